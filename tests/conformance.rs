//! Conformance against the real libraries, without Python: conformance/fixtures/ holds what
//! transformers 5.25.0 + accelerate 1.16.0 + DeepSpeed 0.19.8 did with each corpus recipe's
//! artefacts (conformance/harness.py; refreshed with conformance/run.sh). Here the current code is
//! compared with those recorded facts: the DeepSpeed config we emit is the one HF filled (no
//! mismatch, nothing changed), and our step accounting and LR per optimizer step equal the real
//! ones (relative error ≤ 1e-12).

use std::path::{Path, PathBuf};

use recipe::check::check_source_with;
use recipe::emit::{self, deepspeed::Style, Layout};
use recipe::resolve::{resolve, Options};
use recipe::SourceFile;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `*.json` fixture under `conformance/fixtures/<sub>`, in file-name order.
fn json_dir(sub: &str) -> Vec<Value> {
    let dir = root().join("conformance/fixtures").join(sub);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

/// The generated corpus and the example recipes (recipes/*.rcp, built for the pinned stack;
/// legacy_seed.rcp, pinned to transformers 4.6.1, runs on its own stack: legacy-run).
fn fixtures() -> Vec<Value> {
    let mut all = json_dir("corpus");
    all.extend(json_dir("examples"));
    all
}

/// Every example recipe has its fixture.
#[test]
fn every_example_recipe_ran_on_the_real_stack() {
    let have: Vec<String> = json_dir("examples")
        .iter()
        .map(|f| f["recipe"].as_str().unwrap().to_string())
        .collect();
    let mut n = 0;
    for e in std::fs::read_dir(root().join("recipes")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.ends_with(".rcp") {
            continue;
        }
        let rel = format!("recipes/{name}");
        if name == "legacy_seed.rcp" {
            // Pinned to transformers 4.6.1 + DeepSpeed 0.3.16: checked against those releases
            // (conformance/fixtures/legacy/, the 4.6.1 corpus in legacy-run/).
            continue;
        }
        assert!(have.contains(&rel), "{rel} has no conformance fixture");
        n += 1;
    }
    assert!(n >= 6, "{n} examples");
}

/// The explicit artefacts `recipe build` writes for a resolved recipe (paths relative to it).
fn explicit_artefacts(r: &recipe::resolve::Resolved, text: &str) -> Vec<(String, Vec<u8>)> {
    let layout = Layout {
        recipe_dir_from_out: ".".into(),
        out_dir_from_recipe: ".".into(),
    };
    emit::build(
        r,
        &SourceFile::new("r.rcp", text.to_string()),
        &[],
        &layout,
        Style::Explicit,
    )
    .files
}

/// JSON equality where numbers compare by value (1 == 1.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn the_corpus_is_large_and_every_fixture_is_well_formed() {
    let all = fixtures();
    assert!(all.len() >= 200, "only {} corpus fixtures", all.len());
    assert!(json_dir("corpus").len() >= 200);
    for f in &all {
        assert_eq!(f["format"], "recipe-conformance-fixture/1", "{}", f["case"]);
        assert!(f["versions"]["transformers"] == "5.25.0", "{}", f["case"]);
    }
}

/// Every corpus recipe (the ones our checker accepts) is accepted by the real stack: HF, its
/// DeepSpeed fill/match, and DeepSpeed's validation at the recipe's world size.
#[test]
fn the_real_stack_accepts_every_corpus_recipe() {
    for f in fixtures() {
        assert_eq!(
            f["verdict"], "ok",
            "{}: the real stack refused it: {}",
            f["case"], f["errors"]
        );
    }
}

#[test]
fn hf_never_reports_a_mismatch_and_fills_exactly_what_we_emitted() {
    for f in fixtures() {
        let case = f["case"].as_str().unwrap();
        let mismatch = f["errors"].as_array().unwrap().iter().any(|e| {
            e["error"]
                .as_str()
                .unwrap_or("")
                .contains("mismatch TrainingArguments")
        });
        assert!(!mismatch, "{case}: HF reported a mismatch: {}", f["errors"]);
        if f["config_equal"].is_null() {
            // The real stack stopped before filling (TrainingArguments refused the recipe).
            assert_eq!(f["verdict"], "error", "{case}");
            continue;
        }
        assert_eq!(
            f["config_equal"], true,
            "{case}: HF changed the config: {}",
            f["config_diff"]
        );
    }
}

#[test]
fn our_current_config_steps_and_learning_rates_match_the_real_stack() {
    for f in fixtures() {
        let case = f["case"].as_str().unwrap();
        let path = root().join(f["recipe"].as_str().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let options = Options {
            base_dir: path.parent().map(Path::to_path_buf),
            ..Options::default()
        };
        let checked = check_source_with(&text, &options);
        if checked.has_errors() {
            // Our checker rejects it (a rule added after the run): the real stack must agree.
            assert_eq!(
                f["verdict"], "error",
                "{case}: we reject it, the real stack accepted it"
            );
            continue;
        }
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        // The config we emit today is the one the real HF filled (and DeepSpeed validated).
        let files = explicit_artefacts(&r, &text);
        let ds: Value =
            serde_json::from_slice(&files.iter().find(|(n, _)| n == "ds_config.json").unwrap().1)
                .unwrap();
        assert!(
            same(&ds, &f["filled_config"]),
            "{case}: emitted config differs from what HF filled:\n{ds}\nvs\n{}",
            f["filled_config"]
        );
        // Step accounting.
        for key in ["batches_per_epoch", "per_epoch", "total", "warmup"] {
            let real = &f["steps_compare"][key]["real"];
            if real.is_null() {
                continue;
            }
            let ours = r.int(&format!("steps.{key}")).unwrap_or(0);
            assert_eq!(Some(ours), real.as_i64(), "{case}: steps.{key}");
        }
        // LR of every optimizer step, on the side the run uses.
        let Some(real) = f["lr"].as_array() else {
            continue;
        };
        if real.is_empty() {
            continue;
        }
        let side = f["lr_side"].as_str().unwrap();
        let (worst, first) = lr_error(real, &r, side, 1e-12);
        assert!(
            worst <= 1e-12,
            "{case}: LR ({side}) differs from step {first:?}, max rel. error {worst:e}"
        );
    }
}

/// launch.sh, as the real libraries read it: transformers' `HfArgumentParser` parses the flags
/// it passes into the same TrainingArguments as training_args.json (no unexpected flag, the
/// `--deepspeed` path reaching the case's config), and DeepSpeed's own launcher code
/// (`runner.parse_args`, `fetch_hostfile`, `apply_num_nodes_and_gpus`) starts exactly the
/// recipe's world size. The launcher flags launch.sh has today are the ones recorded.
#[test]
fn launch_sh_passes_the_same_arguments_and_starts_the_recipes_world_size() {
    let mut several_nodes = 0;
    for f in fixtures() {
        let case = f["case"].as_str().unwrap();
        let launch = &f["launch"];
        assert_eq!(launch["equal"], true, "{case}: {launch}");
        assert_eq!(launch["unexpected_flags"], Value::Array(vec![]), "{case}");
        assert_eq!(launch["deepspeed_path_ok"], true, "{case}");
        let l = &launch["launcher"];
        assert!(l.get("error").is_none(), "{case}: {l}");
        assert_eq!(l["world_matches"], true, "{case}: {l}");
        assert_eq!(l["world_size"], f["world_size"], "{case}");
        assert_eq!(l["num_gpus"], f["gpus"], "{case}");
        assert_eq!(l["num_nodes"], f["nodes"], "{case}");

        let (checked, r, text) = resolved(f["recipe"].as_str().unwrap());
        if checked.has_errors() {
            continue; // our_current_config_… covers it
        }
        let files = explicit_artefacts(&r, &text);
        let sh = String::from_utf8(
            files
                .iter()
                .find(|(n, _)| n == "launch.sh")
                .unwrap()
                .1
                .clone(),
        )
        .unwrap();
        let mut want = vec![
            format!("  --num_gpus {} \\\n", l["num_gpus"]),
            format!("  --num_nodes {} \\\n", l["num_nodes"]),
        ];
        if l["num_nodes"].as_u64() > Some(1) {
            // Several nodes always name their hostfile (DeepSpeed's default when not given).
            several_nodes += 1;
            want.push(format!(
                "  --hostfile {} \\\n",
                l["hostfile"].as_str().unwrap()
            ));
        } else {
            assert!(!sh.contains("--hostfile"), "{case}");
        }
        for w in want {
            assert!(sh.contains(&w), "{case}: launch.sh lacks {w:?}:\n{sh}");
        }
    }
    assert!(several_nodes >= 20, "only {several_nodes} multi-node cases");
}

fn rejected_fixtures() -> Vec<Value> {
    json_dir("rejected")
}

/// R0201 (accelerate < 1.8 step drift, docs/upstream.md R-S02) and R0202 (transformers 4.47–4.51
/// early stop, docs/upstream.md R-S04) need releases older than the pinned stack: the harness
/// trained those cases for real (`Trainer.train()` through DeepSpeed on CPU,
/// conformance/train_run.py) under an overlay of the old release, and under the pinned stack as the
/// control. The recorded run must show the misbehaviour, and our step timeline
/// (`rules::steps::run_timeline`, what `recipe steps` prints and R0201/R0202 are computed from)
/// must match it at every HF optimizer step: the micro-batch it happened at, HF's `global_step` and
/// DeepSpeed's weight-update count.
#[test]
fn old_stacks_show_the_step_misbehaviour_r0201_and_r0202_exist_for() {
    let mut seen = Vec::new();
    for f in rejected_fixtures() {
        let rej = &f["rejected"];
        if rej["expect"] != "silent_run" || rej["stack_check"] == "refused" {
            continue; // refusals: the_real_stack_refuses_or_misbehaves_on_every_rejected_recipe
        }
        let case = f["case"].as_str().unwrap();
        let code = rej["code"].as_str().unwrap();
        assert_eq!(
            rej["reproduced"], true,
            "{case}: the real run under {} did not show it (fixture recorded without the \
             overlays? run conformance/setup.sh overlays, then conformance/run.sh): {}",
            rej["stack"], rej["reproduced"]
        );
        let run = &f["stack_run"]["overlay"];
        let pins = &f["stack_run"]["pins"];
        for lib in ["transformers", "accelerate"] {
            if let Some(v) = pins.get(lib) {
                assert_eq!(&run["versions"][lib], v, "{case}: {lib} of the overlay run");
            }
        }
        // Our checker still rejects the recipe with this rule.
        let path = root().join(f["recipe"].as_str().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let options = Options {
            base_dir: path.parent().map(Path::to_path_buf),
            ..Options::default()
        };
        let checked = check_source_with(&text, &options);
        assert!(
            checked
                .diagnostics
                .iter()
                .any(|d| d.is_error() && d.code == code),
            "{case}: our checker no longer reports {code}"
        );
        // Our timeline for the recipe's targets against the real run, step by step.
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        let rows = recipe::rules::steps::run_timeline(&r, u64::MAX)
            .unwrap_or_else(|| panic!("{case}: no timeline"));
        // The summary the checker reads (R0201) is the same run: its end and first disagreement.
        let sum = recipe::rules::steps::run_summary(&r).unwrap();
        assert_eq!(sum.last, rows.last().copied(), "{case}");
        assert_eq!(
            sum.first_divergence,
            rows.iter().find(|x| x.hf_step != x.ds_step).copied(),
            "{case}"
        );
        let real_rows = run["rows"].as_array().unwrap();
        assert!(!real_rows.is_empty(), "{case}: no optimizer step recorded");
        for real in real_rows {
            let micro = real["micro_batches"].as_u64().unwrap();
            let ours = rows
                .iter()
                .find(|row| row.count == micro)
                .unwrap_or_else(|| panic!("{case}: our timeline has no micro-batch {micro}"));
            assert!(
                ours.hf_step,
                "{case}: HF stepped at micro-batch {micro}, we say not"
            );
            assert_eq!(
                Some(ours.hf_global),
                real["hf_global_step"].as_u64(),
                "{case}: HF global_step at micro-batch {micro}"
            );
            assert_eq!(
                Some(ours.ds_global),
                real["ds_global_steps"].as_u64(),
                "{case}: DeepSpeed global_steps at micro-batch {micro}"
            );
        }
        // HF steps nowhere else, and the run ends where we say it does.
        let hf_steps = rows.iter().filter(|row| row.hf_step).count();
        assert_eq!(hf_steps, real_rows.len(), "{case}: HF optimizer steps");
        let s = &run["summary"];
        let last = rows.last().unwrap();
        assert_eq!(
            Some(last.count),
            s["micro_batches"].as_u64(),
            "{case}: micro-batches run"
        );
        assert_eq!(
            Some(last.ds_global),
            s["ds_global_steps"].as_u64(),
            "{case}: DeepSpeed weight updates"
        );
        assert_eq!(
            r.uint("steps.total"),
            s["max_steps"].as_u64(),
            "{case}: max_steps"
        );
        // The control: the same artefacts on the pinned stack neither drift nor stop early.
        let p = &f["stack_run"]["pinned"]["summary"];
        assert_eq!(p["hf_global_step"], p["ds_global_steps"], "{case}: control");
        assert!(
            same(&p["epoch_reached"], &p["num_train_epochs"]),
            "{case}: control"
        );
        seen.push(code.to_string());
    }
    seen.sort();
    assert_eq!(seen, ["R0201", "R0202"], "silent_run cases");
}

/// Whether our checker, on the rejected recipe of fixture `f`, still reports `code` as an error.
fn checker_reports(f: &Value, code: &str) -> bool {
    let path = root().join(f["recipe"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    let options = Options {
        base_dir: path.parent().map(Path::to_path_buf),
        ..Options::default()
    };
    check_source_with(&text, &options)
        .diagnostics
        .iter()
        .any(|d| d.is_error() && d.code == code)
}

/// `raise_engine` cases: the harness built the real DeepSpeed 0.19.8 engine on CPU from the
/// case's patched artefacts (HF `Trainer.train()` → accelerate → `deepspeed.initialize`, world
/// size 1; conformance/train_run.py `--engine`) and, as the control, from the base recipe's.
/// R0609: the engine refuses (`DeepSpeedZeroOptimizer.__init__`'s assertion) and the base builds.
/// R0406: on the CPU accelerator FusedLamb cannot be built at all — the base recipe fails the
/// same way — so it is recorded as not reproduced, with both exceptions.
#[test]
fn the_real_engine_refuses_what_the_engine_rules_say_and_r0406_is_not_reproducible_on_cpu() {
    let mut seen = Vec::new();
    for f in rejected_fixtures() {
        let rej = &f["rejected"];
        if rej["expect"] != "raise_engine" {
            continue;
        }
        let case = f["case"].as_str().unwrap();
        let code = rej["code"].as_str().unwrap();
        assert!(
            checker_reports(&f, code),
            "{case}: our checker no longer reports {code}"
        );
        let run = &f["engine_run"];
        let exc = &run["case"]["exception"];
        assert_eq!(run["case"]["built"], false, "{case}: the engine was built");
        let message = exc["message"].as_str().unwrap_or_default();
        match code {
            "R0609" => {
                assert_eq!(rej["reproduced"], true, "{case}: {}", rej["reproduced"]);
                assert_eq!(exc["type"], "AssertionError", "{case}");
                assert!(
                    message.contains(
                        "pre-scale gradients is not yet supported with ZeRO-2 with reduce \
                         scatter enabled"
                    ),
                    "{case}: {message}"
                );
                assert!(message.contains(rej["engine_match"].as_str().unwrap()));
                assert_eq!(
                    exc["raised_at"], "deepspeed/runtime/zero/stage_1_and_2.py:__init__",
                    "{case}"
                );
                // The control: the base recipe (no prescale_gradients) builds the ZeRO-2 engine
                // and takes an optimizer step.
                let control = &run["control"];
                assert_eq!(control["built"], true, "{case}: control {control}");
                assert_eq!(control["deepspeed_optimizer"], "DeepSpeedZeroOptimizer");
                assert_eq!(control["versions"]["deepspeed"], "0.19.8");
                assert_eq!(control["ds_global_steps"], 1, "{case}: control");
            }
            "R0406" => {
                let why = rej["reproduced"].as_str().unwrap_or_else(|| {
                    panic!("{case}: expected a reason, got {}", rej["reproduced"])
                });
                assert!(why.starts_with("not reproducible on CPU"), "{case}: {why}");
                for side in ["case", "control"] {
                    let e = &run[side]["exception"];
                    assert_eq!(e["type"], "ValueError", "{case} {side}");
                    assert_eq!(
                        e["message"], "This op had not been implemented on CPU backend.",
                        "{case} {side}"
                    );
                    assert_eq!(
                        e["raised_at"], "deepspeed/ops/op_builder/cpu/no_impl.py:load",
                        "{case} {side}"
                    );
                }
            }
            _ => {
                // Trainer- and engine-level refusals (R0205, R0706, R0905, R0906, R0907): the message
                // the rule names, and the control builds and steps.
                assert_eq!(rej["reproduced"], true, "{case}: {}", rej["reproduced"]);
                let want = rej["engine_match"].as_str().unwrap();
                assert!(message.contains(want), "{case}: {message}");
                let control = &run["control"];
                assert_eq!(control["built"], true, "{case}: control {control}");
                assert_eq!(control["ds_global_steps"], 1, "{case}: control");
            }
        }
        seen.push(code.to_string());
    }
    seen.sort();
    assert_eq!(
        seen,
        ["R0205", "R0406", "R0609", "R0706", "R0905", "R0906", "R0907"],
        "raise_engine cases"
    );
}

/// The rejected case's definition as gen_corpus.py wrote it (conformance/corpus-rejected/).
fn corpus_rejected_meta(case: &str) -> Value {
    let path = root().join(format!("conformance/corpus-rejected/{case}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every recipe of the rejected corpus: our checker still reports its rule as an error, and the
/// real stack (transformers 5.25.0, accelerate 1.16.0, DeepSpeed 0.19.8 on CPU) refuses it with
/// the refusal the rule names (`match`, found in the errors the harness recorded), or trains
/// with another optimizer than the recipe names (`silent_engine`: DeepSpeed's basic optimizer
/// for the case and for the base recipe), or shows the silent value (`silent`). The engine and
/// old-release cases have their own tests above; R0406 is the one not reproducible on CPU.
#[test]
fn the_real_stack_refuses_or_misbehaves_on_every_rejected_recipe() {
    let mut codes = Vec::new();
    for f in rejected_fixtures() {
        let case = f["case"].as_str().unwrap();
        let rej = &f["rejected"];
        let code = rej["code"].as_str().unwrap();
        assert!(
            checker_reports(&f, code),
            "{case}: our checker no longer reports {code}"
        );
        codes.push(code.to_string());
        if code == "R0406" {
            continue; // the_real_engine_refuses_… records why it is not reproducible on CPU
        }
        assert_eq!(rej["reproduced"], true, "{case}: {}", rej["reproduced"]);
        match rej["expect"].as_str().unwrap() {
            "raise" | "raise_trainer" | "runtime" => {
                // What the refusal must say, from the corpus (gen_corpus.py), not the fixture.
                let meta = corpus_rejected_meta(case);
                let want = meta["match"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{case}: no `match` for the refusal"));
                let got = rej["matched_error"].as_str().unwrap();
                assert!(got.contains(want), "{case}: {got}");
                assert!(
                    f["errors"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|e| e["error"] == got),
                    "{case}: the matched refusal is not among the recorded errors"
                );
            }
            "silent_engine" => {
                let name = |r: &Value| {
                    format!(
                        "{}.{}",
                        r["deepspeed_basic_optimizer_module"].as_str().unwrap(),
                        r["deepspeed_basic_optimizer"].as_str().unwrap()
                    )
                };
                let run = &rej["observed"];
                assert_eq!(
                    name(&run["case"]),
                    rej["engine_optimizer"].as_str().unwrap(),
                    "{case}"
                );
                assert_eq!(
                    name(&run["control"]),
                    rej["control_optimizer"].as_str().unwrap(),
                    "{case}"
                );
                assert_ne!(rej["engine_optimizer"], rej["control_optimizer"], "{case}");
                assert_eq!(run["case"]["ds_global_steps"], 1, "{case}: no step taken");
            }
            "silent" => {
                // The value DeepSpeed ends up with (from the corpus), against the recipe's.
                let meta = corpus_rejected_meta(case);
                let key = meta["silent_key"].as_str().unwrap();
                assert_eq!(rej["observed"][key], meta["silent_value"], "{case}");
                let (_, r, _) = resolved(f["recipe"].as_str().unwrap());
                match code {
                    // The recipe trains in fp32; DeepSpeed has fp16 enabled.
                    "R0501" => assert_eq!(r.word("train.precision"), Some("fp32"), "{case}"),
                    // The recipe's bucket is hidden_size²; DeepSpeed runs with the raw one.
                    "R0607" => assert_eq!(r.uint("zero.reduce_bucket"), Some(768 * 768), "{case}"),
                    // The recipe's schedule is HF's linear; DeepSpeed builds WarmupLR instead.
                    "R0309" => assert_eq!(r.word("schedule.kind"), Some("linear"), "{case}"),
                    other => panic!("{case}: no assertion written for silent {other}"),
                }
            }
            "silent_run" if rej["stack_check"] == "refused" => {
                // An older release (an overlay) refuses the artefacts; the pinned stack trains
                // them.
                let meta = corpus_rejected_meta(case);
                let want = meta["match"].as_str().unwrap();
                let obs = &rej["observed"];
                let message = obs["overlay_exception"]["message"].as_str().unwrap();
                assert!(message.contains(want), "{case}: {message}");
                let pins = &f["stack_run"]["pins"];
                for (lib, v) in pins.as_object().unwrap() {
                    assert_eq!(&obs["overlay_versions"][lib], v, "{case}: {lib}");
                }
                assert!(
                    obs["pinned_error"].is_null(),
                    "{case}: {}",
                    obs["pinned_error"]
                );
            }
            "launch" => {
                // DeepSpeed's launcher refuses the hostfile (R1002), or starts fewer processes
                // than the recipe's world size and DeepSpeed refuses the config at that size
                // (R1003); the base recipe's launch.sh starts the recipe's.
                let meta = corpus_rejected_meta(case);
                let want = meta["match"].as_str().unwrap();
                let run = &rej["observed"]["case"];
                let said = match run.get("error") {
                    Some(e) => e.as_str().unwrap(),
                    None => {
                        assert_eq!(run["world_matches"], false, "{case}: {run}");
                        run["deepspeed_at_launcher_world"].as_str().unwrap()
                    }
                };
                assert!(said.contains(want), "{case}: {said}");
                let ctl = &rej["observed"]["control"];
                assert_eq!(ctl["world_matches"], true, "{case}: {ctl}");
                assert_eq!(ctl["world_size"], f["world_size"], "{case}");
            }
            "raise_engine" | "silent_run" => {} // their own tests above
            other => panic!("{case}: no assertion written for expect {other}"),
        }
    }
    codes.sort();
    codes.dedup();
    assert_eq!(
        codes,
        [
            "R0101", "R0102", "R0201", "R0202", "R0205", "R0309", "R0311", "R0402", "R0403",
            "R0404", "R0405", "R0406", "R0407", "R0409", "R0410", "R0411", "R0414", "R0501",
            "R0502", "R0503", "R0504", "R0505", "R0509", "R0603", "R0605", "R0607", "R0609",
            "R0706", "R0901", "R0902", "R0903", "R0905", "R0906", "R0907", "R0908", "R0909",
            "R1002", "R1003"
        ],
        "the rules the rejected corpus covers"
    );
}

/// Leaf keys of a DeepSpeed config (dotted), `optimizer.params` / `scheduler.params` kept whole.
fn config_leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let key = format!("{prefix}{k}");
            match x {
                Value::Object(inner) if !inner.is_empty() && k != "params" => {
                    config_leaves(x, &format!("{key}."), out)
                }
                _ => out.push(key),
            }
        }
    }
}

/// The seed article's stacks (transformers 4.6.1 + DeepSpeed 0.3.16, transformers 4.24.0 +
/// DeepSpeed 0.7.7): what we emit today for them uses only `TrainingArguments` fields of that
/// transformers release and only config key names (and optimizer constructor arguments) that
/// DeepSpeed release knows. The names were read from the released sources
/// (conformance/legacy.py; the old DeepSpeed releases, and transformers 4.6.1, do not import on
/// Python 3.11 + torch 2.15 — the fixtures record the import errors).
#[test]
fn legacy_artefacts_use_only_names_the_old_releases_know() {
    let dir = root().join("conformance/fixtures/legacy");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let f: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let stack = f["stack"].as_str().unwrap();
        assert!(
            f["skipped"].is_null(),
            "{stack}: recorded without the overlays (conformance/setup.sh overlays): {}",
            f["skipped"]
        );
        let rcp = root().join(f["recipe"].as_str().unwrap());
        let text = std::fs::read_to_string(&rcp).unwrap();
        let options = Options {
            base_dir: rcp.parent().map(Path::to_path_buf),
            ..Options::default()
        };
        let checked = check_source_with(&text, &options);
        assert!(!checked.has_errors(), "{stack}: the recipe has errors");
        let r = resolve(checked.file.as_ref().unwrap(), &options);
        let files = explicit_artefacts(&r, &text);
        let file = |name: &str| -> Value {
            serde_json::from_slice(&files.iter().find(|(n, _)| n == name).unwrap().1).unwrap()
        };
        let (ds, args) = (file("ds_config.json"), file("training_args.json"));
        // TrainingArguments fields of that transformers release.
        let fields = f["transformers"]["training_args_fields"]
            .as_object()
            .unwrap();
        assert!(fields.len() > 50, "{stack}: fields not read");
        for k in args.as_object().unwrap().keys() {
            assert!(
                fields.contains_key(k),
                "{stack}: training_args.json field `{k}` does not exist in transformers {}",
                f["transformers"]["version"]
            );
        }
        if f["transformers"]["import"]["ok"] == true {
            assert_eq!(
                f["transformers"]["live_fields_equal_ast"], true,
                "{stack}: the live class and the source reading disagree"
            );
        }
        // DeepSpeed config key names of that release.
        let names: Vec<&str> = f["deepspeed"]["key_names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut leaves = Vec::new();
        config_leaves(&ds, "", &mut leaves);
        for key in &leaves {
            let name = key.rsplit('.').next().unwrap();
            assert!(
                names.contains(&name),
                "{stack}: ds_config.json key `{key}` is unknown to DeepSpeed {}",
                f["deepspeed"]["version"]
            );
        }
        // optimizer.params: DeepSpeed pops torch_adam / adam_w_mode and passes the rest to the
        // optimizer's constructor (`_configure_basic_optimizer`).
        let ctor = f["compare"]["optimizer_ctor"].as_str().unwrap();
        let ctor_params = &f["deepspeed"]["optimizer_init_params"][ctor];
        if let Some(params) = ds["optimizer"]["params"].as_object() {
            for k in params.keys() {
                let ok = k == "torch_adam"
                    || k == "adam_w_mode"
                    || ctor_params.as_array().unwrap().iter().any(|p| p == k);
                assert!(ok, "{stack}: optimizer.params.{k} is not a {ctor} argument");
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 3, "legacy fixtures");
}

/// A corpus recipe checked and resolved as `recipe build` would (path relative to the repo).
fn resolved(rel: &str) -> (recipe::check::Checked, recipe::resolve::Resolved, String) {
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let options = Options {
        base_dir: path.parent().map(Path::to_path_buf),
        ..Options::default()
    };
    let checked = check_source_with(&text, &options);
    let r = resolve(checked.file.as_ref().unwrap(), &options);
    (checked, r, text)
}

/// The largest relative error between the recorded LRs and ours on `side` (absolute where the
/// real LR is 0; NaN counts as infinite), and the first step where it exceeds `tol`.
fn lr_error(
    real: &[Value],
    r: &recipe::resolve::Resolved,
    side: &str,
    tol: f64,
) -> (f64, Option<usize>) {
    let curves = recipe::upstream::schedules::curves(r).expect("schedule curves");
    let (mut worst, mut first) = (0.0f64, None);
    for (i, want) in real.iter().enumerate() {
        // A step upstream could not compute is recorded as a string; nothing to compare.
        let Some(want) = want.as_f64() else { continue };
        let at = curves.at(i as u64 + 1);
        let got = if side == "hf" { at.hf } else { at.deepspeed }.unwrap_or(f64::NAN);
        let err = if want == 0.0 {
            got.abs()
        } else {
            ((got - want) / want).abs()
        };
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > tol && first.is_none() {
            first = Some(i + 1);
        }
        worst = worst.max(err);
    }
    (worst, first)
}

fn legacy_run_fixtures() -> Vec<Value> {
    let out = json_dir("legacy-run");
    for f in &out {
        assert!(
            f["skipped"].is_null(),
            "recorded without the overlays (conformance/setup.sh overlays): {}",
            f["skipped"]
        );
    }
    out
}

/// The seed article's stacks run for real (conformance/legacy_run.py: transformers 4.6.1 +
/// DeepSpeed 0.3.16, transformers 4.24.0 + DeepSpeed 0.7.7, each release's own
/// `TrainingArguments`, `Trainer.train()` up to `deepspeed.initialize`, `DeepSpeedConfig` at the
/// world size, the engine's sanity check and basic optimizer, the scheduler it steps), on a
/// generated corpus of 30 recipes per stack: nothing fails, HF's processing changes nothing we
/// emit, the config HF hands DeepSpeed is the one we emit today (plus HF's own
/// `zero_allow_untested_optimizer` when HF builds the optimizer), DeepSpeed parses the batch
/// and ZeRO values we state, and our step count and LR per step equal the old releases' own.
#[test]
fn old_stacks_run_our_artefacts_and_match_our_steps_and_learning_rates() {
    let fixtures = legacy_run_fixtures();
    assert_eq!(fixtures.len(), 3, "legacy-run fixtures");
    for f in &fixtures {
        let stack = format!(
            "transformers {} + DeepSpeed {}",
            f["transformers"].as_str().unwrap(),
            f["deepspeed"].as_str().unwrap()
        );
        let cases = f["cases"].as_array().unwrap();
        assert!(cases.len() >= 30, "{stack}: {} cases", cases.len());
        for c in cases {
            let case = c["case"].as_str().unwrap();
            assert!(
                c["harness_error"].is_null(),
                "{stack} {case}: {}",
                c["traceback"]
            );
            assert_eq!(
                c["errors"],
                Value::Array(vec![]),
                "{stack} {case}: the old release failed"
            );
            assert_eq!(
                c["hf_processed_diff"],
                Value::Array(vec![]),
                "{stack} {case}: HF's config processing changed our config"
            );
            let (checked, r, text) = resolved(c["recipe"].as_str().unwrap());
            assert!(!checked.has_errors(), "{stack} {case}: we now reject it");
            // No accelerate in these releases' path: DeepSpeed logs every logging_steps, and
            // explain says nothing about an override.
            assert_eq!(
                c["deepspeed_parsed"]["steps_per_print"].as_u64(),
                r.uint("train.logging_steps"),
                "{stack} {case}"
            );
            let report = recipe::commands::explain::report(&r, None);
            let logging = report
                .settings
                .iter()
                .find(|row| row.key == "train.logging_steps");
            assert_eq!(
                logging.and_then(|row| row.upstream.as_ref()),
                None,
                "{stack} {case}"
            );
            let files = explicit_artefacts(&r, &text);
            let ours: Value = serde_json::from_slice(
                &files.iter().find(|(n, _)| n == "ds_config.json").unwrap().1,
            )
            .unwrap();
            let mut handed = c["handed_config"].clone();
            if !c["client_optimizer"].is_null() {
                // The engine's own optimizer set-up took HF's optimizer (legacy_run.py L7).
                assert_eq!(
                    c["engine_optimizer"], c["client_optimizer"],
                    "{stack} {case}: the engine's optimizer set-up"
                );
                // deepspeed_init adds it when HF builds the optimizer ("To use other optimizers
                // requires voiding warranty with: `zero_allow_untested_optimizer`").
                let added = handed
                    .as_object_mut()
                    .unwrap()
                    .remove("zero_allow_untested_optimizer");
                assert_eq!(added, Some(Value::Bool(true)), "{stack} {case}");
            }
            assert!(
                same(&ours, &handed),
                "{stack} {case}: we emit\n{ours}\nthe old HF handed DeepSpeed\n{handed}"
            );
            let parsed = &c["deepspeed_parsed"];
            for (key, ds_key) in [
                ("train_batch_size", "train_batch_size"),
                (
                    "train_micro_batch_size_per_gpu",
                    "train_micro_batch_size_per_gpu",
                ),
                ("gradient_accumulation_steps", "gradient_accumulation_steps"),
            ] {
                assert!(
                    same(&parsed[key], &ours[ds_key]),
                    "{stack} {case}: DeepSpeed parsed {key} = {}",
                    parsed[key]
                );
            }
            assert!(
                same(&parsed["zero.stage"], &ours["zero_optimization"]["stage"]),
                "{stack} {case}: ZeRO stage {}",
                parsed["zero.stage"]
            );
            assert_eq!(
                c["real_total"].as_i64(),
                r.int("steps.total"),
                "{stack} {case}: optimizer steps"
            );
            assert_eq!(
                c["real_batches_per_epoch"].as_i64(),
                r.int("steps.batches_per_epoch"),
                "{stack} {case}: micro-batches per epoch and rank"
            );
            let side = c["lr_side"].as_str().unwrap();
            let real = c["lr"].as_array().unwrap();
            assert_eq!(
                real.len() as i64,
                r.int("steps.total").unwrap(),
                "{stack} {case}"
            );
            let (worst, first) = lr_error(real, &r, side, 1e-12);
            assert!(
                worst <= 1e-12,
                "{stack} {case}: LR ({side}) differs from step {first:?}, max rel. error {worst:e}"
            );
        }
    }
}

/// Recipes our checker rejects for the old stacks, run through those releases: R0312 (no
/// `lr_scheduler_kwargs` before transformers 4.36: the real run follows HF's default schedule,
/// equal to the base recipe's curve and not the rejected recipe's), R0307 (DeepSpeed 0.3.16 has
/// no `warmup_type`: the real WarmupDecayLR warms up logarithmically, as the base recipe says,
/// not linearly), R0506 (DeepSpeed 0.3.16 has no bf16: handed a `bf16` section it parses
/// neither half precision as on and trains in fp32), and refusals with the message the rule
/// names: R0313 (the scheduler name), R0314 (OneCycle divides by zero after the cycle), R0412
/// (HF's optimizer with ZeRO Offload), R0413 (DeepSpeed's optimizer with HF's scheduler), R0508
/// (ZeRO-1 without fp16), R0306 (DeepSpeed 0.7.7 has no WarmupCosineLR), R0408 (DeepSpeed 0.8.3's
/// engine refuses HF's optimizer with ZeRO-Offload); each base recipe, the
/// control, runs clean.
#[test]
fn old_stacks_show_what_their_rules_exist_for() {
    let mut seen = Vec::new();
    for f in legacy_run_fixtures() {
        let stack = format!(
            "transformers {} + DeepSpeed {}",
            f["transformers"].as_str().unwrap(),
            f["deepspeed"].as_str().unwrap()
        );
        for c in f["rejected"].as_array().unwrap() {
            let case = c["case"].as_str().unwrap();
            let meta = &c["rejected"];
            let code = meta["code"].as_str().unwrap();
            assert!(
                checker_reports(c, code),
                "{stack} {case}: we no longer report {code}"
            );
            assert_eq!(
                c["control"]["errors"],
                Value::Array(vec![]),
                "{stack} {case}: the control failed"
            );
            match meta["expect"].as_str().unwrap() {
                "silent_lr" => {
                    assert_eq!(c["errors"], Value::Array(vec![]), "{stack} {case}");
                    let real = c["lr"].as_array().unwrap();
                    let side = c["lr_side"].as_str().unwrap();
                    // R0312: HF's scheduler; R0307: DeepSpeed's WarmupDecayLR.
                    let want = if code == "R0307" { "deepspeed" } else { "hf" };
                    assert_eq!(side, want, "{stack} {case}");
                    // The run follows the base recipe (HF's defaults) ...
                    let (_, base, _) = resolved(c["base_recipe"].as_str().unwrap());
                    let (worst, first) = lr_error(real, &base, side, 1e-12);
                    assert!(
                        worst <= 1e-12,
                        "{stack} {case}: base differs from step {first:?}"
                    );
                    // ... not the rejected recipe's schedule.
                    let (_, rejected, _) = resolved(c["recipe"].as_str().unwrap());
                    let (worst, _) = lr_error(real, &rejected, side, 1e-6);
                    assert!(
                        worst > 1e-3,
                        "{stack} {case}: the real LR follows the rejected recipe"
                    );
                }
                "silent_precision" => {
                    assert_eq!(c["errors"], Value::Array(vec![]), "{stack} {case}");
                    // Handed a bf16 section, with fp16 off ...
                    assert_eq!(
                        c["handed_config"]["bf16"]["enabled"], true,
                        "{stack} {case}"
                    );
                    let p = &c["deepspeed_parsed"];
                    // ... the release parses no half precision at all: fp32.
                    assert_eq!(p["fp16_enabled"], false, "{stack} {case}");
                    for k in ["bf16_enabled", "bfloat16_enabled"] {
                        assert!(
                            p.get(k).is_none_or(|v| v == false),
                            "{stack} {case}: {k} = {}",
                            p[k]
                        );
                    }
                    // The control, fp16, is parsed as fp16.
                    let ctl = &c["control"]["deepspeed_parsed"];
                    assert_eq!(ctl["fp16_enabled"], true, "{stack} {case}");
                }
                "raise" => {
                    let want = meta["engine_match"].as_str().unwrap();
                    let errors = c["errors"].as_array().unwrap();
                    if code == "R0408" {
                        // The engine's own optimizer set-up refuses HF's optimizer; the control
                        // (DeepSpeed's AdamW) builds DeepSpeedCPUAdam.
                        assert_eq!(errors[0]["stage"], "engine_optimizer", "{stack} {case}");
                        assert_eq!(errors[0]["type"], "ZeRORuntimeException", "{stack} {case}");
                        assert_eq!(
                            c["control"]["basic_optimizer"]["class"], "DeepSpeedCPUAdam",
                            "{stack} {case}"
                        );
                    }
                    assert!(
                        errors
                            .iter()
                            .any(|e| e["message"].as_str().unwrap().contains(want)),
                        "{stack} {case}: expected an error containing {want:?}, got {errors:?}"
                    );
                }
                other => panic!("{stack} {case}: unknown expect {other}"),
            }
            seen.push(format!(
                "{}+{} {code}",
                f["transformers"].as_str().unwrap(),
                f["deepspeed"].as_str().unwrap()
            ));
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "4.24.0+0.7.7 R0306",
            "4.24.0+0.7.7 R0312",
            "4.24.0+0.7.7 R0312",
            "4.24.0+0.7.7 R0313",
            "4.24.0+0.8.3 R0312",
            "4.24.0+0.8.3 R0312",
            "4.24.0+0.8.3 R0313",
            "4.24.0+0.8.3 R0408",
            "4.6.1+0.3.16 R0307",
            "4.6.1+0.3.16 R0312",
            "4.6.1+0.3.16 R0312",
            "4.6.1+0.3.16 R0313",
            "4.6.1+0.3.16 R0314",
            "4.6.1+0.3.16 R0412",
            "4.6.1+0.3.16 R0413",
            "4.6.1+0.3.16 R0506",
            "4.6.1+0.3.16 R0508"
        ]
    );
}

/// What reaches DeepSpeed after accelerate prepares it (the harness records the config
/// `deepspeed.initialize` receives) differs from what we emit in two keys only, both
/// accelerate's: `steps_per_print` becomes inf (DeepSpeedPlugin.__post_init__), which `recipe
/// explain` reports on `train.logging_steps`; and `zero_allow_untested_optimizer = true` is
/// added exactly when HF builds the optimizer (`owner = hf`).
#[test]
fn accelerate_changes_only_steps_per_print_and_explain_says_so() {
    for f in fixtures() {
        let case = f["case"].as_str().unwrap();
        let Some(diff) = f["final_config_diff"].as_array() else {
            assert_eq!(f["verdict"], "error", "{case}: no final config recorded");
            continue;
        };
        let (_, r, _) = resolved(f["recipe"].as_str().unwrap());
        let hf_optimizer = r.word("optimizer.owner") == Some("hf");
        let mut keys: Vec<&str> = diff.iter().map(|d| d["key"].as_str().unwrap()).collect();
        keys.sort();
        let expected: &[&str] = if hf_optimizer {
            &["steps_per_print", "zero_allow_untested_optimizer"]
        } else {
            &["steps_per_print"]
        };
        assert_eq!(keys, expected, "{case}: {diff:?}");
        for d in diff {
            match d["key"].as_str().unwrap() {
                "steps_per_print" => {
                    assert_eq!(d["real"], "inf", "{case}");
                    // Ours: logging_steps, or the raw `deepspeed { steps_per_print }` given.
                    let raw = r
                        .raw_deepspeed
                        .iter()
                        .find(|(k, _, _)| k == "steps_per_print")
                        .and_then(|(_, v, _)| v.as_i64())
                        .map(|v| v as u64);
                    assert_eq!(
                        d["emitted"].as_u64(),
                        raw.or(r.uint("train.logging_steps")),
                        "{case}"
                    );
                }
                _ => assert_eq!(d["real"], true, "{case}"),
            }
        }
        let report = recipe::commands::explain::report(&r, None);
        let row = report
            .settings
            .iter()
            .find(|row| row.key == "train.logging_steps")
            .unwrap();
        assert!(
            row.upstream
                .as_deref()
                .is_some_and(|n| n.contains("steps_per_print with inf")),
            "{case}: explain says nothing: {:?}",
            row.upstream
        );
    }
}

/// Our hostfile parser (R1002–R1004) against DeepSpeed's launcher on the same texts
/// (conformance/launcher.py: `runner.fetch_hostfile` on each, read as a launch reads it): the
/// same hosts and slots in the same order, or a refusal of the same kind.
#[test]
fn our_hostfile_parser_agrees_with_deepspeeds_launcher() {
    use recipe::rules::launch::{parse_hostfile, BadHostfile};
    let path = root().join("conformance/fixtures/launcher/hostfiles.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(doc["format"], "recipe-conformance-hostfiles/1");
    let all = doc["hostfiles"].as_array().unwrap();
    assert!(all.len() >= 20);
    let (mut accepted, mut refused) = (0, 0);
    for e in all {
        let text = e["text"].as_str().unwrap();
        let ours = parse_hostfile(text);
        match (&ours, e.get("hosts")) {
            (Ok(hosts), Some(real)) => {
                let real = real.as_array().unwrap();
                assert_eq!(hosts.len(), real.len(), "{text:?}: {hosts:?} vs {real:?}");
                for (h, r) in hosts.iter().zip(real) {
                    assert_eq!(h.name, r[0].as_str().unwrap(), "{text:?}");
                    match r[1].as_u64() {
                        Some(n) => assert_eq!(h.slots, n, "{text:?}"),
                        // Beyond u64 (Python's int has no bound): ours saturates.
                        None => assert_eq!(h.slots, u64::MAX, "{text:?}"),
                    }
                }
                accepted += 1;
            }
            (Err(bad), None) => {
                let message = e["error"]["message"].as_str().unwrap();
                let want = match bad {
                    BadHostfile::BadLine { text: line, .. } => {
                        format!("Hostfile contains a bad entry: {line},")
                    }
                    BadHostfile::Duplicate { host, .. } => {
                        format!("Hostfile contains multiple entries for {host},")
                    }
                    BadHostfile::Empty => "Hostfile is empty or not formatted correctly".into(),
                };
                assert!(message.starts_with(&want), "{text:?}: {message} vs {want}");
                refused += 1;
            }
            _ => panic!("{text:?}: ours {ours:?}, DeepSpeed's launcher {e}"),
        }
    }
    assert!(
        accepted >= 10 && refused >= 10,
        "{accepted} accepted, {refused} refused"
    );
}

/// R0315's arithmetic against a real DeepSpeed engine stepping HF's `reduce_lr_on_plateau`
/// (conformance/plateau_engine.py): the LR after each optimizer step, and the message's end
/// value for a recipe of the same shape.
#[test]
fn deepspeed_steps_a_plateau_schedule_every_step_as_r0315_says() {
    let f: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("conformance/fixtures/plateau-engine.json")).unwrap(),
    )
    .unwrap();
    let (lr, factor, patience) = (
        f["lr"].as_f64().unwrap(),
        f["factor"].as_f64().unwrap(),
        f["patience"].as_u64().unwrap(),
    );
    let real: Vec<f64> = f["lr_after_step"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(real.len() >= 3 * (patience as usize + 1), "{f}");
    for (i, got) in real.iter().enumerate() {
        let cuts = i as u64 / (patience + 1);
        let want = lr * factor.powi(cuts as i32);
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "step {}: {got} vs {want}",
            i + 1
        );
    }
    assert_eq!(
        f["best_metric"].as_f64(),
        f["train_batch_size"].as_f64(),
        "the metric is the batch size"
    );
    let text = format!(
        "model bert {{ from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }}\n\
         data {{ train = \"train.jsonl\", eval = \"dev.jsonl\", samples = {} }}\n\
         batch {{ micro = {} }}\ntrain {{ epochs = 1 }}\noptimizer adamw {{ lr = {lr:e} }}\n\
         schedule reduce_lr_on_plateau {{ factor = {factor}, patience = {patience} }}\n",
        real.len() as u64 * f["train_batch_size"].as_u64().unwrap(),
        f["train_batch_size"].as_u64().unwrap(),
    );
    let checked = check_source_with(&text, &Options::default());
    let d = checked
        .diagnostics
        .iter()
        .find(|d| d.code == "R0315")
        .unwrap_or_else(|| panic!("no R0315 for\n{text}"));
    let end = recipe::resolve::value::fmt_f64(*real.last().unwrap()); // 1.25e-5: exact in 3 digits
    assert!(
        d.message
            .contains(&format!("down to {end} by step {}", real.len())),
        "{}",
        d.message
    );
}

/// R0315 for HF's `greedy` against a real DeepSpeed engine stepping HF's `GreedyLR`
/// (conformance/plateau_engine.py): the LR after each optimizer step is what
/// `upstream::schedules::Greedy` gives on the batch size, cuts, floor and reset included, and the
/// message states the run's curve.
#[test]
fn deepspeed_steps_a_greedy_schedule_every_step_as_r0315_says() {
    use recipe::upstream::schedules::{Greedy, GreedyConfig};
    let f: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("conformance/fixtures/greedy-engine.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(f["scheduler"], "GreedyLR");
    let lr = f["lr"].as_f64().unwrap();
    let kw = &f["kwargs"];
    let (factor, patience, cooldown, reset_start) = (
        kw["factor"].as_f64().unwrap(),
        kw["patience"].as_u64().unwrap(),
        kw["cooldown"].as_u64().unwrap(),
        kw["reset_start"].as_u64().unwrap(),
    );
    let batch = f["train_batch_size"].as_u64().unwrap();
    let real: Vec<f64> = f["lr_after_step"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    // The fixture shows the cuts, the floor and the start over.
    assert!(real.contains(&1e-3) && real.iter().rev().skip(3).any(|&x| x == lr));
    let mut g = Greedy::new(
        lr,
        GreedyConfig {
            factor,
            patience,
            cooldown,
            reset_start,
            ..GreedyConfig::default()
        },
    );
    for (i, want) in real.iter().enumerate() {
        let got = g.step(batch as f64);
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "step {}: {got} vs {want}",
            i + 1
        );
    }
    // A recipe of the same shape: one more step than the fixture has, so its last LR is the one
    // the fixture records after its last step.
    let steps = real.len() as u64 + 1;
    let text = format!(
        "model bert {{ from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }}\n\
         data {{ train = \"train.jsonl\", eval = \"dev.jsonl\", samples = {} }}\n\
         batch {{ micro = {batch} }}\ntrain {{ epochs = 1 }}\noptimizer adamw {{ lr = {lr:e} }}\n\
         schedule greedy {{ factor = {factor}, patience = {patience}, cooldown = {cooldown}, reset_start = {reset_start} }}\n",
        steps * batch,
    );
    let checked = check_source_with(&text, &Options::default());
    let d = checked
        .diagnostics
        .iter()
        .find(|d| d.code == "R0315")
        .unwrap_or_else(|| panic!("no R0315 for\n{text}"));
    let first = real.iter().position(|&x| x != lr).unwrap();
    let fmt = recipe::resolve::value::fmt_f64;
    assert!(
        d.message.contains(&format!(
            "the LR moves to {} at step {} and is {} by step {steps}",
            fmt(real[first]),
            first + 2,
            fmt(*real.last().unwrap())
        )),
        "{}",
        d.message
    );
}
