//! What the real HF Trainer builds for `owner = hf` (conformance/fixtures/hf-optimizers.json,
//! written by conformance/hf_optimizers.py) agrees with the checker and the compiler: every key a
//! recipe gives either reaches the real optimizer with the recipe's value, or the recipe is refused
//! by R0415 (and the fixture shows the optimizer running with something else); kinds HF has no
//! optimizer for are R0402; and the TrainingArguments the fixture was built from are the ones the
//! compiler writes today. No Python needed.

use recipe::check::check_source;
use recipe::emit::{self, deepspeed::Style, Layout};
use recipe::resolve::{resolve, Options, Resolved, Val};
use recipe::rules::optimizer::{NO_HF_OPTIMIZER, SETTING_NOT_PASSED};
use recipe::upstream::hf_optimizers;
use recipe::SourceFile;
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conformance/fixtures/hf-optimizers.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// JSON equality where numbers compare by value (1 == 1.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

fn resolved(text: &str) -> (recipe::Checked, Option<Resolved>) {
    let checked = check_source(text);
    let r = checked
        .file
        .as_ref()
        .map(|f| resolve(f, &Options::default()));
    (checked, r)
}

/// The TrainingArguments the compiler writes for `text`.
fn emitted_args(text: &str) -> Value {
    let (checked, r) = resolved(text);
    assert!(!checked.has_errors(), "{text}: {:#?}", checked.diagnostics);
    let layout = Layout {
        recipe_dir_from_out: ".".into(),
        out_dir_from_recipe: ".".into(),
    };
    let files = emit::build(
        &r.unwrap(),
        &SourceFile::new("r.rcp", text.to_string()),
        &[],
        &layout,
        Style::Explicit,
    )
    .files;
    let (_, bytes) = files
        .iter()
        .find(|(n, _)| n == "training_args.json")
        .unwrap();
    serde_json::from_slice(bytes).unwrap()
}

/// A recipe value as JSON (`(0.9, 0.99)` is `[0.9, 0.99]`).
fn json(v: &Val) -> Value {
    match v {
        Val::Int(i) => Value::from(*i),
        Val::Float(f) => Value::from(*f),
        Val::Percent(p) => Value::from(p / 100.0),
        Val::Bool(b) => Value::from(*b),
        Val::Str(s) | Val::Word(s) => Value::from(s.clone()),
        Val::List(xs) => Value::Array(xs.iter().map(json).collect()),
        Val::Call { name, .. } => Value::from(name.clone()),
    }
}

/// What the real optimizer runs with for `key`, read from the fixture entry `e`, in the recipe's
/// terms; `None` when the entry says nothing of it.
fn real(e: &Value, key: &str, r: &Resolved) -> Option<Value> {
    let defaults = &e["defaults"];
    let class = e["class"].as_str().unwrap_or("");
    let groups = e["param_groups"].as_array()?;
    let group_of = |name: &str| {
        groups.iter().find(|g| {
            g["params"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p == name))
        })
    };
    match key {
        "lr" | "betas" | "eps" | "momentum" | "nesterov" | "amsgrad" => defaults.get(key).cloned(),
        "weight_decay" => group_of("dense.weight").map(|g| g["weight_decay"].clone()),
        // The parameters the real optimizer does not decay, against the ones `no_decay` names.
        "no_decay" => {
            let undecayed: Vec<&str> = groups
                .iter()
                .filter(|g| g["weight_decay"].as_f64() == Some(0.0))
                .flat_map(|g| g["params"].as_array().unwrap().iter())
                .filter_map(Value::as_str)
                .collect();
            let named: Vec<String> = r.strings("optimizer.no_decay");
            let all: Vec<&str> = groups
                .iter()
                .flat_map(|g| g["params"].as_array().unwrap().iter())
                .filter_map(Value::as_str)
                .collect();
            let agrees = all
                .iter()
                .all(|p| undecayed.contains(p) == named.iter().any(|n| p.contains(n.as_str())));
            Some(if agrees {
                json(r.val("optimizer.no_decay")?)
            } else {
                Value::from("the Trainer's grouping")
            })
        }
        // torch's AdamW always corrects the bias; HF builds torch's classes, not DeepSpeed's.
        "bias_correction" => Some(Value::from(class == "torch.optim.adamw.AdamW")),
        "torch_adam" => Some(Value::from(class.starts_with("torch.optim."))),
        _ => None,
    }
}

#[test]
fn what_the_real_trainer_builds_agrees_with_the_checker() {
    let f = fixture();
    assert_eq!(f["format"], "recipe-hf-optimizers/1");
    assert_eq!(f["stacks"]["venv"]["transformers"], "5.25.0");
    let entries = f["entries"].as_array().unwrap();
    let mut checked_keys = 0;
    let mut refusals = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let text = e["recipe"].as_str().unwrap();
        let (checked, r) = resolved(text);
        let r = r.unwrap();
        let kind = r.choice("optimizer.kind").to_string();
        kinds.insert(kind.clone());
        let codes: Vec<&str> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.code)
            .collect();
        // The fixture was made with today's checker.
        let recorded: Vec<&str> = e["check"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for c in &codes {
            assert!(
                recorded.contains(c),
                "{name}: {c} not in the fixture's {recorded:?}"
            );
        }
        if e["built_from"].is_null() {
            // No HF optimizer for this kind: R0402, and the table has no class.
            assert!(codes.contains(&NO_HF_OPTIMIZER), "{name}: {codes:?}");
            if kind != "adam" {
                assert!(hf_optimizers::class(&kind).is_none(), "{name}");
            }
            continue;
        }
        assert!(e.get("skipped").is_none(), "{name}: {}", e["skipped"]);
        assert!(
            e.get("error").is_none(),
            "{name}: HF refused: {}",
            e["error"]
        );
        // The TrainingArguments the real Trainer got are the ones the compiler writes today.
        let built = e
            .get("base")
            .and_then(Value::as_str)
            .unwrap_or(text)
            .to_string();
        let ours = emitted_args(&built);
        for (field, real_value) in e["args"].as_object().unwrap() {
            let mine = ours.get(field).cloned().unwrap_or(Value::Null);
            assert!(
                same(&mine, real_value),
                "{name}: {field} is {mine} today, the fixture was built with {real_value}"
            );
        }
        // The class HF built is the table's.
        let class = e["class"].as_str().unwrap();
        let table = hf_optimizers::class(&kind).unwrap();
        assert!(
            class.rsplit('.').next() == table.rsplit('.').next(),
            "{name}: HF built {class}, the table says {table}"
        );
        // Every given key: the real value, or R0415.
        let refused: Vec<&str> = checked
            .diagnostics
            .iter()
            .filter(|d| d.code == SETTING_NOT_PASSED)
            .map(|d| {
                hf_optimizers::KEYS
                    .iter()
                    .copied()
                    .find(|k| r.span(&format!("optimizer.{k}")) == Some(d.primary.span))
                    .unwrap_or_else(|| panic!("{name}: R0415 on no optimizer key"))
            })
            .collect();
        for key in hf_optimizers::KEYS {
            let dotted = format!("optimizer.{key}");
            if !r.is_given(&dotted) {
                continue;
            }
            if *key == "no_decay" && r.num("optimizer.weight_decay") == 0.0 {
                continue; // nothing decays: no_decay says nothing about the run
            }
            let want = json(r.val(&dotted).unwrap());
            let got = real(e, key, &r).unwrap_or_else(|| panic!("{name}: nothing about {key}"));
            checked_keys += 1;
            if refused.contains(key) {
                refusals += 1;
                assert!(
                    !same(&want, &got),
                    "{name}: R0415 refuses `{key}`, but HF runs with {got} as the recipe says"
                );
            } else {
                assert!(
                    same(&want, &got),
                    "{name}: `{key} = {want}` is accepted, but HF runs with {got}"
                );
            }
        }
    }
    // Every kind of the language is in the fixture; enough keys and refusals were compared.
    for kind in recipe::schema::blocks::OPTIMIZERS {
        assert!(kinds.contains(*kind), "no fixture entry for {kind}");
    }
    assert!(checked_keys >= 40, "{checked_keys}");
    assert!(refusals >= 6, "{refusals}");
}

/// The older stack shows what `Facts::hf_sgd_adagrad_optim_args` says: SGD and Adagrad built
/// from `lr` alone, whatever `optim_args` would hold.
#[test]
fn before_5_3_hf_builds_sgd_and_adagrad_from_lr_alone() {
    let f = fixture();
    let entries = f["entries"].as_array().unwrap();
    let old: Vec<&Value> = entries
        .iter()
        .filter(|e| e["stack"] == "transformers-4.48.0")
        .collect();
    assert!(!old.is_empty());
    assert_eq!(f["stacks"]["transformers-4.48.0"]["transformers"], "4.48.0");
    for e in old {
        let kwargs = e["handler"]["kwargs"].as_object().unwrap();
        if e["class"] != "torch.optim.adamw.AdamW" {
            assert_eq!(
                kwargs.keys().collect::<Vec<_>>(),
                vec!["lr"],
                "{}",
                e["name"]
            );
        }
    }
}
