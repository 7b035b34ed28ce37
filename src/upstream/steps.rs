//! Step accounting: batches per rank per epoch (`L`), optimizer steps per epoch (`U`), the
//! total, warmup steps, and the micro-batch timeline under HF and under DeepSpeed
//! (`transformers/trainer.py:Trainer._inner_training_loop`, `deepspeed/runtime/engine.py:
//! DeepSpeedEngine.is_gradient_accumulation_boundary`; docs/diagnostics.md, "Steps"). Pure
//! functions over version facts; no I/O.

use serde::Serialize;

use crate::upstream::versions::{DsBoundary, HfStepRule, WarmupArgs};

pub use recipe_runtime::accounting::{batches_per_rank, total_steps, updates_per_epoch};

/// A warmup as the recipe states it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    /// Whole optimizer steps.
    Steps(u64),
    /// A fraction of the total steps (`6%` is 0.06).
    Fraction(f64),
}

/// Warmup steps HF derives for `total` steps (docs/upstream.md §5.3). A fraction is `ceil(total ×
/// f)` in every version that takes one; whole steps are taken as they are.
pub fn warmup_steps(warmup: Warmup, total: u64, _args: WarmupArgs) -> u64 {
    match warmup {
        Warmup::Steps(s) => s,
        Warmup::Fraction(f) => (total as f64 * f).ceil() as u64,
    }
}

/// One micro-batch of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Row {
    /// Micro-batches since training began (1-based).
    pub count: u64,
    /// Epoch (1-based).
    pub epoch: u64,
    /// Micro-batch within the epoch (1-based).
    pub step_in_epoch: u64,
    /// HF `global_step` after this micro-batch.
    pub hf_global: u64,
    /// HF takes an optimizer step here.
    pub hf_step: bool,
    /// DeepSpeed `micro_steps` after this micro-batch.
    pub ds_micro: u64,
    /// DeepSpeed `global_steps` after this micro-batch.
    pub ds_global: u64,
    /// DeepSpeed updates the weights here.
    pub ds_step: bool,
}

/// The micro-batch timeline of a run (docs/upstream.md §5.5): `batches` per epoch, accumulation
/// `g`, `epochs` (whole epochs started), HF stopping at `max_steps`.
pub fn timeline(
    batches: u64,
    g: u64,
    epochs: u64,
    max_steps: u64,
    hf: HfStepRule,
    ds: DsBoundary,
) -> Vec<Row> {
    let g = g.max(1);
    let mut rows = Vec::new();
    let (mut count, mut hf_global, mut ds_micro, mut ds_global) = (0u64, 0u64, 0u64, 0u64);
    'epochs: for epoch in 1..=epochs {
        for i in 1..=batches {
            count += 1;
            let short_epoch = batches <= g && i == batches;
            let hf_step = match hf {
                HfStepRule::EpochModulo => i % g == 0 || short_epoch,
                HfStepRule::Cumulative => count % g == 0 || short_epoch,
                HfStepRule::EpochModuloOrLast => i % g == 0 || i == batches,
            };
            if hf_step {
                hf_global += 1;
            }
            let ds_step = match ds {
                DsBoundary::OwnCounter => {
                    ds_micro += 1;
                    ds_micro % g == 0
                }
                // accelerate ≥ 1.8 calls engine.step() only at HF's boundary.
                DsBoundary::FollowsHf => {
                    if hf_step {
                        ds_micro += 1;
                    }
                    hf_step
                }
            };
            if ds_step {
                ds_global += 1;
            }
            rows.push(Row {
                count,
                epoch,
                step_in_epoch: i,
                hf_global,
                hf_step,
                ds_micro,
                ds_global,
                ds_step,
            });
            if hf_global >= max_steps && hf_step {
                break 'epochs;
            }
        }
    }
    rows
}

/// Whether HF and DeepSpeed disagree anywhere on the timeline.
pub fn diverges(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.hf_step != r.ds_step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::versions::{Rounding, Sharding};

    #[test]
    fn batches_per_rank_follows_both_samplers() {
        // 10 samples, batch 3, 2 ranks: B = 4 batches, 2 each.
        assert_eq!(
            batches_per_rank(10, 3, 2, false, Sharding::BatchSamplerShard),
            2
        );
        // 10 samples, batch 3, 3 ranks: B = 4, ceil(4/3) = 2 with wrap-around; drop_last: 3 / 3 = 1.
        assert_eq!(
            batches_per_rank(10, 3, 3, false, Sharding::BatchSamplerShard),
            2
        );
        assert_eq!(
            batches_per_rank(10, 3, 3, true, Sharding::BatchSamplerShard),
            1
        );
        // DistributedSampler: ceil(10/3) = 4 samples per rank, ceil(4/3) = 2 batches; drop_last: 1.
        assert_eq!(
            batches_per_rank(10, 3, 3, false, Sharding::DistributedSampler),
            2
        );
        assert_eq!(
            batches_per_rank(10, 3, 3, true, Sharding::DistributedSampler),
            1
        );
        // SpamAssassin train split, batch 16, 1 GPU: ceil(4708 / 16) = 295.
        assert_eq!(
            batches_per_rank(4708, 16, 1, false, Sharding::BatchSamplerShard),
            295
        );
    }

    #[test]
    fn updates_round_as_the_version_does() {
        assert_eq!(updates_per_epoch(3, 2, Rounding::Floor), 1);
        assert_eq!(updates_per_epoch(3, 2, Rounding::Ceil), 2);
        assert_eq!(updates_per_epoch(1, 4, Rounding::Floor), 1);
        assert_eq!(total_steps(3.0, 74, None), 222);
        assert_eq!(total_steps(2.5, 3, None), 8);
        assert_eq!(total_steps(3.0, 74, Some(10)), 10);
    }

    #[test]
    fn warmup_fraction_rounds_up() {
        assert_eq!(
            warmup_steps(Warmup::Fraction(0.06), 222, WarmupArgs::FloatSteps),
            14
        );
        assert_eq!(
            warmup_steps(Warmup::Steps(500), 10, WarmupArgs::StepsOnly),
            500
        );
    }

    fn marks(rows: &[Row], hf: bool) -> Vec<u64> {
        rows.iter()
            .filter(|r| if hf { r.hf_step } else { r.ds_step })
            .map(|r| r.count)
            .collect()
    }

    /// The seed document's example: GAS 2, 3 micro-batches per epoch, 2 epochs.
    #[test]
    fn seed_timeline_old_versions_drift() {
        // transformers 4.26 / DeepSpeed: U = floor(3/2) = 1, max_steps = 2.
        let rows = timeline(3, 2, 2, 2, HfStepRule::EpochModulo, DsBoundary::OwnCounter);
        assert_eq!(marks(&rows, true), vec![2, 5]);
        assert_eq!(marks(&rows, false), vec![2, 4]);
        assert!(diverges(&rows));
        assert_eq!(rows.len(), 5, "HF stops once global_step reaches max_steps");
    }

    #[test]
    fn seed_timeline_new_versions_agree() {
        // transformers 5.24 + accelerate 1.15: U = ceil(3/2) = 2, max_steps = 4.
        let rows = timeline(
            3,
            2,
            2,
            4,
            HfStepRule::EpochModuloOrLast,
            DsBoundary::FollowsHf,
        );
        assert_eq!(marks(&rows, true), vec![2, 3, 5, 6]);
        assert_eq!(marks(&rows, false), vec![2, 3, 5, 6]);
        assert!(!diverges(&rows));
        assert_eq!(
            rows.last().unwrap().ds_micro,
            4,
            "micro_steps counts optimizer steps under accelerate >= 1.8"
        );
    }

    #[test]
    fn new_transformers_old_accelerate_drifts_again() {
        let rows = timeline(
            3,
            2,
            2,
            4,
            HfStepRule::EpochModuloOrLast,
            DsBoundary::OwnCounter,
        );
        assert_eq!(marks(&rows, true), vec![2, 3, 5, 6]);
        assert_eq!(marks(&rows, false), vec![2, 4, 6]);
        assert!(diverges(&rows));
    }

    #[test]
    fn cumulative_rule_agrees_unless_the_epoch_is_short() {
        let rows = timeline(5, 2, 2, 5, HfStepRule::Cumulative, DsBoundary::OwnCounter);
        assert!(!diverges(&rows));
        let rows = timeline(2, 4, 3, 3, HfStepRule::Cumulative, DsBoundary::OwnCounter);
        assert_eq!(marks(&rows, true), vec![2, 4, 6]);
        assert_eq!(marks(&rows, false), vec![4]);
    }
}
