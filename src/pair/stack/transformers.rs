//! transformers' side: `TrainingArguments` validation, HF's fill and match
//! (`trainer_config_process`), the Trainer's checks, `trainer_config_finalize`,
//! `deepspeed_optim_sched` and the HF scheduler's arguments (transformers v5.24.0).

use super::*;

impl Work<'_> {
    // ---- 1. TrainingArguments ----------------------------------------------------------------

    pub(super) fn training_arguments(&mut self) {
        let a = self.args;
        let err = |span: Span, msg: String, label: &str, help: String| {
            Finding::new(
                codes::ARGS_INVALID,
                Severity::Error,
                msg,
                At::args(span, label.to_string()),
            )
            .help(help)
        };
        let span_of = |field: &str| a.given(field).map(|(_, v)| v);
        // Enum fields: the dataclass converts them (`SchedulerType(value)` …).
        let kinds = self.facts.hf_scheduler_kinds;
        let mut enums: Vec<(&str, &str, Vec<&str>)> = vec![
            ("lr_scheduler_type", "SchedulerType", {
                let mut k = kinds.to_vec();
                // transformers ≥ 4.48 / 5.x names beyond the facts table's base list.
                for extra in ["greedy", "cosine_warmup_with_min_lr"] {
                    if a.fields.contains_key("lr_scheduler_kwargs") && !k.contains(&extra) {
                        k.push(extra);
                    }
                }
                k
            }),
            (
                "eval_strategy",
                "IntervalStrategy",
                vec!["no", "steps", "epoch"],
            ),
            (
                "logging_strategy",
                "IntervalStrategy",
                vec!["no", "steps", "epoch"],
            ),
            (
                "save_strategy",
                "SaveStrategy",
                vec!["no", "steps", "epoch", "best"],
            ),
        ];
        enums.retain(|(f, ..)| a.fields.contains_key(*f));
        for (field, class, allowed) in &enums {
            let Some(span) = span_of(field) else { continue };
            let value = a.get(field).cloned().unwrap_or(Py::None);
            let ok = matches!(&value, Py::Str(s) if allowed.contains(&s.as_str()));
            if !ok {
                self.out.push(err(
                    span,
                    format!(
                        "`{field}` = {} is not one of transformers' {class} values",
                        value.repr()
                    ),
                    "not a valid value",
                    format!(
                        "TrainingArguments refuses it (\"{} is not a valid {class}\"); one of: {}",
                        value.repr(),
                        allowed.join(", ")
                    ),
                ));
            }
        }
        if a.flag("fp16") && a.flag("bf16") {
            let span = span_of("bf16").or(span_of("fp16")).unwrap_or_default();
            let mut f = err(
                span,
                "`fp16` and `bf16` are both true".into(),
                "bf16 = true",
                "TrainingArguments refuses it (\"At most one of fp16 and bf16 can be True, but not \
                 both\"); keep one"
                    .into(),
            );
            if let Some(s) = span_of("fp16") {
                f = f.also(At::args(s, "fp16 = true"));
            }
            self.out.push(f);
        }
        if a.num("warmup_steps", 0.0) < 0.0 {
            let span = span_of("warmup_steps").unwrap_or_default();
            self.out.push(err(
                span,
                "`warmup_steps` is negative".into(),
                "below 0",
                format!(
                    "TrainingArguments refuses it (\"Got warmup_steps = {}, Expected value \
                     warmup_steps >= 0\")",
                    a.get("warmup_steps").map(Py::show).unwrap_or_default()
                ),
            ));
        }
        let eval = a.text("eval_strategy");
        let sched = a.text("lr_scheduler_type");
        if (sched == "reduce_lr_on_plateau" || sched == "greedy") && eval == "no" {
            let span = span_of("lr_scheduler_type").unwrap_or_default();
            self.out.push(err(
                span,
                format!(
                    "`lr_scheduler_type` {sched} needs evaluations, and `eval_strategy` is \"no\""
                ),
                "steps on an evaluation metric",
                format!(
                    "TrainingArguments refuses it (\"lr_scheduler_type {sched} requires an eval \
                     strategy\"); set eval_strategy to steps or epoch"
                ),
            ));
        }
        if a.flag("load_best_model_at_end") {
            let save = a.text("save_strategy");
            if save != "best" && save != eval {
                let span = span_of("load_best_model_at_end").unwrap_or_default();
                let mut f = err(
                    span,
                    format!(
                        "`load_best_model_at_end` needs the save and eval strategies to match, \
                         found eval {eval}, save {save}"
                    ),
                    "needs matching strategies",
                    "TrainingArguments refuses it (\"--load_best_model_at_end requires the save \
                     and eval strategy to match, except when --save_strategy=\"best\"\"); make \
                     save_strategy equal eval_strategy"
                        .into(),
                );
                for field in ["eval_strategy", "save_strategy"] {
                    if let Some(s) = span_of(field) {
                        f = f.also(At::args(s, field));
                    }
                }
                self.out.push(f);
            } else if eval == "steps" {
                let save_steps = a.num("save_steps", 500.0);
                let eval_steps = a
                    .get("eval_steps")
                    .and_then(Py::number)
                    .unwrap_or_else(|| a.num("logging_steps", 500.0));
                let bad = if (save_steps < 1.0) != (eval_steps < 1.0) {
                    true
                } else if save_steps >= 1.0 {
                    save_steps % eval_steps != 0.0
                } else {
                    // Ratios: a round multiple (transformers compares with a tolerance).
                    let q = save_steps / eval_steps;
                    (q - q.round()).abs() > 1e-9
                };
                if bad {
                    let span = span_of("save_steps")
                        .or(span_of("load_best_model_at_end"))
                        .unwrap_or_default();
                    let mut f = err(
                        span,
                        format!(
                            "`save_steps` {} is not a multiple of the evaluation steps {}",
                            py_num(save_steps),
                            py_num(eval_steps)
                        ),
                        "not a multiple",
                        "TrainingArguments refuses it with load_best_model_at_end (\"requires the \
                         saving steps to be a multiple of the evaluation steps\")"
                            .into(),
                    );
                    if let Some(s) = span_of("eval_steps") {
                        f = f.also(At::args(s, "eval_steps"));
                    }
                    self.out.push(f);
                }
            }
        }
    }

    // ---- 2. HF fill (trainer_config_process) -----------------------------------------------

    pub(super) fn world(&self) -> u64 {
        self.opts.world.max(1)
    }

    pub(super) fn hf_process(&mut self) {
        let a = self.args;
        let micro = a
            .get("per_device_train_batch_size")
            .cloned()
            .unwrap_or(Py::Int(8));
        let gas = a
            .get("gradient_accumulation_steps")
            .cloned()
            .unwrap_or(Py::Int(1));
        let auto_find = a.flag("auto_find_batch_size");
        let tb = match (&micro, &gas) {
            (Py::Int(m), Py::Int(g)) => (self.world() as i128)
                .checked_mul(*m)
                .and_then(|x| x.checked_mul(*g))
                .map_or(Py::Float(f64::INFINITY), Py::Int),
            _ => Py::Float(
                self.world() as f64 * micro.number().unwrap_or(0.0) * gas.number().unwrap_or(0.0),
            ),
        };
        self.fill_match(
            "train_micro_batch_size_per_gpu",
            micro,
            "per_device_train_batch_size",
            &["per_device_train_batch_size"],
            !auto_find,
        );
        self.fill_match(
            "gradient_accumulation_steps",
            gas,
            "gradient_accumulation_steps",
            &["gradient_accumulation_steps"],
            true,
        );
        self.fill_match(
            "train_batch_size",
            tb,
            "train_batch_size (calculated)",
            &["per_device_train_batch_size", "gradient_accumulation_steps"],
            !auto_find,
        );
        let v = |f: &str| a.get(f).cloned().unwrap_or(Py::None);
        self.fill_match(
            "gradient_clipping",
            v("max_grad_norm"),
            "max_grad_norm",
            &["max_grad_norm"],
            true,
        );
        self.fill_match(
            "optimizer.params.lr",
            v("learning_rate"),
            "learning_rate",
            &["learning_rate"],
            true,
        );
        self.fill_match(
            "optimizer.params.betas",
            Py::List(vec![v("adam_beta1"), v("adam_beta2")]),
            "adam_beta1+adam_beta2",
            &["adam_beta1", "adam_beta2"],
            true,
        );
        self.fill_match(
            "optimizer.params.eps",
            v("adam_epsilon"),
            "adam_epsilon",
            &["adam_epsilon"],
            true,
        );
        self.fill_match(
            "optimizer.params.weight_decay",
            v("weight_decay"),
            "weight_decay",
            &["weight_decay"],
            true,
        );
        self.fill_match(
            "scheduler.params.warmup_min_lr",
            Py::Int(0),
            "0",
            &[],
            false,
        );
        self.fill_match(
            "scheduler.params.warmup_max_lr",
            v("learning_rate"),
            "learning_rate",
            &["learning_rate"],
            true,
        );
        if a.flag("save_on_each_node") {
            self.insert("checkpoint.use_node_local_storage", Py::Bool(true), "HF");
        }
        let fp16 = a.flag("fp16") || a.flag("fp16_full_eval");
        let bf16 = a.flag("bf16") || a.flag("bf16_full_eval");
        self.fill_match(
            "fp16.enabled",
            Py::Bool(fp16),
            "fp16|fp16_full_eval",
            &["fp16", "fp16_full_eval"],
            true,
        );
        self.fill_match(
            "bf16.enabled",
            Py::Bool(bf16),
            "bf16|bf16_full_eval",
            &["bf16", "bf16_full_eval"],
            true,
        );
    }

    // ---- 4. the Trainer --------------------------------------------------------------------

    pub(super) fn trainer_checks(&mut self) {
        let a = self.args;
        let eval = a.text("eval_strategy");
        if a.flag("save_only_model") && a.flag("load_best_model_at_end") {
            let span = a.given("save_only_model").map(|g| g.1).unwrap_or_default();
            self.out.push(
                Finding::new(
                    codes::TRAINER_REFUSES,
                    Severity::Error,
                    "`save_only_model` with `load_best_model_at_end` under DeepSpeed",
                    At::args(span, "save_only_model"),
                )
                .help(
                    "the Trainer refuses it (\"DeepSpeed can't be used with `save_only_model` \
                     along with `load_best_model_at_end`.\"); drop one",
                ),
            );
        }
        if a.flag("auto_find_batch_size")
            && self.get("zero_optimization.stage").and_then(Py::number) == Some(3.0)
        {
            let span = a
                .given("auto_find_batch_size")
                .map(|g| g.1)
                .unwrap_or_default();
            self.out.push(
                Finding::new(
                    codes::TRAINER_REFUSES,
                    Severity::Error,
                    "`auto_find_batch_size` with ZeRO stage 3",
                    At::args(span, "auto_find_batch_size"),
                )
                .help(
                    "the Trainer refuses it (\"`auto_find_batch_size` isn't supported yet with \
                     DeepSpeed Zero-3\"); use stage 1 or 2, or a fixed batch size",
                ),
            );
        }
        if eval != "no" && !eval.is_empty() && self.opts.has_eval == Some(false) {
            let span = a.given("eval_strategy").map(|g| g.1).unwrap_or_default();
            self.out.push(
                Finding::new(
                    codes::TRAINER_REFUSES,
                    Severity::Error,
                    format!("`eval_strategy` is {eval}, but the run has no evaluation dataset"),
                    At::args(span, "evaluates"),
                )
                .help(format!(
                    "the Trainer refuses it (\"You have set `args.eval_strategy` to {eval} but you \
                     didn't pass an `eval_dataset` to `Trainer`\"); set eval_strategy to \"no\" or \
                     pass evaluation data"
                )),
            );
        }
    }

    /// Optimizer steps as the Trainer counts them (docs/upstream.md §5), when samples are known.
    pub(super) fn total_steps(&self) -> Option<u64> {
        use crate::upstream::steps;
        let samples = self.opts.samples?;
        let micro = self.args.num("per_device_train_batch_size", 8.0).max(1.0) as u64;
        let gas = self.args.num("gradient_accumulation_steps", 1.0).max(1.0) as u64;
        let drop_last = self.args.flag("dataloader_drop_last");
        let l =
            steps::batches_per_rank(samples, micro, self.world(), drop_last, self.facts.sharding);
        let u = steps::updates_per_epoch(l, gas, self.facts.updates_per_epoch);
        let max_steps = self.args.num("max_steps", -1.0);
        let max = (max_steps > 0.0).then_some(max_steps as u64);
        Some(steps::total_steps(
            self.args.num("num_train_epochs", 3.0),
            u,
            max,
        ))
    }

    /// `trainer_config_finalize`: hidden-size and step "auto"s, then the mismatch error.
    pub(super) fn hf_finalize(&mut self) -> Option<u64> {
        let hidden_keys = [
            "zero_optimization.reduce_bucket_size",
            "zero_optimization.stage3_prefetch_bucket_size",
            "zero_optimization.stage3_param_persistence_threshold",
        ];
        if let Some(h) = self.opts.hidden_size {
            let h = h as i128;
            let zero3 = self.get("zero_optimization.stage").and_then(Py::number) == Some(3.0);
            let values = [
                h.saturating_mul(h),
                h.saturating_mul(h).saturating_mul(9) / 10,
                h.saturating_mul(10),
            ];
            for (i, key) in hidden_keys.iter().enumerate() {
                if self.is_auto(key) && (i == 0 || zero3) {
                    self.set(
                        key,
                        Py::Int(values[i]),
                        Origin::Filled {
                            by: "HF",
                            from: "the model's hidden_size".into(),
                        },
                    );
                }
            }
        }
        let total = self.total_steps();
        if let Some(t) = total {
            self.fill_match(
                "scheduler.params.total_num_steps",
                Py::Int(t as i128),
                "num_training_steps (calculated)",
                &[],
                true,
            );
            let ws = self.args.num("warmup_steps", 0.0);
            let warmup = if ws >= 1.0 {
                ws as u64
            } else {
                (t as f64 * ws).ceil() as u64
            };
            self.fill_match(
                "scheduler.params.warmup_num_steps",
                Py::Int(warmup.max(1) as i128),
                "warmup_steps",
                &["warmup_steps"],
                true,
            );
        }
        let mismatches = std::mem::take(&mut self.mismatches);
        self.out.extend(mismatches);
        total
    }

    /// `deepspeed_optim_sched`: without a DeepSpeed optimizer HF builds its own and allows it.
    pub(super) fn optim_sched(&mut self) {
        if self.get("optimizer").is_none() {
            self.insert("zero_allow_untested_optimizer", Py::Bool(true), "HF");
        }
    }

    /// The HF scheduler, built when the config has no `scheduler` section
    /// (`Trainer.create_scheduler` → `get_scheduler` with `lr_scheduler_kwargs`; transformers
    /// v5.24.0 `optimization.py:get_cosine_with_min_lr_schedule_with_warmup`).
    pub(super) fn hf_scheduler(&mut self) {
        if self.get("scheduler").is_some()
            || self.args.text("lr_scheduler_type") != "cosine_with_min_lr"
        {
            return;
        }
        let kwargs = self
            .args
            .get("lr_scheduler_kwargs")
            .cloned()
            .unwrap_or(Py::None);
        let has = |k: &str| kwargs.get(k).is_some_and(|v| *v != Py::None);
        let (min_lr, rate) = (has("min_lr"), has("min_lr_rate"));
        if min_lr == rate {
            let span = self
                .args
                .given("lr_scheduler_kwargs")
                .or(self.args.given("lr_scheduler_type"))
                .map(|g| g.1)
                .unwrap_or_default();
            let quote = if min_lr {
                "Only one of min_lr or min_lr_rate should be set"
            } else {
                "One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`"
            };
            self.out.push(
                Finding::new(
                    codes::HF_SCHEDULER_REFUSES,
                    Severity::Error,
                    if min_lr {
                        "cosine_with_min_lr takes `min_lr` or `min_lr_rate`, and both are given".to_string()
                    } else {
                        "cosine_with_min_lr needs `min_lr` or `min_lr_rate` in `lr_scheduler_kwargs`".to_string()
                    },
                    At::args(span, if min_lr { "both given" } else { "neither given" }),
                )
                .help(format!(
                    "HF refuses it when it builds the scheduler (\"{quote}\"); give exactly one"
                )),
            );
        }
    }
}
