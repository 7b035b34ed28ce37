//! `recipe explain --plot`: the LR of every optimizer step as HF and as DeepSpeed run it, as SVG.
//! (The run's own pictures are tested in runtime/src/plot.rs and by tests/outputs.rs' real run.)

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn explain_draws_both_curves_epoch_ends_and_disagreements() {
    let dir = std::env::temp_dir().join(format!("recipe-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("lr.svg");
    // The seed recipe: DeepSpeed's WarmupDecayLR runs a step behind HF's linear.
    let out = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(["explain", "recipes/legacy_seed.rcp", "--plot"])
        .arg(&svg)
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    for label in [
        "HF linear",
        "DeepSpeed WarmupDecayLR",
        "epoch end",
        "the curves differ",
    ] {
        assert!(text.contains(label), "no `{label}` in the picture");
    }
    // No half-written file is left beside it.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["lr.svg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn explain_plot_without_a_sample_count_says_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args([
            "explain",
            "tests/diagnostics/R0204-samples-unknown.rcp",
            "--plot",
            "/nonexistent/lr.svg",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("number of training samples is unknown"));
}

#[test]
fn steps_draws_the_timelines_and_marks_the_drift() {
    let dir = std::env::temp_dir().join(format!("recipe-steps-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("steps.svg");
    // The seed's step drift: transformers 4.26.0 steps at an epoch's end where DeepSpeed does not.
    let out = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args([
            "steps",
            "recipes/cls.rcp",
            "--versions",
            "transformers=4.26.0",
            "--plot",
        ])
        .arg(&svg)
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "the timelines diverge");
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in [
        "HF global_step (transformers 4.26.0",
        "DeepSpeed global_steps (transformers 4.26.0",
        "HF global_step (transformers 5.25.0",
        "epoch end",
        "the curves differ",
    ] {
        assert!(text.contains(label), "no `{label}` in the picture");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
