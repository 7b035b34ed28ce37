//! `reduce_lr_on_plateau`: torch's `ReduceLROnPlateau` as HF's Trainer drives it — built with
//! `lr_scheduler_kwargs` over torch's defaults (mode `min`, threshold 1e-4 relative, cooldown 0,
//! min_lr 0, eps 1e-8), stepped only after each evaluation with the evaluation loss
//! (`metric_for_best_model` defaults to `loss`), never per optimizer step
//! (`huggingface/transformers@v5.24.0:src/transformers/trainer.py`, the `ReduceLROnPlateau`
//! checks in the training step and in `_evaluate`; `pytorch/pytorch:torch/optim/lr_scheduler.py:
//! ReduceLROnPlateau.step`, `_reduce_lr`, `_is_better`).

use serde::{Deserialize, Serialize};

/// torch's threshold (relative, mode `min`).
const THRESHOLD: f64 = 1e-4;
/// torch's `eps`: a reduction smaller than this is not applied.
const EPS: f64 = 1e-8;

/// The scheduler's state: enough to resume exactly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Plateau {
    /// The learning rate now.
    pub lr: f64,
    /// Multiplies the LR on a plateau.
    pub factor: f64,
    /// Evaluations without improvement tolerated.
    pub patience: u64,
    /// The best metric so far (`inf` before the first).
    pub best: f64,
    /// Evaluations since the last improvement.
    pub bad: u64,
}

impl Plateau {
    /// A scheduler starting at `lr`.
    pub fn new(lr: f64, factor: f64, patience: u64) -> Plateau {
        Plateau {
            lr,
            factor,
            patience,
            best: f64::INFINITY,
            bad: 0,
        }
    }

    /// One evaluation's metric (lower is better); returns the LR from now on.
    pub fn observe(&mut self, metric: f64) -> f64 {
        // `_is_better` in mode min, threshold_mode rel: a < best · (1 − threshold).
        if metric < self.best * (1.0 - THRESHOLD) {
            self.best = metric;
            self.bad = 0;
        } else {
            self.bad += 1;
        }
        if self.bad > self.patience {
            let new = (self.lr * self.factor).max(0.0);
            if self.lr - new > EPS {
                self.lr = new;
            }
            self.bad = 0;
        }
        self.lr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_after_patience_evaluations_without_improvement() {
        // patience 2: the third evaluation without improvement reduces (num_bad > patience).
        let mut p = Plateau::new(1e-3, 0.5, 2);
        assert_eq!(p.observe(1.0), 1e-3); // best = 1.0
        assert_eq!(p.observe(1.0), 1e-3); // bad 1 (not better by 1e-4)
        assert_eq!(p.observe(0.99995), 1e-3); // bad 2 (within the threshold)
        assert_eq!(p.observe(1.2), 5e-4); // bad 3 > 2: reduce, reset
        assert_eq!(p.observe(0.5), 5e-4); // better
        assert_eq!(p.bad, 0);
        // A reduction below eps is not applied.
        let mut q = Plateau::new(1e-8, 0.5, 0);
        q.observe(1.0);
        assert_eq!(q.observe(2.0), 1e-8);
    }
}
