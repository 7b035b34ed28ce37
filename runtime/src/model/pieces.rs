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
//!
//! Both overlap the pass's compute (DeepSpeed's stage-3 prefetch and `overlap_comm`): they are
//! queued ([`Peers::reduce_sum_queued`], [`Peers::broadcast_queued`]: on a GPU, NCCL on the copy
//! stream) and joined back ([`Device::join_copies`]) where their results are read. Two segment
//! buffers: while the pass computes with one segment, the next one of the pass's order (the
//! forward's segments up, then the backward's down) is gathered into the other; the last two
//! segments of the forward are still held when the backward starts, and are not gathered again.
//! Two gradient buffers: while the backward computes one segment's gradient, the previous
//! segment's is reduced from the other, and added to the accumulator after the next join.
//!
//! ZeRO-2's reduction on such devices is the same [`Scatter`] over its flat partition
//! ([`Parts::Flat`]: each segment's part in each owner's range, to that owner): two segments'
//! gradient buffers rather than the micro-batch's whole gradient.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use super::{GradSink, ModelError, ParamSource};
use crate::backend::device::{grouped, Device, Peers};
use crate::backend::kernels::Kernels;
use crate::backend::Backend;
use crate::optim::device::Landing;
use crate::zero::{SegmentParts, Storage};

/// One rank's ZeRO-3 layout on its device.
pub(super) struct Pieces<D: Device> {
    pub map: SegmentParts,
    /// This rank.
    pub me: usize,
    /// Two gathered segments (each the largest segment's length).
    pub seg: [D::Buf; 2],
    /// Two segments' gradients.
    pub grad: [D::Buf; 2],
    /// The dtypes of the reduction and of the accumulator.
    pub storage: Storage,
}

impl<D: Device> Pieces<D> {
    /// Buffers for `map`'s segments on `k`, for rank `me`; the gathered segment of the type of
    /// the rank's pieces ([`Backend::alloc_stored`], as the parameters, `model/on_device`).
    pub fn new(k: &Kernels<D>, map: SegmentParts, me: usize, storage: Storage) -> Pieces<D> {
        let largest = map.segs.iter().map(Range::len).max().unwrap_or(0);
        Pieces {
            seg: [k.alloc_stored(largest), k.alloc_stored(largest)],
            grad: [k.alloc(largest), k.alloc(largest)],
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

/// The gathers and reductions a pass queued (on a GPU, NCCL on the copy stream), numbered in
/// the order queued, and how many of them the device's later work has joined
/// ([`Device::join_copies`] joins every one queued so far).
#[derive(Debug, Default)]
pub(super) struct Queue {
    queued: Cell<u64>,
    joined: Cell<u64>,
}

impl Queue {
    /// The number of the next queued call (a group of them counts as one).
    fn next(&self) -> u64 {
        self.queued.set(self.queued.get() + 1);
        self.queued.get()
    }

    /// Joins every queued call, unless none is pending.
    pub fn join<D: Device>(&self, dev: &D) -> Result<(), ModelError> {
        if self.joined.get() < self.queued.get() {
            // Counted joined even when it failed: the error ends the pass.
            self.joined.set(self.queued.get());
            dev.join_copies().map_err(ModelError::Device)?;
        }
        Ok(())
    }

    /// Joins call `seq`, unless an earlier join did.
    fn wait_for<D: Device>(&self, dev: &D, seq: u64) -> Result<(), ModelError> {
        if self.joined.get() < seq {
            self.join(dev)?;
        }
        Ok(())
    }
}

/// Which part of each segment each rank owns.
#[derive(Clone, Copy)]
pub(super) enum Parts<'a> {
    /// ZeRO-3's pieces: each segment partitioned on its own.
    Pieces(&'a SegmentParts),
    /// ZeRO-2's flat partition: rank r owns `ranges[r]` of the buffer the segments tile, so a
    /// segment's part of it may be empty.
    Flat {
        segs: &'a [Range<usize>],
        ranges: &'a [Range<usize>],
    },
}

impl Parts<'_> {
    fn segments(&self) -> usize {
        match self {
            Parts::Pieces(m) => m.segs.len(),
            Parts::Flat { segs, .. } => segs.len(),
        }
    }

    fn seg_len(&self, seg: usize) -> usize {
        match self {
            Parts::Pieces(m) => m.segs[seg].len(),
            Parts::Flat { segs, .. } => segs[seg].len(),
        }
    }

    fn world(&self, seg: usize) -> usize {
        match self {
            Parts::Pieces(m) => m.parts[seg].world,
            Parts::Flat { ranges, .. } => ranges.len(),
        }
    }

    /// Rank `owner`'s part of segment `seg`, relative to the segment.
    fn part(&self, seg: usize, owner: usize) -> Range<usize> {
        match self {
            Parts::Pieces(m) => m.parts[seg].range(owner),
            Parts::Flat { segs, ranges } => {
                let (s, r) = (&segs[seg], &ranges[owner]);
                let start = s.start.max(r.start).min(s.end);
                let end = s.end.min(r.end).max(start);
                start - s.start..end - s.start
            }
        }
    }

    /// Where rank `me`'s part of segment `seg` lies in its own buffer (its pieces, or its
    /// partition).
    fn local_offset(&self, me: usize, seg: usize) -> usize {
        match self {
            Parts::Pieces(m) => m.local_offset(me, seg),
            Parts::Flat { segs, ranges } => {
                (segs[seg].start + self.part(seg, me).start).saturating_sub(ranges[me].start)
            }
        }
    }
}

/// One rank of a pass: its kernels, its group, the parts it owns, its rank and its queued
/// calls.
pub(super) struct Rank<'a, 'p, D: Device> {
    pub k: &'a Kernels<D>,
    pub peers: &'a SharedPeers<'p, D>,
    pub parts: Parts<'a>,
    pub me: usize,
    pub queue: &'a Queue,
}

// By hand: a derive would ask `D: Copy`, and every field is a reference or an index.
impl<D: Device> Clone for Rank<'_, '_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for Rank<'_, '_, D> {}

/// Gathers segment `seg`'s pieces from `local` (this rank's pieces) into `out` (every rank's
/// buffer of the segment): the rank's own piece copied in, then each owner's broadcast, at once
/// (what was queued is joined first) or queued (returns the number of the queued group, which
/// the caller joins before anything reads `out` or writes it again).
fn gather<D: Device>(
    r: Rank<'_, '_, D>,
    local: D::View<'_>,
    out: &mut D::Buf,
    seg: usize,
    queued: bool,
) -> Result<u64, ModelError> {
    let dev = r.k.device();
    if !queued {
        r.queue.join(dev)?;
    }
    let p = r.parts;
    let (off, mine) = (p.local_offset(r.me, seg), p.part(seg, r.me));
    let piece = dev.sub(local, off..off + mine.len());
    dev.copy(dev.range_mut(out, mine), piece);
    let mut peers = r.peers.borrow_mut();
    grouped(&mut **peers, |peers| {
        for owner in 0..peers.world() {
            let part = dev.range_mut(out, p.part(seg, owner));
            if queued {
                // SAFETY: `out` is a buffer of the rank's `Pieces`, alive for the run, which
                // nothing reads or writes until the caller joins this group (`Gather`).
                unsafe { peers.broadcast_queued(dev, part, owner)? };
            } else {
                peers.broadcast(dev, part, owner)?;
            }
        }
        Ok(())
    })
    .map_err(ModelError::Device)?;
    Ok(if queued { r.queue.next() } else { 0 })
}

/// The `i`-th segment a training pass over `n` segments reads: the forward's up, then the
/// backward's down.
fn pass_order(i: usize, n: usize) -> Option<usize> {
    if i < n {
        Some(i)
    } else {
        (i < 2 * n).then(|| 2 * n - 1 - i)
    }
}

/// The parameters of one training pass, each segment gathered from the ranks' pieces: the next
/// segment of the pass's order ([`pass_order`]) gathered on the copy stream into the buffer
/// not being read while the pass computes with the other (see the module docs). Made afresh
/// for each pass: the buffers' contents are trusted within a pass only (the step changes the
/// pieces between passes).
pub(super) struct Gather<'a, 'p, D: Device> {
    rank: Rank<'a, 'p, D>,
    /// This rank's pieces.
    local: &'a D::Buf,
    /// The two segment buffers.
    out: &'a mut [D::Buf; 2],
    /// What each buffer holds: the segment, and the number of its queued gather (0: gathered
    /// at once).
    held: [Option<(usize, u64)>; 2],
    /// The buffer the last fetch returned.
    last: usize,
    /// Fetches so far.
    at: usize,
}

impl<'a, 'p, D: Device> Gather<'a, 'p, D> {
    pub fn new(rank: Rank<'a, 'p, D>, local: &'a D::Buf, out: &'a mut [D::Buf; 2]) -> Self {
        Gather {
            rank,
            local,
            out,
            held: [None, None],
            last: 1,
            at: 0,
        }
    }

    fn holding(&self, seg: usize) -> Option<usize> {
        self.held
            .iter()
            .position(|h| h.is_some_and(|(s, _)| s == seg))
    }
}

impl<D: Device> ParamSource<Kernels<D>> for Gather<'_, '_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::View<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        let (k, r) = (self.rank.k, self.rank);
        let dev = k.device();
        let n = r.parts.segments();
        let slot = match self.holding(seg) {
            Some(slot) => {
                if let Some((_, seq)) = self.held[slot] {
                    r.queue.wait_for(dev, seq)?;
                }
                slot
            }
            None => {
                // Not gathered ahead (a pass's first segment, or another order): at once, into
                // the buffer the last fetch did not return.
                let slot = 1 - self.last;
                self.held[slot] = None;
                gather(r, k.view(self.local), &mut self.out[slot], seg, false)?;
                self.held[slot] = Some((seg, 0));
                slot
            }
        };
        self.last = slot;
        self.at += 1;
        // The next segment the pass reads, queued into the other buffer: the work queued so far
        // (what read that buffer) comes first, and the pass computes with this one meanwhile.
        if let Some(next) = pass_order(self.at, n).filter(|&x| self.holding(x).is_none()) {
            let other = 1 - slot;
            self.held[other] = None;
            let seq = gather(r, k.view(self.local), &mut self.out[other], next, true)?;
            self.held[other] = Some((next, seq));
        }
        let len = r.parts.seg_len(seg);
        Ok(dev.sub(k.view(&self.out[slot]), 0..len))
    }

    fn release(&mut self, _: usize) -> Result<(), ModelError> {
        Ok(())
    }
}

/// The gradients of a pass, each segment's reduced to its owners when the backward finishes it
/// (queued, while the backward computes the next segment into the other buffer) and this
/// rank's piece added to its accumulator after the join that follows; [`Scatter::finish`]
/// adds the last one.
pub(super) struct Scatter<'a, 'p, D: Device> {
    rank: Rank<'a, 'p, D>,
    /// Two segments' gradients (segment s in buffer s mod 2).
    grad: &'a mut [D::Buf; 2],
    /// This rank's gradient pieces, concatenated (the accumulator).
    acc: &'a mut D::Buf,
    storage: Storage,
    /// The segment whose reduction is queued and not yet added, and the number of its group.
    pending: Option<(usize, u64)>,
    /// Optimizer offload, a window's last micro-batch ([`Scatter::landing`]): where each
    /// finished part of the accumulator is copied down.
    landing: Option<&'a Landing>,
}

impl<'a, 'p, D: Device> Scatter<'a, 'p, D> {
    pub fn new(
        rank: Rank<'a, 'p, D>,
        grad: &'a mut [D::Buf; 2],
        acc: &'a mut D::Buf,
        storage: Storage,
    ) -> Self {
        Scatter {
            rank,
            grad,
            acc,
            storage,
            pending: None,
            landing: None,
        }
    }

    /// Under optimizer offload, the window's last micro-batch: each segment's piece of the
    /// accumulator, once added (final for the window: no later segment adds to it), is queued
    /// for its copy into `dst` at the same offset ([`Device::download_queued`]), while the
    /// backward computes the segments below; the caller waits for the copies
    /// (`Resident::landed`). `dst` holds as many floats as the accumulator.
    pub fn landing(mut self, dst: Option<&'a Landing>) -> Self {
        self.landing = dst;
        self
    }

    /// The pending segment's reduced piece made the average, rounded and added to the
    /// accumulator, once its reduction is joined.
    fn add_pending(&mut self) -> Result<(), ModelError> {
        let Some((seg, seq)) = self.pending.take() else {
            return Ok(());
        };
        let Rank { k, parts, me, .. } = self.rank;
        let dev = k.device();
        self.rank.queue.wait_for(dev, seq)?;
        let mine = parts.part(seg, me);
        if mine.is_empty() {
            return Ok(());
        }
        let inv = 1.0 / parts.world(seg) as f32;
        let off = parts.local_offset(me, seg);
        let (s, grad) = (self.storage, &mut self.grad[seg % 2]);
        k.scale_round(dev.range_mut(grad, mine.clone()), inv, s.comm, s.module);
        let piece = dev.sub(k.view(grad), mine.clone());
        let at = off..off + mine.len();
        k.add_assign(dev.range_mut(self.acc, at.clone()), piece);
        if let Some(dst) = self.landing {
            // SAFETY: `dst` is pinned memory of the accumulator's length (`Resident::land_next`
            // checked), which the replica leaves alone until `landed`; this range of the
            // accumulator is not written again before the next window's `zero_grads`, which
            // comes after `landed`.
            unsafe { dev.download_queued(dev.sub(k.view(self.acc), at.clone()), dst.at(at.start)) };
        }
        Ok(())
    }

    /// After the pass: the last reduction joined and added (and every queued call joined, also
    /// after a pass that failed: no direct call may follow them unjoined).
    pub fn finish(mut self) -> Result<(), ModelError> {
        let added = self.add_pending();
        let joined = self.rank.queue.join(self.rank.k.device());
        added.and(joined)
    }
}

impl<D: Device> GradSink<Kernels<D>> for Scatter<'_, '_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::ViewMut<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        // The previous segment's piece first (its reduction was joined by the gather of this
        // segment's parameters, in the pass's order): its buffer is free after that.
        self.add_pending()?;
        let (k, len) = (self.rank.k, self.rank.parts.seg_len(seg));
        let grad = &mut self.grad[seg % 2];
        k.zero(k.device().range_mut(grad, 0..len));
        Ok(k.device().range_mut(grad, 0..len))
    }

    fn done(&mut self, seg: usize) -> Result<(), ModelError> {
        let Rank {
            k, peers, parts, ..
        } = self.rank;
        // The segment's aside work (its weight gradients' GEMMs and rounding) first.
        k.join_aside();
        let dev = k.device();
        let mut peers = peers.borrow_mut();
        let grad = &mut self.grad[seg % 2];
        grouped(&mut **peers, |peers| {
            for owner in 0..peers.world() {
                let part = parts.part(seg, owner);
                if part.is_empty() {
                    // Every rank skips it (ZeRO-2: the segment lies outside the owner's range).
                    continue;
                }
                let part = dev.range_mut(grad, part);
                // SAFETY: the buffer is the rank's `Pieces`', alive for the run; nothing reads
                // or writes it until `add_pending` has joined this group (the next fetch, or
                // `finish`).
                unsafe { peers.reduce_sum_queued(dev, part, owner)? };
            }
            Ok(())
        })
        .map_err(ModelError::Device)?;
        self.pending = Some((seg, self.rank.queue.next()));
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
    let queue = Queue::default();
    let rank = Rank {
        k,
        peers: &peers,
        parts: Parts::Pieces(&pc.map),
        me: pc.me,
        queue: &queue,
    };
    for (seg, s) in pc.map.segs.iter().enumerate() {
        gather(rank, k.view(local), &mut pc.seg[0], seg, false)?;
        let dev = k.device();
        dev.download(
            dev.sub(k.view(&pc.seg[0]), 0..s.len()),
            &mut whole[s.clone()],
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{pass_order, Parts};

    /// A pass reads the forward's segments up, then the backward's down, and nothing after.
    #[test]
    fn a_pass_reads_the_segments_up_then_down() {
        let order: Vec<_> = (0..9).map(|i| pass_order(i, 4)).collect();
        let want = [0, 1, 2, 3, 3, 2, 1, 0].map(Some);
        assert_eq!(order[..8], want);
        assert_eq!(order[8], None);
        assert_eq!(pass_order(0, 0), None);
    }

    /// ZeRO-2's flat partition cut by the segments: each owner's part of a segment relative to
    /// it (empty where the segment lies outside its range), and where this rank's part goes in
    /// its partition.
    #[test]
    fn a_flat_partition_gives_each_segment_its_owners_parts() {
        let segs = [0..10, 10..14, 14..30];
        let ranges = [0..12, 12..24, 24..30];
        let p = Parts::Flat {
            segs: &segs,
            ranges: &ranges,
        };
        let parts: Vec<Vec<_>> = (0..3)
            .map(|s| (0..3).map(|o| p.part(s, o)).collect())
            .collect();
        assert_eq!(parts[0], [0..10, 10..10, 10..10]);
        assert_eq!(parts[1], [0..2, 2..4, 4..4]);
        assert_eq!(parts[2], [0..0, 0..10, 10..16]);
        assert_eq!((p.local_offset(0, 1), p.local_offset(1, 1)), (10, 0));
        assert_eq!((p.local_offset(1, 2), p.local_offset(2, 2)), (2, 0));
        assert_eq!((p.world(0), p.segments(), p.seg_len(2)), (3, 3, 16));
    }
}
