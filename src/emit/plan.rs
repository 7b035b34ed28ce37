//! The native plan (`plan.json`): a pure function of the [`Resolved`] recipe and where its model
//! is, which the caller found (that lookup is I/O, so it happens in the CLI).
//!
//! The plan's step accounting is `recipe_runtime::accounting::native` (what `recipe steps`
//! prints as the native runtime's), and its schedule is the same `lr` function `explain` prints,
//! computed for the native step count.

use std::path::PathBuf;

use recipe_runtime::accounting;
use recipe_runtime::plan::{
    BatchPlan, DataFormat, DataPlan, Every, ModelPlan, ModelSource, OptimizerKind, OptimizerPlan,
    Plan, Precision, SchedulePlan, TrainPlan, FORMAT,
};

use crate::resolve::{files, Resolved, Val};
use crate::schedules::{self, Owner};

/// Where the model's files are (found by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFiles {
    /// Weights or config.
    pub source: ModelSource,
    /// The `tokenizer.json`.
    pub tokenizer: PathBuf,
}

/// Why a recipe cannot run natively (yet): one line each, said plainly.
pub type Unsupported = Vec<String>;

fn every(v: Option<&Val>, default: Every) -> Every {
    match v {
        Some(Val::Word(w)) if w == "epoch" => Every::Epoch,
        Some(Val::Word(w)) if w == "never" => Every::Never,
        Some(Val::Int(n)) if *n > 0 => Every::Steps(*n as u64),
        _ => default,
    }
}

/// Label names in id order, and whether the recipe named them.
pub fn labels(r: &Resolved) -> Option<(Vec<String>, bool)> {
    match r.val("model.task")?.arg("labels")? {
        Val::Int(n) if *n > 0 => Some(((0..*n).map(|i| format!("LABEL_{i}")).collect(), false)),
        Val::List(items) => Some((
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()?,
            true,
        )),
        _ => None,
    }
}

/// The plan of a checked recipe whose model files are at `model`.
pub fn plan(r: &Resolved, model: ModelFiles) -> Result<Plan, Unsupported> {
    let mut no = Vec::new();
    let arch = r.word("model.arch").unwrap_or("bert").to_string();
    if arch != "bert" {
        no.push(format!(
            "model {arch}: the native runtime trains BERT encoders only"
        ));
    }
    let (label_names, named_labels) = match labels(r) {
        Some(l) => l,
        None => {
            no.push("model.task: the native runtime trains `classify(labels: …)` only".into());
            (Vec::new(), false)
        }
    };

    let samples = r.uint("data.samples").unwrap_or(0);
    let micro = r.uint("batch.micro").unwrap_or(8);
    let accumulate = r.uint("batch.accumulate").unwrap_or(1);
    let world = r.uint("cluster.world_size").unwrap_or(1);
    let drop_last = r.bool("data.drop_last").unwrap_or(false);
    let epochs = r.f64("train.epochs").unwrap_or(3.0);
    let max_steps = r.uint("train.max_steps");
    if samples == 0 {
        no.push("data.train: no training rows were counted (is the file local?)".into());
    }
    let steps = accounting::native(
        samples, micro, accumulate, world, drop_last, epochs, max_steps,
    );

    let kind = match r.word("optimizer.kind").unwrap_or("adamw") {
        "adamw" => OptimizerKind::AdamW,
        "adam" => OptimizerKind::Adam,
        other => {
            no.push(format!(
                "optimizer {other}: the native runtime has AdamW and Adam so far"
            ));
            OptimizerKind::AdamW
        }
    };
    if r.bool("optimizer.amsgrad") == Some(true) {
        no.push("optimizer.amsgrad: not in the native runtime yet".into());
    }
    let betas = match r.val("optimizer.betas") {
        Some(Val::List(v)) if v.len() == 2 => {
            (v[0].as_f64().unwrap_or(0.9), v[1].as_f64().unwrap_or(0.999))
        }
        _ => (0.9, 0.999),
    };
    let no_decay = match r.val("optimizer.no_decay") {
        Some(Val::List(v)) => v
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => vec!["bias".into(), "LayerNorm.weight".into()],
    };
    let peak = r.f64("optimizer.lr").unwrap_or(5e-5);
    let optimizer = OptimizerPlan {
        kind,
        lr: peak,
        betas,
        eps: r.f64("optimizer.eps").unwrap_or(1e-8),
        weight_decay: r.f64("optimizer.weight_decay").unwrap_or(0.0),
        no_decay,
        bias_correction: r.bool("optimizer.bias_correction").unwrap_or(true),
    };

    // The schedule for the native step count: re-derive the totals the schedule reads.
    let mut native_r = r.clone();
    native_r.set(
        "steps.total",
        Val::Int(steps.total as i64),
        crate::resolve::Source::Derived {
            rule: "native step accounting".into(),
            inputs: vec![],
        },
    );
    if let Some(w) = crate::resolve::warmup(r) {
        let warmup = crate::steps::warmup_steps(w, steps.total, r.facts.warmup_args);
        native_r.set(
            "steps.warmup",
            Val::Int(warmup as i64),
            crate::resolve::Source::Derived {
                rule: "native step accounting".into(),
                inputs: vec![],
            },
        );
    }
    let schedule = match schedules::curves(&native_r) {
        Some(c) => match (c.owner, c.hf, c.ds) {
            (Owner::Hf, Some(s), _) if !s.is_metric_driven() => SchedulePlan::Hf {
                schedule: s,
                peak: c.peak,
                warmup: c.warmup,
                total: c.total,
            },
            (Owner::Hf, Some(recipe_runtime::lr::HfSchedule::ReduceLrOnPlateau), _) => {
                SchedulePlan::Plateau {
                    peak: c.peak,
                    factor: r.f64("schedule.factor").unwrap_or(0.1),
                    patience: r.uint("schedule.patience").unwrap_or(10),
                }
            }
            (Owner::DeepSpeed, _, Some(s)) => SchedulePlan::DeepSpeed {
                schedule: s,
                peak: c.peak,
                flags: c.flags,
            },
            _ => {
                no.push(format!(
                    "schedule {}: not in the native runtime (it needs evaluation metrics)",
                    r.word("schedule.kind").unwrap_or("?")
                ));
                SchedulePlan::Hf {
                    schedule: recipe_runtime::lr::HfSchedule::Constant,
                    peak,
                    warmup: 0,
                    total: steps.total,
                }
            }
        },
        None => SchedulePlan::Hf {
            schedule: recipe_runtime::lr::HfSchedule::Linear,
            peak,
            warmup: native_r.uint("steps.warmup").unwrap_or(0),
            total: steps.total,
        },
    };

    let path = |key: &str| r.str(key).map(|p| absolute(files::local_path(r, p)));
    let format = match r.word("data.format") {
        Some("csv") => DataFormat::Csv,
        Some("tsv") => DataFormat::Tsv,
        _ => DataFormat::Jsonl,
    };
    let data = DataPlan {
        train: path("data.train").unwrap_or_default(),
        eval: path("data.eval"),
        test: path("data.test"),
        format,
        text: r.str("data.text").unwrap_or("text").to_string(),
        text_pair: r.str("data.text_pair").map(str::to_string),
        label: r.str("data.label").unwrap_or("label").to_string(),
        max_len: r.uint("data.max_len").unwrap_or(128) as usize,
        shuffle: r.bool("data.shuffle").unwrap_or(true),
        drop_last,
        samples,
    };
    let precision = match r.word("train.precision") {
        Some("fp16") => Precision::Fp16,
        Some("bf16") => Precision::Bf16,
        _ => Precision::Fp32,
    };
    let (loss_scale, comm_dtype) = mixed_precision(r, precision, &mut no);
    let train = TrainPlan {
        epochs,
        max_steps,
        clip: r.f64("train.clip").unwrap_or(1.0),
        precision,
        seed: r.uint("train.seed").unwrap_or(42),
        logging_steps: r.uint("train.logging_steps").unwrap_or(10).max(1),
        eval_every: every(
            r.val("train.eval_every"),
            if data.eval.is_some() {
                Every::Epoch
            } else {
                Every::Never
            },
        ),
        save_every: every(r.val("train.save_every"), Every::Epoch),
        output_dir: path("train.output_dir").unwrap_or_else(|| PathBuf::from("out")),
        zero_stage: r.uint("zero.stage").unwrap_or(0).min(3) as u8,
        offload_optimizer: offload(r.word("zero.offload optimizer")),
        offload_param: offload(r.word("zero.offload param")),
        loss_scale,
        comm_dtype,
    };
    if !no.is_empty() {
        return Err(no);
    }
    Ok(Plan {
        format: FORMAT,
        name: r.str("recipe.name").unwrap_or("recipe").to_string(),
        model: ModelPlan {
            arch,
            source: model.source,
            tokenizer: model.tokenizer,
            labels: label_names,
            named_labels,
            dropout: r.f64("model.dropout"),
        },
        data,
        batch: BatchPlan {
            micro,
            accumulate,
            world,
            eval_micro: r.uint("batch.eval_micro").unwrap_or(micro),
        },
        optimizer,
        schedule,
        train,
        steps,
    })
}

/// A raw `deepspeed { … }` key's value, if the recipe writes one.
fn raw_ds<'a>(r: &'a Resolved, key: &str) -> Option<&'a Val> {
    r.raw_deepspeed
        .iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, v, _)| v)
}

/// A DeepSpeed dtype name (`fp16`, `bfloat16`, `float32`, …) as the runtime's dtype.
fn ds_dtype(v: &Val) -> Option<recipe_runtime::precision::Dtype> {
    use recipe_runtime::precision::Dtype;
    // DeepSpeed's `DtypeEnum` (runtime/config.py) accepts these spellings.
    match v.as_str()? {
        "fp32" | "float32" | "float" => Some(Dtype::F32),
        "fp16" | "float16" | "half" => Some(Dtype::F16),
        "bf16" | "bfloat16" | "bfloat" => Some(Dtype::Bf16),
        _ => None,
    }
}

/// fp16's loss scaling and the gradient communication dtype, as DeepSpeed would run the recipe;
/// what the runtime does not emulate is pushed onto `no`.
fn mixed_precision(
    r: &Resolved,
    precision: Precision,
    no: &mut Unsupported,
) -> (
    Option<recipe_runtime::precision::ScaleConfig>,
    Option<recipe_runtime::precision::Dtype>,
) {
    use recipe_runtime::precision::ScaleConfig;
    let module = match precision {
        Precision::Fp32 => return (None, None),
        Precision::Fp16 => recipe_runtime::precision::Dtype::F16,
        Precision::Bf16 => recipe_runtime::precision::Dtype::Bf16,
    };
    if r.word("train.eval_precision")
        .is_some_and(|e| Some(e) != r.word("train.precision"))
    {
        no.push("train.eval_precision: the native runtime evaluates in the training precision (DeepSpeed's engine evaluates its own fp16/bf16 module)".into());
    }
    if let Some(v) = raw_ds(r, "data_types.grad_accum_dtype") {
        if ds_dtype(v) != Some(module) {
            no.push(format!(
                "deepspeed data_types.grad_accum_dtype = {v}: the native runtime accumulates gradients in the module's dtype (DeepSpeed's default)"
            ));
        }
    }
    if raw_ds(r, "fp16.auto_cast").and_then(Val::as_bool) == Some(true) {
        no.push("deepspeed fp16.auto_cast = true (torch autocast over an fp32 module): the native runtime runs DeepSpeed's fp16 module mode".into());
    }
    let comm = match raw_ds(r, "communication_data_type") {
        None => None,
        Some(v) => match ds_dtype(v) {
            Some(d) => Some(d),
            None => {
                no.push(format!(
                    "deepspeed communication_data_type = {v}: not a dtype the native runtime reduces in"
                ));
                None
            }
        },
    };
    if precision != Precision::Fp16 {
        return (None, comm);
    }
    let int = |k: &str| r.uint(k);
    let scale = match r.val("train.loss_scale") {
        Some(Val::Int(i)) if *i > 0 => Some(ScaleConfig::Static { scale: *i as f64 }),
        _ => match (
            int("train.initial_scale_power"),
            int("train.loss_scale_window"),
            int("train.hysteresis"),
            r.f64("train.min_loss_scale"),
        ) {
            (Some(power), Some(window), Some(hysteresis), Some(min_scale)) => {
                Some(ScaleConfig::Dynamic {
                    initial_scale_power: power as u32,
                    window,
                    hysteresis,
                    consecutive_hysteresis: raw_ds(r, "fp16.consecutive_hysteresis")
                        .and_then(Val::as_bool)
                        .unwrap_or(false),
                    min_scale,
                })
            }
            // Resolution fills every fp16 default; without them the plan would guess.
            _ => None,
        },
    };
    (scale, comm)
}

/// `p` made absolute (canonical when it exists), so a plan runs from anywhere.
fn absolute(p: PathBuf) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(&p) {
        return c;
    }
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map_or(p.clone(), |d| d.join(p))
    }
}

/// The runtime's offload target for a `zero { offload … = … }` word.
fn offload(word: Option<&str>) -> recipe_runtime::plan::Offload {
    use recipe_runtime::plan::Offload;
    match word {
        Some("cpu") => Offload::Cpu,
        Some("nvme") => Offload::Nvme,
        _ => Offload::None,
    }
}
