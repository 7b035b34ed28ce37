//! `recipe run` with SGD, Adagrad and LAMB end to end on the tiny seeded BERT (see
//! `tests/common/mod.rs`): each trains the predicted steps with finite losses and saves its own
//! optimizer state; a resumed run ends bit-identical to an uninterrupted one (fp32, and fp16 with
//! its master weights); N ranks train what one process trains (SGD and Adagrad under every ZeRO
//! stage, Adagrad with optimizer offload too; LAMB data-parallel at stage 0); a checkpoint resumes
//! on another world size (re-partitioned); and what the runtime does not run is refused plainly.
//! The updates themselves are tested against torch and DeepSpeed in `runtime/tests/optim.rs`.

use crate::common;

use common::*;
use recipe_runtime::optim::OptimState;
use serde_json::Value;

const SGD: &str =
    "optimizer sgd { lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 0.01 }";
const ADAGRAD: &str = "optimizer adagrad { lr = 0.01, weight_decay = 0.01 }";
const LAMB: &str = "optimizer lamb { lr = 0.01, weight_decay = 0.01 }";

/// `recipe` (the tiny one, or [`dp_recipe`]) with its optimizer replaced by `line`.
fn with(recipe: &str, line: &str) -> String {
    let old = "optimizer adamw { lr = 1e-3, weight_decay = 0.01 }";
    assert!(recipe.contains(old));
    recipe.replace(old, line)
}

fn ok(o: std::process::Output) {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

fn losses(dir: &std::path::Path) -> Vec<(u64, f64)> {
    metrics(dir)
        .iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
        .collect()
}

/// Relative L2 distance between two models' weights (all tensors together), and the worst
/// tensor's.
fn distance(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> (f64, f64) {
    let (mut diff, mut scale, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for ((na, x), (nb, y)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let d: f64 = x.iter().zip(y).map(|(p, q)| f64::from(p - q).powi(2)).sum();
        let s: f64 = y.iter().map(|&q| f64::from(q).powi(2)).sum();
        worst = worst.max((d / s.max(1e-300)).sqrt());
        diff += d;
        scale += s;
    }
    ((diff / scale).sqrt(), worst)
}

/// What each kind's optimizer file holds.
fn buffers(kind: &str) -> (&'static str, Vec<&'static str>) {
    match kind {
        "sgd" => ("sgd", vec!["momentum_buffer"]),
        "adagrad" => ("adagrad", vec!["sum"]),
        _ => ("lamb", vec!["exp_avg", "exp_avg_sq"]),
    }
}

#[test]
fn each_optimizer_trains_the_predicted_steps_and_saves_its_state() {
    for (kind, line) in [("sgd", SGD), ("adagrad", ADAGRAD), ("lamb", LAMB)] {
        let dir = workspace(&format!("opt-{kind}"), &with(TINY, line));
        let o = recipe_in(
            &dir,
            &["build", "--target", "native", "-o", "built", "tiny.rcp"],
        );
        ok(o);
        let plan: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("built/plan.json")).unwrap())
                .unwrap();
        assert_eq!(plan["optimizer"]["kind"], kind);
        ok(recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]));
        let m = metrics(&dir.join("out"));
        let end = m.iter().find(|r| r["event"] == "end").unwrap();
        assert_eq!(end["steps"]["taken"], 8, "{kind}");
        assert_eq!(end["steps"]["predicted"], 8, "{kind}");
        let curve = losses(&dir.join("out"));
        assert_eq!(
            curve.iter().map(|c| c.0).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>(),
            "{kind}"
        );
        assert!(curve.iter().all(|c| c.1.is_finite()), "{kind}: {curve:?}");
        // The weights moved, and every tensor is finite.
        let w = weights(&dir.join("out/model/model.safetensors"));
        assert!(
            w.iter().all(|(_, t)| t.iter().all(|x| x.is_finite())),
            "{kind}"
        );
        let ckpt = weights(&dir.join("out/checkpoint-4/model.safetensors"));
        assert!(distance(&w, &ckpt).0 > 0.0, "{kind}: nothing trained");
        // The epoch-1 checkpoint holds this optimizer's state, whole (ZeRO-0).
        let bytes = std::fs::read(dir.join("out/checkpoint-4/optimizer.safetensors")).unwrap();
        let state = OptimState::from_safetensors(&bytes).unwrap();
        let (family, names) = buffers(kind);
        assert_eq!(state.optimizer, family);
        assert_eq!(state.step, 4, "{kind}");
        assert_eq!(state.buffers.keys().collect::<Vec<_>>(), names, "{kind}");
        let n = start_record(&dir.join("out"))["parameters"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(state.len, n, "{kind}");
        assert!(state.master.is_empty(), "{kind}: fp32 keeps no master copy");
    }
}

/// The plan carries the class's hyper-parameters as DeepSpeed or HF would pass them.
#[test]
fn the_plan_holds_what_deepspeed_or_hf_would_build() {
    let plan = |name: &str, line: &str| -> Value {
        let dir = workspace(&format!("optplan-{name}"), &with(TINY, line));
        ok(recipe_in(
            &dir,
            &["build", "--target", "native", "-o", "built", "tiny.rcp"],
        ));
        let text = std::fs::read_to_string(dir.join("built/plan.json")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["optimizer"].clone()
    };
    let sgd = plan("sgd", SGD);
    assert_eq!(sgd["momentum"], 0.9);
    assert_eq!(sgd["nesterov"], true);
    assert_eq!(sgd["weight_decay"], 0.01);
    // Without momentum the plan says nothing of it (plans of other kinds are unchanged).
    let plain = plan("sgd0", "optimizer sgd { lr = 0.05 }");
    assert!(plain.get("momentum").is_none() && plain.get("nesterov").is_none());
    // DeepSpeed gets the recipe's eps (default 1e-8); HF's Adagrad runs torch's 1e-10.
    assert_eq!(plan("adagrad", ADAGRAD)["eps"], 1e-8);
    let hf = plan("adagrad-hf", "optimizer adagrad { lr = 0.01, owner = hf }");
    assert_eq!(hf["eps"], 1e-10);
    // A given eps reaches HF's Adagrad through the `optim_args` the build writes (transformers
    // ≥ 5.3.0), and so do SGD's momentum and Nesterov.
    let hf = plan(
        "adagrad-hf-eps",
        "optimizer adagrad { lr = 0.01, eps = 1e-6, owner = hf }",
    );
    assert_eq!(hf["eps"], 1e-6);
    let hf = plan(
        "sgd-hf",
        "optimizer sgd { lr = 0.05, momentum = 0.9, nesterov = true, owner = hf }",
    );
    assert_eq!(hf["momentum"], 0.9);
    assert_eq!(hf["nesterov"], true);
    // FusedLamb's bounds unless the recipe sets them.
    let lamb = plan("lamb", LAMB);
    assert_eq!(lamb["trust_clamp"], serde_json::json!([0.01, 10.0]));
    let tight = plan(
        "lamb-tight",
        "optimizer lamb { lr = 0.01, max_coeff = 2.0, min_coeff = 0.5 }",
    );
    assert_eq!(tight["trust_clamp"], serde_json::json!([0.5, 2.0]));
    assert!(plan("adamw", "optimizer adamw { lr = 1e-3 }")
        .get("trust_clamp")
        .is_none());
}

#[test]
fn a_resumed_run_ends_bit_identical_for_every_optimizer() {
    // fp32 at ZeRO-0, and fp16 (master weights in the checkpoint; LAMB divides by the loss scale
    // in its kernel) where the kind runs it: SGD and Adagrad at ZeRO-2 on 2 ranks (micro-batches
    // of 2, so there are still 8 steps), LAMB at 0.
    let two_ranks_fp16 = vec![
        "--set",
        "train.precision=fp16",
        "--set",
        "zero.stage=2",
        "--set",
        "batch.micro=2",
        "--gpus",
        "2",
    ];
    let cases = [
        ("sgd", SGD, vec![]),
        ("adagrad", ADAGRAD, vec![]),
        ("lamb", LAMB, vec![]),
        ("sgd16", SGD, two_ranks_fp16.clone()),
        ("adagrad16", ADAGRAD, two_ranks_fp16),
        ("lamb16", LAMB, vec!["--set", "train.precision=fp16"]),
    ];
    for (name, line, extra) in cases {
        let dir = workspace(&format!("optresume-{name}"), &with(TINY, line));
        let run = |out: &str, more: &[&str]| {
            let o = format!("train.output_dir=\"{out}\"");
            let mut args = vec!["run", "--quiet", "tiny.rcp", "--set", &o];
            args.extend(extra.iter().copied());
            args.extend(more);
            ok(recipe_in(&dir, &args));
        };
        run("a", &[]);
        run("b", &["--stop-after", "6"]);
        assert!(!dir.join("b/model").exists(), "{name}");
        run("b", &["--resume", "b/checkpoint-6"]);
        let a = std::fs::read(dir.join("a/model/model.safetensors")).unwrap();
        let b = std::fs::read(dir.join("b/model/model.safetensors")).unwrap();
        assert!(a == b, "{name}: the resumed run's weights differ");
        assert_eq!(losses(&dir.join("a")), losses(&dir.join("b")), "{name}");
        if name.ends_with("16") {
            let ckpt = dir.join("b/checkpoint-6");
            let file = if name == "lamb16" {
                ckpt.join("optimizer.safetensors")
            } else {
                ckpt.join("optimizer/rank-0-of-2.safetensors")
            };
            let state = OptimState::from_safetensors(&std::fs::read(file).unwrap()).unwrap();
            assert_eq!(
                state.master.len(),
                state.len,
                "{name}: fp32 master weights saved"
            );
        }
    }
}

/// N ranks with micro-batch 12/N train what one process with micro-batch 12 trains (the global
/// batch fixed; only the order of float sums differs): the loss curve within 1e-6 relative, the
/// weights within 1e-6 relative L2 (1e-5 per tensor), as `tests/run.rs` asks of Adam.
fn data_parallel(kind: &str, line: &str, runs: &[(u32, bool)]) {
    let dir = workspace(&format!("optdp-{kind}"), &with(&dp_recipe(), line));
    let read = |out: &str| {
        let w = weights(&dir.join(out).join("model/model.safetensors"));
        (losses(&dir.join(out)), w)
    };
    dp_run(&dir, 1, "base", &zero_sets(0, false));
    let (curve1, w1) = read("base");
    assert_eq!(curve1.len(), 4, "{kind}");
    let n = start_record(&dir.join("base"))["parameters"]
        .as_u64()
        .unwrap();
    for &(stage, offload) in runs {
        for world in [2u64, 3] {
            let ctx = format!("{kind} stage {stage} offload {offload} world {world}");
            let out = format!("s{stage}-{offload}-w{world}");
            dp_run(&dir, world, &out, &zero_sets(stage, offload));
            let (curve, w) = read(&out);
            assert_eq!(curve.len(), curve1.len(), "{ctx}");
            for ((k, a), (_, b)) in curve.iter().zip(&curve1) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{ctx} step {k}: loss {a} vs {b}"
                );
            }
            let (rel, worst) = distance(&w, &w1);
            assert!(
                rel <= 1e-6,
                "{ctx}: weights differ by {rel:e} (relative L2)"
            );
            // Adagrad's step g / sqrt(Σg²) is scale-free, so where the gradient and the L2 decay
            // term nearly cancel (decayed biases, with owner = deepspeed every tensor decays) the
            // reduction order's relative error is amplified: 5e-5 per tensor for it.
            let per_tensor = if kind == "adagrad" { 5e-5 } else { 1e-5 };
            assert!(worst <= per_tensor, "{ctx}: a tensor differs by {worst:e}");
            // Rank 0 holds the state of its partition: one buffer per element for SGD with
            // momentum and Adagrad, two for LAMB (whole at stage 0).
            let mem = &start_record(&dir.join(&out))["memory_rank0"];
            let elems = mem["optimizer"].as_u64().unwrap() / 4;
            let per = if kind == "lamb" { 2 } else { 1 };
            let part = match stage {
                0 => n,
                1 | 2 => n.div_ceil(world),
                _ => elems / per,
            };
            assert_eq!(elems, per * part, "{ctx}");
            assert!(
                stage != 3 || (part * world >= n && part <= n / world + 4),
                "{ctx}"
            );
            assert_eq!(mem["offloaded"], offload, "{ctx}");
        }
    }
}

#[test]
fn sgd_on_n_ranks_matches_one_process_at_every_zero_stage() {
    data_parallel(
        "sgd",
        SGD,
        &[(0, false), (1, false), (2, false), (3, false)],
    );
}

#[test]
fn adagrad_on_n_ranks_matches_one_process_at_every_zero_stage_and_offloaded() {
    // Offload runs DeepSpeedCPUAdagrad's arithmetic: an ulp from torch's per step, well inside.
    data_parallel(
        "adagrad",
        ADAGRAD,
        &[
            (0, false),
            (1, false),
            (2, false),
            (3, false),
            (2, true),
            (3, true),
        ],
    );
}

#[test]
fn lamb_on_n_ranks_matches_one_process_at_zero_stage_0() {
    data_parallel("lamb", LAMB, &[(0, false)]);
}

/// Stopped on 2 ranks, resumed on 3: the per-rank optimizer files are re-partitioned (momentum
/// buffers and Adagrad sums by element ranges), and the run ends where the uninterrupted 2-rank
/// run ends.
#[test]
fn sgd_and_adagrad_checkpoints_resume_on_another_world_size() {
    for (kind, line, stage, offload) in [("sgd", SGD, 1u32, false), ("adagrad", ADAGRAD, 3, true)] {
        let dir = workspace(&format!("optrepart-{kind}"), &with(&dp_recipe(), line));
        dp_run(&dir, 2, "full", &zero_sets(stage, offload));
        let mut stop = zero_sets(stage, offload);
        stop.extend(["--stop-after".into(), "3".into()]);
        dp_run(&dir, 2, "part", &stop);
        let mut resume = zero_sets(stage, offload);
        resume.extend(["--resume".into(), "part/checkpoint-3".into()]);
        dp_run(&dir, 3, "part", &resume);
        let resumed = metrics(&dir.join("part"))
            .into_iter()
            .find(|r| r["event"] == "resume")
            .unwrap();
        assert_eq!(resumed["repartitioned"], true, "{kind}");
        let (a, b) = (losses(&dir.join("full")), losses(&dir.join("part")));
        assert_eq!(a.len(), b.len(), "{kind}");
        for ((k, x), (_, y)) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-6 * x.abs(),
                "{kind} step {k}: {y} vs {x}"
            );
        }
        let (rel, _) = distance(
            &weights(&dir.join("part/model/model.safetensors")),
            &weights(&dir.join("full/model/model.safetensors")),
        );
        assert!(
            rel <= 1e-6,
            "{kind}: resumed on 3 ranks, weights differ by {rel:e}"
        );
    }
}

#[test]
fn what_the_runtime_does_not_run_is_refused_plainly() {
    // (recipe line, extra lines, words the refusal must say)
    let cases = [
        (LAMB, "zero 1\n", "one trust ratio"),
        (LAMB, "", "bf16 gradient path"),
        (
            "optimizer sgd { lr = 0.05, nesterov = true }",
            "",
            "Nesterov momentum requires",
        ),
        ("optimizer lion { lr = 1e-4 }", "", "`optimizer lion`"),
    ];
    for (i, (line, extra, says)) in cases.into_iter().enumerate() {
        let mut recipe = with(TINY, line);
        recipe.push_str(extra);
        if says == "bf16 gradient path" {
            recipe = recipe.replace("precision = fp32", "precision = bf16");
        }
        let dir = workspace(&format!("optno-{i}"), &recipe);
        let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
        assert_ne!(o.status.code(), Some(0), "{line}");
        assert!(stderr(&o).contains(says), "{line}: {}", stderr(&o));
        // Refused with the native family's code and a help line (docs/rules/native.md).
        assert!(stderr(&o).contains("R1103"), "{line}: {}", stderr(&o));
        assert!(stderr(&o).contains("help:"), "{line}: {}", stderr(&o));
        assert!(!dir.join("out/model").exists(), "{line}");
    }
    // A hand-edited plan that asks for LAMB under ZeRO-1 is refused by the runtime itself.
    let dir = workspace("optno-plan", &with(TINY, LAMB));
    ok(recipe_in(
        &dir,
        &["build", "--target", "native", "-o", "built", "tiny.rcp"],
    ));
    let path = dir.join("built/plan.json");
    let mut plan: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    plan["train"]["zero_stage"] = 1.into();
    std::fs::write(&path, plan.to_string()).unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "built/plan.json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("LAMB under ZeRO stages 1–3"),
        "{}",
        stderr(&o)
    );
}
