//! ZeRO on the runtime's flat buffers: what each data-parallel rank holds and how the partitions
//! meet, as DeepSpeed defines the stages (`deepspeed/runtime/zero/stage_1_and_2.py`,
//! `deepspeed/runtime/zero/stage3.py`; docs/runtime.md, "Data parallelism and ZeRO").
//!
//! - Stage 0: every rank holds the whole parameters, gradients and optimizer state; gradients
//!   are all-reduced (averaged) once per optimizer step.
//! - Stage 1: the optimizer state is partitioned. The flat buffer is padded to a multiple of N
//!   and cut into N equal contiguous shards (DeepSpeed `stage_1_and_2.py`); each rank updates its
//!   shard's parameters, then the shards are all-gathered.
//! - Stage 2: gradients are partitioned as well. The backward hands each finished segment (an
//!   encoder layer, the embeddings, the head) to [`Collective::reduce`], piece by piece, to the
//!   rank that owns that piece, which accumulates it into its partition-sized gradient buffer
//!   (DeepSpeed reduces its gradient buckets the same way, every micro-batch). The whole-size
//!   gradient buffer is gone; one segment's gradient is the working set.
//! - Stage 3: parameters are partitioned too, segment by segment (each segment padded to a
//!   multiple of N; DeepSpeed pads every tensor). Before the forward or backward uses a segment,
//!   its pieces are all-gathered into a segment-sized buffer, which the next segment overwrites;
//!   gradients are reduce-scattered segment by segment into the owner's piece. Evaluation and
//!   saving gather the whole model for their duration (what DeepSpeed's
//!   `stage3_gather_16bit_weights_on_model_save` does for saving).
//!
//! `offload optimizer = cpu` keeps fp32 master weights, a gradient copy and the optimizer state of
//! the rank's partition in host memory and runs the [`crate::optim::Optimizer`] there
//! ([`HostOptimizer`]; for Adagrad that is DeepSpeedCPUAdagrad's arithmetic); the updated master is
//! copied back into the rank's parameters. On the CPU backend host and device are the same memory,
//! so this changes where the bytes are counted, not the numbers. The elementwise optimizers (Adam,
//! SGD, Adagrad) partition exactly; LAMB, whose trust ratio needs whole tensors, runs at stage 0
//! only.

mod replica;
mod sinks;

use std::ops::Range;

pub use replica::{HostOptimizer, RankMemory, Replica, Storage};

use crate::collective::{CollectiveError, Partition};
use crate::model::ModelError;
use crate::optim::OptimError;

/// Why a ZeRO operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ZeroError {
    /// A collective between ranks failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// The model refused a batch or a buffer.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The optimizer refused its inputs.
    #[error(transparent)]
    Optim(#[from] OptimError),
}

impl From<std::convert::Infallible> for ZeroError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// What one rank owns of the flat parameter buffer under a ZeRO stage: the elements its
/// optimizer updates (and, for stages 2–3, its gradients; for stage 3, its parameters). The
/// rank's local buffers are the concatenation of [`Shard::ranges`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// ZeRO stage, 0–3.
    pub stage: u8,
    /// Ranks.
    pub world: usize,
    /// This rank.
    pub rank: usize,
    /// Elements of the whole buffer.
    pub total: usize,
    /// The owned elements of the whole buffer, ascending and disjoint.
    pub ranges: Vec<Range<usize>>,
}

impl Shard {
    /// Rank `rank`'s share of a buffer cut into `segs` (which tile it, in order).
    ///
    /// Stage 0: everything. Stages 1–2: one contiguous shard of the buffer padded to a multiple
    /// of `world` ([`Partition`]). Stage 3: the rank's piece of every segment, each segment padded
    /// to a multiple of `world` on its own ([`SegmentParts`]).
    pub fn new(stage: u8, world: usize, rank: usize, segs: &[Range<usize>]) -> Shard {
        let world = world.max(1);
        let total = segs.last().map_or(0, |r| r.end);
        let ranges = match stage {
            0 => std::iter::once(0..total).collect(),
            1 | 2 => vec![Partition::new(total, world)
                .expect("world >= 1")
                .range(rank)],
            _ => SegmentParts::new(segs, world).pieces(rank),
        };
        let ranges = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        Shard {
            stage,
            world,
            rank,
            total,
            ranges,
        }
    }

    /// Elements owned.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|r| r.len()).sum()
    }

    /// True when the rank owns nothing (more ranks than elements).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The owned elements of a whole buffer, concatenated.
    pub fn take(&self, whole: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        for r in &self.ranges {
            out.extend_from_slice(&whole[r.clone()]);
        }
        out
    }

    /// Writes the concatenated `local` elements back into a whole buffer.
    pub fn put(&self, local: &[f32], whole: &mut [f32]) {
        let mut at = 0;
        for r in &self.ranges {
            whole[r.clone()].copy_from_slice(&local[at..at + r.len()]);
            at += r.len();
        }
    }
}

/// Stage 3's map: every segment partitioned on its own over `world` ranks.
#[derive(Debug, Clone)]
pub struct SegmentParts {
    /// The segments of the whole buffer.
    pub segs: Vec<Range<usize>>,
    /// Each segment's partition.
    pub parts: Vec<Partition>,
}

impl SegmentParts {
    /// The partition of each of `segs` over `world` ranks.
    pub fn new(segs: &[Range<usize>], world: usize) -> SegmentParts {
        SegmentParts {
            segs: segs.to_vec(),
            parts: segs
                .iter()
                .map(|s| Partition::new(s.len(), world.max(1)).expect("world >= 1"))
                .collect(),
        }
    }

    /// Rank `rank`'s piece of every segment, as ranges of the whole buffer.
    pub fn pieces(&self, rank: usize) -> Vec<Range<usize>> {
        self.segs
            .iter()
            .zip(&self.parts)
            .map(|(s, p)| {
                let r = p.range(rank);
                s.start + r.start..s.start + r.end
            })
            .collect()
    }

    /// Where segment `seg`'s piece of rank `rank` starts in that rank's local buffer.
    pub fn local_offset(&self, rank: usize, seg: usize) -> usize {
        self.parts[..seg].iter().map(|p| p.range(rank).len()).sum()
    }

    /// The largest padded segment: the gather and reduce-scatter working buffers.
    pub fn largest_padded(&self) -> usize {
        self.parts.iter().map(|p| p.padded).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs() -> Vec<Range<usize>> {
        vec![0..7, 7..8, 8..20, 20..23]
    }

    #[test]
    fn shards_of_every_stage_tile_the_buffer() {
        for stage in 0..=3u8 {
            for world in 1..=5 {
                let mut seen = vec![0u32; 23];
                for rank in 0..world {
                    let s = Shard::new(stage, world, rank, &segs());
                    for r in &s.ranges {
                        for i in r.clone() {
                            seen[i] += 1;
                        }
                    }
                    let whole: Vec<f32> = (0..23).map(|i| i as f32).collect();
                    let local = s.take(&whole);
                    assert_eq!(local.len(), s.len());
                    let mut back = vec![-1.0; 23];
                    s.put(&local, &mut back);
                    for r in &s.ranges {
                        assert_eq!(back[r.clone()], whole[r.clone()]);
                    }
                }
                let expect = if stage == 0 { world as u32 } else { 1 };
                assert!(
                    seen.iter().all(|&n| n == expect),
                    "stage {stage} world {world}: {seen:?}"
                );
            }
        }
    }

    #[test]
    fn stage3_pieces_and_offsets() {
        let p = SegmentParts::new(&segs(), 2);
        assert_eq!(p.pieces(0), vec![0..4, 7..8, 8..14, 20..22]);
        assert_eq!(p.pieces(1), vec![4..7, 8..8, 14..20, 22..23]);
        assert_eq!(p.local_offset(1, 2), 3);
        assert_eq!(p.local_offset(1, 3), 3 + 6);
        assert_eq!(p.largest_padded(), 12);
        // Stage 1/2 shards are one contiguous range of the padded whole.
        assert_eq!(Shard::new(2, 2, 1, &segs()).ranges, vec![12..23]);
    }
}
