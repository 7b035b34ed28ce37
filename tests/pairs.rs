//! The pair linter against the real stack (conformance/pairs/, fixtures written by
//! conformance/pairs.py with transformers 5.25.0 + accelerate 1.16.0 + DeepSpeed 0.19.8), and
//! its diagnostics against their snapshots (tests/pairs/).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use recipe::diagnostics::{render_human_with, Style};
use recipe::pair::json::{self, Py};
use recipe::pair::{self as lint, ArgsInput, Options};
use recipe::upstream::versions::Targets;
use recipe::{Severity, SourceFile};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file named by its file name only, as the snapshots show it on every machine.
fn read(path: &Path) -> SourceFile {
    let f = SourceFile::read(path).unwrap_or_else(|e| panic!("{e}"));
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    SourceFile::new(name, f.text)
}

/// The TrainingArguments of a pair directory: training_args.json or args.txt (flags).
fn args_of(dir: &Path) -> Option<ArgsInput> {
    let j = dir.join("training_args.json");
    let t = dir.join("args.txt");
    if j.is_file() {
        Some(ArgsInput::Json(read(&j)))
    } else if t.is_file() {
        Some(ArgsInput::Flags(read(&t)))
    } else {
        None
    }
}

fn case_options(case: &serde_json::Value) -> Options {
    let n = |k: &str| case.get(k).and_then(serde_json::Value::as_u64);
    Options {
        world: n("world_size").unwrap_or(1),
        samples: n("samples"),
        hidden_size: n("hidden_size"),
        has_eval: case.get("has_eval").and_then(serde_json::Value::as_bool),
        targets: Targets::newest(),
    }
}

/// The cause of a real refusal, as the codes that report it.
fn cause_codes(error: &str) -> &'static [&'static str] {
    const TABLE: &[(&str, &[&str])] = &[
        ("mismatch TrainingArguments", &["R1210"]),
        ("not found in kwargs", &["R0901"]),
        ("Cannot provide deprecated parameter", &["R0031"]),
        ("has been removed", &["R0909"]),
        ("untested ZeRO Optimizer", &["R0403"]),
        ("not a supported DeepSpeed Optimizer", &["R1222"]),
        ("'bool' object has no attribute 'get'", &["R1222"]),
        ("invalid choice", &["R1205", "R1204"]),
        ("min_lr or min_lr_rate", &["R1207"]),
        ("Please specify the ZeRO optimization config", &["R1214"]),
        ("`--mixed_precision` arg cannot be set", &["R1213"]),
        ("Check batch related parameters", &["R1220"]),
        ("has to be greater than 0", &["R1220"]),
        (
            "Either train_batch_size or train_micro_batch_size_per_gpu",
            &["R1220"],
        ),
        (
            "bfloat16 and fp16 modes cannot be simultaneously",
            &["R1221"],
        ),
        ("Extra inputs are not permitted", &["R0030", "R0031"]),
        ("not used by the HfArgumentParser", &["R0032", "R0033"]),
        // HF's schedule functions (before TrainingArguments' own TypeError).
        ("_schedule()", &["R1207"]),
        ("schedule_with_warmup()", &["R1207"]),
        ("warmup_lr_rate()", &["R1207"]),
        ("Plateau.__init__()", &["R1207"]),
        // GreedyLR / ReduceLROnPlateau: a per-group list of the wrong length.
        ("min_lrs, got", &["R1207"]),
        ("max_lrs, got", &["R1207"]),
        ("must be smaller than initial lr", &["R1207"]),
        ("Invalid communication_data_type", &["R1222"]),
        ("together with --deepspeed is not possible", &["R1206"]),
        // DeepSpeed's scheduler constructors (before TrainingArguments' own TypeError).
        ("LR.__init__()", &["R1222"]),
        ("Cycle.__init__()", &["R1222"]),
        ("Test.__init__()", &["R1222"]),
        ("warmup_num_steps must be a positive integer", &["R1222"]),
        ("unexpected keyword argument", &["R0032", "R0033"]),
        ("At most one of fp16 and bf16", &["R1205"]),
        ("is not a valid", &["R1205"]),
        ("load_best_model_at_end requires", &["R1205"]),
        ("requires an eval strategy", &["R1205"]),
        ("warmup_steps >= 0", &["R1205"]),
        ("didn't pass an `eval_dataset`", &["R1206"]),
        ("save_only_model", &["R1206"]),
        ("auto_find_batch_size", &["R1206"]),
        ("does not recognize LR scheduler", &["R1222"]),
        ("stage", &["R1222"]),
        ("device", &["R1222"]),
        ("has no attribute", &["R1222"]),
    ];
    TABLE
        .iter()
        .find(|(needle, _)| error.contains(needle))
        .map_or(&[], |(_, codes)| codes)
}

/// A config's leaves, dotted (an empty section is a leaf).
fn leaves(v: &Py) -> BTreeMap<String, Py> {
    v.leaves()
        .into_iter()
        .map(|(k, v)| (k, v.clone()))
        .collect()
}

fn from_fixture(v: &serde_json::Value) -> Py {
    json::parse(&v.to_string()).expect("fixture JSON").to_py()
}

/// Whether our value is the real one (non-finite numbers are strings in a fixture: "inf").
fn same_value(ours: Option<&Py>, real: &Py) -> bool {
    match (ours, real) {
        (Some(Py::Float(f)), Py::Str(s)) => json::py_float(*f) == *s,
        (Some(m), v) => m.py_eq(v),
        (None, _) => false,
    }
}

/// One pair of conformance/pairs/ with its real-stack fixture.
struct Pair {
    name: String,
    dir: PathBuf,
    opts: Options,
    fixture: serde_json::Value,
}

/// Every pair of the corpus, in name order.
fn corpus() -> Vec<Pair> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("conformance/pairs"))
        .expect("conformance/pairs exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let json = |path: PathBuf| -> serde_json::Value {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    };
    dirs.into_iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            Pair {
                opts: case_options(&json(dir.join("case.json"))),
                fixture: json(root().join(format!("conformance/fixtures/pairs/{name}.json"))),
                name,
                dir,
            }
        })
        .collect()
}

/// The pair checked as `recipe check` checks it.
fn check_pair(p: &Pair) -> lint::Report {
    lint::check(
        read(&p.dir.join("ds_config.json")),
        args_of(&p.dir),
        &p.opts,
    )
}

#[test]
fn pairs_agree_with_the_real_stack() {
    let cases = corpus();
    assert!(cases.len() >= 60, "the corpus has {} pairs", cases.len());
    let mut failures = Vec::new();
    let (mut refused, mut accepted, mut values) = (0, 0, 0);
    for pair in &cases {
        let (name, fixture) = (&pair.name, &pair.fixture);
        let report = check_pair(pair);
        let ours: Vec<&str> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| f.code)
            .collect();
        let real_error = fixture["verdict"] == "error";
        if real_error {
            refused += 1;
            let first = fixture["errors"][0]["error"].as_str().unwrap_or("");
            let want = cause_codes(first);
            if ours.is_empty() {
                failures.push(format!(
                    "{name}: the real stack refuses ({first:.160}); we accept"
                ));
            } else if want.is_empty() {
                failures.push(format!("{name}: unclassified real error: {first:.200}"));
            } else if !ours.iter().any(|c| want.contains(c)) {
                failures.push(format!(
                    "{name}: real cause {want:?} ({first:.120}); ours {ours:?}"
                ));
            }
            continue;
        }
        accepted += 1;
        if !ours.is_empty() {
            let msgs: Vec<String> = report
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .map(|f| format!("{} {}", f.code, f.message))
                .collect();
            failures.push(format!(
                "{name}: the real stack accepts; we refuse: {msgs:?}"
            ));
            continue;
        }
        // Accepted: the config DeepSpeed receives, key by key (where the real one is known).
        if fixture["final_config"].is_null() {
            continue;
        }
        let real = leaves(&from_fixture(&fixture["final_config"]));
        let mine = leaves(&report.outcome.as_ref().unwrap().config);
        for (k, v) in &real {
            values += 1;
            if !same_value(mine.get(k), v) {
                failures.push(format!(
                    "{name}: `{k}` is {} after the real chain; ours {}",
                    v.repr(),
                    mine.get(k).map_or("<absent>".into(), Py::repr)
                ));
            }
        }
        for k in mine.keys() {
            if !real.contains_key(k) {
                failures.push(format!("{name}: we have `{k}`, the real chain does not"));
            }
        }
    }
    eprintln!(
        "{} pairs: {refused} refused, {accepted} accepted, {values} final values compared",
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Renders every finding of a pair the way `recipe check` prints it.
fn render(dir: &Path) -> String {
    let opts_text = std::fs::read_to_string(dir.join("options")).unwrap_or_default();
    let mut opts = Options {
        world: 1,
        samples: None,
        hidden_size: None,
        has_eval: None,
        targets: Targets::newest(),
    };
    for pair in opts_text.split_whitespace() {
        let (k, v) = pair.split_once('=').expect("options are key=value");
        match k {
            "world" => opts.world = v.parse().unwrap(),
            "samples" => opts.samples = Some(v.parse().unwrap()),
            "hidden_size" => opts.hidden_size = Some(v.parse().unwrap()),
            "has_eval" => opts.has_eval = Some(v.parse().unwrap()),
            _ => panic!("unknown option {k}"),
        }
    }
    let report = lint::check(read(&dir.join("ds_config.json")), args_of(dir), &opts);
    let mut out = String::new();
    for f in &report.findings {
        let (d, other) = report.split(f);
        let other = other.as_ref().map(|(f, l)| (*f, l.as_slice()));
        out.push_str(&render_human_with(
            &d,
            report.file(f.primary.side),
            other,
            Style::Plain,
        ));
    }
    out
}

fn snapshot_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("tests/pairs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn pair_diagnostics_match_snapshots() {
    for dir in snapshot_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let rendered = render(&dir);
        insta::with_settings!({snapshot_suffix => name.clone(), prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!("pair", rendered);
        });
    }
}

#[test]
fn every_pair_code_has_a_failing_pair() {
    let dirs = snapshot_dirs();
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    for (code, name, _) in lint::codes::CODES {
        let dir = dirs
            .iter()
            .zip(&names)
            .find(|(_, n)| n.starts_with(code))
            .map(|(d, _)| d.clone())
            .unwrap_or_else(|| panic!("no failing pair for {code} ({name}) in tests/pairs/"));
        assert!(
            render(&dir).contains(code),
            "tests/pairs/{} does not report {code}",
            dir.display()
        );
    }
    for code in lint::codes::SHARED {
        assert!(
            names.iter().any(|n| n.starts_with(code)),
            "no failing pair for {code} in tests/pairs/"
        );
    }
}

#[test]
fn pair_codes_do_not_collide_with_recipe_codes() {
    let recipe: Vec<&str> = recipe::diagnostics::codes::all()
        .into_iter()
        .map(|(c, _, _)| c)
        .collect();
    for (code, ..) in lint::codes::CODES {
        assert!(!recipe.contains(code), "{code} is also a recipe code");
    }
    for code in lint::codes::SHARED {
        assert!(recipe.contains(code), "{code} is not a recipe code");
    }
}

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    /// Keys the stack reads, so that generated configs reach its code paths.
    const KEYS: &[&str] = &[
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "optimizer",
        "scheduler",
        "params",
        "type",
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "warmup_min_lr",
        "warmup_max_lr",
        "warmup_num_steps",
        "total_num_steps",
        "zero_optimization",
        "stage",
        "offload_optimizer",
        "offload_param",
        "device",
        "cpu_offload",
        "reduce_bucket_size",
        "stage3_prefetch_bucket_size",
        "fp16",
        "bf16",
        "enabled",
        "amp",
        "steps_per_print",
        "zero_allow_untested_optimizer",
        "per_device_train_batch_size",
        "learning_rate",
        "adam_beta1",
        "fp16_full_eval",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "min_lr",
        "eval_strategy",
        "save_strategy",
        "load_best_model_at_end",
        "save_steps",
        "eval_steps",
        "warmup_steps",
        "max_steps",
        "num_train_epochs",
        "auto_find_batch_size",
        "save_on_each_node",
        "x",
    ];

    fn value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-3i64..70).prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            Just(Value::from("auto")),
            Just(Value::from("cosine_with_min_lr")),
            Just(Value::from("steps")),
            Just(Value::from("AdamW")),
            ".{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                    serde_json::Value::Object(
                        kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                    )
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn any_pair_is_checked_without_panic(
            ds in value(),
            args in value(),
            cut in any::<prop::sample::Index>(),
            world in 1u64..9,
            samples in prop::option::of(0u64..5000),
            flags in prop::collection::vec(prop::sample::select(KEYS), 0..8),
        ) {
            let ds_text = serde_json::to_string_pretty(&ds).unwrap();
            let args_text = serde_json::to_string(&args).unwrap();
            let opts = Options {
                world,
                samples,
                hidden_size: Some(64),
                has_eval: Some(false),
                targets: Targets::newest(),
            };
            // Whole, and cut anywhere (on a character boundary).
            let mut at = cut.index(ds_text.len() + 1);
            while !ds_text.is_char_boundary(at) {
                at -= 1;
            }
            for text in [ds_text.as_str(), &ds_text[..at]] {
                let ds_file = SourceFile::new("ds.json", text);
                let _ = lint::check(ds_file.clone(), Some(ArgsInput::Json(SourceFile::new("a.json", args_text.clone()))), &opts);
                let line: Vec<String> = flags.iter().map(|k| format!("--{k}")).collect();
                let report = lint::check(ds_file, Some(ArgsInput::Flags(SourceFile::new("f", line.join(" 7 ")))), &opts);
                for f in &report.findings {
                    let (d, other) = report.split(f);
                    let other = other.as_ref().map(|(f, l)| (*f, l.as_slice()));
                    let _ = render_human_with(&d, report.file(f.primary.side), other, Style::Plain);
                }
            }
        }
    }
}

/// A DeepSpeed config (flattened) as DeepSpeed reads it, so that two spellings of the same run
/// compare equal: the deprecated ZeRO keys as DeepSpeed maps them (schema/upstream.rs
/// `DEEPSPEED_RENAMED`: `cpu_offload: true` is optimizer offload to the CPU, `cpu_offload_param`
/// parameter offload, `cpu_offload_use_pin_memory` is not applied, the fp16 gather key is the
/// 16-bit one, `bfloat16` is not read beside `bf16`), null as absent, DeepSpeed's own optimizer
/// names in lower case (it lowercases them), the parameters of a disabled precision section and
/// the ZeRO keys DeepSpeed ignores at the stage (the schema's `stages`) and the top-level keys
/// it does not read dropped.
fn deepspeed_reading(flat: &mut BTreeMap<String, Py>) {
    for (old, new) in [
        (
            "zero_optimization.cpu_offload",
            "zero_optimization.offload_optimizer.device",
        ),
        (
            "zero_optimization.cpu_offload_param",
            "zero_optimization.offload_param.device",
        ),
    ] {
        if let Some(v) = flat.remove(old) {
            if v.truthy() && !flat.contains_key(new) {
                flat.insert(new.into(), Py::Str("cpu".into()));
            }
        }
    }
    flat.remove("zero_optimization.cpu_offload_use_pin_memory");
    // The deprecated gather key is read as the 16-bit one (honoured, DEEPSPEED_RENAMED).
    if let Some(v) = flat.remove("zero_optimization.stage3_gather_fp16_weights_on_model_save") {
        flat.entry("zero_optimization.stage3_gather_16bit_weights_on_model_save".into())
            .or_insert(v);
    }
    // `bfloat16` is read only without `bf16` (which accelerate always inserts under HF).
    if flat.keys().any(|k| k.starts_with("bf16.")) {
        flat.retain(|k, _| !k.starts_with("bfloat16."));
    }
    // Old names DeepSpeed no longer reads.
    for (old, _, _, honoured) in recipe::schema::upstream::DEEPSPEED_RENAMED {
        if !honoured {
            flat.retain(|k, _| k != old && !k.starts_with(&format!("{old}.")));
        }
    }
    // null is "not set": the reader's default applies.
    flat.retain(|_, v| *v != Py::None);
    // Top-level keys DeepSpeed does not read: ignored.
    flat.retain(|k, _| {
        let top = k.split('.').next().unwrap_or(k);
        recipe::schema::upstream::DEEPSPEED_TOP_LEVEL
            .binary_search(&top)
            .is_ok()
    });
    let facts = recipe::upstream::versions::Facts::for_targets(&Targets::newest());
    if let Some(Py::Str(t)) = flat.get("optimizer.type") {
        let lower = t.to_lowercase();
        if facts.ds_optimizers.contains(&lower.as_str()) {
            flat.insert("optimizer.type".into(), Py::Str(lower));
        }
    }
    for section in ["fp16", "bf16"] {
        let on = flat
            .get(&format!("{section}.enabled"))
            .is_some_and(Py::truthy);
        if !on {
            flat.retain(|k, _| !k.starts_with(&format!("{section}.")) || k.ends_with(".enabled"));
        }
    }
    let stage = flat
        .get("zero_optimization.stage")
        .and_then(Py::number)
        .unwrap_or(0.0) as i64;
    flat.retain(|k, _| {
        deepspeed_key_spec(k)
            .is_none_or(|spec| spec.stages.is_empty() || spec.stages.contains(&stage))
    });
}

/// The schema's key that writes this DeepSpeed key.
fn deepspeed_key_spec(ds_key: &str) -> Option<&'static recipe::schema::KeySpec> {
    recipe::schema::blocks::BLOCKS
        .iter()
        .flat_map(|b| b.keys.iter())
        .find(|k| k.deepspeed == Some(ds_key))
}

/// DeepSpeed's default for a key, where the schema states it as a literal.
fn deepspeed_default(ds_key: &str) -> Option<Py> {
    use recipe::schema::{KeyDefault, Lit};
    let lit = match deepspeed_key_spec(ds_key)?.default {
        KeyDefault::Value(l, _) | KeyDefault::Upstream(l, _) => l,
        _ => return None,
    };
    Some(match lit {
        Lit::Int(i) => Py::Int(i128::from(i)),
        Lit::Float(f) => Py::Float(f),
        Lit::Bool(b) => Py::Bool(b),
        Lit::Word(w) | Lit::Str(w) => Py::Str(w.into()),
        _ => return None,
    })
}

/// `recipe import` of every accepted pair, then `recipe build` of the recipe: the pair the build
/// writes, taken through the same stack, gives DeepSpeed the same values the original pair gave
/// it in the real chain (conformance/fixtures/pairs `final_config`), and gives the Trainer the
/// same TrainingArguments (the fixture's `args`, the ones the run uses).
#[test]
fn accepted_pairs_import_and_build_to_the_same_effective_values() {
    use recipe::commands::import::{import, Inputs};
    use recipe::emit::{self, deepspeed::Style, Layout};

    let mut failures = Vec::new();
    let (mut checked, mut values) = (0, 0);
    for pair in corpus() {
        let (name, fixture, opts, case_dir) = (&pair.name, &pair.fixture, &pair.opts, &pair.dir);
        if fixture["verdict"] != "ok" || fixture["final_config"].is_null() {
            continue;
        }
        let ds_text = std::fs::read_to_string(case_dir.join("ds_config.json")).unwrap();
        let ds: serde_json::Value = serde_json::from_str(&ds_text).unwrap();
        // The TrainingArguments as written (flags read as argparse reads them).
        let args: serde_json::Value = match args_of(case_dir) {
            Some(ArgsInput::Json(f)) => serde_json::from_str(&f.text).unwrap(),
            Some(ArgsInput::Flags(f)) => {
                let release = recipe::schema::upstream::HfFields::for_target(
                    recipe::upstream::versions::Library::Transformers.newest(),
                );
                let words = lint::args::script_flags(lint::args::shell_words(&f.text));
                let a = lint::args::Args::from_flags(&words, release);
                serde_json::Value::Object(
                    a.fields
                        .iter()
                        .filter(|(n, _)| a.given(n).is_some())
                        .map(|(n, f)| (n.clone(), f.value.to_json()))
                        .collect(),
                )
            }
            None => serde_json::json!({}),
        };
        let inputs = Inputs {
            model: Some("bert-base-uncased".into()),
            train: Some("train.jsonl".into()),
            samples: opts.samples,
            labels: Some(2),
            hidden_size: opts.hidden_size,
            gpus: Some(opts.world),
            origin: name.clone(),
            ..Inputs::default()
        };
        let text = import(&ds, Some(&args), &inputs);
        let resolve_options = recipe::resolve::Options::default();
        let recipe_checked = recipe::check::check_source_with(&text, &resolve_options);
        if recipe_checked.has_errors() {
            let errors: Vec<String> = recipe_checked
                .diagnostics
                .iter()
                .filter(|d| d.is_error())
                .map(|d| format!("{} {}", d.code, d.message))
                .collect();
            failures.push(format!(
                "{name}: the imported recipe does not check: {errors:?}"
            ));
            continue;
        }
        checked += 1;
        let r = recipe::resolve::resolve(recipe_checked.file.as_ref().unwrap(), &resolve_options);
        let layout = Layout {
            recipe_dir_from_out: ".".into(),
            out_dir_from_recipe: ".".into(),
        };
        let source = SourceFile::new("i.rcp", text.clone());
        let built = emit::build(&r, &source, &[], &layout, Style::Explicit).files;
        let file = |n: &str| {
            let (_, bytes) = built.iter().find(|(f, _)| f == n).unwrap();
            SourceFile::new(n, String::from_utf8(bytes.clone()).unwrap())
        };
        let report = lint::check(
            file("ds_config.json"),
            Some(ArgsInput::Json(file("training_args.json"))),
            opts,
        );
        let errors: Vec<String> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| format!("{} {}", f.code, f.message))
            .collect();
        if !errors.is_empty() {
            failures.push(format!("{name}: the rebuilt pair is refused: {errors:?}"));
            continue;
        }
        // The TrainingArguments the Trainer gets from the rebuilt arguments file.
        let release = recipe::schema::upstream::HfFields::for_target(
            recipe::upstream::versions::Library::Transformers.newest(),
        );
        let rebuilt_args = lint::args::Args::from_json(
            &json::parse(&file("training_args.json").text).unwrap(),
            release,
        );
        // With a DeepSpeed `scheduler` section the run uses DeepSpeed's: HF's schedule fields do
        // not reach it (R1215), and the recipe writes its counterpart's name there instead.
        let ds_scheduler = !fixture["final_config"]["scheduler"].is_null();
        if let Some(serde_json::Value::Object(real_args)) = fixture.get("args") {
            for (field, real) in real_args {
                let schedule_field = ["lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps"]
                    .contains(&field.as_str());
                if ds_scheduler && schedule_field {
                    continue;
                }
                values += 1;
                let real = from_fixture(real);
                // A warmup fraction and the whole steps it comes to are the same warmup
                // (`get_warmup_steps`, the fixture's `steps.warmup`).
                if field == "warmup_steps" {
                    let total = fixture["steps"]["total"].as_f64().unwrap_or(0.0);
                    let w = rebuilt_args.num("warmup_steps", 0.0);
                    let ours = if w >= 1.0 {
                        w.floor()
                    } else {
                        (total * w).ceil()
                    };
                    if Some(ours) == fixture["steps"]["warmup"].as_f64() {
                        continue;
                    }
                }
                if !same_value(rebuilt_args.get(field), &real) {
                    failures.push(format!(
                        "{name}: the Trainer gets {field} = {} from the pair, {} from import → build",
                        real.repr(),
                        rebuilt_args.get(field).map_or("<absent>".into(), Py::repr)
                    ));
                }
            }
        }
        let mut real = leaves(&from_fixture(&fixture["final_config"]));
        let mut mine = leaves(&report.outcome.as_ref().unwrap().config);
        deepspeed_reading(&mut real);
        deepspeed_reading(&mut mine);
        // A config without `gradient_accumulation_steps` trains HF's loop with the arguments'
        // accumulation and DeepSpeed with accelerate's 1 (R1212): one recipe cannot say both;
        // the import keeps the arguments' value, and the pair check warns.
        if check_pair(&pair)
            .findings
            .iter()
            .any(|f| f.code == "R1212" && f.message.contains("gradient_accumulation_steps"))
        {
            real.remove("gradient_accumulation_steps");
        }
        for (k, v) in &real {
            values += 1;
            // Not written by the build: DeepSpeed's default, if the schema says it is this.
            let same = match mine.get(k) {
                None => deepspeed_default(k).is_some_and(|d| d.py_eq(v)),
                ours => same_value(ours, v),
            };
            if !same {
                failures.push(format!(
                    "{name}: `{k}` reaches DeepSpeed as {} from the pair, {} from import → build",
                    v.repr(),
                    mine.get(k).map_or("<absent>".into(), Py::repr)
                ));
            }
        }
    }
    eprintln!("{checked} accepted pairs imported and rebuilt, {values} DeepSpeed values compared");
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
