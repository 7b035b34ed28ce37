//! Emitters: golden files for every example recipe, and "consistent by construction" checked the
//! way HF checks it — a re-statement of transformers' `fill_match` mismatch rules
//! (`transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.fill_match`) run over the
//! emitted ds_config.json and training_args.json — plus "every emitted key exists in the target
//! release".

mod common;

use std::path::PathBuf;

use recipe::check::check_source_with;
use recipe::emit::{self, deepspeed::Style, Layout};
use recipe::resolve::{resolve, Options, Resolved};
use recipe::schema::upstream_versions::DEEPSPEED_TOP_LEVEL_BY_VERSION;
use recipe::SourceFile;
use serde_json::Value;

fn examples() -> Vec<PathBuf> {
    common::rcp_files("recipes")
}

fn resolved(path: &PathBuf) -> (SourceFile, Resolved) {
    let text = std::fs::read_to_string(path).unwrap();
    let options = Options {
        base_dir: path.parent().map(|p| p.to_path_buf()),
        ..Options::default()
    };
    let checked = check_source_with(&text, &options);
    assert!(
        !checked.has_errors(),
        "{}: {:#?}",
        path.display(),
        checked.diagnostics
    );
    let r = resolve(checked.file.as_ref().unwrap(), &options);
    let name = format!("recipes/{}", path.file_name().unwrap().to_string_lossy());
    (SourceFile::new(name, text), r)
}

fn layout() -> Layout {
    Layout {
        recipe_dir_from_out: "../../recipes".into(),
        out_dir_from_recipe: "../build/x".into(),
    }
}

#[test]
fn artefacts_match_golden_files() {
    for path in examples() {
        let (source, r) = resolved(&path);
        let artefacts = emit::build(&r, &source, &[], &layout(), Style::Explicit);
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        for (name, bytes) in &artefacts.files {
            let text = String::from_utf8(bytes.clone()).unwrap();
            insta::assert_snapshot!(format!("{stem}__{name}"), text);
        }
    }
}

#[test]
fn builds_are_byte_identical() {
    for path in examples() {
        let (source, r) = resolved(&path);
        let a = emit::build(&r, &source, &[], &layout(), Style::Explicit);
        let b = emit::build(&r, &source, &[], &layout(), Style::Explicit);
        assert_eq!(a.files, b.files);
    }
}

fn get<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |node, part| node.get(part))
}

/// Python's `!=` on the JSON values HF compares (ints and floats compare by value).
fn differs(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x != y,
        _ => a != b,
    }
}

/// The HF side of each Table-A key that HF checks with must_match (transformers 5.24.0), from
/// training_args.json and the resolved step accounting (HF computes max_steps and warmup itself).
fn hf_values(args: &Value, r: &Resolved) -> Vec<(&'static str, Value)> {
    let a = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
    let world = r.int("cluster.world_size").unwrap();
    let micro = a("per_device_train_batch_size").as_i64().unwrap();
    let gas = a("gradient_accumulation_steps").as_i64().unwrap();
    let warmup = a("warmup_steps").as_i64().unwrap();
    let fp16 = a("fp16").as_bool().unwrap() || a("fp16_full_eval").as_bool().unwrap();
    let bf16 = a("bf16").as_bool().unwrap() || a("bf16_full_eval").as_bool().unwrap();
    vec![
        (
            "train_micro_batch_size_per_gpu",
            a("per_device_train_batch_size"),
        ),
        (
            "gradient_accumulation_steps",
            a("gradient_accumulation_steps"),
        ),
        ("train_batch_size", Value::from(world * micro * gas)),
        ("gradient_clipping", a("max_grad_norm")),
        ("optimizer.params.lr", a("learning_rate")),
        (
            "optimizer.params.betas",
            Value::from(vec![a("adam_beta1"), a("adam_beta2")]),
        ),
        ("optimizer.params.eps", a("adam_epsilon")),
        ("optimizer.params.weight_decay", a("weight_decay")),
        ("scheduler.params.warmup_max_lr", a("learning_rate")),
        ("fp16.enabled", Value::from(fp16)),
        ("bf16.enabled", Value::from(bf16)),
        (
            "scheduler.params.total_num_steps",
            Value::from(r.int("steps.total").unwrap()),
        ),
        // transformers v5.24.0: max(1, get_warmup_steps(max_steps)).
        (
            "scheduler.params.warmup_num_steps",
            Value::from(warmup.max(1)),
        ),
    ]
}

#[test]
fn hf_fill_match_finds_no_mismatch() {
    for path in examples() {
        let (source, r) = resolved(&path);
        if r.targets.transformers != recipe::upstream::versions::Targets::newest().transformers {
            continue; // the Table-A statement above is transformers 5.24.0's
        }
        let artefacts = emit::build(&r, &source, &[], &layout(), Style::Explicit);
        let json = |name: &str| -> Value {
            let (_, bytes) = artefacts.files.iter().find(|(n, _)| n == name).unwrap();
            serde_json::from_slice(bytes).unwrap()
        };
        let (ds, args) = (json("ds_config.json"), json("training_args.json"));
        for (key, hf) in hf_values(&args, &r) {
            // fill_match: a missing key (or parent) is neither filled nor checked.
            if let Some(dsv) = get(&ds, key) {
                assert!(dsv != "auto", "{}: {key} left as auto", path.display());
                assert!(
                    !differs(dsv, &hf),
                    "{}: ds {key}={dsv} vs hf {hf}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn every_emitted_key_exists_in_the_target_release() {
    for path in examples() {
        let (source, r) = resolved(&path);
        let artefacts = emit::build(&r, &source, &[], &layout(), Style::Explicit);
        let json = |name: &str| -> Value {
            let (_, bytes) = artefacts.files.iter().find(|(n, _)| n == name).unwrap();
            serde_json::from_slice(bytes).unwrap()
        };
        let fields = recipe::emit::training_args::fields_for(r.targets.transformers);
        for key in json("training_args.json").as_object().unwrap().keys() {
            assert!(
                fields.fields.iter().any(|(n, _)| n == key),
                "{}: TrainingArguments {} has no field `{key}`",
                path.display(),
                fields.version
            );
        }
        let ds_version = r.targets.deepspeed;
        let (_, top) = DEEPSPEED_TOP_LEVEL_BY_VERSION
            .iter()
            .rev()
            .find(|(v, _)| v.parse::<recipe::upstream::versions::Version>().unwrap() <= ds_version)
            .unwrap_or(&DEEPSPEED_TOP_LEVEL_BY_VERSION[0]);
        for key in json("ds_config.json").as_object().unwrap().keys() {
            assert!(
                top.contains(&key.as_str()),
                "{}: DeepSpeed {ds_version} does not read `{key}`",
                path.display()
            );
        }
    }
}

/// The keys HF (Table A) and accelerate (Table B) may fill from `"auto"` (docs/upstream.md §2.3).
const FILLABLE: &[&str] = &[
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "fp16.enabled",
    "bf16.enabled",
    "amp.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
];

fn autos(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(map) = v {
        for (k, x) in map {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if x == "auto" {
                out.push(path);
            } else {
                autos(x, &path, out);
            }
        }
    }
}

#[test]
fn auto_appears_only_where_hf_fills_and_stands_for_the_explicit_value() {
    for path in examples() {
        let (source, r) = resolved(&path);
        let json = |style| -> Value {
            let files = emit::build(&r, &source, &[], &layout(), style).files;
            serde_json::from_slice(&files.iter().find(|(n, _)| n == "ds_config.json").unwrap().1)
                .unwrap()
        };
        let (explicit, auto) = (json(Style::Explicit), json(Style::Auto));
        let mut keys = Vec::new();
        autos(&auto, "", &mut keys);
        assert!(
            !keys.is_empty(),
            "{}: --auto wrote no \"auto\"",
            path.display()
        );
        let mut filled = auto.clone();
        for key in &keys {
            assert!(
                FILLABLE.contains(&key.as_str()),
                "{}: \"auto\" at `{key}`, which HF does not fill",
                path.display()
            );
            // What HF fills is the explicit value (hf_fill_match_finds_no_mismatch shows the two
            // agree with TrainingArguments).
            let value = get(&explicit, key)
                .unwrap_or_else(|| panic!("{key} missing from the explicit config"))
                .clone();
            let mut node = &mut filled;
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                node = node.get_mut(*part).unwrap();
            }
            node[*parts.last().unwrap()] = value;
        }
        assert_eq!(filled, explicit, "{}", path.display());
    }
}

/// The native plan of every example the runtime can run, with the repository root written as
/// `<root>` (plans carry absolute paths); the others say why they cannot run natively.
#[test]
fn native_plans_match_golden_files() {
    use recipe::emit::plan::{plan, ModelFiles};
    use recipe_runtime::plan::ModelSource;
    let root = std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).unwrap();
    for path in examples() {
        let (_, r) = resolved(&path);
        let model = ModelFiles {
            source: ModelSource::Pretrained {
                dir: PathBuf::from("/models/m"),
            },
            tokenizer: PathBuf::from("/models/m/tokenizer.json"),
        };
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let text = match plan(&r, model) {
            Ok(p) => p.to_json().replace(&root.display().to_string(), "<root>"),
            Err(recipe::emit::plan::Unsupported::Refused(ds)) => {
                let lines: Vec<String> = ds
                    .iter()
                    .map(|d| format!("{} {}", d.code, d.message))
                    .collect();
                format!("not native:\n{}\n", lines.join("\n"))
            }
            Err(recipe::emit::plan::Unsupported::Bug(b)) => panic!("{stem}: {b}"),
        };
        insta::assert_snapshot!(format!("{stem}__plan.json"), text);
    }
}

/// HF-built SGD and Adagrad get the settings HF reads only from `optim_args`
/// (src/upstream/hf_optimizers.rs, docs/rules/schedule-optimizer.md): golden training_args.json
/// for each, and no `optim_args` where HF would read none.
#[test]
fn hf_optimizer_settings_reach_optim_args() {
    let head = "model bert { from = \"m\", task = classify(labels: 2), hidden_size = 8 }\ndata { train = \"t.jsonl\", samples = 80 }\nbatch { micro = 8 }\n";
    let args = |body: &str| -> Value {
        let text = format!("{head}{body}\n");
        let options = Options::default();
        let checked = check_source_with(&text, &options);
        assert!(!checked.has_errors(), "{body}: {:#?}", checked.diagnostics);
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        let source = SourceFile::new("r.rcp", text);
        let files = emit::build(&r, &source, &[], &layout(), Style::Explicit).files;
        let (_, bytes) = files
            .iter()
            .find(|(n, _)| n == "training_args.json")
            .unwrap();
        serde_json::from_slice(bytes).unwrap()
    };
    for (name, body) in [
        (
            "hf_sgd",
            "optimizer sgd { lr = 0.1, momentum = 0.9, nesterov = true, owner = hf }",
        ),
        (
            "hf_adagrad",
            "optimizer adagrad { lr = 0.01, eps = 1e-6, owner = hf }",
        ),
    ] {
        let text = serde_json::to_string_pretty(&args(body)).unwrap();
        insta::assert_snapshot!(format!("{name}__training_args.json"), text);
    }
    assert_eq!(
        args("optimizer sgd { lr = 0.1, momentum = 0.9, owner = hf }")["optim_args"],
        "momentum=0.9"
    );
    for body in [
        // DeepSpeed builds it: momentum goes to its optimizer section.
        "optimizer sgd { lr = 0.1, momentum = 0.9 }",
        // Nothing given that HF reads from optim_args.
        "optimizer sgd { lr = 0.1, owner = hf }",
        "optimizer adagrad { lr = 0.01, owner = hf }",
        "optimizer adamw { lr = 3e-5, eps = 1e-6, owner = hf }",
    ] {
        assert!(args(body).get("optim_args").is_none(), "{body}");
    }
}
