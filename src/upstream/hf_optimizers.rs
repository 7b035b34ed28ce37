//! Which optimizer settings reach the optimizer that is built, key by key, per target release
//! (docs/rules/schedule-optimizer.md, "What reaches the optimizer HF builds").
//!
//! With `owner = hf` the Trainer builds the optimizer from `TrainingArguments`
//! (huggingface/transformers@v5.24.0 src/transformers/trainer.py:Trainer.create_optimizer and
//! Trainer.get_optimizer_cls_and_kwargs, which dispatch to
//! src/transformers/trainer_optimizer.py:_OPTIMIZER_HANDLERS): `lr` from `learning_rate`, AdamW's
//! and Lion's `betas` / AdamW's `eps` from `adam_beta1/2` / `adam_epsilon`, `weight_decay` through
//! its two parameter groups, and, for SGD and Adagrad from transformers 5.3.0 on, a few arguments
//! parsed from `optim_args`. Every other setting is never passed: the optimizer runs with its
//! constructor's default. The compiler writes `optim_args` ([`optim_args`]); the optimizer rules
//! refuse a given setting that is never passed ([`dropped`], R0415); `conformance/hf_optimizers.py`
//! records the real Trainer building each kind (conformance/fixtures/hf-optimizers.json), and
//! tests/hf_optimizers.rs checks the two agree.
//!
//! One DeepSpeed-built case belongs here too: with `torch_adam = true` DeepSpeed hands every
//! `optimizer.params` entry (lr, betas, eps, weight_decay, amsgrad) to `torch.optim.Adam`/`AdamW`
//! (deepspeedai/DeepSpeed@v0.19.8 deepspeed/runtime/engine.py:DeepSpeedEngine._configure_basic_optimizer
//! and get_optimizer_configuration), which has no `bias_correction`, so the compiler leaves it
//! out (src/emit/deepspeed.rs).

use crate::resolve::{Resolved, Val};
use crate::upstream::versions::Facts;

/// How a recipe setting reaches the optimizer HF builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Route {
    /// A constructor argument taken from a TrainingArguments field.
    Field(&'static str),
    /// The `weight_decay` of the Trainer's two parameter groups (`Trainer.create_optimizer`:
    /// `args.weight_decay` for the decaying parameters, 0 for the rest).
    ParamGroups,
    /// An `optim_args` entry the target release parses for this optimizer (the compiler writes
    /// it from the recipe's key).
    OptimArgs(&'static str),
    /// Never passed: the optimizer runs with this instead.
    Dropped(Runs),
}

/// What the built optimizer runs with for a setting that never reaches it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Runs {
    /// A boolean constructor default (or, for `torch_adam`, what is built).
    Bool(bool),
    /// A numeric constructor default.
    Num(f64),
    /// The Trainer's own parameter grouping (`Trainer.get_decay_parameter_names`: no decay for
    /// biases and normalization layers), which the recipe's default `no_decay` stands for.
    HfGrouping,
}

impl Runs {
    /// Whether `given` is what the optimizer runs with anyway (so stating it is harmless).
    pub fn agrees(self, given: &Val) -> bool {
        match self {
            Runs::Bool(b) => given.as_bool() == Some(b),
            Runs::Num(x) => given.as_f64() == Some(x),
            Runs::HfGrouping => {
                let names = |v: &Val| -> Option<Vec<String>> {
                    let Val::List(items) = v else { return None };
                    let mut out: Vec<String> = items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect::<Option<_>>()?;
                    out.sort();
                    out.dedup();
                    Some(out)
                };
                let hf = Val::List(
                    crate::schema::blocks::HF_NO_DECAY
                        .iter()
                        .map(|s| Val::Str((*s).to_string()))
                        .collect(),
                );
                names(&hf).is_some() && names(&hf) == names(given)
            }
        }
    }

    /// The value, as the recipe would write it.
    pub fn describe(self) -> String {
        match self {
            Runs::Bool(b) => b.to_string(),
            Runs::Num(x) => crate::resolve::value::fmt_f64(x),
            Runs::HfGrouping => "the Trainer's grouping".into(),
        }
    }
}

/// The class HF builds for a recipe optimizer kind (`TrainingArguments.optim` as the compiler
/// writes it, src/emit/training_args.rs `hf_optim`); `None` for kinds HF's `optim` lacks
/// (R0402).
pub fn class(kind: &str) -> Option<&'static str> {
    Some(match kind {
        // adamw_torch: trainer_optimizer.py:_get_adamw_torch
        "adamw" | "adam" => "torch.optim.AdamW",
        // sgd: _get_sgd
        "sgd" => "torch.optim.SGD",
        // adagrad: _get_adagrad
        "adagrad" => "torch.optim.Adagrad",
        // lion_32bit: _get_bitsandbytes_optimizer (bitsandbytes must be installed)
        "lion" => "bitsandbytes.optim.Lion",
        // adafactor: _get_adafactor (scale_parameter=False, relative_step=False)
        "adafactor" => "transformers.optimization.Adafactor",
        _ => return None,
    })
}

/// The `optimizer` keys [`route`] speaks of (the block's other keys are the kind, `owner`, and
/// the DeepSpeed-only ones of the kinds HF lacks).
pub const KEYS: &[&str] = &[
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "no_decay",
    "momentum",
    "nesterov",
    "bias_correction",
    "amsgrad",
    "torch_adam",
];

/// How the `optimizer` key `key` reaches the optimizer HF builds for `kind` on the release whose
/// facts are `facts`; `None` when the key does not apply to the kind (the schema's `kinds`) or
/// HF has no such optimizer. Read in huggingface/transformers@v5.24.0
/// src/transformers/trainer_optimizer.py (`_get_adamw_torch`, `_get_sgd`, `_get_adagrad`,
/// `_get_bitsandbytes_optimizer`, `_get_adafactor`) and trainer.py:Trainer.create_optimizer;
/// v5.2.0 and earlier build SGD and Adagrad with `lr` alone
/// ([`Facts::hf_sgd_adagrad_optim_args`]).
pub fn route(kind: &str, key: &str, facts: &Facts) -> Option<Route> {
    class(kind)?;
    let spec = crate::schema::block("optimizer")?.key(key)?;
    if !KEYS.contains(&key) || !spec.applies_to(Some(kind)) {
        return None;
    }
    let optim_args = facts.hf_sgd_adagrad_optim_args;
    Some(match (kind, key) {
        (_, "lr") => Route::Field("learning_rate"),
        (_, "weight_decay") => Route::ParamGroups,
        (_, "no_decay") => Route::Dropped(Runs::HfGrouping),
        // AdamW: `adam_kwargs`; bitsandbytes Lion: betas only.
        ("adamw" | "adam" | "lion", "betas") => Route::Field("adam_beta1, adam_beta2"),
        ("adamw" | "adam", "eps") => Route::Field("adam_epsilon"),
        ("adagrad", "eps") if optim_args => Route::OptimArgs("eps"),
        // torch.optim.Adagrad's default eps.
        ("adagrad", "eps") => Route::Dropped(Runs::Num(1e-10)),
        ("sgd", "momentum") if optim_args => Route::OptimArgs("momentum"),
        ("sgd", "momentum") => Route::Dropped(Runs::Num(0.0)),
        ("sgd", "nesterov") if optim_args => Route::OptimArgs("nesterov"),
        ("sgd", "nesterov") => Route::Dropped(Runs::Bool(false)),
        // torch.optim.AdamW always corrects the bias and defaults amsgrad to false; HF passes
        // neither, and builds torch's AdamW, never DeepSpeed's fused kernel.
        (_, "bias_correction") => Route::Dropped(Runs::Bool(true)),
        (_, "amsgrad") => Route::Dropped(Runs::Bool(false)),
        (_, "torch_adam") => Route::Dropped(Runs::Bool(true)),
        _ => return None,
    })
}

/// A setting the recipe gives that the built optimizer never receives, with a value other than
/// the one it runs with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropped {
    /// The `optimizer` key.
    pub key: &'static str,
    /// What the optimizer runs with instead.
    pub runs: Runs,
}

/// The given settings that never reach the optimizer the run builds: with `owner = hf` every
/// [`Route::Dropped`] key the recipe states with another value than the optimizer runs with
/// (`no_decay` only while something decays); with `owner = deepspeed` and `torch_adam = true`,
/// `bias_correction = false`, which torch's Adam has no argument for. Nothing for the kinds HF
/// lacks (R0402 refuses them).
pub fn dropped(r: &Resolved) -> Vec<Dropped> {
    let kind = r.choice("optimizer.kind");
    let given = |key: &str| {
        let name = format!("optimizer.{key}");
        r.is_given(&name).then(|| r.val(&name)).flatten()
    };
    let mut out = Vec::new();
    // A release without `TrainingArguments.optim` (4.6.1) builds AdamW whatever the kind: not a
    // question of settings, and not this table's.
    let has_optim =
        crate::schema::upstream_versions::HfFields::for_target(r.targets.transformers).has("optim");
    match r.word("optimizer.owner") {
        Some("hf") if has_optim => {
            for key in KEYS {
                let Some(Route::Dropped(runs)) = route(kind, key, &r.facts) else {
                    continue;
                };
                if *key == "no_decay" && r.num("optimizer.weight_decay") == 0.0 {
                    continue;
                }
                if given(key).is_some_and(|v| !runs.agrees(v)) {
                    out.push(Dropped { key, runs });
                }
            }
        }
        Some("deepspeed") if matches!(kind, "adam" | "adamw") => {
            let torch = r.bool("optimizer.torch_adam") == Some(true);
            let runs = Runs::Bool(true);
            if torch && given("bias_correction").is_some_and(|v| !runs.agrees(v)) {
                out.push(Dropped {
                    key: "bias_correction",
                    runs,
                });
            }
        }
        _ => {}
    }
    out
}

/// One `optim_args` value as `_parse_optim_args` hands it on: `float(value)` for numbers,
/// `value.lower() in ("true", "1", "yes")` for booleans.
fn arg_value(v: &Val) -> Option<String> {
    match v {
        Val::Bool(b) => Some(if *b { "True" } else { "False" }.into()),
        // `{:?}` keeps a decimal point or exponent and round-trips through Python's float().
        _ => v.as_f64().map(|x| format!("{x:?}")),
    }
}

/// The `optim_args` the compiler writes when HF builds the optimizer: each given key the target
/// release reads from it for that optimizer ([`Route::OptimArgs`]), `name=value` joined by
/// commas (huggingface/transformers@v5.24.0 src/transformers/trainer_optimizer.py:_parse_optim_args
/// splits on "," and "="). `None` when there is nothing to write.
pub fn optim_args(r: &Resolved) -> Option<String> {
    if r.word("optimizer.owner") != Some("hf") {
        return None;
    }
    let kind = r.choice("optimizer.kind");
    let pairs: Vec<String> = KEYS
        .iter()
        .filter_map(|key| {
            let Some(Route::OptimArgs(name)) = route(kind, key, &r.facts) else {
                return None;
            };
            let dotted = format!("optimizer.{key}");
            if !r.is_given(&dotted) {
                return None;
            }
            Some(format!("{name}={}", arg_value(r.val(&dotted)?)?))
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs.join(","))
}

/// The recipe key an `optim_args` entry of HF's optimizer for `kind` stands for, on the release
/// whose facts are `facts` (for `recipe import` and R0411's help).
pub fn key_for_optim_arg(kind: &str, name: &str, facts: &Facts) -> Option<&'static str> {
    KEYS.iter()
        .copied()
        .find(|key| matches!(route(kind, key, facts), Some(Route::OptimArgs(n)) if n == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::versions::Targets;

    fn facts(tf: &str) -> Facts {
        let mut t = Targets::newest();
        t.transformers = tf.parse().unwrap();
        Facts::for_targets(&t)
    }

    #[test]
    fn sgd_and_adagrad_read_optim_args_from_5_3_0() {
        let new = facts("5.3.0");
        let old = facts("5.2.0");
        assert!(new.hf_sgd_adagrad_optim_args && !old.hf_sgd_adagrad_optim_args);
        assert!(Facts::for_targets(&Targets::newest()).hf_sgd_adagrad_optim_args);
        assert_eq!(
            route("sgd", "momentum", &new),
            Some(Route::OptimArgs("momentum"))
        );
        assert_eq!(
            route("sgd", "momentum", &old),
            Some(Route::Dropped(Runs::Num(0.0)))
        );
        assert_eq!(route("adagrad", "eps", &new), Some(Route::OptimArgs("eps")));
        assert_eq!(
            route("adagrad", "eps", &old),
            Some(Route::Dropped(Runs::Num(1e-10)))
        );
        assert_eq!(key_for_optim_arg("sgd", "nesterov", &new), Some("nesterov"));
        assert_eq!(key_for_optim_arg("sgd", "dampening", &new), None);
        assert_eq!(key_for_optim_arg("sgd", "momentum", &old), None);
    }

    #[test]
    fn the_table_covers_every_kind_hf_builds() {
        let f = facts("5.24.0");
        for kind in crate::schema::blocks::OPTIMIZERS {
            let routes: Vec<_> = KEYS.iter().filter_map(|k| route(kind, k, &f)).collect();
            match class(kind) {
                None => assert!(routes.is_empty(), "{kind}"),
                // lr, weight_decay and no_decay apply to every kind.
                Some(_) => assert!(routes.len() >= 3, "{kind}: {routes:?}"),
            }
        }
        assert_eq!(
            route("adamw", "amsgrad", &f),
            Some(Route::Dropped(Runs::Bool(false)))
        );
        assert_eq!(route("lion", "eps", &f), None);
        assert_eq!(
            route("lion", "betas", &f),
            Some(Route::Field("adam_beta1, adam_beta2"))
        );
        assert_eq!(route("lamb", "lr", &f), None);
    }

    #[test]
    fn optim_args_values_parse_as_python_floats_and_bools() {
        assert_eq!(arg_value(&Val::Float(0.9)).unwrap(), "0.9");
        assert_eq!(arg_value(&Val::Int(1)).unwrap(), "1.0");
        assert_eq!(arg_value(&Val::Float(1e-6)).unwrap(), "1e-6");
        assert_eq!(arg_value(&Val::Bool(true)).unwrap(), "True");
        assert!(arg_value(&Val::Str("x".into())).is_none());
    }

    #[test]
    fn no_decay_agrees_with_the_trainers_grouping_only_as_the_default() {
        let list = |xs: &[&str]| Val::List(xs.iter().map(|x| Val::Str(x.to_string())).collect());
        assert!(Runs::HfGrouping.agrees(&list(&["LayerNorm.weight", "bias"])));
        assert!(!Runs::HfGrouping.agrees(&list(&["bias"])));
        assert!(!Runs::HfGrouping.agrees(&Val::Bool(true)));
    }
}
