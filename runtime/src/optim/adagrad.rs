//! Adagrad, in the two classes DeepSpeed 0.19.8 builds for it (`engine.py`
//! `_configure_basic_optimizer`: `type: "Adagrad"` is `torch.optim.Adagrad`, or
//! `DeepSpeedCPUAdagrad` when `zero_use_cpu_optimizer()`, i.e. under `offload optimizer`; HF's
//! `optim = "adagrad"` is `torch.optim.Adagrad`, which accelerate rebuilds as
//! `DeepSpeedCPUAdagrad` under offload, `accelerate/utils/deepspeed.py`
//! `map_pytorch_optim_to_deepspeed`).
//!
//! Per element, with `wd` the group's weight decay:
//!
//! ```text
//! torch (optim/adagrad.py, _multi_tensor_adagrad, what CUDA parameters get by default):
//!   g ← g + wd·p;  s ← s + g·g;  p ← p + (g·(−clr)) / (√s + eps),  clr = lr / (1 + (t − 1)·lr_decay)
//! DeepSpeedCPUAdagrad (csrc/includes/cpu_adagrad.h Step_AVX, csrc/adagrad/cpu_adagrad.cpp Step_1):
//!   g ← fma(p, wd, g);  s ← fma(g, g, s);  p ← fma(g / (√s + eps), −lr, p)
//! ```
//!
//! `torch`'s `add(…, alpha)` and `addcmul` are fused multiply-adds on its vectorized CPU kernels
//! and `addcdiv` is not; the square root is correctly rounded here, as CUDA's `sqrtf` is (torch's
//! CPU `sqrt` is off by an ulp on some inputs). DeepSpeed's AVX loop uses FMA intrinsics and is
//! reproduced exactly; its scalar loop, the last `n mod 16` (AVX-512) or `n mod 8` (AVX2) elements
//! of each tensor it is handed, rounds `grad · step_size` before adding it: those few elements may
//! differ by an ulp per step (under ZeRO-Offload the tensors are DeepSpeed's flat partitions,
//! whose boundaries are not the runtime's). DeepSpeedCPUAdagrad has no `lr_decay` and no
//! `initial_accumulator_value`; the recipe can set neither, so both are torch's defaults (0) in
//! every plan. Measured against both classes in `tests/optim.rs`.

use std::ops::Range;

use super::{check_step, layout, non_negative, partition, whole, OptimError, OptimState, Segments};
use crate::params::Entry;

/// The state family name.
pub(crate) const FAMILY: &str = "adagrad";
/// torch's name for the accumulated squares (DeepSpeedCPUAdagrad calls it `exp_avg_sq`).
pub(crate) const BUFFER: &str = "sum";

/// `torch.optim.Adagrad`'s default eps (torch 2.15 `optim/adagrad.py`; DeepSpeedCPUAdagrad's
/// default too): what HF's `optim = "adagrad"` runs, as it passes no eps.
pub const TORCH_ADAGRAD_EPS: f64 = 1e-10;

/// Which class's arithmetic runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdagradImpl {
    /// `torch.optim.Adagrad` (the foreach path DeepSpeed's GPU parameters take).
    Torch,
    /// `deepspeed.ops.adagrad.DeepSpeedCPUAdagrad` (ZeRO-Offload).
    DeepSpeedCpu,
}

/// Adagrad hyper-parameters (the learning rate is passed per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdagradConfig {
    /// Added to the denominator's square root.
    pub eps: f64,
    /// L2 penalty added to the gradient of the tensors flagged for decay.
    pub weight_decay: f64,
    /// torch's LR decay per step (0 in plans; DeepSpeedCPUAdagrad has none).
    pub lr_decay: f64,
    /// torch's starting value of the accumulator (0 in plans; DeepSpeedCPUAdagrad starts at 0).
    pub initial_accumulator_value: f64,
    /// Which class computes the update.
    pub imp: AdagradImpl,
}

impl AdagradConfig {
    /// Adagrad with `eps` and `weight_decay`, torch's defaults for the rest.
    pub fn new(eps: f64, weight_decay: f64, imp: AdagradImpl) -> AdagradConfig {
        AdagradConfig {
            eps,
            weight_decay,
            lr_decay: 0.0,
            initial_accumulator_value: 0.0,
            imp,
        }
    }

    fn check(&self) -> Result<(), OptimError> {
        non_negative("eps", self.eps)?;
        non_negative("weight_decay", self.weight_decay)?;
        non_negative("lr_decay", self.lr_decay)?;
        non_negative("initial_accumulator_value", self.initial_accumulator_value)?;
        if self.imp == AdagradImpl::DeepSpeedCpu
            && (self.lr_decay != 0.0 || self.initial_accumulator_value != 0.0)
        {
            return Err(OptimError::Config(
                "DeepSpeedCPUAdagrad has no lr_decay and no initial_accumulator_value".into(),
            ));
        }
        Ok(())
    }
}

/// One step's f32 scalars, as adagrad.rs's loop and the device's `adagrad_step`
/// (kernels/optim.cu) both take them: formed in one place so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdagradScalars {
    /// Whether decaying tensors get `wd·p`: torch tests the group's weight decay ≠ 0,
    /// DeepSpeedCPUAdagrad its f32 value > 0.
    pub decay: bool,
    /// `wd`.
    pub wd: f32,
    /// `eps`.
    pub eps: f32,
    /// torch's `−clr = −lr / (1 + (t − 1)·lr_decay)` (a Python float rounded by `_foreach_mul`),
    /// or DeepSpeedCPUAdagrad's `step_size = −1 · _alpha` (`_alpha` the lr as f32).
    pub neg_lr: f32,
}

impl AdagradConfig {
    /// The scalars of step `t` (1 first) at learning rate `lr`.
    pub fn scalars(&self, t: u64, lr: f64) -> AdagradScalars {
        let wd = self.weight_decay as f32;
        let (decay, neg_lr) = match self.imp {
            AdagradImpl::Torch => (
                self.weight_decay != 0.0,
                (-lr / (1.0 + (t as f64 - 1.0) * self.lr_decay)) as f32,
            ),
            AdagradImpl::DeepSpeedCpu => (wd > 0.0, -(lr as f32)),
        };
        AdagradScalars {
            decay,
            wd,
            eps: self.eps as f32,
            neg_lr,
        }
    }
}

/// Adagrad over a flat parameter buffer (or a ZeRO partition of it), with a per-tensor decay flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Adagrad {
    config: AdagradConfig,
    state: OptimState,
    segments: Segments,
}

impl Adagrad {
    /// Adagrad for a buffer laid out as `entries`; `decay[i]` says whether `entries[i]` decays.
    pub fn new(
        config: AdagradConfig,
        entries: &[Entry],
        decay: &[bool],
    ) -> Result<Adagrad, OptimError> {
        Self::shard(
            config,
            entries,
            decay,
            std::slice::from_ref(&whole(entries)),
        )
    }

    /// Adagrad over the ZeRO partition `ranges` of the buffer (see `Adam::shard`): elementwise,
    /// so the partitions together compute exactly what [`Adagrad::new`] computes.
    pub fn shard(
        config: AdagradConfig,
        entries: &[Entry],
        decay: &[bool],
        ranges: &[Range<usize>],
    ) -> Result<Adagrad, OptimError> {
        config.check()?;
        let (full, total) = layout(entries, decay)?;
        let (segments, n) = partition(&full, total, ranges)?;
        let init = config.initial_accumulator_value as f32;
        Ok(Adagrad {
            config,
            state: OptimState::new(FAMILY, n, &[BUFFER], init),
            segments,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdagradConfig {
        &self.config
    }

    /// Replaces the state with a saved one (same family and length).
    pub fn load_state(&mut self, s: OptimState) -> Result<(), OptimError> {
        s.check_fits(FAMILY, &[BUFFER], self.state.len)?;
        self.state = s;
        Ok(())
    }

    /// One update of `params` with gradients `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        self.step_on(params, grads, lr, 1)
    }

    /// [`Adagrad::step`] on up to `threads` threads ([`crate::par`]; the same bits).
    pub fn step_on(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        threads: usize,
    ) -> Result<(), OptimError> {
        check_step(self.state.len, params, grads, lr)?;
        let c = self.config;
        self.state.step += 1;
        let AdagradScalars {
            decay,
            wd,
            eps,
            neg_lr,
        } = c.scalars(self.state.step, lr);
        let sum = self
            .state
            .buffers
            .get_mut(BUFFER)
            .expect("Adagrad's state has its sum");
        let segments = &self.segments;
        crate::par::chunks2((params, sum), threads, |start, params, sum| {
            for (r, decays) in crate::par::within(segments, start, params.len()) {
                let decays = decays && decay;
                let g0 = &grads[start + r.start..start + r.end];
                let (p, s) = (&mut params[r.clone()], &mut sum[r]);
                for ((p, s), &g) in p.iter_mut().zip(s).zip(g0) {
                    let mut g = g;
                    if decays {
                        g = p.mul_add(wd, g);
                    }
                    *s = g.mul_add(g, *s);
                    *p = match c.imp {
                        AdagradImpl::Torch => *p + (g * neg_lr) / (s.sqrt() + eps),
                        AdagradImpl::DeepSpeedCpu => (g / (s.sqrt() + eps)).mul_add(neg_lr, *p),
                    };
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    use crate::optim::testing::{big, same_bits_on_threads};

    /// The threaded step is the one-thread step bit for bit, in torch's and DeepSpeedCPUAdagrad's
    /// order, over three steps.
    #[test]
    fn threads_change_no_bit() {
        let (p0, decay, n) = big();
        for imp in [AdagradImpl::Torch, AdagradImpl::DeepSpeedCpu] {
            let cfg = AdagradConfig::new(1e-10, 0.01, imp);
            let same = same_bits_on_threads(
                n,
                || Adagrad::new(cfg, &p0.entries, &decay).unwrap(),
                |o, p, g, t| o.step_on(p, g, 0.1, t).unwrap(),
            );
            assert!(same, "{imp:?}");
        }
    }

    fn two_tensors() -> Params {
        Params::zeros(vec![("w".into(), vec![3]), ("b".into(), vec![2])])
    }

    #[test]
    fn the_first_step_moves_by_the_learning_rate() {
        // s = g², so p moves by lr·g/(|g| + eps) ≈ lr·sign(g), in both classes.
        let p0 = two_tensors();
        for imp in [AdagradImpl::Torch, AdagradImpl::DeepSpeedCpu] {
            let cfg = AdagradConfig::new(0.0, 0.0, imp);
            let mut opt = Adagrad::new(cfg, &p0.entries, &[true, true]).unwrap();
            let mut p = vec![1.0f32; 5];
            opt.step(&mut p, &[0.5, -2.0, 0.25, 4.0, -1.0], 0.5)
                .unwrap();
            assert_eq!(p, vec![0.5, 1.5, 0.5, 0.5, 1.5], "{imp:?}");
            assert_eq!(opt.state().buffer("sum"), &[0.25, 4.0, 0.0625, 16.0, 1.0]);
        }
    }

    #[test]
    fn lr_decay_and_the_initial_accumulator_are_torchs() {
        let p0 = two_tensors();
        let mut cfg = AdagradConfig::new(0.0, 0.0, AdagradImpl::Torch);
        cfg.lr_decay = 1.0;
        cfg.initial_accumulator_value = 3.0;
        let mut opt = Adagrad::new(cfg, &p0.entries, &[true, true]).unwrap();
        let mut p = vec![0.0f32; 5];
        let g = [1.0f32; 5];
        opt.step(&mut p, &g, 1.0).unwrap();
        // s = 3 + 1 = 4, clr = 1: p = −1/2.
        assert_eq!(p, vec![-0.5; 5]);
        opt.step(&mut p, &g, 1.0).unwrap();
        // s = 5, clr = 1/(1 + 1) = 0.5.
        let want = -0.5 - 0.5 / 5f32.sqrt();
        assert!(p.iter().all(|&x| (x - want).abs() < 1e-7), "{p:?}");
        cfg.imp = AdagradImpl::DeepSpeedCpu;
        assert!(Adagrad::new(cfg, &p0.entries, &[true, true]).is_err());
    }

    #[test]
    fn decay_enters_the_gradient_of_decaying_tensors_only() {
        let p0 = two_tensors();
        for imp in [AdagradImpl::Torch, AdagradImpl::DeepSpeedCpu] {
            let cfg = AdagradConfig::new(0.0, 0.5, imp);
            let mut opt = Adagrad::new(cfg, &p0.entries, &[true, false]).unwrap();
            let mut p = vec![2.0f32; 5];
            // g + wd·p = 1 + 0.5·2 = 2 where it decays, 1 elsewhere: the sums are its squares.
            opt.step(&mut p, &[1.0; 5], 0.1).unwrap();
            assert_eq!(
                opt.state().buffer("sum"),
                &[4.0, 4.0, 4.0, 1.0, 1.0],
                "{imp:?}"
            );
        }
    }

    #[test]
    fn shards_together_equal_the_whole_and_resume_exactly() {
        let entries = Params::zeros(vec![
            ("a.weight".into(), vec![5]),
            ("a.bias".into(), vec![3]),
            ("b.weight".into(), vec![4]),
        ])
        .entries;
        let decay = [true, false, true];
        for imp in [AdagradImpl::Torch, AdagradImpl::DeepSpeedCpu] {
            let cfg = AdagradConfig::new(1e-10, 0.1, imp);
            let p0: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 - 0.4).collect();
            let g = |k: usize| -> Vec<f32> {
                (0..12)
                    .map(|i| ((i * 7 + k * 3) % 5) as f32 * 0.03 - 0.05)
                    .collect()
            };
            let mut whole = p0.clone();
            let mut full = Adagrad::new(cfg, &entries, &decay).unwrap();
            let ranges = [0..4, 4..9, 9..12];
            let mut shards: Vec<Adagrad> = ranges
                .iter()
                .map(|r| Adagrad::shard(cfg, &entries, &decay, std::slice::from_ref(r)).unwrap())
                .collect();
            let mut parts = p0.clone();
            for k in 0..3 {
                full.step(&mut whole, &g(k), 1e-2).unwrap();
                for (s, r) in shards.iter_mut().zip(&ranges) {
                    s.step(&mut parts[r.clone()], &g(k)[r.clone()], 1e-2)
                        .unwrap();
                }
            }
            assert_eq!(whole, parts, "{imp:?}");
            let bytes = full.state().to_safetensors().unwrap();
            let mut again = Adagrad::new(cfg, &entries, &decay).unwrap();
            again
                .load_state(OptimState::from_safetensors(&bytes).unwrap())
                .unwrap();
            let mut resumed = whole.clone();
            for k in 3..5 {
                full.step(&mut whole, &g(k), 1e-2).unwrap();
                again.step(&mut resumed, &g(k), 1e-2).unwrap();
            }
            assert_eq!(whole, resumed, "{imp:?}");
        }
    }
}

state_access!(Adagrad);
