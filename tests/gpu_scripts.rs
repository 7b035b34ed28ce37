//! The GPU scripts' own arithmetic, on recorded inputs: `scripts/gpu/profile_summary.py` turns
//! Nsight Compute's CSV (its `==PROF==` lines, thousands separators, cuBLAS kernels by grid),
//! the speed-of-light section, torch.profiler's rows and a run's metrics into per-step figures
//! (tests/fixtures/gpu-profile/); `scripts/gpu/throughput_summary.py` turns timed runs into
//! samples/s and MFU against the named GPU's peak; `scripts/gpu/resume_summary.py` judges a
//! checkpoint resumed on the other device; and `scripts/gpu-throughput.sh` runs dry on the CPU.
//! Needs `python3` (or `$PYTHON`), which CI installs.

use std::path::Path;
use std::process::Command;

use recipe_runtime::flops;
use recipe_runtime::plan::Precision;

fn summary() -> serde_json::Value {
    summary_with(&[])
}

fn summary_with(args: &[&str]) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run_summary(&root.join("tests/fixtures/gpu-profile"), args);
    serde_json::from_str(&out).expect("the summary is JSON")
}

/// profile_summary.py's output for the files in `dir`, run from the repository's root.
fn run_summary(dir: &Path, args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .arg(root.join("scripts/gpu/profile_summary.py"))
        .arg(dir)
        .args(args)
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("this test needs {py} (set PYTHON): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn a_profile_counts_whole_steps_between_two_optimizer_steps() {
    let s = summary();
    let r = &s["recipe"];
    // The kernels after the first adamw_step up to the second one: one whole step, 4 kernels.
    assert_eq!(r["steps"], 1);
    assert_eq!(r["kernels_per_step"], 4.0);
    assert_eq!(r["gpu_us_per_step"], 1035.0);
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows[0]["kernel"], "adamw_step");
    // cuBLAS's kernels are told apart by their grid; their two calls are summed.
    let gemm = &rows[1];
    assert!(gemm["kernel"]
        .as_str()
        .unwrap()
        .ends_with("grid(2, 64, 1) block(384, 1, 1)"));
    assert_eq!(gemm["calls_per_step"], 2.0);
    assert_eq!(gemm["mean_us"], 15.0);
}

#[test]
fn a_profile_reads_the_speed_of_light_the_peer_and_the_larger_batch() {
    let s = summary();
    let sol = &s["recipe_speed_of_light"]["layernorm_fwd"];
    assert_eq!(sol["Memory Throughput [%]"], 42.0);
    assert_eq!(sol["Duration [ns]"], 22000.0);
    assert_eq!(s["torch"]["gpu_us_per_step"], 927.5);
    assert_eq!(s["torch"]["bench"]["samples_per_s"], 1264.4);
    // 64 samples every 25 ms after a slow first step: the median per-step rate ignores it.
    let rate = s["recipe_micro64_samples_per_s"].as_f64().unwrap();
    assert!((rate - 2560.0).abs() < 1e-6, "{rate}");
}

#[test]
fn a_profile_compares_each_kernel_with_an_earlier_one() {
    let s = summary_with(&["--against", "tests/fixtures/gpu-profile/then.json"]);
    let c = &s["compared"];
    assert_eq!(c["then_us_per_step"], 970.0);
    assert_eq!(c["now_us_per_step"], 1035.0);
    // The largest change first: adamw_step 900 -> 1000, then bias_grad 50 -> 5, a kernel gone
    // (round_rows, 20 -> 0) and one new (the GEMM, 0 -> 30).
    let rows: Vec<(&str, f64)> = c["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kernel"].as_str().unwrap(),
                r["change_us"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows[0], ("adamw_step", 100.0));
    assert_eq!(rows[1], ("bias_grad", -45.0));
    assert!(rows.contains(&("round_rows", -20.0)), "{rows:?}");
    assert_eq!(rows.len(), 4, "{rows:?}");
}

#[test]
fn a_missing_file_is_named_without_the_machines_paths() {
    // The summaries are committed (docs/gpu/): an error names DIR, not the folder it ran in.
    let dir = std::env::temp_dir().join(format!("recipe-gpu-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = run_summary(&dir, &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(text.contains("DIR/ncu-recipe.csv"), "{text}");
    assert!(!text.contains(dir.to_str().unwrap()), "{text}");
}

/// scripts/gpu/throughput_summary.py's output for one timed run of ours (`out`) at a steady
/// `rate` samples/s on the GPU `gpu` and PyTorch's `torch` samples/s, with `peak` as
/// PEAK_TFLOPS (empty: none).
fn throughput(gpu: &str, rate: f64, torch: f64, peak: &str) -> serde_json::Value {
    throughput_of(gpu, &[("out", rate, 1.0)], torch, peak)
}

/// The same for the runs `(folder, steady samples/s, every step's loss)`.
fn throughput_of(
    gpu: &str,
    runs: &[(&str, f64, f64)],
    torch: f64,
    peak: &str,
) -> serde_json::Value {
    throughput_evaluated(gpu, runs, &[], torch, peak)
}

/// The same, the runs `evals` names ending with an evaluation of that many rows a second.
fn throughput_evaluated(
    gpu: &str,
    runs: &[(&str, f64, f64)],
    evals: &[(&str, f64)],
    torch: f64,
    peak: &str,
) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // One folder a call: the tests run side by side.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "recipe-gpu-throughput-{}-{call}",
        std::process::id()
    ));
    for &(name, rate, loss) in runs {
        let run = dir.join(name);
        std::fs::create_dir_all(&run).expect("temporary folder");
        let mut start = serde_json::json!({
            "event": "start", "device": gpu, "parameters": 100_000_000, "precision": "bf16"
        });
        // The peak `recipe run` would measure its MFU against on that GPU (train.rs).
        let peak = flops::device_peak(gpu, Precision::Bf16);
        if let Some(p) = &peak {
            start["peak_tflops"] = p.tflops.into();
            start["peak_from"] = p.from.clone().into();
        }
        let mut lines = vec![start];
        // A row's samples_per_s is the average since the start: a steady rate keeps it. With
        // a peak, each step also says the run's MFU so far (here a made-up 0.25).
        lines.extend((1..=20).map(|s| {
            let mut r = serde_json::json!({"step": s, "loss": loss, "samples_per_s": rate});
            if peak.is_some() {
                r["mfu"] = 0.25.into();
            }
            r
        }));
        for &(_, rows_per_s) in evals.iter().filter(|e| e.0 == name) {
            lines.push(serde_json::json!({"step": 20, "eval": {
                "rows": 640, "loss": loss, "accuracy": 0.5, "f1": 0.0,
                "seconds": 640.0 / rows_per_s, "samples_per_s": rows_per_s
            }}));
        }
        // A run on a GPU ends, after its evaluation, with what it took of the GPU's memory.
        if peak.is_some() {
            let taken = 10u64 << 30;
            lines.push(serde_json::json!({"event": "end", "device_memory": {
                "taken": taken, "free": (141u64 << 30) - taken, "total": 141u64 << 30
            }}));
        }
        let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        std::fs::write(run.join("metrics.jsonl"), text.join("\n")).expect("metrics");
    }
    std::fs::write(
        dir.join("torch.json"),
        serde_json::json!({ "samples_per_s": torch }).to_string(),
    )
    .expect("torch.json");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .arg(root.join("scripts/gpu/throughput_summary.py"))
        .arg(&dir)
        .args(["cuda", "12", "768", "128", "10", peak])
        .output()
        .unwrap_or_else(|e| panic!("this test needs {py} (set PYTHON): {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the summary is JSON")
}

/// llm.c's FLOPs a sample for BERT-base's shape and the runs' 10⁸ parameters.
const FLOPS_PER_SAMPLE: f64 = (6.0 * 1e8 + 6.0 * 12.0 * 768.0 * 128.0) * 128.0;

/// The summary takes the peak the run reported (runtime/src/flops.rs's table, tested there).
#[test]
fn mfu_is_against_the_named_gpus_own_peak() {
    for (gpu, peak) in [
        ("NVIDIA H200 (sm_90)", 989.0),
        ("NVIDIA H100 80GB HBM3 (sm_90)", 989.0),
        ("NVIDIA H100 PCIe (sm_90)", 756.0),
        ("NVIDIA H100 NVL (sm_90)", 835.0),
        ("NVIDIA A100-SXM4-80GB (sm_80)", 312.0),
    ] {
        let s = throughput(gpu, 3000.0, 1000.0, "");
        assert_eq!(s["peak_tflops_bf16"], peak, "{gpu}");
        assert_eq!(s["peak_from"], gpu);
        // The run's own figure, beside the steady one, and the GPU memory it took.
        assert_eq!(s["recipe"]["mfu_reported"], 0.25, "{gpu}");
        assert_eq!(s["recipe"]["device_memory"]["taken"], 10u64 << 30, "{gpu}");
        let mfu = s["mfu_recipe"].as_f64().expect("an MFU");
        let want = 3000.0 * FLOPS_PER_SAMPLE / (peak * 1e12);
        assert!(
            (mfu - want).abs() < 1e-9 * want,
            "{gpu}: {mfu} against {want}"
        );
        assert!((s["ratio_recipe_over_torch"].as_f64().unwrap() - 3.0).abs() < 1e-9);
        // Beside it, the FLOPs ours executes: the last layer's output projection and
        // feed-forward (4 × 768 wide) on the [CLS] rows only, 127 of 128 rows fewer.
        let pruned = 6.0 * (768.0 * 768.0 + 2.0 * 768.0 * 3072.0) * 127.0;
        let executed = s["executed_utilization_recipe"]
            .as_f64()
            .expect("a utilization");
        let want = 3000.0 * (FLOPS_PER_SAMPLE - pruned) / (peak * 1e12);
        assert!((executed - want).abs() < 1e-9 * want, "{gpu}: {executed}");
        assert_eq!(s["flops_per_sample"].as_f64(), Some(FLOPS_PER_SAMPLE));
    }
}

/// MiniLM's runs (heads of 32) and BERT-base's at twice the length (the long fused kernels)
/// are summarised apart from BERT-base's A/Bs: each rate, the fused run's speed-up over the
/// unfused one, and their largest loss difference.
#[test]
fn the_fused_and_unfused_pairs_are_compared_with_each_other() {
    let runs = [
        ("out", 3000.0, 1.0),
        ("minilm", 6000.0, 1.0),
        ("minilm-unfused", 4000.0, 1.1),
        ("long", 1500.0, 2.0),
        ("long-unfused", 1200.0, 2.5),
    ];
    let s = throughput_of("NVIDIA H200 (sm_90)", &runs, 1000.0, "");
    let rate = |k: &str| s[k]["samples_per_s"].as_f64().expect(k);
    for (key, fused, unfused, ratio, diff) in [
        ("minilm", 6000.0, 4000.0, 1.5, 0.1),
        ("long", 1500.0, 1200.0, 1.25, 0.25),
    ] {
        assert!((rate(&format!("recipe_{key}")) - fused).abs() < 1e-6, "{s}");
        assert!(
            (rate(&format!("recipe_{key}_unfused")) - unfused).abs() < 1e-6,
            "{s}"
        );
        let r = s[format!("ratio_{key}_fused_over_unfused")]
            .as_f64()
            .expect("a ratio");
        assert!((r - ratio).abs() < 1e-9, "{key}: {r}");
        let d = s[format!("recipe_{key}_unfused")]["max_loss_rel_diff"]
            .as_f64()
            .expect("a loss difference");
        assert!((d - diff).abs() < 1e-9, "{key}: {d}");
    }
    // BERT-base's figures are the default run's, as without them.
    assert!((s["ratio_recipe_over_torch"].as_f64().unwrap() - 3.0).abs() < 1e-9);
    // Without those runs (an older session's folder) the summary still stands.
    let s = throughput("NVIDIA H200 (sm_90)", 3000.0, 1000.0, "");
    for key in ["minilm", "long"] {
        assert!(s[format!("recipe_{key}")]["error"].is_string(), "{s}");
        assert!(
            s.get(format!("ratio_{key}_fused_over_unfused")).is_none(),
            "{s}"
        );
    }
}

/// The runs that evaluate after their last step (the default, the unfused, MiniLM's two) give
/// their evaluation's rows a second, and the fused runs' ratios to the unfused; the training
/// rates are the steps', as without an evaluation.
#[test]
fn the_evaluations_are_compared_fused_over_unfused() {
    let runs = [
        ("out", 3000.0, 1.0),
        ("unfused", 2500.0, 1.0),
        ("minilm", 6000.0, 1.0),
        ("minilm-unfused", 4000.0, 1.0),
    ];
    let evals = [
        ("out", 9000.0),
        ("unfused", 6000.0),
        ("minilm", 20000.0),
        ("minilm-unfused", 16000.0),
    ];
    let s = throughput_evaluated("NVIDIA H200 (sm_90)", &runs, &evals, 1000.0, "");
    let eval = |k: &str| s[k]["eval_samples_per_s"].as_f64().expect(k);
    assert_eq!(eval("recipe"), 9000.0, "{s}");
    assert_eq!(eval("recipe_unfused_attention"), 6000.0, "{s}");
    assert_eq!(
        s["ratio_eval_fused_over_unfused"].as_f64(),
        Some(1.5),
        "{s}"
    );
    assert_eq!(
        s["ratio_minilm_eval_fused_over_unfused"].as_f64(),
        Some(1.25),
        "{s}"
    );
    assert!((s["recipe"]["samples_per_s"].as_f64().unwrap() - 3000.0).abs() < 1e-6);
    // Runs without an evaluation (an older session's folder) have no ratio.
    let s = throughput_of("NVIDIA H200 (sm_90)", &runs, 1000.0, "");
    assert!(s["recipe"].get("eval_samples_per_s").is_none(), "{s}");
    assert!(s.get("ratio_eval_fused_over_unfused").is_none(), "{s}");
}

#[test]
fn an_unknown_gpu_gets_no_mfu_unless_its_peak_is_given() {
    let s = throughput("NVIDIA L4 (sm_89)", 300.0, 100.0, "");
    assert!(s["peak_tflops_bf16"].is_null());
    assert!(s["recipe"].get("mfu_reported").is_none(), "{s}");
    assert!(s.get("mfu_recipe").is_none(), "{s}");
    let note = s["mfu_note"].as_str().expect("a note");
    assert!(
        note.contains("NVIDIA L4") && note.contains("PEAK_TFLOPS"),
        "{note}"
    );
    let s = throughput("NVIDIA L4 (sm_89)", 300.0, 100.0, "121");
    assert_eq!(s["peak_tflops_bf16"], 121.0);
    assert_eq!(s["peak_from"], "PEAK_TFLOPS");
    let want = 300.0 * FLOPS_PER_SAMPLE / 121e12;
    assert!((s["mfu_recipe"].as_f64().unwrap() - want).abs() < 1e-9 * want);
}

/// A resumed run as `resume_summary.py` reads it: its first record, then its steps' LR and loss.
struct Resumed<'a> {
    first: serde_json::Value,
    steps: &'a [(u64, f64, f64)],
}

/// scripts/gpu/resume_summary.py over the CPU's uninterrupted run (`alone`: step, LR, loss)
/// and the two resumed runs (GPU → CPU, CPU → GPU).
fn resume_summary(alone: &[(u64, f64, f64)], moved: [Resumed<'_>; 2]) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("recipe-gpu-resume-{}-{call}", std::process::id()));
    let write = |name: &str, first: serde_json::Value, steps: &[(u64, f64, f64)]| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("temporary folder");
        let mut lines = vec![first.to_string()];
        lines.extend(steps.iter().map(|&(step, lr, loss)| {
            serde_json::json!({"step": step, "lr": lr, "loss": loss}).to_string()
        }));
        lines.push(serde_json::json!({"event": "end"}).to_string());
        std::fs::write(d.join("metrics.jsonl"), lines.join("\n")).expect("metrics");
    };
    write(
        "tiny-cpu",
        serde_json::json!({"event": "start", "device": "cpu"}),
        alone,
    );
    let [to_cpu, to_gpu] = moved;
    write("resume-cuda-cpu", to_cpu.first, to_cpu.steps);
    write("resume-cpu-cuda", to_gpu.first, to_gpu.steps);
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .arg(root.join("scripts/gpu/resume_summary.py"))
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("this test needs {py} (set PYTHON): {e}"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("resume.json is JSON")
}

#[test]
fn a_resumed_run_passes_only_where_it_goes_on_as_the_cpu_alone() {
    const GPU: &str = "NVIDIA H200 (sm_90)";
    let lr = |s: u64| 1e-3 * (20 - s) as f64 / 18.0;
    let alone: Vec<(u64, f64, f64)> = (1..=20)
        .map(|s| (s, lr(s), 0.7 - 0.01 * s as f64))
        .collect();
    let after: Vec<(u64, f64, f64)> = alone[8..].to_vec();
    let first = |device: &str| serde_json::json!({"event": "resume", "device": device, "step": 8});
    let judge = |to_cpu: (&str, &[(u64, f64, f64)]), to_gpu: (&str, &[(u64, f64, f64)])| {
        resume_summary(
            &alone,
            [
                Resumed {
                    first: first(to_cpu.0),
                    steps: to_cpu.1,
                },
                Resumed {
                    first: first(to_gpu.0),
                    steps: to_gpu.1,
                },
            ],
        )
    };
    // Both go on from step 9 on the device named, with the CPU's LRs, within 1e-4.
    let mut near = after.clone();
    near[3].2 *= 1.0 + 5e-5;
    let s = judge(("cpu", &after), (GPU, &near));
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["cpu-cuda"]["device"], GPU);
    assert_eq!(s["cuda-cpu"]["steps"].as_array().unwrap().len(), 12);
    let d = s["cpu-cuda"]["max_loss_rel_diff"].as_f64().unwrap();
    assert!((d - 5e-5).abs() < 1e-9, "{d}");
    // A loss 1e-3 off, a run that started over, a step left out, another LR, or a run that went
    // on on the other device: each fails.
    let mut far = after.clone();
    far[5].2 *= 1.001;
    let mut other_lr = after.clone();
    other_lr[0].1 *= 2.0;
    for (what, to_cpu, to_gpu) in [
        ("loss", ("cpu", &after[..]), (GPU, &far[..])),
        ("started over", ("cpu", &alone[..]), (GPU, &after[..])),
        ("step missing", ("cpu", &after[1..]), (GPU, &after[..])),
        ("lr", ("cpu", &other_lr[..]), (GPU, &after[..])),
        ("device", ("cpu", &after[..]), ("cpu", &after[..])),
        ("device", (GPU, &after[..]), (GPU, &after[..])),
    ] {
        let s = judge(to_cpu, to_gpu);
        assert_eq!(s["ok"], false, "{what}: {s}");
    }
    // A resumed run without its metrics: not ok, and says why.
    let root = std::env::temp_dir().join(format!("recipe-gpu-resume-none-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu/resume_summary.py"))
        .arg(&root)
        .output()
        .expect("python");
    std::fs::remove_dir_all(&root).unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(s["ok"], false);
    // Named under W, not the machine's folder (the results are committed: docs/gpu/).
    let e = s["error"].as_str().unwrap();
    assert!(
        e.contains("FileNotFoundError: W/tiny-cpu/metrics.jsonl")
            && !e.contains(root.to_str().unwrap()),
        "{s}"
    );
}

/// scripts/gpu-throughput.sh's dry run on the CPU (`DEVICE=cpu SHAPE=tiny`, as its header
/// says), with this build's binary: every run of ours trains, and the four that evaluate give
/// their evaluation's rate and the two ratios, so the script's plumbing is checked before a GPU
/// session spends device time on it. The rates say nothing (the CPU has no fused attention);
/// PyTorch's peer runs only where torch is installed, so its part is not asserted.
#[test]
fn the_throughput_script_runs_dry_on_the_cpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out =
        std::env::temp_dir().join(format!("recipe-gpu-throughput-dry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let o = Command::new("bash")
        .arg(root.join("scripts/gpu-throughput.sh"))
        .current_dir(root)
        .env("DEVICE", "cpu")
        .env("SHAPE", "tiny")
        .env("OUT", &out)
        .env("RECIPE_BIN", env!("CARGO_BIN_EXE_recipe"))
        .env(
            "PYTHON",
            std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()),
        )
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    let text = std::fs::read_to_string(out.join("throughput.json")).unwrap();
    let s: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "recipe",
        "recipe_unfused_attention",
        "recipe_minilm",
        "recipe_minilm_unfused",
    ] {
        assert!(
            s[key]["samples_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{key}: {text}"
        );
        assert!(
            s[key]["eval_samples_per_s"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{key}: {text}"
        );
    }
    for key in [
        "recipe_cublas",
        "recipe_pdl",
        "recipe_direct",
        "recipe_long",
        "recipe_long_unfused",
    ] {
        assert!(s[key]["samples_per_s"].as_f64().is_some(), "{key}: {text}");
        assert!(s[key].get("eval_samples_per_s").is_none(), "{key}: {text}");
    }
    for key in [
        "ratio_eval_fused_over_unfused",
        "ratio_minilm_eval_fused_over_unfused",
    ] {
        assert!(s[key].as_f64().is_some(), "{key}: {text}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
