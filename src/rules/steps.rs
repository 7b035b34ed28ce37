//! Step rules: the predicted optimizer steps (docs/upstream.md R-S01), the HF/DeepSpeed drift
//! windows (docs/upstream.md R-S02, R-S03), the 4.47–4.51 early stop
//! (docs/upstream.md R-S04), warmup against the total, runs without steps.

use crate::diagnostics::Diagnostic;
use crate::resolve::Resolved;
use crate::upstream::steps;
use crate::upstream::versions::{DsBoundary, HfStepRule, Rounding};

use super::{anchor, origin};

/// HF and DeepSpeed count optimizer steps differently (docs/upstream.md R-S02, R-S03).
pub const STEP_DRIFT: &str = "R0201";
/// transformers 4.47–4.51 end the run before the last epoch (docs/upstream.md R-S04).
pub const EARLY_STOP: &str = "R0202";
/// Warmup as long as the whole run, or longer.
pub const WARMUP_TOO_LONG: &str = "R0203";
/// The number of training samples is unknown, so steps are not predicted.
pub const SAMPLES_UNKNOWN: &str = "R0204";
/// The run has no optimizer steps.
pub const NO_STEPS: &str = "R0205";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        STEP_DRIFT,
        "step-drift",
        "HF and DeepSpeed take optimizer steps at different micro-batches",
    ),
    (
        EARLY_STOP,
        "early-stop",
        "transformers 4.47-4.51 stop before the last epoch",
    ),
    (
        WARMUP_TOO_LONG,
        "warmup-too-long",
        "the warmup lasts the whole run or longer",
    ),
    (
        SAMPLES_UNKNOWN,
        "samples-unknown",
        "the number of training samples is unknown",
    ),
    (NO_STEPS, "no-steps", "the run takes no optimizer step"),
];

/// The timeline of the run as the targets execute it, when the inputs are known: its first
/// `limit` micro-batches.
pub fn run_timeline(r: &Resolved, limit: u64) -> Option<Vec<steps::Row>> {
    let (l, g, epochs, total) = timeline_shape(r)?;
    Some(steps::timeline(
        l,
        g,
        epochs,
        total,
        r.facts.hf_step_rule,
        r.facts.ds_boundary,
        limit,
    ))
}

/// The whole run's timeline as [`steps::summary`] gives it: its last micro-batch and first
/// disagreement, in time that does not grow with the run (a recipe may state billions of
/// samples, and the editor checks it at every edit). `None` where the samples are unknown, or
/// for an accumulation of more than a million micro-batches ([`steps::summary`]).
pub fn run_summary(r: &Resolved) -> Option<steps::Summary> {
    let (l, g, epochs, total) = timeline_shape(r)?;
    steps::summary(
        l,
        g,
        epochs,
        total,
        r.facts.hf_step_rule,
        r.facts.ds_boundary,
    )
}

/// Micro-batches per epoch, accumulation, epochs started and HF's total steps.
fn timeline_shape(r: &Resolved) -> Option<(u64, u64, u64, u64)> {
    let l = r.uint("steps.batches_per_epoch")?;
    let g = r.uint("batch.accumulate")?;
    let total = r.uint("steps.total")?;
    let u = r.uint("steps.per_epoch")?.max(1);
    Some((l, g, total.div_ceil(u).max(1), total))
}

/// Whether DeepSpeed takes part (a ZeRO stage or the DeepSpeed path at all). Every recipe
/// compiles to DeepSpeed + HF today, so it always does.
fn uses_deepspeed(_r: &Resolved) -> bool {
    true
}

/// R0204 as `recipe build` reports it: an error. The artefacts state the schedule's steps
/// (warmup steps, DeepSpeed's `total_num_steps`, HF's scheduler), which need the sample count;
/// rather than write a config without them, the build stops (`check` only warns: the recipe is
/// fine to read and explain).
pub fn build_needs_samples(r: &Resolved) -> Diagnostic {
    Diagnostic::error(
        SAMPLES_UNKNOWN,
        "the number of training samples is unknown, so `recipe build` cannot state the schedule's steps (warmup, total_num_steps) in the artefacts",
        anchor(r, "data.train"),
    )
    .with_label("not a readable local file")
    .with_help("give `samples = N` in `data` (or --samples N) when the file lives elsewhere")
}

/// R0204 as `recipe check` reports it (a warning: the file may live on the cluster). A path
/// whose directory exists here but whose file does not is more likely a typo: the message says
/// the file is missing, and the help (and its fix) names the closest file of that directory.
fn samples_unknown(r: &Resolved) -> Diagnostic {
    let written = r.str("data.train").unwrap_or_default();
    let path = crate::resolve::files::local_path(r, written);
    let dir_here = path.parent().is_some_and(|p| p.is_dir());
    let (message, label) = if dir_here && !path.exists() {
        (
            format!("the training file \"{written}\" does not exist, so the number of training samples is unknown and optimizer steps cannot be predicted"),
            format!("no file at {}", path.display()),
        )
    } else {
        (
            "the number of training samples is unknown, so optimizer steps cannot be predicted"
                .to_string(),
            "not a readable local file".to_string(),
        )
    };
    let d =
        Diagnostic::warning(SAMPLES_UNKNOWN, message, anchor(r, "data.train")).with_label(label);
    match super::data::closest_sibling(written, &path).filter(|_| !path.exists()) {
        Some((best, fixed)) => {
            let d = d.with_help(format!(
                "did you mean \"{best}\"? (in the same directory); or give `samples = N` in `data` (or --samples N) when the file lives elsewhere"
            ));
            super::fix::with_set(d, r, "data.train", &crate::commands::format::quote(&fixed))
        }
        None => d.with_help(
            "give `samples = N` in `data` (or --samples N) when the file lives elsewhere",
        ),
    }
}

/// Checks step accounting.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if r.uint("data.samples").is_none() {
        out.push(samples_unknown(r));
        return;
    }
    let (Some(l), Some(g), Some(u), Some(total)) = (
        r.uint("steps.batches_per_epoch"),
        r.uint("batch.accumulate"),
        r.uint("steps.per_epoch"),
        r.uint("steps.total"),
    ) else {
        return;
    };
    if total == 0 || l == 0 {
        let samples = r.uint("data.samples").unwrap_or(0);
        let per_batch =
            r.uint("batch.micro").unwrap_or(1) * r.uint("cluster.world_size").unwrap_or(1);
        let message = if l == 0 && samples > 0 && r.bool("data.drop_last") == Some(true) {
            // transformers 5.24 then stops in Trainer.train() ("args.max_steps must be set to a
            // positive value if dataloader does not have a length"; conformance R0205 case).
            format!(
                "this run has no micro-batch to train on: {samples} samples, fewer than micro × world = {per_batch}, and `drop_last` drops the short batch"
            )
        } else {
            format!(
                "this run takes no optimizer step ({l} micro-batches per epoch, {total} steps in all)"
            )
        };
        out.push(
            Diagnostic::error(
                NO_STEPS,
                message,
                anchor(r, if l == 0 { "data.samples" } else { "train.epochs" }),
            )
            .with_label("nothing to train on")
            .with_help("check `epochs`/`max_steps`, and that there are at least micro × world samples (or drop_last = false)"),
        );
        return;
    }
    let tf = r.targets.transformers;
    if uses_deepspeed(r) && g > 1 {
        if let Some(sum) = run_summary(r) {
            if let Some(first) = sum.first_divergence {
                out.push(drift(r, &sum, &first, l, g));
            }
        }
    }
    // transformers 4.47–4.51: floor U with stepping at every epoch end (docs/upstream.md §5.5,
    // issue #36297).
    if r.facts.hf_step_rule == HfStepRule::EpochModuloOrLast
        && r.facts.updates_per_epoch == Rounding::Floor
        && l % g != 0
        && r.uint("train.max_steps").is_none()
    {
        let epochs = r.num("train.epochs");
        let steps_run = l.div_ceil(g);
        out.push(
            Diagnostic::error(
                EARLY_STOP,
                format!(
                    "transformers {tf} stops after {total} optimizer steps, before the last epoch ends"
                ),
                anchor(r, "train.epochs"),
            )
            .with_label(format!(
                "{} epochs × {u} steps (floor of {l}/{g}) = {total}, but each epoch takes {steps_run}",
                crate::resolve::value::fmt_f64(epochs)
            ))
            .with_help("upgrade to transformers ≥ 4.52 (`target transformers \"4.52.0\"`), set `max_steps`, or make the micro-batches per epoch a multiple of `accumulate`"),
        );
        if let Some(d) = out.pop() {
            out.push(early_stop_fixes(d, r, l, g));
        }
    }
    if let Some(w) = r.uint("steps.warmup") {
        if w >= total && total > 0 {
            out.push(
                Diagnostic::warning(
                    WARMUP_TOO_LONG,
                    format!("the warmup ({w} steps) lasts the whole run ({total} optimizer steps)"),
                    anchor(r, "schedule.warmup"),
                )
                .with_label(format!(
                    "{w} warmup steps{}",
                    origin(r, "steps.warmup").replace(" (derived)", "")
                ))
                .with_help(
                    "the learning rate never reaches its peak; shorten the warmup or train longer",
                ),
            );
        }
    }
}

/// R0202's ways out as edits: the first release that counts a partial accumulation window
/// (4.52.0), `drop_last = true` where dropping the short batch leaves a multiple of
/// `accumulate`, and the accumulation nearest the written one that divides the micro-batches
/// per epoch.
fn early_stop_fixes(mut d: Diagnostic, r: &Resolved, l: u64, g: u64) -> Diagnostic {
    use crate::upstream::versions::Library;
    if let Some((span, text)) = super::fix::set_target(r, Library::Transformers, "4.52.0") {
        d.fixes.push(crate::diagnostics::Fix {
            title: "target transformers \"4.52.0\"".into(),
            edits: vec![crate::diagnostics::Edit { span, text }],
        });
    }
    if let (Some(n), Some(m), Some(world), Some(false)) = (
        r.uint("data.samples"),
        r.uint("batch.micro"),
        r.uint("cluster.world_size"),
        r.bool("data.drop_last"),
    ) {
        let dropped = steps::batches_per_rank(n, m, world, true, r.facts.sharding);
        if dropped > 0 && dropped % g == 0 {
            d = super::fix::with_set(d, r, "data.drop_last", "true");
        }
    }
    // Within a factor of two of the written accumulation: a batch size the user still means.
    let nearest = ((g / 2).max(2)..=l.min(2 * g))
        .filter(|x| l % x == 0)
        .min_by_key(|x| x.abs_diff(g));
    match nearest {
        Some(x) => super::fix::with_set(d, r, "batch.accumulate", &x.to_string()),
        None => d,
    }
}

fn drift(r: &Resolved, sum: &steps::Summary, first: &steps::Row, l: u64, g: u64) -> Diagnostic {
    let (hf_steps, ds_steps) = (sum.hf_steps(), sum.ds_steps());
    let (tf, acc) = (r.targets.transformers, r.targets.accelerate);
    let why = match (r.facts.hf_step_rule, r.facts.ds_boundary) {
        (HfStepRule::EpochModulo, _) => format!(
            "transformers {tf} restarts its accumulation count every epoch while DeepSpeed counts micro-batches from the start"
        ),
        (HfStepRule::Cumulative, _) => format!(
            "with {l} micro-batches per epoch (≤ accumulate {g}) transformers {tf} steps at every epoch end, DeepSpeed does not"
        ),
        (HfStepRule::EpochModuloOrLast, DsBoundary::OwnCounter) => format!(
            "transformers {tf} steps at every epoch end, but accelerate {acc} lets DeepSpeed count micro-batches on its own"
        ),
        (HfStepRule::EpochModuloOrLast, DsBoundary::FollowsHf) => "the step counters differ".into(),
    };
    // A nearby accumulation that divides L removes the epoch-end window.
    let better_g = (1..=l.min(4 * g))
        .filter(|d| l % d == 0 && *d > 1)
        .min_by_key(|d| d.abs_diff(g));
    let mut fixes = Vec::new();
    if r.facts.hf_step_rule == HfStepRule::EpochModuloOrLast {
        fixes.push(
            "target accelerate ≥ 1.8.0 (it forces DeepSpeed's boundary from HF's)".to_string(),
        );
    } else {
        fixes.push("target transformers ≥ 4.52 with accelerate ≥ 1.8.0".to_string());
    }
    if let Some(bg) = better_g {
        fixes.push(format!(
            "set accumulate = {bg} (divides the {l} micro-batches per epoch)"
        ));
    }
    fixes.push("or choose samples, micro and GPUs so that micro-batches per epoch are a multiple of accumulate (drop_last helps)".into());
    let counts = if hf_steps == ds_steps {
        format!("both take {hf_steps} steps, but at different micro-batches")
    } else {
        format!("HF steps {hf_steps} times, DeepSpeed updates the weights {ds_steps} times")
    };
    let mut d = Diagnostic::error(
        STEP_DRIFT,
        format!("HF and DeepSpeed disagree on optimizer steps: {counts}"),
        anchor(r, "batch.accumulate"),
    )
    .with_label(format!(
        "accumulate = {g}{}; first disagreement at micro-batch {} (epoch {}, batch {} of {l})",
        origin(r, "batch.accumulate"),
        first.count,
        first.epoch,
        first.step_in_epoch
    ));
    if let Some(span) = r.target_sources.iter().find_map(|s| s.span()) {
        d = d.with_secondary(span, "these versions");
    }
    d.with_help(format!(
        "{why}; `recipe steps` shows the timeline. Fix: {}",
        fixes.join("; ")
    ))
}
