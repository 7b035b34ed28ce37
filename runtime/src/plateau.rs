//! The schedules HF's Trainer steps on an evaluation metric instead of per optimizer step:
//! torch's `ReduceLROnPlateau` (`reduce_lr_on_plateau`, [`Plateau`]) and HF's `GreedyLR`
//! (`greedy`, [`crate::greedy::Greedy`]). The Trainer builds them with `lr_scheduler_kwargs`
//! over their own defaults, never steps them after an optimizer step, and steps them after each
//! evaluation with the evaluation loss (`metric_for_best_model` defaults to `loss` for both)
//! (`huggingface/transformers@v5.24.0:src/transformers/trainer.py`, the `ReduceLROnPlateau` /
//! `GreedyLR` checks in the training step and in `_evaluate`).
//!
//! The native runtime trains every parameter at one LR; HF's optimizer has two parameter groups
//! at the same LR, which stay equal unless a per-group `min_lr` list differs (the checker refuses
//! that for the native target, R1106).

use serde::{Deserialize, Serialize};

use crate::greedy::Greedy;

/// torch `ReduceLROnPlateau`'s arguments (`pytorch/pytorch:torch/optim/lr_scheduler.py`,
/// `ReduceLROnPlateau.__init__`, torch 2.15); [`Default`] is torch's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlateauConfig {
    /// `factor` (< 1).
    pub factor: f64,
    /// `patience`: evaluations without improvement tolerated.
    pub patience: u64,
    /// `mode == "max"` (the metric should rise).
    #[serde(default)]
    pub maximize: bool,
    /// `threshold`.
    #[serde(default = "defaults::threshold")]
    pub threshold: f64,
    /// `threshold_mode == "rel"`.
    #[serde(default = "defaults::yes")]
    pub relative: bool,
    /// `cooldown`: evaluations after a reduction whose verdict is ignored.
    #[serde(default)]
    pub cooldown: u64,
    /// `min_lr`: the LR is never cut below it.
    #[serde(default)]
    pub min_lr: f64,
    /// `eps`: a cut of this much or less is not made.
    #[serde(default = "defaults::eps")]
    pub eps: f64,
}

/// The defaults of the fields a plan or checkpoint written before they existed lacks: torch's.
mod defaults {
    pub fn threshold() -> f64 {
        1e-4
    }
    pub fn eps() -> f64 {
        1e-8
    }
    pub fn yes() -> bool {
        true
    }
}

impl Default for PlateauConfig {
    fn default() -> Self {
        PlateauConfig {
            factor: 0.1,
            patience: 10,
            maximize: false,
            threshold: defaults::threshold(),
            relative: true,
            cooldown: 0,
            min_lr: 0.0,
            eps: defaults::eps(),
        }
    }
}

/// `_is_better` of torch's `ReduceLROnPlateau` and HF's `GreedyLR` (the same four cases).
pub(crate) fn is_better(
    current: f64,
    best: f64,
    maximize: bool,
    relative: bool,
    threshold: f64,
) -> bool {
    match (maximize, relative) {
        (false, true) => current < best * (1.0 - threshold),
        (false, false) => current < best - threshold,
        (true, true) => current > best * (threshold + 1.0),
        (true, false) => current > best + threshold,
    }
}

/// `mode_worse`: the best metric before the first.
pub(crate) fn worst(maximize: bool) -> f64 {
    if maximize {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    }
}

/// torch's `ReduceLROnPlateau` over one parameter group: enough state to resume exactly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Plateau {
    /// The learning rate now.
    pub lr: f64,
    /// Its arguments (flattened: a checkpoint written when only `factor` and `patience` existed
    /// reads as torch's defaults for the rest).
    #[serde(flatten)]
    pub config: PlateauConfig,
    /// The best metric so far (`mode_worse`, ±inf, before the first).
    #[serde(with = "crate::json_f64")]
    pub best: f64,
    /// `num_bad_epochs`: evaluations since the last improvement.
    pub bad: u64,
    /// `cooldown_counter`.
    #[serde(default)]
    pub cooldown_left: u64,
}

impl Plateau {
    /// A scheduler starting at `lr`.
    pub fn new(lr: f64, config: PlateauConfig) -> Plateau {
        Plateau {
            lr,
            config,
            best: worst(config.maximize),
            bad: 0,
            cooldown_left: 0,
        }
    }

    /// `step(metrics)`: one evaluation's metric; returns the LR from now on.
    pub fn observe(&mut self, metric: f64) -> f64 {
        let c = self.config;
        if is_better(metric, self.best, c.maximize, c.relative, c.threshold) {
            self.best = metric;
            self.bad = 0;
        } else {
            self.bad += 1;
        }
        if self.cooldown_left > 0 {
            // Bad evaluations during the cooldown are ignored.
            self.cooldown_left -= 1;
            self.bad = 0;
        }
        if self.bad > c.patience {
            // `_reduce_lr`: max(lr · factor, min_lr), made only when it moves by more than eps.
            let new = (self.lr * c.factor).max(c.min_lr);
            if self.lr - new > c.eps {
                self.lr = new;
            }
            self.cooldown_left = c.cooldown;
            self.bad = 0;
        }
        self.lr
    }
}

/// The state of the metric-driven schedule a run steps at each evaluation.
#[derive(Debug, Clone, PartialEq)]
pub enum OnMetric {
    /// `reduce_lr_on_plateau`.
    Plateau(Plateau),
    /// `greedy`.
    Greedy(Greedy),
}

impl OnMetric {
    /// The learning rate now.
    pub fn lr(&self) -> f64 {
        match self {
            OnMetric::Plateau(p) => p.lr,
            OnMetric::Greedy(g) => g.lr,
        }
    }

    /// Steps the schedule with one evaluation's loss; returns the LR from now on.
    pub fn observe(&mut self, metric: f64) -> f64 {
        match self {
            OnMetric::Plateau(p) => p.observe(metric),
            OnMetric::Greedy(g) => g.step(metric),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plateau(lr: f64, factor: f64, patience: u64) -> Plateau {
        Plateau::new(
            lr,
            PlateauConfig {
                factor,
                patience,
                ..PlateauConfig::default()
            },
        )
    }

    #[test]
    fn reduces_after_patience_evaluations_without_improvement() {
        // patience 2: the third evaluation without improvement reduces (num_bad > patience).
        let mut p = plateau(1e-3, 0.5, 2);
        assert_eq!(p.observe(1.0), 1e-3); // best = 1.0
        assert_eq!(p.observe(1.0), 1e-3); // bad 1 (not better by 1e-4)
        assert_eq!(p.observe(0.99995), 1e-3); // bad 2 (within the threshold)
        assert_eq!(p.observe(1.2), 5e-4); // bad 3 > 2: reduce, reset
        assert_eq!(p.observe(0.5), 5e-4); // better
        assert_eq!(p.bad, 0);
        // A reduction below eps is not applied.
        let mut q = plateau(1e-8, 0.5, 0);
        q.observe(1.0);
        assert_eq!(q.observe(2.0), 1e-8);
    }

    #[test]
    fn cooldown_floor_and_the_other_modes() {
        // patience 0, cooldown 1, floor 3e-4: cut, one ignored evaluation, cut to the floor.
        let mut p = Plateau::new(
            1e-3,
            PlateauConfig {
                factor: 0.5,
                patience: 0,
                cooldown: 1,
                min_lr: 3e-4,
                ..PlateauConfig::default()
            },
        );
        let got: Vec<f64> = [1.0, 1.0, 1.0, 1.0, 1.0]
            .iter()
            .map(|&m| p.observe(m))
            .collect();
        assert_eq!(got, [1e-3, 5e-4, 5e-4, 3e-4, 3e-4]);
        // mode max, absolute threshold 0.1: 0.75 after 0.7 is no improvement.
        let mut q = Plateau::new(
            1.0,
            PlateauConfig {
                factor: 0.5,
                patience: 0,
                maximize: true,
                relative: false,
                threshold: 0.1,
                ..PlateauConfig::default()
            },
        );
        assert_eq!(q.observe(0.7), 1.0);
        assert_eq!(q.observe(0.75), 0.5);
        assert_eq!(q.observe(0.9), 0.5);
    }

    #[test]
    fn the_state_survives_json_before_the_first_evaluation() {
        // `best` is ±inf until the first metric, which JSON has no number for.
        for maximize in [false, true] {
            let p = Plateau::new(
                1e-3,
                PlateauConfig {
                    maximize,
                    ..PlateauConfig::default()
                },
            );
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(serde_json::from_str::<Plateau>(&text).unwrap(), p, "{text}");
        }
        // A checkpoint written when the state was lr, factor, patience, best, bad.
        let old: Plateau =
            serde_json::from_str(r#"{"lr":0.001,"factor":0.5,"patience":2,"best":0.7,"bad":1}"#)
                .unwrap();
        assert_eq!(old.config.threshold, 1e-4);
        assert_eq!(old.best, 0.7);
    }
}
