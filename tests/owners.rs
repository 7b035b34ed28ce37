//! Issue 20's owner table (conformance/fixtures/owners.json, written by conformance/owners.py):
//! for every optimizer kind × owner and every schedule kind × owner, what the real stack built
//! (HF Trainer → accelerate → a DeepSpeed engine on the CPU) against what `recipe check` and
//! `recipe explain` state. This test re-runs check and explain on each recipe of
//! conformance/owners/ and asserts they still say what the fixture recorded, and that where the
//! fixture found them equal to the real run they still are. No Python needed.

use recipe::schema::blocks::{DS_SCHEDULES, HF_SCHEDULES, OPTIMIZERS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The tiny model's parameters (conformance/owners.py: BERT-like names).
const TINY_PARAMS: [&str; 6] = [
    "LayerNorm.bias",
    "LayerNorm.weight",
    "classifier.bias",
    "classifier.weight",
    "dense.bias",
    "dense.weight",
];

fn fixture() -> Value {
    let path = Path::new(ROOT).join("conformance/fixtures/owners.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn recipe(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8(o.stdout).unwrap(),
    )
}

/// `recipe check --format json`: exit code and the codes by severity.
fn check(path: &str) -> (i64, BTreeSet<String>, BTreeSet<String>) {
    let (code, out) = recipe(&["check", "--format", "json", path]);
    let mut errors = BTreeSet::new();
    let mut warnings = BTreeSet::new();
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let d: Value = serde_json::from_str(line).unwrap();
        let c = d["code"].as_str().unwrap().to_string();
        match d["severity"].as_str() {
            Some("error") => errors.insert(c),
            Some("warning") => warnings.insert(c),
            _ => false,
        };
    }
    (i64::from(code), errors, warnings)
}

fn explain(path: &str) -> Value {
    let (_, out) = recipe(&["explain", "--format", "json", path]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: explain: {e}"))
}

fn setting<'a>(ex: &'a Value, key: &str) -> Option<&'a Value> {
    ex["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .map(|s| &s["json"])
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Numbers equal within 1e-9 relative, arrays element-wise, anything else exactly.
fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close(p, q))
        }
        _ => a == b,
    }
}

/// Explain's LR per step on the side that builds the schedule.
fn lr_list(ex: &Value) -> Vec<Value> {
    let side = ex["schedule_owner"].as_str().unwrap_or("hf");
    ex["lr"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[side].clone())
        .collect()
}

/// "steps 1–N run at …" in explain's schedule note: the steps whose LR does not depend on the
/// metric of a metric-driven schedule.
fn metric_free_steps(ex: &Value) -> Option<u64> {
    for n in ex["notes"].as_array().unwrap() {
        let n = n.as_str().unwrap();
        if !n.starts_with("schedule") {
            continue;
        }
        if let Some(i) = n.find("steps 1–") {
            let rest = &n[i + "steps 1–".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if rest[digits.len()..].starts_with(" run at") {
                return digits.parse().ok();
            }
        }
        if n.contains("step 1 runs at") {
            return Some(1);
        }
    }
    None
}

#[test]
fn owner_table_still_holds() {
    let f = fixture();
    assert_eq!(f["format"], "recipe-conformance-owners/1");
    assert_eq!(f["versions"]["transformers"], "5.25.0");
    assert_eq!(f["versions"]["deepspeed"], "0.19.8");
    let records = f["records"].as_array().unwrap();
    let mut seen = BTreeSet::new();
    let mut compared_lr = 0;
    let mut compared_opt = 0;
    for rec in records {
        let name = rec["name"].as_str().unwrap();
        let path = rec["recipe"].as_str().unwrap();
        if rec["variant"].is_null() {
            seen.insert((
                rec["table"].as_str().unwrap().to_string(),
                rec["kind"].as_str().unwrap().to_string(),
                rec["owner"].as_str().unwrap().to_string(),
            ));
        }
        // The checker's verdict and codes are the fixture's.
        let (exit, errors, warnings) = check(path);
        assert_eq!(exit, rec["check"]["exit"].as_i64().unwrap(), "{name}: exit");
        assert_eq!(
            errors,
            strings(&rec["check"]["errors"]),
            "{name}: error codes"
        );
        assert_eq!(
            warnings,
            strings(&rec["check"]["warnings"]),
            "{name}: warning codes"
        );
        let ex = explain(path);
        let recorded = &rec["explain"];
        for (k, v) in recorded["optimizer"].as_object().unwrap() {
            let today = setting(&ex, &format!("optimizer.{k}")).unwrap_or(&Value::Null);
            assert!(close(today, v), "{name}: optimizer.{k} is {today}, was {v}");
        }
        assert_eq!(
            ex["schedule_owner"], recorded["schedule"]["owner"],
            "{name}: schedule owner"
        );
        let lr = lr_list(&ex);
        assert!(
            close(&Value::Array(lr.clone()), &recorded["lr"]),
            "{name}: explain's LR per step changed"
        );
        if rec["verdict"] == "refused" {
            assert!(!errors.is_empty(), "{name}");
            assert!(
                !rec["evidence"].as_array().unwrap().is_empty(),
                "{name}: a refusal without evidence"
            );
            continue;
        }
        assert_eq!(rec["verdict"], "accepted", "{name}");
        let real = &rec["real"];
        if real.get("error").is_some() {
            // Refused by the real stack (a hole: equal false) or not buildable on the CPU
            // (equal null: DeepSpeed's fused LAMB / Lion have no CPU kernel).
            assert_ne!(rec["equal"], true, "{name}");
            continue;
        }
        let real_lr = real["lr"].as_array().unwrap();
        if rec["kind"] == "reduce_lr_on_plateau" || rec["kind"] == "greedy" {
            // Explain cannot know the metric: it states the steps before the first possible
            // change, and those ran at its LR.
            let n = metric_free_steps(&ex).unwrap_or_else(|| panic!("{name}: no metric note"));
            assert_eq!(
                Some(n),
                rec["metric_free_steps"].as_u64(),
                "{name}: metric-free steps"
            );
            let n = n as usize;
            assert!(
                close(
                    &Value::from(lr[..n].to_vec()),
                    &Value::from(real_lr[..n].to_vec())
                ),
                "{name}: steps 1–{n} differ from the real run"
            );
            compared_lr += 1;
        } else if rec["equal"] == true {
            assert!(
                close(&Value::Array(lr.clone()), &Value::Array(real_lr.clone())),
                "{name}: explain's LR per step no longer matches the real run"
            );
            compared_lr += 1;
        }
        if rec["table"] == "optimizer" && rec["optimizer_equal"] == true {
            assert_eq!(real["built_by"], recorded["optimizer"]["owner"], "{name}");
            for k in ["lr", "betas", "eps", "weight_decay", "momentum"] {
                let Some(today) = setting(&ex, &format!("optimizer.{k}")) else {
                    continue;
                };
                if today.is_null() {
                    continue;
                }
                let got = if k == "lr" {
                    &real["constructor_lr"]
                } else {
                    &real[k]
                };
                assert!(
                    close(today, got),
                    "{name}: explain says {k} = {today}, the real optimizer has {got}"
                );
            }
            // `no_decay`: the parameters it names are the ones the real optimizer does not decay.
            let decays = setting(&ex, "optimizer.weight_decay")
                .and_then(Value::as_f64)
                .is_some_and(|w| w > 0.0);
            if let (true, Some(nd)) = (decays, setting(&ex, "optimizer.no_decay")) {
                let names = strings(nd);
                let said: BTreeSet<String> = TINY_PARAMS
                    .iter()
                    .filter(|p| names.iter().any(|n| p.contains(n.as_str())))
                    .map(|p| p.to_string())
                    .collect();
                let got: BTreeSet<String> = real["no_decay_groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(strings)
                    .collect();
                assert_eq!(said, got, "{name}: no_decay against the real groups");
            }
            compared_opt += 1;
        }
    }
    // Every kind × owner of the language has a record.
    for kind in OPTIMIZERS {
        for owner in ["hf", "deepspeed"] {
            let key = ("optimizer".to_string(), kind.to_string(), owner.to_string());
            assert!(
                seen.contains(&key),
                "no record for optimizer {kind} × {owner}"
            );
        }
    }
    for kind in HF_SCHEDULES.iter().chain(DS_SCHEDULES) {
        for owner in ["hf", "deepspeed"] {
            let key = ("schedule".to_string(), kind.to_string(), owner.to_string());
            assert!(
                seen.contains(&key),
                "no record for schedule {kind} × {owner}"
            );
        }
    }
    assert!(compared_lr >= 30, "{compared_lr}");
    assert!(compared_opt >= 5, "{compared_opt}");
}
