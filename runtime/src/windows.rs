//! The order of work: epochs of shuffled, sharded micro-batches, grouped into accumulation
//! windows, one optimizer step per window, until the run's total. The training loop consumes
//! exactly this sequence, so counting it is counting the steps the runtime takes.

use crate::data::{self, DataError};

/// The shape of a run's data order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Training rows.
    pub rows: usize,
    /// Examples per rank per micro-batch.
    pub micro: usize,
    /// Micro-batches per window (`G`).
    pub accumulate: usize,
    /// Data-parallel ranks.
    pub world: usize,
    /// Drop each epoch's short last batch.
    pub drop_last: bool,
    /// Shuffle each epoch (seeded).
    pub shuffle: bool,
    /// The shuffle seed.
    pub seed: u64,
    /// Optimizer steps of the whole run.
    pub total: u64,
}

/// One accumulation window: the micro-batches (row indices) of one optimizer step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The optimizer step this window ends with (1-based).
    pub step: u64,
    /// The epoch (0-based).
    pub epoch: u64,
    /// Micro-batches of this epoch consumed before this window.
    pub first_batch: u64,
    /// Row indices of each micro-batch (`G` of them, fewer in a short last window).
    pub batches: Vec<Vec<usize>>,
    /// Whether the window ends its epoch.
    pub ends_epoch: bool,
    /// Micro-batches per rank in this epoch (`L`).
    pub epoch_batches: u64,
}

/// Every window of `rank`'s run, in order, starting after optimizer step `done` (0 from the
/// start). Windows are ceil-grouped: each epoch ends with a possibly short window.
pub fn windows(shape: Shape, rank: usize, done: u64) -> Result<Vec<Window>, DataError> {
    let g = shape.accumulate.max(1);
    let mut out = Vec::new();
    let mut step = 0u64;
    let mut epoch = 0u64;
    if shape.rows == 0 {
        return Ok(out);
    }
    while step < shape.total {
        let order = data::epoch_order(shape.rows, shape.seed, epoch, shape.shuffle);
        let batches =
            data::trainer_batches(&order, shape.micro, shape.world, rank, shape.drop_last)?;
        if batches.is_empty() {
            // Nothing to train on (e.g. drop_last with fewer rows than one batch per rank).
            break;
        }
        let epoch_batches = batches.len() as u64;
        let mut start = 0;
        while start < batches.len() && step < shape.total {
            let end = (start + g).min(batches.len());
            step += 1;
            if step > done {
                out.push(Window {
                    step,
                    epoch,
                    first_batch: start as u64,
                    batches: batches[start..end].to_vec(),
                    ends_epoch: end == batches.len(),
                    epoch_batches,
                });
            }
            start = end;
        }
        epoch += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::native;

    /// The optimizer steps the loop's order takes equal what `recipe steps` predicts
    /// (`accounting::native`, closed form), over a grid of shapes and every rank.
    #[test]
    fn steps_taken_equal_the_prediction() {
        let mut cases = 0;
        for rows in [1usize, 2, 5, 7, 16, 23, 48, 100] {
            for micro in [1usize, 3, 4, 8] {
                for acc in [1usize, 2, 3, 5] {
                    for world in [1usize, 2, 3, 4] {
                        for drop_last in [false, true] {
                            for (epochs, max_steps) in
                                [(1.0, None), (2.0, None), (2.5, None), (3.0, Some(7))]
                            {
                                let p = native(
                                    rows as u64,
                                    micro as u64,
                                    acc as u64,
                                    world as u64,
                                    drop_last,
                                    epochs,
                                    max_steps,
                                );
                                if p.batches_per_epoch == 0 {
                                    continue; // the checker refuses a run with no batches
                                }
                                let shape = Shape {
                                    rows,
                                    micro,
                                    accumulate: acc,
                                    world,
                                    drop_last,
                                    shuffle: true,
                                    seed: 3,
                                    total: p.total,
                                };
                                for rank in 0..world {
                                    let ws = windows(shape, rank, 0).unwrap();
                                    let what = format!(
                                        "rows {rows} micro {micro} acc {acc} world {world} \
                                         drop_last {drop_last} epochs {epochs} rank {rank}"
                                    );
                                    assert_eq!(ws.len() as u64, p.total, "{what}");
                                    for w in &ws {
                                        assert_eq!(w.epoch_batches, p.batches_per_epoch, "{what}");
                                    }
                                    // Full epochs take `per_epoch` steps, the last window of each
                                    // is `last_window` long.
                                    let full = ws.iter().filter(|w| w.ends_epoch);
                                    for w in full {
                                        assert_eq!(
                                            w.step - w.epoch * p.per_epoch,
                                            p.per_epoch,
                                            "{what}"
                                        );
                                        assert_eq!(w.batches.len() as u64, p.last_window, "{what}");
                                    }
                                    cases += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(cases > 2000, "{cases}");
    }

    #[test]
    fn resuming_skips_exactly_the_done_steps() {
        let shape = Shape {
            rows: 23,
            micro: 3,
            accumulate: 2,
            world: 1,
            drop_last: false,
            shuffle: true,
            seed: 9,
            total: 11,
        };
        let all = windows(shape, 0, 0).unwrap();
        let rest = windows(shape, 0, 4).unwrap();
        assert_eq!(&all[4..], &rest[..]);
    }
}
