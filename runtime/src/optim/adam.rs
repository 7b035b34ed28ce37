//! Adam and AdamW, with PyTorch's arithmetic.
//!
//! The scalar coefficients (bias corrections, step size) are computed in f64 like PyTorch's
//! Python-float arithmetic, then applied elementwise in f32 in PyTorch's operation order
//! (`torch.optim.Adam` / `AdamW`, `foreach=False`, `fused=False`), so the updates agree with
//! PyTorch to a few ulps.

use std::collections::HashMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{
    check_betas, check_step, layout, non_negative, partition, whole, OptimError, OptimState,
};
use crate::params::Entry;

/// The state family of Adam and AdamW (their files hold the same buffers).
pub(crate) const FAMILY: &str = "adam";
/// Adam's buffers, as torch names them.
pub(crate) const BUFFERS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

/// How weight decay enters the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightDecay {
    /// AdamW: `p *= 1 − lr·wd` before the Adam step (`torch.optim.AdamW`).
    Decoupled,
    /// Adam with L2: `g += wd·p` (`torch.optim.Adam`, DeepSpeed `adam_w_mode = false`).
    L2,
}

/// Adam hyper-parameters (the learning rate is passed per step).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decay rate for the tensors flagged for decay.
    pub weight_decay: f64,
    /// Decoupled (AdamW) or L2.
    pub mode: WeightDecay,
    /// Divide the moments by `1 − β^t` (DeepSpeed can turn this off).
    pub bias_correction: bool,
}

impl AdamConfig {
    /// `torch.optim.AdamW` defaults with weight decay `wd` (betas 0.9/0.999, eps 1e-8).
    pub fn adamw(weight_decay: f64) -> AdamConfig {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            mode: WeightDecay::Decoupled,
            bias_correction: true,
        }
    }
}

/// The optimizer's state: moments in the flat parameter layout, and the step count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamState {
    /// First moment.
    pub m: Vec<f32>,
    /// Second moment.
    pub v: Vec<f32>,
    /// Completed steps.
    pub step: u64,
    /// The fp32 master weights of the same elements under mixed precision (DeepSpeed's
    /// `single_partition_of_fp32_groups`), saved with the moments; empty in fp32, where the
    /// model's own weights are the master.
    #[serde(default)]
    pub master: Vec<f32>,
}

impl AdamState {
    /// The state as safetensors bytes (tensors `exp_avg`, `exp_avg_sq`; the step in metadata):
    /// exact, so a resumed run continues bit-identically. The [`OptimState`] format.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, OptimError> {
        self.to_safetensors_with(std::iter::empty())
    }

    /// [`AdamState::to_safetensors`] with extra metadata entries (e.g. a ZeRO partition's ranges).
    pub fn to_safetensors_with(
        &self,
        extra: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Vec<u8>, OptimError> {
        OptimState::from(self.clone()).to_safetensors_with(extra)
    }

    /// Reads [`AdamState::to_safetensors`] output (or any state file holding Adam's moments).
    pub fn from_safetensors(bytes: &[u8]) -> Result<AdamState, OptimError> {
        Ok(Self::from_safetensors_with(bytes)?.0)
    }

    /// [`AdamState::from_safetensors`], with the file's metadata.
    pub fn from_safetensors_with(
        bytes: &[u8],
    ) -> Result<(AdamState, HashMap<String, String>), OptimError> {
        let (state, meta) = OptimState::from_safetensors_with(bytes)?;
        Ok((AdamState::try_from(state)?, meta))
    }
}

impl From<AdamState> for OptimState {
    fn from(s: AdamState) -> OptimState {
        let [m, v] = BUFFERS;
        OptimState {
            optimizer: FAMILY.to_string(),
            len: s.m.len(),
            step: s.step,
            buffers: [(m.to_string(), s.m), (v.to_string(), s.v)].into(),
            master: s.master,
        }
    }
}

impl TryFrom<OptimState> for AdamState {
    type Error = OptimError;

    /// The moments of a state that has them (Adam's, or LAMB's, which keeps the same two).
    fn try_from(mut s: OptimState) -> Result<AdamState, OptimError> {
        let mut take = |name: &str| {
            s.buffers
                .remove(name)
                .ok_or_else(|| OptimError::State(format!("no {name} in {}'s state", s.optimizer)))
        };
        let (m, v) = (take("exp_avg")?, take("exp_avg_sq")?);
        if m.len() != v.len() {
            return Err(OptimError::State(format!(
                "exp_avg has {} elements, exp_avg_sq {}",
                m.len(),
                v.len()
            )));
        }
        Ok(AdamState {
            m,
            v,
            step: s.step,
            master: s.master,
        })
    }
}

/// Adam / AdamW over a flat parameter buffer, with a per-tensor decay flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    config: AdamConfig,
    state: AdamState,
    /// Element ranges and whether they decay, covering the buffer in order.
    segments: Vec<(Range<usize>, bool)>,
}

impl Adam {
    /// An optimizer for a buffer laid out as `entries`; `decay[i]` says whether `entries[i]`
    /// gets weight decay (see [`super::hf_no_decay`] for HF Trainer's rule).
    pub fn new(config: AdamConfig, entries: &[Entry], decay: &[bool]) -> Result<Adam, OptimError> {
        Self::shard(
            config,
            entries,
            decay,
            std::slice::from_ref(&whole(entries)),
        )
    }

    /// The optimizer of one ZeRO partition: only the elements `ranges` of the buffer (ascending,
    /// disjoint), with state for them alone, laid out as their concatenation. `step` then takes
    /// the partition's parameters and gradients in that layout. Adam is elementwise, so the
    /// partitions together compute exactly what [`Adam::new`] computes.
    pub fn shard(
        config: AdamConfig,
        entries: &[Entry],
        decay: &[bool],
        ranges: &[Range<usize>],
    ) -> Result<Adam, OptimError> {
        check_betas(config.beta1, config.beta2)?;
        non_negative("eps", config.eps)?;
        non_negative("weight_decay", config.weight_decay)?;
        let (full, total) = layout(entries, decay)?;
        let (segments, n) = partition(&full, total, ranges)?;
        Ok(Adam {
            config,
            state: AdamState {
                m: vec![0.0; n],
                v: vec![0.0; n],
                step: 0,
                master: Vec::new(),
            },
            segments,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// Sets (β₁, β₂) for the next steps, as a scheduler that cycles momentum does
    /// (DeepSpeed's `OneCycle` writes the param group's `betas`; the bias correction then uses
    /// the current β, as torch's Adam does).
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), OptimError> {
        check_betas(beta1, beta2)?;
        self.config.beta1 = beta1;
        self.config.beta2 = beta2;
        Ok(())
    }

    /// The state, e.g. to save it.
    pub fn state(&self) -> &AdamState {
        &self.state
    }

    /// The element ranges of the buffer it updates, each with whether it decays.
    pub fn segments(&self) -> &[(Range<usize>, bool)] {
        &self.segments
    }

    /// Counts a step applied to this optimizer's moments elsewhere (the device's `adamw_step`,
    /// [`super::device`]), which keeps them until [`Adam::load_state`] brings them back: the
    /// step count is the host's, so a checkpoint and the next bias correction see it.
    pub fn count_step(&mut self) {
        self.state.step += 1;
    }

    /// Takes the fp32 master weights out of the state (see [`AdamState::master`]).
    pub fn take_master(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.state.master)
    }

    /// Replaces the state with a saved one (same length).
    pub fn load_state(&mut self, s: AdamState) -> Result<(), OptimError> {
        let n = self.state.m.len();
        if s.m.len() != n || s.v.len() != n || !(s.master.is_empty() || s.master.len() == n) {
            return Err(OptimError::Length {
                what: "saved moments",
                found: s.m.len().max(s.v.len()),
                expected: n,
            });
        }
        self.state = s;
        Ok(())
    }

    /// One update of `params` with gradients `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        self.step_on(params, grads, lr, 1)
    }

    /// [`Adam::step`] on up to `threads` threads ([`crate::par`]): each element's arithmetic is
    /// the same, so are the bits.
    pub fn step_on(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        threads: usize,
    ) -> Result<(), OptimError> {
        self.step_parts(params, grads, lr, threads, 1, |_, _| {})
    }

    /// [`Adam::step_on`] over `parts` consecutive ranges of the buffer, one after another,
    /// calling `after(range, &params[range])` as soon as a range is updated: optimizer offload
    /// copies each range to the device while the next is stepped. The same bits.
    pub fn step_parts(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        lr: f64,
        threads: usize,
        parts: usize,
        mut after: impl FnMut(std::ops::Range<usize>, &[f32]),
    ) -> Result<(), OptimError> {
        check_step(self.state.m.len(), params, grads, lr)?;
        let c = self.config;
        self.state.step += 1;
        let k = AdamScalars::new(&c, self.state.step, lr);
        let segments = &self.segments;
        let n = params.len();
        let per = n.div_ceil(parts.max(1)).max(1);
        for base in (0..n).step_by(per) {
            let part = base..(base + per).min(n);
            let (m, v) = (
                &mut self.state.m[part.clone()],
                &mut self.state.v[part.clone()],
            );
            let p = &mut params[part.clone()];
            crate::par::chunks3((p, m, v), threads, |at, p, m, v| {
                let (start, end) = (base + at, base + at + p.len());
                for (r, decays) in segments {
                    let (lo, hi) = (r.start.max(start), r.end.min(end));
                    if lo >= hi {
                        continue;
                    }
                    let decay = match (*decays, k.decay_mode) {
                        (false, _) | (_, 0) => None,
                        (true, _) => Some(c.mode),
                    };
                    let at = lo - start..hi - start;
                    update(
                        &k,
                        decay,
                        &mut p[at.clone()],
                        &grads[lo..hi],
                        &mut m[at.clone()],
                        &mut v[at],
                    );
                }
            });
            after(part.clone(), &params[part]);
        }
        Ok(())
    }
}

/// The f32 scalars of one Adam step, formed from f64 as PyTorch forms them (Python floats),
/// then rounded to f32: what [`Adam::step`] and the device's `adamw_step` kernel use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamScalars {
    /// `−lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bc2_sqrt: f32,
    /// `1 − β₁`.
    pub w1: f32,
    /// `β₂`.
    pub b2: f32,
    /// `1 − β₂`.
    pub w2: f32,
    /// `eps`.
    pub eps: f32,
    /// 0: no decay (or `weight_decay == 0`), 1: decoupled (AdamW), 2: L2 (Adam).
    pub decay_mode: i32,
    /// `1 − lr·wd`.
    pub decay_mul: f32,
    /// `wd`.
    pub wd: f32,
}

impl AdamScalars {
    /// The scalars of step `step` (the count *after* this step, as adam.rs increments it first:
    /// 1 for the first step) at learning rate `lr`.
    pub fn new(c: &AdamConfig, step: u64, lr: f64) -> AdamScalars {
        let t = step as f64;
        let (bc1, bc2) = if c.bias_correction {
            (1.0 - c.beta1.powf(t), 1.0 - c.beta2.powf(t))
        } else {
            (1.0, 1.0)
        };
        AdamScalars {
            step_size: -(lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            w1: (1.0 - c.beta1) as f32,
            b2: c.beta2 as f32,
            w2: (1.0 - c.beta2) as f32,
            eps: c.eps as f32,
            decay_mode: match (c.weight_decay != 0.0, c.mode) {
                (false, _) => 0,
                (true, WeightDecay::Decoupled) => 1,
                (true, WeightDecay::L2) => 2,
            },
            decay_mul: (1.0 - lr * c.weight_decay) as f32,
            wd: c.weight_decay as f32,
        }
    }
}

/// The update of one run of elements of a tensor, `decay` its weight-decay mode (if it decays).
fn update(
    k: &AdamScalars,
    decay: Option<WeightDecay>,
    params: &mut [f32],
    grads: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    for (((p, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
        let (mut g, mut x) = (g, *p);
        match decay {
            None => {}
            Some(WeightDecay::Decoupled) => x *= k.decay_mul,
            Some(WeightDecay::L2) => g += k.wd * x,
        }
        // torch.lerp with weight < 0.5: m + w·(g − m).
        *m += k.w1 * (g - *m);
        *v = *v * k.b2 + k.w2 * g * g;
        let denom = v.sqrt() / k.bc2_sqrt + k.eps;
        *p = x + k.step_size * *m / denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;

    /// The threaded step, whole or in parts, is the one-thread step bit for bit, over tensors
    /// whose boundaries fall inside the threads' chunks and the parts, some decaying and some
    /// not, in both decay modes and across several steps.
    #[test]
    fn threads_change_no_bit() {
        let sizes = [70_001usize, 3, 150_000, 1, 40_000];
        let entries: Vec<(String, Vec<usize>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("t{i}"), vec![n]))
            .collect();
        let p0 = Params::zeros(entries);
        let n: usize = sizes.iter().sum();
        let decay = [true, false, true, false, true];
        for mode in [WeightDecay::Decoupled, WeightDecay::L2] {
            let mut cfg = AdamConfig::adamw(0.1);
            cfg.mode = mode;
            let mut runs = Vec::new();
            for (threads, parts) in [(1, 1), (3, 1), (8, 1), (2, 5), (1, 7)] {
                let mut opt = Adam::new(cfg, &p0.entries, &decay).unwrap();
                let mut p: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
                for step in 0..3 {
                    let g: Vec<f32> = (0..n)
                        .map(|i| ((i * 7 + step) % 89) as f32 * 1e-3 - 0.04)
                        .collect();
                    // The parts come in order, cover the buffer, and carry their values.
                    let mut seen = 0;
                    opt.step_parts(&mut p, &g, 1e-3, threads, parts, |r, done| {
                        assert_eq!((r.start, done.len()), (seen, r.len()));
                        seen = r.end;
                    })
                    .unwrap();
                    assert_eq!(seen, n);
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                runs.push((bits(&p), bits(&opt.state().m), bits(&opt.state().v)));
            }
            assert!(runs.iter().all(|r| *r == runs[0]), "{mode:?}");
        }
    }

    fn two_tensors() -> Params {
        Params::zeros(vec![("w".into(), vec![3]), ("b".into(), vec![2])])
    }

    #[test]
    fn no_bias_correction_matches_the_hand_formula() {
        let p0 = two_tensors();
        let mut cfg = AdamConfig::adamw(0.5);
        cfg.bias_correction = false;
        let mut opt = Adam::new(cfg, &p0.entries, &[true, false]).unwrap();
        let mut p = vec![1.0f32, -2.0, 0.5, 1.0, 1.0];
        let g = vec![0.1f32, 0.2, -0.3, 0.4, -0.5];
        opt.step(&mut p, &g, 0.1).unwrap();
        for i in 0..5 {
            let p0 = [1.0f64, -2.0, 0.5, 1.0, 1.0][i];
            let decayed = if i < 3 { p0 * (1.0 - 0.1 * 0.5) } else { p0 };
            let gi = f64::from(g[i]);
            let (m, v) = (0.1 * gi, 0.001 * gi * gi);
            let want = decayed - 0.1 * m / (v.sqrt() + 1e-8);
            assert!(
                (f64::from(p[i]) - want).abs() < 1e-6,
                "{i}: {} vs {want}",
                p[i]
            );
        }
    }

    #[test]
    fn l2_mode_adds_decay_to_the_gradient() {
        let p0 = two_tensors();
        let mut cfg = AdamConfig::adamw(0.1);
        cfg.mode = WeightDecay::L2;
        let mut opt = Adam::new(cfg, &p0.entries, &[true, true]).unwrap();
        let mut p = vec![2.0f32; 5];
        // g + wd·p = 0 for every element: the first moment stays 0, so p does not move.
        let g = vec![-0.2f32; 5];
        opt.step(&mut p, &g, 0.1).unwrap();
        assert_eq!(p, vec![2.0f32; 5]);
    }

    #[test]
    fn state_round_trips_and_resumes_bit_identically() {
        let p0 = two_tensors();
        let cfg = AdamConfig::adamw(0.01);
        let flags = [true, false];
        let mut a = Adam::new(cfg, &p0.entries, &flags).unwrap();
        let mut pa = vec![0.3f32, -0.1, 0.7, 0.2, 0.9];
        let g = |k: usize| -> Vec<f32> {
            (0..5)
                .map(|i| ((i * 7 + k * 3) % 11) as f32 / 10.0 - 0.5)
                .collect()
        };
        for k in 0..3 {
            a.step(&mut pa, &g(k), 1e-2).unwrap();
        }
        let saved = a.state().to_safetensors().unwrap();
        let mut b = Adam::new(cfg, &p0.entries, &flags).unwrap();
        b.load_state(AdamState::from_safetensors(&saved).unwrap())
            .unwrap();
        let mut pb = pa.clone();
        for k in 3..6 {
            a.step(&mut pa, &g(k), 1e-2).unwrap();
            b.step(&mut pb, &g(k), 1e-2).unwrap();
        }
        assert_eq!(pa, pb);
        assert_eq!(a.state(), b.state());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let p0 = two_tensors();
        let cfg = AdamConfig::adamw(0.01);
        assert!(matches!(
            Adam::new(cfg, &p0.entries, &[true]),
            Err(OptimError::Length { .. })
        ));
        let mut bad = cfg;
        bad.beta1 = 1.0;
        assert!(matches!(
            Adam::new(bad, &p0.entries, &[true, true]),
            Err(OptimError::Config(_))
        ));
        let mut opt = Adam::new(cfg, &p0.entries, &[true, true]).unwrap();
        let mut p = vec![0.0; 4];
        assert!(matches!(
            opt.step(&mut p, &[0.0; 5], 1e-3),
            Err(OptimError::Length { what: "params", .. })
        ));
        assert!(AdamState::from_safetensors(b"garbage").is_err());
        assert!(opt
            .load_state(AdamState {
                m: vec![0.0; 2],
                v: vec![0.0; 2],
                step: 1,
                master: Vec::new(),
            })
            .is_err());
    }

    #[test]
    fn shards_together_equal_the_whole() {
        let entries = vec![
            Entry {
                name: "a.weight".into(),
                shape: vec![5],
                offset: 0,
            },
            Entry {
                name: "a.bias".into(),
                shape: vec![3],
                offset: 5,
            },
            Entry {
                name: "b.weight".into(),
                shape: vec![4],
                offset: 8,
            },
        ];
        let decay = [true, false, true];
        let cfg = AdamConfig::adamw(0.1);
        let params0: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 - 0.4).collect();
        let grads: Vec<f32> = (0..12)
            .map(|i| ((i * 7) % 5) as f32 * 0.03 - 0.05)
            .collect();
        let mut whole = params0.clone();
        let mut full = Adam::new(cfg, &entries, &decay).unwrap();
        let mut parts = params0.clone();
        let ranges = [0..4, 4..9, 9..12];
        let mut shards: Vec<Adam> = ranges
            .iter()
            .map(|r| Adam::shard(cfg, &entries, &decay, std::slice::from_ref(r)).unwrap())
            .collect();
        for _ in 0..3 {
            full.step(&mut whole, &grads, 1e-2).unwrap();
            for (a, r) in shards.iter_mut().zip(&ranges) {
                a.step(&mut parts[r.clone()], &grads[r.clone()], 1e-2)
                    .unwrap();
            }
        }
        assert_eq!(whole, parts);
        assert_eq!(shards[1].state().m.len(), 5);
        assert!(Adam::shard(cfg, &entries, &decay, &[10..13, 13..14]).is_err());
        assert!(Adam::shard(cfg, &entries, &decay, &[4..6, 0..2]).is_err());
        // Several ranges (a ZeRO-3 rank's pieces of every segment) in one local buffer.
        let pieces = [1..3, 6..10];
        let mut opt = Adam::shard(cfg, &entries, &decay, &pieces).unwrap();
        let mut local: Vec<f32> = pieces
            .iter()
            .flat_map(|r| params0[r.clone()].to_vec())
            .collect();
        let g: Vec<f32> = pieces
            .iter()
            .flat_map(|r| grads[r.clone()].to_vec())
            .collect();
        for _ in 0..3 {
            opt.step(&mut local, &g, 1e-2).unwrap();
        }
        let expect: Vec<f32> = pieces
            .iter()
            .flat_map(|r| whole[r.clone()].to_vec())
            .collect();
        assert_eq!(local, expect);
    }
}
