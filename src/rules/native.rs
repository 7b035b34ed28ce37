//! What the native runtime (`recipe run`, `recipe build --target native`) cannot train yet. Not
//! an upstream rule family: `recipe check` does not run it (a recipe built for DeepSpeed is fine
//! whatever the native runtime lacks); `check_source_native` adds it for the native target, so
//! every refusal has a code, a span and a help line (docs/rules/native.md). The plan emitter
//! (`emit::plan`) maps only what passes here.

use crate::diagnostics::Diagnostic;
use crate::resolve::{Resolved, Val};

use super::anchor;

/// The model is not a BERT encoder fine-tuned for classification.
pub const MODEL: &str = "R1101";
/// No training rows were counted, so the plan cannot state its steps.
pub const DATA: &str = "R1102";
/// An optimizer (or optimizer setting) the runtime does not run.
pub const OPTIMIZER: &str = "R1103";
/// A mixed-precision variant the CPU backend does not emulate.
pub const PRECISION: &str = "R1104";
/// An offload target the runtime does not have.
pub const OFFLOAD: &str = "R1105";
/// A schedule the runtime does not run.
pub const SCHEDULE: &str = "R1106";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        MODEL,
        "native-model",
        "the native runtime trains BERT encoders for classification only",
    ),
    (
        DATA,
        "native-data",
        "the native runtime needs the training rows counted",
    ),
    (
        OPTIMIZER,
        "native-optimizer",
        "an optimizer the native runtime does not run yet",
    ),
    (
        PRECISION,
        "native-precision",
        "a mixed-precision variant the native runtime does not emulate",
    ),
    (
        OFFLOAD,
        "native-offload",
        "an offload target the native runtime does not have yet",
    ),
    (
        SCHEDULE,
        "native-schedule",
        "a schedule setting the native runtime cannot follow",
    ),
];

/// The optimizer kinds the runtime trains (`runtime/src/optim/`).
pub const OPTIMIZERS: &[&str] = &["adamw", "adam", "sgd", "adagrad", "lamb"];

/// A raw `deepspeed { … }` key's value, if the recipe writes one.
pub fn raw_ds<'a>(r: &'a Resolved, key: &str) -> Option<&'a Val> {
    r.raw_deepspeed
        .iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, v, _)| v)
}

/// The span of a raw `deepspeed { … }` key.
fn raw_span(r: &Resolved, key: &str) -> crate::syntax::ast::Span {
    r.raw_deepspeed
        .iter()
        .find(|(k, _, _)| k == key)
        .map_or_else(|| anchor(r, "deepspeed"), |(_, _, s)| *s)
}

/// A DeepSpeed dtype name as DeepSpeed's `DtypeEnum` spells them (`runtime/config.py`):
/// `fp32`/`float32`/`float`, `fp16`/`float16`/`half`, `bf16`/`bfloat16`/`bfloat`.
pub fn ds_dtype(v: &Val) -> Option<&'static str> {
    match v.as_str()? {
        "fp32" | "float32" | "float" => Some("fp32"),
        "fp16" | "float16" | "half" => Some("fp16"),
        "bf16" | "bfloat16" | "bfloat" => Some("bf16"),
        _ => None,
    }
}

fn model(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if let Some(arch) = r.word("model.arch").filter(|a| *a != "bert") {
        out.push(
            Diagnostic::error(
                MODEL,
                format!("the native runtime cannot train `model {arch}` yet: it fine-tunes BERT encoders"),
                anchor(r, "model.arch"),
            )
            .with_help("train this recipe with HF + DeepSpeed (`recipe build`), or use a BERT-family checkpoint (`model bert { … }`)"),
        );
    }
    let classify = r
        .val("model.task")
        .and_then(|t| t.arg("labels"))
        .is_some_and(|l| matches!(l, Val::Int(n) if *n > 0) || matches!(l, Val::List(_)));
    if !classify {
        out.push(
            Diagnostic::error(
                MODEL,
                "the native runtime trains sequence classification only: `task = classify(labels: …)`",
                anchor(r, "model.task"),
            )
            .with_help("write `task = classify(labels: [\"neg\", \"pos\"])` (or a label count), or build for DeepSpeed"),
        );
    }
}

fn data(r: &Resolved, out: &mut Vec<Diagnostic>) {
    // The runtime maps label names only to the names a task declares (runtime/src/data/labels.rs
    // `LabelSet::id_of_str`); with a count it reads ids, where HF's script numbers the names.
    if let Some(names) = super::data::names_under_a_count(r) {
        let list: Vec<String> = names
            .iter()
            .map(|n| crate::commands::format::quote(n))
            .collect();
        let task = format!("classify(labels: [{}])", list.join(", "));
        let d = Diagnostic::error(
            DATA,
            format!(
                "the training file's labels are names ({}), but the task declares a count: the native runtime reads labels as ids then, and stops at the first name",
                list.join(", ")
            ),
            anchor(r, "model.task"),
        )
        .with_label("a count of classes")
        .with_help(format!(
            "declare the names, in the order HF's script numbers them (sorted): `task = {task}`"
        ));
        out.push(super::fix::with_set(d, r, "model.task", &task));
    }
    if r.uint("data.samples").unwrap_or(0) == 0 {
        out.push(
            Diagnostic::error(
                DATA,
                "no training rows were counted, so the native plan cannot state its steps",
                anchor(r, "data.train"),
            )
            .with_help("point data.train at a local JSONL/CSV/TSV file: the runtime reads it, and the plan counts its rows"),
        );
    }
}

fn optimizer(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let kind = r.choice("optimizer.kind");
    if !OPTIMIZERS.contains(&kind) {
        out.push(
            Diagnostic::error(
                OPTIMIZER,
                format!("the native runtime does not run `optimizer {kind}` yet"),
                anchor(r, "optimizer.kind"),
            )
            .with_help(format!(
                "it runs {}; or build for DeepSpeed (`recipe build`)",
                OPTIMIZERS.join(", ")
            )),
        );
    }
    if r.bool("optimizer.amsgrad") == Some(true) {
        out.push(
            Diagnostic::error(
                OPTIMIZER,
                "the native runtime does not run AMSGrad yet",
                anchor(r, "optimizer.amsgrad"),
            )
            .with_help("drop `amsgrad = true`, or build for DeepSpeed"),
        );
    }
    let hf = r.word("optimizer.owner") == Some("hf");
    let stage = r.count("zero.stage");
    let offloaded = stage >= 1 && !matches!(r.word("zero.offload optimizer"), None | Some("none"));
    // With this raw key false, accelerate keeps HF's own optimizer under offload.
    let hf_kept_under_offload =
        raw_ds(r, "zero_force_ds_cpu_optimizer").and_then(Val::as_bool) == Some(false);
    // `fix`: the item the help writes, offered as a quick fix.
    let mut refuse = |key: &str, message: String, help: &str, fix: Option<(&str, &str)>| {
        let d = Diagnostic::error(OPTIMIZER, message, anchor(r, key)).with_help(help);
        out.push(match fix {
            Some((k, v)) => super::fix::with_set(d, r, k, v),
            None => d,
        });
    };
    let to_ds = Some(("optimizer.owner", "deepspeed"));
    let owner_ds = "write `owner = deepspeed` (DeepSpeed builds the optimizer from its config)";
    match kind {
        "sgd" => {
            let momentum = r.num("optimizer.momentum");
            let nesterov = r.bool("optimizer.nesterov") == Some(true);
            if nesterov && momentum <= 0.0 {
                refuse(
                    "optimizer.nesterov",
                    "Nesterov momentum needs `momentum` > 0: torch.optim.SGD stops with \"Nesterov momentum requires a momentum and zero dampening\"".into(),
                    "set `momentum`, or drop `nesterov`",
                    None,
                );
            }
            // With `owner = hf`, momentum and Nesterov reach HF's SGD through the `optim_args`
            // the build writes; where the target transformers ignores them, R0415 refuses.
            if hf && offloaded && !hf_kept_under_offload {
                // accelerate's `map_pytorch_optim_to_deepspeed`: anything but Adam/Adagrad/Lion
                // becomes DeepSpeedCPUAdam.
                refuse(
                    "optimizer.owner",
                    "with `owner = hf` and `offload optimizer`, accelerate rebuilds HF's SGD as DeepSpeedCPUAdam, which the native runtime does not emulate".into(),
                    owner_ds,
                    to_ds,
                );
            }
        }
        // A given eps reaches HF's Adagrad through `optim_args` (R0415 where it cannot).
        "adagrad" if hf && offloaded && hf_kept_under_offload => {
            refuse(
                "optimizer.owner",
                "HF's torch Adagrad stepping the offloaded partition (zero_force_ds_cpu_optimizer = false) is not emulated; the native runtime runs DeepSpeedCPUAdagrad under offload".into(),
                owner_ds,
                to_ds,
            );
        }
        "lamb" => {
            if hf {
                refuse(
                    "optimizer.owner",
                    "HF's `optim` has no LAMB".into(),
                    owner_ds,
                    to_ds,
                );
            }
            if stage >= 1 {
                // stage_1_and_2.py hands FusedLamb each rank's flattened fp32 partition as one
                // tensor: one trust ratio per partition, which depends on the world size.
                refuse(
                    "zero.stage",
                    format!("LAMB at ZeRO stage {stage}: DeepSpeed's ZeRO optimizer computes one trust ratio per rank's flattened partition, which the native runtime does not emulate"),
                    "run LAMB at ZeRO stage 0 (`zero 0`), or use AdamW with ZeRO",
                    Some(("zero.stage", "0")),
                );
            } else if r.word("train.precision") == Some("bf16") {
                refuse(
                    "train.precision",
                    "LAMB in bf16 at ZeRO stage 0: DeepSpeed's FusedLamb kernel has no bf16 gradient path (the run stops at its first step)".into(),
                    "train LAMB in fp16 or fp32",
                    None,
                );
            }
            if r.word("train.precision") == Some("fp16")
                && matches!(r.val("train.loss_scale"), Some(Val::Int(i)) if *i > 0)
            {
                refuse(
                    "train.loss_scale",
                    "LAMB with a fixed fp16 loss scale: DeepSpeed asserts \"DeepSpeed lamb optimizer requires dynamic loss scaling\"".into(),
                    "use `loss_scale = dynamic`",
                    Some(("train.loss_scale", "dynamic")),
                );
            }
        }
        _ => {}
    }
}

fn precision(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let Some(module) = r.word("train.precision").filter(|p| *p != "fp32") else {
        return;
    };
    if let Some(eval) = r.word("train.eval_precision").filter(|e| *e != module) {
        out.push(
            Diagnostic::error(
                PRECISION,
                format!("the native runtime evaluates in the training precision ({module}), not {eval}"),
                anchor(r, "train.eval_precision"),
            )
            .with_help("drop train.eval_precision: DeepSpeed's engine also evaluates its own fp16/bf16 module"),
        );
    }
    let key = "data_types.grad_accum_dtype";
    if let Some(v) = raw_ds(r, key).filter(|v| ds_dtype(v) != Some(module)) {
        out.push(
            Diagnostic::error(
                PRECISION,
                format!("the native runtime accumulates gradients in the module's dtype ({module}), not {v}"),
                raw_span(r, key),
            )
            .with_help("drop data_types.grad_accum_dtype (DeepSpeed's default is the module's dtype)"),
        );
    }
    let key = "fp16.auto_cast";
    if module == "fp16" && raw_ds(r, key).and_then(Val::as_bool) == Some(true) {
        out.push(
            Diagnostic::error(
                PRECISION,
                "the native runtime runs DeepSpeed's fp16 module mode, not torch autocast (`fp16.auto_cast = true`)",
                raw_span(r, key),
            )
            .with_help("drop fp16.auto_cast"),
        );
    }
    let key = "communication_data_type";
    if let Some(v) = raw_ds(r, key).filter(|v| ds_dtype(v).is_none()) {
        out.push(
            Diagnostic::error(
                PRECISION,
                format!("communication_data_type {v} is not a dtype the native runtime reduces in"),
                raw_span(r, key),
            )
            .with_help("write fp32, fp16 or bf16"),
        );
    }
}

fn offload(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let stage = r.count("zero.stage");
    for (key, what) in [
        ("zero.offload optimizer", "the optimizer state"),
        ("zero.offload param", "parameters"),
    ] {
        let target = r.word(key).unwrap_or("none");
        let refused = match key {
            // DeepSpeed reads `offload_optimizer` under a ZeRO optimizer only (R0601).
            "zero.offload optimizer" => target == "nvme" && stage >= 1,
            // ZeRO-Infinity's parameter offload (DeepSpeed reads it at stage 3 only).
            _ => target != "none" && stage == 3,
        };
        if refused {
            out.push(
                Diagnostic::error(
                    OFFLOAD,
                    format!("the native runtime cannot offload {what} to {target} yet"),
                    anchor(r, key),
                )
                .with_help(if key == "zero.offload optimizer" {
                    "`offload optimizer = cpu` runs natively"
                } else {
                    "drop `offload param`: ZeRO-3 already partitions the parameters over the ranks"
                }),
            );
        }
    }
}

/// The runtime runs every schedule kind (`recipe_runtime::lr`; the metric-driven ones,
/// `recipe_runtime::plateau` and `recipe_runtime::greedy`, at each evaluation with the
/// evaluation loss), at one learning rate for every parameter. HF's optimizer has two parameter
/// groups (decaying weights, then the rest) whose LRs a metric-driven schedule moves apart only
/// when a per-group `min_lr` / `max_lr` list holds different values: that one LR cannot follow.
fn schedule(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if !matches!(
        r.word("schedule.kind"),
        Some("reduce_lr_on_plateau" | "greedy")
    ) {
        return;
    }
    for key in ["schedule.min_lr", "schedule.max_lr"] {
        let Some(values) = r.per_group(key) else {
            continue;
        };
        if values.windows(2).any(|w| w[0] != w[1]) {
            let name = key.trim_start_matches("schedule.");
            out.push(
                Diagnostic::error(
                    SCHEDULE,
                    format!(
                        "the native runtime trains every parameter at one learning rate, so `{name} = {}` cannot hold a different value per parameter group",
                        r.val(key).map(Val::to_string).unwrap_or_default()
                    ),
                    anchor(r, key),
                )
                .with_help(format!(
                    "write one `{name}` for every group (e.g. `{name} = {}`), or build for DeepSpeed (`recipe build`), where HF's optimizer has its parameter groups",
                    match r.val(key) {
                        Some(Val::List(items)) => items[0].to_string(),
                        _ => values[0].to_string(),
                    }
                )),
            );
        }
    }
}

/// Reports what the native runtime cannot train in `r`.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    model(r, out);
    data(r, out);
    optimizer(r, out);
    precision(r, out);
    offload(r, out);
    schedule(r, out);
}
