//! The training loop: epochs of sharded micro-batches, accumulation windows, clipping, the
//! optimizer step at the plan's learning rate, evaluation, metrics, checkpoints and resume.
//!
//! The loop is written for `world` data-parallel ranks (each rank's batches come from the
//! accelerate-style sharding in [`crate::data`]). The ranks are threads of this process that
//! talk through a [`LocalCollective`], or, for a run over several nodes, this node's share of
//! them, talking through node 0's hub ([`crate::collective::net`]).

use std::fmt;
use std::io::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backend::device::DeviceMemory;
use crate::backend::Cpu;
use crate::collective::net::{self, Expect, Hub, Join, NetError};
use crate::collective::{Collective, CollectiveError, LocalCollective};
use crate::data::{self, Dataset, LabelSet, TextTokenizer, TokenBatch};
use crate::flops::{self, Peak};
use crate::greedy::Greedy;
use crate::metrics::{self, EvalReport};
use crate::model::{Batch, BertConfig, Classifier, DropoutKey, ModelError, Workspace};
use crate::optim::{
    self, Adagrad, AdagradConfig, AdagradImpl, Adam, AdamConfig, Lamb, LambConfig, OptimError,
    Optimizer, Sgd, SgdConfig, WeightDecay,
};
use crate::plan::{
    DataPlan, Every, ModelSource, Offload, OptimizerKind, Plan, Precision, SchedulePlan,
};
use crate::plateau::{OnMetric, Plateau};
use crate::precision::{AtMinimum, LossScaler, ScaleConfig, ScalerImpl};
use crate::resume;
use crate::windows::{self, Shape};
pub use crate::zero::RankMemory;
use crate::zero::{Replica, Shard, Storage, ZeroError};

/// How to run a plan.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Continue from this checkpoint directory.
    pub resume: Option<PathBuf>,
    /// Stop after this many optimizer steps (a checkpoint is written there).
    pub stop_after: Option<u64>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Print nothing but errors (metrics still go to the metrics file).
    pub quiet: bool,
    /// Where each rank's passes run instead of the CPU backend: one executor (a GPU) per rank
    /// of the plan, rank r on `executors[r]`; empty, every rank on the CPU. One rank keeps its
    /// model states on its device, and so does each of several at ZeRO-0; under ZeRO 1–3
    /// several keep theirs on the host. Several talk through host memory (docs/cuda.md,
    /// "Several GPUs").
    pub executors: Vec<std::sync::Arc<dyn crate::model::Executor>>,
    /// This process's place in a run over several nodes (the plan's `batch.nodes`); `None`
    /// runs every rank of the plan in this process.
    pub node: Option<NodeOptions>,
    /// One device's dense peak in TFLOP/s (`RECIPE_PEAK_TFLOPS`), for the MFU the run reports
    /// where the device's own is not known ([`crate::flops`]).
    pub peak_tflops: Option<f64>,
}

/// One node of a run over several: which one, where node 0 listens, and how its ranks
/// exchange.
#[derive(Clone, Default)]
pub struct NodeOptions {
    /// This node, `0..nodes`; it runs ranks `rank·g .. (rank+1)·g` of the plan's `world`, with
    /// `g = world / nodes`. Node 0 runs rank 0, which logs, evaluates and saves.
    pub rank: usize,
    /// Node 0's `host:port`, as every node reaches it; node 0 listens on that port.
    pub master: String,
    /// How the ranks exchange (`cpu`, `gpu`, `gpu+nccl`); every node must say the same. Empty:
    /// `cpu` without executors, else `gpu`.
    pub mode: String,
    /// Node 0: what every rank receives once the run has gathered (an NCCL unique id).
    pub blob: Vec<u8>,
    /// Once gathered, this node's executors made from node 0's blob (GPUs whose NCCL
    /// communicators span the nodes), replacing [`RunOptions::executors`].
    pub connect: Option<Connect>,
}

/// See [`NodeOptions::connect`].
pub type Connect = std::sync::Arc<
    dyn Fn(&[u8]) -> Result<Vec<std::sync::Arc<dyn crate::model::Executor>>, String> + Send + Sync,
>;

impl fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeOptions")
            .field("rank", &self.rank)
            .field("master", &self.master)
            .field("mode", &self.mode)
            .field("blob", &self.blob.len())
            .field("connect", &self.connect.is_some())
            .finish()
    }
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
    /// The model cannot be loaded, run or saved.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The optimizer refused its inputs or state.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// A collective between ranks failed (another rank's error, a mismatch, a timeout).
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// The nodes of a run could not gather.
    #[error(transparent)]
    Net(#[from] NetError),
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
    /// fp16 gradients overflowed at the minimum loss scale (DeepSpeed ends the run there too).
    #[error("optimizer step {step}: {source} (lower train.min_loss_scale, lower optimizer.lr, or train in bf16)")]
    LossScale {
        /// The step.
        step: u64,
        /// The scaler's refusal.
        source: AtMinimum,
    },
}

impl From<ZeroError> for RunError {
    fn from(e: ZeroError) -> Self {
        match e {
            ZeroError::Collective(e) => RunError::Collective(e),
            ZeroError::Model(e) => RunError::Model(e),
            ZeroError::Optim(e) => RunError::Optim(e),
        }
    }
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
    /// Steps skipped because fp16 gradients overflowed (the weights and the LR schedule held).
    pub skipped: u64,
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
    /// Model FLOPs utilization of those examples against the devices' dense peak
    /// ([`crate::flops`]), where the peak is known.
    pub mfu: Option<f64>,
    /// Where the final model (or the stop checkpoint) is.
    pub saved: Option<PathBuf>,
    /// The metrics file.
    pub metrics: PathBuf,
    /// What each rank held for the model states, by rank.
    pub memory: Vec<RankMemory>,
    /// The first rank's GPU memory after training (its driver's figures), on a GPU.
    pub device_memory: Option<DeviceMemory>,
    /// The pictures written beside the metrics file (crate::plot).
    pub pictures: Vec<PathBuf>,
    /// Why they could not be drawn, if so.
    pub picture_error: Option<String>,
    /// The training loss of every logged step as a one-line sparkline.
    pub loss_line: String,
    /// A run over several nodes: this one's place (rank 0's node reports the run).
    pub node: Option<NodeSummary>,
}

/// What one node of several ran.
#[derive(Debug, Clone, Serialize)]
pub struct NodeSummary {
    /// This node.
    pub node: usize,
    /// Nodes in the run.
    pub nodes: usize,
    /// Its ranks.
    pub ranks: Range<usize>,
    /// Ranks in the run.
    pub world: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.node.as_ref().filter(|n| n.node > 0) {
            // Rank 0's node has the metrics, the evaluations and the saved model.
            return write!(
                f,
                "node {} of {}: ranks {}–{} of {} {} {} optimizer steps (predicted {}), {:.1} samples/s; node 0 logs, evaluates and saves",
                n.node,
                n.nodes,
                n.ranks.start,
                n.ranks.end.saturating_sub(1),
                n.world,
                if self.stopped { "stopped after" } else { "trained" },
                self.steps,
                self.predicted_steps,
                self.samples_per_s
            );
        }
        if self.stopped {
            write!(f, "stopped after optimizer step {}", self.steps)?;
        } else {
            write!(
                f,
                "trained {} optimizer steps (predicted {})",
                self.steps, self.predicted_steps
            )?;
        }
        if self.skipped > 0 {
            write!(f, ", {} skipped on fp16 overflow", self.skipped)?;
        }
        if let Some(l) = self.last_loss {
            write!(f, ", last loss {l:.4}")?;
        }
        write!(f, ", {:.1} samples/s", self.samples_per_s)?;
        if let Some(m) = self.mfu {
            write!(f, " (MFU {:.1} %)", 100.0 * m)?;
        }
        writeln!(f)?;
        if let Some(e) = &self.eval {
            writeln!(f, "eval: {e}")?;
        }
        if let Some(e) = &self.test {
            writeln!(f, "test: {e}")?;
        }
        if let Some(m) = self.memory.first() {
            let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
            write!(
                f,
                "model states per rank (rank 0 of {}): params {:.1} MiB, grads {:.1} MiB, optimizer {:.1} MiB",
                self.node.as_ref().map_or(self.memory.len(), |n| n.world),
                mib(m.params),
                mib(m.grads),
                mib(m.optimizer),
            )?;
            if m.master > 0 {
                write!(f, ", fp32 master weights {:.1} MiB", mib(m.master))?;
            }
            if m.offloaded {
                write!(
                    f,
                    " in host memory with {:.1} MiB of master weights and gradient copy",
                    mib(m.host_copies)
                )?;
            }
            if m.working > 0 {
                write!(f, ", one segment at a time {:.1} MiB", mib(m.working))?;
            }
            writeln!(
                f,
                ", total {:.1} MiB ({:.1} MiB on the device)",
                mib(m.total()),
                mib(m.device())
            )?;
            if let Some(d) = &self.device_memory {
                let size = |b: u64| match b as f64 / (1024.0 * 1024.0) {
                    m if m >= 1024.0 => format!("{:.2} GiB", m / 1024.0),
                    m => format!("{m:.1} MiB"),
                };
                writeln!(
                    f,
                    "GPU memory (rank 0's): {} taken by this run, {} of {} free",
                    size(d.taken),
                    size(d.free),
                    size(d.total)
                )?;
            }
            if self.memory.len() > 1 {
                let totals: Vec<String> = self
                    .memory
                    .iter()
                    .map(|m| format!("{:.1}", mib(m.total())))
                    .collect();
                match &self.node {
                    Some(n) => writeln!(
                        f,
                        "model states by rank on this node ({}–{}): {} MiB",
                        n.ranks.start,
                        n.ranks.end.saturating_sub(1),
                        totals.join(", ")
                    )?,
                    None => writeln!(f, "model states by rank: {} MiB", totals.join(", "))?,
                }
            }
        }
        if let Some(p) = &self.saved {
            writeln!(f, "saved {}", p.display())?;
        }
        write!(f, "metrics {}", self.metrics.display())?;
        let names: Vec<String> = self
            .pictures
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
            .collect();
        if !names.is_empty() {
            write!(f, " (pictures: {})", names.join(", "))?;
        }
        if let Some(e) = &self.picture_error {
            write!(f, "\nno pictures: {e}")?;
        }
        if !self.loss_line.is_empty() {
            write!(f, "\nloss {}", self.loss_line)?;
        }
        Ok(())
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
        format: data.format,
        text: data.text.clone(),
        text_pair: data.text_pair.clone(),
        label: data.label.clone(),
    }
}

/// Refuses what this runtime does not do yet, plainly.
fn supported(plan: &Plan) -> Result<(), RunError> {
    match (plan.train.offload_optimizer, plan.train.offload_param) {
        (Offload::Nvme, _) if plan.train.zero_stage >= 1 => {
            return Err(RunError::NotBuilt(
                "offloading the optimizer to NVMe (`offload optimizer = cpu` runs)".into(),
            ))
        }
        // DeepSpeed reads `offload_param` at ZeRO-3 only.
        (_, Offload::Cpu | Offload::Nvme) if plan.train.zero_stage >= 3 => {
            return Err(RunError::NotBuilt(
                "offloading parameters (`offload param`; ZeRO-3 partitions them: drop the offload)"
                    .into(),
            ))
        }
        _ => {}
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
/// Refuses, before anything is allocated, a model whose weights (and, training on the CPU, their
/// gradients: `grads_on_host`) alone exceed the memory this machine has available
/// ([`crate::host_memory`]): the allocations would succeed and the kernel then kill the run, or
/// swap it to a crawl, minutes in. The optimizer's states and the activations come on top, so
/// this is a floor, not an estimate (`recipe explain` has those). Each of the `ranks` this
/// process runs holds a copy (a rank is a thread with its own replica, docs/runtime.md), so
/// `--gpus 100000` on the CPU is refused here, not killed by the kernel. A config that cannot be
/// read here is left to the loader to report.
fn fits_in_memory(
    plan: &Plan,
    resume: Option<&Path>,
    grads_on_host: bool,
    ranks: usize,
) -> Result<(), RunError> {
    let config = match (resume, &plan.model.source) {
        (Some(dir), _) => dir.join("config.json"),
        (None, ModelSource::Pretrained { dir }) => dir.join("config.json"),
        (None, ModelSource::Config { config }) => config.clone(),
    };
    let Some(config) = std::fs::read_to_string(&config)
        .ok()
        .and_then(|text| BertConfig::from_json(&text).ok())
    else {
        return Ok(());
    };
    let Some(n) = Classifier::param_count(&config, plan.model.labels.len()) else {
        return Err(ModelError::Memory("the model's parameter count overflows".into()).into());
    };
    let (copies, what) = if grads_on_host {
        (2, "its f32 weights and gradients")
    } else {
        (1, "its f32 weights")
    };
    let need = (n as u64)
        .saturating_mul(4 * copies)
        .saturating_mul(ranks.max(1) as u64);
    let (what, advice) = if ranks > 1 {
        (
            format!(
                "each of the {ranks} ranks this process runs holds a copy, and {} for all of them",
                what.replacen("its", "the", 1)
            ),
            "run fewer ranks (--gpus), spread them over nodes (--nodes), or choose a smaller model",
        )
    } else {
        (
            what.to_string(),
            "train it on GPUs (--device cuda, with `zero 3` or an offload to partition it) or choose a smaller model",
        )
    };
    match crate::host_memory::available() {
        Some(free) if need > free => Err(ModelError::Memory(format!(
            "the model has {n} parameters: {what} alone take {:.1} GiB, more than the {:.1} GiB this machine has available (MemAvailable in /proc/meminfo); {advice}",
            crate::host_memory::gib(need),
            crate::host_memory::gib(free)
        ))
        .into()),
        _ => Ok(()),
    }
}

/// A device run's largest tensor, for the longest micro-batch (training or evaluation), must
/// have fewer than 2³¹ elements: the CUDA kernels index with 32-bit ints.
fn fits_int_indices(plan: &Plan, model: &Classifier) -> Result<(), RunError> {
    let batch = plan.batch.micro.max(plan.batch.eval_micro) as usize;
    let shards = if plan.train.zero_stage >= 3 {
        plan.batch.world.max(1) as usize
    } else {
        1
    };
    let (name, shape, n) = Classifier::largest_device_tensor(
        model.config(),
        plan.model.labels.len(),
        batch,
        plan.data.max_len,
        shards,
    );
    let advice = if name == "parameters" {
        "partition them over more GPUs with `zero 3`"
    } else {
        "lower batch.micro (or the evaluation's) or data.max_len"
    };
    match n {
        Some(n) if n <= i32::MAX as usize => Ok(()),
        _ => Err(RunError::NotBuilt(format!(
            "a GPU tensor of 2³¹ elements or more (the {name}: {shape} = {}, where the CUDA kernels index with 32-bit ints; {advice})",
            n.map_or_else(|| "more than 2⁶⁴".to_string(), |n| n.to_string())
        ))),
    }
}

fn load_model(plan: &Plan, resume: Option<&Path>) -> Result<Classifier, RunError> {
    let n = plan.model.labels.len();
    let seed = plan.train.seed;
    let mut model = match (resume, &plan.model.source) {
        (Some(dir), _) => Classifier::from_pretrained(dir, n, seed)?,
        (None, ModelSource::Pretrained { dir }) => Classifier::from_pretrained(dir, n, seed)?,
        (None, ModelSource::Config { config }) => {
            let text = std::fs::read_to_string(config).map_err(|e| ModelError::Io {
                path: config.clone(),
                message: e.to_string(),
            })?;
            Classifier::random(BertConfig::from_json(&text)?, n, seed)?
        }
    };
    if let Some(p) = plan.model.dropout {
        model.set_dropout(p)?;
    }
    // DeepSpeed's engine casts the module to fp16 / bf16 (`module.half()` / `.bfloat16()`); the
    // optimizer's fp32 master weights start from those rounded values.
    let dtype = plan.train.precision.module_dtype();
    dtype.round_slice(model.params_mut());
    model.set_backend(Cpu::new(threads()).with_store(dtype));
    Ok(model)
}

/// The gradient a micro-batch's backward starts from at the loss: `scale / n` for a window of
/// `n` micro-batches, as a half-precision module computes it. The loss is a half tensor, so the
/// seed `∂(loss · scale)/∂loss` is `scale` rounded to the module's dtype (in fp16, a scale of 2¹⁶
/// or more is +inf: DeepSpeed's default 2¹⁶ overflows the first steps), and the division by the
/// accumulation steps (DeepSpeed's `scale_wrt_gas`, or HF's own) is a half division too. Checked
/// with torch 2.15: `(x.half() * 65536.0).backward()` and `(x.half().float() * 65536.0)
/// .backward()` both leave `x.grad = inf`.
fn backward_seed(module: crate::precision::Dtype, scale: f64, n: usize) -> f32 {
    if !module.is_half() {
        return (scale / n as f64) as f32;
    }
    let seed = module.round(scale as f32);
    module.round(seed / n as f32)
}

/// How the ranks store their model states under the plan's precision.
fn storage(plan: &Plan) -> Storage {
    let module = plan.train.precision.module_dtype();
    Storage {
        module,
        comm: plan.train.comm_dtype.unwrap_or(module),
    }
}

/// The overflow guard of a rank at ZeRO `stage`: fp16's loss scaler, or for bf16 a fixed scale
/// of 1 that only counts skipped steps (DeepSpeed 0.19.8 skips a bf16 step whose gradients hold
/// an inf or NaN too: `bf16.check_grad_overflow`, default true since 0.19.3, in the ZeRO
/// optimizers; `FP16_Optimizer._skip_invalid_grad_norm` at ZeRO-0). None in fp32.
fn loss_scaler(plan: &Plan, stage: u8) -> Option<LossScaler> {
    let config = match plan.train.precision {
        Precision::Fp32 => return None,
        Precision::Fp16 => plan
            .train
            .loss_scale
            .unwrap_or_else(ScaleConfig::deepspeed_default),
        Precision::Bf16 => ScaleConfig::Static { scale: 1.0 },
    };
    Some(LossScaler::new(config, ScalerImpl::for_stage(stage)))
}

/// Threads for the CPU backend: `RECIPE_THREADS`, else every core. Results do not depend on it
/// (each output element is summed by one thread in a fixed order).
pub fn threads() -> usize {
    std::env::var("RECIPE_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The model's batch from the data pipeline's (the same fields; the crates' modules stay apart).
pub fn model_batch(b: TokenBatch) -> Batch {
    Batch {
        input_ids: b.input_ids,
        token_type_ids: b.token_type_ids,
        attention_mask: b.attention_mask,
        labels: b.labels,
        batch: b.batch,
        seq: b.seq,
    }
}

/// The optimizer of the plan over `shard`'s part of `model`'s parameters, with HF Trainer's decay
/// grouping by name substrings (`optimizer.no_decay`). Which class's arithmetic runs, as
/// DeepSpeed 0.19.8 picks it (`engine.py` `_configure_basic_optimizer`): Adam/AdamW as torch's;
/// SGD is `torch.optim.SGD` with dampening 0 (the recipe cannot set it); Adagrad is
/// `torch.optim.Adagrad` with lr_decay and initial_accumulator_value 0, or DeepSpeedCPUAdagrad
/// under optimizer offload (`zero_use_cpu_optimizer`); LAMB is FusedLamb, whole tensors only.
fn optimizer(plan: &Plan, model: &Classifier, shard: &Shard) -> Result<Optimizer, RunError> {
    let o = &plan.optimizer;
    let entries = &model.params().entries;
    let decay: Vec<bool> = entries
        .iter()
        .map(|e| !o.no_decay.iter().any(|s| e.name.contains(s.as_str())))
        .collect();
    let ranges = &shard.ranges;
    let adam = |mode| AdamConfig {
        beta1: o.betas.0,
        beta2: o.betas.1,
        eps: o.eps,
        weight_decay: o.weight_decay,
        mode,
        bias_correction: o.bias_correction,
    };
    Ok(match o.kind {
        OptimizerKind::AdamW => {
            Adam::shard(adam(WeightDecay::Decoupled), entries, &decay, ranges)?.into()
        }
        OptimizerKind::Adam => Adam::shard(adam(WeightDecay::L2), entries, &decay, ranges)?.into(),
        OptimizerKind::Sgd => {
            let config = SgdConfig::new(o.momentum, o.nesterov, o.weight_decay);
            Sgd::shard(config, entries, &decay, ranges)?.into()
        }
        OptimizerKind::Adagrad => {
            // The same condition as the offload of the run (`run`): stages 1–3 only.
            let offloaded = plan.train.offload_optimizer == Offload::Cpu && shard.stage >= 1;
            let imp = if offloaded {
                AdagradImpl::DeepSpeedCpu
            } else {
                AdagradImpl::Torch
            };
            let config = AdagradConfig::new(o.eps, o.weight_decay, imp);
            Adagrad::shard(config, entries, &decay, ranges)?.into()
        }
        OptimizerKind::Lamb => {
            if shard.stage >= 1 {
                return Err(RunError::NotBuilt(
                    "LAMB under ZeRO stages 1–3 (DeepSpeed's ZeRO optimizer hands FusedLamb each rank's flattened partition, so its trust ratio is one per partition and depends on the world size; the native runtime runs LAMB per tensor at ZeRO stage 0)".into(),
                ));
            }
            if plan.train.precision == Precision::Bf16 {
                return Err(RunError::NotBuilt(
                    "LAMB in bf16 (DeepSpeed's FusedLamb kernel has no bf16 gradient path and stops at the first step)".into(),
                ));
            }
            let (min_coeff, max_coeff) = o
                .trust_clamp
                .unwrap_or((optim::DEFAULT_MIN_COEFF, optim::DEFAULT_MAX_COEFF));
            let config = LambConfig {
                beta1: o.betas.0,
                beta2: o.betas.1,
                eps: o.eps,
                weight_decay: o.weight_decay,
                bias_correction: o.bias_correction,
                max_coeff,
                min_coeff,
            };
            Lamb::shard(config, entries, &decay, ranges)?.into()
        }
    })
}

fn labels(plan: &Plan) -> Result<LabelSet, RunError> {
    Ok(if plan.model.named_labels {
        LabelSet::names(plan.model.labels.iter().cloned())?
    } else {
        LabelSet::count(plan.model.labels.len() as u32)?
    })
}

/// How long a rank waits for the others at a collective ([`crate::collective::timeout`]).
pub fn collective_timeout() -> Duration {
    crate::collective::timeout()
}

/// What every rank reads.
struct Shared<'a> {
    plan: &'a Plan,
    options: &'a RunOptions,
    train: Dataset,
    eval: Option<Dataset>,
    test: Option<Dataset>,
    done: u64,
    /// The metric-driven schedule's state at the start (resumed or fresh).
    on_metric: Option<OnMetric>,
    /// Whether the resumed optimizer state was re-partitioned (another world size or stage).
    repartitioned: bool,
    /// The fp16 loss scaler at the start (resumed or fresh).
    scaler: Option<LossScaler>,
}

/// Runs a plan to the end (or to `stop_after`). The `world` ranks are threads, each holding a
/// [`Replica`] under the plan's ZeRO stage and talking through a [`LocalCollective`] (a single
/// process is a group of one); rank 0 logs, evaluates and saves.
pub fn run(plan: &Plan, options: &RunOptions) -> Result<Summary, RunError> {
    let mut summary = train(plan, options)?;
    if summary.node.as_ref().is_some_and(|n| n.node > 0) {
        // Node 0 draws them, from the metrics rank 0 wrote.
        return Ok(summary);
    }
    // The pictures of the run, from everything its metrics file holds (a resumed run's too).
    // Drawing them cannot undo the training: a failure is reported, not returned.
    let text = std::fs::read_to_string(&summary.metrics).unwrap_or_default();
    let series = crate::plot::RunSeries::parse(&text);
    summary.loss_line =
        crate::plot::sparkline(&series.steps.iter().map(|s| s.1).collect::<Vec<_>>(), 60);
    let dir = summary
        .metrics
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    match crate::plot::write_run_charts(&dir, &series, &plan.name) {
        Ok(written) => summary.pictures = written,
        Err(e) => summary.picture_error = Some(e.to_string()),
    }
    Ok(summary)
}

/// Trains: the data, the model (or the checkpoint), one replica per rank.
fn train(plan: &Plan, options: &RunOptions) -> Result<Summary, RunError> {
    supported(plan)?;
    let labels = labels(plan)?;
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
    let load = |p: &Option<PathBuf>| -> Result<Option<Dataset>, RunError> {
        match p {
            Some(p) => Ok(Some(Dataset::load(
                &spec(&plan.data, p),
                &labels,
                &tokenizer,
            )?)),
            None => Ok(None),
        }
    };
    let eval = load(&plan.data.eval)?;
    let test = load(&plan.data.test)?;

    let out = &plan.train.output_dir;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let local = local_ranks(plan, options.node.as_ref())?;
    fits_in_memory(
        plan,
        options.resume.as_deref(),
        options.executors.is_empty(),
        local.len(),
    )?;
    let mut model = load_model(plan, options.resume.as_deref())?;
    let world = plan.batch.world.max(1) as usize;
    let stage = plan.train.zero_stage.min(3);
    // DeepSpeed reads `offload_optimizer` only under a ZeRO optimizer (stages 1–3; R0601 warns).
    let offload = plan.train.offload_optimizer == Offload::Cpu && stage >= 1;
    let mut done = 0u64;
    let mut on_metric = match plan.schedule {
        SchedulePlan::Plateau { peak, config } => {
            Some(OnMetric::Plateau(Plateau::new(peak, config)))
        }
        SchedulePlan::Greedy { peak, config } => Some(OnMetric::Greedy(Greedy::new(peak, config))),
        _ => None,
    };
    let resumed = options
        .resume
        .as_deref()
        .map(resume::read_training_state)
        .transpose()?;
    let mut scaler = loss_scaler(plan, stage);
    if let Some(state) = &resumed {
        done = state.position.step;
        // The saved scheduler state, as the Trainer loads `scheduler.pt` (its arguments
        // included), when it is the plan's kind.
        if let (Some(now), Some(saved)) = (on_metric.as_mut(), &state.on_metric) {
            if std::mem::discriminant(now) == std::mem::discriminant(saved) {
                now.clone_from(saved);
            }
        }
        let saved = state.precision.unwrap_or(Precision::Fp32);
        if saved != plan.train.precision {
            return Err(RunError::Mismatch(format!(
                "the checkpoint was written by a {saved:?} run and this plan trains in {:?}: resume it with train.precision = {}",
                plan.train.precision,
                format!("{saved:?}").to_lowercase()
            )));
        }
        if let (Some(s), Some(saved)) = (scaler.as_mut(), state.scaler) {
            s.state = saved;
        }
    }
    // A run over several nodes gathers here, before any rank is built: every node has loaded
    // its data and model, and node 0's blob may make this node's devices (NCCL).
    let mut gathered = None;
    let mut connected = None;
    if let Some(node) = options.node.as_ref().filter(|_| local.len() < world) {
        let mode = match node.mode.as_str() {
            "" if options.executors.is_empty() => "cpu",
            "" => "gpu",
            m => m,
        };
        let digest = digest(plan, options, done);
        // Node 0 listens before its own ranks join; the others retry until it does.
        let hub = if node.rank == 0 {
            Some(Hub::start(
                &listen_on(&node.master),
                Expect {
                    world,
                    digest: digest.clone(),
                    mode: mode.into(),
                    blob: node.blob.clone(),
                    join: join_timeout(),
                    op: collective_timeout(),
                },
            )?)
        } else {
            None
        };
        let (colls, blob) = net::join(&Join {
            addr: node.master.clone(),
            ranks: local.clone(),
            world,
            digest,
            mode: mode.into(),
            join: join_timeout(),
            op: collective_timeout(),
        })?;
        if let Some(connect) = &node.connect {
            connected =
                Some(connect(&blob).map_err(|e| {
                    RunError::Mismatch(format!("node {}'s devices: {e}", node.rank))
                })?);
        }
        gathered = Some((colls, hub, node.rank));
    }
    let executors = connected.as_ref().unwrap_or(&options.executors);
    if !executors.is_empty() {
        fits_int_indices(plan, &model)?;
    }
    if !executors.is_empty() && executors.len() != local.len() {
        return Err(RunError::Mismatch(format!(
            "{} device(s) for {} rank(s) in this process: one per rank",
            executors.len(),
            local.len()
        )));
    }
    // Each rank's passes on its device (`Replica::attach_device`), its buffers sized for the
    // longest batches once, before the first step (docs/cuda.md).
    let attach = |model: &mut Classifier, rank: usize| {
        if let Some(x) = executors.get(rank - local.start) {
            model.set_executor(x.clone());
            x.reserve(
                model,
                plan.batch.micro as usize,
                plan.batch.eval_micro as usize,
                plan.data.max_len,
            );
        }
    };
    // Each rank's optimizer over its partition, its state read from the checkpoint: its own
    // file when the layout is unchanged, else assembled from the saved partitions.
    let mut repartitioned = false;
    let mut adams = Vec::with_capacity(local.len());
    for rank in local.clone() {
        let shard = Shard::new(stage, world, rank, model.segments());
        let mut adam = optimizer(plan, &model, &shard)?;
        if let Some(dir) = &options.resume {
            let (state, moved) = resume::read_optimizer(dir, &shard)?;
            adam.load_state(state)?;
            repartitioned |= moved;
        }
        adams.push(adam);
    }
    if let (true, Some(state)) = (repartitioned, &resumed) {
        // DeepSpeed ties a ZeRO checkpoint to its world size; ours re-partitions.
        if !options.quiet {
            eprintln!(
                "resuming a checkpoint of {} rank(s) at ZeRO-{} on {world} rank(s) at ZeRO-{stage}: the optimizer state is re-partitioned",
                state.world.map_or_else(|| "?".into(), |w| w.to_string()),
                state.zero_stage.map_or_else(|| "?".into(), |s| s.to_string()),
            );
        }
    }
    let shared = Shared {
        plan,
        options,
        train,
        eval,
        test,
        done,
        on_metric,
        repartitioned,
        scaler,
    };
    let storage = storage(plan);
    if world == 1 {
        let mut group = LocalCollective::group(1, collective_timeout());
        let mut coll = group.pop().expect("a group of one");
        let adam = adams.pop().expect("one optimizer");
        attach(&mut model, 0);
        let mut replica = Replica::new(model, stage, 1, 0, adam, offload, storage)?;
        replica.set_host_threads(threads());
        // One device: the optimizer's step and the model states stay there when it can
        // (docs/cuda.md).
        replica.attach_device(&mut coll)?;
        return rank_loop(&shared, &mut coll, replica);
    }
    let per_rank = (threads() / local.len()).max(1);
    // Every rank of this process on a thread of its own, with its end of the group.
    let ranks = |colls: Vec<Box<dyn Collective>>| -> Vec<Result<Summary, RunError>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = colls
                .into_iter()
                .zip(adams)
                .map(|(coll, adam)| {
                    let (model, shared, attach) = (&model, &shared, &attach);
                    let rank = coll.rank();
                    // A thread the system will not start (its limit on threads) fails that
                    // rank, whose end of the group is dropped with the closure, so the other
                    // ranks stop at their next collective instead of waiting for it.
                    let h = std::thread::Builder::new().spawn_scoped(s, move || {
                        let mut model = model.clone();
                        model.set_backend(Cpu::new(per_rank).with_store(storage.module));
                        attach(&mut model, rank);
                        let mut coll = coll;
                        let mut replica =
                            Replica::new(model, stage, world, rank, adam, offload, storage)?;
                        replica.set_host_threads(per_rank);
                        replica.attach_device(&mut *coll)?;
                        rank_loop(shared, &mut *coll, replica)
                    });
                    (rank, h)
                })
                .collect();
            let n = handles.len();
            handles
                .into_iter()
                .map(|(rank, h)| {
                    let h = h.map_err(|e| {
                        RunError::Mismatch(format!(
                            "rank {rank}'s thread cannot be started: {e} (this process runs its {n} ranks as threads: spread them over nodes, --nodes N --node-rank K)"
                        ))
                    })?;
                    h.join().unwrap_or_else(|payload| {
                        // The panic's own words (a device out of memory says so), then the plea.
                        let what = payload
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| payload.downcast_ref::<&str>().copied())
                            .unwrap_or("no message");
                        Err(RunError::Mismatch(format!(
                            "rank {rank} panicked: {what} (a bug unless the message says otherwise; please report it)"
                        )))
                    })
                })
                .collect()
        })
    };
    let (results, node) = match gathered {
        Some((colls, hub, node)) => {
            let results = ranks(
                colls
                    .into_iter()
                    .map(|c| Box::new(c) as Box<dyn Collective>)
                    .collect(),
            );
            // Node 0's hub serves until every rank of every node has left.
            if let Some(hub) = hub {
                if !hub.finish_within(collective_timeout()) && !options.quiet {
                    eprintln!("note: a node's ranks did not leave node 0's hub within the collective timeout; not waiting for them");
                }
            }
            let summary = NodeSummary {
                node,
                nodes: plan.batch.nodes as usize,
                ranks: local.clone(),
                world,
            };
            (results, Some(summary))
        }
        None => {
            let colls = LocalCollective::group(world, collective_timeout())
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Collective>)
                .collect();
            (ranks(colls), None)
        }
    };
    // The cause, not its echo: another rank's failure shows up on the rest as a collective error.
    let mut first_collective = None;
    let mut summary: Option<Summary> = None;
    let mut memory = Vec::new();
    for r in results {
        match r {
            Ok(s) => {
                memory.extend(s.memory.iter().copied());
                // This process's first rank reports: rank 0 on node 0.
                summary.get_or_insert(s);
            }
            Err(RunError::Collective(e)) => {
                first_collective.get_or_insert(RunError::Collective(e));
            }
            Err(e) => return Err(e),
        }
    }
    match (first_collective, summary) {
        (Some(e), _) => Err(e),
        (None, Some(mut s)) => {
            s.memory = memory;
            s.node = node;
            Ok(s)
        }
        (None, None) => Err(RunError::Mismatch("no rank returned a summary".into())),
    }
}

/// The ranks this process runs: all of them, or its node's share (docs/runtime.md, "Several
/// nodes"); an error for a node the plan does not have.
pub fn local_ranks(plan: &Plan, node: Option<&NodeOptions>) -> Result<Range<usize>, RunError> {
    let world = plan.batch.world.max(1) as usize;
    let nodes = plan.batch.nodes.max(1) as usize;
    let Some(node) = node else {
        return Ok(0..world);
    };
    if nodes == 1 {
        return Err(RunError::Mismatch(
            "--node-rank for a plan of one node: build it with --nodes N (or cluster.nodes) to spread its ranks over N nodes".into(),
        ));
    }
    if world % nodes != 0 {
        return Err(RunError::Mismatch(format!(
            "{world} rank(s) do not split evenly over {nodes} nodes"
        )));
    }
    if node.rank >= nodes {
        return Err(RunError::Mismatch(format!(
            "--node-rank {} for a plan of {nodes} nodes (0..{nodes})",
            node.rank
        )));
    }
    let g = world / nodes;
    Ok(node.rank * g..(node.rank + 1) * g)
}

/// What every node of a run must agree on, so that a node started with another plan (another
/// recipe build, other `--set` flags), from another checkpoint or to stop elsewhere is refused
/// when it joins rather than training something else. FNV-1a over the plan's JSON: stable
/// across builds and machines, unlike std's hasher.
fn digest(plan: &Plan, options: &RunOptions, done: u64) -> String {
    let json = serde_json::to_string(plan).unwrap_or_default();
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for b in json.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let stop = options
        .stop_after
        .map_or_else(|| "the end".to_string(), |s| format!("step {s}"));
    format!(
        "recipe-runtime {}, plan {} {h:016x}, from step {done} to {stop}",
        env!("CARGO_PKG_VERSION"),
        plan.name
    )
}

/// Where node 0 listens for a master address `host:port`: that port on every interface (the
/// host name may resolve to a loopback address on node 0 itself, as `/etc/hosts` often has it).
fn listen_on(master: &str) -> String {
    let port = master.rsplit(':').next().unwrap_or("0");
    if master.starts_with('[') {
        format!("[::]:{port}")
    } else {
        format!("0.0.0.0:{port}")
    }
}

/// How long the nodes of a run may take to all join: `RECIPE_JOIN_TIMEOUT` seconds, else 300.
pub fn join_timeout() -> Duration {
    let secs = std::env::var("RECIPE_JOIN_TIMEOUT")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// One rank's loop.
fn rank_loop(
    shared: &Shared<'_>,
    coll: &mut dyn Collective,
    mut rep: Replica,
) -> Result<Summary, RunError> {
    let Shared {
        plan,
        options,
        train,
        eval,
        test,
        done,
        on_metric,
        repartitioned,
        scaler,
    } = shared;
    let mut on_metric = on_metric.clone();
    let mut scaler = *scaler;
    let mixed = rep.storage().is_mixed();
    let fp16 = plan.train.precision == Precision::Fp16;
    let (plan, options, done) = (*plan, *options, *done);
    let (rank, world) = (coll.rank(), coll.world());
    let lead = rank == 0;
    let memory = rep.memory();
    let stage = rep.shard().stage;
    let out = &plan.train.output_dir;
    let device = rep.model_executor().unwrap_or_else(|| "cpu".into());
    // The peak each rank's device could reach, for the MFU the run reports: the one the
    // environment gives, else the GPU's own (flops.rs).
    let peak = options
        .peak_tflops
        .map(|tflops| Peak {
            tflops,
            from: flops::PEAK_ENV.into(),
        })
        .or_else(|| flops::device_peak(&device, plan.train.precision));
    let (params, config) = (rep.shard().total as u64, rep.model().config());
    let (layers, hidden) = (config.num_hidden_layers, config.hidden_size);
    let metrics_path = out.join("metrics.jsonl");
    let mut log = if lead {
        Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)
                .map_err(io(&metrics_path))?,
        )
    } else {
        None
    };
    let mut record = |v: serde_json::Value| -> Result<(), RunError> {
        match log.as_mut() {
            Some(f) => writeln!(f, "{v}").map_err(io(&metrics_path)),
            None => Ok(()),
        }
    };
    let with_peak = |mut rec: serde_json::Value| {
        if let Some(p) = &peak {
            rec["peak_tflops"] = serde_json::json!(p.tflops);
            rec["peak_from"] = serde_json::json!(p.from);
        }
        rec
    };
    if done == 0 {
        record(with_peak(serde_json::json!({
            "event": "start",
            "plan": plan.name,
            "train_rows": train.len(),
            "parameters": rep.shard().total,
            "world": world,
            "zero_stage": stage,
            "offload_optimizer": memory.offloaded,
            "threads": threads(),
            "device": device,
            // What runs where: the passes (`device`), the model states and the optimizer step
            // (on the host under `offload_optimizer`).
            "model_on_device": rep.on_device(),
            "optimizer_on_device": rep.optimizer_on_device(),
            "exchange_on_device": rep.exchanges_on_device(),
            "predicted": plan.steps,
            "memory_rank0": memory,
            "precision": plan.train.precision,
            "loss_scaler": scaler.filter(|_| fp16).map(|s| s.config),
        })))?;
    } else {
        // The device too: a checkpoint may be resumed on another one (docs/cuda.md).
        record(with_peak(serde_json::json!({
            "event": "resume", "from": options.resume, "step": done, "world": world,
            "zero_stage": stage, "repartitioned": repartitioned,
            "device": device,
        })))?;
    }

    let total = plan.steps.total;
    let g = plan.batch.accumulate.max(1);
    let shape = Shape {
        rows: train.len(),
        micro: plan.batch.micro as usize,
        accumulate: g as usize,
        world,
        drop_last: plan.data.drop_last,
        shuffle: plan.data.shuffle,
        seed: plan.train.seed,
        total,
    };
    let work = windows::windows(shape, rank, done)?;
    let bar = (lead && options.progress).then(|| crate::progress::bar(total, done));
    let mut ws = Workspace::new();
    let mut last_loss = None;
    let mut last_eval = None;
    let started = Instant::now();
    let mut trained_samples = 0u64;
    // llm.c's FLOP count of those samples (every rank's micro-batch counted as this rank's).
    let mut trained_flops = 0.0f64;
    let mut step = done;
    let mut stopped = false;

    for w in &work {
        if w.epoch_batches != plan.steps.batches_per_epoch {
            return Err(RunError::Mismatch(format!(
                "epoch {}: {} micro-batches on rank {rank}, but the plan predicted {} (a step-accounting bug; please report it)",
                w.epoch + 1,
                w.epoch_batches,
                plan.steps.batches_per_epoch
            )));
        }
        rep.start_window()?;
        // fp16: the loss is multiplied by the scale before the backward, so every gradient is
        // computed at that scale.
        let scale = scaler.map_or(1.0, |s| s.scale());
        // Steps skipped before this one: DeepSpeed's scheduler (and Adam's step count) only
        // advance on applied steps, so this step runs at the schedule's step `w.step - skipped`.
        let skipped_before = scaler.map_or(0, |s| s.skipped());
        let applied = w.step - skipped_before;
        // A short last window is averaged over its real size.
        let grad_weight = backward_seed(rep.storage().module, scale, w.batches.len());
        let mut losses = Vec::with_capacity(w.batches.len());
        for (i, idx) in w.batches.iter().enumerate() {
            let batch = model_batch(train.batch(idx));
            if i + 1 == w.batches.len() {
                rep.last_micro();
            }
            let key = DropoutKey {
                seed: plan.train.seed,
                micro_batch: ((w.step - 1) * g + i as u64) * world as u64 + rank as u64,
            };
            losses.push(rep.micro(&mut *coll, &mut ws, &batch, grad_weight, Some(key))?);
            trained_samples += (batch.batch * world) as u64;
            trained_flops +=
                flops::train_flops(params, layers, hidden, batch.batch * world, batch.seq);
        }
        // A device keeps its micro-batches' losses until the window ends: one copy for all.
        let mut kept = rep.window_losses()?.into_iter();
        let mut loss = 0.0f32;
        for l in losses {
            loss +=
                match l.or_else(|| kept.next()) {
                    Some(l) => l,
                    None => return Err(RunError::Mismatch(
                        "a micro-batch's loss did not come back from the device (please report it)"
                            .into(),
                    )),
                };
        }
        loss /= w.batches.len() as f32;
        // Every rank ends with the same averaged gradient (or its partition of it).
        rep.finish_window(&mut *coll)?;
        if world > 1 {
            loss = (coll.all_reduce_sum_f64(f64::from(loss))? / world as f64) as f32;
        }
        // Mixed precision: an inf or NaN in any rank's gradients skips the step (weights,
        // optimizer state and LR schedule held) and, in fp16, lowers the scale (DeepSpeed's
        // `has_overflow` reduced over the ranks, then `_take_model_step` skipping
        // `lr_scheduler.step()`).
        let overflow = scaler.is_some() && rep.overflow(&mut *coll)?;
        if !overflow && !loss.is_finite() {
            return Err(RunError::Diverged { step: w.step, loss });
        }
        let lr = on_metric
            .as_ref()
            .map_or_else(|| plan.schedule.lr(applied), OnMetric::lr);
        // DeepSpeed updates the scale before it unscales the gradients (see
        // `Replica::unscale`).
        if let Some(s) = scaler.as_mut() {
            s.update(overflow).map_err(|source| RunError::LossScale {
                step: w.step,
                source,
            })?;
        }
        let norm = if overflow {
            f32::INFINITY
        } else {
            let (norm, unscale) = if mixed {
                let now = scaler.map_or(1.0, |s| s.scale());
                rep.unscale(&mut *coll, plan.train.clip, scale, now)?
            } else {
                (rep.clip(&mut *coll, plan.train.clip)?, 1.0)
            };
            if let Some((b1, b2)) = plan.schedule.betas(applied) {
                rep.set_betas(b1, b2)?;
            }
            rep.step(&mut *coll, lr, unscale)?;
            norm
        };
        step = w.step;
        last_loss = Some(loss);
        let seconds = started.elapsed().as_secs_f64();
        let rate = trained_samples as f64 / seconds.max(1e-9);
        let mfu = peak
            .as_ref()
            .map(|p| flops::mfu(trained_flops, seconds, world, p));
        if let Some(b) = &bar {
            b.set_position(step);
            let mfu = mfu.map_or(String::new(), |m| format!("  MFU {:.1} %", 100.0 * m));
            b.set_message(format!(
                "loss {loss:.4}  lr {lr:.3e}  {rate:.1} samples/s{mfu}"
            ));
        }
        // fp16 runs log every step (each one's loss scale and whether it was skipped); bf16
        // logs a skipped step off the cadence too.
        if step % plan.train.logging_steps == 0 || step == total || fp16 || overflow {
            let mut rec = serde_json::json!({
                "step": step,
                "epoch": w.epoch + 1,
                "loss": loss,
                "lr": lr,
                "grad_norm": if norm.is_finite() { serde_json::json!(norm) } else { serde_json::Value::Null },
                "samples_per_s": rate,
            });
            if let Some(m) = mfu {
                rec["mfu"] = serde_json::json!(m);
            }
            if fp16 {
                rec["loss_scale"] = serde_json::json!(scale);
            }
            if scaler.is_some() {
                rec["skipped"] = serde_json::json!(overflow);
            }
            record(rec)?;
        }
        if w.ends_epoch {
            let steps_in_epoch = step - w.epoch * plan.steps.per_epoch;
            if steps_in_epoch != plan.steps.per_epoch {
                return Err(RunError::Mismatch(format!(
                    "epoch {}: {steps_in_epoch} optimizer steps, but the plan predicted {} (a step-accounting bug; please report it)",
                    w.epoch + 1,
                    plan.steps.per_epoch
                )));
            }
        }
        let due = |every: Every| match every {
            Every::Epoch => w.ends_epoch,
            Every::Steps(n) => step % n == 0,
            Every::Never => false,
        };
        let at_end = step == total && plan.train.eval_every != Every::Never;
        let eval_now = eval.is_some() && (due(plan.train.eval_every) || at_end);
        let stop_here = options.stop_after == Some(step) && step < total;
        let save = (due(plan.train.save_every) && step < total) || stop_here;
        if eval_now || save {
            // ZeRO-3: every rank takes part in gathering the whole model.
            rep.gather_whole(&mut *coll)?;
        }
        // Every rank evaluates under a metric-driven schedule (the replicas are identical, so
        // each reaches the same LR without a broadcast); otherwise rank 0 alone.
        if let Some(ev) = eval
            .as_ref()
            .filter(|_| eval_now && (lead || on_metric.is_some()))
        {
            let report = metrics::evaluate(rep.model(), ev, plan.batch.eval_micro as usize)?;
            if let Some(m) = on_metric.as_mut() {
                m.observe(report.loss);
            }
            record(serde_json::json!({ "step": step, "eval": report }))?;
            match &bar {
                Some(b) => b.println(format!("step {step}: eval {report}")),
                None if lead && !options.quiet => eprintln!("step {step}: eval {report}"),
                None => {}
            }
            last_eval = Some(report);
        }
        if save {
            let dir = out.join(format!("checkpoint-{step}"));
            let progress = resume::Progress {
                position: Position {
                    step,
                    epoch: w.epoch,
                    batch: w.first_batch + w.batches.len() as u64,
                },
                on_metric: on_metric.clone(),
                world: world as u64,
                zero_stage: stage,
                precision: plan.train.precision,
                scaler: scaler.map(|s| s.state),
            };
            save_checkpoint(coll, &rep, plan, &dir, progress)?;
            record(serde_json::json!({ "step": step, "checkpoint": dir }))?;
        }
        rep.release_whole();
        if stop_here {
            stopped = true;
            break;
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }

    let skipped = scaler.map_or(0, |s| s.skipped());
    let seconds = started.elapsed().as_secs_f64();
    let mut summary = Summary {
        steps: step,
        predicted_steps: total,
        skipped,
        stopped,
        last_loss,
        eval: last_eval,
        test: None,
        samples_per_s: trained_samples as f64 / seconds.max(1e-9),
        mfu: peak
            .as_ref()
            .map(|p| flops::mfu(trained_flops, seconds, world, p)),
        saved: None,
        metrics: metrics_path.clone(),
        memory: vec![memory],
        // Every buffer is made before the first step and kept (docs/cuda.md): after the last,
        // what the run took is what it needed.
        device_memory: rep.model().executor().and_then(|x| x.memory()),
        pictures: Vec::new(),
        picture_error: None,
        loss_line: String::new(),
        node: None,
    };
    if stopped {
        summary.saved = Some(out.join(format!("checkpoint-{step}")));
        return Ok(summary);
    }
    if step != total {
        return Err(RunError::Mismatch(format!(
            "the run took {step} optimizer steps, but the plan predicted {total}"
        )));
    }
    rep.gather_whole(&mut *coll)?;
    if !lead {
        return Ok(summary);
    }
    let model = rep.model();
    if let Some(t) = &test {
        let report = metrics::evaluate(model, t, plan.batch.eval_micro as usize)?;
        record(serde_json::json!({ "step": step, "test": report }))?;
        summary.test = Some(report);
    }
    let final_dir = out.join("model");
    resume::save_model(&final_dir, model, &plan.model.labels, &plan.model.tokenizer)?;
    let mut end = serde_json::json!({
        "event": "end",
        "steps": { "taken": step, "predicted": total, "skipped": skipped },
        "model": final_dir,
    });
    if let Some(d) = &summary.device_memory {
        end["device_memory"] = serde_json::json!(d);
    }
    record(end)?;
    summary.saved = Some(final_dir);
    Ok(summary)
}

/// Writes checkpoint `dir` from every rank: rank 0 prepares a staging directory, each rank
/// writes its optimizer partition (ZeRO-1/2/3), rank 0 adds the model (gathered, under ZeRO-3)
/// and the position and renames it into place. A failure on any rank fails every rank (the
/// barriers) and leaves no partial checkpoint.
fn save_checkpoint(
    coll: &mut dyn Collective,
    rep: &Replica,
    plan: &Plan,
    dir: &Path,
    progress: resume::Progress,
) -> Result<(), RunError> {
    let lead = coll.rank() == 0;
    // Rank 0's process names the staging directory; the sum carries its pid to every rank
    // (exact: any u32 is an f64).
    let pid = coll.all_reduce_sum_f64(if lead {
        f64::from(std::process::id())
    } else {
        0.0
    })?;
    let tmp = resume::staging(dir, pid as u32);
    let stage = rep.shard().stage;
    let write = || -> Result<(), RunError> {
        if lead {
            let m = rep.model();
            resume::begin(&tmp, m, &plan.model.labels, &plan.model.tokenizer)?;
        }
        coll.barrier()?;
        // Rank 0 made it before the barrier. On another node a shared filesystem may show it a
        // little later (NFS caches directory attributes for seconds): wait a while for it.
        let seen = |t: &Path| {
            let start = Instant::now();
            while !t.is_dir() {
                if start.elapsed() >= Duration::from_secs(30) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            true
        };
        if !lead && !seen(&tmp) {
            // This rank is on another node and does not see rank 0's files.
            return Err(RunError::Mismatch(format!(
                "rank {} cannot see `{}`, which rank 0 created for the checkpoint: a run over several nodes needs train.output_dir on a filesystem every node shares",
                coll.rank(),
                tmp.display()
            )));
        }
        if stage >= 1 {
            resume::write_shard(&tmp, rep.shard(), &rep.optimizer_state())?;
        }
        coll.barrier()?;
        if lead {
            resume::finish(
                &tmp,
                dir,
                (stage == 0).then(|| rep.optimizer_state()).as_ref(),
                progress,
            )?;
        }
        Ok(())
    };
    let result = write();
    if result.is_err() && lead {
        resume::abandon(&tmp);
    }
    result
}
