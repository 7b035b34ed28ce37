//! Precision rules: the recipe states one training precision (`train.precision`), an optional
//! evaluation precision and the fp16 backend; HF turns them into DeepSpeed's `fp16` / `bf16` /
//! `amp` sections (docs/upstream.md §2.2 Table A), and DeepSpeed accepts only some combinations
//! (docs/upstream.md §3 R-H01, §6.5 R-F01–R-F03, §6.2 R-Z06). Severities follow
//! docs/upstream.md §0.2: "error" and "bug" are errors, "warn" are warnings.

use crate::diagnostics::Diagnostic;
use crate::resolve::{Resolved, Val};
use crate::upstream::versions::{Fact, Version, CHANGES};

use super::{anchor, fix, origin};

/// Half-precision evaluation under DeepSpeed changes the training precision, or is not honoured
/// (docs/upstream.md R-A07).
pub const EVAL_PRECISION: &str = "R0501";
/// Training and evaluation precisions enable both fp16 and bf16 in DeepSpeed
/// (docs/upstream.md R-F01, R-H01).
pub const FP16_AND_BF16: &str = "R0502";
/// Apex AMP with a ZeRO stage (docs/upstream.md R-F02).
pub const APEX_WITH_ZERO: &str = "R0503";
/// Apex AMP together with DeepSpeed's own fp16 mode (docs/upstream.md R-F03).
pub const APEX_WITH_FP16: &str = "R0504";
/// Apex requested where transformers does not hand it to DeepSpeed (docs/upstream.md R-F03;
/// `hf_apex_amp`).
pub const APEX_UNAVAILABLE: &str = "R0505";
/// bf16 on a DeepSpeed without bf16 support (`ds_bf16_key`).
pub const BF16_UNSUPPORTED: &str = "R0506";
/// fp16-only settings (loss scaling, backend) while training in another precision
/// (docs/upstream.md §6.5).
pub const FP16_SETTING_IGNORED: &str = "R0507";
/// ZeRO without fp16 on an old DeepSpeed (docs/upstream.md R-Z06).
pub const ZERO_NEEDS_FP16: &str = "R0508";
/// A raw `deepspeed { }` / `hf { }` key restating the recipe's precision.
pub const RAW_PRECISION_KEY: &str = "R0509";
/// fp16 at ZeRO stage 0 on a DeepSpeed that never scales the loss there but still unscales.
pub const FP16_ZERO0_UNSCALED: &str = "R0510";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        EVAL_PRECISION,
        "eval-precision",
        "under DeepSpeed, evaluation cannot run in another precision than training",
    ),
    (
        FP16_AND_BF16,
        "fp16-and-bf16",
        "training and evaluation precisions enable both fp16 and bf16",
    ),
    (
        APEX_WITH_ZERO,
        "apex-with-zero",
        "apex AMP cannot be used with a ZeRO stage",
    ),
    (
        APEX_WITH_FP16,
        "apex-with-fp16",
        "apex AMP and DeepSpeed's fp16 mode would both be enabled",
    ),
    (
        APEX_UNAVAILABLE,
        "apex-unavailable",
        "the target transformers does not pass apex to DeepSpeed",
    ),
    (
        BF16_UNSUPPORTED,
        "bf16-unsupported",
        "the target DeepSpeed has no bf16 mode",
    ),
    (
        FP16_SETTING_IGNORED,
        "fp16-setting-ignored",
        "fp16-only settings while training in another precision",
    ),
    (
        ZERO_NEEDS_FP16,
        "zero-needs-fp16",
        "the target DeepSpeed runs this ZeRO stage only with fp16",
    ),
    (
        RAW_PRECISION_KEY,
        "raw-precision-key",
        "a raw key restates the recipe's precision",
    ),
    (
        FP16_ZERO0_UNSCALED,
        "fp16-zero0-unscaled",
        "fp16 at ZeRO stage 0: the target DeepSpeed divides by a loss scale it never applied",
    ),
];

/// The fp16-only `train` keys: DeepSpeed's `fp16` section (docs/upstream.md §6.5), read only when
/// fp16 is on.
const LOSS_SCALE_KEYS: &[&str] = &[
    "train.loss_scale",
    "train.initial_scale_power",
    "train.loss_scale_window",
    "train.hysteresis",
    "train.min_loss_scale",
];

/// Raw DeepSpeed keys the recipe's precision keys become (schema `.ds()` of `train`), and the
/// recipe key each restates. `data_types.param_dtype` (DeepSpeed ≥ 0.19.2) must match the
/// enabled mode (docs/upstream.md R-F04), so it restates `precision` too.
const RAW_DEEPSPEED: &[(&str, &str)] = &[
    ("fp16", "train.precision"),
    ("fp16.enabled", "train.precision"),
    ("bf16", "train.precision"),
    ("bf16.enabled", "train.precision"),
    ("bfloat16", "train.precision"),
    ("bfloat16.enabled", "train.precision"),
    ("data_types.param_dtype", "train.precision"),
    ("amp", "train.fp16_backend"),
    ("amp.enabled", "train.fp16_backend"),
    ("fp16.loss_scale", "train.loss_scale"),
    ("fp16.initial_scale_power", "train.initial_scale_power"),
    ("fp16.loss_scale_window", "train.loss_scale_window"),
    ("fp16.hysteresis", "train.hysteresis"),
    ("fp16.min_loss_scale", "train.min_loss_scale"),
];

/// Raw TrainingArguments fields the recipe's precision keys become (schema `.hf()` of `train`).
const RAW_HF: &[(&str, &str)] = &[
    ("fp16", "train.precision"),
    ("bf16", "train.precision"),
    ("fp16_full_eval", "train.eval_precision"),
    ("bf16_full_eval", "train.eval_precision"),
    ("half_precision_backend", "train.fp16_backend"),
    ("fp16_backend", "train.fp16_backend"),
];

/// The first release from which a fact holds, read from the versions table (for help lines:
/// "target DeepSpeed ≥ …"). Rules never compare versions themselves.
pub fn first_release(holds: impl Fn(&Fact) -> bool) -> Option<Version> {
    CHANGES
        .iter()
        .filter(|c| c.since != Version::new(0, 0, 0) && holds(&c.fact))
        .map(|c| c.since)
        .min()
}

/// The precisions as the recipe resolves them.
struct Precision<'a> {
    /// `train.precision`.
    train: &'a str,
    /// `train.eval_precision` (the training precision unless given).
    eval: &'a str,
    /// Whether `eval_precision` was given.
    eval_given: bool,
    /// Whether HF turns half-precision evaluation into DeepSpeed's `fp16`/`bf16.enabled`.
    eval_enables: bool,
}

impl Precision<'_> {
    /// Whether DeepSpeed's `mode` section (`fp16` or `bf16`) ends up enabled.
    fn deepspeed_enables(&self, mode: &str) -> bool {
        self.train == mode || (self.eval_given && self.eval == mode && self.eval_enables)
    }
}

/// Checks the precision rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let train = r.choice("train.precision");
    let p = Precision {
        train,
        eval: r.word("train.eval_precision").unwrap_or(train),
        eval_given: r.is_given("train.eval_precision"),
        eval_enables: r.facts.hf_full_eval_enables_ds_half,
    };
    eval_precision(r, &p, out);
    apex(r, &p, out);
    bf16_unsupported(r, &p, out);
    fp16_settings_ignored(r, &p, out);
    zero_needs_fp16(r, &p, out);
    fp16_zero0_unscaled(r, &p, out);
    raw_keys(r, out);
}

/// DeepSpeed ≥ 0.18.3 (PR #7665), `runtime/engine.py:backward`: the loss is scaled only when the
/// optimizer is a `ZeROOptimizer` (or under torch autocast). At ZeRO stage 0 fp16 runs
/// `FP16_Optimizer` / `FP16_UnfusedOptimizer`, which are not, so the backward sees the unscaled
/// loss — and their `step` still divides the gradients by the loss scale
/// (`unscale_and_clip_grads`). Measured on DeepSpeed 0.19.8 (CPU accelerator, a `Linear` with
/// SGD lr 1, `initial_scale_power = 8`): the engine's gradient equalled the true one and the
/// update was 1/256 of it (docs/rules/precision-zero.md). A warning until the conformance corpus
/// carries the case.
fn fp16_zero0_unscaled(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    if !r.facts.ds_zero0_fp16_unscaled
        || p.train != "fp16"
        || r.integer("zero.stage") != 0
        || matches!(r.val("train.loss_scale"), Some(Val::Int(1)))
    {
        return;
    }
    let ds = r.targets.deepspeed;
    let scale = match r.val("train.loss_scale") {
        Some(Val::Int(s)) => format!("the static scale {s}"),
        _ => format!(
            "the loss scale (2^{} at the start)",
            r.integer("train.initial_scale_power")
        ),
    };
    out.push(
        Diagnostic::warning(
            FP16_ZERO0_UNSCALED,
            format!("DeepSpeed {ds} never scales an fp16 loss at ZeRO stage 0, but divides the gradients by {scale}: every update is that much too small, and small fp16 gradients flush to zero"),
            anchor(r, "train.precision"),
        )
        .with_label("fp16 at ZeRO stage 0")
        .with_help("use ZeRO stage 1 (`zero 1 { }`: the ZeRO optimizer scales the loss), or bf16, or `loss_scale = 1` (no scaling, so nothing to divide by)"),
    );
}

fn is_half(p: &str) -> bool {
    matches!(p, "fp16" | "bf16")
}

/// docs/upstream.md R-A07
/// (`huggingface/transformers@v5.24.0:src/transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_process`
/// fills `fp16.enabled` with `args.fp16 or args.fp16_full_eval`, `bf16.enabled` with `args.bf16 or
/// args.bf16_full_eval`) and docs/upstream.md R-F01/R-H01. The other direction, half-precision
/// training with fp32 evaluation, follows from DeepSpeed casting the module itself to the half type
/// (`deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:DeepSpeedEngine._configure_distributed_model`),
/// and HF evaluating through the engine
/// (`huggingface/transformers@v5.24.0:src/transformers/trainer.py:Trainer._wrap_model`).
fn eval_precision(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    if !p.eval_given || p.eval == p.train {
        return;
    }
    let (train, eval) = (p.train, p.eval);
    let with_train = |d: Diagnostic| match near(r, "train.precision") {
        Some(span) => d.with_secondary(
            span,
            format!("training precision {train}{}", origin(r, "train.precision")),
        ),
        None => d,
    };
    if train == "fp32" && is_half(eval) {
        if !p.eval_enables {
            return;
        }
        let d = Diagnostic::error(
            EVAL_PRECISION,
            format!(
                "`eval_precision = {eval}` makes DeepSpeed train in {eval} too, not in {train}"
            ),
            anchor(r, "train.eval_precision"),
        )
        .with_label(format!(
            "transformers {} fills DeepSpeed's `{eval}.enabled` from `{eval} or {eval}_full_eval`",
            r.targets.transformers
        ));
        out.push(with_train(d).with_help(format!(
            "under DeepSpeed, half-precision evaluation turns on half-precision training; remove \
             `eval_precision` to evaluate in {train}, or train in {eval} with `precision = {eval}`"
        )));
    } else if is_half(train) && is_half(eval) && p.eval_enables {
        let d = Diagnostic::error(
            FP16_AND_BF16,
            format!("`eval_precision = {eval}` with `precision = {train}` enables both fp16 and bf16 in DeepSpeed"),
            anchor(r, "train.eval_precision"),
        )
        .with_label(format!(
            "HF fills DeepSpeed's `{eval}.enabled` from `{eval} or {eval}_full_eval`"
        ));
        out.push(with_train(d).with_help(format!(
            "DeepSpeed raises 'bfloat16 and fp16 modes cannot be simultaneously enabled' (accelerate \
             already refuses a `{eval}` section next to `--mixed_precision {train}`); remove \
             `eval_precision`: under DeepSpeed evaluation runs in the training precision"
        )));
    } else if is_half(train) {
        let d = Diagnostic::warning(
            EVAL_PRECISION,
            format!("`eval_precision = {eval}` is not honoured: DeepSpeed holds the model in {train}, so evaluation runs in {train}"),
            anchor(r, "train.eval_precision"),
        )
        .with_label("DeepSpeed casts the model's parameters to the training precision");
        out.push(with_train(d).with_help(format!(
            "remove `eval_precision` (under DeepSpeed, HF evaluates with the {train} engine), \
             or train in {eval}"
        )));
    }
}

/// docs/upstream.md R-F02 / R-F03: apex reaches DeepSpeed as `amp.enabled`, which HF fills from
/// `fp16_backend == "apex"` when fp16 is on
/// (`huggingface/transformers@v4.57.6:src/transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_process`), while the
/// recipe's fp16 becomes `fp16.enabled`. DeepSpeed:
/// `deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:DeepSpeedEngine._do_optimizer_sanity_check`.
fn apex(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    if r.word("train.fp16_backend") != Some("apex") {
        return;
    }
    let tf = r.targets.transformers;
    if !r.facts.hf_apex_amp {
        let mut d = Diagnostic::error(
            APEX_UNAVAILABLE,
            format!("`fp16_backend = apex` cannot take effect: transformers {tf} does not pass apex to DeepSpeed"),
            anchor(r, "train.fp16_backend"),
        )
        .with_label("HF does not fill DeepSpeed's `amp.enabled` from it");
        if let Some(span) = r.target_sources[0].span() {
            d = d.with_secondary(span, format!("transformers {tf}"));
        }
        out.push(d.with_help(
            "remove `fp16_backend`: fp16 runs in DeepSpeed's own fp16 mode (transformers 5 \
             removed apex and `half_precision_backend`)",
        ));
        return;
    }
    if !p.deepspeed_enables("fp16") {
        return; // HF sets its apex backend only for fp16; R0507 reports it as ignored.
    }
    let stage = r.integer("zero.stage");
    if stage >= 1 {
        let mut d = Diagnostic::error(
            APEX_WITH_ZERO,
            format!("apex (`fp16_backend = apex`) cannot be used with ZeRO stage {stage}"),
            anchor(r, "train.fp16_backend"),
        )
        .with_label("HF turns this into DeepSpeed's `amp.enabled`");
        if let Some(span) = r.span("zero.stage") {
            d = d.with_secondary(span, format!("ZeRO stage {stage}"));
        }
        out.push(d.with_help(
            "DeepSpeed asserts \"Amp and ZeRO are not currently compatible, please use (legacy) \
             fp16 mode which performs similar to amp opt_mode=O2\"; remove `fp16_backend` to use \
             DeepSpeed's fp16 mode",
        ));
        return;
    }
    let hf_says = if r.facts.hf_mismatch_checks {
        format!(
            "transformers {tf} rejects `fp16.enabled = true` (its own value is `fp16 and \
             fp16_backend == amp`, false) and "
        )
    } else {
        String::new()
    };
    let mut d = Diagnostic::error(
        APEX_WITH_FP16,
        "apex (`fp16_backend = apex`) and `precision = fp16` would enable DeepSpeed's `amp` and `fp16` modes together",
        anchor(r, "train.fp16_backend"),
    )
    .with_label("HF fills DeepSpeed's `amp.enabled` from this");
    if let Some(span) = r.span("train.precision") {
        d = d.with_secondary(span, "becomes DeepSpeed's `fp16.enabled`");
    }
    out.push(d.with_help(format!(
        "{hf_says}DeepSpeed raises \"Cannot enable both amp with (legacy) fp16 or bfloat16 mode\"; \
         remove `fp16_backend`: DeepSpeed's fp16 mode performs like apex O2"
    )));
}

/// bf16 needs DeepSpeed's `bf16` (v0.5.5: `bfloat16`) section; older releases ignore the
/// unknown top-level key and train in fp32 (`ds_bf16_key`, docs/upstream.md §6.5).
fn bf16_unsupported(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    if r.facts.ds_bf16_key.is_some() || !p.deepspeed_enables("bf16") {
        return;
    }
    let key = if p.train == "bf16" {
        "train.precision"
    } else {
        "train.eval_precision"
    };
    let ds = r.targets.deepspeed;
    let since = first_release(|f| matches!(f, Fact::DsBf16Key(Some(_))));
    let named = first_release(|f| matches!(f, Fact::DsBf16Key(Some("bf16"))));
    let mut d = Diagnostic::error(
        BF16_UNSUPPORTED,
        format!(
            "DeepSpeed {ds} has no bf16 mode: it would ignore the `bf16` section and train in fp32"
        ),
        anchor(r, key),
    )
    .with_label(format!("{} = bf16{}", &key[6..], origin(r, key)));
    if let Some(span) = r.target_sources[2].span() {
        d = d.with_secondary(span, format!("DeepSpeed {ds}"));
    }
    let d = d.with_help(match (since, named) {
        (Some(v), Some(b)) if v != b => format!(
            "target DeepSpeed ≥ {b}, where the section is `bf16`, the name HF and accelerate read \
             (from {v} until then it was `bfloat16`), or use `precision = fp16`"
        ),
        (Some(v), _) => format!("target DeepSpeed ≥ {v}, or use `precision = fp16`"),
        _ => "use `precision = fp16`".into(),
    });
    out.push(fix::with_set(d, r, key, "fp16"));
}

/// DeepSpeed reads the `fp16` section only with fp16 on (docs/upstream.md §6.5), and HF picks its
/// fp16 backend only for fp16
/// (`huggingface/transformers@v4.57.6:src/transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_process`).
fn fp16_settings_ignored(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    if p.deepspeed_enables("fp16") {
        return;
    }
    let mut keys: Vec<&str> = LOSS_SCALE_KEYS
        .iter()
        .copied()
        .filter(|k| r.is_given(k))
        .collect();
    // Apex where HF has no apex path is R0505's.
    if r.is_given("train.fp16_backend")
        && (r.word("train.fp16_backend") != Some("apex") || r.facts.hf_apex_amp)
    {
        keys.push("train.fp16_backend");
    }
    if keys.is_empty() {
        return;
    }
    keys.sort_by_key(|k| anchor(r, k).start);
    let train = p.train;
    let names: Vec<String> = keys.iter().map(|k| format!("`{}`", &k[6..])).collect();
    let (first, rest) = keys.split_first().expect("not empty");
    let value = |k: &str| r.val(k).map_or_else(String::new, Val::to_string);
    let mut d = Diagnostic::warning(
        FP16_SETTING_IGNORED,
        format!(
            "{} only {} to fp16 training; with `precision = {train}` {} ignored",
            join(&names),
            if keys.len() == 1 { "applies" } else { "apply" },
            if keys.len() == 1 { "it is" } else { "they are" },
        ),
        anchor(r, first),
    )
    .with_label(format!("{} = {} is ignored", &first[6..], value(first)));
    for k in rest {
        d = d.with_secondary(
            anchor(r, k),
            format!("{} = {} is ignored", &k[6..], value(k)),
        );
    }
    if let Some(span) = r.span("train.precision") {
        d = d.with_secondary(span, format!("training precision {train}"));
    }
    let why = if train == "bf16" {
        " (bf16 needs no loss scaling)"
    } else {
        ""
    };
    out.push(d.with_help(format!(
        "remove {}{why}, or train in fp16 with `precision = fp16`",
        if keys.len() == 1 { "it" } else { "them" }
    )));
}

/// docs/upstream.md R-Z06:
/// `deepspeedai/DeepSpeed@v0.3.16:deepspeed/runtime/config.py:DeepSpeedConfig._do_error_check`
/// asserts fp16 for ZeRO stage 1 (every stage up to v0.3.15; none from v0.4.0, PR #1042).
fn zero_needs_fp16(r: &Resolved, p: &Precision, out: &mut Vec<Diagnostic>) {
    let stage = r.integer("zero.stage");
    let needs =
        r.facts.ds_zero_needs_fp16 && stage >= 1 && (stage == 1 || !r.facts.ds_zero23_without_fp16);
    if !needs || p.deepspeed_enables("fp16") {
        return;
    }
    let ds = r.targets.deepspeed;
    let train = p.train;
    let mut d = Diagnostic::error(
        ZERO_NEEDS_FP16,
        format!("DeepSpeed {ds} runs ZeRO stage {stage} only with fp16, and the recipe trains in {train}"),
        anchor(r, "zero.stage"),
    )
    .with_label(format!("ZeRO stage {stage}"));
    if let Some(span) = near(r, "train.precision") {
        d = d.with_secondary(
            span,
            format!("precision = {train}{}", origin(r, "train.precision")),
        );
    }
    if let Some(span) = r.target_sources[2].span() {
        d = d.with_secondary(span, format!("DeepSpeed {ds}"));
    }
    let mut fixes = vec!["set `precision = fp16`".to_string()];
    if r.facts.ds_zero23_without_fp16 {
        fixes.push(format!(
            "use ZeRO stage 2 or 3 (DeepSpeed {ds} runs them in full precision)"
        ));
    }
    fixes.push("use `zero 0`".into());
    if let Some(v) = first_release(|f| matches!(f, Fact::DsZeroNeedsFp16(false))) {
        fixes.push(format!("target DeepSpeed ≥ {v}"));
    }
    let d = d.with_help(format!(
        "DeepSpeed asserts \"DeepSpeedConfig: ZeRO is only supported if fp16 is enabled\"; {}",
        fixes.join(", or ")
    ));
    let d = fix::with_set(d, r, "train.precision", "fp16");
    out.push(fix::with_set(d, r, "zero.stage", "0"));
}

/// A raw key that restates a precision key: the compiler derives it from the recipe, so the two
/// would be two sources of truth.
fn raw_keys(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let train = r.choice("train.precision");
    for (path, value, span) in &r.raw_deepspeed {
        let Some((_, key)) = RAW_DEEPSPEED.iter().find(|(p, _)| p == path) else {
            continue;
        };
        if value.as_str() == Some("auto") {
            continue; // HF fills it from the same source (compat checks the fill)
        }
        let mut help = if path == "data_types.param_dtype" {
            "remove it: DeepSpeed derives the model dtype from the `fp16` / `bf16` sections, which \
             `recipe build` writes from `precision` in `train`"
                .to_string()
        } else {
            format!(
                "remove it: `recipe build` writes `{path}` from `{}` in `train`",
                &key[6..]
            )
        };
        if path == "data_types.param_dtype" {
            if let Some(dtype) = value.as_str().and_then(dtype_precision) {
                if dtype != train {
                    help.push_str(&format!(
                        "; with `precision = {train}` DeepSpeed asserts \"data_types.param_dtype='{}' \
                         conflicts with the enabled precision mode\"",
                        value.as_str().unwrap_or_default()
                    ));
                }
            }
        }
        out.push(raw(r, "deepspeed", path, value, *span, key).with_help(help));
    }
    for (path, value, span) in &r.raw_hf {
        let Some((_, key)) = RAW_HF.iter().find(|(p, _)| p == path) else {
            continue;
        };
        out.push(raw(r, "hf", path, value, *span, key).with_help(format!(
            "remove it: `recipe build` sets `{path}` from `{}` in `train`",
            &key[6..]
        )));
    }
}

fn raw(
    r: &Resolved,
    block: &str,
    path: &str,
    value: &Val,
    span: crate::syntax::ast::Span,
    key: &str,
) -> Diagnostic {
    let short = &key[6..];
    let mut d = Diagnostic::error(
        RAW_PRECISION_KEY,
        format!("`{path}` in `{block} {{ }}` restates `train.{short}`: two sources of truth for the precision"),
        span,
    )
    .with_label(format!("{path} = {value}"));
    let current = r.val(key).map_or_else(String::new, Val::to_string);
    if let Some(s) = near(r, key).filter(|_| !current.is_empty()) {
        d = d.with_secondary(s, format!("{short} = {current}{}", origin(r, key)));
    }
    d
}

/// Where a value was written, else its block's header; `None` when neither is in the file.
pub fn near(r: &Resolved, key: &str) -> Option<crate::syntax::ast::Span> {
    r.span(key).or_else(|| {
        key.split('.')
            .next()
            .and_then(|b| r.block_spans.get(b).copied())
    })
}

/// The precision a DeepSpeed dtype name stands for (`DtypeEnum`, DeepSpeed@v0.19.5
/// runtime/config_utils.py / runtime/constants.py), if it is one.
fn dtype_precision(name: &str) -> Option<&'static str> {
    match name {
        "fp16" | "float16" | "half" | "torch.float16" | "torch.half" => Some("fp16"),
        "bf16" | "bfloat16" | "torch.bfloat16" => Some("bf16"),
        "fp32" | "float32" | "float" | "torch.float32" | "torch.float" => Some("fp32"),
        _ => None,
    }
}

/// `a`, `a and b`, `a, b and c`.
fn join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    #[test]
    fn first_release_reads_the_table() {
        assert_eq!(
            first_release(|f| matches!(f, Fact::DsBf16Key(Some(_)))),
            Some(Version::new(0, 5, 5))
        );
        assert_eq!(
            first_release(|f| matches!(f, Fact::DsZeroNeedsFp16(false))),
            Some(Version::new(0, 4, 0))
        );
        // A 0.0.0 row is "always", not a release.
        assert_eq!(
            first_release(|f| matches!(f, Fact::DsZeroNeedsFp16(true))),
            None
        );
    }

    #[test]
    fn raw_tables_cover_the_schema_mappings_of_the_precision_keys() {
        let train = schema::block("train").unwrap();
        for name in [
            "precision",
            "eval_precision",
            "fp16_backend",
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "min_loss_scale",
        ] {
            let key = train.key(name).unwrap();
            let full = format!("train.{name}");
            for ds in key.deepspeed.into_iter().flat_map(|d| d.split(", ")) {
                assert!(
                    RAW_DEEPSPEED.contains(&(ds, full.as_str())),
                    "{ds} of {full} is not in RAW_DEEPSPEED"
                );
            }
            // The fields, before any note in parentheses.
            let fields = key.hf.map(|h| h.split(" (").next().unwrap());
            for field in fields.into_iter().flat_map(|h| h.split(", ")) {
                assert!(
                    RAW_HF.contains(&(field, full.as_str())),
                    "{field} of {full} is not in RAW_HF"
                );
            }
        }
    }

    #[test]
    fn dtype_names() {
        assert_eq!(dtype_precision("bfloat16"), Some("bf16"));
        assert_eq!(dtype_precision("half"), Some("fp16"));
        assert_eq!(dtype_precision("float"), Some("fp32"));
        assert_eq!(dtype_precision("int8"), None);
    }

    #[test]
    fn joins_like_prose() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(join(&s(&["a"])), "a");
        assert_eq!(join(&s(&["a", "b"])), "a and b");
        assert_eq!(join(&s(&["a", "b", "c"])), "a, b and c");
    }
}
