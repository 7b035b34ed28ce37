//! runtime/kernels/optim.cu on the emulated device against the host optimizer (runtime/src/optim,
//! the code path the runtime trains with today, itself tested against PyTorch).
//!
//! Tolerances: the Adam step is the same f32 operations in the same order as adam.rs (no FMA
//! contraction on either side: the kernel uses `__f*_rn` on a GPU, and g++ has no FMA on baseline
//! x86-64), so parameters, moments, master and half weights are compared **bit for bit**. The
//! gradient norm sums in f64 in a blocked order where the host sums sequentially: bit-identical
//! when every partial sum is exact (checked on such inputs), otherwise within `n · 2⁻⁵²` relative
//! (both orders are within `(n − 1) · 2⁻⁵³` of the exact sum); the f32 norm the host derives from
//! it is then the same unless the sum sits that close to an f32 rounding boundary of its square
//! root (the same on every input tested here).

use crate::common;

use common::rand;
use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::{
    adamw_step, grad_norm_sq, grad_norm_sq_blocks, DecayMask, Kernels, NORM_BLOCKS,
};
use recipe_runtime::backend::selftest::{optim_layout, scaled_step_inputs};
use recipe_runtime::optim::{
    self, Adagrad, AdagradConfig, AdagradImpl, Adam, AdamConfig, GradScale, Lamb, LambConfig,
    Optimizer, Sgd, SgdConfig, WeightDecay,
};
use recipe_runtime::params::Entry;
use recipe_runtime::precision::{self, Dtype, LossScaler, ScaleConfig, ScalerImpl};
use recipe_runtime::zero::HostOptimizer;

const SIZES: [usize; 4] = [1, 33, 257, 1000];

/// `0..n` cut at odd places (a segment of one element, the decaying ranges' bounds inside
/// segments, starts that are not multiples of adamw_step's four), as a model's segments cut the
/// flat buffer for `Resident::step`.
fn odd_segments(n: usize) -> Vec<std::ops::Range<usize>> {
    let mut cuts: Vec<usize> = [0, n / 7, n / 7 + 1, n / 2 + 2, n * 5 / 6, n]
        .iter()
        .map(|&c| c.min(n))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// One step of the resident optimizer: whole, or one segment of [`odd_segments`] at a time
/// (`DeviceOptimizer::by_segments`, as `Resident::step` queues them beside the next forward),
/// each segment's gradient zeroed with or after its update (checked: the whole accumulator is
/// zero after the last). `by_segments` is refused for LAMB, which then steps whole.
fn device_step(
    k: &Kernels<Emu>,
    dev: &mut recipe_runtime::optim::device::DeviceOptimizer<Emu>,
    params: &mut <Kernels<Emu> as recipe_runtime::backend::Backend>::Buf,
    opt: &Optimizer,
    lr: f64,
    factors: (f32, f32),
    segmented: bool,
) {
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::Backend;
    let lamb = matches!(opt, Optimizer::Lamb(_));
    let segs = odd_segments(dev.len());
    if !segmented || !dev.by_segments(k, opt, &segs) {
        assert!(!segmented || lamb, "by_segments refused {segs:?}");
        dev.step(k, k.view_mut(params), opt, lr, factors).unwrap();
        return;
    }
    assert!(!lamb, "LAMB stepped by segments");
    assert_eq!(dev.segment_count(), segs.len());
    for seg in 0..dev.segment_count() {
        let r = dev.segment(seg);
        let p = k.device().range_mut(params, r);
        // Every other segment as `Resident::step` queues it: zeroed by AdamW's own pass
        // (`adamw_step_zeroing`; after the step for the others).
        if seg % 2 == 0 {
            dev.step_segment_zeroing(k, p, opt, lr, factors, seg)
                .unwrap();
        } else {
            dev.step_segment(k, p, opt, lr, factors, seg).unwrap();
            dev.zero_segment(k, seg);
        }
    }
    let mut g = vec![1.0f32; dev.len()];
    k.download(k.view(dev.grads_mut()), &mut g);
    assert!(
        g.iter().all(|&x| x == 0.0),
        "a segment's gradient not zeroed"
    );
}

/// Asserts `got` and `want` hold the same bits, naming the first difference.
#[track_caller]
fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}[{i}]: got {:e}, want {:e} ({} differences)",
            got[i],
            want[i],
            (0..got.len())
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .count()
        );
    }
}

/// The gradient of step `k`: random, with some exact zeros, different every step.
fn grads(n: usize, k: usize) -> Vec<f32> {
    let mut g = rand(n, 0.5 + k as f32, 100 + k as u64);
    for x in g.iter_mut().skip(3).step_by(7) {
        *x = 0.0;
    }
    g
}

fn config(beta1: f64, beta2: f64, eps: f64, wd: f64, mode: WeightDecay, bc: bool) -> AdamConfig {
    AdamConfig {
        beta1,
        beta2,
        eps,
        weight_decay: wd,
        mode,
        bias_correction: bc,
    }
}

/// The mask of a whole buffer laid out as `entries` (`Adam::new`'s).
fn whole_mask(k: &Kernels<Emu>, entries: &[Entry], decay: &[bool]) -> DecayMask<Emu> {
    let end = entries.last().map_or(0, |e| e.range().end);
    DecayMask::new(k, entries, decay, std::slice::from_ref(&(0..end))).unwrap()
}

/// (config, base LR, decay flags replaced by all-true, betas set from step 3 on).
type Case = (AdamConfig, f64, bool, Option<(f64, f64)>);

fn cases() -> Vec<Case> {
    use WeightDecay::{Decoupled, L2};
    vec![
        (AdamConfig::adamw(0.01), 1e-3, false, None),
        (config(0.8, 0.99, 1e-6, 0.1, L2, true), 3e-3, false, None),
        (
            config(0.95, 0.9999, 1e-10, 0.5, Decoupled, false),
            1e-2,
            false,
            None,
        ),
        (
            config(0.9, 0.98, 1e-7, 0.0, Decoupled, true),
            5e-4,
            false,
            None,
        ),
        // Adjacent decaying tensors (merged in the mask), and OneCycle-style momentum cycling.
        (
            config(0.9, 0.999, 1e-8, 0.05, L2, true),
            2e-3,
            true,
            Some((0.85, 0.995)),
        ),
    ]
}

/// Several steps of [`Optimizer::step_scaled`] (what `Replica::step` calls) and of the kernel,
/// with changing gradients, LRs and gradient multipliers (< 1: clipping or unscaling).
#[test]
fn adam_step_matches_the_host_bit_for_bit() {
    let k = Kernels::new(Emu);
    const MULTS: [f32; 5] = [1.0, 0.37, 1.0, 0.812_345_6, 0.5];
    for n in SIZES {
        let (entries, flags) = optim_layout(n);
        for (ci, (cfg0, lr0, all_decay, cycle)) in cases().into_iter().enumerate() {
            let flags = if all_decay {
                vec![true; flags.len()]
            } else {
                flags.clone()
            };
            let mut host = Optimizer::from(Adam::new(cfg0, &entries, &flags).unwrap());
            let mask = whole_mask(&k, &entries, &flags);
            let mut cfg = cfg0;
            let p0 = rand(n, 1.0, 7);
            let (mut hp, mut dp) = (p0.clone(), p0);
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
            for (step, mult) in MULTS.into_iter().enumerate() {
                if let (Some((b1, b2)), true) = (cycle, step >= 2) {
                    host.set_betas(b1, b2).unwrap();
                    (cfg.beta1, cfg.beta2) = (b1, b2);
                }
                let lr = lr0 * (1.0 + step as f64) / 3.0;
                let g = grads(n, step);
                let scale = GradScale {
                    unscale: mult,
                    combined: None,
                };
                host.step_scaled(&mut hp, &mut g.clone(), lr, scale)
                    .unwrap();
                let t = step as u64 + 1;
                adamw_step(
                    &k, &cfg, t, lr, mult, &mask, &mut dp, &g, &mut m, &mut v, None,
                )
                .unwrap();
                let what = format!("n={n} case {ci} step {t}");
                let state = host.state();
                same_bits(&format!("{what} params"), &dp, &hp);
                same_bits(&format!("{what} exp_avg"), &m, state.buffer("exp_avg"));
                same_bits(
                    &format!("{what} exp_avg_sq"),
                    &v,
                    state.buffer("exp_avg_sq"),
                );
            }
        }
    }
}

/// The fp32 clipping path of `Replica::clip`: the norm from the device's `Σ g²`, the host's
/// coefficient, applied as the kernel's multiplier; against `clip_grad_norm` then the step.
#[test]
fn clipped_steps_match_clip_grad_norm_then_the_host_step() {
    let k = Kernels::new(Emu);
    for n in SIZES {
        let (entries, flags) = optim_layout(n);
        let cfg = AdamConfig::adamw(0.01);
        let mut host = Optimizer::from(Adam::new(cfg, &entries, &flags).unwrap());
        let mask = whole_mask(&k, &entries, &flags);
        let p0 = rand(n, 1.0, 8);
        let (mut hp, mut dp) = (p0.clone(), p0);
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        let mut clipped = 0;
        for step in 0..4 {
            let g = grads(n, step);
            let max_norm = 0.6f32;
            let mut hg = g.clone();
            let host_norm = optim::clip_grad_norm(&mut hg, max_norm);
            host.step_scaled(&mut hp, &mut hg, 1e-3, GradScale::ONE)
                .unwrap();
            let norm = grad_norm_sq(&k, &g).sqrt() as f32;
            assert_eq!(norm.to_bits(), host_norm.to_bits(), "n={n} norm");
            let coef = optim::clip_coef(norm, max_norm);
            clipped += usize::from(coef.is_some());
            let mult = coef.unwrap_or(1.0);
            adamw_step(
                &k,
                &cfg,
                step as u64 + 1,
                1e-3,
                mult,
                &mask,
                &mut dp,
                &g,
                &mut m,
                &mut v,
                None,
            )
            .unwrap();
            same_bits(&format!("n={n} step {step} params"), &dp, &hp);
        }
        assert!(clipped > 0, "n={n}: the test should clip some steps");
    }
}

/// Mixed precision as `Replica` runs it: half gradients at a loss scale, the overflow check and
/// the norm from one `Σ g²`, DeepSpeed's combined factor, the step on fp32 masters, and the half
/// weights rounded from them (`HostOptimizer`); an overflowing step is skipped on both sides.
#[test]
fn mixed_precision_steps_match_the_host_optimizer() {
    for module in [Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(Emu).with_store(module);
        for n in SIZES {
            let (entries, flags) = optim_layout(n);
            let mut cfg = AdamConfig::adamw(0.01);
            cfg.mode = if n == 33 {
                WeightDecay::L2
            } else {
                WeightDecay::Decoupled
            };
            let mut p0 = rand(n, 1.0, 9);
            module.round_slice(&mut p0);
            let adam = Adam::new(cfg, &entries, &flags).unwrap();
            let mut host = HostOptimizer::new(adam, false, module, &p0);
            let mask = whole_mask(&k, &entries, &flags);
            let mut hp = p0.clone();
            let (mut master, mut work) = (p0.clone(), p0);
            let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
            let scale_cfg = if module == Dtype::F16 {
                ScaleConfig::Dynamic {
                    initial_scale_power: 10,
                    window: 2,
                    hysteresis: 1,
                    consecutive_hysteresis: false,
                    min_scale: 1.0,
                }
            } else {
                ScaleConfig::Static { scale: 1.0 }
            };
            let mut scaler = LossScaler::new(scale_cfg, ScalerImpl::Zero);
            let mut t = 0u64;
            for step in 0..5 {
                let used = scaler.scale();
                // Multiples of 2⁻⁶ (times a power of two): the f64 Σg² is exact on both sides.
                let mut g: Vec<f32> = grads(n, step)
                    .iter()
                    .map(|x| (x * 64.0).round() / 64.0 * used as f32)
                    .collect();
                if step == 2 {
                    g[n / 2] = f32::INFINITY; // one overflowing step
                }
                module.round_slice(&mut g);
                let sq = grad_norm_sq(&k, &g);
                let overflow = !sq.is_finite();
                assert_eq!(overflow, precision::has_inf_or_nan(&g), "n={n} overflow");
                assert_eq!(overflow, step == 2);
                scaler.update(overflow).unwrap();
                if overflow {
                    continue;
                }
                let now = scaler.scale();
                let host_sq = optim::sum_squares(&g);
                assert_eq!(sq.to_bits(), host_sq.to_bits(), "n={n} Σg² (exact here)");
                let combined = precision::combined_scale(now, sq.sqrt(), 1.0);
                let unscale = (1.0 / combined) as f32;
                let lr = 1e-3 * (step + 1) as f64;
                host.step(&mut hp, &mut g.clone(), lr, unscale).unwrap();
                t += 1;
                adamw_step(
                    &k,
                    &cfg,
                    t,
                    lr,
                    unscale,
                    &mask,
                    &mut master,
                    &g,
                    &mut m,
                    &mut v,
                    Some(&mut work),
                )
                .unwrap();
                let what = format!("{module:?} n={n} step {step}");
                let state = host.state();
                same_bits(&format!("{what} master"), &master, &state.master);
                same_bits(&format!("{what} half weights"), &work, &hp);
                same_bits(&format!("{what} exp_avg"), &m, state.buffer("exp_avg"));
                same_bits(
                    &format!("{what} exp_avg_sq"),
                    &v,
                    state.buffer("exp_avg_sq"),
                );
            }
        }
    }
}

/// A ZeRO partition (several pieces of a buffer in one local buffer): the mask is
/// `Adam::shard`'s, and the partition steps as the host's shard does.
#[test]
fn a_zero_partition_steps_as_the_host_shard() {
    let k = Kernels::new(Emu);
    let (entries, flags) = optim_layout(1000);
    let pieces = [3..70, 480..620, 990..1000];
    let cfg = AdamConfig::adamw(0.1);
    let mut host = Adam::shard(cfg, &entries, &flags, &pieces).unwrap();
    let mask = DecayMask::new(&k, &entries, &flags, &pieces).unwrap();
    let n = mask.len();
    assert_eq!(n, 67 + 140 + 10);
    let p0 = rand(n, 1.0, 10);
    let (mut hp, mut dp) = (p0.clone(), p0);
    let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    for step in 0..3 {
        let g = grads(n, step);
        host.step(&mut hp, &g, 1e-2).unwrap();
        adamw_step(
            &k,
            &cfg,
            step as u64 + 1,
            1e-2,
            1.0,
            &mask,
            &mut dp,
            &g,
            &mut m,
            &mut v,
            None,
        )
        .unwrap();
        same_bits("partition params", &dp, &hp);
    }
    // Wrong lengths and a non-finite LR are refused as the host refuses them.
    let short = vec![0.0f32; n - 1];
    assert!(
        adamw_step(&k, &cfg, 4, 1e-2, 1.0, &mask, &mut dp, &short, &mut m, &mut v, None).is_err()
    );
    let g = grads(n, 0);
    assert!(adamw_step(
        &k,
        &cfg,
        4,
        f64::NAN,
        1.0,
        &mask,
        &mut dp,
        &g,
        &mut m,
        &mut v,
        None
    )
    .is_err());
}

/// adamw_step takes four elements a thread, 16 bytes at a time where its four buffers are
/// aligned: buffers one element off (every element one at a time) and a length with a tail of
/// three step as the host does, bit for bit, the decaying ranges' bounds falling inside groups
/// of four.
#[test]
fn adam_steps_misaligned_buffers_and_short_tails_as_the_host_does() {
    let k = Kernels::new(Emu);
    let n = 1003;
    let (entries, flags) = optim_layout(n);
    let cfg = AdamConfig::adamw(0.1);
    for off in [0, 1] {
        let mut host = Adam::new(cfg, &entries, &flags).unwrap();
        let mask = whole_mask(&k, &entries, &flags);
        let p0 = rand(n + 1, 1.0, 12);
        let (mut hp, mut dp) = (p0[off..off + n].to_vec(), p0.clone());
        let (mut m, mut v) = (vec![0.0f32; n + 1], vec![0.0f32; n + 1]);
        for step in 0..3 {
            let mut g = vec![0.0f32; n + 1];
            g[off..off + n].copy_from_slice(&grads(n, step));
            host.step(&mut hp, &g[off..off + n], 1e-2).unwrap();
            adamw_step(
                &k,
                &cfg,
                step as u64 + 1,
                1e-2,
                1.0,
                &mask,
                &mut dp[off..off + n],
                &g[off..off + n],
                &mut m[off..off + n],
                &mut v[off..off + n],
                None,
            )
            .unwrap();
            same_bits(&format!("params, offset {off}"), &dp[off..off + n], &hp);
        }
    }
}

/// `Σ g²` against `optim::sum_squares`: bit-identical on inputs whose sums are exact (multiples
/// of 2⁻¹⁰ up to 2 in magnitude: squares are multiples of 2⁻²⁰ below 2¹³ in total), and within
/// `n · 2⁻⁵²` relative with the same f32 norm on f32 values spread over 40 binades. Sizes cover
/// one element and partial warps and blocks; small block caps run the grid-stride loop (many
/// elements per thread) at a cost the emulation affords.
#[test]
fn grad_norm_matches_the_host_sum_of_squares() {
    let k = Kernels::new(Emu);
    for (n, cap) in [
        (0, NORM_BLOCKS),
        (1, NORM_BLOCKS),
        (33, NORM_BLOCKS),
        (257, NORM_BLOCKS),
        (1000, NORM_BLOCKS),
        (1000, 1),
        (5003, 3),
        (20_000, 7),
    ] {
        let exact: Vec<f32> = rand(n, 1.0, 11)
            .iter()
            .map(|x| (x * 2048.0).round() / 1024.0)
            .collect();
        let got = grad_norm_sq_blocks(&k, &exact, cap);
        let want = optim::sum_squares(&exact);
        // (Rust's f64 sum of nothing is −0.0, the device's +0.0: equal values.)
        assert!(
            got == want && got.to_bits() == (want + 0.0).to_bits(),
            "n={n} exact Σg²: {got} vs {want}"
        );

        let spread: Vec<f32> = rand(n, 1.0, 12)
            .iter()
            .zip(rand(n, 1.0, 13))
            .map(|(x, e)| x * 2f32.powi((e * 20.0) as i32))
            .collect();
        let got = grad_norm_sq_blocks(&k, &spread, cap);
        let want = optim::sum_squares(&spread);
        let bound = n as f64 * 2f64.powi(-52) * want;
        assert!(
            (got - want).abs() <= bound,
            "n={n}: {got} vs {want} (bound {bound})"
        );
        assert_eq!(
            (got.sqrt() as f32).to_bits(),
            (want.sqrt() as f32).to_bits() & 0x7fff_ffff,
            "n={n} f32 norm"
        );
        // Determinism: the same call, the same bits.
        assert_eq!(
            grad_norm_sq_blocks(&k, &spread, cap).to_bits(),
            got.to_bits(),
            "n={n} rerun"
        );
    }
}

/// `Σ g²` segment by segment (`SegmentNorms`: each segment's first pass queued on its own, as a
/// backward finishes it, then one second pass over all of them) against `optim::sum_squares`:
/// bit-identical on exact inputs, within `n · 2⁻⁵²` relative otherwise with the same f32 norm,
/// the same bits on a rerun; a segment's partials queued again after its values change give the
/// new sum; an inf in one segment makes the total inf.
#[test]
fn grad_norm_by_segments_matches_the_host_sum_of_squares() {
    use recipe_runtime::backend::kernels::SegmentNorms;
    use recipe_runtime::backend::Backend;
    let k = Kernels::new(Emu);
    for n in [1, 33, 257, 5003, 300_000] {
        let segs = odd_segments(n);
        let mut norms = SegmentNorms::new(&k, &segs);
        let mut sum = |g: &[f32]| {
            let buf = k.upload(g);
            for seg in (0..segs.len()).rev() {
                norms.partials(&k, k.view(&buf), seg);
            }
            norms.total(&k)
        };
        let exact: Vec<f32> = rand(n, 1.0, 21)
            .iter()
            .map(|x| (x * 2048.0).round() / 1024.0)
            .collect();
        let (got, want) = (sum(&exact), optim::sum_squares(&exact));
        assert_eq!(got.to_bits(), want.to_bits(), "n={n} exact Σg²");
        let spread: Vec<f32> = rand(n, 1.0, 22)
            .iter()
            .zip(rand(n, 1.0, 23))
            .map(|(x, e)| x * 2f32.powi((e * 20.0) as i32))
            .collect();
        let (got, want) = (sum(&spread), optim::sum_squares(&spread));
        let bound = n as f64 * 2f64.powi(-52) * want;
        assert!((got - want).abs() <= bound, "n={n}: {got} vs {want}");
        assert_eq!(
            (got.sqrt() as f32).to_bits(),
            (want.sqrt() as f32).to_bits()
        );
        assert_eq!(sum(&spread).to_bits(), got.to_bits(), "n={n} rerun");
        let mut inf = spread.clone();
        inf[n - 1] = f32::INFINITY;
        assert!(sum(&inf).is_infinite(), "n={n}");
    }
}

/// A segment rounded to the storage dtype in the pass that sums it
/// (`SegmentNorms::partials_rounding`: the backward's weight gradients, which their GEMMs leave
/// unrounded, in the resident optimizer's sink) against `Backend::round_stored` of the segment
/// and then `SegmentNorms::partials`: the same rounded buffer and the same sum, bit for bit, in
/// fp16 and bf16, with segments of one element and past a block's reach (the grid-stride loop),
/// some segments rounded and others only summed; values that overflow fp16 become inf in both.
/// In fp32 the pass only reads.
#[test]
fn a_segments_rounding_fused_with_its_sum_is_the_two_passes_bit_for_bit() {
    use recipe_runtime::backend::kernels::SegmentNorms;
    use recipe_runtime::backend::Backend;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in [Dtype::F16, Dtype::Bf16, Dtype::F32] {
        let k = Kernels::new(Emu).with_store(store);
        for n in [1, 257, 5003, 300_000] {
            let segs = odd_segments(n);
            // Unrounded sums of a GEMM, some past fp16's range.
            let mut g: Vec<f32> = rand(n, 1.0, 31)
                .iter()
                .zip(rand(n, 1.0, 32))
                .map(|(x, e)| x * 2f32.powi((e * 20.0) as i32))
                .collect();
            g[n / 2] = 1.0e5;
            // Every other segment rounded, the rest only summed (as the embeddings' are).
            let rounded = |seg: usize| seg % 2 == 0;
            let mut two = k.upload(&g);
            let mut fused = k.upload(&g);
            let (mut a, mut b) = (SegmentNorms::new(&k, &segs), SegmentNorms::new(&k, &segs));
            for (seg, r) in segs.iter().enumerate().rev() {
                if rounded(seg) {
                    k.round_stored(k.range_mut(&mut two, r.clone()));
                    b.partials_rounding(&k, k.view_mut(&mut fused), seg);
                } else {
                    b.partials(&k, k.view(&fused), seg);
                }
                a.partials(&k, k.view(&two), seg);
            }
            let (want, got) = (a.total(&k), b.total(&k));
            let what = format!("{store:?} n={n}");
            assert_eq!(got.to_bits(), want.to_bits(), "{what}: Σg²");
            let (mut x, mut y) = (vec![0.0; n], vec![0.0; n]);
            k.download(k.view(&two), &mut x);
            k.download(k.view(&fused), &mut y);
            assert_eq!(bits(&y), bits(&x), "{what}: the rounded values");
            // The rounding happened (or, in fp32, nothing was written).
            let changed = x
                .iter()
                .zip(&g)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                changed == 0,
                store == Dtype::F32,
                "{what}: {changed} changed"
            );
            if store == Dtype::F16
                && rounded(segs.iter().position(|r| r.contains(&(n / 2))).unwrap())
            {
                assert!(want.is_infinite(), "{what}: 1e5 is inf in fp16");
            }
        }
    }
}

/// The sum is non-finite exactly when an element is inf or NaN (the host's overflow test), wherever
/// it sits, and finite for the largest finite values (no f64 overflow); and one sum at the real
/// cap over more than NORM_BLOCKS · BLOCK elements.
#[test]
fn grad_norm_reports_non_finite_gradients_as_the_overflow_check_does() {
    let k = Kernels::new(Emu);
    for (n, cap) in [
        (1, NORM_BLOCKS),
        (33, NORM_BLOCKS),
        (1000, NORM_BLOCKS),
        (3001, 2),
    ] {
        let base = rand(n, 1.0, 14);
        for at in [0, n / 2, n - 1] {
            for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                let mut g = base.clone();
                g[at] = bad;
                let sq = grad_norm_sq_blocks(&k, &g, cap);
                assert!(!sq.is_finite(), "n={n} at {at} {bad}: {sq}");
                assert!(precision::has_inf_or_nan(&g));
                assert_eq!(sq.is_nan(), bad.is_nan(), "n={n} at {at} {bad}");
            }
        }
        let maxed = vec![f32::MAX; n];
        let sq = grad_norm_sq_blocks(&k, &maxed, cap);
        assert!(sq.is_finite() && !precision::has_inf_or_nan(&maxed));
        let want = optim::sum_squares(&maxed);
        assert!((sq - want).abs() <= n as f64 * 2f64.powi(-52) * want);
    }
    // The default cap, beyond one grid: block 0's threads take a second round (one call only:
    // ~5 s of emulation on two cores).
    let n = NORM_BLOCKS * 256 + 77;
    let g = rand(n, 1.0, 16);
    let (got, want) = (grad_norm_sq(&k, &g), optim::sum_squares(&g));
    assert!((got - want).abs() <= n as f64 * 2f64.powi(-52) * want);
    assert_eq!(
        (got.sqrt() as f32).to_bits(),
        (want.sqrt() as f32).to_bits()
    );
}

/// The same step from the same state twice gives the same bits.
#[test]
fn adam_step_is_deterministic() {
    let k = Kernels::new(Emu).with_store(Dtype::Bf16);
    let n = 1000;
    let (entries, flags) = optim_layout(n);
    let mask = whole_mask(&k, &entries, &flags);
    let cfg = AdamConfig::adamw(0.01);
    let run = || {
        let mut p = rand(n, 1.0, 15);
        let (mut m, mut v, mut w) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        for step in 0..3 {
            let g = grads(n, step);
            adamw_step(
                &k,
                &cfg,
                step as u64 + 1,
                1e-3,
                0.7,
                &mask,
                &mut p,
                &g,
                &mut m,
                &mut v,
                Some(&mut w),
            )
            .unwrap();
        }
        [p, m, v, w]
    };
    let (a, b) = (run(), run());
    for (x, y) in a.iter().zip(&b) {
        same_bits("rerun", x, y);
    }
}

/// The training loop's resident optimizer (`optim::device::DeviceOptimizer`: state uploaded once,
/// the accumulator, norm and step on the device, the state downloaded for a checkpoint) against
/// `HostOptimizer` over several steps, from a state that already took a step (a resumed run):
/// the weights (fp32, or master and half copy), the moments and the step count bit for bit;
/// clipping in fp32 (the coefficient the host scales by, as the step's factor), the unscale factor
/// under mixed precision.
#[test]
fn the_resident_optimizer_keeps_the_host_optimizers_state() {
    use recipe_runtime::backend::Backend;
    use recipe_runtime::optim::device::DeviceOptimizer;

    for (module, segmented) in [Dtype::F32, Dtype::F16, Dtype::Bf16]
        .into_iter()
        .flat_map(|m| [(m, false), (m, true)])
    {
        let k = Kernels::new(Emu).with_store(module);
        let n = 257;
        let (entries, flags) = optim_layout(n);
        let cfg = AdamConfig::adamw(0.01);
        let mut p0 = rand(n, 1.0, 5);
        module.round_slice(&mut p0);
        let mut host = HostOptimizer::new(
            Adam::new(cfg, &entries, &flags).unwrap(),
            false,
            module,
            &p0,
        );
        let mut hp = p0;
        // One host step first: the device starts from a state with moments and a count.
        host.step(&mut hp, &mut grads(n, 9), 1e-3, 1.0).unwrap();
        let state = host.state();
        let mut adam = Adam::new(cfg, &entries, &flags).unwrap();
        let master = state.master.clone();
        adam.load_state(state.try_into().unwrap()).unwrap();
        let mut adam = Optimizer::from(adam);
        let mut dev =
            DeviceOptimizer::new(&k, &adam, module.is_half().then_some(&master[..]), n, 0..n)
                .unwrap();
        assert_eq!(dev.len(), n);
        let mut params = k.upload(&hp);
        for step in 0..4 {
            let g: Vec<f32> = grads(n, step).iter().map(|x| x * 64.0).collect();
            dev.zero_grads(&k);
            k.write(k.view_mut(dev.grads_mut()), &g);
            let sq = dev.grad_sq(&k);
            assert_eq!(sq, grad_norm_sq(&k, &g), "{module:?} step {step}");
            let norm = sq.sqrt() as f32;
            let lr = 1e-3 * (step + 1) as f64;
            let mut hg = g.clone();
            let mult = if module.is_half() {
                let unscale = (1.0 / precision::combined_scale(64.0, sq.sqrt(), 1.0)) as f32;
                host.step(&mut hp, &mut hg, lr, unscale).unwrap();
                unscale
            } else {
                let coef = optim::clip_coef(norm, 1.0).expect("these gradients clip");
                optim::scale(&mut hg, coef);
                host.step(&mut hp, &mut hg, lr, 1.0).unwrap();
                coef
            };
            device_step(&k, &mut dev, &mut params, &adam, lr, (mult, 1.0), segmented);
            adam.count_step();
            let state = host.state();
            assert_eq!(adam.steps(), state.step);
            let mut w = vec![0.0; n];
            dev.download(&k, &mut adam, Some(&mut w)).unwrap();
            let got = adam.state();
            let (m, v) = (got.buffer("exp_avg"), got.buffer("exp_avg_sq"));
            let what = format!("{module:?} step {step} by segments {segmented}");
            same_bits(&format!("{what} weights"), &params, &hp);
            same_bits(&format!("{what} exp_avg"), m, state.buffer("exp_avg"));
            same_bits(&format!("{what} exp_avg_sq"), v, state.buffer("exp_avg_sq"));
            if module.is_half() {
                same_bits(&format!("{what} master"), &w, &state.master);
            }
        }
    }
}

/// SGD, Adagrad and LAMB cases: every variant the host optimizers have, each a fresh optimizer
/// for `entries` / `flags` and a name. LAMB's clamp cases pin the trust ratio at a bound on every
/// tensor (asserted by [`the_other_optimizers_step_on_the_device_as_the_host_does`]).
fn other_cases(entries: &[Entry], flags: &[bool]) -> Vec<(&'static str, Optimizer)> {
    let sgd = |momentum: f64, dampening: f64, nesterov: bool, wd: f64| {
        let mut c = SgdConfig::new(momentum, nesterov, wd);
        c.dampening = dampening;
        Optimizer::from(Sgd::new(c, entries, flags).unwrap())
    };
    let adagrad = |c: AdagradConfig| Optimizer::from(Adagrad::new(c, entries, flags).unwrap());
    let lamb = |c: LambConfig| Optimizer::from(Lamb::new(c, entries, flags).unwrap());
    let mut torch_decay = AdagradConfig::new(1e-10, 0.0, AdagradImpl::Torch);
    torch_decay.lr_decay = 0.1;
    torch_decay.initial_accumulator_value = 0.1;
    let mut no_bc = LambConfig::fused_lamb(0.0);
    (no_bc.bias_correction, no_bc.eps, no_bc.beta1) = (false, 1e-6, 0.8);
    let (mut at_max, mut at_min) = (LambConfig::fused_lamb(0.05), LambConfig::fused_lamb(0.01));
    at_max.max_coeff = 0.05;
    at_min.min_coeff = 5.0;
    vec![
        ("sgd plain", sgd(0.0, 0.0, false, 0.0)),
        ("sgd plain decay", sgd(0.0, 0.0, false, 0.1)),
        ("sgd momentum", sgd(0.9, 0.0, false, 0.01)),
        ("sgd nesterov", sgd(0.9, 0.0, true, 0.1)),
        ("sgd dampening", sgd(0.5, 0.3, false, 0.05)),
        (
            "adagrad torch",
            adagrad(AdagradConfig::new(1e-10, 0.01, AdagradImpl::Torch)),
        ),
        ("adagrad torch lr_decay init", adagrad(torch_decay)),
        (
            "adagrad deepspeed",
            adagrad(AdagradConfig::new(1e-8, 0.05, AdagradImpl::DeepSpeedCpu)),
        ),
        ("lamb", lamb(LambConfig::fused_lamb(0.01))),
        ("lamb no bias correction", lamb(no_bc)),
        ("lamb clamped at max", lamb(at_max)),
        ("lamb clamped at min", lamb(at_min)),
    ]
}

fn lamb_coefficients(o: &Optimizer) -> Vec<f32> {
    match o {
        Optimizer::Lamb(l) => l.coefficients().to_vec(),
        _ => Vec::new(),
    }
}

/// The resident optimizer (`optim::device::DeviceOptimizer`, what the training loop runs) for SGD,
/// Adagrad and LAMB against `HostOptimizer` (what `Replica` runs on the host), bit for bit: the
/// weights (fp32, or the fp32 master and the half copy), every state buffer, the step count and
/// LAMB's per-tensor trust ratios, over five steps with changing gradients, LRs and factors. In
/// fp32 the factor is a multiplier (the clip coefficient: the host scales the gradients by it);
/// under fp16/bf16 it is DeepSpeed's combined scale, which LAMB divides by in its kernel and the
/// others multiply by the reciprocal of ([`Optimizer::grad_factors`]). After step 2 the state is
/// downloaded into the host optimizer and uploaded again (a checkpoint and a resume), so the
/// later steps start from a state the host wrote.
#[test]
fn the_other_optimizers_step_on_the_device_as_the_host_does() {
    use recipe_runtime::backend::Backend;
    use recipe_runtime::optim::device::DeviceOptimizer;

    const MULTS: [f32; 5] = [1.0, 0.37, 1.0, 0.812_345_6, 0.5];
    for module in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(Emu).with_store(module);
        // fp32 on every odd size; the half dtypes (the same kernels, plus the rounding into the
        // working copy) on one.
        let sizes: &[usize] = if module.is_half() { &[257] } else { &SIZES };
        for (&n, segmented) in sizes.iter().flat_map(|n| [(n, false), (n, true)]) {
            let (entries, flags) = optim_layout(n);
            for (name, opt) in other_cases(&entries, &flags) {
                let what = format!("{name} {module:?} n={n} by segments {segmented}");
                let mut p0 = rand(n, 1.0, 11);
                module.round_slice(&mut p0);
                let mut host = HostOptimizer::new(opt.clone(), false, module, &p0);
                let master = module.is_half().then(|| p0.clone());
                let mut dopt = opt;
                let mut dev =
                    DeviceOptimizer::new(&k, &dopt, master.as_deref(), dopt.len(), 0..dopt.len())
                        .unwrap();
                let mut params = k.upload(&p0);
                let mut hp = p0;
                let mut w = vec![0.0f32; n];
                for (step, mult) in MULTS.into_iter().enumerate() {
                    let what = format!("{what} step {}", step + 1);
                    let lr = 1e-2 * (1.0 + step as f64) / 3.0;
                    let (g, scale) = scaled_step_inputs(&grads(n, step), module, 48.0, mult);
                    host.step_scaled(&mut hp, &mut g.clone(), lr, scale)
                        .unwrap();
                    dev.zero_grads(&k);
                    k.write(k.view_mut(dev.grads_mut()), &g);
                    let factors = dopt.grad_factors(scale);
                    device_step(&k, &mut dev, &mut params, &dopt, lr, factors, segmented);
                    dopt.count_step();
                    dev.download(&k, &mut dopt, Some(&mut w)).unwrap();
                    if step == 2 {
                        // Resume: a fresh device optimizer from the state just downloaded.
                        let again = module.is_half().then_some(&w[..]);
                        dev = DeviceOptimizer::new(&k, &dopt, again, dopt.len(), 0..dopt.len())
                            .unwrap();
                    }
                    let (want, got) = (host.state(), dopt.state());
                    assert_eq!(got.step, want.step, "{what}");
                    let mut dp = vec![0.0f32; n];
                    k.download(k.view(&params), &mut dp);
                    same_bits(&format!("{what} weights"), &dp, &hp);
                    if module.is_half() {
                        same_bits(&format!("{what} master"), &w, &want.master);
                    }
                    assert_eq!(
                        got.buffers.keys().collect::<Vec<_>>(),
                        want.buffers.keys().collect::<Vec<_>>()
                    );
                    for (b, x) in &want.buffers {
                        same_bits(&format!("{what} {b}"), got.buffer(b), x);
                    }
                    let (hc, dc) = (
                        lamb_coefficients(host.optimizer()),
                        lamb_coefficients(&dopt),
                    );
                    same_bits(&format!("{what} trust ratios"), &dc, &hc);
                    if name.ends_with("at max") {
                        assert!(hc.iter().all(|&c| c == 0.05), "{what}: {hc:?}");
                    }
                    if name.ends_with("at min") {
                        assert!(hc.iter().all(|&c| c == 5.0), "{what}: {hc:?}");
                    }
                }
            }
        }
    }
}

/// LAMB's norms on a tensor longer than 512 blocks of 512 (FusedLamb caps the blocks at 512, so
/// threads take more than one element in turn) beside a 3-element one: the trust ratios and the
/// step bit for bit, and the ratio not clamped (the norms decide it).
#[test]
fn lamb_norms_cap_the_blocks_as_the_host_does() {
    use recipe_runtime::backend::Backend;
    use recipe_runtime::optim::device::DeviceOptimizer;

    let k = Kernels::new(Emu);
    let long = 512 * 512 + 1;
    let entries = vec![
        Entry {
            name: "big.weight".into(),
            shape: vec![long],
            offset: 0,
        },
        Entry {
            name: "small.bias".into(),
            shape: vec![3],
            offset: long,
        },
    ];
    let flags = [true, false];
    let n = long + 3;
    let mut cfg = LambConfig::fused_lamb(0.01);
    (cfg.min_coeff, cfg.max_coeff) = (0.0, 1e9);
    let opt = Optimizer::from(Lamb::new(cfg, &entries, &flags).unwrap());
    let p0 = rand(n, 1.0, 12);
    let mut host = opt.clone();
    let mut dopt = opt;
    let mut dev = DeviceOptimizer::new(&k, &dopt, None, dopt.len(), 0..dopt.len()).unwrap();
    let mut params = k.upload(&p0);
    let mut hp = p0;
    for step in 0..2 {
        let g = grads(n, step);
        host.step(&mut hp, &g, 1e-2).unwrap();
        k.write(k.view_mut(dev.grads_mut()), &g);
        dev.step(&k, k.view_mut(&mut params), &dopt, 1e-2, (1.0, 1.0))
            .unwrap();
        dopt.count_step();
        dev.download(&k, &mut dopt, None).unwrap();
        let mut dp = vec![0.0f32; n];
        k.download(k.view(&params), &mut dp);
        same_bits(&format!("step {step} weights"), &dp, &hp);
        let hc = lamb_coefficients(&host);
        same_bits("trust ratios", &lamb_coefficients(&dopt), &hc);
        assert!(hc.iter().all(|&c| c != 1.0 && c > 0.0 && c < 1e9), "{hc:?}");
        for (b, x) in &host.state().buffers {
            same_bits(&format!("step {step} {b}"), dopt.state().buffer(b), x);
        }
    }
}

/// 16-bit parameters hold only the rounded copy of the weights: stepping them without fp32
/// master weights is refused with the reason (no kernel reads two-byte values as floats).
#[test]
fn sixteen_bit_parameters_without_master_weights_are_refused() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::Backend;
    let k = Kernels::new(EmuTyped).with_store(Dtype::F16);
    let n = 33;
    let (entries, flags) = optim_layout(n);
    let adam = Optimizer::from(Adam::new(AdamConfig::adamw(0.01), &entries, &flags).unwrap());
    let mut dev =
        recipe_runtime::optim::device::DeviceOptimizer::new(&k, &adam, None, n, 0..n).unwrap();
    let mut params = k.alloc_stored(n);
    let e = dev
        .step(&k, k.view_mut(&mut params), &adam, 1e-3, (1.0, 1.0))
        .unwrap_err();
    assert!(e.to_string().contains("fp32 master weights"), "{e}");
}

/// The half copy an AdamW step writes into 16-bit parameters (typed buffers, as on a GPU): four
/// elements in one 8-byte store where the copy's elements are 8-byte aligned, one at a time
/// elsewhere (a segment may start at any element), each the host's rounding of its updated
/// master, bit for bit, and nothing outside the copy written.
#[test]
fn the_half_copy_is_the_hosts_rounding_at_any_alignment() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::Backend;
    for module in [Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(EmuTyped).with_store(module);
        for n in SIZES {
            // Offsets of 0–3 elements (2 bytes each): at least one is 8-byte aligned.
            for offset in 0..4 {
                let (entries, flags) = optim_layout(n);
                let cfg = AdamConfig::adamw(0.01);
                let mut p0 = rand(n, 1.0, 11);
                module.round_slice(&mut p0);
                let adam = Adam::new(cfg, &entries, &flags).unwrap();
                let mut host = HostOptimizer::new(adam, false, module, &p0);
                let end = entries.last().map_or(0, |e| e.range().end);
                let whole = 0..end;
                let mask =
                    DecayMask::new(&k, &entries, &flags, std::slice::from_ref(&whole)).unwrap();
                let mut hp = p0.clone();
                let (mut master, mut m, mut v) = (
                    k.upload(&p0),
                    k.upload(&vec![0.0; n]),
                    k.upload(&vec![0.0; n]),
                );
                // A sentinel either side of the copy.
                let mut work = k.alloc_stored(n + offset + 1);
                let mut around = vec![0.5f32; n + offset + 1];
                around[offset..offset + n].copy_from_slice(&p0);
                k.write(k.view_mut(&mut work), &around);
                for step in 0..2 {
                    let mut g = grads(n, step);
                    module.round_slice(&mut g);
                    let lr = 1e-3 * (step + 1) as f64;
                    host.step(&mut hp, &mut g.clone(), lr, 1.0).unwrap();
                    let gb = k.upload(&g);
                    adamw_step(
                        &k,
                        &cfg,
                        step as u64 + 1,
                        lr,
                        1.0,
                        &mask,
                        k.view_mut(&mut master),
                        k.view(&gb),
                        k.view_mut(&mut m),
                        k.view_mut(&mut v),
                        Some(k.range_mut(&mut work, offset..offset + n)),
                    )
                    .unwrap();
                    let what = format!("{module:?} n={n} offset {offset} step {step}");
                    let mut got = vec![0.0f32; n + offset + 1];
                    k.download(k.view(&work), &mut got);
                    same_bits(
                        &format!("{what} half weights"),
                        &got[offset..offset + n],
                        &hp,
                    );
                    assert!(
                        got[..offset]
                            .iter()
                            .chain(&got[offset + n..])
                            .all(|&x| x == 0.5),
                        "{what}: written outside the copy"
                    );
                    let mut mp = vec![0.0f32; n];
                    k.download(k.view(&master), &mut mp);
                    same_bits(&format!("{what} master"), &mp, &host.state().master);
                }
            }
        }
    }
}

/// The word embeddings' step in two parts (`DeviceOptimizer::rows_first`, as `Resident::step`
/// puts off the first segment's step and the next micro-batch takes it): the rows its tokens
/// name and the segment's other tensors first (`FirstPart::Rows`), then the other rows
/// (`FirstPart::Rest`), or all of it where no micro-batch comes first (`FirstPart::Whole`), against the
/// same segment stepped whole (`step_segment`, then `zero_segment`): parameters, moments and
/// master weights bit for bit after each step, in fp32, fp16 and bf16. After the first part the
/// named rows and the tail are the whole step's and every other row is as it was. Tables of
/// rows 7 and 8 wide (every chunk of four inside a row, or some across the decaying ranges'
/// bounds), tokens repeating rows, naming the first and last rows, every row, one row, none.
#[test]
fn the_word_embeddings_rows_first_then_the_rest_are_the_whole_step() {
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::Backend;
    use recipe_runtime::optim::device::{DeviceOptimizer, FirstPart};

    let n = 257;
    let (entries, flags) = optim_layout(n);
    let segs = [0..200, 200..n];
    let batches: [&[u32]; 6] = [
        &[3, 3, 0, 19, 3, 7],
        &[
            19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
        ],
        &[5],
        &[],
        &[2, 11, 2, 11, 2],
        &[0, 0, 0, 0],
    ];
    for module in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        for row_len in [7, 8] {
            let what = format!("{module:?} rows of {row_len}");
            let k = Kernels::new(Emu).with_store(module);
            let dev = k.device();
            let rows = 20;
            let mut p0 = rand(n, 1.0, 11);
            module.round_slice(&mut p0);
            let master = module.is_half().then_some(&p0[..]);
            let mut opt =
                Optimizer::from(Adam::new(AdamConfig::adamw(0.1), &entries, &flags).unwrap());
            let new = || DeviceOptimizer::new(&k, &opt, master, n, 0..n).unwrap();
            let (mut whole, mut split) = (new(), new());
            assert!(whole.by_segments(&k, &opt, &segs) && split.by_segments(&k, &opt, &segs));
            assert!(split.rows_first(&k, &opt, rows, row_len), "{what}");
            assert!(
                !split.rows_first(&k, &opt, 29, row_len),
                "{what}: a table past the segment"
            );
            assert!(split.rows_first(&k, &opt, rows, row_len));
            let (mut pw, mut ps) = (k.upload(&p0), k.upload(&p0));
            let read = |b: &<Kernels<Emu> as Backend>::Buf| {
                let mut x = vec![0.0f32; n];
                k.download(k.view(b), &mut x);
                x
            };
            for (step, ids) in batches.iter().enumerate() {
                let what = format!("{what} step {step} ids {ids:?}");
                let (lr, mult) = (1e-2 * (step + 1) as f64, [1.0, 0.75][step % 2]);
                let g = grads(n, step);
                for o in [&mut whole, &mut split] {
                    o.zero_grads(&k);
                    k.write(k.view_mut(o.grads_mut()), &g);
                }
                let seg0 = whole.segment(0);
                whole
                    .step_segment(
                        &k,
                        dev.range_mut(&mut pw, seg0.clone()),
                        &opt,
                        lr,
                        (mult, 1.0),
                        0,
                    )
                    .unwrap();
                whole.zero_segment(&k, 0);
                let d = split
                    .defer_first(&opt, lr, (mult, 1.0))
                    .expect("AdamW puts it off");
                let before = read(&ps);
                if step == 4 {
                    // No micro-batch comes first: the step whole.
                    let p = dev.range_mut(&mut ps, seg0.clone());
                    split.step_first(&k, p, &d, FirstPart::Whole).unwrap();
                } else {
                    let on = k.upload_ids(ids);
                    let p = dev.range_mut(&mut ps, seg0.clone());
                    let part = FirstPart::Rows(&on, ids.len());
                    split.step_first(&k, p, &d, part).unwrap();
                    let (mid, want) = (read(&ps), read(&pw));
                    for i in 0..seg0.end {
                        let named = i >= rows * row_len || ids.contains(&((i / row_len) as u32));
                        let expect = if named { want[i] } else { before[i] };
                        assert_eq!(
                            mid[i].to_bits(),
                            expect.to_bits(),
                            "{what}: element {i} after the first part (named {named})"
                        );
                    }
                    let p = dev.range_mut(&mut ps, seg0.clone());
                    let part = FirstPart::Rest(&on, ids.len());
                    split.step_first(&k, p, &d, part).unwrap();
                }
                for (o, p) in [(&mut whole, &mut pw), (&mut split, &mut ps)] {
                    let r = o.segment(1);
                    o.step_segment(&k, dev.range_mut(p, r), &opt, lr, (mult, 1.0), 1)
                        .unwrap();
                }
                opt.count_step();
                same_bits(&format!("{what} weights"), &read(&ps), &read(&pw));
                let (mut a, mut b) = (opt.clone(), opt.clone());
                let (mut wa, mut wb) = (vec![0.0f32; n], vec![0.0f32; n]);
                whole.download(&k, &mut a, Some(&mut wa)).unwrap();
                split.download(&k, &mut b, Some(&mut wb)).unwrap();
                let (a, b) = (a.state(), b.state());
                for name in ["exp_avg", "exp_avg_sq"] {
                    same_bits(&format!("{what} {name}"), b.buffer(name), a.buffer(name));
                }
                if module.is_half() {
                    same_bits(&format!("{what} master"), &wb, &wa);
                }
                let zeroed = read(split.grads_mut());
                assert!(
                    zeroed[..200].iter().all(|&x| x == 0.0),
                    "{what}: gradient not zeroed"
                );
            }
        }
    }
}
