//! Learning-rate schedules of HuggingFace transformers and DeepSpeed, as pure functions.
//!
//! Both sides answer one question: *which learning rate does optimizer step `k` use?* Steps
//! are counted from 1 and only count applied optimizer steps (an fp16-overflow skip steps
//! neither scheduler). Everything is `f64`; nothing here does I/O.
//!
//! Spec: `/work/shared/reference/ds_hf_rules.md` §6.4 (DeepSpeed formulas, version notes) and
//! §7 (HF `lr_scheduler_type` λ formulas, the one-step lag, the W = 4, T = 10 table). Where the
//! spec is silent the behaviour was read from upstream, cited as `repo@tag:path:function`:
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
//!   reproduces the spec §7 table (k = 1 → 0 *and* k = 2 → 0 for W = 4: `it = −1` gives
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DsWarmupType {
    /// `"log"` (upstream default): `ln(it + 1) / ln(W')`.
    #[default]
    Log,
    /// `"linear"`: `it / W'`.
    Linear,
}

/// Parameters of DeepSpeed's `OneCycle` (`DS:OneCycle.__init__`); [`OneCycle::new`] fills the
/// defaults. Step sizes are floats because upstream converts them with `float()`.
#[derive(Debug, Clone, Copy, PartialEq)]
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
/// formulas). [`DsFlags::from_facts`] takes them from the versions table; `Default` is the newest (v0.19.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// The flags of a target DeepSpeed release, from the versions table.
    pub fn from_facts(facts: &crate::versions::Facts) -> DsFlags {
        DsFlags {
            init_writes_lr: facts.ds_warmup_init_writes_lr,
            warmup_lr_max_defaults_to_optimizer_lr: facts.ds_warmup_lr_defaults_to_optimizer_lr,
            cosine_clamped: facts.ds_cosine_clamped,
            one_cycle_stairs: facts.ds_one_cycle_stairs,
        }
    }
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
/// With W = 4, T = 10, linear warmup this gives the spec §7 rows: `WarmupLR` 0, 0, .25, .5, .75,
/// 1, …; `WarmupDecayLR` … 1, .833, …, .333 (HF `linear` is one step ahead).
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
/// β₂ is forced to 0.99 whatever the optimizer was configured with (spec R-L05). β₁ follows the
/// cycle inversely: `cycle_max_mom − (max − min)·scale` (`DS:OneCycle._get_cycle_mom`), then
/// `cycle_max_mom · (1 + decay_mom_rate · (it − size + 1) / decay_step_size)` after the cycle
/// (`DS:OneCycle._get_decay_mom`; it *grows*, even past 1), or `cycle_max_mom` when that decay is
/// off. Step 1 is special: the constructor writes `(cycle_min_mom, 0.99)`
/// (`DS:OneCycle._initialize_momentum`) although the cycle formula at that point would give
/// `cycle_max_mom`, so β₁ jumps from min to ≈max between steps 1 and 2. Upstream turns
/// `cycle_momentum` off (with a warning) when the optimizer has no `betas` default; the caller
/// must account for that.
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

#[cfg(test)]
mod tests {
    //! Expected values are literals: the spec §7 table (as printed, 3 decimals) and numbers
    //! worked out by hand from the documented formulas (cross-checked by running the upstream
    //! Python with a stub `torch`), never produced by calling the functions under test.

    use super::*;

    fn flags_for(deepspeed: &str) -> DsFlags {
        let mut targets = crate::versions::Targets::newest();
        targets.deepspeed = deepspeed.parse().unwrap();
        DsFlags::from_facts(&crate::versions::Facts::for_targets(&targets))
    }

    /// `got` prints as `want` to 3 decimals, the precision of the spec table.
    fn assert_row(got: &[f64], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                format!("{g:.3}"),
                format!("{w:.3}"),
                "{what}: step k = {} got {g}, want {w}",
                k + 1
            );
        }
    }

    fn assert_close(got: f64, want: f64, what: &str) {
        assert!((got - want).abs() < 1e-9, "{what}: got {got}, want {want}");
    }

    fn hf_row(s: &HfSchedule, w: u64, t: u64, n: u64) -> Vec<f64> {
        (1..=n).map(|k| hf_lr(s, 1.0, w, t, k)).collect()
    }

    fn ds_row(s: &DsSchedule, n: u64) -> Vec<f64> {
        (1..=n)
            .map(|k| ds_lr(s, &DsFlags::LATEST, 1.0, k))
            .collect()
    }

    fn warmup_lr(w: u64, ty: DsWarmupType) -> DsSchedule {
        DsSchedule::WarmupLr {
            min_lr: 0.0,
            max_lr: Some(1.0),
            warmup_num_steps: w,
            warmup_type: ty,
        }
    }

    fn warmup_decay(w: u64, t: u64) -> DsSchedule {
        DsSchedule::WarmupDecayLr {
            total_num_steps: t,
            min_lr: 0.0,
            max_lr: Some(1.0),
            warmup_num_steps: w,
            warmup_type: DsWarmupType::Linear,
        }
    }

    fn warmup_cosine(w: u64, t: u64, cos_min_ratio: f64) -> DsSchedule {
        DsSchedule::WarmupCosineLr {
            total_num_steps: t,
            warmup_min_ratio: 0.0,
            cos_min_ratio,
            warmup_num_steps: w,
            warmup_type: DsWarmupType::Linear,
        }
    }

    // --- spec §7 table, W = 4, T = 10 -------------------------------------------------------

    #[test]
    fn spec_table_ds_warmup_lr_log() {
        let got = ds_row(&warmup_lr(4, DsWarmupType::Log), 10);
        let want = [0.0, 0.0, 0.500, 0.792, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "DS WarmupLR log");
    }

    #[test]
    fn spec_table_ds_warmup_lr_linear() {
        let got = ds_row(&warmup_lr(4, DsWarmupType::Linear), 10);
        let want = [0.0, 0.0, 0.250, 0.500, 0.750, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "DS WarmupLR linear");
    }

    #[test]
    fn spec_table_hf_constant_with_warmup() {
        let got = hf_row(&HfSchedule::ConstantWithWarmup, 4, 10, 10);
        let want = [0.0, 0.250, 0.500, 0.750, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "HF constant_with_warmup");
    }

    #[test]
    fn spec_table_ds_warmup_decay_lr_linear() {
        let got = ds_row(&warmup_decay(4, 10), 10);
        let want = [
            0.0, 0.0, 0.250, 0.500, 0.750, 1.0, 0.833, 0.667, 0.500, 0.333,
        ];
        assert_row(&got, &want, "DS WarmupDecayLR linear");
    }

    #[test]
    fn spec_table_hf_linear() {
        let got = hf_row(&HfSchedule::Linear, 4, 10, 10);
        let want = [
            0.0, 0.250, 0.500, 0.750, 1.0, 0.833, 0.667, 0.500, 0.333, 0.167,
        ];
        assert_row(&got, &want, "HF linear");
    }

    #[test]
    fn spec_table_ds_warmup_cosine_lr_linear() {
        let got = ds_row(&warmup_cosine(4, 10, 0.0), 10);
        let want = [
            0.0, 0.0, 0.250, 0.500, 0.750, 0.933, 0.750, 0.500, 0.250, 0.067,
        ];
        assert_row(&got, &want, "DS WarmupCosineLR linear");
    }

    #[test]
    fn spec_table_hf_cosine() {
        let got = hf_row(&HfSchedule::Cosine { num_cycles: 0.5 }, 4, 10, 10);
        let want = [
            0.0, 0.250, 0.500, 0.750, 1.0, 0.933, 0.750, 0.500, 0.250, 0.067,
        ];
        assert_row(&got, &want, "HF cosine");
    }

    // --- spec §7, W = 1, T = 6 ---------------------------------------------------------------

    #[test]
    fn spec_w1_t6() {
        assert_row(
            &hf_row(&HfSchedule::Linear, 1, 6, 6),
            &[0.0, 1.0, 0.8, 0.6, 0.4, 0.2],
            "HF linear W=1",
        );
        assert_row(
            &hf_row(&HfSchedule::Linear, 0, 6, 6),
            &[1.0, 0.833, 0.667, 0.5, 0.333, 0.167],
            "HF linear W=0",
        );
        assert_row(
            &ds_row(&warmup_decay(1, 6), 6),
            &[0.0, 0.0, 0.5, 1.0, 0.75, 0.5],
            "DS WarmupDecayLR linear W=1 (W'=2)",
        );
        // warmup_num_steps 0 (accepted before v0.19.3) is the same W' = 2.
        assert_row(
            &ds_row(&warmup_decay(0, 6), 6),
            &[0.0, 0.0, 0.5, 1.0, 0.75, 0.5],
            "DS WarmupDecayLR linear W=0",
        );
    }

    #[test]
    fn ds_iteration_offset() {
        assert_eq!(ds_iteration(1), -1);
        assert_eq!(ds_iteration(2), 0);
        assert_eq!(ds_iteration(10), 8);
        assert_eq!(ds_effective_warmup(1), 2);
        assert_eq!(ds_effective_warmup(7), 7);
    }

    // --- HF, hand-computed -------------------------------------------------------------------

    #[test]
    fn hf_polynomial_decays_to_absolute_lr_end() {
        // peak 2, lr_end 0.1, power 2, W = 2, T = 6; s = k − 1.
        // s < 2: 2·s/2; 2 <= s <= 6: (2 − 0.1)(1 − (s − 2)/4)^2 + 0.1; s > 6: 0.1.
        let s = HfSchedule::Polynomial {
            lr_end: 0.1,
            power: 2.0,
        };
        let want = [0.0, 1.0, 2.0, 1.16875, 0.575, 0.21875, 0.1, 0.1, 0.1];
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&s, 2.0, 2, 6, k), w, &format!("polynomial k={k}"));
        }
        // Constructor rejects lr_end >= peak; T == W divides by zero at s == T.
        assert!(hf_lr(&s, 0.1, 2, 6, 4).is_nan());
        assert!(hf_lr(&s, 2.0, 3, 3, 4).is_nan());
        assert_close(
            hf_lr(&s, 2.0, 3, 3, 5),
            0.1,
            "polynomial past T with T == W",
        );
    }

    #[test]
    fn hf_inverse_sqrt() {
        let s = HfSchedule::InverseSqrt { timescale: None };
        // W = 4, τ = W = 4: s >= 4 → 1/sqrt(s/4).
        assert_close(hf_lr(&s, 1.0, 4, 100, 3), 0.5, "warmup s=2");
        assert_close(hf_lr(&s, 1.0, 4, 100, 5), 1.0, "s=4");
        assert_close(hf_lr(&s, 1.0, 4, 100, 10), 2.0 / 3.0, "s=9");
        assert_close(hf_lr(&s, 1.0, 4, 100, 17), 0.5, "s=16");
        // W = 0 → τ = 10 000: s = 30 000 → 1/sqrt(4).
        assert_close(hf_lr(&s, 1.0, 0, 0, 1), 1.0, "W=0 s=0");
        assert_close(hf_lr(&s, 1.0, 0, 0, 30_001), 0.5, "W=0 s=30000");
        // Explicit τ = 100, W = 0: s = 300 → 1/sqrt(400/100).
        let t = HfSchedule::InverseSqrt {
            timescale: Some(100),
        };
        assert_close(hf_lr(&t, 1.0, 0, 0, 301), 0.5, "tau=100 s=300");
    }

    #[test]
    fn hf_cosine_with_restarts() {
        // W = 0, T = 8, 2 cycles: p = s/8, λ = ½(1 + cos(π·((2p) mod 1))), 0 once p >= 1.
        let s = HfSchedule::CosineWithRestarts { num_cycles: 2.0 };
        let want = [
            1.0,
            0.853_553_390_593_273_8,
            0.5,
            0.146_446_609_406_726_24,
            1.0,
            0.853_553_390_593_273_8,
            0.5,
            0.146_446_609_406_726_24,
            0.0,
            0.0,
        ];
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&s, 1.0, 0, 8, k), w, &format!("restarts k={k}"));
        }
    }

    #[test]
    fn hf_min_lr_and_wsd() {
        // cosine_with_min_lr, W = 0, T = 4, rate 0.1: s = 2 → ½·0.9 + 0.1.
        let rate = HfSchedule::CosineWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Rate(0.1),
        };
        assert_close(hf_lr(&rate, 1.0, 0, 4, 3), 0.55, "min_lr_rate");
        let abs = HfSchedule::CosineWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Absolute(0.2),
        };
        assert_close(hf_lr(&abs, 2.0, 0, 4, 3), 1.1, "min_lr absolute");
        assert_close(hf_lr(&abs, 2.0, 0, 4, 5), 0.2, "ends at min_lr");
        assert!(hf_lambda(&abs, 0.0, 0, 4, 2).is_nan(), "min_lr / 0");
        // cosine_warmup_with_min_lr, W = 2, T = 6, rate 0: warmup (s+1)/2, p = (s − 1)/4.
        let cw = HfSchedule::CosineWarmupWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Rate(0.0),
            warmup_lr_rate: None,
        };
        assert_close(hf_lr(&cw, 1.0, 2, 6, 1), 0.5, "cw s=0");
        assert_close(hf_lr(&cw, 1.0, 2, 6, 2), 1.0, "cw s=1");
        assert_close(hf_lr(&cw, 1.0, 2, 6, 4), 0.5, "cw s=3 (p=1/2)");
        // warmup_stable_decay: W = 2, stable 2, decay 4, min ratio 0.1; s = k − 1.
        let wsd = |decay_type| HfSchedule::WarmupStableDecay {
            num_stable_steps: Some(2),
            num_decay_steps: 4,
            warmup_type: WsdShape::Linear,
            decay_type,
            min_lr_ratio: 0.1,
            num_cycles: 0.5,
        };
        let want = [0.1, 0.55, 1.0, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1];
        let lin = wsd(WsdShape::Linear);
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&lin, 1.0, 2, 0, k), w, &format!("wsd linear k={k}"));
        }
        // s = 5 (p = 1/4): 1-sqrt → 1 − ½; s = 6 (p = 1/2): cosine → ½.
        assert_close(
            hf_lr(&wsd(WsdShape::OneMinusSqrt), 1.0, 2, 0, 6),
            0.55,
            "1-sqrt",
        );
        assert_close(hf_lr(&wsd(WsdShape::Cosine), 1.0, 2, 0, 7), 0.55, "cosine");
    }

    #[test]
    fn hf_metric_driven_and_constant_are_flat() {
        for s in [
            HfSchedule::Constant,
            HfSchedule::ReduceLrOnPlateau,
            HfSchedule::Greedy,
        ] {
            assert_eq!(hf_lr(&s, 3e-4, 100, 1000, 1), 3e-4, "{}", s.name());
            assert_eq!(hf_lr(&s, 3e-4, 100, 1000, 1000), 3e-4, "{}", s.name());
        }
        assert!(HfSchedule::ReduceLrOnPlateau.is_metric_driven());
        assert_eq!(
            HfSchedule::with_defaults("cosine"),
            Some(HfSchedule::Cosine { num_cycles: 0.5 })
        );
        assert_eq!(HfSchedule::with_defaults("warmup_stable_decay"), None);
    }

    // --- DeepSpeed, hand-computed ------------------------------------------------------------

    #[test]
    fn ds_warmup_cosine_pre_0_19_3_rises_after_total() {
        // W' = 4, T = 10, cos_min 0. After T: unclamped p = (it − 3)/6 keeps growing, so the
        // LR comes back up (k = 12: p = 7/6 → ½(1 + cos(7π/6)); k = 17: p = 2 → 1).
        let s = warmup_cosine(4, 10, 0.0);
        let old = flags_for("0.19.2");
        let new = flags_for("0.19.3");
        let old_want = [
            (11, 0.0),
            (12, 0.066_987_298_107_780_68),
            (13, 0.25),
            (16, 0.933_012_701_892_219_3),
            (17, 1.0),
        ];
        for (k, w) in old_want {
            assert_close(ds_lr(&s, &old, 1.0, k), w, &format!("unclamped k={k}"));
            assert_close(ds_lr(&s, &new, 1.0, k), 0.0, &format!("clamped k={k}"));
        }
        // T == W': upstream divided by zero before v0.19.3; since then the floor (1e-4) holds.
        let eq = warmup_cosine(4, 4, 1e-4);
        assert_close(ds_lr(&eq, &old, 1.0, 5), 0.75, "warmup unaffected");
        assert!(ds_lr(&eq, &old, 1.0, 6).is_nan());
        assert_close(ds_lr(&eq, &new, 1.0, 6), 1e-4, "clamped floor");
        assert_close(ds_lr(&eq, &new, 1.0, 8), 1e-4, "clamped floor");
    }

    #[test]
    fn ds_init_and_max_lr_defaults_by_version() {
        // Optimizer lr 0.5, WarmupLR linear W = 4 without warmup_max_lr.
        let s = DsSchedule::WarmupLr {
            min_lr: 0.0,
            max_lr: None,
            warmup_num_steps: 4,
            warmup_type: DsWarmupType::Linear,
        };
        let old = flags_for("0.15.2");
        // Before v0.15.3 step 1 runs at the optimizer lr, and the peak is 0.001.
        let want_old = [0.5, 0.0, 0.00025, 0.0005, 0.00075, 0.001];
        let want_new = [0.0, 0.0, 0.125, 0.25, 0.375, 0.5];
        for (k, (a, b)) in (1..).zip(want_old.into_iter().zip(want_new)) {
            assert_close(ds_lr(&s, &old, 0.5, k), a, &format!("v0.15.2 k={k}"));
            assert_close(
                ds_lr(&s, &DsFlags::LATEST, 0.5, k),
                b,
                &format!("latest k={k}"),
            );
        }
        // WarmupDecayLR without warmup_max_lr peaks at 0.001 in every version.
        let d = DsSchedule::WarmupDecayLr {
            total_num_steps: 10,
            min_lr: 0.0,
            max_lr: None,
            warmup_num_steps: 4,
            warmup_type: DsWarmupType::Linear,
        };
        assert_close(ds_lr(&d, &DsFlags::LATEST, 0.5, 6), 0.001, "decay peak");
        assert_eq!(DsFlags::default(), flags_for("0.19.5"));
    }

    #[test]
    fn ds_constant_warmup_lr() {
        // min == max: exact constant from step 1 (spec §7, `constant`).
        let s = DsSchedule::WarmupLr {
            min_lr: 2e-5,
            max_lr: Some(2e-5),
            warmup_num_steps: 1000,
            warmup_type: DsWarmupType::Log,
        };
        for k in [1, 2, 3, 500, 5000] {
            assert_eq!(ds_lr(&s, &DsFlags::LATEST, 1.0, k), 2e-5);
        }
    }

    fn one_cycle_small() -> OneCycle {
        // min 0.1, max 1, halves of 4, decay 0.5 every 2 iterations after the cycle.
        OneCycle {
            decay_lr_rate: 0.5,
            cycle_first_step_size: 4.0,
            decay_step_size: 2.0,
            ..OneCycle::new(0.1, 1.0)
        }
    }

    #[test]
    fn ds_one_cycle_triangle_then_decay() {
        // b = it + 1 = k − 1; scale = b/4 rising, (8 − b)/4 falling; lr = 0.1 + 0.9·scale.
        // After the cycle (it >= 8): 0.1 / (1 + 0.5·(it − 7)/2).
        let s = DsSchedule::OneCycle(one_cycle_small());
        let want = [
            0.1,
            0.325,
            0.55,
            0.775,
            1.0,
            0.775,
            0.55,
            0.325,
            0.1,
            0.08,
            0.1 / 1.5,
            0.1 / 1.75,
        ];
        for (k, w) in (1..).zip(want) {
            assert_close(
                ds_lr(&s, &DsFlags::LATEST, 1.0, k),
                w,
                &format!("one cycle k={k}"),
            );
        }
        // β1 = 0.9 − 0.1·scale, except step 1 (constructor: min mom); after the cycle, with no
        // momentum decay, 0.9. β2 = 0.99.
        let want_mom = [
            (1, 0.8),
            (2, 0.875),
            (3, 0.85),
            (5, 0.8),
            (6, 0.825),
            (9, 0.9),
            (12, 0.9),
        ];
        for (k, w) in want_mom {
            let (b1, b2) = ds_momentum(&s, &DsFlags::LATEST, k).unwrap();
            assert_close(b1, w, &format!("beta1 k={k}"));
            assert_eq!(b2, 0.99);
        }
        let no_mom = DsSchedule::OneCycle(OneCycle {
            cycle_momentum: false,
            ..one_cycle_small()
        });
        assert_eq!(ds_momentum(&no_mom, &DsFlags::LATEST, 3), None);
        assert_eq!(
            ds_momentum(&warmup_lr(4, DsWarmupType::Log), &DsFlags::LATEST, 3),
            None
        );
    }

    #[test]
    fn ds_one_cycle_momentum_decay_grows() {
        // Halves 2 and 4, decay_mom_rate 0.1 every iteration: after the cycle (it >= 6)
        // β1 = 0.9·(1 + 0.1·(it − 5)).
        let s = DsSchedule::OneCycle(OneCycle {
            cycle_first_step_size: 2.0,
            cycle_second_step_size: Some(4.0),
            decay_mom_rate: 0.1,
            decay_step_size: 1.0,
            ..OneCycle::new(0.1, 1.0)
        });
        let lr_want = [0.1, 0.55, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1];
        for (k, w) in (1..).zip(lr_want) {
            assert_close(ds_lr(&s, &DsFlags::LATEST, 1.0, k), w, &format!("lr k={k}"));
        }
        for (k, w) in [(7, 0.9), (8, 0.99), (9, 1.08), (12, 1.35)] {
            let (b1, _) = ds_momentum(&s, &DsFlags::LATEST, k).unwrap();
            assert_close(b1, w, &format!("beta1 k={k}"));
        }
    }

    #[test]
    fn ds_one_cycle_stairs() {
        // 2 stairs per half of 4: the position b·2/4 (rising) or (8 − b)·2/4 (falling) is
        // floored to halves. Without the v0.19.4 flag the stair count is ignored.
        let s = DsSchedule::OneCycle(OneCycle {
            cycle_first_step_size: 4.0,
            cycle_first_stair_count: 2,
            ..OneCycle::new(0.1, 1.0)
        });
        let stairs = [0.1, 0.1, 0.55, 0.55, 1.0, 0.55, 0.55, 0.1, 0.1];
        let smooth = [0.1, 0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1];
        let new = flags_for("0.19.4");
        let old = flags_for("0.19.3");
        for (k, (a, b)) in (1..).zip(stairs.into_iter().zip(smooth)) {
            assert_close(ds_lr(&s, &new, 1.0, k), a, &format!("stairs k={k}"));
            assert_close(ds_lr(&s, &old, 1.0, k), b, &format!("no stairs k={k}"));
        }
        let (b1, _) = ds_momentum(&s, &new, 3).unwrap();
        assert_close(b1, 0.85, "stair momentum");
    }

    #[test]
    fn ds_one_cycle_pr_8179_reproduction() {
        // Numbers printed in DeepSpeed PR #8179 (min 0.001, max 0.01, halves of 8), which list
        // the LR after each scheduler step, i.e. at optimizer steps k = 2, 3, ….
        let mk = |stairs| {
            DsSchedule::OneCycle(OneCycle {
                cycle_first_step_size: 8.0,
                cycle_first_stair_count: stairs,
                ..OneCycle::new(0.001, 0.01)
            })
        };
        let cont = [
            0.002125, 0.00325, 0.004375, 0.0055, 0.006625, 0.00775, 0.008875, 0.01,
        ];
        let two = [0.001, 0.001, 0.001, 0.0055, 0.0055, 0.0055, 0.0055, 0.01];
        let four = [
            0.001, 0.00325, 0.00325, 0.0055, 0.0055, 0.00775, 0.00775, 0.01,
        ];
        for (stairs, want) in [(0, cont), (2, two), (4, four), (8, cont)] {
            for (k, w) in (2..).zip(want) {
                let got = ds_lr(&mk(stairs), &DsFlags::LATEST, 1.0, k);
                assert!(
                    (got - w).abs() < 1e-12,
                    "stairs {stairs} k={k}: {got} vs {w}"
                );
            }
        }
    }

    #[test]
    fn ds_lr_range_test() {
        // min 0.01, step_size 10, rate 2: lr = 0.01·(1 + 2·(k − 1)/10), floored x for staircase.
        let mk = |staircase| DsSchedule::LrRangeTest {
            min_lr: 0.01,
            step_size: 10.0,
            step_rate: 2.0,
            staircase,
        };
        let f = DsFlags::LATEST;
        for (k, w) in [(1, 0.01), (2, 0.012), (6, 0.02), (11, 0.03), (12, 0.032)] {
            assert_close(ds_lr(&mk(false), &f, 1.0, k), w, &format!("lrrt k={k}"));
        }
        for (k, w) in [(1, 0.01), (6, 0.01), (10, 0.01), (11, 0.03), (12, 0.03)] {
            assert_close(ds_lr(&mk(true), &f, 1.0, k), w, &format!("stair k={k}"));
        }
        // Not stepped by the Warmup* init flag: step 1 is min_lr in every version.
        let old = flags_for("0.10.0");
        assert_close(ds_lr(&mk(false), &old, 5.0, 1), 0.01, "old init");
        assert_eq!(mk(false).type_name(), "LRRangeTest");
    }
}
