//! `recipe import` round trips: import(build(r)) resolves to the same values as r, and
//! build(import(x)) gives back the same DeepSpeed config and TrainingArguments as x.

use crate::common;

use std::path::PathBuf;

use common::rcp_files;
use recipe::check::check_source_with;
use recipe::commands::import::{import, Inputs};
use recipe::emit::{self, deepspeed::Style, Layout};
use recipe::resolve::{resolve, Options, Resolved, Val};
use recipe::SourceFile;
use serde_json::Value;

/// The `.rcp` files directly in `dir` (relative to the crate root), sorted.
/// Every recipe the round trip is checked on: the examples, the conformance corpus (whose
/// artefacts the real stack accepted: conformance/fixtures/corpus) and the old stacks' corpus
/// (conformance/fixtures/legacy-run).
fn examples() -> Vec<PathBuf> {
    let mut files = rcp_files("recipes");
    files.extend(rcp_files("conformance/corpus"));
    for stack in [
        "transformers-4.6.1+deepspeed-0.3.16",
        "transformers-4.24.0+deepspeed-0.7.7",
    ] {
        files.extend(rcp_files(&format!("conformance/corpus-legacy/{stack}")));
    }
    assert!(files.len() > 300, "{} recipes", files.len());
    files
}

fn resolve_text(text: &str, options: &Options) -> Result<Resolved, String> {
    let checked = check_source_with(text, options);
    if checked.has_errors() {
        let errors: Vec<String> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| format!("{} {}", d.code, d.message))
            .collect();
        return Err(format!("{}\n{text}", errors.join("; ")));
    }
    Ok(resolve(checked.file.as_ref().unwrap(), options))
}

fn layout() -> Layout {
    Layout {
        recipe_dir_from_out: ".".into(),
        out_dir_from_recipe: ".".into(),
    }
}

fn artefact(files: &[(String, Vec<u8>)], name: &str) -> Value {
    let (_, bytes) = files.iter().find(|(n, _)| n == name).unwrap();
    serde_json::from_slice(bytes).unwrap()
}

/// Artefacts: (file name, contents).
type Files = Vec<(String, Vec<u8>)>;

/// Builds a recipe, imports the artefacts back, and returns both resolutions and artefacts.
fn round_trip(path: &PathBuf) -> Result<(Resolved, Resolved, Files, Files), String> {
    round_trip_from(path, Style::Explicit)
}

/// As [`round_trip`], importing the artefacts `recipe build` writes in `style`; the rebuild is
/// always explicit.
fn round_trip_from(
    path: &PathBuf,
    style: Style,
) -> Result<(Resolved, Resolved, Files, Files), String> {
    let text = std::fs::read_to_string(path).unwrap();
    let options = Options {
        base_dir: path.parent().map(|p| p.to_path_buf()),
        ..Options::default()
    };
    let r = resolve_text(&text, &options).expect("the recipe itself checks clean");
    let source = SourceFile::new("r.rcp", text);
    let built = emit::build(&r, &source, &[], &layout(), style).files;
    let labels = match r.val("model.task").and_then(|t| t.arg("labels")) {
        Some(Val::List(items)) => items.len() as u64,
        Some(v) => v.as_i64().unwrap() as u64,
        None => 2,
    };
    let inputs = Inputs {
        model: r.str("model.from").map(str::to_string),
        train: r.str("data.train").map(str::to_string),
        eval: r.str("data.eval").map(str::to_string),
        samples: r.uint("data.samples"),
        labels: Some(labels),
        hidden_size: r.uint("model.hidden_size"),
        model_is_local: false,
        gpus: r.uint("cluster.gpus"),
        nodes: r.uint("cluster.nodes"),
        targets: recipe::upstream::versions::Library::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                !matches!(
                    r.target_sources[*i],
                    recipe::resolve::Source::Default { .. }
                )
            })
            .map(|(_, lib)| (lib.key().to_string(), r.targets.get(*lib).to_string()))
            .collect(),
        origin: "a test".into(),
    };
    let imported = import(
        &artefact(&built, "ds_config.json"),
        Some(&artefact(&built, "training_args.json")),
        &inputs,
    );
    // The imported recipe names no local files: steps come from `samples`.
    let back = resolve_text(&imported, &Options::default())
        .map_err(|e| format!("the import does not check clean: {e}"))?;
    let source = SourceFile::new("i.rcp", imported);
    let rebuilt = emit::build(&back, &source, &[], &layout(), Style::Explicit).files;
    Ok((r, back, built, rebuilt))
}

#[test]
fn import_of_a_build_resolves_to_the_same_values() {
    let keys = [
        "batch.micro",
        "batch.accumulate",
        "batch.global",
        "cluster.world_size",
        "optimizer.kind",
        "optimizer.owner",
        "optimizer.lr",
        "optimizer.betas",
        "optimizer.eps",
        "optimizer.weight_decay",
        "schedule.kind",
        "steps.warmup",
        "steps.total",
        "steps.per_epoch",
        "train.precision",
        "train.clip",
        "train.epochs",
        "train.seed",
        "zero.stage",
        "zero.offload optimizer",
        "zero.offload param",
        "zero.reduce_bucket",
    ];
    let mut failures = Vec::new();
    for path in examples() {
        let (r, back, _, _) = match round_trip(&path) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        for key in keys {
            // At stage 0 the config's `zero_optimization` is `{"stage": 0}`: the ZeRO tuning
            // values feed nothing, and the import cannot (and need not) recover them.
            if key.starts_with("zero.") && key != "zero.stage" && r.uint("zero.stage") == Some(0) {
                continue;
            }
            let (a, b) = (r.val(key), back.val(key));
            let same = match (a.and_then(Val::as_f64), b.and_then(Val::as_f64)) {
                (Some(x), Some(y)) => x == y,
                // `cpu` and `cpu(pin_memory: true)` are the same place (the import states the
                // pin_memory the build made explicit).
                _ if a.and_then(Val::as_word).is_some() => {
                    a.and_then(Val::as_word) == b.and_then(Val::as_word)
                }
                _ => a.map(|v| v.to_string()) == b.map(|v| v.to_string()),
            };
            if !same {
                failures.push(format!("{}: {key}: {a:?} became {b:?}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn build_of_an_import_gives_back_the_same_artefacts() {
    let mut failures = Vec::new();
    for path in examples() {
        let Ok((_, _, built, rebuilt)) = round_trip(&path) else {
            continue; // reported by import_of_a_build_resolves_to_the_same_values
        };
        for name in ["ds_config.json", "training_args.json"] {
            let (x, y) = (artefact(&built, name), artefact(&rebuilt, name));
            if x != y {
                failures.push(format!("{}: {name}: {}", path.display(), json_diff(&x, &y)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The leaves that differ between two JSON documents, as `path: a -> b`.
fn json_diff(a: &Value, b: &Value) -> String {
    fn walk(a: Option<&Value>, b: Option<&Value>, path: &str, out: &mut Vec<String>) {
        match (a, b) {
            (Some(Value::Object(x)), Some(Value::Object(y))) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    walk(x.get(k), y.get(k), &format!("{path}.{k}"), out);
                }
            }
            (x, y) if x != y => out.push(format!(
                "{path}: {} -> {}",
                x.map_or("absent".into(), Value::to_string),
                y.map_or("absent".into(), Value::to_string)
            )),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(Some(a), Some(b), "", &mut out);
    out.join(", ")
}

/// `--auto` artefacts import as HF would fill them: the rebuild equals the explicit build.
#[test]
fn build_of_an_auto_import_gives_back_the_explicit_artefacts() {
    let mut failures = Vec::new();
    for path in examples() {
        let explicit = match round_trip(&path) {
            Ok((_, _, built, _)) => built,
            Err(_) => continue, // reported by import_of_a_build_resolves_to_the_same_values
        };
        let rebuilt = match round_trip_from(&path, Style::Auto) {
            Ok((_, _, _, rebuilt)) => rebuilt,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        for name in ["ds_config.json", "training_args.json"] {
            let (x, y) = (artefact(&explicit, name), artefact(&rebuilt, name));
            if x != y {
                failures.push(format!("{}: {name}: {}", path.display(), json_diff(&x, &y)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Imports `ds` (+ `args`) with the model and data given, and returns the recipe text and the
/// codes of the errors its check reports.
fn lint(ds: &str, args: Option<&str>) -> (String, Vec<String>) {
    let ds: Value = serde_json::from_str(ds).unwrap();
    let args: Option<Value> = args.map(|a| serde_json::from_str(a).unwrap());
    let inputs = Inputs {
        model: Some("bert-base-uncased".into()),
        train: Some("train.jsonl".into()),
        samples: Some(1000),
        origin: "a test".into(),
        ..Inputs::default()
    };
    let text = import(&ds, args.as_ref(), &inputs);
    let checked = check_source_with(&text, &Options::default());
    let codes = checked
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| d.code.to_string())
        .collect();
    (text, codes)
}

/// What the language cannot say, or what the real stack refuses, is named by the check of the
/// imported recipe, never silently turned into something else.
#[test]
fn import_names_what_it_cannot_carry_over() {
    let cases: [(&str, Option<&str>, &str, &[&str]); 10] = [
        // A torch.optim class DeepSpeed would look up by name, and a typo: not AdamW.
        (
            r#"{"train_batch_size": 8, "optimizer": {"type": "RMSprop", "params": {"lr": 0.01}}}"#,
            None,
            "optimizer rmsprop",
            &["R0018"],
        ),
        (
            r#"{"train_batch_size": 8, "optimizer": {"type": "Adamw-8bit", "params": {"lr": 0.01}}}"#,
            None,
            "optimizer \"adamw-8bit\"",
            &["R0013"],
        ),
        // A constructor argument the language does not model: named in the block.
        (
            r#"{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "foo": 1}}}"#,
            None,
            "foo = 1",
            &["R0011"],
        ),
        // HF's optimizer: an 8-bit AdamW is not adamw_torch.
        (
            r#"{"train_batch_size": 8}"#,
            Some(r#"{"optim": "adamw_bnb_8bit", "per_device_train_batch_size": 8}"#),
            "optimizer adamw_bnb_8bit",
            &["R0018"],
        ),
        // Both half precisions: DeepSpeed and HF refuse it; the import keeps the conflict.
        (
            r#"{"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}}"#,
            None,
            "bf16.enabled = true",
            &["R0509"],
        ),
        // DeepSpeed's default last_batch_iteration says nothing; the schedule imports clean.
        (
            r#"{"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_type": "linear", "last_batch_iteration": -1}}}"#,
            None,
            "schedule WarmupLR",
            &[],
        ),
        // Evaluation asked for: a placeholder evaluation file, not a false R0706.
        (
            r#"{"train_batch_size": 8}"#,
            Some(r#"{"eval_strategy": "epoch", "per_device_train_batch_size": 8}"#),
            "= \"eval.jsonl\"",
            &[],
        ),
        // A warmup for a kind that takes none (`get_scheduler` passes `constant` and the
        // metric-driven kinds no `num_warmup_steps`): kept raw, as the arguments give it.
        (
            r#"{"train_batch_size": 8}"#,
            Some(
                r#"{"lr_scheduler_type": "constant", "warmup_steps": 10, "per_device_train_batch_size": 8}"#,
            ),
            "hf {\n  warmup_steps = 10\n}",
            &[],
        ),
        // greedy's kwargs are schedule keys; its `warmup` is `increase_cooldown`.
        (
            r#"{"train_batch_size": 8}"#,
            Some(
                r#"{"lr_scheduler_type": "greedy", "lr_scheduler_kwargs": {"warmup": 2, "min_lr": 0}, "eval_strategy": "epoch", "optim": "adamw_torch", "per_device_train_batch_size": 8}"#,
            ),
            "increase_cooldown = 2",
            &[],
        ),
        // Gradient checkpointing (renamed in transformers 5.23) and Adafactor before `optim`.
        (
            r#"{"train_batch_size": 8}"#,
            Some(
                r#"{"activation_checkpointing": true, "adafactor": true, "per_device_train_batch_size": 8}"#,
            ),
            "gradient_checkpointing = true",
            &[],
        ),
    ];
    for (ds, args, fragment, codes) in cases {
        let (text, got) = lint(ds, args);
        assert!(text.contains(fragment), "{ds}: no `{fragment}` in\n{text}");
        assert_eq!(got, codes, "{ds}\n{text}");
    }
    let (text, _) = lint(
        r#"{"train_batch_size": 8}"#,
        Some(r#"{"adafactor": true, "per_device_train_batch_size": 8}"#),
    );
    assert!(text.contains("optimizer adafactor"), "{text}");
    // A key no DeepSpeed config or TrainingArguments has (not a name): said, not written.
    let (text, codes) = lint(
        r#"{"train_batch_size": 8, "my key": 1, "optimizer": {"type": "AdamW", "params": {"a-b": 2}}}"#,
        Some(r#"{"per_device_train_batch_size": 8, "x.y z": 3}"#),
    );
    // A top-level key DeepSpeed does not read: it ignores it, so the recipe does not carry it.
    assert!(
        text.contains("# not imported: `my key` is not a DeepSpeed key; DeepSpeed ignores it"),
        "{text}"
    );
    for key in [r#"optimizer: "a-b""#, r#"hf: "x.y z""#] {
        assert!(
            text.contains(&format!("# not imported: {key} is not a name")),
            "{text}"
        );
    }
    assert_eq!(codes, Vec::<String>::new(), "{text}");
}

/// HF fills the hidden-size `"auto"` ZeRO sizes from the model: with the hidden size given they
/// come back as HF computes them; without it the import says what is missing.
#[test]
fn import_of_hidden_size_autos_needs_the_hidden_size() {
    let ds: Value = serde_json::from_str(
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 3,
            "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto"}}"#,
    )
    .unwrap();
    let mut inputs = Inputs {
        model: Some("bert-base-uncased".into()),
        train: Some("train.jsonl".into()),
        samples: Some(1000),
        ..Inputs::default()
    };
    let text = import(&ds, None, &inputs);
    assert!(
        text.contains("# fill in: model.hidden_size is unknown"),
        "{text}"
    );
    inputs.hidden_size = Some(768);
    let text = import(&ds, None, &inputs);
    assert!(!text.contains("hidden_size is unknown"), "{text}");
    let r = resolve_text(&text, &Options::default()).unwrap();
    assert_eq!(r.uint("zero.reduce_bucket"), Some(768 * 768));
    assert_eq!(r.uint("zero.prefetch_bucket"), Some(768 * 768 * 9 / 10));
    assert_eq!(r.uint("zero.param_persistence_threshold"), Some(7680));
}

mod robustness {
    //! `recipe import` on arbitrary configs (known keys with values of any JSON type, unknown
    //! keys, odd strings): it never panics, and what it prints is always a recipe that parses, so
    //! the check (which must not panic either) can name what is wrong.

    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map};

    /// DeepSpeed keys the import reads, and a few it does not.
    const DS_KEYS: &[&str] = &[
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "steps_per_print",
        "optimizer",
        "optimizer.type",
        "optimizer.params",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.adam_w_mode",
        "optimizer.params.max_grad_norm",
        "optimizer.params.weird key",
        "scheduler.type",
        "scheduler.params",
        "scheduler.params.warmup_num_steps",
        "scheduler.params.warmup_type",
        "scheduler.params.last_batch_iteration",
        "fp16",
        "fp16.enabled",
        "fp16.loss_scale",
        "bf16.enabled",
        "amp.enabled",
        "zero_optimization",
        "zero_optimization.stage",
        "zero_optimization.offload_optimizer",
        "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.pin_memory",
        "zero_optimization.reduce_bucket_size",
        "wall_clock_breakdown",
        "flops_profiler.enabled",
        "x\"y",
    ];

    /// TrainingArguments fields the import reads, and a few it does not.
    const HF_KEYS: &[&str] = &[
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "warmup_steps",
        "warmup_ratio",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "optim",
        "adafactor",
        "fp16",
        "bf16",
        "eval_strategy",
        "evaluation_strategy",
        "eval_steps",
        "save_strategy",
        "num_train_epochs",
        "max_steps",
        "seed",
        "activation_checkpointing",
        "half_precision_backend",
        "report_to",
    ];

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..100_000).prop_map(|n| json!(n)),
            any::<i64>().prop_map(|n| json!(n)),
            prop_oneof![Just(0.0), Just(1e-3), Just(0.5), Just(1e300), Just(-2.5)]
                .prop_map(|f: f64| json!(f)),
            prop_oneof![
                Just("auto"),
                Just("cpu"),
                Just("none"),
                Just("Lamb"),
                Just("WarmupLR"),
                Just("linear"),
                Just("steps"),
                Just("epoch"),
                Just("adamw_torch"),
                Just(""),
                Just("a \"quoted\"\nline}"),
                Just("ünï"),
            ]
            .prop_map(|s| json!(s)),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec(("[a-z_]{1,6}", inner), 0..3)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    /// Sets a dotted path, replacing whatever non-object stands in the way.
    fn set(root: &mut Value, path: &str, v: Value) {
        let mut node = root;
        let parts: Vec<&str> = path.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            if !node.get(*p).is_some_and(Value::is_object) {
                node[*p] = json!({});
            }
            node = &mut node[*p];
        }
        node[parts[parts.len() - 1]] = v;
    }

    fn config(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
        prop::collection::vec((prop::sample::select(keys), value()), 0..10).prop_map(|kv| {
            let mut root = json!({});
            for (k, v) in kv {
                set(&mut root, k, v);
            }
            root
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        #[test]
        fn import_never_panics_and_always_prints_a_recipe_that_parses(
            ds in prop_oneof![config(DS_KEYS), value()],
            args in prop::option::of(config(HF_KEYS)),
        ) {
            let text = import(&ds, args.as_ref(), &Inputs::default());
            let checked = check_source_with(&text, &Options::default());
            prop_assert!(checked.file.is_some(), "does not parse:\n{text}\n{:?}", checked.diagnostics);
            for d in &checked.diagnostics {
                prop_assert!(d.primary.span.end <= text.len());
            }
        }
    }
}

/// The linter use: an args file with fields the target transformers no longer has is reported
/// (that release's TrainingArguments refuses it), with the rename, though the import maps them;
/// for the release the file was written for, nothing is reported.
#[test]
fn args_fields_the_target_release_lacks_are_reported() {
    use recipe::upstream::versions::Version;
    let args = serde_json::json!({
        "warmup_ratio": 0.06, "evaluation_strategy": "epoch", "learning_rate": 3e-5
    });
    let v5: Version = "5.24.0".parse().unwrap();
    let found = recipe::commands::import::unknown_args(&args, v5);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found
        .iter()
        .any(|m| m.starts_with("`evaluation_strategy`") && m.contains("now `eval_strategy`")));
    assert!(found.iter().any(|m| m.starts_with("`warmup_ratio`")));
    let v4: Version = "4.30.0".parse().unwrap();
    assert!(recipe::commands::import::unknown_args(&args, v4).is_empty());
}

/// Without --gpus, a written train_batch_size that is micro × accumulation × N gives the world
/// size DeepSpeed expects: the recipe gets `cluster { gpus = N }` and says it was inferred, and
/// its batch check passes. A size that is not such a multiple is left to the check (R0101).
#[test]
fn the_world_size_is_inferred_from_a_written_train_batch_size() {
    let (text, errors) = lint(
        r#"{"train_batch_size": 256, "train_micro_batch_size_per_gpu": 16,
            "gradient_accumulation_steps": 2}"#,
        None,
    );
    assert!(text.contains("cluster {\n  gpus = 8\n}"), "{text}");
    assert!(text.contains("cluster.gpus = 8 inferred"), "{text}");
    assert!(errors.is_empty(), "{errors:?}");

    let (text, errors) = lint(
        r#"{"train_batch_size": 100, "train_micro_batch_size_per_gpu": 16,
            "gradient_accumulation_steps": 2}"#,
        None,
    );
    assert!(!text.contains("cluster"), "{text}");
    assert!(errors.contains(&"R0101".to_string()), "{errors:?}");
}
