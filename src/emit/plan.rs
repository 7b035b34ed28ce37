//! The native plan (`plan.json`): a pure function of the [`Resolved`] recipe and where its model
//! is, which the caller found (that lookup is I/O, so it happens in the CLI).
//!
//! The plan's step accounting is `recipe_runtime::accounting::native` (what `recipe steps`
//! prints as the native runtime's), and its schedule is the same `lr` function `explain` prints,
//! computed for the native step count.

use std::path::PathBuf;

use recipe_runtime::accounting;
use recipe_runtime::plan::{
    BatchPlan, DataPlan, Every, ModelPlan, ModelSource, OptimizerKind, OptimizerPlan, Plan,
    Precision, SchedulePlan, TrainPlan, FORMAT,
};

use crate::diagnostics::Diagnostic;
use crate::resolve::{files, Resolved, Val};
use crate::upstream::schedules::{self, Owner};

/// Where the model's files are (found by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFiles {
    /// Weights or config.
    pub source: ModelSource,
    /// The `tokenizer.json`.
    pub tokenizer: PathBuf,
}

/// Why a recipe cannot run natively (yet): one line each, said plainly.
#[derive(Debug)]
pub enum Unsupported {
    /// The native family's errors (R11xx, `rules::native`), with spans and help.
    Refused(Vec<Diagnostic>),
    /// A recipe the native check passed that the emitter still cannot map: a bug.
    Bug(String),
}

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
    // What the runtime cannot train is decided once, with codes and spans (rules/native.rs).
    let mut refusals = Vec::new();
    crate::rules::native::check(r, &mut refusals);
    if refusals.iter().any(Diagnostic::is_error) {
        return Err(Unsupported::Refused(refusals));
    }
    let bug = |what: &str| Unsupported::Bug(what.to_string());
    let arch = r.choice("model.arch").to_string();
    let (label_names, named_labels) = labels(r).ok_or_else(|| bug("model.task has no labels"))?;

    // Resolution sets these for every recipe that passed the checks.
    let samples = r.uint("data.samples").unwrap_or(0);
    let micro = r
        .uint("batch.micro")
        .ok_or_else(|| bug("batch.micro is not resolved"))?;
    let accumulate = r
        .uint("batch.accumulate")
        .ok_or_else(|| bug("batch.accumulate is not resolved"))?;
    let world = r
        .uint("cluster.world_size")
        .ok_or_else(|| bug("cluster.world_size is not resolved"))?;
    let drop_last = r.flag("data.drop_last");
    let epochs = r.num("train.epochs");
    let max_steps = r.uint("train.max_steps");
    let steps = accounting::native(
        samples, micro, accumulate, world, drop_last, epochs, max_steps,
    );

    let optimizer =
        optimizer(r).ok_or_else(|| bug("an optimizer kind the native check let through"))?;
    let peak = optimizer.lr;

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
        let warmup = crate::upstream::steps::warmup_steps(w, steps.total, r.facts.warmup_args);
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
                    config: schedules::plateau_config(r),
                }
            }
            (Owner::Hf, Some(recipe_runtime::lr::HfSchedule::Greedy), _) => SchedulePlan::Greedy {
                peak: c.peak,
                config: schedules::greedy_config(r),
            },
            (Owner::DeepSpeed, _, Some(s)) => SchedulePlan::DeepSpeed {
                schedule: s,
                peak: c.peak,
                flags: c.flags,
            },
            // Only a schedule the target release lacks (a check error) lands here.
            _ => return Err(bug("a schedule the native runtime cannot state")),
        },
        None => SchedulePlan::Hf {
            schedule: recipe_runtime::lr::HfSchedule::Linear,
            peak,
            warmup: native_r.uint("steps.warmup").unwrap_or(0),
            total: steps.total,
        },
    };

    let path = |key: &str| r.str(key).map(|p| absolute(files::local_path(r, p)));
    // The format the row count was taken in, so the runtime reads the rows the plan counted.
    let format = files::data_format(r);
    let data = DataPlan {
        train: path("data.train").unwrap_or_default(),
        eval: path("data.eval"),
        test: path("data.test"),
        format,
        text: r.text("data.text").to_string(),
        text_pair: r.str("data.text_pair").map(str::to_string),
        label: r.text("data.label").to_string(),
        max_len: r.count("data.max_len") as usize,
        shuffle: r.flag("data.shuffle"),
        drop_last,
        samples,
    };
    let precision = match r.word("train.precision") {
        Some("fp16") => Precision::Fp16,
        Some("bf16") => Precision::Bf16,
        _ => Precision::Fp32,
    };
    let (loss_scale, comm_dtype) = mixed_precision(r, precision);
    let train = TrainPlan {
        epochs,
        max_steps,
        clip: r.num("train.clip"),
        precision,
        seed: r.count("train.seed"),
        logging_steps: r.count("train.logging_steps").max(1),
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
        zero_stage: r.count("zero.stage").min(3) as u8,
        offload_optimizer: offload(r.word("zero.offload optimizer")),
        offload_param: offload(r.word("zero.offload param")),
        loss_scale,
        comm_dtype,
    };
    Ok(Plan {
        format: FORMAT,
        name: r.text("recipe.name").to_string(),
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
            nodes: r.uint("cluster.nodes").unwrap_or(1),
            master: r.str("cluster.master_addr").map(|a| {
                let port = r.int("cluster.master_port").unwrap_or(29500);
                // An IPv6 address in brackets, as `host:port` needs it.
                if a.contains(':') && !a.starts_with('[') {
                    format!("[{a}]:{port}")
                } else {
                    format!("{a}:{port}")
                }
            }),
            eval_micro: r.uint("batch.eval_micro").unwrap_or(micro),
        },
        optimizer,
        schedule,
        train,
        steps,
    })
}

/// The optimizer DeepSpeed 0.19.8 or HF builds for the recipe, as the runtime's plan; what the
/// runtime does not run, or what would run other than the recipe says, is pushed onto `no`.
///
/// Which class runs (DeepSpeed `engine.py` `_configure_basic_optimizer`; HF
/// `trainer_optimizer.py`; accelerate `map_pytorch_optim_to_deepspeed` under offload):
/// - `sgd`: `torch.optim.SGD` for both owners. HF's `_get_sgd` takes momentum and Nesterov from
///   the `optim_args` the build writes (src/upstream/hf_optimizers.rs; R0415 refuses them where
///   the target transformers does not read it); under offload accelerate turns HF's SGD into
///   DeepSpeedCPUAdam.
/// - `adagrad`: `torch.optim.Adagrad`, DeepSpeedCPUAdagrad under offload (both owners). DeepSpeed
///   gets the recipe's eps (the compiler writes it); HF's `_get_adagrad` ignores `adam_epsilon`
///   and reads eps from `optim_args` only, which the build writes when the recipe gives eps: an
///   `owner = hf` recipe without eps runs torch's default.
/// - `lamb`: FusedLamb (DeepSpeed only); under ZeRO 1–3 the ZeRO optimizer hands it each rank's
///   flattened partition as one tensor (`stage_1_and_2.py`: `param_group['params'] =
///   [single_partition_of_fp32_groups[i]]`; `stage3.py` likewise per sub-group), so its trust
///   ratio is one per partition, not per tensor: not emulated. DeepSpeed allows it (LAMB is
///   "untested" with ZeRO; the compiler adds `zero_allow_untested_optimizer`).
fn optimizer(r: &Resolved) -> Option<OptimizerPlan> {
    let hf = r.word("optimizer.owner") == Some("hf");
    let kind = match r.choice("optimizer.kind") {
        "adamw" => OptimizerKind::AdamW,
        "adam" => OptimizerKind::Adam,
        "sgd" => OptimizerKind::Sgd,
        "adagrad" => OptimizerKind::Adagrad,
        "lamb" => OptimizerKind::Lamb,
        // rules/native.rs refuses every other kind (R1103).
        _ => return None,
    };
    let betas = r.pair("optimizer.betas");
    let no_decay = r.strings("optimizer.no_decay");
    let mut eps = r.num("optimizer.eps");
    let momentum = r.num("optimizer.momentum");
    let nesterov = r.flag("optimizer.nesterov");
    let mut trust_clamp = None;
    match kind {
        // HF's Adagrad takes eps only from `optim_args`, which the build writes when the recipe
        // gives eps (src/upstream/hf_optimizers.rs): otherwise it runs torch's default.
        OptimizerKind::Adagrad if hf && !hf_reads_eps(r) => {
            eps = recipe_runtime::optim::TORCH_ADAGRAD_EPS;
        }
        OptimizerKind::Lamb => {
            // The compiler writes max_coeff / min_coeff only when the recipe sets them;
            // otherwise DeepSpeed runs FusedLamb's defaults (the schema's upstream defaults).
            trust_clamp = Some((r.num("optimizer.min_coeff"), r.num("optimizer.max_coeff")));
        }
        _ => {}
    }
    Some(OptimizerPlan {
        kind,
        lr: r.num("optimizer.lr"),
        betas,
        eps,
        weight_decay: r.num("optimizer.weight_decay"),
        no_decay,
        bias_correction: r.flag("optimizer.bias_correction"),
        momentum,
        nesterov,
        trust_clamp,
    })
}

/// Whether HF's Adagrad gets the recipe's eps: given, and read from the `optim_args` the build
/// writes on the target transformers.
fn hf_reads_eps(r: &Resolved) -> bool {
    use crate::upstream::hf_optimizers::{route, Route};
    r.is_given("optimizer.eps")
        && matches!(route("adagrad", "eps", &r.facts), Some(Route::OptimArgs(_)))
}

/// fp16's loss scaling and the gradient communication dtype, as DeepSpeed would run the recipe
/// (what the runtime does not emulate is refused by rules/native.rs, R1104).
fn mixed_precision(
    r: &Resolved,
    precision: Precision,
) -> (
    Option<recipe_runtime::precision::ScaleConfig>,
    Option<recipe_runtime::precision::Dtype>,
) {
    use crate::rules::native::{ds_dtype, raw_ds};
    use recipe_runtime::precision::{Dtype, ScaleConfig};
    if precision == Precision::Fp32 {
        return (None, None);
    }
    let comm = raw_ds(r, "communication_data_type")
        .and_then(ds_dtype)
        .map(|d| match d {
            "fp16" => Dtype::F16,
            "bf16" => Dtype::Bf16,
            _ => Dtype::F32,
        });
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
