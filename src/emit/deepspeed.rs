//! `ds_config.json`: the DeepSpeed config, from the resolved recipe only.
//!
//! Every key the run depends on is stated (no silent DeepSpeed defaults: clipping, accumulation,
//! both precision sections, offload `device` and `pin_memory`, optimizer `params`, integer bucket
//! sizes), with canonical DeepSpeed names for the target release (`src/upstream/versions.rs` cites each
//! rename). The values are the ones `training_args.json` carries, so HF's fill/match step
//! (`transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_process`)
//! finds nothing to change and nothing to reject. serde_json's map keeps keys sorted,
//! so the output is byte-identical across runs.

use serde_json::{json, Map, Value};

use crate::resolve::{Resolved, Val};
use crate::upstream::schedules::{self, Owner};

/// How values that HF fills are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Concrete values everywhere (the default): nothing is left for HF to fill.
    Explicit,
    /// `"auto"` exactly where HF/accelerate of the target version fill the key
    /// (docs/upstream.md §2.2, §2.3).
    Auto,
}

fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

/// The DeepSpeed optimizer `type` for a recipe optimizer kind.
pub fn optimizer_type(kind: &str) -> &'static str {
    match kind {
        "adamw" => "AdamW",
        "adam" => "Adam",
        "lamb" => "Lamb",
        "lion" => "Lion",
        "adagrad" => "Adagrad",
        "onebitadam" => "OneBitAdam",
        "zerooneadam" => "ZeroOneAdam",
        "onebitlamb" => "OneBitLamb",
        // torch.optim names are looked up with their exact case.
        "sgd" => "SGD",
        _ => "AdamW",
    }
}

fn offload_section(v: Option<&Val>, pin_default: bool, param: bool) -> Option<Value> {
    let v = v?;
    let device = v.as_word()?;
    if device == "none" {
        return None;
    }
    let mut m = Map::new();
    m.insert("device".into(), json!(device));
    if let Some(path) = v.arg("path").and_then(Val::as_str) {
        m.insert("nvme_path".into(), json!(path));
    }
    m.insert(
        "pin_memory".into(),
        json!(v
            .arg("pin_memory")
            .and_then(Val::as_bool)
            .unwrap_or(pin_default)),
    );
    for (arg, key) in [
        ("buffer_count", "buffer_count"),
        ("buffer_size", "buffer_size"),
        ("max_in_cpu", "max_in_cpu"),
    ] {
        if let Some(i) = v.arg(arg).and_then(Val::as_i64) {
            m.insert(key.into(), json!(i));
        }
    }
    for arg in ["pipeline_read", "pipeline_write", "fast_init"] {
        if let Some(b) = v.arg(arg).and_then(Val::as_bool) {
            m.insert(arg.into(), json!(b));
        }
    }
    if !param {
        if let Some(r) = v.arg("ratio").and_then(Val::as_f64) {
            m.insert("ratio".into(), num(r));
        }
    }
    Some(Value::Object(m))
}

/// The `zero_optimization` keys the target DeepSpeed release reads (the nearest sampled release,
/// [`crate::schema::sampled`]).
fn zero_keys(r: &Resolved) -> &'static [&'static str] {
    use crate::schema::upstream_versions::DEEPSPEED_ZERO_KEYS_BY_VERSION as KEYS;
    crate::schema::sampled::nearest(KEYS, r.targets.deepspeed).1
}

fn zero_section(r: &Resolved, auto: bool) -> Value {
    let mut z = zero_section_all(r, auto);
    // Keys a release does not read are left out rather than written for nothing.
    let known = zero_keys(r);
    if let Value::Object(map) = &mut z {
        map.retain(|k, _| known.contains(&k.as_str()));
    }
    z
}

/// Whether a hidden-size bucket is written as `"auto"`: its value came from the hidden size (HF
/// fills the same number, docs/upstream.md §2.2) and the target transformers fills this key at this
/// stage.
fn hidden_auto(r: &Resolved, key: &str, auto: bool, stage: i64) -> bool {
    let derived = matches!(
        r.get(key).map(|s| &s.source),
        Some(crate::resolve::Source::Derived { rule, .. }) if rule.contains("hidden_size")
    );
    let fills = match key {
        "zero.reduce_bucket" => stage == 3 || r.facts.hf_hidden_autos_any_stage,
        // Before 4.45 HF writes a float, which DeepSpeed's int field rejects
        // (docs/upstream.md R-A06).
        "zero.prefetch_bucket" => stage == 3 && !r.facts.hf_float_prefetch_bucket,
        _ => stage == 3,
    };
    auto && derived && fills
}

/// Zero keys `recipe build` states at a stage where DeepSpeed does not read them, or leaves to
/// DeepSpeed where it does (the exceptions to the schema's `stages`, which say where DeepSpeed
/// reads each key). The allgather knobs are validated by DeepSpeed's config model at stage 3
/// although the stage-3 optimizer never reads them; `ignore_unused_parameters` is stated at
/// stage 2 only (at stage 1 DeepSpeed's default, true, applies). The conformance corpus records
/// the configs with exactly these keys, so they stay.
const ZERO_EMIT_EXCEPTIONS: &[(&str, &[i64])] = &[
    ("allgather_partitions", &[1, 2, 3]),
    ("allgather_bucket", &[1, 2, 3]),
    ("ignore_unused_parameters", &[2]),
];

fn zero_section_all(r: &Resolved, auto: bool) -> Value {
    let stage = r.integer("zero.stage");
    let mut z = Map::new();
    z.insert("stage".into(), json!(stage));
    if stage == 0 {
        return Value::Object(z);
    }
    let pin = r.facts.ds_pin_memory_default;
    let Some(block) = crate::schema::block("zero") else {
        return Value::Object(z);
    };
    for key in block.keys {
        let stages = ZERO_EMIT_EXCEPTIONS
            .iter()
            .find(|(name, _)| *name == key.name)
            .map_or(key.stages, |(_, s)| *s);
        let Some(leaf) = key
            .deepspeed
            .and_then(|d| d.strip_prefix("zero_optimization."))
        else {
            continue;
        };
        let name = format!("zero.{}", key.name);
        if !stages.contains(&stage) {
            continue;
        }
        let value = match key.ty {
            crate::schema::Ty::Call(_) => {
                match offload_section(r.val(&name), pin, key.name == "offload param") {
                    Some(o) => o,
                    None => continue,
                }
            }
            _ if hidden_auto(r, &name, auto, stage) => json!("auto"),
            _ => match r.val(&name) {
                Some(v) => to_json(v),
                None => continue,
            },
        };
        if key.name == "offload optimizer" && !r.facts.ds_offload_optimizer_section {
            // DeepSpeed < 0.3.15 only knows the legacy switch (docs/upstream.md R-Z01).
            z.insert("cpu_offload".into(), json!(true));
            continue;
        }
        z.insert(leaf.into(), value);
    }
    Value::Object(z)
}

/// The `params` a DeepSpeed `optimizer` / `scheduler` section takes from the schema: every key
/// of `block` that applies to `kind` and maps to `<section>.params.<name>`, with its resolved
/// value. Keys the recipe does not resolve (an upstream default) are left to DeepSpeed.
fn schema_params(r: &Resolved, block: &str, section: &str, kind: &str) -> Map<String, Value> {
    let prefix = format!("{section}.params.");
    let mut p = Map::new();
    for key in crate::schema::block(block).map_or(&[][..], |b| b.keys) {
        if !key.applies_to(Some(kind)) {
            continue;
        }
        let Some(leaf) = key.deepspeed.and_then(|d| d.strip_prefix(prefix.as_str())) else {
            continue;
        };
        if let Some(v) = r.val(&format!("{block}.{}", key.name)) {
            p.insert(leaf.to_string(), to_json(v));
        }
    }
    p
}

fn optimizer_section(r: &Resolved, auto: bool) -> Option<Value> {
    if r.word("optimizer.owner") != Some("deepspeed") {
        return None;
    }
    let kind = r.choice("optimizer.kind");
    let mut p = schema_params(r, "optimizer", "optimizer", kind);
    if auto {
        // HF fills exactly the params that TrainingArguments also carry (the schema's keys with
        // both a DeepSpeed key and a TrainingArguments field; docs/upstream.md §2.2).
        for key in crate::schema::block("optimizer").map_or(&[][..], |b| b.keys) {
            let leaf = key
                .deepspeed
                .and_then(|d| d.strip_prefix("optimizer.params."));
            if let (Some(leaf), Some(_)) = (leaf, key.hf) {
                if let Some(v) = p.get_mut(leaf) {
                    *v = json!("auto");
                }
            }
        }
    }
    // With torch_adam DeepSpeed hands params to torch.optim.Adam(W), which has no
    // bias_correction argument (found by the conformance harness).
    if r.bool("optimizer.torch_adam") == Some(true) {
        p.remove("bias_correction");
    }
    match kind {
        // DeepSpeed's "Adam" is AdamW unless told otherwise (docs/upstream.md R-P01): classic Adam
        // is asked for.
        "adam" => {
            p.insert("adam_w_mode".into(), json!(false));
        }
        "adamw" => {
            p.insert("adam_w_mode".into(), json!(true));
        }
        _ => {}
    }
    Some(json!({ "type": optimizer_type(kind), "params": Value::Object(p) }))
}

fn scheduler_section(r: &Resolved, auto: bool) -> Option<Value> {
    let curves = schedules::curves(r)?;
    if curves.owner != Owner::DeepSpeed {
        return None;
    }
    let kind = r.word("schedule.kind")?;
    let f = |k: &str| r.num(k);
    let total = curves.total;
    // DeepSpeed ≥ 0.19.3 rejects a warmup_num_steps that is not a positive int; HF's own auto value
    // is max(1, W) where it clamps (docs/upstream.md R-L03). W' = max(2, W) applies either way.
    let warmup = if r.facts.ds_warmup_steps_positive_int || r.facts.hf_ds_warmup_at_least_one {
        curves.warmup.max(1)
    } else {
        curves.warmup
    };
    let auto_or = |v: Value| if auto { json!("auto") } else { v };
    // Every parameter the schema maps (OneCycle and LRRangeTest need nothing else); the
    // warmup kinds then state their step counts and HF's "auto" values below.
    let mut p = schema_params(r, "schedule", "scheduler", kind);
    match kind {
        "WarmupLR" | "WarmupDecayLR" => {
            // HF fills warmup_min_lr with 0 and warmup_max_lr with learning_rate
            // (docs/upstream.md §2.2): "auto" only stands for the recipe's value when it is exactly
            // that.
            let min_lr = f("schedule.min_lr");
            let max_lr = r.f64("schedule.max_lr").unwrap_or(curves.peak);
            p.insert(
                "warmup_min_lr".into(),
                if min_lr == 0.0 {
                    auto_or(num(min_lr))
                } else {
                    num(min_lr)
                },
            );
            p.insert(
                "warmup_max_lr".into(),
                if max_lr == curves.peak {
                    auto_or(num(max_lr))
                } else {
                    num(max_lr)
                },
            );
            p.insert("warmup_num_steps".into(), auto_or(json!(warmup)));
            if !r.facts.ds_has_warmup_type {
                p.remove("warmup_type");
            }
            if kind == "WarmupDecayLR" {
                p.insert("total_num_steps".into(), auto_or(json!(total)));
            }
        }
        "WarmupCosineLR" => {
            p.insert("total_num_steps".into(), auto_or(json!(total)));
            p.insert("warmup_num_steps".into(), auto_or(json!(warmup)));
        }
        "OneCycle" | "LRRangeTest" => {}
        _ => return None,
    }
    Some(json!({ "type": kind, "params": Value::Object(p) }))
}

/// Inserts `value` at a dotted path, creating objects on the way (raw `deepspeed { }` keys).
pub(super) fn insert_path(root: &mut Map<String, Value>, path: &str, value: Value) {
    let mut parts = path.split('.').peekable();
    let mut node = root;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            node.insert(part.to_string(), value);
            return;
        }
        let entry = node
            .entry(part.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        node = entry.as_object_mut().expect("made an object above");
    }
}

/// A recipe value as JSON.
pub fn to_json(v: &Val) -> Value {
    match v {
        Val::Int(i) => json!(i),
        Val::Float(f) => num(*f),
        Val::Percent(p) => num(p / 100.0),
        Val::Bool(b) => json!(b),
        Val::Str(s) | Val::Word(s) => json!(s),
        Val::List(items) => Value::Array(items.iter().map(to_json).collect()),
        Val::Call { name, args } if args.is_empty() => json!(name),
        Val::Call { args, .. } => {
            Value::Object(args.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
    }
}

/// The DeepSpeed config of a resolved recipe.
pub fn config(r: &Resolved, style: Style) -> Value {
    let auto = style == Style::Auto;
    let auto_or = |v: Value| if auto { json!("auto") } else { v };
    let int = |k: &str| json!(r.int(k).unwrap_or(0));
    let mut c = Map::new();
    c.insert("train_batch_size".into(), auto_or(int("batch.global")));
    c.insert(
        "train_micro_batch_size_per_gpu".into(),
        auto_or(int("batch.micro")),
    );
    c.insert(
        "gradient_accumulation_steps".into(),
        auto_or(int("batch.accumulate")),
    );
    c.insert(
        "gradient_clipping".into(),
        auto_or(num(r.num("train.clip"))),
    );
    c.insert("steps_per_print".into(), int("train.logging_steps"));
    let precision = r.choice("train.precision");
    let eval = r.word("train.eval_precision").unwrap_or(precision);
    // HF fills fp16.enabled from `fp16 or fp16_full_eval` (and bf16 alike), docs/upstream.md §2.2.
    let fp16 = precision == "fp16" || eval == "fp16";
    let bf16 = precision == "bf16" || eval == "bf16";
    let mut fp = Map::new();
    fp.insert("enabled".into(), auto_or(json!(fp16)));
    if fp16 {
        let loss_scale = match r.val("train.loss_scale") {
            Some(Val::Int(i)) => *i,
            _ => 0, // dynamic
        };
        if r.facts.ds_has_fp16_auto_cast {
            fp.insert("auto_cast".into(), json!(false));
        }
        fp.insert("loss_scale".into(), json!(loss_scale));
        fp.insert(
            "initial_scale_power".into(),
            int("train.initial_scale_power"),
        );
        fp.insert("loss_scale_window".into(), int("train.loss_scale_window"));
        fp.insert("hysteresis".into(), int("train.hysteresis"));
        fp.insert("min_loss_scale".into(), num(r.num("train.min_loss_scale")));
    }
    c.insert("fp16".into(), Value::Object(fp));
    if let Some(key) = r.facts.ds_bf16_key {
        c.insert(key.into(), json!({ "enabled": auto_or(json!(bf16)) }));
    }
    // DeepSpeed 0.19.8 refuses an `amp` section even when disabled (apex AMP removed).
    if r.word("train.fp16_backend") == Some("apex")
        && r.facts.hf_apex_amp
        && !r.facts.ds_removed_legacy_features
    {
        c.insert("amp".into(), json!({ "enabled": auto_or(json!(fp16)) }));
    }
    c.insert("zero_optimization".into(), zero_section(r, auto));
    if let Some(o) = optimizer_section(r, auto) {
        let kind = r.choice("optimizer.kind");
        let tested = r.facts.ds_zero_supported_optimizers.contains(&kind);
        c.insert("optimizer".into(), o);
        if !tested && r.integer("zero.stage") >= 1 {
            // DeepSpeed refuses optimizers outside its ZeRO-tested list without this
            // (docs/upstream.md R-P02).
            c.insert("zero_allow_untested_optimizer".into(), json!(true));
        }
    }
    if let Some(s) = scheduler_section(r, auto) {
        c.insert("scheduler".into(), s);
    }
    c.insert("wall_clock_breakdown".into(), json!(false));
    for (path, value, _) in &r.raw_deepspeed {
        insert_path(&mut c, path, to_json(value));
    }
    Value::Object(c)
}
