//! `training_args.json`: the TrainingArguments of the target transformers release, from the
//! same resolved values as `ds_config.json` (so HF's fill/match step agrees with DeepSpeed).
//!
//! Field names differ across releases (`evaluation_strategy` → `eval_strategy`, `warmup_ratio`
//! → float `warmup_steps`, `gradient_checkpointing` → `activation_checkpointing`, …). Each field
//! is written under the first of its names that the target release has, looked up in the field
//! lists read from the released packages ([`crate::schema::upstream_versions`]); a field the
//! release lacks is left out. No version numbers are compared here.

use serde_json::{json, Map, Value};

use crate::resolve::Resolved;
use crate::schema::upstream_versions::HfFields;
use crate::schema::Ty;
use crate::upstream::schedules::{self, Owner};

use super::deepspeed::to_json;

/// HF's `optim` value for a recipe optimizer kind (when HF builds the optimizer).
pub fn hf_optim(kind: &str) -> &'static str {
    match kind {
        "sgd" => "sgd",
        "adagrad" => "adagrad",
        "adafactor" => "adafactor",
        "lion" => "lion_32bit",
        _ => "adamw_torch",
    }
}

fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

/// The TrainingArguments of a resolved recipe; `ds_config` is the path HF is given for the
/// DeepSpeed config.
pub fn arguments(r: &Resolved, ds_config: &str) -> Value {
    let fields = HfFields::for_target(r.targets.transformers);
    let mut a = Map::new();
    let mut unsampled_optim = None;
    // Writes the value under the first name the release has.
    let mut put = |names: &[&str], value: Value| {
        if let Some(name) = names.iter().find(|n| fields.has(n)) {
            a.insert((*name).to_string(), value);
        }
    };
    let f = |k: &str| num(r.num(k));
    let mut sched_kwargs = None;
    put(&["deepspeed"], json!(ds_config));
    put(&["do_train"], json!(true));
    put(&["do_eval"], json!(r.get("data.eval").is_some()));
    // Every key whose TrainingArguments field is one plain field taking the value as it is (the
    // schema's `hf` column), written when resolved. The rest are mapped below.
    for block in crate::schema::BLOCKS {
        for key in block.keys {
            let plain = |h: &&str| {
                h.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            };
            let Some(field) = key.hf.filter(plain) else {
                continue;
            };
            if matches!(key.ty, Ty::Word(_) | Ty::Call(_) | Ty::WordOrInt(..)) {
                continue; // a word is mapped to HF's own words below
            }
            if let Some(v) = r.val(&format!("{}.{}", block.name, key.name)) {
                put(&[field], to_json(v));
            }
        }
    }
    if r.get("optimizer.betas").is_some() {
        let (b1, b2) = r.pair("optimizer.betas");
        put(&["adam_beta1"], num(b1));
        put(&["adam_beta2"], num(b2));
    }
    // Whole warmup steps: the same number the DeepSpeed scheduler gets, and never a float in
    // [0, 1) that transformers 5 would read as a ratio.
    put(&["warmup_steps"], json!(r.int("steps.warmup").unwrap_or(0)));
    if let Some(c) = schedules::curves(r) {
        let hf_name = match c.owner {
            Owner::Hf => r.word("schedule.kind"),
            // DeepSpeed builds it; HF's field names the counterpart, for the record.
            Owner::DeepSpeed => c.names().0,
        };
        if let Some(name) = hf_name {
            put(&["lr_scheduler_type"], json!(name));
        }
        if c.owner == Owner::Hf {
            // Every kwarg the recipe wrote, named by the schema's `lr_scheduler_kwargs.*` column
            // (HF's own defaults apply to the rest, the same values the recipe defaults to).
            let kind = r.choice("schedule.kind");
            let mut kw = Map::new();
            for key in crate::schema::block("schedule").map_or(&[][..], |b| b.keys) {
                let Some(field) = key.hf.and_then(|h| h.strip_prefix("lr_scheduler_kwargs."))
                else {
                    continue;
                };
                let name = format!("schedule.{}", key.name);
                if key.applies_to(Some(kind)) && r.is_given(&name) {
                    if let Some(v) = r.val(&name) {
                        kw.insert(field.to_string(), to_json(v));
                    }
                }
            }
            if r.word("schedule.kind") == Some("warmup_stable_decay") {
                // Whole steps, whether the recipe wrote steps or a fraction.
                let decay = match crate::resolve::warmup_like(r, "schedule.decay") {
                    Some(crate::upstream::steps::Warmup::Steps(s)) => s,
                    Some(crate::upstream::steps::Warmup::Fraction(x)) => {
                        (c.total as f64 * x).ceil() as u64
                    }
                    None => 0,
                };
                kw.insert("num_decay_steps".into(), json!(decay));
                if let Some(stable) =
                    crate::upstream::schedules::wsd_steps(r, "schedule.stable", c.total)
                {
                    kw.insert("num_stable_steps".into(), json!(stable));
                }
                // The shape words, in HF's names (`one_minus_sqrt` is "1-sqrt").
                for (key, field) in [
                    ("schedule.warmup_shape", "warmup_type"),
                    ("schedule.decay_shape", "decay_type"),
                ] {
                    if r.is_given(key) {
                        let name = crate::upstream::schedules::wsd_shape(r.choice(key));
                        kw.insert(field.into(), json!(name));
                    }
                }
            }
            // HF's cosine_with_min_lr and cosine_warmup_with_min_lr need one of min_lr /
            // min_lr_rate (transformers@v5.24.0 optimization.py:
            // get_cosine_with_min_lr_schedule_with_warmup, …_with_warmup_lr_rate): the default
            // min_lr is stated when the recipe gives neither.
            if matches!(kind, "cosine_with_min_lr" | "cosine_warmup_with_min_lr")
                && !kw.contains_key("min_lr_rate")
            {
                kw.insert("min_lr".into(), f("schedule.min_lr"));
            }
            // Written only where the release has the field (R0312 refuses a recipe whose
            // arguments would be lost); the sampled field lists skip 4.36 … 4.40.
            if !kw.is_empty() && r.facts.hf_scheduler_kwargs {
                sched_kwargs = Some(Value::Object(kw));
            }
        }
    }
    let precision = r.choice("train.precision");
    let eval = r.word("train.eval_precision").unwrap_or(precision);
    put(&["fp16"], json!(precision == "fp16"));
    put(&["bf16"], json!(precision == "bf16"));
    put(
        &["fp16_full_eval"],
        json!(eval == "fp16" && precision != "fp16"),
    );
    put(
        &["bf16_full_eval"],
        json!(eval == "bf16" && precision != "bf16"),
    );
    if r.word("train.fp16_backend") == Some("apex") {
        put(&["half_precision_backend", "fp16_backend"], json!("apex"));
    }
    for (key, strategy, steps) in [
        (
            "train.eval_every",
            &["eval_strategy", "evaluation_strategy"][..],
            "eval_steps",
        ),
        ("train.save_every", &["save_strategy"][..], "save_steps"),
    ] {
        match r.val(key) {
            Some(v) if v.as_i64().is_some() => {
                put(strategy, json!("steps"));
                put(&[steps], json!(v.as_i64()));
            }
            Some(v) if v.as_word() == Some("never") => put(strategy, json!("no")),
            _ => put(strategy, json!("epoch")),
        }
    }
    if r.bool("model.gradient_checkpointing") == Some(true) {
        put(
            &["activation_checkpointing", "gradient_checkpointing"],
            json!(true),
        );
    }
    if r.bool("train.auto_find_batch_size") == Some(true) {
        put(&["auto_find_batch_size"], json!(true));
    }
    if r.word("optimizer.owner") == Some("hf") {
        let kind = r.choice("optimizer.kind");
        if fields.has("optim") {
            put(&["optim"], json!(hf_optim(kind)));
        } else if !r.facts.hf_optim_names.is_empty() {
            // `optim` exists from 4.16.0, between the sampled field lists of 4.6.1 and 4.24.0
            // (the facts table, src/upstream/versions.rs `HfOptimNames`): written last.
            unsampled_optim = Some(hf_optim(kind));
        } else if kind == "adafactor" {
            put(&["adafactor"], json!(true));
        }
        // The settings HF's optimizer reads only from `optim_args` (SGD's momentum and Nesterov,
        // Adagrad's eps, from transformers 5.3.0 on; src/upstream/hf_optimizers.rs).
        if let Some(args) = crate::upstream::hf_optimizers::optim_args(r) {
            put(&["optim_args"], json!(args));
        }
    }
    // `data.shuffle = false`: HF's `SequentialSampler` (transformers@v5.2.0 … v5.24.0
    // trainer.py:Trainer._get_train_sampler, `train_sampling_strategy == "sequential"`). Releases
    // before 5.2.0 have no such field: the generated train.py then returns a `SequentialSampler`
    // itself, and a recipe's own script is warned about (R0707).
    if r.bool("data.shuffle") == Some(false) && r.facts.hf_train_sampling_strategy {
        // By the facts table, not the sampled field lists (5.0.0 and 5.24.0: a 5.2 … 5.23 target
        // takes 5.0.0's list, which lacks the field).
        a.insert("train_sampling_strategy".into(), json!("sequential"));
    }
    if let Some(kw) = sched_kwargs {
        a.insert("lr_scheduler_kwargs".into(), kw);
    }
    if let Some(optim) = unsampled_optim {
        a.insert("optim".into(), json!(optim));
    }
    for (path, value, _) in &r.raw_hf {
        super::deepspeed::insert_path(&mut a, path, to_json(value));
    }
    Value::Object(a)
}
