//! The plan: everything a native run needs, as plain data (serde JSON). The compiler writes it
//! from a checked recipe (`recipe build --target native` → `plan.json`); the runtime executes
//! it and knows nothing of the language. Paths are absolute, so a plan runs from anywhere.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::accounting::NativeSteps;
use crate::greedy::GreedyConfig;
use crate::lr::{self, DsFlags, DsSchedule, HfSchedule};
use crate::plateau::PlateauConfig;
use crate::precision::{Dtype, ScaleConfig};

/// The plan format this runtime executes.
pub const FORMAT: u32 = 1;

/// A native training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Always [`FORMAT`]; a plan from another format is refused.
    pub format: u32,
    /// The recipe's name (directories and logs).
    pub name: String,
    /// The model and its head.
    pub model: ModelPlan,
    /// Training and evaluation data.
    pub data: DataPlan,
    /// Batch shape and data parallelism.
    pub batch: BatchPlan,
    /// The optimizer.
    pub optimizer: OptimizerPlan,
    /// The learning-rate schedule, per optimizer step.
    pub schedule: SchedulePlan,
    /// Loop settings.
    pub train: TrainPlan,
    /// The step accounting the compiler predicts; the loop asserts its own count against it.
    pub steps: NativeSteps,
}

/// Where the weights come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// An HF-layout directory: `config.json`, `model.safetensors`, `tokenizer.json`.
    Pretrained {
        /// The directory.
        dir: PathBuf,
    },
    /// A `config.json` only: random seeded initialisation (HF's `_init_weights`).
    Config {
        /// The `config.json`.
        config: PathBuf,
    },
}

/// The model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPlan {
    /// The architecture (only `bert` today).
    pub arch: String,
    /// Weights or config.
    pub source: ModelSource,
    /// The `tokenizer.json` to tokenize with.
    pub tokenizer: PathBuf,
    /// Label names in id order (`LABEL_0`, … when the recipe gives a count).
    pub labels: Vec<String>,
    /// Whether the recipe named the labels (a row's label may then be the name).
    pub named_labels: bool,
    /// Override of hidden and attention dropout (0 for exact parity runs).
    pub dropout: Option<f64>,
}

/// File format of a data file: the one format type of the data layer (the compiler writes a
/// concrete one; `auto` would be taken from the extension).
pub use crate::data::Format as DataFormat;

/// The data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPlan {
    /// Training file.
    pub train: PathBuf,
    /// Evaluated at each epoch end.
    pub eval: Option<PathBuf>,
    /// Evaluated once after training.
    pub test: Option<PathBuf>,
    /// Format of all three files.
    pub format: DataFormat,
    /// The text field.
    pub text: String,
    /// A second text field (sentence pairs).
    pub text_pair: Option<String>,
    /// The label field.
    pub label: String,
    /// Tokens per example after truncation.
    pub max_len: usize,
    /// Shuffle the training order each epoch (seeded).
    pub shuffle: bool,
    /// Drop each epoch's last incomplete batch.
    pub drop_last: bool,
    /// Training rows the compiler counted (the loop checks the file still has them).
    pub samples: u64,
}

/// Batch shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPlan {
    /// Examples per rank per forward/backward.
    pub micro: u64,
    /// Micro-batches per optimizer step.
    pub accumulate: u64,
    /// Data-parallel ranks, over every node.
    pub world: u64,
    /// The nodes (processes) the ranks are spread over, `world / nodes` each
    /// (docs/runtime.md, "Several nodes"). Plans written before it existed mean one.
    #[serde(default = "one")]
    pub nodes: u64,
    /// Node 0's `host:port` when the recipe names it (`cluster.master_addr`, `master_port`):
    /// `recipe run --node-rank K` then needs no `--master`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// Examples per evaluation pass.
    pub eval_micro: u64,
}

fn one() -> u64 {
    1
}

/// The optimizer kinds the runtime trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Decoupled weight decay (torch `AdamW`; DeepSpeed `adam_w_mode = true`).
    AdamW,
    /// L2 penalty added to the gradient (torch `Adam`; DeepSpeed `adam_w_mode = false`).
    Adam,
    /// `torch.optim.SGD` (DeepSpeed's `type: "SGD"` and HF's `optim = "sgd"` both build it).
    Sgd,
    /// `torch.optim.Adagrad`; DeepSpeedCPUAdagrad's arithmetic under optimizer offload.
    Adagrad,
    /// DeepSpeed's FusedLamb (ZeRO stage 0 only: see `crate::optim::Lamb`).
    Lamb,
}

/// The optimizer. Fields a kind does not use are ignored (betas and bias correction outside the
/// Adam family and LAMB, eps for SGD, momentum outside SGD, the coefficients outside LAMB).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerPlan {
    /// Which optimizer.
    pub kind: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    /// (β1, β2).
    pub betas: (f64, f64),
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay (decoupled for AdamW; added to the gradient for Adam, SGD and Adagrad; to the
    /// update for LAMB).
    pub weight_decay: f64,
    /// Parameter-name substrings excluded from weight decay.
    pub no_decay: Vec<String>,
    /// Adam and LAMB bias correction.
    pub bias_correction: bool,
    /// SGD momentum (0: none). Absent in plans written before SGD.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub momentum: f64,
    /// SGD Nesterov momentum.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nesterov: bool,
    /// LAMB's trust-ratio bounds `(min_coeff, max_coeff)`; absent means FusedLamb's defaults
    /// (0.01, 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_clamp: Option<(f64, f64)>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// Which formula gives the learning rate of optimizer step `k`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulePlan {
    /// An HF `lr_scheduler_type` (`recipe_runtime::lr::hf_lr`).
    Hf {
        /// The schedule.
        schedule: HfSchedule,
        /// Peak learning rate.
        peak: f64,
        /// Warmup steps.
        warmup: u64,
        /// Total optimizer steps.
        total: u64,
    },
    /// HF's `reduce_lr_on_plateau`: `peak` until evaluations stop improving the evaluation loss
    /// (`crate::plateau::Plateau`, which the loop drives).
    Plateau {
        /// The starting learning rate.
        peak: f64,
        /// torch's arguments (flattened: a plan that names only `factor` and `patience` takes
        /// torch's defaults for the rest).
        #[serde(flatten)]
        config: PlateauConfig,
    },
    /// HF's `greedy` (`GreedyLR`): `peak` until evaluations move it, down on a plateau and up
    /// while the loss improves (`crate::greedy::Greedy`, which the loop drives).
    Greedy {
        /// The starting learning rate.
        peak: f64,
        /// GreedyLR's arguments.
        config: GreedyConfig,
    },
    /// A DeepSpeed scheduler (`recipe_runtime::lr::ds_lr`).
    #[serde(rename = "deepspeed")]
    DeepSpeed {
        /// The schedule.
        schedule: DsSchedule,
        /// The optimizer's learning rate.
        peak: f64,
        /// Formula details of the target DeepSpeed release.
        flags: DsFlags,
    },
}

impl Precision {
    /// The dtype the module (parameters, activations, gradients) is stored in.
    pub fn module_dtype(self) -> Dtype {
        match self {
            Precision::Fp32 => Dtype::F32,
            Precision::Fp16 => Dtype::F16,
            Precision::Bf16 => Dtype::Bf16,
        }
    }
}

impl SchedulePlan {
    /// The learning rate optimizer step `step` (1-based) uses: the same function `recipe
    /// explain` prints.
    pub fn lr(&self, step: u64) -> f64 {
        match self {
            SchedulePlan::Hf {
                schedule,
                peak,
                warmup,
                total,
            } => lr::hf_lr(schedule, *peak, *warmup, *total, step),
            SchedulePlan::DeepSpeed {
                schedule,
                peak,
                flags,
            } => lr::ds_lr(schedule, flags, *peak, step),
            // The loop's metric-driven state decides; before any evaluation this is the LR.
            SchedulePlan::Plateau { peak, .. } | SchedulePlan::Greedy { peak, .. } => *peak,
        }
    }

    /// Adam's (β₁, β₂) for optimizer step `step` when the schedule sets them (DeepSpeed's
    /// `OneCycle` with `cycle_momentum`: `lr::ds_momentum`), else `None`.
    pub fn betas(&self, step: u64) -> Option<(f64, f64)> {
        match self {
            SchedulePlan::DeepSpeed {
                schedule, flags, ..
            } => lr::ds_momentum(schedule, flags, step),
            SchedulePlan::Hf { .. }
            | SchedulePlan::Plateau { .. }
            | SchedulePlan::Greedy { .. } => None,
        }
    }
}

/// Training precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 throughout.
    Fp32,
    /// fp16 mixed precision with loss scaling.
    Fp16,
    /// bf16 mixed precision.
    Bf16,
}

/// When to evaluate or save.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Every {
    /// At each epoch end.
    Epoch,
    /// Every this many optimizer steps.
    Steps(u64),
    /// Never.
    Never,
}

/// Loop settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainPlan {
    /// Passes over the data (fractions allowed).
    pub epochs: f64,
    /// Stop after this many optimizer steps.
    pub max_steps: Option<u64>,
    /// Clip gradients to this global L2 norm (0 = off).
    pub clip: f64,
    /// Training precision.
    pub precision: Precision,
    /// Seed for initialisation, shuffling and dropout.
    pub seed: u64,
    /// Log every this many optimizer steps.
    pub logging_steps: u64,
    /// When to evaluate on the eval file.
    pub eval_every: Every,
    /// When to write a checkpoint.
    pub save_every: Every,
    /// Checkpoints, metrics and the final model.
    pub output_dir: PathBuf,
    /// ZeRO stage, 0–3 (see `crate::zero`).
    pub zero_stage: u8,
    /// Where the optimizer state lives (`zero { offload optimizer = … }`).
    #[serde(default)]
    pub offload_optimizer: Offload,
    /// Where the parameters live between uses (`zero { offload param = … }`).
    #[serde(default)]
    pub offload_param: Offload,
    /// fp16's loss scaling (DeepSpeed's `fp16` section); `None` means DeepSpeed's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<ScaleConfig>,
    /// The dtype gradients are reduced in between ranks (DeepSpeed's
    /// `communication_data_type`); `None` means the module's dtype, DeepSpeed's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_dtype: Option<Dtype>,
}

/// A ZeRO offload target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// Stay with the compute.
    #[default]
    None,
    /// Host memory.
    Cpu,
    /// NVMe storage.
    Nvme,
}

/// A plan that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file cannot be read.
    #[error("cannot read `{path}`: {source}")]
    Io {
        /// The plan file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The JSON does not describe a plan.
    #[error("`{path}` is not a plan: {source}")]
    Json {
        /// The plan file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// Another plan format.
    #[error("`{path}` is plan format {found}; this runtime executes format {FORMAT}: rebuild it with `recipe build --target native`")]
    Format {
        /// The plan file.
        path: PathBuf,
        /// The format found.
        found: u32,
    },
}

impl Plan {
    /// Reads a `plan.json`.
    pub fn read(path: &Path) -> Result<Plan, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| PlanError::Json {
                path: path.to_path_buf(),
                source,
            })?;
        let found = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0) as u32;
        if found != FORMAT {
            return Err(PlanError::Format {
                path: path.to_path_buf(),
                found,
            });
        }
        serde_json::from_value(value).map_err(|source| PlanError::Json {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The plan as pretty JSON (deterministic: struct field order).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a plan always serialises");
        s.push('\n');
        s
    }
}
