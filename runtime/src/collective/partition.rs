//! The shard map of a flat buffer over `world` ranks.
//!
//! Like DeepSpeed ZeRO-1/2, the flat buffer is padded with zeros to a multiple of the world size
//! and cut into equal contiguous shards, rank-major (`deepspeed/runtime/zero/stage_1_and_2.py`:
//! `DeepSpeedZeroOptimizer.__init__` builds `bit16_groups_flat` with
//! `flatten_dense_tensors_aligned(…, nccl_start_alignment_factor * dp_world_size)`, which pads
//! via `align_dense_tensors` in `deepspeed/runtime/utils.py`, then
//! `get_data_parallel_partitions` cuts it into `numel // dp` equal parts). Equal shards are what
//! reduce-scatter and all-gather need; llm.c instead refuses sizes that do not divide. DeepSpeed's
//! extra alignment factor (2, for 4-byte alignment of 16-bit elements) is not needed for `f32`.

use std::ops::Range;

/// Why a [`Partition`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// A group of zero ranks.
    #[error("cannot partition over a world of 0 ranks")]
    ZeroWorld,
}

/// A flat buffer of `total` elements split over `world` ranks: padded with zeros to
/// `padded = world × shard` and cut into `world` equal shards of `shard = ceil(total / world)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Elements of the unpadded buffer.
    pub total: usize,
    /// Number of ranks.
    pub world: usize,
    /// Elements per rank (the padded buffer's shard length).
    pub shard: usize,
    /// `world × shard`, the smallest multiple of `world` ≥ `total`.
    pub padded: usize,
}

impl Partition {
    /// The partition of `total` elements over `world` ranks.
    pub fn new(total: usize, world: usize) -> Result<Self, PartitionError> {
        if world == 0 {
            return Err(PartitionError::ZeroWorld);
        }
        let shard = total.div_ceil(world);
        Ok(Partition {
            total,
            world,
            shard,
            padded: shard * world,
        })
    }

    /// Elements of padding at the end, `padded − total` (< `world`).
    pub fn padding(&self) -> usize {
        self.padded - self.total
    }

    /// Rank `rank`'s elements in the padded buffer, `rank·shard..(rank+1)·shard`. Empty
    /// (`padded..padded`) for a rank outside the group.
    pub fn padded_range(&self, rank: usize) -> Range<usize> {
        if rank >= self.world {
            return self.padded..self.padded;
        }
        rank * self.shard..(rank + 1) * self.shard
    }

    /// Rank `rank`'s elements of the unpadded buffer: [`Partition::padded_range`] cut at
    /// `total`, so the last ranks may get a short or empty range (e.g. 5 over 4 ranks:
    /// `0..2, 2..4, 4..5, 5..5`). Empty (`total..total`) for a rank outside the group.
    pub fn range(&self, rank: usize) -> Range<usize> {
        let r = self.padded_range(rank);
        r.start.min(self.total)..r.end.min(self.total)
    }

    /// The rank whose shard holds element `index` of the padded buffer, or `None` past it.
    pub fn owner(&self, index: usize) -> Option<usize> {
        (index < self.padded).then(|| index / self.shard)
    }

    /// `buf` copied into a new buffer of `padded` elements, zero padding at the end; `None` if
    /// `buf` does not have `total` elements.
    pub fn pad(&self, buf: &[f32]) -> Option<Vec<f32>> {
        if buf.len() != self.total {
            return None;
        }
        let mut out = Vec::with_capacity(self.padded);
        out.extend_from_slice(buf);
        out.resize(self.padded, 0.0);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_in_rank_order() {
        for world in 1..=8 {
            for total in 0..50 {
                let p = Partition::new(total, world).unwrap();
                assert_eq!(p.padded % world, 0);
                assert!(p.padded >= total && p.padding() < world);
                let mut next = 0;
                let mut padded_next = 0;
                for rank in 0..world {
                    let r = p.range(rank);
                    let pr = p.padded_range(rank);
                    assert_eq!(r.start, next, "total {total} world {world} rank {rank}");
                    assert_eq!(pr.start, padded_next);
                    assert_eq!(pr.len(), p.shard);
                    assert!(r.len() <= p.shard);
                    assert!(pr.start >= r.start && r.end <= pr.end);
                    next = r.end;
                    padded_next = pr.end;
                    for i in pr {
                        assert_eq!(p.owner(i), Some(rank));
                    }
                }
                assert_eq!(next, total);
                assert_eq!(padded_next, p.padded);
                assert_eq!(p.owner(p.padded), None);
            }
        }
    }

    #[test]
    fn short_and_empty_last_shards() {
        let p = Partition::new(5, 4).unwrap();
        assert_eq!((p.shard, p.padded), (2, 8));
        let ranges: Vec<_> = (0..4).map(|r| p.range(r)).collect();
        assert_eq!(ranges, vec![0..2, 2..4, 4..5, 5..5]);
        assert_eq!(p.padded_range(3), 6..8);
        assert_eq!(p.range(4), 5..5);
        assert_eq!(p.padded_range(4), 8..8);
    }

    #[test]
    fn empty_buffer_and_zero_world() {
        let p = Partition::new(0, 3).unwrap();
        assert_eq!((p.shard, p.padded), (0, 0));
        assert!(p.range(2).is_empty() && p.padded_range(2).is_empty());
        assert_eq!(Partition::new(10, 0), Err(PartitionError::ZeroWorld));
    }

    #[test]
    fn pad_appends_zeros() {
        let p = Partition::new(3, 2).unwrap();
        assert_eq!(p.pad(&[1.0, 2.0, 3.0]), Some(vec![1.0, 2.0, 3.0, 0.0]));
        assert_eq!(p.pad(&[1.0]), None);
    }
}
