//! DeepSpeed's side: its reading of the keys (deprecated, removed, unknown, strict sections),
//! `DeepSpeedConfig` at the world size (batch inference and assertion, precision) and the
//! values it validates (DeepSpeed v0.19.8 `runtime/config.py`, `runtime/engine.py`).

use super::*;

impl Work<'_> {
    // ---- 5. DeepSpeed --------------------------------------------------------------------------

    /// Keys DeepSpeed does not know, deprecated keys, strict sections (at their written spans).
    pub(super) fn deepspeed_keys(&mut self) {
        let mut keys = Vec::new();
        members(self.ds, "", &mut keys);
        if self.facts.ds_removed_legacy_features {
            let ds = self.opts.targets.deepspeed;
            for key in crate::rules::compat::REMOVED_KEYS {
                if self.ds.get(key).is_some() {
                    self.out.push(
                        Finding::new(
                            codes::REMOVED_DEEPSPEED_KEY,
                            Severity::Error,
                            format!("DeepSpeed {ds} has removed `{key}`, even disabled"),
                            At::ds(self.ds_key_span(key), format!("removed in DeepSpeed {ds}")),
                        )
                        .help(
                            "DeepSpeed refuses the config (\"… has been removed\"); delete the key, \
                             or launch with a DeepSpeed release that still reads it",
                        ),
                    );
                }
            }
            keys.retain(|(k, ..)| crate::rules::compat::removed_key(k).is_none());
        }
        let cpu_offload = self.ds.get("zero_optimization.cpu_offload").is_some();
        let offload_optimizer = self.ds.get("zero_optimization.offload_optimizer").is_some();
        for (dotted, span, value) in keys {
            if let Some(d) = crate::check::raw::deepspeed_finding(&dotted, span, value.is_auto()) {
                let severity = d.severity;
                let mut f = Finding {
                    code: d.code,
                    severity,
                    message: d.message,
                    primary: At {
                        side: Side::DeepSpeed,
                        label: d.primary,
                    },
                    secondary: Vec::new(),
                    help: d.help,
                };
                if dotted == "zero_optimization.cpu_offload" && cpu_offload && offload_optimizer {
                    f.severity = Severity::Error;
                    f.message =
                        "`zero_optimization.cpu_offload` and `offload_optimizer` are both given"
                            .into();
                    f.help = Some(
                        "DeepSpeed refuses both (the deprecated key and its replacement); keep \
                         `offload_optimizer`"
                            .into(),
                    );
                }
                self.out.push(f);
            }
        }
    }

    /// `DeepSpeedConfig` at the world size: batch inference and assertion, precision, values.
    pub(super) fn deepspeed_config(&mut self) {
        let world = self.world() as i128;
        let int = |v: Option<&Py>| -> Option<i128> {
            match v? {
                Py::Int(i) => Some(*i),
                Py::Float(f) if f.fract() == 0.0 => Some(*f as i128),
                Py::Bool(b) => Some(i128::from(*b)),
                _ => None,
            }
        };
        let tb = int(self.get("train_batch_size"));
        let micro = int(self.get("train_micro_batch_size_per_gpu"));
        let gas = int(self.get("gradient_accumulation_steps"));
        let (t, m, g) = match (tb, micro, gas) {
            (Some(t), Some(m), Some(g)) => (t, m, g),
            (Some(t), Some(m), None) => (t, m, if m > 0 { t / m / world } else { 0 }),
            (Some(t), None, Some(g)) => (t, if g > 0 { t / world / g } else { 0 }, g),
            (None, Some(m), Some(g)) => (m.saturating_mul(g).saturating_mul(world), m, g),
            (Some(t), None, None) => (t, t / world, 1),
            (None, Some(m), None) => (m.saturating_mul(world), m, 1),
            (None, None, _) => {
                if self.get("train_batch_size").is_none()
                    && self.get("train_micro_batch_size_per_gpu").is_none()
                {
                    self.out.push(
                        Finding::new(
                            codes::DS_BATCH,
                            Severity::Error,
                            "the DeepSpeed config gives neither `train_batch_size` nor \
                             `train_micro_batch_size_per_gpu`",
                            At::ds(self.ds_key_span(""), "no batch size"),
                        )
                        .help(
                            "DeepSpeed refuses it (\"Either train_batch_size or \
                             train_micro_batch_size_per_gpu needs to be provided\"); write \
                             \"train_micro_batch_size_per_gpu\": \"auto\"",
                        ),
                    );
                }
                return;
            }
        };
        let batch_keys = [
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        ];
        let label_of = |w: &Work, path: &str| -> String {
            let v = w
                .get(path)
                .map(Py::show)
                .unwrap_or_else(|| "inferred".into());
            match w.origins.get(path) {
                Some(Origin::Filled { by, from, .. }) => {
                    format!("{path} = {v} ({by} fills it from {from})")
                }
                Some(Origin::Inserted { by }) => format!("{path} = {v} (inserted by {by})"),
                _ => format!("{path} = {v}"),
            }
        };
        let mut problem = None;
        for (v, name, text) in [
            (t, "Train batch size", "train_batch_size"),
            (
                m,
                "Micro batch size per gpu",
                "train_micro_batch_size_per_gpu",
            ),
            (
                g,
                "Gradient accumulation steps",
                "gradient_accumulation_steps",
            ),
        ] {
            if v <= 0 && problem.is_none() {
                problem = Some((
                    format!("`{text}` is {v} at {world} process(es): it must be greater than 0"),
                    format!("{name}: {v} has to be greater than 0"),
                    text,
                ));
            }
        }
        if problem.is_none() && Some(t) != m.checked_mul(g).and_then(|x| x.checked_mul(world)) {
            problem = Some((
                format!(
                    "DeepSpeed's batch sizes do not agree at {world} process(es): {t} != {m} × {g} × {world}"
                ),
                format!(
                    "Check batch related parameters. train_batch_size is not equal to \
                     micro_batch_per_gpu * gradient_acc_step * world_size {t} != {m} * {g} * {world}"
                ),
                "train_batch_size",
            ));
        }
        if let Some((message, quote, key)) = problem {
            let mut f = Finding::new(
                codes::DS_BATCH,
                Severity::Error,
                message,
                At::ds(self.ds_span(key), label_of(self, key)),
            )
            .help(format!(
                "DeepSpeed refuses it at launch (\"{quote}\"); write \"auto\" for the batch keys, \
                 or make train_batch_size = micro × accumulation × world size"
            ));
            for k in batch_keys {
                if k != key && self.get(k).is_some() {
                    f = f.also(At::ds(self.ds_span(k), label_of(self, k)));
                }
            }
            for field in ["per_device_train_batch_size", "gradient_accumulation_steps"] {
                let v = self.args.get(field).map(Py::show).unwrap_or_default();
                if let Some(at) = self.field_at(field, format!("{field} = {v}")) {
                    f = f.also(at);
                }
            }
            self.out.push(f);
        }
        let enabled = |w: &Work, s: &str| w.get(&format!("{s}.enabled")).is_some_and(Py::truthy);
        if enabled(self, "fp16") && (enabled(self, "bf16") || enabled(self, "bfloat16")) {
            let f = Finding::new(
                codes::DS_PRECISION,
                Severity::Error,
                "fp16 and bf16 are both enabled in the DeepSpeed config",
                At::ds(self.ds_span("bf16.enabled"), label_of(self, "bf16.enabled")),
            )
            .also(At::ds(
                self.ds_span("fp16.enabled"),
                label_of(self, "fp16.enabled"),
            ))
            .help(
                "DeepSpeed refuses it (\"bfloat16 and fp16 modes cannot be simultaneously \
                 enabled\"); write \"auto\" for both and choose in TrainingArguments",
            );
            self.out.push(f);
        }
        self.deepspeed_values();
    }

    /// The parameters of one of DeepSpeed's schedulers, as its constructor takes them.
    fn scheduler_params(&mut self, name: &str) {
        let Some((_, required, optional)) = DS_SCHEDULER_PARAMS.iter().find(|(n, ..)| *n == name)
        else {
            return;
        };
        let params = self
            .get("scheduler.params")
            .cloned()
            .unwrap_or(Py::Dict(Vec::new()));
        let Py::Dict(items) = &params else { return };
        let mut all: Vec<&str> = required.to_vec();
        all.extend_from_slice(optional);
        for (k, _) in items {
            if all.contains(&k.as_str()) {
                continue;
            }
            let path = format!("scheduler.params.{k}");
            let hint = crate::check::suggest::closest(k, all.iter().copied())
                .map(|b| format!("did you mean `{b}`? "))
                .unwrap_or_default();
            self.out.push(
                Finding::new(
                    codes::DS_BAD_VALUE,
                    Severity::Error,
                    format!("`{k}` is not a parameter of DeepSpeed's {name}"),
                    At::ds(self.ds_key_span(&path), "not a parameter"),
                )
                .help(format!(
                    "DeepSpeed refuses it when it builds the scheduler (\"__init__() got an \
                     unexpected keyword argument '{k}'\"); {hint}{name} takes {}",
                    all.join(", ")
                )),
            );
        }
        for k in *required {
            if params.get(k).is_none() {
                self.out.push(
                    Finding::new(
                        codes::DS_BAD_VALUE,
                        Severity::Error,
                        format!("DeepSpeed's {name} needs `{k}`, and the config does not give it"),
                        At::ds(self.ds_key_span("scheduler.params"), format!("no {k}")),
                    )
                    .help(format!(
                        "DeepSpeed refuses it when it builds the scheduler (\"__init__() missing 1 \
                         required positional argument: '{k}'\"); write it (\"auto\" where HF fills it)"
                    )),
                );
            }
        }
        let warmup = params.get("warmup_num_steps").filter(|v| !v.is_auto());
        if let (true, Some(v)) = (self.facts.ds_warmup_steps_positive_int, warmup) {
            if name.starts_with("Warmup") && !matches!(v, Py::Int(1..) | Py::Bool(true)) {
                self.out.push(
                    Finding::new(
                        codes::DS_BAD_VALUE,
                        Severity::Error,
                        format!(
                            "`warmup_num_steps` = {} is not a positive integer",
                            v.show()
                        ),
                        At::ds(
                            self.ds_span("scheduler.params.warmup_num_steps"),
                            "must be ≥ 1",
                        ),
                    )
                    .help(format!(
                        "DeepSpeed refuses it (\"warmup_num_steps must be a positive integer, got \
                         {}\"); write 1 for no warmup, or \"auto\"",
                        v.show()
                    )),
                );
            }
        }
    }

    /// Values DeepSpeed validates: the ZeRO stage, offload devices, optimizer and scheduler types.
    pub(super) fn deepspeed_values(&mut self) {
        let bad = |w: &Work, path: &str, msg: String, help: String| {
            Finding::new(
                codes::DS_BAD_VALUE,
                Severity::Error,
                msg,
                At::ds(w.ds_span(path), "refused by DeepSpeed"),
            )
            .help(help)
        };
        if let Some(stage) = self.get("zero_optimization.stage").cloned() {
            let ok = matches!(stage, Py::Int(0..=3));
            if !ok {
                let f = bad(
                    self,
                    "zero_optimization.stage",
                    format!("ZeRO stage {} does not exist", stage.show()),
                    "DeepSpeed's ZeRO config takes stage 0, 1, 2 or 3".into(),
                );
                self.out.push(f);
            }
        }
        for section in ["offload_optimizer", "offload_param"] {
            let path = format!("zero_optimization.{section}.device");
            if let Some(Py::Str(d)) = self.get(&path).cloned() {
                if !["none", "cpu", "nvme"].contains(&d.as_str()) {
                    let f = bad(
                        self,
                        &path,
                        format!("offload device \"{d}\" does not exist"),
                        "DeepSpeed's offload config takes \"none\", \"cpu\" or \"nvme\"".into(),
                    );
                    self.out.push(f);
                }
            }
        }
        if let Some(Py::Str(name)) = self.get("optimizer.type").cloned() {
            let lower = name.to_lowercase();
            let known = self.facts.ds_optimizers.contains(&lower.as_str());
            if !known && !TORCH_OPTIMIZERS.contains(&name.as_str()) {
                let f = bad(
                    self,
                    "optimizer.type",
                    format!("`{name}` is not an optimizer DeepSpeed knows"),
                    format!(
                        "DeepSpeed's optimizers: {}; or a class of torch.optim (exact case)",
                        self.facts.ds_optimizers.join(", ")
                    ),
                );
                self.out.push(f);
            }
        }
        // `get_communication_data_type` (DeepSpeed v0.19.8 runtime/config.py): lowercased, then
        // one of three names.
        for key in [
            "communication_data_type",
            "seq_parallel_communication_data_type",
        ] {
            let Some(v) = self.get(key).cloned() else {
                continue;
            };
            let ok = match &v {
                Py::None => true,
                Py::Str(s) => ["fp16", "bf16", "fp32"].contains(&s.to_lowercase().as_str()),
                _ => false,
            };
            if !ok {
                let f = bad(
                    self,
                    key,
                    format!("{key} {} is not one DeepSpeed takes", v.repr()),
                    format!(
                        "DeepSpeed refuses it (\"Invalid communication_data_type. Supported data \
                         types: ['fp16', 'bf16', 'fp32']. Got: {}\"); write \"fp32\" (not \
                         \"float32\"), \"fp16\" or \"bf16\"",
                        v.show().to_lowercase()
                    ),
                );
                self.out.push(f);
            }
        }
        let stage = self
            .get("zero_optimization.stage")
            .and_then(Py::number)
            .unwrap_or(0.0);
        if let Some(Py::Str(name)) = self.get("optimizer.type").cloned() {
            let tested = self.facts.ds_zero_supported_optimizers;
            let allowed = self
                .get("zero_allow_untested_optimizer")
                .is_some_and(Py::truthy);
            if stage >= 1.0 && !allowed && !tested.contains(&name.to_lowercase().as_str()) {
                self.out.push(
                    Finding::new(
                        codes::UNTESTED_OPTIMIZER,
                        Severity::Error,
                        format!(
                            "DeepSpeed does not test `{name}` with ZeRO stage {}, and the config does \
                             not allow untested optimizers",
                            py_num(stage)
                        ),
                        At::ds(self.ds_span("optimizer.type"), format!("tested with ZeRO: {}", tested.join(", "))),
                    )
                    .help(
                        "DeepSpeed refuses it (\"You are using an untested ZeRO Optimizer. Please add \
                         <\"zero_allow_untested_optimizer\": true> in the configuration file to use \
                         it.\"); add that key, or use a tested optimizer",
                    ),
                );
            }
        }
        if let Some(Py::Str(name)) = self.get("scheduler.type").cloned() {
            self.scheduler_params(&name);
            let own = crate::schema::blocks::DS_SCHEDULES.contains(&name.as_str());
            if !own && !TORCH_SCHEDULERS.contains(&name.as_str()) {
                let f = bad(
                    self,
                    "scheduler.type",
                    format!("`{name}` is not a scheduler DeepSpeed knows"),
                    format!(
                        "DeepSpeed refuses it (\"DeepSpeed does not recognize LR scheduler {name}\"); \
                         one of: {}",
                        crate::schema::blocks::DS_SCHEDULES.join(", ")
                    ),
                );
                self.out.push(f);
            }
        }
    }
}

/// DeepSpeed's own schedulers: the constructor parameters of each, required ones first
/// (DeepSpeed v0.19.8 `runtime/lr_schedules.py`; the names are the schema's `DS_SCHEDULES`).
/// DeepSpeed calls `Class(optimizer, **params)`, so an unknown parameter or a missing required
/// one is a `TypeError` when the engine builds the scheduler.
const DS_SCHEDULER_PARAMS: &[(&str, &[&str], &[&str])] = &[
    (
        "LRRangeTest",
        &[],
        &[
            "lr_range_test_min_lr",
            "lr_range_test_step_size",
            "lr_range_test_step_rate",
            "lr_range_test_staircase",
            "last_batch_iteration",
        ],
    ),
    (
        "OneCycle",
        &["cycle_min_lr", "cycle_max_lr"],
        &[
            "decay_lr_rate",
            "cycle_first_step_size",
            "cycle_second_step_size",
            "cycle_first_stair_count",
            "cycle_second_stair_count",
            "decay_step_size",
            "cycle_momentum",
            "cycle_min_mom",
            "cycle_max_mom",
            "decay_mom_rate",
            "last_batch_iteration",
        ],
    ),
    (
        "WarmupLR",
        &[],
        &[
            "warmup_min_lr",
            "warmup_max_lr",
            "warmup_num_steps",
            "warmup_type",
            "last_batch_iteration",
        ],
    ),
    (
        "WarmupDecayLR",
        &["total_num_steps"],
        &[
            "warmup_min_lr",
            "warmup_max_lr",
            "warmup_num_steps",
            "warmup_type",
            "last_batch_iteration",
        ],
    ),
    (
        "WarmupCosineLR",
        &["total_num_steps"],
        &[
            "warmup_min_ratio",
            "warmup_num_steps",
            "cos_min_ratio",
            "warmup_type",
            "last_batch_iteration",
        ],
    ),
];

/// `torch.optim.lr_scheduler` classes DeepSpeed falls back to by name.
const TORCH_SCHEDULERS: &[&str] = &[
    "LambdaLR",
    "MultiplicativeLR",
    "StepLR",
    "MultiStepLR",
    "ConstantLR",
    "LinearLR",
    "ExponentialLR",
    "SequentialLR",
    "CosineAnnealingLR",
    "ChainedScheduler",
    "ReduceLROnPlateau",
    "CyclicLR",
    "CosineAnnealingWarmRestarts",
    "OneCycleLR",
    "PolynomialLR",
];

/// `torch.optim` classes DeepSpeed builds by name when the type is not one of its own.
const TORCH_OPTIMIZERS: &[&str] = &[
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ASGD",
    "LBFGS",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
    "SparseAdam",
];
