//! The host optimizer's step under optimizer offload (`zero.offload optimizer = cpu`), on every
//! core next to one, interleaved in one run: `cargo bench -p recipe-runtime --bench host_step`.
//!
//! Shape: MiniLM-L6's 22.7 M parameters as one partition (one GPU, ZeRO-2 offload; with N GPUs
//! each rank steps 1/N of them on its share of the cores), AdamW in fp16 mixed precision: the
//! gradients copied from the pinned buffer, unscaled, the master updated and rounded into the
//! parameters (`HostOptimizer::step`). This is what the GPU waits for once per window. Threads:
//! `RECIPE_THREADS`, else every core; `BENCH_PARAMS` and `BENCH_ROUNDS` change the shape and
//! the rounds, `BENCH_OPTIMIZER=lamb` steps LAMB (one tensor: its two norms split over the
//! threads too) instead of AdamW. Prints each side's median milliseconds and the ratio per round
//! (median, lowest, highest).

use std::time::Instant;

use recipe_runtime::optim::{Adam, AdamConfig, Lamb, LambConfig, Optimizer};
use recipe_runtime::params::Params;
use recipe_runtime::precision::Dtype;
use recipe_runtime::zero::HostOptimizer;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let n = env("BENCH_PARAMS", 22_713_216);
    let rounds = env("BENCH_ROUNDS", 7);
    let threads = recipe_runtime::train::threads();
    let p0 = Params::zeros(vec![("w".into(), vec![n])]);
    let lamb = std::env::var("BENCH_OPTIMIZER").is_ok_and(|v| v == "lamb");
    let side = |t: usize| {
        let opt: Optimizer = if lamb {
            Lamb::new(LambConfig::fused_lamb(0.01), &p0.entries, &[true])
                .expect("lamb")
                .into()
        } else {
            Adam::new(AdamConfig::adamw(0.01), &p0.entries, &[true])
                .expect("adam")
                .into()
        };
        let mut params: Vec<f32> = (0..n).map(|i| (i % 31) as f32 * 0.01).collect();
        Dtype::F16.round_slice(&mut params);
        let mut opt = HostOptimizer::new(opt, true, Dtype::F16, &params);
        opt.set_threads(t);
        let grads: Vec<f32> = (0..n).map(|i| (i % 89) as f32 * 0.5 - 20.0).collect();
        (opt, params, grads)
    };
    let (mut one, mut all) = (side(1), side(threads));
    let time = |s: &mut (HostOptimizer, Vec<f32>, Vec<f32>)| {
        let mut g = s.2.clone();
        let t = Instant::now();
        s.0.step(&mut s.1, &mut g, 1e-4, 1.0 / 65536.0)
            .expect("step");
        t.elapsed().as_secs_f64() * 1e3
    };
    // Warm both (page faults of the first touch), then alternate who goes first.
    time(&mut one);
    time(&mut all);
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (x, y) = if r % 2 == 0 {
            let x = time(&mut one);
            (x, time(&mut all))
        } else {
            let y = time(&mut all);
            (time(&mut one), y)
        };
        a.push(x);
        b.push(y);
        ratios.push(x / y);
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
    println!(
        "host {} step (offload, fp16) on {n} parameters: {:.1} ms on 1 thread, {:.1} ms on {threads}: \
         {:.2}x (rounds {lo:.2}x..{hi:.2}x, {rounds} rounds)",
        if lamb { "LAMB" } else { "AdamW" },
        median(&mut a),
        median(&mut b),
        median(&mut ratios)
    );
}
