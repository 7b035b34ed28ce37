//! Adam / AdamW on the device, for a run on one device (ZeRO 0–1, no optimizer offload).
//!
//! The gradient accumulator, the moments and, under mixed precision, the fp32 master weights
//! stay on the device across micro-batches and optimizer steps, beside the parameters the passes
//! read. Per step only scalars cross to the host: `Σ g²` (the norm, whose inf/NaN is the overflow
//! check the host's loss scaler consumes) and the loss. The host keeps every decision — the
//! scaler, the clip coefficient or unscale factor, with the formulas of `zero/replica.rs` — and
//! `adamw_step` applies that one factor as the host optimizer does (bit-identical:
//! runtime/emu/tests/optim.rs). [`Resident::download`] brings the states back when the host
//! needs them (a checkpoint, an evaluation, the final save), so those stay the CPU's files.

use super::{Adam, AdamConfig, OptimError};
use crate::backend::device::Device;
use crate::backend::kernels::{self, DecayMask, Kernels, NORM_BLOCKS};
use crate::backend::Backend;
use crate::model::{Batch, Classifier, DropoutKey, ModelError};
use crate::precision::Dtype;
use crate::zero::ZeroError;

/// What the training loop asks of a device that keeps the model states; `model::OnDevice`
/// implements it over its kernels and the parameter buffer its passes read.
pub trait Resident: Send + Sync {
    /// Uploads `model`'s parameters, `adam`'s moments and the fp32 `master` weights (mixed
    /// precision), and allocates the gradient accumulator and the norm's scratch: once per run.
    /// Refused when the device does not store `module`, the dtype the run trains in.
    fn upload(
        &self,
        model: &Classifier,
        module: Dtype,
        adam: &Adam,
        master: Option<&[f32]>,
    ) -> Result<(), ModelError>;
    /// Zeroes the gradient accumulator (a window starts).
    fn zero_grads(&self) -> Result<(), ModelError>;
    /// One micro-batch's forward and backward with the device's parameters, its gradient
    /// (× `weight`) added to the device's accumulator; returns its mean loss.
    fn micro(
        &self,
        model: &Classifier,
        batch: &Batch,
        weight: f32,
        dropout: Option<DropoutKey>,
    ) -> Result<f32, ModelError>;
    /// `Σ g²` of the accumulator, in f64 ([`kernels::grad_norm_sq`]).
    fn grad_sq(&self) -> Result<f64, ModelError>;
    /// One Adam / AdamW step (`step` counts it, 1 first) at `lr` with the gradients × `mult`.
    fn step(&self, cfg: &AdamConfig, step: u64, lr: f64, mult: f32) -> Result<(), ZeroError>;
    /// Copies the parameters into `model`, the moments into `m` and `v`, and the master weights
    /// into `master` (mixed precision).
    fn download(
        &self,
        model: &mut Classifier,
        m: &mut [f32],
        v: &mut [f32],
        master: Option<&mut [f32]>,
    ) -> Result<(), ModelError>;
}

/// The device buffers of [`Resident`] besides the parameters (which the passes own).
pub struct DeviceAdam<D: Device> {
    grads: D::Buf,
    m: D::Buf,
    v: D::Buf,
    master: Option<D::Buf>,
    mask: DecayMask<D>,
    /// The norm's partial sums.
    norm: D::Buf,
}

impl<D: Device> DeviceAdam<D> {
    /// `adam`'s state and `master` on the device, a zero gradient accumulator of its length.
    pub fn new(k: &Kernels<D>, adam: &Adam, master: Option<&[f32]>) -> DeviceAdam<D> {
        let s = adam.state();
        let n = s.m.len();
        DeviceAdam {
            grads: k.alloc(n),
            m: k.upload(&s.m),
            v: k.upload(&s.v),
            master: master.map(|w| k.upload(w)),
            mask: DecayMask::from_segments(k, adam.segments(), n),
            norm: k.alloc(kernels::norm_scratch_len(n, NORM_BLOCKS)),
        }
    }

    /// Elements it updates.
    pub fn len(&self) -> usize {
        self.mask.len()
    }

    /// True when it updates nothing.
    pub fn is_empty(&self) -> bool {
        self.mask.is_empty()
    }

    /// The gradient accumulator.
    pub fn grads_mut(&mut self) -> &mut D::Buf {
        &mut self.grads
    }

    /// `grads = 0`.
    pub fn zero_grads(&mut self, k: &Kernels<D>) {
        k.zero(k.view_mut(&mut self.grads));
    }

    /// `Σ g²` of the accumulator (its scratch allocated once, in [`DeviceAdam::new`]).
    pub fn grad_sq(&mut self, k: &Kernels<D>) -> f64 {
        kernels::grad_norm_sq_in(k, k.view(&self.grads), &mut self.norm)
    }

    /// One step of `params` (the module's parameters on the device). In fp32 they are the
    /// weights the step updates; under mixed precision the fp32 master is, and `params` receives
    /// it rounded to the module's dtype, as `zero::HostOptimizer` writes it back.
    pub fn step(
        &mut self,
        k: &Kernels<D>,
        params: &mut D::Buf,
        cfg: &AdamConfig,
        step: u64,
        lr: f64,
        mult: f32,
    ) -> Result<(), OptimError> {
        let (m, v) = (k.view_mut(&mut self.m), k.view_mut(&mut self.v));
        let grads = k.view(&self.grads);
        match &mut self.master {
            None => kernels::adamw_step(
                k,
                cfg,
                step,
                lr,
                mult,
                &self.mask,
                k.view_mut(params),
                grads,
                m,
                v,
                None,
            ),
            Some(master) => kernels::adamw_step(
                k,
                cfg,
                step,
                lr,
                mult,
                &self.mask,
                k.view_mut(master),
                grads,
                m,
                v,
                Some(k.view_mut(params)),
            ),
        }
    }

    /// Copies the moments and the master weights (when kept) to the host.
    pub fn download(
        &self,
        k: &Kernels<D>,
        m: &mut [f32],
        v: &mut [f32],
        master: Option<&mut [f32]>,
    ) {
        k.download(k.view(&self.m), m);
        k.download(k.view(&self.v), v);
        if let (Some(d), Some(h)) = (&self.master, master) {
            k.download(k.view(d), h);
        }
    }
}
