//! Compat rules: the raw `deepspeed { }` and `hf { }` escape hatches against what HF, accelerate
//! and DeepSpeed do with them — `"auto"` that nothing fills (docs/upstream.md R-A01, R-A09), raw
//! keys that duplicate typed items (two sources of truth), FSDP with DeepSpeed
//! (docs/upstream.md R-H03), `save_only_model` with `load_best_model_at_end`
//! (docs/upstream.md R-H04), `managed_gradient_accumulation = false` (docs/upstream.md R-S06) — and
//! the target accelerate against what the target transformers requires (docs/upstream.md §0.1).
//!
//! Only the batch, clipping, step, seed, output, logging, evaluation, saving, data-loader and
//! model duplicates are here; precision, ZeRO-section, optimizer and scheduler duplicates belong
//! to their own families. Key names are checked by the schema layer (check/raw.rs) already.

use crate::diagnostics::Diagnostic;
use crate::resolve::{Resolved, Val};
use crate::syntax::ast::Span;

use super::{anchor, origin};

/// A raw DeepSpeed value `"auto"` that nothing fills (docs/upstream.md R-A01).
pub const AUTO_UNFILLED: &str = "R0901";
/// A raw DeepSpeed key that duplicates a typed item.
pub const RAW_DEEPSPEED_DUPLICATE: &str = "R0902";
/// A raw TrainingArguments field that duplicates a typed item.
pub const RAW_HF_DUPLICATE: &str = "R0903";
/// `hf { deepspeed = … }`: the compiler owns it.
pub const HF_DEEPSPEED_FIELD: &str = "R0904";
/// FSDP together with DeepSpeed (docs/upstream.md R-H03).
pub const FSDP_WITH_DEEPSPEED: &str = "R0905";
/// `save_only_model` with `load_best_model_at_end` under DeepSpeed (docs/upstream.md R-H04).
pub const SAVE_ONLY_MODEL_BEST: &str = "R0906";
/// `managed_gradient_accumulation = false` under accelerate ≥ 1.8 (docs/upstream.md R-S06).
pub const UNMANAGED_ACCUMULATION: &str = "R0907";
/// The target accelerate is older than the target transformers requires.
pub const ACCELERATE_TOO_OLD: &str = "R0908";
/// A raw DeepSpeed section the target DeepSpeed has removed.
pub const REMOVED_DEEPSPEED_KEY: &str = "R0909";
/// A target release newer than the newest one the rules were read from.
pub const TARGET_TOO_NEW: &str = "R0910";
/// A raw DeepSpeed `"auto"` that accelerate fills from its own defaults with a value other than
/// the recipe's.
pub const AUTO_ACCELERATE_DEFAULT: &str = "R0911";
/// With gradient accumulation, the HF Trainer of the target release scales the loss so that the
/// gradient of an optimizer step is not the mean over its micro-batches (G× or 1/G).
pub const GA_LOSS_SCALING: &str = "R0912";

/// Raw DeepSpeed keys that DeepSpeed 0.19.8 refuses with "… has been removed", even when the
/// section only disables the feature (`deepspeed/runtime/config.py:_reject_removed_config_keys`,
/// `_REMOVED_TOP_LEVEL_CONFIG_KEYS` and `_REMOVED_ZERO_CONFIG_KEYS` of the 0.19.8 wheel; all
/// read by 0.19.5; seen by the conformance harness, conformance/fixtures/).
pub const REMOVED_KEYS: &[&str] = &[
    "amp",
    "compression_training",
    "curriculum_learning",
    "eigenvalue",
    "elasticity",
    "graph_harvesting",
    "nebula",
    "progressive_layer_drop",
    "quantize_training",
    "sparse_attention",
    "sparse_gradients",
    "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.mics_shard_size",
    "zero_optimization.zeropp_loco_param",
];

/// The [`REMOVED_KEYS`] entry `dotted` is, or is below.
pub fn removed_key(dotted: &str) -> Option<&'static str> {
    REMOVED_KEYS.iter().copied().find(|k| {
        dotted
            .strip_prefix(k)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

/// Raw keys of features DeepSpeed has removed (one report per section).
fn removed_keys(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if !r.facts.ds_removed_legacy_features {
        return;
    }
    let mut seen: Vec<&str> = Vec::new();
    for (path, _, span) in &r.raw_deepspeed {
        let Some(key) = removed_key(path) else {
            continue;
        };
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let ds = r.targets.deepspeed;
        let message = format!(
            "DeepSpeed {ds} has removed `{key}`: the run stops with \"… has been removed\""
        );
        let d = Diagnostic::error(REMOVED_DEEPSPEED_KEY, message, *span);
        out.push(
            d.with_label(format!("removed in DeepSpeed {ds}"))
                .with_help("remove it, or target the DeepSpeed release that still has it (e.g. `target deepspeed \"0.19.5\"`)"),
        );
    }
}

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        AUTO_UNFILLED,
        "auto-unfilled",
        "a raw DeepSpeed \"auto\" that HF and accelerate do not fill",
    ),
    (
        RAW_DEEPSPEED_DUPLICATE,
        "raw-deepspeed-duplicate",
        "a raw DeepSpeed key duplicates a typed item",
    ),
    (
        RAW_HF_DUPLICATE,
        "raw-hf-duplicate",
        "a raw TrainingArguments field duplicates a typed item",
    ),
    (
        HF_DEEPSPEED_FIELD,
        "hf-deepspeed-field",
        "`hf { deepspeed }` is written by the compiler",
    ),
    (
        FSDP_WITH_DEEPSPEED,
        "fsdp-with-deepspeed",
        "FSDP cannot be used together with DeepSpeed",
    ),
    (
        SAVE_ONLY_MODEL_BEST,
        "save-only-model-best",
        "save_only_model with load_best_model_at_end under DeepSpeed",
    ),
    (
        UNMANAGED_ACCUMULATION,
        "unmanaged-accumulation",
        "managed_gradient_accumulation = false with accelerate >= 1.8",
    ),
    (
        ACCELERATE_TOO_OLD,
        "accelerate-too-old",
        "the target accelerate is older than transformers requires",
    ),
    (
        REMOVED_DEEPSPEED_KEY,
        "removed-deepspeed-key",
        "a raw DeepSpeed key the target DeepSpeed has removed",
    ),
    (
        TARGET_TOO_NEW,
        "target-too-new",
        "a target release newer than the rules know",
    ),
    (
        AUTO_ACCELERATE_DEFAULT,
        "auto-accelerate-default",
        "a raw DeepSpeed \"auto\" that accelerate fills from its own defaults, not the recipe",
    ),
    (
        GA_LOSS_SCALING,
        "ga-loss-scaling",
        "with accumulation, HF's loss scaling makes the step's gradient G× or 1/G of the mean",
    ),
];

/// Keys HF's integration fills when `"auto"` (docs/upstream.md §2.2 Table A,
/// `trainer_config_process` / `trainer_config_finalize`; transformers@v4.24.0 … v5.25.0).
const HF_AUTO: &[&str] = &[
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
];

/// Filled by HF while it has apex (`Facts::hf_apex_amp`, docs/upstream.md §2.2).
const HF_APEX_AUTO: &[&str] = &["amp.enabled", "amp.opt_level"];

/// Filled by accelerate's `DeepSpeedPlugin` (docs/upstream.md §2.3; accelerate@v1.15.0
/// utils/dataclasses.py:DeepSpeedPlugin.__post_init__), so only where the Trainer prepares
/// DeepSpeed through accelerate (not `Facts::hf_direct_deepspeed_init`).
const ACCELERATE_AUTO: &[&str] = &[
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
];

/// Raw DeepSpeed keys the compiler writes from typed items (batch, clipping, stage).
const DEEPSPEED_TYPED: &[(&str, &str, &str)] = &[
    ("train_batch_size", "batch.global", "`global` in `batch`"),
    (
        "train_micro_batch_size_per_gpu",
        "batch.micro",
        "`micro` in `batch`",
    ),
    (
        "gradient_accumulation_steps",
        "batch.accumulate",
        "`accumulate` in `batch`",
    ),
    ("gradient_clipping", "train.clip", "`clip` in `train`"),
    (
        "zero_optimization.stage",
        "zero.stage",
        "the stage of the `zero` block (`zero N`)",
    ),
];

/// Raw TrainingArguments fields the compiler writes from typed items.
const HF_TYPED: &[(&str, &str, &str)] = &[
    (
        "per_device_train_batch_size",
        "batch.micro",
        "`micro` in `batch`",
    ),
    (
        "per_device_eval_batch_size",
        "batch.eval_micro",
        "`eval_micro` in `batch`",
    ),
    (
        "gradient_accumulation_steps",
        "batch.accumulate",
        "`accumulate` in `batch`",
    ),
    (
        "auto_find_batch_size",
        "train.auto_find_batch_size",
        "`auto_find_batch_size` in `train`",
    ),
    ("num_train_epochs", "train.epochs", "`epochs` in `train`"),
    ("max_steps", "train.max_steps", "`max_steps` in `train`"),
    ("max_grad_norm", "train.clip", "`clip` in `train`"),
    ("seed", "train.seed", "`seed` in `train`"),
    ("output_dir", "train.output_dir", "`output_dir` in `train`"),
    (
        "logging_steps",
        "train.logging_steps",
        "`logging_steps` in `train`",
    ),
    (
        "eval_strategy",
        "train.eval_every",
        "`eval_every` in `train`",
    ),
    ("eval_steps", "train.eval_every", "`eval_every` in `train`"),
    (
        "save_strategy",
        "train.save_every",
        "`save_every` in `train`",
    ),
    ("save_steps", "train.save_every", "`save_every` in `train`"),
    (
        "dataloader_drop_last",
        "data.drop_last",
        "`drop_last` in `data`",
    ),
    // Written from `data.shuffle = false` on transformers ≥ 5.2.0 (training_args.rs); a raw value
    // would silently override the typed one either way.
    (
        "train_sampling_strategy",
        "data.shuffle",
        "`shuffle` in `data`",
    ),
    (
        "dataloader_num_workers",
        "data.workers",
        "`workers` in `data`",
    ),
    (
        "activation_checkpointing",
        "model.gradient_checkpointing",
        "`gradient_checkpointing` in `model`",
    ),
    (
        "gradient_checkpointing",
        "model.gradient_checkpointing",
        "`gradient_checkpointing` in `model`",
    ),
];

/// Checks the compat rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    removed_keys(r, out);
    ga_loss_scaling(r, out);
    for (path, value, span) in &r.raw_deepspeed {
        let auto = value.as_str() == Some("auto");
        if auto && auto_filled(r, path) && DEEPSPEED_TYPED.iter().any(|(k, ..)| k == path) {
            // An "auto" for a key the compiler writes is not a second source when HF fills it
            // from the TrainingArguments the recipe writes (the batch triple, clipping; as R0607
            // and R0509 treat "auto"); one accelerate fills from its own defaults (the stage) is
            // checked against the recipe's value.
            if let Some(d) = auto_accelerate_default(r, path, *span) {
                out.push(d);
            }
            continue;
        }
        if let Some(typed) = DEEPSPEED_TYPED.iter().find(|(k, ..)| k == path) {
            out.push(duplicate(
                r,
                RAW_DEEPSPEED_DUPLICATE,
                "deepspeed",
                path,
                value,
                *span,
                typed,
            ));
        } else if value.as_str() == Some("auto") && !auto_filled(r, path) {
            out.push(auto_unfilled(r, path, *span));
        } else if value.as_str() == Some("auto") {
            if let Some(d) = auto_accelerate_default(r, path, *span) {
                out.push(d);
            }
        } else if path == "managed_gradient_accumulation" {
            unmanaged_accumulation(r, value, *span, out);
        }
    }
    let mut deepspeed_field = false;
    for (path, value, span) in &r.raw_hf {
        let field = path.split('.').next().unwrap_or(path);
        if let Some(typed) = HF_TYPED.iter().find(|(k, ..)| *k == field) {
            out.push(duplicate(
                r,
                RAW_HF_DUPLICATE,
                "hf",
                path,
                value,
                *span,
                typed,
            ));
        } else if field == "deepspeed" && !deepspeed_field {
            deepspeed_field = true;
            out.push(hf_deepspeed(*span));
        } else if field == "fsdp" && fsdp_on(value) {
            out.push(fsdp(r, value, *span));
        }
    }
    save_only_model(r, out);
    accelerate_too_old(r, out);
    target_too_new(r, out);
}

/// Whether HF or accelerate replace `"auto"` at `path` for the targets
/// (docs/upstream.md §2.2, §2.3).
fn auto_filled(r: &Resolved, path: &str) -> bool {
    HF_AUTO.contains(&path)
        || (r.facts.hf_apex_amp && HF_APEX_AUTO.contains(&path))
        || (!r.facts.hf_direct_deepspeed_init && ACCELERATE_AUTO.contains(&path))
}

/// What accelerate's `DeepSpeedPlugin` fills an `"auto"` at `path` with, and the environment
/// variable it reads first. The HF Trainer creates the plugin with no arguments (transformers
/// training_args.py: `DeepSpeedPlugin(hf_ds_config=…)`) and the `deepspeed` launcher of
/// `launch.sh` sets no `ACCELERATE_*` variable, so these are accelerate's own defaults, not the
/// recipe's (accelerate@v1.15.0 utils/dataclasses.py:DeepSpeedPlugin.__post_init__, then
/// `fill_match` of `plugin_to_config_mapping`).
fn accelerate_fill(path: &str) -> Option<(serde_json::Value, &'static str)> {
    use serde_json::json;
    Some(match path {
        "zero_optimization.stage" => (json!(2), "ACCELERATE_DEEPSPEED_ZERO_STAGE"),
        "zero_optimization.offload_optimizer.device" => (
            json!("none"),
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        ),
        "zero_optimization.offload_param.device" => {
            (json!("none"), "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE")
        }
        "zero_optimization.offload_optimizer.nvme_path" => (
            json!("none"),
            "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        ),
        "zero_optimization.offload_param.nvme_path" => (
            json!("none"),
            "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
        ),
        "zero_optimization.stage3_gather_16bit_weights_on_model_save" => {
            (json!(false), "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL")
        }
        _ => return None,
    })
}

/// docs/upstream.md §2.3: a raw `"auto"` that accelerate fills. It fills from its own defaults,
/// so the run gets the recipe's value only when the two agree; then the `"auto"` is harmless (as
/// R0607 and R0509 treat an `"auto"` HF fills from the recipe). Otherwise DeepSpeed runs with
/// accelerate's value where `recipe explain` shows the recipe's: an error.
fn auto_accelerate_default(r: &Resolved, path: &str, span: Span) -> Option<Diagnostic> {
    if r.facts.hf_direct_deepspeed_init {
        return None; // no accelerate in between (auto_filled says whether HF fills it)
    }
    let (filled, env) = accelerate_fill(path)?;
    // The recipe's own value at `path`: the config `recipe build` writes from the typed blocks.
    let mut typed = r.clone();
    typed.raw_deepspeed.clear();
    let config = crate::emit::deepspeed::config(&typed, crate::emit::deepspeed::Style::Explicit);
    let ours = path
        .split('.')
        .try_fold(&config, |node, part| node.get(part))
        .cloned();
    let leaf = path.rsplit('.').next().unwrap_or(path);
    let ours = match ours {
        Some(v) => v,
        // An offload section the recipe does not write is no offload.
        None if leaf == "device" => serde_json::json!("none"),
        // A key DeepSpeed does not read at the recipe's stage, or an nvme path without nvme.
        None => return None,
    };
    let same = filled == ours || (filled.as_f64().is_some() && filled.as_f64() == ours.as_f64());
    if same {
        return None;
    }
    let effect = match leaf {
        "device" if filled == "none" => " (nothing is offloaded)".to_string(),
        "stage" => format!(" (ZeRO stage {filled}, not {ours})"),
        _ => String::new(),
    };
    let d = Diagnostic::error(
        AUTO_ACCELERATE_DEFAULT,
        format!(
            "accelerate fills `{path} = \"auto\"` with its own default, {filled}, not the recipe's {ours}: DeepSpeed runs with {filled}{effect}"
        ),
        span,
    )
    .with_label(format!(
        "accelerate {} reads {env} (unset under `deepspeed` launches), else {filled}",
        r.targets.accelerate
    ));
    Some(d.with_help(format!(
        "remove `{path}` from `deepspeed {{ }}`: `recipe build` writes {ours} there from the typed blocks"
    )))
}

fn auto_unfilled(r: &Resolved, path: &str, span: Span) -> Diagnostic {
    let tf = r.targets.transformers;
    let (message, label) = if r.facts.hf_direct_deepspeed_init {
        (
            format!(
                "`{path} = \"auto\"` is filled by nothing: transformers {tf} hands the config to DeepSpeed as it is"
            ),
            "DeepSpeed drops \"auto\" inside its validated sections (the default applies) and fails on it elsewhere".to_string(),
        )
    } else {
        (
            format!(
                "`{path} = \"auto\"` is filled by neither transformers {tf} nor accelerate {}",
                r.targets.accelerate
            ),
            format!("accelerate raises: \"`{path}` not found in kwargs. Please specify `{path}` without `auto` (set to correct value) in the DeepSpeed config file or pass it in kwargs.\""),
        )
    };
    let help = if ACCELERATE_AUTO.contains(&path) {
        format!(
            "write the value itself: accelerate fills `{path}` only from transformers 4.30 on, where the Trainer prepares DeepSpeed through accelerate"
        )
    } else {
        "write the value itself; docs/upstream.md §2.3 lists the keys that HF or accelerate fill from \"auto\"".into()
    };
    Diagnostic::error(AUTO_UNFILLED, message, span)
        .with_label(label)
        .with_help(help)
}

/// A raw key that the compiler also writes from a typed item: two sources of truth.
fn duplicate(
    r: &Resolved,
    code: &'static str,
    block: &str,
    path: &str,
    value: &Val,
    span: Span,
    (_, key, item): &(&str, &str, &str),
) -> Diagnostic {
    let typed = match r.val(key) {
        Some(v) => format!("which says {v}{}", origin(r, key)),
        None => "which is not set".into(),
    };
    let mut d = Diagnostic::error(
        code,
        format!(
            "`{block} {{ {path} = {value} }}` duplicates {item}, {typed}: two sources of truth"
        ),
        span,
    )
    .with_label(format!("the compiler writes `{path}` from {item}"));
    if let Some(typed_span) = r.span(key) {
        d = d.with_secondary(typed_span, "the typed item");
    } else if let Some(block_span) = key.split('.').next().and_then(|b| r.block_spans.get(b)) {
        d = d.with_secondary(*block_span, format!("{item}, {typed}"));
    }
    let short = key.split('.').nth(1).unwrap_or(key);
    let fix = if *key == "zero.stage" {
        "write the stage as `zero N`".to_string()
    } else {
        format!("set `{short}` in `{}`", key.split('.').next().unwrap_or(""))
    };
    d.with_help(format!("remove `{path}` from `{block} {{ }}` and {fix}"))
}

fn hf_deepspeed(span: Span) -> Diagnostic {
    Diagnostic::error(
        HF_DEEPSPEED_FIELD,
        "`hf { deepspeed }` is written by the compiler: it points TrainingArguments at the ds_config.json it builds",
        span,
    )
    .with_label("a second DeepSpeed config")
    .with_help("remove it; put DeepSpeed settings in the typed blocks (`zero`, `batch`, …) or in `deepspeed { }`")
}

/// `fsdp` counts as set unless it is false, "" or [] (TrainingArguments turns those into off).
fn fsdp_on(value: &Val) -> bool {
    match value {
        Val::Bool(b) => *b,
        Val::Str(s) => !s.is_empty(),
        Val::List(items) => !items.is_empty(),
        _ => true,
    }
}

fn fsdp(r: &Resolved, value: &Val, span: Span) -> Diagnostic {
    let mut d = Diagnostic::error(
        FSDP_WITH_DEEPSPEED,
        format!("`fsdp = {value}` cannot be used with DeepSpeed, which every recipe trains with"),
        span,
    )
    .with_label("transformers raises: \"Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags.\"");
    if let Some(zero) = r.block_spans.get("zero") {
        d = d.with_secondary(*zero, "DeepSpeed ZeRO");
    }
    d = d.with_help(
        "remove `fsdp` (and `fsdp_config`) from `hf { }`: use `zero 3` to shard parameters",
    );
    // The fix takes both out together: `fsdp_config` alone is ignored by HF, but left behind it
    // would read as if FSDP were still configured.
    let edits: Vec<crate::diagnostics::Edit> = ["hf.fsdp", "hf.fsdp_config"]
        .iter()
        .filter_map(|k| r.raw_item_spans.get(*k))
        .map(|span| crate::diagnostics::Edit {
            span: *span,
            text: String::new(),
        })
        .collect();
    if !edits.is_empty() {
        d.fixes.push(crate::diagnostics::Fix {
            title: "remove `fsdp` from `hf { }`".into(),
            edits,
        });
    }
    d
}

fn raw_hf<'a>(r: &'a Resolved, field: &str) -> Option<&'a (String, Val, Span)> {
    r.raw_hf.iter().find(|(path, ..)| path == field)
}

fn save_only_model(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let (Some((_, Val::Bool(true), save)), Some((_, Val::Bool(true), best))) = (
        raw_hf(r, "save_only_model"),
        raw_hf(r, "load_best_model_at_end"),
    ) else {
        return;
    };
    out.push(
        Diagnostic::error(
            SAVE_ONLY_MODEL_BEST,
            "`save_only_model` with `load_best_model_at_end` is rejected under DeepSpeed: the best checkpoint could not be resumed into the engine",
            *save,
        )
        .with_label("transformers raises: \"DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`.\"")
        .with_secondary(*best, "load_best_model_at_end = true")
        .with_help("drop one of them: keep full checkpoints (remove `save_only_model`), or do not reload the best model at the end"),
    );
    // One quick fix per way out the help names.
    let d = out.last_mut().expect("just pushed");
    for (key, title) in [
        (
            "hf.save_only_model",
            "remove `save_only_model` (keep full checkpoints)",
        ),
        (
            "hf.load_best_model_at_end",
            "remove `load_best_model_at_end` (do not reload the best model)",
        ),
    ] {
        if let Some(span) = r.raw_item_spans.get(key) {
            d.fixes.push(crate::diagnostics::Fix {
                title: title.into(),
                edits: vec![crate::diagnostics::Edit {
                    span: *span,
                    text: String::new(),
                }],
            });
        }
    }
}

/// R-S06 (docs/upstream.md §5.4): with `managed_gradient_accumulation = false` (DeepSpeed ≥ 0.19.4)
/// DeepSpeed asserts in `set_gradient_accumulation_boundary`, which accelerate ≥ 1.8 calls on every
/// micro-batch; where DeepSpeed is stepped on every micro-batch instead (accelerate < 1.8, or
/// transformers ≤ 4.26), "every `step()` is the accumulation boundary" (DeepSpeed@v0.19.4
/// runtime/engine.py:DeepSpeedEngine.is_gradient_accumulation_boundary), so the weights are updated
/// on every micro-batch and `accumulate` is ignored.
fn unmanaged_accumulation(r: &Resolved, value: &Val, span: Span, out: &mut Vec<Diagnostic>) {
    use crate::upstream::versions::DsBoundary;
    if value != &Val::Bool(false) || !r.facts.ds_managed_gradient_accumulation {
        return;
    }
    let (acc, ds) = (r.targets.accelerate, r.targets.deepspeed);
    let g = r.int("batch.accumulate").unwrap_or(1);
    let d = match r.facts.ds_boundary {
        DsBoundary::FollowsHf => {
            let mut d = Diagnostic::error(
                UNMANAGED_ACCUMULATION,
                format!(
                    "`managed_gradient_accumulation = false` fails under accelerate {acc}, which sets DeepSpeed {ds}'s accumulation boundary on every micro-batch"
                ),
                span,
            )
            .with_label("DeepSpeed asserts: \"set_gradient_accumulation_boundary() is not supported with managed_gradient_accumulation=False; the caller owns the boundary by calling step()\"");
            if let Some(span) = r.target_sources[1].span() {
                d = d.with_secondary(span, "accelerate ≥ 1.8 drives the boundary");
            }
            d
        }
        DsBoundary::OwnCounter if g > 1 => {
            let mut d = Diagnostic::error(
                UNMANAGED_ACCUMULATION,
                format!(
                    "`managed_gradient_accumulation = false` makes DeepSpeed {ds} update the weights on every micro-batch, ignoring accumulate = {g}"
                ),
                span,
            )
            .with_label("the Trainer steps DeepSpeed on every micro-batch, and each step() is then a boundary");
            if let Some(span) = r.span("batch.accumulate") {
                d = d.with_secondary(span, "not applied");
            }
            d
        }
        DsBoundary::OwnCounter => return,
    };
    out.push(d.with_help(
        "remove it: under the HF Trainer DeepSpeed must manage the accumulation (accelerate ≥ 1.8 sets its boundary from HF's steps)",
    ));
}

fn accelerate_too_old(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let Some(min) = r.facts.hf_min_accelerate else {
        return;
    };
    let (tf, acc) = (r.targets.transformers, r.targets.accelerate);
    if acc >= min {
        return;
    }
    let span = r.target_sources[1]
        .span()
        .or_else(|| r.target_sources[0].span())
        .unwrap_or_else(|| anchor(r, "target.accelerate"));
    let mut d = Diagnostic::error(
        ACCELERATE_TOO_OLD,
        format!("transformers {tf} requires accelerate ≥ {min}, but the recipe targets accelerate {acc}"),
        span,
    )
    .with_label(format!(
        "transformers raises: \"Using the `Trainer` with `PyTorch` requires `accelerate>={min}`\""
    ));
    if let (Some(t), true) = (
        r.target_sources[0].span(),
        r.target_sources[1].span().is_some(),
    ) {
        d = d.with_secondary(t, format!("transformers {tf}"));
    }
    out.push(d.with_help(format!(
        "target accelerate \"{min}\" or newer (\"1.8.0\" or newer also keeps DeepSpeed's optimizer steps in line with HF's, docs/upstream.md R-S02)"
    )));
}

/// A target newer than the newest release read (`Library::newest`): the newest release's rules
/// and field lists apply, and whatever changed since is not checked. `recipe verify` on that
/// stack is the way to find out.
fn target_too_new(r: &Resolved, out: &mut Vec<Diagnostic>) {
    for (i, lib) in crate::upstream::versions::Library::ALL.iter().enumerate() {
        let (target, newest) = (r.targets.get(*lib), lib.newest());
        if target <= newest {
            continue;
        }
        let name = lib.key();
        let written = r.target_sources[i].span();
        let span = written.unwrap_or_else(|| anchor(r, &format!("target.{name}")));
        let label = match written {
            Some(_) => format!("newest known: {name} {newest}"),
            None => format!(
                "{name} {target} ({}); newest known: {newest}",
                r.target_sources[i].describe(None)
            ),
        };
        out.push(
            Diagnostic::warning(
                TARGET_TOO_NEW,
                format!(
                    "{name} {target} is newer than the newest release recipe's rules were read from ({newest}): the rules of {newest} apply, and what changed since is not checked"
                ),
                span,
            )
            .with_label(label)
            .with_help(format!(
                "run `recipe verify` with {name} {target} installed to check the artefacts against it, or target {name} \"{newest}\""
            )),
        );
    }
}

/// How the HF Trainer scales each micro-batch's loss for accumulation, under DeepSpeed (every
/// recipe trains with it), against the recipe's meaning: the step's gradient is the mean over
/// the window's micro-batches of their mean losses (what `recipe run` computes). G is
/// `accumulate`. Read in the released wheels (trainer.py, `Trainer.training_step`, and
/// `Trainer.__init__` for `model_accepts_loss_kwargs`; models/bert/modeling_bert.py):
///
/// - 4.46.0, 4.46.1: `loss *= gradient_accumulation_steps` before `accelerator.backward`, for
///   every model; DeepSpeed's `backward` divides by G: G× the gradient, G× the logged loss.
/// - 4.46.2 … 4.47.1: the loss as computed, DeepSpeed divides: the mean.
/// - 4.48.0 … 4.48.3: HF divides by G when the model does not take loss kwargs (4.48.0: when
///   `num_items_in_batch is None`, which `get_batch_samples` returns for such a model; 4.48.1:
///   `not self.model_accepts_loss_kwargs`), and DeepSpeed's `backward` divides again: 1/G of
///   the gradient (the logged loss, HF-divided once, is right). BERT takes no loss kwargs, and
///   the generated train.py's `accepts_loss_kwargs = False` says the same.
/// - 4.49.0 on (transformers PR #35808): `scale_wrt_gas=False` under DeepSpeed; HF divides only
///   when the model takes no loss kwargs. `BertForSequenceClassification.forward` takes
///   `**kwargs` from 5.0.0 on, so without an `accepts_loss_kwargs` attribute the Trainer passes
///   `num_items_in_batch` and divides by nothing, while BERT's loss is a plain
///   `CrossEntropyLoss()` mean that ignores it: G× the gradient and the logged loss
///   (v5.24.0: `loss_is_scaled_for_ga`). The generated train.py sets
///   `model.accepts_loss_kwargs = False`; a script of the recipe's own is warned about.
///
/// Only `model bert` is checked: `model auto`'s class is known at run time only.
fn ga_loss_scaling(r: &Resolved, out: &mut Vec<Diagnostic>) {
    use crate::upstream::versions::GaScaling;
    let g = r.int("batch.accumulate").unwrap_or(1);
    if g <= 1 || r.word("model.arch") != Some("bert") {
        return;
    }
    let own = r.is_given("train.script");
    let tf = r.targets.transformers;
    let (factor, logged, why, help) = match r.facts.hf_ga_scaling {
        GaScaling::TimesG => (
            format!("{g}×"),
            format!("the logged loss {g}× too"),
            format!("transformers {tf} multiplies every micro-batch's loss by the accumulation steps before DeepSpeed's backward divides it by them (Trainer.training_step)"),
            "target transformers ≥ 4.46.2 (it no longer multiplies the loss; 4.46.0 and 4.46.1 do)".to_string(),
        ),
        GaScaling::DividedTwice => (
            format!("1/{g}"),
            "the logged loss is the mean".to_string(),
            format!("transformers {tf} divides the loss of a model that takes no loss kwargs (BERT's) by the accumulation steps, and DeepSpeed's backward divides it again (Trainer.training_step; fixed by transformers PR #35808)"),
            "target transformers ≥ 4.49.0 (it passes scale_wrt_gas=False, so DeepSpeed does not divide again)".to_string(),
        ),
        GaScaling::UndividedWithLossKwargs if own && r.facts.hf_bert_forward_kwargs => (
            format!("{g}×"),
            format!("the logged loss {g}× too"),
            format!("in transformers {tf} BertForSequenceClassification.forward takes **kwargs, so the Trainer takes it for a model that reads num_items_in_batch and divides its loss by nothing (Trainer.training_step), while BERT's loss is a plain mean that ignores it"),
            "in the script, set model.accepts_loss_kwargs = False before building the Trainer (as the generated train.py does), or remove `script` to run the generated train.py".to_string(),
        ),
        _ => return,
    };
    let (clip, sgd) = if factor.starts_with("1/") {
        (format!("max_grad_norm × {g}"), format!("lr / {g}"))
    } else {
        (format!("max_grad_norm / {g}"), format!("{g}× lr"))
    };
    let mut d = Diagnostic::warning(
        GA_LOSS_SCALING,
        format!(
            "with `accumulate = {g}` the gradient of each optimizer step is {factor} the mean over its micro-batches that the recipe means ({logged}; gradient clipping acts at {clip} and an SGD step is {sgd}): {why}",
        ),
        anchor(r, "batch.accumulate"),
    )
    .with_label(format!("{g} micro-batches per step{}", origin(r, "batch.accumulate")));
    if let Some(span) = r.target_sources[0].span() {
        d = d.with_secondary(span, "this transformers");
    }
    if own {
        if let Some(span) = r.span("train.script") {
            d = d.with_secondary(span, "the recipe's own script");
        }
    }
    out.push(d.with_help(help));
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

    #[test]
    fn accelerate_requirements_by_transformers_release() {
        let min = |tf| {
            facts(tf, "1.15.0", "0.19.8")
                .hf_min_accelerate
                .map(|v| v.to_string())
        };
        assert_eq!(min("4.24.0"), None);
        assert_eq!(min("4.30.0").as_deref(), Some("0.20.1"));
        assert_eq!(min("4.57.6").as_deref(), Some("0.26.0"));
        assert_eq!(min("5.24.0").as_deref(), Some("1.1.0"));
    }

    #[test]
    fn managed_accumulation_exists_from_0_19_4() {
        assert!(!facts("5.24.0", "1.15.0", "0.19.3").ds_managed_gradient_accumulation);
        assert!(facts("5.24.0", "1.15.0", "0.19.4").ds_managed_gradient_accumulation);
    }

    fn codes(text: &str) -> Vec<&'static str> {
        crate::check::check_source(text)
            .diagnostics
            .iter()
            .map(|d| d.code)
            .collect()
    }

    const BASE: &str = "model bert { from = \"m\", task = classify(labels: 2) }
data { train = \"/cluster/x.jsonl\", samples = 64 }
batch { micro = 8 }
";

    #[test]
    fn an_auto_accelerate_fills_is_an_error_only_where_it_differs_from_the_recipe() {
        let count = |blocks: &str, raw: &str| {
            let text = format!("{BASE}{blocks}\ndeepspeed {{ {raw} }}\n");
            codes(&text)
                .iter()
                .filter(|c| **c == AUTO_ACCELERATE_DEFAULT)
                .count()
        };
        let device = "zero_optimization.offload_optimizer.device = \"auto\"";
        assert_eq!(count("zero 2 { offload optimizer = cpu }", device), 1);
        assert_eq!(count("zero 2", device), 0);
        // The recipe's 16-bit save (true by default) against accelerate's false, at stage 3 only.
        let save = "zero_optimization.stage3_gather_16bit_weights_on_model_save = \"auto\"";
        assert_eq!(count("zero 3", save), 1);
        assert_eq!(
            count(
                "zero 3 { gather_16bit_weights_on_model_save = false }",
                save
            ),
            0
        );
        assert_eq!(count("zero 2", save), 0);
        // transformers 4.26 prepares DeepSpeed without accelerate: nobody fills it (R0901 says so).
        let old = format!("target transformers \"4.26.1\"\n{BASE}zero 2 {{ offload optimizer = cpu }}\ndeepspeed {{ {device} }}\n");
        assert!(!codes(&old).contains(&AUTO_ACCELERATE_DEFAULT));
    }

    #[test]
    fn auto_keys_filled_depend_on_the_versions() {
        let count = |target: &str, raw: &str| {
            let text = format!("{target}{BASE}deepspeed {{ {raw} }}\n");
            codes(&text).iter().filter(|c| **c == AUTO_UNFILLED).count()
        };
        // HF fills optimizer and scheduler autos in every version.
        assert_eq!(count("", "optimizer.params.lr = \"auto\""), 0);
        // accelerate fills the offload device, but only where the Trainer prepares through it.
        let device = "zero_optimization.offload_param.device = \"auto\"";
        assert_eq!(count("", device), 0);
        assert_eq!(count("target transformers \"4.26.1\"\n", device), 1);
        // amp.enabled: filled while HF has apex (4.24 - 4.57), not in 5.x.
        assert_eq!(
            count("target transformers \"4.45.2\"\n", "amp.enabled = \"auto\""),
            0
        );
        assert_eq!(count("", "amp.enabled = \"auto\""), 1);
        // A typed key left to an "auto" HF fills from the recipe is accepted; the stage, which
        // accelerate fills from its own default (2), only where that is the recipe's stage.
        let raw = |zero: &str, raw: &str| -> Vec<&str> {
            codes(&format!("{BASE}{zero}\ndeepspeed {{ {raw} }}\n"))
                .into_iter()
                .filter(|c| *c != "R0805") // the hidden size of a hub model, beside the point
                .collect()
        };
        assert!(raw(
            "",
            "train_batch_size = \"auto\", gradient_clipping = \"auto\""
        )
        .is_empty());
        let stage = "zero_optimization.stage = \"auto\"";
        assert_eq!(raw("zero 1", stage), vec![AUTO_ACCELERATE_DEFAULT]);
        assert!(raw("zero 2", stage).is_empty());
        // A written value is still a second source.
        assert!(raw("", "train_batch_size = 8").contains(&RAW_DEEPSPEED_DUPLICATE));
    }

    #[test]
    fn unmanaged_accumulation_by_boundary_owner() {
        let raw = "deepspeed { managed_gradient_accumulation = false }\n";
        let has = |text: String| codes(&text).contains(&UNMANAGED_ACCUMULATION);
        assert!(has(format!("{BASE}{raw}")));
        // accelerate 1.7 steps DeepSpeed every micro-batch: harmful only with accumulation.
        assert!(!has(format!("target accelerate \"1.7.0\"\n{BASE}{raw}")));
        let acc = BASE.replace("micro = 8", "micro = 8, accumulate = 2");
        assert!(has(format!("target accelerate \"1.7.0\"\n{acc}{raw}")));
        // DeepSpeed before 0.19.4 has no such key.
        assert!(!has(format!("target deepspeed \"0.19.3\"\n{BASE}{raw}")));
    }

    #[test]
    fn fsdp_off_values() {
        assert!(!fsdp_on(&Val::Bool(false)));
        assert!(!fsdp_on(&Val::Str(String::new())));
        assert!(!fsdp_on(&Val::List(Vec::new())));
        assert!(fsdp_on(&Val::Str("full_shard auto_wrap".into())));
        assert!(fsdp_on(&Val::Bool(true)));
    }
}
