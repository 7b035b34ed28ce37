//! docs/outputs.md and docs/metrics.schema.json are true of what the commands write: a real
//! run's metrics.jsonl (a fresh start stopped with a checkpoint, then resumed to the end, in
//! fp16 with eval and test files, so every kind of record is written) validates against the
//! schema, and every field name of metrics.jsonl, plan.json, recipe.lock and the JSON of
//! `explain` and `steps` is named in docs/outputs.md.

use crate::common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/outputs.md")).unwrap()
}

fn schema() -> Value {
    let text = std::fs::read_to_string(root().join("docs/metrics.schema.json")).unwrap();
    serde_json::from_str(&text).expect("docs/metrics.schema.json is JSON")
}

// ---- a small JSON Schema validator: the keywords docs/metrics.schema.json uses --------------

/// The keywords [`validate`] understands; a schema with any other is refused, so that the
/// schema cannot say something this test does not check.
const KEYWORDS: &[&str] = &[
    "$schema",
    "title",
    "description",
    "$defs",
    "$ref",
    "oneOf",
    "type",
    "const",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "minimum",
    "maximum",
];

fn resolve<'s>(root: &'s Value, schema: &'s Value) -> &'s Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r
                .strip_prefix("#/$defs/")
                .unwrap_or_else(|| panic!("unsupported $ref {r}"));
            resolve(root, &root["$defs"][name])
        }
        None => schema,
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_u64() || v.is_i64(),
        other => panic!("unsupported type {other}"),
    }
}

/// Why `v` does not match `schema` (empty: it does).
fn validate(root: &Value, schema: &Value, v: &Value, at: &str) -> Vec<String> {
    let schema = resolve(root, schema);
    let obj = schema.as_object().expect("a schema is an object");
    for k in obj.keys() {
        assert!(KEYWORDS.contains(&k.as_str()), "unsupported keyword {k}");
    }
    let mut errors = Vec::new();
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = alts
            .iter()
            .filter(|s| validate(root, s, v, at).is_empty())
            .count();
        if matching != 1 {
            errors.push(format!("{at}: matches {matching} of oneOf, not exactly 1"));
        }
    }
    if let Some(ty) = schema.get("type") {
        let ok = match ty {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)),
            _ => panic!("bad type"),
        };
        if !ok {
            errors.push(format!("{at}: {v} is not {ty}"));
            return errors;
        }
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            errors.push(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errors.push(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(x)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if x < min {
            errors.push(format!("{at}: {x} < {min}"));
        }
    }
    if let (Some(max), Some(x)) = (schema.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if x > max {
            errors.push(format!("{at}: {x} > {max}"));
        }
    }
    if let Some(map) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !map.contains_key(r.as_str().unwrap()) {
                errors.push(format!("{at}: `{r}` is missing"));
            }
        }
        for (k, x) in map {
            match props.and_then(|p| p.get(k)) {
                Some(s) => errors.extend(validate(root, s, x, &format!("{at}.{k}"))),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    errors.push(format!("{at}: `{k}` is not in the schema"))
                }
                None => {}
            }
        }
    }
    errors
}

#[test]
fn the_validator_refuses_what_the_schema_does_not_allow() {
    let s = schema();
    let step = serde_json::json!({
        "step": 1, "epoch": 1, "loss": 0.7, "lr": 0.0, "grad_norm": null, "samples_per_s": 3.0
    });
    assert_eq!(validate(&s, &s, &step, "$"), Vec::<String>::new());
    let mut extra = step.clone();
    extra["surprise"] = Value::Bool(true);
    assert!(!validate(&s, &s, &extra, "$").is_empty());
    let mut missing = step.clone();
    missing.as_object_mut().unwrap().remove("lr");
    assert!(!validate(&s, &s, &missing, "$").is_empty());
    let wrong = serde_json::json!({ "event": "end", "steps": { "taken": 1 }, "model": "m" });
    assert!(!validate(&s, &s, &wrong, "$").is_empty());
}

/// The kind of a metrics record: its `event`, else which of `eval`, `test`, `checkpoint` it
/// has, else a step record.
fn kind(r: &Value) -> &str {
    if let Some(e) = r.get("event").and_then(Value::as_str) {
        return e;
    }
    ["eval", "test", "checkpoint"]
        .into_iter()
        .find(|k| r.get(k).is_some())
        .unwrap_or("step")
}

fn all_kinds() -> BTreeSet<&'static str> {
    BTreeSet::from([
        "start",
        "resume",
        "step",
        "eval",
        "test",
        "checkpoint",
        "end",
    ])
}

#[test]
fn the_docs_example_records_match_the_schema() {
    let doc = doc();
    let mut lines = Vec::new();
    let mut inside = false;
    for line in doc.lines() {
        match (inside, line.trim()) {
            (false, "```jsonl") => inside = true,
            (true, "```") => inside = false,
            (true, l) => lines.push(l.to_string()),
            _ => {}
        }
    }
    let s = schema();
    let mut kinds = BTreeSet::new();
    for l in &lines {
        let r: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        let errors = validate(&s, &s, &r, "$");
        assert!(errors.is_empty(), "{l}\n{}", errors.join("\n"));
        kinds.insert(kind(&r).to_string());
    }
    let kinds: BTreeSet<&str> = kinds.iter().map(String::as_str).collect();
    assert_eq!(
        kinds,
        all_kinds(),
        "docs/outputs.md shows one of each record"
    );
}

// ---- the real outputs ------------------------------------------------------------------------

/// [`TINY`] in fp16 with an eval and a test file and a checkpoint every 3 steps.
fn recipe() -> String {
    let r = tiny_with_data(
        "data { train = \"train.jsonl\", eval = \"eval.jsonl\", test = \"eval.jsonl\", max_len = 24 }",
    );
    let old = "precision = fp32,";
    assert!(r.contains(old));
    r.replace(old, "precision = fp16, save_every = 3,")
}

#[test]
fn metrics_records_match_the_schema_and_the_docs() {
    let dir = workspace("outputs-metrics", &recipe());
    // With a peak, so that the records carry MFU and the peak too.
    let peak = [("RECIPE_PEAK_TFLOPS", "0.5")];
    let o = recipe_in_env(
        &dir,
        &peak,
        &["run", "--quiet", "--stop-after", "2", "tiny.rcp"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = recipe_in_env(
        &dir,
        &peak,
        &["run", "--quiet", "--resume", "out/checkpoint-2", "tiny.rcp"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let records = metrics(&dir.join("out"));
    let s = schema();
    let mut kinds = BTreeSet::new();
    for (i, r) in records.iter().enumerate() {
        let errors = validate(&s, &s, r, &format!("line {}", i + 1));
        assert!(errors.is_empty(), "{r}\n{}", errors.join("\n"));
        kinds.insert(kind(r));
    }
    assert_eq!(
        kinds,
        all_kinds(),
        "every kind of record is written by this run"
    );
    // An evaluation's time is measured: its rate is its rows over it.
    for e in records
        .iter()
        .filter_map(|r| r.get("eval").or(r.get("test")))
    {
        let (seconds, rate) = (
            e["seconds"].as_f64().unwrap(),
            e["samples_per_s"].as_f64().unwrap(),
        );
        let rows = e["rows"].as_f64().unwrap();
        assert!(
            seconds > 0.0 && (rate * seconds - rows).abs() <= 1e-6 * rows,
            "{e}"
        );
    }
    // Every field of every record is named in docs/outputs.md.
    let doc = doc();
    let mut missing = BTreeSet::new();
    for r in &records {
        for k in keys(r) {
            if !doc.contains(&format!("`{k}`")) {
                missing.insert(k);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/outputs.md does not name {missing:?}"
    );
}

/// Every object key in `v`, at any depth.
fn keys(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.insert(k.clone());
                out.extend(keys(x));
            }
        }
        Value::Array(items) => items.iter().for_each(|x| out.extend(keys(x))),
        _ => {}
    }
    out
}

#[test]
fn every_field_of_the_json_outputs_is_documented() {
    let dir = workspace("outputs-fields", &recipe());
    let mut found: Vec<(&str, BTreeSet<String>)> = Vec::new();
    let o = recipe_in(
        &dir,
        &["build", "--target", "native", "-o", "native", "tiny.rcp"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("native/plan.json")).unwrap())
            .unwrap();
    found.push(("plan.json", keys(&plan)));
    let o = recipe_in(&dir, &["build", "-o", "ds", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lock: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ds/recipe.lock")).unwrap())
            .unwrap();
    // The lock's settings are `[key, {value, from}]` pairs; the values are the recipe's.
    let mut lock_keys: BTreeSet<String> = lock.as_object().unwrap().keys().cloned().collect();
    lock_keys.extend(["value".to_string(), "from".to_string()]);
    found.push(("recipe.lock", lock_keys));
    let o = recipe_in(
        &dir,
        &[
            "diff",
            "--format",
            "json",
            "ds/recipe.lock",
            "ds/recipe.lock",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout_json(&o), serde_json::json!([]));
    for args in [
        &["explain", "--format", "json", "tiny.rcp"][..],
        &["explain", "--format", "json", "tiny.rcp", "batch.micro"],
        &["steps", "--format", "json", "tiny.rcp"],
    ] {
        let mut v = stdout_json(&recipe_in(&dir, args));
        // An explain row's `json` is the value itself (an object for calls like `task`).
        if let Some(rows) = v["settings"].as_array_mut() {
            rows.iter_mut().for_each(|r| r["json"] = Value::Null);
        }
        if v.get("json").is_some() {
            v["json"] = Value::Null;
        }
        let k = keys(&v);
        found.push((args[0], k));
    }
    let doc = doc();
    let missing: Vec<String> = found
        .iter()
        .flat_map(|(what, ks)| {
            ks.iter()
                .filter(|k| !doc.contains(&format!("`{k}`")))
                .map(move |k| format!("{what}: {k}"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/outputs.md does not name:\n{}",
        missing.join("\n")
    );
}
