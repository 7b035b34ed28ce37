//! ZeRO-3 on devices that sum directly ([`Peers`]: NCCL between GPUs): each device holds its
//! rank's piece of every segment, gathers a segment's pieces from their owners when the pass
//! reads it, and reduces each segment's gradient to the owners as the backward finishes it —
//! what `zero/sinks.rs` `Gathered` and `Scattered` do through the host's collective, here on the
//! devices (DeepSpeed's stage 3: `deepspeed/runtime/zero/stage3.py`, parameters all-gathered
//! before each module's forward and backward, gradients reduce-scattered after it).
//!
//! The gather is one broadcast per owner of the owner's piece (no padding: the pieces of a
//! segment may differ in length by one element), the reduction one sum per owner to the owner,
//! averaged and rounded there as the host's reduce-scatter makes it (`Storage::reduced`, then
//! `accumulate`): the same bits as the CPU's ranks (runtime/emu/tests/model.rs).

use std::cell::RefCell;
use std::ops::Range;

use super::{GradSink, ModelError, ParamSource};
use crate::backend::device::{grouped, Device, Peers};
use crate::backend::kernels::Kernels;
use crate::backend::Backend;
use crate::zero::{SegmentParts, Storage};

/// One rank's ZeRO-3 layout on its device.
pub(super) struct Pieces<D: Device> {
    pub map: SegmentParts,
    /// This rank.
    pub me: usize,
    /// One gathered segment (the largest segment's length).
    pub seg: D::Buf,
    /// One segment's gradient.
    pub grad: D::Buf,
    /// The dtypes of the reduction and of the accumulator.
    pub storage: Storage,
}

impl<D: Device> Pieces<D> {
    /// Buffers for `map`'s segments on `k`, for rank `me`; the gathered segment of the type of
    /// the rank's pieces ([`Backend::alloc_stored`], as the parameters, `model/on_device`).
    pub fn new(k: &Kernels<D>, map: SegmentParts, me: usize, storage: Storage) -> Pieces<D> {
        let largest = map.segs.iter().map(Range::len).max().unwrap_or(0);
        Pieces {
            seg: k.alloc_stored(largest),
            grad: k.alloc(largest),
            map,
            me,
            storage,
        }
    }

    /// Rank `me`'s pieces of `whole`, concatenated in segment order (its local buffer).
    pub fn take(&self, whole: &[f32]) -> Vec<f32> {
        self.map
            .pieces(self.me)
            .into_iter()
            .flat_map(|r| whole[r].iter().copied())
            .collect()
    }

    /// Elements of the local buffer.
    pub fn local_len(&self) -> usize {
        self.map.pieces(self.me).iter().map(Range::len).sum()
    }
}

/// The group, shared by the gather and the scatter of one pass (never borrowed by both at once:
/// a fetch or a `done` runs its collectives and returns).
pub(super) type SharedPeers<'p, D> = RefCell<&'p mut dyn Peers<D>>;

/// One rank of a pass: its kernels, its group, ZeRO-3's map and its rank.
pub(super) struct Rank<'a, 'p, D: Device> {
    pub k: &'a Kernels<D>,
    pub peers: &'a SharedPeers<'p, D>,
    pub map: &'a SegmentParts,
    pub me: usize,
}

// By hand: a derive would ask `D: Copy`, and every field is a reference or an index.
impl<D: Device> Clone for Rank<'_, '_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for Rank<'_, '_, D> {}

/// Gathers segment `seg`'s pieces from `local` (this rank's pieces) into `out` (every rank's
/// buffer of the segment): the rank's own piece copied in, then each owner's broadcast.
fn gather<D: Device>(
    r: Rank<'_, '_, D>,
    local: D::View<'_>,
    out: &mut D::Buf,
    seg: usize,
) -> Result<(), ModelError> {
    let dev = r.k.device();
    let p = r.map.parts[seg];
    let (off, mine) = (r.map.local_offset(r.me, seg), p.range(r.me));
    let piece = dev.sub(local, off..off + mine.len());
    dev.copy(dev.range_mut(out, mine), piece);
    let mut peers = r.peers.borrow_mut();
    grouped(&mut **peers, |peers| {
        for owner in 0..peers.world() {
            peers.broadcast(dev, dev.range_mut(out, p.range(owner)), owner)?;
        }
        Ok(())
    })
    .map_err(ModelError::Device)
}

/// The parameters of a pass, each segment gathered from the ranks' pieces when it is read.
pub(super) struct Gather<'a, 'p, D: Device> {
    pub rank: Rank<'a, 'p, D>,
    /// This rank's pieces.
    pub local: &'a D::Buf,
    /// The gathered segment (the next fetch overwrites it: one segment is held at a time, as
    /// the host's `Gathered` holds one).
    pub out: &'a mut D::Buf,
}

impl<D: Device> ParamSource<Kernels<D>> for Gather<'_, '_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::View<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        let k = self.rank.k;
        gather(self.rank, k.view(self.local), self.out, seg)?;
        let len = self.rank.map.segs[seg].len();
        Ok(k.device().sub(k.view(self.out), 0..len))
    }

    fn release(&mut self, _: usize) -> Result<(), ModelError> {
        Ok(())
    }
}

/// The gradients of a pass, each segment's reduced to its owners when the backward finishes it
/// and this rank's piece added to its accumulator.
pub(super) struct Scatter<'a, 'p, D: Device> {
    pub rank: Rank<'a, 'p, D>,
    /// One segment's gradient.
    pub grad: &'a mut D::Buf,
    /// This rank's gradient pieces, concatenated (the accumulator).
    pub acc: &'a mut D::Buf,
    pub storage: Storage,
}

impl<D: Device> GradSink<Kernels<D>> for Scatter<'_, '_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::ViewMut<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        let (k, len) = (self.rank.k, self.rank.map.segs[seg].len());
        k.zero(k.device().range_mut(self.grad, 0..len));
        Ok(k.device().range_mut(self.grad, 0..len))
    }

    fn done(&mut self, seg: usize) -> Result<(), ModelError> {
        let Rank { k, peers, map, me } = self.rank;
        let dev = k.device();
        let p = map.parts[seg];
        let mut peers = peers.borrow_mut();
        let grad = &mut *self.grad;
        grouped(&mut **peers, |peers| {
            for owner in 0..peers.world() {
                peers.reduce_sum(dev, dev.range_mut(grad, p.range(owner)), owner)?;
            }
            Ok(())
        })
        .map_err(ModelError::Device)?;
        let inv = 1.0 / peers.world() as f32;
        let (off, mine) = (map.local_offset(me, seg), p.range(me));
        let s = self.storage;
        k.scale_round(
            dev.range_mut(self.grad, mine.clone()),
            inv,
            s.comm,
            s.module,
        );
        let piece = dev.sub(k.view(self.grad), mine.clone());
        k.add_assign(dev.range_mut(self.acc, off..off + mine.len()), piece);
        Ok(())
    }
}

/// The parameters of an evaluation on one rank, each segment copied up from the host's whole
/// buffer (gathered there first by `Replica::gather_whole`; rank 0 evaluates alone, so no
/// collective may run here).
pub(super) struct Upload<'a, D: Device> {
    pub k: &'a Kernels<D>,
    pub host: &'a [f32],
    pub segs: &'a [Range<usize>],
    pub out: &'a mut D::Buf,
}

impl<D: Device> ParamSource<Kernels<D>> for Upload<'_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::View<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        let (k, s) = (self.k, self.segs[seg].clone());
        let len = s.len();
        let src = self.host.get(s).ok_or_else(|| {
            ModelError::Argument(
                "the model's parameters are partitioned (ZeRO-3): gather them first".into(),
            )
        })?;
        k.write(k.device().range_mut(self.out, 0..len), src);
        Ok(k.device().sub(k.view(self.out), 0..len))
    }

    fn release(&mut self, _: usize) -> Result<(), ModelError> {
        Ok(())
    }
}

/// Every segment gathered into `whole` (host), for a checkpoint or an evaluation: every rank
/// takes part.
pub(super) fn download_whole<D: Device>(
    k: &Kernels<D>,
    peers: &mut dyn Peers<D>,
    pc: &mut Pieces<D>,
    local: &D::Buf,
    whole: &mut [f32],
) -> Result<(), ModelError> {
    let peers: SharedPeers<'_, D> = RefCell::new(peers);
    let rank = Rank {
        k,
        peers: &peers,
        map: &pc.map,
        me: pc.me,
    };
    for (seg, s) in pc.map.segs.iter().enumerate() {
        gather(rank, k.view(local), &mut pc.seg, seg)?;
        let dev = k.device();
        dev.download(dev.sub(k.view(&pc.seg), 0..s.len()), &mut whole[s.clone()]);
    }
    Ok(())
}
