//! One data-parallel rank's model states under a ZeRO stage, and the steps of a training window
//! over them: micro-batches, the gradient reduction, clipping, the optimizer step.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use serde::Serialize;

use super::sinks::{accumulate, Gathered, ReduceToOwners, Scattered, SharedColl};
use super::{SegmentParts, Shard, ZeroError};
use crate::backend::Cpu;
use crate::collective::{Collective, CollectiveError, Partition, ReduceOp};
use crate::model::{
    Batch, Classifier, DropoutKey, Executor, GradSink, ModelError, ParamSource, Whole, Workspace,
};
use crate::optim::device::{Accumulate, Keep, Landing, Partitioned, PinnedBuf, Resident};
use crate::optim::{self, GradScale, OptimError, OptimState, Optimizer};
use crate::precision::{self, Dtype};

/// How a rank stores its model states: the module's dtype (parameters, activations and the
/// gradients accumulated over a window, as DeepSpeed's default `grad_accum_dtype`) and the dtype
/// gradients are reduced in (DeepSpeed's `communication_data_type`, default the module's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Storage {
    /// Parameters, activations and accumulated gradients.
    pub module: Dtype,
    /// Gradient reductions between ranks.
    pub comm: Dtype,
}

impl Storage {
    /// fp32 throughout.
    pub fn fp32() -> Storage {
        Storage::default()
    }

    /// Whether the module is held in a half type (mixed precision).
    pub fn is_mixed(&self) -> bool {
        self.module.is_half()
    }

    /// Rounds a reduced gradient as it arrives (communication dtype) and is stored (module).
    pub fn reduced(&self, xs: &mut [f32]) {
        self.comm.round_slice(xs);
        self.module.round_slice(xs);
    }
}

/// The optimizer of a rank's partition (any of [`Optimizer`]). With mixed precision it keeps
/// fp32 master weights (DeepSpeed's `single_partition_of_fp32_groups`), steps them with the half
/// gradients unscaled as they are read (DeepSpeed first upcasts them into an fp32 gradient
/// partition; a fused optimizer needs none), and writes the result rounded back into the half
/// parameters. With `offload optimizer = cpu` the master weights, an fp32 gradient copy and the
/// optimizer's state live in host memory and the step runs there (in fp32 too, where the master
/// is a copy of the parameters).
#[derive(Debug, Clone)]
pub struct HostOptimizer {
    opt: Optimizer,
    host: Option<HostCopy>,
    offload: bool,
    module: Dtype,
    /// Threads of the step's element-wise passes ([`HostOptimizer::set_threads`]).
    threads: usize,
}

#[derive(Debug, Clone)]
struct HostCopy {
    master: Vec<f32>,
    /// The fp32 gradient copy in host memory (offload only).
    grads: Vec<f32>,
}

impl HostOptimizer {
    /// `opt` over the partition whose current parameters are `params`, offloaded when
    /// `offload`, with parameters stored as `module`. The master weights are the ones saved in
    /// `opt`'s state when it holds them (a resumed mixed-precision run), else a copy of `params`.
    pub fn new(
        opt: impl Into<Optimizer>,
        offload: bool,
        module: Dtype,
        params: &[f32],
    ) -> HostOptimizer {
        let mut opt = opt.into();
        let saved = opt.take_master();
        let keep = offload || module.is_half();
        HostOptimizer {
            opt,
            host: keep.then(|| HostCopy {
                master: if saved.len() == params.len() {
                    saved
                } else {
                    params.to_vec()
                },
                grads: if offload {
                    vec![0.0; params.len()]
                } else {
                    Vec::new()
                },
            }),
            offload,
            module,
            threads: 1,
        }
    }

    /// Runs the step's element-wise passes (the gradients' copy and scaling, Adam's update, the
    /// master's copy into the parameters) on up to `threads` threads: the same bits, in a
    /// fraction of the time on a partition of millions of elements (what optimizer offload
    /// steps once per window while the GPU waits).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// One step of the partition's `params` with `grads` multiplied by `unscale` (DeepSpeed
    /// multiplies the fp32 gradient partition by `1 / combined_scale`; 1 in fp32, where clipping
    /// was applied in place). The gradients are consumed: they may be overwritten.
    pub fn step(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        unscale: f32,
    ) -> Result<(), OptimError> {
        let scale = GradScale {
            unscale,
            combined: None,
        };
        self.step_scaled(params, grads, lr, scale)
    }

    /// [`HostOptimizer::step`] with the combined scale too, when known (LAMB divides by it, as
    /// FusedLamb does: see [`Optimizer::step_scaled`]).
    pub fn step_scaled(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        scale: GradScale,
    ) -> Result<(), OptimError> {
        self.step_parts(params, grads, lr, scale, 1, |_, _| {})
    }

    /// [`HostOptimizer::step_scaled`] calling `after(range, &params[range])` as each of `parts`
    /// consecutive ranges of the parameters is final ([`Optimizer::step_scaled_parts`]), so
    /// that optimizer offload copies a range to the device while the next is stepped.
    pub fn step_parts(
        &mut self,
        params: &mut [f32],
        grads: &mut [f32],
        lr: f64,
        scale: GradScale,
        parts: usize,
        mut after: impl FnMut(Range<usize>, &[f32]),
    ) -> Result<(), OptimError> {
        let threads = self.threads;
        let cut = crate::par::Cut { threads, parts };
        let Some(h) = &mut self.host else {
            return self
                .opt
                .step_scaled_parts(params, grads, lr, scale, cut, after);
        };
        if params.len() != h.master.len() || grads.len() != h.master.len() {
            return Err(OptimError::Length {
                what: "master partition",
                found: params.len().max(grads.len()),
                expected: h.master.len(),
            });
        }
        // Half values live in f32 containers, so unscaling in place gives the fp32 values
        // DeepSpeed's upcast partition holds; with offload they travel to the host copy.
        let g: &mut [f32] = if self.offload {
            let src = &*grads;
            crate::par::chunks(&mut h.grads, threads, |at, g| {
                g.copy_from_slice(&src[at..at + g.len()]);
            });
            &mut h.grads
        } else {
            grads
        };
        // Master → parameters, stored in the module's dtype, range by range.
        let module = self.module;
        self.opt
            .step_scaled_parts(&mut h.master, g, lr, scale, cut, |r, master| {
                let p = &mut params[r.clone()];
                crate::par::chunks(p, threads, |at, p| {
                    p.copy_from_slice(&master[at..at + p.len()]);
                    module.round_slice(p);
                });
                after(r, p);
            })
    }

    /// The optimizer's state for the partition, with the fp32 master weights under mixed
    /// precision.
    pub fn state(&self) -> OptimState {
        let mut s = self.opt.state();
        if let (true, Some(h)) = (self.module.is_half(), &self.host) {
            s.master = h.master.clone();
        }
        s
    }

    /// See [`Optimizer::set_betas`].
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), OptimError> {
        self.opt.set_betas(beta1, beta2)
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &Optimizer {
        &self.opt
    }

    /// Whether the state lives in host memory.
    pub fn offloaded(&self) -> bool {
        self.offload
    }

    /// Bytes of the fp32 master weights and, with offload, the host gradient copy (0 in fp32
    /// without offload).
    fn master_bytes(&self) -> u64 {
        self.host
            .as_ref()
            .map_or(0, |h| 4 * (h.master.len() + h.grads.len()) as u64)
    }
}

/// Bytes one rank holds for the model states, each buffer counted at the dtype it stands for on
/// a device (the CPU backend keeps fp16/bf16 values in f32 containers, so its process holds
/// twice the figure for those; see docs/runtime.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankMemory {
    /// Parameters kept between steps (ZeRO-3: the rank's partition), in the module's dtype.
    pub params: u64,
    /// Gradients kept across a window's micro-batches (ZeRO-2/3: the rank's partition), in the
    /// module's dtype.
    pub grads: u64,
    /// The optimizer's state (ZeRO-1/2/3: the rank's partition), fp32: Adam's and LAMB's two
    /// moments, Adagrad's sum, SGD's momentum buffer (none without momentum).
    pub optimizer: u64,
    /// Mixed precision without offload: the fp32 master weights the optimizer steps, on the
    /// device.
    #[serde(default)]
    pub master: u64,
    /// With optimizer offload: the fp32 master weights and gradient copy in host memory.
    pub host_copies: u64,
    /// Transient buffers of one segment (ZeRO-2: a gradient segment; ZeRO-3: a gathered
    /// parameter segment and a gradient segment), the largest segment's size.
    pub working: u64,
    /// Whether the optimizer state is in host memory (`offload optimizer = cpu`).
    pub offloaded: bool,
}

impl RankMemory {
    /// Everything counted, device and host.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.master + self.host_copies + self.working
    }

    /// What stays on the device (the accelerator's share of [`RankMemory::total`]): all but
    /// the offloaded optimizer state and copies.
    pub fn device(&self) -> u64 {
        let host = if self.offloaded { self.optimizer } else { 0 } + self.host_copies;
        self.total() - host
    }
}

/// One rank's model, gradients and optimizer under a ZeRO stage.
///
/// A window is [`Replica::start_window`], [`Replica::micro`] per micro-batch,
/// [`Replica::finish_window`], [`Replica::clip`], [`Replica::step`]; every rank makes the same
/// calls in the same order (each may call collectives).
#[derive(Debug)]
pub struct Replica {
    model: Classifier,
    shard: Shard,
    /// Stages 1–2: the flat partition.
    flat: Partition,
    /// Stage 3: the per-segment partition.
    map: Option<SegmentParts>,
    /// Stage 3: this rank's parameter pieces.
    local: Vec<f32>,
    /// Stages 0–1: whole; 2–3: this rank's partition.
    grads: Vec<f32>,
    scratch: Vec<f32>,
    piece: Vec<f32>,
    send: Vec<f32>,
    buf: Vec<f32>,
    opt: HostOptimizer,
    storage: Storage,
    /// The combined scale [`Replica::unscale`] found, for the step that follows it.
    combined: Option<f64>,
    /// The executor keeping the model states on its device ([`Replica::keep_on_device`]).
    device: Option<Arc<dyn Executor>>,
    /// On the device: this window's `Σ g²` (one norm serves the overflow check and the clip).
    sq: Option<f64>,
    /// On the device: the clip coefficient [`Replica::clip`] found, applied by the step.
    coef: Option<f32>,
    /// On the device under optimizer offload: the host's ends of the step's two copies.
    staging: Option<Staging>,
    /// Several ranks, each on its own GPU ([`Replica::attach_device`]): the executor running
    /// this rank's passes (and, stages 0–1, accumulating its window); the collectives, the
    /// optimizer and the model states stay on the host.
    passes: Option<Arc<dyn Executor>>,
    /// Several ranks on devices: the host's end of their copies, page-locked.
    staged: Option<Exchange>,
    /// Several ranks whose devices sum the gradients directly (NCCL; `Resident::peers`): at
    /// ZeRO 2–3, every rank's ranges of the gradient with their owner, in the order each rank
    /// reduces them (this rank's own, in order, are its partition's layout). Empty otherwise.
    owners: Vec<(Range<usize>, usize)>,
    /// Whether the gradients are averaged on the devices rather than on the host.
    peers: bool,
    /// The next [`Replica::micro`] is its window's last ([`Replica::last_micro`]).
    last_next: bool,
    /// Under optimizer offload: the window's gradients are coming down into the staging buffer
    /// as its last backward finishes each segment ([`Resident::land_next`]).
    landing: bool,
}

/// Ranges optimizer offload's step and upload are pipelined in ([`HostOptimizer::step_parts`]):
/// one per 4 Mi parameters, 1 to 8 (each range starts the step's threads anew).
fn upload_parts(n: usize) -> usize {
    (n / (4 << 20)).clamp(1, 8)
}

/// Page-locked host memory of the whole model's size for several ranks' copies
/// ([`Replica::attach_device`]): ZeRO-0's window gradient (down, averaged, up), ZeRO-2/3's
/// micro-batch gradient for the stage's sink, ZeRO-3's gathered parameters for the upload.
struct Exchange(PinnedBuf);

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Exchange").field(&self.0.len()).finish()
    }
}

/// Optimizer offload with the model on the device (DeepSpeed's ZeRO-Offload): the gradients
/// accumulated over a window come to the host once per step, the host optimizer steps on them,
/// and the updated parameters go back once. Both buffers are the device's pinned host memory
/// (page-locked on a GPU), allocated once per run.
struct Staging {
    /// The window's gradients, copied from the device by [`Replica::finish_window`].
    grads: PinnedBuf,
    /// The parameters the host optimizer writes, copied to the device by [`Replica::step`].
    params: PinnedBuf,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging")
            .field("grads", &self.grads.len())
            .field("params", &self.params.len())
            .finish()
    }
}

impl Replica {
    /// Rank `rank` of `world` under `stage`, from the whole `model` and an optimizer built for
    /// [`Shard::new`]`(stage, world, rank, model.segments())` (its state already loaded).
    pub fn new(
        mut model: Classifier,
        stage: u8,
        world: usize,
        rank: usize,
        opt: impl Into<Optimizer>,
        offload: bool,
        storage: Storage,
    ) -> Result<Replica, ZeroError> {
        let segs = model.segments().to_vec();
        let shard = Shard::new(stage, world, rank, &segs);
        let total = shard.total;
        let flat = Partition::new(total, world.max(1)).expect("world >= 1");
        let largest = segs.iter().map(Range::len).max().unwrap_or(0);
        let (mut local, mut map) = (Vec::new(), None);
        let mut scratch = Vec::new();
        let (mut piece, mut send, mut buf) = (Vec::new(), Vec::new(), Vec::new());
        let grads = match stage {
            0 | 1 => vec![0.0; total],
            2 => {
                scratch = vec![0.0; largest];
                vec![0.0; shard.len()]
            }
            _ => {
                let m = SegmentParts::new(&segs, world);
                let padded = m.largest_padded();
                let widest = m.parts.iter().map(|p| p.shard).max().unwrap_or(0);
                // Only pieces shorter than their shard (the last ranks') need a padded copy.
                let short = m.parts.iter().filter(|p| p.range(rank).len() < p.shard);
                let short = short.map(|p| p.shard).max().unwrap_or(0);
                scratch = vec![0.0; padded];
                buf = vec![0.0; padded];
                piece = vec![0.0; widest];
                send = vec![0.0; short];
                local = shard.take(&model.params().data);
                // The whole buffer is dropped: this rank keeps its pieces only.
                drop(model.take_params());
                map = Some(m);
                vec![0.0; shard.len()]
            }
        };
        let opt = opt.into();
        if opt.len() != shard.len() {
            return Err(OptimError::Length {
                what: "optimizer partition",
                found: opt.len(),
                expected: shard.len(),
            }
            .into());
        }
        let init = match stage {
            3 => local.clone(),
            _ => shard.take(&model.params().data),
        };
        let opt = HostOptimizer::new(opt, offload, storage.module, &init);
        Ok(Replica {
            model,
            shard,
            flat,
            map,
            local,
            grads,
            scratch,
            piece,
            send,
            buf,
            opt,
            storage,
            combined: None,
            device: None,
            sq: None,
            coef: None,
            staging: None,
            passes: None,
            staged: None,
            owners: Vec::new(),
            peers: false,
            last_next: false,
            landing: false,
        })
    }

    /// Keeps the model states on the device of the model's executor when this rank can: one
    /// rank ([`Replica::attach_device`] handles several), an executor that offers it. Returns
    /// whether it does.
    ///
    /// Every ZeRO stage: with one rank a stage's partition is the whole buffer (stage 3's
    /// pieces are every segment in order), its reduce-scatter and all-gathers are identities, so
    /// the device's whole-model path computes what the host's stage computes; stages 2–3
    /// accumulate each micro-batch's gradient as their reduce sinks do ([`Accumulate`]).
    /// Without optimizer offload the optimizer steps there too ([`crate::optim::device`]:
    /// Adam/AdamW, SGD, Adagrad, LAMB); with it the host's optimizer steps between one copy of
    /// the gradients down and one of the parameters up ([`Staging`]).
    /// From now on the host's parameters (and a device optimizer's state) are refreshed by
    /// [`Replica::gather_whole`] only.
    pub fn keep_on_device(&mut self) -> Result<bool, ZeroError> {
        let Some(x) = self.model.executor().cloned() else {
            return Ok(false);
        };
        let Some(r) = x.resident() else {
            return Ok(false);
        };
        if self.shard.world > 1 {
            return Ok(false);
        }
        let accumulate = if self.shard.stage >= 2 {
            Accumulate::Reduced(self.storage)
        } else {
            Accumulate::InPlace
        };
        // ZeRO-3 holds its pieces in `local` (one rank: the whole buffer in order), not in the
        // model, whose buffer is what the device uploads.
        if self.map.is_some() {
            self.model.put_params(self.local.clone())?;
        }
        let offload = self.opt.offload;
        let master = self.opt.host.as_ref().map(|h| &h.master[..]);
        let keep = Keep {
            optimizer: (!offload).then_some((&self.opt.opt, master)),
            accumulate,
            partition: None,
        };
        r.upload(&self.model, self.storage.module, keep)?;
        if offload {
            let n = self.shard.total;
            self.staging = Some(Staging {
                grads: r.pinned(n),
                params: r.pinned(n),
            });
        }
        self.release_whole();
        // The accumulator is the device's now (and the staging copy's under offload).
        self.grads = Vec::new();
        self.device = Some(x);
        Ok(true)
    }

    /// Puts the model's executor to work for this rank: with one rank,
    /// [`Replica::keep_on_device`]; with several (one GPU each, threads of one process) at
    /// ZeRO-0, the same resident model and optimizer on every rank's device, the window's
    /// gradient averaged on the host (on the devices with peers); at ZeRO 1–3 with peers and no
    /// optimizer offload, the parameters (ZeRO-3: this rank's pieces) and this rank's partition
    /// of the optimizer on the device, which steps it; otherwise at ZeRO 1–3 the device runs this
    /// rank's passes and the host keeps everything ZeRO does between them (docs/cuda.md,
    /// "Several GPUs"):
    /// - stages 0–1 accumulate the window's gradient on the device, copied to the host once per
    ///   step ([`Replica::finish_window`]) for the all-reduce;
    /// - stages 2–3 copy each micro-batch's gradient to the host, where the stage's sink reduces
    ///   it segment by segment to the owners, as the CPU's backward hands it over (the reduction
    ///   of an element does not depend on when its segment is reduced, so the sums are the
    ///   CPU ranks' bit for bit);
    /// - the overflow check, clipping, the optimizer and the all-gathers run on the host, and
    ///   the updated parameters go to the device once per step (ZeRO-3's gathered from the
    ///   ranks' pieces: until NCCL the device holds the whole parameters).
    ///
    /// Every rank calls it (ZeRO-3 gathers). Returns whether a device was attached.
    pub fn attach_device(&mut self, coll: &mut dyn Collective) -> Result<bool, ZeroError> {
        if self.shard.world <= 1 {
            return self.keep_on_device();
        }
        let Some(x) = self.model.executor().cloned() else {
            return Ok(false);
        };
        let Some(r) = x.resident() else {
            return Ok(false);
        };
        if let Some(group) = r.peers() {
            let ours = (coll.rank(), coll.world());
            if group != ours {
                return Err(ModelError::Argument(format!(
                    "the device is rank {} of {} in its group, for the run's rank {} of {}",
                    group.0, group.1, ours.0, ours.1
                ))
                .into());
            }
            self.peers = true;
        }
        if self.shard.stage == 0 {
            // Data parallelism without ZeRO: every rank holds and steps the whole model, so each
            // device keeps it resident as one rank does, and only the window's gradient makes
            // the round trip for the host's all-reduce ([`Replica::finish_window`]).
            let master = self.opt.host.as_ref().map(|h| &h.master[..]);
            let keep = Keep {
                optimizer: Some((&self.opt.opt, master)),
                accumulate: Accumulate::InPlace,
                partition: None,
            };
            r.upload(&self.model, self.storage.module, keep)?;
            if !self.peers {
                self.staged = Some(Exchange(r.pinned(self.shard.total)));
            }
            // The accumulator is the device's; the exchange buffer carries its copies.
            self.grads = Vec::new();
            self.device = Some(x);
            return Ok(true);
        }
        let offload = self.opt.offload;
        if self.peers {
            // ZeRO 1–3 as DeepSpeed runs them on GPUs: each device steps its partition with its
            // optimizer state (and master weights) there; the gradients are averaged (ZeRO-1,
            // once per step) or reduced to their owners (ZeRO 2–3, every micro-batch) between
            // the devices. ZeRO 1–2 keep the whole parameters on each device and broadcast each
            // updated partition from its owner; ZeRO-3 keeps the rank's pieces and gathers each
            // segment inside the pass. Nothing crosses to the host in a step but the norm.
            // Under optimizer offload the host steps the rank's partition: the device
            // accumulates the partition's gradient (ZeRO 2–3) or averages the whole in place
            // and keeps it for the norm (ZeRO-1); one copy of the partition down and one up per
            // step (`Staging`), then the broadcasts.
            let world = self.shard.world;
            let ranges: Vec<Range<usize>> = (0..world).map(|o| self.flat.range(o)).collect();
            // ZeRO-3's device takes its pieces from the whole parameters, gathered here.
            self.gather_whole(coll)?;
            let master = self.opt.host.as_ref().map(|h| &h.master[..]);
            let keep = Keep {
                optimizer: (!offload).then_some((&self.opt.opt, master)),
                accumulate: match self.shard.stage {
                    1 => Accumulate::InPlace,
                    _ => Accumulate::ToOwners(self.storage),
                },
                partition: Some(match &self.map {
                    None => Partitioned::Flat(&ranges),
                    Some(map) => Partitioned::Pieces(map),
                }),
            };
            let uploaded = r.upload(&self.model, self.storage.module, keep);
            self.release_whole();
            uploaded?;
            if offload {
                let n = self.shard.len();
                self.staging = Some(Staging {
                    grads: r.pinned(n),
                    params: r.pinned(n),
                });
            }
            self.grads = Vec::new();
            self.device = Some(x);
            return Ok(true);
        }
        // ZeRO-3 holds pieces: the device gets the whole buffer they make up.
        self.gather_whole(coll)?;
        let keep = Keep {
            optimizer: None,
            accumulate: Accumulate::InPlace,
            partition: None,
        };
        let uploaded = r.upload(&self.model, self.storage.module, keep);
        self.release_whole();
        uploaded?;
        if self.shard.stage >= 2 {
            // ZeRO-3 gathers the whole parameters here for their upload; with peers each
            // micro-batch's reduced partition comes down here.
            let n = match (self.map.is_some(), self.peers) {
                (false, true) => self.shard.len(),
                _ => self.shard.total,
            };
            self.staged = Some(Exchange(r.pinned(n)));
            if self.peers {
                let (stage, world) = (self.shard.stage, self.shard.world);
                let segs = self.model.segments().to_vec();
                self.owners = (0..world)
                    .flat_map(|o| {
                        let ranges = Shard::new(stage, world, o, &segs).ranges;
                        ranges.into_iter().map(move |r| (r, o))
                    })
                    .collect();
            }
        }
        self.passes = Some(x);
        Ok(true)
    }

    /// Whether this rank's passes run on a device of its own while the host keeps the model
    /// states ([`Replica::attach_device`] with several ranks).
    pub fn passes_on_device(&self) -> bool {
        self.passes.is_some()
    }

    /// Whether this rank's gradients are summed with the other ranks' on the devices
    /// (`Resident::peers`) rather than through the host.
    pub fn exchanges_on_device(&self) -> bool {
        self.peers
    }

    /// The executor of [`Replica::attach_device`]'s several-rank mode, its resident side.
    fn passes(&self) -> Option<Arc<dyn Executor>> {
        self.passes.clone().filter(|x| x.resident().is_some())
    }

    /// Whether the model states live on the device ([`Replica::keep_on_device`]).
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Whether the optimizer steps on the device (the model is there and the optimizer is not
    /// offloaded).
    pub fn optimizer_on_device(&self) -> bool {
        self.device.is_some() && self.staging.is_none()
    }

    fn resident(&self) -> Option<&dyn Resident> {
        self.device.as_ref().and_then(|x| x.resident())
    }

    /// The gradients the host's code reads: the window's copy from the device under optimizer
    /// offload, else the host's accumulator.
    fn host_grads(&mut self) -> &mut [f32] {
        match &mut self.staging {
            Some(s) => &mut s.grads,
            None => &mut self.grads,
        }
    }

    /// `Σ g²` of the whole gradient (stages 0–1) or this rank's partition: on the device once a
    /// window when the optimizer is there, else on the host.
    fn sum_squares(&mut self) -> Result<f64, ZeroError> {
        if let Some(sq) = self.sq {
            return Ok(sq);
        }
        // ZeRO-1 offloaded with peers: the whole average is on the device, the rank's range of
        // it on the host.
        let whole_there = self.peers && self.shard.stage == 1;
        let Some(r) = self
            .resident()
            .filter(|_| self.staging.is_none() || whole_there)
        else {
            return Ok(optim::sum_squares(self.host_grads()));
        };
        let sq = r.grad_sq()?;
        self.sq = Some(sq);
        Ok(sq)
    }

    /// The model. Under ZeRO-3 its parameters are present only between
    /// [`Replica::gather_whole`] and [`Replica::release_whole`].
    pub fn model(&self) -> &Classifier {
        &self.model
    }

    /// What this rank owns.
    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// The optimizer state of this rank's partition (laid out as [`Shard::ranges`]), with the
    /// fp32 master weights under mixed precision.
    pub fn optimizer_state(&self) -> OptimState {
        self.opt.state()
    }

    /// How this rank stores its model states.
    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// Sets the optimizer's betas (momentum cycling; see [`Optimizer::set_betas`]).
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), ZeroError> {
        Ok(self.opt.set_betas(beta1, beta2)?)
    }

    /// What runs the model's passes when it is not the CPU backend.
    pub fn model_executor(&self) -> Option<String> {
        self.model.executor().map(|x| x.describe())
    }

    /// Clears the gradient accumulator at the start of a window.
    pub fn start_window(&mut self) -> Result<(), ZeroError> {
        (self.sq, self.coef) = (None, None);
        match self.resident() {
            Some(r) => r.zero_grads()?,
            None => self.grads.fill(0.0),
        }
        if let (Some(x), true) = (self.passes(), self.shard.stage <= 1) {
            x.resident().expect("resident").zero_grads()?;
        }
        Ok(())
    }

    /// The next [`Replica::micro`] is its window's last. Under optimizer offload with the model
    /// on the device (one, or with peers at ZeRO 2–3 the rank's partition and at ZeRO-1 the
    /// rank's range of the averaged whole), that micro-batch's backward then copies each
    /// finished segment of the window's gradient down while it computes the rest
    /// ([`Resident::land_next`]), rather than [`Replica::finish_window`] copying the whole
    /// after it.
    pub fn last_micro(&mut self) {
        self.last_next = true;
    }

    /// One micro-batch's forward and backward, its gradient (× `weight`) accumulated: locally
    /// (stages 0–1) or reduced into the owners' partitions segment by segment (stages 2–3).
    /// Returns its mean loss, or `None` when a device keeps it until
    /// [`Replica::window_losses`] (so that the host queues the next micro-batch meanwhile).
    pub fn micro(
        &mut self,
        coll: &mut dyn Collective,
        ws: &mut Workspace,
        batch: &Batch,
        weight: f32,
        key: Option<DropoutKey>,
    ) -> Result<Option<f32>, ZeroError> {
        let stage = self.shard.stage;
        let last = std::mem::take(&mut self.last_next);
        if let (true, Some(x), Some(s)) = (last, self.device.clone(), self.staging.as_mut()) {
            let r = x.resident().expect("kept on the device");
            // SAFETY: the staging buffer is pinned memory of the run, which nothing touches
            // until `finish_window` has called `landed` (the window's overflow check, clip and
            // step read it after that).
            self.landing = r.land_next(unsafe { Landing::new(&mut s.grads) }, self.storage);
        }
        if last && self.peers && stage <= 1 {
            // ZeRO 0–1 with the devices summing: the window's sums start during its last
            // backward, segment by segment (`Resident::sum_next`), and `finish_window` waits
            // for them. The host barrier first, as before any sum between the devices: a rank
            // that failed ends the run here.
            if let Some(x) = self.device.clone().or_else(|| self.passes()) {
                coll.barrier()?;
                // Whether it will (every rank alike): `average_grads` does the rest either way.
                let _overlapped = x.resident().expect("resident").sum_next();
            }
        }
        if let Some(r) = self.resident() {
            if last {
                // One device: the window's norm summed segment by segment during its last
                // backward where the device can (`Resident::norm_next`); `grad_sq` adds them.
                let _summing = r.norm_next();
            }
            if self.peers && stage >= 2 {
                // The micro-batch ends in sums between the devices: the host barrier first, so
                // that a rank that failed ends the run here, not in a sum that waits forever.
                coll.barrier()?;
            }
            return Ok(r.micro(&self.model, batch, weight, key)?);
        }
        if let Some(x) = self.passes() {
            let r = x.resident().expect("resident");
            if stage <= 1 {
                return Ok(r.micro(&self.model, batch, weight, key)?);
            }
            // The micro-batch's gradient alone (the accumulator zeroed, then added into: the
            // CPU's sink buffer is zeroed and added into the same way), to the host's sink.
            r.zero_grads()?;
            let loss = r.micro(&self.model, batch, weight, key)?;
            let staged = self.staged.as_mut().expect("attached with its buffer");
            if self.peers {
                // Reduced to the owners on the devices; this rank's partition comes down and
                // is accumulated as the sinks accumulate it (`sinks::accumulate`).
                let part = &mut staged.0[..self.grads.len()];
                coll.barrier()?;
                r.reduce_to_owners(&self.owners, self.storage, part)?;
                accumulate(&mut self.grads, part, self.storage);
                return Ok(loss);
            }
            r.download_grads(&mut staged.0)?;
            self.reduce_staged(coll)?;
            return Ok(loss);
        }
        if stage <= 1 {
            return Ok(Some(self.model.forward_backward(
                ws,
                batch,
                weight,
                &mut self.grads,
                key,
            )?));
        }
        let shared: SharedColl<'_> = RefCell::new(coll);
        let segs = self.model.segments().to_vec();
        if stage == 2 {
            let mut sink = ReduceToOwners {
                coll: &shared,
                part: self.flat,
                segs: &segs,
                scratch: &mut self.scratch,
                acc: &mut self.grads,
                storage: self.storage,
            };
            let mut src = Whole::new(&self.model.params().data, &segs);
            return self
                .model
                .forward_backward_with::<_, _, ZeroError>(
                    ws, batch, weight, &mut src, &mut sink, key,
                )
                .map(Some);
        }
        let map = self.map.as_ref().expect("stage 3 has its map");
        let mut src = Gathered {
            coll: &shared,
            map,
            local: &self.local,
            send: &mut self.send,
            buf: &mut self.buf,
        };
        let mut sink = Scattered {
            coll: &shared,
            map,
            scratch: &mut self.scratch,
            piece: &mut self.piece,
            acc: &mut self.grads,
            storage: self.storage,
        };
        self.model
            .forward_backward_with::<_, _, ZeroError>(ws, batch, weight, &mut src, &mut sink, key)
            .map(Some)
    }

    /// The mean losses of the micro-batches whose [`Replica::micro`] left them on the device
    /// (`None`), in order, read in one copy: once per window, after its last micro-batch.
    pub fn window_losses(&self) -> Result<Vec<f32>, ZeroError> {
        match self.device.clone().or_else(|| self.passes()) {
            Some(x) => Ok(x.resident().expect("resident").window_losses()?),
            None => Ok(Vec::new()),
        }
    }

    /// Stages 2–3 with the passes on a device: feeds the micro-batch gradient in `staged` to the
    /// stage's sink segment by segment, as the CPU's backward does when each segment finishes.
    fn reduce_staged(&mut self, coll: &mut dyn Collective) -> Result<(), ZeroError> {
        let shared: SharedColl<'_> = RefCell::new(coll);
        let segs = self.model.segments().to_vec();
        let staged = &self.staged.as_ref().expect("attached with its buffer").0;
        let feed = |sink: &mut dyn GradSink<Cpu, Error = CollectiveError>| {
            // The backward finishes the last segment first.
            for (seg, s) in segs.iter().enumerate().rev() {
                sink.fetch(seg)?.copy_from_slice(&staged[s.clone()]);
                sink.done(seg)?;
            }
            Ok::<(), CollectiveError>(())
        };
        match &self.map {
            None => feed(&mut ReduceToOwners {
                coll: &shared,
                part: self.flat,
                segs: &segs,
                scratch: &mut self.scratch,
                acc: &mut self.grads,
                storage: self.storage,
            })?,
            Some(map) => feed(&mut Scattered {
                coll: &shared,
                map,
                scratch: &mut self.scratch,
                piece: &mut self.piece,
                acc: &mut self.grads,
                storage: self.storage,
            })?,
        }
        Ok(())
    }

    /// After a window's micro-batches: stages 0–1 average the whole gradient over the ranks
    /// (stages 2–3 already reduced each segment as it finished).
    /// Under optimizer offload with the model on the device, the window's gradients come to the
    /// host here: one copy per optimizer step.
    pub fn finish_window(&mut self, coll: &mut dyn Collective) -> Result<(), ZeroError> {
        if let (Some(x), Some(s)) = (&self.device, &mut self.staging) {
            let r = x.resident().expect("kept on the device");
            if self.peers && self.shard.stage == 1 {
                // ZeRO-1 with peers: averaged on the devices (summed segment by segment during
                // the last backward, `sum_next`), and this rank's range down: during that
                // backward where the device lands it (`land_next`: each segment's part once
                // summed and averaged), else after it. The host barrier first, as before any
                // sum between the devices.
                coll.barrier()?;
                r.average_grads(self.storage)?;
                if std::mem::take(&mut self.landing) {
                    r.landed()?;
                } else {
                    r.download_grads(&mut s.grads)?;
                }
                return Ok(());
            }
            if std::mem::take(&mut self.landing) {
                // Copied down during the last backward: only the wait.
                r.landed()?;
            } else {
                r.download_grads(&mut s.grads)?;
            }
            return Ok(());
        }
        if let (Some(x), true) = (self.passes(), self.shard.stage <= 1) {
            // The window's gradient, accumulated on the device: one copy per step, averaged
            // there first when the devices sum directly.
            let r = x.resident().expect("resident");
            if self.peers {
                coll.barrier()?;
                r.average_grads(self.storage)?;
                r.download_grads(&mut self.grads)?;
                return Ok(());
            }
            r.download_grads(&mut self.grads)?;
        }
        if let (Some(x), true) = (self.device.clone(), coll.world() > 1) {
            let r = x.resident().expect("kept on the device");
            if self.peers {
                // ZeRO 0–1 with peers: averaged where it lies, nothing crosses to the host (ZeRO-2
                // reduced each micro-batch already). The host barrier first: a rank that failed
                // ends the run here, not in a device sum that would wait for it forever.
                if self.shard.stage <= 1 {
                    coll.barrier()?;
                    r.average_grads(self.storage)?;
                }
                return Ok(());
            }
            // ZeRO-0 resident on several devices: the window's gradient down, averaged over
            // the ranks as the host's path averages it, and back up for the device's step.
            let storage = self.storage;
            let grads = &mut self.staged.as_mut().expect("attached with its buffer").0;
            r.download_grads(grads)?;
            coll.all_reduce(grads, ReduceOp::Avg)?;
            storage.reduced(grads);
            r.upload_grads(grads)?;
            return Ok(());
        }
        if self.shard.stage <= 1 && coll.world() > 1 {
            coll.all_reduce(&mut self.grads, ReduceOp::Avg)?;
            self.storage.reduced(&mut self.grads);
        }
        Ok(())
    }

    /// Threads of the host optimizer's step ([`HostOptimizer::set_threads`]).
    pub fn set_host_threads(&mut self, threads: usize) {
        self.opt.set_threads(threads);
    }

    /// Whether any rank's gradients (or gradient partition) hold an inf or NaN: DeepSpeed's
    /// overflow check, a local test reduced over the ranks.
    /// On the device, `Σ g²` answers it (inf or NaN exactly when some gradient is).
    pub fn overflow(&mut self, coll: &mut dyn Collective) -> Result<bool, ZeroError> {
        let bad = if self.optimizer_on_device() {
            !self.sum_squares()?.is_finite()
        } else {
            precision::has_inf_or_nan(self.host_grads())
        };
        let local = f64::from(u8::from(bad));
        let any = if coll.world() > 1 {
            coll.all_reduce_sum_f64(local)?
        } else {
            local
        };
        Ok(any > 0.0)
    }

    /// Mixed precision's clipping: the global norm of the gradients, computed at loss scale
    /// `used` (1 for bf16), and the factor DeepSpeed multiplies the fp32 gradient partition by,
    /// `1 / combined_scale` with the scaler's scale *after* this step's update, `now`: DeepSpeed
    /// 0.19.8 updates the scale before it unscales (`stage_1_and_2.py` `step`,
    /// `fused_optimizer.py` `step`), so on a step where the scale doubles the gradients are
    /// divided by twice the scale they were computed at. Returns `(norm / used, factor)`, the
    /// norm DeepSpeed reports (`scaled_norm / prev_scale`).
    pub fn unscale(
        &mut self,
        coll: &mut dyn Collective,
        max_norm: f64,
        used: f64,
        now: f64,
    ) -> Result<(f32, f32), ZeroError> {
        let sq = self.sum_squares()?;
        let sq = if self.shard.stage >= 2 {
            coll.all_reduce_sum_f64(sq)?
        } else {
            sq
        };
        let scaled_norm = sq.sqrt();
        let combined = precision::combined_scale(now, scaled_norm, max_norm);
        self.combined = Some(combined);
        Ok(((scaled_norm / used) as f32, (1.0 / combined) as f32))
    }

    /// The global gradient norm (before clipping), and `clip_grad_norm_` to `max_norm` when it
    /// is positive. Partitioned gradients add their squared sums over the ranks.
    /// On the device the coefficient is kept for the step, which multiplies by it as it reads
    /// the gradients (the same f32 product as scaling them in place).
    pub fn clip(&mut self, coll: &mut dyn Collective, max_norm: f64) -> Result<f32, ZeroError> {
        let sq = self.sum_squares()?;
        let sq = if self.shard.stage >= 2 {
            coll.all_reduce_sum_f64(sq)?
        } else {
            sq
        };
        let norm = sq.sqrt() as f32;
        if max_norm > 0.0 {
            if let Some(coef) = optim::clip_coef(norm, max_norm as f32) {
                if self.optimizer_on_device() {
                    self.coef = Some(coef);
                } else {
                    optim::scale(self.host_grads(), coef);
                }
            }
        }
        Ok(norm)
    }

    /// The optimizer step at `lr` with the gradients multiplied by `unscale` (see
    /// [`Replica::unscale`]; 1 in fp32): stage 0 updates everything; stages 1–2 update this rank's
    /// shard and all-gather the shards; stage 3 updates this rank's pieces (gathered on use).
    pub fn step(
        &mut self,
        coll: &mut dyn Collective,
        lr: f64,
        unscale: f32,
    ) -> Result<(), ZeroError> {
        let rank = self.shard.rank;
        // The combined scale behind `unscale`, when this step follows `unscale()` with its factor.
        let combined = self
            .combined
            .take()
            .filter(|&c| (1.0 / c) as f32 == unscale);
        let scale = GradScale { unscale, combined };
        if let Some(x) = self.device.clone() {
            let r = x.resident().expect("kept on the device");
            if let Some(s) = &mut self.staging {
                // Optimizer offload: the host path's step below, with one rank every stage's
                // (stage 1–2's all-gather and stage 3's gather are identities), on the
                // gradients `finish_window` copied (or landed during the last backward); the
                // updated parameters go back range by range, each copied up while the host steps the next (then, with
                // peers at ZeRO-2, the owners' broadcasts); where the device does not queue
                // copies, the whole after.
                let mut queued = None;
                let parts = upload_parts(s.params.len());
                self.opt.step_parts(
                    &mut s.params,
                    &mut s.grads,
                    lr,
                    scale,
                    parts,
                    |r0, done| {
                        if queued != Some(false) {
                            // SAFETY: `done` is the pinned staging buffer's range, which the
                            // step does not write again, and nothing else touches the buffer
                            // before `params_uploaded` below.
                            queued = Some(unsafe { r.upload_params_part(r0.start, done) });
                        }
                    },
                )?;
                if self.peers {
                    // The upload ends in broadcasts between the devices (see `micro`).
                    coll.barrier()?;
                }
                if queued == Some(true) {
                    r.params_uploaded()?;
                    return Ok(());
                }
                r.upload_params(&s.params)?;
                return Ok(());
            }
            if self.peers && self.shard.stage >= 1 {
                // The step ends in broadcasts between the devices (see `micro`).
                coll.barrier()?;
            }
            return self.step_on_device(r, lr, scale);
        }
        match self.shard.stage {
            0 => self
                .opt
                .step_scaled(self.model.params_mut(), &mut self.grads, lr, scale)?,
            stage @ (1 | 2) => {
                let r = self.flat.range(rank);
                let g = if stage == 1 {
                    &mut self.grads[r.clone()]
                } else {
                    &mut self.grads[..]
                };
                self.opt
                    .step_scaled(&mut self.model.params_mut()[r.clone()], g, lr, scale)?;
                let mut send = vec![0.0f32; self.flat.shard];
                send[..r.len()].copy_from_slice(&self.model.params().data[r]);
                let mut all = vec![0.0f32; self.flat.padded];
                coll.all_gather(&send, &mut all)?;
                let total = self.flat.total;
                self.model.params_mut().copy_from_slice(&all[..total]);
            }
            _ => self
                .opt
                .step_scaled(&mut self.local, &mut self.grads, lr, scale)?,
        }
        if let Some(x) = self.passes() {
            // The updated parameters to this rank's device, once per step.
            let r = x.resident().expect("resident");
            if self.map.is_some() {
                let mut whole = self.staged.take().expect("attached with its buffer");
                let gathered = self.gather_into(coll, &mut whole.0);
                let uploaded = gathered.and_then(|()| Ok(r.upload_params(&whole.0)?));
                self.staged = Some(whole);
                uploaded?;
            } else {
                r.upload_params(&self.model.params().data)?;
            }
        }
        Ok(())
    }

    /// [`Replica::step`] on the device: the factors the host path applies to the gradients —
    /// the clip coefficient in fp32, or under mixed precision `scale` as
    /// [`Optimizer::grad_factors`] applies it (the loop never asks for both) — applied by the
    /// optimizer's kernel, and the step counted on the host's optimizer.
    fn step_on_device(
        &mut self,
        r: &dyn Resident,
        lr: f64,
        scale: GradScale,
    ) -> Result<(), ZeroError> {
        let opt = &mut self.opt.opt;
        let factors = match self.coef.take() {
            Some(c) if scale.unscale == 1.0 && scale.combined.is_none() => (c, 1.0),
            Some(_) => {
                return Err(OptimError::Config(
                    "a clip coefficient and an unscale factor in one device step".into(),
                )
                .into())
            }
            None => opt.grad_factors(scale),
        };
        r.step(opt, lr, factors)?;
        opt.count_step();
        Ok(())
    }

    /// ZeRO-3: gathers the whole parameters into the model (every rank takes part) for
    /// evaluation or saving. On the device: downloads the parameters, and the optimizer state
    /// for a checkpoint. A no-op for the other stages.
    pub fn gather_whole(&mut self, coll: &mut dyn Collective) -> Result<(), ZeroError> {
        if let Some(x) = self.device.clone() {
            let r = x.resident().expect("kept on the device");
            if self.peers && self.map.is_some() {
                // ZeRO-3's pieces are gathered between the devices (see `micro`).
                coll.barrier()?;
            }
            if self.map.is_some() {
                // ZeRO-3: the whole buffer exists between this and `release_whole` only.
                self.model.put_params(vec![0.0; self.shard.total])?;
            }
            // Under offload the host's optimizer state is current: the parameters only.
            let (opt, master) = match self.staging {
                Some(_) => (None, None),
                None => (
                    Some(&mut self.opt.opt),
                    self.opt.host.as_mut().map(|h| &mut h.master[..]),
                ),
            };
            r.download(&mut self.model, opt, master)?;
            if self.peers {
                // Every rank's device has finished (the download waited for it), so every
                // transfer between the GPUs has arrived: past this barrier a rank may release
                // its communicator (`NcclPeers`'s drop aborts it), which over the network could
                // otherwise cut a send NCCL's proxy thread was still making for a rank whose
                // kernel had already finished.
                coll.barrier()?;
            }
            return Ok(());
        }
        if self.map.is_none() {
            return Ok(());
        }
        let mut whole = vec![0.0f32; self.shard.total];
        self.gather_into(coll, &mut whole)?;
        self.model.put_params(whole)?;
        Ok(())
    }

    /// ZeRO-3: all-gathers every segment's pieces into `whole` (every rank takes part).
    fn gather_into(
        &mut self,
        coll: &mut dyn Collective,
        whole: &mut [f32],
    ) -> Result<(), ZeroError> {
        let Some(map) = &self.map else {
            return Ok(());
        };
        let shared: SharedColl<'_> = RefCell::new(coll);
        let mut src = Gathered {
            coll: &shared,
            map,
            local: &self.local,
            send: &mut self.send,
            buf: &mut self.buf,
        };
        for (seg, s) in map.segs.iter().enumerate() {
            let p = ParamSource::<Cpu>::fetch(&mut src, seg)?;
            whole[s.clone()].copy_from_slice(p);
        }
        Ok(())
    }

    /// ZeRO-3: drops the whole parameters again after [`Replica::gather_whole`].
    pub fn release_whole(&mut self) {
        if self.map.is_some() {
            drop(self.model.take_params());
        }
    }

    /// What this rank holds, each buffer at the dtype it stands for.
    pub fn memory(&self) -> RankMemory {
        let half = |n: usize| self.storage.module.bytes() * n as u64;
        let state_elems = self.opt.optimizer().state_elems();
        let master = self.opt.master_bytes();
        let offloaded = self.opt.offloaded();
        RankMemory {
            params: if self.map.is_some() {
                half(self.local.len())
            } else {
                half(self.shard.total)
            },
            // Stages 0–1 accumulate the whole gradient, 2–3 their partition (`Replica::new`).
            grads: half(if self.shard.stage <= 1 {
                self.shard.total
            } else {
                self.shard.len()
            }),
            optimizer: 4 * state_elems as u64,
            master: if offloaded { 0 } else { master },
            host_copies: if offloaded { master } else { 0 },
            working: half(self.scratch.len() + self.buf.len() + self.piece.len() + self.send.len()),
            offloaded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::{Adam, AdamConfig};
    use crate::params::Params;

    /// The host step on several threads, whole or in parts, is the one-thread step bit for bit:
    /// offloaded in fp16 (gradients copied, unscaled, the master rounded into the parameters),
    /// and in fp32 with no host copy; each part handed on holds its final values.
    #[test]
    fn threads_change_no_bit() {
        let sizes = [100_003usize, 5, 120_000];
        let p0 = Params::zeros(
            sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| (format!("t{i}"), vec![n]))
                .collect(),
        );
        let n: usize = sizes.iter().sum();
        for (offload, module) in [(true, Dtype::F16), (false, Dtype::F32), (true, Dtype::Bf16)] {
            let mut runs = Vec::new();
            for (threads, parts) in [(1, 1), (4, 1), (2, 3)] {
                let adam =
                    Adam::new(AdamConfig::adamw(0.01), &p0.entries, &[true, false, true]).unwrap();
                let mut params: Vec<f32> = (0..n).map(|i| (i % 31) as f32 * 0.03 - 0.4).collect();
                module.round_slice(&mut params);
                let mut opt = HostOptimizer::new(adam, offload, module, &params);
                opt.set_threads(threads);
                for step in 0..2 {
                    let mut g: Vec<f32> = (0..n)
                        .map(|i| ((i * 3 + step) % 53) as f32 * 64.0 - 1500.0)
                        .collect();
                    let scale = GradScale {
                        unscale: 1.0 / 1024.0,
                        combined: None,
                    };
                    // Each range handed on holds the parameters' final values.
                    let mut handed = vec![0.0f32; n];
                    opt.step_parts(&mut params, &mut g, 1e-3, scale, parts, |r, done| {
                        handed[r].copy_from_slice(done);
                    })
                    .unwrap();
                    assert!(handed == params, "parts {parts}");
                }
                runs.push(params.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(
                runs.iter().all(|r| *r == runs[0]),
                "offload {offload} {module:?}"
            );
        }
    }
}
