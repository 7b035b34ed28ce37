//! Each epoch's sample order and the batches each data-parallel rank takes from it.
//!
//! The dealing reproduces accelerate 1.15.0's `BatchSamplerShard` with `split_batches=False` and
//! `even_batches=True` (what the HF Trainer uses), so that a native run steps exactly as many
//! times as the `accelerate` run the compiler's step accounting predicts
//! ([`crate::accounting::batches_per_rank`] with `Sharding::BatchSamplerShard`).

use super::DataError;
use crate::rng::Rng;

/// The order in which epoch `epoch` visits the `n` examples: a seeded Fisher–Yates shuffle from
/// Philox stream `epoch` of `seed` (so any epoch can be regenerated on resume, on any rank,
/// without replaying earlier ones), or `0..n` when the recipe turns shuffling off.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        Rng::new(seed, epoch).shuffle(&mut order);
    }
    order
}

/// The batches (each a list of example indices) that rank `rank` of `world` trains on in an epoch
/// whose sample order is `order`, with `micro` samples per batch.
///
/// This is accelerate 1.15.0 `data_loader.py`, `BatchSamplerShard._iter_with_no_split` with
/// `even_batches=True`, over `torch.utils.data.BatchSampler(order, micro, drop_last)`:
///
/// * the sampler cuts `order` into `B` consecutive batches (`B = ceil(n / micro)`; with
///   `drop_last` the short tail is dropped, `B = n / micro`);
/// * batch `j` goes to rank `j % world`;
/// * with `drop_last`, only whole rounds of `world` batches are yielded: `B / world` per rank,
///   the leftover batches are dropped;
/// * without it, the short last batch is completed and extra batches are appended until every
///   rank has `ceil(B / world)` full batches. The filler (fewer than `world * micro` samples) is
///   read from the start of `initial_data`: the samples of the first `world` batches, i.e. the
///   first `min(n, world * micro)` of `order`, doubled (`initial_data += initial_data`) until it
///   holds at least `world * micro`. Either way that is `order` continued cyclically: sample `p`
///   of the padded stream is `order[p % n]`. When `n < world * micro` the whole epoch repeats
///   (for `n = 1`, every batch on every rank is `[o, o, …]`); accelerate calls this the
///   degenerate case and handles it the same way, so no special rule is needed here.
///
/// So every rank gets the same number of batches, all exactly `micro` long, and
/// `rank_batches(..).len() == accounting::batches_per_rank(n, micro, world, drop_last,
/// Sharding::BatchSamplerShard)`. An empty `order` yields no batches (accelerate yields none).
pub fn rank_batches(
    order: &[usize],
    micro: usize,
    world: usize,
    rank: usize,
    drop_last: bool,
) -> Result<Vec<Vec<usize>>, DataError> {
    if micro == 0 {
        return Err(DataError::Shard(
            "the per-device batch size must be at least 1".into(),
        ));
    }
    if world == 0 {
        return Err(DataError::Shard(
            "the number of ranks must be at least 1".into(),
        ));
    }
    if rank >= world {
        return Err(DataError::Shard(format!(
            "rank {rank} is outside a world of {world} ranks"
        )));
    }
    let n = order.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let per_rank = if drop_last {
        (n / micro) / world
    } else {
        n.div_ceil(micro).div_ceil(world)
    };
    Ok((0..per_rank)
        .map(|k| {
            let j = k * world + rank;
            (j * micro..(j + 1) * micro).map(|p| order[p % n]).collect()
        })
        .collect())
}

/// The batches the HF Trainer's data loader gives rank `rank` of `world` in an epoch: accelerate
/// 1.15.0 `data_loader.py`, `prepare_data_loader`, shards the batch sampler with
/// [`rank_batches`]'s `BatchSamplerShard` only when `num_processes != 1` ("No change if no
/// multiprocess"). With one process the loader is torch's own `BatchSampler`: consecutive batches
/// of `micro`, the short last one kept as it is (dropped with `drop_last`), never padded.
/// Found by the two-backend agreement run (conformance/README.md, "Agreement").
pub fn trainer_batches(
    order: &[usize],
    micro: usize,
    world: usize,
    rank: usize,
    drop_last: bool,
) -> Result<Vec<Vec<usize>>, DataError> {
    if world != 1 {
        return rank_batches(order, micro, world, rank, drop_last);
    }
    if micro == 0 {
        return Err(DataError::Shard(
            "the per-device batch size must be at least 1".into(),
        ));
    }
    if rank != 0 {
        return Err(DataError::Shard(format!(
            "rank {rank} is outside a world of 1 rank"
        )));
    }
    Ok(order
        .chunks(micro)
        .filter(|b| !drop_last || b.len() == micro)
        .map(<[usize]>::to_vec)
        .collect())
}
