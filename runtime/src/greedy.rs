//! HF's `greedy` schedule, `GreedyLR`: stepped at each evaluation with the evaluation loss, like
//! torch's `ReduceLROnPlateau` ([`crate::plateau`]), but it also raises the LR while the metric
//! improves (docs/upstream.md §7.1). The compiler's rules run it on the metric DeepSpeed would
//! step it with (R0315); the training loop runs it on the evaluation loss.

use serde::{Deserialize, Serialize};

use crate::plateau::{is_better, worst};

/// The arguments of HF's `GreedyLR` (`greedy`), one parameter group
/// (huggingface/transformers@v5.24.0 src/transformers/optimization.py:`GreedyLR.__init__`);
/// [`Default`] is its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GreedyConfig {
    /// `mode == "max"`.
    pub maximize: bool,
    /// `factor` (< 1).
    pub factor: f64,
    /// `patience`.
    pub patience: u64,
    /// `threshold`.
    pub threshold: f64,
    /// `threshold_mode == "rel"`.
    pub relative: bool,
    /// `cooldown`.
    pub cooldown: u64,
    /// `warmup` (steps without counting after an increase; the recipe's `increase_cooldown`).
    pub warmup: u64,
    /// `min_lr`.
    pub min_lr: f64,
    /// `max_lr`.
    pub max_lr: f64,
    /// `eps`.
    pub eps: f64,
    /// `window_size` when `smooth`, else `None`.
    pub window: Option<usize>,
    /// `reset_start`.
    pub reset_start: u64,
}

impl Default for GreedyConfig {
    fn default() -> Self {
        GreedyConfig {
            maximize: false,
            factor: 0.95,
            patience: 10,
            threshold: 1e-6,
            relative: false,
            cooldown: 0,
            warmup: 0,
            min_lr: 1e-3,
            max_lr: 1.0,
            eps: 1e-8,
            window: None,
            reset_start: 500,
        }
    }
}

/// Calls [`Greedy::on_constant_metric`] follows one by one.
pub const CONSTANT_DIRECT: u64 = 1 << 22;
/// Calls [`Greedy::on_constant_metric`] follows at most looking for its state's cycle.
pub const CONSTANT_FOLLOWED: u64 = 1 << 24;

/// What [`Greedy::on_constant_metric`] finds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConstantCurve {
    /// The first call after which the LR differs from the LR before the first, and that LR.
    pub first_change: Option<(u64, f64)>,
    /// The LR after the last call, unless its state's cycle was not found.
    pub last: Option<f64>,
}

/// HF's `GreedyLR` as a state machine over the metrics it is stepped with
/// (huggingface/transformers@v5.24.0 src/transformers/optimization.py: `GreedyLR.step`,
/// `is_better`, `_reduce_lr`, `_increase_lr`, `_reset`, `StreamingAverage`). A metric better
/// than the best by more than `threshold` counts as good, else bad; `patience + 1` good ones in a
/// row divide the LR by `factor` (up to `max_lr`, then `warmup` steps without counting),
/// `patience + 1` bad ones multiply it (down to `min_lr`, then `cooldown` steps without
/// counting); a change of `eps` or less is not made, and after `reset_start` reductions tried at
/// `min_lr` it starts over from the initial LR. `recipe explain` has no metric to drive it; the
/// rules use it where the metric is known (DeepSpeed stepping it with the batch size, R0315).
/// Checked against the real class (transformers 5.24.0, torch 2.x) on 1,536 argument sets and
/// metric sequences of 40 steps each (constant, random, falling, rising; both modes and
/// threshold modes, patience 0–4, cooldown, warmup, smoothing, resets): all 61,440 LRs equal
/// to 1e-14 relative (the recorded values' JSON round trip).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Greedy {
    /// Its arguments.
    pub config: GreedyConfig,
    /// The initial LR (`_init_lrs`).
    pub init_lr: f64,
    /// The LR now.
    pub lr: f64,
    #[serde(with = "crate::json_f64")]
    best: f64,
    bad: u64,
    good: u64,
    cooldown_counter: u64,
    warmup_counter: u64,
    resets_left: i64,
    #[serde(with = "crate::json_f64::seq")]
    values: std::collections::VecDeque<f64>,
    #[serde(with = "crate::json_f64")]
    sum: f64,
}

impl Greedy {
    /// A scheduler over an optimizer at `lr`.
    pub fn new(lr: f64, config: GreedyConfig) -> Greedy {
        Greedy {
            config,
            init_lr: lr,
            lr,
            best: worst(config.maximize),
            bad: 0,
            good: 0,
            cooldown_counter: 0,
            warmup_counter: 0,
            resets_left: config.reset_start as i64,
            values: std::collections::VecDeque::new(),
            sum: 0.0,
        }
    }

    /// `step(metrics)`: one metric; returns the LR from now on.
    pub fn step(&mut self, metric: f64) -> f64 {
        let c = self.config;
        let mut current = metric;
        if let Some(size) = c.window {
            // StreamingAverage.streamavg: the window's mean, the sum kept as it goes.
            self.values.push_back(current);
            self.sum += current;
            if self.values.len() > size {
                self.sum -= self.values.pop_front().unwrap_or(0.0);
            }
            current = self.sum / self.values.len() as f64;
        }
        if self.cooldown_counter > 0 {
            self.cooldown_counter -= 1;
            self.bad = 0;
            self.good = 0;
        } else if self.warmup_counter > 0 {
            self.warmup_counter -= 1;
            self.bad = 0;
            self.good = 0;
        } else {
            if is_better(current, self.best, c.maximize, c.relative, c.threshold) {
                self.best = current;
                self.bad = 0;
                self.good += 1;
            } else {
                self.bad += 1;
                self.good = 0;
            }
            if self.good > c.patience {
                let new = (self.lr / c.factor).min(c.max_lr);
                if new - self.lr > c.eps {
                    self.lr = new;
                }
                self.resets_left = c.reset_start as i64;
                self.warmup_counter = c.warmup;
                self.good = 0;
            } else if self.bad > c.patience {
                let new = (self.lr * c.factor).max(c.min_lr);
                if self.lr - new > c.eps {
                    self.lr = new;
                }
                if self.lr <= c.min_lr {
                    self.resets_left -= 1;
                    if self.resets_left <= 0 {
                        self.reset();
                    }
                }
                self.cooldown_counter = c.cooldown;
                self.bad = 0;
            }
        }
        self.lr
    }

    /// The LR curve of `calls` calls of `step(metric)` with the same metric each time (how
    /// DeepSpeed's engine steps it, with the batch size: R0315), without keeping it: the first
    /// call after which the LR differs from the LR now, with that LR, and the LR after the last
    /// call (`None`: not followed that far). A run states up to billions of steps, so past
    /// [`CONSTANT_DIRECT`] calls the state's cycle is found (Brent's algorithm: on one metric the
    /// state machine is a function of its state, and `_reset` brings it back round) and the
    /// last call's state read off it; a cycle not closed within [`CONSTANT_FOLLOWED`] calls
    /// (smoothing's running sum can drift by an ulp a call) leaves the end undecided.
    pub fn on_constant_metric(&self, metric: f64, calls: u64) -> ConstantCurve {
        let lr0 = self.lr;
        let mut first = None;
        let mut note = |j: u64, lr: f64| {
            if first.is_none() && lr != lr0 && j <= calls {
                first = Some((j, lr));
            }
        };
        let mut g = self.clone();
        if calls <= CONSTANT_DIRECT {
            for j in 1..=calls {
                let lr = g.step(metric);
                note(j, lr);
            }
            return ConstantCurve {
                first_change: first,
                last: Some(g.lr),
            };
        }
        // Brent: the hare runs ahead of a tortoise parked at powers of two until it meets it;
        // `lam` is then the cycle's length. The hare has passed every state by then.
        let (mut power, mut lam) = (1u64, 1u64);
        let mut tortoise = self.clone();
        let lr = g.step(metric);
        let mut at = 1u64;
        note(at, lr);
        while g != tortoise {
            if at >= CONSTANT_FOLLOWED {
                return ConstantCurve {
                    first_change: first,
                    last: None,
                };
            }
            if power == lam {
                tortoise = g.clone();
                power *= 2;
                lam = 0;
            }
            let lr = g.step(metric);
            at += 1;
            lam += 1;
            note(at, lr);
        }
        // The cycle's first state: the tortoise from the start, the hare `lam` calls ahead.
        let (mut tortoise, mut hare) = (self.clone(), self.clone());
        for _ in 0..lam {
            hare.step(metric);
        }
        let mut mu = 0u64;
        while tortoise != hare {
            tortoise.step(metric);
            hare.step(metric);
            mu += 1;
        }
        // After `calls` calls the state is the one `mu + (calls − mu) mod lam` calls in (or
        // `calls` in, when the cycle starts later than that).
        let index = if calls < mu {
            calls
        } else {
            mu + (calls - mu) % lam
        };
        let mut end = self.clone();
        for _ in 0..index {
            end.step(metric);
        }
        ConstantCurve {
            first_change: first,
            last: Some(end.lr),
        }
    }

    /// `_reset`: the initial LR and a fresh start (the cooldown set after it still applies).
    fn reset(&mut self) {
        self.lr = self.init_lr;
        self.best = worst(self.config.maximize);
        self.bad = 0;
        self.good = 0;
        self.cooldown_counter = 0;
        self.warmup_counter = 0;
        self.resets_left = self.config.reset_start as i64;
        self.values.clear();
        self.sum = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_on_a_constant_metric() {
        // lr 0.01, factor 0.5, patience 1, floor 1e-3, 2 resets: the first metric is good, then
        // every second one cuts (bad 2 > 1); at the floor two more cuts are tried, then the LR
        // starts over. Worked out from GreedyLR.step by hand.
        let config = GreedyConfig {
            factor: 0.5,
            patience: 1,
            reset_start: 2,
            ..GreedyConfig::default()
        };
        let mut g = Greedy::new(0.01, config);
        let got: Vec<f64> = (0..12).map(|_| g.step(8.0)).collect();
        let want = [
            0.01, 0.01, 0.005, 0.005, 0.0025, 0.0025, 0.00125, 0.00125, 0.001, 0.001, 0.01, 0.01,
        ];
        assert_eq!(got, want);
    }

    /// The constant metric's curve found through the cycle is the one stepped call by call,
    /// for runs on both sides of the direct bound and cycles of every kind: resets, a floor
    /// reached and kept (no resets left to take), cooldowns, smoothing.
    #[test]
    fn a_constant_metrics_curve_through_its_cycle_is_the_direct_one() {
        let configs = [
            GreedyConfig {
                factor: 0.5,
                patience: 1,
                reset_start: 2,
                ..GreedyConfig::default()
            },
            GreedyConfig {
                factor: 0.9,
                patience: 3,
                cooldown: 2,
                min_lr: 1e-6,
                ..GreedyConfig::default()
            },
            GreedyConfig {
                factor: 0.7,
                patience: 0,
                window: Some(3),
                reset_start: 1,
                ..GreedyConfig::default()
            },
            GreedyConfig {
                min_lr: 0.5,
                ..GreedyConfig::default()
            },
        ];
        for config in configs {
            let g = Greedy::new(0.01, config);
            for calls in [
                0,
                1,
                2,
                5,
                17,
                1000,
                CONSTANT_DIRECT + 1,
                CONSTANT_DIRECT + 12_345,
            ] {
                let got = g.on_constant_metric(8.0, calls);
                // The direct walk, as the rule did before: every LR kept.
                let mut d = g.clone();
                let lrs: Vec<f64> = (0..calls).map(|_| d.step(8.0)).collect();
                let first = lrs
                    .iter()
                    .position(|&x| x != 0.01)
                    .map(|i| (i as u64 + 1, lrs[i]));
                assert_eq!(got.first_change, first, "{config:?}, {calls} calls");
                assert_eq!(got.last, Some(d.lr), "{config:?}, {calls} calls");
            }
        }
    }

    /// A cycle that starts after a long descent: cuts of 1e-6 of the LR stop being made once
    /// they are `eps` or less (at lr 1e-3, above the floor, so no reset ever comes), about
    /// 2.3 M cuts of 2 calls each in; then the state repeats every 2 calls. Runs past the direct
    /// walk end inside that prefix or in the cycle.
    #[test]
    fn a_constant_metrics_cycle_after_a_long_prefix() {
        let config = GreedyConfig {
            factor: 1.0 - 1e-6,
            patience: 1,
            min_lr: 1e-4,
            eps: 1e-9,
            ..GreedyConfig::default()
        };
        let g = Greedy::new(0.01, config);
        for calls in [CONSTANT_DIRECT + 1000, 12_000_000] {
            let got = g.on_constant_metric(8.0, calls);
            let (mut d, mut first) = (g.clone(), None);
            for j in 1..=calls {
                let lr = d.step(8.0);
                if first.is_none() && lr != 0.01 {
                    first = Some((j, lr));
                }
            }
            assert_eq!((got.first_change, got.last), (first, Some(d.lr)), "{calls}");
        }
    }

    /// A billion calls are answered from the cycle at once, and so is the LR that never moves.
    #[test]
    fn a_constant_metric_over_a_billion_calls() {
        let config = GreedyConfig {
            factor: 0.5,
            patience: 1,
            reset_start: 2,
            ..GreedyConfig::default()
        };
        let got = Greedy::new(0.01, config).on_constant_metric(8.0, 1_000_000_000_001);
        // The unit test above's cycle: 11 calls from the fresh state back to it (the 11th
        // resets), and 10¹² + 1 calls are 2 past a whole number of cycles.
        assert_eq!(got.first_change, Some((3, 0.005)));
        assert_eq!(got.last, Some(0.01));
        let still = Greedy::new(1e-4, GreedyConfig::default()).on_constant_metric(8.0, 1 << 40);
        assert_eq!(still.first_change, None);
        assert_eq!(still.last, Some(1e-4));
    }

    #[test]
    fn greedy_raises_after_improving_metrics_and_never_cuts_below_its_floor() {
        // patience 0: every improvement divides by 0.95, up to max_lr; lr 1e-4 under the default
        // floor 1e-3: a plateau makes no cut.
        let mut g = Greedy::new(
            1e-4,
            GreedyConfig {
                patience: 0,
                max_lr: 1.1e-4,
                ..GreedyConfig::default()
            },
        );
        assert!((g.step(1.0) - 1e-4 / 0.95).abs() < 1e-18);
        assert_eq!(g.step(0.5), 1.1e-4);
        assert_eq!(g.step(0.5), 1.1e-4);
        assert_eq!(g.step(0.5), 1.1e-4);
    }
}
