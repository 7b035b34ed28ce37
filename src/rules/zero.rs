//! ZeRO rules: keys DeepSpeed reads only at some stages (docs/upstream.md §6.2, R-Z03/R-Z04),
//! partial offload, 16-bit weights on save (docs/upstream.md R-H06), `auto_find_batch_size`
//! (docs/upstream.md R-A04), offload on DeepSpeed releases before the offload sections
//! (docs/upstream.md R-Z01), raw `zero_optimization` keys that restate the `zero` block, and the
//! model-states memory estimate (docs/upstream.md §8, R-E01). Severities follow
//! docs/upstream.md §0.2: "error" and "bug" are errors, "warn" are warnings.

use crate::diagnostics::Diagnostic;
use crate::resolve::{Resolved, Val};
use crate::upstream::memory::{self, BertShape, Estimate, ModelSize, Offload, Zero2Formula};
use crate::upstream::versions::Fact;

use super::precision::{first_release, near};
use super::{anchor, origin};

/// A `zero` key written for a stage at which DeepSpeed does not read it (docs/upstream.md R-Z03).
pub const KEY_WRONG_STAGE: &str = "R0601";
/// NVMe optimizer offload with ZeRO stage 1 or 2 behaves as CPU offload (docs/upstream.md R-Z04).
pub const NVME_AS_CPU: &str = "R0602";
/// Partial optimizer offload (`ratio` < 1) below ZeRO stage 3 (docs/upstream.md §6.2).
pub const PARTIAL_OFFLOAD: &str = "R0603";
/// ZeRO-3 without gathering 16-bit weights on save (docs/upstream.md R-H06).
pub const NO_16BIT_SAVE: &str = "R0604";
/// `auto_find_batch_size` with ZeRO-3 (docs/upstream.md R-A04).
pub const AUTO_BATCH_ZERO3: &str = "R0605";
/// Offload the target DeepSpeed cannot express (docs/upstream.md R-Z01;
/// `ds_offload_optimizer_section`).
pub const OFFLOAD_UNSUPPORTED: &str = "R0606";
/// A raw `deepspeed { }` key restating the `zero` block.
pub const RAW_ZERO_KEY: &str = "R0607";
/// The model states alone fill most of a GPU (docs/upstream.md R-E01).
pub const MEMORY: &str = "R0608";
/// ZeRO-2 with reduce-scatter and gradient pre-scaling or pre-division (docs/upstream.md R-Z05).
pub const REDUCE_SCATTER_PRESCALE: &str = "R0609";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        KEY_WRONG_STAGE,
        "zero-key-wrong-stage",
        "a zero key that DeepSpeed ignores at this stage",
    ),
    (
        NVME_AS_CPU,
        "nvme-as-cpu",
        "NVMe optimizer offload with ZeRO stage 1 or 2 offloads to the CPU",
    ),
    (
        PARTIAL_OFFLOAD,
        "partial-offload",
        "partial optimizer offload needs ZeRO stage 3",
    ),
    (
        NO_16BIT_SAVE,
        "zero3-no-16bit-save",
        "ZeRO-3 saves no loadable model without 16-bit gathering",
    ),
    (
        AUTO_BATCH_ZERO3,
        "auto-batch-zero3",
        "auto_find_batch_size is not supported with ZeRO-3",
    ),
    (
        OFFLOAD_UNSUPPORTED,
        "offload-unsupported",
        "the target DeepSpeed cannot offload this way",
    ),
    (
        RAW_ZERO_KEY,
        "raw-zero-key",
        "a raw zero_optimization key restates the zero block",
    ),
    (
        MEMORY,
        "memory",
        "the model states alone need most of a GPU's memory",
    ),
    (
        REDUCE_SCATTER_PRESCALE,
        "reduce-scatter-prescale",
        "ZeRO-2 reduce-scatter with prescale_gradients or gradient_predivide_factor",
    ),
];

/// Shapes of a few public BERT checkpoints (each one's config.json on the Hugging Face hub:
/// vocabulary, hidden size, layers, intermediate size; 512 positions, 2 token types), so that a
/// recipe naming one by hub id gets a memory estimate without a local copy.
const KNOWN_MODELS: &[(&[&str], u64, u64, u64, u64)] = &[
    (
        &["sentence-transformers/all-MiniLM-L6-v2"],
        30522,
        384,
        6,
        1536,
    ),
    (
        &["bert-base-uncased", "google-bert/bert-base-uncased"],
        30522,
        768,
        12,
        3072,
    ),
    (
        &["bert-base-cased", "google-bert/bert-base-cased"],
        28996,
        768,
        12,
        3072,
    ),
    (
        &["bert-large-uncased", "google-bert/bert-large-uncased"],
        30522,
        1024,
        24,
        4096,
    ),
    (
        &["bert-large-cased", "google-bert/bert-large-cased"],
        28996,
        1024,
        24,
        4096,
    ),
];

/// The share of a GPU's memory the model states may take before docs/upstream.md R-E01 warns.
const MEMORY_SHARE: f64 = 0.8;

/// Checks the ZeRO rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let stage = r.integer("zero.stage");
    wrong_stage(r, stage, out);
    offload(r, stage, out);
    if stage == 3 {
        zero3(r, out);
    }
    raw_keys(r, out);
    if stage == 2 {
        reduce_scatter_prescale(r, out);
    }
    memory_estimate(r, stage, out);
}

/// docs/upstream.md R-Z05: ZeRO-2 with `reduce_scatter` (default true) asserts against gradient
/// pre-scaling (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/zero/stage_1_and_2.py:
/// DeepSpeedZeroOptimizer.__init__, guarded by `partition_gradients`, i.e. stage 2).
fn reduce_scatter_prescale(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if r.bool("zero.reduce_scatter") == Some(false) {
        return;
    }
    for (path, value, span) in &r.raw_deepspeed {
        let message = match (path.as_str(), value) {
            ("prescale_gradients", Val::Bool(true)) => {
                "pre-scale gradients is not yet supported with ZeRO-2 with reduce scatter enabled"
            }
            ("gradient_predivide_factor", v) if v.as_f64().is_some_and(|f| f != 1.0) => {
                "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2 with reduce scatter enabled"
            }
            _ => continue,
        };
        let mut d = Diagnostic::error(
            REDUCE_SCATTER_PRESCALE,
            format!("DeepSpeed stops at start: \"{message}\""),
            *span,
        )
        .with_label(format!("{path} with ZeRO-2"));
        if let Some(s) = r.span("zero.stage") {
            d = d.with_secondary(s, "stage 2");
        }
        out.push(d.with_help(format!(
            "remove `{path}`, or set `reduce_scatter = false` in `zero` (all-reduce instead)"
        )));
    }
}

fn ds_key(name: &str) -> &'static str {
    crate::schema::block("zero")
        .and_then(|b| b.key(name))
        .and_then(|k| k.deepspeed)
        .unwrap_or("zero_optimization")
}

fn offload_word(r: &Resolved, key: &str) -> Option<&'static str> {
    match r.word(key)? {
        "cpu" => Some("cpu"),
        "nvme" => Some("nvme"),
        _ => None,
    }
}

fn stage_label(r: &Resolved, stage: i64, d: Diagnostic) -> Diagnostic {
    match near(r, "zero.stage") {
        Some(span) => d.with_secondary(
            span,
            format!("ZeRO stage {stage}{}", origin(r, "zero.stage")),
        ),
        None => d,
    }
}

/// R-Z03 (docs/upstream.md §6.2 table). Elastic checkpoints with stage 3 are also logged by
/// DeepSpeed (`DeepSpeed@v0.19.5
/// zero/config.py:DeepSpeedZeroConfig.elastic_checkpoint_deprecated`).
fn wrong_stage(r: &Resolved, stage: i64, out: &mut Vec<Diagnostic>) {
    // The stages at which DeepSpeed reads each key are the schema's (`KeySpec::stages`, from
    // deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:_configure_zero_optimizer: stage 0
    // builds no ZeRO optimizer; stages 1-2 build DeepSpeedZeroOptimizer, which takes no stage-3
    // argument; stage 3 builds DeepSpeedZeroOptimizer_Stage3, which takes no `allgather_*`,
    // `round_robin_gradients` or `ignore_unused_parameters`).
    for spec in crate::schema::block("zero").map_or(&[][..], |b| b.keys) {
        let (name, stages) = (spec.name, spec.stages);
        let key = format!("zero.{name}");
        if !r.is_given(&key) || stages.contains(&stage) {
            continue;
        }
        let value = r.val(&key).map_or_else(String::new, Val::to_string);
        let is_offload = name.starts_with("offload");
        if is_offload && offload_word(r, &key).is_none() {
            continue; // `none` offloads nothing
        }
        if name == "offload optimizer" && partial_ratio(r).is_some() {
            continue; // R0603 is the error DeepSpeed raises
        }
        let (message, help) = if stage == 0 {
            (
                format!(
                    "`{name}` has no effect with ZeRO stage 0: DeepSpeed builds no ZeRO optimizer"
                ),
                "remove it, or choose a ZeRO stage (`zero 1`, `zero 2` or `zero 3`)".to_string(),
            )
        } else if stages == [3] {
            (
                format!("`{name}` only applies to ZeRO stage 3; DeepSpeed ignores it with stage {stage}"),
                format!("remove it, or use `zero 3`{}", if is_offload { " (parameter offload is ZeRO-3's)" } else { "" }),
            )
        } else if name == "elastic_checkpoint" {
            (
                format!("`{name}` only applies to ZeRO stages 1 and 2; DeepSpeed ignores it with stage 3"),
                "remove it: DeepSpeed logs \"ZeRO-3 elastic checkpointing is deprecated and no longer supported. Use Universal Checkpointing instead.\"".to_string(),
            )
        } else {
            (
                format!("`{name}` only applies to ZeRO stages 1 and 2; DeepSpeed ignores it with stage {stage}"),
                "remove it".to_string(),
            )
        };
        let d = Diagnostic::warning(KEY_WRONG_STAGE, message, anchor(r, &key))
            .with_label(format!("{name} = {value} is ignored"));
        let d = stage_label(r, stage, d).with_help(format!(
            "{help} (`{}` is read by DeepSpeed at {})",
            ds_key(name),
            stages_text(stages)
        ));
        let d = super::fix::with_removal(d, r, &key);
        out.push(if stages == [3] && stage != 0 {
            super::fix::with_set(d, r, "zero.stage", "3")
        } else {
            d
        });
    }
}

fn stages_text(stages: &[i64]) -> String {
    let s: Vec<String> = stages.iter().map(i64::to_string).collect();
    match s.as_slice() {
        [one] => format!("stage {one}"),
        [init @ .., last] => format!("stages {} or {last}", init.join(", ")),
        [] => String::new(),
    }
}

/// `ratio` of a partial optimizer offload, when below 1.
fn partial_ratio(r: &Resolved) -> Option<f64> {
    offload_word(r, "zero.offload optimizer")?;
    r.val("zero.offload optimizer")
        .and_then(|v| v.arg("ratio"))
        .and_then(Val::as_f64)
        .filter(|ratio| *ratio < 1.0)
}

/// docs/upstream.md R-Z04, the partial-offload assertion (`DeepSpeed@v0.19.5
/// zero/config.py:DeepSpeedZeroConfig.offload_ratio_check`, since v0.12.3), and
/// docs/upstream.md R-Z01: before v0.3.15 the ZeRO config has only the `cpu_offload` /
/// `cpu_offload_params` switches (`DeepSpeed@v0.3.14 runtime/zero/constants.py`), so NVMe offload
/// cannot be expressed.
fn offload(r: &Resolved, stage: i64, out: &mut Vec<Diagnostic>) {
    let key = "zero.offload optimizer";
    let value = r.val(key).map_or_else(String::new, Val::to_string);
    if let Some(ratio) = partial_ratio(r).filter(|_| stage != 3) {
        let ratio = crate::resolve::value::fmt_f64(ratio);
        let d = Diagnostic::error(
            PARTIAL_OFFLOAD,
            format!("partial optimizer offload (`ratio: {ratio}`) needs ZeRO stage 3, and the recipe uses stage {stage}"),
            anchor(r, key),
        )
        .with_label(format!("offload optimizer = {value}"));
        out.push(stage_label(r, stage, d).with_help(
            "DeepSpeed asserts \"Partial offloading only supported for ZeRO Stage 3.\"; use \
             `zero 3`, or drop `ratio` to offload all optimizer states",
        ));
    }
    if offload_word(r, key) == Some("nvme") && matches!(stage, 1 | 2) {
        let d = Diagnostic::warning(
            NVME_AS_CPU,
            format!("`offload optimizer = nvme(…)` offloads to the CPU with ZeRO stage {stage}: NVMe offload needs stage 3"),
            anchor(r, key),
        )
        .with_label("DeepSpeed treats every device but `none` as CPU offload at stages 1 and 2");
        out.push(stage_label(r, stage, d).with_help(
            "use `zero 3` for NVMe offload (ZeRO-Infinity), or write `offload optimizer = cpu` \
             to say what happens",
        ));
    }
    if !r.facts.ds_offload_optimizer_section {
        let ds = r.targets.deepspeed;
        for k in ["zero.offload optimizer", "zero.offload param"] {
            if offload_word(r, k) != Some("nvme") {
                continue;
            }
            let mut d = Diagnostic::error(
                OFFLOAD_UNSUPPORTED,
                format!(
                    "DeepSpeed {ds} has no NVMe offload: `{} = nvme(…)` cannot be expressed",
                    &k[5..]
                ),
                anchor(r, k),
            )
            .with_label("its ZeRO config has only the `cpu_offload` switches");
            if let Some(span) = r.target_sources[2].span() {
                d = d.with_secondary(span, format!("DeepSpeed {ds}"));
            }
            let since = first_release(|f| matches!(f, Fact::DsOffloadOptimizerSection(true)));
            out.push(d.with_help(match since {
                Some(v) => format!("offload to `cpu`, or target DeepSpeed ≥ {v} (the `offload_optimizer` / `offload_param` sections)"),
                None => "offload to `cpu`".into(),
            }));
        }
    }
}

/// docs/upstream.md R-H06 and R-A04, for ZeRO stage 3.
fn zero3(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let key = "zero.gather_16bit_weights_on_model_save";
    if r.bool(key) == Some(false) {
        let d = Diagnostic::warning(
            NO_16BIT_SAVE,
            "with ZeRO-3 and `gather_16bit_weights_on_model_save = false`, saving writes no loadable model weights",
            anchor(r, key),
        )
        .with_label(format!("the saved checkpoint stays sharded{}", origin(r, key)));
        out.push(stage_label(r, 3, d).with_help(
            "HF logs \"stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint \
             instead, use zero_to_fp32.py to recover weights\"; set it to true (the recipe default) \
             for a model.safetensors that from_pretrained loads",
        ));
    }
    let key = "train.auto_find_batch_size";
    if r.bool(key) == Some(true) {
        let d = Diagnostic::error(
            AUTO_BATCH_ZERO3,
            "`auto_find_batch_size` is not supported with ZeRO stage 3",
            anchor(r, key),
        )
        .with_label(format!(
            "HF raises when the Trainer is built{}",
            origin(r, key)
        ));
        out.push(stage_label(r, 3, d).with_help(
            "the HF Trainer raises \"`auto_find_batch_size` isn't supported yet with DeepSpeed \
             Zero-3. Please consider using Zero-2, Zero-1, or FSDP\"; remove it and set `micro`, \
             or use `zero 2`",
        ));
    }
}

/// A raw key that restates the `zero` block: two sources of truth for one setting.
fn raw_keys(r: &Resolved, out: &mut Vec<Diagnostic>) {
    for (path, value, span) in &r.raw_deepspeed {
        let Some((name, raw_name)) = raw_zero_key(path) else {
            continue;
        };
        if value.as_str() == Some("auto") {
            continue; // HF/accelerate fill it from the same source (compat checks the fill)
        }
        let recipe = if name == "stage" {
            "the `zero` block's stage".to_string()
        } else {
            format!("`{name}` in `zero`")
        };
        let mut d = Diagnostic::error(
            RAW_ZERO_KEY,
            format!(
                "`{path}` in `deepspeed {{ }}` restates {recipe}: two sources of truth for ZeRO"
            ),
            *span,
        )
        .with_label(format!("{path} = {value}"));
        let key = format!("zero.{name}");
        if let Some(s) = r.span(&key).or_else(|| r.block_spans.get("zero").copied()) {
            let current = r.val(&key).map_or_else(String::new, Val::to_string);
            d = d.with_secondary(s, format!("{name} = {current}{}", origin(r, &key)));
        }
        let how = if name == "stage" {
            "write the stage as the `zero` block's label (`zero 2`)".to_string()
        } else {
            format!("write `{name} = …` in the `zero` block")
        };
        let deprecated = if raw_name.starts_with("cpu_offload") {
            " (`cpu_offload*` are deprecated; DeepSpeed 0.7.0 even maps `cpu_offload` to no offload)"
        } else {
            ""
        };
        let written = if name == "stage" {
            "zero_optimization.stage"
        } else {
            ds_key(name)
        };
        let d = d.with_help(format!(
            "remove it and {how}: `recipe build` writes `{written}` from it{deprecated}"
        ));
        out.push(raw_key_fix(d, r, path, name, raw_name, value));
    }
}

/// R0607's fix: the raw key removed and its value written in the `zero` block (unless the block
/// already says the same), the deprecated `cpu_offload*` switches as the device they mean.
fn raw_key_fix(
    mut d: Diagnostic,
    r: &Resolved,
    path: &str,
    name: &str,
    raw_name: &str,
    value: &Val,
) -> Diagnostic {
    let Some(span) = r.raw_item_spans.get(&format!("deepspeed.{path}")) else {
        return d;
    };
    let text = match (raw_name.starts_with("cpu_offload"), value) {
        (true, Val::Bool(on)) if name.starts_with("offload ") => {
            if *on { "cpu" } else { "none" }.to_string()
        }
        (true, _) => return d,
        // The legacy `zero_optimization: true|false` names no stage.
        (false, Val::Bool(_)) if name == "stage" => return d,
        _ => value.to_string(),
    };
    let key = if name == "stage" {
        "zero.stage".to_string()
    } else {
        format!("zero.{name}")
    };
    let mut edits = vec![crate::diagnostics::Edit {
        span: *span,
        text: String::new(),
    }];
    let same = r.val(&key).is_some_and(|v| v.to_string() == text);
    if !same {
        let Some((at, new)) = super::fix::set(r, &key, &text) else {
            return d;
        };
        edits.push(crate::diagnostics::Edit {
            span: at,
            text: new,
        });
    }
    edits.sort_by_key(|e| e.span.start);
    let title = if same {
        format!("remove `{path}` (the `zero` block says the same)")
    } else if name == "stage" {
        format!("remove `{path}` and write `zero {text}`")
    } else {
        format!("move it to `zero {{ {name} = {text} }}`")
    };
    d.fixes.push(crate::diagnostics::Fix { title, edits });
    d
}

/// The `zero` key a raw DeepSpeed path restates, and the `zero_optimization` field it names.
fn raw_zero_key(path: &str) -> Option<(&'static str, &'static str)> {
    if path == "zero_optimization" {
        return Some(("stage", "stage")); // the legacy `zero_optimization: true|false`
    }
    if path == "allgather_size" {
        return Some(("allgather_bucket", "allgather_bucket_size")); // legacy top level
    }
    let rest = path.strip_prefix("zero_optimization.")?;
    let field = rest.split('.').next()?;
    // DeepSpeed's name for each `zero` key, and the other names it accepts (pydantic aliases of
    // `DeepSpeed@v0.19.5 zero/config.py:DeepSpeedZeroConfig`, the deprecated `cpu_offload*`
    // switches, docs/upstream.md R-Z01), from the schema.
    crate::schema::block("zero")?.keys.iter().find_map(|k| {
        let own = k.deepspeed?.strip_prefix("zero_optimization.")?;
        std::iter::once(own)
            .chain(k.ds_aliases.iter().copied())
            .find(|raw| *raw == field)
            .map(|raw| (k.name, raw))
    })
}

/// The model's size: from a local config.json (`model.params`, resolved from the file), else
/// from the known hub checkpoints. With the source, in words.
pub fn model_size(r: &Resolved) -> Option<(ModelSize, String)> {
    if let (Some(params), Some(largest_layer)) =
        (r.uint("model.params"), r.uint("model.largest_layer"))
    {
        let from = match r.get("model.params").map(|s| &s.source) {
            Some(crate::resolve::Source::File { what }) => what.clone(),
            _ => "the model".into(),
        };
        return Some((
            ModelSize {
                params,
                largest_layer,
            },
            from,
        ));
    }
    let id = r.str("model.from")?;
    let (_, vocab, hidden, layers, intermediate) =
        KNOWN_MODELS.iter().find(|m| m.0.contains(&id))?;
    let labels = match r.val("model.task").and_then(|t| t.arg("labels")) {
        Some(Val::List(items)) => items.len() as u64,
        Some(v) => v.as_i64().map_or(2, |n| n.max(0) as u64),
        None => 2,
    };
    let size = memory::bert_size(&BertShape {
        vocab_size: *vocab,
        hidden_size: *hidden,
        num_hidden_layers: *layers,
        intermediate_size: *intermediate,
        max_position_embeddings: 512,
        type_vocab_size: 2,
        num_labels: labels,
        pooler: true,
    });
    Some((size, format!("the {labels}-label classifier of {id}")))
}

/// One ZeRO configuration of the estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// ZeRO stage.
    pub stage: u8,
    /// Optimizer offload.
    pub optimizer: Offload,
    /// Parameter offload (stage 3).
    pub param: Offload,
}

impl Choice {
    /// What the estimators tell apart: NVMe counts as CPU, parameter offload only at stage 3.
    fn same_as(&self) -> (u8, bool, bool) {
        (
            self.stage,
            offloaded(self.optimizer),
            self.stage == 3 && offloaded(self.param),
        )
    }

    fn name(&self) -> String {
        let offload = match (self.optimizer, self.param) {
            (Offload::None, _) => "",
            (_, Offload::None) => " + optimizer offload",
            _ => " + full offload",
        };
        format!("ZeRO-{}{offload}", self.stage)
    }
}

/// The configurations the help compares (DeepSpeed's estimator rows, docs/upstream.md §8).
pub const CHOICES: &[(u8, Offload, Offload)] = &[
    (0, Offload::None, Offload::None),
    (1, Offload::None, Offload::None),
    (2, Offload::None, Offload::None),
    (2, Offload::Cpu, Offload::None),
    (3, Offload::None, Offload::None),
    (3, Offload::Cpu, Offload::None),
    (3, Offload::Cpu, Offload::Cpu),
];

/// An offload word (`none`, `cpu`, `nvme`) as the estimators' enum.
pub fn to_offload(word: Option<&str>) -> Offload {
    match word {
        Some("cpu") => Offload::Cpu,
        Some("nvme") => Offload::Nvme,
        _ => Offload::None,
    }
}

/// Model-states memory of one configuration (HF builds ZeRO-3 models under `zero.Init`). DeepSpeed
/// has no ZeRO-1 estimator; ZeRO-1 keeps full 16-bit gradients on every GPU, so it needs at least
/// the ZeRO-2 figure (docs/upstream.md §8): stage 1 is the larger of the paper's formula and that.
pub fn estimate(r: &Resolved, c: Choice, size: ModelSize) -> Option<Estimate> {
    if c.stage == 1 {
        let zero2 = estimate(r, Choice { stage: 2, ..c }, size)?;
        let paper = estimate_raw(r, c, size);
        return Some(Estimate {
            per_gpu: paper.map_or(zero2.per_gpu, |e| e.per_gpu.max(zero2.per_gpu)),
            per_node_cpu: paper.map_or(zero2.per_node_cpu, |e| e.per_node_cpu),
        });
    }
    estimate_raw(r, c, size)
}

fn estimate_raw(r: &Resolved, c: Choice, size: ModelSize) -> Option<Estimate> {
    let gpus = r.count("cluster.gpus");
    let nodes = r.count("cluster.nodes");
    let formula = if r.facts.ds_zero2_estimate_new {
        Zero2Formula::Since0_14_3
    } else {
        Zero2Formula::Before0_14_3
    };
    let param = if c.stage == 3 { c.param } else { Offload::None };
    memory::estimate(
        c.stage,
        c.optimizer,
        param,
        size,
        gpus,
        nodes,
        true,
        formula,
    )
}

fn gib(bytes: u64) -> String {
    let g = memory::gib(bytes);
    if g.fract() == 0.0 {
        format!("{g} GiB")
    } else {
        format!("{g:.2} GiB")
    }
}

/// Whether `per_gpu` bytes exceed the share of `gpu_memory` docs/upstream.md R-E01 allows.
fn too_big(per_gpu: u64, gpu_memory: u64) -> bool {
    per_gpu as f64 > MEMORY_SHARE * gpu_memory as f64
}

/// docs/upstream.md R-E01: DeepSpeed's model-states estimators (`memory.rs`, docs/upstream.md §8)
/// for the recipe's stage, offload and world; a warning when they exceed 80% of
/// `cluster.gpu_memory`.
fn memory_estimate(r: &Resolved, stage: i64, out: &mut Vec<Diagnostic>) {
    let Some(gpu_memory) = r.uint("cluster.gpu_memory").filter(|m| *m > 0) else {
        return;
    };
    let Some((size, from)) = model_size(r) else {
        return;
    };
    let Ok(stage) = u8::try_from(stage) else {
        return;
    };
    let chosen = Choice {
        stage,
        optimizer: to_offload(r.word("zero.offload optimizer")),
        param: to_offload(r.word("zero.offload param")),
    };
    let Some(e) = estimate(r, chosen, size) else {
        return; // no DeepSpeed estimator row for this configuration
    };
    if !too_big(e.per_gpu, gpu_memory) {
        return;
    }
    let world = r.uint("cluster.world_size").unwrap_or(1);
    let limit = (MEMORY_SHARE * gpu_memory as f64) as u64;
    let mut d = Diagnostic::warning(
        MEMORY,
        format!(
            "the model states alone need {} per GPU with {} on {world} GPU(s), more than 80% of the {} of a GPU",
            gib(e.per_gpu),
            chosen.name(),
            gib(gpu_memory)
        ),
        anchor(r, "cluster.gpu_memory"),
    )
    .with_label(format!("{}{}; 80% is {}", gib(gpu_memory), origin(r, "cluster.gpu_memory"), gib(limit)));
    if let Some(span) = near(r, "model.from") {
        d = d.with_secondary(
            span,
            format!("{:.1}M parameters ({from})", size.params as f64 / 1e6),
        );
    }
    d = stage_label(r, i64::from(stage), d);
    let others: Vec<String> = CHOICES
        .iter()
        .map(|&(stage, optimizer, param)| Choice {
            stage,
            optimizer,
            param,
        })
        .filter(|c| c.same_as() != chosen.same_as())
        .filter_map(|c| estimate(r, c, size).map(|e| (c, e)))
        .map(|(c, e)| {
            let host = if offloaded(c.optimizer) {
                format!(", {} CPU per node", gib(e.per_node_cpu))
            } else {
                String::new()
            };
            let fits = if too_big(e.per_gpu, gpu_memory) {
                ""
            } else {
                " (fits)"
            };
            format!("{} {}{host}{fits}", c.name(), gib(e.per_gpu))
        })
        .collect();
    out.push(d.with_help(format!(
        "parameters, gradients and optimizer states only (DeepSpeed's estimators); activations and \
         buffers come on top. Per GPU on {world} GPU(s): {}. Choose a configuration that fits, \
         more GPUs, or GPUs with more memory",
        others.join("; ")
    )));
}

fn offloaded(o: Offload) -> bool {
    !matches!(o, Offload::None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    #[test]
    fn every_zero_key_has_its_stages_and_deepspeed_name() {
        let zero = schema::block("zero").unwrap();
        for key in zero.keys {
            assert!(!key.stages.is_empty(), "zero.{} has no stages", key.name);
            assert!(
                key.deepspeed.is_some(),
                "zero.{} has no DeepSpeed key",
                key.name
            );
        }
        assert_eq!(
            raw_zero_key("zero_optimization.stage3_prefetch_bucket_size"),
            Some(("prefetch_bucket", "stage3_prefetch_bucket_size"))
        );
        assert_eq!(
            raw_zero_key("zero_optimization.prefetch_bucket_size"),
            Some(("prefetch_bucket", "prefetch_bucket_size"))
        );
        assert_eq!(
            raw_zero_key("zero_optimization.cpu_offload"),
            Some(("offload optimizer", "cpu_offload"))
        );
        assert_eq!(
            raw_zero_key("zero_optimization.offload_param.device"),
            Some(("offload param", "offload_param"))
        );
        assert_eq!(raw_zero_key("zero_optimization.nonsense"), None);
    }

    #[test]
    fn every_zero_key_has_its_raw_names() {
        let zero = schema::block("zero").unwrap();
        for key in zero.keys {
            let ds = key.deepspeed.unwrap();
            let field = ds.strip_prefix("zero_optimization.").unwrap();
            assert_eq!(
                raw_zero_key(ds),
                Some((key.name, field)),
                "raw {ds} does not map to zero.{}",
                key.name
            );
        }
        // The stage is compat's R0902; the legacy `zero_optimization: true` is ours.
        assert_eq!(raw_zero_key("zero_optimization.stage"), None);
        assert_eq!(raw_zero_key("zero_optimization"), Some(("stage", "stage")));
        assert_eq!(
            raw_zero_key("zero_optimization.offload_param.device"),
            Some(("offload param", "offload_param"))
        );
        assert_eq!(
            raw_zero_key("zero_optimization.stage3_gather_fp16_weights_on_model_save"),
            Some((
                "gather_16bit_weights_on_model_save",
                "stage3_gather_fp16_weights_on_model_save"
            ))
        );
        // Keys the language does not model stay escape hatches.
        assert_eq!(
            raw_zero_key("zero_optimization.zero_quantized_weights"),
            None
        );
        assert_eq!(raw_zero_key("wall_clock_breakdown"), None);
    }

    #[test]
    fn known_models_match_their_published_sizes() {
        // all-MiniLM-L6-v2: 22,713,216 parameters in its safetensors (reference/assets.md).
        let minilm = KNOWN_MODELS[0];
        let s = memory::bert_size(&BertShape {
            vocab_size: minilm.1,
            hidden_size: minilm.2,
            num_hidden_layers: minilm.3,
            intermediate_size: minilm.4,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            num_labels: 0,
            pooler: true,
        });
        assert_eq!(s.params, 22_713_216);
        // bert-base-uncased: BertModel has 109,482,240.
        let base = KNOWN_MODELS[1];
        let s = memory::bert_size(&BertShape {
            vocab_size: base.1,
            hidden_size: base.2,
            num_hidden_layers: base.3,
            intermediate_size: base.4,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            num_labels: 0,
            pooler: true,
        });
        assert_eq!(s.params, 109_482_240);
        // bert-large-uncased: about 335M.
        let large = KNOWN_MODELS[3];
        let s = memory::bert_size(&BertShape {
            vocab_size: large.1,
            hidden_size: large.2,
            num_hidden_layers: large.3,
            intermediate_size: large.4,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            num_labels: 0,
            pooler: true,
        });
        assert_eq!(s.params / 1_000_000, 335);
    }

    #[test]
    fn threshold_is_eighty_percent() {
        let gi = 1u64 << 30;
        assert!(!too_big(8 * gi, 10 * gi));
        assert!(too_big(8 * gi + 1, 10 * gi));
    }

    #[test]
    fn choice_names() {
        let c = |stage, optimizer, param| Choice {
            stage,
            optimizer,
            param,
        };
        assert_eq!(c(2, Offload::None, Offload::None).name(), "ZeRO-2");
        assert_eq!(
            c(2, Offload::Nvme, Offload::None).name(),
            "ZeRO-2 + optimizer offload"
        );
        assert_eq!(
            c(3, Offload::Cpu, Offload::Cpu).name(),
            "ZeRO-3 + full offload"
        );
        assert_eq!(stages_text(&[1, 2, 3]), "stages 1, 2 or 3");
        assert_eq!(stages_text(&[3]), "stage 3");
    }

    fn resolved(text: &str) -> Resolved {
        let file = crate::syntax::parse(text).unwrap();
        crate::resolve::resolve(&file, &crate::resolve::Options::default())
    }

    #[test]
    fn zero_1_needs_at_least_what_zero_2_needs() {
        let r = resolved(
            "model bert { from = \"bert-large-uncased\", task = classify(labels: 2) }\n\
             data { train = \"t.jsonl\", samples = 64 }\n\
             batch { micro = 8 }\n\
             cluster { gpus = 2 }\n",
        );
        let (size, from) = model_size(&r).unwrap();
        assert!(from.contains("bert-large-uncased"), "{from}");
        let at = |stage, optimizer| {
            estimate(
                &r,
                Choice {
                    stage,
                    optimizer,
                    param: Offload::None,
                },
                size,
            )
            .unwrap()
            .per_gpu
        };
        // On 2 GPUs the paper's ZeRO-1 formula (10P) is below DeepSpeed's ZeRO-2 one (11P).
        let p = size.params;
        assert_eq!(at(2, Offload::None), 2 * p + 18 * p / 2);
        assert_eq!(at(1, Offload::None), at(2, Offload::None));
        // ZeRO-1 with offload has no estimator row: ZeRO-2's stands in.
        assert_eq!(at(1, Offload::Cpu), at(2, Offload::Cpu));
        assert_eq!(at(0, Offload::None), 16 * p);
    }

    /// A local config.json is read through the recipe's directory (resolve/files.rs) and wins
    /// over the hub table; the estimate then warns against `gpu_memory`.
    #[test]
    fn local_config_feeds_the_estimate() {
        let dir = std::env::temp_dir().join(format!("recipe-zero-{}", std::process::id()));
        let model = dir.join("tiny");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            r#"{"model_type": "bert", "vocab_size": 30522, "hidden_size": 1024,
                "num_hidden_layers": 24, "intermediate_size": 4096,
                "max_position_embeddings": 512, "type_vocab_size": 2}"#,
        )
        .unwrap();
        let text = "model bert { from = \"tiny\", task = classify(labels: 2) }\n\
                    data { train = \"t.jsonl\", samples = 64 }\n\
                    batch { micro = 8 }\n\
                    cluster { gpu_memory = 4Gi }\n";
        let options = crate::resolve::Options {
            base_dir: Some(dir.clone()),
            ..Default::default()
        };
        let checked = crate::check::check_source_with(text, &options);
        let memory: Vec<_> = checked
            .diagnostics
            .iter()
            .filter(|d| d.code == MEMORY)
            .collect();
        assert_eq!(memory.len(), 1, "{:#?}", checked.diagnostics);
        // 335,143,938 parameters × 16 bytes at stage 0.
        assert!(
            memory[0].message.contains("4.99 GiB"),
            "{}",
            memory[0].message
        );
        assert!(memory[0].secondary[0].text.contains("config.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
