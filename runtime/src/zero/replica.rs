//! One data-parallel rank's model states under a ZeRO stage, and the steps of a training window
//! over them: micro-batches, the gradient reduction, clipping, the optimizer step.

use std::cell::RefCell;
use std::ops::Range;

use serde::Serialize;

use super::sinks::{Gathered, ReduceToOwners, Scattered, SharedColl};
use super::{SegmentParts, Shard, ZeroError};
use crate::backend::Cpu;
use crate::collective::{Collective, Partition, ReduceOp};
use crate::model::{Batch, Classifier, DropoutKey, ParamSource, Whole, Workspace};
use crate::optim::{self, Adam, AdamState, OptimError};

/// The optimizer of a rank's partition, optionally offloaded (`offload optimizer = cpu`): then
/// fp32 master weights, a gradient copy and Adam's moments live in host memory, the step runs
/// there, and the result is copied back into the rank's parameters.
#[derive(Debug, Clone)]
pub struct HostOptimizer {
    adam: Adam,
    host: Option<HostCopy>,
}

#[derive(Debug, Clone)]
struct HostCopy {
    master: Vec<f32>,
    grads: Vec<f32>,
}

impl HostOptimizer {
    /// `adam` over the partition whose current parameters are `params`; offloaded when
    /// `offload` (the master weights start as a copy of `params`).
    pub fn new(adam: Adam, offload: bool, params: &[f32]) -> HostOptimizer {
        HostOptimizer {
            adam,
            host: offload.then(|| HostCopy {
                master: params.to_vec(),
                grads: vec![0.0; params.len()],
            }),
        }
    }

    /// One Adam step of the partition's `params` with `grads`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) -> Result<(), OptimError> {
        match &mut self.host {
            None => self.adam.step(params, grads, lr),
            Some(h) => {
                if params.len() != h.master.len() || grads.len() != h.grads.len() {
                    return Err(OptimError::Length {
                        what: "offloaded partition",
                        found: params.len(),
                        expected: h.master.len(),
                    });
                }
                // Device → host, the CPU optimizer on the master weights, host → device.
                h.grads.copy_from_slice(grads);
                self.adam.step(&mut h.master, &h.grads, lr)?;
                params.copy_from_slice(&h.master);
                Ok(())
            }
        }
    }

    /// Adam's state for the partition.
    pub fn state(&self) -> &AdamState {
        self.adam.state()
    }

    /// See [`Adam::set_betas`].
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), OptimError> {
        self.adam.set_betas(beta1, beta2)
    }

    /// Whether the state lives in host memory.
    pub fn offloaded(&self) -> bool {
        self.host.is_some()
    }

    /// Bytes of the host copies (master weights and gradients), 0 without offload.
    fn host_copy_bytes(&self) -> u64 {
        self.host
            .as_ref()
            .map_or(0, |h| 4 * (h.master.len() + h.grads.len()) as u64)
    }
}

/// Bytes one rank holds for the model states (fp32: 4 bytes an element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankMemory {
    /// Parameters kept between steps (ZeRO-3: the rank's partition).
    pub params: u64,
    /// Gradients kept across a window's micro-batches (ZeRO-2/3: the rank's partition).
    pub grads: u64,
    /// Adam's two moments (ZeRO-1/2/3: the rank's partition).
    pub optimizer: u64,
    /// With optimizer offload: the fp32 master weights and gradient copy in host memory.
    pub host_copies: u64,
    /// Transient buffers of one segment (ZeRO-2: a gradient segment; ZeRO-3: a gathered
    /// parameter segment and a gradient segment), the largest segment's size.
    pub working: u64,
    /// Whether the optimizer state is in host memory (`offload optimizer = cpu`).
    pub offloaded: bool,
}

impl RankMemory {
    /// Everything counted.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.host_copies + self.working
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
}

impl Replica {
    /// Rank `rank` of `world` under `stage`, from the whole `model` and an optimizer built for
    /// [`Shard::new`]`(stage, world, rank, model.segments())` (its state already loaded).
    pub fn new(
        mut model: Classifier,
        stage: u8,
        world: usize,
        rank: usize,
        adam: Adam,
        offload: bool,
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
        if adam.state().m.len() != shard.len() {
            return Err(OptimError::Length {
                what: "optimizer partition",
                found: adam.state().m.len(),
                expected: shard.len(),
            }
            .into());
        }
        let init = match stage {
            3 => local.clone(),
            _ => shard.take(&model.params().data),
        };
        let opt = HostOptimizer::new(adam, offload, &init);
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
        })
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

    /// The optimizer state of this rank's partition (laid out as [`Shard::ranges`]).
    pub fn optimizer_state(&self) -> &AdamState {
        self.opt.state()
    }

    /// Sets Adam's betas (momentum cycling).
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<(), ZeroError> {
        Ok(self.opt.set_betas(beta1, beta2)?)
    }

    /// Zeroes the gradient accumulation before a window.
    pub fn start_window(&mut self) {
        self.grads.fill(0.0);
    }

    /// One micro-batch's forward and backward, its gradient (× `weight`) accumulated: locally
    /// (stages 0–1) or reduced into the owners' partitions segment by segment (stages 2–3).
    pub fn micro(
        &mut self,
        coll: &mut dyn Collective,
        ws: &mut Workspace,
        batch: &Batch,
        weight: f32,
        key: Option<DropoutKey>,
    ) -> Result<f32, ZeroError> {
        let stage = self.shard.stage;
        if stage <= 1 {
            return Ok(self
                .model
                .forward_backward(ws, batch, weight, &mut self.grads, key)?);
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
            };
            let mut src = Whole::new(&self.model.params().data, &segs);
            return self.model.forward_backward_with::<_, _, ZeroError>(
                ws, batch, weight, &mut src, &mut sink, key,
            );
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
        };
        self.model
            .forward_backward_with::<_, _, ZeroError>(ws, batch, weight, &mut src, &mut sink, key)
    }

    /// After a window's micro-batches: stages 0–1 average the whole gradient over the ranks
    /// (stages 2–3 already reduced each segment as it finished).
    pub fn finish_window(&mut self, coll: &mut dyn Collective) -> Result<(), ZeroError> {
        if self.shard.stage <= 1 && coll.world() > 1 {
            coll.all_reduce(&mut self.grads, ReduceOp::Avg)?;
        }
        Ok(())
    }

    /// The global gradient norm (before clipping), and `clip_grad_norm_` to `max_norm` when it
    /// is positive. Partitioned gradients add their squared sums over the ranks.
    pub fn clip(&mut self, coll: &mut dyn Collective, max_norm: f64) -> Result<f32, ZeroError> {
        let sq = optim::sum_squares(&self.grads);
        let sq = if self.shard.stage >= 2 {
            coll.all_reduce_sum_f64(sq)?
        } else {
            sq
        };
        let norm = sq.sqrt() as f32;
        if max_norm > 0.0 {
            if let Some(coef) = optim::clip_coef(norm, max_norm as f32) {
                optim::scale(&mut self.grads, coef);
            }
        }
        Ok(norm)
    }

    /// The optimizer step at `lr`: stage 0 updates everything; stages 1–2 update this rank's
    /// shard and all-gather the shards; stage 3 updates this rank's pieces (gathered on use).
    pub fn step(&mut self, coll: &mut dyn Collective, lr: f64) -> Result<(), ZeroError> {
        let rank = self.shard.rank;
        match self.shard.stage {
            0 => self.opt.step(self.model.params_mut(), &self.grads, lr)?,
            stage @ (1 | 2) => {
                let r = self.flat.range(rank);
                let g = if stage == 1 {
                    &self.grads[r.clone()]
                } else {
                    &self.grads[..]
                };
                self.opt
                    .step(&mut self.model.params_mut()[r.clone()], g, lr)?;
                let mut send = vec![0.0f32; self.flat.shard];
                send[..r.len()].copy_from_slice(&self.model.params().data[r]);
                let mut all = vec![0.0f32; self.flat.padded];
                coll.all_gather(&send, &mut all)?;
                let total = self.flat.total;
                self.model.params_mut().copy_from_slice(&all[..total]);
            }
            _ => self.opt.step(&mut self.local, &self.grads, lr)?,
        }
        Ok(())
    }

    /// ZeRO-3: gathers the whole parameters into the model (every rank takes part) for
    /// evaluation or saving; a no-op for the other stages.
    pub fn gather_whole(&mut self, coll: &mut dyn Collective) -> Result<(), ZeroError> {
        let Some(map) = &self.map else {
            return Ok(());
        };
        let mut whole = vec![0.0f32; self.shard.total];
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
        self.model.put_params(whole)?;
        Ok(())
    }

    /// ZeRO-3: drops the whole parameters again after [`Replica::gather_whole`].
    pub fn release_whole(&mut self) {
        if self.map.is_some() {
            drop(self.model.take_params());
        }
    }

    /// What this rank holds.
    pub fn memory(&self) -> RankMemory {
        let b = |n: usize| 4 * n as u64;
        let s = self.opt.state();
        RankMemory {
            params: if self.map.is_some() {
                b(self.local.len())
            } else {
                b(self.shard.total)
            },
            grads: b(self.grads.len()),
            optimizer: b(s.m.len() + s.v.len()),
            host_copies: self.opt.host_copy_bytes(),
            working: b(self.scratch.len() + self.buf.len() + self.piece.len() + self.send.len()),
            offloaded: self.opt.offloaded(),
        }
    }
}
