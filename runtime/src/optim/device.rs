//! The optimizer on the device, for a run on one device (any ZeRO stage, no optimizer offload)
//! or on several that sum directly (ZeRO 0–3: each rank steps the whole model or its
//! partition, [`Keep::partition`]): Adam / AdamW, SGD, Adagrad and LAMB, each stepped by its
//! kernel in `runtime/kernels/optim.cu`.
//! Under optimizer offload the same [`Resident`] keeps only the parameters and the gradient
//! accumulator on the device, and the host steps (`zero::Replica`).
//!
//! The gradient accumulator, the optimizer's state buffers and, under mixed precision, the fp32
//! master weights stay on the device across micro-batches and optimizer steps, beside the
//! parameters the passes read. Per step only scalars cross to the host: `Σ g²` (the norm, whose
//! inf/NaN is the overflow check the host's loss scaler consumes) and the loss. The host keeps
//! every decision — the scaler, the clip coefficient or unscale factor, with the formulas of
//! `zero/replica.rs`, and how the optimizer applies them ([`Optimizer::grad_factors`]) — and the
//! kernel applies those factors as the host optimizer does (bit-identical:
//! runtime/emu/tests/optim.rs). Which kernel runs is data: the host [`Optimizer`] handed to
//! [`Resident::step`] (its kind, hyper-parameters and step count), matched against the
//! states uploaded from it. [`Resident::download`] brings the states back when the host needs
//! them (a checkpoint, an evaluation, the final save), so those stay the CPU's files.

use std::ops::Range;

use super::{adagrad, adam, lamb, sgd, OptimError, Optimizer};
use crate::backend::device::Device;
use crate::backend::kernels::{self, DecayMask, Kernels, LambTensors, RowMarks, NORM_BLOCKS};
use crate::backend::Backend;
use crate::model::{Batch, Classifier, DropoutKey, ModelError};
use crate::precision::Dtype;
use crate::zero::{SegmentParts, Storage, ZeroError};

/// How each micro-batch's gradient reaches the device's accumulator, as the host's ZeRO stage
/// accumulates it (`zero/replica.rs` `Replica::micro`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    /// ZeRO 0–1: the backward adds into the accumulator in place
    /// ([`Classifier::forward_backward`] into the whole gradient buffer).
    InPlace,
    /// ZeRO-2/3: the backward writes into a zeroed buffer of its own, which is rounded as a
    /// reduced gradient and added to the accumulator (`zero/sinks.rs`: `Storage::reduced`, then
    /// `accumulate`). With one rank the reduce-scatter is the identity, so this is all of it,
    /// and it keeps the host's sums bit for bit.
    Reduced(Storage),
    /// ZeRO-2 on several devices that sum directly ([`Keep::partition`]): the backward writes
    /// into a zeroed buffer of its own, each rank's range of which is summed to that rank on
    /// the devices (DeepSpeed's reduce of each partition to its owner); this rank's range is
    /// made the average, rounded as a reduced gradient and added to the accumulator, which is
    /// the partition's length (`zero/sinks.rs` `ReduceToOwners`, on the devices).
    ToOwners(Storage),
}

/// What [`Resident::upload`] keeps on the device besides the parameters and the gradient
/// accumulator.
#[derive(Debug, Clone, Copy)]
pub struct Keep<'a> {
    /// The optimizer stepped on the device: its state, and the fp32 master weights under mixed
    /// precision, are uploaded. `None` under optimizer offload: the host keeps and steps them.
    pub optimizer: Option<(&'a Optimizer, Option<&'a [f32]>)>,
    /// How micro-batch gradients are accumulated.
    pub accumulate: Accumulate,
    /// Several devices that sum directly (`zero::Replica::attach_device`): what this rank
    /// owns, which its optimizer (state and master weights of that length) steps. `None`: the
    /// optimizer steps the whole buffer.
    pub partition: Option<Partitioned<'a>>,
}

/// How the ranks of [`Keep::partition`] share the parameters.
#[derive(Debug, Clone, Copy)]
pub enum Partitioned<'a> {
    /// ZeRO 1–2: every rank's range of the flat buffer, by rank. Each device holds the whole
    /// parameters; each range is broadcast from its owner after the step (DeepSpeed's
    /// all-gather of the updated partitions).
    Flat(&'a [Range<usize>]),
    /// ZeRO-3: every segment split over the ranks. Each device holds its rank's pieces only,
    /// gathers a segment when a pass reads it and reduces its gradient to the owners when the
    /// backward finishes it (`model::pieces`); the accumulation must be
    /// [`Accumulate::ToOwners`].
    Pieces(&'a SegmentParts),
}

/// Host memory a device copies to and from directly ([`Device::Pinned`]), behind the object-safe
/// [`Resident`].
pub type PinnedBuf = Box<dyn std::ops::DerefMut<Target = [f32]> + Send>;

/// Host memory a device writes into after the call that was handed it has returned
/// ([`Resident::land_next`]): the address and length of a [`PinnedBuf`].
#[derive(Debug)]
pub struct Landing {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: an address into pinned host memory, which `Landing::new`'s contract keeps alive and
// untouched while the device writes it; moving it between threads changes nothing.
unsafe impl Send for Landing {}

impl Landing {
    /// Where `buf` is.
    ///
    /// # Safety
    /// `buf` is [`Resident::pinned`] memory that stays allocated, and that nothing else reads or
    /// writes, until the [`Resident::landed`] that follows has returned.
    pub unsafe fn new(buf: &mut [f32]) -> Landing {
        Landing {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// Floats it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of element `at` (at most [`Landing::len`]).
    pub fn at(&self, at: usize) -> *mut f32 {
        assert!(at <= self.len, "landing offset {at} past {}", self.len);
        // SAFETY: inside (or one past) the buffer `new` was given.
        unsafe { self.ptr.add(at) }
    }
}

/// What the training loop asks of a device that keeps the model states; `model::OnDevice`
/// implements it over its kernels and the parameter buffer its passes read.
pub trait Resident: Send + Sync {
    /// Uploads `model`'s parameters and what `keep` says, and allocates the gradient accumulator
    /// and the step's scratch: once per run. Refused when the device does not store `module`,
    /// the dtype the run trains in.
    fn upload(&self, model: &Classifier, module: Dtype, keep: Keep<'_>) -> Result<(), ModelError>;
    /// Zeroes the gradient accumulator (a window starts).
    fn zero_grads(&self) -> Result<(), ModelError>;
    /// One micro-batch's forward and backward with the device's parameters, its gradient
    /// (× `weight`) added to the device's accumulator. Its mean loss: `Some` when read at once,
    /// `None` when it stays on the device until [`Resident::window_losses`] — the host then
    /// goes on to prepare and queue the next micro-batch while the device runs this one.
    fn micro(
        &self,
        model: &Classifier,
        batch: &Batch,
        weight: f32,
        dropout: Option<DropoutKey>,
    ) -> Result<Option<f32>, ModelError>;
    /// The mean losses of the micro-batches [`Resident::micro`] left on the device since the
    /// last call, in order, read in one copy (which waits for the device, and reports its
    /// errors).
    fn window_losses(&self) -> Result<Vec<f32>, ModelError>;
    /// `Σ g²` of the accumulator, in f64 ([`kernels::grad_norm_sq`]). The optimizer must be kept,
    /// or (ZeRO-1 offloaded with peers) the whole gradient accumulated with a partition.
    fn grad_sq(&self) -> Result<f64, ModelError>;
    /// The next [`Resident::micro`], a window's last, sums each segment's `Σ g²` as its backward
    /// finishes the segment, beside the rest, so that the [`Resident::grad_sq`] after it only
    /// adds the segments' sums ([`kernels::SegmentNorms`]). Returns whether it will: by default
    /// it does not, and `grad_sq` reads the whole accumulator.
    fn norm_next(&self) -> bool {
        false
    }
    /// One step of `opt` (the host's optimizer before it counts this step: the kind,
    /// hyper-parameters and step count the kernel takes) at `lr`, each gradient taken as
    /// `(g · mult) / div` with `factors = (mult, div)` from [`Optimizer::grad_factors`]. The
    /// optimizer must be kept.
    fn step(&self, opt: &Optimizer, lr: f64, factors: (f32, f32)) -> Result<(), ZeroError>;
    /// Copies the parameters into `model` and, when the optimizer is kept and `opt` is given,
    /// the optimizer's state into `opt` (LAMB's trust ratios too) and the master weights into
    /// `master` (mixed precision).
    fn download(
        &self,
        model: &mut Classifier,
        opt: Option<&mut Optimizer>,
        master: Option<&mut [f32]>,
    ) -> Result<(), ZeroError>;
    /// `n` floats of host memory the device copies to and from directly (page-locked on a GPU),
    /// for optimizer offload's two copies per step. Allocate once per run.
    fn pinned(&self, n: usize) -> PinnedBuf;
    /// Optimizer offload: copies the gradient accumulator into `dst` (one device → host copy per
    /// optimizer step; `dst` from [`Resident::pinned`]); ZeRO-1 with peers, whose accumulator is
    /// the whole averaged gradient, copies this rank's range of it.
    fn download_grads(&self, dst: &mut [f32]) -> Result<(), ModelError>;
    /// Optimizer offload: the next [`Resident::micro`], a window's last, copies each segment of
    /// the gradient accumulator into `dst` as its backward finishes the segment, on a copy
    /// stream, while the device goes on with the rest of the backward (DeepSpeed copies its
    /// gradient buckets down during the backward the same way); [`Resident::landed`] waits for
    /// the copies, in place of [`Resident::download_grads`]. With peers at ZeRO 2–3 the
    /// accumulator is the rank's partition, and each segment's piece of it goes down once it is
    /// reduced and added. ZeRO-1 with peers averages the whole accumulator: each segment, once
    /// summed over the devices ([`Resident::sum_next`]), is made the average as
    /// [`Resident::average_grads`] makes it with `storage`, and its part in this rank's range
    /// goes down (`dst` holds the range); `average_grads` then only waits for the sums. Returns
    /// whether it will: by default it does not, and the window is downloaded after its last
    /// micro-batch.
    fn land_next(&self, _dst: Landing, _storage: Storage) -> bool {
        false
    }
    /// Waits for the copies of the last [`Resident::land_next`]; the device's errors.
    fn landed(&self) -> Result<(), ModelError> {
        Ok(())
    }
    /// Optimizer offload: queues the copy of `src`, the host optimizer's updated values of
    /// elements `at .. at + src.len()` of what [`Resident::upload_params`] takes (the whole
    /// parameters, or with peers this rank's partition or ZeRO-3 pieces), to the device on its
    /// copy stream, while the host steps
    /// the next range; [`Resident::params_uploaded`] waits for the copies. Returns whether it
    /// did: by default not, and the caller uploads the whole with
    /// [`Resident::upload_params`] after the step.
    ///
    /// # Safety
    /// `src` is [`Resident::pinned`] memory that stays allocated and unwritten until
    /// [`Resident::params_uploaded`] has returned.
    unsafe fn upload_params_part(&self, _at: usize, _src: &[f32]) -> bool {
        false
    }
    /// Waits for the copies [`Resident::upload_params_part`] queued; the device's errors. With
    /// peers at ZeRO-2 (where `upload_params_part` takes this rank's partition) every
    /// partition is then broadcast from its owner, as [`Resident::upload_params`] ends: every
    /// rank calls it.
    fn params_uploaded(&self) -> Result<(), ModelError> {
        Ok(())
    }
    /// Optimizer offload: replaces the device's parameters with `src`, the host optimizer's
    /// updated values (one host → device copy per optimizer step; `src` from
    /// [`Resident::pinned`]).
    fn upload_params(&self, src: &[f32]) -> Result<(), ModelError>;
    /// Several ranks at ZeRO-0: replaces the gradient accumulator with `src`, the window's
    /// gradients averaged over the ranks on the host (one host → device copy per step).
    fn upload_grads(&self, src: &[f32]) -> Result<(), ModelError>;
    /// Several ranks whose devices sum their buffers directly ([`crate::backend::device::Peers`]): this device's
    /// `(rank, world)` in that group, or `None` when it has no peers (the ranks then exchange
    /// through the host).
    fn peers(&self) -> Option<(usize, usize)>;
    /// ZeRO 0–1 with peers: the gradient accumulator summed over the ranks' devices, made the
    /// average and rounded as the host's all-reduce makes it (`ReduceOp::Avg`, then
    /// `Storage::reduced`), in place on every rank. Every rank calls it.
    fn average_grads(&self, storage: Storage) -> Result<(), ModelError>;
    /// ZeRO 0–1 with peers: the next [`Resident::micro`], a window's last, sums each segment of
    /// the gradient accumulator over the ranks' devices as its backward finishes the segment,
    /// while the device goes on with the rest of the backward (DeepSpeed's `overlap_comm`);
    /// the [`Resident::average_grads`] that follows only waits for the sums and makes the
    /// average. Returns whether it will (every rank of a group gives the same answer); by
    /// default it does not, and `average_grads` sums the whole accumulator.
    fn sum_next(&self) -> bool {
        false
    }
    /// ZeRO 2–3 with peers: each `(range, owner)` of the gradient accumulator summed to rank
    /// `owner` (DeepSpeed's reduce of each partition's slice to its owner), this rank's own
    /// ranges made the average and rounded as [`Resident::average_grads`] does, and copied in
    /// order into `dst`, their total length (one device → host copy). Every rank calls it with
    /// the same list.
    fn reduce_to_owners(
        &self,
        owners: &[(Range<usize>, usize)],
        storage: Storage,
        dst: &mut [f32],
    ) -> Result<(), ModelError>;
}

/// The per-element state of each optimizer on the device, named as the host's [`super::OptimState`]
/// names it.
enum States<D: Device> {
    /// Adam / AdamW: `exp_avg`, `exp_avg_sq`.
    Adam { m: D::Buf, v: D::Buf },
    /// SGD: `momentum_buffer`, when the momentum is not 0.
    Sgd { momentum: Option<D::Buf> },
    /// Adagrad: `sum`.
    Adagrad { sum: D::Buf },
    /// LAMB: `exp_avg`, `exp_avg_sq`, and its per-tensor layout and scratch.
    Lamb {
        m: D::Buf,
        v: D::Buf,
        tensors: LambTensors<D>,
    },
}

impl<D: Device> States<D> {
    /// The buffers by the host state's names.
    fn named(&self) -> Vec<(&'static str, &D::Buf)> {
        match self {
            States::Adam { m, v } | States::Lamb { m, v, .. } => {
                debug_assert_eq!(adam::BUFFERS, lamb::BUFFERS);
                vec![(adam::BUFFERS[0], m), (adam::BUFFERS[1], v)]
            }
            States::Sgd { momentum } => momentum.iter().map(|b| (sgd::BUFFER, b)).collect(),
            States::Adagrad { sum } => vec![(adagrad::BUFFER, sum)],
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            States::Adam { .. } => adam::FAMILY,
            States::Sgd { .. } => sgd::FAMILY,
            States::Adagrad { .. } => adagrad::FAMILY,
            States::Lamb { .. } => lamb::FAMILY,
        }
    }
}

/// The device buffers of [`Resident`] besides the parameters (which the passes own).
pub struct DeviceOptimizer<D: Device> {
    grads: D::Buf,
    /// The accumulator's elements the step reads: all of it, or at ZeRO-1 on several devices
    /// this rank's partition of the whole gradient.
    grads_at: Range<usize>,
    states: States<D>,
    master: Option<D::Buf>,
    mask: DecayMask<D>,
    /// The norm's partial sums.
    norm: D::Buf,
    /// The model's segments, each with its decay mask, where the step may update them one at a
    /// time ([`DeviceOptimizer::by_segments`]); empty until then.
    segments: Vec<(Range<usize>, DecayMask<D>)>,
    /// The table at the start of the first segment whose rows the forward reads by token id,
    /// where its step may go in two parts ([`DeviceOptimizer::rows_first`]).
    rows: Option<RowsFirst<D>>,
}

/// The word embeddings at the start of the first segment, stepped in two parts: the rows the
/// next micro-batch's tokens name before its forward, the rest beside it (docs/cuda.md, "The
/// step beside the forward").
struct RowsFirst<D: Device> {
    /// Which rows the tokens name (allocated once).
    marks: RowMarks<D>,
    row_len: usize,
    /// The decay mask of the segment's elements past the table (its other tensors).
    tail: DecayMask<D>,
}

/// Which part of a first segment's step put off ([`DeviceOptimizer::step_first`]).
pub enum FirstPart<'i, D: Device> {
    /// Before the micro-batch's forward: the table's rows its first `usize` token ids name,
    /// each once, and the segment's elements past the table.
    Rows(&'i D::Ids, usize),
    /// Beside it: the table's other rows (the same tokens, whose marks are then cleared).
    Rest(&'i D::Ids, usize),
    /// All of it, where no micro-batch's tokens come first.
    Whole,
}

/// A first segment's step put off until the next micro-batch's tokens are on the device
/// ([`DeviceOptimizer::defer_first`]): AdamW's arguments as the step was asked for.
#[derive(Debug, Clone, Copy)]
pub struct Deferred {
    cfg: adam::AdamConfig,
    /// The step count after this step.
    t: u64,
    lr: f64,
    mult: f32,
}

impl<D: Device> DeviceOptimizer<D> {
    /// `opt`'s state and `master` on the device, and a zero gradient accumulator of `acc`
    /// elements whose `grads_at` the step reads (`opt`'s length; `0..opt.len()` unless ZeRO-1
    /// partitions the optimizer over a whole accumulator).
    pub fn new(
        k: &Kernels<D>,
        opt: &Optimizer,
        master: Option<&[f32]>,
        acc: usize,
        grads_at: Range<usize>,
    ) -> Result<DeviceOptimizer<D>, OptimError> {
        let n = opt.len();
        if grads_at.len() != n || grads_at.end > acc {
            return Err(OptimError::Length {
                what: "device optimizer's gradient range",
                found: grads_at.len(),
                expected: n,
            });
        }
        let host = opt.state();
        let up = |name: &str| -> D::Buf { k.upload(host.buffer(name)) };
        let states = match opt {
            Optimizer::Adam(_) => States::Adam {
                m: up(adam::BUFFERS[0]),
                v: up(adam::BUFFERS[1]),
            },
            Optimizer::Sgd(_) => States::Sgd {
                momentum: host
                    .buffers
                    .contains_key(sgd::BUFFER)
                    .then(|| up(sgd::BUFFER)),
            },
            Optimizer::Adagrad(_) => States::Adagrad {
                sum: up(adagrad::BUFFER),
            },
            Optimizer::Lamb(_) => States::Lamb {
                m: up(lamb::BUFFERS[0]),
                v: up(lamb::BUFFERS[1]),
                tensors: LambTensors::new(k, opt.segments(), n)?,
            },
        };
        Ok(DeviceOptimizer {
            grads: k.alloc(acc),
            grads_at,
            states,
            master: master.map(|w| k.upload(w)),
            mask: DecayMask::from_segments(k, opt.segments(), n),
            norm: k.alloc(kernels::norm_scratch_len(acc, NORM_BLOCKS)),
            segments: Vec::new(),
            rows: None,
        })
    }

    /// Makes [`DeviceOptimizer::step_segment`] possible over `segs`, the model's segments
    /// (ascending, covering the optimizer's whole length): each segment's decay mask, uploaded
    /// once, before the first step. False, and nothing made, for LAMB (its trust ratios are
    /// per tensor over the whole step: `lamb_step`'s passes) or segments that do not cover the
    /// buffer.
    pub fn by_segments(&mut self, k: &Kernels<D>, opt: &Optimizer, segs: &[Range<usize>]) -> bool {
        let n = self.len();
        let covers = segs.first().is_some_and(|s| s.start == 0)
            && segs.windows(2).all(|w| w[0].end == w[1].start)
            && segs.last().is_some_and(|s| s.end == n);
        if matches!(self.states, States::Lamb { .. }) || !covers || opt.len() != n {
            self.segments.clear();
            return false;
        }
        if self.segments.len() == segs.len()
            && self.segments.iter().zip(segs).all(|((r, _), s)| r == s)
        {
            return true;
        }
        self.segments = segs
            .iter()
            .map(|seg| {
                // The optimizer's decaying ranges inside the segment, from its start.
                let inside: Vec<(Range<usize>, bool)> = opt
                    .segments()
                    .iter()
                    .filter_map(|(r, d)| {
                        let (s, e) = (r.start.max(seg.start), r.end.min(seg.end));
                        (s < e).then(|| (s - seg.start..e - seg.start, *d))
                    })
                    .collect();
                let mask = DecayMask::from_segments(k, &inside, seg.len());
                (seg.clone(), mask)
            })
            .collect();
        true
    }

    /// The segments [`DeviceOptimizer::by_segments`] made: their count (0 when none).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
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

    /// The range of segment `seg` of [`DeviceOptimizer::by_segments`] in the parameters.
    pub fn segment(&self, seg: usize) -> Range<usize> {
        self.segments[seg].0.clone()
    }

    /// `grads = 0` over segment `seg` of [`DeviceOptimizer::by_segments`] (after its step: the
    /// next window's accumulation starts there).
    pub fn zero_segment(&mut self, k: &Kernels<D>, seg: usize) {
        let r = self.segments[seg].0.clone();
        let at = self.grads_at.start;
        k.zero(
            k.device()
                .range_mut(&mut self.grads, at + r.start..at + r.end),
        );
    }

    /// Lets the first segment's AdamW step go in two parts ([`DeviceOptimizer::defer_first`]):
    /// `rows` rows of `row_len` elements at its start are a table the forward reads by token id
    /// (BERT's word embeddings). Made once, after [`DeviceOptimizer::by_segments`]; false, and
    /// nothing made, for another optimizer or a table that does not fit the segment.
    pub fn rows_first(
        &mut self,
        k: &Kernels<D>,
        opt: &Optimizer,
        rows: usize,
        row_len: usize,
    ) -> bool {
        let table = rows * row_len;
        let Some(seg) = self.segments.first().map(|(r, _)| r.clone()) else {
            return false;
        };
        if !matches!(self.states, States::Adam { .. }) || table == 0 || table > seg.len() {
            self.rows = None;
            return false;
        }
        // The optimizer's decaying ranges past the table, from its end.
        let start = seg.start + table;
        let inside: Vec<(Range<usize>, bool)> = opt
            .segments()
            .iter()
            .filter_map(|(r, d)| {
                let (s, e) = (r.start.max(start), r.end.min(seg.end));
                (s < e).then(|| (s - start..e - start, *d))
            })
            .collect();
        self.rows = Some(RowsFirst {
            marks: RowMarks::new(k, rows),
            row_len,
            tail: DecayMask::from_segments(k, &inside, seg.end - start),
        });
        true
    }

    /// Whether [`DeviceOptimizer::rows_first`] made its table.
    pub fn has_rows_first(&self) -> bool {
        self.rows.is_some()
    }

    /// The first segment's step as [`DeviceOptimizer::step_segment`] would take it, put off:
    /// `None` where [`DeviceOptimizer::rows_first`] made nothing or `opt` is not AdamW with one
    /// gradient multiplier.
    pub fn defer_first(
        &self,
        opt: &Optimizer,
        lr: f64,
        (mult, div): (f32, f32),
    ) -> Option<Deferred> {
        let Optimizer::Adam(o) = opt else {
            return None;
        };
        (self.rows.is_some() && div == 1.0 && lr.is_finite()).then(|| Deferred {
            cfg: *o.config(),
            t: opt.steps() + 1,
            lr,
            mult,
        })
    }

    /// A `part` of a first segment's step put off by [`DeviceOptimizer::defer_first`]
    /// (`params`: that segment's parameters): [`FirstPart::Rows`] then [`FirstPart::Rest`] with
    /// the same tokens, or [`FirstPart::Whole`]; by the last part the segment's gradient is
    /// zeroed for the next window (as [`DeviceOptimizer::step_segment_zeroing`] leaves it).
    pub fn step_first<'a>(
        &'a mut self,
        k: &Kernels<D>,
        params: D::ViewMut<'a>,
        d: &Deferred,
        part: FirstPart<'_, D>,
    ) -> Result<(), OptimError> {
        let dev = k.device();
        let (Some(rows), Some((seg, mask)), States::Adam { m, v }) =
            (&self.rows, self.segments.first(), &mut self.states)
        else {
            return Err(OptimError::Config(
                "a deferred step without a rows-first table".into(),
            ));
        };
        let n = seg.len();
        if dev.len_mut(&params) != n {
            return Err(OptimError::Length {
                what: "device optimizer's parameters",
                found: dev.len_mut(&params),
                expected: n,
            });
        }
        let table = rows.marks.rows() * rows.row_len;
        let gr = self.grads_at.start + seg.start..self.grads_at.start + seg.end;
        let (mut m, mut v) = (dev.range_mut(m, seg.clone()), dev.range_mut(v, seg.clone()));
        let (mut weights, mut work) = match &mut self.master {
            None => (params, None),
            Some(master) => (dev.range_mut(master, seg.clone()), Some(params)),
        };
        let (cfg, t, lr, mult) = (&d.cfg, d.t, d.lr, d.mult);
        let done = match part {
            FirstPart::Whole => {
                // The gradient zeroed as it is read, as a segment's step by `Resident::step`.
                let grads = dev.range_mut(&mut self.grads, gr.clone());
                kernels::adamw_step_zeroing(k, cfg, t, lr, mult, mask, weights, grads, m, v, work)
            }
            FirstPart::Rows(ids, ntok) | FirstPart::Rest(ids, ntok) => {
                let grads = dev.sub(k.view(&self.grads), gr.clone());
                let rows_part = matches!(part, FirstPart::Rows(..));
                if rows_part {
                    kernels::rows_mark(k, &rows.marks, ids, ntok);
                }
                kernels::adamw_rows(
                    k,
                    cfg,
                    t,
                    lr,
                    mult,
                    mask,
                    dev.sub_mut(&mut weights, 0..n),
                    grads,
                    dev.sub_mut(&mut m, 0..n),
                    dev.sub_mut(&mut v, 0..n),
                    work.as_mut().map(|w| dev.sub_mut(w, 0..n)),
                    (&rows.marks, rows.row_len),
                    rows_part.then_some((ids, ntok)),
                )?;
                if rows_part {
                    // The segment's other tensors (position and token-type embeddings, the
                    // LayerNorm), which every forward reads.
                    kernels::adamw_step(
                        k,
                        cfg,
                        t,
                        lr,
                        mult,
                        &rows.tail,
                        dev.sub_mut(&mut weights, table..n),
                        dev.sub(grads, table..n),
                        dev.sub_mut(&mut m, table..n),
                        dev.sub_mut(&mut v, table..n),
                        work.as_mut().map(|w| dev.sub_mut(w, table..n)),
                    )
                } else {
                    kernels::rows_unmark(k, &rows.marks, ids, ntok);
                    Ok(())
                }
            }
        };
        done?;
        if matches!(part, FirstPart::Rest(..)) {
            // The next window's accumulation starts there (`zero_segment`).
            k.zero(dev.range_mut(&mut self.grads, gr));
        }
        Ok(())
    }

    /// `Σ g²` of the accumulator (its scratch allocated once, in [`DeviceOptimizer::new`]).
    pub fn grad_sq(&mut self, k: &Kernels<D>) -> f64 {
        kernels::grad_norm_sq_in(k, k.view(&self.grads), &mut self.norm)
    }

    /// One step of `params` (the module's parameters on the device, the optimizer's length:
    /// all of them, or this rank's partition) by `opt`'s rule, as [`Resident::step`]. In fp32
    /// they are the weights the step updates; under mixed precision the fp32 master is, and
    /// `params` receives it rounded to the module's dtype, as `zero::HostOptimizer` writes it
    /// back.
    pub fn step<'a>(
        &'a mut self,
        k: &Kernels<D>,
        params: D::ViewMut<'a>,
        opt: &Optimizer,
        lr: f64,
        factors: (f32, f32),
    ) -> Result<(), OptimError> {
        self.step_on(k, params, opt, lr, factors, None, false)
    }

    /// [`DeviceOptimizer::step`] of segment `seg` of [`DeviceOptimizer::by_segments`] alone:
    /// `params` is that segment's parameters. The same operations on the same elements as the
    /// whole step (each element's update reads only its own), so every segment stepped once is
    /// the whole step, bit for bit.
    pub fn step_segment<'a>(
        &'a mut self,
        k: &Kernels<D>,
        params: D::ViewMut<'a>,
        opt: &Optimizer,
        lr: f64,
        factors: (f32, f32),
        seg: usize,
    ) -> Result<(), OptimError> {
        self.check_segment(seg)?;
        self.step_on(k, params, opt, lr, factors, Some(seg), false)
    }

    /// [`DeviceOptimizer::step_segment`], then the segment's gradient zeroed for the next
    /// window ([`DeviceOptimizer::zero_segment`]): AdamW sets each gradient to 0 as it reads
    /// it (`adamw_step_zeroing`), one pass and one launch where a memset followed; the other
    /// optimizers zero it after their step.
    pub fn step_segment_zeroing<'a>(
        &'a mut self,
        k: &Kernels<D>,
        params: D::ViewMut<'a>,
        opt: &Optimizer,
        lr: f64,
        factors: (f32, f32),
        seg: usize,
    ) -> Result<(), OptimError> {
        self.check_segment(seg)?;
        self.step_on(k, params, opt, lr, factors, Some(seg), true)
    }

    /// Refuses a segment [`DeviceOptimizer::by_segments`] did not make.
    fn check_segment(&self, seg: usize) -> Result<(), OptimError> {
        if seg >= self.segments.len() {
            return Err(OptimError::Config(format!(
                "segment {seg} of a step made by {} segments",
                self.segments.len()
            )));
        }
        Ok(())
    }

    /// The elements of segment `seg` (all of them for `None`) of the step; with `zero`, their
    /// gradient zeroed after it.
    #[allow(clippy::too_many_arguments)]
    fn step_on<'a>(
        &'a mut self,
        k: &Kernels<D>,
        params: D::ViewMut<'a>,
        opt: &Optimizer,
        lr: f64,
        (mult, div): (f32, f32),
        seg: Option<usize>,
        zero: bool,
    ) -> Result<(), OptimError> {
        let dev = k.device();
        let (part, mask) = match seg {
            Some(i) => (self.segments[i].0.clone(), &self.segments[i].1),
            None => (0..self.len(), &self.mask),
        };
        let n = part.len();
        if dev.len_mut(&params) != n || opt.len() != self.len() {
            return Err(OptimError::Length {
                what: "device optimizer's parameters",
                found: dev.len_mut(&params),
                expected: n,
            });
        }
        if n == 0 {
            // A rank that owns nothing (more ranks than elements) steps nothing.
            return Ok(());
        }
        if self.master.is_none() && dev.elem(dev.as_view(&params)).is_half() {
            // The kernels update f32 weights: 16-bit parameters are only their rounded copy.
            return Err(OptimError::Config(
                "16-bit parameters are stepped through fp32 master weights, and none were uploaded"
                    .into(),
            ));
        }
        let t = opt.steps() + 1;
        let (weights, work) = match &mut self.master {
            None => (params, None),
            Some(master) => (dev.range_mut(master, part.clone()), Some(params)),
        };
        let at = self.grads_at.start;
        let gr = at + part.start..at + part.end;
        let state = |b: &'a mut D::Buf| dev.range_mut(b, part.clone());
        if !matches!(opt, Optimizer::Lamb(_)) && div != 1.0 {
            return Err(OptimError::Config(format!(
                "{} multiplies its gradients; a divisor {div} is LAMB's",
                opt.family()
            )));
        }
        // Each arm borrows the gradient itself: AdamW's zeroing step writes it.
        let mut adam = false;
        let done = match (&mut self.states, opt) {
            (States::Adam { m, v }, Optimizer::Adam(o)) => {
                let (cfg, m, v) = (o.config(), state(m), state(v));
                if zero {
                    adam = true;
                    let grads = dev.range_mut(&mut self.grads, gr.clone());
                    kernels::adamw_step_zeroing(
                        k, cfg, t, lr, mult, mask, weights, grads, m, v, work,
                    )
                } else {
                    let grads = dev.sub(k.view(&self.grads), gr.clone());
                    kernels::adamw_step(k, cfg, t, lr, mult, mask, weights, grads, m, v, work)
                }
            }
            (States::Sgd { momentum }, Optimizer::Sgd(o)) => kernels::sgd_step(
                k,
                o.config(),
                t,
                lr,
                mult,
                mask,
                weights,
                dev.sub(k.view(&self.grads), gr.clone()),
                momentum.as_mut().map(state),
                work,
            ),
            (States::Adagrad { sum }, Optimizer::Adagrad(o)) => kernels::adagrad_step(
                k,
                o.config(),
                t,
                lr,
                mult,
                mask,
                weights,
                dev.sub(k.view(&self.grads), gr.clone()),
                state(sum),
                work,
            ),
            (States::Lamb { m, v, tensors }, Optimizer::Lamb(o)) => kernels::lamb_step(
                k,
                o.config(),
                t,
                lr,
                (mult, div),
                mask,
                tensors,
                weights,
                dev.sub(k.view(&self.grads), gr.clone()),
                state(m),
                state(v),
                work,
            ),
            (s, o) => Err(OptimError::Config(format!(
                "the device holds {}'s state and the step is {}'s",
                s.kind(),
                o.family()
            ))),
        };
        done?;
        if zero && !adam {
            k.zero(dev.range_mut(&mut self.grads, gr));
        }
        Ok(())
    }

    /// Copies the optimizer's state into `opt` (which must be the optimizer it was built from,
    /// or a copy: its step count is kept), LAMB's trust ratios included, and the master weights
    /// (when kept) into `master`.
    pub fn download(
        &self,
        k: &Kernels<D>,
        opt: &mut Optimizer,
        master: Option<&mut [f32]>,
    ) -> Result<(), OptimError> {
        let mut s = opt.state();
        for (name, buf) in self.states.named() {
            let host = s.buffers.get_mut(name).ok_or_else(|| {
                OptimError::State(format!("{}'s state has no {name}", opt.family()))
            })?;
            k.download(k.view(buf), host);
        }
        opt.load_state(s)?;
        if let (States::Lamb { tensors, .. }, Optimizer::Lamb(o)) = (&self.states, &mut *opt) {
            o.set_coefficients(&tensors.coefficients(k))?;
        }
        if let (Some(d), Some(h)) = (&self.master, master) {
            k.download(k.view(d), h);
        }
        Ok(())
    }
}
