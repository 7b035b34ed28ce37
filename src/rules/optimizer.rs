//! Optimizer rules: whether the optimizer a recipe states can be built, by whom, and whether it
//! is the one that runs (docs/rules/schedule-optimizer.md). The recipe states one
//! kind and `owner`: `deepspeed` writes a DeepSpeed `optimizer` section (DeepSpeed builds it),
//! `hf` sets `TrainingArguments.optim` (the HF Trainer builds it and hands it to DeepSpeed).
//!
//! * DeepSpeed's optimizer section: "Adam" is AdamW (docs/upstream.md R-P01), untested optimizers
//!   with ZeRO (docs/upstream.md R-P02), 1-bit optimizers with ZeRO (docs/upstream.md R-P04), LAMB
//!   with a fixed loss scale (docs/upstream.md R-P05) or with optimizer offload
//!   (docs/upstream.md R-P06), kinds DeepSpeed does not have (Adafactor; Lion and 0/1 Adam before
//!   they were added);
//! * HF's optimizer under ZeRO-Offload: silently replaced by accelerate (docs/upstream.md R-O01),
//!   rejected by DeepSpeed (docs/upstream.md R-O02), rejected by transformers < 4.9
//!   (docs/upstream.md §4.2);
//! * ownership: kinds HF's `optim` lacks, DeepSpeed's optimizer with HF's scheduler where
//!   transformers cannot combine them (docs/upstream.md §4.2), the optimizer given twice
//!   (docs/upstream.md R-H07);
//! * settings the built optimizer never receives: what HF does not pass to the optimizer it
//!   builds, and `bias_correction` with DeepSpeed's `torch_adam` (src/upstream/hf_optimizers.rs).
//!
//! `optimizer.params.max_grad_norm` (docs/upstream.md R-P03) is the schema's R0031, not repeated
//! here.

use crate::diagnostics::{Diagnostic, Label};
use crate::resolve::value::fmt_f64;
use crate::resolve::{Resolved, Val};
use crate::syntax::ast::Span;
use crate::upstream::hf_optimizers::{self, Dropped, Runs};
use crate::upstream::versions::{Fact, Library, CHANGES};

use super::schedule::{first_release, fmt_lr, is_deepspeed_schedule, note, with_target};
use super::{anchor, fix, origin};

/// `optimizer adam` with weight decay is classic L2 Adam: the compiler emits `adam_w_mode = false`
/// (docs/upstream.md R-P01).
pub const ADAM_L2: &str = "R0401";
/// `owner = hf` with a kind HF's `optim` does not have.
pub const NO_HF_OPTIMIZER: &str = "R0402";
/// An optimizer DeepSpeed does not test with ZeRO (docs/upstream.md R-P02).
pub const UNTESTED_OPTIMIZER: &str = "R0403";
/// 1-bit Adam, 0/1 Adam and 1-bit LAMB are not compatible with ZeRO (docs/upstream.md R-P04).
pub const ONEBIT_WITH_ZERO: &str = "R0404";
/// LAMB needs dynamic loss scaling (docs/upstream.md R-P05).
pub const LAMB_FIXED_LOSS_SCALE: &str = "R0405";
/// LAMB has no CPU implementation for optimizer offload (docs/upstream.md R-P06).
pub const LAMB_OFFLOAD: &str = "R0406";
/// accelerate replaces HF's optimizer by a DeepSpeed CPU optimizer under offload
/// (docs/upstream.md R-O01).
pub const HF_OPTIMIZER_REPLACED: &str = "R0407";
/// DeepSpeed rejects HF's optimizer under offload when transformers hands it over as is
/// (docs/upstream.md R-O02).
pub const CLIENT_OPTIMIZER_OFFLOAD: &str = "R0408";
/// DeepSpeed has no Adafactor.
pub const ADAFACTOR_DEEPSPEED: &str = "R0409";
/// The target DeepSpeed does not have this optimizer yet.
pub const NOT_IN_DEEPSPEED: &str = "R0410";
/// The optimizer is given by `optimizer` and by raw keys as well (docs/upstream.md R-H07).
pub const OPTIMIZER_TWICE: &str = "R0411";
/// transformers < 4.9 refuses HF's optimizer with ZeRO Offload (docs/upstream.md §4.2).
pub const OFFLOAD_NEEDS_DS_OPTIMIZER: &str = "R0412";
/// transformers < 4.10 and 4.30–4.33 cannot combine DeepSpeed's optimizer with HF's scheduler
/// (docs/upstream.md §4.2).
pub const DS_OPTIMIZER_HF_SCHEDULER: &str = "R0413";
/// AMSGrad with DeepSpeed's own Adam kernels, which refuse it.
pub const AMSGRAD_FUSED: &str = "R0414";
/// A setting the recipe gives that the optimizer the run builds never receives
/// (src/upstream/hf_optimizers.rs).
pub const SETTING_NOT_PASSED: &str = "R0415";
/// An HF-built optimizer from a package transformers does not install (bitsandbytes' Lion).
pub const OPTIONAL_DEPENDENCY: &str = "R0416";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        ADAM_L2,
        "adam-l2",
        "`optimizer adam` with weight decay is classic Adam with an L2 penalty",
    ),
    (
        NO_HF_OPTIMIZER,
        "no-hf-optimizer",
        "owner = hf with an optimizer HF's `optim` does not have",
    ),
    (
        UNTESTED_OPTIMIZER,
        "untested-optimizer",
        "an optimizer DeepSpeed does not test with ZeRO",
    ),
    (
        ONEBIT_WITH_ZERO,
        "onebit-with-zero",
        "1-bit and 0/1 optimizers are not compatible with ZeRO",
    ),
    (
        LAMB_FIXED_LOSS_SCALE,
        "lamb-fixed-loss-scale",
        "LAMB needs dynamic loss scaling",
    ),
    (
        LAMB_OFFLOAD,
        "lamb-offload",
        "LAMB cannot run with ZeRO optimizer offload",
    ),
    (
        HF_OPTIMIZER_REPLACED,
        "hf-optimizer-replaced",
        "under optimizer offload accelerate rebuilds HF's optimizer as a DeepSpeed CPU optimizer",
    ),
    (
        CLIENT_OPTIMIZER_OFFLOAD,
        "client-optimizer-offload",
        "DeepSpeed rejects HF's optimizer under ZeRO-Offload",
    ),
    (
        ADAFACTOR_DEEPSPEED,
        "adafactor-deepspeed",
        "DeepSpeed has no Adafactor",
    ),
    (
        NOT_IN_DEEPSPEED,
        "not-in-deepspeed",
        "the target DeepSpeed does not have this optimizer",
    ),
    (
        OPTIMIZER_TWICE,
        "optimizer-twice",
        "the optimizer is given by `optimizer` and by raw keys",
    ),
    (
        OFFLOAD_NEEDS_DS_OPTIMIZER,
        "offload-needs-ds-optimizer",
        "transformers < 4.9 refuses HF's optimizer with ZeRO Offload",
    ),
    (
        DS_OPTIMIZER_HF_SCHEDULER,
        "ds-optimizer-hf-scheduler",
        "the target transformers cannot combine DeepSpeed's optimizer with HF's scheduler",
    ),
    (
        AMSGRAD_FUSED,
        "amsgrad-fused",
        "amsgrad with DeepSpeed's FusedAdam or DeepSpeedCPUAdam, which refuse it",
    ),
    (
        SETTING_NOT_PASSED,
        "setting-not-passed",
        "an optimizer setting the optimizer the run builds never receives",
    ),
    (
        OPTIONAL_DEPENDENCY,
        "optional-dependency",
        "the optimizer HF builds comes from a package transformers does not install",
    ),
];

/// The 1-bit / 0-1 optimizers (DeepSpeed only).
const ONEBIT: &[&str] = &["onebitadam", "zerooneadam", "onebitlamb"];

/// Kinds DeepSpeed must know by name: torch.optim has no class of that name to fall back on
/// (`DS:deepspeed/runtime/engine.py:DeepSpeedEngine._configure_basic_optimizer`).
const DS_ONLY: &[&str] = &["lamb", "lion", "onebitadam", "zerooneadam", "onebitlamb"];

/// How upstream names the optimizer, for messages.
fn display(kind: &str) -> &'static str {
    match kind {
        "adamw" => "AdamW",
        "adam" => "Adam",
        "sgd" => "SGD",
        "adagrad" => "Adagrad",
        "lamb" => "LAMB",
        "lion" => "Lion",
        "adafactor" => "Adafactor",
        "onebitadam" => "1-bit Adam",
        "zerooneadam" => "0/1 Adam",
        "onebitlamb" => "1-bit LAMB",
        _ => "this optimizer",
    }
}

/// The optimizer state the rules look at.
struct Opt<'a> {
    kind: &'a str,
    owner: &'a str,
    stage: i64,
    offload_optimizer: &'a str,
    offload_param: &'a str,
    weight_decay: f64,
}

impl Opt<'_> {
    fn deepspeed(&self) -> bool {
        self.owner == "deepspeed"
    }

    /// The kind HF actually builds: `adam` without weight decay is AdamW (`optim adamw_torch`).
    fn hf_kind(&self) -> &str {
        if self.kind == "adam" && self.weight_decay == 0.0 {
            "adamw"
        } else {
            self.kind
        }
    }
}

/// A raw `deepspeed { }` boolean.
fn raw_ds_bool(r: &Resolved, key: &str) -> Option<(bool, Span)> {
    r.raw_deepspeed
        .iter()
        .find(|(k, _, _)| k == key)
        .and_then(|(_, v, span)| v.as_bool().map(|b| (b, *span)))
}

/// Where to point for a diagnostic about the optimizer's kind: its label, else the block.
fn kind_span(r: &Resolved) -> Span {
    anchor(r, "optimizer.kind")
}

/// The first of these keys that was written, else the optimizer's kind.
fn first_written(r: &Resolved, keys: &[&str]) -> Span {
    keys.iter()
        .find_map(|k| r.span(k))
        .unwrap_or_else(|| kind_span(r))
}

/// Checks the optimizer rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let (Some(kind), Some(owner)) = (r.word("optimizer.kind"), r.word("optimizer.owner")) else {
        return;
    };
    let o = Opt {
        kind,
        owner,
        stage: r.integer("zero.stage"),
        offload_optimizer: r.choice("zero.offload optimizer"),
        offload_param: r.choice("zero.offload param"),
        weight_decay: r.num("optimizer.weight_decay"),
    };
    twice(r, out);
    ds_optimizer_hf_scheduler(r, &o, out);
    if o.deepspeed() {
        amsgrad_fused(r, &o, out);
        deepspeed_owned(r, &o, out);
        not_passed(r, &o, out);
    } else {
        hf_owned(r, &o, out);
        optional_dependency(r, &o, out);
    }
}

/// R0416: `optimizer lion { owner = hf }` makes HF build bitsandbytes' Lion (`optim =
/// "lion_32bit"`), and bitsandbytes is not a dependency of transformers: without it the Trainer
/// stops when it creates the optimizer (huggingface/transformers@v5.24.0
/// src/transformers/trainer_optimizer.py:_get_bitsandbytes_optimizer, "You need to install
/// `bitsandbytes` in order to use bitsandbytes optimizers"). A warning: the check cannot see the
/// training machines' packages.
fn optional_dependency(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    // A release without `lion_32bit` never gets that far (R0402).
    if o.kind != "lion" || !r.facts.hf_optim_names.contains(&"lion_32bit") {
        return;
    }
    let key = if r.is_given("optimizer.owner") {
        "optimizer.owner"
    } else {
        "optimizer.kind"
    };
    let mut d = Diagnostic::warning(
        OPTIONAL_DEPENDENCY,
        "HF builds Lion from bitsandbytes (`optim = \"lion_32bit\"`), which transformers does not install: without it the Trainer stops with ImportError when it creates the optimizer",
        anchor(r, key),
    )
    .with_label("HF builds bitsandbytes.optim.Lion");
    if key != "optimizer.kind" {
        if let Some(span) = r.span("optimizer.kind") {
            d = d.with_secondary(span, "Lion");
        }
    }
    let d = d.with_help(
        "install bitsandbytes where the run trains (`pip install -U bitsandbytes`), or write `owner = deepspeed` (DeepSpeed builds its own FusedLion)",
    );
    out.push(to_deepspeed(d, r));
}

/// `amsgrad = true` on DeepSpeed's Adam: FusedAdam (and DeepSpeedCPUAdam under optimizer offload)
/// raise "FusedAdam does not support the AMSGrad variant." — seen by the conformance harness on
/// DeepSpeed 0.19.8 (deepspeedai/DeepSpeed deepspeed/ops/adam/fused_adam.py:FusedAdam.step,
/// cpu_adam.py:DeepSpeedCPUAdam.__init__). torch's Adam (`torch_adam = true`) supports it.
fn amsgrad_fused(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    if !matches!(o.kind, "adam" | "adamw")
        || r.bool("optimizer.amsgrad") != Some(true)
        || r.bool("optimizer.torch_adam") == Some(true)
    {
        return;
    }
    let which = if o.offload_optimizer == "none" {
        "FusedAdam"
    } else {
        "DeepSpeedCPUAdam"
    };
    out.push(
        Diagnostic::error(
            AMSGRAD_FUSED,
            format!("DeepSpeed's {which} does not support AMSGrad: the run stops with \"{which} does not support the AMSGrad variant.\""),
            anchor(r, "optimizer.amsgrad"),
        )
        .with_label(format!("amsgrad with {which}"))
        .with_help("remove `amsgrad`, or set `torch_adam = true` (torch's Adam supports AMSGrad; not with optimizer offload)"),
    );
}

/// R0415: a setting the recipe gives that the optimizer the run builds never receives
/// (src/upstream/hf_optimizers.rs; docs/rules/schedule-optimizer.md). With `owner = hf` the
/// Trainer passes `lr`, AdamW's and Lion's betas, AdamW's eps and the weight decay, and, from
/// transformers 5.3.0, SGD's momentum / Nesterov and Adagrad's eps through `optim_args`, which
/// the compiler writes (huggingface/transformers@v5.24.0
/// src/transformers/trainer_optimizer.py:_get_adamw_torch, _get_sgd, _get_adagrad); anything
/// else runs at the constructor's default. With `owner = deepspeed` and `torch_adam = true`,
/// DeepSpeed builds torch's Adam, which has no `bias_correction`
/// (deepspeedai/DeepSpeed@v0.19.8 deepspeed/runtime/engine.py:get_optimizer_configuration).
fn not_passed(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    if let Some(d) = deepspeed_no_decay(r, o) {
        out.push(d);
    }
    for d in hf_optimizers::dropped(r) {
        out.push(if o.deepspeed() {
            torch_adam_drops(r, o, d)
        } else {
            hf_drops(r, o, d)
        });
    }
}

/// The given value of an `optimizer` key, as written.
fn given_value(r: &Resolved, key: &str) -> String {
    r.val(&format!("optimizer.{key}"))
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// R0415 with `owner = hf`.
fn hf_drops(r: &Resolved, o: &Opt, d: Dropped) -> Diagnostic {
    let key = d.key;
    let dotted = format!("optimizer.{key}");
    let given = given_value(r, key);
    let class = hf_optimizers::class(o.kind).unwrap_or("the optimizer");
    let lr = fmt_lr(r.num("optimizer.lr"));
    let tf = r.targets.transformers;
    // The release from which HF reads this key from `optim_args` (SGD, Adagrad).
    let later = first_release(Library::Transformers, tf, |f| {
        matches!(f, Fact::HfSgdAdagradOptimArgs(true))
    })
    .filter(|_| matches!(key, "momentum" | "nesterov" | "eps"));
    let who = if later.is_some() {
        format!("transformers {tf}")
    } else {
        "HF".to_string()
    };
    let ctor = match o.kind {
        "adamw" | "adam" => format!("{class}(params, lr={lr}, betas, eps)"),
        "lion" => format!("{class}(params, lr={lr}, betas)"),
        _ => format!("{class}(params, lr={lr})"),
    };
    let runs = d.runs.describe();
    let message = match key {
        "no_decay" => format!(
            "{who} groups the parameters itself (no weight decay for biases and normalization layers) and never reads `no_decay`: the run would not decay as `no_decay = {given}` says"
        ),
        "momentum" => format!(
            "{who} builds {ctor} and never passes `momentum`: the run would be plain SGD, without momentum"
        ),
        "nesterov" => format!(
            "{who} builds {ctor} and never passes `nesterov`: the run would use no Nesterov momentum"
        ),
        "torch_adam" => format!(
            "{who} builds {ctor}: `torch_adam = {given}` (DeepSpeed's own Adam kernel) never applies when HF builds the optimizer"
        ),
        "bias_correction" => format!(
            "{who} builds {ctor} and never passes `bias_correction`: torch's AdamW always corrects the bias"
        ),
        "amsgrad" => format!(
            "{who} builds {ctor} and never passes `amsgrad`: the run would be AdamW without AMSGrad"
        ),
        "eps" => format!(
            "{who} builds {ctor} and never passes `eps`: the run would use torch's eps = {runs}"
        ),
        _ => format!(
            "{who} builds {ctor} and never passes `{key}`: the run would use {runs}"
        ),
    };
    let label = if key == "no_decay" {
        "never read: HF decays by its own grouping".to_string()
    } else {
        format!("never reaches {class}")
    };
    let mut diag =
        Diagnostic::error(SETTING_NOT_PASSED, message, anchor(r, &dotted)).with_label(label);
    if let Some(span) = r.span("optimizer.owner") {
        diag = diag.with_secondary(span, "HF builds the optimizer");
    }
    let help = match (key, later) {
        (_, Some(v)) => format!(
            "target transformers ≥ {v} (its {} reads `{key}` from `optim_args`, which the compiler then writes), or write `owner = deepspeed` (DeepSpeed passes `{key}` to {class}), or remove `{key}`",
            display(o.kind)
        ),
        ("no_decay", None) => "remove `no_decay` (HF's grouping is what the default [\"bias\", \"LayerNorm.weight\"] stands for), or set `weight_decay = 0`".to_string(),
        ("amsgrad", None) => "write `owner = deepspeed` with `torch_adam = true` (DeepSpeed passes `amsgrad` to torch's Adam), or remove `amsgrad`".to_string(),
        ("bias_correction", None) => "write `owner = deepspeed` (DeepSpeed's FusedAdam takes `bias_correction = false`), or remove `bias_correction`".to_string(),
        ("torch_adam", None) => "remove `torch_adam` (it chooses DeepSpeed's Adam kernel), or write `owner = deepspeed`".to_string(),
        _ => format!("write `owner = deepspeed`, or remove `{key}`"),
    };
    if later.is_some() {
        diag = with_target(diag, r, Library::Transformers);
    }
    let diag = diag.with_help(help);
    // Every help but no_decay's and amsgrad's (which needs a second key) names this one edit.
    if matches!(key, "no_decay" | "amsgrad") && later.is_none() {
        diag
    } else {
        to_deepspeed(diag, r)
    }
}

/// R0415 with `owner = deepspeed`: a written `no_decay`. transformers hands DeepSpeed the model's
/// parameters as one flat list (huggingface/transformers@v5.24.0
/// src/transformers/integrations/deepspeed.py:deepspeed_init, `DummyOptim(params=…)`), so
/// DeepSpeed's optimizer has one parameter group and decays every tensor by `weight_decay`;
/// nothing reads the recipe's grouping. (The default follows: `[]` with `owner = deepspeed`.)
fn deepspeed_no_decay(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    if !o.deepspeed() || o.weight_decay == 0.0 || !r.is_given("optimizer.no_decay") {
        return None;
    }
    if matches!(r.val("optimizer.no_decay"), Some(Val::List(items)) if items.is_empty()) {
        return None; // what DeepSpeed runs anyway
    }
    let wd = fmt_f64(o.weight_decay);
    let mut d = Diagnostic::error(
        SETTING_NOT_PASSED,
        format!(
            "DeepSpeed builds the optimizer over one parameter group and decays every tensor by weight_decay = {wd}: `no_decay = {}` is never read",
            given_value(r, "no_decay")
        ),
        anchor(r, "optimizer.no_decay"),
    )
    .with_label("never reaches DeepSpeed: transformers hands it the parameters as one list");
    if let Some(span) = r.span("optimizer.owner") {
        d = d.with_secondary(span, "DeepSpeed builds the optimizer");
    }
    let d = d.with_help(
        "write `owner = hf` (HF's optimizer keeps biases and LayerNorm weights out of weight decay), or remove `no_decay` (every tensor decays, as DeepSpeed runs it)",
    );
    Some(fix::with_set(d, r, "optimizer.owner", "hf"))
}

/// R0415 with `owner = deepspeed` and `torch_adam = true`: `bias_correction = false`.
fn torch_adam_drops(r: &Resolved, o: &Opt, d: Dropped) -> Diagnostic {
    let key = d.key;
    let class = if o.kind == "adam" {
        "torch.optim.Adam"
    } else {
        "torch.optim.AdamW"
    };
    let runs = match d.runs {
        Runs::Bool(true) => "the run corrects the bias".to_string(),
        other => format!("the run uses {}", other.describe()),
    };
    let mut diag = Diagnostic::error(
        SETTING_NOT_PASSED,
        format!(
            "with `torch_adam = true` DeepSpeed builds {class}, which has no `{key}` argument: the compiler leaves `{key} = {}` out, and {runs}",
            given_value(r, key)
        ),
        anchor(r, &format!("optimizer.{key}")),
    )
    .with_label(format!("never reaches {class}"));
    if let Some(span) = r.span("optimizer.torch_adam") {
        diag = diag.with_secondary(span, "DeepSpeed builds torch's Adam");
    }
    diag.with_help(format!(
        "remove `torch_adam = true` (DeepSpeed's FusedAdam takes `{key}`), or remove `{key}`"
    ))
}

/// Whether some owner can build `kind` on the releases whose facts are `facts`: DeepSpeed (no
/// Adafactor; its own kinds only where the release has them) or HF (the release's `optim` has
/// the value the compiler writes, or it has no `optim` and builds AdamW / Adafactor). The
/// editor's completion offers these kinds.
pub fn buildable(kind: &str, facts: &crate::upstream::versions::Facts) -> bool {
    let deepspeed =
        kind != "adafactor" && (!DS_ONLY.contains(&kind) || facts.ds_optimizers.contains(&kind));
    let names = facts.hf_optim_names;
    let hf = crate::upstream::hf_optimizers::class(kind).is_some()
        && (names.contains(&crate::emit::training_args::hf_optim(kind))
            || (names.is_empty() && matches!(kind, "adamw" | "adam" | "adafactor")));
    deepspeed || hf
}

/// Rules for a DeepSpeed `optimizer` section.
fn deepspeed_owned(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    if o.kind == "adafactor" {
        out.push(adafactor(r));
        return;
    }
    if DS_ONLY.contains(&o.kind) && !r.facts.ds_optimizers.contains(&o.kind) {
        out.push(not_in_deepspeed(r, o));
        return;
    }
    if o.kind == "adam" && o.weight_decay > 0.0 {
        out.push(adam_l2(r, o));
    }
    if ONEBIT.contains(&o.kind) && o.stage >= 1 {
        out.push(onebit_with_zero(r, o));
        return;
    }
    if o.stage >= 1 && !r.facts.ds_zero_supported_optimizers.contains(&o.kind) {
        if let Some(d) = untested(r, o) {
            out.push(d);
        }
    }
    if matches!(o.kind, "lamb" | "onebitlamb") {
        if let Some(d) = lamb_fixed_loss_scale(r, o) {
            out.push(d);
        }
    }
    if o.kind == "lamb" && o.stage >= 1 && o.offload_optimizer != "none" {
        out.push(lamb_offload(r, o));
    }
}

/// Rules for an optimizer HF builds (`optim`).
fn hf_owned(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    if matches!(o.kind, "lamb" | "onebitadam" | "zerooneadam" | "onebitlamb")
        || (o.kind == "adam" && o.weight_decay > 0.0)
    {
        out.push(no_hf_optimizer(r, o));
        return;
    }
    if let Some(d) = not_in_release(r, o) {
        out.push(d);
        return;
    }
    not_passed(r, o, out);
    let forced_off = matches!(
        raw_ds_bool(r, "zero_force_ds_cpu_optimizer"),
        Some((false, _))
    );
    if r.facts.hf_offload_needs_ds_optimizer {
        if let Some(d) = offload_needs_ds_optimizer(r, o) {
            out.push(d);
            return;
        }
    }
    if o.offload_optimizer == "none" || forced_off {
        return;
    }
    if r.facts.hf_direct_deepspeed_init {
        if r.facts.ds_force_cpu_optimizer && o.stage >= 1 {
            out.push(client_optimizer_offload(r, o));
        }
    } else if let Some(d) = hf_optimizer_replaced(r, o) {
        out.push(d);
    }
}

/// R-P01 (docs/upstream.md §6.3): DeepSpeed's `type: "Adam"` uses decoupled weight decay unless
/// `adam_w_mode: false` (`ADAM_W_MODE_DEFAULT = True`,
/// deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:_configure_basic_optimizer), so the
/// compiler emits `adam_w_mode: false` for `optimizer adam`: classic Adam, weight decay added to
/// the gradient (L2). Info the user should see, as most fine-tuning uses AdamW.
fn adam_l2(r: &Resolved, o: &Opt) -> Diagnostic {
    let mut d = note(
        ADAM_L2,
        format!(
            "`optimizer adam` with weight_decay = {} is classic Adam with an L2 penalty: the compiler emits adam_w_mode = false, as DeepSpeed's \"Adam\" is AdamW by default",
            fmt_f64(o.weight_decay)
        ),
        kind_span(r),
    )
    .with_label("Adam, weight decay added to the gradient");
    if let Some(span) = r.span("optimizer.weight_decay") {
        d = d.with_secondary(span, "an L2 penalty here");
    }
    let d = d.with_help(
        "for decoupled weight decay (HF Trainer's default, AdamW) write `optimizer adamw`",
    );
    fix::with_set(d, r, "optimizer.kind", "adamw")
}

/// Adds the fix `owner = deepspeed` (fix::set declines it where the target transformers would
/// then refuse the recipe's HF schedule, R0413).
fn to_deepspeed(d: Diagnostic, r: &Resolved) -> Diagnostic {
    fix::with_set(d, r, "optimizer.owner", "deepspeed")
}

/// The target transformers lacks the `optim` value the compiler writes for the kind
/// ([`Facts::hf_optim_names`]): before 4.16.0 there is no `optim` and the Trainer builds AdamW
/// whatever the kind (Adafactor with `adafactor = true`, which the compiler writes); later,
/// HfArgumentParser refuses a value its `OptimizerNames` lacks (argparse's "invalid choice").
///
/// [`Facts::hf_optim_names`]: crate::upstream::versions::Facts::hf_optim_names
fn not_in_release(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    let names = r.facts.hf_optim_names;
    let tf = r.targets.transformers;
    let name = crate::emit::training_args::hf_optim(o.kind);
    // Adam without weight decay is AdamW (hf_owned refuses it with decay).
    let builds_adamw = matches!(o.kind, "adamw" | "adam");
    if names.contains(&name) || (names.is_empty() && (builds_adamw || o.kind == "adafactor")) {
        return None;
    }
    let first = super::precision::first_release(
        |f| matches!(f, crate::upstream::versions::Fact::HfOptimNames(n) if n.contains(&name)),
    )?;
    let (message, label) = if names.is_empty() {
        (
            format!(
                "transformers {tf} has no `optim`: with `owner = hf` its Trainer builds AdamW, not {}",
                display(o.kind)
            ),
            "HF builds AdamW whatever the kind".to_string(),
        )
    } else {
        (
            format!(
                "transformers {tf}'s `optim` has no `{name}`: the launch stops in HfArgumentParser (\"argument --optim: invalid choice: '{name}'\")"
            ),
            format!("HF builds the optimizer from `optim = \"{name}\"`"),
        )
    };
    let mut d =
        Diagnostic::error(NO_HF_OPTIMIZER, message, anchor(r, "optimizer.owner")).with_label(label);
    if r.span("optimizer.owner").is_some() {
        if let Some(span) = r.span("optimizer.kind") {
            d = d.with_secondary(span, format!("`{}`", o.kind));
        }
    }
    let help = format!(
        "target transformers ≥ {first} (`optim = \"{name}\"` arrived then), or write `owner = deepspeed` (DeepSpeed builds {})",
        display(o.kind)
    );
    Some(to_deepspeed(d.with_help(help), r))
}

/// HF's `optim` has no LAMB, no 1-bit optimizer and no classic Adam
/// (huggingface/transformers@v5.24.0:src/transformers/training_args.py:OptimizerNames: adamw_*,
/// adafactor, sgd, adagrad, lion_*, rmsprop, …), so `owner = hf` cannot build these.
fn no_hf_optimizer(r: &Resolved, o: &Opt) -> Diagnostic {
    let (message, help) = if o.kind == "adam" {
        (
            format!(
                "HF's `optim` has no classic Adam: with `owner = hf`, `optimizer adam` with weight_decay = {} (an L2 penalty) cannot be built",
                fmt_f64(o.weight_decay)
            ),
            "write `owner = deepspeed` (DeepSpeed's Adam with adam_w_mode = false), `optimizer adamw` for decoupled weight decay, or weight_decay = 0 (then Adam is AdamW)".to_string(),
        )
    } else {
        (
            format!(
                "HF's `optim` has no {}: with `owner = hf` the Trainer cannot build `optimizer {}`",
                display(o.kind),
                o.kind
            ),
            format!(
                "write `owner = deepspeed` (DeepSpeed builds {}), or choose an optimizer HF has (adamw, sgd, adagrad, lion, adafactor)",
                display(o.kind)
            ),
        )
    };
    let mut d = Diagnostic::error(NO_HF_OPTIMIZER, message, anchor(r, "optimizer.owner"))
        .with_label("HF builds the optimizer");
    if r.span("optimizer.owner").is_some() {
        if let Some(span) = r.span("optimizer.kind") {
            d = d.with_secondary(span, format!("`{}`", o.kind));
        }
    }
    if o.kind == "adam" {
        if let Some(span) = r.span("optimizer.weight_decay") {
            d = d.with_secondary(span, "an L2 penalty");
        }
    }
    to_deepspeed(d.with_help(help), r)
}

/// R-P02 (docs/upstream.md §6.3): with ZeRO (stage ≥ 1) DeepSpeed asserts that the basic
/// optimizer's type is in `ZERO_SUPPORTED_OPTIMIZERS` or `zero_allow_untested_optimizer` is true
/// (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:_configure_zero_optimizer). HF sets
/// the flag only for its own optimizer (docs/upstream.md §4.1), so for `owner = deepspeed` the
/// compiler adds it. A raw `zero_allow_untested_optimizer = false` makes DeepSpeed stop.
fn untested(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    let ds = r.targets.deepspeed;
    let raw = raw_ds_bool(r, "zero_allow_untested_optimizer");
    if matches!(raw, Some((true, _))) {
        return None;
    }
    let tested = r.facts.ds_zero_supported_optimizers;
    if let Some((false, span)) = raw {
        let d = Diagnostic::error(
            UNTESTED_OPTIMIZER,
            format!(
                "DeepSpeed {ds} stops on {} with ZeRO stage {}: \"You are using an untested ZeRO Optimizer. Please add <\\\"zero_allow_untested_optimizer\\\": true> …\"",
                display(o.kind),
                o.stage
            ),
            span,
        )
        .with_label("zero_allow_untested_optimizer = false")
        .with_secondary(kind_span(r), format!("`{}` is not tested with ZeRO", o.kind));
        return Some(d.with_help(format!(
            "remove `zero_allow_untested_optimizer` (the compiler sets it to true), or use one of the optimizers DeepSpeed {ds} tests with ZeRO: {}",
            tested.join(", ")
        )));
    }
    let mut d = Diagnostic::warning(
        UNTESTED_OPTIMIZER,
        format!(
            "DeepSpeed {ds} does not test {} with ZeRO stage {}: the compiler adds zero_allow_untested_optimizer = true, without which DeepSpeed stops (\"You are using an untested ZeRO Optimizer\")",
            display(o.kind),
            o.stage
        ),
        kind_span(r),
    )
    .with_label(format!("tested with ZeRO: {}", tested.join(", ")));
    if let Some(span) = r.span("zero.stage") {
        d = d.with_secondary(span, format!("ZeRO stage {}", o.stage));
    }
    Some(d.with_help(format!(
        "nothing to fix if {} is what you want (DeepSpeed logs \"proceed with caution\"); the tested ones are {}",
        display(o.kind),
        tested.join(", ")
    )))
}

/// R-P04 (docs/upstream.md §6.3): `assert not self.zero_optimization(), "1bit-Adam is not
/// compatible with ZeRO"` (also "0/1 Adam …", "1bit-Lamb …";
/// deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py: _configure_basic_optimizer, since
/// v0.4.1 PR #1169). Before v0.4.1 nothing stopped it, but these optimizers run their own
/// compressed all-reduce and were never made to work under ZeRO's partitioning, so it is an error
/// for every version.
fn onebit_with_zero(r: &Resolved, o: &Opt) -> Diagnostic {
    let upstream = match o.kind {
        "onebitadam" => "1bit-Adam is not compatible with ZeRO",
        "zerooneadam" => "0/1 Adam is not compatible with ZeRO",
        _ => "1bit-Lamb is not compatible with ZeRO",
    };
    Diagnostic::error(
        ONEBIT_WITH_ZERO,
        format!(
            "{} cannot run with ZeRO stage {}: DeepSpeed asserts \"{upstream}\"",
            display(o.kind),
            o.stage
        ),
        anchor(r, "zero.stage"),
    )
    .with_label(format!("ZeRO stage {}", o.stage))
    .with_secondary(kind_span(r), format!("`{}`", o.kind))
    .with_help(format!(
        "remove the `zero` block (stage 0) to use {}, or use adam / adamw / lamb with ZeRO",
        display(o.kind)
    ))
}

/// R-P05 (docs/upstream.md §6.3): `assert self.dynamic_loss_scale(), "DeepSpeed lamb optimizer
/// requires dynamic loss scaling"` (also onebitlamb;
/// deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py: _do_sanity_check). A fixed
/// `loss_scale` with fp16 fails it; so does bf16 on DeepSpeed 0.5.5–0.17.0, whose `get_loss_scale`
/// returns a fixed 1.0 for bf16
/// (deepspeedai/DeepSpeed@v0.15.2:deepspeed/runtime/config.py:get_loss_scale).
fn lamb_fixed_loss_scale(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    let precision = r.choice("train.precision");
    let name = if o.kind == "lamb" {
        "lamb"
    } else {
        "onebitlamb"
    };
    let upstream = format!("DeepSpeed {name} optimizer requires dynamic loss scaling");
    if precision == "fp16" {
        let scale = r.int("train.loss_scale")?;
        let mut d = Diagnostic::error(
            LAMB_FIXED_LOSS_SCALE,
            format!(
                "{} needs dynamic loss scaling, but `loss_scale = {scale}` fixes it: DeepSpeed asserts \"{upstream}\"",
                display(o.kind)
            ),
            anchor(r, "train.loss_scale"),
        )
        .with_label(format!("a fixed fp16 loss scale of {scale}"));
        if r.span("optimizer.kind").is_some() {
            d = d.with_secondary(kind_span(r), format!("`{}`", o.kind));
        }
        let d = d.with_help("write `loss_scale = dynamic` (the default), or use another optimizer");
        return Some(fix::with_set(d, r, "train.loss_scale", "dynamic"));
    }
    if precision == "bf16" && r.facts.ds_bf16_fixed_loss_scale {
        let ds = r.targets.deepspeed;
        let fixed = first_release(Library::DeepSpeed, ds, |f| {
            matches!(f, Fact::DsBf16FixedLossScale(false))
        });
        let mut d = Diagnostic::error(
            LAMB_FIXED_LOSS_SCALE,
            format!(
                "with bf16, DeepSpeed {ds} uses a fixed loss scale of 1.0, and {} needs dynamic loss scaling: DeepSpeed asserts \"{upstream}\"",
                display(o.kind)
            ),
            anchor(r, "train.precision"),
        )
        .with_label("bf16: DeepSpeed's loss scale is a fixed 1.0")
        .with_secondary(kind_span(r), format!("`{}`", o.kind));
        d = with_target(d, r, Library::DeepSpeed);
        let upgrade = fixed
            .map(|v| format!("target deepspeed ≥ {v} (bf16 no longer fixes the scale), "))
            .unwrap_or_default();
        return Some(d.with_help(format!(
            "{upgrade}train in fp16 with `loss_scale = dynamic`, or use another optimizer"
        )));
    }
    None
}

/// R-P06 (docs/upstream.md §6.3, §4.1): there is no CPU LAMB; with optimizer offload DeepSpeed
/// still builds FusedLamb (a CUDA kernel) for the offloaded fp32 partitions on the CPU, which fails
/// at the first step (HF's own note: "… should work … (except LAMB)",
/// huggingface/transformers@v5.24.0:src/transformers/integrations/deepspeed.py:deepspeed_optim_sched).
fn lamb_offload(r: &Resolved, o: &Opt) -> Diagnostic {
    let mut d = Diagnostic::error(
        LAMB_OFFLOAD,
        format!(
            "LAMB cannot run with `offload optimizer = {}`: DeepSpeed has no CPU LAMB, and its FusedLamb fails on the offloaded CPU states",
            o.offload_optimizer
        ),
        anchor(r, "zero.offload optimizer"),
    )
    .with_label("optimizer states on the CPU");
    if r.span("optimizer.kind").is_some() {
        d = d.with_secondary(kind_span(r), "`lamb`: GPU only");
    }
    d.with_help("remove the optimizer offload, or use adam / adamw (DeepSpeedCPUAdam) with offload")
}

/// What accelerate's `map_pytorch_optim_to_deepspeed` turns HF's optimizer into
/// (huggingface/accelerate@v1.15.0:src/accelerate/utils/deepspeed.py:map_pytorch_optim_to_deepspeed;
/// before v1.2.0 every optimizer became `DeepSpeedCPUAdam(param_groups, lr, weight_decay)`,
/// accelerate@v1.1.1:src/accelerate/accelerator.py:_prepare_deepspeed): `Ok` when it is the
/// same optimizer on the CPU, `Err(what it becomes)` otherwise.
fn cpu_replacement(r: &Resolved, kind: &str) -> Result<&'static str, &'static str> {
    let by_class = r.facts.acc_cpu_optimizer_by_class;
    match kind {
        "adamw" => Ok("DeepSpeedCPUAdam (adamw_mode)"),
        "adagrad" if by_class && r.facts.ds_optimizers.contains(&"adagrad") => {
            Ok("DeepSpeedCPUAdagrad")
        }
        "lion" if by_class && r.facts.ds_optimizers.contains(&"lion") => Ok("DeepSpeedCPULion"),
        _ if by_class => {
            Err("DeepSpeedCPUAdam with adamw_mode = false (Adam with L2 weight decay)")
        }
        _ => Err("DeepSpeedCPUAdam (AdamW)"),
    }
}

/// R-O01 (docs/upstream.md §4.1): on the accelerate path (transformers ≥ 4.30) with optimizer
/// offload and `zero_force_ds_cpu_optimizer` not false, accelerate rebuilds HF's optimizer as a
/// DeepSpeed CPU optimizer from its param groups (only `lr` and `weight_decay` carried as
/// defaults): an SGD, Adafactor, … run silently becomes Adam (bug); AdamW stays AdamW (info).
fn hf_optimizer_replaced(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    let kind = o.hf_kind();
    let acc = r.targets.accelerate;
    let lr = r.num("optimizer.lr");
    let span = anchor(r, "zero.offload optimizer");
    match cpu_replacement(r, kind) {
        // accelerate (≥ 1.2.0, accelerate/utils/deepspeed.py:map_pytorch_optim_to_deepspeed)
        // sets `adamw_mode` in the defaults for every optimizer before it picks the class, and
        // DeepSpeedCPUAdagrad / DeepSpeedCPULion take no such argument (DeepSpeed 0.8.3–0.19.8
        // ops/adagrad/cpu_adagrad.py, ops/lion/cpu_lion.py): the run stops at start (seen with
        // accelerate 1.15.0 + DeepSpeed 0.19.8 in conformance/fixtures/owners.json).
        Ok(class) if kind != "adamw" => {
            let d = rebuilt(
                r,
                o,
                format!(
                    "with `owner = hf` and optimizer offload, accelerate {acc} rebuilds HF's {} as {class} and passes it `adamw_mode`, which {class} does not take: the run stops at start with \"TypeError: {class}.__init__() got an unexpected keyword argument 'adamw_mode'\"",
                    display(kind)
                ),
                span,
            );
            let d = with_target(d, r, Library::Accelerate);
            let d = d.with_help(format!(
                "write `owner = deepspeed` (DeepSpeed builds {class} from its config), remove the optimizer offload, or add `deepspeed {{ zero_force_ds_cpu_optimizer = false }}` to keep HF's {} (it then steps on the CPU copies)",
                display(kind)
            ));
            Some(to_deepspeed(d, r))
        }
        Ok(becomes) => {
            let d = note(
                HF_OPTIMIZER_REPLACED,
                format!(
                    "with `owner = hf` and optimizer offload, accelerate {acc} rebuilds HF's AdamW as {becomes}: the same update, computed on the CPU"
                ),
                span,
            )
            .with_label(format!("offload optimizer = {}", o.offload_optimizer));
            Some(d.with_help(
                "nothing to fix; `owner = deepspeed` states the DeepSpeedCPUAdam explicitly",
            ))
        }
        Err(becomes) => {
            let mut d = rebuilt(
                r,
                o,
                format!(
                    "with `owner = hf` and optimizer offload, accelerate {acc} silently replaces HF's {} by {becomes} at lr {}: the run does not train with {}",
                    display(kind),
                    fmt_lr(lr),
                    display(kind)
                ),
                span,
            );
            if r.span("optimizer.kind").is_some() {
                d = d.with_secondary(kind_span(r), format!("`{}`", o.kind));
            }
            d = with_target(d, r, Library::Accelerate);
            let ds_fix = if kind == "adafactor" {
                String::new()
            } else {
                "write `owner = deepspeed` (DeepSpeed builds it), ".into()
            };
            let d = d.with_help(format!(
                "{ds_fix}remove the optimizer offload, or add `deepspeed {{ zero_force_ds_cpu_optimizer = false }}` to keep HF's {} (it then steps on the CPU copies)",
                display(kind)
            ));
            Some(if ds_fix.is_empty() {
                d
            } else {
                to_deepspeed(d, r)
            })
        }
    }
}

/// R0407's error: accelerate rebuilds HF's optimizer for the CPU (labels on the offload and, when
/// written, the owner).
fn rebuilt(r: &Resolved, o: &Opt, message: String, span: Span) -> Diagnostic {
    let mut d = Diagnostic::error(HF_OPTIMIZER_REPLACED, message, span).with_label(format!(
        "offload optimizer = {}: HF's optimizer is rebuilt for the CPU",
        o.offload_optimizer
    ));
    if let Some(s) = r.span("optimizer.owner") {
        d = d.with_secondary(s, "HF builds the optimizer");
    }
    d
}

/// R-O02 (docs/upstream.md §4.1): transformers < 4.30 passes HF's optimizer to
/// `deepspeed.initialize` as is; DeepSpeed ≥ 0.8.3 (PR #2971) raises `ZeRORuntimeException` for a
/// client optimizer that is not DeepSpeedCPUAdam under ZeRO-Offload unless
/// `zero_force_ds_cpu_optimizer` is false
/// (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:DeepSpeedEngine._configure_optimizer).
fn client_optimizer_offload(r: &Resolved, o: &Opt) -> Diagnostic {
    let (tf, ds) = (r.targets.transformers, r.targets.deepspeed);
    let mut d = Diagnostic::error(
        CLIENT_OPTIMIZER_OFFLOAD,
        format!(
            "DeepSpeed {ds} rejects HF's {} under ZeRO-Offload: transformers {tf} hands it to deepspeed.initialize unchanged, and DeepSpeed raises \"You are using ZeRO-Offload with a client provided optimizer …\"",
            display(o.hf_kind())
        ),
        anchor(r, "zero.offload optimizer"),
    )
    .with_label(format!("offload optimizer = {}", o.offload_optimizer));
    if let Some(s) = r.span("optimizer.owner") {
        d = d.with_secondary(s, "HF builds the optimizer");
    }
    d = with_target(d, r, Library::DeepSpeed);
    let d = d.with_help(
        "write `owner = deepspeed` (DeepSpeedCPUAdam), or add `deepspeed { zero_force_ds_cpu_optimizer = false }` to run HF's optimizer on the CPU copies",
    );
    to_deepspeed(d, r)
}

/// docs/upstream.md §4.2 (transformers v4.6.1): transformers before 4.9 (PR #12690) raise "ZeRO
/// Offload can only work with DeepSpeed optimizers" when HF builds the optimizer and `is_offload()`
/// holds: stage 2 with the legacy `cpu_offload` switch (what the compiler writes for DeepSpeed <
/// 0.3.15), or stage 3 with `offload_optimizer` / `offload_param` on cpu or nvme
/// (huggingface/transformers@v4.6.1:src/transformers/integrations.py:DeepSpeedConfigHF.config_process,
/// deepspeed_init).
fn offload_needs_ds_optimizer(r: &Resolved, o: &Opt) -> Option<Diagnostic> {
    let key = match o.stage {
        2 if o.offload_optimizer != "none" && !r.facts.ds_offload_optimizer_section => {
            "zero.offload optimizer"
        }
        3 if o.offload_optimizer != "none" => "zero.offload optimizer",
        3 if o.offload_param != "none" => "zero.offload param",
        _ => return None,
    };
    let tf = r.targets.transformers;
    let fixed = first_release(Library::Transformers, tf, |f| {
        matches!(f, Fact::HfOffloadNeedsDsOptimizer(false))
    });
    let mut d = Diagnostic::error(
        OFFLOAD_NEEDS_DS_OPTIMIZER,
        format!(
            "transformers {tf} refuses HF's optimizer with ZeRO Offload: \"ZeRO Offload can only work with DeepSpeed optimizers\""
        ),
        anchor(r, key),
    )
    .with_label(format!(
        "{} = {}",
        key.trim_start_matches("zero."),
        r.word(key).unwrap_or("cpu")
    ));
    if let Some(s) = r.span("optimizer.owner") {
        d = d.with_secondary(s, "HF builds the optimizer");
    }
    d = with_target(d, r, Library::Transformers);
    let upgrade = fixed
        .map(|v| format!(", or target transformers ≥ {v}"))
        .unwrap_or_default();
    let d = d.with_help(format!(
        "write `owner = deepspeed` (DeepSpeed builds the optimizer), or remove the offload{upgrade}"
    ));
    Some(to_deepspeed(d, r))
}

/// docs/upstream.md §4.2: with a DeepSpeed `optimizer` section and no DeepSpeed `scheduler` (an HF
/// schedule), transformers before 4.10 raise "At the moment HF scheduler + DeepSpeed optimizer
/// combination is not possible" (huggingface/transformers@v4.6.1:src/transformers/integrations.py:
/// deepspeed_init), and 4.30–4.33 raise "Found `optimizer` configured in the DeepSpeed config, but
/// no `scheduler`. …" (huggingface/transformers@v4.30.0:src/transformers/deepspeed.py:
/// deepspeed_optim_sched); see
/// [`crate::upstream::versions::Facts::hf_ds_optimizer_hf_scheduler_error`].
fn ds_optimizer_hf_scheduler(r: &Resolved, o: &Opt, out: &mut Vec<Diagnostic>) {
    let Some(upstream) = r.facts.hf_ds_optimizer_hf_scheduler_error else {
        return;
    };
    let Some(schedule) = r.word("schedule.kind") else {
        return;
    };
    if !o.deepspeed() || is_deepspeed_schedule(schedule) {
        return;
    }
    let tf = r.targets.transformers;
    let span = r
        .span("schedule.kind")
        .unwrap_or_else(|| first_written(r, &["optimizer.owner"]));
    let mut d = Diagnostic::error(
        DS_OPTIMIZER_HF_SCHEDULER,
        format!(
            "transformers {tf} cannot combine DeepSpeed's optimizer with HF's `{schedule}` schedule: \"{upstream}\""
        ),
        span,
    )
    .with_label(format!(
        "`{schedule}`{}: HF builds the schedule",
        origin(r, "schedule.kind")
    ));
    if r.span("schedule.kind").is_some() {
        if let Some(s) = r
            .span("optimizer.owner")
            .or_else(|| r.span("optimizer.kind"))
        {
            d = d.with_secondary(
                s,
                format!(
                    "DeepSpeed builds the optimizer{}",
                    origin(r, "optimizer.owner")
                ),
            );
        }
    }
    d = with_target(d, r, Library::Transformers);
    let twin = match schedule {
        "constant_with_warmup" => Some("WarmupLR"),
        "linear" => Some("WarmupDecayLR"),
        "cosine" => Some("WarmupCosineLR"),
        _ => None,
    };
    let mut fixes = Vec::new();
    if let Some(t) = twin {
        fixes.push(format!("write `schedule {t}` (DeepSpeed's counterpart)"));
    }
    fixes.push("`owner = hf` (HF builds both)".into());
    if let Some(v) = first_release(Library::Transformers, tf, |f| {
        matches!(f, Fact::HfDsOptimizerHfSchedulerError(None))
    }) {
        fixes.push(format!("target transformers ≥ {v}"));
    }
    out.push(d.with_help(fixes.join(", or ")));
}

/// DeepSpeed has no Adafactor of its own: a `type` outside `DEEPSPEED_OPTIMIZERS` is looked up
/// in `torch.optim` with its exact case (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/
/// engine.py:_configure_basic_optimizer, `getattr(torch.optim, self.optimizer_name())`), where
/// `Adafactor` only exists since torch 2.5 and is not HF's Adafactor (no relative step, no
/// parameter scaling).
fn adafactor(r: &Resolved) -> Diagnostic {
    let mut d = Diagnostic::error(
        ADAFACTOR_DEEPSPEED,
        "DeepSpeed has no Adafactor: with `owner = deepspeed` it would look `Adafactor` up in torch.optim, which has none before torch 2.5 and is not HF's Adafactor after",
        kind_span(r),
    )
    .with_label("DeepSpeed would build this");
    if let Some(s) = r.span("optimizer.owner") {
        d = d.with_secondary(s, "owner = deepspeed");
    }
    d.with_help("write `owner = hf`: HF builds its Adafactor (optim = \"adafactor\")")
}

/// `lion` (v0.11.0) and `zerooneadam` (v0.6.1) are DeepSpeed names with no torch.optim
/// fallback; before they were added DeepSpeed asserts "<type> is not a supported DeepSpeed
/// Optimizer" (deepspeedai/DeepSpeed@v0.10.3:deepspeed/runtime/engine.py:_do_sanity_check).
fn not_in_deepspeed(r: &Resolved, o: &Opt) -> Diagnostic {
    let ds = r.targets.deepspeed;
    let kind = o.kind;
    let since = first_release(
        Library::DeepSpeed,
        ds,
        |f| matches!(f, Fact::DsOptimizers(list) if list.contains(&kind)),
    );
    // An optimizer an earlier release had: the release that deleted it.
    let has = |f: &Fact| matches!(f, Fact::DsOptimizers(list) if list.contains(&kind));
    let lists = || {
        CHANGES.iter().filter(|c| {
            c.library == Library::DeepSpeed
                && c.since <= ds
                && matches!(c.fact, Fact::DsOptimizers(_))
        })
    };
    let removed = lists()
        .filter(|c| has(&c.fact))
        .map(|c| c.since)
        .max()
        .and_then(|last| {
            lists()
                .filter(|c| c.since > last && !has(&c.fact))
                .map(|c| c.since)
                .min()
        });
    let d = Diagnostic::error(
        NOT_IN_DEEPSPEED,
        format!(
            "DeepSpeed {ds} has no {} optimizer: it stops with \"{kind} is not a supported DeepSpeed Optimizer\"",
            display(kind)
        ),
        kind_span(r),
    )
    .with_label(match (since, removed) {
        (Some(v), _) => format!("added in DeepSpeed {v}"),
        (None, Some(v)) => format!("removed in DeepSpeed {v}"),
        (None, None) => "not in this DeepSpeed".into(),
    });
    let d = with_target(d, r, Library::DeepSpeed);
    d.with_help(match (since, removed) {
        (Some(v), _) => format!("target deepspeed ≥ {v}, or choose another optimizer"),
        (None, Some(v)) => format!(
            "DeepSpeed {v} deleted it: choose another optimizer (adamw, adam, lamb), or target deepspeed < {v}"
        ),
        (None, None) => "choose another optimizer".into(),
    })
}

/// TrainingArguments fields the `optimizer` block writes (schema `hf` column), and the recipe
/// key each restates.
const HF_OPTIMIZER_FIELDS: &[(&str, &str)] = &[
    ("learning_rate", "lr"),
    ("weight_decay", "weight_decay"),
    ("adam_beta1", "betas"),
    ("adam_beta2", "betas"),
    ("adam_epsilon", "eps"),
    ("optim", "the optimizer's kind and owner"),
    ("optim_args", "the optimizer's settings"),
];

/// R-H07 (docs/upstream.md §3): a raw DeepSpeed `optimizer` section or raw HF optimizer fields
/// restate what `optimizer` writes. With a DeepSpeed `optimizer`, `args.optim` is silently ignored
/// (transformers v5), and differing lr / betas / eps / weight_decay are a mismatch error (transformers ≥ 4.24,
/// `fill_match`). Two sources of truth: error.
fn twice(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let kind = r.choice("optimizer.kind");
    let ours = if r.is_given("optimizer.kind") {
        format!("`optimizer {kind}`")
    } else {
        "the recipe's optimizer (adamw, the default)".to_string()
    };
    let ds: Vec<&(String, Val, Span)> = r
        .raw_deepspeed
        .iter()
        .filter(|(k, _, _)| {
            (k == "optimizer" || k.starts_with("optimizer."))
                && k != "optimizer.params.max_grad_norm"
        })
        .collect();
    if let Some((first, rest)) = ds.split_first() {
        let mut d = Diagnostic::error(
            OPTIMIZER_TWICE,
            format!("the optimizer is given twice: by a raw DeepSpeed `optimizer` and by {ours}"),
            first.2,
        )
        .with_label(format!("`{}` in `deepspeed {{ }}`", first.0));
        for (key, _, span) in rest {
            d.secondary.push(Label::new(*span, format!("`{key}` too")));
        }
        if let Some(span) = r.span("optimizer.kind") {
            d = d.with_secondary(span, "the recipe's optimizer");
        }
        out.push(d.with_help(
            "the compiler writes DeepSpeed's `optimizer` section from `optimizer` (owner = deepspeed); state the optimizer once there and remove the raw keys",
        ));
    }
    let hf: Vec<(&(String, Val, Span), &str)> = r
        .raw_hf
        .iter()
        .filter_map(|e| {
            let field = e.0.split('.').next().unwrap_or("");
            HF_OPTIMIZER_FIELDS
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, ours)| (e, *ours))
        })
        .collect();
    if let Some(((first, _, first_span), what)) = hf.first().copied() {
        let mut d = Diagnostic::error(
            OPTIMIZER_TWICE,
            format!("the optimizer is given twice: `hf {{ {first} }}` restates {what} of {ours}"),
            *first_span,
        )
        .with_label(format!("`{first}` in `hf {{ }}`"));
        for ((key, _, span), w) in hf.iter().skip(1) {
            d.secondary
                .push(Label::new(*span, format!("`{key}` restates {w} too")));
        }
        if let Some(span) = r.span("optimizer.kind") {
            d = d.with_secondary(span, "the recipe's optimizer");
        }
        let raw_optim_args = hf
            .iter()
            .find(|((k, _, _), _)| k == "optim_args")
            .map(|((_, v, _), _)| v.as_str().unwrap_or_default());
        let help = match raw_optim_args {
            Some(text) => optim_args_help(r, text),
            None => "the compiler writes learning_rate, weight_decay, adam_beta1/2, adam_epsilon and optim from `optimizer`; state them once there and remove them from `hf { }`".to_string(),
        };
        out.push(d.with_help(help));
    }
}

/// R0411's help for a raw `hf { optim_args = "…" }`: the compiler writes `optim_args` itself from
/// the typed keys HF reads it for (src/upstream/hf_optimizers.rs, as the newest release reads
/// them), so each entry is translated to the recipe key that states it; entries with no recipe
/// key are named.
fn optim_args_help(r: &Resolved, text: &str) -> String {
    let kind = r.choice("optimizer.kind");
    let newest = crate::upstream::versions::Facts::for_targets(
        &crate::upstream::versions::Targets::newest(),
    );
    let (mut typed, mut untyped) = (Vec::new(), Vec::new());
    // As huggingface/transformers@v5.24.0 trainer_optimizer.py:_parse_optim_args splits it.
    for pair in text.replace(' ', "").split(',').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match hf_optimizers::key_for_optim_arg(kind, name, &newest) {
            Some(key) => {
                let value = if value.parse::<f64>().is_ok() {
                    value.to_string()
                } else {
                    // _get_sgd: `value.lower() in ("true", "1", "yes")`.
                    matches!(value.to_ascii_lowercase().as_str(), "true" | "1" | "yes").to_string()
                };
                typed.push(format!("{key} = {value}"));
            }
            None => untyped.push(format!("`{name}`")),
        }
    }
    let mut parts = Vec::new();
    if !typed.is_empty() {
        let who = if r.word("optimizer.owner") == Some("hf") {
            "the compiler writes `optim_args` from them"
        } else {
            "DeepSpeed passes them to the optimizer it builds, and HF ignores `optim_args` (docs/upstream.md R-H07)"
        };
        parts.push(format!(
            "write `{}` in `optimizer {kind} {{ }}`: {who}",
            typed.join(", ")
        ));
    }
    if !untyped.is_empty() {
        parts.push(format!(
            "{} {} no recipe key",
            untyped.join(", "),
            if untyped.len() == 1 { "has" } else { "have" }
        ));
    }
    parts.push("remove `optim_args` from `hf { }`".into());
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::versions::{Facts, Targets};

    fn facts(tf: &str, acc: &str, ds: &str) -> Facts {
        Facts::for_targets(&Targets {
            transformers: tf.parse().unwrap(),
            accelerate: acc.parse().unwrap(),
            deepspeed: ds.parse().unwrap(),
        })
    }

    fn codes(text: &str) -> Vec<(&'static str, String)> {
        crate::check::check_source(text)
            .diagnostics
            .into_iter()
            .filter(|d| d.code.starts_with("R04"))
            .map(|d| (d.code, d.help.unwrap_or_default()))
            .collect()
    }

    const HEAD: &str = "model bert { from = \"m\", task = classify(labels: 2), hidden_size = 8 }\ndata { train = \"t.jsonl\", samples = 80 }\nbatch { micro = 8 }\n";

    #[test]
    fn ownership_facts_by_version() {
        let f = facts("4.6.1", "1.15.0", "0.3.16");
        assert!(f.hf_offload_needs_ds_optimizer);
        assert!(f.hf_ds_optimizer_hf_scheduler_error.is_some());
        let f = facts("4.24.0", "1.15.0", "0.8.2");
        assert!(!f.hf_offload_needs_ds_optimizer && !f.ds_force_cpu_optimizer);
        assert!(f.hf_ds_optimizer_hf_scheduler_error.is_none());
        let f = facts("4.31.0", "1.1.1", "0.10.3");
        assert!(f
            .hf_ds_optimizer_hf_scheduler_error
            .unwrap()
            .starts_with("Found `optimizer`"));
        assert!(!f.acc_cpu_optimizer_by_class && f.ds_force_cpu_optimizer);
        assert!(
            !f.ds_optimizers.contains(&"lion")
                && f.ds_zero_supported_optimizers.contains(&"adagrad")
        );
        assert!(f.ds_bf16_fixed_loss_scale);
        let f = facts("5.24.0", "1.15.0", "0.19.8");
        assert!(f.hf_ds_optimizer_hf_scheduler_error.is_none() && f.acc_cpu_optimizer_by_class);
        assert!(f.ds_zero_supported_optimizers.contains(&"lion") && !f.ds_bf16_fixed_loss_scale);
    }

    #[test]
    fn accelerate_maps_by_class_from_1_2() {
        let mut r = crate::resolve::resolve(
            &crate::syntax::parse(HEAD).unwrap(),
            &crate::resolve::Options::default(),
        );
        assert_eq!(
            cpu_replacement(&r, "adamw"),
            Ok("DeepSpeedCPUAdam (adamw_mode)")
        );
        assert_eq!(cpu_replacement(&r, "adagrad"), Ok("DeepSpeedCPUAdagrad"));
        assert_eq!(cpu_replacement(&r, "lion"), Ok("DeepSpeedCPULion"));
        assert!(cpu_replacement(&r, "sgd")
            .unwrap_err()
            .contains("adamw_mode = false"));
        r.facts = facts("5.24.0", "1.1.1", "0.19.8");
        assert_eq!(
            cpu_replacement(&r, "adagrad"),
            Err("DeepSpeedCPUAdam (AdamW)")
        );
        assert_eq!(
            cpu_replacement(&r, "adafactor"),
            Err("DeepSpeedCPUAdam (AdamW)")
        );
    }

    #[test]
    fn lamb_with_bf16_on_deepspeed_0_5_5_to_0_17_0() {
        let lamb = "optimizer lamb { lr = 1e-3 }\ntrain { precision = bf16 }\n";
        let old = codes(&format!("target deepspeed \"0.15.2\"\n{HEAD}{lamb}"));
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].0, LAMB_FIXED_LOSS_SCALE);
        assert!(
            old[0].1.starts_with("target deepspeed ≥ 0.17.1"),
            "{}",
            old[0].1
        );
        assert!(codes(&format!("target deepspeed \"0.17.1\"\n{HEAD}{lamb}")).is_empty());
    }

    #[test]
    fn hf_scheduler_with_ds_optimizer_names_the_next_good_release() {
        let text =
            format!("target transformers \"4.31.0\"\n{HEAD}schedule cosine {{ warmup = 2 }}\n");
        let found = codes(&text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, DS_OPTIMIZER_HF_SCHEDULER);
        assert!(
            found[0].1.ends_with("target transformers ≥ 4.34.0"),
            "{}",
            found[0].1
        );
        assert!(
            found[0].1.starts_with("write `schedule WarmupCosineLR`"),
            "{}",
            found[0].1
        );
        // No `schedule` block: HF's default `linear` is still an HF schedule.
        let text = format!("target transformers \"4.9.0\"\n{HEAD}");
        assert_eq!(codes(&text)[0].0, DS_OPTIMIZER_HF_SCHEDULER);
    }

    #[test]
    fn transformers_4_6_sees_stage_2_offload_only_through_cpu_offload() {
        let body = "optimizer adamw { lr = 1e-4, owner = hf }\ntrain { precision = fp16 }\nzero 2 { offload optimizer = cpu }\n";
        // DeepSpeed 0.3.14 gets the legacy `cpu_offload` switch, which HF 4.6.1 detects.
        let legacy = codes(&format!(
            "target transformers \"4.6.1\", deepspeed \"0.3.14\"\n{HEAD}{body}"
        ));
        assert_eq!(
            legacy.iter().map(|c| c.0).collect::<Vec<_>>(),
            vec![OFFLOAD_NEEDS_DS_OPTIMIZER]
        );
        // 0.3.16 gets `offload_optimizer`, which HF 4.6.1 does not look at for stage 2.
        let section = codes(&format!(
            "target transformers \"4.6.1\", deepspeed \"0.3.16\"\n{HEAD}{body}"
        ));
        assert!(section.is_empty(), "{section:?}");
    }

    #[test]
    fn settings_the_built_optimizer_never_receives() {
        let only = |text: &str| -> Vec<&'static str> {
            codes(text)
                .into_iter()
                .map(|(c, _)| c)
                .filter(|c| *c == SETTING_NOT_PASSED)
                .collect()
        };
        // HF's SGD reads momentum and Nesterov from the `optim_args` the compiler writes from
        // transformers 5.3.0 on; before, they never reach it.
        let sgd = "optimizer sgd { lr = 0.1, momentum = 0.9, nesterov = true, owner = hf }\n";
        assert!(only(&format!("{HEAD}{sgd}")).is_empty());
        assert!(only(&format!("target transformers \"5.3.0\"\n{HEAD}{sgd}")).is_empty());
        let old = codes(&format!("target transformers \"5.2.0\"\n{HEAD}{sgd}"));
        assert_eq!(old.len(), 2, "{old:?}");
        assert!(
            old[0].1.starts_with("target transformers ≥ 5.3.0"),
            "{}",
            old[0].1
        );
        // The same keys with DeepSpeed building torch.optim.SGD: passed.
        let ds = "optimizer sgd { lr = 0.1, momentum = 0.9, nesterov = true }\n";
        assert!(only(&format!("target transformers \"5.2.0\"\n{HEAD}{ds}")).is_empty());
        // Adagrad's eps: through optim_args from 5.3.0; stating torch's own default is harmless.
        let eps = "optimizer adagrad { lr = 0.01, eps = 1e-6, owner = hf }\n";
        assert!(only(&format!("{HEAD}{eps}")).is_empty());
        assert_eq!(
            only(&format!("target transformers \"4.57.6\"\n{HEAD}{eps}")).len(),
            1
        );
        let torch_eps = "optimizer adagrad { lr = 0.01, eps = 1e-10, owner = hf }\n";
        assert!(only(&format!(
            "target transformers \"4.57.6\"\n{HEAD}{torch_eps}"
        ))
        .is_empty());
        // AdamW: amsgrad, bias_correction = false, torch_adam = false never reach torch's AdamW;
        // the values it runs with anyway are accepted.
        for bad in [
            "amsgrad = true",
            "bias_correction = false",
            "torch_adam = false",
        ] {
            let text = format!("{HEAD}optimizer adamw {{ lr = 3e-5, {bad}, owner = hf }}\n");
            assert_eq!(only(&text), vec![SETTING_NOT_PASSED], "{bad}");
        }
        for fine in [
            "amsgrad = false",
            "bias_correction = true",
            "torch_adam = true",
        ] {
            let text = format!("{HEAD}optimizer adamw {{ lr = 3e-5, {fine}, owner = hf }}\n");
            assert!(codes(&text).is_empty(), "{fine}");
        }
        // no_decay: HF's own grouping; only a list other than the default, and only while
        // something decays.
        let nd = |wd: &str, list: &str| {
            format!("{HEAD}optimizer adamw {{ lr = 3e-5, weight_decay = {wd}, no_decay = {list}, owner = hf }}\n")
        };
        assert_eq!(only(&nd("0.01", "[\"bias\"]")).len(), 1);
        assert!(only(&nd("0", "[\"bias\"]")).is_empty());
        assert!(codes(&nd("0.01", "[\"LayerNorm.weight\", \"bias\"]")).is_empty());
        // Lion and Adafactor: everything the language lets them state reaches them.
        let lion =
            "optimizer lion { lr = 1e-4, betas = (0.9, 0.99), weight_decay = 0.1, owner = hf }\n";
        // (R0416 warns that HF's Lion needs bitsandbytes; nothing else.)
        let lion_codes: Vec<&str> = codes(&format!("{HEAD}{lion}"))
            .into_iter()
            .map(|(code, _)| code)
            .collect();
        assert_eq!(lion_codes, vec![OPTIONAL_DEPENDENCY]);
        let adafactor = "optimizer adafactor { lr = 1e-3, weight_decay = 0.01, owner = hf }\n";
        assert!(codes(&format!("{HEAD}{adafactor}")).is_empty());
        // DeepSpeed's torch_adam: torch's Adam has no bias_correction; FusedAdam has.
        let ds_torch =
            "optimizer adamw { lr = 3e-5, bias_correction = false, torch_adam = true }\n";
        assert_eq!(only(&format!("{HEAD}{ds_torch}")), vec![SETTING_NOT_PASSED]);
        let fused = "optimizer adamw { lr = 3e-5, bias_correction = false }\n";
        assert!(codes(&format!("{HEAD}{fused}")).is_empty());
        // transformers 4.6.1 has no `optim`: HF builds AdamW whatever the kind, not this rule's.
        let legacy = format!("target transformers \"4.6.1\", deepspeed \"0.3.16\"\n{HEAD}{sgd}");
        assert!(only(&legacy).is_empty());
    }

    #[test]
    fn a_raw_optim_args_is_translated_to_the_typed_keys() {
        let text = format!(
            "{HEAD}optimizer sgd {{ lr = 0.1, owner = hf }}\nhf {{ optim_args = \"momentum=0.9, nesterov=True, dampening=0\" }}\n"
        );
        let found = codes(&text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, OPTIMIZER_TWICE);
        assert!(
            found[0].1.starts_with("write `momentum = 0.9, nesterov = true` in `optimizer sgd { }`: the compiler writes `optim_args`"),
            "{}",
            found[0].1
        );
        assert!(
            found[0].1.contains("`dampening` has no recipe key"),
            "{}",
            found[0].1
        );
    }

    #[test]
    fn untested_optimizer_respects_a_raw_flag() {
        let body = "optimizer sgd { lr = 0.1 }\nzero 1\n";
        assert_eq!(codes(&format!("{HEAD}{body}"))[0].0, UNTESTED_OPTIMIZER);
        let allowed = format!("{HEAD}{body}deepspeed {{ zero_allow_untested_optimizer = true }}\n");
        assert!(codes(&allowed).is_empty());
        let refused =
            format!("{HEAD}{body}deepspeed {{ zero_allow_untested_optimizer = false }}\n");
        let d = crate::check::check_source(&refused).diagnostics;
        let d = d.iter().find(|d| d.code == UNTESTED_OPTIMIZER).unwrap();
        assert!(d.is_error());
        // Adagrad is tested from DeepSpeed 0.9.2 on.
        let adagrad = "optimizer adagrad { lr = 0.01 }\nzero 1\n";
        assert_eq!(
            codes(&format!("target deepspeed \"0.9.1\"\n{HEAD}{adagrad}"))[0].0,
            UNTESTED_OPTIMIZER
        );
        assert!(codes(&format!("target deepspeed \"0.9.2\"\n{HEAD}{adagrad}")).is_empty());
    }
}
