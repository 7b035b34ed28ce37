//! The segment sources and sinks of ZeRO-2/3 (see [`crate::model::ParamSource`]).
//!
//! The collective is shared by a stage-3 rank's parameter source and gradient sink, which the
//! model calls one after the other, never at once: hence the `RefCell`.

use std::cell::RefCell;
use std::ops::Range;

use super::{SegmentParts, Storage};
use crate::backend::Cpu;
use crate::collective::{Collective, CollectiveError, Partition, ReduceOp};
use crate::model::{GradSink, ParamSource};

/// The collective of one rank, shared by its source and sink.
pub(crate) type SharedColl<'c> = RefCell<&'c mut dyn Collective>;

/// Adds `src` into `acc` elementwise (the gradient accumulation of a partition), stored in the
/// module's dtype.
pub(crate) fn accumulate(acc: &mut [f32], src: &[f32], storage: Storage) {
    for (a, g) in acc.iter_mut().zip(src) {
        *a += *g;
    }
    storage.module.round_slice(acc);
}

/// ZeRO-2: each finished gradient segment is reduced (averaged over ranks) piece by piece to the
/// rank owning that piece of the flat partition, which adds it to its gradient partition.
pub(crate) struct ReduceToOwners<'a, 'c> {
    pub coll: &'a SharedColl<'c>,
    pub part: Partition,
    pub segs: &'a [Range<usize>],
    /// One segment's gradient (the working buffer).
    pub scratch: &'a mut [f32],
    /// This rank's gradient partition, `part.range(rank)`.
    pub acc: &'a mut [f32],
    /// The dtypes of the reduction and of the partition.
    pub storage: Storage,
}

impl GradSink<Cpu> for ReduceToOwners<'_, '_> {
    type Error = CollectiveError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<&'s mut [f32], CollectiveError>
    where
        Cpu: 's,
    {
        let n = self.segs[seg].len();
        self.scratch[..n].fill(0.0);
        Ok(&mut self.scratch[..n])
    }

    fn done(&mut self, seg: usize) -> Result<(), CollectiveError> {
        let s = self.segs[seg].clone();
        let mut coll = self.coll.borrow_mut();
        let me = coll.rank();
        for owner in 0..self.part.world {
            let own = self.part.range(owner);
            let (lo, hi) = (own.start.max(s.start), own.end.min(s.end));
            if lo >= hi {
                continue;
            }
            let piece = &mut self.scratch[lo - s.start..hi - s.start];
            coll.reduce(piece, owner, ReduceOp::Avg)?;
            if owner == me {
                self.storage.reduced(piece);
                accumulate(
                    &mut self.acc[lo - own.start..hi - own.start],
                    piece,
                    self.storage,
                );
            }
        }
        Ok(())
    }
}

/// ZeRO-3: a segment's parameters all-gathered from every rank's piece into one working buffer.
pub(crate) struct Gathered<'a, 'c> {
    pub coll: &'a SharedColl<'c>,
    pub map: &'a SegmentParts,
    /// This rank's pieces of every segment, concatenated.
    pub local: &'a [f32],
    /// One padded piece, for this rank's short pieces (full ones are sent from `local`).
    pub send: &'a mut [f32],
    /// One padded segment (what the ranks' pieces make up).
    pub buf: &'a mut [f32],
}

impl ParamSource<Cpu> for Gathered<'_, '_> {
    type Error = CollectiveError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<&'s [f32], CollectiveError>
    where
        Cpu: 's,
    {
        let mut coll = self.coll.borrow_mut();
        let me = coll.rank();
        let p = self.map.parts[seg];
        let (off, len) = (self.map.local_offset(me, seg), p.range(me).len());
        let mine = &self.local[off..off + len];
        if len == p.shard {
            coll.all_gather(mine, &mut self.buf[..p.padded])?;
        } else {
            // A short last piece travels padded with zeros.
            let send = &mut self.send[..p.shard];
            send[..len].copy_from_slice(mine);
            send[len..].fill(0.0);
            coll.all_gather(send, &mut self.buf[..p.padded])?;
        }
        Ok(&self.buf[..self.map.segs[seg].len()])
    }

    fn release(&mut self, _: usize) -> Result<(), CollectiveError> {
        // The next fetch overwrites the buffer: only one segment is ever held.
        Ok(())
    }
}

/// ZeRO-3: each finished gradient segment reduce-scattered (averaged) into the owners' pieces.
pub(crate) struct Scattered<'a, 'c> {
    pub coll: &'a SharedColl<'c>,
    pub map: &'a SegmentParts,
    /// One padded segment's gradient.
    pub scratch: &'a mut [f32],
    /// One padded piece of the reduced gradient.
    pub piece: &'a mut [f32],
    /// This rank's gradient pieces of every segment, concatenated.
    pub acc: &'a mut [f32],
    /// The dtypes of the reduction and of the partition.
    pub storage: Storage,
}

impl GradSink<Cpu> for Scattered<'_, '_> {
    type Error = CollectiveError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<&'s mut [f32], CollectiveError>
    where
        Cpu: 's,
    {
        let p = self.map.parts[seg];
        // The padding stays zero: it is part of what is reduce-scattered.
        self.scratch[..p.padded].fill(0.0);
        Ok(&mut self.scratch[..self.map.segs[seg].len()])
    }

    fn done(&mut self, seg: usize) -> Result<(), CollectiveError> {
        let mut coll = self.coll.borrow_mut();
        let me = coll.rank();
        let p = self.map.parts[seg];
        coll.reduce_scatter(
            &self.scratch[..p.padded],
            &mut self.piece[..p.shard],
            ReduceOp::Avg,
        )?;
        let (off, len) = (self.map.local_offset(me, seg), p.range(me).len());
        self.storage.reduced(&mut self.piece[..len]);
        accumulate(
            &mut self.acc[off..off + len],
            &self.piece[..len],
            self.storage,
        );
        Ok(())
    }
}
