//! Collective communication between data-parallel ranks over flat `f32` buffers.
//!
//! The runtime keeps parameters, gradients and optimizer state in flat buffers
//! ([`crate::params`]), so every collective here works on a contiguous `&[f32]` and an explicit
//! rank, never on tensors or threads. [`Collective`] is the interface ZeRO and plain data
//! parallelism use; [`LocalCollective`] implements it with ranks as threads of one process
//! (CPU, deterministic; docs/runtime.md, "Data parallelism and ZeRO"), and [`NetCollective`]
//! with ranks in several processes (nodes) that reach node 0's hub over TCP ([`net`]), with
//! the same bits and errors; both pass the same tests (`tests/collective.rs`). [`Partition`] is the shard map of a flat
//! buffer padded to a multiple of the world size.
//!
//! Failure model: a collective is all-or-nothing. Any error (a rank that times out, ranks that
//! disagree on an op's shape, an [`Collective::abort`], a rank that leaves) fails the whole
//! group, and every pending or later op on every rank returns that same first error. So a
//! misuse ends the run with the same clear message on every rank instead of a hang.

mod local;
pub mod net;
mod partition;

use std::fmt;
use std::time::Duration;

pub use local::LocalCollective;
pub use net::NetCollective;
pub use partition::{Partition, PartitionError};

/// How long a rank waits for the others at a collective: `RECIPE_COLLECTIVE_TIMEOUT` seconds,
/// else 600 (rank 0 evaluates and writes checkpoints while the others wait at the next step).
/// GPUs that sum through NCCL wait as long for their queued work (`backend::cuda`).
pub fn timeout() -> Duration {
    let secs = std::env::var("RECIPE_COLLECTIVE_TIMEOUT")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(600);
    Duration::from_secs(secs)
}

/// The reduction of [`Collective::all_reduce`] and [`Collective::reduce_scatter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// Element-wise sum, accumulated in rank order 0, 1, …, N−1.
    Sum,
    /// The [`ReduceOp::Sum`] result multiplied by `1.0_f32 / N as f32` (ncclAvg emulated as
    /// sum × 1/N; see [`Collective::all_reduce`] for the exact arithmetic).
    Avg,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
        })
    }
}

/// Which collective an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// [`Collective::all_reduce`].
    AllReduce,
    /// [`Collective::reduce_scatter`].
    ReduceScatter,
    /// [`Collective::reduce`].
    Reduce,
    /// [`Collective::all_gather`].
    AllGather,
    /// [`Collective::broadcast`].
    Broadcast,
    /// [`Collective::all_reduce_max`].
    AllReduceMax,
    /// [`Collective::all_reduce_sum_f64`].
    AllReduceSumF64,
    /// [`Collective::barrier`].
    Barrier,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::Reduce => "reduce",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::AllReduceMax => "all_reduce_max",
            Op::AllReduceSumF64 => "all_reduce_sum_f64",
            Op::Barrier => "barrier",
        })
    }
}

/// Why a collective failed. Every variant is group-wide: the first error that fails the group is
/// returned, unchanged, by every pending and later op on every rank.
// Serialized: a [`NetCollective`] receives the group's error from the hub with its words intact.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum CollectiveError {
    /// A rank waited longer than the group's timeout inside an op: some rank never reached it
    /// (missing, stuck, or calling collectives in a different order).
    #[error(
        "rank {rank} waited {waited:?} in {op} (collective #{seq}) and not every rank reached it: \
         a rank is missing, stuck, or calls collectives in a different order"
    )]
    Timeout {
        /// The rank whose wait ran out.
        rank: usize,
        /// The op it was waiting in.
        op: Op,
        /// The group's position in its sequence of collectives (0-based).
        seq: u64,
        /// How long it waited.
        waited: Duration,
    },
    /// Ranks called the same collective slot with different ops, reductions, roots or lengths.
    #[error("collective #{seq}: ranks disagree: {detail}")]
    Mismatch {
        /// The group's position in its sequence of collectives (0-based).
        seq: u64,
        /// What each rank called so far, e.g. `rank 0: all_reduce(sum) of 8, rank 1: …`.
        detail: String,
    },
    /// A rank aborted the group ([`Collective::abort`]) or left it (dropped its handle).
    #[error("rank {rank} aborted the collective group: {reason}")]
    Aborted {
        /// The rank that aborted or left.
        rank: usize,
        /// Its reason.
        reason: String,
    },
    /// A rank in another process lost its connection to the group ([`NetCollective`]): node 0's
    /// process ended, or the network failed.
    #[error("rank {rank} lost the collective group: {detail}")]
    Disconnected {
        /// The rank that lost it.
        rank: usize,
        /// What failed, and where.
        detail: String,
    },
    /// One rank's arguments cannot form the op (e.g. a reduce-scatter output that is not
    /// 1/N of the input, a broadcast root outside the group).
    #[error("rank {rank}: invalid {op} call: {detail}")]
    InvalidArgument {
        /// The rank that made the call.
        rank: usize,
        /// The op.
        op: Op,
        /// What is wrong.
        detail: String,
    },
}

/// One data-parallel rank's end of a collective group; every rank of the group owns one and
/// calls the same ops in the same order with matching shapes.
///
/// Buffers are flat `f32` slices; sharded ops use the rank-major layout of [`Partition`] over a
/// buffer padded to a multiple of [`Collective::world`]. Every op blocks until all ranks have
/// taken part, and is fallible: see the module docs for the failure model. An implementation
/// must never hang on misuse: every wait is bounded by a timeout.
pub trait Collective: Send {
    /// This rank, `0..world()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world(&self) -> usize;

    /// Reduces `buf` element-wise over all ranks and leaves the result in every rank's `buf`.
    ///
    /// Exact arithmetic of the reference implementation ([`LocalCollective`]), each operation
    /// rounded to `f32`, with `x_r` rank r's input:
    /// - `Sum`: `out[i] = (…((x_0[i] + x_1[i]) + x_2[i]) + …) + x_{N-1}[i]`;
    /// - `Avg`: the `Sum` result, then `out[i] *= 1.0_f32 / N as f32` (one multiply by the
    ///   rounded reciprocal, not a division; with N = 1 this is a multiply by 1.0, exact).
    ///
    /// The result has identical bits on every rank and across runs. (NCCL's native `ncclAvg`
    /// pre-multiplies each input by 1/N and sums in ring order, so an NCCL implementation that
    /// wants the same formula emulates `Avg` as `ncclSum` followed by the × 1/N.)
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError>;

    /// Reduces the full `input` (len = N × shard) over all ranks, as [`Collective::all_reduce`]
    /// does, and writes only this rank's shard, elements `rank·shard..(rank+1)·shard`, to
    /// `output` (len = shard). Bit-identical to the same elements of an all-reduce.
    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;

    /// Reduces `buf` over all ranks, as [`Collective::all_reduce`] does (same arithmetic, same
    /// bits), into rank `root`'s `buf` only; the other ranks' `buf` is left unchanged. ZeRO-2
    /// hands each piece of a finished gradient bucket to the rank that owns it this way
    /// (DeepSpeed's `average_tensor` reduces each partition's slice to its owner; NCCL: `ncclReduce`).
    fn reduce(&mut self, buf: &mut [f32], root: usize, op: ReduceOp)
        -> Result<(), CollectiveError>;

    /// Concatenates every rank's `shard` in rank order into `output` (len = N × shard len), so
    /// rank r's shard lands at `r·len..(r+1)·len`.
    fn all_gather(&mut self, shard: &[f32], output: &mut [f32]) -> Result<(), CollectiveError>;

    /// Copies rank `root`'s `buf` into every rank's `buf`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError>;

    /// The maximum of `x` over all ranks (overflow / found-inf flags). NaN-propagating: if any
    /// rank passes NaN the result is NaN, so a NaN flag is never lost (`f32::max` would drop it).
    fn all_reduce_max(&mut self, x: f32) -> Result<f32, CollectiveError>;

    /// The sum of `x` over all ranks, accumulated in `f64` in rank order 0..N (loss sums,
    /// squared gradient norms of shards).
    fn all_reduce_sum_f64(&mut self, x: f64) -> Result<f64, CollectiveError>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CollectiveError>;

    /// Fails the group on purpose: every other rank's pending or next op returns
    /// [`CollectiveError::Aborted`] with this rank and `reason`, promptly rather than after a
    /// timeout. A no-op if the group has already failed (the first error stays).
    fn abort(&mut self, reason: &str);
}
