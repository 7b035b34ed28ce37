//! The model's passes on a kernel device (a GPU through cudarc, or the emulated one the tests
//! use), for a [`super::Classifier`] whose parameters, gradients and optimizer stay on the host.
//!
//! Each pass uploads the parameters when they changed (once per optimizer step) and, for
//! training, the gradient accumulator, runs the forward/backward with [`Kernels`], and downloads
//! the result: the optimizer, the clipping, the loss scaler and ZeRO's stage 0–1 bookkeeping are the host code already tested
//! against PyTorch and DeepSpeed. Uploading the accumulator instead of adding a downloaded
//! micro-batch gradient keeps the CPU's order of additions, so the two backends agree to the
//! kernels' own differences. Keeping the optimizer on the device (a fused AdamW) and the
//! transfers out of the step is the next step of docs/cuda.md.

use std::sync::{Arc, Mutex};

use super::{Batch, Classifier, DropoutKey, ModelError, Workspace};
use crate::backend::device::Device;
use crate::backend::kernels::Kernels;
use crate::backend::Backend;

/// Runs a classifier's passes somewhere other than the CPU backend.
pub trait Executor: Send + Sync {
    /// What runs the passes, for logs (e.g. "NVIDIA H200 (sm_90)").
    fn describe(&self) -> String;
    /// [`Classifier::forward_backward`] there.
    fn forward_backward(
        &self,
        model: &Classifier,
        batch: &Batch,
        loss_weight: f32,
        grads: &mut [f32],
        dropout: Option<DropoutKey>,
    ) -> Result<f32, ModelError>;
    /// [`Classifier::forward`] there.
    fn forward(&self, model: &Classifier, batch: &Batch) -> Result<Vec<f32>, ModelError>;
}

struct State<D: Device> {
    ws: Workspace<Kernels<D>>,
    params: Option<D::Buf>,
    /// The [`Classifier::params_stamp`] of what `params` holds.
    params_stamp: u64,
    grads: Option<D::Buf>,
}

/// An [`Executor`] over a [`Device`]'s kernels; buffers are kept between passes (allocated once
/// per batch shape and model size).
pub struct OnDevice<D: Device> {
    kernels: Kernels<D>,
    what: String,
    state: Mutex<State<D>>,
}

impl<D: Device> OnDevice<D> {
    /// Passes on `kernels`, described as `what`.
    pub fn new(kernels: Kernels<D>, what: impl Into<String>) -> Arc<OnDevice<D>> {
        Arc::new(OnDevice {
            kernels,
            what: what.into(),
            state: Mutex::new(State {
                ws: Workspace::new(),
                params: None,
                params_stamp: 0,
                grads: None,
            }),
        })
    }
}

/// Copies `host` into `slot`, allocating only the first time (the model's size is fixed).
fn put<D: Device>(k: &Kernels<D>, slot: &mut Option<D::Buf>, host: &[f32]) {
    match slot {
        Some(buf) => k.write(k.view_mut(buf), host),
        None => *slot = Some(k.upload(host)),
    }
}

/// Uploads the model's parameters unless the device already holds these values (the same
/// stamp): a window's micro-batches and an evaluation's batches upload them once.
fn put_params<D: Device>(k: &Kernels<D>, st: &mut State<D>, model: &Classifier) {
    if st.params.is_none() || st.params_stamp != model.params_stamp() {
        put(k, &mut st.params, &model.params().data);
        st.params_stamp = model.params_stamp();
    }
}

impl<D> Executor for OnDevice<D>
where
    D: Device + Send + Sync,
    D::Buf: Send,
    D::Ids: Send,
{
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn forward_backward(
        &self,
        model: &Classifier,
        batch: &Batch,
        loss_weight: f32,
        grads: &mut [f32],
        dropout: Option<DropoutKey>,
    ) -> Result<f32, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        put_params(k, st, model);
        put(k, &mut st.grads, grads);
        let (params, dgrads) = (st.params.as_ref().unwrap(), st.grads.as_mut().unwrap());
        let loss = model.forward_backward_on(
            k,
            &mut st.ws,
            batch,
            loss_weight,
            params,
            dgrads,
            dropout,
        )?;
        k.download(k.view(dgrads), grads);
        k.device().sync().map_err(ModelError::Device)?;
        Ok(loss)
    }

    fn forward(&self, model: &Classifier, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        put_params(k, st, model);
        let logits = model.forward_on(k, &mut st.ws, batch, st.params.as_ref().unwrap())?;
        k.device().sync().map_err(ModelError::Device)?;
        Ok(logits)
    }
}
