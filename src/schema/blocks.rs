//! The table of every block and key.
//!
//! Upstream names: `deepspeed` is the DeepSpeed config key (dotted path), `hf` the
//! transformers `TrainingArguments` field (or, marked "script", an argument of the training
//! script that `recipe build` launches). Defaults are the ones the recipe language applies;
//! where they mirror an upstream default the doc says which.

use super::types::{ArgSpec, CallSpec, Ty};
use super::{BlockSpec, BodySpec, Derive, KeyDefault, KeySpec, LabelSpec, Lit, RawKind};

const fn key(name: &'static str, ty: Ty, doc: &'static str) -> KeySpec {
    KeySpec {
        name,
        ty,
        doc,
        default: KeyDefault::None,
        deepspeed: None,
        ds_aliases: &[],
        stages: &[],
        hf: None,
        required: false,
        kinds: &[],
        kind_defaults: &[],
    }
}

impl KeySpec {
    const fn val(mut self, value: Lit, why: &'static str) -> Self {
        self.default = KeyDefault::Value(value, why);
        self
    }
    const fn derived(mut self, rule: Derive, text: &'static str) -> Self {
        self.default = KeyDefault::Derived(rule, text);
        self
    }
    const fn later(mut self, text: &'static str) -> Self {
        self.default = KeyDefault::Later(text);
        self
    }
    const fn upstream(mut self, value: Lit, text: &'static str) -> Self {
        self.default = KeyDefault::Upstream(value, text);
        self
    }
    const fn stages(mut self, stages: &'static [i64]) -> Self {
        self.stages = stages;
        self
    }
    const fn aliases(mut self, names: &'static [&'static str]) -> Self {
        self.ds_aliases = names;
        self
    }
    const fn ds(mut self, key: &'static str) -> Self {
        self.deepspeed = Some(key);
        self
    }
    const fn hf(mut self, field: &'static str) -> Self {
        self.hf = Some(field);
        self
    }
    const fn required(mut self) -> Self {
        self.required = true;
        self
    }
    const fn kinds(mut self, kinds: &'static [&'static str]) -> Self {
        self.kinds = kinds;
        self
    }
    /// Other defaults for some of the kinds (see [`KeySpec::kind_defaults`]).
    const fn val_for(mut self, defaults: &'static [super::KindDefault]) -> Self {
        self.kind_defaults = defaults;
        self
    }
}

const fn arg(name: &'static str, ty: Ty, doc: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        ty,
        required: false,
        doc,
        upstream: None,
    }
}

impl ArgSpec {
    const fn required(mut self) -> Self {
        self.required = true;
        self
    }
    const fn upstream(mut self, key: &'static str) -> Self {
        self.upstream = Some(key);
        self
    }
}

const POSITIVE: Ty = Ty::Int {
    min: 1,
    max: i64::MAX,
};
const NON_NEGATIVE: Ty = Ty::Int {
    min: 0,
    max: i64::MAX,
};
const LR: Ty = Ty::Number {
    min: 0.0,
    max: f64::INFINITY,
};
/// A learning rate, or one per parameter group (R0319 says which kinds take a list).
const LRS: Ty = Ty::Numbers {
    min: 0.0,
    max: f64::INFINITY,
};
const UNIT: Ty = Ty::Number { min: 0.0, max: 1.0 };

/// The parameter-name substrings HF's Trainer excludes from weight decay when it builds the
/// optimizer (`Trainer.get_decay_parameter_names`: biases and normalization layers).
pub const HF_NO_DECAY: &[&str] = &["bias", "LayerNorm.weight"];

/// Optimizer kinds (`optimizer <kind>`): DeepSpeed optimizer types plus the torch/HF ones.
pub const OPTIMIZERS: &[&str] = &[
    "adamw",
    "adam",
    "sgd",
    "adagrad",
    "lamb",
    "lion",
    "adafactor",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
];
const ADAM_LIKE: &[&str] = &[
    "adamw",
    "adam",
    "lamb",
    "lion",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
];
const ADAM_EPS: &[&str] = &[
    "adamw",
    "adam",
    "adagrad",
    "lamb",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
];
const ONEBIT: &[&str] = &["onebitadam", "zerooneadam", "onebitlamb"];

/// The shapes of HF's warmup_stable_decay phases, as words (`upstream::schedules::wsd_shape`
/// gives HF's names: `one_minus_sqrt` is `"1-sqrt"`).
pub const WSD_SHAPES: &[&str] = &["linear", "cosine", "one_minus_sqrt"];

/// Declares the HF and DeepSpeed schedule names once, and their union.
macro_rules! schedules {
    (hf: [$($hf:literal),* $(,)?], deepspeed: [$($ds:literal),* $(,)?] $(,)?) => {
        /// HF `lr_scheduler_type` names accepted by `schedule <kind>`.
        pub const HF_SCHEDULES: &[&str] = &[$($hf),*];
        /// DeepSpeed scheduler types accepted by `schedule <kind>` (case as DeepSpeed spells them).
        pub const DS_SCHEDULES: &[&str] = &[$($ds),*];
        const SCHEDULES: &[&str] = &[$($hf,)* $($ds),*];
    };
}

schedules! {
    hf: [
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "reduce_lr_on_plateau",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
        "greedy",
    ],
    deepspeed: ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"],
}
const WARMED: &[&str] = &[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
];
const DS_WARMUP: &[&str] = &["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"];
/// HF's cosine schedules that end at `min_lr` / `min_lr_rate`.
const MIN_LR_COSINE: &[&str] = &["cosine_with_min_lr", "cosine_warmup_with_min_lr"];
/// The HF schedules that step on an evaluation metric: torch's `ReduceLROnPlateau` and HF's
/// `GreedyLR` (transformers v5.24.0 `optimization.py`), which share most arguments.
const METRIC: &[&str] = &["reduce_lr_on_plateau", "greedy"];
/// HF `GreedyLR`'s own defaults where torch `ReduceLROnPlateau`'s differ
/// (transformers v5.24.0 `optimization.py:GreedyLR.__init__`).
const GREEDY: &[&str] = &["greedy"];

const OFFLOAD_OPTIMIZER: &[CallSpec] = &[
    CallSpec {
        name: "none",
        doc: "no offload: optimizer states stay on the GPU",
        args: &[],
    },
    CallSpec {
        name: "cpu",
        doc: "optimizer states and step on the CPU (DeepSpeedCPUAdam)",
        args: &[
            arg(
                "pin_memory",
                Ty::Bool,
                "page-locked CPU memory (DeepSpeed default true since 0.19.5)",
            )
            .upstream("pin_memory"),
            arg(
                "ratio",
                UNIT,
                "fraction of the optimizer offloaded (ZeRO-3 only below 1)",
            )
            .upstream("ratio"),
            arg(
                "fast_init",
                Ty::Bool,
                "fast initialisation of offloaded states",
            )
            .upstream("fast_init"),
        ],
    },
    CallSpec {
        name: "nvme",
        doc: "optimizer states on NVMe through the CPU (ZeRO-3; stages 1-2 treat it as cpu)",
        args: &[
            arg("path", Ty::Path, "the NVMe mount to swap to")
                .required()
                .upstream("nvme_path"),
            arg("pin_memory", Ty::Bool, "page-locked CPU buffers").upstream("pin_memory"),
            arg(
                "buffer_count",
                POSITIVE,
                "number of swap buffers (DeepSpeed default 4)",
            )
            .upstream("buffer_count"),
            arg("pipeline_read", Ty::Bool, "overlap reads with the step").upstream("pipeline_read"),
            arg("pipeline_write", Ty::Bool, "overlap writes with the step")
                .upstream("pipeline_write"),
            arg("ratio", UNIT, "fraction of the optimizer offloaded").upstream("ratio"),
            arg(
                "fast_init",
                Ty::Bool,
                "fast initialisation of offloaded states",
            )
            .upstream("fast_init"),
        ],
    },
];

const OFFLOAD_PARAM: &[CallSpec] = &[
    CallSpec {
        name: "none",
        doc: "no parameter offload",
        args: &[],
    },
    CallSpec {
        name: "cpu",
        doc: "parameters on the CPU between uses (ZeRO-3 only)",
        args: &[
            arg(
                "pin_memory",
                Ty::Bool,
                "page-locked CPU memory (DeepSpeed default true since 0.19.5)",
            )
            .upstream("pin_memory"),
            arg(
                "max_in_cpu",
                Ty::Size,
                "elements kept in CPU memory when swapping (DeepSpeed default 1e9)",
            )
            .upstream("max_in_cpu"),
        ],
    },
    CallSpec {
        name: "nvme",
        doc: "parameters on NVMe (ZeRO-3 only)",
        args: &[
            arg("path", Ty::Path, "the NVMe mount to swap to")
                .required()
                .upstream("nvme_path"),
            arg("pin_memory", Ty::Bool, "page-locked CPU buffers").upstream("pin_memory"),
            arg(
                "buffer_count",
                POSITIVE,
                "number of swap buffers (DeepSpeed default 5)",
            )
            .upstream("buffer_count"),
            arg(
                "buffer_size",
                Ty::Size,
                "elements per swap buffer (DeepSpeed default 1e8)",
            )
            .upstream("buffer_size"),
            arg(
                "max_in_cpu",
                Ty::Size,
                "elements kept in CPU memory (DeepSpeed default 1e9)",
            )
            .upstream("max_in_cpu"),
        ],
    },
];

const TASKS: &[CallSpec] = &[CallSpec {
    name: "classify",
    doc: "sequence classification with a linear head on the [CLS] representation",
    args: &[arg(
        "labels",
        Ty::Labels,
        "the number of classes, or their names in id order",
    )
    .required()],
}];

/// Every block of the language, in the order docs and `fmt` present them.
pub static BLOCKS: &[BlockSpec] = &[
    BlockSpec {
        name: "recipe",
        doc: "The recipe's name, used for the output directory and in reports.",
        label: LabelSpec::Required {
            ty: Ty::Str,
            what: "a name",
            example: "recipe \"cls\"",
        },
        body: BodySpec::None,
        required: false,
        absent: KeyDefault::Value(Lit::Str("recipe"), "no `recipe` name"),
        keys: &[],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "target",
        doc: "The library versions whose rules and formats the recipe follows (newest known by default).",
        label: LabelSpec::None,
        body: BodySpec::Pairs,
        required: false,
        absent: KeyDefault::None,
        keys: &[
            key("transformers", Ty::Version, "transformers release")
                .val(Lit::Str("5.25.0"), "the newest release recipe knows"),
            key("accelerate", Ty::Version, "accelerate release")
                .val(Lit::Str("1.16.0"), "the newest release recipe knows"),
            key("deepspeed", Ty::Version, "DeepSpeed release")
                .val(Lit::Str("0.19.8"), "the newest release recipe knows"),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "model",
        doc: "The model to fine-tune and its task.",
        label: LabelSpec::Optional {
            ty: Ty::Word(&["bert", "auto"]),
            what: "an architecture",
        },
        body: BodySpec::Items,
        required: true,
        absent: KeyDefault::Value(Lit::Word("auto"), "architecture from the model's config.json"),
        keys: &[
            key("from", Ty::Str, "a local HF-layout directory (config.json, model.safetensors, tokenizer.json) or a hub id")
                .hf("model_name_or_path (script)"),
            key("config", Ty::Path, "a config.json to build a randomly initialised model from (no weights)")
                .hf("config_name (script)"),
            key("task", Ty::Call(TASKS), "what the model is trained to do").required().hf("num_labels (script)"),
            key("hidden_size", POSITIVE, "the hidden size, for the bucket sizes DeepSpeed derives from it when the model is not local")
                .later("read from the model's config.json"),
            key("dropout", UNIT, "override of the hidden and attention dropout (0 for exact parity runs)")
                .later("the model config's"),
            key("gradient_checkpointing", Ty::Bool, "recompute activations in backward to save memory")
                .hf("activation_checkpointing (gradient_checkpointing before 5.23)")
                .upstream(Lit::Bool(false), "HF gradient_checkpointing"),
        ],
        one_of: &[&["from", "config"]],
        exclusive: &[],
    },
    BlockSpec {
        name: "data",
        doc: "The training and evaluation data and how to read it.",
        label: LabelSpec::None,
        body: BodySpec::Items,
        required: true,
        absent: KeyDefault::None,
        keys: &[
            key("train", Ty::Path, "training data: a JSONL, CSV or TSV file").required().hf("train_file (script)"),
            key("eval", Ty::Path, "evaluation data, evaluated at each epoch end").hf("validation_file (script)"),
            key("test", Ty::Path, "held-out test data, evaluated once after training").hf("test_file (script)"),
            key("format", Ty::Word(&["auto", "jsonl", "csv", "tsv"]), "file format")
                .derived(Derive::FormatFromExtension, "from the training file's extension"),
            key("text", Ty::Str, "the field holding the text")
                .val(Lit::Str("text"), "the usual field name"),
            key("text_pair", Ty::Str, "a second text field, for sentence-pair tasks"),
            key("label", Ty::Str, "the field holding the label")
                .val(Lit::Str("label"), "the usual field name"),
            key("max_len", Ty::Int { min: 1, max: 1_000_000 }, "tokens per example after truncation")
                .hf("max_seq_length (script)")
                .val(Lit::Int(128), "recipe default"),
            key("samples", POSITIVE, "number of training examples, when the training file is not local")
                .later("counted from the training file"),
            key("shuffle", Ty::Bool, "shuffle the training data each epoch (seeded)")
                .hf("train_sampling_strategy (\"sequential\" when false; transformers ≥ 5.2.0)")
                .val(Lit::Bool(true), "HF Trainer shuffles the training set"),
            key("drop_last", Ty::Bool, "drop the last incomplete batch of each epoch")
                .hf("dataloader_drop_last")
                .val(Lit::Bool(false), "HF dataloader_drop_last default"),
            key("workers", NON_NEGATIVE, "data loader worker processes").hf("dataloader_num_workers")
                .val(Lit::Int(0), "HF dataloader_num_workers default"),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "batch",
        doc: "Batch sizes: global = micro x accumulate x data-parallel world size.",
        label: LabelSpec::None,
        body: BodySpec::Items,
        required: true,
        absent: KeyDefault::None,
        keys: &[
            key("micro", POSITIVE, "examples per GPU per forward/backward pass")
                .ds("train_micro_batch_size_per_gpu")
                .hf("per_device_train_batch_size"),
            key("accumulate", POSITIVE, "micro-batches accumulated per optimizer step")
                .ds("gradient_accumulation_steps")
                .hf("gradient_accumulation_steps")
                .later("`1`, or derived from `global` (the batch inference)"),
            key("global", POSITIVE, "examples per optimizer step over all GPUs; checked against the others")
                .ds("train_batch_size")
                .later("micro × accumulate × world size (the batch inference)"),
            key("eval_micro", POSITIVE, "examples per GPU per evaluation pass")
                .hf("per_device_eval_batch_size")
                .derived(Derive::TrainingMicro, "the training micro batch"),
        ],
        one_of: &[&["micro", "global"]],
        exclusive: &[],
    },
    BlockSpec {
        name: "optimizer",
        doc: "The optimizer and its hyper-parameters.",
        label: LabelSpec::Required {
            ty: Ty::Word(OPTIMIZERS),
            what: "an optimizer kind",
            example: "optimizer adamw { lr = 3e-5 }",
        },
        body: BodySpec::Items,
        required: false,
        absent: KeyDefault::Value(Lit::Word("adamw"), "AdamW, HF's default optimizer (optim adamw_torch)"),
        keys: &[
            // First: `no_decay`'s default depends on it (keys resolve in this order).
            key("owner", Ty::Word(&["deepspeed", "hf"]), "who builds the optimizer: a DeepSpeed `optimizer` section, or HF's `optim`")
                .ds("optimizer")
                .hf("optim")
                .val(Lit::Word("deepspeed"), "recipe default: a DeepSpeed optimizer section"),
            key("lr", LR, "peak learning rate").ds("optimizer.params.lr").hf("learning_rate")
                .val(Lit::Float(5e-5), "HF TrainingArguments.learning_rate"),
            key("betas", Ty::Pair { min: 0.0, max: 1.0 }, "Adam moment decay rates")
                .ds("optimizer.params.betas")
                .hf("adam_beta1, adam_beta2")
                .kinds(ADAM_LIKE)
                .val(Lit::Floats(&[0.9, 0.999]), "HF adam_beta1/adam_beta2 (also DeepSpeed's)"),
            key("eps", LR, "denominator epsilon")
                .ds("optimizer.params.eps")
                .hf("adam_epsilon")
                .kinds(ADAM_EPS)
                .val(Lit::Float(1e-8), "HF adam_epsilon (also DeepSpeed's)"),
            key("weight_decay", LR, "decoupled weight decay (AdamW) or L2 penalty (adam, sgd)")
                .ds("optimizer.params.weight_decay")
                .hf("weight_decay")
                .val(Lit::Float(0.0), "HF weight_decay (also DeepSpeed's)"),
            key("no_decay", Ty::StrList, "parameter-name substrings excluded from weight decay")
                .derived(Derive::NoDecay, "with `owner = hf`, HF Trainer's grouping, `[\"bias\", \"LayerNorm.weight\"]`; with `owner = deepspeed`, `[]`: DeepSpeed gets one parameter group"),
            key("momentum", UNIT, "SGD momentum").ds("optimizer.params.momentum").kinds(&["sgd"])
                .val(Lit::Float(0.0), "torch SGD"),
            key("nesterov", Ty::Bool, "Nesterov momentum").ds("optimizer.params.nesterov").kinds(&["sgd"])
                .val(Lit::Bool(false), "torch SGD"),
            key("bias_correction", Ty::Bool, "Adam bias correction")
                .ds("optimizer.params.bias_correction")
                .kinds(&["adamw", "adam", "lamb", "onebitadam", "zerooneadam", "onebitlamb"])
                .val(Lit::Bool(true), "DeepSpeed Adam"),
            key("amsgrad", Ty::Bool, "the AMSGrad variant")
                .ds("optimizer.params.amsgrad")
                .kinds(&["adamw", "adam"])
                .val(Lit::Bool(false), "DeepSpeed Adam"),
            key("torch_adam", Ty::Bool, "use torch's Adam instead of DeepSpeed's fused kernel")
                .ds("optimizer.params.torch_adam")
                .kinds(&["adamw", "adam"])
                .val(Lit::Bool(false), "DeepSpeed Adam"),
            key("freeze_step", POSITIVE, "warm-up steps before 1-bit compression starts")
                .ds("optimizer.params.freeze_step")
                .kinds(ONEBIT)
                .upstream(Lit::Int(100_000), "DeepSpeed's 1-bit optimizers"),
            key("max_coeff", LR, "LAMB trust-ratio upper bound").ds("optimizer.params.max_coeff").kinds(&["lamb", "onebitlamb"])
                .upstream(Lit::Float(10.0), "DeepSpeed FusedLamb"),
            key("min_coeff", LR, "LAMB trust-ratio lower bound").ds("optimizer.params.min_coeff").kinds(&["lamb", "onebitlamb"])
                .upstream(Lit::Float(0.01), "DeepSpeed FusedLamb"),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "schedule",
        doc: "The learning-rate schedule: an HF lr_scheduler_type or a DeepSpeed scheduler.",
        label: LabelSpec::Required {
            ty: Ty::Word(SCHEDULES),
            what: "a schedule kind",
            example: "schedule linear { warmup = 6% }",
        },
        body: BodySpec::Items,
        required: false,
        absent: KeyDefault::Value(Lit::Word("linear"), "HF's default lr_scheduler_type"),
        keys: &[
            key("warmup", Ty::Steps, "warmup length: optimizer steps, or a fraction of all steps")
                .ds("scheduler.params.warmup_num_steps")
                .hf("warmup_steps (a fraction: warmup_ratio before transformers 5.0)")
                .kinds(WARMED)
                .val(Lit::Int(0), "HF warmup_steps"),
            key("warmup_type", Ty::Word(&["linear", "log"]), "shape of a DeepSpeed warmup")
                .ds("scheduler.params.warmup_type")
                .kinds(DS_WARMUP)
                .val(Lit::Word("linear"), "recipe default, like HF's warmup (DeepSpeed's own is log)"),
            key("min_lr", LRS, "learning rate at the start of warmup / end of decay (a metric-driven schedule's floor; one per parameter group for those)")
                .ds("scheduler.params.warmup_min_lr")
                .hf("lr_scheduler_kwargs.min_lr")
                .kinds(&["WarmupLR", "WarmupDecayLR", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "reduce_lr_on_plateau", "greedy"])
                .val(Lit::Float(0.0), "HF's auto value for warmup_min_lr")
                .val_for(&[(GREEDY, Lit::Float(1e-3), "HF GreedyLR")]),
            key("min_lr_rate", UNIT, "final learning rate as a fraction of lr, instead of min_lr")
                .hf("lr_scheduler_kwargs.min_lr_rate")
                .kinds(MIN_LR_COSINE),
            key("warmup_lr_rate", UNIT, "first warmup step's learning rate as a fraction of lr")
                .hf("lr_scheduler_kwargs.warmup_lr_rate")
                .kinds(&["cosine_warmup_with_min_lr"])
                .later("1 / warmup: HF warms up as (step + 1) / warmup"),
            key("max_lr", LRS, "peak learning rate of a DeepSpeed warmup; greedy's ceiling (one per parameter group for it)")
                .ds("scheduler.params.warmup_max_lr")
                .hf("lr_scheduler_kwargs.max_lr")
                .kinds(&["WarmupLR", "WarmupDecayLR", "greedy"])
                .derived(Derive::OptimizerLr, "the optimizer's lr")
                .val_for(&[(GREEDY, Lit::Float(1.0), "HF GreedyLR")]),
            key("warmup_min_ratio", UNIT, "start of the cosine warmup, as a fraction of lr")
                .ds("scheduler.params.warmup_min_ratio")
                .kinds(&["WarmupCosineLR"])
                .val(Lit::Float(0.0), "DeepSpeed WarmupCosineLR"),
            key("cos_min_ratio", UNIT, "end of the cosine decay, as a fraction of lr")
                .ds("scheduler.params.cos_min_ratio")
                .kinds(&["WarmupCosineLR"])
                .val(Lit::Float(0.0), "recipe default for HF parity (DeepSpeed's own is 1e-4)"),
            key("num_cycles", LR, "cosine cycles (0.5 = one half-wave down)")
                .hf("lr_scheduler_kwargs.num_cycles")
                .kinds(&["cosine", "cosine_with_restarts", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"])
                .derived(Derive::CosineCycles, "`0.5` (`cosine`, `cosine_with_min_lr`, `cosine_warmup_with_min_lr`, a cosine `decay_shape`), `1` (`cosine_with_restarts`), as HF"),
            key("power", LR, "polynomial decay power").hf("lr_scheduler_kwargs.power").kinds(&["polynomial"])
                .val(Lit::Float(1.0), "HF polynomial"),
            key("lr_end", LR, "final learning rate of the polynomial decay")
                .hf("lr_scheduler_kwargs.lr_end")
                .kinds(&["polynomial"])
                .val(Lit::Float(1e-7), "HF polynomial"),
            key("timescale", POSITIVE, "inverse-sqrt time scale")
                .hf("lr_scheduler_kwargs.timescale")
                .kinds(&["inverse_sqrt"])
                .later("the warmup steps (HF inverse_sqrt)"),
            key("decay", Ty::Steps, "length of the final decay phase (HF requires it; written as whole steps)")
                .required()
                .hf("lr_scheduler_kwargs.num_decay_steps")
                .kinds(&["warmup_stable_decay"]),
            key("min_lr_ratio", UNIT, "final learning rate as a fraction of lr")
                .hf("lr_scheduler_kwargs.min_lr_ratio")
                .kinds(&["warmup_stable_decay"])
                .val(Lit::Float(0.0), "HF warmup_stable_decay"),
            key("stable", Ty::Steps, "length of the constant phase between warmup and decay (written as whole steps)")
                .hf("lr_scheduler_kwargs.num_stable_steps")
                .kinds(&["warmup_stable_decay"])
                .later("the steps left after warmup and decay (HF warmup_stable_decay)"),
            key("warmup_shape", Ty::Word(WSD_SHAPES), "shape of the warmup (one_minus_sqrt is HF's \"1-sqrt\")")
                .hf("lr_scheduler_kwargs.warmup_type")
                .kinds(&["warmup_stable_decay"])
                .val(Lit::Word("linear"), "HF warmup_stable_decay"),
            key("decay_shape", Ty::Word(WSD_SHAPES), "shape of the decay (one_minus_sqrt is HF's \"1-sqrt\")")
                .hf("lr_scheduler_kwargs.decay_type")
                .kinds(&["warmup_stable_decay"])
                .val(Lit::Word("cosine"), "HF warmup_stable_decay"),
            key("factor", UNIT, "LR reduction factor on a plateau (greedy also divides by it on improvement)").hf("lr_scheduler_kwargs.factor").kinds(METRIC)
                .val(Lit::Float(0.1), "torch ReduceLROnPlateau")
                .val_for(&[(GREEDY, Lit::Float(0.95), "HF GreedyLR")]),
            key("patience", NON_NEGATIVE, "evaluations without improvement before reducing (greedy: also with improvement before raising)").hf("lr_scheduler_kwargs.patience").kinds(METRIC)
                .val(Lit::Int(10), "torch ReduceLROnPlateau, HF GreedyLR"),
            key("cooldown", NON_NEGATIVE, "evaluations after a reduction before counting again").hf("lr_scheduler_kwargs.cooldown").kinds(METRIC)
                .val(Lit::Int(0), "torch ReduceLROnPlateau, HF GreedyLR"),
            key("mode", Ty::Word(&["min", "max"]), "whether the metric should fall (min, a loss) or rise (max)").hf("lr_scheduler_kwargs.mode").kinds(METRIC)
                .val(Lit::Word("min"), "torch ReduceLROnPlateau, HF GreedyLR"),
            key("threshold", LR, "the least change that counts as an improvement").hf("lr_scheduler_kwargs.threshold").kinds(METRIC)
                .val(Lit::Float(1e-4), "torch ReduceLROnPlateau")
                .val_for(&[(GREEDY, Lit::Float(1e-6), "HF GreedyLR")]),
            key("threshold_mode", Ty::Word(&["rel", "abs"]), "threshold relative to the best metric (rel) or absolute (abs)").hf("lr_scheduler_kwargs.threshold_mode").kinds(METRIC)
                .val(Lit::Word("rel"), "torch ReduceLROnPlateau")
                .val_for(&[(GREEDY, Lit::Word("abs"), "HF GreedyLR")]),
            key("eps", LR, "an LR change smaller than this is not made").hf("lr_scheduler_kwargs.eps").kinds(METRIC)
                .val(Lit::Float(1e-8), "torch ReduceLROnPlateau, HF GreedyLR"),
            key("increase_cooldown", NON_NEGATIVE, "evaluations after an increase before counting again (HF's `warmup`)").hf("lr_scheduler_kwargs.warmup").kinds(GREEDY)
                .val(Lit::Int(0), "HF GreedyLR"),
            key("smooth", Ty::Bool, "compare a rolling average of the metric instead of the metric").hf("lr_scheduler_kwargs.smooth").kinds(GREEDY)
                .val(Lit::Bool(false), "HF GreedyLR"),
            key("window_size", POSITIVE, "evaluations in the rolling average (with smooth)").hf("lr_scheduler_kwargs.window_size").kinds(GREEDY)
                .val(Lit::Int(50), "HF GreedyLR"),
            key("reset_start", NON_NEGATIVE, "reductions attempted at min_lr before the LR is reset to its start").hf("lr_scheduler_kwargs.reset_start").kinds(GREEDY)
                .val(Lit::Int(500), "HF GreedyLR"),
            key("verbose", Ty::Bool, "print each LR change").hf("lr_scheduler_kwargs.verbose").kinds(GREEDY)
                .val(Lit::Bool(false), "HF GreedyLR"),
            key("cycle_min_lr", LR, "lowest LR of the cycle (DeepSpeed requires it)")
                .required()
                .ds("scheduler.params.cycle_min_lr")
                .kinds(&["OneCycle"]),
            key("cycle_max_lr", LR, "highest LR of the cycle").ds("scheduler.params.cycle_max_lr").kinds(&["OneCycle"])
                .derived(Derive::OptimizerLr, "the optimizer's lr"),
            key("cycle_first_step_size", POSITIVE, "steps of the rising half").ds("scheduler.params.cycle_first_step_size").kinds(&["OneCycle"])
                .val(Lit::Int(2000), "DeepSpeed OneCycle"),
            key("cycle_second_step_size", POSITIVE, "steps of the falling half").ds("scheduler.params.cycle_second_step_size").kinds(&["OneCycle"])
                .later("`cycle_first_step_size` (DeepSpeed OneCycle)"),
            key("cycle_first_stair_count", NON_NEGATIVE, "stairs in the rising half (0 = smooth)").ds("scheduler.params.cycle_first_stair_count").kinds(&["OneCycle"])
                .val(Lit::Int(0), "DeepSpeed OneCycle"),
            key("cycle_second_stair_count", NON_NEGATIVE, "stairs in the falling half").ds("scheduler.params.cycle_second_stair_count").kinds(&["OneCycle"])
                .later("`cycle_first_stair_count` (DeepSpeed OneCycle)"),
            key("decay_lr_rate", LR, "LR decay rate after the cycle").ds("scheduler.params.decay_lr_rate").kinds(&["OneCycle"])
                .val(Lit::Float(0.0), "DeepSpeed OneCycle"),
            key("decay_step_size", NON_NEGATIVE, "steps between LR decays after the cycle").ds("scheduler.params.decay_step_size").kinds(&["OneCycle"])
                .val(Lit::Int(0), "DeepSpeed OneCycle"),
            key("cycle_momentum", Ty::Bool, "cycle beta1 too (and set beta2 to 0.99)").ds("scheduler.params.cycle_momentum").kinds(&["OneCycle"])
                .val(Lit::Bool(true), "DeepSpeed OneCycle"),
            key("cycle_min_mom", UNIT, "lowest momentum of the cycle").ds("scheduler.params.cycle_min_mom").kinds(&["OneCycle"])
                .val(Lit::Float(0.8), "DeepSpeed OneCycle"),
            key("cycle_max_mom", UNIT, "highest momentum of the cycle").ds("scheduler.params.cycle_max_mom").kinds(&["OneCycle"])
                .val(Lit::Float(0.9), "DeepSpeed OneCycle"),
            key("decay_mom_rate", LR, "momentum decay rate after the cycle").ds("scheduler.params.decay_mom_rate").kinds(&["OneCycle"])
                .val(Lit::Float(0.0), "DeepSpeed OneCycle"),
            key("start_lr", LR, "LR at the start of the range test").ds("scheduler.params.lr_range_test_min_lr").kinds(&["LRRangeTest"])
                .val(Lit::Float(1e-3), "DeepSpeed LRRangeTest"),
            key("step_size", POSITIVE, "steps per LR increase").ds("scheduler.params.lr_range_test_step_size").kinds(&["LRRangeTest"])
                .val(Lit::Int(2000), "DeepSpeed LRRangeTest"),
            key("step_rate", LR, "LR increase per step_size").ds("scheduler.params.lr_range_test_step_rate").kinds(&["LRRangeTest"])
                .val(Lit::Float(1.0), "DeepSpeed LRRangeTest"),
            key("staircase", Ty::Bool, "increase in stairs rather than continuously").ds("scheduler.params.lr_range_test_staircase").kinds(&["LRRangeTest"])
                .val(Lit::Bool(false), "DeepSpeed LRRangeTest"),
        ],
        one_of: &[],
        // HF takes one or the other (transformers@v5.24.0 optimization.py:
        // get_cosine_with_min_lr_schedule_with_warmup and
        // get_cosine_with_min_lr_schedule_with_warmup_lr_rate, "Only one of min_lr or min_lr_rate").
        exclusive: &[&["min_lr", "min_lr_rate"]],
    },
    BlockSpec {
        name: "train",
        doc: "How long and how to train: epochs, clipping, precision, seed, evaluation.",
        label: LabelSpec::None,
        body: BodySpec::Items,
        required: false,
        absent: KeyDefault::None,
        keys: &[
            key("epochs", Ty::Number { min: 0.0, max: 1e9 }, "passes over the training data (fractions allowed)")
                .hf("num_train_epochs")
                .val(Lit::Float(3.0), "HF num_train_epochs"),
            key("max_steps", POSITIVE, "stop after this many optimizer steps (wins over epochs)").hf("max_steps"),
            key("clip", LR, "clip gradients to this global L2 norm (0 = off)")
                .ds("gradient_clipping")
                .hf("max_grad_norm")
                .val(Lit::Float(1.0), "HF max_grad_norm"),
            key("precision", Ty::Word(&["fp32", "fp16", "bf16"]), "training precision")
                .ds("fp16.enabled, bf16.enabled")
                .hf("fp16, bf16")
                .val(Lit::Word("fp32"), "recipe default: full precision"),
            key("eval_precision", Ty::Word(&["fp32", "fp16", "bf16"]), "precision of evaluation")
                .hf("fp16_full_eval, bf16_full_eval")
                .derived(Derive::TrainingPrecision, "the training precision"),
            key("fp16_backend", Ty::Word(&["amp", "apex"]), "fp16 implementation (apex is incompatible with ZeRO)")
                .ds("amp.enabled")
                .hf("half_precision_backend (transformers 4.x; removed in 5.0, where apex is gone)")
                .val(Lit::Word("amp"), "HF half_precision_backend (torch AMP)"),
            key("loss_scale", Ty::WordOrInt(&["dynamic"], 1, i64::MAX), "fp16 loss scale: dynamic, or a fixed scale")
                .ds("fp16.loss_scale")
                .val(Lit::Word("dynamic"), "DeepSpeed fp16.loss_scale 0 = dynamic"),
            key("initial_scale_power", Ty::Int { min: 0, max: 63 }, "the dynamic loss scale starts at 2^this")
                .ds("fp16.initial_scale_power")
                .val(Lit::Int(16), "DeepSpeed fp16 (since 0.8.0)"),
            key("loss_scale_window", POSITIVE, "good steps before the loss scale doubles")
                .ds("fp16.loss_scale_window")
                .val(Lit::Int(1000), "DeepSpeed fp16"),
            key("hysteresis", POSITIVE, "overflows tolerated before the loss scale halves")
                .ds("fp16.hysteresis")
                .val(Lit::Int(2), "DeepSpeed fp16"),
            key("min_loss_scale", POSITIVE, "the loss scale never drops below this (DeepSpeed requires an integer)")
                .ds("fp16.min_loss_scale")
                .val(Lit::Int(1), "DeepSpeed fp16"),
            key("seed", NON_NEGATIVE, "seed for initialisation, shuffling and dropout").hf("seed")
                .val(Lit::Int(42), "HF seed"),
            key("script", Ty::Path, "the training script `launch.sh` runs: by default the `train.py` that `recipe build` writes beside it, which takes the TrainingArguments; a script of your own also gets the arguments of HF's text-classification example (`--model_name_or_path`, `--train_file`, `--validation_file`, `--test_file`, `--text_column_names`, `--label_column_name`, `--max_seq_length`)")
                .val(Lit::Str("train.py"), "written by `recipe build` beside launch.sh"),
            key("output_dir", Ty::Path, "where checkpoints, metrics and logs go")
                .hf("output_dir")
                .derived(Derive::OutputDir, "`\"out/<recipe name>\"`"),
            key("logging_steps", POSITIVE, "log every this many optimizer steps").ds("steps_per_print").hf("logging_steps")
                .val(Lit::Int(10), "recipe default"),
            key("eval_every", Ty::WordOrInt(&["epoch", "never"], 1, i64::MAX), "evaluate every epoch, never, or every N optimizer steps (HF refuses a strategy without evaluation data)")
                .hf("eval_strategy, eval_steps")
                .derived(Derive::EvalEvery, "`epoch` with `data.eval`, else `never`"),
            key("save_every", Ty::WordOrInt(&["epoch", "never"], 1, i64::MAX), "checkpoint every epoch, never, or every N optimizer steps")
                .hf("save_strategy, save_steps")
                .val(Lit::Word("epoch"), "recipe default"),
            key("auto_find_batch_size", Ty::Bool, "halve the micro batch on out-of-memory (not with ZeRO-3)")
                .hf("auto_find_batch_size (written when true)")
                .val(Lit::Bool(false), "HF auto_find_batch_size"),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "zero",
        doc: "The DeepSpeed ZeRO stage (0-3) and its settings.",
        label: LabelSpec::Required {
            ty: Ty::Int { min: 0, max: 3 },
            what: "a stage (0, 1, 2 or 3)",
            example: "zero 2 { offload optimizer = cpu }",
        },
        body: BodySpec::Items,
        required: false,
        absent: KeyDefault::Value(Lit::Int(0), "no `zero` block: stage 0, DeepSpeed's default"),
        keys: &[
            key("offload optimizer", Ty::Call(OFFLOAD_OPTIMIZER), "where optimizer states live")
                .ds("zero_optimization.offload_optimizer")
                .val(Lit::Word("none"), "DeepSpeed: no offload").stages(&[1, 2, 3]).aliases(&["cpu_offload", "cpu_offload_use_pin_memory"]),
            key("offload param", Ty::Call(OFFLOAD_PARAM), "where parameters live between uses (stage 3)")
                .ds("zero_optimization.offload_param")
                .val(Lit::Word("none"), "DeepSpeed: no offload").stages(&[3]).aliases(&["cpu_offload_param", "cpu_offload_params"]),
            key("overlap_comm", Ty::Bool, "overlap gradient reduction with backward")
                .ds("zero_optimization.overlap_comm")
                .derived(Derive::Stage3, "`true` for stage 3, else `false` (DeepSpeed)").stages(&[1, 2, 3]),
            key("contiguous_gradients", Ty::Bool, "copy gradients into one buffer as they are produced")
                .ds("zero_optimization.contiguous_gradients")
                .val(Lit::Bool(true), "DeepSpeed (since 0.4.3)").stages(&[1, 2, 3]),
            key("reduce_scatter", Ty::Bool, "reduce gradients with reduce-scatter instead of all-reduce")
                .ds("zero_optimization.reduce_scatter")
                .val(Lit::Bool(true), "DeepSpeed (since 0.4.0)").stages(&[1, 2, 3]),
            key("reduce_bucket", Ty::Size, "elements reduced at a time")
                .ds("zero_optimization.reduce_bucket_size")
                .derived(Derive::HiddenSquared, "hidden_size² (HF's auto value), else DeepSpeed's 5e8").stages(&[1, 2, 3]),
            key("allgather_partitions", Ty::Bool, "all-gather updated partitions (else broadcasts)")
                .ds("zero_optimization.allgather_partitions")
                .val(Lit::Bool(true), "DeepSpeed").stages(&[1, 2]),
            key("allgather_bucket", Ty::Size, "elements all-gathered at a time")
                .ds("zero_optimization.allgather_bucket_size")
                .val(Lit::Int(500_000_000), "DeepSpeed allgather_bucket_size 5e8").stages(&[1, 2]),
            key("round_robin_gradients", Ty::Bool, "stage 1-2 CPU offload: parallel gradient copies")
                .ds("zero_optimization.round_robin_gradients")
                .val(Lit::Bool(false), "DeepSpeed").stages(&[1, 2]),
            key("sub_group_size", Ty::Size, "stage 3: parameters per optimizer sub-group")
                .ds("zero_optimization.sub_group_size")
                .val(Lit::Int(1_000_000_000), "DeepSpeed 1e9").stages(&[3]),
            key("prefetch_bucket", Ty::Size, "stage 3: parameter elements prefetched")
                .ds("zero_optimization.stage3_prefetch_bucket_size")
                .derived(Derive::PrefetchBucket, "int(0.9 × hidden_size²) (HF's auto value), else DeepSpeed's 5e7").stages(&[3]).aliases(&["prefetch_bucket_size"]),
            key("param_persistence_threshold", Ty::Size, "stage 3: parameters smaller than this stay unpartitioned")
                .ds("zero_optimization.stage3_param_persistence_threshold")
                .derived(Derive::PersistenceThreshold, "10 × hidden_size (HF's auto value), else DeepSpeed's 1e5").stages(&[3]).aliases(&["param_persistence_threshold"]),
            key("model_persistence_threshold", Ty::Size, "stage 3: cap on unpartitioned parameter elements")
                .ds("zero_optimization.stage3_model_persistence_threshold")
                .later("unlimited (DeepSpeed: sys.maxsize)").stages(&[3]).aliases(&["model_persistence_threshold"]),
            key("max_live_parameters", Ty::Size, "stage 3: parameter elements resident per GPU")
                .ds("zero_optimization.stage3_max_live_parameters")
                .val(Lit::Int(1_000_000_000), "DeepSpeed 1e9").stages(&[3]).aliases(&["max_live_parameters"]),
            key("max_reuse_distance", Ty::Size, "stage 3: keep a parameter if reused within this many elements")
                .ds("zero_optimization.stage3_max_reuse_distance")
                .val(Lit::Int(1_000_000_000), "DeepSpeed 1e9").stages(&[3]).aliases(&["max_reuse_distance"]),
            key("gather_16bit_weights_on_model_save", Ty::Bool, "stage 3: gather full 16-bit weights when saving, for a loadable model")
                .ds("zero_optimization.stage3_gather_16bit_weights_on_model_save")
                .val(Lit::Bool(true), "recipe default: a loadable model.safetensors (DeepSpeed's is false)").stages(&[3]).aliases(&["stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"]),
            key("load_from_fp32_weights", Ty::Bool, "initialise fp32 master weights from the checkpoint's fp32 copy")
                .ds("zero_optimization.load_from_fp32_weights")
                .val(Lit::Bool(true), "DeepSpeed").stages(&[1, 2, 3]),
            key("ignore_unused_parameters", Ty::Bool, "stage 2: tolerate parameters without gradients")
                .ds("zero_optimization.ignore_unused_parameters")
                .val(Lit::Bool(true), "DeepSpeed").stages(&[1, 2]),
            key("elastic_checkpoint", Ty::Bool, "stages 1-2: checkpoints loadable at another world size")
                .ds("zero_optimization.elastic_checkpoint")
                .val(Lit::Bool(false), "DeepSpeed (since 0.5.10)").stages(&[1, 2]),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "cluster",
        doc: "Where the run happens: GPUs per node, nodes, hostfile.",
        label: LabelSpec::None,
        body: BodySpec::Items,
        required: false,
        absent: KeyDefault::None,
        keys: &[
            key("gpus", POSITIVE, "GPUs per node").hf("deepspeed --num_gpus (launcher)")
                .val(Lit::Int(1), "one GPU (use --gpus or cluster.gpus)"),
            key("nodes", POSITIVE, "number of nodes").hf("deepspeed --num_nodes (launcher)")
                .val(Lit::Int(1), "one node (use --nodes or cluster.nodes)"),
            key("hostfile", Ty::Path, "DeepSpeed hostfile listing the nodes and their slots").hf("deepspeed --hostfile (launcher)"),
            key("master_addr", Ty::Str, "address of the rank-0 node").hf("deepspeed --master_addr (launcher)"),
            key("master_port", Ty::Int { min: 1, max: 65535 }, "port of the rendezvous").hf("deepspeed --master_port (launcher)")
                .val(Lit::Int(29500), "DeepSpeed launcher"),
            key("gpu_memory", Ty::Size, "memory per GPU in bytes (80Gi), for the memory estimate"),
        ],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "deepspeed",
        doc: "Raw DeepSpeed config keys, merged into ds_config.json; checked against DeepSpeed's key set.",
        label: LabelSpec::None,
        body: BodySpec::Raw(RawKind::DeepSpeed),
        required: false,
        absent: KeyDefault::None,
        keys: &[],
        one_of: &[],
        exclusive: &[],
    },
    BlockSpec {
        name: "hf",
        doc: "Raw TrainingArguments fields, merged into training_args.json; checked against transformers' fields.",
        label: LabelSpec::None,
        body: BodySpec::Raw(RawKind::Hf),
        required: false,
        absent: KeyDefault::None,
        keys: &[],
        one_of: &[],
        exclusive: &[],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = BLOCKS.iter().map(|b| b.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BLOCKS.len());
        for block in BLOCKS {
            let mut keys: Vec<&str> = block.keys.iter().map(|k| k.name).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(
                keys.len(),
                block.keys.len(),
                "duplicate key in {}",
                block.name
            );
        }
    }

    #[test]
    fn kinds_name_real_labels() {
        for block in BLOCKS {
            let allowed: &[&str] = match block.label {
                LabelSpec::Required {
                    ty: Ty::Word(w), ..
                }
                | LabelSpec::Optional {
                    ty: Ty::Word(w), ..
                } => w,
                _ => &[],
            };
            for key in block.keys {
                for kind in key.kinds {
                    assert!(
                        allowed.contains(kind),
                        "{}.{} names unknown kind {kind}",
                        block.name,
                        key.name
                    );
                }
            }
            for group in block.one_of {
                for name in *group {
                    assert!(
                        block.key(name).is_some(),
                        "{}: one_of names unknown key {name}",
                        block.name
                    );
                }
            }
        }
    }

    #[test]
    fn schedule_kinds_are_hf_or_deepspeed() {
        for kind in SCHEDULES {
            assert!(HF_SCHEDULES.contains(kind) ^ DS_SCHEDULES.contains(kind));
        }
        assert_eq!(SCHEDULES.len(), HF_SCHEDULES.len() + DS_SCHEDULES.len());
    }
}
