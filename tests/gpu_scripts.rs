//! The GPU scripts' own arithmetic, on recorded inputs: `scripts/gpu/profile_summary.py` turns
//! Nsight Compute's CSV (its `==PROF==` lines, thousands separators, cuBLAS kernels by grid),
//! the speed-of-light section, torch.profiler's rows and a run's metrics into per-step figures
//! (tests/fixtures/gpu-profile/). Needs `python3` (or `$PYTHON`), which CI installs.

use std::path::Path;
use std::process::Command;

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
