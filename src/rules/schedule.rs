//! Schedule rules: what the learning-rate schedule a recipe names does under the target
//! versions (docs/rules/schedule-optimizer.md). The recipe names either an HF
//! `lr_scheduler_type` (HF builds it; the DeepSpeed config gets no `scheduler` section) or a
//! DeepSpeed scheduler (the compiler writes a `scheduler` section, DeepSpeed builds and steps it).
//!
//! * DeepSpeed's `Warmup*` schedulers against HF's counterparts: the one-step lag
//!   (docs/upstream.md R-M02), the effective warmup `W' = max(2, W)` (docs/upstream.md R-M03,
//!   R-L03), log warmup (docs/upstream.md R-L01/R-M01), the cosine floor (docs/upstream.md R-M05);
//! * `OneCycle` overriding the optimizer's betas (docs/upstream.md R-L05);
//! * version gaps: `WarmupCosineLR` (v0.12.3), `warmup_type` (v0.5.7), the construction-time LR
//!   (v0.15.3);
//! * the schedule given twice, by the `schedule` block and by raw keys (docs/upstream.md R-H07,
//!   R-L06).
//!
//! LR values come from [`crate::upstream::lr`] (the formulas of docs/upstream.md §6.4/§7) through
//! [`crate::upstream::schedules::curves`]; version facts from [`crate::upstream::versions`].

use crate::diagnostics::{Diagnostic, Label, Severity};
use crate::resolve::value::fmt_f64;
use crate::resolve::{Resolved, Val};
use crate::schema::blocks::DS_SCHEDULES;
use crate::syntax::ast::Span;
use crate::upstream::lr::{self, DsSchedule, DsWarmupType, HfSchedule};
use crate::upstream::schedules::{self, Curves};
use crate::upstream::versions::{Fact, Library, Version, CHANGES};

use super::{anchor, origin};

/// A DeepSpeed `Warmup*` scheduler runs one optimizer step behind HF's (docs/upstream.md R-M02).
pub const DS_LAG: &str = "R0301";
/// A DeepSpeed `Warmup*` scheduler with a warmup below 2 steps warms up over 2
/// (docs/upstream.md R-M03, R-L03).
pub const DS_WARMUP_MIN_TWO: &str = "R0302";
/// `warmup_type = log`: DeepSpeed warms up logarithmically, HF linearly (docs/upstream.md R-L01,
/// R-M01).
pub const LOG_WARMUP: &str = "R0303";
/// `OneCycle` with `cycle_momentum` overwrites the optimizer's betas (docs/upstream.md R-L05).
pub const ONE_CYCLE_MOMENTUM: &str = "R0304";
/// `WarmupCosineLR` with a non-zero `cos_min_ratio` / `warmup_min_ratio` (docs/upstream.md R-M05).
pub const COSINE_FLOOR: &str = "R0305";
/// `WarmupCosineLR` on a DeepSpeed without it (docs/upstream.md §6.4, v0.12.3).
pub const NO_WARMUP_COSINE: &str = "R0306";
/// `warmup_type` on a DeepSpeed without it: the warmup is logarithmic (docs/upstream.md §6.4,
/// v0.5.7).
pub const WARMUP_TYPE_IGNORED: &str = "R0307";
/// A DeepSpeed `Warmup*` scheduler before v0.15.3: step 1 runs at the optimizer's lr.
pub const FIRST_STEP_AT_PEAK: &str = "R0308";
/// The schedule is given by `schedule` and by raw keys as well (docs/upstream.md R-H07).
pub const SCHEDULE_TWICE: &str = "R0309";
/// HF scheduler arguments next to a DeepSpeed schedule are ignored (docs/upstream.md R-H07, R-L06).
pub const HF_SCHEDULER_ARGS_IGNORED: &str = "R0310";
/// `max_lr` differs from the optimizer's lr: HF raises a mismatch at train start
/// (docs/upstream.md R-A03).
pub const PEAK_MISMATCH: &str = "R0311";

/// HF schedule arguments the target transformers cannot pass to its scheduler: no
/// `lr_scheduler_kwargs` before v4.36.0.
pub const HF_KWARGS_UNAVAILABLE: &str = "R0312";
/// An HF schedule kind the target transformers does not have.
pub const HF_KIND_UNAVAILABLE: &str = "R0313";

/// `OneCycle` without decay steps runs past its cycle on a DeepSpeed that divides by them.
pub const ONE_CYCLE_ZERO_DECAY: &str = "R0314";

/// `reduce_lr_on_plateau` or `greedy` with a DeepSpeed-built optimizer: DeepSpeed's engine steps
/// HF's scheduler every optimizer step, without a metric.
pub const PLATEAU_STEPPED_BY_DEEPSPEED: &str = "R0315";

/// An HF schedule whose own argument checks refuse the recipe when the Trainer builds it.
pub const HF_SCHEDULE_REFUSES: &str = "R0316";

/// A raw `hf { lr_scheduler_kwargs.<x> }` the `schedule` block does not model: HF refuses it
/// (not an argument of the schedule function) or `recipe explain`'s curve does not follow it.
pub const RAW_SCHEDULE_KWARG: &str = "R0317";

/// `greedy` whose floor `min_lr` (HF GreedyLR's default 1e-3) is not below the learning rate:
/// the LR is never lowered.
pub const GREEDY_NEVER_LOWERS: &str = "R0318";
/// A per-parameter-group list (`min_lr = [1e-5, 0]`) where the schedule takes one number, or
/// whose length is not the optimizer's number of parameter groups.
pub const PER_GROUP_LIST: &str = "R0319";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        DS_LAG,
        "ds-schedule-lag",
        "a DeepSpeed Warmup* schedule runs one optimizer step behind HF's",
    ),
    (
        DS_WARMUP_MIN_TWO,
        "ds-warmup-min-two",
        "DeepSpeed's Warmup* schedules warm up over at least 2 steps",
    ),
    (
        LOG_WARMUP,
        "log-warmup",
        "warmup_type = log: DeepSpeed warms up logarithmically, HF linearly",
    ),
    (
        ONE_CYCLE_MOMENTUM,
        "one-cycle-momentum",
        "OneCycle overrides the optimizer's betas",
    ),
    (
        COSINE_FLOOR,
        "cosine-floor",
        "WarmupCosineLR ends above 0 or warms up from above 0",
    ),
    (
        NO_WARMUP_COSINE,
        "no-warmup-cosine",
        "the target DeepSpeed has no WarmupCosineLR",
    ),
    (
        WARMUP_TYPE_IGNORED,
        "warmup-type-ignored",
        "the target DeepSpeed has no warmup_type: the warmup is logarithmic",
    ),
    (
        FIRST_STEP_AT_PEAK,
        "first-step-at-peak",
        "before DeepSpeed 0.15.3 the first step runs at the optimizer's lr",
    ),
    (
        SCHEDULE_TWICE,
        "schedule-twice",
        "the schedule is given by `schedule` and by raw keys",
    ),
    (
        HF_SCHEDULER_ARGS_IGNORED,
        "hf-scheduler-args-ignored",
        "HF scheduler arguments next to a DeepSpeed schedule are ignored",
    ),
    (
        PEAK_MISMATCH,
        "peak-mismatch",
        "a DeepSpeed warmup peaks at a max_lr other than the optimizer's lr",
    ),
    (
        HF_KWARGS_UNAVAILABLE,
        "hf-kwargs-unavailable",
        "the target transformers has no lr_scheduler_kwargs: the schedule argument is lost",
    ),
    (
        HF_KIND_UNAVAILABLE,
        "hf-kind-unavailable",
        "the target transformers does not have this lr_scheduler_type",
    ),
    (
        ONE_CYCLE_ZERO_DECAY,
        "one-cycle-zero-decay",
        "OneCycle runs past its cycle with decay_step_size = 0 on a DeepSpeed that divides by it",
    ),
    (
        PLATEAU_STEPPED_BY_DEEPSPEED,
        "plateau-stepped-by-deepspeed",
        "reduce_lr_on_plateau or greedy with a DeepSpeed optimizer: DeepSpeed steps it every step without a metric",
    ),
    (
        HF_SCHEDULE_REFUSES,
        "hf-schedule-refuses",
        "an HF schedule whose own argument checks refuse the recipe at train start",
    ),
    (
        RAW_SCHEDULE_KWARG,
        "raw-schedule-kwarg",
        "a raw lr_scheduler_kwargs entry the schedule does not model: refused by HF, or not in explain's curve",
    ),
    (
        GREEDY_NEVER_LOWERS,
        "greedy-never-lowers",
        "greedy's floor min_lr is not below the learning rate: the LR is never lowered",
    ),
    (
        PER_GROUP_LIST,
        "per-group-list",
        "a list of one value per parameter group where the schedule takes one number, or of the wrong length",
    ),
];

/// DeepSpeed's warmup schedulers, whose `warmup_num_steps` becomes `W' = max(2, W)`.
const DS_WARMUP: &[&str] = &["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"];

/// Optimizer kinds whose implementation has `betas` in its defaults, so `OneCycle`'s
/// `_initialize_momentum` overwrites them (FusedAdam, DeepSpeedCPUAdam, FusedLamb, the 1-bit
/// optimizers, FusedLion, torch AdamW, bnb Lion). SGD, Adagrad and Adafactor have none, and
/// upstream then turns `cycle_momentum` off with a warning
/// (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/lr_schedules.py:OneCycle._initialize_momentum).
pub(crate) const HAS_BETAS: &[&str] = &[
    "adamw",
    "adam",
    "lamb",
    "lion",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
];

/// Whether a schedule kind is a DeepSpeed scheduler (written to a DeepSpeed `scheduler` section)
/// rather than an HF `lr_scheduler_type`.
pub(crate) fn is_deepspeed_schedule(kind: &str) -> bool {
    DS_SCHEDULES.contains(&kind)
}

/// The first release of `library` after `after` from which a row of the versions table makes
/// `holds` true: where a fix or feature arrives. Reads the table, compares no versions itself
/// beyond ordering the rows' `since`.
pub(crate) fn first_release(
    library: Library,
    after: Version,
    holds: impl Fn(&Fact) -> bool,
) -> Option<Version> {
    CHANGES
        .iter()
        .filter(|c| c.library == library && c.since > after && holds(&c.fact))
        .map(|c| c.since)
        .min()
}

/// The secondary label on a written `target` version (`i`: 0 transformers, 1 accelerate,
/// 2 deepspeed), if it was written.
pub(crate) fn with_target(d: Diagnostic, r: &Resolved, library: Library) -> Diagnostic {
    let i = match library {
        Library::Transformers => 0,
        Library::Accelerate => 1,
        Library::DeepSpeed => 2,
    };
    match r.target_sources[i].span() {
        Some(span) => d.with_secondary(
            span,
            format!("{} {}", library.key(), r.targets.get(library)),
        ),
        None => d,
    }
}

/// A note (the constructors only make errors and warnings).
pub(crate) fn note(code: &'static str, message: impl Into<String>, span: Span) -> Diagnostic {
    Diagnostic {
        severity: Severity::Note,
        ..Diagnostic::error(code, message, span)
    }
}

/// A learning rate with three significant digits, as people write it: `3e-5`, `2.14e-6`, `0.5`.
/// NaN (upstream raises at that step) reads "an error".
pub(crate) fn fmt_lr(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        return "an error".into();
    }
    let sci = format!("{x:.2e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-3..4).contains(&exp) {
        let decimals = usize::try_from(2 - exp).unwrap_or(0);
        trim(&format!("{x:.decimals$}"))
    } else {
        format!("{}e{exp}", trim(mantissa))
    }
}

/// The DeepSpeed schedule the run really uses: without `warmup_type` support
/// ([`crate::upstream::versions::Facts::ds_has_warmup_type`]) every warmup is logarithmic.
fn as_run(r: &Resolved, ds: DsSchedule) -> DsSchedule {
    if r.facts.ds_has_warmup_type {
        return ds;
    }
    let log = DsWarmupType::Log;
    match ds {
        DsSchedule::WarmupLr {
            min_lr,
            max_lr,
            warmup_num_steps,
            ..
        } => DsSchedule::WarmupLr {
            min_lr,
            max_lr,
            warmup_num_steps,
            warmup_type: log,
        },
        DsSchedule::WarmupDecayLr {
            total_num_steps,
            min_lr,
            max_lr,
            warmup_num_steps,
            ..
        } => DsSchedule::WarmupDecayLr {
            total_num_steps,
            min_lr,
            max_lr,
            warmup_num_steps,
            warmup_type: log,
        },
        DsSchedule::WarmupCosineLr {
            total_num_steps,
            warmup_min_ratio,
            cos_min_ratio,
            warmup_num_steps,
            ..
        } => DsSchedule::WarmupCosineLr {
            total_num_steps,
            warmup_min_ratio,
            cos_min_ratio,
            warmup_num_steps,
            warmup_type: log,
        },
        other => other,
    }
}

/// The run's curves with the DeepSpeed side as the target version runs it, when the step
/// accounting is known and the run has steps.
fn run_curves(r: &Resolved) -> Option<Curves> {
    let mut c = schedules::curves(r)?;
    if c.total == 0 {
        return None;
    }
    c.ds = c.ds.map(|ds| as_run(r, ds));
    Some(c)
}

/// The first optimizer steps (up to 3, within the run).
fn first_steps(c: &Curves) -> Vec<u64> {
    (1..=c.total.min(3)).collect()
}

/// `a, b, c` for the steps, under DeepSpeed.
fn ds_values(c: &Curves, ds: &DsSchedule, steps: &[u64]) -> String {
    let v: Vec<String> = steps
        .iter()
        .map(|&k| fmt_lr(lr::ds_lr(ds, &c.flags, c.peak, k)))
        .collect();
    v.join(", ")
}

/// `a, b, c` for the steps, under HF.
fn hf_values(c: &Curves, hf: &HfSchedule, steps: &[u64]) -> String {
    let v: Vec<String> = steps
        .iter()
        .map(|&k| fmt_lr(lr::hf_lr(hf, c.peak, c.warmup, c.total, k)))
        .collect();
    v.join(", ")
}

/// `1, 2, 3`.
fn step_list(steps: &[u64]) -> String {
    let v: Vec<String> = steps.iter().map(u64::to_string).collect();
    v.join(", ")
}

/// HF's schedule that the DeepSpeed `Warmup*` scheduler stands for (docs/upstream.md §7).
fn hf_twin(kind: &str) -> &'static str {
    match kind {
        "WarmupLR" => "constant_with_warmup",
        "WarmupCosineLR" => "cosine",
        _ => "linear",
    }
}

/// The lr a `Warmup*` scheduler starts its warmup from (`it = 0`): `min_lr`, or
/// `warmup_min_ratio × lr` for `WarmupCosineLR`.
fn warmup_start(r: &Resolved, kind: &str) -> f64 {
    if kind == "WarmupCosineLR" {
        r.num("schedule.warmup_min_ratio") * r.num("optimizer.lr")
    } else {
        r.num("schedule.min_lr")
    }
}

/// The warmup's start in words: `min_lr = 0`, `warmup_min_ratio × lr = 0`.
fn start_words(r: &Resolved, kind: &str) -> String {
    let start = fmt_lr(warmup_start(r, kind));
    if kind == "WarmupCosineLR" {
        format!("warmup_min_ratio × lr = {start}")
    } else {
        format!("min_lr = {start}")
    }
}

/// `WarmupLR`/`WarmupDecayLR` with `min_lr == max_lr` is a constant schedule: no warmup to lag.
fn is_constant(r: &Resolved, kind: &str) -> bool {
    kind != "WarmupCosineLR"
        && r.f64("schedule.min_lr").is_some()
        && r.f64("schedule.min_lr") == r.f64("schedule.max_lr")
}

/// The warmup steps DeepSpeed is given, when known: the resolved whole steps.
fn warmup_steps(r: &Resolved) -> Option<u64> {
    r.uint("steps.warmup")
        .or_else(|| match crate::resolve::warmup(r)? {
            crate::upstream::steps::Warmup::Steps(s) => Some(s),
            crate::upstream::steps::Warmup::Fraction(_) => None,
        })
}

/// Checks the schedule rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let Some(kind) = r.word("schedule.kind") else {
        return;
    };
    twice(r, kind, out);
    let lists = per_group_lists(r, kind);
    if !lists.is_empty() {
        out.extend(lists);
        return;
    }
    if matches!(kind, "reduce_lr_on_plateau" | "greedy") {
        if let Some(d) = plateau_stepped_by_deepspeed(r, kind) {
            out.push(d);
        }
    }
    if kind == "greedy" && r.word("optimizer.owner") == Some("hf") {
        if let Some(d) = greedy_never_lowers(r) {
            out.push(d);
        }
    }
    if !is_deepspeed_schedule(kind) {
        if let Some(d) = hf_schedule_refuses(r, kind) {
            out.push(d);
        }
        raw_schedule_kwargs(r, kind, out);
        if !r.facts.hf_scheduler_kinds.contains(&kind) {
            out.push(hf_kind_unavailable(r, kind));
        } else if !r.facts.hf_scheduler_kwargs {
            hf_kwargs_unavailable(r, kind, out);
        }
        return;
    }
    peak_mismatch(r, kind, out);
    hf_args_ignored(r, kind, out);
    if kind == "OneCycle" {
        one_cycle_momentum(r, out);
        if !r.facts.ds_one_cycle_zero_decay_ok {
            if let Some(d) = one_cycle_zero_decay(r) {
                out.push(d);
            }
        }
        return;
    }
    if !DS_WARMUP.contains(&kind) {
        return;
    }
    if kind == "WarmupCosineLR" && !r.facts.ds_has_warmup_cosine {
        out.push(no_warmup_cosine(r));
        return;
    }
    let constant = is_constant(r, kind);
    if !r.facts.ds_has_warmup_type && r.word("schedule.warmup_type") == Some("linear") && !constant
    {
        out.push(warmup_type_ignored(r, kind));
    }
    if !r.facts.ds_warmup_init_writes_lr {
        if let Some(d) = first_step_at_peak(r, kind) {
            out.push(d);
        }
    }
    if r.word("schedule.warmup_type") == Some("log")
        && r.is_given("schedule.warmup_type")
        && !constant
    {
        out.push(log_warmup(r, kind));
    }
    if kind == "WarmupCosineLR" {
        if let Some(d) = cosine_floor(r) {
            out.push(d);
        }
    }
    if constant {
        return;
    }
    match warmup_steps(r) {
        Some(w) if w < 2 => out.push(warmup_min_two(r, kind, w)),
        _ => out.push(lag(r, kind)),
    }
}

/// The argument checks of HF's schedule functions that a recipe can fail (transformers v5.24.0
/// `optimization.py:get_polynomial_decay_schedule_with_warmup`: the decay must end below the
/// optimizer's initial LR, `optimizer.defaults["lr"]`, whoever builds the optimizer), and those
/// of the metric-driven schedules' constructors (a `factor` below 1). The pair linter checks the
/// same on existing configs (`pair::stack`, R1207).
fn hf_schedule_refuses(r: &Resolved, kind: &str) -> Option<Diagnostic> {
    if matches!(kind, "reduce_lr_on_plateau" | "greedy") {
        return factor_not_below_one(r, kind);
    }
    if kind != "polynomial" {
        return None;
    }
    let (lr, end) = (r.num("optimizer.lr"), r.num("schedule.lr_end"));
    if lr > end {
        return None;
    }
    let shown = |x: f64| crate::pair::json::py_float(x);
    let span = r
        .span("schedule.lr_end")
        .unwrap_or_else(|| anchor(r, "schedule.kind"));
    let mut d = Diagnostic::error(
        HF_SCHEDULE_REFUSES,
        format!(
            "the polynomial decay ends at lr_end {} , not below the learning rate {}: HF stops \
             when it builds the scheduler (\"lr_end ({}) must be smaller than initial lr ({})\")",
            shown(end),
            shown(lr),
            shown(end),
            shown(lr)
        )
        .replace(" , ", ", "),
        span,
    )
    .with_label("not below the learning rate");
    if let Some(s) = r.span("optimizer.lr") {
        d = d.with_secondary(s, "the initial learning rate");
    }
    Some(d.with_help("make lr_end smaller than the optimizer's lr (HF's default is 1e-7)"))
}

/// A metric-driven schedule's `factor` must be below 1: torch's `ReduceLROnPlateau.__init__`
/// (torch 2.x `optim/lr_scheduler.py`) and HF's `GreedyLR.__init__` (transformers v5.24.0
/// `optimization.py`) both raise "Factor should be < 1.0." when the Trainer builds the scheduler.
fn factor_not_below_one(r: &Resolved, kind: &str) -> Option<Diagnostic> {
    let factor = r.f64("schedule.factor")?;
    // GreedyLR also divides by the factor when evaluations improve (`_increase_lr`:
    // `old_lr / self.factor`): a factor of 0 passes its constructor and raises
    // ZeroDivisionError at the first increase.
    if kind == "greedy" && factor <= 0.0 {
        return Some(
            Diagnostic::error(
                HF_SCHEDULE_REFUSES,
                "`greedy` divides the learning rate by `factor` after improving evaluations: a factor of 0 makes HF's GreedyLR raise ZeroDivisionError at the first increase",
                anchor(r, "schedule.factor"),
            )
            .with_label("0: the first increase divides by it")
            .with_help("write a factor between 0 and 1 (GreedyLR's default is 0.95)"),
        );
    }
    if factor < 1.0 {
        return None;
    }
    let class = if kind == "greedy" {
        "HF's GreedyLR"
    } else {
        "torch's ReduceLROnPlateau"
    };
    Some(
        Diagnostic::error(
            HF_SCHEDULE_REFUSES,
            format!(
                "`{kind}` needs a factor below 1, not {}: {class} stops when the Trainer builds it (\"Factor should be < 1.0.\")",
                fmt_f64(factor)
            ),
            anchor(r, "schedule.factor"),
        )
        .with_label("not below 1")
        .with_help("write a factor below 1 (the LR is multiplied by it on a plateau)"),
    )
}

/// HF's `GreedyLR` cuts the LR to `max(lr × factor, min_lr)` and makes the cut only when it
/// lowers the LR by more than `eps` (transformers v5.24.0 `optimization.py:GreedyLR._reduce_lr`);
/// its `min_lr` defaults to 1e-3, above the learning rates models are usually fine-tuned at. With
/// `min_lr` not below the optimizer's lr no cut is ever made: the LR only rises on improvement
/// (`_increase_lr`, up to `max_lr`), or never moves. Only when HF steps it (`owner = hf`); with a
/// DeepSpeed optimizer R0315 says what happens instead.
fn greedy_never_lowers(r: &Resolved) -> Option<Diagnostic> {
    let lr = r.f64("optimizer.lr")?;
    let factor = r.num("schedule.factor");
    // Per parameter group where the recipe gives lists: the first group whose floor holds.
    let mins = r.per_group("schedule.min_lr");
    let maxs = r.per_group("schedule.max_lr");
    let groups = mins.as_ref().or(maxs.as_ref()).map_or(1, Vec::len);
    let at = |list: &Option<Vec<f64>>, key: &str, g: usize| {
        list.as_ref().map_or_else(|| r.num(key), |l| l[g])
    };
    let group = (0..groups).find(|&g| at(&mins, "schedule.min_lr", g) >= lr)?;
    let (min_lr, max_lr) = (
        at(&mins, "schedule.min_lr", group),
        at(&maxs, "schedule.max_lr", group),
    );
    if factor >= 1.0 {
        return None; // HF refuses the factor (R0316)
    }
    let whose = if groups > 1 {
        format!(" of parameter group {group} ({})", group_name(group))
    } else {
        String::new()
    };
    let n = r.count("schedule.patience") + 1;
    let after = if max_lr > lr {
        format!(
            "the LR can only rise (divided by {} after {n} improving evaluations, up to max_lr = {})",
            fmt_f64(factor),
            fmt_lr(max_lr)
        )
    } else {
        format!(
            "and max_lr = {} is not above it either, so the LR never moves",
            fmt_lr(max_lr)
        )
    };
    let mut d = Diagnostic::warning(
        GREEDY_NEVER_LOWERS,
        format!(
            "`greedy` never lowers the learning rate{whose}: its floor min_lr = {} is not below lr = {}, so a cut on a plateau, max(lr × {}, min_lr), is no cut; {after}",
            fmt_lr(min_lr),
            fmt_lr(lr),
            fmt_f64(factor)
        ),
        anchor(
            r,
            if r.is_given("schedule.min_lr") {
                "schedule.min_lr"
            } else {
                "schedule.kind"
            },
        ),
    )
    .with_label(format!(
        "min_lr = {}{}",
        fmt_lr(min_lr),
        if r.is_given("schedule.min_lr") {
            String::new()
        } else {
            " (HF GreedyLR's default)".to_string()
        }
    ));
    if let Some(span) = r.span("optimizer.lr") {
        d = d.with_secondary(span, format!("lr = {}", fmt_lr(lr)));
    }
    let d = d.with_help(
        "write a `min_lr` below the learning rate (`min_lr = 0` for no floor) for the LR to come down on a plateau; nothing to fix if only increases are intended",
    );
    if mins.is_some() {
        return Some(d); // which group's floor to lower is the user's choice
    }
    Some(super::fix::with_set(d, r, "schedule.min_lr", "0"))
}

/// The parameter groups of the optimizer a per-group list speaks to: HF's Trainer builds two
/// (transformers v5.24.0 `trainer.py:Trainer.create_optimizer`: the parameters that decay, then
/// biases and LayerNorm weights with weight_decay 0); DeepSpeed builds its optimizer from the
/// one flat list HF passes it (`integrations/deepspeed.py:deepspeed_optim_sched`).
fn param_groups(r: &Resolved) -> usize {
    if r.word("optimizer.owner") == Some("hf") {
        2
    } else {
        1
    }
}

/// How a message names parameter group `g` of HF's optimizer.
fn group_name(g: usize) -> &'static str {
    if g == 0 {
        "the weights that decay"
    } else {
        "biases and LayerNorm weights"
    }
}

/// R0319: `min_lr`/`max_lr` as a list, one value per parameter group. torch's
/// ReduceLROnPlateau (`min_lr`) and HF's GreedyLR (`min_lr`, `max_lr`) take one; both raise
/// `ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")` when the
/// length differs (torch 2.15 `optim/lr_scheduler.py:ReduceLROnPlateau.__init__`,
/// transformers v5.24.0 `optimization.py:GreedyLR.__init__`). Every other kind takes a number.
fn per_group_lists(r: &Resolved, kind: &str) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for name in ["min_lr", "max_lr"] {
        let key = format!("schedule.{name}");
        let Some(list) = r.per_group(&key) else {
            continue;
        };
        let takes = match name {
            "min_lr" => matches!(kind, "greedy" | "reduce_lr_on_plateau"),
            _ => kind == "greedy",
        };
        let values: Vec<String> = list.iter().map(|x| fmt_lr(*x)).collect();
        if !takes {
            let first = values[0].clone();
            out.push(super::fix::with_set(
                Diagnostic::error(
                    PER_GROUP_LIST,
                    format!("`{kind}` takes one `{name}`, not one per parameter group"),
                    anchor(r, &key),
                )
                .with_label(format!("{} values", list.len()))
                .with_help(format!(
                    "write one number (`{name} = {}`); a list per parameter group is for {}",
                    values[0],
                    if name == "min_lr" {
                        "`greedy` and `reduce_lr_on_plateau`"
                    } else {
                        "`greedy`"
                    }
                )),
                r,
                &key,
                &first,
            ));
            continue;
        }
        let groups = param_groups(r);
        if list.len() == groups {
            continue;
        }
        let (who, class) = if kind == "greedy" {
            ("HF's GreedyLR", "GreedyLR")
        } else {
            ("torch's ReduceLROnPlateau", "ReduceLROnPlateau")
        };
        let built = if groups == 2 {
            "HF builds the optimizer with 2 parameter groups (the weights that decay; biases and LayerNorm weights)"
        } else {
            "DeepSpeed builds the optimizer with 1 parameter group"
        };
        let d = Diagnostic::error(
            PER_GROUP_LIST,
            format!(
                "{} values of `{name}` for {groups} parameter group{}: {who} stops the run when the Trainer builds the scheduler",
                list.len(),
                if groups == 1 { "" } else { "s" }
            ),
            anchor(r, &key),
        )
        .with_label(format!("{name} = [{}]", values.join(", ")))
        .with_help(format!(
            "{built}, and {class} raises ValueError(\"expected {groups} {name}s, got {}\"); write {groups} value{} (or one number for every group)",
            list.len(),
            if groups == 1 { "" } else { "s" }
        ));
        out.push(d);
    }
    out
}

/// Raw `hf { lr_scheduler_kwargs.<x> }` entries the `schedule` block does not model (the modelled
/// ones are R0309). HF passes them to the schedule function
/// (`upstream::schedules::HF_SCHEDULE_FUNCTIONS`, transformers v5.24.0 `optimization.py`): one it
/// does not take stops the run when the Trainer builds the scheduler (error); one it takes
/// changes the curve, which `recipe explain` and the LR rules do not model (warning).
fn raw_schedule_kwargs(r: &Resolved, kind: &str, out: &mut Vec<Diagnostic>) {
    let modelled = modelled_kwargs(kind);
    let function = crate::upstream::schedules::HF_SCHEDULE_FUNCTIONS
        .iter()
        .find(|(k, ..)| *k == kind);
    for (key, _, span) in &r.raw_hf {
        let Some(arg) = key.strip_prefix("lr_scheduler_kwargs.") else {
            continue;
        };
        if modelled.contains(&arg) {
            continue; // R0309
        }
        let d = match function {
            Some((_, func, accepted, _)) if !accepted.contains(&arg) => {
                let takes = if accepted.is_empty() {
                    "no arguments".to_string()
                } else {
                    accepted.join(", ")
                };
                Diagnostic::error(
                    RAW_SCHEDULE_KWARG,
                    format!(
                        "`{arg}` is not an argument of HF's `{kind}` schedule: the run stops when the \
                         Trainer builds it (\"{func}() got an unexpected keyword argument '{arg}'\")"
                    ),
                    *span,
                )
                .with_label("not an argument of the schedule")
                .with_help(format!("remove it; `{kind}` takes {takes}"))
            }
            // A kind whose kwargs HF ignores (constant) or passes on free-form (greedy).
            None => continue,
            Some(_) => Diagnostic::warning(
                RAW_SCHEDULE_KWARG,
                format!(
                    "`{arg}` reaches HF's `{kind}` schedule, but the recipe does not model it: \
                     `recipe explain` and the LR checks show the curve without it"
                ),
                *span,
            )
            .with_label("not modelled")
            .with_help("nothing to fix if the real curve is what you want; the language lists what it models (docs/language.md §5.7)"),
        };
        out.push(d);
    }
}

/// "<lead>the learning rate at steps 1, 2, 3 is …" plus HF's values where there is an HF twin
/// (`hf_part` with `{twin}` and `{hf}` filled in), for the lag and short-warmup messages.
fn first_lrs(c: Option<&Curves>, twin: &str, lead: &str, hf_part: &str) -> Option<String> {
    let c = c?;
    let ds = c.ds.as_ref()?;
    let steps = first_steps(c);
    let hf = c.hf.as_ref().map_or(String::new(), |hf| {
        hf_part
            .replace("{twin}", twin)
            .replace("{hf}", &hf_values(c, hf, &steps))
    });
    Some(format!(
        "{lead}the learning rate at steps {} is {}{hf}",
        step_list(&steps),
        ds_values(c, ds, &steps)
    ))
}

/// R-M02 (docs/upstream.md §7): DeepSpeed's scheduler starts at `last_batch_iteration = -1`, writes
/// that value at construction and is stepped after each optimizer step, so optimizer step `k` runs
/// at iteration `k − 2` where HF's LambdaLR uses `λ(k − 1)`: the first two steps both run at the
/// start of the warmup and the whole curve is one step late (`lr::ds_lr`, `lr::hf_lr`).
fn lag(r: &Resolved, kind: &str) -> Diagnostic {
    let twin = hf_twin(kind);
    let start = start_words(r, kind);
    let curves = run_curves(r);
    let numbers = first_lrs(curves.as_ref(), twin, ": ", " (HF's `{twin}`: {hf})");
    let message = match numbers {
        Some(n) => format!("`{kind}` runs one optimizer step behind HF's `{twin}`{n}"),
        None => format!(
            "`{kind}` runs one optimizer step behind HF's `{twin}`: its first two optimizer steps both run at {start}"
        ),
    };
    let label = if r.facts.ds_warmup_init_writes_lr {
        format!(
            "DeepSpeed starts at iteration -1 and steps after each optimizer step: steps 1 and 2 both run at {start}"
        )
    } else {
        format!(
            "DeepSpeed steps after each optimizer step: step 1 runs at the optimizer's lr, step 2 at {start}"
        )
    };
    let help = match curves.as_ref().and_then(|c| c.hf.as_ref()) {
        Some(_) => format!(
            "nothing to fix if this is intended; for HF's exact curve write `schedule {twin} {{ … }}`: HF then builds the scheduler and the DeepSpeed config gets no `scheduler` section"
        ),
        None => "nothing to fix if this is intended; for HF's curve use an HF schedule (`linear`, `cosine`, `cosine_with_min_lr`, …), which HF builds and steps".into(),
    };
    let d = Diagnostic::warning(DS_LAG, message, anchor(r, "schedule.kind"))
        .with_label(label)
        .with_help(help);
    with_hf_twin(d, r, twin)
}

/// Adds the fix "write `schedule TWIN`" (HF's counterpart of a DeepSpeed `Warmup*` schedule,
/// keeping the block's items) when every item written in the block applies to the twin too:
/// otherwise the edit would trade this warning for an unknown-key error.
fn with_hf_twin(d: Diagnostic, r: &Resolved, twin: &str) -> Diagnostic {
    let fits = r
        .item_spans
        .keys()
        .filter(|k| k.starts_with("schedule."))
        .all(|k| crate::schema::key_spec(k).is_some_and(|s| s.applies_to(Some(twin))));
    if fits {
        super::fix::with_set(d, r, "schedule.kind", twin)
    } else {
        d
    }
}

/// R-M03 (docs/upstream.md §7) and R-L03 (docs/upstream.md §6.4): DeepSpeed's `Warmup*` schedulers
/// use `W' = max(2, W)`, so a warmup of 0 or 1 still spends two steps below the peak; DeepSpeed ≥
/// 0.19.3 rejects `warmup_num_steps` 0 ("warmup_num_steps must be a positive integer"), so the
/// compiler emits 1 there
/// (deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/lr_schedules.py:WarmupLR.__init__).
fn warmup_min_two(r: &Resolved, kind: &str, w: u64) -> Diagnostic {
    let twin = hf_twin(kind);
    // As the emitter does: at least 1 where DeepSpeed rejects 0 or HF's own auto value clamps.
    let emitted =
        if w == 0 && (r.facts.ds_warmup_steps_positive_int || r.facts.hf_ds_warmup_at_least_one) {
            1
        } else {
            w
        };
    let numbers = first_lrs(
        run_curves(r).as_ref(),
        twin,
        "; ",
        " where HF's `{twin}` gives {hf}",
    );
    // As written: `warmup = 0`, or `warmup = 0.2%` (1 step).
    let written = match r.val("schedule.warmup") {
        Some(v @ (Val::Percent(_) | Val::Float(_))) if v.as_i64().is_none() => {
            let s = if w == 1 { "" } else { "s" };
            format!("warmup = {v}` ({w} step{s})")
        }
        _ => format!("warmup = {w}`"),
    };
    let message = format!(
        "`{written} still means a 2-step warmup with `{kind}`: DeepSpeed warms up over max(2, {emitted}) = 2 steps{}",
        numbers.unwrap_or_default()
    );
    let emit = if emitted == w {
        format!("the compiler emits warmup_num_steps = {w}")
    } else if r.facts.ds_warmup_steps_positive_int {
        format!(
            "the compiler emits warmup_num_steps = 1: DeepSpeed {} rejects 0 (\"warmup_num_steps must be a positive integer\")",
            r.targets.deepspeed
        )
    } else {
        format!(
            "the compiler emits warmup_num_steps = 1, as transformers {}'s own auto value max(1, W) would",
            r.targets.transformers
        )
    };
    let d = Diagnostic::warning(DS_WARMUP_MIN_TWO, message, anchor(r, "schedule.warmup"))
        .with_label(format!(
            "{w} warmup step{}{}; {emit}",
            if w == 1 { "" } else { "s" },
            origin(r, "schedule.warmup")
        ))
        .with_help(format!(
            "no warmup is impossible with DeepSpeed's {kind}: write `schedule {twin}` (HF builds it; no DeepSpeed `scheduler` section), or `warmup = 2` to state what DeepSpeed does"
        ));
    let d = with_hf_twin(d, r, twin);
    super::fix::with_set(d, r, "schedule.warmup", "2")
}

/// The first optimizer step at which the warmup has covered half of its way, on a unit scale.
/// Both warmups (DeepSpeed's log, HF's linear) rise monotonically to the peak and stay there,
/// so the step is found by bisection: a recipe may warm up over billions of steps. "Half" allows
/// a few ulps (ln 4 / ln 16 rounds below ½), not a step's worth at any warmup a u64 counts.
fn half_way(f: impl Fn(u64) -> f64, first: u64, limit: u64) -> Option<u64> {
    let reached = |k: u64| f(k) >= 0.5 - 1e-15;
    if first > limit || !reached(limit) {
        return None;
    }
    let (mut lo, mut hi) = (first, limit);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if reached(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

/// DeepSpeed's `WarmupLR` from 0 to 1 over a log warmup of `w` steps: the shape R0303 compares.
fn log_unit(w: u64) -> DsSchedule {
    DsSchedule::WarmupLr {
        min_lr: 0.0,
        max_lr: Some(1.0),
        warmup_num_steps: w,
        warmup_type: DsWarmupType::Log,
    }
}

/// R-L01/R-M01 (docs/upstream.md §6.4, §7): `warmup_type = log` gives `γ = ln(it + 1) / ln(W')`,
/// concave, where HF warms up linearly (`s / W`); with the recipe's default `linear` this cannot
/// happen.
fn log_warmup(r: &Resolved, kind: &str) -> Diagnostic {
    let twin = hf_twin(kind);
    let numbers = warmup_steps(r).map(|w| {
        let wp = lr::ds_effective_warmup(w);
        let unit = log_unit(w);
        let flags = lr::ds_flags(&r.facts);
        // From step 2 on (iteration ≥ 0): step 1 is the construction-time value.
        let ds_half = half_way(
            |k| lr::ds_lr_at_iteration(&unit, &flags, 1.0, lr::ds_iteration(k)),
            2,
            wp.saturating_add(2),
        );
        let hf_half = half_way(
            |k| {
                lr::hf_lr(
                    &HfSchedule::ConstantWithWarmup,
                    1.0,
                    w,
                    w.max(1).saturating_add(1),
                    k,
                )
            },
            1,
            w.saturating_add(2),
        );
        (w, wp, ds_half, hf_half)
    });
    let message = match numbers {
        Some((_, wp, Some(ds), Some(hf))) => format!(
            "`warmup_type = log` warms up as ln(it + 1) / ln({wp}), unlike HF's linear warmup: the learning rate passes half its peak at step {ds}, where HF's `{twin}` passes it at step {hf}"
        ),
        _ => "`warmup_type = log` warms up as ln(it + 1) / ln(W'), unlike HF's linear warmup: most of the rise happens in the first steps".into(),
    };
    let d = Diagnostic::warning(LOG_WARMUP, message, anchor(r, "schedule.warmup_type"))
        .with_label("DeepSpeed's own default, not HF's shape")
        .with_help(if r.facts.ds_has_warmup_type {
            "write `warmup_type = linear` (the recipe's default) to warm up linearly, as HF does"
                .to_string()
        } else {
            format!(
                "DeepSpeed {} has no `warmup_type`: it only warms up this way; an HF schedule (`schedule linear`) warms up linearly",
                r.targets.deepspeed
            )
        });
    if r.facts.ds_has_warmup_type {
        super::fix::with_set(d, r, "schedule.warmup_type", "linear")
    } else {
        d
    }
}

/// R-L05 (docs/upstream.md §6.4): with `cycle_momentum` (default true) `OneCycle` writes `(mom,
/// 0.99)` into every param group's `betas` at construction and each step, β₁ cycling inversely to
/// the lr between `cycle_min_mom` and `cycle_max_mom` (`lr::ds_momentum`), for any optimizer whose
/// defaults have `betas`.
fn one_cycle_momentum(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if r.bool("schedule.cycle_momentum") != Some(true) {
        return;
    }
    let Some(opt) = r.word("optimizer.kind") else {
        return;
    };
    if !HAS_BETAS.contains(&opt) {
        return;
    }
    let min = r.num("schedule.cycle_min_mom");
    let max = r.num("schedule.cycle_max_mom");
    let betas = match r.val("optimizer.betas") {
        Some(Val::List(items)) if items.len() == 2 => {
            let b: Vec<String> = items
                .iter()
                .map(|v| v.as_f64().map_or_else(|| v.to_string(), fmt_f64))
                .collect();
            format!("({}, {})", b[0], b[1])
        }
        _ => "(0.9, 0.999)".into(),
    };
    let mut d = Diagnostic::warning(
        ONE_CYCLE_MOMENTUM,
        format!(
            "`OneCycle` overrides the optimizer's betas {betas}: beta1 cycles between {} and {} (inversely to the learning rate) and beta2 becomes 0.99",
            fmt_f64(min),
            fmt_f64(max)
        ),
        anchor(r, "schedule.cycle_momentum"),
    )
    .with_label(format!(
        "cycle_momentum = true{}",
        origin(r, "schedule.cycle_momentum")
    ));
    if let Some(span) = r.span("optimizer.betas") {
        d = d.with_secondary(span, "not used while OneCycle runs");
    }
    out.push(d.with_help(
        "write `cycle_momentum = false` to keep the optimizer's betas, or set cycle_min_mom / cycle_max_mom to the beta1 range you want (beta2 stays 0.99)",
    ));
}

/// R-M05 (docs/upstream.md §7): `WarmupCosineLR`'s ratio decays to `cos_min_ratio` (DeepSpeed's own
/// default 1e-4; the recipe's 0) and warms up from `warmup_min_ratio`; HF's `cosine` goes from 0 to
/// 0.
fn cosine_floor(r: &Resolved) -> Option<Diagnostic> {
    let floor = r.num("schedule.cos_min_ratio");
    let start = r.num("schedule.warmup_min_ratio");
    if floor == 0.0 && start == 0.0 {
        return None;
    }
    let lr = r.num("optimizer.lr");
    let mut parts = Vec::new();
    if floor != 0.0 {
        parts.push(format!(
            "decays to cos_min_ratio × lr = {} × {} = {}, not to 0",
            fmt_f64(floor),
            fmt_lr(lr),
            fmt_lr(floor * lr)
        ));
    }
    if start != 0.0 {
        parts.push(format!(
            "warms up from warmup_min_ratio × lr = {}, not from 0",
            fmt_lr(start * lr)
        ));
    }
    let key = if floor != 0.0 {
        "schedule.cos_min_ratio"
    } else {
        "schedule.warmup_min_ratio"
    };
    let mut d = note(
        COSINE_FLOOR,
        format!(
            "`WarmupCosineLR` {} as HF's `cosine` would",
            parts.join(", and ")
        ),
        anchor(r, key),
    )
    .with_label("a fraction of the optimizer's lr");
    if floor != 0.0 && start != 0.0 {
        if let Some(span) = r.span("schedule.warmup_min_ratio") {
            d = d.with_secondary(span, "the warmup's start, as a fraction of lr");
        }
    }
    if let Some(span) = r.span("optimizer.lr") {
        d = d.with_secondary(span, format!("lr = {}", fmt_lr(lr)));
    }
    let help = if floor != 0.0 {
        format!(
            "nothing to fix if the floor is intended (HF's counterpart is `schedule cosine_with_min_lr {{ min_lr = {} }}`); write cos_min_ratio = 0 and warmup_min_ratio = 0 for HF's `cosine`",
            fmt_lr(floor * lr)
        )
    } else {
        "nothing to fix if intended; write warmup_min_ratio = 0 for HF's `cosine`".to_string()
    };
    Some(d.with_help(help))
}

/// docs/upstream.md §6.4: `WarmupCosineLR` exists since DeepSpeed v0.12.3; before,
/// `_scheduler_from_config` finds it neither in `lr_schedules` nor in `torch.optim.lr_scheduler`
/// and asserts "DeepSpeed does not recognize LR scheduler WarmupCosineLR"
/// (deepspeedai/DeepSpeed@v0.12.2:deepspeed/runtime/engine.py:DeepSpeedEngine._scheduler_from_config).
fn no_warmup_cosine(r: &Resolved) -> Diagnostic {
    let ds = r.targets.deepspeed;
    let since = first_release(Library::DeepSpeed, ds, |f| {
        matches!(f, Fact::DsHasWarmupCosine(true))
    });
    let d = Diagnostic::error(
        NO_WARMUP_COSINE,
        format!(
            "DeepSpeed {ds} has no `WarmupCosineLR`: it stops with \"DeepSpeed does not recognize LR scheduler WarmupCosineLR\""
        ),
        anchor(r, "schedule.kind"),
    )
    .with_label(match since {
        Some(v) => format!("added in DeepSpeed {v}"),
        None => "not in this DeepSpeed".into(),
    });
    with_target(d, r, Library::DeepSpeed).with_help(match since {
        Some(v) => format!(
            "target deepspeed ≥ {v}, or write `schedule cosine {{ … }}` (HF builds the cosine schedule)"
        ),
        None => "write `schedule cosine { … }` (HF builds the cosine schedule)".into(),
    })
}

/// docs/upstream.md §6.4: `warmup_type` exists since DeepSpeed v0.5.7 (PR #1530). Before,
/// `WarmupLR.__init__` takes no such argument (the compiler cannot emit it: `TypeError`) and always
/// warms up as `ln(it + 1) / ln(W')`
/// (deepspeedai/DeepSpeed@v0.3.16:deepspeed/runtime/lr_schedules.py: WarmupLR._get_gamma), so a
/// recipe's linear warmup silently becomes logarithmic (docs/upstream.md R-L01: bug).
fn warmup_type_ignored(r: &Resolved, kind: &str) -> Diagnostic {
    let ds = r.targets.deepspeed;
    let since = first_release(Library::DeepSpeed, ds, |f| {
        matches!(f, Fact::DsHasWarmupType(true))
    });
    let d = Diagnostic::error(
        WARMUP_TYPE_IGNORED,
        format!(
            "DeepSpeed {ds} has no `warmup_type`: its `{kind}` always warms up logarithmically, not linearly as the recipe says"
        ),
        anchor(r, "schedule.warmup_type"),
    )
    .with_label(format!(
        "warmup_type = linear{}: cannot be emitted ({kind}() takes no such argument)",
        origin(r, "schedule.warmup_type")
    ));
    let upgrade = since
        .map(|v| format!("target deepspeed ≥ {v}, "))
        .unwrap_or_default();
    with_target(d, r, Library::DeepSpeed).with_help(format!(
        "{upgrade}or write `warmup_type = log` to accept DeepSpeed's logarithmic warmup, or use an HF schedule (`schedule {}`) where the versions allow it",
        hf_twin(kind)
    ))
}

/// Before DeepSpeed v0.15.3 (PR #6597) the `Warmup*` constructors write no learning rate, so
/// optimizer step 1 runs at the optimizer's configured lr, the next at the warmup's start
/// (`lr::DsFlags::init_writes_lr`; deepspeedai/DeepSpeed@v0.15.2:deepspeed/runtime/lr_schedules.py:
/// WarmupLR.__init__).
fn first_step_at_peak(r: &Resolved, kind: &str) -> Option<Diagnostic> {
    let lr = r.f64("optimizer.lr")?;
    let start = warmup_start(r, kind);
    if lr == start {
        return None;
    }
    let ds = r.targets.deepspeed;
    let since = first_release(Library::DeepSpeed, ds, |f| {
        matches!(f, Fact::DsWarmupInitWritesLr(true))
    });
    let mut d = Diagnostic::warning(
        FIRST_STEP_AT_PEAK,
        format!(
            "DeepSpeed {ds}'s `{kind}` sets no learning rate when it is built: optimizer step 1 runs at the optimizer's lr {} before the warmup starts from {} at step 2",
            fmt_lr(lr),
            start_words(r, kind)
        ),
        anchor(r, "schedule.kind"),
    )
    .with_label("one full-lr step before the warmup");
    if let Some(span) = r.span("optimizer.lr") {
        d = d.with_secondary(span, format!("lr = {}", fmt_lr(lr)));
    }
    let upgrade = since
        .map(|v| format!("target deepspeed ≥ {v} (its constructors write the warmup's start), or "))
        .unwrap_or_default();
    Some(with_target(d, r, Library::DeepSpeed).with_help(format!(
        "{upgrade}use an HF schedule (`schedule {}`), which starts at 0",
        hf_twin(kind)
    )))
}

/// The LR after `cuts` plateau cuts from `lr` (torch's `_reduce_lr`): each multiplies by
/// `factor`, stays at or above `min_lr`, and one of `eps` or less is not made. The first
/// `followed` are made one by one as torch rounds them (a recipe may state billions of steps);
/// the rest, if any, as one power, and the answer is then approximate (`false`).
fn plateau_end(
    lr: f64,
    factor: f64,
    min_lr: f64,
    eps: f64,
    cuts: u64,
    followed: u64,
) -> (f64, bool) {
    let mut end = lr;
    for made in 0..cuts {
        let next = (end * factor).max(min_lr);
        if end - next <= eps {
            return (end, true);
        }
        end = next;
        if made + 1 == followed && made + 1 < cuts {
            // A cut is no longer made once it would be `eps` or less, at end·(1 − factor) ≤ eps,
            // nor once it rounds to nothing: among subnormals, at end·(1 − factor) under half
            // their spacing.
            let left = cuts - followed;
            let stop = (eps / (1.0 - factor)).max(f64::from_bits(1) / (2.0 * (1.0 - factor)));
            let end = (end * factor.powf(left as f64))
                .max(min_lr)
                .max(stop.min(end));
            return (end, false);
        }
    }
    (end, true)
}

/// Plateau cuts R0315 makes one by one (a millisecond's work); more are taken as one power.
const PLATEAU_CUTS_FOLLOWED: u64 = 1 << 20;

/// `reduce_lr_on_plateau` when DeepSpeed builds the optimizer (`owner = deepspeed`): HF hands its
/// scheduler to `deepspeed.initialize` as a callable (huggingface/transformers@v5.24.0
/// integrations/deepspeed.py:deepspeed_optim_sched, `DummyScheduler(lr_scheduler_callable=…)`;
/// accelerate@v1.15.0 accelerator.py:_prepare_deepspeed passes it on), and the engine steps it
/// after every optimizer step with `step()`. torch's `ReduceLROnPlateau.step` needs the metric,
/// so that raises TypeError, and DeepSpeed retries with `step(train_batch_size())`: the batch
/// size, a constant, is the metric, it never improves, and the LR is multiplied by `factor`
/// every `patience + 1` steps (from step `patience + 2`). Before DeepSpeed 0.10.1 the retry is
/// `step(increment=…)`, which raises again: the run stops at the first optimizer step
/// (deepspeedai/DeepSpeed@v0.10.0 and @v0.10.1 runtime/engine.py:_take_model_step). With
/// `owner = hf` accelerate keeps the scheduler (only DeepSpeed's own scheduler types are passed,
/// `VALID_LR_SCHEDULES`) and HF steps it at each evaluation with the metric. HF's `greedy`
/// (`GreedyLR.step(self, metrics, epoch=None)`, transformers v5.24.0 `optimization.py`) takes
/// the same path: its curve on the batch size is [`schedules::Greedy`]'s, checked against a real
/// engine (conformance/plateau_engine.py, conformance/fixtures/greedy-engine.json).
fn plateau_stepped_by_deepspeed(r: &Resolved, kind: &str) -> Option<Diagnostic> {
    if r.word("optimizer.owner") != Some("deepspeed")
        || r.facts.hf_ds_optimizer_hf_scheduler_error.is_some()
    {
        return None; // HF steps it, or the combination is refused already (R0413)
    }
    let batch = r.uint("batch.global")?;
    let factor = r.num("schedule.factor");
    let patience = r.count("schedule.patience");
    let ds = r.targets.deepspeed;
    let (message, label) = if r.facts.ds_scheduler_step_batch_size_fallback && kind == "greedy" {
        let lr = r.num("optimizer.lr");
        let total = r.uint("steps.total").unwrap_or(0);
        // Step k runs at the LR the scheduler left after optimizer step k − 1, so the run's
        // steps see the first total − 1 calls; found without walking them all (a recipe may
        // state billions of steps).
        let curve = schedules::greedy(r).on_constant_metric(batch as f64, total.saturating_sub(1));
        let curve = match (curve.first_change, curve.last) {
            (None, Some(_)) => format!("the LR stays at {} for all {total} steps", fmt_lr(lr)),
            (None, None) => format!(
                "the LR stays at {} for the first {} steps at least",
                fmt_lr(lr),
                recipe_runtime::greedy::CONSTANT_FOLLOWED
            ),
            (Some((call, at)), Some(last)) => format!(
                "the LR moves to {} at step {} and is {} by step {total}",
                fmt_lr(at),
                call + 1,
                fmt_lr(last)
            ),
            (Some((call, at)), None) => format!(
                "the LR moves to {} at step {} (its curve is not followed past step {})",
                fmt_lr(at),
                call + 1,
                recipe_runtime::greedy::CONSTANT_FOLLOWED
            ),
        };
        (
            format!(
                "DeepSpeed steps `greedy` after every optimizer step with the batch size ({batch}) as the metric: {curve}, whatever the evaluations say"
            ),
            "DeepSpeed builds the optimizer, so its engine steps HF's scheduler",
        )
    } else if r.facts.ds_scheduler_step_batch_size_fallback {
        let lr = r.num("optimizer.lr");
        let total = r.uint("steps.total").unwrap_or(0);
        // torch's ReduceLROnPlateau on a metric that never improves: the first cut after
        // `patience + 1` bad steps, then one every `cooldown + patience + 1` (the cooldown
        // resets the count); checked against torch 2.15 for patience 0–4, cooldown 0–3, 1–39
        // steps, min_lr 0 and 1e-6.
        let cooldown = r.count("schedule.cooldown");
        let first = patience + 1;
        let cuts = match total.saturating_sub(1) {
            n if n < first => 0,
            n => 1 + (n - first) / (first + cooldown),
        };
        let (min_lr, eps) = (r.num("schedule.min_lr"), r.num("schedule.eps"));
        let (end, exact) = plateau_end(lr, factor, min_lr, eps, cuts, PLATEAU_CUTS_FOLLOWED);
        let about = if exact { "" } else { "about " };
        (
            format!(
                "DeepSpeed steps `reduce_lr_on_plateau` after every optimizer step with the batch size ({batch}) as the metric: the LR is multiplied by {} every {} steps, down to {about}{} by step {total}, whatever the evaluations say",
                fmt_f64(factor),
                patience + 1 + cooldown,
                fmt_lr(end)
            ),
            "DeepSpeed builds the optimizer, so its engine steps HF's scheduler",
        )
    } else {
        (
            format!(
                "DeepSpeed {ds} steps `{kind}` after the first optimizer step without a metric: the run stops with TypeError"
            ),
            "DeepSpeed builds the optimizer, so its engine steps HF's scheduler",
        )
    };
    let key = if r.is_given("optimizer.owner") {
        "optimizer.owner"
    } else {
        "schedule.kind"
    };
    let mut d =
        Diagnostic::error(PLATEAU_STEPPED_BY_DEEPSPEED, message, anchor(r, key)).with_label(
            format!("owner = deepspeed{}: {label}", origin(r, "optimizer.owner")),
        );
    if key != "schedule.kind" {
        if let Some(span) = r.span("schedule.kind") {
            d = d.with_secondary(span, "steps on an evaluation metric");
        }
    }
    Some(with_target(d, r, Library::DeepSpeed).with_help(
        "write `owner = hf` in `optimizer`: HF then builds the optimizer and steps the schedule at each evaluation with its metric; or choose a schedule that does not read a metric",
    ))
}

/// Before DeepSpeed v0.5.5 `OneCycle.get_lr` computes the post-cycle decay as
/// `iteration / decay_step_size` with no guard (deepspeedai/DeepSpeed@v0.3.16:deepspeed/runtime/
/// lr_schedules.py:OneCycle._get_decay_lr), so with `decay_step_size = 0` (its default, "no
/// decay") the scheduler step after optimizer step `cycle + 1` raises `ZeroDivisionError` and the
/// run stops there (reproduced with the real 0.3.16, conformance/fixtures/legacy-run).
fn one_cycle_zero_decay(r: &Resolved) -> Option<Diagnostic> {
    let decay = r.integer("schedule.decay_step_size");
    if decay != 0 {
        return None;
    }
    let first = u64::try_from(r.int("schedule.cycle_first_step_size")?).ok()?;
    let second = r
        .int("schedule.cycle_second_step_size")
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(first);
    let cycle = first + second;
    let total = u64::try_from(r.int("steps.total")?).ok()?;
    if total <= cycle {
        return None;
    }
    let ds = r.targets.deepspeed;
    let since = first_release(Library::DeepSpeed, ds, |f| {
        matches!(f, Fact::DsOneCycleZeroDecayOk(true))
    });
    let key = if r.is_given("schedule.decay_step_size") {
        "schedule.decay_step_size"
    } else {
        "schedule.kind"
    };
    let d = Diagnostic::error(
        ONE_CYCLE_ZERO_DECAY,
        format!(
            "DeepSpeed {ds}'s `OneCycle` divides by decay_step_size = 0 after its {cycle}-step cycle: the run stops with ZeroDivisionError after optimizer step {} of {total}",
            cycle + 1
        ),
        anchor(r, key),
    )
    .with_label(format!(
        "decay_step_size = 0{}: no decay, but DeepSpeed {ds} divides by it",
        origin(r, "schedule.decay_step_size")
    ));
    let upgrade = since
        .map(|v| format!("target deepspeed ≥ {v} (it holds cycle_min_lr), or "))
        .unwrap_or_default();
    Some(with_target(d, r, Library::DeepSpeed).with_help(format!(
        "{upgrade}write `decay_step_size = 1, decay_lr_rate = 0` to hold cycle_min_lr after the cycle, or make the cycle cover the {total} steps"
    )))
}

/// An HF `lr_scheduler_type` newer than the target transformers: `TrainingArguments` converts
/// the string to its `SchedulerType` enum in `__post_init__` and stops
/// (huggingface/transformers@v4.24.0:src/transformers/training_args.py:__post_init__,
/// `SchedulerType(self.lr_scheduler_type)`; the kinds per release in [`crate::upstream::versions`]).
fn hf_kind_unavailable(r: &Resolved, kind: &str) -> Diagnostic {
    let tf = r.targets.transformers;
    let since = first_release(
        Library::Transformers,
        tf,
        |f| matches!(f, Fact::HfSchedulerKinds(k) if k.contains(&kind)),
    );
    let d = Diagnostic::error(
        HF_KIND_UNAVAILABLE,
        format!(
            "transformers {tf} has no lr_scheduler_type `{kind}`: TrainingArguments stops with \"{kind} is not a valid SchedulerType\""
        ),
        anchor(r, "schedule.kind"),
    )
    .with_label(match since {
        Some(v) => format!("added in transformers {v}"),
        None => "not in this transformers".into(),
    });
    // The ones a recipe can write (the release may have more).
    let kinds = r
        .facts
        .hf_scheduler_kinds
        .iter()
        .filter(|k| crate::schema::blocks::HF_SCHEDULES.contains(k))
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    with_target(d, r, Library::Transformers).with_help(match since {
        Some(v) => format!("target transformers ≥ {v}, or use a schedule it has: {kinds}"),
        None => format!("use a schedule transformers {tf} has: {kinds}"),
    })
}

/// HF's own value for a schedule argument that `get_scheduler` would otherwise receive through
/// `lr_scheduler_kwargs`: the keyword defaults of the schedule functions
/// (huggingface/transformers@v4.24.0:src/transformers/optimization.py:
/// get_cosine_schedule_with_warmup num_cycles 0.5, get_cosine_with_hard_restarts_schedule_with_warmup
/// num_cycles 1, get_polynomial_decay_schedule_with_warmup lr_end 1e-7 and power 1.0; v4.29.0:
/// get_reduce_on_plateau_schedule builds torch's `ReduceLROnPlateau(optimizer)`, factor 0.1 and
/// patience 10). `None`: no single number.
fn hf_kwarg_default(kind: &str, key: &str) -> Option<f64> {
    match (kind, key) {
        ("cosine", "num_cycles") => Some(0.5),
        ("cosine_with_restarts", "num_cycles") => Some(1.0),
        ("polynomial", "power") => Some(1.0),
        ("polynomial", "lr_end") => Some(1e-7),
        ("reduce_lr_on_plateau", "factor") => Some(0.1),
        ("reduce_lr_on_plateau", "patience") => Some(10.0),
        _ => None,
    }
}

/// Before transformers v4.36.0 `TrainingArguments` has no `lr_scheduler_kwargs`: the Trainer
/// calls `get_scheduler(type, optimizer, num_warmup_steps, num_training_steps)` and nothing else,
/// so a schedule argument the recipe gives (other than HF's own default) cannot reach the run,
/// which silently follows the function's default instead (seen with the real 4.6.1 and 4.24.0,
/// conformance/fixtures/legacy-run).
fn hf_kwargs_unavailable(r: &Resolved, kind: &str, out: &mut Vec<Diagnostic>) {
    let Some(block) = crate::schema::block("schedule") else {
        return;
    };
    let tf = r.targets.transformers;
    let since = first_release(Library::Transformers, tf, |f| {
        matches!(f, Fact::HfSchedulerKwargs(true))
    });
    for k in block
        .keys
        .iter()
        .filter(|k| !k.kinds.is_empty() && k.applies_to(Some(kind)))
    {
        if !k.hf.is_some_and(|h| h.starts_with("lr_scheduler_kwargs.")) {
            continue;
        }
        let key = format!("schedule.{}", k.name);
        if !r.is_given(&key) {
            continue;
        }
        // A per-group list is never the default's one number.
        let given = r.per_group(&key).map_or_else(|| r.f64(&key), |_| None);
        let default = hf_kwarg_default(kind, k.name);
        if given.is_some() && given == default {
            continue;
        }
        let shown = given.map(fmt_f64).unwrap_or_else(|| "this value".into());
        let runs = match default {
            Some(d) => format!("HF's `{kind}` runs with {} = {}", k.name, fmt_f64(d)),
            None => format!("HF's `{kind}` runs with its own default {}", k.name),
        };
        let d = Diagnostic::error(
            HF_KWARGS_UNAVAILABLE,
            format!(
                "transformers {tf} has no `lr_scheduler_kwargs`: `{} = {shown}` cannot reach the scheduler; {runs}",
                k.name
            ),
            anchor(r, &key),
        )
        .with_label(format!(
            "not passed on: the Trainer gives get_scheduler only the warmup and the total steps{}",
            origin(r, &key)
        ));
        let upgrade = since
            .map(|v| format!("target transformers ≥ {v} (lr_scheduler_kwargs), or "))
            .unwrap_or_default();
        let keep = match default {
            Some(v) => format!("write `{} = {}` (HF's default)", k.name, fmt_f64(v)),
            None => format!("remove `{}`", k.name),
        };
        out.push(with_target(d, r, Library::Transformers).with_help(format!("{upgrade}{keep}")));
    }
}

/// The `lr_scheduler_kwargs` fields the `schedule` block writes for an HF kind (from the
/// schema's `hf` column), plus the ones that clash with them.
fn modelled_kwargs(kind: &str) -> Vec<&'static str> {
    crate::schema::block("schedule")
        .map(|b| {
            b.keys
                .iter()
                .filter(|k| !k.kinds.is_empty() && k.applies_to(Some(kind)))
                .filter_map(|k| k.hf?.strip_prefix("lr_scheduler_kwargs."))
                .map(|f| f.split_whitespace().next().unwrap_or(f))
                .collect()
        })
        .unwrap_or_default()
}

/// TrainingArguments' warmup fields.
fn is_warmup_field(key: &str) -> bool {
    matches!(key, "warmup_steps" | "warmup_ratio")
}

/// Whether the schedule kind takes `warmup` (then the compiler writes `warmup_steps`, and for a
/// DeepSpeed kind `warmup_num_steps`, which HF checks against it).
fn warmup_modelled(r: &Resolved) -> bool {
    r.get("schedule.warmup").is_some()
}

/// R-H07 (docs/upstream.md §3): a raw `deepspeed { scheduler … }` makes DeepSpeed build a scheduler
/// and HF then ignores `lr_scheduler_type` without a check (docs/upstream.md §4.1); raw `hf {
/// lr_scheduler_type, warmup_steps, lr_scheduler_kwargs.<modelled> }` restate what `schedule`
/// writes. Two sources of truth: error.
fn twice(r: &Resolved, kind: &str, out: &mut Vec<Diagnostic>) {
    let written = r.is_given("schedule.kind");
    let ours = if written {
        format!("`schedule {kind}`")
    } else {
        format!("the recipe's schedule (`{kind}`, the default)")
    };
    let ds_keys: Vec<&(String, Val, Span)> = r
        .raw_deepspeed
        .iter()
        .filter(|(k, _, _)| k == "scheduler" || k.starts_with("scheduler."))
        .collect();
    if let Some(d) = raw_twice(
        r,
        &ds_keys,
        "deepspeed",
        format!("the schedule is given twice: by a raw DeepSpeed `scheduler` and by {ours}"),
        if is_deepspeed_schedule(kind) {
            format!("the compiler writes DeepSpeed's `scheduler` section from `schedule {kind}`")
        } else {
            format!(
                "with a DeepSpeed `scheduler` section DeepSpeed builds the schedule and HF ignores lr_scheduler_type = {kind} without a word"
            )
        },
    ) {
        out.push(d);
    }
    let kwargs = if is_deepspeed_schedule(kind) {
        Vec::new()
    } else {
        modelled_kwargs(kind)
    };
    let hf_keys: Vec<&(String, Val, Span)> = r
        .raw_hf
        .iter()
        .filter(|(k, _, _)| {
            k == "lr_scheduler_type"
                || (is_warmup_field(k) && warmup_modelled(r))
                || k.strip_prefix("lr_scheduler_kwargs.")
                    .is_some_and(|f| kwargs.contains(&f))
        })
        .collect();
    if let Some(d) = raw_twice(
        r,
        &hf_keys,
        "hf",
        format!("the schedule is given twice: by raw TrainingArguments fields and by {ours}"),
        "the compiler writes lr_scheduler_type, warmup_steps and these lr_scheduler_kwargs from `schedule`".into(),
    ) {
        out.push(d);
    }
}

fn raw_twice(
    r: &Resolved,
    keys: &[&(String, Val, Span)],
    block: &str,
    message: String,
    why: String,
) -> Option<Diagnostic> {
    let (first, rest) = keys.split_first()?;
    let mut d = Diagnostic::error(SCHEDULE_TWICE, message, first.2)
        .with_label(format!("`{}` in `{block} {{ }}`", first.0));
    for (key, _, span) in rest {
        d.secondary.push(Label::new(*span, format!("`{key}` too")));
    }
    if let Some(span) = r.span("schedule.kind") {
        d = d.with_secondary(span, "the recipe's schedule");
    }
    let what = if keys.len() == 1 { "it" } else { "them" };
    Some(d.with_help(format!(
        "{why}; state the schedule once, in `schedule`, and remove {what} from `{block} {{ }}`"
    )))
}

/// R-H07/R-L06 (docs/upstream.md §3, §6.4): with a DeepSpeed `scheduler` section HF never builds
/// its scheduler, so `lr_scheduler_kwargs` has no effect (huggingface/transformers@v5.24.0:
/// src/transformers/integrations/deepspeed.py:deepspeed_optim_sched), nor has `warmup_steps` for a
/// kind without warmup (`OneCycle`, `LRRangeTest`: `trainer_config_finalize`'s `fill_match` finds
/// no `scheduler.params.warmup_num_steps` to fill or check).
fn hf_args_ignored(r: &Resolved, kind: &str, out: &mut Vec<Diagnostic>) {
    let keys: Vec<&(String, Val, Span)> = r
        .raw_hf
        .iter()
        .filter(|(k, _, _)| {
            k == "lr_scheduler_kwargs"
                || k.starts_with("lr_scheduler_kwargs.")
                || (is_warmup_field(k) && !warmup_modelled(r))
        })
        .collect();
    let Some((first, rest)) = keys.split_first() else {
        return;
    };
    let mut d = Diagnostic::warning(
        HF_SCHEDULER_ARGS_IGNORED,
        format!(
            "HF's scheduler arguments have no effect here: `schedule {kind}` is built by DeepSpeed, and HF builds no scheduler when the DeepSpeed config has a `scheduler`"
        ),
        first.2,
    )
    .with_label(format!("`{}` is never read", first.0));
    for (key, _, span) in rest {
        d.secondary
            .push(Label::new(*span, format!("`{key}` neither")));
    }
    if let Some(span) = r.span("schedule.kind") {
        d = d.with_secondary(span, "a DeepSpeed scheduler");
    }
    let what = if keys.len() == 1 { "it" } else { "them" };
    out.push(d.with_help(format!(
        "remove {what} from `hf {{ }}`; set the schedule's parameters in `schedule {kind} {{ … }}`"
    )));
}

/// R-A03 (docs/upstream.md §2.1, Table A): HF checks `scheduler.params.warmup_max_lr` against
/// `learning_rate` with must_match (transformers ≥ 4.24; `trainer_config_finalize` raises the
/// recorded mismatch at train start), so a DeepSpeed warmup cannot peak anywhere but at the
/// optimizer's lr.
fn peak_mismatch(r: &Resolved, kind: &str, out: &mut Vec<Diagnostic>) {
    if !matches!(kind, "WarmupLR" | "WarmupDecayLR") || !r.facts.hf_mismatch_checks {
        return;
    }
    let (Some(max_lr), Some(lr)) = (r.f64("schedule.max_lr"), r.f64("optimizer.lr")) else {
        return;
    };
    if !r.is_given("schedule.max_lr") || max_lr == lr {
        return;
    }
    let mut d = Diagnostic::error(
        PEAK_MISMATCH,
        format!(
            "`max_lr = {}` differs from the optimizer's lr {}: transformers {} stops at train start with \"ds scheduler.params.warmup_max_lr={} vs hf learning_rate={}\"",
            fmt_f64(max_lr),
            fmt_f64(lr),
            r.targets.transformers,
            fmt_f64(max_lr),
            fmt_f64(lr)
        ),
        anchor(r, "schedule.max_lr"),
    )
    .with_label("HF requires this to equal learning_rate");
    if let Some(span) = r.span("optimizer.lr") {
        d = d.with_secondary(
            span,
            format!("lr = {}{}", fmt_f64(lr), origin(r, "optimizer.lr")),
        );
    }
    out.push(d.with_help(format!(
        "remove `max_lr` (it defaults to the optimizer's lr), or set `optimizer.lr = {}`",
        fmt_f64(max_lr)
    )));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the cuts made one by one the power lands where making every cut lands, within the
    /// message's three figures: at the floor, at the `eps` stop, among the subnormals, and in
    /// the middle of the decay; within the bound the answer is the one-by-one one exactly.
    #[test]
    fn plateau_cuts_as_one_power_land_where_the_cuts_one_by_one_do() {
        let mut approximated = 0;
        for (lr, factor, min_lr, eps, cuts) in [
            (1e-2, 0.999_999, 1e-5, 0.0, 3_000_000),
            (1e-2, 0.999_999, 0.0, 1e-9, 5_000_000),
            (1e-2, 0.999_999, 0.0, 1e-12, 2_000_000),
            (1e-2, 0.99, 0.0, 0.0, 3_000_000),
            (1e-2, 0.999_99, 0.0, 0.0, 80_000_000),
            (1e-2, 0.999_999_9, 0.0, 0.0, 40_000_000),
        ] {
            let (exact, all) = plateau_end(lr, factor, min_lr, eps, cuts, u64::MAX);
            let (about, whole) = plateau_end(lr, factor, min_lr, eps, cuts, 1 << 20);
            assert!(all, "{factor} {cuts}");
            if whole {
                // Stopped (the floor, `eps`, or a cut rounding to nothing) within the bound.
                assert_eq!(about, exact, "{factor} {cuts}");
            } else {
                approximated += 1;
                assert!(
                    (about - exact).abs() <= 1e-3 * exact,
                    "factor {factor}, min_lr {min_lr}, eps {eps}, {cuts} cuts: {about:e} for {exact:e}"
                );
            }
        }
        assert_eq!(approximated, 5);
    }

    #[test]
    fn plateau_is_refused_only_when_deepspeed_steps_it() {
        let base = "model bert { from = \"bert-base-uncased\", task = classify(labels: 2), hidden_size = 768 }\n\
                    data { train = \"t.jsonl\", eval = \"d.jsonl\", samples = 96 }\nbatch { micro = 8 }\n\
                    train { epochs = 1 }\nschedule reduce_lr_on_plateau { factor = 0.5, patience = 2 }\n";
        let has = |text: &str| {
            crate::check::check_source(text)
                .diagnostics
                .into_iter()
                .find(|d| d.code == PLATEAU_STEPPED_BY_DEEPSPEED)
        };
        // 12 steps: cut after steps 3, 6, 9 (from step 4 on, every 3).
        let d = has(&format!("{base}optimizer adamw {{ lr = 1e-4 }}\n")).expect("R0315");
        assert!(
            d.message.contains("down to 1.25e-5 by step 12"),
            "{}",
            d.message
        );
        assert!(has(&format!(
            "{base}optimizer adamw {{ lr = 1e-4, owner = hf }}\n"
        ))
        .is_none());
        // Before DeepSpeed 0.10.1 the retry raises too: the run stops.
        let old = has(&format!(
            "target transformers \"4.46.0\", accelerate \"1.0.1\", deepspeed \"0.10.0\"\n{base}"
        ))
        .expect("R0315 on 0.10.0");
        assert!(
            old.message.contains("stops with TypeError"),
            "{}",
            old.message
        );
        assert!(crate::check::check_source(&base.replace(
            "reduce_lr_on_plateau { factor = 0.5, patience = 2 }",
            "linear"
        ))
        .diagnostics
        .iter()
        .all(|d| d.code != PLATEAU_STEPPED_BY_DEEPSPEED));
    }

    #[test]
    fn greedy_rules() {
        let base = "model bert { from = \"m\", task = classify(labels: 2) }\n\
                    data { train = \"t.jsonl\", eval = \"d.jsonl\", samples = 96 }\nbatch { micro = 8 }\n\
                    train { epochs = 1 }\n";
        let codes = |text: &str| -> Vec<&'static str> {
            crate::check::check_source(&format!("{base}{text}"))
                .diagnostics
                .iter()
                .map(|d| d.code)
                .collect()
        };
        // GreedyLR's floor 1e-3 above the lr: never lowered (HF steps it).
        let hf = "optimizer adamw { lr = 2e-5, owner = hf }\n";
        assert_eq!(
            codes(&format!("{hf}schedule greedy\n")),
            vec![GREEDY_NEVER_LOWERS]
        );
        assert!(codes(&format!("{hf}schedule greedy {{ min_lr = 0 }}\n")).is_empty());
        // A factor of 1 is refused by GreedyLR itself (not also R0318).
        assert_eq!(
            codes(&format!("{hf}schedule greedy {{ factor = 1 }}\n")),
            vec![HF_SCHEDULE_REFUSES]
        );
        // DeepSpeed's engine steps it on the batch size (8): with the default floor above the
        // lr it never moves; from above the floor it is cut every patience + 1 steps.
        let ds = crate::check::check_source(&format!(
            "{base}optimizer adamw {{ lr = 2e-5 }}\nschedule greedy\n"
        ))
        .diagnostics;
        assert_eq!(ds.len(), 1);
        assert!(
            ds[0]
                .message
                .contains("the LR stays at 2e-5 for all 12 steps"),
            "{}",
            ds[0].message
        );
        let ds = crate::check::check_source(&format!(
            "{base}optimizer adamw {{ lr = 0.01 }}\nschedule greedy {{ factor = 0.5, patience = 1 }}\n"
        ))
        .diagnostics;
        assert!(
            ds[0]
                .message
                .contains("the LR moves to 0.005 at step 4 and is 0.001 by step 12"),
            "{}",
            ds[0].message
        );
    }

    #[test]
    fn lr_formatting() {
        assert_eq!(fmt_lr(0.0), "0");
        assert_eq!(fmt_lr(3e-5), "3e-5");
        assert_eq!(fmt_lr(2.142857e-6), "2.14e-6");
        assert_eq!(fmt_lr(1.5e-5), "1.5e-5");
        assert_eq!(fmt_lr(0.5), "0.5");
        assert_eq!(fmt_lr(0.001), "0.001");
        assert_eq!(fmt_lr(0.1234), "0.123");
        assert_eq!(fmt_lr(12.0), "12");
        assert_eq!(fmt_lr(f64::NAN), "an error");
    }

    #[test]
    fn first_release_reads_the_table() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        let cos = |f: &Fact| matches!(f, Fact::DsHasWarmupCosine(true));
        assert_eq!(
            first_release(Library::DeepSpeed, v("0.10.0"), cos),
            Some(v("0.12.3"))
        );
        assert_eq!(first_release(Library::DeepSpeed, v("0.12.3"), cos), None);
        let ty = |f: &Fact| matches!(f, Fact::DsHasWarmupType(true));
        assert_eq!(
            first_release(Library::DeepSpeed, v("0.3.16"), ty),
            Some(v("0.5.7"))
        );
    }

    #[test]
    fn log_warmup_half_way_points() {
        // W = 16: log γ = ln(it + 1) / ln 16 ≥ ½ once it + 1 ≥ 4, i.e. it = 3, step 5;
        // HF linear s / 16 ≥ ½ at s = 8, step 9.
        let unit = log_unit(16);
        let flags = lr::DsFlags::LATEST;
        let ds = half_way(
            |k| lr::ds_lr_at_iteration(&unit, &flags, 1.0, lr::ds_iteration(k)),
            2,
            18,
        );
        let hf = half_way(
            |k| lr::hf_lr(&HfSchedule::ConstantWithWarmup, 1.0, 16, 17, k),
            1,
            18,
        );
        assert_eq!((ds, hf), (Some(5), Some(9)));
    }

    /// The bisection finds the step a walk from the first step finds, for every warmup up to
    /// 400 steps, on both sides.
    #[test]
    fn half_way_by_bisection_is_the_first_step_past_half() {
        let flags = lr::DsFlags::LATEST;
        for w in 0..=400u64 {
            let wp = lr::ds_effective_warmup(w);
            let unit = log_unit(w);
            let ds = |k| lr::ds_lr_at_iteration(&unit, &flags, 1.0, lr::ds_iteration(k));
            let hf = |k| lr::hf_lr(&HfSchedule::ConstantWithWarmup, 1.0, w, w.max(1) + 1, k);
            let walk = |f: &dyn Fn(u64) -> f64, first, limit| {
                (first..=limit).find(|&k| f(k) >= 0.5 - 1e-15)
            };
            assert_eq!(
                half_way(ds, 2, wp + 2),
                walk(&ds, 2, wp + 2),
                "log, W = {w}"
            );
            assert_eq!(
                half_way(hf, 1, w + 2),
                walk(&hf, 1, w + 2),
                "linear, W = {w}"
            );
        }
    }

    #[test]
    fn old_deepspeed_runs_log_warmup() {
        let mut targets = crate::upstream::versions::Targets::newest();
        targets.deepspeed = "0.3.16".parse().unwrap();
        let mut r = crate::resolve::resolve(
            &crate::syntax::parse(
                "model bert { from = \"m\", task = classify(labels: 2) }\ndata { train = \"t.jsonl\", samples = 100 }\nbatch { micro = 10 }\nschedule WarmupLR { warmup = 4 }\n",
            )
            .unwrap(),
            &crate::resolve::Options::default(),
        );
        r.facts = crate::upstream::versions::Facts::for_targets(&targets);
        let c = run_curves(&r).unwrap();
        let Some(DsSchedule::WarmupLr { warmup_type, .. }) = c.ds else {
            panic!("{:?}", c.ds)
        };
        assert_eq!(warmup_type, DsWarmupType::Log);
    }

    fn diagnostics(text: &str) -> Vec<Diagnostic> {
        crate::check::check_source(text).diagnostics
    }

    const HEAD: &str = "model bert { from = \"m\", task = classify(labels: 2) }\ndata { train = \"t.jsonl\", samples = 80 }\nbatch { micro = 8 }\ntrain { epochs = 1 }\noptimizer adamw { lr = 1 }\n";

    #[test]
    fn lag_message_reproduces_the_spec_table() {
        // docs/upstream.md §7 table, W = 4, T = 10 (80 samples / 8, one epoch), peak 1: DS
        // WarmupDecayLR linear 0, 0, .25 against HF linear 0, .25, .5.
        let d = diagnostics(&format!("{HEAD}schedule WarmupDecayLR {{ warmup = 4 }}\n"));
        let lag = d.iter().find(|d| d.code == DS_LAG).expect("R0301");
        assert!(
            lag.message
                .ends_with("is 0, 0, 0.25 (HF's `linear`: 0, 0.25, 0.5)"),
            "{}",
            lag.message
        );
        assert_eq!(d.len(), 1, "{d:#?}");
    }

    #[test]
    fn warmup_below_two_replaces_the_lag() {
        // W = 1, T = 10: W' = 2, so DS gives 0, 0, .5 (linear) where HF gives 0, 1, .889.
        let d = diagnostics(&format!("{HEAD}schedule WarmupDecayLR {{ warmup = 1 }}\n"));
        let codes: Vec<&str> = d.iter().map(|d| d.code).collect();
        assert_eq!(codes, vec![DS_WARMUP_MIN_TWO]);
        assert!(d[0].message.contains("max(2, 1) = 2"), "{}", d[0].message);
        assert!(
            d[0].message
                .contains("is 0, 0, 0.5 where HF's `linear` gives 0, 1, 0.889"),
            "{}",
            d[0].message
        );
    }

    #[test]
    fn constant_warmup_lr_has_no_lag() {
        let d = diagnostics(&format!(
            "{HEAD}schedule WarmupLR {{ warmup = 4, min_lr = 1, max_lr = 1 }}\n"
        ));
        assert!(d.is_empty(), "{d:#?}");
    }

    #[test]
    fn every_argument_of_an_hf_schedule_function_is_a_key() {
        // All but `last_epoch` (a resume by hand): an upstream argument the language lacks, or
        // a key the function does not take, trips this.
        for (kind, _, accepted, _) in crate::upstream::schedules::HF_SCHEDULE_FUNCTIONS {
            assert!(crate::schema::blocks::HF_SCHEDULES.contains(kind), "{kind}");
            let mut want: Vec<&str> = accepted
                .iter()
                .copied()
                .filter(|a| *a != "last_epoch")
                .collect();
            let mut have = modelled_kwargs(kind);
            want.sort_unstable();
            have.sort_unstable();
            assert_eq!(want, have, "{kind}");
        }
    }

    #[test]
    fn modelled_kwargs_follow_the_schema() {
        assert_eq!(modelled_kwargs("polynomial"), vec!["power", "lr_end"]);
        assert!(modelled_kwargs("cosine_with_min_lr").contains(&"min_lr_rate"));
        assert!(modelled_kwargs("linear").is_empty());
    }
}
