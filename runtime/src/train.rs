//! The training loop: epochs of sharded micro-batches, accumulation windows, clipping, the
//! optimizer step at the plan's learning rate, evaluation, metrics, checkpoints and resume.
//!
//! The loop is written for `world` data-parallel ranks (each rank's batches come from the
//! accelerate-style sharding in [`crate::data`]); running more than one rank needs the
//! collectives of the next stage and is refused plainly until then.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::resume;
use crate::data::{self, Dataset, LabelSet, TextTokenizer};
use crate::metrics::{self, EvalReport};
use crate::model::{BertConfig, Classifier, Workspace};
use crate::optim::{self, AdamConfig, AdamState};
use crate::plan::{DataPlan, Every, ModelSource, OptimizerKind, Plan, Precision};

/// How to run a plan.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from this checkpoint directory.
    pub resume: Option<PathBuf>,
    /// Stop after this many optimizer steps (a checkpoint is written there).
    pub stop_after: Option<u64>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The plan asks for something this runtime does not do yet.
    #[error("{0} is not built yet")]
    NotBuilt(String),
    /// Bad data (the message names file and line).
    #[error(transparent)]
    Data(#[from] data::DataError),
    /// The model cannot be loaded or saved.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// A checkpoint cannot be read or written.
    #[error(transparent)]
    Checkpoint(#[from] resume::ResumeError),
    /// A file cannot be written.
    #[error("cannot write `{path}`: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The data no longer matches the plan, or the loop's count broke its prediction.
    #[error("{0}")]
    Mismatch(String),
    /// The loss became NaN or infinite.
    #[error("the loss is {loss} at optimizer step {step}: training diverged (lower optimizer.lr, or clip gradients with train.clip)")]
    Diverged {
        /// The step.
        step: u64,
        /// The loss.
        loss: f32,
    },
}

impl RunError {
    /// Whether the run was refused because a feature is missing (a usage error, not a failure).
    pub fn is_not_built(&self) -> bool {
        matches!(self, RunError::NotBuilt(_))
    }
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Optimizer steps taken, in total (a resumed run counts the earlier ones).
    pub steps: u64,
    /// Optimizer steps the plan predicted.
    pub predicted_steps: u64,
    /// Whether the run stopped early (`--stop-after`).
    pub stopped: bool,
    /// Mean training loss of the last logged window.
    pub last_loss: Option<f32>,
    /// The last evaluation on the eval file.
    pub eval: Option<EvalReport>,
    /// The evaluation on the test file, after training.
    pub test: Option<EvalReport>,
    /// Training examples per second (forward + backward + step), this process.
    pub samples_per_s: f64,
    /// Where the final model (or the stop checkpoint) is.
    pub saved: Option<PathBuf>,
    /// The metrics file.
    pub metrics: PathBuf,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.stopped {
            write!(f, "stopped after optimizer step {}", self.steps)?;
        } else {
            write!(
                f,
                "trained {} optimizer steps (predicted {})",
                self.steps, self.predicted_steps
            )?;
        }
        if let Some(l) = self.last_loss {
            write!(f, ", last loss {l:.4}")?;
        }
        writeln!(f, ", {:.1} samples/s", self.samples_per_s)?;
        if let Some(e) = &self.eval {
            writeln!(f, "eval: {e}")?;
        }
        if let Some(e) = &self.test {
            writeln!(f, "test: {e}")?;
        }
        if let Some(p) = &self.saved {
            writeln!(f, "saved {}", p.display())?;
        }
        write!(f, "metrics {}", self.metrics.display())
    }
}

/// Where a run is: enough, with the weights and optimizer state, to resume bit-identically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Optimizer steps taken.
    pub step: u64,
    /// The epoch (0-based) the next window belongs to.
    pub epoch: u64,
    /// Micro-batches of that epoch already consumed.
    pub batch: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn spec(data: &DataPlan, path: &Path) -> data::DataSpec {
    data::DataSpec {
        path: path.to_path_buf(),
        format: match data.format {
            crate::plan::DataFormat::Jsonl => data::Format::Jsonl,
            crate::plan::DataFormat::Csv => data::Format::Csv,
            crate::plan::DataFormat::Tsv => data::Format::Tsv,
        },
        text: data.text.clone(),
        text_pair: data.text_pair.clone(),
        label: data.label.clone(),
    }
}

/// Refuses what this runtime does not do yet, plainly.
fn supported(plan: &Plan) -> Result<(), RunError> {
    if plan.train.precision != Precision::Fp32 {
        return Err(RunError::NotBuilt(format!(
            "{:?} mixed precision on the CPU backend (it trains in fp32: --set train.precision=fp32)",
            plan.train.precision
        )
        .to_lowercase()));
    }
    if plan.batch.world > 1 {
        return Err(RunError::NotBuilt(format!(
            "data parallelism over {} ranks (the collectives come with ZeRO; run with one rank)",
            plan.batch.world
        )));
    }
    if plan.model.arch != "bert" {
        return Err(RunError::NotBuilt(format!(
            "the `{}` architecture",
            plan.model.arch
        )));
    }
    Ok(())
}

/// The model the plan names, or the one saved in a checkpoint.
fn load_model(plan: &Plan, resume: Option<&Path>) -> Result<Classifier, RunError> {
    let n = plan.model.labels.len();
    let seed = plan.train.seed;
    let mut model = match (resume, &plan.model.source) {
        (Some(dir), _) => Classifier::from_pretrained(dir, n, seed)?,
        (None, ModelSource::Pretrained { dir }) => Classifier::from_pretrained(dir, n, seed)?,
        (None, ModelSource::Config { config }) => {
            let cfg = BertConfig::read(config)?;
            Classifier::random(cfg, n, seed)?
        }
    };
    if let Some(p) = plan.model.dropout {
        model.set_dropout(p as f32);
    }
    Ok(model)
}

/// Per-element weight-decay mask: HF Trainer's grouping by parameter-name substrings.
fn decay_mask(model: &Classifier, no_decay: &[String]) -> Vec<bool> {
    model
        .params
        .entries
        .iter()
        .map(|e| !no_decay.iter().any(|s| e.name.contains(s.as_str())))
        .collect()
}

/// Runs a plan to the end (or to `stop_after`).
pub fn run(plan: &Plan, options: &RunOptions) -> Result<Summary, RunError> {
    supported(plan)?;
    let labels = LabelSet::new(plan.model.labels.clone(), plan.model.named_labels);
    let tokenizer = TextTokenizer::from_file(&plan.model.tokenizer, plan.data.max_len)?;
    let train = Dataset::load(&spec(&plan.data, &plan.data.train), &labels, &tokenizer)?;
    if train.len() as u64 != plan.data.samples {
        return Err(RunError::Mismatch(format!(
            "`{}` has {} rows, but the plan was built for {}: rebuild the plan",
            plan.data.train.display(),
            train.len(),
            plan.data.samples
        )));
    }
    let eval = match &plan.data.eval {
        Some(p) => Some(Dataset::load(&spec(&plan.data, p), &labels, &tokenizer)?),
        None => None,
    };
    let test = match &plan.data.test {
        Some(p) => Some(Dataset::load(&spec(&plan.data, p), &labels, &tokenizer)?),
        None => None,
    };

    let out = &plan.train.output_dir;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut model = load_model(plan, options.resume.as_deref())?;
    let adam = AdamConfig {
        decoupled: plan.optimizer.kind == OptimizerKind::AdamW,
        betas: (plan.optimizer.betas.0 as f32, plan.optimizer.betas.1 as f32),
        eps: plan.optimizer.eps as f32,
        weight_decay: plan.optimizer.weight_decay as f32,
        bias_correction: plan.optimizer.bias_correction,
    };
    let mask = decay_mask(&model, &plan.optimizer.no_decay);
    let (mut state, mut pos) = match &options.resume {
        Some(dir) => {
            let (state, pos) = resume::read_training_state(dir, model.params.data.len())?;
            (state, pos)
        }
        None => (
            AdamState::new(model.params.data.len()),
            Position {
                step: 0,
                epoch: 0,
                batch: 0,
            },
        ),
    };

    let metrics_path = out.join("metrics.jsonl");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .map_err(io(&metrics_path))?;
    let mut record = |v: serde_json::Value| -> Result<(), RunError> {
        writeln!(log, "{v}").map_err(io(&metrics_path))
    };
    if pos.step == 0 {
        record(serde_json::json!({
            "event": "start",
            "plan": plan.name,
            "train_rows": train.len(),
            "params": model.params.data.len(),
            "predicted": plan.steps,
        }))?;
    } else {
        record(serde_json::json!({ "event": "resume", "from": options.resume, "step": pos.step }))?;
    }

    let total = plan.steps.total;
    let g = plan.batch.accumulate.max(1) as usize;
    let micro = plan.batch.micro as usize;
    let (world, rank) = (plan.batch.world as usize, 0usize);
    let bar = options.progress.then(|| crate::progress::bar(total, pos.step));
    let mut grads = vec![0.0f32; model.params.data.len()];
    let mut ws = Workspace::default();
    let mut last_loss = None;
    let mut last_eval = None;
    let mut window_losses: Vec<f32> = Vec::new();
    let started = Instant::now();
    let mut trained_samples = 0u64;
    let mut stopped = false;

    'epochs: while pos.step < total {
        let order = data::epoch_order(train.len(), plan.data.shuffle, plan.train.seed, pos.epoch);
        let batches = data::rank_batches(&order, micro, world, rank, plan.data.drop_last);
        if batches.len() as u64 != plan.steps.batches_per_epoch {
            return Err(RunError::Mismatch(format!(
                "epoch {}: {} micro-batches on rank {rank}, but the plan predicted {} (a step-accounting bug; please report it)",
                pos.epoch + 1,
                batches.len(),
                plan.steps.batches_per_epoch
            )));
        }
        let mut steps_this_epoch = pos.batch.div_ceil(g as u64);
        let mut start = pos.batch as usize;
        while start < batches.len() {
            let window = &batches[start..(start + g).min(batches.len())];
            grads.iter_mut().for_each(|x| *x = 0.0);
            window_losses.clear();
            let weight = 1.0 / window.len() as f32;
            for (i, idx) in window.iter().enumerate() {
                let batch = train.batch(idx);
                let key = crate::model::DropoutKey {
                    seed: plan.train.seed,
                    step: pos.step,
                    micro: i as u64,
                };
                let loss = model.forward_backward(&mut ws, &batch, weight, &mut grads, Some(key));
                trained_samples += batch.batch as u64;
                window_losses.push(loss);
            }
            let loss = window_losses.iter().sum::<f32>() / window_losses.len() as f32;
            if !loss.is_finite() {
                return Err(RunError::Diverged {
                    step: pos.step + 1,
                    loss,
                });
            }
            let norm = if plan.train.clip > 0.0 {
                optim::clip_grad_norm(&mut grads, plan.train.clip as f32)
            } else {
                optim::grad_norm(&grads)
            };
            pos.step += 1;
            let lr = plan.schedule.lr(pos.step);
            optim::adam_step(
                &adam,
                &mut state,
                &mut model.params,
                &grads,
                &mask,
                lr as f32,
            );
            start += window.len();
            pos.batch = start as u64;
            steps_this_epoch += 1;
            last_loss = Some(loss);
            let rate = trained_samples as f64 / started.elapsed().as_secs_f64().max(1e-9);
            if let Some(b) = &bar {
                b.set_position(pos.step);
                b.set_message(format!("loss {loss:.4}  lr {lr:.3e}  {rate:.1} samples/s"));
            }
            if pos.step % plan.train.logging_steps == 0 || pos.step == total {
                record(serde_json::json!({
                    "step": pos.step,
                    "epoch": pos.epoch + 1,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": norm,
                    "samples_per_s": rate,
                }))?;
            }
            let epoch_done = start >= batches.len();
            if epoch_done {
                if steps_this_epoch != plan.steps.per_epoch {
                    return Err(RunError::Mismatch(format!(
                        "epoch {}: {steps_this_epoch} optimizer steps, but the plan predicted {} (a step-accounting bug; please report it)",
                        pos.epoch + 1,
                        plan.steps.per_epoch
                    )));
                }
                pos.epoch += 1;
                pos.batch = 0;
            }
            let due = |every: Every| match every {
                Every::Epoch => epoch_done,
                Every::Steps(n) => pos.step % n == 0,
                Every::Never => false,
            };
            if let Some(ev) = &eval {
                if due(plan.train.eval_every) || (pos.step == total && plan.train.eval_every != Every::Never) {
                    let report = metrics::evaluate(&model, ev, plan.batch.eval_micro as usize);
                    record(serde_json::json!({ "step": pos.step, "eval": report }))?;
                    if let Some(b) = &bar {
                        b.println(format!("step {}: eval {report}", pos.step));
                    }
                    last_eval = Some(report);
                }
            }
            let stop_here = options.stop_after == Some(pos.step) && pos.step < total;
            if (due(plan.train.save_every) && pos.step < total) || stop_here {
                let dir = out.join(format!("checkpoint-{}", pos.step));
                resume::save(&dir, &model, &plan.model.labels, &plan.model.tokenizer, &state, pos)?;
                record(serde_json::json!({ "step": pos.step, "checkpoint": dir }))?;
            }
            if stop_here {
                stopped = true;
                break 'epochs;
            }
            if pos.step == total {
                break 'epochs;
            }
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }

    let mut summary = Summary {
        steps: pos.step,
        predicted_steps: total,
        stopped,
        last_loss,
        eval: last_eval,
        test: None,
        samples_per_s: trained_samples as f64 / started.elapsed().as_secs_f64().max(1e-9),
        saved: None,
        metrics: metrics_path.clone(),
    };
    if stopped {
        summary.saved = Some(out.join(format!("checkpoint-{}", pos.step)));
        return Ok(summary);
    }
    if pos.step != total {
        return Err(RunError::Mismatch(format!(
            "the run took {} optimizer steps, but the plan predicted {total}",
            pos.step
        )));
    }
    if let Some(t) = &test {
        let report = metrics::evaluate(&model, t, plan.batch.eval_micro as usize);
        record(serde_json::json!({ "step": pos.step, "test": report }))?;
        summary.test = Some(report);
    }
    let final_dir = out.join("model");
    resume::save_model(&final_dir, &model, &plan.model.labels, &plan.model.tokenizer)?;
    record(serde_json::json!({
        "event": "end",
        "steps": { "taken": pos.step, "predicted": total },
        "model": final_dir,
    }))?;
    summary.saved = Some(final_dir);
    Ok(summary)
}
