//! Learning-rate schedules of HuggingFace transformers and DeepSpeed, as pure functions.
//!
//! Both sides answer one question: *which learning rate does optimizer step `k` use?* Steps
//! are counted from 1 and only count applied optimizer steps (an fp16-overflow skip steps
//! neither scheduler). Everything is `f64`; nothing here does I/O.
//!
//! The formulas, the one-step lag of DeepSpeed's schedulers and the version notes are read from
//! upstream (the user-facing account is docs/rules/schedule-optimizer.md), cited as
//! `repo@tag:path:function`:
//! `HF` = `huggingface/transformers@v5.24.0:src/transformers/optimization.py`,
//! `DS` = `deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/lr_schedules.py`.
//!
//! # Step offsets
//!
//! * **HF** builds a `torch.optim.lr_scheduler.LambdaLR`, whose constructor already performs one
//!   `step()` (`pytorch/pytorch:torch/optim/lr_scheduler.py:LRScheduler._initial_step`, last
//!   epoch −1 → 0), and the Trainer steps it after every applied optimizer step
//!   (`huggingface/transformers@v5.24.0:src/transformers/trainer.py:Trainer._run_epoch`, the
//!   `if not self.accelerator.optimizer_step_was_skipped: … self.lr_scheduler.step()` block).
//!   So optimizer step `k` runs at `peak × λ(k − 1)`: see [`hf_lr`].
//! * **DeepSpeed** schedulers do *not* step in their constructors. They start at
//!   `last_batch_iteration = it = −1` and (since v0.15.3, PR #6597 "Add first Step in LR
//!   Schedulers") write the `it = −1` value into the optimizer at construction
//!   (`DS:WarmupLR.__init__`, `DS:WarmupCosineLR.__init__`; `LRRangeTest` and `OneCycle` always
//!   did). The engine steps the scheduler *after* each applied optimizer step
//!   (`deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/engine.py:DeepSpeedEngine._take_model_step`,
//!   `self.lr_scheduler.step(**(lr_kwargs or {}))` after the optimizer step, skipped on overflow).
//!   So optimizer step 1 runs at `it = −1` and step `k` at `it = k − 2` ([`ds_iteration`]). This
//!   reproduces the docs/upstream.md §7 table (k = 1 → 0 *and* k = 2 → 0 for W = 4: `it = −1` gives
//!   `min_lr`, `it = 0` gives `min_lr + Δ·0`). Before v0.15.3 the `Warmup*` constructors wrote
//!   nothing, so step 1 ran at the optimizer's own configured lr ([`DsFlags::init_writes_lr`]).
//!
//! # Upstream errors
//!
//! Where upstream would raise at that step (a Python `ZeroDivisionError`, or a constructor
//! `ValueError` such as polynomial's `lr_end >= lr`), the functions return `f64::NAN`, so a
//! checker can tell "upstream crashes" from any real learning rate.

use std::f64::consts::PI;

// ---------------------------------------------------------------------------------------------
// HuggingFace
// ---------------------------------------------------------------------------------------------

/// A `min_lr` / `min_lr_rate` pair of `lr_scheduler_kwargs`; upstream requires exactly one
/// (`HF:get_cosine_with_min_lr_schedule_with_warmup` raises "Only one of min_lr or min_lr_rate
/// should be set" / "One of min_lr or min_lr_rate should be set …"), which this enum enforces.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MinLr {
    /// `min_lr`: an absolute learning rate; upstream turns it into `min_lr / peak`.
    Absolute(f64),
    /// `min_lr_rate`: a fraction of the peak learning rate.
    Rate(f64),
}

impl MinLr {
    /// The rate relative to `peak_lr` (`min_lr / optimizer.defaults["lr"]`); NaN when an
    /// absolute `min_lr` meets a zero peak (upstream: `ZeroDivisionError`).
    pub fn rate(self, peak_lr: f64) -> f64 {
        match self {
            MinLr::Rate(r) => r,
            MinLr::Absolute(lr) => py_div(lr, peak_lr),
        }
    }
}

/// Warmup or decay shape of `warmup_stable_decay` (`"linear"`, `"cosine"`, `"1-sqrt"`;
/// `HF:get_wsd_schedule` raises `ValueError` for anything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WsdShape {
    /// `"linear"`.
    Linear,
    /// `"cosine"`.
    Cosine,
    /// `"1-sqrt"`.
    OneMinusSqrt,
}

/// An HF `lr_scheduler_type` together with its `lr_scheduler_kwargs`
/// (`HF:TYPE_TO_SCHEDULER_FUNCTION`,
/// `huggingface/transformers@v5.24.0:src/transformers/trainer_utils.py:SchedulerType`).
/// Documented defaults are upstream's; [`HfSchedule::with_defaults`] builds them from a name.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum HfSchedule {
    /// `"linear"` (the Trainer default): linear warmup, then linear decay to 0 at `total`
    /// (`HF:_get_linear_schedule_with_warmup_lr_lambda`).
    Linear,
    /// `"cosine"`: linear warmup, then `max(0, ½(1 + cos(2π·num_cycles·p)))`; `num_cycles`
    /// default 0.5, i.e. one half-cosine down to 0
    /// (`HF:_get_cosine_schedule_with_warmup_lr_lambda`).
    Cosine {
        /// Number of cosine waves (default 0.5).
        num_cycles: f64,
    },
    /// `"cosine_with_restarts"`: `num_cycles` hard restarts, each a half-cosine from 1 to 0;
    /// λ = 0 once `p >= 1` (`HF:_get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda`).
    CosineWithRestarts {
        /// Number of restarts (an `int` upstream, default 1; used as a float).
        num_cycles: f64,
    },
    /// `"polynomial"`: linear warmup, then `(peak − lr_end)·(1 − p)^power + lr_end`, i.e. the
    /// decay ends at the *absolute* `lr_end`, not at 0, and stays there after `total`
    /// (`HF:_get_polynomial_decay_schedule_with_warmup_lr_lambda`, which returns that divided by
    /// `lr_init = optimizer.defaults["lr"]` because LambdaLR multiplies it back).
    /// Upstream raises unless `peak > lr_end` (`HF:get_polynomial_decay_schedule_with_warmup`)
    /// and divides by `total − warmup` without a guard: both give NaN here.
    Polynomial {
        /// Final learning rate, absolute (default 1e-7).
        lr_end: f64,
        /// Exponent (default 1.0).
        power: f64,
    },
    /// `"constant"`: λ = 1; the warmup argument is ignored (`HF:get_scheduler` passes none).
    Constant,
    /// `"constant_with_warmup"`: `s / max(1, W)` during warmup, then 1
    /// (`HF:_get_constant_schedule_with_warmup_lr_lambda`).
    ConstantWithWarmup,
    /// `"inverse_sqrt"`: linear warmup, then `1 / sqrt((s + τ − W) / τ)`
    /// (`HF:_get_inverse_sqrt_schedule_lr_lambda`). `timescale` τ defaults to
    /// `num_warmup_steps or 10_000`, i.e. 10 000 when W = 0 (`HF:get_inverse_sqrt_schedule`).
    /// v5.24.0's `get_scheduler` forwards `lr_scheduler_kwargs`, so `timescale` can be set.
    InverseSqrt {
        /// `timescale`; `None` = upstream default.
        timescale: Option<u64>,
    },
    /// `"reduce_lr_on_plateau"`: torch `ReduceLROnPlateau`, driven by an evaluation metric
    /// (`HF:get_reduce_on_plateau_schedule`; the Trainer steps it with the metric in
    /// `Trainer._evaluate`, not after each optimizer step). It has no warmup and cannot be
    /// predicted without the metric: **modelled as constant** (the peak until the first
    /// reduction, an upper bound after).
    ReduceLrOnPlateau,
    /// `"cosine_with_min_lr"`: as `cosine`, but the factor is rescaled to
    /// `factor·(1 − rate) + rate`, so it ends at `min_lr`
    /// (`HF:get_cosine_with_min_lr_schedule_with_warmup`;
    /// its λ is the second `_get_cosine_schedule_with_warmup_lr_lambda` definition in the
    /// module, which shadows the first; with `min_lr_rate = 0` both agree).
    CosineWithMinLr {
        /// Number of cosine waves (default 0.5).
        num_cycles: f64,
        /// `min_lr` or `min_lr_rate` (one is required).
        min_lr: MinLr,
    },
    /// `"cosine_warmup_with_min_lr"`: like `cosine_with_min_lr` but shifted one step earlier:
    /// warmup `(s + 1) / max(1, W)` (or `r + (1 − r)·s / max(1, W − 1)` with `warmup_lr_rate` r),
    /// decay progress `(s − W + 1) / max(1, T − W)`
    /// (`HF:_get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda`).
    CosineWarmupWithMinLr {
        /// Number of cosine waves (default 0.5).
        num_cycles: f64,
        /// `min_lr` or `min_lr_rate` (one is required).
        min_lr: MinLr,
        /// `warmup_lr_rate` (default `None`).
        warmup_lr_rate: Option<f64>,
    },
    /// `"warmup_stable_decay"`: warmup (from `min_lr_ratio`), a flat phase, a decay to
    /// `min_lr_ratio` over `num_decay_steps`, then `min_lr_ratio` (`HF:_get_wsd_scheduler_lambda`).
    WarmupStableDecay {
        /// `num_stable_steps`; `None` = `total − warmup − num_decay_steps` (may be negative
        /// upstream, which is reproduced) (`HF:get_wsd_schedule`).
        num_stable_steps: Option<u64>,
        /// `num_decay_steps` (required).
        num_decay_steps: u64,
        /// `warmup_type` (default linear).
        warmup_type: WsdShape,
        /// `decay_type` (default cosine).
        decay_type: WsdShape,
        /// `min_lr_ratio` (default 0).
        min_lr_ratio: f64,
        /// `num_cycles` of the cosine decay (default 0.5).
        num_cycles: f64,
    },
    /// `"greedy"` (`HF:GreedyLR`): metric-driven like `reduce_lr_on_plateau`, starts at the
    /// optimizer lr; **modelled as constant**.
    Greedy,
}

impl HfSchedule {
    /// The `lr_scheduler_type` string.
    pub fn name(&self) -> &'static str {
        match self {
            HfSchedule::Linear => "linear",
            HfSchedule::Cosine { .. } => "cosine",
            HfSchedule::CosineWithRestarts { .. } => "cosine_with_restarts",
            HfSchedule::Polynomial { .. } => "polynomial",
            HfSchedule::Constant => "constant",
            HfSchedule::ConstantWithWarmup => "constant_with_warmup",
            HfSchedule::InverseSqrt { .. } => "inverse_sqrt",
            HfSchedule::ReduceLrOnPlateau => "reduce_lr_on_plateau",
            HfSchedule::CosineWithMinLr { .. } => "cosine_with_min_lr",
            HfSchedule::CosineWarmupWithMinLr { .. } => "cosine_warmup_with_min_lr",
            HfSchedule::WarmupStableDecay { .. } => "warmup_stable_decay",
            HfSchedule::Greedy => "greedy",
        }
    }

    /// The schedule named `name` with upstream's default kwargs; `None` for an unknown name and
    /// for the types that require a kwarg (`cosine_with_min_lr`, `cosine_warmup_with_min_lr`:
    /// `min_lr`/`min_lr_rate`; `warmup_stable_decay`: `num_decay_steps`).
    pub fn with_defaults(name: &str) -> Option<HfSchedule> {
        Some(match name {
            "linear" => HfSchedule::Linear,
            "cosine" => HfSchedule::Cosine { num_cycles: 0.5 },
            "cosine_with_restarts" => HfSchedule::CosineWithRestarts { num_cycles: 1.0 },
            "polynomial" => HfSchedule::Polynomial {
                lr_end: 1e-7,
                power: 1.0,
            },
            "constant" => HfSchedule::Constant,
            "constant_with_warmup" => HfSchedule::ConstantWithWarmup,
            "inverse_sqrt" => HfSchedule::InverseSqrt { timescale: None },
            "reduce_lr_on_plateau" => HfSchedule::ReduceLrOnPlateau,
            "greedy" => HfSchedule::Greedy,
            _ => return None,
        })
    }

    /// Whether the LR depends on an evaluation metric (then [`hf_lr`] returns the peak).
    pub fn is_metric_driven(&self) -> bool {
        matches!(self, HfSchedule::ReduceLrOnPlateau | HfSchedule::Greedy)
    }
}

/// Python's `a / b`: NaN where Python raises `ZeroDivisionError`.
fn py_div(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        f64::NAN
    } else {
        a / b
    }
}

/// Python's `max(0.0, x)`, except that NaN (our "upstream raised" marker) stays NaN, where
/// `f64::max` would turn it into 0.
fn nonneg(x: f64) -> f64 {
    if x.is_nan() {
        x
    } else {
        x.max(0.0)
    }
}

/// HF's shared linear warmup `s / max(1, W)`.
fn hf_warmup(s: f64, w: f64) -> f64 {
    s / w.max(1.0)
}

/// Half-cosine factor `½(1 + cos(2π·cycles·p))` used by HF's cosine family.
fn hf_cosine(num_cycles: f64, progress: f64) -> f64 {
    0.5 * (1.0 + (PI * num_cycles * 2.0 * progress).cos())
}

/// HF's multiplicative factor λ(s) for scheduler position `s` (= optimizer step − 1), with
/// `warmup` = W and `total` = T (`num_training_steps`). `peak_lr` is only read by the two
/// schedules whose λ depends on it (`polynomial`, and `min_lr` given absolutely).
/// Metric-driven schedules return 1.
pub fn hf_lambda(schedule: &HfSchedule, peak_lr: f64, warmup: u64, total: u64, s: u64) -> f64 {
    let (s, w, t) = (s as f64, warmup as f64, total as f64);
    match *schedule {
        HfSchedule::Constant | HfSchedule::ReduceLrOnPlateau | HfSchedule::Greedy => 1.0,
        HfSchedule::ConstantWithWarmup => {
            if s < w {
                hf_warmup(s, w)
            } else {
                1.0
            }
        }
        HfSchedule::Linear => {
            if s < w {
                hf_warmup(s, w)
            } else {
                ((t - s) / (t - w).max(1.0)).max(0.0)
            }
        }
        HfSchedule::Cosine { num_cycles } => {
            if s < w {
                hf_warmup(s, w)
            } else {
                hf_cosine(num_cycles, (s - w) / (t - w).max(1.0)).max(0.0)
            }
        }
        HfSchedule::CosineWithRestarts { num_cycles } => {
            if s < w {
                return hf_warmup(s, w);
            }
            let p = (s - w) / (t - w).max(1.0);
            if p >= 1.0 {
                0.0
            } else {
                // Python's `%` is a floor modulo: `rem_euclid` for a positive divisor.
                (0.5 * (1.0 + (PI * (num_cycles * p).rem_euclid(1.0)).cos())).max(0.0)
            }
        }
        HfSchedule::Polynomial { lr_end, power } => {
            let lr_init = peak_lr;
            if lr_init.partial_cmp(&lr_end) != Some(std::cmp::Ordering::Greater) {
                f64::NAN // constructor: "lr_end (…) must be smaller than initial lr (…)"
            } else if s < w {
                hf_warmup(s, w)
            } else if s > t {
                lr_end / lr_init
            } else {
                let remaining = 1.0 - py_div(s - w, t - w);
                ((lr_init - lr_end) * remaining.powf(power) + lr_end) / lr_init
            }
        }
        HfSchedule::InverseSqrt { timescale } => {
            if s < w {
                return hf_warmup(s, w);
            }
            let tau = match timescale {
                Some(tau) => tau as f64,
                None if warmup > 0 => w,
                None => 10_000.0,
            };
            1.0 / py_div(s + (tau - w), tau).sqrt()
        }
        HfSchedule::CosineWithMinLr { num_cycles, min_lr } => {
            let rate = min_lr.rate(peak_lr);
            if s < w {
                hf_warmup(s, w)
            } else {
                let factor = hf_cosine(num_cycles, (s - w) / (t - w).max(1.0));
                nonneg(factor * (1.0 - rate) + rate)
            }
        }
        HfSchedule::CosineWarmupWithMinLr {
            num_cycles,
            min_lr,
            warmup_lr_rate,
        } => {
            let rate = min_lr.rate(peak_lr);
            if s < w {
                match warmup_lr_rate {
                    None => (s + 1.0) / w.max(1.0),
                    Some(r) => r + (1.0 - r) * s / (w - 1.0).max(1.0),
                }
            } else {
                let factor = hf_cosine(num_cycles, (s - w + 1.0) / (t - w).max(1.0));
                nonneg(factor * (1.0 - rate) + rate)
            }
        }
        HfSchedule::WarmupStableDecay {
            num_stable_steps,
            num_decay_steps,
            warmup_type,
            decay_type,
            min_lr_ratio,
            num_cycles,
        } => {
            let d = num_decay_steps as f64;
            let stable = match num_stable_steps {
                Some(n) => n as f64,
                None => t - w - d,
            };
            let rescale = |f: f64| (f * (1.0 - min_lr_ratio) + min_lr_ratio).max(0.0);
            if s < w {
                let p = s / w.max(1.0);
                rescale(match warmup_type {
                    WsdShape::Linear => p,
                    WsdShape::Cosine => 0.5 * (1.0 - (PI * p).cos()),
                    WsdShape::OneMinusSqrt => 1.0 - (1.0 - p).sqrt(),
                })
            } else if s < w + stable {
                1.0
            } else if s < w + stable + d {
                let p = (s - w - stable) / d.max(1.0);
                rescale(match decay_type {
                    WsdShape::Linear => 1.0 - p,
                    WsdShape::Cosine => hf_cosine(num_cycles, p),
                    WsdShape::OneMinusSqrt => 1.0 - p.sqrt(),
                })
            } else {
                min_lr_ratio
            }
        }
    }
}

/// Learning rate used by optimizer step `step` (1-based; 0 is treated as 1) under the HF
/// scheduler: `peak_lr × λ(step − 1)` (LambdaLR semantics, see the module docs). `warmup` is
/// the resolved `num_warmup_steps` (`TrainingArguments.get_warmup_steps`) and `total` the
/// `num_training_steps` (`max_steps`).
pub fn hf_lr(schedule: &HfSchedule, peak_lr: f64, warmup: u64, total: u64, step: u64) -> f64 {
    peak_lr * hf_lambda(schedule, peak_lr, warmup, total, step.max(1) - 1)
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed
// ---------------------------------------------------------------------------------------------

/// `warmup_type` of DeepSpeed's `Warmup*` schedulers (v0.5.7+, PR #1530; earlier versions
/// always warm up logarithmically, so pass [`DsWarmupType::Log`] for them). Upstream maps any
/// other string to `Log` with a warning (`DS:WarmupLR.__init__`; `WarmupCosineLR` only since
/// v0.19.4, PR #8151, before which it crashed on the first step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum DsWarmupType {
    /// `"log"` (upstream default): `ln(it + 1) / ln(W')`.
    #[default]
    Log,
    /// `"linear"`: `it / W'`.
    Linear,
}

/// Parameters of DeepSpeed's `OneCycle` (`DS:OneCycle.__init__`); [`OneCycle::new`] fills the
/// defaults. Step sizes are floats because upstream converts them with `float()`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OneCycle {
    /// `cycle_min_lr` (required): the LR at both ends of the cycle.
    pub cycle_min_lr: f64,
    /// `cycle_max_lr` (required): the LR at the top of the cycle.
    pub cycle_max_lr: f64,
    /// `decay_lr_rate` (default 0 = no post-cycle decay).
    pub decay_lr_rate: f64,
    /// `cycle_first_step_size` (default 2000): iterations of the rising half.
    pub cycle_first_step_size: f64,
    /// `cycle_second_step_size` (default `None` = the first step size): the falling half.
    pub cycle_second_step_size: Option<f64>,
    /// `cycle_first_stair_count` (default 0 = continuous). Only has an effect with
    /// [`DsFlags::one_cycle_stairs`].
    pub cycle_first_stair_count: u64,
    /// `cycle_second_stair_count` (default `None` = the first stair count).
    pub cycle_second_stair_count: Option<u64>,
    /// `decay_step_size` (default 0 = no post-cycle decay).
    pub decay_step_size: f64,
    /// `cycle_momentum` (default **true**): cycle Adam β₁ inversely to the LR and force β₂ = 0.99.
    pub cycle_momentum: bool,
    /// `cycle_min_mom` (default 0.8).
    pub cycle_min_mom: f64,
    /// `cycle_max_mom` (default 0.9).
    pub cycle_max_mom: f64,
    /// `decay_mom_rate` (default 0).
    pub decay_mom_rate: f64,
}

impl OneCycle {
    /// `OneCycle` between `cycle_min_lr` and `cycle_max_lr` with upstream's other defaults.
    pub fn new(cycle_min_lr: f64, cycle_max_lr: f64) -> OneCycle {
        OneCycle {
            cycle_min_lr,
            cycle_max_lr,
            decay_lr_rate: 0.0,
            cycle_first_step_size: 2000.0,
            cycle_second_step_size: None,
            cycle_first_stair_count: 0,
            cycle_second_stair_count: None,
            decay_step_size: 0.0,
            cycle_momentum: true,
            cycle_min_mom: 0.8,
            cycle_max_mom: 0.9,
            decay_mom_rate: 0.0,
        }
    }

    /// Length of the cycle (both halves).
    fn total_size(&self) -> f64 {
        self.cycle_first_step_size + self.second_step_size()
    }

    fn second_step_size(&self) -> f64 {
        self.cycle_second_step_size
            .unwrap_or(self.cycle_first_step_size)
    }

    /// Position in the cycle, 0 at the ends and 1 at the top, for iteration `it`
    /// (`DS:OneCycle._get_scale_factor`): the triangle is evaluated at `b = it + 1`; with stairs
    /// enabled the position within the half is floored to `1/stair_count` steps, measured from
    /// the integer batch offset. NaN for a non-positive first or negative second half
    /// (v0.19.4+ raises `ValueError`; earlier versions divide by zero or misbehave).
    fn scale(&self, flags: &DsFlags, it: i64) -> f64 {
        let first = self.cycle_first_step_size;
        let second = self.second_step_size();
        if first.is_nan() || second.is_nan() || first <= 0.0 || second < 0.0 {
            return f64::NAN;
        }
        let total = first + second;
        let ratio = first / total;
        let b = (it + 1) as f64;
        let x = b / total - (b / total).floor();
        let rising = x <= ratio;
        let mut scale = if rising {
            x / ratio
        } else {
            (x - 1.0) / (ratio - 1.0)
        };
        let stairs = if rising {
            self.cycle_first_stair_count
        } else {
            self.cycle_second_stair_count
                .unwrap_or(self.cycle_first_stair_count)
        };
        if flags.one_cycle_stairs && stairs > 0 {
            let n = stairs as f64;
            let in_cycle = b.rem_euclid(total);
            let position = if in_cycle <= first {
                in_cycle * n / first
            } else {
                (total - in_cycle) * n / second
            };
            scale = position.floor() / n;
        }
        scale
    }
}

/// A DeepSpeed `scheduler` section (`type` + `params`), LR-relevant params only.
///
/// `warmup_num_steps` is stored as given; the effective value is always
/// `W' = max(2, warmup_num_steps)` (all versions; since v0.19.3, PR #8126, upstream also rejects
/// a non-`int` or ≤ 0 value with `"warmup_num_steps must be a positive integer, got <x>"`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DsSchedule {
    /// `WarmupLR` (`DS:WarmupLR`): `min_lr` at `it < 0`, warmup to `max_lr` over W', then flat.
    WarmupLr {
        /// `warmup_min_lr` (default 0).
        min_lr: f64,
        /// `warmup_max_lr`; `None` = key absent: the optimizer lr with
        /// [`DsFlags::warmup_lr_max_defaults_to_optimizer_lr`], else 0.001.
        max_lr: Option<f64>,
        /// `warmup_num_steps` (default 1000).
        warmup_num_steps: u64,
        /// `warmup_type` (default log).
        warmup_type: DsWarmupType,
    },
    /// `WarmupDecayLR` (`DS:WarmupDecayLR._get_gamma`): as `WarmupLR`, then
    /// `min + Δ·max(0, (T − it) / max(1, T − W'))`.
    WarmupDecayLr {
        /// `total_num_steps` T (required).
        total_num_steps: u64,
        /// `warmup_min_lr` (default 0).
        min_lr: f64,
        /// `warmup_max_lr`; `None` = key absent = 0.001 in every version (the subclass keeps
        /// its own `0.001` default, still on master).
        max_lr: Option<f64>,
        /// `warmup_num_steps` (default 1000).
        warmup_num_steps: u64,
        /// `warmup_type` (default log).
        warmup_type: DsWarmupType,
    },
    /// `WarmupCosineLR` (v0.12.3+, `DS:WarmupCosineLR.get_lr_ratio`): LR = optimizer lr (at
    /// construction) × ratio; ratio 0 at `it < 0`, warmup from `warmup_min_ratio` to 1 over W',
    /// then a half-cosine from 1 to `cos_min_ratio` with progress `(it − W' + 1) / (T − W')`
    /// (clamping per [`DsFlags::cosine_clamped`]). Has no `warmup_min_lr`/`warmup_max_lr`.
    WarmupCosineLr {
        /// `total_num_steps` T (required).
        total_num_steps: u64,
        /// `warmup_min_ratio` (default 0).
        warmup_min_ratio: f64,
        /// `cos_min_ratio` (default **1e-4**, not 0).
        cos_min_ratio: f64,
        /// `warmup_num_steps` (default 1000).
        warmup_num_steps: u64,
        /// `warmup_type` (default log).
        warmup_type: DsWarmupType,
    },
    /// `OneCycle` (`DS:OneCycle`): a triangle between `cycle_min_lr` and `cycle_max_lr`, then
    /// `cycle_min_lr / (1 + decay_lr_rate · (it − size + 1) / decay_step_size)`; see also
    /// [`ds_momentum`].
    OneCycle(OneCycle),
    /// `LRRangeTest` (`DS:LRRangeTest`): `min_lr · (1 + step_rate · x)`, `x = (it + 1) / step_size`,
    /// floored when `staircase`.
    LrRangeTest {
        /// `lr_range_test_min_lr` (default 1e-3).
        min_lr: f64,
        /// `lr_range_test_step_size` (default 2000; a positive `int` since v0.19.4, PR #8166).
        step_size: f64,
        /// `lr_range_test_step_rate` (default 1.0).
        step_rate: f64,
        /// `lr_range_test_staircase` (default false).
        staircase: bool,
    },
}

impl DsSchedule {
    /// The DeepSpeed `scheduler.type` string (looked up case-sensitively upstream).
    pub fn type_name(&self) -> &'static str {
        match self {
            DsSchedule::WarmupLr { .. } => "WarmupLR",
            DsSchedule::WarmupDecayLr { .. } => "WarmupDecayLR",
            DsSchedule::WarmupCosineLr { .. } => "WarmupCosineLR",
            DsSchedule::OneCycle(_) => "OneCycle",
            DsSchedule::LrRangeTest { .. } => "LRRangeTest",
        }
    }
}

/// Version-dependent DeepSpeed scheduler behaviour, as switches (no version checks in the
/// formulas). the `recipe` crate takes them from its versions table; `Default` is the newest (v0.19.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DsFlags {
    /// v0.15.3+ (PR #6597): the `Warmup*` constructors write the `it = −1` LR (`min_lr`, or 0
    /// for `WarmupCosineLR`) into the optimizer, so optimizer step 1 runs at it. Before, they
    /// wrote nothing and step 1 ran at the optimizer's configured lr. (`OneCycle` and
    /// `LRRangeTest` always wrote `cycle_min_lr` / `min_lr`.)
    pub init_writes_lr: bool,
    /// v0.17.2+ (PR #7360): `WarmupLR` without `warmup_max_lr` peaks at the optimizer lr;
    /// before, at 0.001. (`WarmupDecayLR` keeps 0.001.)
    pub warmup_lr_max_defaults_to_optimizer_lr: bool,
    /// v0.19.3+ (PR #8142): `WarmupCosineLR` uses `p = min(1, (it − W' + 1) / max(1, T − W'))`.
    /// Before: no clamp (the LR rises again after T) and no `max(1, ·)` (`ZeroDivisionError`,
    /// NaN here, once past warmup when T == W').
    pub cosine_clamped: bool,
    /// v0.19.4+ (PR #8179): `OneCycle`'s `cycle_first_stair_count` / `cycle_second_stair_count`
    /// take effect. Before, they were stored and never read (continuous schedule).
    pub one_cycle_stairs: bool,
}

impl DsFlags {
    /// Behaviour of v0.19.5 (latest tag; also master `edaa72212` for these formulas).
    pub const LATEST: DsFlags = DsFlags {
        init_writes_lr: true,
        warmup_lr_max_defaults_to_optimizer_lr: true,
        cosine_clamped: true,
        one_cycle_stairs: true,
    };
}

impl Default for DsFlags {
    fn default() -> DsFlags {
        DsFlags::LATEST
    }
}

/// The DeepSpeed scheduler position (`last_batch_iteration`) at which optimizer step `step`
/// (1-based; 0 is treated as 1) runs: `step − 2` (step 1 at −1, the construction-time value;
/// see the module docs).
pub fn ds_iteration(step: u64) -> i64 {
    step.max(1) as i64 - 2
}

/// `W' = max(2, warmup_num_steps)` (`DS:WarmupLR.__init__`, `DS:WarmupCosineLR.__init__`).
pub fn ds_effective_warmup(warmup_num_steps: u64) -> u64 {
    warmup_num_steps.max(2)
}

/// Warmup progress γ(it) for `0 <= it < W'` (`DS:WarmupLR._get_gamma`).
fn ds_warmup_gamma(warmup_type: DsWarmupType, w: f64, it: f64) -> f64 {
    match warmup_type {
        DsWarmupType::Log => (it + 1.0).ln() / w.ln(),
        DsWarmupType::Linear => it / w,
    }
}

/// The LR a DeepSpeed scheduler sets at `last_batch_iteration = it` (`it >= -1`; `-1` is the
/// value written at construction), independent of when it is stepped. `optimizer_lr` is the
/// optimizer's lr when the scheduler is built (DeepSpeed `optimizer.params.lr`): the base of
/// `WarmupCosineLR` and the default peak of `WarmupLR`. Ignores
/// [`DsFlags::init_writes_lr`], which only matters for [`ds_lr`] at step 1.
pub fn ds_lr_at_iteration(
    schedule: &DsSchedule,
    flags: &DsFlags,
    optimizer_lr: f64,
    it: i64,
) -> f64 {
    let itf = it as f64;
    match *schedule {
        DsSchedule::WarmupLr {
            min_lr,
            max_lr,
            warmup_num_steps,
            warmup_type,
        } => {
            let max_lr = max_lr.unwrap_or(if flags.warmup_lr_max_defaults_to_optimizer_lr {
                optimizer_lr
            } else {
                0.001
            });
            let w = ds_effective_warmup(warmup_num_steps) as f64;
            if it < 0 {
                min_lr
            } else if itf < w {
                min_lr + (max_lr - min_lr) * ds_warmup_gamma(warmup_type, w, itf)
            } else {
                max_lr
            }
        }
        DsSchedule::WarmupDecayLr {
            total_num_steps,
            min_lr,
            max_lr,
            warmup_num_steps,
            warmup_type,
        } => {
            let max_lr = max_lr.unwrap_or(0.001);
            let w = ds_effective_warmup(warmup_num_steps) as f64;
            let t = total_num_steps as f64;
            let gamma = if it < 0 {
                0.0
            } else if itf < w {
                ds_warmup_gamma(warmup_type, w, itf)
            } else {
                ((t - itf) / (t - w).max(1.0)).max(0.0)
            };
            min_lr + (max_lr - min_lr) * gamma
        }
        DsSchedule::WarmupCosineLr {
            total_num_steps,
            warmup_min_ratio,
            cos_min_ratio,
            warmup_num_steps,
            warmup_type,
        } => {
            let w = ds_effective_warmup(warmup_num_steps) as f64;
            let t = total_num_steps as f64;
            let ratio = if it < 0 {
                0.0
            } else if itf < w {
                warmup_min_ratio + (1.0 - warmup_min_ratio) * ds_warmup_gamma(warmup_type, w, itf)
            } else {
                let done = itf - w + 1.0;
                let p = if flags.cosine_clamped {
                    (done / (t - w).max(1.0)).min(1.0)
                } else {
                    py_div(done, t - w)
                };
                let half = (1.0 + (PI * p).cos()) / 2.0;
                nonneg(cos_min_ratio + (1.0 - cos_min_ratio) * half)
            };
            optimizer_lr * ratio
        }
        DsSchedule::OneCycle(ref oc) => {
            let total = oc.total_size();
            if itf < total {
                oc.cycle_min_lr + (oc.cycle_max_lr - oc.cycle_min_lr) * oc.scale(flags, it)
            } else if oc.decay_step_size == 0.0 || oc.decay_lr_rate == 0.0 {
                oc.cycle_min_lr
            } else {
                let interval = (itf - total + 1.0) / oc.decay_step_size;
                oc.cycle_min_lr / (1.0 + oc.decay_lr_rate * interval)
            }
        }
        DsSchedule::LrRangeTest {
            min_lr,
            step_size,
            step_rate,
            staircase,
        } => {
            if step_size.is_nan() || step_size <= 0.0 {
                return f64::NAN;
            }
            let mut x = (itf + 1.0) / step_size;
            if staircase {
                x = x.floor();
            }
            min_lr * (1.0 + step_rate * x)
        }
    }
}

/// Learning rate used by optimizer step `step` (1-based; 0 is treated as 1) under a DeepSpeed
/// scheduler stepped by the engine after each applied optimizer step, as under the HF Trainer:
/// the value at `it = step − 2` ([`ds_iteration`]). Step 1 (`it = −1`) gets the construction-time
/// value, or, for the `Warmup*` schedulers without [`DsFlags::init_writes_lr`], `optimizer_lr`
/// itself.
///
/// With W = 4, T = 10, linear warmup this gives the docs/upstream.md §7 rows: `WarmupLR` 0, 0, .25,
/// .5, .75, 1, …; `WarmupDecayLR` … 1, .833, …, .333 (HF `linear` is one step ahead).
pub fn ds_lr(schedule: &DsSchedule, flags: &DsFlags, optimizer_lr: f64, step: u64) -> f64 {
    let it = ds_iteration(step);
    let warmup_family = matches!(
        schedule,
        DsSchedule::WarmupLr { .. }
            | DsSchedule::WarmupDecayLr { .. }
            | DsSchedule::WarmupCosineLr { .. }
    );
    if it < 0 && warmup_family && !flags.init_writes_lr {
        return optimizer_lr;
    }
    ds_lr_at_iteration(schedule, flags, optimizer_lr, it)
}

/// The Adam betas `(β₁, β₂)` that DeepSpeed's `OneCycle` sets for optimizer step `step`
/// (1-based), or `None` when it sets none (other schedulers, or `cycle_momentum: false`).
///
/// β₂ is forced to 0.99 whatever the optimizer was configured with (docs/upstream.md R-L05). β₁
/// follows the cycle inversely: `cycle_max_mom − (max − min)·scale` (`DS:OneCycle._get_cycle_mom`),
/// then `cycle_max_mom · (1 + decay_mom_rate · (it − size + 1) / decay_step_size)` after the cycle
/// (`DS:OneCycle._get_decay_mom`; it *grows*, even past 1), or `cycle_max_mom` when that decay is
/// off. Step 1 is special: the constructor writes `(cycle_min_mom, 0.99)`
/// (`DS:OneCycle._initialize_momentum`) although the cycle formula at that point would give
/// `cycle_max_mom`, so β₁ jumps from min to ≈max between steps 1 and 2. Upstream turns
/// `cycle_momentum` off (with a warning) when the optimizer has no `betas` default; the caller must
/// account for that.
pub fn ds_momentum(schedule: &DsSchedule, flags: &DsFlags, step: u64) -> Option<(f64, f64)> {
    const BETA2: f64 = 0.99;
    let DsSchedule::OneCycle(oc) = schedule else {
        return None;
    };
    if !oc.cycle_momentum {
        return None;
    }
    let it = ds_iteration(step);
    if it < 0 {
        return Some((oc.cycle_min_mom, BETA2));
    }
    let total = oc.total_size();
    let itf = it as f64;
    let beta1 = if itf < total {
        oc.cycle_max_mom - (oc.cycle_max_mom - oc.cycle_min_mom) * oc.scale(flags, it)
    } else if oc.decay_step_size == 0.0 || oc.decay_mom_rate == 0.0 {
        oc.cycle_max_mom
    } else {
        let interval = (itf - total + 1.0) / oc.decay_step_size;
        oc.cycle_max_mom * (1.0 + oc.decay_mom_rate * interval)
    };
    Some((beta1, BETA2))
}
