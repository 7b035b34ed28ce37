//! accelerate's side: `DeepSpeedPlugin.__post_init__`, `set_mixed_precision` and the last fill
//! in `Accelerator._prepare_deepspeed` (accelerate v1.15.0).

use super::*;

impl Work<'_> {
    // ---- 3. accelerate's plugin and precision ------------------------------------------------

    /// `DeepSpeedPlugin.__post_init__`; false when it raises (no ZeRO section).
    pub(super) fn accelerate_plugin(&mut self) -> bool {
        if self.get("gradient_accumulation_steps").is_none() {
            self.insert("gradient_accumulation_steps", Py::Int(1), "accelerate");
            let gas = self.args.num("gradient_accumulation_steps", 1.0);
            if gas != 1.0 {
                let mut f = Finding::new(
                    codes::ACCELERATE_CHANGES,
                    Severity::Warning,
                    format!(
                        "the DeepSpeed config has no `gradient_accumulation_steps`: accelerate \
                         inserts 1, while TrainingArguments accumulate {}",
                        py_num(gas)
                    ),
                    At::ds(self.ds_key_span(""), "no gradient_accumulation_steps"),
                )
                .help(
                    "write \"gradient_accumulation_steps\": \"auto\" (HF fills it from \
                     TrainingArguments); DeepSpeed steps the optimizer on every micro-batch otherwise",
                );
                if let Some(at) = self.field_at("gradient_accumulation_steps", "accumulates here") {
                    f = f.also(at);
                }
                self.out.push(f);
            }
        }
        if self.get("zero_optimization").is_none() {
            self.out.push(
                Finding::new(
                    codes::NO_ZERO_SECTION,
                    Severity::Error,
                    "the DeepSpeed config has no `zero_optimization` section",
                    At::ds(self.ds_key_span(""), "no zero_optimization"),
                )
                .help(
                    "accelerate refuses it (\"Please specify the ZeRO optimization config in the \
                     DeepSpeed config.\"); add \"zero_optimization\": {\"stage\": 0} (or the stage \
                     you want)",
                ),
            );
            return false;
        }
        // The plugin's own values (environment defaults of a plain launch) fill what is still
        // "auto"; written values win (must_match=False).
        let plugin: [(&str, Py); 4] = [
            ("zero_optimization.stage", Py::Int(2)),
            (
                "zero_optimization.offload_optimizer.device",
                Py::Str("none".into()),
            ),
            (
                "zero_optimization.offload_param.device",
                Py::Str("none".into()),
            ),
            (
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                Py::Bool(false),
            ),
        ];
        for (path, v) in plugin {
            if self.is_auto(path) {
                if path == "zero_optimization.stage" {
                    self.out.push(
                        Finding::new(
                            codes::ACCELERATE_CHANGES,
                            Severity::Warning,
                            "`zero_optimization.stage` is \"auto\": accelerate fills it with its \
                             default, stage 2",
                            At::ds(self.ds_span(path), "becomes 2"),
                        )
                        .help("write the stage you want (0, 1, 2 or 3)"),
                    );
                }
                self.set(
                    path,
                    v,
                    Origin::Filled {
                        by: "accelerate",
                        from: "DeepSpeedPlugin default".into(),
                        given: None,
                    },
                );
            }
        }
        if let Some(v) = self.get("steps_per_print").cloned() {
            if !v.is_auto() {
                self.out.push(
                    Finding::new(
                        codes::ACCELERATE_CHANGES,
                        Severity::Warning,
                        format!(
                            "`steps_per_print` = {} is overwritten: accelerate sets it to inf",
                            v.show()
                        ),
                        At::ds(self.ds_span("steps_per_print"), "ignored"),
                    )
                    .help(
                        "remove it; under HF the Trainer's `logging_steps` decides what is logged",
                    ),
                );
            }
        }
        let origin = if self.get("steps_per_print").is_some() {
            Origin::Overwritten { by: "accelerate" }
        } else {
            Origin::Inserted { by: "accelerate" }
        };
        self.set("steps_per_print", Py::Float(f64::INFINITY), origin);
        true
    }

    /// `DeepSpeedPlugin.set_mixed_precision` with TrainingArguments' precision.
    pub(super) fn accelerate_mixed_precision(&mut self) {
        let mixed = if self.args.flag("fp16") {
            "fp16"
        } else if self.args.flag("bf16") {
            "bf16"
        } else {
            "no"
        };
        if mixed != "no" && self.get(mixed).is_none() {
            let v = if mixed == "fp16" {
                Py::Dict(vec![
                    ("enabled".into(), Py::Bool(true)),
                    ("auto_cast".into(), Py::Bool(true)),
                ])
            } else {
                Py::Dict(vec![("enabled".into(), Py::Bool(true))])
            };
            self.insert(mixed, v, "accelerate");
            if mixed == "fp16" {
                self.out.push(
                    Finding::new(
                        codes::ACCELERATE_CHANGES,
                        Severity::Warning,
                        "the DeepSpeed config has no `fp16` section: accelerate inserts one with \
                         `auto_cast: true`",
                        At::ds(self.ds_key_span(""), "no fp16 section"),
                    )
                    .help(
                        "write \"fp16\": {\"enabled\": \"auto\"} to keep DeepSpeed's fp16 defaults \
                         (auto_cast false: the model's inputs are not cast)",
                    ),
                );
            }
        }
        if mixed != "no" {
            let other = if mixed == "fp16" { "bf16" } else { "fp16" };
            let path = format!("{other}.enabled");
            if let Some(v) = self.get(&path) {
                if v.show().to_lowercase() == "true" {
                    let mut f = Finding::new(
                        codes::MIXED_PRECISION_CONFLICT,
                        Severity::Error,
                        format!(
                            "TrainingArguments train in {mixed}, but the DeepSpeed config enables {other}"
                        ),
                        At::ds(self.ds_span(&path), format!("{other} enabled")),
                    )
                    .help(format!(
                        "accelerate refuses it (\"`--mixed_precision` arg cannot be set to \
                         `{mixed}` when `{other}` is set in the DeepSpeed config file.\"); write \
                         \"auto\" for both `enabled` keys and choose the precision in \
                         TrainingArguments"
                    ));
                    if let Some(at) = self.field_at(mixed, format!("{mixed} = true")) {
                        f = f.also(at);
                    }
                    self.out.push(f);
                }
            }
        }
        for dtype in ["fp16", "bf16"] {
            if self.get(dtype).is_none() {
                self.insert(
                    dtype,
                    Py::Dict(vec![("enabled".into(), Py::Bool(false))]),
                    "accelerate",
                );
            }
            let path = format!("{dtype}.enabled");
            if self.is_auto(&path) {
                self.set(
                    &path,
                    Py::Bool(mixed == dtype),
                    Origin::Filled {
                        by: "accelerate",
                        from: "mixed_precision".into(),
                        given: None,
                    },
                );
            }
        }
    }

    /// accelerate's `_prepare_deepspeed` fill: what is still "auto" is filled from the prepared
    /// objects, and an "auto" nothing fills is refused.
    pub(super) fn accelerate_last_fill(&mut self) {
        let mut kwargs: Vec<(&str, Option<Py>)> = vec![
            ("gradient_accumulation_steps", Some(Py::Int(1))),
            ("gradient_clipping", Some(Py::Float(1.0))),
            (
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                Some(Py::Bool(false)),
            ),
        ];
        let micro = self.get("train_micro_batch_size_per_gpu").cloned();
        if let Some(m) = micro.filter(|m| !m.is_auto()) {
            let gas = self
                .get("gradient_accumulation_steps")
                .and_then(Py::number)
                .unwrap_or(1.0);
            let tb = m
                .number()
                .map(|m| Py::Int(((m * gas) as i128).saturating_mul(self.world() as i128)));
            kwargs.push(("train_micro_batch_size_per_gpu", Some(m)));
            kwargs.push(("train_batch_size", tb));
        }
        let hidden = self.hidden_size_fills();
        if hidden.iter().any(|(k, _)| self.is_auto(k)) {
            // The model's hidden size: unknown here unless given; filled at launch.
            kwargs.extend(hidden.map(|(k, v)| (k, v.map(Py::Int))));
        }
        if self.get("optimizer").is_some() {
            let lr = self.args.get("learning_rate").cloned();
            let wd = self.args.get("weight_decay").cloned();
            kwargs.push(("optimizer.params.lr", lr));
            kwargs.push(("optimizer.params.weight_decay", wd));
        }
        if self.get("scheduler").is_some() {
            let lr = self.args.get("learning_rate").cloned();
            kwargs.push(("scheduler.params.warmup_min_lr", Some(Py::Int(0))));
            kwargs.push(("scheduler.params.warmup_max_lr", lr));
            kwargs.push(("scheduler.params.warmup_num_steps", None));
            kwargs.push(("scheduler.params.total_num_steps", None));
        }
        // Every "auto" left (a dict is never "auto", so its children are all visited).
        let autos: Vec<String> = self
            .cfg
            .entries()
            .into_iter()
            .filter(|(_, v)| v.is_auto())
            .map(|(k, _)| k)
            .collect();
        for path in autos {
            match kwargs.iter().find(|(k, _)| *k == path) {
                Some((_, Some(v))) => {
                    let v = v.clone();
                    self.set(
                        &path,
                        v,
                        Origin::Filled {
                            by: "accelerate",
                            from: "Accelerator.prepare".into(),
                            given: None,
                        },
                    );
                }
                // Filled at launch from something only the run knows (the model, the step
                // count without --samples).
                Some((_, None)) => {}
                None => {
                    self.out.push(
                        Finding::new(
                            codes::AUTO_UNFILLED,
                            Severity::Error,
                            format!("`{path}` is \"auto\", and nothing fills it"),
                            At::ds(self.ds_span(&path), "no one fills this \"auto\""),
                        )
                        .help(format!(
                            "accelerate refuses it (\"`{path}` not found in kwargs. Please specify \
                             `{path}` without `auto` (set to correct value) in the DeepSpeed config \
                             file or pass it in kwargs.\"); write the value"
                        )),
                    );
                }
            }
        }
    }
}
