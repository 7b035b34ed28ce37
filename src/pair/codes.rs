//! Codes of the pair linter (`recipe check ds_config.json --args …`): R12xx. A pair also gets
//! the raw-key codes of recipes where the cause is the same (R0030 unknown DeepSpeed key, R0031
//! deprecated DeepSpeed key, R0032 unknown TrainingArguments field, R0033 renamed field).

// The first line of the module doc lists the shared codes; keep them in [`SHARED`].

/// The file is not JSON.
pub const JSON_SYNTAX: &str = "R1201";
/// The file is JSON, but not an object of settings.
pub const JSON_NOT_OBJECT: &str = "R1202";
/// A key given twice in one object (Python keeps the last).
pub const JSON_DUPLICATE_KEY: &str = "R1203";
/// A TrainingArguments value of the wrong type (argparse / the dataclass refuse it).
pub const ARGS_BAD_VALUE: &str = "R1204";
/// TrainingArguments' own validation refuses the values.
pub const ARGS_INVALID: &str = "R1205";
/// The Trainer refuses the setup before training (no eval data, save_only_model, …).
pub const TRAINER_REFUSES: &str = "R1206";
/// An explicit DeepSpeed value differs from the TrainingArguments value HF fills it from.
pub const DS_HF_MISMATCH: &str = "R1210";
/// The HF scheduler refuses its arguments (`lr_scheduler_kwargs`).
pub const HF_SCHEDULER_REFUSES: &str = "R1207";
/// accelerate inserts or overwrites a value silently.
pub const ACCELERATE_CHANGES: &str = "R1212";
/// TrainingArguments' precision against the other precision enabled in the config.
pub const MIXED_PRECISION_CONFLICT: &str = "R1213";
/// A TrainingArguments value the run does not use (DeepSpeed's section or default wins).
pub const ARGS_IGNORED: &str = "R1215";
/// No `zero_optimization` section (accelerate requires one).
pub const NO_ZERO_SECTION: &str = "R1214";
/// DeepSpeed's batch sizes do not agree at the world size (or none is given).
pub const DS_BATCH: &str = "R1220";
/// fp16 and bf16 both enabled.
pub const DS_PRECISION: &str = "R1221";
/// A value DeepSpeed refuses (ZeRO stage, offload device, optimizer or scheduler type).
pub const DS_BAD_VALUE: &str = "R1222";

/// Code, short name, summary.
pub const CODES: &[(&str, &str, &str)] = &[
    (JSON_SYNTAX, "json-syntax", "the file is not JSON"),
    (
        JSON_NOT_OBJECT,
        "json-not-object",
        "the file is JSON but not an object of settings",
    ),
    (
        JSON_DUPLICATE_KEY,
        "json-duplicate-key",
        "a key given twice in one object; the last one counts",
    ),
    (
        ARGS_BAD_VALUE,
        "args-bad-value",
        "a TrainingArguments value of the wrong type",
    ),
    (
        ARGS_INVALID,
        "args-invalid",
        "TrainingArguments' own validation refuses the values",
    ),
    (
        TRAINER_REFUSES,
        "trainer-refuses",
        "the Trainer refuses the setup before training",
    ),
    (
        DS_HF_MISMATCH,
        "ds-hf-mismatch",
        "an explicit DeepSpeed value differs from the TrainingArguments value HF fills it from",
    ),
    (
        HF_SCHEDULER_REFUSES,
        "hf-scheduler-refuses",
        "the HF scheduler refuses its lr_scheduler_kwargs",
    ),
    (
        ACCELERATE_CHANGES,
        "accelerate-changes",
        "accelerate inserts or overwrites a DeepSpeed value silently",
    ),
    (
        MIXED_PRECISION_CONFLICT,
        "mixed-precision-conflict",
        "TrainingArguments' precision against the other one enabled in the config",
    ),
    (
        NO_ZERO_SECTION,
        "no-zero-section",
        "the config has no zero_optimization section",
    ),
    (
        DS_BATCH,
        "ds-batch",
        "DeepSpeed's batch sizes do not agree at the world size",
    ),
    (DS_PRECISION, "ds-precision", "fp16 and bf16 both enabled"),
    (DS_BAD_VALUE, "ds-bad-value", "a value DeepSpeed refuses"),
];

/// The recipe codes a pair can get too (same cause): unknown and deprecated DeepSpeed keys,
/// unknown and renamed TrainingArguments fields, an untested ZeRO optimizer, an "auto" nothing
/// fills, a key DeepSpeed has removed.
pub const SHARED: &[&str] = &[
    "R0030", "R0031", "R0032", "R0033", "R0403", "R0901", "R0909",
];

/// An "auto" that neither HF nor accelerate fills (the recipe code).
pub const AUTO_UNFILLED: &str = crate::rules::compat::AUTO_UNFILLED;
/// An optimizer DeepSpeed does not test with ZeRO, without the flag that allows it.
pub const UNTESTED_OPTIMIZER: &str = crate::rules::optimizer::UNTESTED_OPTIMIZER;
/// A key the target DeepSpeed has removed.
pub const REMOVED_DEEPSPEED_KEY: &str = crate::rules::compat::REMOVED_DEEPSPEED_KEY;
