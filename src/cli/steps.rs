//! `recipe steps FILE [--versions LIB=V,...] [--all]`

use std::fmt::Write as _;
use std::path::Path;

use recipe::resolve::Resolved;
use recipe::rules::steps::{run_summary, run_timeline};
use recipe::upstream::steps::Row;
use recipe::upstream::versions::{Facts, Library, Targets};
use recipe_runtime::accounting::NativeSteps;
use serde::Serialize;

use super::{load, Format, RecipeFlags, FAILED, OK, USAGE};

/// The most micro-batches a timeline lists (the run's first): a recipe may state billions of
/// samples; the counts, and the first disagreement wherever it is, are the whole run's.
const ROWS_MAX: u64 = 100_000;

/// One timeline under one set of versions.
#[derive(Serialize)]
struct Timeline {
    transformers: String,
    accelerate: String,
    deepspeed: String,
    batches_per_epoch: u64,
    accumulate: u64,
    hf_steps: u64,
    deepspeed_steps: u64,
    diverges: bool,
    /// Micro-batches in the run.
    micro_batches: u64,
    /// The first micro-batch at which the two sides disagree.
    first_divergence: Option<Row>,
    /// The run's first micro-batches, [`ROWS_MAX`] at most: all of them unless `truncated`.
    rows: Vec<Row>,
    truncated: bool,
}

/// Why a timeline cannot be made.
enum NoTimeline {
    SamplesUnknown,
    TooLong,
}

fn parse_stack(spec: &str, base: Targets) -> Result<Targets, String> {
    let mut t = base;
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (lib, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`--versions {spec}`: expected LIB=VERSION,..."))?;
        let lib = Library::ALL
            .into_iter()
            .find(|l| l.key() == lib.trim())
            .ok_or_else(|| {
                format!(
                    "`--versions {spec}`: the libraries are transformers, accelerate and deepspeed"
                )
            })?;
        t.set(
            lib,
            v.parse().map_err(|e| format!("`--versions {spec}`: {e}"))?,
        );
    }
    Ok(t)
}

/// The timeline of the recipe under other versions: the step accounting is re-derived.
fn timeline_for(resolved: &Resolved, targets: Targets) -> Result<Timeline, NoTimeline> {
    let mut r = resolved.clone();
    r.targets = targets;
    r.facts = Facts::for_targets(&targets);
    recipe::resolve::recompute_steps(&mut r);
    let rows = run_timeline(&r, ROWS_MAX).ok_or(NoTimeline::SamplesUnknown)?;
    let sum = run_summary(&r).ok_or(NoTimeline::TooLong)?;
    Ok(Timeline {
        transformers: targets.transformers.to_string(),
        accelerate: targets.accelerate.to_string(),
        deepspeed: targets.deepspeed.to_string(),
        batches_per_epoch: r.uint("steps.batches_per_epoch").unwrap_or(0),
        accumulate: r.uint("batch.accumulate").unwrap_or(1),
        hf_steps: sum.hf_steps(),
        deepspeed_steps: sum.ds_steps(),
        diverges: sum.first_divergence.is_some(),
        micro_batches: sum.micro_batches(),
        first_divergence: sum.first_divergence,
        truncated: (rows.len() as u64) < sum.micro_batches(),
        rows,
    })
}

/// `--plot`: per timeline, the optimizer steps HF and DeepSpeed have taken after each
/// micro-batch; the epoch ends, and the micro-batches where the first diverging timeline's two
/// sides step differently, marked.
fn draw(timelines: &[Timeline], r: &Resolved, path: &Path) -> Result<(), String> {
    use recipe_runtime::plot::{curves_chart, Curve, STEPS_AXES};
    // The first timeline that diverges comes first: its differences are marked on its curve.
    let first = timelines
        .iter()
        .find(|t| t.diverges)
        .or(timelines.first())
        .ok_or("no timeline")?;
    let ordered =
        std::iter::once(first).chain(timelines.iter().filter(|t| !std::ptr::eq(*t, first)));
    let mut names = Vec::new();
    let mut points = Vec::new();
    for tl in ordered {
        let versions = if timelines.len() > 1 {
            format!(
                " (transformers {}, accelerate {}, deepspeed {})",
                tl.transformers, tl.accelerate, tl.deepspeed
            )
        } else {
            String::new()
        };
        names.push(format!("HF global_step{versions}"));
        points.push(
            tl.rows
                .iter()
                .map(|x| (x.count, x.hf_global as f64))
                .collect::<Vec<_>>(),
        );
        names.push(format!("DeepSpeed global_steps{versions}"));
        points.push(
            tl.rows
                .iter()
                .map(|x| (x.count, x.ds_global as f64))
                .collect::<Vec<_>>(),
        );
    }
    let curves: Vec<Curve<'_>> = names
        .iter()
        .zip(&points)
        .map(|(name, points)| Curve { name, points })
        .collect();
    let epoch_ends: Vec<u64> = first
        .rows
        .iter()
        .filter(|x| x.step_in_epoch == first.batches_per_epoch)
        .map(|x| x.count)
        .collect();
    let differ: Vec<u64> = first
        .rows
        .iter()
        .filter(|x| x.hf_step != x.ds_step)
        .map(|x| x.count)
        .collect();
    let mut title = format!(
        "{}: optimizer steps per micro-batch (accumulate {})",
        r.text("recipe.name"),
        first.accumulate
    );
    if first.truncated {
        let _ = write!(
            title,
            ", the first {} of {}",
            first.rows.len(),
            first.micro_batches
        );
    }
    curves_chart(path, &title, &STEPS_AXES, &curves, &epoch_ends, &differ)
        .map_err(|e| e.to_string())
}

/// The native runtime's accounting (`recipe_runtime::accounting::native`, which the training
/// loop asserts its own count against).
fn native(r: &Resolved) -> Option<NativeSteps> {
    Some(recipe_runtime::accounting::native(
        r.uint("data.samples")?,
        r.uint("batch.micro")?,
        r.uint("batch.accumulate")?,
        r.uint("cluster.world_size")?,
        r.flag("data.drop_last"),
        r.num("train.epochs"),
        r.uint("train.max_steps"),
    ))
}

pub fn run(
    file: &Path,
    versions: &[String],
    all: bool,
    plot: Option<&Path>,
    flags: &RecipeFlags,
) -> i32 {
    let (_, resolved, _) = match load(file, flags) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let mut stacks = vec![resolved.targets];
    for spec in versions {
        match parse_stack(spec, resolved.targets) {
            Ok(t) => stacks.push(t),
            Err(e) => {
                eprintln!("error: {e}");
                return USAGE;
            }
        }
    }
    let mut timelines = Vec::new();
    for t in stacks {
        match timeline_for(&resolved, t) {
            Ok(tl) => timelines.push(tl),
            Err(NoTimeline::SamplesUnknown) => {
                eprintln!("error: the number of training samples is unknown: give data.samples or --samples");
                return FAILED;
            }
            Err(NoTimeline::TooLong) => {
                eprintln!(
                    "error: the timeline is too long to walk: its epochs repeat only every {} or more epochs (accumulate {}); lower `accumulate`",
                    1u64 << 20,
                    resolved.uint("batch.accumulate").unwrap_or(0)
                );
                return FAILED;
            }
        }
    }
    if let Some(path) = plot {
        if let Err(e) = draw(&timelines, &resolved, path) {
            eprintln!("error: {e}");
            return USAGE;
        }
    }
    let native = native(&resolved);
    let skips = recipe::upstream::skips::note(&resolved);
    match flags.format {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "timelines": timelines, "native": native, "skipped_steps": skips })
        ),
        Format::Human => {
            for tl in &timelines {
                print!("{}", human(tl, all));
            }
            if let Some(n) = &native {
                println!(
                    "native runtime (`recipe run`): {} micro-batches per rank per epoch, {} optimizer \
                     steps per epoch (the last over {} micro-batch(es), averaged over them), {} in all",
                    n.batches_per_epoch, n.per_epoch, n.last_window, n.total
                );
            }
            if let Some(note) = &skips {
                println!("\nskipped steps: {note}");
            }
        }
    }
    if timelines.iter().any(|t| t.diverges) {
        eprintln!(
            "HF and DeepSpeed take optimizer steps at different micro-batches (rows marked `!`)"
        );
        FAILED
    } else {
        OK
    }
}

fn human(tl: &Timeline, all: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "transformers {}, accelerate {}, deepspeed {}: {} micro-batches per epoch, accumulate {}; HF steps {}, DeepSpeed steps {}{}",
        tl.transformers,
        tl.accelerate,
        tl.deepspeed,
        tl.batches_per_epoch,
        tl.accumulate,
        tl.hf_steps,
        tl.deepspeed_steps,
        if tl.diverges { " — they DIVERGE" } else { " — they agree" }
    );
    let _ = writeln!(
        out,
        "{:>7} {:>5} {:>6} {:>9}   {:>8} {:>9}",
        "micro", "epoch", "in-ep", "HF global", "DS micro", "DS global"
    );
    // Without --all: the first two windows, the last two micro-batches of every epoch, and every
    // disagreement (with the row before it).
    let g = tl.accumulate.max(1);
    let keep = |i: usize, r: &Row| {
        all || r.count <= 2 * g
            || r.step_in_epoch + 2 > tl.batches_per_epoch
            || r.hf_step != r.ds_step
            || tl.rows.get(i + 1).is_some_and(|n| n.hf_step != n.ds_step)
    };
    let mut skipped = false;
    for (i, r) in tl.rows.iter().enumerate() {
        if !keep(i, r) {
            skipped = true;
            continue;
        }
        if skipped {
            let _ = writeln!(out, "{:>7}", "…");
            skipped = false;
        }
        let mark = |b: bool| if b { "*" } else { " " };
        let line = format!(
            "{:>7} {:>5} {:>6} {:>8}{} {:>8} {:>8}{} {}",
            r.count,
            r.epoch,
            r.step_in_epoch,
            r.hf_global,
            mark(r.hf_step),
            r.ds_micro,
            r.ds_global,
            mark(r.ds_step),
            if r.hf_step != r.ds_step { "!" } else { "" }
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if skipped {
        let _ = writeln!(out, "{:>7}", "…");
    }
    if tl.truncated {
        let _ = writeln!(
            out,
            "  (the first {} of the run's {} micro-batches)",
            tl.rows.len(),
            tl.micro_batches
        );
        if let Some(d) = tl
            .first_divergence
            .filter(|d| d.count > tl.rows.len() as u64)
        {
            let _ = writeln!(
                out,
                "  the first disagreement: micro-batch {} (epoch {}, batch {}): HF {}, DeepSpeed {}",
                d.count,
                d.epoch,
                d.step_in_epoch,
                if d.hf_step { "steps" } else { "does not step" },
                if d.ds_step { "steps" } else { "does not step" }
            );
        }
    }
    let _ = writeln!(
        out,
        "  (* an optimizer step happens here; ! HF and DeepSpeed disagree)\n"
    );
    out
}
