//! Step accounting shared by the compiler (`recipe steps`, `explain`, the rules) and the
//! training loop: micro-batches per rank per epoch (`L`) and optimizer steps per epoch (`U`), as
//! accelerate shards the data (`huggingface/accelerate:src/accelerate/data_loader.py:
//! BatchSamplerShard`) and the HF Trainer counts its updates
//! (`huggingface/transformers:src/transformers/trainer.py:Trainer._inner_training_loop`); the
//! version differences are docs/diagnostics.md's R0201/R0202. Pure functions; no I/O.

/// How `num_update_steps_per_epoch` rounds `L / G` (docs/upstream.md §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// `max(L // G, 1)` (≤ 4.51).
    Floor,
    /// `max(ceil(L / G), 1)` (≥ 4.52).
    Ceil,
}

/// How the training data is split across data-parallel ranks (docs/upstream.md §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// torch `DistributedSampler`: `ceil(N / P)` samples per rank (padded), then batches.
    DistributedSampler,
    /// accelerate `BatchSamplerShard` with `even_batches`: batches first, then `ceil(B / P)` each.
    BatchSamplerShard,
}

/// Micro-batches each data-parallel rank sees per epoch (`L`, docs/upstream.md §5.1).
///
/// `BatchSamplerShard` (accelerate, `even_batches`): the unsharded sampler makes
/// `B = ceil(N / b)` batches (`floor` with `drop_last`), then each rank gets `ceil(B / P)`
/// (`floor` with `drop_last`), the last ones padded by wrap-around.
/// `DistributedSampler` (transformers ≤ 4.29): each rank gets `S = ceil(N / P)` samples
/// (padded), then `ceil(S / b)` batches (`floor` with `drop_last`).
pub fn batches_per_rank(
    samples: u64,
    micro: u64,
    ranks: u64,
    drop_last: bool,
    sharding: Sharding,
) -> u64 {
    let (micro, ranks) = (micro.max(1), ranks.max(1));
    let div = |a: u64, b: u64| if drop_last { a / b } else { a.div_ceil(b) };
    match sharding {
        Sharding::BatchSamplerShard => div(div(samples, micro), ranks),
        Sharding::DistributedSampler => div(samples.div_ceil(ranks), micro),
    }
}

/// Optimizer steps per epoch (`U`, docs/upstream.md §5.2): `max(L // G, 1)` or
/// `max(ceil(L / G), 1)`.
pub fn updates_per_epoch(batches: u64, accumulate: u64, rounding: Rounding) -> u64 {
    let g = accumulate.max(1);
    let u = match rounding {
        Rounding::Floor => batches / g,
        Rounding::Ceil => batches.div_ceil(g),
    };
    u.max(1)
}

/// Total optimizer steps (HF `max_steps`): `max_steps` when given, else `ceil(epochs × U)`.
pub fn total_steps(epochs: f64, per_epoch: u64, max_steps: Option<u64>) -> u64 {
    match max_steps {
        Some(m) if m > 0 => m,
        _ => (epochs * per_epoch as f64).ceil() as u64,
    }
}

/// The native runtime's step accounting: accelerate-style even sharding
/// ([`Sharding::BatchSamplerShard`]), ceil windows (every epoch ends with a step, as HF ≥ 4.47
/// does), and a short last window whose gradients are averaged over its real size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NativeSteps {
    /// Micro-batches each rank sees per epoch (`L`).
    pub batches_per_epoch: u64,
    /// Optimizer steps per epoch (`U = max(ceil(L / G), 1)`).
    pub per_epoch: u64,
    /// Micro-batches in each epoch's last window (`G` when `G` divides `L`).
    pub last_window: u64,
    /// Optimizer steps of the whole run (`max_steps`, else `ceil(epochs × U)`).
    pub total: u64,
}

/// [`NativeSteps`] for `samples` training rows, micro-batch `micro`, accumulation `accumulate`
/// over `world` ranks.
pub fn native(
    samples: u64,
    micro: u64,
    accumulate: u64,
    world: u64,
    drop_last: bool,
    epochs: f64,
    max_steps: Option<u64>,
) -> NativeSteps {
    let g = accumulate.max(1);
    let l = batches_per_rank(
        samples,
        micro,
        world,
        drop_last,
        Sharding::BatchSamplerShard,
    );
    let u = updates_per_epoch(l, g, Rounding::Ceil);
    NativeSteps {
        batches_per_epoch: l,
        per_epoch: u,
        last_window: l.saturating_sub(g * (u - 1)).max(1),
        total: total_steps(epochs, u, max_steps),
    }
}
