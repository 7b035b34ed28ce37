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

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::pieces::{self, Gather, Pieces, Rank, Scatter, SharedPeers, Upload};
use super::{Batch, BufGrads, BufParams, Classifier, DropoutKey, ModelError, Workspace};
use crate::backend::device::{grouped, Device, Peers};
use crate::backend::kernels::Kernels;
use crate::backend::{Backend, Loss};
use crate::optim::device::{Accumulate, DeviceOptimizer, Keep, Partitioned, PinnedBuf, Resident};
use crate::optim::Optimizer;
use crate::precision::Dtype;
use crate::zero::{Storage, ZeroError};

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
}

/// What a rank of a group owns ([`Partitioned`]).
enum Split<D: Device> {
    /// ZeRO 1–2: every rank's range of the whole parameters (which `State::params` holds), and
    /// this rank.
    Flat(Vec<Range<usize>>, usize),
    /// ZeRO-3: `State::params` holds this rank's pieces only.
    Pieces(Pieces<D>),
}

/// One micro-batch's gradient on its own, before it is added to the accumulator.
struct Own<D: Device> {
    buf: D::Buf,
    /// The dtypes of the reduction and of the accumulator.
    storage: Storage,
    /// Reduced to each range's owner on the devices first ([`Accumulate::ToOwners`]).
    to_owners: bool,
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
                own: None,
                split: None,
                peers,
                part: None,
                losses: None,
                pending: Vec::new(),
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

    fn resident(&self) -> Option<&dyn Resident> {
        Some(self)
    }

    fn forward(&self, model: &Classifier, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        if let Some(Split::Pieces(pc)) = &mut st.split {
            // ZeRO-3: the host gathered the whole parameters for this evaluation; each segment
            // goes up as the forward reads it (rank 0 evaluates alone: no collective).
            let mut src = Upload {
                k,
                host: &model.params().data,
                segs: model.segments(),
                out: &mut pc.seg,
            };
            let logits = model.forward_on_with(k, &mut st.ws, batch, &mut src)?;
            k.device().sync().map_err(ModelError::Device)?;
            return Ok(logits);
        }
        put_params(k, st, model);
        let logits = model.forward_on(k, &mut st.ws, batch, st.params.as_ref().unwrap())?;
        k.device().sync().map_err(ModelError::Device)?;
        Ok(logits)
    }
}

fn no_peers() -> ModelError {
    ModelError::Argument(
        "this device sums with no other ranks' devices (OnDevice::with_peers)".into(),
    )
}

/// Checks [`Keep::partition`] against the group and the model (one range per rank inside the
/// parameters, or ZeRO-3's map of the model's segments over the group), with the optimizer
/// kept (the partition is what it steps) or the partition's gradient accumulated for the host
/// to step (offload), and makes this rank's [`Split`].
fn split<D: Device>(
    k: &Kernels<D>,
    peers: Option<&dyn Peers<D>>,
    p: Partitioned<'_>,
    model: &Classifier,
    keep: &Keep<'_>,
) -> Result<Split<D>, ModelError> {
    let peers = peers.ok_or_else(no_peers)?;
    let (me, world, n) = (peers.rank(), peers.world(), model.num_params());
    let bad = |what: String| Err(ModelError::Argument(what));
    if keep.optimizer.is_none() && !matches!(keep.accumulate, Accumulate::ToOwners(_)) {
        // Under offload the host steps what the device accumulated: a partition's gradient
        // (ZeRO 2–3), not ZeRO-1's whole one.
        return bad("a partition of the parameters with the optimizer offloaded needs the partition's gradient (ZeRO 2–3)".into());
    }
    match p {
        Partitioned::Flat(ranges) => {
            if ranges.len() != world || ranges.iter().any(|r| r.start > r.end || r.end > n) {
                return bad(format!(
                    "a partition {ranges:?} for {world} ranks and {n} parameters"
                ));
            }
            Ok(Split::Flat(ranges.to_vec(), me))
        }
        Partitioned::Pieces(map) => {
            let Accumulate::ToOwners(storage) = keep.accumulate else {
                return bad("ZeRO-3's pieces reduce their gradients to the owners".into());
            };
            if map.segs != model.segments() || map.parts.iter().any(|p| p.world != world) {
                return bad(format!(
                    "a ZeRO-3 map of {} segments over {:?} ranks for a model of {} segments and a group of {world}",
                    map.segs.len(),
                    map.parts.first().map(|p| p.world),
                    model.segments().len()
                ));
            }
            if model.params().len() != n {
                return bad(
                    "ZeRO-3's pieces are taken from the whole parameters: gather them first".into(),
                );
            }
            Ok(Split::Pieces(Pieces::new(k, map.clone(), me, storage)))
        }
    }
}

/// Every rank's range of `buf` (`ranges[r]` for rank r) broadcast from its owner, in one group:
/// each rank's updated partition on every device.
fn broadcast_ranges<D: Device>(
    dev: &D,
    peers: &mut dyn Peers<D>,
    buf: &mut D::Buf,
    ranges: &[Range<usize>],
) -> Result<(), ModelError> {
    grouped(peers, |p| {
        for (owner, r) in ranges.iter().enumerate() {
            p.broadcast(dev, dev.range_mut(buf, r.clone()), owner)?;
        }
        Ok(())
    })
    .map_err(ModelError::Device)
}

/// Each `(range, owner)` of `buf` summed to its owner, in one group, in the order given (every
/// rank gives the same).
fn reduce_ranges<D: Device>(
    dev: &D,
    peers: &mut dyn Peers<D>,
    buf: &mut D::Buf,
    owners: impl Iterator<Item = (Range<usize>, usize)>,
) -> Result<(), ModelError> {
    grouped(peers, |p| {
        for (r, owner) in owners {
            p.reduce_sum(dev, dev.range_mut(buf, r), owner)?;
        }
        Ok(())
    })
    .map_err(ModelError::Device)
}

fn not_uploaded() -> ModelError {
    ModelError::Argument("the device holds no model states yet (Resident::upload)".into())
}

impl<D> Resident for OnDevice<D>
where
    D: Device + Send + Sync,
    D::Buf: Send,
    D::Ids: Send,
{
    fn upload(&self, model: &Classifier, module: Dtype, keep: Keep<'_>) -> Result<(), ModelError> {
        let k = &self.kernels;
        if k.store() != module {
            return Err(ModelError::Argument(format!(
                "the device stores {:?} values and the run trains in {module:?}",
                k.store()
            )));
        }
        let n = model.params().len();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let split = match keep.partition {
            None => None,
            Some(p) => Some(split(k, st.peers.as_deref(), p, model, &keep)?),
        };
        if matches!(keep.accumulate, Accumulate::ToOwners(_)) && split.is_none() {
            return Err(ModelError::Argument(
                "a gradient reduced to its owners needs the ranks' partition".into(),
            ));
        }
        // The elements this rank's optimizer steps (ZeRO-3: its pieces, all the device holds).
        let mine = match &split {
            None => n,
            Some(Split::Flat(r, me)) => r[*me].len(),
            Some(Split::Pieces(pc)) => pc.local_len(),
        };
        if let Some((opt, master)) = keep.optimizer {
            let lens = [opt.len(), master.map_or(mine, <[f32]>::len)];
            if lens.iter().any(|&l| l != mine) {
                return Err(ModelError::Argument(format!(
                    "optimizer state of {lens:?} elements for {mine} parameters"
                )));
            }
        }
        match &split {
            Some(Split::Pieces(pc)) => st.params = Some(k.upload(&pc.take(&model.params().data))),
            _ => put(k, &mut st.params, &model.params().data),
        }
        st.params_stamp = model.params_stamp();
        // ZeRO 2–3 with peers accumulate their partition only; the others the whole gradient
        // (ZeRO-1's optimizer reading its range of it).
        let (acc, grads_at) = match (&split, keep.accumulate) {
            (_, Accumulate::ToOwners(_)) => (mine, 0..mine),
            (Some(Split::Flat(r, me)), _) => (n, r[*me].clone()),
            _ => (n, 0..n),
        };
        (st.opt, st.acc) = match keep.optimizer {
            Some((opt, master)) => (
                Some(
                    DeviceOptimizer::new(k, opt, master, acc, grads_at)
                        .map_err(|e| ModelError::Argument(e.to_string()))?,
                ),
                None,
            ),
            None => (None, Some(k.alloc(acc))),
        };
        st.own = match keep.accumulate {
            Accumulate::InPlace => None,
            // ZeRO-3's pieces take each segment's gradient as the backward finishes it.
            _ if matches!(split, Some(Split::Pieces(_))) => None,
            Accumulate::Reduced(storage) => Some(Own {
                buf: k.alloc(n),
                storage,
                to_owners: false,
            }),
            Accumulate::ToOwners(storage) => Some(Own {
                buf: k.alloc(n),
                storage,
                to_owners: true,
            }),
        };
        st.split = split;
        k.device().sync().map_err(ModelError::Device)
    }

    fn zero_grads(&self) -> Result<(), ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        k.zero(k.view_mut(accumulator(&mut st.opt, &mut st.acc)?));
        Ok(())
    }

    fn micro(
        &self,
        model: &Classifier,
        batch: &Batch,
        weight: f32,
        dropout: Option<DropoutKey>,
    ) -> Result<Option<f32>, ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let (ws, params) = (&mut st.ws, st.params.as_ref().ok_or_else(not_uploaded)?);
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        // The whole parameters and a whole gradient buffer, segment by segment.
        let segs = model.segments();
        let whole = |ws: &mut Workspace<Kernels<D>>, grads: &mut D::Buf| {
            let mut src = BufParams::new(k, params, segs);
            let mut sink = BufGrads::new(k, grads, segs);
            model.forward_backward_on_with::<_, _, _, ModelError>(
                k, ws, batch, weight, &mut src, &mut sink, dropout,
            )
        };
        let loss = if let Some(Split::Pieces(pc)) = &mut st.split {
            // ZeRO-3: each segment gathered as the pass reads it, each gradient reduced to the
            // owners as the backward finishes it.
            let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
            let peers: SharedPeers<'_, D> = RefCell::new(peers);
            let Pieces {
                map,
                me,
                seg,
                grad,
                storage,
            } = pc;
            let rank = Rank {
                k,
                peers: &peers,
                map,
                me: *me,
            };
            let mut src = Gather {
                rank,
                local: params,
                out: seg,
            };
            let mut sink = Scatter {
                rank,
                grad,
                acc,
                storage: *storage,
            };
            model.forward_backward_on_with::<_, _, _, ModelError>(
                k, ws, batch, weight, &mut src, &mut sink, dropout,
            )?
        } else {
            match &mut st.own {
                None => whole(ws, acc)?,
                Some(own) => {
                    // zero/sinks.rs `ReduceToOwners`/`Scattered`: the micro-batch's gradient on
                    // its own, `Storage::reduced`, then `accumulate` (acc += g, stored as the
                    // module).
                    let (g, storage) = (&mut own.buf, own.storage);
                    k.zero(k.view_mut(g));
                    let loss = whole(ws, g)?;
                    match (&st.split, own.to_owners) {
                        (Some(Split::Flat(ranges, me)), true) => {
                            // Each range summed to its owner, in rank order as every rank calls
                            // them; this rank's made the average as `reduce_to_owners` makes it.
                            let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
                            let owners = ranges.iter().cloned().zip(0..);
                            reduce_ranges(dev, peers, g, owners)?;
                            let (r, inv) = (ranges[*me].clone(), 1.0 / peers.world() as f32);
                            k.scale_round(
                                dev.range_mut(g, r.clone()),
                                inv,
                                storage.comm,
                                storage.module,
                            );
                            k.add_assign(k.view_mut(acc), dev.sub(dev.view(g), r));
                        }
                        _ => {
                            k.round_to(k.view_mut(g), storage.comm);
                            k.round_to(k.view_mut(g), storage.module);
                            k.add_assign(k.view_mut(acc), k.view(g));
                        }
                    }
                    loss
                }
            }
        };
        let Loss::Queued { rows } = loss else {
            return Ok(Some(k.loss(loss)));
        };
        // The rows' losses join the window's on the device; nothing waits for the device here.
        let at = st.pending.last().map_or(0, |&(at, n)| at + n);
        let window = grow_keeping(k, &mut st.losses, at, at + rows);
        k.keep_loss(dev.range_mut(window, at..at + rows));
        st.pending.push((at, rows));
        Ok(None)
    }

    fn window_losses(&self) -> Result<Vec<f32>, ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let pending = std::mem::take(&mut st.pending);
        let Some(&(at, n)) = pending.last() else {
            return Ok(Vec::new());
        };
        let mut rows = vec![0.0f32; at + n];
        if let Some(window) = &st.losses {
            dev.download(dev.sub(dev.view(window), 0..at + n), &mut rows);
        }
        dev.sync().map_err(ModelError::Device)?;
        Ok(pending
            .iter()
            .map(|&(at, n)| k.mean_loss(&rows[at..at + n]))
            .collect())
    }

    fn grad_sq(&self) -> Result<f64, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let sq = st.optimizer()?.grad_sq(k);
        k.device().sync().map_err(ModelError::Device)?;
        Ok(sq)
    }

    fn step(&self, opt: &Optimizer, lr: f64, factors: (f32, f32)) -> Result<(), ZeroError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let dev = k.device();
        let (Some(params), Some(o)) = (st.params.as_mut(), st.opt.as_mut()) else {
            return Err(not_uploaded().into());
        };
        let Some(Split::Flat(ranges, me)) = &st.split else {
            // The whole parameters, or ZeRO-3's pieces (gathered when the next pass reads them).
            o.step(k, k.view_mut(params), opt, lr, factors)?;
            // The passes read these parameters as they are: no upload until the host changes
            // them.
            return Ok(dev.sync().map_err(ModelError::Device)?);
        };
        o.step(
            k,
            dev.range_mut(params, ranges[*me].clone()),
            opt,
            lr,
            factors,
        )?;
        // Every rank's updated partition from its owner: the whole parameters on every device.
        let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
        broadcast_ranges(dev, peers, params, ranges)?;
        // The passes read these parameters as they are: no upload until the host changes them.
        Ok(k.device().sync().map_err(ModelError::Device)?)
    }

    fn download(
        &self,
        model: &mut Classifier,
        opt: Option<&mut Optimizer>,
        master: Option<&mut [f32]>,
    ) -> Result<(), ZeroError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let params = st.params.as_ref().ok_or_else(not_uploaded)?;
        match &mut st.split {
            Some(Split::Pieces(pc)) => {
                // Every rank takes part (`Replica::gather_whole`).
                let n = model.num_params();
                same_len("parameter", model.params().len(), n)?;
                let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
                pieces::download_whole(k, peers, pc, params, model.params_mut())?;
            }
            _ => k.download(k.view(params), model.params_mut()),
        }
        // The host now holds what the device holds: an evaluation uploads nothing.
        st.params_stamp = model.params_stamp();
        if let (Some(dev), Some(opt)) = (st.opt.as_ref(), opt) {
            dev.download(k, opt, master)?;
        }
        Ok(k.device().sync().map_err(ModelError::Device)?)
    }

    fn pinned(&self, n: usize) -> PinnedBuf {
        Box::new(self.kernels.device().alloc_pinned(n))
    }

    fn download_grads(&self, dst: &mut [f32]) -> Result<(), ModelError> {
        self.copy_accumulator(dst.len(), |k, acc| k.download(k.view(acc), dst))
    }

    fn upload_grads(&self, src: &[f32]) -> Result<(), ModelError> {
        self.copy_accumulator(src.len(), |k, acc| k.write(k.view_mut(acc), src))
    }

    fn peers(&self) -> Option<(usize, usize)> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.peers.as_ref().map(|p| (p.rank(), p.world()))
    }

    fn average_grads(&self, storage: Storage) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let peers = st.peers.as_mut().ok_or_else(no_peers)?;
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        peers
            .all_reduce_sum(dev, dev.view_mut(acc))
            .map_err(ModelError::Device)?;
        let inv = 1.0 / peers.world() as f32;
        k.scale_round(dev.view_mut(acc), inv, storage.comm, storage.module);
        dev.sync().map_err(ModelError::Device)
    }

    fn reduce_to_owners(
        &self,
        owners: &[(Range<usize>, usize)],
        storage: Storage,
        dst: &mut [f32],
    ) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let peers = st.peers.as_mut().ok_or_else(no_peers)?;
        let (me, inv) = (peers.rank(), 1.0 / peers.world() as f32);
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        let n = dev.len(dev.view(acc));
        if let Some((r, _)) = owners.iter().find(|(r, _)| r.end > n || r.start > r.end) {
            return Err(ModelError::Argument(format!(
                "gradient range {r:?} of a device accumulator of {n}"
            )));
        }
        reduce_ranges(dev, &mut **peers, acc, owners.iter().cloned())?;
        let mine: Vec<Range<usize>> = owners
            .iter()
            .filter(|(_, o)| *o == me)
            .map(|(r, _)| r.clone())
            .collect();
        same_len(
            "gradient partition",
            dst.len(),
            mine.iter().map(Range::len).sum(),
        )?;
        for r in &mine {
            k.scale_round(
                dev.range_mut(acc, r.clone()),
                inv,
                storage.comm,
                storage.module,
            );
        }
        if let [r] = &mine[..] {
            // One range (ZeRO-2's flat partition): straight to the host.
            dev.download(dev.sub(dev.view(acc), r.clone()), dst);
        } else {
            // ZeRO-3's pieces, one per segment: packed on the device, then one copy.
            let part = st.part.get_or_insert_with(|| k.alloc(dst.len()));
            let mut at = 0;
            for r in &mine {
                let src = dev.sub(dev.view(acc), r.clone());
                dev.copy(dev.range_mut(part, at..at + r.len()), src);
                at += r.len();
            }
            dev.download(dev.sub(dev.view(part), 0..at), dst);
        }
        dev.sync().map_err(ModelError::Device)
    }

    fn upload_params(&self, src: &[f32]) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let params = st.params.as_mut().ok_or_else(not_uploaded)?;
        if let Some(Split::Flat(ranges, me)) = &st.split {
            // ZeRO-2 offloaded with peers: this rank's partition up, then every partition from
            // its owner (DeepSpeed's all-gather after the CPU step).
            let mine = ranges[*me].clone();
            same_len("parameter partition", src.len(), mine.len())?;
            k.write(dev.range_mut(params, mine), src);
            let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
            broadcast_ranges(dev, peers, params, ranges)?;
            return dev.sync().map_err(ModelError::Device);
        }
        // The whole parameters, or ZeRO-3's pieces (which are all the device holds).
        same_len("parameter", src.len(), dev.len(k.view(params)))?;
        k.write(k.view_mut(params), src);
        // The source is pinned on a GPU: the copy is asynchronous, and the host writes it again
        // at the next step, so it must be finished before this returns.
        k.device().sync().map_err(ModelError::Device)
    }
}
