//! Gradient clipping and the optimizers, with the arithmetic of the upstream class each recipe
//! runs under DeepSpeed 0.19.8 / PyTorch 2.15 (one module per optimizer):
//!
//! - [`Adam`] / AdamW (`adam.rs`): `torch.optim.Adam` / `AdamW`, which DeepSpeed's FusedAdam and
//!   DeepSpeedCPUAdam compute too.
//! - [`Sgd`] (`sgd.rs`): `torch.optim.SGD` (momentum, dampening 0, Nesterov, L2 weight decay).
//! - [`Adagrad`] (`adagrad.rs`): `torch.optim.Adagrad`, or DeepSpeedCPUAdagrad's kernel under
//!   ZeRO-Offload.
//! - [`Lamb`] (`lamb.rs`): DeepSpeed's FusedLamb CUDA kernel, per-tensor trust ratio.
//!
//! Each keeps its state in the flat parameter layout (or a ZeRO partition of it) and exposes it as
//! an [`OptimState`]: named per-element buffers, the step count and, under mixed precision, the
//! fp32 master weights, saved per rank as safetensors and re-partitionable by element ranges.

/// The accessors every optimizer whose state is an [`OptimState`] shares (SGD, Adagrad, LAMB;
/// Adam keeps its own `AdamState`).
macro_rules! state_access {
    ($t:ty) => {
        impl $t {
            /// Elements updated.
            pub fn len(&self) -> usize {
                self.state.len
            }

            /// True when it updates nothing.
            pub fn is_empty(&self) -> bool {
                self.state.len == 0
            }

            /// The state: its buffers, step count and fp32 master weights.
            pub fn state(&self) -> &OptimState {
                &self.state
            }

            /// Takes the fp32 master weights out of the state.
            pub fn take_master(&mut self) -> Vec<f32> {
                std::mem::take(&mut self.state.master)
            }

            /// The element ranges of the buffer it updates (one per tensor, or the part of it a
            /// ZeRO partition holds), each with whether it decays.
            pub fn segments(&self) -> &[(std::ops::Range<usize>, bool)] {
                &self.segments
            }

            /// Counts a step applied to this optimizer's state elsewhere (the device's kernels,
            /// [`crate::optim::device`]), which keeps the buffers until `load_state` brings them
            /// back: the step count is the host's, so a checkpoint and the next step see it.
            pub fn count_step(&mut self) {
                self.state.step += 1;
            }
        }
    };
}

mod adagrad;
mod adam;
pub mod device;
mod lamb;
mod sgd;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

pub use adagrad::{Adagrad, AdagradConfig, AdagradImpl, AdagradScalars, TORCH_ADAGRAD_EPS};
pub use adam::{Adam, AdamConfig, AdamScalars, AdamState, WeightDecay};
pub use lamb::{Lamb, LambConfig, LambScalars, DEFAULT_MAX_COEFF, DEFAULT_MIN_COEFF};
pub use sgd::{Sgd, SgdConfig, SgdScalars};

use crate::checkpoint;
use crate::params::Entry;

/// Why an optimizer call was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimError {
    /// Buffers of different lengths.
    #[error("{what} has {found} elements, expected {expected}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        found: usize,
        /// The optimizer's length.
        expected: usize,
    },
    /// A hyper-parameter out of range.
    #[error("bad optimizer setting: {0}")]
    Config(String),
    /// A saved state that cannot be read.
    #[error("bad optimizer state: {0}")]
    State(String),
}

/// `torch.nn.utils.clip_grad_norm_` over all of `grads`: the total L2 norm `n`, and if
/// `max_norm / (n + 1e-6) < 1` every gradient is scaled by that factor. Returns `n` (pre-clip).
/// A non-finite norm makes the gradients non-finite too, as in PyTorch; check the returned norm.
pub fn clip_grad_norm(grads: &mut [f32], max_norm: f32) -> f32 {
    let norm = sum_squares(grads).sqrt() as f32;
    if let Some(coef) = clip_coef(norm, max_norm) {
        scale(grads, coef);
    }
    norm
}

/// `Σ g²` in f64. The norm `sqrt(Σ g²) as f32` is then the correctly rounded f32 of the exact
/// value, which PyTorch's blocked f32 sums approach to within an ulp or two; partitions of a
/// buffer (ZeRO-2/3) add their partial sums.
pub fn sum_squares(grads: &[f32]) -> f64 {
    grads.iter().map(|&g| f64::from(g) * f64::from(g)).sum()
}

/// The factor `clip_grad_norm_` multiplies gradients by for total norm `norm`, or `None` when it
/// leaves them alone: `max_norm / (norm + 1e-6)` if that is below 1 (or NaN, which propagates
/// like PyTorch's `clamp(coef, max = 1)`).
pub fn clip_coef(norm: f32, max_norm: f32) -> Option<f32> {
    let coef = max_norm / (norm + 1e-6);
    (coef < 1.0 || coef.is_nan()).then_some(coef)
}

/// `g *= coef` for every element.
pub fn scale(grads: &mut [f32], coef: f32) {
    for g in grads.iter_mut() {
        *g *= coef;
    }
}

/// HF Trainer's no-decay rule: biases and LayerNorm weights get no weight decay.
pub fn hf_no_decay(name: &str) -> bool {
    name.contains("bias") || name.contains("LayerNorm.weight")
}

/// Element ranges of the optimizer's buffer, one per tensor (or the part of a tensor a ZeRO
/// partition holds), and whether that tensor gets weight decay.
pub(crate) type Segments = Vec<(Range<usize>, bool)>;

/// All the elements of a buffer laid out as `entries`.
pub(crate) fn whole(entries: &[Entry]) -> Range<usize> {
    0..entries.last().map_or(0, |e| e.range().end)
}

/// The segments of a buffer laid out as `entries` (which must tile it), and its length.
pub(crate) fn layout(entries: &[Entry], decay: &[bool]) -> Result<(Segments, usize), OptimError> {
    if entries.len() != decay.len() {
        return Err(OptimError::Length {
            what: "decay flags",
            found: decay.len(),
            expected: entries.len(),
        });
    }
    let mut end = 0;
    let mut segments = Vec::with_capacity(entries.len());
    for (e, &d) in entries.iter().zip(decay) {
        if e.offset != end {
            return Err(OptimError::Config(format!(
                "entry {} starts at {}, expected {end} (entries must tile the buffer)",
                e.name, e.offset
            )));
        }
        end = e.range().end;
        segments.push((e.range(), d));
    }
    Ok((segments, end))
}

/// The segments of one ZeRO partition, the elements `ranges` of a buffer of `total` elements cut
/// into `full` (ascending, disjoint), laid out as the ranges' concatenation; and its length.
pub(crate) fn partition(
    full: &Segments,
    total: usize,
    ranges: &[Range<usize>],
) -> Result<(Segments, usize), OptimError> {
    let mut segments = Vec::new();
    let (mut local, mut prev_end) = (0usize, 0usize);
    for range in ranges {
        if range.start > range.end || range.end > total || range.start < prev_end {
            return Err(OptimError::Config(format!(
                "partition {range:?} outside the {total} parameters or out of order"
            )));
        }
        prev_end = range.end;
        for (r, d) in full {
            let (s, e) = (r.start.max(range.start), r.end.min(range.end));
            if s < e {
                let at = local + s - range.start;
                segments.push((at..at + (e - s), *d));
            }
        }
        local += range.len();
    }
    Ok((segments, local))
}

/// Refuses parameter or gradient buffers that are not `n` long, and a non-finite LR.
pub(crate) fn check_step(
    n: usize,
    params: &[f32],
    grads: &[f32],
    lr: f64,
) -> Result<(), OptimError> {
    for (what, len) in [("params", params.len()), ("grads", grads.len())] {
        if len != n {
            return Err(OptimError::Length {
                what,
                found: len,
                expected: n,
            });
        }
    }
    if !lr.is_finite() {
        return Err(OptimError::Config(format!("learning rate {lr}")));
    }
    Ok(())
}

/// Refuses a hyper-parameter that is negative, NaN or infinite.
pub(crate) fn non_negative(what: &str, x: f64) -> Result<(), OptimError> {
    if x >= 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(OptimError::Config(format!(
            "{what} {x} must be finite and ≥ 0"
        )))
    }
}

/// Refuses a moment decay rate outside [0, 1).
pub(crate) fn check_betas(beta1: f64, beta2: f64) -> Result<(), OptimError> {
    let ok = |x: f64| x.is_finite() && (0.0..1.0).contains(&x);
    if ok(beta1) && ok(beta2) {
        Ok(())
    } else {
        Err(OptimError::Config(format!(
            "betas ({beta1}, {beta2}) must be in [0, 1)"
        )))
    }
}

/// Any optimizer's state: its per-element buffers by name (in the layout of the buffer or ZeRO
/// partition it covers), the step count and, under mixed precision, the fp32 master weights of the
/// same elements (DeepSpeed's `single_partition_of_fp32_groups`; empty in fp32, where the model's
/// own weights are the master).
///
/// Saved as safetensors: one F32 tensor per buffer (named as torch names the state: `exp_avg`,
/// `exp_avg_sq`, `momentum_buffer`, `sum`), `fp32_master`, and in the metadata the step, the
/// optimizer family and the element count. Exact, so a resumed run continues bit-identically.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptimState {
    /// The family that wrote it, which fixes the buffers: `adam` (Adam and AdamW), `sgd`,
    /// `adagrad`, `lamb`.
    pub optimizer: String,
    /// Elements covered.
    pub len: usize,
    /// Completed steps.
    pub step: u64,
    /// The per-element buffers, each `len` long.
    pub buffers: BTreeMap<String, Vec<f32>>,
    /// The fp32 master weights (`len` long), or empty.
    pub master: Vec<f32>,
}

impl OptimState {
    /// A fresh state of `family` over `len` elements with `names` buffers filled with `fill`.
    pub fn new(family: &str, len: usize, names: &[&str], fill: f32) -> OptimState {
        OptimState {
            optimizer: family.to_string(),
            len,
            step: 0,
            buffers: names
                .iter()
                .map(|n| (n.to_string(), vec![fill; len]))
                .collect(),
            master: Vec::new(),
        }
    }

    /// Buffer `name`, or an empty slice when the state has none of that name.
    pub fn buffer(&self, name: &str) -> &[f32] {
        self.buffers.get(name).map_or(&[], Vec::as_slice)
    }

    /// Elements held in the buffers (not the master weights): what the optimizer state costs.
    pub fn buffer_elems(&self) -> usize {
        self.buffers.values().map(Vec::len).sum()
    }

    /// Checks that every buffer (and the master weights, when present) is `len` long.
    pub fn validate(&self) -> Result<(), OptimError> {
        for (name, b) in &self.buffers {
            if b.len() != self.len {
                return Err(OptimError::State(format!(
                    "{name} has {} elements, the state covers {}",
                    b.len(),
                    self.len
                )));
            }
        }
        if !self.master.is_empty() && self.master.len() != self.len {
            return Err(OptimError::State(format!(
                "fp32_master has {} elements, the state covers {}",
                self.master.len(),
                self.len
            )));
        }
        Ok(())
    }

    /// Checks that this state fits an optimizer of `family` with buffers `names` over `len`
    /// elements (before it replaces that optimizer's state).
    pub(crate) fn check_fits(
        &self,
        family: &str,
        names: &[&str],
        len: usize,
    ) -> Result<(), OptimError> {
        if self.optimizer != family {
            return Err(OptimError::State(format!(
                "the saved state is {}'s, and this run trains {family}",
                self.optimizer
            )));
        }
        let have: Vec<&str> = self.buffers.keys().map(String::as_str).collect();
        let mut want = names.to_vec();
        want.sort_unstable();
        if have != want {
            return Err(OptimError::State(format!(
                "{family}'s state holds {want:?}, the saved one {have:?}"
            )));
        }
        if self.len != len {
            return Err(OptimError::Length {
                what: "saved optimizer state",
                found: self.len,
                expected: len,
            });
        }
        self.validate()
    }

    /// The state as safetensors bytes.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, OptimError> {
        self.to_safetensors_with(std::iter::empty())
    }

    /// [`OptimState::to_safetensors`] with extra metadata entries (e.g. a ZeRO partition's
    /// ranges).
    pub fn to_safetensors_with(
        &self,
        extra: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Vec<u8>, OptimError> {
        self.validate()?;
        let mut meta: HashMap<String, String> = extra.into_iter().collect();
        meta.insert("step".to_string(), self.step.to_string());
        meta.insert("optimizer".to_string(), self.optimizer.clone());
        meta.insert("elements".to_string(), self.len.to_string());
        let mut tensors: Vec<(String, Vec<usize>, &[f32])> = self
            .buffers
            .iter()
            .map(|(n, b)| (n.clone(), vec![b.len()], b.as_slice()))
            .collect();
        if !self.master.is_empty() {
            tensors.push(("fp32_master".into(), vec![self.master.len()], &self.master));
        }
        checkpoint::safetensors_bytes(&tensors, meta).map_err(|e| OptimError::State(e.to_string()))
    }

    /// Reads [`OptimState::to_safetensors`] output.
    pub fn from_safetensors(bytes: &[u8]) -> Result<OptimState, OptimError> {
        Ok(Self::from_safetensors_with(bytes)?.0)
    }

    /// [`OptimState::from_safetensors`], with the file's metadata. A file without an `optimizer`
    /// entry was written before there was more than Adam: it is Adam's.
    pub fn from_safetensors_with(
        bytes: &[u8],
    ) -> Result<(OptimState, HashMap<String, String>), OptimError> {
        use safetensors::tensor::{Dtype, SafeTensors};
        let err = |m: String| OptimError::State(m);
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| err(e.to_string()))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        let step = meta
            .get("step")
            .ok_or_else(|| err("no step in metadata".into()))?
            .parse::<u64>()
            .map_err(|e| err(format!("step: {e}")))?;
        let optimizer = meta
            .get("optimizer")
            .cloned()
            .unwrap_or_else(|| "adam".into());
        let st = SafeTensors::deserialize(bytes).map_err(|e| err(e.to_string()))?;
        let get = |name: &str| -> Result<Vec<f32>, OptimError> {
            let t = st.tensor(name).map_err(|e| err(format!("{name}: {e}")))?;
            if t.dtype() != Dtype::F32 {
                return Err(err(format!("{name}: dtype {:?}, expected F32", t.dtype())));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        };
        let mut buffers = BTreeMap::new();
        let mut master = Vec::new();
        for name in st.names() {
            if name == "fp32_master" {
                master = get(name)?;
            } else {
                buffers.insert(name.to_string(), get(name)?);
            }
        }
        let len = match meta.get("elements") {
            Some(n) => n
                .parse::<usize>()
                .map_err(|e| err(format!("elements: {e}")))?,
            // Adam's files before the count was written: the moments' length.
            None => buffers.values().next().map_or(master.len(), Vec::len),
        };
        let state = OptimState {
            optimizer,
            len,
            step,
            buffers,
            master,
        };
        state.validate()?;
        Ok((state, meta))
    }
}

/// How the gradients handed to a step relate to the true ones under mixed precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScale {
    /// `f32(1 / combined)`: what DeepSpeed's ZeRO and fp16 optimizers multiply the fp32 gradient
    /// by before the step (1 in fp32).
    pub unscale: f32,
    /// `combined` itself (loss scale × clipping factor), when the caller knows it: FusedLamb
    /// divides by it inside its kernel instead of multiplying by the reciprocal.
    pub combined: Option<f64>,
}

impl GradScale {
    /// Gradients already unscaled and clipped.
    pub const ONE: GradScale = GradScale {
        unscale: 1.0,
        combined: None,
    };
}

/// One of the runtime's optimizers over a flat buffer or a ZeRO partition of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Optimizer {
    /// Adam or AdamW.
    Adam(Adam),
    /// SGD.
    Sgd(Sgd),
    /// Adagrad.
    Adagrad(Adagrad),
    /// LAMB.
    Lamb(Lamb),
}

impl From<Adam> for Optimizer {
    fn from(o: Adam) -> Self {
        Optimizer::Adam(o)
    }
}

impl From<Sgd> for Optimizer {
    fn from(o: Sgd) -> Self {
        Optimizer::Sgd(o)
    }
}

impl From<Adagrad> for Optimizer {
    fn from(o: Adagrad) -> Self {
        Optimizer::Adagrad(o)
    }
}

impl From<Lamb> for Optimizer {
    fn from(o: Lamb) -> Self {
        Optimizer::Lamb(o)
    }
}

impl Optimizer {
    /// The state family (`adam`, `sgd`, `adagrad`, `lamb`).
    pub fn family(&self) -> &'static str {
        match self {
            Optimizer::Adam(_) => adam::FAMILY,
            Optimizer::Sgd(_) => sgd::FAMILY,
            Optimizer::Adagrad(_) => adagrad::FAMILY,
            Optimizer::Lamb(_) => lamb::FAMILY,
        }
    }

    /// Elements it updates.
    pub fn len(&self) -> usize {
        match self {
            Optimizer::Adam(o) => o.state().m.len(),
            Optimizer::Sgd(o) => o.len(),
            Optimizer::Adagrad(o) => o.len(),
            Optimizer::Lamb(o) => o.len(),
        }
    }

    /// True when it updates nothing (a ZeRO rank that owns no elements).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Completed steps.
    pub fn steps(&self) -> u64 {
        match self {
            Optimizer::Adam(o) => o.state().step,
            Optimizer::Sgd(o) => o.state().step,
            Optimizer::Adagrad(o) => o.state().step,
            Optimizer::Lamb(o) => o.state().step,
        }
    }

    /// Counts a step applied elsewhere (see [`Adam::count_step`]).
    pub fn count_step(&mut self) {
        match self {
            Optimizer::Adam(o) => o.count_step(),
            Optimizer::Sgd(o) => o.count_step(),
            Optimizer::Adagrad(o) => o.count_step(),
            Optimizer::Lamb(o) => o.count_step(),
        }
    }

    /// The element ranges it updates, each with whether it decays.
    pub fn segments(&self) -> &[(Range<usize>, bool)] {
        match self {
            Optimizer::Adam(o) => o.segments(),
            Optimizer::Sgd(o) => o.segments(),
            Optimizer::Adagrad(o) => o.segments(),
            Optimizer::Lamb(o) => o.segments(),
        }
    }

    /// How a step handed gradients carrying `scale` applies it: `(mult, div)`, the gradient
    /// taken as `(g · mult) / div`. LAMB divides by the combined scale in its kernel when the
    /// caller knows it (FusedLamb's `grad_scale`, which DeepSpeed's
    /// `FP16_UnfusedOptimizer.step_fused_lamb` passes); every other case multiplies by
    /// `unscale`, as DeepSpeed's wrappers multiply the fp32 gradients. One of the two is 1,
    /// which changes no bits. [`Optimizer::step_scaled`] and the device's step both follow it.
    pub fn grad_factors(&self, scale: GradScale) -> (f32, f32) {
        match (self, scale.combined) {
            (Optimizer::Lamb(_), Some(c)) => (1.0, c as f32),
            _ => (scale.unscale, 1.0),
        }
    }

    /// One update of `params` with the true gradients `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        match self {
            Optimizer::Adam(o) => o.step(params, grads, lr),
            Optimizer::Sgd(o) => o.step(params, grads, lr),
            Optimizer::Adagrad(o) => o.step(params, grads, lr),
            Optimizer::Lamb(o) => o.step(params, grads, lr),
        }
    }

    /// One update with gradients still carrying `scale` (see [`GradScale`]); the gradients may be
    /// overwritten. LAMB divides by the combined scale in its kernel (FusedLamb's `grad_scale`,
    /// which DeepSpeed's `FP16_UnfusedOptimizer.step_fused_lamb` passes); the others are handed
    /// gradients multiplied by `unscale`, as DeepSpeed's wrappers multiply the fp32 gradients.
    pub fn step_scaled(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        scale: GradScale,
    ) -> Result<(), OptimError> {
        self.step_scaled_on(params, grads, lr, scale, 1)
    }

    /// [`Optimizer::step_scaled`] on up to `threads` threads ([`crate::par`]; the same bits):
    /// the gradients' scaling and the updates, LAMB's per-tensor norms included (each of
    /// FusedLamb's partial sums stays one thread's, in its order).
    pub fn step_scaled_on(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        scale: GradScale,
        threads: usize,
    ) -> Result<(), OptimError> {
        let cut = crate::par::Cut { threads, parts: 1 };
        self.step_scaled_parts(params, grads, lr, scale, cut, |_, _| {})
    }

    /// [`Optimizer::step_scaled_on`] cut as `cut` says, calling `after(range, &params[range])`
    /// as each range is final (Adam steps them one after another; the others step the
    /// whole buffer, then call it once).
    pub fn step_scaled_parts(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        scale: GradScale,
        cut: crate::par::Cut,
        mut after: impl FnMut(Range<usize>, &[f32]),
    ) -> Result<(), OptimError> {
        let (mult, div) = self.grad_factors(scale);
        if mult != 1.0 {
            crate::par::chunks(grads, cut.threads, |_, g| self::scale(g, mult));
        }
        match self {
            Optimizer::Adam(o) => {
                return o.step_parts(params, grads, lr, cut.threads, cut.parts, after)
            }
            Optimizer::Lamb(o) => o.step_with_scale_on(params, grads, lr, div, cut.threads)?,
            Optimizer::Sgd(o) => o.step_on(params, grads, lr, cut.threads)?,
            Optimizer::Adagrad(o) => o.step_on(params, grads, lr, cut.threads)?,
        }
        after(0..params.len(), params);
        Ok(())
    }

    /// Sets (β₁, β₂) for the next steps, as DeepSpeed's `OneCycle` with `cycle_momentum` writes
    /// the param groups' `betas`. SGD and Adagrad have no `betas` in their defaults, so `OneCycle`
    /// turns momentum cycling off for them (`lr_schedules.py`
    /// `OneCycle._initialize_momentum`): a no-op here.
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), OptimError> {
        match self {
            Optimizer::Adam(o) => o.set_betas(beta1, beta2),
            Optimizer::Lamb(o) => o.set_betas(beta1, beta2),
            Optimizer::Sgd(_) | Optimizer::Adagrad(_) => Ok(()),
        }
    }

    /// The state (without master weights; [`crate::zero::HostOptimizer`] adds them).
    pub fn state(&self) -> OptimState {
        match self {
            Optimizer::Adam(o) => o.state().clone().into(),
            Optimizer::Sgd(o) => o.state().clone(),
            Optimizer::Adagrad(o) => o.state().clone(),
            Optimizer::Lamb(o) => o.state().clone(),
        }
    }

    /// f32 elements of state it holds (its buffers), for the memory accounting.
    pub fn state_elems(&self) -> usize {
        match self {
            Optimizer::Adam(o) => o.state().m.len() + o.state().v.len(),
            Optimizer::Sgd(o) => o.state().buffer_elems(),
            Optimizer::Adagrad(o) => o.state().buffer_elems(),
            Optimizer::Lamb(o) => o.state().buffer_elems(),
        }
    }

    /// Replaces the state with a saved one of the same family and length (master weights
    /// included, for [`Optimizer::take_master`]).
    pub fn load_state(&mut self, s: OptimState) -> Result<(), OptimError> {
        match self {
            Optimizer::Adam(o) => {
                s.check_fits(adam::FAMILY, &adam::BUFFERS, o.state().m.len())?;
                o.load_state(AdamState::try_from(s)?)
            }
            Optimizer::Sgd(o) => o.load_state(s),
            Optimizer::Adagrad(o) => o.load_state(s),
            Optimizer::Lamb(o) => o.load_state(s),
        }
    }

    /// Takes the fp32 master weights out of the state (a resumed mixed-precision run's).
    pub fn take_master(&mut self) -> Vec<f32> {
        match self {
            Optimizer::Adam(o) => o.take_master(),
            Optimizer::Sgd(o) => o.take_master(),
            Optimizer::Adagrad(o) => o.take_master(),
            Optimizer::Lamb(o) => o.take_master(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_scales_only_above_max() {
        let mut g = vec![3.0, 4.0];
        assert_eq!(clip_grad_norm(&mut g, 10.0), 5.0);
        assert_eq!(g, vec![3.0, 4.0]);
        let n = clip_grad_norm(&mut g, 1.0);
        assert_eq!(n, 5.0);
        let after = (g[0] * g[0] + g[1] * g[1]).sqrt();
        assert!((after - 1.0).abs() < 1e-6, "{after}");
    }

    #[test]
    fn a_scaled_step_divides_for_lamb_and_multiplies_for_the_others() {
        let entries = crate::params::Params::zeros(vec![("w".into(), vec![4])]).entries;
        let g = [0.3f32, -0.7, 1.1, 0.01];
        let combined = 3.0f64;
        let scaled: Vec<f32> = g.iter().map(|x| x * combined as f32).collect();
        let unscale = (1.0 / combined) as f32;
        let scale = GradScale {
            unscale,
            combined: Some(combined),
        };
        let lamb = Lamb::new(LambConfig::fused_lamb(0.0), &entries, &[true]).unwrap();
        let (mut a, mut b) = (Optimizer::from(lamb.clone()), lamb);
        let (mut pa, mut pb) = (vec![0.5f32; 4], vec![0.5f32; 4]);
        a.step_scaled(&mut pa, &mut scaled.clone(), 1e-2, scale)
            .unwrap();
        b.step_with_scale(&mut pb, &scaled, 1e-2, combined as f32)
            .unwrap();
        assert_eq!(pa, pb);
        let sgd = Sgd::new(SgdConfig::new(0.0, false, 0.0), &entries, &[true]).unwrap();
        let (mut a, mut b) = (Optimizer::from(sgd.clone()), sgd);
        let (mut pa, mut pb) = (vec![0.5f32; 4], vec![0.5f32; 4]);
        a.step_scaled(&mut pa, &mut scaled.clone(), 1e-2, scale)
            .unwrap();
        let unscaled: Vec<f32> = scaled.iter().map(|x| x * unscale).collect();
        b.step(&mut pb, &unscaled, 1e-2).unwrap();
        assert_eq!(pa, pb);
        // SGD and Adagrad ignore momentum cycling; Adam and LAMB take it.
        assert!(a.set_betas(0.5, 0.5).is_ok());
        let mut l =
            Optimizer::from(Lamb::new(LambConfig::fused_lamb(0.0), &entries, &[true]).unwrap());
        assert!(l.set_betas(1.5, 0.5).is_err());
    }

    #[test]
    fn a_state_round_trips_through_safetensors() {
        let mut s = OptimState::new("sgd", 3, &["momentum_buffer"], 0.0);
        s.step = 4;
        s.buffers.get_mut("momentum_buffer").unwrap()[1] = -0.25;
        s.master = vec![1.0, 2.0, 3.0];
        let back = OptimState::from_safetensors(&s.to_safetensors().unwrap()).unwrap();
        assert_eq!(back, s);
        // No buffers at all (SGD without momentum, fp32): the count still travels.
        let empty = OptimState::new("sgd", 5, &[], 0.0);
        let back = OptimState::from_safetensors(&empty.to_safetensors().unwrap()).unwrap();
        assert_eq!(back, empty);
    }

    #[test]
    fn a_state_that_does_not_fit_is_refused() {
        let s = OptimState::new("adagrad", 3, &["sum"], 0.0);
        assert!(s.check_fits("adagrad", &["sum"], 3).is_ok());
        assert!(s.check_fits("sgd", &["sum"], 3).is_err());
        assert!(s.check_fits("adagrad", &["sum"], 4).is_err());
        assert!(s.check_fits("adagrad", &["sum", "x"], 3).is_err());
        let mut bad = s.clone();
        bad.master = vec![0.0; 2];
        assert!(bad.validate().is_err());
        assert!(bad.to_safetensors().is_err());
        assert!(OptimState::from_safetensors(b"not safetensors").is_err());
    }
}

/// What the optimizers' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::params::Params;

    /// Tensors whose boundaries fall inside the threads' chunks of a threaded step, some
    /// decaying and some not: the parameters, the decay flags and the elements.
    pub fn big() -> (Params, Vec<bool>, usize) {
        let sizes = [70_001usize, 3, 150_000, 1, 40_000];
        let p = Params::zeros(
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (format!("t{i}"), vec![n]))
                .collect(),
        );
        (p, vec![true, false, true, false, true], sizes.iter().sum())
    }

    /// The values' bit patterns.
    pub fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Three steps of a fresh optimizer (`make`) over `n` parameters with `step(opt, params,
    /// grads, threads)`, on 1, 3 and 8 threads: whether every run ends with the same bits.
    pub fn same_bits_on_threads<O>(
        n: usize,
        make: impl Fn() -> O,
        step: impl Fn(&mut O, &mut [f32], &[f32], usize),
    ) -> bool {
        let runs: Vec<_> = [1, 3, 8]
            .into_iter()
            .map(|threads| {
                let mut opt = make();
                let mut p: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * 0.01).collect();
                for k in 0..3 {
                    let g: Vec<f32> = (0..n).map(|i| ((i * 7 + k) % 89) as f32 * 1e-3).collect();
                    step(&mut opt, &mut p, &g, threads);
                }
                bits(&p)
            })
            .collect();
        runs.iter().all(|r| *r == runs[0])
    }
}
