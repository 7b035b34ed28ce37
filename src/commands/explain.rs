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
    /// LR per optimizer step, every step.
    pub lr: Vec<LrStep>,
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
        // release from 0.10.0 to 1.15.0 (read in the wheels; the conformance fixtures record
        // the real final config with "inf").
        "train.logging_steps" if !r.facts.hf_direct_deepspeed_init => Some(
            "accelerate overrides DeepSpeed's steps_per_print with inf (DeepSpeedPlugin), so \
             DeepSpeed's own step logs never print; HF's Trainer logs every logging_steps"
                .into(),
        ),
        // Skipped steps shift DeepSpeed's LR schedule against HF's global_step
        // (docs/upstream.md R-M04).
        "train.precision" => crate::upstream::skips::note(r),
        _ => hf_optimizer_note(r, key),
    }
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
            let (deepspeed, mut hf) = upstream_names(&s.key);
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
        lr,
        memory,
        notes,
    }
}
