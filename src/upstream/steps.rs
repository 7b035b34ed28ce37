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

/// The rules of one run's timeline and where it has got to: the one place that decides whether
/// a micro-batch is an optimizer step on either side, for [`timeline`] (every row) and
/// [`summary`] (the whole run without its rows).
struct Walk {
    batches: u64,
    g: u64,
    max_steps: u64,
    hf: HfStepRule,
    ds: DsBoundary,
    count: u64,
    hf_global: u64,
    ds_micro: u64,
    ds_global: u64,
}

impl Walk {
    fn new(batches: u64, g: u64, max_steps: u64, hf: HfStepRule, ds: DsBoundary) -> Walk {
        Walk {
            batches,
            g: g.max(1),
            max_steps,
            hf,
            ds,
            count: 0,
            hf_global: 0,
            ds_micro: 0,
            ds_global: 0,
        }
    }

    /// Micro-batch `i` (1-based) of `epoch`: the row, and whether HF stops after it (`max_steps`).
    fn row(&mut self, epoch: u64, i: u64) -> (Row, bool) {
        let (batches, g) = (self.batches, self.g);
        self.count += 1;
        let short_epoch = batches <= g && i == batches;
        let hf_step = match self.hf {
            HfStepRule::EpochModulo => i % g == 0 || short_epoch,
            HfStepRule::Cumulative => self.count % g == 0 || short_epoch,
            HfStepRule::EpochModuloOrLast => i % g == 0 || i == batches,
        };
        if hf_step {
            self.hf_global += 1;
        }
        let ds_step = match self.ds {
            DsBoundary::OwnCounter => {
                self.ds_micro += 1;
                self.ds_micro % g == 0
            }
            // accelerate ≥ 1.8 calls engine.step() only at HF's boundary.
            DsBoundary::FollowsHf => {
                if hf_step {
                    self.ds_micro += 1;
                }
                hf_step
            }
        };
        if ds_step {
            self.ds_global += 1;
        }
        let row = Row {
            count: self.count,
            epoch,
            step_in_epoch: i,
            hf_global: self.hf_global,
            hf_step,
            ds_micro: self.ds_micro,
            ds_global: self.ds_global,
            ds_step,
        };
        (row, self.hf_global >= self.max_steps && hf_step)
    }

    /// The next micro-batch after `i` of the epoch at which either side may step: a multiple of
    /// `g` in the epoch or since the start (the rules' only residues), or the epoch's last. No
    /// micro-batch before it steps on either side.
    fn next_event(&self, i: u64) -> u64 {
        let g = self.g;
        let by_epoch = (i / g + 1).saturating_mul(g);
        let by_count = i.saturating_add(g - self.count % g);
        by_epoch.min(by_count).min(self.batches)
    }

    /// Skips `n` micro-batches at which neither side steps.
    fn quiet(&mut self, n: u64) {
        self.count += n;
        if self.ds == DsBoundary::OwnCounter {
            self.ds_micro += n;
        }
    }

    /// The counters, to take differences of over a period.
    fn counters(&self) -> [u64; 4] {
        [self.count, self.hf_global, self.ds_micro, self.ds_global]
    }

    /// Repeats `times` times a stretch whose counters went from `before` to now; `None` if a
    /// counter would pass `u64::MAX`.
    fn repeat(&mut self, before: [u64; 4], times: u64) -> Option<()> {
        let now = self.counters();
        let mut next = [0; 4];
        for k in 0..4 {
            next[k] = (now[k] - before[k])
                .checked_mul(times)?
                .checked_add(now[k])?;
        }
        [self.count, self.hf_global, self.ds_micro, self.ds_global] = next;
        Some(())
    }

    /// How many repeats of a stretch that takes `hf` HF steps leave HF short of `max_steps`
    /// (so that none of them stops the run), at most `wanted`.
    fn repeats_before_stop(&self, hf: u64, wanted: u64) -> u64 {
        if hf == 0 {
            return wanted;
        }
        if self.max_steps <= self.hf_global {
            return 0;
        }
        wanted.min((self.max_steps - 1 - self.hf_global) / hf)
    }
}

/// The micro-batch timeline of a run (docs/upstream.md §5.5): `batches` per epoch, accumulation
/// `g`, `epochs` (whole epochs started), HF stopping at `max_steps`; at most `limit` rows (the
/// run's first micro-batches).
pub fn timeline(
    batches: u64,
    g: u64,
    epochs: u64,
    max_steps: u64,
    hf: HfStepRule,
    ds: DsBoundary,
    limit: u64,
) -> Vec<Row> {
    let mut walk = Walk::new(batches, g, max_steps, hf, ds);
    let mut rows = Vec::new();
    'epochs: for epoch in 1..=epochs {
        for i in 1..=batches {
            if rows.len() as u64 >= limit {
                break 'epochs;
            }
            let (row, stop) = walk.row(epoch, i);
            rows.push(row);
            if stop {
                break 'epochs;
            }
        }
    }
    rows
}

/// What a whole timeline comes to, without its rows (which may be billions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The run's last micro-batch (`None`: it has none).
    pub last: Option<Row>,
    /// The first micro-batch at which HF and DeepSpeed disagree.
    pub first_divergence: Option<Row>,
}

impl Summary {
    /// Micro-batches in the run.
    pub fn micro_batches(&self) -> u64 {
        self.last.map_or(0, |r| r.count)
    }
    /// HF's optimizer steps.
    pub fn hf_steps(&self) -> u64 {
        self.last.map_or(0, |r| r.hf_global)
    }
    /// DeepSpeed's weight updates.
    pub fn ds_steps(&self) -> u64 {
        self.last.map_or(0, |r| r.ds_global)
    }
}

/// The most epochs [`summary`] walks one by one before their start residues (`count % g`) repeat:
/// a cycle is at most `g` epochs, so only an accumulation above this leaves a run undecided.
const CYCLE_EPOCHS_MAX: u64 = 1 << 20;

/// [`timeline`]'s last row and first disagreement, in time that does not grow with the run:
/// whether a micro-batch steps depends only on its place in the epoch, `count % g` and whether
/// it ends the epoch, so the micro-batches between two steps are skipped, an epoch's whole
/// periods of `g` repeat its first period, and the epochs repeat once an epoch starts at a
/// multiple of `g` again (a cycle of at most `g` epochs). Each skip stops short of `max_steps`, so
/// the run's end is walked. A disagreement shows in the first period of its epoch, or at the
/// epoch's end, and in the first cycle of epochs. `None` if the epochs' cycle is longer than
/// [`CYCLE_EPOCHS_MAX`] (an accumulation of more than a million micro-batches), or if the epochs'
/// micro-batches would pass `u64::MAX`.
pub fn summary(
    batches: u64,
    g: u64,
    epochs: u64,
    max_steps: u64,
    hf: HfStepRule,
    ds: DsBoundary,
) -> Option<Summary> {
    let mut walk = Walk::new(batches, g, max_steps, hf, ds);
    let g = walk.g;
    let mut out = Summary {
        last: None,
        first_divergence: None,
    };
    if batches == 0 {
        return Some(out);
    }
    // Every counter stays at or below the micro-batches of all the epochs.
    batches.checked_mul(epochs)?;
    let mut cycled = false;
    let mut epoch = 1;
    while epoch <= epochs {
        if !cycled && epoch > 1 && walk.count % g == 0 {
            // Epochs 1 … epoch − 1 are a cycle: each later epoch repeats the one a cycle before.
            cycled = true;
            let cycle = epoch - 1;
            let times = walk.repeats_before_stop(walk.hf_global, (epochs - cycle) / cycle);
            walk.repeat([0; 4], times)?;
            epoch += times * cycle;
            if let Some(last) = out.last.as_mut() {
                // The same place in a later cycle.
                *last = Row {
                    count: walk.count,
                    epoch: last.epoch + times * cycle,
                    hf_global: walk.hf_global,
                    ds_micro: walk.ds_micro,
                    ds_global: walk.ds_global,
                    ..*last
                };
            }
            continue;
        }
        if !cycled && epoch > CYCLE_EPOCHS_MAX {
            return None;
        }
        let start = walk.counters();
        let mut i = 0;
        while i < batches {
            let next = walk.next_event(i);
            walk.quiet(next - i - 1);
            i = next;
            let (row, stop) = walk.row(epoch, i);
            if row.hf_step != row.ds_step && out.first_divergence.is_none() {
                out.first_divergence = Some(row);
            }
            out.last = Some(row);
            if stop {
                return Some(out);
            }
            if i == g && g < batches {
                // Micro-batches g + 1 … g + k·g, all before the epoch's last, repeat 1 … g.
                let whole = (batches - 1 - g) / g;
                let times = walk.repeats_before_stop(walk.hf_global - start[1], whole);
                walk.repeat(start, times)?;
                i += times * g;
            }
        }
        epoch += 1;
    }
    Some(out)
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
        let rows = timeline(
            3,
            2,
            2,
            2,
            HfStepRule::EpochModulo,
            DsBoundary::OwnCounter,
            u64::MAX,
        );
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
            u64::MAX,
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
            u64::MAX,
        );
        assert_eq!(marks(&rows, true), vec![2, 3, 5, 6]);
        assert_eq!(marks(&rows, false), vec![2, 4, 6]);
        assert!(diverges(&rows));
    }

    #[test]
    fn cumulative_rule_agrees_unless_the_epoch_is_short() {
        let rows = timeline(
            5,
            2,
            2,
            5,
            HfStepRule::Cumulative,
            DsBoundary::OwnCounter,
            u64::MAX,
        );
        assert!(!diverges(&rows));
        let rows = timeline(
            2,
            4,
            3,
            3,
            HfStepRule::Cumulative,
            DsBoundary::OwnCounter,
            u64::MAX,
        );
        assert_eq!(marks(&rows, true), vec![2, 4, 6]);
        assert_eq!(marks(&rows, false), vec![4]);
    }

    const RULES: [(HfStepRule, DsBoundary); 6] = [
        (HfStepRule::EpochModulo, DsBoundary::OwnCounter),
        (HfStepRule::EpochModulo, DsBoundary::FollowsHf),
        (HfStepRule::Cumulative, DsBoundary::OwnCounter),
        (HfStepRule::Cumulative, DsBoundary::FollowsHf),
        (HfStepRule::EpochModuloOrLast, DsBoundary::OwnCounter),
        (HfStepRule::EpochModuloOrLast, DsBoundary::FollowsHf),
    ];

    /// What the listed rows say of the whole run.
    fn from_rows(rows: &[Row]) -> Summary {
        Summary {
            last: rows.last().copied(),
            first_divergence: rows.iter().find(|r| r.hf_step != r.ds_step).copied(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// The summary's skips land where walking every micro-batch does: the last row (its
        /// counters, place and steps) and the first disagreement, under every pair of rules, with
        /// epochs shorter and longer than the accumulation, `max_steps` inside an epoch, a cycle
        /// or past the end.
        #[test]
        fn the_summary_is_the_walk_of_every_row(
            batches in 0u64..60,
            g in 1u64..12,
            epochs in 1u64..40,
            max_steps in 0u64..400,
            rules in 0usize..6,
        ) {
            let (hf, ds) = RULES[rules];
            let rows = timeline(batches, g, epochs, max_steps, hf, ds, u64::MAX);
            let sum = summary(batches, g, epochs, max_steps, hf, ds).expect("a short cycle");
            proptest::prop_assert_eq!(sum, from_rows(&rows));
        }
    }

    #[test]
    fn a_listed_timeline_stops_at_its_limit() {
        let all = timeline(
            7,
            3,
            4,
            100,
            HfStepRule::EpochModulo,
            DsBoundary::OwnCounter,
            u64::MAX,
        );
        let some = timeline(
            7,
            3,
            4,
            100,
            HfStepRule::EpochModulo,
            DsBoundary::OwnCounter,
            10,
        );
        assert_eq!(all.len(), 28);
        assert_eq!(some[..], all[..10]);
    }

    /// A run of billions of micro-batches is summed up at once, and its figures are the closed
    /// forms: 10⁹ micro-batches an epoch (accumulation 4, one left over), 1000 epochs.
    #[test]
    fn a_billion_micro_batches_an_epoch_take_no_time() {
        let (l, g, epochs) = (1_000_000_001u64, 4u64, 1000u64);
        let per_epoch = l.div_ceil(g);
        let t = std::time::Instant::now();
        for (hf, ds) in RULES {
            let sum = summary(l, g, epochs, per_epoch * epochs, hf, ds).unwrap();
            let last = sum.last.unwrap();
            assert_eq!(last.count, l * epochs, "{hf:?} {ds:?}");
            assert_eq!(last.epoch, epochs);
            assert_eq!(last.step_in_epoch, l);
            // DeepSpeed's own counter steps at every 4th micro-batch of the run.
            if ds == DsBoundary::OwnCounter {
                assert_eq!(last.ds_global, l * epochs / g);
            } else {
                assert_eq!(last.ds_global, last.hf_global);
            }
        }
        // transformers ≥ 4.47 steps at each epoch's end too: ceil(L / g) a epoch.
        let sum = summary(
            l,
            g,
            epochs,
            per_epoch * epochs,
            HfStepRule::EpochModuloOrLast,
            DsBoundary::OwnCounter,
        )
        .unwrap();
        assert_eq!(sum.hf_steps(), per_epoch * epochs);
        let d = sum.first_divergence.unwrap();
        // The epoch's last micro-batch (1 past a multiple of 4): HF steps, DeepSpeed does not.
        assert_eq!((d.count, d.epoch, d.step_in_epoch), (l, 1, l));
        assert!(d.hf_step && !d.ds_step);
        assert!(t.elapsed().as_secs_f64() < 5.0, "{:?}", t.elapsed());
    }

    /// An accumulation whose epochs repeat only after more than 2²⁰ of them is left undecided,
    /// and a count past u64::MAX too, rather than walked or wrapped.
    #[test]
    fn runs_too_long_to_walk_are_undecided() {
        let g = (1u64 << 20) + 7;
        assert_eq!(
            summary(
                3,
                g,
                1 << 30,
                u64::MAX,
                HfStepRule::Cumulative,
                DsBoundary::OwnCounter
            ),
            None
        );
        assert_eq!(
            summary(
                u64::MAX / 2,
                4,
                8,
                u64::MAX,
                HfStepRule::EpochModulo,
                DsBoundary::OwnCounter
            ),
            None
        );
    }
}
