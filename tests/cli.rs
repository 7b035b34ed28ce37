//! The command line as a user meets it: exit codes, output streams, JSON, fmt in place.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::stderr;

fn recipe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recipe-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn clean_recipe_exits_zero() {
    let o = recipe(&["check", "recipes/cls.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The seed recipe's WarmupDecayLR lags HF's linear by a step: a warning, not an error.
    assert!(
        stderr(&o).contains("recipes/cls.rcp: 1 warning"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn errors_exit_one_and_every_file_is_reported() {
    let o = recipe(&[
        "check",
        "tests/diagnostics/R0011-unknown-key.rcp",
        "recipes/cls.rcp",
        "tests/diagnostics/R0014-duplicate-key.rcp",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("R0011") && err.contains("did you mean `accumulate`?"),
        "{err}"
    );
    assert!(err.contains("R0014"), "{err}");
    assert!(err.contains("recipes/cls.rcp: 1 warning"), "{err}");
}

#[test]
fn missing_file_and_bad_usage_exit_two() {
    let o = recipe(&["check", "no/such.rcp"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read `no/such.rcp`"));
    assert_eq!(recipe(&["check"]).status.code(), Some(2));
    assert_eq!(recipe(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        recipe(&["check", "--format", "xml", "recipes/cls.rcp"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn io_error_wins_over_recipe_errors() {
    let o = recipe(&[
        "check",
        "tests/diagnostics/R0011-unknown-key.rcp",
        "no/such.rcp",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn non_utf8_input_is_an_io_error() {
    let dir = temp_dir("utf8");
    let path = dir.join("bin.rcp");
    std::fs::write(&path, [b'x', 0xff, 0xfe]).unwrap();
    let o = recipe(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not UTF-8"));
}

#[test]
fn json_lines_carry_the_editor_contract() {
    let o = recipe(&[
        "check",
        "--format",
        "json",
        "tests/diagnostics/many-problems.rcp",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 6);
    let first = &lines[0];
    for field in [
        "code", "severity", "message", "file", "span", "labels", "help",
    ] {
        assert!(first.get(field).is_some(), "missing {field} in {first}");
    }
    assert_eq!(first["code"], "R0010");
    assert_eq!(first["severity"], "error");
    assert_eq!(first["file"], "tests/diagnostics/many-problems.rcp");
    // `modle` on line 2, columns 1..6, bytes after the first line.
    assert_eq!(first["span"]["start"]["line"], 2);
    assert_eq!(first["span"]["start"]["column"], 1);
    assert_eq!(first["span"]["end"]["column"], 6);
    let first_line_len = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics/many-problems.rcp"),
    )
    .unwrap()
    .lines()
    .next()
    .unwrap()
    .len();
    assert_eq!(first["span"]["start"]["offset"], first_line_len + 1);
    assert_eq!(first["labels"][0]["primary"], true);
    // Duplicate key: a secondary label too.
    let dup = lines.iter().find(|l| l["code"] == "R0014").unwrap();
    assert_eq!(dup["labels"].as_array().unwrap().len(), 2);
    assert_eq!(dup["labels"][1]["primary"], false);
}

#[test]
fn json_on_a_clean_recipe_prints_nothing() {
    let o = recipe(&[
        "check",
        "--format",
        "json",
        "tests/diagnostics/ok/R0101-batch-mismatch.rcp",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout.is_empty());
    // Warnings are printed, and do not fail the check.
    let o = recipe(&["check", "--format", "json", "recipes/cls.rcp"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["severity"], "warning");
}

#[test]
fn fmt_rewrites_in_place_and_check_mode_reports() {
    let dir = temp_dir("fmt");
    let path = dir.join("messy.rcp");
    std::fs::write(
        &path,
        "# messy\nbatch   {micro=4,accumulate=2}\ndata{train=\"t.jsonl\"}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = recipe(&["fmt", "--check", p]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not formatted"));
    let o = recipe(&["fmt", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let formatted = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        formatted,
        "# messy\nbatch { micro = 4, accumulate = 2 }\ndata { train = \"t.jsonl\" }\n"
    );
    assert_eq!(recipe(&["fmt", "--check", p]).status.code(), Some(0));
    // Nothing but the file itself is left in the directory.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn fmt_leaves_a_file_with_syntax_errors_untouched() {
    let dir = temp_dir("fmt-bad");
    let path = dir.join("bad.rcp");
    let text = "batch { micro = \n";
    std::fs::write(&path, text).unwrap();
    let o = recipe(&["fmt", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn explain_shows_values_with_provenance_and_step_accounting() {
    let o = recipe(&["explain", "recipes/cls.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    // Grouped by block: `global` under `batch`.
    assert!(
        out.contains("\nbatch\n")
            && out.contains("  global ")
            && out.contains("derived: micro × accumulate × world"),
        "{out}"
    );
    assert!(out.contains("written at recipes/cls.rcp:21:16"), "{out}");
    // --wide: one row per dotted key.
    let o = recipe(&["explain", "recipes/cls.rcp", "--wide"]);
    let wide = String::from_utf8(o.stdout).unwrap();
    assert!(
        wide.lines().any(|l| l.starts_with("batch.global ")),
        "{wide}"
    );
    assert!(
        out.contains("optimizer steps in all") && out.contains("222"),
        "{out}"
    );
    // One key, with a flag changing the world size.
    let o = recipe(&["explain", "recipes/cls.rcp", "batch.global", "--gpus", "2"]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.starts_with("batch.global = 128"), "{out}");
    assert!(out.contains("train_batch_size"));
    // What accelerate does to a value on its way to DeepSpeed (not on the old stacks).
    let o = recipe(&["explain", "recipes/cls.rcp", "train.logging_steps"]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("upstream:") && out.contains("steps_per_print with inf"),
        "{out}"
    );
    let o = recipe(&["explain", "recipes/legacy_seed.rcp", "train.logging_steps"]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("steps_per_print") && !out.contains("upstream:"),
        "{out}"
    );
    assert_eq!(
        recipe(&["explain", "recipes/cls.rcp", "batch.glob"])
            .status
            .code(),
        Some(1)
    );
}

#[test]
fn explain_json_carries_every_number() {
    let o = recipe(&["explain", "--format", "json", "recipes/cls.rcp"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"]["total"], 222);
    assert_eq!(v["steps"]["per_epoch"], 74);
    assert_eq!(v["steps"]["warmup"], 14);
    assert_eq!(v["lr"].as_array().unwrap().len(), 222);
    assert_eq!(v["lr"][0]["deepspeed"], 0.0);
    let micro = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "batch.micro")
        .unwrap();
    assert_eq!(micro["json"], 16);
    assert_eq!(micro["source"]["kind"], "written");
    assert_eq!(micro["deepspeed"], "train_micro_batch_size_per_gpu");
}

#[test]
fn explain_writes_the_lr_csv() {
    let dir = temp_dir("lrcsv");
    let csv = dir.join("lr.csv");
    let o = recipe(&[
        "explain",
        "recipes/cls.rcp",
        "--lr-csv",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 223);
    assert!(text.starts_with("step,hf,deepspeed\n1,0,0\n"), "{text}");
}

#[test]
fn steps_prints_the_seed_timelines_and_exits_one_on_divergence() {
    let o = recipe(&[
        "steps",
        "tests/diagnostics/R0201-seed-timeline.rcp",
        "--versions",
        "transformers=5.24.0,accelerate=1.15.0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("transformers 4.26.0") && out.contains("DIVERGE"),
        "{out}"
    );
    assert!(
        out.contains("transformers 5.24.0") && out.contains("they agree"),
        "{out}"
    );
    let o = recipe(&[
        "steps",
        "--format",
        "json",
        "tests/diagnostics/ok/R0201-step-drift.rcp",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tl = &v["timelines"][0];
    assert_eq!(tl["diverges"], false);
    assert_eq!(tl["batches_per_epoch"], 13);
    assert_eq!(tl["rows"].as_array().unwrap().len(), 39);
    // Native: ceil(13 / 4) = 4 steps per epoch, the last over 13 - 12 = 1 micro-batch.
    assert_eq!(v["native"]["per_epoch"], 4);
    assert_eq!(v["native"]["last_window"], 1);
    assert_eq!(v["native"]["total"], 12);
}

/// A recipe of a billion micro-batches an epoch: `steps` lists the first 100,000 and sums up
/// the rest (its counts and first disagreement are the whole run's), `explain` lists a sample
/// of its 750 million LR steps, and `--lr-csv` refuses a file of that size; all at once, where
/// walking every micro-batch took minutes and gigabytes.
#[test]
fn a_billion_micro_batches_are_summed_up_not_listed() {
    let huge = "tests/diagnostics/R0201-a-billion-micro-batches.rcp";
    let o = recipe(&["steps", "--format", "json", huge]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tl = &v["timelines"][0];
    assert_eq!(tl["diverges"], true);
    assert_eq!(tl["truncated"], true);
    assert_eq!(tl["rows"].as_array().unwrap().len(), 100_000);
    assert_eq!(tl["rows"][99_999]["count"], 100_000);
    // transformers 4.26: floor(L / 4) steps an epoch, and HF stops at 3 of them; its last
    // micro-batch is the last multiple of 4 in the third epoch.
    assert_eq!(tl["hf_steps"], 750_000_003u64);
    assert_eq!(tl["micro_batches"], 3_000_000_014u64);
    let d = &tl["first_divergence"];
    assert_eq!(
        (&d["count"], &d["epoch"], &d["step_in_epoch"]),
        (&1_000_000_008u64.into(), &2.into(), &3.into())
    );
    let o = recipe(&["steps", huge]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("(the first 100000 of the run's 3000000014 micro-batches)")
            && out.contains("the first disagreement: micro-batch 1000000008 (epoch 2, batch 3)"),
        "{out}"
    );

    let o = recipe(&["explain", "--format", "json", huge]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["lr_steps"], 750_000_003u64);
    assert_eq!(v["lr_sampled"], true);
    let lr = v["lr"].as_array().unwrap();
    assert_eq!(lr.len(), 100_000);
    let steps: Vec<u64> = lr.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]),
        "in order, no step twice"
    );
    assert_eq!(steps[..3], [1, 2, 3]);
    assert_eq!(steps[99_999], 750_000_003);
    // The last 1,000 steps one by one, evenly spaced ones before them.
    assert_eq!(steps[99_000], 750_000_003 - 999);
    assert!(steps[98_999] < 750_000_003 - 999 && steps[1000] > 1000);
    let dir = temp_dir("hugecsv");
    let csv = dir.join("lr.csv");
    let o = recipe(&["explain", huge, "--lr-csv", csv.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("750000003 optimizer steps"),
        "{}",
        stderr(&o)
    );
    assert!(!csv.exists());
}

/// `--lr-csv` writes every step of a run whose report lists a sample of them.
#[test]
fn the_lr_csv_has_every_step_of_a_sampled_report() {
    let dir = temp_dir("samplecsv");
    let rcp = dir.join("long.rcp");
    std::fs::write(
        &rcp,
        "model bert { from = \"m\", task = classify(labels: 2) }\n\
         data { train = \"t.jsonl\", samples = 800000 }\n\
         batch { micro = 1, accumulate = 4 }\n\
         schedule linear { warmup = 10 }\n\
         train { epochs = 1 }\n",
    )
    .unwrap();
    let o = recipe(&["explain", "--format", "json", rcp.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (&v["lr_steps"], &v["lr_sampled"]),
        (&200_000.into(), &true.into())
    );
    let csv = dir.join("lr.csv");
    let o = recipe(&[
        "explain",
        rcp.to_str().unwrap(),
        "--lr-csv",
        csv.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 200_000);
    assert!(rows[199_999].starts_with("200000,"), "{}", rows[199_999]);
    // The sampled steps of the report are the file's rows for the same steps.
    for s in v["lr"].as_array().unwrap().iter().step_by(997) {
        let k = s["step"].as_u64().unwrap() as usize;
        let hf: f64 = rows[k - 1].split(',').nth(1).unwrap().parse().unwrap();
        // serde_json's default float parser may land an ulp off the printed value.
        let want = s["hf"].as_f64().unwrap();
        assert!(
            (hf - want).abs() <= 1e-15 * want.abs(),
            "step {k}: {hf} {want}"
        );
    }
}

#[test]
fn bad_flags_are_usage_errors() {
    for args in [
        &["check", "recipes/cls.rcp", "--set", "batch.mikro=3"][..],
        &["check", "recipes/cls.rcp", "--target", "transformers=x"],
        &["check", "recipes/cls.rcp", "--target", "torch=2.0"],
        &["check", "recipes/cls.rcp", "--gpus", "0"],
        &["steps", "recipes/cls.rcp", "--versions", "accelerate"],
    ] {
        let o = recipe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn build_writes_the_artefacts_atomically_and_identically() {
    let dir = temp_dir("build");
    let out = dir.join("out");
    let o = recipe(&["build", "recipes/cls.rcp", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let names = [
        "ds_config.json",
        "training_args.json",
        "train.py",
        "launch.sh",
        "recipe.lock",
    ];
    let first: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap())
        .collect();
    // Nothing else (no temporary directory) is left behind.
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 5);
    let o = recipe(&["build", "recipes/cls.rcp", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let second: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap())
        .collect();
    assert_eq!(first, second, "builds must be byte-identical");
    // A recipe with errors writes nothing and leaves the previous outputs as they were.
    let o = recipe(&[
        "build",
        "recipes/cls.rcp",
        "-o",
        out.to_str().unwrap(),
        "--set",
        "batch.global=100",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("nothing written"), "{}", stderr(&o));
    let third: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap())
        .collect();
    assert_eq!(first, third);
    let ds: serde_json::Value = serde_json::from_slice(&first[0]).unwrap();
    assert_eq!(ds["train_batch_size"], 64);
    assert_eq!(
        ds["zero_optimization"]["offload_optimizer"]["device"],
        "cpu"
    );
}

#[test]
fn diff_reports_what_changed_and_why() {
    let dir = temp_dir("diff");
    let (a, b) = (dir.join("a"), dir.join("b"));
    assert_eq!(
        recipe(&["build", "recipes/cls.rcp", "-o", a.to_str().unwrap()])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        recipe(&[
            "build",
            "recipes/cls.rcp",
            "-o",
            b.to_str().unwrap(),
            "--gpus",
            "2"
        ])
        .status
        .code(),
        Some(0)
    );
    let lock = |d: &PathBuf| d.join("recipe.lock").to_str().unwrap().to_string();
    let o = recipe(&["diff", &lock(&a), &lock(&a)]);
    assert_eq!(o.status.code(), Some(0));
    let o = recipe(&["diff", &lock(&a), &lock(&b)]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("cluster.gpus") && out.contains("flag --gpus 2"),
        "{out}"
    );
    assert!(out.contains("batch.global") && out.contains("128"), "{out}");
    assert!(out.contains("artefact.ds_config.json"), "{out}");
}

/// A key with a carriage return (a JSON `\r`) named in the imported recipe's comments, by the
/// import and by the --force marks: escaped, so each comment stays one line and the recipe
/// parses (the `pair` fuzz target found the import's comment broken into recipe text).
#[test]
fn import_comments_escape_line_breaks_in_keys() {
    let dir = temp_dir("import-cr");
    let ds = dir.join("ds_config.json");
    std::fs::write(
        &ds,
        r#"{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "x\ry": 1,
            "zero_optimization": {"stage": 2, "a\rb": 1}}"#,
    )
    .unwrap();
    let o = recipe(&[
        "import",
        ds.to_str().unwrap(),
        "--samples",
        "1000",
        "--force",
    ]);
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(out.contains("`x\\ry`"), "{out}");
    assert!(!out.contains('\r'), "{out:?}");
    recipe::syntax::parse(&out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
}

#[test]
fn import_lints_an_existing_config() {
    let dir = temp_dir("import");
    let ds = dir.join("ds_config.json");
    std::fs::write(
        &ds,
        r#"{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3,
            "zero_optimization": {"stage": 2, "cpu_offload": true}}"#,
    )
    .unwrap();
    // The real stack refuses the pair (DeepSpeed's batch assertion: 10 != 3 × 3 × 1): no
    // recipe, the findings in the JSON file.
    let o = recipe(&["import", ds.to_str().unwrap(), "--samples", "1000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let err = stderr(&o);
    assert!(
        err.contains("R1220") && err.contains("ds_config.json:1:") && err.contains("--force"),
        "{err}"
    );
    // --force writes it, marked.
    let o = recipe(&[
        "import",
        ds.to_str().unwrap(),
        "--samples",
        "1000",
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(
        out.contains("batch {") && out.contains("global = 10"),
        "{out}"
    );
    assert!(
        out.contains("# conflict in the imported pair (--force): R1220"),
        "{out}"
    );
    // The deprecated key is mapped as DeepSpeed maps it.
    assert!(
        out.contains("offload optimizer = cpu")
            && out.contains("# mapped: zero_optimization.cpu_offload"),
        "{out}"
    );
    assert!(
        out.contains("# fill in: model.from is a placeholder"),
        "{out}"
    );
    let err = stderr(&o);
    // The batch triple does not add up (in the recipe too); the legacy key is reported in the
    // JSON.
    assert!(err.contains("R0101") && err.contains("R0031"), "{err}");
    // A misspelt key DeepSpeed would silently ignore.
    std::fs::write(
        &ds,
        r#"{"train_micro_batch_size_per_gpu": 4, "wall_clock_breakdwn": true}"#,
    )
    .unwrap();
    let o = recipe(&["import", ds.to_str().unwrap(), "--samples", "1000"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("did you mean `wall_clock_breakdown`?"),
        "{}",
        stderr(&o)
    );
    let o = recipe(&["import", "no/such.json"]);
    assert_eq!(o.status.code(), Some(2));
    // JSON, but not a config: said plainly, nothing printed.
    let list = dir.join("list.json");
    std::fs::write(&list, "[1, 2]").unwrap();
    let o = recipe(&["import", list.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an object"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
}

#[test]
fn verify_says_plainly_when_python_or_the_libraries_are_missing() {
    let o = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(["verify", "recipes"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RECIPE_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("recipe verify needs Python 3") && err.contains("RECIPE_PYTHON"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
    assert_eq!(recipe(&["verify", "no/such/dir"]).status.code(), Some(2));
    // A directory without recipes: nothing to verify, said before Python is looked for.
    let empty = temp_dir("verify-empty");
    let o = recipe(&["verify", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("has no .rcp file"), "{}", stderr(&o));
}

/// `recipe verify` builds for the installed stack (conformance/make_cases.py `--stack`, plain
/// Python): a library a recipe does not pin gets the installed release; a recipe that pins
/// another release is skipped with the reason, not reported as the real stack failing.
#[test]
fn verify_builds_for_the_installed_stack_and_skips_recipes_pinned_elsewhere() {
    // Plain Python (make_cases.py imports nothing outside the standard library).
    let Some(python) = common::python("conformance/make_cases.py --stack") else {
        return;
    };
    let dir = temp_dir("verify-stack");
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::create_dir_all(dir.join("none")).unwrap();
    let body = "model bert { from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }\n\
                data { train = \"train.jsonl\", samples = 1000 }\n\
                batch { micro = 8 }\n";
    std::fs::write(corpus.join("a-free.rcp"), format!("recipe \"a\"\n{body}")).unwrap();
    std::fs::write(
        corpus.join("b-pinned.rcp"),
        format!("recipe \"b\"\ntarget transformers \"4.6.1\"\n{body}"),
    )
    .unwrap();
    let out = dir.join("build");
    let o = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/make_cases.py"))
        .args(["--recipe", env!("CARGO_BIN_EXE_recipe"), "--corpus"])
        .arg(&corpus)
        .arg("--rejected")
        .arg(dir.join("none"))
        .arg("--out")
        .arg(&out)
        .args([
            "--stack",
            "transformers=4.24.0,accelerate=0.15.0.dev0,deepspeed=0.7.7",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let skipped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("skipped.json")).unwrap()).unwrap();
    let skipped = skipped.as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0]["case"], "b-pinned");
    let why = skipped[0]["why"].as_str().unwrap();
    assert!(
        why.contains("transformers 4.6.1 (installed: 4.24.0)"),
        "{why}"
    );
    assert!(!out.join("cases/b-pinned").exists());
    // The free recipe was built for 4.24.0: its field names, and the case's targets.
    let args: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("cases/a-free/training_args.json")).unwrap(),
    )
    .unwrap();
    assert!(args.get("evaluation_strategy").is_some(), "{args}");
    assert!(args.get("eval_strategy").is_none(), "{args}");
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("cases/a-free/case.json")).unwrap())
            .unwrap();
    assert_eq!(case["targets"]["transformers"], "4.24.0");
    assert_eq!(
        case["targets"]["accelerate"], "0.15.0",
        "a dev release is read as its number"
    );
    assert_eq!(case["targets"]["deepspeed"], "0.7.7");
}

/// `recipe` remembers clean data-file scans across runs (resolve::scan_cache): an unchanged file
/// is not read again (shown by editing the remembered entry), a changed one always is, a file
/// changed within the last two seconds is not remembered, and a broken one never.
#[test]
fn data_scans_are_remembered_only_for_unchanged_clean_files() {
    let dir = temp_dir("scan-cache");
    let cache = dir.join("cache");
    let row = |i: usize| format!("{{\"text\": \"row {i}\", \"label\": \"{}\"}}\n", i % 2);
    let rows = |n: usize| (0..n).map(row).collect::<String>();
    std::fs::write(dir.join("train.jsonl"), rows(10)).unwrap();
    std::fs::write(
        dir.join("r.rcp"),
        "recipe \"r\"\nmodel bert { from = \"bert-base-uncased\", hidden_size = 768, task = classify(labels: 2) }\n\
         data { train = \"train.jsonl\", text = \"text\", label = \"label\" }\nbatch { micro = 2 }\n\
         optimizer adamw { lr = 1e-4 }\n",
    )
    .unwrap();
    let samples = || {
        let o = Command::new(env!("CARGO_BIN_EXE_recipe"))
            .args(["explain", "r.rcp", "data.samples"])
            .current_dir(&dir)
            .env("NO_COLOR", "1")
            .env("RECIPE_CACHE", &cache)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines()
            .next()
            .and_then(|l| l.strip_prefix("data.samples = "))
            .unwrap_or_else(|| panic!("{out}{}", stderr(&o)))
            .parse::<u64>()
            .unwrap()
    };
    let entries = || -> Vec<PathBuf> {
        std::fs::read_dir(cache.join("scans"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    };
    // Just written: counted, but not remembered (a change within the timestamp granularity
    // could go unnoticed).
    assert_eq!(samples(), 10);
    assert!(entries().is_empty(), "{:?}", entries());
    std::thread::sleep(std::time::Duration::from_millis(2100));
    assert_eq!(samples(), 10);
    let remembered = entries();
    assert_eq!(remembered.len(), 1);
    // The next run takes the remembered scan: edit it and the answer follows.
    let text = std::fs::read_to_string(&remembered[0]).unwrap();
    let edited = text.replacen("\"rows\":10", "\"rows\":777", 1);
    assert_ne!(text, edited, "{text}");
    std::fs::write(&remembered[0], edited).unwrap();
    assert_eq!(samples(), 777);
    // Any change to the file (here one more row) reads it again.
    std::fs::write(dir.join("train.jsonl"), rows(11)).unwrap();
    assert_eq!(samples(), 11);
    // A file with a broken row is never remembered.
    std::fs::remove_dir_all(cache.join("scans")).unwrap();
    std::fs::write(dir.join("train.jsonl"), rows(3) + "not json\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let _ = samples();
    assert!(entries().is_empty(), "{:?}", entries());
}

/// Several nodes: launch.sh always names the hostfile (the launcher's default when the recipe
/// gives none, with R1001 saying so), and a local hostfile with too few hosts stops the build
/// before anything is written (R1003) — relative to the recipe's directory, where launch.sh runs.
#[test]
fn several_nodes_always_name_their_hostfile() {
    let dir = temp_dir("hostfile");
    let head = "model bert { from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }\n\
                data { train = \"/cluster/train.jsonl\", samples = 1000 }\nbatch { micro = 8 }\n";
    let rcp = dir.join("r.rcp");
    std::fs::write(&rcp, format!("{head}cluster {{ gpus = 8, nodes = 2 }}\n")).unwrap();
    let out = dir.join("out");
    let o = recipe(&["build", rcp.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("R1001"), "{}", stderr(&o));
    let launch = std::fs::read_to_string(out.join("launch.sh")).unwrap();
    assert!(
        launch.contains("  --num_nodes 2 \\\n  --hostfile /job/hostfile \\\n"),
        "{launch}"
    );
    // One node: no hostfile flag (the launcher uses the local GPUs).
    let o = recipe(&[
        "build",
        rcp.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--nodes",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let launch = std::fs::read_to_string(out.join("launch.sh")).unwrap();
    assert!(!launch.contains("--hostfile"), "{launch}");

    // A hostfile next to the recipe with one host for two nodes: an error, nothing written.
    std::fs::write(dir.join("hosts"), "worker-1 slots=8\n").unwrap();
    std::fs::write(
        &rcp,
        format!("{head}cluster {{ gpus = 8, nodes = 2, hostfile = \"hosts\" }}\n"),
    )
    .unwrap();
    let out2 = dir.join("out2");
    let o = recipe(&["build", rcp.to_str().unwrap(), "-o", out2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("R1003"), "{}", stderr(&o));
    assert!(!out2.exists());
    // Two hosts: clean, and launch.sh passes the recipe's path.
    std::fs::write(dir.join("hosts"), "worker-1 slots=8\nworker-2 slots=8\n").unwrap();
    let o = recipe(&["build", rcp.to_str().unwrap(), "-o", out2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("R10"), "{}", stderr(&o));
    let launch = std::fs::read_to_string(out2.join("launch.sh")).unwrap();
    assert!(launch.contains("  --hostfile hosts \\\n"), "{launch}");
}

/// Without the sample count the schedule's steps are unknown: `check` warns (R0204), `build`
/// refuses rather than write artefacts without the schedule, and `--samples` fixes it.
#[test]
fn build_refuses_a_recipe_whose_steps_are_unknown() {
    let dir = temp_dir("no-samples");
    let rcp = dir.join("r.rcp");
    std::fs::write(
        &rcp,
        "model bert { from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }\n\
         data { train = \"/cluster/train.jsonl\" }\nbatch { micro = 8 }\n\
         schedule WarmupLR { warmup = 100 }\n",
    )
    .unwrap();
    let o = recipe(&["check", rcp.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = dir.join("out");
    for auto in [false, true] {
        let mut args = vec!["build", rcp.to_str().unwrap(), "-o", out.to_str().unwrap()];
        if auto {
            args.push("--auto");
        }
        let o = recipe(&args);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot state the schedule's steps"),
            "{}",
            stderr(&o)
        );
        assert!(!out.exists());
    }
    let o = recipe(&[
        "build",
        rcp.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--samples",
        "1000",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ds = std::fs::read_to_string(out.join("ds_config.json")).unwrap();
    assert!(ds.contains("\"WarmupLR\""), "{ds}");
}

/// A build that cannot replace one of its outputs (here a directory where recipe.lock goes)
/// replaces none of them: the previous outputs stay as they were.
#[test]
fn a_failed_build_leaves_every_previous_output_as_it_was() {
    let dir = temp_dir("all-or-nothing");
    let out = dir.join("out");
    let o = recipe(&["build", "recipes/cls.rcp", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before: Vec<Vec<u8>> = ["ds_config.json", "training_args.json", "launch.sh"]
        .iter()
        .map(|f| std::fs::read(out.join(f)).unwrap())
        .collect();
    std::fs::remove_file(out.join("recipe.lock")).unwrap();
    std::fs::create_dir_all(out.join("recipe.lock/kept")).unwrap();
    let o = recipe(&[
        "build",
        "recipes/cls.rcp",
        "-o",
        out.to_str().unwrap(),
        "--set",
        "batch.micro=8",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a directory"), "{}", stderr(&o));
    for (f, old) in ["ds_config.json", "training_args.json", "launch.sh"]
        .iter()
        .zip(&before)
    {
        assert_eq!(
            &std::fs::read(out.join(f)).unwrap(),
            old,
            "{f} was replaced"
        );
    }
    // No temporary directory is left behind.
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `recipe import --format json`: the recipe on stdout, and every line on stderr a JSON object
/// (the recipe's diagnostics and the args file's lint).
#[test]
fn import_json_diagnostics_are_json_lines_on_stderr() {
    let dir = temp_dir("import-json");
    let o = recipe(&["build", "recipes/cls.rcp", "-o", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let args_path = dir.join("args.json");
    let mut args: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("training_args.json")).unwrap()).unwrap();
    args["warmup_ratio"] = serde_json::json!(0.06);
    std::fs::write(&args_path, args.to_string()).unwrap();
    let o = recipe(&[
        "import",
        dir.join("ds_config.json").to_str().unwrap(),
        "--args",
        args_path.to_str().unwrap(),
        "--samples",
        "4708",
        "--format",
        "json",
        "--force",
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("schedule "));
    let err = stderr(&o);
    assert!(err.lines().count() >= 2, "{err}");
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["message"].is_string(), "{line}");
    }
    assert!(
        err.contains("`warmup_ratio` is not a TrainingArguments field"),
        "{err}"
    );
}

/// `recipe check ds_config.json`: the pair linter, with the TrainingArguments as a JSON file, as
/// a launch script, or as flags after `--`; JSON output names the other file on its labels.
#[test]
fn check_lints_a_pair() {
    let pair = "tests/pairs/R1210-lr-mismatch";
    let ds = format!("{pair}/ds_config.json");
    let ta = format!("{pair}/training_args.json");
    let o = recipe(&["check", &ds, "--args", &ta]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("R1210") && err.contains("ds_config.json:6:22"),
        "{err}"
    );
    assert!(err.contains("training_args.json:3:20"), "{err}");
    assert!(err.contains("2 errors"), "{err}");
    // The same values as flags after `--`: the TrainingArguments span is on the command line.
    let o = recipe(&[
        "check",
        &ds,
        "--",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "5e-5",
        "--adam_beta2",
        "0.98",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("<command line>"), "{}", stderr(&o));
    // Matching values: accepted.
    let o = recipe(&[
        "check",
        &ds,
        "--",
        "--per_device_train_batch_size",
        "16",
        "--learning_rate",
        "0.001",
        "--adam_epsilon",
        "1e-8",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // JSON lines: the label in the other file carries it.
    let o = recipe(&["check", &ds, "--args", &ta, "--format", "json"]);
    let out = String::from_utf8(o.stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["code"], "R1210");
    assert!(first["file"].as_str().unwrap().ends_with("ds_config.json"));
    let labels = first["labels"].as_array().unwrap();
    assert!(
        labels.iter().any(|l| l["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("training_args.json"))),
        "{out}"
    );
    // A launch script: the flags after the training script count.
    let o = recipe(&[
        "check",
        "tests/pairs/R1204-flag-not-an-int/ds_config.json",
        "--args",
        "tests/pairs/R1204-flag-not-an-int/args.txt",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("R1204"), "{}", stderr(&o));
    // Pair flags with a recipe, and two sources of arguments, are usage errors.
    let o = recipe(&["check", "recipes/cls.rcp", "--args", &ta]);
    assert_eq!(o.status.code(), Some(2));
    let o = recipe(&["check", &ds, "--args", &ta, "--", "--fp16"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `recipe explain ds_config.json --args …`: the config DeepSpeed receives and where each value
/// came from.
#[test]
fn explain_shows_where_a_pairs_values_come_from() {
    let pair = "tests/pairs/R1212-accumulation-inserted";
    let ds = format!("{pair}/ds_config.json");
    let ta = format!("{pair}/training_args.json");
    let o = recipe(&["explain", &ds, "--args", &ta, "--gpus", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let line = |key: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {out}"))
            .to_string()
    };
    assert!(
        line("train_micro_batch_size_per_gpu")
            .contains("HF fills it from per_device_train_batch_size"),
        "{out}"
    );
    assert!(
        line("train_micro_batch_size_per_gpu").contains("training_args.json:2:3"),
        "{out}"
    );
    assert!(
        line("gradient_accumulation_steps").contains("accelerate inserts it"),
        "{out}"
    );
    assert!(
        line("steps_per_print").contains("accelerate overwrites it"),
        "{out}"
    );
    assert!(
        line("zero_optimization.stage").contains("written (")
            && line("zero_optimization.stage").contains("ds_config.json:4:"),
        "{out}"
    );
    let o = recipe(&[
        "explain",
        &ds,
        "--args",
        &ta,
        "--format",
        "json",
        "gradient_accumulation_steps",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["key"], "gradient_accumulation_steps");
    assert_eq!(v[0]["value"], 1);
    let o = recipe(&["explain", "recipes/cls.rcp", "--args", &ta]);
    assert_eq!(o.status.code(), Some(2));
}
