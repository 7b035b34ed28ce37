//! SGD with momentum, as `torch.optim.SGD` computes it (torch 2.15 `optim/sgd.py`).
//!
//! DeepSpeed has no SGD of its own: `type: "SGD"` falls through to `getattr(torch.optim, "SGD")`
//! in `engine.py` `_configure_basic_optimizer` (also under ZeRO-Offload, where it steps the CPU
//! partition), and HF's `optim = "sgd"` builds `torch.optim.SGD` (`trainer_optimizer.py`
//! `_get_sgd`). Per element, with `wd` the group's weight decay, `μ` the momentum and `d` the
//! dampening (0: the recipe cannot set it, torch's default):
//!
//! ```text
//! g ← g + wd·p                        (L2, tensors that decay)
//! b ← g on the first step, else b ← μ·b + (1 − d)·g
//! g ← g + μ·b (Nesterov), else g ← b
//! p ← p − lr·g
//! ```
//!
//! The `x + α·y` operations (`add(…, alpha=α)`) are fused multiply-adds, as torch's vectorized
//! CPU kernel computes them (bit-identical to torch on `tests/optim.rs`'s cases) and as nvcc
//! contracts the CUDA kernel's `a + alpha * b`; the scalars are rounded to f32 as the kernels
//! receive them.

use std::ops::Range;

use super::{check_step, layout, non_negative, partition, whole, OptimError, OptimState, Segments};
use crate::params::Entry;

/// The state family name.
pub(crate) const FAMILY: &str = "sgd";
/// torch's name for the momentum buffer.
pub(crate) const BUFFER: &str = "momentum_buffer";

/// SGD hyper-parameters (the learning rate is passed per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Momentum factor μ (0: plain SGD, no buffer).
    pub momentum: f64,
    /// Dampening d of the momentum (torch's default 0; the recipe cannot set it).
    pub dampening: f64,
    /// Nesterov momentum (needs μ > 0 and d = 0, as torch requires).
    pub nesterov: bool,
    /// L2 penalty added to the gradient of the tensors flagged for decay.
    pub weight_decay: f64,
}

impl SgdConfig {
    /// `torch.optim.SGD(momentum, nesterov, weight_decay)` with torch's dampening 0.
    pub fn new(momentum: f64, nesterov: bool, weight_decay: f64) -> SgdConfig {
        SgdConfig {
            momentum,
            dampening: 0.0,
            nesterov,
            weight_decay,
        }
    }

    fn check(&self) -> Result<(), OptimError> {
        non_negative("momentum", self.momentum)?;
        non_negative("dampening", self.dampening)?;
        non_negative("weight_decay", self.weight_decay)?;
        // torch.optim.SGD.__init__ raises the same.
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::Config(
                "Nesterov momentum requires a momentum and zero dampening".into(),
            ));
        }
        Ok(())
    }
}

/// One step's f32 scalars, as sgd.rs's loop and the device's `sgd_step` (kernels/optim.cu) both
/// take them: formed in one place so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdScalars {
    /// Whether decaying tensors get `wd·p` (weight decay ≠ 0).
    pub decay: bool,
    /// `wd`.
    pub wd: f32,
    /// Whether there is a momentum buffer (μ ≠ 0).
    pub momentum: bool,
    /// `μ`.
    pub mu: f32,
    /// `1 − dampening`.
    pub keep: f32,
    /// `−lr`.
    pub neg_lr: f32,
}

impl SgdConfig {
    /// The scalars of a step at learning rate `lr`.
    pub fn scalars(&self, lr: f64) -> SgdScalars {
        SgdScalars {
            decay: self.weight_decay != 0.0,
            wd: self.weight_decay as f32,
            momentum: self.momentum != 0.0,
            mu: self.momentum as f32,
            keep: (1.0 - self.dampening) as f32,
            neg_lr: (-lr) as f32,
        }
    }
}

/// SGD over a flat parameter buffer (or a ZeRO partition of it), with a per-tensor decay flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Sgd {
    config: SgdConfig,
    state: OptimState,
    segments: Segments,
}

impl Sgd {
    /// SGD for a buffer laid out as `entries`; `decay[i]` says whether `entries[i]` decays.
    pub fn new(config: SgdConfig, entries: &[Entry], decay: &[bool]) -> Result<Sgd, OptimError> {
        Self::shard(
            config,
            entries,
            decay,
            std::slice::from_ref(&whole(entries)),
        )
    }

    /// SGD over the ZeRO partition `ranges` of the buffer (see `Adam::shard`): elementwise, so
    /// the partitions together compute exactly what [`Sgd::new`] computes.
    pub fn shard(
        config: SgdConfig,
        entries: &[Entry],
        decay: &[bool],
        ranges: &[Range<usize>],
    ) -> Result<Sgd, OptimError> {
        config.check()?;
        let (full, total) = layout(entries, decay)?;
        let (segments, n) = partition(&full, total, ranges)?;
        Ok(Sgd {
            config,
            state: OptimState::new(FAMILY, n, Self::buffers(&config), 0.0),
            segments,
        })
    }

    /// The buffers the state holds: torch keeps a momentum buffer only when μ ≠ 0.
    fn buffers(c: &SgdConfig) -> &'static [&'static str] {
        if c.momentum != 0.0 {
            &[BUFFER]
        } else {
            &[]
        }
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// Replaces the state with a saved one (same family, buffers and length).
    pub fn load_state(&mut self, s: OptimState) -> Result<(), OptimError> {
        s.check_fits(FAMILY, Self::buffers(&self.config), self.state.len)?;
        self.state = s;
        Ok(())
    }

    /// One update of `params` with gradients `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        self.step_on(params, grads, lr, 1)
    }

    /// [`Sgd::step`] on up to `threads` threads ([`crate::par`]; the same bits).
    pub fn step_on(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        threads: usize,
    ) -> Result<(), OptimError> {
        check_step(self.state.len, params, grads, lr)?;
        let c = self.config;
        // torch creates the buffer from the first step's gradient (`buf is None`).
        let first = self.state.step == 0;
        self.state.step += 1;
        let SgdScalars {
            decay,
            wd,
            momentum,
            mu,
            keep,
            neg_lr,
        } = c.scalars(lr);
        let segments = &self.segments;
        let update = |start: usize, params: &mut [f32], buf: &mut [f32]| {
            for (r, decays) in crate::par::within(segments, start, params.len()) {
                let decays = decays && decay;
                for i in r {
                    let p = params[i];
                    let mut g = grads[start + i];
                    if decays {
                        g = p.mul_add(wd, g);
                    }
                    if momentum {
                        let b = if first {
                            g
                        } else {
                            g.mul_add(keep, buf[i] * mu)
                        };
                        buf[i] = b;
                        g = if c.nesterov { b.mul_add(mu, g) } else { b };
                    }
                    params[i] = g.mul_add(neg_lr, p);
                }
            }
        };
        match self.state.buffers.get_mut(BUFFER) {
            Some(buf) if momentum => crate::par::chunks2((params, buf), threads, update),
            _ => crate::par::chunks(params, threads, |start, p| update(start, p, &mut [])),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    use crate::optim::testing::{big, same_bits_on_threads};

    /// The threaded step is the one-thread step bit for bit: plain, with momentum (its first
    /// step included) and with Nesterov momentum, over three steps.
    #[test]
    fn threads_change_no_bit() {
        let (p0, decay, n) = big();
        for cfg in [
            SgdConfig::new(0.0, false, 0.01),
            SgdConfig::new(0.9, false, 0.01),
            SgdConfig::new(0.9, true, 0.0),
        ] {
            let same = same_bits_on_threads(
                n,
                || Sgd::new(cfg, &p0.entries, &decay).unwrap(),
                |o, p, g, t| o.step_on(p, g, 0.1, t).unwrap(),
            );
            assert!(same, "{cfg:?}");
        }
    }

    fn two_tensors() -> Params {
        Params::zeros(vec![("w".into(), vec![3]), ("b".into(), vec![2])])
    }

    #[test]
    fn momentum_starts_from_the_first_gradient() {
        let p0 = two_tensors();
        let mut opt =
            Sgd::new(SgdConfig::new(0.5, false, 0.0), &p0.entries, &[true, false]).unwrap();
        let mut p = vec![1.0f32; 5];
        let g = vec![0.5f32, -1.0, 0.25, 2.0, 0.0];
        opt.step(&mut p, &g, 0.5).unwrap();
        // b = g, p = 1 − 0.5·g.
        assert_eq!(p, vec![0.75, 1.5, 0.875, 0.0, 1.0]);
        opt.step(&mut p, &g, 0.5).unwrap();
        // b = 0.5·g + g = 1.5·g, p −= 0.5·1.5·g.
        assert_eq!(p, vec![0.375, 2.25, 0.6875, -1.5, 1.0]);
        assert_eq!(opt.state().step, 2);
        assert_eq!(opt.state().buffer("momentum_buffer")[0], 0.75);
    }

    #[test]
    fn nesterov_and_decay_follow_the_formula() {
        let p0 = two_tensors();
        let cfg = SgdConfig::new(0.5, true, 0.5);
        let mut opt = Sgd::new(cfg, &p0.entries, &[true, false]).unwrap();
        let mut p = vec![2.0f32; 5];
        let g = vec![1.0f32; 5];
        opt.step(&mut p, &g, 0.25).unwrap();
        // Decayed: g' = 1 + 0.5·2 = 2, b = 2, step g = 2 + 0.5·2 = 3, p = 2 − 0.75.
        // Not decayed: g' = 1, b = 1, g = 1.5, p = 2 − 0.375.
        assert_eq!(p, vec![1.25, 1.25, 1.25, 1.625, 1.625]);
    }

    #[test]
    fn no_momentum_keeps_no_buffer_and_bad_settings_are_refused() {
        let p0 = two_tensors();
        let opt = Sgd::new(SgdConfig::new(0.0, false, 0.1), &p0.entries, &[true, true]).unwrap();
        assert!(opt.state().buffers.is_empty());
        assert!(Sgd::new(SgdConfig::new(0.0, true, 0.0), &p0.entries, &[true, true]).is_err());
        assert!(Sgd::new(SgdConfig::new(-0.1, false, 0.0), &p0.entries, &[true, true]).is_err());
        let mut cfg = SgdConfig::new(0.9, true, 0.0);
        cfg.dampening = 0.1;
        assert!(Sgd::new(cfg, &p0.entries, &[true, true]).is_err());
        let mut opt =
            Sgd::new(SgdConfig::new(0.9, false, 0.0), &p0.entries, &[true, true]).unwrap();
        assert!(opt.step(&mut [0.0; 4], &[0.0; 5], 0.1).is_err());
        assert!(opt.step(&mut [0.0; 5], &[0.0; 5], f64::NAN).is_err());
        // A saved Adagrad state, or one of another length, does not load.
        assert!(opt
            .load_state(OptimState::new("adagrad", 5, &["sum"], 0.0))
            .is_err());
        assert!(opt
            .load_state(OptimState::new("sgd", 4, &["momentum_buffer"], 0.0))
            .is_err());
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
        let cfg = SgdConfig::new(0.9, true, 0.1);
        let p0: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 - 0.4).collect();
        let g = |k: usize| -> Vec<f32> {
            (0..12)
                .map(|i| ((i * 7 + k * 3) % 5) as f32 * 0.03 - 0.05)
                .collect()
        };
        let mut whole = p0.clone();
        let mut full = Sgd::new(cfg, &entries, &decay).unwrap();
        let ranges = [0..4, 4..9, 9..12];
        let mut shards: Vec<Sgd> = ranges
            .iter()
            .map(|r| Sgd::shard(cfg, &entries, &decay, std::slice::from_ref(r)).unwrap())
            .collect();
        let mut parts = p0.clone();
        for k in 0..3 {
            full.step(&mut whole, &g(k), 1e-2).unwrap();
            for (s, r) in shards.iter_mut().zip(&ranges) {
                s.step(&mut parts[r.clone()], &g(k)[r.clone()], 1e-2)
                    .unwrap();
            }
        }
        assert_eq!(whole, parts);
        let saved = OptimState::from_safetensors(&full.state().to_safetensors().unwrap()).unwrap();
        let mut again = Sgd::new(cfg, &entries, &decay).unwrap();
        again.load_state(saved).unwrap();
        let mut resumed = whole.clone();
        for k in 3..5 {
            full.step(&mut whole, &g(k), 1e-2).unwrap();
            again.step(&mut resumed, &g(k), 1e-2).unwrap();
        }
        assert_eq!(whole, resumed);
    }
}

state_access!(Sgd);
