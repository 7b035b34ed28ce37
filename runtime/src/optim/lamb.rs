//! LAMB as DeepSpeed 0.19.8's FusedLamb computes it: `type: "Lamb"` builds
//! `deepspeed.ops.lamb.FusedLamb` (`engine.py` `_configure_basic_optimizer`), whose CUDA kernel
//! (`csrc/lamb/fused_lamb_cuda_kernel.cu`, `fused_lamb_cuda`) updates one tensor per call:
//!
//! ```text
//! part 1, per element:  s = g / grad_scale
//!                       m ← β₁·m + (1 − β₁)·s;   v ← β₂·v + (1 − β₂)·s·s
//!                       u = m / (√v + eps) + wd·p          (eps outside the root: eps_mode 1)
//!                       per-thread partial sums of p² and u², a 512-wide tree per block
//! part 2:               a 512-wide tree over the blocks' sums
//! part 3:               ‖w‖ = √Σp², ‖u‖ = √Σu²
//!                       r = 1 if either is 0, else clamp(‖w‖/‖u‖, min_coeff, max_coeff)
//!                       p ← p − (step_size·r)·u
//! step_size = lr·√(1 − β₂ᵗ)/(1 − β₁ᵗ) (lr with bias_correction off), in f32 from f32 β's
//! ```
//!
//! Everything is f32 in the kernel's order, including the sums: 512 threads per block,
//! `min(⌈n/512⌉, 512)` blocks, thread `t` summing elements `t, t + T, …` (`T` all threads), then
//! halving trees (bit-identical to the transcription in `reference/make_optim_fixtures.py`, see
//! `tests/optim.rs`). The one thing not reproduced is nvcc's contraction of `a·b + c` into FMAs,
//! which cannot be known without the compiled kernel: about an ulp per operation.
//!
//! The kernel's other inputs are FusedLamb's defaults where the recipe has no key:
//! `eps_inside_sqrt = False`, `max_grad_norm = 0` (DeepSpeed clips before the step);
//! `max_coeff` 10 and `min_coeff` 0.01 unless the recipe sets them.

use std::ops::Range;

use super::{
    check_betas, check_step, layout, non_negative, partition, whole, OptimError, OptimState,
    Segments,
};
use crate::par;
use crate::params::Entry;

/// The state family name.
pub(crate) const FAMILY: &str = "lamb";
/// FusedLamb's moments, as it names them.
pub(crate) const BUFFERS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// FusedLamb's default upper bound of the trust ratio (`fused_lamb.py`).
pub const DEFAULT_MAX_COEFF: f64 = 10.0;
/// FusedLamb's default lower bound of the trust ratio (`fused_lamb.py`).
pub const DEFAULT_MIN_COEFF: f64 = 0.01;

/// Threads per block of the kernel (`threadsPerBlock`), also its largest block count.
pub(crate) const THREADS: usize = 512;

/// LAMB hyper-parameters (the learning rate is passed per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the square root of the second moment.
    pub eps: f64,
    /// Added to the update as `wd·p` for the tensors flagged for decay.
    pub weight_decay: f64,
    /// Scale the step by `√(1 − β₂ᵗ)/(1 − β₁ᵗ)`.
    pub bias_correction: bool,
    /// Upper bound of the trust ratio.
    pub max_coeff: f64,
    /// Lower bound of the trust ratio.
    pub min_coeff: f64,
}

impl LambConfig {
    /// FusedLamb's defaults (betas 0.9/0.999, eps 1e-8, bias correction, coefficients in
    /// [0.01, 10]) with weight decay `wd`.
    pub fn fused_lamb(weight_decay: f64) -> LambConfig {
        LambConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            bias_correction: true,
            max_coeff: DEFAULT_MAX_COEFF,
            min_coeff: DEFAULT_MIN_COEFF,
        }
    }

    fn check(&self) -> Result<(), OptimError> {
        check_betas(self.beta1, self.beta2)?;
        non_negative("eps", self.eps)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("max_coeff", self.max_coeff)?;
        non_negative("min_coeff", self.min_coeff)?;
        if self.min_coeff > self.max_coeff {
            return Err(OptimError::Config(format!(
                "min_coeff {} is above max_coeff {}",
                self.min_coeff, self.max_coeff
            )));
        }
        Ok(())
    }
}

/// One step's f32 scalars, as lamb.rs's loop and the device's `lamb_*` kernels (kernels/optim.cu)
/// both take them: formed in one place so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambScalars {
    /// `β₁`, `β₂` (the kernel's C floats).
    pub b1: f32,
    /// `β₂`.
    pub b2: f32,
    /// `1 − β₁`, in f32.
    pub w1: f32,
    /// `1 − β₂`, in f32.
    pub w2: f32,
    /// `lr·√(1 − β₂ᵗ)/(1 − β₁ᵗ)`, or `lr` without bias correction.
    pub step_size: f32,
    /// `eps`.
    pub eps: f32,
    /// The group's weight decay (applied to the decaying tensors).
    pub wd: f32,
    /// Upper bound of the trust ratio.
    pub max_coeff: f32,
    /// Lower bound of the trust ratio.
    pub min_coeff: f32,
}

impl LambConfig {
    /// The scalars of step `t` (1 first) at learning rate `lr`.
    pub fn scalars(&self, t: u64, lr: f64) -> LambScalars {
        // The kernel's scalars are C floats; `std::pow(float, int)` is computed in double.
        let (b1, b2) = (self.beta1 as f32, self.beta2 as f32);
        let lr32 = lr as f32;
        let step_size = if self.bias_correction {
            let t = t as f64;
            let bc1 = (1.0 - f64::from(b1).powf(t)) as f32;
            let bc2 = (1.0 - f64::from(b2).powf(t)) as f32;
            lr32 * bc2.sqrt() / bc1
        } else {
            lr32
        };
        LambScalars {
            b1,
            b2,
            w1: 1.0 - b1,
            w2: 1.0 - b2,
            step_size,
            eps: self.eps as f32,
            wd: self.weight_decay as f32,
            max_coeff: self.max_coeff as f32,
            min_coeff: self.min_coeff as f32,
        }
    }
}

/// LAMB over a whole flat parameter buffer, one trust ratio per tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Lamb {
    config: LambConfig,
    state: OptimState,
    /// One per tensor: the trust ratio's norms run over each.
    segments: Segments,
    /// The trust ratio each tensor got at the last step (FusedLamb's `lamb_coeffs`).
    coeffs: Vec<f32>,
}

impl Lamb {
    /// LAMB for a buffer laid out as `entries`; `decay[i]` says whether `entries[i]` decays.
    pub fn new(config: LambConfig, entries: &[Entry], decay: &[bool]) -> Result<Lamb, OptimError> {
        Self::shard(
            config,
            entries,
            decay,
            std::slice::from_ref(&whole(entries)),
        )
    }

    /// LAMB over `ranges` of the buffer, which must be all of it: the trust ratio needs each
    /// tensor's whole norm, and DeepSpeed's ZeRO optimizers hand FusedLamb each rank's flattened
    /// partition as one tensor instead (a ratio per partition), which is not emulated.
    pub fn shard(
        config: LambConfig,
        entries: &[Entry],
        decay: &[bool],
        ranges: &[Range<usize>],
    ) -> Result<Lamb, OptimError> {
        config.check()?;
        let (full, total) = layout(entries, decay)?;
        let (segments, n) = partition(&full, total, ranges)?;
        if n != total {
            return Err(OptimError::Config(format!(
                "LAMB runs over whole tensors: a partition of {n} of the {total} parameters is not supported"
            )));
        }
        Ok(Lamb {
            config,
            state: OptimState::new(FAMILY, n, &BUFFERS, 0.0),
            coeffs: vec![1.0; segments.len()],
            segments,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LambConfig {
        &self.config
    }

    /// The trust ratio of each tensor at the last step (1 before the first).
    pub fn coefficients(&self) -> &[f32] {
        &self.coeffs
    }

    /// The trust ratios of a step taken elsewhere (the device's `lamb_coeff`), one per tensor.
    pub fn set_coefficients(&mut self, coeffs: &[f32]) -> Result<(), OptimError> {
        if coeffs.len() != self.coeffs.len() {
            return Err(OptimError::Length {
                what: "trust ratios",
                found: coeffs.len(),
                expected: self.coeffs.len(),
            });
        }
        self.coeffs.copy_from_slice(coeffs);
        Ok(())
    }

    /// Replaces the state with a saved one (same family and length).
    pub fn load_state(&mut self, s: OptimState) -> Result<(), OptimError> {
        s.check_fits(FAMILY, &BUFFERS, self.state.len)?;
        self.state = s;
        Ok(())
    }

    /// Sets (β₁, β₂) for the next steps (DeepSpeed's `OneCycle` writes the group's `betas`, which
    /// FusedLamb reads every step, bias correction included).
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), OptimError> {
        check_betas(beta1, beta2)?;
        self.config.beta1 = beta1;
        self.config.beta2 = beta2;
        Ok(())
    }

    /// One update with true gradients (`grad_scale` 1).
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        self.step_with_scale(params, grads, lr, 1.0)
    }

    /// One update with gradients that the kernel divides by `grad_scale` (the combined loss
    /// scale and clipping factor `FP16_UnfusedOptimizer.step_fused_lamb` passes under fp16).
    pub fn step_with_scale(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        grad_scale: f32,
    ) -> Result<(), OptimError> {
        self.step_with_scale_on(params, grads, lr, grad_scale, 1)
    }

    /// [`Lamb::step_with_scale`] on up to `threads` threads ([`crate::par`]), the same bits:
    /// each tensor's moments and update, its two norms (each of FusedLamb's partial sums is
    /// still one thread's, over its elements in order) and its parameters' update are split
    /// over the threads; the tensors go one after another.
    pub fn step_with_scale_on(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        grad_scale: f32,
        threads: usize,
    ) -> Result<(), OptimError> {
        check_step(self.state.len, params, grads, lr)?;
        if !(grad_scale > 0.0 && grad_scale.is_finite()) {
            return Err(OptimError::Config(format!("gradient scale {grad_scale}")));
        }
        self.state.step += 1;
        let LambScalars {
            b1,
            b2,
            w1,
            w2,
            step_size,
            eps,
            wd,
            max_coeff,
            min_coeff,
        } = self.config.scalars(self.state.step, lr);
        let [m, v] = BUFFERS.map(|n| {
            self.state
                .buffers
                .remove(n)
                .expect("LAMB's state has both moments")
        });
        let (mut m, mut v) = (m, v);
        let mut update = Vec::new();
        for (k, (r, decays)) in self.segments.iter().enumerate() {
            let decay = if *decays { wd } else { 0.0 };
            update.clear();
            update.resize(r.len(), 0.0);
            let (p, g) = (&params[r.clone()], &grads[r.clone()]);
            let moments = (&mut m[r.clone()], &mut v[r.clone()], &mut update[..]);
            par::chunks3(moments, threads, |start, m, v, u| {
                for i in 0..m.len() {
                    let s = g[start + i] / grad_scale;
                    m[i] = b1 * m[i] + w1 * s;
                    v[i] = b2 * v[i] + w2 * s * s;
                    u[i] = m[i] / (v[i].sqrt() + eps) + decay * p[start + i];
                }
            });
            let w_norm = kernel_sum_sq(p, threads).sqrt();
            let u_norm = kernel_sum_sq(&update, threads).sqrt();
            let mut coeff = 1.0f32;
            if w_norm != 0.0 && u_norm != 0.0 {
                coeff = w_norm / u_norm;
                if coeff > max_coeff {
                    coeff = max_coeff;
                }
                if coeff < min_coeff {
                    coeff = min_coeff;
                }
            }
            self.coeffs[k] = coeff;
            let scaled = step_size * coeff;
            par::chunks(&mut params[r.clone()], threads, |start, p| {
                for (p, u) in p.iter_mut().zip(&update[start..]) {
                    *p -= scaled * u;
                }
            });
        }
        self.state.buffers.insert(BUFFERS[0].to_string(), m);
        self.state.buffers.insert(BUFFERS[1].to_string(), v);
        Ok(())
    }
}

/// `Σ x²` in f32 as `fused_lamb_cuda` reduces it: `min(⌈n/512⌉, 512)` blocks of 512 threads,
/// thread `t` adding `x[t]², x[t + T]², …` in order, each block's partials then summed by a
/// halving tree (`reduce_block_in_shared_memory`), and the blocks' sums by one more tree over 512
/// slots (part 2, unused slots 0). The partial sums are split over up to `threads` host
/// threads, each adding its sums' elements row after row of `slots`: every sum in its order.
fn kernel_sum_sq(xs: &[f32], threads: usize) -> f32 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut partial = partial_sums(xs, threads);
    let mut sums = [0.0f32; THREADS];
    for (b, block) in partial.chunks_exact_mut(THREADS).enumerate() {
        sums[b] = tree(block);
    }
    tree(&mut sums)
}

/// The first step of [`kernel_sum_sq`]: the `min(⌈n/512⌉, 512)·512` threads' sums.
fn partial_sums(xs: &[f32], threads: usize) -> Vec<f32> {
    let slots = xs.len().div_ceil(THREADS).min(THREADS) * THREADS;
    let mut partial = vec![0.0f32; slots];
    par::chunks(&mut partial, threads, |first, sums| {
        for row in xs.chunks(slots) {
            let row = row.get(first..).unwrap_or(&[]);
            for (s, &x) in sums.iter_mut().zip(row) {
                *s += x * x;
            }
        }
    });
    partial
}

/// The halving tree of a 512-wide block: `s[t] += s[t + h]` for `h` = 256, 128, …, 1.
fn tree(s: &mut [f32]) -> f32 {
    let mut h = s.len() / 2;
    while h >= 1 {
        for t in 0..h {
            s[t] += s[t + h];
        }
        h /= 2;
    }
    s[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    /// The threaded step is the one-thread step bit for bit, norms and trust ratios included,
    /// with and without decay and a gradient scale, over three steps; the norm's partial sums
    /// are the one-thread sums on any count of threads.
    #[test]
    fn threads_change_no_bit() {
        use crate::optim::testing::{big, bits, same_bits_on_threads};
        let (p0, decay, n) = big();
        for (wd, scale) in [(0.0, 1.0), (0.01, 1.0), (0.01, 1024.0)] {
            let same = same_bits_on_threads(
                n,
                || Lamb::new(LambConfig::fused_lamb(wd), &p0.entries, &decay).unwrap(),
                |o, p, g, t| o.step_with_scale_on(p, g, 0.1, scale, t).unwrap(),
            );
            assert!(same, "wd {wd} scale {scale}");
        }
        // Against the definition, slot `j mod slots` adding `x[j]²` in `j`'s order (sizes under
        // one block, of a few blocks, and of the full 512 blocks with a ragged last row). The
        // first row's squares are 1e8 and the later ones 2.25, under half an ulp of 1e8: added
        // in order they vanish, added first they would not.
        for n in [1usize, 700, 5 * 512 + 3, 1_000_003] {
            let slots = n.div_ceil(THREADS).min(THREADS) * THREADS;
            let xs: Vec<f32> = (0..n).map(|i| if i < slots { 1e4 } else { 1.5 }).collect();
            let mut want = vec![0.0f32; slots];
            for (j, &x) in xs.iter().enumerate() {
                want[j % slots] += x * x;
            }
            for t in [1, 2, 3, 4, 8] {
                let got = partial_sums(&xs, t);
                assert!(bits(&got) == bits(&want), "{n} elements, {t} threads");
            }
        }
    }

    fn two_tensors() -> Params {
        Params::zeros(vec![("w".into(), vec![3]), ("b".into(), vec![2])])
    }

    #[test]
    fn the_kernel_sum_is_exact_on_small_integers() {
        for n in [0usize, 1, 511, 512, 513, 262_144, 262_145, 600_000] {
            let xs: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
            let want: f64 = xs.iter().map(|&x| f64::from(x * x)).sum();
            assert_eq!(f64::from(kernel_sum_sq(&xs, 1)), want, "n = {n}");
        }
    }

    #[test]
    fn the_trust_ratio_is_clamped_and_one_when_a_norm_is_zero() {
        let p0 = two_tensors();
        let mut cfg = LambConfig::fused_lamb(0.0);
        cfg.bias_correction = false;
        cfg.eps = 0.0;
        let mut opt = Lamb::new(cfg, &p0.entries, &[true, true]).unwrap();
        // First tensor: ‖w‖ = 0 → ratio 1. Second: every update is ±0.1/√0.001 ≈ ±3.16 (no bias
        // correction, no eps), ‖w‖ ≈ 1414 → the ratio 316 is clamped at 10.
        let mut p = vec![0.0f32, 0.0, 0.0, 1000.0, -1000.0];
        opt.step(&mut p, &[1.0, -1.0, 0.5, 1.0, 1.0], 1e-3).unwrap();
        assert_eq!(opt.coefficients(), &[1.0, 10.0]);
        let u = 0.1f32 / (0.001f32.sqrt());
        assert!((p[0] + 1e-3 * u).abs() < 1e-7, "{p:?}");
        assert!((p[3] - (1000.0 - 1e-2 * u)).abs() < 1e-3, "{p:?}");
        // A zero gradient everywhere: ‖u‖ = 0 → ratio 1, nothing moves.
        let mut with_eps = cfg;
        with_eps.eps = 1e-8;
        let mut opt = Lamb::new(with_eps, &p0.entries, &[true, true]).unwrap();
        let mut q = vec![1.0f32; 5];
        opt.step(&mut q, &[0.0; 5], 1e-3).unwrap();
        assert_eq!(q, vec![1.0; 5]);
        assert_eq!(opt.coefficients(), &[1.0, 1.0]);
        // Tiny weights: clamped at min_coeff.
        let mut opt = Lamb::new(cfg, &p0.entries, &[true, true]).unwrap();
        let mut q = vec![1e-6f32; 5];
        opt.step(&mut q, &[1.0; 5], 1e-3).unwrap();
        assert_eq!(opt.coefficients(), &[0.01, 0.01]);
    }

    #[test]
    fn decay_enters_the_update_and_the_scale_divides_the_gradient() {
        let p0 = two_tensors();
        let cfg = LambConfig::fused_lamb(0.5);
        let mut a = Lamb::new(cfg, &p0.entries, &[true, false]).unwrap();
        let mut b = a.clone();
        let g = vec![0.25f32, -0.5, 1.0, 2.0, -4.0];
        let (mut pa, mut pb) = (vec![0.5f32; 5], vec![0.5f32; 5]);
        a.step(&mut pa, &g, 1e-2).unwrap();
        let scaled: Vec<f32> = g.iter().map(|x| x * 1024.0).collect();
        b.step_with_scale(&mut pb, &scaled, 1e-2, 1024.0).unwrap();
        assert_eq!(pa, pb, "a power-of-two scale divides exactly");
        assert!(b.step_with_scale(&mut pb, &scaled, 1e-2, 0.0).is_err());
    }

    #[test]
    fn partitions_are_refused_and_state_round_trips() {
        let p0 = two_tensors();
        let cfg = LambConfig::fused_lamb(0.01);
        assert!(Lamb::shard(cfg, &p0.entries, &[true, true], &[0..2, 3..5]).is_err());
        let mut bad = cfg;
        bad.min_coeff = 20.0;
        assert!(Lamb::new(bad, &p0.entries, &[true, true]).is_err());
        let mut a = Lamb::new(cfg, &p0.entries, &[true, false]).unwrap();
        let mut pa = vec![0.3f32, -0.1, 0.7, 0.2, 0.9];
        let g = |k: usize| -> Vec<f32> {
            (0..5)
                .map(|i| ((i * 7 + k * 3) % 11) as f32 / 10.0 - 0.5)
                .collect()
        };
        for k in 0..3 {
            a.step(&mut pa, &g(k), 1e-2).unwrap();
        }
        let mut b = Lamb::new(cfg, &p0.entries, &[true, false]).unwrap();
        b.load_state(OptimState::from_safetensors(&a.state().to_safetensors().unwrap()).unwrap())
            .unwrap();
        let mut pb = pa.clone();
        for k in 3..6 {
            a.step(&mut pa, &g(k), 1e-2).unwrap();
            b.step(&mut pb, &g(k), 1e-2).unwrap();
        }
        assert_eq!(pa, pb);
        assert!(b
            .load_state(OptimState::new("adam", 5, &BUFFERS, 0.0))
            .is_err());
    }
}

state_access!(Lamb);
