//! A setting's value when neither the recipe nor a flag gives it. The schema says what each
//! default is ([`crate::schema::KeyDefault`]); this module turns a literal into a value and
//! computes the derived ones from what is resolved so far (blocks resolve in schema order, so
//! earlier blocks are available).

use super::value::{fmt_f64, Source, Val};
use super::Resolved;
use crate::schema::{Derive, KeyDefault, Lit};

/// A schema literal as a resolved value.
pub fn lit(v: Lit) -> Val {
    match v {
        Lit::Int(i) => Val::Int(i),
        Lit::Float(f) => Val::Float(f),
        Lit::Bool(b) => Val::Bool(b),
        Lit::Word(w) => Val::Word(w.to_string()),
        Lit::Str(s) => Val::Str(s.to_string()),
        Lit::Floats(xs) => Val::List(xs.iter().map(|x| Val::Float(*x)).collect()),
        Lit::Strs(xs) => Val::List(xs.iter().map(|x| Val::Str((*x).to_string())).collect()),
    }
}

fn derived(value: Val, rule: &str, inputs: Vec<String>) -> Option<(Val, Source)> {
    Some((
        value,
        Source::Derived {
            rule: rule.to_string(),
            inputs,
        },
    ))
}

/// The default of a setting whose schema default is `spec`; `None` when the schema gives none
/// here (no default, one supplied by a later step, or the upstream library's own).
pub fn default(spec: KeyDefault, r: &Resolved) -> Option<(Val, Source)> {
    match spec {
        KeyDefault::Value(v, why) => Some((
            lit(v),
            Source::Default {
                reason: why.to_string(),
            },
        )),
        KeyDefault::Derived(rule, _) => derive(rule, r),
        KeyDefault::None | KeyDefault::Later(_) | KeyDefault::Upstream(..) => None,
    }
}

fn derive(rule: Derive, r: &Resolved) -> Option<(Val, Source)> {
    let w = |s: &str| Val::Word(s.to_string());
    let lr = || {
        r.f64("optimizer.lr").and_then(|lr| {
            derived(
                Val::Float(lr),
                "the optimizer's learning rate",
                vec![format!("optimizer.lr = {}", fmt_f64(lr))],
            )
        })
    };
    let hidden = r.int("model.hidden_size");
    let from_hidden = |value: i64, rule: &str| {
        derived(
            Val::Int(value),
            rule,
            vec![format!("model.hidden_size = {}", hidden.unwrap_or(0))],
        )
    };
    let fallback = |value: i64, why: &str| {
        Some((
            Val::Int(value),
            Source::Default {
                reason: why.to_string(),
            },
        ))
    };
    match rule {
        Derive::FormatFromExtension => {
            let train = r.str("data.train").unwrap_or("");
            let fmt = recipe_runtime::data::Format::from_extension(train)
                .unwrap_or(recipe_runtime::data::Format::Jsonl);
            derived(
                w(fmt.name()),
                "from the training file's extension",
                vec![format!("data.train = \"{train}\"")],
            )
        }
        Derive::TrainingMicro => r.int("batch.micro").and_then(|m| {
            derived(
                Val::Int(m),
                "the training micro batch",
                vec![format!("batch.micro = {m}")],
            )
        }),
        Derive::OptimizerLr => lr(),
        Derive::CosineCycles => Some(match r.word("schedule.kind") {
            Some("cosine_with_restarts") => (
                Val::Float(1.0),
                Source::Default {
                    reason: "HF cosine_with_restarts".into(),
                },
            ),
            _ => (
                Val::Float(0.5),
                Source::Default {
                    reason: "HF cosine".into(),
                },
            ),
        }),
        Derive::TrainingPrecision => r.word("train.precision").and_then(|p| {
            derived(
                w(p),
                "the training precision",
                vec![format!("train.precision = {p}")],
            )
        }),
        Derive::OutputDir => {
            let name = r.text("recipe.name");
            derived(
                Val::Str(format!("out/{name}")),
                "out/<recipe name>",
                vec![format!("recipe.name = \"{name}\"")],
            )
        }
        // HF's Trainer refuses an evaluation strategy without evaluation data.
        Derive::EvalEvery => match r.str("data.eval") {
            Some(e) => derived(
                w("epoch"),
                "evaluate at each epoch end when there is evaluation data",
                vec![format!("data.eval = \"{e}\"")],
            ),
            None => derived(w("never"), "no evaluation data (data.eval)", vec![]),
        },
        // transformers hands DeepSpeed `model.parameters()` as one flat list
        // (huggingface/transformers@v5.24.0 integrations/deepspeed.py:deepspeed_init,
        // `DummyOptim(params=model_parameters)`), so DeepSpeed's optimizer decays every tensor;
        // HF's own optimizer gets its two groups (trainer.py:Trainer.create_optimizer).
        Derive::NoDecay => match r.word("optimizer.owner") {
            Some("hf") => Some((
                Val::List(
                    crate::schema::blocks::HF_NO_DECAY
                        .iter()
                        .map(|s| Val::Str((*s).to_string()))
                        .collect(),
                ),
                Source::Default {
                    reason: "HF Trainer's grouping: no decay for biases and LayerNorm weights"
                        .into(),
                },
            )),
            owner => derived(
                Val::List(Vec::new()),
                "DeepSpeed builds the optimizer over one parameter group: every tensor decays",
                vec![format!(
                    "optimizer.owner = {}",
                    owner.unwrap_or("deepspeed")
                )],
            ),
        },
        Derive::Stage3 => {
            let stage = r.integer("zero.stage");
            derived(
                Val::Bool(stage == 3),
                "DeepSpeed: true for stage 3, else false",
                vec![format!("zero.stage = {stage}")],
            )
        }
        Derive::HiddenSquared => match hidden {
            Some(h) => from_hidden(h * h, "hidden_size² (HF's auto value)"),
            None => fallback(500_000_000, "DeepSpeed reduce_bucket_size 5e8"),
        },
        Derive::PrefetchBucket => match hidden {
            Some(h) => from_hidden(
                (0.9 * (h * h) as f64) as i64,
                "int(0.9 × hidden_size²) (HF's auto value)",
            ),
            None => fallback(50_000_000, "DeepSpeed stage3_prefetch_bucket_size 5e7"),
        },
        Derive::PersistenceThreshold => match hidden {
            Some(h) => from_hidden(10 * h, "10 × hidden_size (HF's auto value)"),
            None => fallback(100_000, "DeepSpeed stage3_param_persistence_threshold 1e5"),
        },
    }
}
