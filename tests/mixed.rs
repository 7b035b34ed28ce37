//! `recipe run` in fp16 and bf16 on the tiny seeded BERT: every ZeRO stage on 1–4 ranks trains
//! the single-process curve; a forced fp16 overflow skips exactly the steps DeepSpeed's scaler
//! says and holds the LR schedule; a run resumed in the middle of an overflow streak ends
//! bit-identical; what each rank holds is counted at the half dtype.

use crate::common;

use std::path::Path;

use common::*;
use recipe_runtime::precision::{LossScaler, ScaleConfig, ScalerImpl};
use serde_json::Value;

/// The records of logged optimizer steps.
fn steps(dir: &Path) -> Vec<Value> {
    metrics(dir)
        .into_iter()
        .filter(|r| r["loss"].is_number())
        .collect()
}

fn end(dir: &Path) -> Value {
    metrics(dir)
        .into_iter()
        .find(|r| r["event"] == "end")
        .unwrap()
}

/// Relative L2 distance between two models' weights (all tensors together).
fn weight_distance(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for ((na, x), (nb, y)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (p, q) in x.iter().zip(y) {
            diff += f64::from(p - q).powi(2);
            scale += f64::from(*q).powi(2);
        }
    }
    (diff / scale).sqrt()
}

/// Tolerances for "the same training" under mixed precision, `(loss, weights)`. The ranks sum
/// gradients in another order and round the reduced values to the half dtype, so a run differs
/// from one process by rounding at the half type's precision, which Adam carries into the
/// weights. The fp32 tests' 1e-6 scaled by the ratio of machine epsilons (2⁻¹⁰/2⁻²³ for fp16)
/// would allow 8e-3. Measured over every stage, offload and world size below (8 steps): weights
/// fp16 7.5e-5, bf16 4.6e-4 (relative L2), bounded at about 5×; the logged loss is a half
/// value, so it moves by whole units in the last place: worst 4.8e-4 (fp16) and 2.1e-3 (bf16),
/// one unit each, bounded at one unit at 0.5 (2⁻¹¹/0.5, 2⁻⁸/0.5).
fn tolerance(precision: &str) -> (f64, f64) {
    match precision {
        "fp16" => (1e-3, 4e-4),
        _ => (8e-3, 3e-3),
    }
}

/// Every ZeRO stage (with and without optimizer offload from stage 1) on 1–4 ranks trains the
/// loss curve and weights of one process at that stage, in `precision` (8 steps, DeepSpeed's
/// default loss scale: fp16 skips its opening overflows, once at ZeRO-0 and twice, hysteresis,
/// at 1–3, the same on every world size); rank 0 holds half parameters and gradients and fp32
/// master weights of its partition.
fn data_parallel_case(precision: &str) {
    let dir = workspace(
        &format!("mixed-dp-{precision}"),
        &dp_recipe().replace("epochs = 2", "epochs = 4"),
    );
    let set = ["--set".to_string(), format!("train.precision={precision}")];
    let read = |out: &str| {
        let curve: Vec<f64> = steps(&dir.join(out))
            .iter()
            .map(|r| r["loss"].as_f64().unwrap())
            .collect();
        (
            curve,
            weights(&dir.join(out).join("model/model.safetensors")),
        )
    };
    let mut args = zero_sets(0, false);
    args.extend(set.iter().cloned());
    dp_run(&dir, 1, "base", &args);
    let (curve0, w0) = read("base");
    assert_eq!(curve0.len(), 8);
    let n = start_record(&dir.join("base"))["parameters"]
        .as_u64()
        .unwrap();
    // The run is not the fp32 run: the emulation rounds (else this test would prove nothing).
    let mut fp32 = zero_sets(0, false);
    fp32.extend(["--set".to_string(), "train.precision=fp32".to_string()]);
    dp_run(&dir, 1, "fp32", &fp32);
    let (_, w32) = read("fp32");
    let (tol_loss, tol_w) = tolerance(precision);
    let from_fp32 = weight_distance(&w0, &w32);
    assert!(
        from_fp32 > 1e-6,
        "{precision} trained fp32's weights: {from_fp32:e}"
    );

    let (mut worst_loss, mut worst_w) = (0.0f64, 0.0f64);
    for stage in 0..=3u32 {
        // One process at this stage is the reference (the stages skip different steps in fp16).
        let mut args = zero_sets(stage, false);
        args.extend(set.iter().cloned());
        let base = format!("base{stage}");
        dp_run(&dir, 1, &base, &args);
        let (curve1, w1) = read(&base);
        let offloads: &[bool] = if stage == 0 { &[false] } else { &[false, true] };
        for &offload in offloads {
            for world in [1u64, 2, 3, 4] {
                let ctx = format!("{precision} stage {stage} offload {offload} world {world}");
                let out = format!("s{stage}-{offload}-w{world}");
                let mut args = zero_sets(stage, offload);
                args.extend(set.iter().cloned());
                dp_run(&dir, world, &out, &args);
                let (curve, w) = read(&out);
                assert_eq!(curve.len(), curve1.len(), "{ctx}");
                for (a, b) in curve.iter().zip(&curve1) {
                    worst_loss = worst_loss.max((a - b).abs() / b.abs());
                }
                let d = weight_distance(&w, &w1);
                worst_w = worst_w.max(d);
                assert!(d <= tol_w, "{ctx}: weights differ by {d:e} (relative L2)");

                // What rank 0 held: half parameters and gradients (2 bytes an element), fp32
                // moments and master weights of the partition.
                let start = start_record(&dir.join(&out));
                assert_eq!(start["precision"], precision, "{ctx}");
                let mem = &start["memory_rank0"];
                let bytes = |k: &str| mem[k].as_u64().unwrap();
                let part = bytes("optimizer") / 8;
                let params = if stage == 3 { part } else { n };
                let grads = if stage >= 2 { part } else { n };
                assert_eq!(bytes("params"), 2 * params, "{ctx}");
                assert_eq!(bytes("grads"), 2 * grads, "{ctx}");
                if offload {
                    // Master weights and the fp32 gradient copy in host memory.
                    assert_eq!(bytes("host_copies"), 8 * part, "{ctx}");
                    assert_eq!(bytes("master"), 0, "{ctx}");
                } else {
                    assert_eq!(bytes("master"), 4 * part, "{ctx}");
                    assert_eq!(bytes("host_copies"), 0, "{ctx}");
                }
            }
        }
    }
    assert!(
        worst_loss <= tol_loss,
        "{precision}: loss curves differ by {worst_loss:e}"
    );
    eprintln!("{precision}: worst loss deviation {worst_loss:e}, weights {worst_w:e}");
}

#[test]
fn fp16_trains_every_zero_stage_on_1_to_4_ranks_like_one_process() {
    data_parallel_case("fp16");
}

#[test]
fn bf16_trains_every_zero_stage_on_1_to_4_ranks_like_one_process() {
    data_parallel_case("bf16");
}

/// The tiny recipe for 16 steps with an fp16 loss scale so large that the first steps overflow.
fn overflowing() -> String {
    TINY.replace("epochs = 2", "epochs = 4").replace(
        "precision = fp32",
        "precision = fp16, initial_scale_power = 24",
    )
}

/// The scale each step used and whether it was skipped, from the metrics.
fn scale_log(dir: &Path) -> Vec<(f64, bool)> {
    steps(dir)
        .iter()
        .map(|r| {
            (
                r["loss_scale"].as_f64().unwrap(),
                r["skipped"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_forced_overflow_skips_the_steps_the_scaler_says_and_holds_the_lr() {
    let dir = workspace("mixed-overflow", &overflowing());
    // The LR schedule of the same recipe without skips (fp32 never skips).
    let o = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.precision=fp32",
            "--set",
            "train.output_dir=\"plain\"",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plain_lr: Vec<f64> = steps(&dir.join("plain"))
        .iter()
        .map(|r| r["lr"].as_f64().unwrap())
        .collect();
    assert_eq!(plain_lr.len(), 16);

    for (stage, imp) in [(0u32, ScalerImpl::Fp16Optimizer), (1, ScalerImpl::Zero)] {
        let out = format!("z{stage}");
        let o = recipe_in(
            &dir,
            &[
                "run",
                "--quiet",
                "tiny.rcp",
                "--set",
                &format!("zero.stage={stage}"),
                "--set",
                &format!("train.output_dir=\"{out}\""),
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let log = scale_log(&dir.join(&out));
        assert_eq!(log.len(), 16, "every fp16 step is recorded");
        // At 2^24 the tiny model's fp16 gradients overflow: the first step must be skipped.
        assert!(
            log[0].1,
            "stage {stage}: step 1 at scale 2^24 did not overflow"
        );
        let skipped = log.iter().filter(|(_, s)| *s).count() as u64;
        assert!(skipped >= 4, "stage {stage}: only {skipped} skipped");
        assert!(
            log.iter().any(|(_, s)| !s),
            "stage {stage}: every step skipped"
        );
        assert_eq!(end(&dir.join(&out))["steps"]["skipped"], skipped);

        // DeepSpeed's scaler for this stage, fed the same overflows, used the same scales.
        let config = ScaleConfig::Dynamic {
            initial_scale_power: 24,
            window: 1000,
            hysteresis: 2,
            consecutive_hysteresis: false,
            min_scale: 1.0,
        };
        let mut scaler = LossScaler::new(config, imp);
        for (k, &(scale, skip)) in log.iter().enumerate() {
            assert_eq!(scale, scaler.scale(), "stage {stage} step {}", k + 1);
            scaler.update(skip).unwrap();
        }

        // The LR schedule only advances on applied steps: step k runs at the plain run's step
        // k − (steps skipped before it), and a skipped step holds that LR.
        let lrs: Vec<f64> = steps(&dir.join(&out))
            .iter()
            .map(|r| r["lr"].as_f64().unwrap())
            .collect();
        let mut before = 0usize;
        for (k, (&lr, &(_, skip))) in lrs.iter().zip(&log).enumerate() {
            assert_eq!(
                lr,
                plain_lr[k - before],
                "stage {stage} step {}: lr {lr} ({before} skipped before)",
                k + 1
            );
            before += usize::from(skip);
        }
        // A skipped step leaves the weights alone: the grad norm is not reported for it.
        for r in steps(&dir.join(&out)) {
            assert_eq!(r["skipped"].as_bool().unwrap(), r["grad_norm"].is_null());
        }
    }
}

#[test]
fn a_run_resumed_in_an_overflow_streak_ends_bit_identical() {
    let dir = workspace("mixed-resume", &overflowing());
    // ZeRO-2 with the global batch fixed at 12 × 3 whatever the ranks (micro 12/N), so 2 and 3
    // ranks train the same function: 2 steps an epoch, 8 in all.
    let run_at = |stage: u32, world: u64, out: &str, extra: &[&str]| {
        let mut args = vec![
            "run".to_string(),
            "--quiet".into(),
            "tiny.rcp".into(),
            "--gpus".into(),
            world.to_string(),
            "--set".into(),
            format!("zero.stage={stage}"),
            "--set".into(),
            format!("batch.micro={}", 12 / world),
            "--set".into(),
            format!("train.output_dir=\"{out}\""),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        recipe_in(&dir, &refs)
    };
    let run = |world: u64, out: &str, extra: &[&str]| run_at(2, world, out, extra);
    let ok = |o: std::process::Output| assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    ok(run(2, "a", &[]));
    let full = scale_log(&dir.join("a"));
    assert_eq!(full.len(), 8);
    // Stop after step 2, inside the opening streak of overflows (hysteresis already spent).
    assert!(full[0].1 && full[1].1 && full[2].1, "{full:?}");
    ok(run(2, "b", &["--stop-after", "2"]));
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("b/checkpoint-2/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["precision"], "fp16");
    assert_eq!(state["loss_scaler"]["skipped"], 2);
    assert_eq!(state["loss_scaler"]["hysteresis"], 1);
    ok(run(2, "b", &["--resume", "b/checkpoint-2"]));
    assert_eq!(
        scale_log(&dir.join("b")),
        full,
        "scales and skips after resume"
    );
    let a = std::fs::read(dir.join("a/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("b/model/model.safetensors")).unwrap();
    assert!(a == b, "the resumed fp16 run's weights differ");
    // The optimizer files carry the partitions' fp32 master weights.
    let opt = std::fs::read(dir.join("b/checkpoint-2/optimizer/rank-0-of-2.safetensors")).unwrap();
    let saved = recipe_runtime::optim::AdamState::from_safetensors(&opt).unwrap();
    assert_eq!(saved.master.len(), saved.m.len());

    // Every stage, fp16 and bf16: stopped on 2 ranks, resumed on 3 (re-partitioned, masters
    // included), the run ends where the uninterrupted 2-rank run ends, within the
    // mixed-precision tolerance.
    for stage in 0..=3u32 {
        for precision in ["fp16", "bf16"] {
            let p = format!("train.precision={precision}");
            let (full, part) = (
                format!("f{stage}{precision}"),
                format!("p{stage}{precision}"),
            );
            ok(run_at(stage, 2, &full, &["--set", &p]));
            ok(run_at(stage, 2, &part, &["--set", &p, "--stop-after", "6"]));
            let ckpt = format!("{part}/checkpoint-6");
            ok(run_at(stage, 3, &part, &["--set", &p, "--resume", &ckpt]));
            let d = weight_distance(
                &weights(&dir.join(&part).join("model/model.safetensors")),
                &weights(&dir.join(&full).join("model/model.safetensors")),
            );
            assert!(
                d <= tolerance(precision).1,
                "{precision} stage {stage}, resumed on 3 ranks: {d:e}"
            );
        }
    }

    // Another precision cannot take over an fp16 checkpoint's master weights.
    let o = run(
        3,
        "d",
        &[
            "--resume",
            "b/checkpoint-2",
            "--set",
            "train.precision=bf16",
        ],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("train.precision = fp16"),
        "{}",
        stderr(&o)
    );
}
