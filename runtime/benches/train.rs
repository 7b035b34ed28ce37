//! Training throughput of the CPU backend next to PyTorch, measured in the same run with the
//! same shape and thread count: `cargo bench -p recipe-runtime --bench train`.
//!
//! Shape: MiniLM-L6 (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), batch 16,
//! sequence 128 (`BENCH_SEQ`), dropout 0, AdamW + clipping each step. Threads: `RECIPE_THREADS`,
//! else every core. The peer is `runtime/reference/bench_torch.py` run by `RECIPE_PYTHON`, else
//! the conformance venv's python, else `python3`; without torch the bench says so and prints
//! only its own figure. Figures are best-of-N step times (the machine may be shared).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use recipe_runtime::backend::Cpu;
use recipe_runtime::model::{Batch, BertConfig, Classifier, Workspace};
use recipe_runtime::optim::{clip_grad_norm, Adam, AdamConfig};
use recipe_runtime::rng::Rng;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RECIPE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conformance/.venv/bin/python");
    if venv.is_file() {
        return Some(venv);
    }
    Some(PathBuf::from("python3"))
}

fn main() {
    let (batch, seq) = (env("BENCH_BATCH", 16), env("BENCH_SEQ", 128));
    let steps = env("BENCH_STEPS", 4);
    let threads = recipe_runtime::train::threads();
    let config = BertConfig::from_json(
        r#"{"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
            "num_attention_heads": 12, "intermediate_size": 1536, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "pad_token_id": 0}"#,
    )
    .expect("the bench config is valid");
    let mut model = Classifier::random(config, 2, 0).expect("the bench model builds");
    model.set_backend(Cpu::new(threads));
    let mut rng = Rng::new(0, 0);
    let b = Batch {
        input_ids: (0..batch * seq).map(|_| rng.below(30522) as u32).collect(),
        token_type_ids: vec![0; batch * seq],
        attention_mask: vec![1; batch * seq],
        labels: (0..batch).map(|_| rng.below(2) as u32).collect(),
        batch,
        seq,
    };
    let entries = model.params().entries.clone();
    let decay = vec![true; entries.len()];
    let mut adam = Adam::new(AdamConfig::adamw(0.01), &entries, &decay).expect("optimizer");
    let mut grads = model.params().zeros_like();
    let mut ws = Workspace::new();
    let mut best = f64::INFINITY;
    for i in 0..=steps {
        let t = Instant::now();
        grads.iter_mut().for_each(|g| *g = 0.0);
        model
            .forward_backward(&mut ws, &b, 1.0, &mut grads, None)
            .expect("forward/backward");
        clip_grad_norm(&mut grads, 1.0);
        adam.step(model.params_mut(), &grads, 1e-4).expect("step");
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64()); // step 0 warms up
        }
    }
    let ours = batch as f64 / best;
    println!(
        "MiniLM-L6 shape, batch {batch}, seq {seq}, {threads} thread(s), best of {steps} steps"
    );
    println!(
        "  recipe (CPU backend): {ours:8.2} samples/s  ({:.0} ms/step)",
        best * 1e3
    );

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference/bench_torch.py");
    let peer = python().and_then(|py| {
        Command::new(py)
            .arg(&script)
            .args(["--batch", &batch.to_string(), "--seq", &seq.to_string()])
            .args([
                "--steps",
                &steps.to_string(),
                "--threads",
                &threads.to_string(),
            ])
            .output()
            .ok()
    });
    match peer {
        Some(o) if o.status.success() => {
            let line = String::from_utf8_lossy(&o.stdout);
            let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
            match v["samples_per_s"].as_f64() {
                Some(theirs) => {
                    println!(
                        "  PyTorch {} (eager, fp32): {theirs:8.2} samples/s  ({:.0} ms/step)",
                        v["torch"].as_str().unwrap_or("?"),
                        v["ms_per_step"].as_f64().unwrap_or(0.0)
                    );
                    println!("  ratio recipe / PyTorch: {:.2}", ours / theirs);
                }
                None => println!("  PyTorch peer printed no figure: {line}"),
            }
        }
        Some(o) => println!(
            "  PyTorch peer unavailable (needs torch + transformers; set RECIPE_PYTHON): {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        None => println!("  PyTorch peer unavailable: no python"),
    }
}
