//! The model's passes on a kernel device (a GPU through cudarc, or the emulated one the tests
//! use).
//!
//! Two ways to train on it:
//! - passes only ([`Executor::forward_backward`]): each pass uploads the parameters when they
//!   changed (once per optimizer step) and the gradient accumulator, runs the forward/backward
//!   with [`Kernels`] and downloads the accumulator; the host runs the optimizer. Uploading the
//!   accumulator instead of adding a downloaded micro-batch gradient keeps the CPU's order of
//!   additions. The training loop uses it when the device keeps no model states.
//! - resident ([`Executor::resident`], [`crate::optim::device`]): the parameters, the gradient
//!   accumulator and the optimizer's state (Adam/AdamW, SGD, Adagrad or LAMB) stay on the device
//!   and the step runs there; the host gets them back only when it reads them (checkpoints,
//!   evaluation, the final save). Under optimizer offload the optimizer's state stays on the
//!   host: the accumulated gradients come down and the parameters go up once per step, through
//!   pinned host memory ([`Resident::pinned`]).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::pieces::{Pieces, Upload};
use super::{Batch, BufParams, Classifier, DropoutKey, ModelError, Workspace};
use crate::backend::device::{Device, DeviceMemory, Peers};
use crate::backend::kernels::{Kernels, SegmentNorms};
use crate::backend::profile::Profile;
use crate::backend::{Backend, Loss};
use crate::optim::device::{Deferred, DeviceOptimizer, FirstPart, Landing, Resident};
use crate::zero::Storage;

mod graphs;
mod resident;

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
    /// Sizes the executor's buffers for micro-batches of up to `batch` rows, evaluation batches
    /// of up to `eval_batch`, `seq` tokens each ([`Classifier::reserve_on`]), before a run's
    /// first step.
    fn reserve(&self, _model: &Classifier, _batch: usize, _eval_batch: usize, _seq: usize) {}
    /// The model states kept on the device and the optimizer stepped there, when this executor
    /// can.
    fn resident(&self) -> Option<&dyn Resident> {
        None
    }
    /// Starts timing the device's operations (`recipe run --profile`); false when it cannot.
    fn start_profile(&self) -> bool {
        false
    }
    /// What the device's operations took since [`Executor::start_profile`].
    fn profile(&self) -> Option<Profile> {
        None
    }
    /// The device's memory now ([`Device::memory`]), where it has memory of its own.
    fn memory(&self) -> Option<DeviceMemory> {
        None
    }
}

struct State<D: Device> {
    ws: Workspace<Kernels<D>>,
    params: Option<D::Buf>,
    /// The [`Classifier::params_stamp`] of what `params` holds.
    params_stamp: u64,
    grads: Option<D::Buf>,
    /// The resident optimizer's buffers, once [`Resident::upload`] ran with the optimizer kept.
    opt: Option<DeviceOptimizer<D>>,
    /// Under optimizer offload: the gradient accumulator (the [`DeviceOptimizer`] holds it
    /// otherwise).
    acc: Option<D::Buf>,
    /// ZeRO-1 offloaded with peers: the scratch of [`Resident::grad_sq`] over `acc`, the whole
    /// averaged gradient, of which only this rank's range goes to the host.
    acc_norm: Option<D::Buf>,
    /// ZeRO-2/3 ([`Accumulate::Reduced`], [`Accumulate::ToOwners`]): one micro-batch's own
    /// gradient, and how it reaches the accumulator.
    own: Option<Own<D>>,
    /// With peers ([`Keep::partition`]): what this rank owns.
    split: Option<Split<D>>,
    /// The other ranks' devices, when this one sums with them directly.
    peers: Option<Box<dyn Peers<D>>>,
    /// ZeRO-2/3 with peers: this rank's reduced ranges packed for their one copy to the host
    /// (allocated at the first micro-batch, then reused).
    part: Option<D::Buf>,
    /// The per-row losses of a window's micro-batches ([`Resident::micro`]), read back once by
    /// [`Resident::window_losses`]; grown in the first window, then reused.
    losses: Option<D::Buf>,
    /// Where each of the window's micro-batches left its rows in `losses`: (offset, rows).
    pending: Vec<(usize, usize)>,
    /// Where the next micro-batch copies the accumulator's segments as it finishes them
    /// ([`Resident::land_next`]).
    landing: Option<Landing>,
    /// Under optimizer offload with 16-bit parameters: the host's updated values as their 16
    /// bits, in pinned memory (floats holding two each), which [`Resident::upload_params_part`]
    /// queues up (allocated by [`Resident::upload`], before the first step).
    param_bits: Option<D::Pinned>,
    /// The captured passes of the plain resident path ([`graphs`]).
    graphs: graphs::Graphs<Loss>,
    /// The captured evaluation forwards ([`Executor::forward`]).
    eval_graphs: graphs::Graphs<()>,
    /// The next micro-batch sums the accumulator's segments over the peers as it finishes them
    /// ([`Resident::sum_next`]).
    sum_next: bool,
    /// The accumulator's sums are queued (by the last micro-batch): [`Resident::average_grads`]
    /// joins them instead of summing.
    summed: bool,
    /// ZeRO-1 with peers under optimizer offload, a window landing ([`Resident::land_next`]):
    /// how the last micro-batch makes each summed segment the average before its copy down.
    averaging: Option<Storage>,
    /// That micro-batch made the whole accumulator the average: [`Resident::average_grads`]
    /// only joins.
    averaged: bool,
    /// The resident optimizer steps one model segment at a time, each segment's update (and
    /// its gradient's zeroing) queued beside the rest, which the next micro-batch's forward
    /// waits for segment by segment (`Kernels::update_aside`; docs/cuda.md, "The step beside
    /// the forward"): one device, its whole gradient accumulated in place, an element-wise
    /// optimizer.
    by_segments: bool,
    /// With `by_segments` and the word embeddings' rows first (`Kernels::with_rows_first`):
    /// the first segment's step, put off until the next micro-batch's tokens are on the device,
    /// where the rows they name are updated before its forward and the rest beside it
    /// (`Resident::micro`); anything else queues it whole first ([`State::settle`]).
    deferred: Option<Deferred>,
    /// A step's updates are queued and not yet waited for as a whole: anything but the next
    /// micro-batch's pass joins them first ([`State::settle`]).
    updating: bool,
    /// The last step zeroed the gradient accumulator: the next window's
    /// [`Resident::zero_grads`] has nothing to do.
    zeroed: bool,
    /// With `by_segments`: `Σ g²` summed segment by segment during a window's last backward
    /// ([`Resident::norm_next`]).
    norms: Option<SegmentNorms<D>>,
    /// The next micro-batch sums the norm's segments (`norm_next`).
    norm_next: bool,
    /// `norms` holds the accumulator's sums: [`Resident::grad_sq`] only adds them.
    normed: bool,
}

/// What a rank of a group owns ([`Partitioned`]).
enum Split<D: Device> {
    /// ZeRO 1–2: every rank's range of the whole parameters (which `State::params` holds), and
    /// this rank.
    Flat(Vec<Range<usize>>, usize),
    /// ZeRO-3: `State::params` holds this rank's pieces only.
    Pieces(Pieces<D>),
}

/// One micro-batch's gradient on its own, before it is added to the accumulator, and the
/// dtypes of the reduction and of the accumulator.
enum Own<D: Device> {
    /// One device at ZeRO 2–3 ([`Accumulate::Reduced`]): the whole gradient.
    Whole(D::Buf, Storage),
    /// ZeRO-2 with peers ([`Accumulate::ToOwners`]): two segments' gradients, each reduced to
    /// its owners as the backward finishes it (`pieces::Scatter` over the flat partition).
    Segments([D::Buf; 2], Storage),
}

/// The gradient accumulator of [`Resident`], once uploaded: the device optimizer's, else the
/// offload path's own (`State::opt`, `State::acc`; fields, so that a pass can borrow the others).
fn accumulator<'a, D: Device>(
    opt: &'a mut Option<DeviceOptimizer<D>>,
    acc: &'a mut Option<D::Buf>,
) -> Result<&'a mut D::Buf, ModelError> {
    match (opt, acc) {
        (Some(o), _) => Ok(o.grads_mut()),
        (None, Some(acc)) => Ok(acc),
        (None, None) => Err(not_uploaded()),
    }
}

/// Refuses a host buffer of another length than the device buffer it is copied to or from.
fn same_len(what: &str, host: usize, device: usize) -> Result<(), ModelError> {
    if host == device {
        return Ok(());
    }
    Err(ModelError::Argument(format!(
        "a host {what} buffer of {host} elements for a device buffer of {device}"
    )))
}

impl<D: Device> State<D> {
    /// Orders what is queued from now on after the last step's updates, if they are still
    /// beside the rest (`State::updating`).
    fn settle(&mut self, k: &Kernels<D>) {
        self.step_deferred(k);
        if std::mem::take(&mut self.updating) {
            k.join_aside();
        }
    }

    /// The first segment's deferred step (`State::deferred`), if any, queued whole beside the
    /// rest as `Resident::step` queues a segment's. A failure is the device's, recorded there
    /// and reported at its next wait.
    fn step_deferred(&mut self, k: &Kernels<D>) {
        let (Some(d), Some(o), Some(params)) = (
            self.deferred.take(),
            self.opt.as_mut(),
            self.params.as_mut(),
        ) else {
            return;
        };
        let part = o.segment(0);
        let dev = k.device();
        k.update_aside(0, || {
            // Its arguments were checked when the step was put off (`defer_first`: AdamW, a
            // finite rate) and the parameters are the segment's: nothing here can refuse.
            let _ = o.step_first(k, dev.range_mut(params, part), &d, FirstPart::Whole);
        });
    }

    /// The resident optimizer, when the optimizer is kept on the device.
    fn optimizer(&mut self) -> Result<&mut DeviceOptimizer<D>, ModelError> {
        self.opt.as_mut().ok_or_else(|| {
            ModelError::Argument(
                "the device keeps no optimizer (offloaded, or Resident::upload not run)".into(),
            )
        })
    }
}

/// An [`Executor`] over a [`Device`]'s kernels; buffers are kept between passes (allocated once
/// per batch shape and model size).
pub struct OnDevice<D: Device> {
    kernels: Kernels<D>,
    what: String,
    state: Mutex<State<D>>,
}

impl<D: Device> OnDevice<D> {
    /// The device allocations its kernels made so far ([`Kernels::allocations`]).
    pub fn allocations(&self) -> u64 {
        self.kernels.allocations()
    }

    /// Passes on `kernels`, described as `what`.
    pub fn new(kernels: Kernels<D>, what: impl Into<String>) -> Arc<OnDevice<D>> {
        Self::build(kernels, what.into(), None)
    }

    /// Passes on `kernels` of one rank whose device sums gradients with the other ranks'
    /// devices through `peers` ([`Resident::average_grads`], [`Resident::reduce_to_owners`]).
    pub fn with_peers(
        kernels: Kernels<D>,
        what: impl Into<String>,
        peers: Box<dyn Peers<D>>,
    ) -> Arc<OnDevice<D>> {
        Self::build(kernels, what.into(), Some(peers))
    }

    fn build(
        kernels: Kernels<D>,
        what: String,
        peers: Option<Box<dyn Peers<D>>>,
    ) -> Arc<OnDevice<D>> {
        Arc::new(OnDevice {
            kernels,
            what,
            state: Mutex::new(State {
                ws: Workspace::new(),
                params: None,
                params_stamp: 0,
                grads: None,
                opt: None,
                acc: None,
                acc_norm: None,
                own: None,
                split: None,
                peers,
                part: None,
                losses: None,
                pending: Vec::new(),
                landing: None,
                param_bits: None,
                graphs: graphs::Graphs::default(),
                eval_graphs: graphs::Graphs::default(),
                sum_next: false,
                summed: false,
                averaging: None,
                averaged: false,
                by_segments: false,
                deferred: None,
                updating: false,
                zeroed: false,
                norms: None,
                norm_next: false,
                normed: false,
            }),
        })
    }
}

impl<D: Device> Drop for OnDevice<D> {
    fn drop(&mut self) {
        // The group's communicator goes first, while the device and every buffer a sum may
        // have touched are still there (NCCL's teardown then finds them as it left them).
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        drop(st.peers.take());
        let dev = self.kernels.device();
        st.graphs.release(|id| dev.drop_graph(id));
        st.eval_graphs.release(|id| dev.drop_graph(id));
    }
}

impl<D: Device> OnDevice<D> {
    /// One copy between the gradient accumulator and a host buffer of `host` elements (refused
    /// at another length), finished before it returns: the host reuses its buffer next step.
    fn copy_accumulator(
        &self,
        host: usize,
        copy: impl FnOnce(&Kernels<D>, &mut D::Buf),
    ) -> Result<(), ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        // A copy up replaces what a step zeroed and the norm's sums (and one down is not worth
        // the bookkeeping).
        st.zeroed = false;
        st.normed = false;
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        same_len("gradient", host, k.device().len(k.view(acc)))?;
        copy(k, acc);
        k.device().sync().map_err(ModelError::Device)
    }
}

/// `slot` with room for `need` floats, its first `keep` kept (a larger buffer copies them over):
/// the window's loss buffer, which grows only while the first window finds its size.
fn grow_keeping<'s, D: Device>(
    k: &Kernels<D>,
    slot: &'s mut Option<D::Buf>,
    keep: usize,
    need: usize,
) -> &'s mut D::Buf {
    let dev = k.device();
    let have = slot.as_ref().map_or(0, |b| dev.len(dev.view(b)));
    if have < need {
        let mut bigger = k.alloc(need.max(2 * have));
        if let Some(old) = slot.as_ref() {
            dev.copy(
                dev.range_mut(&mut bigger, 0..keep),
                dev.sub(dev.view(old), 0..keep),
            );
        }
        *slot = Some(bigger);
    }
    slot.as_mut().expect("allocated above")
}

/// Copies `host` into `slot`: into the buffer it holds when that has the length and the kind
/// asked (`stored`: [`Backend::alloc_stored`], else f32), else into a new one (the model's size
/// is fixed, so only the first time).
fn put<D: Device>(k: &Kernels<D>, slot: &mut Option<D::Buf>, host: &[f32], stored: bool) {
    let dev = k.device();
    let elem = if stored {
        k.stored_elem()
    } else {
        crate::precision::Dtype::F32
    };
    match slot {
        Some(buf) if dev.len(k.view(buf)) == host.len() && dev.elem(k.view(buf)) == elem => {
            k.write(k.view_mut(buf), host)
        }
        _ => {
            let mut buf = if stored {
                k.alloc_stored(host.len())
            } else {
                k.alloc(host.len())
            };
            k.write(k.view_mut(&mut buf), host);
            *slot = Some(buf);
        }
    }
}

/// Uploads the model's parameters unless the device already holds these values (the same
/// stamp): a window's micro-batches and an evaluation's batches upload them once.
fn put_params<D: Device>(k: &Kernels<D>, st: &mut State<D>, model: &Classifier) {
    if st.params.is_none() || st.params_stamp != model.params_stamp() {
        put(k, &mut st.params, &model.params().data, true);
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

    fn start_profile(&self) -> bool {
        self.kernels.device().start_profile()
    }

    fn profile(&self) -> Option<Profile> {
        self.kernels.device().profile()
    }

    fn memory(&self) -> Option<DeviceMemory> {
        self.kernels.device().memory()
    }

    fn reserve(&self, model: &Classifier, batch: usize, eval_batch: usize, seq: usize) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        model.reserve_on(&self.kernels, &mut st.ws, batch, eval_batch, seq);
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
        if matches!(st.split, Some(Split::Pieces(_))) {
            return Err(ModelError::Argument(
                "the device holds ZeRO-3 pieces: its passes run through Resident::micro".into(),
            ));
        }
        st.settle(k);
        put_params(k, st, model);
        put(k, &mut st.grads, grads, false);
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

    fn resident(&self) -> Option<&dyn Resident> {
        Some(self)
    }

    fn forward(&self, model: &Classifier, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        if let Some(Split::Pieces(pc)) = &mut st.split {
            // ZeRO-3: the host gathered the whole parameters for this evaluation; each segment
            // goes up as the forward reads it (rank 0 evaluates alone: no collective).
            let mut src = Upload {
                k,
                host: &model.params().data,
                segs: model.segments(),
                out: &mut pc.seg[0],
            };
            let logits = model.forward_on_with(k, &mut st.ws, batch, &mut src)?;
            k.device().sync().map_err(ModelError::Device)?;
            return Ok(logits);
        }
        put_params(k, st, model);
        let params = st.params.as_ref().unwrap();
        let dev = k.device();
        let ws = &mut st.ws;
        model.set_eval_inputs_on(k, ws, batch)?;
        // Captured and replayed where the device captures (graphs.rs), with peers too: the
        // evaluation forward sums nothing between the ranks.
        let shape = graphs::Shape {
            batch: batch.batch,
            seq: batch.seq,
            loss_weight: 0,
            dropout: false,
            buffers: [dev.ptr(dev.view(params)), 0, 0],
        };
        graphs::run(
            k,
            &mut st.eval_graphs,
            shape,
            |_| true,
            || {
                let mut src = BufParams::new(k, params, model.segments());
                model.eval_pass_on_with(k, ws, batch, &mut src)
            },
        )?;
        let logits = model.eval_logits_on(k, ws, batch);
        dev.sync().map_err(ModelError::Device)?;
        Ok(logits)
    }
}

fn not_uploaded() -> ModelError {
    ModelError::Argument("the device holds no model states yet (Resident::upload)".into())
}
