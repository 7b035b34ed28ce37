//! Training and evaluation throughput of the CPU backend next to PyTorch eager, interleaved in one
//! run: `cargo bench -p recipe-runtime --bench train`.
//!
//! Shape: MiniLM-L6 (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), batch 16,
//! sequence `BENCH_SEQ` (128), dropout 0, AdamW + clipping each training step. Threads:
//! `RECIPE_THREADS`, else every core. The peer is `runtime/reference/bench_torch.py`, kept running
//! beside this process (`RECIPE_PYTHON`, else the conformance venv's python, else `python3`).
//!
//! Why interleaved: separate runs of the two sides on a shared machine gave ratios from 0.86 to
//! 1.53 for the same configuration. Here each round runs `BENCH_STEPS` steps of ours and of
//! PyTorch's back to back (who goes first alternates), both warm, and the figure is the median of
//! the per-round ratios over `BENCH_ROUNDS` rounds, printed with its spread (lowest and highest
//! round). The same bench measures the SGEMM rate of the GEMM the backend uses (a 1024³ product on
//! the same threads) and prints the training FLOP rate as a fraction of it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use recipe_runtime::backend::{Backend, Cpu, Gemm};
use recipe_runtime::model::{Batch, BertConfig, Classifier, Workspace};
use recipe_runtime::optim::{clip_grad_norm, Adam, AdamConfig};
use recipe_runtime::rng::Rng;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("RECIPE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../conformance/.venv/bin/python");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("python3")
}

/// The shape's sizes.
const LAYERS: usize = 6;
const HIDDEN: usize = 384;
const INTER: usize = 1536;

/// Floating-point operations of one training step (forward + backward = 3× the forward's GEMMs
/// and attention products), counting a multiply-add as 2: per token and layer, the forward does
/// QKV + output (8·H²) and the feed-forward (4·H·I) weight products, and the scores and the
/// weighted sum of the values (4·T·H). The classifier, embeddings and elementwise work are left out.
fn train_flops(batch: usize, seq: usize) -> f64 {
    let (h, i, t) = (HIDDEN as f64, INTER as f64, seq as f64);
    let per_token_layer = 8.0 * h * h + 4.0 * h * i + 4.0 * t * h;
    3.0 * per_token_layer * LAYERS as f64 * (batch * seq) as f64
}

/// GFLOP/s of the backend's own GEMM on a 1024³ product (best of 5).
fn sgemm_peak(cpu: &Cpu) -> f64 {
    let n = 1024;
    let mut r = Rng::new(3, 3);
    let a: Vec<f32> = (0..n * n).map(|_| r.uniform() as f32).collect();
    let b: Vec<f32> = (0..n * n).map(|_| r.uniform() as f32).collect();
    let mut c = vec![0.0f32; n * n];
    let g = Gemm::dense(n, n, n, false, false, 0.0);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        cpu.gemm(&g, &a, &b, &mut c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n * n * n) as f64 / best / 1e9
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    torch: String,
}

impl Peer {
    fn start(batch: usize, seq: usize, threads: usize) -> Result<Peer, String> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reference/bench_torch.py");
        let mut child = Command::new(python())
            .arg(&script)
            .args(["--batch", &batch.to_string(), "--seq", &seq.to_string()])
            .args(["--threads", &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start python: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
        if v["ready"] != true {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(err.lines().last().unwrap_or("no answer").to_string());
        }
        let torch = v["torch"].as_str().unwrap_or("?").to_string();
        Ok(Peer {
            child,
            stdin,
            stdout,
            torch,
        })
    }

    /// Seconds per step of `k` steps of `mode` (the median of the round).
    fn run(&mut self, mode: &str, k: usize) -> f64 {
        writeln!(self.stdin, "{mode} {k}").expect("the peer reads");
        self.stdin.flush().expect("the peer reads");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the peer answers");
        let v: serde_json::Value = serde_json::from_str(line.trim()).expect("a JSON line");
        let mut s: Vec<f64> = v["seconds"]
            .as_array()
            .expect("seconds")
            .iter()
            .filter_map(|x| x.as_f64())
            .collect();
        median(&mut s)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn main() {
    let (batch, seq) = (env("BENCH_BATCH", 16), env("BENCH_SEQ", 128));
    let (steps, rounds) = (env("BENCH_STEPS", 2), env("BENCH_ROUNDS", 7));
    let threads = recipe_runtime::train::threads();
    let config = BertConfig::from_json(&format!(
        r#"{{"vocab_size": 30522, "hidden_size": {HIDDEN}, "num_hidden_layers": {LAYERS},
            "num_attention_heads": 12, "intermediate_size": {INTER}, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "pad_token_id": 0}}"#
    ))
    .expect("the bench config is valid");
    let cpu = Cpu::new(threads);
    let mut model = Classifier::random(config, 2, 0).expect("the bench model builds");
    model.set_backend(cpu);
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
    let mut ours = |mode: &str, k: usize| -> f64 {
        let mut s = Vec::with_capacity(k);
        for _ in 0..k {
            let t = Instant::now();
            if mode == "train" {
                grads.iter_mut().for_each(|g| *g = 0.0);
                model
                    .forward_backward(&mut ws, &b, 1.0, &mut grads, None)
                    .expect("forward/backward");
                clip_grad_norm(&mut grads, 1.0);
                adam.step(model.params_mut(), &grads, 1e-4).expect("step");
            } else {
                model.forward_ws(&mut ws, &b).expect("forward");
            }
            s.push(t.elapsed().as_secs_f64());
        }
        median(&mut s)
    };

    println!(
        "MiniLM-L6 shape, batch {batch}, seq {seq}, {threads} thread(s): {rounds} interleaved rounds of {steps} steps"
    );
    let peak = sgemm_peak(&cpu);
    let mut peer = match Peer::start(batch, seq, threads) {
        Ok(p) => Some(p),
        Err(e) => {
            println!(
                "  PyTorch peer unavailable (needs torch + transformers; set RECIPE_PYTHON): {e}"
            );
            None
        }
    };
    // Warm both sides (allocations, caches, the peer's first-call overheads).
    for mode in ["train", "eval"] {
        ours(mode, 1);
        if let Some(p) = peer.as_mut() {
            p.run(mode, 1);
        }
    }
    for mode in ["train", "eval"] {
        let (mut mine, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            let (a, t) = match peer.as_mut() {
                // Who goes first alternates, so a drift in the machine's load hits both sides.
                Some(p) if r % 2 == 1 => {
                    let t = p.run(mode, steps);
                    (ours(mode, steps), Some(t))
                }
                Some(p) => {
                    let a = ours(mode, steps);
                    (a, Some(p.run(mode, steps)))
                }
                None => (ours(mode, steps), None),
            };
            mine.push(a);
            if let Some(t) = t {
                theirs.push(t);
                ratios.push(t / a);
            }
        }
        let m = median(&mut mine);
        print!(
            "  {mode:<5}  recipe {:7.2} samples/s ({:5.0} ms/step)",
            batch as f64 / m,
            m * 1e3
        );
        if mode == "train" {
            let rate = train_flops(batch, seq) / m / 1e9;
            print!(
                ", {rate:.0} GFLOP/s = {:.0} % of the SGEMM peak {peak:.0} GFLOP/s",
                100.0 * rate / peak
            );
        }
        println!();
        if !theirs.is_empty() {
            let t = median(&mut theirs);
            let r = median(&mut ratios);
            let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
            println!(
                "         PyTorch {} eager {:7.2} samples/s ({:5.0} ms/step); recipe / PyTorch {r:.2} (rounds {lo:.2}–{hi:.2})",
                peer.as_ref().map_or("?", |p| p.torch.as_str()),
                batch as f64 / t,
                t * 1e3
            );
        }
    }
}
