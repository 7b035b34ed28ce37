//! `recipe explain`: every resolved value with its provenance and the upstream key it feeds,
//! the step accounting, the learning rate per optimizer step under HF and DeepSpeed, and the
//! ZeRO model-states memory estimate. A pure report built from [`Resolved`]; the CLI prints it
//! for people or as JSON.

use serde::Serialize;

use crate::diagnostics::source::SourceFile;
use crate::resolve::{Resolved, Source, Val};
use crate::schema;
use crate::upstream::memory::{ModelSize, Offload};
use crate::upstream::schedules::{self, LrStep, Owner};
use crate::upstream::versions::Library;

/// One row of the settings table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `block.key`.
    pub key: String,
    /// The value, as the recipe language writes it.
    pub value: String,
    /// The value as JSON.
    pub json: Val,
    /// Where it came from, in words.
    pub from: String,
    /// Where it came from, structured.
    pub source: Source,
    /// The DeepSpeed config key it feeds.
    pub deepspeed: Option<&'static str>,
    /// The TrainingArguments field (or script argument) it feeds.
    pub hf: Option<&'static str>,
    /// What happens to the value upstream that the value alone does not say.
    pub upstream: Option<String>,
}

/// A target version and its provenance.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// `transformers`, `accelerate` or `deepspeed`.
    pub library: &'static str,
    /// The version.
    pub version: String,
    /// Where it came from.
    pub from: String,
}

/// The step accounting of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Steps {
    /// Training examples.
    pub samples: u64,
    /// Micro-batches per rank per epoch (`L`).
    pub batches_per_epoch: u64,
    /// Optimizer steps per epoch (`U`).
    pub per_epoch: u64,
    /// Size of the last accumulation window of an epoch.
    pub last_window: u64,
    /// Total optimizer steps (HF `max_steps`).
    pub total: u64,
    /// Warmup steps.
    pub warmup: u64,
}

/// One memory estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// ZeRO stage.
    pub stage: u8,
    /// Optimizer offload.
    pub offload_optimizer: &'static str,
    /// Parameter offload.
    pub offload_param: &'static str,
    /// Bytes per GPU.
    pub per_gpu: u64,
    /// Bytes of CPU memory per node.
    pub per_node_cpu: u64,
    /// The recipe's own choice.
    pub chosen: bool,
}

/// The model-states memory section.
#[derive(Debug, Clone, Serialize)]
pub struct MemorySection {
    /// Where the model's size comes from.
    pub from: String,
    /// Parameters (shared once).
    pub params: u64,
    /// The largest single module's parameters.
    pub largest_layer: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Nodes.
    pub nodes: u64,
    /// Estimates: the chosen configuration first, then the others.
    pub estimates: Vec<Memory>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The recipe's name.
    pub name: String,
    /// Target versions.
    pub targets: Vec<Target>,
    /// Every setting.
    pub settings: Vec<Row>,
    /// Step accounting, when the number of samples is known.
    pub steps: Option<Steps>,
    /// Who builds the schedule.
    pub schedule_owner: Option<Owner>,
    /// HF's schedule name (used or counterpart).
    pub hf_schedule: Option<&'static str>,
    /// DeepSpeed's schedule name (used or counterpart).
    pub deepspeed_schedule: Option<&'static str>,
    /// LR per optimizer step: every step, or a sample of a longer run's (`lr_sampled`;
    /// [`schedules::Curves::table`]).
    pub lr: Vec<LrStep>,
    /// The run's optimizer steps (those `lr` lists, unless sampled).
    pub lr_steps: u64,
    /// `lr` lists the first and last steps and evenly spaced ones between, not every step.
    pub lr_sampled: bool,
    /// Memory estimates, when the model's size is known.
    pub memory: Option<MemorySection>,
    /// Why a section is missing.
    pub notes: Vec<String>,
}

fn upstream_names(key: &str) -> (Option<&'static str>, Option<&'static str>) {
    let Some((block, name)) = key.split_once('.') else {
        return (None, None);
    };
    let Some(spec) = schema::block(block) else {
        return (None, None);
    };
    match spec.key(name) {
        Some(k) => (k.deepspeed, k.hf),
        None => match (block, name) {
            ("zero", "stage") => (Some("zero_optimization.stage"), None),
            ("optimizer", "kind") => (Some("optimizer.type"), Some("optim")),
            ("schedule", "kind") => (Some("scheduler.type"), Some("lr_scheduler_type")),
            ("steps", "total") => (Some("scheduler.params.total_num_steps"), Some("max_steps")),
            _ => (None, None),
        },
    }
}

fn offload_name(o: Offload) -> &'static str {
    match o {
        Offload::None => "none",
        Offload::Cpu => "cpu",
        Offload::Nvme => "nvme",
    }
}

fn memory_section(r: &Resolved, size: ModelSize, from: String) -> MemorySection {
    use crate::rules::zero::{estimate, to_offload, Choice, CHOICES};
    let g = r.count("cluster.gpus").max(1);
    let n = r.count("cluster.nodes").max(1);
    let chosen = Choice {
        stage: r.count("zero.stage") as u8,
        optimizer: to_offload(r.word("zero.offload optimizer")),
        param: to_offload(r.word("zero.offload param")),
    };
    let others = CHOICES
        .iter()
        .map(|&(stage, optimizer, param)| Choice {
            stage,
            optimizer,
            param,
        })
        .filter(|c| *c != chosen);
    let estimates = std::iter::once(chosen)
        .chain(others)
        .filter_map(|c| {
            estimate(r, c, size).map(|e| Memory {
                stage: c.stage,
                offload_optimizer: offload_name(c.optimizer),
                offload_param: offload_name(c.param),
                per_gpu: e.per_gpu,
                per_node_cpu: e.per_node_cpu,
                chosen: c == chosen,
            })
        })
        .collect();
    MemorySection {
        from,
        params: size.params,
        largest_layer: size.largest_layer,
        gpus_per_node: g,
        nodes: n,
        estimates,
    }
}

/// What upstream does to a setting's value on the way to the run, where that differs from what
/// the artefacts say.
fn upstream_note(r: &Resolved, key: &str) -> Option<String> {
    match key {
        // accelerate's DeepSpeedPlugin.__post_init__ sets steps_per_print to inf, in every
        // release from 0.10.0 to 1.16.0 (read in the wheels; the conformance fixtures record
        // the real final config with "inf").
        "train.logging_steps" if !r.facts.hf_direct_deepspeed_init => Some(
            "accelerate overrides DeepSpeed's steps_per_print with inf (DeepSpeedPlugin), so \
             DeepSpeed's own step logs never print; HF's Trainer logs every logging_steps"
                .into(),
        ),
        // Skipped steps shift DeepSpeed's LR schedule against HF's global_step
        // (docs/upstream.md R-M04).
        "train.precision" => crate::upstream::skips::note(r),
        "schedule.kind" => metric_schedule_note(r),
        _ => hf_optimizer_note(r, key),
    }
}

/// `reduce_lr_on_plateau` and `greedy` move the LR only when HF steps them after an evaluation,
/// with its metric (huggingface/transformers@v5.24.0 src/transformers/trainer.py:
/// `Trainer._evaluate`; `metric_for_best_model` defaults to `loss` for them in
/// `TrainingArguments.__post_init__`), so the LR table (the starting LR, `upstream::lr`) is exact
/// only as far as no metric can have moved it: neither changes the LR before `patience + 1`
/// evaluations (torch `ReduceLROnPlateau.step`, v5.24.0 `optimization.py:GreedyLR.step`).
fn metric_schedule_note(r: &Resolved) -> Option<String> {
    use crate::resolve::value::fmt_f64;
    use crate::rules::schedule::fmt_lr;
    let kind = r.word("schedule.kind")?;
    if !matches!(kind, "reduce_lr_on_plateau" | "greedy") {
        return None;
    }
    if r.word("optimizer.owner") != Some("hf") {
        return Some(format!(
            "`{kind}` is stepped by DeepSpeed's engine after every optimizer step, with the batch size as its metric (R0315): the LR table does not show that curve"
        ));
    }
    let lr = r.num("optimizer.lr");
    let factor = fmt_f64(r.num("schedule.factor"));
    let n = r.count("schedule.patience") + 1;
    // One value, or one per parameter group (`[1e-6, 0]`; the table shows group 0's LR).
    let bound = |key: &str| match r.per_group(key) {
        Some(list) => {
            let each: Vec<String> = list.iter().map(|x| fmt_lr(*x)).collect();
            format!("[{}] per parameter group", each.join(", "))
        }
        None => fmt_lr(r.num(key)),
    };
    let moves = if kind == "greedy" {
        format!(
            "{n} evaluations without improvement multiply it by {factor} (not below min_lr = {}), {n} improving ones divide it by {factor} (not above max_lr = {})",
            bound("schedule.min_lr"),
            bound("schedule.max_lr")
        )
    } else {
        format!(
            "{n} evaluations without improvement multiply it by {factor} (not below min_lr = {})",
            bound("schedule.min_lr")
        )
    };
    let lead = format!(
        "`{kind}` changes the LR only after an evaluation, from its metric (eval_loss unless `metric_for_best_model` says otherwise): {moves}"
    );
    // The optimizer steps between evaluations.
    let every = match r.val("train.eval_every") {
        Some(v) if v.as_i64().is_some() => v.as_i64().and_then(|n| u64::try_from(n).ok()),
        Some(v) if v.as_word() == Some("epoch") => r.uint("steps.per_epoch"),
        _ => None,
    };
    let (Some(every), Some(total)) = (every.filter(|e| *e > 0), r.uint("steps.total")) else {
        return Some(format!(
            "{lead}; the table shows the LR it starts at, {}",
            fmt_lr(lr)
        ));
    };
    let held = n.saturating_mul(every);
    Some(if held >= total {
        format!(
            "{lead}; with an evaluation every {every} steps, the run's {total} steps end before evaluation {n} could move it, so every step runs at {}, as the table shows",
            fmt_lr(lr)
        )
    } else {
        format!(
            "{lead}; evaluating every {every} steps, steps 1–{held} run at {} as the table shows, whatever the metric; from step {} the LR depends on the metric, which the table does not know (it holds {})",
            fmt_lr(lr),
            held + 1,
            fmt_lr(lr)
        )
    })
}

/// With `owner = hf`: how an `optimizer` setting reaches the optimizer HF builds, where the
/// TrainingArguments field alone does not say (src/upstream/hf_optimizers.rs).
fn hf_optimizer_note(r: &Resolved, key: &str) -> Option<String> {
    use crate::upstream::hf_optimizers::{class, route, Route};
    let name = key.strip_prefix("optimizer.")?;
    if r.word("optimizer.owner") != Some("hf") {
        return None;
    }
    let kind = r.choice("optimizer.kind");
    let class = class(kind)?;
    match route(kind, name, &r.facts)? {
        Route::OptimArgs(arg) if r.is_given(key) => Some(format!(
            "{class} reads it from optim_args (`{arg}=…`, written by the build)"
        )),
        Route::Dropped(runs) if r.is_given(key) && !r.val(key).is_some_and(|v| runs.agrees(v)) => {
            Some(format!(
                "never reaches {class}, which runs with {} (R0415)",
                runs.describe()
            ))
        }
        _ => None,
    }
}

/// Builds the report.
pub fn report(r: &Resolved, file: Option<&SourceFile>) -> Report {
    let settings = r
        .settings()
        .iter()
        .map(|s| {
            let (mut deepspeed, mut hf) = upstream_names(&s.key);
            // A schedule key reaches one side only: DeepSpeed's `scheduler` section for a
            // DeepSpeed kind, `lr_scheduler_kwargs` for an HF one (`min_lr`, `max_lr` map both).
            if s.key.starts_with("schedule.") && s.key != "schedule.kind" {
                if r.word("schedule.kind")
                    .is_some_and(crate::rules::schedule::is_deepspeed_schedule)
                {
                    hf = hf.filter(|h| !h.starts_with("lr_scheduler_kwargs."));
                } else {
                    deepspeed = deepspeed.filter(|d| !d.starts_with("scheduler."));
                }
            }
            // HF's SGD and Adagrad take these from `optim_args`, not from their own field.
            if let (Some(name), Some("hf")) =
                (s.key.strip_prefix("optimizer."), r.word("optimizer.owner"))
            {
                let kind = r.choice("optimizer.kind");
                if let Some(crate::upstream::hf_optimizers::Route::OptimArgs(_)) =
                    crate::upstream::hf_optimizers::route(kind, name, &r.facts)
                {
                    hf = Some("optim_args");
                }
            }
            Row {
                key: s.key.clone(),
                value: s.value.to_string(),
                json: s.value.clone(),
                from: s.source.describe(file),
                source: s.source.clone(),
                deepspeed,
                hf,
                upstream: upstream_note(r, &s.key),
            }
        })
        .collect::<Vec<Row>>();
    let targets = Library::ALL
        .iter()
        .enumerate()
        .map(|(i, lib)| Target {
            library: lib.key(),
            version: r.targets.get(*lib).to_string(),
            from: r.target_sources[i].describe(file),
        })
        .collect();
    let mut notes: Vec<String> = settings
        .iter()
        .filter_map(|row| Some(format!("{}: {}", row.key, row.upstream.as_ref()?)))
        .collect();
    let steps = match (
        r.uint("data.samples"),
        r.uint("steps.batches_per_epoch"),
        r.uint("steps.per_epoch"),
        r.uint("steps.total"),
    ) {
        (Some(samples), Some(l), Some(u), Some(total)) => {
            let g = r.uint("batch.accumulate").unwrap_or(1).max(1);
            Some(Steps {
                samples,
                batches_per_epoch: l,
                per_epoch: u,
                last_window: l.saturating_sub(g * (u.saturating_sub(1))).min(g).max(1),
                total,
                warmup: r.uint("steps.warmup").unwrap_or(0),
            })
        }
        _ => {
            notes.push(
                "steps: the number of training samples is unknown (give data.samples or --samples)"
                    .into(),
            );
            None
        }
    };
    let curves = schedules::curves(r);
    let (hf_schedule, deepspeed_schedule) = curves.as_ref().map_or((None, None), |c| c.names());
    let lr = curves.as_ref().map(|c| c.table()).unwrap_or_default();
    let lr_steps = curves.as_ref().map_or(0, |c| c.total());
    let memory = match crate::rules::zero::model_size(r) {
        Some((size, from)) => Some(memory_section(r, size, from)),
        None => {
            notes.push("memory: the model's size is unknown (its config.json is not local)".into());
            None
        }
    };
    Report {
        name: r.text("recipe.name").to_string(),
        targets,
        settings,
        steps,
        schedule_owner: curves.as_ref().map(|c| c.owner),
        hf_schedule,
        deepspeed_schedule,
        lr_sampled: (lr.len() as u64) < lr_steps,
        lr,
        lr_steps,
        memory,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(text: &str) -> Resolved {
        let head = "model bert { from = \"m\", task = classify(labels: 2) }\n\
                    data { train = \"t.jsonl\", eval = \"d.jsonl\", samples = 800 }\nbatch { micro = 8 }\n\
                    train { epochs = 1, eval_every = 10 }\n";
        crate::resolve::resolve(
            &crate::syntax::parse(&format!("{head}{text}")).unwrap(),
            &crate::resolve::Options::default(),
        )
    }

    #[test]
    fn a_metric_driven_schedule_says_how_far_the_table_holds() {
        // 100 steps, an evaluation every 10: no change before evaluation patience + 1 = 3.
        let r = resolved(
            "optimizer adamw { lr = 1e-4, owner = hf }\nschedule greedy { patience = 2 }\n",
        );
        let note = metric_schedule_note(&r).unwrap();
        assert!(
            note.contains(
                "steps 1–30 run at 1e-4 as the table shows, whatever the metric; from step 31"
            ),
            "{note}"
        );
        assert!(note.contains("not above max_lr = 1"), "{note}");
        // patience 10: evaluation 11 would come after the last step; the table is exact.
        let r =
            resolved("optimizer adamw { lr = 1e-4, owner = hf }\nschedule reduce_lr_on_plateau\n");
        let note = metric_schedule_note(&r).unwrap();
        assert!(
            note.contains("end before evaluation 11 could move it"),
            "{note}"
        );
        // With a DeepSpeed optimizer the engine steps it (R0315).
        let r = resolved("optimizer adamw { lr = 1e-4 }\nschedule greedy\n");
        assert!(metric_schedule_note(&r).unwrap().contains("R0315"));
        assert!(metric_schedule_note(&resolved("schedule cosine\n")).is_none());
    }

    #[test]
    fn an_hf_schedule_key_names_no_deepspeed_key() {
        let report = report(
            &resolved(
                "optimizer adamw { lr = 1e-4, owner = hf }\nschedule greedy { max_lr = 1e-3 }\n",
            ),
            None,
        );
        let row = report
            .settings
            .iter()
            .find(|s| s.key == "schedule.max_lr")
            .unwrap();
        assert_eq!(
            (row.deepspeed, row.hf),
            (None, Some("lr_scheduler_kwargs.max_lr"))
        );
        let report = report_of("schedule WarmupLR { warmup = 5, max_lr = 1e-4 }\n");
        let row = report
            .settings
            .iter()
            .find(|s| s.key == "schedule.max_lr")
            .unwrap();
        assert_eq!(
            (row.deepspeed, row.hf),
            (Some("scheduler.params.warmup_max_lr"), None)
        );
    }

    fn report_of(text: &str) -> Report {
        report(&resolved(text), None)
    }
}
