//! The device optimizer against the host optimizer: see [`compare_optim`].

use super::{rand, OpCheck};
use crate::backend::device::Device;
use crate::backend::kernels::{adamw_step, grad_norm_sq, grad_norm_sq_blocks, DecayMask, Kernels};
use crate::backend::Backend;
use crate::optim::device::{DeviceOptimizer, FirstPart};
use crate::optim::{
    self, Adagrad, AdagradConfig, AdagradImpl, Adam, AdamConfig, GradScale, Lamb, LambConfig,
    Optimizer, Sgd, SgdConfig, WeightDecay,
};
use crate::params::Entry;
use crate::precision::{self, Dtype};
use crate::zero::HostOptimizer;

/// Relative bound on `Σ g²` summed in another order than the host's: both orders are within
/// `(n − 1) · 2⁻⁵³` of the exact sum of `n` terms, so `n · 2⁻⁵²` apart (2.2e-13 at the size
/// checked here); 1e-12 leaves room and still fails on a single lost or doubled term.
pub const NORM_SQ_TOLERANCE: f64 = 1e-12;

/// Relative bound on the f32 norm `√Σg²`: one f32 ulp, where `Σ g²` sits within the bound above
/// of a rounding boundary of its square root (the same bits otherwise).
pub const NORM_TOLERANCE: f64 = f32::EPSILON as f64;

/// Elements of the optimizer checks: off every multiple of 32 and 256.
const OPTIM_N: usize = 1000;

/// `n` elements as four tensors named so that HF's no-decay rule decays only the two weights (a
/// sub-range: `[0, n/2)` and the last tensor); one decayed weight for `n = 1`. The layout of
/// these checks and of runtime/emu/tests/optim.rs.
#[doc(hidden)]
pub fn optim_layout(n: usize) -> (Vec<Entry>, Vec<bool>) {
    if n == 1 {
        let e = Entry {
            name: "w.weight".into(),
            shape: vec![1],
            offset: 0,
        };
        return (vec![e], vec![true]);
    }
    let a = n / 2;
    let b = (n / 8).max(1);
    let c = (n - a - b) / 2;
    let d = n - a - b - c;
    let mut entries = Vec::new();
    let mut at = 0;
    for (name, len) in [
        ("l0.dense.weight", a),
        ("l0.dense.bias", b),
        ("l0.LayerNorm.weight", c),
        ("l1.dense.weight", d),
    ] {
        if len > 0 {
            entries.push(Entry {
                name: name.into(),
                shape: vec![len],
                offset: at,
            });
            at += len;
        }
    }
    let decay = entries
        .iter()
        .map(|e| !optim::hf_no_decay(&e.name))
        .collect();
    (entries, decay)
}

/// The gradient of step `k`: random (rounded to `store`), with some exact zeros.
fn optim_grads(n: usize, k: usize, store: Dtype) -> Vec<f32> {
    let mut g = rand(n, 0.5 + k as f32, 60 + k as u64, Dtype::F32);
    for x in g.iter_mut().skip(3).step_by(7) {
        *x = 0.0;
    }
    store.round_slice(&mut g);
    g
}

/// One comparison of a buffer: the error as [`compare`]'s (largest difference over the largest
/// reference value); a tolerance of 0 asks for the same bits, element by element.
fn buffer_check(op: &str, store: Dtype, got: &[f32], want: &[f32], tol: f64) -> OpCheck {
    let scale = want.iter().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
    let (mut worst, mut finite_agree, mut same_bits) = (0.0f64, true, true);
    for (&g, &w) in got.iter().zip(want) {
        same_bits &= g.to_bits() == w.to_bits();
        if g.is_finite() != w.is_finite() {
            finite_agree = false;
        } else if w.is_finite() {
            worst = worst.max(f64::from((g - w).abs()));
        }
    }
    let error = if scale > 0.0 { worst / scale } else { worst };
    let ok = finite_agree && got.len() == want.len() && error <= tol && (tol > 0.0 || same_bits);
    OpCheck {
        op: op.to_string(),
        store,
        error: if ok || error > 0.0 {
            error
        } else {
            f64::INFINITY
        },
        tolerance: tol,
        ok,
    }
}

/// One comparison of a scalar, relative to `|want|`; a tolerance of 0 asks for the same bits.
fn scalar_check(op: &str, store: Dtype, got: f64, want: f64, tol: f64) -> OpCheck {
    let diff = (got - want).abs();
    let error = if want != 0.0 { diff / want.abs() } else { diff };
    // (The device's empty sum is +0.0 where Rust's is −0.0: equal values.)
    let ok = error <= tol && (tol > 0.0 || got.to_bits() == (want + 0.0).to_bits());
    OpCheck {
        op: op.to_string(),
        store,
        error: if ok || error > 0.0 {
            error
        } else {
            f64::INFINITY
        },
        tolerance: tol,
        ok,
    }
}

/// Checks of the same op over several steps as one row: the worst error, ok when every step is.
fn merge(checks: Vec<OpCheck>) -> Vec<OpCheck> {
    let mut out: Vec<OpCheck> = Vec::new();
    for c in checks {
        match out.iter_mut().find(|o| o.op == c.op) {
            Some(o) => {
                o.error = o.error.max(c.error);
                o.ok &= c.ok;
            }
            None => out.push(c),
        }
    }
    out
}

/// The device optimizer (`runtime/kernels/optim.cu` through `kernels/optim.rs`) against the host
/// optimizer, on [`OPTIM_N`] elements: what `recipe kernels --selftest` adds to [`compare`].
/// `store` must be the kernels' storage dtype (what [`Kernels::with_store`] set): it decides the
/// rounding of the half working copy, checked when it is fp16 or bf16.
///
/// - `optim.grad_norm_sq` (and `.strided`: three first-pass blocks, so each thread loops over
///   several elements): `Σ g²` of values spread over 40 binades against
///   [`optim::sum_squares`], within [`NORM_SQ_TOLERANCE`] relative (another summation order;
///   FMA contraction changes nothing: each `g²` is exact in f64). `optim.grad_norm`: its f32
///   square root, within [`NORM_TOLERANCE`]. `optim.grad_norm_sq.exact`: values whose every
///   partial sum is exact, so the **same bits** in any order. `optim.grad_norm_sq.nonfinite`: an
///   inf (and a NaN) gradient gives an inf (a NaN) sum, the overflow check.
/// - `optim.adamw.*` (decoupled decay on a sub-range, each step's gradient clipped by the host's
///   `clip_grad_norm` coefficient, < 1) and `optim.adam_l2.*` (L2 decay, other betas and eps, a
///   multiplier < 1): two steps each, parameters and both moments after every step, against
///   [`Optimizer::step_scaled`] — the **same bits** (tolerance 0): the kernel's arithmetic is
///   adam.rs's operation for operation, with `__f*_rn` intrinsics on a GPU so NVRTC cannot fuse
///   them, and IEEE f32 operations round the same everywhere.
/// - `optim.mixed.*` (half stores only): the mixed-precision step as `HostOptimizer` takes it —
///   gradients at a loss scale, `f32(1 / combined scale)` as the multiplier, fp32 master weights
///   and the half working copy rounded from them — the same bits too.
/// - `optim.sgd.*` (momentum, Nesterov, decay), `optim.adagrad.*` (torch's) and `optim.lamb.*`
///   (FusedLamb's, its per-tensor trust ratios included): two steps each through the resident
///   optimizer the training loop runs ([`DeviceOptimizer`]) against `HostOptimizer`, a multiplier
///   < 1 in fp32, DeepSpeed's combined scale under a half store (fp32 master and half working
///   copy) — the same bits: sgd.rs's and adagrad.rs's `mul_add` are `__fmaf_rn` on the device,
///   and LAMB's f32 norms add in lamb.rs's order.
/// - `optim.adamw_rows.*`: AdamW by segments, the first one's table in two parts (the word
///   embeddings' rows first: `DeviceOptimizer::rows_first`, the rows some tokens name, each
///   once, then the rest), against `HostOptimizer`'s whole step — the same bits.
pub fn compare_optim<D: Device>(k: &Kernels<D>, store: Dtype) -> Vec<OpCheck> {
    compare_optim_against(k, store, 1.0)
}

/// [`compare_optim`] with the host's Adam steps taken at `host_lr_factor` times the device's
/// learning rate: 1 is the self-test; anything else must fail it (how the tests show that the
/// check can fail).
#[doc(hidden)]
pub fn compare_optim_against<D: Device>(
    k: &Kernels<D>,
    store: Dtype,
    host_lr_factor: f64,
) -> Vec<OpCheck> {
    let mut out = norm_checks(k, store);
    out.extend(adam_checks(k, store, host_lr_factor));
    if store.is_half() {
        out.extend(mixed_checks(k, store, host_lr_factor));
    }
    out.extend(resident_checks(k, store, host_lr_factor));
    out.extend(rows_first_checks(k, store, host_lr_factor));
    out
}

fn norm_checks<D: Device>(k: &Kernels<D>, store: Dtype) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let sq = |g: &[f32], cap: Option<usize>| {
        let b = dev.upload(g);
        match cap {
            Some(c) => grad_norm_sq_blocks(k, dev.view(&b), c),
            None => grad_norm_sq(k, dev.view(&b)),
        }
    };
    let mut out = Vec::new();
    let spread: Vec<f32> = rand(n, 1.0, 50, Dtype::F32)
        .iter()
        .zip(rand(n, 1.0, 51, Dtype::F32))
        .map(|(x, e)| x * 2f32.powi((e * 20.0) as i32))
        .collect();
    let want = optim::sum_squares(&spread);
    let got = sq(&spread, None);
    out.push(scalar_check(
        "optim.grad_norm_sq",
        store,
        got,
        want,
        NORM_SQ_TOLERANCE,
    ));
    out.push(scalar_check(
        "optim.grad_norm",
        store,
        f64::from(got.sqrt() as f32),
        f64::from(want.sqrt() as f32),
        NORM_TOLERANCE,
    ));
    out.push(scalar_check(
        "optim.grad_norm_sq.strided",
        store,
        sq(&spread, Some(3)),
        want,
        NORM_SQ_TOLERANCE,
    ));
    // Multiples of 2⁻¹⁰ up to 2 in magnitude: the squares are multiples of 2⁻²⁰ and their sum
    // stays below 2¹³, so every partial sum is exact.
    let exact: Vec<f32> = rand(n, 1.0, 52, Dtype::F32)
        .iter()
        .map(|x| (x * 2048.0).round() / 1024.0)
        .collect();
    out.push(scalar_check(
        "optim.grad_norm_sq.exact",
        store,
        sq(&exact, None),
        optim::sum_squares(&exact),
        0.0,
    ));
    let mut nonfinite_ok = true;
    for bad in [f32::INFINITY, f32::NAN] {
        let mut g = exact.clone();
        g[n / 2 + 1] = bad;
        let s = sq(&g, None);
        nonfinite_ok &= !s.is_finite() && s.is_nan() == bad.is_nan();
        nonfinite_ok &= precision::has_inf_or_nan(&g);
    }
    out.push(OpCheck {
        op: "optim.grad_norm_sq.nonfinite".into(),
        store,
        error: if nonfinite_ok { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
        ok: nonfinite_ok,
    });
    out
}

/// The device's optimizer buffers: parameters (the fp32 master under mixed precision), moments.
struct DeviceAdam<D: Device> {
    p: D::Buf,
    m: D::Buf,
    v: D::Buf,
}

impl<D: Device> DeviceAdam<D> {
    fn new(dev: &D, p0: &[f32]) -> DeviceAdam<D> {
        let zeros = vec![0.0f32; p0.len()];
        DeviceAdam {
            p: dev.upload(p0),
            m: dev.upload(&zeros),
            v: dev.upload(&zeros),
        }
    }

    fn download(dev: &D, b: &D::Buf) -> Vec<f32> {
        let mut out = vec![0.0; dev.len(dev.view(b))];
        dev.download(dev.view(b), &mut out);
        out
    }

    /// Step `t` (from 1) of the device optimizer on gradients `g` (uploaded here), scaled by
    /// `mult`, writing the rounded working copy into `work` when given.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        k: &Kernels<D>,
        cfg: &AdamConfig,
        t: u64,
        lr: f64,
        mult: f32,
        mask: &DecayMask<D>,
        g: &[f32],
        work: Option<&mut D::Buf>,
    ) {
        let dev = k.device();
        let gb = dev.upload(g);
        adamw_step(
            k,
            cfg,
            t,
            lr,
            mult,
            mask,
            dev.view_mut(&mut self.p),
            dev.view(&gb),
            dev.view_mut(&mut self.m),
            dev.view_mut(&mut self.v),
            work.map(|w| dev.view_mut(w)),
        )
        .expect("a device step");
    }
}

/// AdamW with clipping and Adam with L2 decay, two steps each, against the host's `Optimizer`.
fn adam_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let mask =
        DecayMask::new(k, &entries, &flags, std::slice::from_ref(&(0..n))).expect("a valid layout");
    let l2 = AdamConfig {
        beta1: 0.8,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay: 0.1,
        mode: WeightDecay::L2,
        bias_correction: true,
    };
    let mut out = Vec::new();
    for (name, cfg, lr0, clip) in [
        ("optim.adamw", AdamConfig::adamw(0.01), 1e-3, true),
        ("optim.adam_l2", l2, 3e-3, false),
    ] {
        let mut host = Optimizer::from(Adam::new(cfg, &entries, &flags).expect("a valid layout"));
        let p0 = rand(n, 1.0, 53, Dtype::F32);
        let mut hp = p0.clone();
        let mut d = DeviceAdam::<D>::new(dev, &p0);
        let mut checks = Vec::new();
        for step in 0..2 {
            let g = optim_grads(n, step, Dtype::F32);
            let lr = lr0 * (1 + step) as f64;
            let mut hg = g.clone();
            // The multiplier, < 1 either way: fp32 clipping's coefficient (the gradients' norm
            // is about 9 here), or an unscale factor.
            let mult = if clip {
                let norm = optim::sum_squares(&g).sqrt() as f32;
                optim::clip_coef(norm, 1.0).expect("the gradients are clipped")
            } else {
                0.37
            };
            let scale = GradScale {
                unscale: mult,
                combined: None,
            };
            host.step_scaled(&mut hp, &mut hg, lr * host_lr_factor, scale)
                .expect("a host step");
            d.step(k, &cfg, step as u64 + 1, lr, mult, &mask, &g, None);
            let state = host.state();
            for (what, buf, want) in [
                ("param", &d.p, &hp[..]),
                ("exp_avg", &d.m, state.buffer("exp_avg")),
                ("exp_avg_sq", &d.v, state.buffer("exp_avg_sq")),
            ] {
                let got = DeviceAdam::<D>::download(dev, buf);
                checks.push(buffer_check(
                    &format!("{name}.{what}"),
                    store,
                    &got,
                    want,
                    0.0,
                ));
            }
        }
        out.extend(merge(checks));
    }
    out
}

/// The mixed-precision step: half gradients at a loss scale, the fp32 master and the half working
/// copy (rounded to `store` by the kernel, into a stored buffer), against `HostOptimizer`.
fn mixed_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let mask =
        DecayMask::new(k, &entries, &flags, std::slice::from_ref(&(0..n))).expect("a valid layout");
    let cfg = AdamConfig::adamw(0.01);
    let p0 = rand(n, 1.0, 54, store);
    let adam = Adam::new(cfg, &entries, &flags).expect("a valid layout");
    let mut host = HostOptimizer::new(adam, false, store, &p0);
    let mut hp = p0.clone();
    let mut d = DeviceAdam::<D>::new(dev, &p0);
    // The half parameters as the model keeps them when the device steps them (16 bits on a GPU
    // storing fp16/bf16).
    let mut work = k.alloc_stored(n);
    k.write(k.view_mut(&mut work), &p0);
    let loss_scale = 1024.0f64;
    let mut checks = Vec::new();
    for step in 0..2 {
        let mut g: Vec<f32> = optim_grads(n, step, Dtype::F32)
            .iter()
            .map(|x| x * loss_scale as f32)
            .collect();
        store.round_slice(&mut g);
        let combined = precision::combined_scale(loss_scale, optim::sum_squares(&g).sqrt(), 1.0);
        let unscale = (1.0 / combined) as f32;
        let lr = 1e-3 * (1 + step) as f64;
        host.step(&mut hp, &mut g.clone(), lr * host_lr_factor, unscale)
            .expect("a host step");
        d.step(
            k,
            &cfg,
            step as u64 + 1,
            lr,
            unscale,
            &mask,
            &g,
            Some(&mut work),
        );
        let state = host.state();
        for (what, buf, want) in [
            ("master", &d.p, &state.master[..]),
            ("work", &work, &hp[..]),
            ("exp_avg", &d.m, state.buffer("exp_avg")),
            ("exp_avg_sq", &d.v, state.buffer("exp_avg_sq")),
        ] {
            let got = DeviceAdam::<D>::download(dev, buf);
            checks.push(buffer_check(
                &format!("optim.mixed.{what}"),
                store,
                &got,
                want,
                0.0,
            ));
        }
    }
    merge(checks)
}

/// True gradients `g` as the step of a run storing `store` receives them, and the scale they
/// carry: under a half store at loss scale `loss_scale` (rounded to `store`), with DeepSpeed's
/// combined scale `loss_scale / mult`; in fp32 unscaled, `mult` the multiplier (a clip
/// coefficient). These checks' inputs and runtime/emu/tests/optim.rs's.
#[doc(hidden)]
pub fn scaled_step_inputs(
    g: &[f32],
    store: Dtype,
    loss_scale: f32,
    mult: f32,
) -> (Vec<f32>, GradScale) {
    if !store.is_half() {
        let scale = GradScale {
            unscale: mult,
            combined: None,
        };
        return (g.to_vec(), scale);
    }
    let combined = f64::from(loss_scale) / f64::from(mult);
    let mut g: Vec<f32> = g.iter().map(|x| x * loss_scale).collect();
    store.round_slice(&mut g);
    let scale = GradScale {
        unscale: (1.0 / combined) as f32,
        combined: Some(combined),
    };
    (g, scale)
}

/// SGD, Adagrad and LAMB through [`DeviceOptimizer`] (see [`compare_optim`]).
fn resident_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let valid = "a valid layout";
    let cases = [
        (
            "optim.sgd",
            Optimizer::from(
                Sgd::new(SgdConfig::new(0.9, true, 0.01), &entries, &flags).expect(valid),
            ),
            5e-2,
        ),
        (
            "optim.adagrad",
            Optimizer::from(
                Adagrad::new(
                    AdagradConfig::new(1e-10, 0.01, AdagradImpl::Torch),
                    &entries,
                    &flags,
                )
                .expect(valid),
            ),
            1e-2,
        ),
        (
            "optim.lamb",
            Optimizer::from(
                Lamb::new(LambConfig::fused_lamb(0.01), &entries, &flags).expect(valid),
            ),
            1e-2,
        ),
    ];
    let mut out = Vec::new();
    for (name, opt, lr0) in cases {
        let p0 = rand(n, 1.0, 55, store);
        let mut host = HostOptimizer::new(opt.clone(), false, store, &p0);
        let mut hp = p0.clone();
        let master = store.is_half().then(|| p0.clone());
        let mut dopt = opt;
        let mut d =
            DeviceOptimizer::new(k, &dopt, master.as_deref(), n, 0..n).expect("a device optimizer");
        let mut params = dev.upload(&p0);
        let mut checks = Vec::new();
        for step in 0..2 {
            let lr = lr0 * (1 + step) as f64;
            let g = optim_grads(n, step, Dtype::F32);
            let (g, scale) = scaled_step_inputs(&g, store, 1024.0, 0.37);
            host.step_scaled(&mut hp, &mut g.clone(), lr * host_lr_factor, scale)
                .expect("a host step");
            dev.write(dev.view_mut(d.grads_mut()), &g);
            d.step(
                k,
                dev.view_mut(&mut params),
                &dopt,
                lr,
                dopt.grad_factors(scale),
            )
            .expect("a device step");
            dopt.count_step();
            let ours = (&d, &mut dopt, &params);
            checks.extend(state_checks(k, name, store, ours, (&host, &hp)));
        }
        out.extend(merge(checks));
    }
    out
}

/// AdamW's first segment in two parts (see [`compare_optim`]): two steps, tokens repeating
/// rows and naming the first and the last.
fn rows_first_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let opt = Optimizer::from(
        Adam::new(AdamConfig::adamw(0.01), &entries, &flags).expect("a valid layout"),
    );
    let p0 = rand(n, 1.0, 57, store);
    let mut host = HostOptimizer::new(opt.clone(), false, store, &p0);
    let mut hp = p0.clone();
    let master = store.is_half().then(|| p0.clone());
    let mut dopt = opt;
    let mut d =
        DeviceOptimizer::new(k, &dopt, master.as_deref(), n, 0..n).expect("a device optimizer");
    // A table of rows 7 wide (chunks of four across rows and the decaying ranges' bounds)
    // followed by more of the segment, then a second segment.
    let segs = [0..750, 750..n];
    let (rows, row_len) = (100, 7);
    assert!(d.by_segments(k, &dopt, &segs) && d.rows_first(k, &dopt, rows, row_len));
    let mut params = dev.upload(&p0);
    let mut checks = Vec::new();
    for (step, ids) in [vec![1u32, 1, 0, 99, 3, 1], vec![2, 5, 2, 71]]
        .into_iter()
        .enumerate()
    {
        let lr = 1e-2 * (1 + step) as f64;
        let g = optim_grads(n, step, Dtype::F32);
        let (g, scale) = scaled_step_inputs(&g, store, 1024.0, 0.37);
        host.step_scaled(&mut hp, &mut g.clone(), lr * host_lr_factor, scale)
            .expect("a host step");
        dev.write(dev.view_mut(d.grads_mut()), &g);
        let factors = dopt.grad_factors(scale);
        let first = d
            .defer_first(&dopt, lr, factors)
            .expect("AdamW's step put off");
        let on = dev.upload_ids(&ids);
        for part in [
            FirstPart::Rows(&on, ids.len()),
            FirstPart::Rest(&on, ids.len()),
        ] {
            d.step_first(k, dev.range_mut(&mut params, segs[0].clone()), &first, part)
                .expect("a device step");
        }
        d.step_segment(
            k,
            dev.range_mut(&mut params, segs[1].clone()),
            &dopt,
            lr,
            factors,
            1,
        )
        .expect("a device step");
        dopt.count_step();
        let ours = (&d, &mut dopt, &params);
        checks.extend(state_checks(
            k,
            "optim.adamw_rows",
            store,
            ours,
            (&host, &hp),
        ));
    }
    merge(checks)
}

/// The device optimizer's outputs after a step against the host optimizer's, as `NAME.WHAT`
/// checks with no tolerance: the parameters (`param`, or `work`, the half copy, and `master`
/// under a half store), each state buffer, and LAMB's trust ratios. `dopt` is the host-side
/// optimizer the device's state is downloaded into.
fn state_checks<D: Device>(
    k: &Kernels<D>,
    name: &str,
    store: Dtype,
    (d, dopt, params): (&DeviceOptimizer<D>, &mut Optimizer, &D::Buf),
    (host, hp): (&HostOptimizer, &[f32]),
) -> Vec<OpCheck> {
    let dev = k.device();
    let n = hp.len();
    let mut w = vec![0.0f32; n];
    d.download(k, dopt, Some(&mut w)).expect("the device state");
    let mut got = vec![0.0f32; n];
    dev.download(dev.view(params), &mut got);
    let want = host.state();
    let param = if store.is_half() { "work" } else { "param" };
    let mut rows = vec![(param, got, hp.to_vec())];
    if store.is_half() {
        rows.push(("master", w, want.master.clone()));
    }
    let have = dopt.state();
    for (b, x) in &want.buffers {
        rows.push((b.as_str(), have.buffer(b).to_vec(), x.clone()));
    }
    let ratios = |o: &Optimizer| match o {
        Optimizer::Lamb(l) => l.coefficients().to_vec(),
        _ => Vec::new(),
    };
    if matches!(dopt, Optimizer::Lamb(_)) {
        rows.push(("trust_ratio", ratios(dopt), ratios(host.optimizer())));
    }
    rows.into_iter()
        .map(|(what, got, want)| buffer_check(&format!("{name}.{what}"), store, &got, &want, 0.0))
        .collect()
}
