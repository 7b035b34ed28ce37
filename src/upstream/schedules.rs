//! The learning-rate schedule a resolved recipe runs, and its counterpart on the other side of
//! the HF ↔ DeepSpeed mapping (docs/rules/schedule-optimizer.md), as [`crate::upstream::lr`]
//! schedules. An HF schedule name is built by HF (no DeepSpeed `scheduler` section); a
//! DeepSpeed name is built by DeepSpeed.

use serde::Serialize;

use crate::resolve::Resolved;
use crate::upstream::lr::{
    self, DsFlags, DsSchedule, DsWarmupType, HfSchedule, MinLr, OneCycle, WsdShape,
};

/// Which library builds and steps the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    /// HF's `lr_scheduler_type`.
    Hf,
    /// A DeepSpeed `scheduler` section.
    DeepSpeed,
}

/// The run's schedule and its counterpart.
#[derive(Debug, Clone)]
pub struct Curves {
    /// Who builds the schedule the run uses.
    pub owner: Owner,
    /// The HF schedule: the one used when `owner` is HF, else HF's counterpart (if any).
    pub hf: Option<HfSchedule>,
    /// The DeepSpeed schedule: the one used when `owner` is DeepSpeed, else its counterpart.
    pub ds: Option<DsSchedule>,
    /// Peak learning rate (the optimizer's).
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total optimizer steps.
    pub total: u64,
    /// DeepSpeed formula details of the target version.
    pub flags: DsFlags,
}

/// A warmup_stable_decay phase length in whole steps (a fraction of `total` rounds up), when
/// the recipe gives one.
pub fn wsd_steps(r: &Resolved, key: &str, total: u64) -> Option<u64> {
    match crate::resolve::warmup_like(r, key)? {
        crate::upstream::steps::Warmup::Steps(s) => Some(s),
        crate::upstream::steps::Warmup::Fraction(x) => Some((total as f64 * x).ceil() as u64),
    }
}

/// The words of `schema::blocks::WSD_SHAPES` and HF's names for them (`get_wsd_schedule`'s
/// `warmup_type` / `decay_type`, transformers v5.24.0 `optimization.py`): the one conversion.
pub const WSD_SHAPE_NAMES: &[(&str, &str)] = &[
    ("linear", "linear"),
    ("cosine", "cosine"),
    ("one_minus_sqrt", "1-sqrt"),
];

/// HF's name of a shape word.
pub fn wsd_shape(word: &str) -> &'static str {
    WSD_SHAPE_NAMES
        .iter()
        .find(|(w, _)| *w == word)
        .map_or("cosine", |(_, hf)| hf)
}

/// The shape word of an HF name (`None` for a name HF does not take).
pub fn wsd_shape_word(hf: &str) -> Option<&'static str> {
    WSD_SHAPE_NAMES
        .iter()
        .find(|(_, h)| *h == hf)
        .map(|(w, _)| *w)
}

fn wsd_shape_of(word: &str) -> WsdShape {
    match word {
        "linear" => WsdShape::Linear,
        "one_minus_sqrt" => WsdShape::OneMinusSqrt,
        _ => WsdShape::Cosine,
    }
}

fn warmup_type(r: &Resolved) -> DsWarmupType {
    match r.word("schedule.warmup_type") {
        Some("log") => DsWarmupType::Log,
        _ => DsWarmupType::Linear,
    }
}

/// The schedule of a resolved recipe, once the step accounting is known.
pub fn curves(r: &Resolved) -> Option<Curves> {
    let kind = r.word("schedule.kind")?;
    let total = r.uint("steps.total")?;
    let warmup = r.uint("steps.warmup").unwrap_or(0);
    let peak = r.num("optimizer.lr");
    let min_lr = r.num("schedule.min_lr");
    let max_lr = r.f64("schedule.max_lr").unwrap_or(peak);
    let f = |k: &str| r.num(k);
    let owner = if crate::schema::blocks::DS_SCHEDULES.contains(&kind) {
        Owner::DeepSpeed
    } else {
        Owner::Hf
    };
    // The DeepSpeed counterpart of an HF schedule, with linear warmup and HF's ends
    // (docs/upstream.md §7).
    let ds_linear = |ds: &str| -> Option<DsSchedule> {
        Some(match ds {
            "WarmupLR" => DsSchedule::WarmupLr {
                min_lr: 0.0,
                max_lr: Some(peak),
                warmup_num_steps: warmup,
                warmup_type: DsWarmupType::Linear,
            },
            "WarmupDecayLR" => DsSchedule::WarmupDecayLr {
                total_num_steps: total,
                min_lr: 0.0,
                max_lr: Some(peak),
                warmup_num_steps: warmup,
                warmup_type: DsWarmupType::Linear,
            },
            "WarmupCosineLR" => DsSchedule::WarmupCosineLr {
                total_num_steps: total,
                warmup_min_ratio: 0.0,
                cos_min_ratio: 0.0,
                warmup_num_steps: warmup,
                warmup_type: DsWarmupType::Linear,
            },
            _ => return None,
        })
    };
    let (hf, ds) = match kind {
        "linear" => (Some(HfSchedule::Linear), ds_linear("WarmupDecayLR")),
        "constant_with_warmup" => (Some(HfSchedule::ConstantWithWarmup), ds_linear("WarmupLR")),
        "cosine" => (
            Some(HfSchedule::Cosine {
                num_cycles: f("schedule.num_cycles"),
            }),
            (f("schedule.num_cycles") == 0.5)
                .then(|| ds_linear("WarmupCosineLR"))
                .flatten(),
        ),
        "constant" => (
            Some(HfSchedule::Constant),
            Some(DsSchedule::WarmupLr {
                min_lr: peak,
                max_lr: Some(peak),
                warmup_num_steps: 1,
                warmup_type: DsWarmupType::Linear,
            }),
        ),
        "cosine_with_restarts" => (
            Some(HfSchedule::CosineWithRestarts {
                num_cycles: f("schedule.num_cycles"),
            }),
            None,
        ),
        "polynomial" => (
            Some(HfSchedule::Polynomial {
                lr_end: f("schedule.lr_end"),
                power: f("schedule.power"),
            }),
            None,
        ),
        "inverse_sqrt" => (
            Some(HfSchedule::InverseSqrt {
                timescale: r.uint("schedule.timescale"),
            }),
            None,
        ),
        "reduce_lr_on_plateau" => (Some(HfSchedule::ReduceLrOnPlateau), None),
        "cosine_with_min_lr" => (
            Some(HfSchedule::CosineWithMinLr {
                num_cycles: f("schedule.num_cycles"),
                min_lr: match r.f64("schedule.min_lr_rate") {
                    Some(rate) => MinLr::Rate(rate),
                    None => MinLr::Absolute(min_lr),
                },
            }),
            None,
        ),
        "cosine_warmup_with_min_lr" => (
            Some(HfSchedule::CosineWarmupWithMinLr {
                num_cycles: f("schedule.num_cycles"),
                min_lr: match r.f64("schedule.min_lr_rate") {
                    Some(rate) => MinLr::Rate(rate),
                    None => MinLr::Absolute(min_lr),
                },
                warmup_lr_rate: r.f64("schedule.warmup_lr_rate"),
            }),
            None,
        ),
        // Stepped only at evaluations, with the metric (`HF:GreedyLR`): the LR starts at the
        // optimizer's and no formula says where it goes from there (`upstream::lr`).
        "greedy" => (Some(HfSchedule::Greedy), None),
        "warmup_stable_decay" => {
            let decay = match crate::resolve::warmup_like(r, "schedule.decay") {
                Some(crate::upstream::steps::Warmup::Steps(s)) => s,
                Some(crate::upstream::steps::Warmup::Fraction(x)) => {
                    (total as f64 * x).ceil() as u64
                }
                None => 0,
            };
            (
                Some(HfSchedule::WarmupStableDecay {
                    num_stable_steps: wsd_steps(r, "schedule.stable", total),
                    num_decay_steps: decay,
                    warmup_type: wsd_shape_of(r.choice("schedule.warmup_shape")),
                    decay_type: wsd_shape_of(r.choice("schedule.decay_shape")),
                    min_lr_ratio: f("schedule.min_lr_ratio"),
                    num_cycles: f("schedule.num_cycles"),
                }),
                None,
            )
        }
        "WarmupLR" => (
            (min_lr == 0.0 && max_lr == peak).then_some(HfSchedule::ConstantWithWarmup),
            Some(DsSchedule::WarmupLr {
                min_lr,
                max_lr: Some(max_lr),
                warmup_num_steps: warmup,
                warmup_type: warmup_type(r),
            }),
        ),
        "WarmupDecayLR" => (
            (min_lr == 0.0 && max_lr == peak).then_some(HfSchedule::Linear),
            Some(DsSchedule::WarmupDecayLr {
                total_num_steps: total,
                min_lr,
                max_lr: Some(max_lr),
                warmup_num_steps: warmup,
                warmup_type: warmup_type(r),
            }),
        ),
        "WarmupCosineLR" => (
            (f("schedule.cos_min_ratio") == 0.0 && f("schedule.warmup_min_ratio") == 0.0)
                .then_some(HfSchedule::Cosine { num_cycles: 0.5 }),
            Some(DsSchedule::WarmupCosineLr {
                total_num_steps: total,
                warmup_min_ratio: f("schedule.warmup_min_ratio"),
                cos_min_ratio: f("schedule.cos_min_ratio"),
                warmup_num_steps: warmup,
                warmup_type: warmup_type(r),
            }),
        ),
        "OneCycle" => {
            let mut c = OneCycle::new(
                r.f64("schedule.cycle_min_lr").unwrap_or(peak / 10.0),
                r.f64("schedule.cycle_max_lr").unwrap_or(peak),
            );
            c.cycle_first_step_size = f("schedule.cycle_first_step_size");
            c.cycle_second_step_size = r.f64("schedule.cycle_second_step_size");
            c.cycle_first_stair_count = r.count("schedule.cycle_first_stair_count");
            c.cycle_second_stair_count = r.uint("schedule.cycle_second_stair_count");
            c.decay_lr_rate = f("schedule.decay_lr_rate");
            c.decay_step_size = f("schedule.decay_step_size");
            c.cycle_momentum = r.flag("schedule.cycle_momentum");
            c.cycle_min_mom = f("schedule.cycle_min_mom");
            c.cycle_max_mom = f("schedule.cycle_max_mom");
            c.decay_mom_rate = f("schedule.decay_mom_rate");
            (None, Some(DsSchedule::OneCycle(c)))
        }
        "LRRangeTest" => (
            None,
            Some(DsSchedule::LrRangeTest {
                min_lr: f("schedule.start_lr"),
                step_size: f("schedule.step_size"),
                step_rate: f("schedule.step_rate"),
                staircase: r.flag("schedule.staircase"),
            }),
        ),
        _ => (None, None),
    };
    Some(Curves {
        owner,
        hf,
        ds,
        peak,
        warmup,
        total,
        flags: lr::ds_flags(&r.facts),
    })
}

/// The most optimizer steps a report lists ([`Curves::table`]).
pub const LR_STEPS_LISTED: u64 = 100_000;
/// Steps listed one by one at each end of a longer run's table: the warmup and the end of the
/// decay, where the two sides' curves part most often.
pub const LR_STEPS_AT_ENDS: u64 = 1_000;

/// The learning rate of one optimizer step under each side.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LrStep {
    /// Optimizer step (1-based).
    pub step: u64,
    /// HF's schedule, if there is one.
    pub hf: Option<f64>,
    /// DeepSpeed's schedule, if there is one.
    pub deepspeed: Option<f64>,
}

impl Curves {
    /// The LR at optimizer step `step` (1-based) on each side.
    pub fn at(&self, step: u64) -> LrStep {
        LrStep {
            step,
            hf: self
                .hf
                .as_ref()
                .map(|s| lr::hf_lr(s, self.peak, self.warmup, self.total, step)),
            deepspeed: self
                .ds
                .as_ref()
                .map(|s| lr::ds_lr(s, &self.flags, self.peak, step)),
        }
    }

    /// The optimizer steps of the run (the table's last step).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The steps a report lists ([`LR_STEPS_LISTED`] at most, in order): every step of a run
    /// that has no more, else the first and the last [`LR_STEPS_AT_ENDS`] and steps evenly
    /// spaced between them. A recipe may state billions of samples; [`Curves::at`] gives any
    /// step, and `recipe explain --lr-csv` writes them all.
    pub fn table(&self) -> Vec<LrStep> {
        let n = self.total;
        if n <= LR_STEPS_LISTED {
            return (1..=n).map(|k| self.at(k)).collect();
        }
        let ends = LR_STEPS_AT_ENDS;
        let between = LR_STEPS_LISTED - 2 * ends;
        // Steps ends+1 … n−ends, `between` of them at even spacing (the division exact in u128).
        let span = (n - 2 * ends) as u128;
        let middle =
            (0..between as u128).map(move |j| ends + 1 + (j * span / between as u128) as u64);
        (1..=ends)
            .chain(middle)
            .chain(n - ends + 1..=n)
            .map(|k| self.at(k))
            .collect()
    }

    /// The name of each side's schedule.
    pub fn names(&self) -> (Option<&'static str>, Option<&'static str>) {
        (
            self.hf.as_ref().map(HfSchedule::name),
            self.ds.as_ref().map(DsSchedule::type_name),
        )
    }
}

/// HF's schedule functions by `lr_scheduler_type`: the function, the `lr_scheduler_kwargs` it
/// takes, and those it requires (transformers v5.24.0 `optimization.py`; `get_scheduler` passes
/// `num_warmup_steps` / `num_training_steps` itself). `constant` gets no kwargs, so it is not
/// listed; `reduce_lr_on_plateau` passes them to torch's `ReduceLROnPlateau`, `greedy`
/// (`get_greedy_schedule(optimizer, **kwargs)`) to HF's `GreedyLR`, neither with the warmup or
/// the total steps.
pub const HF_SCHEDULE_FUNCTIONS: &[(&str, &str, &[&str], &[&str])] = &[
    (
        "linear",
        "get_linear_schedule_with_warmup",
        &["last_epoch"],
        &[],
    ),
    (
        "cosine",
        "get_cosine_schedule_with_warmup",
        &["num_cycles", "last_epoch"],
        &[],
    ),
    (
        "cosine_with_restarts",
        "get_cosine_with_hard_restarts_schedule_with_warmup",
        &["num_cycles", "last_epoch"],
        &[],
    ),
    (
        "polynomial",
        "get_polynomial_decay_schedule_with_warmup",
        &["lr_end", "power", "last_epoch"],
        &[],
    ),
    (
        "constant_with_warmup",
        "get_constant_schedule_with_warmup",
        &[],
        &[],
    ),
    (
        "inverse_sqrt",
        "get_inverse_sqrt_schedule",
        &["timescale", "last_epoch"],
        &[],
    ),
    (
        "reduce_lr_on_plateau",
        "ReduceLROnPlateau.__init__",
        &[
            "mode",
            "factor",
            "patience",
            "threshold",
            "threshold_mode",
            "cooldown",
            "min_lr",
            "eps",
        ],
        &[],
    ),
    (
        "cosine_with_min_lr",
        "get_cosine_with_min_lr_schedule_with_warmup",
        &["num_cycles", "last_epoch", "min_lr", "min_lr_rate"],
        &[],
    ),
    (
        "cosine_warmup_with_min_lr",
        "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
        &[
            "num_cycles",
            "last_epoch",
            "min_lr",
            "min_lr_rate",
            "warmup_lr_rate",
        ],
        &[],
    ),
    (
        "warmup_stable_decay",
        "get_wsd_schedule",
        &[
            "num_decay_steps",
            "num_stable_steps",
            "warmup_type",
            "decay_type",
            "min_lr_ratio",
            "num_cycles",
            "last_epoch",
        ],
        &["num_decay_steps"],
    ),
    (
        "greedy",
        "GreedyLR.__init__",
        &[
            "mode",
            "factor",
            "patience",
            "threshold",
            "threshold_mode",
            "cooldown",
            "warmup",
            "min_lr",
            "max_lr",
            "eps",
            "verbose",
            "smooth",
            "window_size",
            "reset_start",
        ],
        &[],
    ),
];

/// HF's `GreedyLR` state machine and its arguments live in the runtime, which runs it at each
/// evaluation; the rules run it on the metric DeepSpeed would step it with (R0315).
pub use recipe_runtime::greedy::{Greedy, GreedyConfig};
pub use recipe_runtime::plateau::PlateauConfig;

/// The arguments of a resolved `schedule greedy` (its keys resolve to GreedyLR's defaults; a
/// per-group list reads as its first group's value, the group HF logs).
pub fn greedy_config(r: &Resolved) -> GreedyConfig {
    GreedyConfig {
        maximize: r.choice("schedule.mode") == "max",
        factor: r.num("schedule.factor"),
        patience: r.count("schedule.patience"),
        threshold: r.num("schedule.threshold"),
        relative: r.choice("schedule.threshold_mode") == "rel",
        cooldown: r.count("schedule.cooldown"),
        warmup: r.count("schedule.increase_cooldown"),
        min_lr: r.num("schedule.min_lr"),
        max_lr: r.num("schedule.max_lr"),
        eps: r.num("schedule.eps"),
        window: r
            .flag("schedule.smooth")
            .then(|| r.count("schedule.window_size") as usize),
        reset_start: r.count("schedule.reset_start"),
    }
}

/// The scheduler of a resolved `schedule greedy` recipe, over an optimizer at its lr.
pub fn greedy(r: &Resolved) -> Greedy {
    Greedy::new(r.num("optimizer.lr"), greedy_config(r))
}

/// The arguments of a resolved `schedule reduce_lr_on_plateau` (torch's defaults where unset;
/// a per-group `min_lr` list reads as its first group's value).
pub fn plateau_config(r: &Resolved) -> PlateauConfig {
    PlateauConfig {
        factor: r.num("schedule.factor"),
        patience: r.count("schedule.patience"),
        maximize: r.choice("schedule.mode") == "max",
        threshold: r.num("schedule.threshold"),
        relative: r.choice("schedule.threshold_mode") == "rel",
        cooldown: r.count("schedule.cooldown"),
        min_lr: r.num("schedule.min_lr"),
        eps: r.num("schedule.eps"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(schedule: &str) -> Resolved {
        let text = format!(
            "model bert {{ from = \"m\", task = classify(labels: 2) }}\n\
             data {{ train = \"t.jsonl\", eval = \"d.jsonl\", samples = 80 }}\nbatch {{ micro = 8 }}\n\
             train {{ epochs = 1 }}\noptimizer adamw {{ lr = 1, owner = hf }}\n{schedule}\n"
        );
        crate::resolve::resolve(
            &crate::syntax::parse(&text).unwrap(),
            &crate::resolve::Options::default(),
        )
    }

    #[test]
    fn the_late_hf_kinds_as_curves() {
        // cosine_warmup_with_min_lr, W = 4, T = 10, warmup_lr_rate 0.25: steps 1–4 rise from
        // 0.25 to 1 in thirds; step 10 ends at min_lr_rate.
        let c = curves(&resolved(
            "schedule cosine_warmup_with_min_lr { warmup = 4, min_lr_rate = 0.1, warmup_lr_rate = 0.25 }",
        ))
        .unwrap();
        assert_eq!(c.owner, Owner::Hf);
        assert!(c.ds.is_none());
        let lr: Vec<f64> = (1..=10).map(|k| c.at(k).hf.unwrap()).collect();
        assert_eq!(&lr[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert!((lr[9] - 0.1).abs() < 1e-15, "{lr:?}");
        // greedy: the optimizer's lr, and GreedyLR's own defaults where torch's plateau differs.
        let r = resolved("schedule greedy");
        let c = curves(&r).unwrap();
        assert!(c.hf.unwrap().is_metric_driven());
        assert_eq!(c.at(10).hf, Some(1.0));
        assert_eq!(greedy_config(&r), GreedyConfig::default());
        let p = resolved("schedule reduce_lr_on_plateau");
        assert_eq!(
            (
                p.num("schedule.factor"),
                p.choice("schedule.threshold_mode")
            ),
            (0.1, "rel")
        );
    }
}
