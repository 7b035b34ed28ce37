//! Emitters: golden files for every example recipe, and "consistent by construction" checked the
//! way HF checks it — a re-statement of transformers' `fill_match` mismatch rules
//! (`transformers/integrations/deepspeed.py:HfTrainerDeepSpeedConfig.fill_match`) run over the
//! emitted ds_config.json and training_args.json — plus "every emitted key exists in the target
//! release".

use crate::common;

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
        let fields = recipe::schema::upstream::HfFields::for_target(r.targets.transformers);
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
        if let Some(script) =
            recipe::emit::launch_native::script(&r, "../../recipes", &format!("recipes/{stem}.rcp"))
        {
            insta::assert_snapshot!(format!("{stem}__launch-native.sh"), script);
        }
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

fn text_of(files: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    files
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| String::from_utf8(b.clone()).unwrap())
}

/// A path with `.` and `..` taken out, for comparing where two relative paths lead.
fn normal(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            _ => parts.push(p),
        }
    }
    parts.join("/")
}

/// Every example recipe's train.py is valid Python: `py_compile` with the Python the tests find
/// (3.11 under CI), and the grammar of Python 3.7 (`ast.parse(feature_version=(3, 7))`), the
/// oldest a supported transformers release runs on. Needs no torch or transformers: the script
/// imports them inside `main()`.
#[test]
fn every_built_train_py_compiles() {
    let Some(python) = common::python("compiling the built train.py files") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("recipe-train-py-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut scripts = Vec::new();
    for path in examples() {
        let (source, r) = resolved(&path);
        let files = emit::build(&r, &source, &[], &layout(), Style::Explicit).files;
        let script = text_of(&files, "train.py")
            .unwrap_or_else(|| panic!("{}: no train.py written", path.display()));
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let file = dir.join(format!("{stem}.py"));
        std::fs::write(&file, script).unwrap();
        scripts.push(file);
    }
    let check = "import ast, py_compile, sys\n\
                 for f in sys.argv[1:]:\n\
                 \x20   py_compile.compile(f, doraise=True)\n\
                 \x20   ast.parse(open(f, encoding='utf-8').read(), f, feature_version=(3, 7))\n";
    let o = std::process::Command::new(&python)
        .arg("-c")
        .arg(check)
        .args(&scripts)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// launch.sh runs the train.py written beside it (its path from the recipe's directory, where
/// launch.sh `cd`s, leads back to launch.sh's own directory), and passes it only arguments it
/// accepts: train.py parses its command line with `HfArgumentParser(TrainingArguments)` alone,
/// so every flag must be a TrainingArguments field of the target release (as is `--local_rank`,
/// which the DeepSpeed launcher adds), and the flags read back, as HfArgumentParser reads them
/// (`recipe::pair::args`, the checker's re-statement), into training_args.json's values.
#[test]
fn launch_sh_runs_train_py_with_arguments_it_accepts() {
    use recipe::pair::args::{script_flags, shell_words, Args};
    for path in examples() {
        let (source, r) = resolved(&path);
        let files = emit::build(&r, &source, &[], &layout(), Style::Explicit).files;
        let launch = text_of(&files, "launch.sh").unwrap();
        let train_py = text_of(&files, "train.py").unwrap();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ds_config.json",
                "training_args.json",
                "train.py",
                "launch.sh",
                "recipe.lock"
            ],
            "{}: train.py is renamed into place before the launch.sh that runs it",
            path.display()
        );

        // train.py's only parser, and no argument of its own.
        assert!(train_py.contains(
            "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()"
        ));
        assert!(!train_py.contains("argparse") && !train_py.contains("sys.argv"));

        // The script launch.sh runs is this train.py: out dir + cd + script path = out dir.
        let out = "build/x"; // layout(): the recipes are at ../../recipes from it
        let cd = launch
            .lines()
            .find_map(|l| l.strip_prefix("cd \"$(dirname \"$0\")\"/"))
            .unwrap();
        let words: Vec<String> = shell_words(&launch).into_iter().map(|(w, _)| w).collect();
        let script = words.iter().find(|w| w.ends_with(".py")).unwrap();
        assert_eq!(
            normal(&format!("{out}/{cd}/{script}")),
            format!("{out}/train.py"),
            "{}",
            path.display()
        );

        let release = recipe::schema::upstream::HfFields::for_target(r.targets.transformers);
        assert!(release.has("local_rank"), "{}", release.version);
        let flags = script_flags(shell_words(&launch));
        for (w, _) in &flags {
            if let Some(name) = w.strip_prefix("--") {
                assert!(
                    release.has(name),
                    "{}: launch.sh passes --{name}, not a TrainingArguments field of {}",
                    path.display(),
                    release.version
                );
            }
        }
        let from_flags = Args::from_flags(&flags, release);
        assert!(from_flags.unknown.is_empty() && from_flags.bad.is_empty());
        let json =
            recipe::pair::json::parse(&text_of(&files, "training_args.json").unwrap()).unwrap();
        let from_json = Args::from_json(&json, release);
        for (name, _) in release.fields {
            // Python's `==`, as TrainingArguments compares: `--logging_steps 10` is 10.0 where
            // the field is a float, the JSON's 10 an int.
            // And a list field given one word (`--report_to tensorboard`) is that one-item list
            // after `TrainingArguments.__post_init__`.
            use recipe::pair::json::Py;
            let (a, b) = (from_flags.get(name).unwrap(), from_json.get(name).unwrap());
            let one = |x: &Py| match x {
                Py::List(items) if items.len() == 1 => items[0].clone(),
                x => x.clone(),
            };
            assert!(
                a.py_eq(b) || one(a).py_eq(&one(b)),
                "{}: {name}: {a:?} from launch.sh, {b:?} from training_args.json",
                path.display()
            );
        }
        assert_eq!(
            from_flags.deepspeed.map(|d| d.0),
            from_json.deepspeed.map(|d| d.0)
        );
    }
}

/// A recipe that names its own script gets no train.py: launch.sh runs that script with the
/// arguments of HF's text-classification example, then the TrainingArguments.
#[test]
fn a_script_of_the_recipes_own_is_run_with_the_example_arguments() {
    let path = PathBuf::from("recipes/spam.rcp");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "  seed      = 42\n",
        "  seed      = 42\n  script    = \"my_train.py\"\n",
    );
    assert!(text.contains("my_train.py"));
    let options = Options {
        base_dir: Some(PathBuf::from("recipes")),
        ..Options::default()
    };
    let checked = check_source_with(&text, &options);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    let r = resolve(checked.file.as_ref().unwrap(), &options);
    let source = SourceFile::new("recipes/spam.rcp", text);
    let files = emit::build(&r, &source, &[], &layout(), Style::Explicit).files;
    assert!(text_of(&files, "train.py").is_none());
    let launch = text_of(&files, "launch.sh").unwrap();
    for want in [
        "  my_train.py \\\n  --model_name_or_path sentence-transformers/all-MiniLM-L6-v2 \\\n",
        "  --train_file ../data/spamassassin/train.jsonl \\\n",
        "  --text_column_names text \\\n  --label_column_name label \\\n  --max_seq_length 64 \\\n",
        "  --per_device_train_batch_size 16 \\\n",
    ] {
        assert!(launch.contains(want), "{want:?} not in\n{launch}");
    }
}

/// What the recipe says about the model and the data reaches train.py's constants: names or a
/// count of labels, the pair field, the format (CSV here, from the extension), the test file and
/// the dropout.
#[test]
fn train_py_states_the_recipes_model_and_data() {
    let text = "recipe \"pairs\"\n\
        model bert { config = \"tiny/config.json\", task = classify(labels: 3), hidden_size = 8, dropout = 0 }\n\
        data { train = \"nli/train.csv\", test = \"nli/test.csv\", text = \"premise\", text_pair = \"hypothesis\", label = \"gold\", max_len = 64, samples = 100 }\n\
        batch { micro = 4 }\n";
    let options = Options::default();
    let checked = check_source_with(text, &options);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    let r = resolve(checked.file.as_ref().unwrap(), &options);
    let files = emit::build(
        &r,
        &SourceFile::new("pairs.rcp", text),
        &[],
        &layout(),
        Style::Explicit,
    )
    .files;
    let py = text_of(&files, "train.py").unwrap();
    for want in [
        "MODEL_FROM = None\nMODEL_CONFIG = \"tiny/config.json\"\n",
        "LABELS = [\"LABEL_0\", \"LABEL_1\", \"LABEL_2\"]\nLABELS_NAMED = False\n",
        "DROPOUT = 0.0\n",
        "TRAIN_FILE = \"nli/train.csv\"\nEVAL_FILE = None\nTEST_FILE = \"nli/test.csv\"\nFORMAT = \"csv\"\n",
        "TEXT = \"premise\"\nTEXT_PAIR = \"hypothesis\"\nLABEL = \"gold\"\n",
        "MAX_LEN = 64\n",
        "Written for pairs.rcp by `recipe build`",
    ] {
        assert!(py.contains(want), "{want:?} not in train.py");
    }
}

/// The built train.py reads the rows `recipe` counts: on the tricky CSV, TSV and JSONL files of
/// conformance/data-rows (blank and whitespace lines, BOM + CRLF, quoted newlines, …), its
/// readers (plain Python, no torch needed) find exactly the `recipe_rows` of
/// conformance/fixtures/data-rows.json, which HF `datasets` found too. Labels are not judged here
/// (two files hold rows that R0703/R0704 refuse): only the row count. The arrays `datasets`
/// takes for lists of strings (its columns: `text` alone) give rows without a label, which the
/// script refuses at the first element's line, as `recipe run` does.
#[test]
fn train_py_reads_the_rows_recipe_counts() {
    let Some(python) = common::python("reading data files with the built train.py") else {
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("conformance/fixtures/data-rows.json")).unwrap(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("recipe-train-py-rows-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cases = Vec::new();
    for (i, f) in fixture["files"].as_array().unwrap().iter().enumerate() {
        let file = format!("conformance/{}", f["file"].as_str().unwrap());
        let text = format!(
            "recipe \"rows\"\nmodel bert {{ from = \"m\", task = classify(labels: [\"ham\", \"spam\"]), hidden_size = 8 }}\n\
             data {{ train = \"{file}\", samples = 10 }}\nbatch {{ micro = 2 }}\n"
        );
        let options = Options {
            base_dir: Some(root.clone()),
            ..Options::default()
        };
        let checked = check_source_with(&text, &options);
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        let files = emit::build(
            &r,
            &SourceFile::new("rows.rcp", text.clone()),
            &[],
            &layout(),
            Style::Explicit,
        )
        .files;
        let script = dir.join(format!("train_{i}.py"));
        std::fs::write(&script, text_of(&files, "train.py").unwrap()).unwrap();
        let labelled = f["datasets_columns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "label");
        cases.push((script, file, f["recipe_rows"].as_u64().unwrap(), labelled));
    }
    let count = "import importlib.util, sys\n\
                 script, data = sys.argv[1], sys.argv[2]\n\
                 spec = importlib.util.spec_from_file_location('train', script)\n\
                 m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n\
                 m.label_id = lambda raw, path, line: 0\n\
                 print(len(m.read_rows(data)))\n";
    for (script, file, want, labelled) in cases {
        let o = std::process::Command::new(&python)
            .arg("-c")
            .arg(count)
            .arg(&script)
            .arg(&file)
            .current_dir(&root)
            .output()
            .unwrap();
        let got = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if !labelled {
            // The line where the checker's scan finds the first row without a label.
            use recipe::resolve::files::{scan_reader, Format, ScanSpec};
            let spec = ScanSpec {
                format: Format::Jsonl,
                fields: vec!["text".into(), "label".into()],
                label: Some(1),
            };
            let bytes = std::fs::read(root.join(&file)).unwrap();
            let scan = scan_reader(&bytes[..], &spec).unwrap();
            let missing = scan.missing.iter().find(|m| m.field == "label");
            let line = missing.expect("no label in a list of strings").first_line;
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(
                e.contains(&format!("{file}:{line}: field \"label\" is missing")),
                "{file}: {got} {e}"
            );
            continue;
        }
        assert_eq!(
            got,
            want.to_string(),
            "{file}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
