//! `recipe run` end to end on a tiny seeded BERT (generated here: a config.json, random init)
//! with the real MiniLM tokenizer and 48 committed SpamAssassin rows: the steps taken equal
//! the prediction, resume is bit-identical, a saved plan runs the same, and bad input is
//! reported plainly.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

#[test]
fn run_takes_the_predicted_steps_and_saves_an_hf_model() {
    let dir = workspace("steps", TINY);
    let o = recipe_in(&dir, &["steps", "--format", "json", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let steps: Value = serde_json::from_slice(&o.stdout).unwrap();
    let predicted = steps["native"]["total"].as_u64().unwrap();
    // 48 rows / micro 5 = 10 micro-batches per epoch, windows of 3: 4 steps (the last over 1).
    assert_eq!(predicted, 8);

    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = metrics(&dir.join("out"));
    let end = m.iter().find(|r| r["event"] == "end").unwrap();
    assert_eq!(end["steps"]["taken"], predicted);
    assert_eq!(end["steps"]["predicted"], predicted);
    let logged: Vec<u64> = m
        .iter()
        .filter_map(|r| r["loss"].as_f64().map(|_| r["step"].as_u64().unwrap()))
        .collect();
    assert_eq!(logged, (1..=predicted).collect::<Vec<_>>());
    // The LR of each step is the schedule `explain` prints: linear, warmup 2 of 8, peak 1e-3.
    let lr: Vec<f64> = m.iter().filter_map(|r| r["lr"].as_f64()).collect();
    let want = [
        0.0,
        5e-4,
        1e-3,
        5e-4 * 5.0 / 3.0,
        5e-4 * 4.0 / 3.0,
        5e-4,
        5e-4 * 2.0 / 3.0,
        5e-4 / 3.0,
    ];
    for (k, (g, w)) in lr.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-12, "step {}: lr {g}, want {w}", k + 1);
    }
    assert!(
        m.iter().any(|r| r["eval"]["rows"] == 12),
        "no eval record: {m:?}"
    );
    // HF layout: config.json with the label names, model.safetensors, tokenizer.json.
    let model = dir.join("out/model");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["id2label"]["1"], "spam");
    assert!(model.join("model.safetensors").is_file());
    assert!(model.join("tokenizer.json").is_file());
    // A checkpoint at the end of epoch 1 (save_every = epoch), none half-written.
    assert!(dir.join("out/checkpoint-4/optimizer.safetensors").is_file());
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_resumed_run_ends_bit_identical_to_an_uninterrupted_one() {
    let dir = workspace("resume", TINY);
    let full = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"a\"",
        ],
    );
    assert_eq!(full.status.code(), Some(0), "{}", stderr(&full));
    // Stop inside the second epoch (step 6 of 8), then resume from there.
    let first = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"b\"",
            "--stop-after",
            "6",
        ],
    );
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(
        !dir.join("b/model").exists(),
        "a stopped run wrote a final model"
    );
    let rest = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"b\"",
            "--resume",
            "b/checkpoint-6",
        ],
    );
    assert_eq!(rest.status.code(), Some(0), "{}", stderr(&rest));
    let a = std::fs::read(dir.join("a/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("b/model/model.safetensors")).unwrap();
    assert!(a == b, "resumed weights differ from the uninterrupted run");
    // The logged curve after the resume point is the same too.
    let curve = |d: &str| -> Vec<(u64, f64)> {
        metrics(&dir.join(d))
            .iter()
            .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
            .collect()
    };
    assert_eq!(curve("a"), curve("b"));
}

#[test]
fn a_saved_plan_runs_like_the_recipe() {
    let dir = workspace("plan", TINY);
    let o = recipe_in(
        &dir,
        &["build", "--target", "native", "-o", "built", "tiny.rcp"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("built/plan.json")).unwrap())
            .unwrap();
    assert_eq!(plan["format"], 1);
    assert_eq!(plan["steps"]["total"], 8);
    // DeepSpeed builds TINY's optimizer: one parameter group, every tensor decays.
    assert_eq!(plan["optimizer"]["no_decay"], serde_json::json!([]));
    let o = recipe_in(&dir, &["run", "--quiet", "built/plan.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::rename(dir.join("out"), dir.join("from-plan")).unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let a = std::fs::read(dir.join("from-plan/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("out/model/model.safetensors")).unwrap();
    assert!(a == b, "the plan and the recipe trained different weights");
}

#[test]
fn a_bad_row_is_reported_with_file_and_line_and_nothing_is_trained() {
    let dir = workspace("badrow", TINY);
    let mut rows: Vec<String> = std::fs::read_to_string(dir.join("train.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    rows[4] = r#"{"text": "half a row", "label": "#.into();
    std::fs::write(dir.join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("train.jsonl:5"), "{}", stderr(&o));
    assert!(!dir.join("out/model").exists());
}

/// A config.json that asks for far more than the machine holds (hidden_size 10⁶: some 10¹³
/// parameters) is refused before anything is allocated, with the model's size and the
/// machine's, where the allocation used to abort the process (found by fuzzing the configs).
#[test]
fn a_model_larger_than_the_machine_is_refused_before_anything_is_allocated() {
    let dir = workspace("huge", TINY);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let mut config = config.as_object().unwrap().clone();
    config.insert("hidden_size".into(), 1_000_000.into());
    std::fs::write(dir.join("config.json"), Value::Object(config).to_string()).unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    if cfg!(target_os = "linux") {
        assert!(
            e.contains("parameters: its f32 weights and gradients alone take")
                && e.contains("GiB this machine has available"),
            "{e}"
        );
    } else {
        // Without /proc/meminfo the allocation itself fails, as an error.
        assert!(e.contains("cannot be allocated"), "{e}");
    }
    assert!(!dir.join("out/model").exists());
}

/// Each rank a process runs holds a copy of the model, so `--gpus 100000` on the CPU (740 GiB of
/// the tiny model's weights and gradients) is refused before anything is allocated, where it
/// used to be killed by the kernel (and `--gpus 4294967296` aborted allocating the optimizers).
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the floor reads /proc/meminfo: elsewhere 100000 threads would be started"
)]
fn more_ranks_than_the_machine_holds_are_refused_before_anything_is_allocated() {
    let dir = workspace("many-ranks", TINY);
    let o = recipe_in(&dir, &["run", "--quiet", "--gpus", "100000", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("each of the 100000 ranks this process runs holds a copy")
            && e.contains("run fewer ranks (--gpus)"),
        "{e}"
    );
    assert!(!dir.join("out/model").exists());
}

#[test]
fn a_label_outside_the_declared_set_is_an_error() {
    let dir = workspace("badlabel", TINY);
    let text = std::fs::read_to_string(dir.join("train.jsonl")).unwrap();
    std::fs::write(
        dir.join("train.jsonl"),
        text.replacen("\"label\": 1", "\"label\": 7", 1),
    )
    .unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(e.contains("train.jsonl:") && e.contains('7'), "{e}");
}

#[test]
fn what_is_not_built_yet_is_said_plainly() {
    // Parameter offload (ZeRO-Infinity) is not built; ZeRO-3 itself runs (see below). The
    // native check refuses it with its code, span and help before anything runs.
    let dir = workspace("gpus", &format!("{TINY}zero 3 {{ offload param = cpu }}\n"));
    let o = recipe_in(&dir, &["run", "--gpus", "2", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("R1105"), "{}", stderr(&o));
    assert!(stderr(&o).contains("offload param"), "{}", stderr(&o));
    assert!(!dir.join("out").exists(), "{}", stderr(&o));
    // `recipe build --target native` refuses it the same way, and `recipe check --target
    // native` shows it; a plain `recipe check` does not (the DeepSpeed build is fine).
    let o = recipe_in(&dir, &["build", "--target", "native", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("R1105"), "{}", stderr(&o));
    let o = recipe_in(&dir, &["check", "--target", "native", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("R1105"), "{}", stderr(&o));
    let o = recipe_in(&dir, &["check", "tiny.rcp"]);
    assert!(!stderr(&o).contains("R1105"), "{}", stderr(&o));
}

#[test]
fn without_a_cuda_driver_the_gpu_is_refused_plainly() {
    if recipe_runtime::backend::cuda::probe().driver {
        // A GPU machine: scripts/gpu-check.sh trains there instead.
        eprintln!("a CUDA driver is present; the refusal cannot be shown here");
        return;
    }
    let dir = workspace("nodriver", TINY);
    let o = recipe_in(&dir, &["run", "--device", "cuda", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no CUDA driver (libcuda.so.1) found; use --device cpu"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("out").exists(), "{}", stderr(&o));
    // auto falls back to the CPU without a word about it.
    let o = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "--device",
            "auto",
            "--set",
            "train.epochs=1",
            "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = metrics(&dir.join("out"));
    let start = m.iter().find(|r| r["event"] == "start").unwrap();
    assert_eq!(start["device"], "cpu");
    // auto with --profile says there is nothing to time, and trains; no profile is written.
    let o = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "--profile",
            "--device",
            "auto",
            "--set",
            "train.epochs=1",
            "--set",
            "train.output_dir=\"auto-profiled\"",
            "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no GPU here, so --profile has nothing to time"),
        "{}",
        stderr(&o)
    );
    assert!(dir.join("auto-profiled/metrics.jsonl").exists());
    assert!(!dir.join("auto-profiled/profile.json").exists());
}

/// `--profile` times a GPU's operations: asked of a CPU run, it is refused before any work.
#[test]
fn a_profile_of_a_cpu_run_is_refused() {
    let dir = workspace("profile-cpu", TINY);
    let o = recipe_in(&dir, &["run", "--profile", "--device", "cpu", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("error: --profile times the GPU's operations (CUDA events); this run trains on the CPU: pass --device cuda"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.join("out").exists(), "{}", stderr(&o));
}

/// What [`device_run_against_the_cpu`] measured, each the largest over the run.
#[derive(Debug)]
struct Deviation {
    /// Relative difference of a step's loss.
    loss: f64,
    /// Relative difference of a step's gradient norm.
    grad_norm: f64,
    /// Absolute difference of a final weight, the device's run vs the CPU's.
    weights: f32,
    /// The same for the run resumed on the CPU from the device's mid-run checkpoint.
    resumed: f32,
    /// The same for the run resumed on the device from the CPU's mid-run checkpoint.
    back: f32,
    /// Steps skipped on an fp16 overflow (the same on both).
    skipped: usize,
}

/// The training loop on the CUDA backend's launch code, run on the emulated GPU (runtime/emu),
/// with the model states resident there: the parameters, the gradient accumulator over a
/// window, the optimizer's state (and the fp32 master weights under mixed precision) stay on
/// the device and its kernel runs the step (`adamw_step`, or `optimizer`'s when that replaces
/// the recipe's AdamW line), the host getting only the loss and `Σ g²` per step.
/// 16 rows, micro-batches of 2 accumulated 2 by 2 (4 steps), dropout 0.1 with the CPU's masks,
/// `clip` 0.58 (steps 2 and 3 clip, 1 and 4 do not), a checkpoint at step 2 written from the
/// device's states, the evaluation at the end on the device. Against the CPU alone: the same
/// steps, LRs, loss scales and skipped steps exactly; losses, gradient norms and final weights to
/// the kernels' float differences; and the device's checkpoint resumed on the CPU, and the CPU's
/// resumed on the device, end where the CPU alone ends (the checkpoints are the same files).
/// In fp16/bf16, under optimizer offload, and with the devices summing directly, the device run
/// again with 16-bit buffers, late queued copies and sums, and captured passes (`EmuTyped`)
/// gives the same bits. docs/cuda.md states the
/// figures.
fn device_run_against_the_cpu(
    precision: &str,
    optimizer: Option<&str>,
    zero: Option<&str>,
    sets: &[&str],
) -> Deviation {
    device_run(precision, optimizer, zero, sets, false)
}

/// [`device_run_against_the_cpu`] on several emulated GPUs that sum their gradients directly
/// (`OnDevice::with_peers`: NCCL's place on real GPUs), not through host memory; and the same
/// devices summing through the host's exchange give the same bits (the tolerance against the
/// CPU alone would let a misplaced part of a reduction pass).
fn peers_run_against_the_cpu(precision: &str, zero: Option<&str>, sets: &[&str]) -> Deviation {
    device_run(precision, None, zero, sets, true)
}

fn device_run(
    precision: &str,
    optimizer: Option<&str>,
    zero: Option<&str>,
    sets: &[&str],
    peers: bool,
) -> Deviation {
    use recipe_kernel_emu::{Emu, EmuPeers};
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::model::{Classifier, Executor, OnDevice};
    use recipe_runtime::plan::Plan;
    use recipe_runtime::train::{self, RunOptions};
    use std::sync::Arc;

    let recipe = TINY
        .replace(
            "batch { micro = 5, accumulate = 3 }",
            "batch { micro = 2, accumulate = 2 }",
        )
        .replace("max_len = 24", "max_len = 16")
        .replace(
            "epochs = 2, precision = fp32,",
            &format!("epochs = 1, precision = {precision}, clip = 0.58, save_every = 2,"),
        );
    let adamw = "optimizer adamw { lr = 1e-3, weight_decay = 0.01 }";
    assert!(recipe.contains(adamw));
    let recipe = recipe.replace(adamw, optimizer.unwrap_or(adamw));
    // A `zero` block (the stage, optimizer offload) appended to the recipe.
    let recipe = format!("{recipe}{}\n", zero.unwrap_or(""));
    let kind = optimizer.map_or("adamw", |o| o.split_whitespace().nth(1).unwrap());
    let stage: String = zero.map_or(String::new(), |z| {
        z.chars().filter(char::is_ascii_alphanumeric).collect()
    });
    let tag = if peers { "-peers" } else { "" };
    let dir = workspace(
        &format!("device-optim-{precision}-{kind}{stage}{tag}"),
        &recipe,
    );
    // Fewer rows than the other tests: the emulation runs every CUDA thread in turn on one core.
    let rows = std::fs::read_to_string(dir.join("train.jsonl")).unwrap();
    let head = |n: usize| -> String { rows.lines().take(n).map(|l| format!("{l}\n")).collect() };
    // 16 rows per rank: four steps whatever the world.
    let ranks = sets
        .windows(2)
        .find(|w| w[0] == "--gpus")
        .map_or(1, |w| w[1].parse::<usize>().unwrap());
    std::fs::write(dir.join("train.jsonl"), head(16 * ranks)).unwrap();
    std::fs::write(dir.join("eval.jsonl"), head(4)).unwrap();
    let mut args = vec!["build", "--target", "native", "-o", "built"];
    args.extend_from_slice(sets);
    args.push("tiny.rcp");
    let o = recipe_in(&dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut plan = Plan::read(&dir.join("built/plan.json")).unwrap();
    let dtype = plan.train.precision.module_dtype();

    plan.train.output_dir = dir.join("cpu");
    let quiet = RunOptions {
        quiet: true,
        ..RunOptions::default()
    };
    train::run(&plan, &quiet).unwrap();
    plan.train.output_dir = dir.join("gpu");
    // One emulated GPU per rank.
    let world = plan.batch.world.max(1) as usize;
    let gpu = || -> Vec<Arc<dyn Executor>> {
        let kernels = || Kernels::new(Emu).with_store(dtype);
        if peers {
            return EmuPeers::group(world)
                .into_iter()
                .map(|p| -> Arc<dyn Executor> {
                    OnDevice::with_peers(kernels(), "emulated GPU", Box::new(p))
                })
                .collect();
        }
        (0..world)
            .map(|_| -> Arc<dyn Executor> { OnDevice::new(kernels(), "emulated GPU") })
            .collect()
    };
    let options = RunOptions {
        executors: gpu(),
        ..quiet.clone()
    };
    train::run(&plan, &options).unwrap();
    if peers {
        // The same devices summing through the host's exchange instead (each rank's gradient
        // down, `LocalCollective`, the result up): the GPU-to-GPU sums, reductions to the
        // owners, broadcasts and gathers give its bits.
        plan.train.output_dir = dir.join("host-exchange");
        let executors = (0..world)
            .map(|_| -> Arc<dyn Executor> {
                OnDevice::new(Kernels::new(Emu).with_store(dtype), "emulated GPU")
            })
            .collect();
        let options = RunOptions {
            executors,
            ..quiet.clone()
        };
        train::run(&plan, &options).unwrap();
        same_run(&dir.join("gpu"), &dir.join("host-exchange"));
    }
    let offload = plan.train.offload_optimizer != recipe_runtime::plan::Offload::None;
    if dtype.is_half() || offload || peers {
        // The same run keeping the stored activations and gradients in 16 bits (a GPU's
        // buffers, docs/cuda.md "16-bit buffers"): the same bits as the f32 buffers holding
        // the same values, through every step, the checkpoint and the evaluation. `EmuTyped`
        // also runs the offload's queued copies as late as their contract allows (at
        // `wait_copies`) where `Emu` copies at once, and the devices' queued sums (the
        // gradient summed segment by segment during the backward) at the join where `Emu` sums
        // at once: a missing wait or join would differ; and it
        // replays one device's passes from captured graphs (model/on_device/graphs.rs): a
        // value passed per micro-batch by argument would differ.
        plan.train.output_dir = dir.join("gpu16");
        let kernels = || Kernels::new(recipe_kernel_emu::EmuTyped).with_store(dtype);
        let executors = if peers {
            recipe_kernel_emu::EmuTypedPeers::group(world)
                .into_iter()
                .map(|p| -> Arc<dyn Executor> {
                    OnDevice::with_peers(kernels(), "emulated GPU", Box::new(p))
                })
                .collect()
        } else {
            (0..world)
                .map(|_| -> Arc<dyn Executor> { OnDevice::new(kernels(), "emulated GPU") })
                .collect()
        };
        let options = RunOptions {
            executors,
            ..quiet.clone()
        };
        let replayed = recipe_kernel_emu::graphs_replayed();
        train::run(&plan, &options).unwrap();
        // One GPU's whole model: its passes were captured and replayed as CUDA graphs (with
        // ZeRO 2–3's own gradient buffer; under offload all but a window's last micro-batch;
        // `EmuTyped` captures, `Emu` does not; counted on this thread, which drives one rank's
        // device).
        let replayed = recipe_kernel_emu::graphs_replayed() - replayed;
        if world == 1 {
            assert!(replayed > 0, "no pass replayed from a graph");
        }
        same_run(&dir.join("gpu"), &dir.join("gpu16"));
    }
    // The device's mid-run checkpoint, finished on the CPU.
    plan.train.output_dir = dir.join("resumed");
    let options = RunOptions {
        resume: Some(dir.join("gpu/checkpoint-2")),
        ..quiet.clone()
    };
    train::run(&plan, &options).unwrap();
    // And back: the CPU's checkpoint finished on the device.
    plan.train.output_dir = dir.join("back");
    let options = RunOptions {
        resume: Some(dir.join("cpu/checkpoint-2")),
        executors: gpu(),
        ..quiet.clone()
    };
    train::run(&plan, &options).unwrap();

    let (cpu, gpu) = (metrics(&dir.join("cpu")), metrics(&dir.join("gpu")));
    let start = gpu.iter().find(|r| r["event"] == "start").unwrap();
    assert_eq!(start["device"], "emulated GPU");
    // One rank: the model states on the device, and the optimizer too unless it is offloaded
    // (not the host's path behind the executor, which would pass the test too). Several: each
    // rank's passes on its device, the model states on the host.
    // Several at ZeRO-0, or with peers at any stage: each rank's model (ZeRO-3: its pieces)
    // resident on its device, and its optimizer (its partition) unless offloaded.
    let offloaded = start["offload_optimizer"] == true;
    let stage = plan.train.zero_stage;
    let resident = world == 1 || stage == 0 || peers;
    assert_eq!(start["world"], world, "{start}");
    assert_eq!(start["model_on_device"], resident, "{start}");
    assert_eq!(start["exchange_on_device"], peers, "{start}");
    assert_eq!(
        start["optimizer_on_device"],
        resident && !offloaded,
        "{start}"
    );
    let files = |run: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.join(run).join("checkpoint-2"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(files("cpu"), files("gpu"));
    let steps = |m: &[Value]| -> Vec<Value> {
        m.iter()
            .filter(|r| r["loss"].is_f64() || r["eval"].is_object())
            .cloned()
            .collect()
    };
    let (a, b) = (steps(&cpu), steps(&gpu));
    assert_eq!(a.len(), 5, "{cpu:?}");
    assert_eq!(a.len(), b.len(), "{gpu:?}");
    let rel = |x: &Value, y: &Value| {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        (x - y).abs() / x.abs()
    };
    let (mut loss, mut grad_norm) = (0.0f64, 0.0f64);
    let (mut clipped, mut skipped) = (0, 0);
    for (ra, rb) in a.iter().zip(&b) {
        if ra["eval"].is_object() {
            loss = loss.max(rel(&ra["eval"]["loss"], &rb["eval"]["loss"]));
            continue;
        }
        for key in ["step", "lr", "loss_scale", "skipped"] {
            assert_eq!(ra[key], rb[key], "{key}: {ra} vs {rb}");
        }
        loss = loss.max(rel(&ra["loss"], &rb["loss"]));
        skipped += usize::from(ra["skipped"] == true);
        // A skipped step reports no norm, on both.
        assert_eq!(ra["grad_norm"].is_null(), rb["grad_norm"].is_null(), "{rb}");
        if !ra["grad_norm"].is_null() {
            grad_norm = grad_norm.max(rel(&ra["grad_norm"], &rb["grad_norm"]));
            clipped += usize::from(ra["grad_norm"].as_f64().unwrap() > plan.train.clip);
        }
    }
    assert!(clipped >= 1, "no step clipped: {cpu:?}");
    let weights = |name: &str| {
        let m = Classifier::from_pretrained(&dir.join(name).join("model"), 2, 0).unwrap();
        m.params().data.clone()
    };
    let worst = |x: &[f32], y: &[f32]| {
        assert_eq!(x.len(), y.len());
        x.iter()
            .zip(y)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let cpu_w = weights("cpu");
    let d = Deviation {
        loss,
        grad_norm,
        weights: worst(&cpu_w, &weights("gpu")),
        resumed: worst(&cpu_w, &weights("resumed")),
        back: worst(&cpu_w, &weights("back")),
        skipped,
    };
    let optimizer_at = if offloaded || !resident {
        "the host"
    } else {
        "the device"
    };
    eprintln!(
        "{precision} {}, CPU vs the emulated GPU, optimizer on {optimizer_at}: {d:?}",
        zero.unwrap_or("")
    );
    d
}

/// Two runs' steps (loss, gradient norm, LR, loss scale, skipped), evaluations and final
/// weights are the same bits.
fn same_run(a: &Path, b: &Path) {
    let keys = [
        "step",
        "loss",
        "grad_norm",
        "lr",
        "loss_scale",
        "skipped",
        "eval",
    ];
    let records = |dir: &Path| -> Vec<Vec<Value>> {
        metrics(dir)
            .iter()
            .filter(|r| r["loss"].is_f64() || r["eval"].is_object())
            .map(|r| {
                let mut r = r.clone();
                // An evaluation's figures, not its time.
                if let Some(e) = r["eval"].as_object_mut() {
                    e.retain(|k, _| !["seconds", "samples_per_s"].contains(&k.as_str()));
                }
                keys.iter().map(|k| r[*k].clone()).collect()
            })
            .collect()
    };
    let (ra, rb) = (records(a), records(b));
    assert!(!ra.is_empty());
    assert_eq!(ra, rb, "{} vs {}", a.display(), b.display());
    let weights = |dir: &Path| -> Vec<u32> {
        let m = recipe_runtime::model::Classifier::from_pretrained(&dir.join("model"), 2, 0);
        m.unwrap()
            .params()
            .data
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert!(weights(a) == weights(b), "final weights differ");
}

impl Deviation {
    /// Asserts the losses and gradient norms are within `rel` relative, every final weight within
    /// `abs`.
    #[track_caller]
    fn within(&self, rel: f64, abs: f32) {
        assert!(self.loss <= rel && self.grad_norm <= rel, "{self:?}");
        assert!(
            self.weights <= abs && self.resumed <= abs && self.back <= abs,
            "{self:?}"
        );
    }
}

#[test]
fn the_device_optimizer_trains_the_cpu_curve_in_fp32_and_its_checkpoint_resumes_on_the_cpu() {
    device_run_against_the_cpu("fp32", None, None, &[]).within(1e-5, 1e-6);
}

/// fp16 at ZeRO-1 (where DeepSpeed scales the loss): the default scale 2¹⁶ overflows the first
/// steps (two, with the scaler's hysteresis of 2), which the device's `Σ g²` must report for the
/// host's scaler to skip them and halve the scale; the last two steps apply.
#[test]
fn the_device_optimizer_trains_the_cpu_curve_in_fp16_with_the_loss_scaler() {
    let d = device_run_against_the_cpu("fp16", None, None, &["--set", "zero.stage=1"]);
    assert_eq!(d.skipped, 2, "{d:?}");
    d.within(1e-3, 1e-3);
}

/// bf16: the same path as fp16 without the scaler (half weights rounded from the device's fp32
/// masters).
#[test]
fn the_device_optimizer_trains_the_cpu_curve_in_bf16() {
    device_run_against_the_cpu("bf16", None, None, &[]).within(1e-2, 1e-2);
}

/// LAMB resident on the device (the optimizer with the most device code: the moments, two f32
/// norms per tensor in FusedLamb's fixed order, the trust ratio, the update) in fp32, resumed on
/// the CPU from the device's checkpoint and back. SGD and Adagrad run the same loop with one
/// elementwise kernel each, checked bit for bit in runtime/emu/tests/optim.rs, so the loop runs
/// LAMB only.
#[test]
fn the_device_lamb_trains_the_cpu_curve_and_resumes_across_the_cpu_and_the_device() {
    let lamb = "optimizer lamb { lr = 0.01, weight_decay = 0.01 }";
    device_run_against_the_cpu("fp32", Some(lamb), None, &[]).within(1e-5, 1e-6);
}

/// recipes/cls.rcp's shape on one GPU: ZeRO-2, the optimizer offloaded to the CPU, fp16.
/// DeepSpeed's ZeRO-Offload: the passes and the window's gradient accumulation on the device
/// (each micro-batch's gradient reduced into the accumulator as the stage's sink does), one copy
/// of the gradients to the host per step, the host's overflow check, loss scaler, clipping and
/// AdamW, one copy of the parameters back. The default scale overflows the first two steps as at
/// ZeRO-1; the checkpoints are ZeRO-2's files on both, resumed across.
#[test]
fn the_device_trains_zero_2_with_the_optimizer_offloaded_in_fp16() {
    let zero = "zero 2 { offload optimizer = cpu }";
    let d = device_run_against_the_cpu("fp16", None, Some(zero), &[]);
    assert_eq!(d.skipped, 2, "{d:?}");
    d.within(1e-3, 1e-3);
}

/// The same offload in fp32: the parameters go up as floats (`Device::upload_queued`), range by
/// range while the host steps the next, and the window's gradient comes down segment by segment
/// during the last backward; the late copies of `EmuTyped` give the same bits.
#[test]
fn the_device_trains_zero_2_with_the_optimizer_offloaded_in_fp32() {
    let zero = "zero 2 { offload optimizer = cpu }";
    device_run_against_the_cpu("fp32", None, Some(zero), &[]).within(1e-5, 1e-6);
}

/// ZeRO-3 on one GPU in fp32, the optimizer on the device: one rank's pieces are the whole
/// model, so the resident path runs, with the stage's accumulation of each micro-batch.
#[test]
fn the_device_trains_zero_3_in_fp32_and_resumes_across_the_cpu() {
    device_run_against_the_cpu("fp32", None, Some("zero 3"), &[]).within(1e-5, 1e-6);
}

/// A library caller handing `train::run` fewer devices than the plan has ranks gets a plain
/// error before anything trains, not a rank without a device.
#[test]
fn one_device_for_two_ranks_is_refused() {
    use recipe_kernel_emu::Emu;
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::model::{Executor, OnDevice};
    use recipe_runtime::plan::Plan;
    use recipe_runtime::train::{self, RunOptions};

    let dir = workspace("one-device-two-ranks", TINY);
    let o = recipe_in(
        &dir,
        &[
            "build", "--target", "native", "-o", "built", "--gpus", "2", "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut plan = Plan::read(&dir.join("built/plan.json")).unwrap();
    plan.train.output_dir = dir.join("out");
    let one: std::sync::Arc<dyn Executor> = OnDevice::new(Kernels::new(Emu), "emulated GPU");
    let options = RunOptions {
        quiet: true,
        executors: vec![one],
        ..RunOptions::default()
    };
    let e = train::run(&plan, &options).unwrap_err().to_string();
    assert!(
        e.contains("1 device(s) for 2 rank(s) in this process"),
        "{e}"
    );
    assert!(!dir.join("out/metrics.jsonl").exists());
}

/// Two GPUs without ZeRO (plain data parallelism): each rank's model and AdamW resident on its
/// device, the window's gradient down, averaged on the host, and back up for the device's step.
#[test]
fn two_gpus_keep_resident_replicas_at_zero_0() {
    device_run_against_the_cpu("fp32", None, None, &["--gpus", "2"]).within(1e-5, 1e-6);
}

/// The same in fp16: the device's `Σ g²` of the averaged gradient is every rank's overflow
/// check, and the host's scaler skips the same steps on both.
#[test]
fn two_gpus_keep_resident_replicas_at_zero_0_in_fp16() {
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    device_run_against_the_cpu("fp16", None, None, &sets).within(1e-3, 1e-3);
}

/// Two GPUs (two emulated devices, one per rank thread) against the CPU's two simulated ranks
/// at ZeRO-1: each device accumulates its rank's window, one copy down per step for the host's
/// all-reduce, the host steps its shard and all-gathers, one copy of the parameters up. The
/// checkpoints are the same files, resumed across.
#[test]
fn two_gpus_train_the_cpu_ranks_curve_at_zero_1() {
    device_run_against_the_cpu("fp32", None, Some("zero 1"), &["--gpus", "2"]).within(1e-5, 1e-6);
}

/// recipes/cls.rcp's shape on two GPUs: ZeRO-2, optimizer offload, fp16. Each micro-batch's
/// gradient comes to the host and is reduced to its owners segment by segment, as the CPU
/// ranks' backward hands it over; the overflow steps are skipped on both.
#[test]
fn two_gpus_train_zero_2_with_the_optimizer_offloaded_in_fp16() {
    let zero = "zero 2 { offload optimizer = cpu }";
    // Two ranks' averaged gradients are smaller: a lower clip, so that a step clips.
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    device_run_against_the_cpu("fp16", None, Some(zero), &sets).within(1e-3, 1e-3);
}

/// ZeRO-3 on two GPUs in fp32: the ranks keep their pieces on the host, each micro-batch's
/// gradient is reduce-scattered there, and each device gets the whole parameters gathered once
/// per step.
#[test]
fn two_gpus_train_zero_3_in_fp32() {
    device_run_against_the_cpu("fp32", None, Some("zero 3"), &["--gpus", "2"]).within(1e-5, 1e-6);
}

/// Two GPUs summing their gradients directly (NCCL's place; here two emulated devices adding in
/// rank order) at ZeRO-0 in fp16: nothing crosses to the host but the loss and `Σ g²`, and the
/// run is the CPU ranks'.
#[test]
fn two_gpus_average_between_the_devices_at_zero_0_in_fp16() {
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("fp16", None, &sets).within(1e-3, 1e-3);
}

/// recipes/cls.rcp's shape (ZeRO-2, optimizer offload, fp16) with the devices reducing each
/// micro-batch's gradient to its owners into a partition-sized accumulator: the rank's
/// partition down during the window's last backward (each segment's piece once reduced and
/// added) and up range by range during the host's CPU step, then the partitions broadcast
/// between the devices. `EmuTyped` copies at the wait where `Emu` copies at once: a piece
/// copied before its addition gives other bits.
#[test]
fn two_gpus_reduce_to_the_owners_between_the_devices_at_zero_2_offloaded_in_fp16() {
    let zero = "zero 2 { offload optimizer = cpu }";
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("fp16", Some(zero), &sets).within(1e-3, 1e-3);
}

/// ZeRO-2 without offload in fp16 with the devices summing: each device steps its partition
/// (AdamW, fp32 master weights) after reducing every micro-batch to the owners, and broadcasts
/// it; the overflow check and the norm sum the ranks' partitions.
#[test]
fn two_gpus_step_their_partitions_on_the_devices_at_zero_2_in_fp16() {
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("fp16", Some("zero 2"), &sets).within(1e-3, 1e-3);
}

/// ZeRO-2 on three GPUs in bf16 with the devices summing: each segment's gradient reduced to
/// the owners of its parts of the flat partition as the backward finishes it (a segment may
/// lie in one owner's range, or across two), from two segment-sized buffers.
#[test]
fn three_gpus_reduce_each_segment_to_its_owners_at_zero_2_in_bf16() {
    let sets = ["--gpus", "3", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("bf16", Some("zero 2"), &sets).within(1e-3, 1e-3);
}

/// ZeRO-1 with optimizer offload on three GPUs in bf16 with the devices summing: the whole
/// gradient averaged between the devices (each segment summed during the last backward, then
/// made the average there and its part in the rank's range copied down for the host's step as
/// the backward goes on), its norm summed on the device over the whole, that range's 16-bit values up as the host steps them, then every range
/// broadcast from its owner (DeepSpeed's stage 1 with `offload_optimizer`).
#[test]
fn three_gpus_offload_their_ranges_at_zero_1_in_bf16() {
    let zero = "zero 1 { offload optimizer = cpu }";
    let sets = ["--gpus", "3", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("bf16", Some(zero), &sets).within(1e-3, 1e-3);
}

/// ZeRO-3 on three GPUs in bf16 with the devices summing: pieces of unequal lengths (the
/// segments do not divide by three), gathered and reduced between the devices, the master
/// weights of each rank's pieces on its device; the evaluations and checkpoints gather the
/// whole model.
#[test]
fn three_gpus_gather_and_reduce_their_pieces_at_zero_3_in_bf16() {
    let sets = ["--gpus", "3", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("bf16", Some("zero 3"), &sets).within(1e-3, 1e-3);
}

/// ZeRO-3 with optimizer offload in fp16 with the devices summing: each device holds its pieces
/// and accumulates their gradient, the host steps them (down during the window's last
/// backward, each segment's piece once reduced; up range by range during the step), and
/// the checkpoints and the evaluation gather the whole model between the devices.
#[test]
fn two_gpus_offload_their_pieces_at_zero_3_in_fp16() {
    let zero = "zero 3 { offload optimizer = cpu }";
    let sets = ["--gpus", "2", "--set", "train.clip=0.4"];
    peers_run_against_the_cpu("fp16", Some(zero), &sets).within(1e-3, 1e-3);
}

/// ZeRO-1 and ZeRO-3 in fp32 with the devices summing, each device stepping its partition:
/// the window's average (ZeRO-1), and each segment gathered from the ranks' pieces inside the
/// pass and its gradient reduced to the owners as the backward finishes it (ZeRO-3); and ZeRO-1
/// with the optimizer offloaded, averaged on the devices, the rank's range of the average down
/// for the host's step and up again, then broadcast from its owner.
#[test]
fn two_gpus_sum_between_the_devices_at_zero_1_and_3() {
    // ZeRO-1 offloaded as well: the average on the devices, the host's step of the rank's range.
    for zero in ["zero 1", "zero 1 { offload optimizer = cpu }", "zero 3"] {
        peers_run_against_the_cpu("fp32", Some(zero), &["--gpus", "2"]).within(1e-5, 1e-6);
    }
}

#[test]
fn a_hub_model_that_is_not_cached_says_how_to_fetch_it() {
    let recipe = TINY.replace(
        "config = \"config.json\"",
        "from = \"sentence-transformers/all-MiniLM-L6-v2\"",
    );
    let dir = workspace("hub", &recipe);
    let o = recipe_in(&dir, &["run", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("scripts/fetch-minilm.sh"),
        "{}",
        stderr(&o)
    );
}

/// Data parallelism under ZeRO `stage` (with and without optimizer offload for stages 1–3): N
/// rank threads with micro-batch 12/N train the same loss curve and weights as one process
/// with micro-batch 12 (the global batch held fixed; only the order of float sums differs), for
/// N = 1–4; and rank 0 holds 1/N of the optimizer state (stages 1–3), of the gradients (2–3)
/// and of the parameters (3).
fn data_parallel_case(stage: u32) {
    let dir = workspace(&format!("dp{stage}"), &dp_recipe());
    let read = |out: &str| {
        let curve: Vec<f64> = metrics(&dir.join(out))
            .iter()
            .filter_map(|r| r["loss"].as_f64())
            .collect();
        let w = weights(&dir.join(out).join("model/model.safetensors"));
        (curve, w)
    };
    dp_run(&dir, 1, "base", &zero_sets(0, false));
    let (curve1, w1) = read("base");
    assert_eq!(
        curve1.len(),
        4,
        "48 rows / 12 = 4 batches, windows of 2, 2 epochs"
    );
    let n = start_record(&dir.join("base"))["parameters"]
        .as_u64()
        .unwrap();
    let offloads: &[bool] = if stage == 0 { &[false] } else { &[false, true] };
    for &offload in offloads {
        for world in [1u64, 2, 3, 4] {
            let ctx = format!("stage {stage} offload {offload} world {world}");
            let out = format!("w{world}-{offload}");
            dp_run(&dir, world, &out, &zero_sets(stage, offload));
            let (curve, w) = read(&out);
            assert_eq!(curve.len(), curve1.len(), "{ctx}");
            for (k, (a, b)) in curve.iter().zip(&curve1).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{ctx} step {}: loss {a} vs {b}",
                    k + 1
                );
            }
            // The whole model within 1e-6 relative (L2), and every tensor within 1e-5: the
            // bias gradients are sums of terms of both signs, whose rounding depends on how rows
            // are grouped, and Adam turns that into ~1e-6 relative changes of a bias (measured
            // 1.4e-6 for value.bias at world 3).
            let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
            let (mut all_diff, mut all_scale) = (0.0f64, 0.0f64);
            for ((name, a), (_, b)) in w.iter().zip(&w1) {
                let diff = norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)));
                let scale = norm(&mut b.iter().map(|&x| f64::from(x))).max(1e-30);
                assert!(
                    diff <= 1e-5 * scale,
                    "{ctx}: {name}: ‖Δ‖ {diff:e} vs ‖w‖ {scale:e}"
                );
                all_diff += diff * diff;
                all_scale += scale * scale;
            }
            let rel = (all_diff / all_scale).sqrt();
            assert!(
                rel <= 1e-6,
                "{ctx}: the weights differ by {rel:e} (relative L2)"
            );

            // What rank 0 held, in fp32 elements.
            let start = start_record(&dir.join(&out));
            assert_eq!(start["zero_stage"], stage, "{ctx}");
            let mem = &start["memory_rank0"];
            let elems = |k: &str| mem[k].as_u64().unwrap() / 4;
            let part = elems("optimizer") / 2; // two moments per owned parameter
            let w = world;
            match stage {
                0 => assert_eq!(part, n, "{ctx}"),
                // One contiguous shard of the padded buffer.
                1 | 2 => assert_eq!(part, n.div_ceil(w), "{ctx}"),
                // A piece of each of the 4 segments, each padded on its own.
                _ => assert!(part * w >= n && part <= n / w + 4, "{ctx}: {part} of {n}"),
            }
            let grads = if stage >= 2 { part } else { n };
            let params = if stage == 3 { part } else { n };
            assert_eq!(elems("grads"), grads, "{ctx}");
            assert_eq!(elems("params"), params, "{ctx}");
            assert_eq!(mem["offloaded"], offload, "{ctx}");
            // Offload: fp32 master weights and a gradient copy of the partition in host memory.
            let host = if offload { 2 * part } else { 0 };
            assert_eq!(elems("host_copies"), host, "{ctx}");
            // Stages 2–3 add one segment's working buffers; stages 0–1 none.
            assert_eq!(mem["working"].as_u64().unwrap() > 0, stage >= 2, "{ctx}");
        }
    }
}

#[test]
fn data_parallel_zero0_matches_the_single_process_run() {
    data_parallel_case(0);
}

#[test]
fn data_parallel_zero1_matches_the_single_process_run() {
    data_parallel_case(1);
}

#[test]
fn data_parallel_zero2_matches_the_single_process_run() {
    data_parallel_case(2);
}

#[test]
fn data_parallel_zero3_matches_the_single_process_run() {
    data_parallel_case(3);
}

/// Bit-level equalities between the stages on 2 ranks: ZeRO-1 trains the same bits as ZeRO-0
/// (the optimizer is elementwise), ZeRO-3 the same as ZeRO-2 (gathering is a copy; both reduce
/// each segment as it finishes), offload the same as none; the optimizer state gathered from a
/// checkpoint's per-rank files equals the one ZeRO-0 keeps whole, bit for bit; and a run stopped
/// on 2 ranks resumes on 3 (re-partitioned, and it says so) and ends where the uninterrupted run
/// ends, for every stage.
#[test]
fn zero_checkpoints_gather_exactly_and_resume_on_another_world_size() {
    use recipe_runtime::model::Classifier;
    use recipe_runtime::resume::read_optimizer;
    use recipe_runtime::zero::Shard;

    let dir = workspace("zerockpt", &dp_recipe());
    let model_bytes =
        |out: &str| std::fs::read(dir.join(out).join("model/model.safetensors")).unwrap();
    for stage in 0..=3u32 {
        dp_run(&dir, 2, &format!("s{stage}"), &zero_sets(stage, false));
    }
    dp_run(&dir, 2, "s2-off", &zero_sets(2, true));
    assert!(
        model_bytes("s0") == model_bytes("s1"),
        "ZeRO-1 and ZeRO-0 trained different weights"
    );
    assert!(
        model_bytes("s2") == model_bytes("s3"),
        "ZeRO-3 and ZeRO-2 trained different weights"
    );
    assert!(
        model_bytes("s2") == model_bytes("s2-off"),
        "offload changed the weights"
    );

    // The epoch-1 checkpoint: ZeRO-0 writes the whole state, the others one file per rank.
    let ckpt = |out: &str| dir.join(out).join("checkpoint-2");
    assert!(ckpt("s0").join("optimizer.safetensors").is_file());
    for stage in 1..=3 {
        let shards = ckpt(&format!("s{stage}")).join("optimizer");
        assert!(
            shards.join("rank-0-of-2.safetensors").is_file(),
            "stage {stage}"
        );
        assert!(
            shards.join("rank-1-of-2.safetensors").is_file(),
            "stage {stage}"
        );
        assert!(!ckpt(&format!("s{stage}"))
            .join("optimizer.safetensors")
            .exists());
    }
    let segs = Classifier::from_pretrained(&ckpt("s0"), 2, 0)
        .unwrap()
        .segments()
        .to_vec();
    let whole = Shard::new(0, 1, 0, &segs);
    let (s0, moved0) = read_optimizer(&ckpt("s0"), &whole).unwrap();
    assert!(!moved0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for stage in [1, 3] {
        let (gathered, moved) = read_optimizer(&ckpt(&format!("s{stage}")), &whole).unwrap();
        assert!(moved, "stage {stage}: assembled from the rank files");
        if stage == 1 {
            assert_eq!(gathered.step, s0.step);
            for b in ["exp_avg", "exp_avg_sq"] {
                assert!(bits(gathered.buffer(b)) == bits(s0.buffer(b)), "{b}");
            }
        }
        // Each rank's own file, read back for the same layout, is its partition of the whole.
        for rank in 0..2 {
            let shard = Shard::new(stage as u8, 2, rank, &segs);
            let (own, moved) = read_optimizer(&ckpt(&format!("s{stage}")), &shard).unwrap();
            assert!(!moved);
            assert!(
                bits(own.buffer("exp_avg")) == bits(&shard.take(gathered.buffer("exp_avg"))),
                "stage {stage} rank {rank}"
            );
        }
    }

    // Stop on 2 ranks after step 3 (inside epoch 2), resume on 3 ranks with the same global batch.
    for stage in 0..=3u32 {
        let out = format!("r{stage}");
        let mut stop = zero_sets(stage, false);
        stop.extend(["--stop-after".into(), "3".into()]);
        dp_run(&dir, 2, &out, &stop);
        let mut resume = zero_sets(stage, false);
        resume.extend(["--resume".into(), format!("{out}/checkpoint-3")]);
        dp_run(&dir, 3, &out, &resume);
        let resumed = metrics(&dir.join(&out))
            .into_iter()
            .find(|r| r["event"] == "resume")
            .unwrap();
        assert_eq!(
            resumed["repartitioned"],
            stage >= 1,
            "stage {stage}: {resumed}"
        );
        // The same curve: steps 1–3 from the first run, step 4 from the resumed one.
        let curve = |d: &str| -> Vec<(u64, f64)> {
            metrics(&dir.join(d))
                .iter()
                .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
                .collect()
        };
        let (ca, cb) = (curve(&format!("s{stage}")), curve(&out));
        assert_eq!(
            ca.iter().map(|x| x.0).collect::<Vec<_>>(),
            cb.iter().map(|x| x.0).collect::<Vec<_>>(),
            "stage {stage}"
        );
        for ((k, x), (_, y)) in ca.iter().zip(&cb) {
            assert!(
                (x - y).abs() <= 1e-6 * x.abs(),
                "stage {stage} step {k}: {y} vs {x}"
            );
        }
        let a = weights(&dir.join(format!("s{stage}/model/model.safetensors")));
        let b = weights(&dir.join(&out).join("model/model.safetensors"));
        let (mut diff, mut scale) = (0.0f64, 0.0f64);
        for ((_, x), (_, y)) in a.iter().zip(&b) {
            for (p, q) in x.iter().zip(y) {
                diff += f64::from(p - q).powi(2);
                scale += f64::from(*p).powi(2);
            }
        }
        let rel = (diff / scale).sqrt();
        assert!(
            rel <= 1e-6,
            "stage {stage}, resumed on 3 ranks: weights differ by {rel:e}"
        );
    }
    // Stopped and resumed on the same 2 ranks: each rank reads its own file, and the run ends
    // bit-identical to the uninterrupted one.
    for stage in [2u32, 3] {
        let out = format!("same{stage}");
        let mut stop = zero_sets(stage, false);
        stop.extend(["--stop-after".into(), "3".into()]);
        dp_run(&dir, 2, &out, &stop);
        let mut resume = zero_sets(stage, false);
        resume.extend(["--resume".into(), format!("{out}/checkpoint-3")]);
        dp_run(&dir, 2, &out, &resume);
        let resumed = metrics(&dir.join(&out))
            .into_iter()
            .find(|r| r["event"] == "resume")
            .unwrap();
        assert_eq!(resumed["repartitioned"], false, "stage {stage}");
        assert!(
            model_bytes(&out) == model_bytes(&format!("s{stage}")),
            "stage {stage}"
        );
    }
}

/// A rank that fails mid-run (rank 0 cannot write its checkpoint: a file stands where the
/// directory goes) ends the run on every rank with that error, promptly, and leaves no partial
/// checkpoint behind.
#[test]
fn a_failing_rank_ends_the_run_with_its_error_on_every_rank() {
    let dir = workspace("failrank", &dp_recipe());
    std::fs::create_dir_all(dir.join("f")).unwrap();
    std::fs::write(dir.join("f/checkpoint-2"), "not a directory").unwrap();
    for stage in [1u32, 3] {
        let started = std::time::Instant::now();
        let mut args: Vec<String> = [
            "run",
            "--quiet",
            "tiny.rcp",
            "--gpus",
            "2",
            "--set",
            "batch.micro=6",
            "--set",
            "train.output_dir=\"f\"",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(zero_sets(stage, false));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = Command::new(env!("CARGO_BIN_EXE_recipe"))
            .args(&refs)
            .current_dir(&dir)
            .env("NO_COLOR", "1")
            .env("RECIPE_COLLECTIVE_TIMEOUT", "60")
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "stage {stage}: {e}");
        assert!(e.contains("checkpoint-2"), "stage {stage}: {e}");
        // The cause, not another rank's echo of it.
        assert!(
            !e.contains("aborted the collective group"),
            "stage {stage}: {e}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(50),
            "stage {stage}: waited for a timeout"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.join("f"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "stage {stage}: {leftovers:?}");
    }
}

/// `reduce_lr_on_plateau`: the LR stays at its peak until evaluation losses stop improving, then
/// drops by `factor` — replayed here from the logged evaluation losses with torch's rule (mode
/// min, relative threshold 1e-4, `num_bad > patience`), on one rank and on two.
#[test]
fn reduce_lr_on_plateau_follows_the_evaluation_loss() {
    let recipe = TINY
        .replace(
            "schedule linear { warmup = 2 }",
            "schedule reduce_lr_on_plateau { factor = 0.5, patience = 0 }",
        )
        .replace("logging_steps = 1,", "logging_steps = 1, eval_every = 1,")
        // HF builds the optimizer, so HF steps the plateau schedule at evaluations (R0315).
        .replace(
            "optimizer adamw { lr = 1e-3",
            "optimizer adamw { owner = hf, lr = 3e-2",
        );
    let dir = workspace("plateau", &recipe);
    for (gpus, micro, out) in [("1", "5", "p1"), ("2", "5", "p2")] {
        let out_set = format!("train.output_dir=\"{out}\"");
        let micro_set = format!("batch.micro={micro}");
        let o = recipe_in(
            &dir,
            &[
                "run", "--quiet", "tiny.rcp", "--gpus", gpus, "--set", &out_set, "--set",
                &micro_set,
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let m = metrics(&dir.join(out));
        let lrs: Vec<f64> = m.iter().filter_map(|r| r["lr"].as_f64()).collect();
        let evals: Vec<f64> = m
            .iter()
            .filter_map(|r| r["eval"]["loss"].as_f64())
            .collect();
        assert_eq!(evals.len(), lrs.len(), "one evaluation per step");
        // Replay: step k+1 runs at the LR after the evaluation of step k.
        let (mut lr, mut best, mut bad) = (3e-2f64, f64::INFINITY, 0u32);
        let mut reduced = false;
        for (k, (&got, &loss)) in lrs.iter().zip(&evals).enumerate() {
            assert_eq!(got, lr, "gpus {gpus} step {}", k + 1);
            if loss < best * (1.0 - 1e-4) {
                best = loss;
                bad = 0;
            } else {
                bad += 1;
            }
            if bad > 0 {
                lr *= 0.5;
                bad = 0;
                reduced = true;
            }
        }
        assert!(
            reduced,
            "gpus {gpus}: the LR never dropped; the test shows nothing: {evals:?}"
        );
    }
}

/// `greedy` (HF's GreedyLR) in the native loop: stepped after each evaluation with its loss, it
/// raises the LR while the loss improves (patience 0: at every improving evaluation) — the LR of
/// each step is the state machine's after the evaluations before it. A run stopped before its
/// first evaluation (the scheduler's best still +inf, which JSON has no number for) resumes to
/// the uninterrupted run's weights, bit for bit. The state machine itself is checked against
/// HF's class by the agreement fixture (tests/agreement.rs).
#[test]
fn greedy_follows_the_evaluation_loss_and_resumes_before_its_first_evaluation() {
    use recipe::upstream::schedules::{Greedy, GreedyConfig};
    let recipe = TINY
        .replace(
            "schedule linear { warmup = 2 }",
            "schedule greedy { factor = 0.5, patience = 0, min_lr = 1e-4, max_lr = 1e-2 }",
        )
        .replace("logging_steps = 1,", "logging_steps = 1, eval_every = 2,")
        .replace(
            "optimizer adamw { lr = 1e-3",
            "optimizer adamw { owner = hf, lr = 2e-3",
        );
    let dir = workspace("greedy", &recipe);
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--quiet", "tiny.rcp"];
        all.extend_from_slice(args);
        let o = recipe_in(&dir, &all);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    };
    run(&["--set", "train.output_dir=\"a\""]);
    run(&["--set", "train.output_dir=\"b\"", "--stop-after", "1"]);
    let state = std::fs::read_to_string(dir.join("b/checkpoint-1/trainer_state.json")).unwrap();
    assert!(state.contains("\"inf\""), "{state}");
    run(&[
        "--set",
        "train.output_dir=\"b\"",
        "--resume",
        "b/checkpoint-1",
    ]);
    let a = std::fs::read(dir.join("a/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("b/model/model.safetensors")).unwrap();
    assert!(a == b, "resumed weights differ from the uninterrupted run");
    let m = metrics(&dir.join("a"));
    let lrs: Vec<(u64, f64)> = m
        .iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["lr"].as_f64()?)))
        .collect();
    let mut g = Greedy::new(
        2e-3,
        GreedyConfig {
            factor: 0.5,
            patience: 0,
            min_lr: 1e-4,
            max_lr: 1e-2,
            ..GreedyConfig::default()
        },
    );
    let mut want = 2e-3;
    for (step, lr) in &lrs {
        assert_eq!(*lr, want, "step {step}: {lrs:?}");
        if let Some(loss) = m
            .iter()
            .find(|r| r["step"] == *step && r["eval"].is_object())
            .map(|r| r["eval"]["loss"].as_f64().unwrap())
        {
            want = g.step(loss);
        }
    }
    assert!(
        lrs.iter().any(|(_, lr)| *lr != 2e-3),
        "the LR never moved; the test shows nothing: {lrs:?}"
    );
}
