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
            ("lr_scheduler_type", "SchedulerType", kinds.to_vec()),
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
        if a.flag("fsdp") {
            let span = a.given("fsdp").map(|g| g.1).unwrap_or_default();
            self.out.push(
                Finding::new(
                    codes::TRAINER_REFUSES,
                    Severity::Error,
                    "`fsdp` together with a DeepSpeed config",
                    At::args(span, "FSDP"),
                )
                .help(
                    "the Trainer refuses it (\"Using --fsdp xxx together with --deepspeed is not \
                     possible, deactivate one of those flags.\"); shard with ZeRO-3 instead, or \
                     drop --deepspeed",
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
        // HF fills the prefetch and persistence sizes at stage 3 only.
        let zero3 = self.get("zero_optimization.stage").and_then(Py::number) == Some(3.0);
        for (i, (key, value)) in self.hidden_size_fills().into_iter().enumerate() {
            if let Some(v) = value.filter(|_| self.is_auto(key) && (i == 0 || zero3)) {
                self.set(
                    key,
                    Py::Int(v),
                    Origin::Filled {
                        by: "HF",
                        from: "the model's hidden_size".into(),
                        given: None,
                    },
                );
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
    /// (`Trainer.create_scheduler` → `get_scheduler(name, optimizer, num_warmup_steps,
    /// num_training_steps, scheduler_specific_kwargs=lr_scheduler_kwargs)`, transformers v5.24.0
    /// `optimization.py`): the kwargs against the schedule function's parameters, and the
    /// functions' own checks.
    pub(super) fn hf_scheduler(&mut self) {
        if self.get("scheduler").is_some() {
            return;
        }
        let kind = self.args.text("lr_scheduler_type").to_string();
        let Some((_, func, accepted, required)) = crate::upstream::schedules::HF_SCHEDULE_FUNCTIONS
            .iter()
            .find(|(k, ..)| *k == kind)
        else {
            return; // constant (kwargs not passed), or a kind TrainingArguments refused
        };
        let kwargs = self
            .args
            .get("lr_scheduler_kwargs")
            .cloned()
            .unwrap_or(Py::None);
        let span = self
            .args
            .given("lr_scheduler_kwargs")
            .or(self.args.given("lr_scheduler_type"))
            .map(|g| g.1)
            .unwrap_or_default();
        let refuse = |w: &mut Work, message: String, label: &str, quote: String, fix: &str| {
            w.out.push(
                Finding::new(
                    codes::HF_SCHEDULER_REFUSES,
                    Severity::Error,
                    message,
                    At::args(span, label.to_string()),
                )
                .help(format!(
                    "HF refuses it when it builds the scheduler (\"{quote}\"); {fix}"
                )),
            );
        };
        let given: Vec<String> = match &kwargs {
            Py::Dict(items) => items.iter().map(|(k, _)| k.clone()).collect(),
            _ => Vec::new(),
        };
        for k in &given {
            if ["num_warmup_steps", "num_training_steps"].contains(&k.as_str()) {
                refuse(
                    self,
                    format!("`lr_scheduler_kwargs` repeats `{k}`, which the Trainer passes itself"),
                    "passed twice",
                    format!("{func}() got multiple values for keyword argument '{k}'"),
                    "remove it (warmup comes from warmup_steps, the total from the step count)",
                );
            } else if !accepted.contains(&k.as_str()) {
                let hint = crate::check::suggest::closest(k, accepted.iter().copied())
                    .map(|b| format!("did you mean `{b}`? "))
                    .unwrap_or_default();
                refuse(
                    self,
                    format!("`{k}` is not an argument of HF's {kind} schedule"),
                    "unknown argument",
                    format!("{func}() got an unexpected keyword argument '{k}'"),
                    &format!(
                        "{hint}{kind} takes {}",
                        if accepted.is_empty() {
                            "none".to_string()
                        } else {
                            accepted.join(", ")
                        }
                    ),
                );
            }
        }
        for k in *required {
            if kwargs.get(k).is_none() {
                refuse(
                    self,
                    format!("HF's {kind} schedule needs `{k}` in `lr_scheduler_kwargs`"),
                    "missing argument",
                    format!("{func}() missing 1 required positional argument: '{k}'"),
                    "give it in lr_scheduler_kwargs",
                );
            }
        }
        let has = |k: &str| kwargs.get(k).is_some_and(|v| *v != Py::None);
        if kind.contains("with_min_lr") && has("min_lr") == has("min_lr_rate") {
            let both = has("min_lr");
            refuse(
                self,
                if both {
                    format!("{kind} takes `min_lr` or `min_lr_rate`, and both are given")
                } else {
                    format!("{kind} needs `min_lr` or `min_lr_rate` in `lr_scheduler_kwargs`")
                },
                if both { "both given" } else { "neither given" },
                if both {
                    "Only one of min_lr or min_lr_rate should be set".into()
                } else {
                    "One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`"
                        .into()
                },
                "give exactly one",
            );
        }
        // torch's ReduceLROnPlateau.__init__ and HF's GreedyLR.__init__ (v5.24.0
        // optimization.py) refuse a factor of 1 or more.
        if matches!(kind.as_str(), "reduce_lr_on_plateau" | "greedy") {
            let default = if kind == "greedy" { 0.95 } else { 0.1 };
            let factor = kwargs.get("factor").and_then(Py::number).unwrap_or(default);
            if factor >= 1.0 {
                refuse(
                    self,
                    format!(
                        "HF's {kind} schedule needs a factor below 1, not {}",
                        py_float(factor)
                    ),
                    "factor not below 1",
                    "Factor should be < 1.0.".into(),
                    "give a factor below 1",
                );
            }
        }
        // A list of one value per parameter group (torch 2.15 ReduceLROnPlateau.__init__, HF's
        // GreedyLR.__init__): as many as the optimizer has groups, two for the one HF builds
        // (Trainer.create_optimizer: decaying weights, then the rest), one for DeepSpeed's (HF
        // passes it one flat parameter list). The recipe side is rules/schedule.rs R0319.
        let per_group: &[&str] = match kind.as_str() {
            "reduce_lr_on_plateau" => &["min_lr"],
            "greedy" => &["min_lr", "max_lr"],
            _ => &[],
        };
        let groups = if self.get("optimizer").is_some() {
            1
        } else {
            2
        };
        for k in per_group {
            if let Some(Py::List(items)) = kwargs.get(k) {
                if items.len() != groups {
                    refuse(
                        self,
                        format!(
                            "{} values of `{k}` for the optimizer's {groups} parameter group{}",
                            items.len(),
                            if groups == 1 { "" } else { "s" }
                        ),
                        "one per parameter group",
                        format!("expected {groups} {k}s, got {}", items.len()),
                        &format!(
                            "give {groups} value{} or one number",
                            if groups == 1 { "" } else { "s" }
                        ),
                    );
                }
            }
        }
        if kind == "polynomial" {
            // The initial LR is the optimizer's: DeepSpeed's section when there is one.
            let lr = self
                .get("optimizer.params.lr")
                .and_then(Py::number)
                .unwrap_or_else(|| self.args.num("learning_rate", 5e-5));
            let end = kwargs.get("lr_end").and_then(Py::number).unwrap_or(1e-7);
            if lr.partial_cmp(&end) != Some(std::cmp::Ordering::Greater) {
                refuse(
                    self,
                    format!(
                        "polynomial decay to lr_end {} does not end below the initial LR {}",
                        py_float(end),
                        py_float(lr)
                    ),
                    "lr_end too high",
                    format!(
                        "lr_end ({}) must be smaller than initial lr ({})",
                        py_float(end),
                        py_float(lr)
                    ),
                    "make lr_end smaller than the learning rate",
                );
            }
        }
    }

    /// TrainingArguments the run does not use, silently (warnings): under DeepSpeed the Trainer
    /// leaves clipping to DeepSpeed (accelerate's `clip_grad_norm_` only reads the norm), builds
    /// no optimizer or scheduler of its own when the config has those sections
    /// (`deepspeed_optim_sched`), and hands DeepSpeed's optimizer one flat parameter list, so
    /// weight decay reaches biases and LayerNorm weights (docs/upstream.md §4).
    pub(super) fn ignored_arguments(&mut self) {
        let a = self.args;
        let warn = |at: At, msg: String, help: &str| {
            Finding::new(codes::ARGS_IGNORED, Severity::Warning, msg, at).help(help.to_string())
        };
        if self.get("gradient_clipping").is_none() {
            let clip = a.num("max_grad_norm", 1.0);
            let ds_default = self.facts.ds_clipping_default;
            if clip != ds_default {
                let at = self
                    .field_at("max_grad_norm", "not applied")
                    .unwrap_or_else(|| At::ds(self.ds_key_span(""), "no gradient_clipping"));
                let f = warn(
                    at,
                    format!(
                        "TrainingArguments clip at max_grad_norm = {}, but under DeepSpeed the \
                         config's `gradient_clipping` decides, and it is absent: DeepSpeed clips at \
                         its default {}",
                        py_float(clip),
                        py_float(ds_default)
                    ),
                    "write \"gradient_clipping\": \"auto\" (HF fills it from max_grad_norm)",
                );
                self.out.push(f);
            }
        }
        if let Some(kind) = self.get("optimizer.type").cloned() {
            if let Some((_, v)) = a.given("optim") {
                let f = warn(
                    At::args(v, "not used"),
                    format!(
                        "`optim` = {} is not used: DeepSpeed builds the config's optimizer ({})",
                        a.get("optim").map(Py::show).unwrap_or_default(),
                        kind.show()
                    ),
                    "remove `optim`, or remove the config's `optimizer` section to train with HF's",
                )
                .also(At::ds(
                    self.ds_span("optimizer.type"),
                    "this optimizer runs",
                ));
                self.out.push(f);
            }
            let wd = self
                .get("optimizer.params.weight_decay")
                .and_then(Py::number)
                .unwrap_or(0.0);
            if wd > 0.0 {
                let f = warn(
                    At::ds(self.ds_span("optimizer.params.weight_decay"), "applies to every parameter"),
                    format!(
                        "weight decay {} reaches biases and LayerNorm weights: the Trainer hands \
                         DeepSpeed's optimizer one flat parameter list, without HF's no-decay group",
                        py_num(wd)
                    ),
                    "remove the config's `optimizer` section to keep HF's grouping (AdamW without \
                     decay on biases and norms), or accept decay everywhere",
                );
                let f = match self.field_at("weight_decay", "the decay") {
                    Some(at) => f.also(at),
                    None => f,
                };
                self.out.push(f);
            }
        }
        if let Some(kind) = self.get("scheduler.type").cloned() {
            for field in ["lr_scheduler_type", "lr_scheduler_kwargs"] {
                if let Some((_, v)) = a.given(field) {
                    let f = warn(
                        At::args(v, "not used"),
                        format!(
                            "`{field}` is not used: DeepSpeed runs the config's scheduler ({})",
                            kind.show()
                        ),
                        "remove it, or remove the config's `scheduler` section to use HF's",
                    )
                    .also(At::ds(
                        self.ds_span("scheduler.type"),
                        "this scheduler runs",
                    ));
                    self.out.push(f);
                }
            }
        }
    }
}
