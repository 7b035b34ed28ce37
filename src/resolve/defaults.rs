//! The value a setting takes when neither the recipe nor a flag gives it, and whose default
//! that mirrors. Keys absent here have no default: they stay unset or are derived later.

use super::value::{Source, Val};
use super::Resolved;

fn d(value: Val, reason: &str) -> Option<(Val, Source)> {
    Some((
        value,
        Source::Default {
            reason: reason.to_string(),
        },
    ))
}

fn derived(value: Val, rule: &str, inputs: Vec<String>) -> Option<(Val, Source)> {
    Some((
        value,
        Source::Derived {
            rule: rule.to_string(),
            inputs,
        },
    ))
}

/// The default for `key` (`block.key`), given what is resolved so far (blocks resolve in
/// schema order, so earlier blocks are available).
pub fn default(key: &str, r: &Resolved) -> Option<(Val, Source)> {
    let w = |s: &str| Val::Word(s.to_string());
    let float = Val::Float;
    let stage = r.int("zero.stage").unwrap_or(0);
    match key {
        // A label absent because the block is absent.
        "optimizer.kind" => d(
            w("adamw"),
            "AdamW, HF's default optimizer (optim adamw_torch)",
        ),
        "schedule.kind" => d(w("linear"), "HF's default lr_scheduler_type"),
        "zero.stage" => d(Val::Int(0), "no `zero` block: stage 0, DeepSpeed's default"),
        "model.arch" => d(w("auto"), "architecture from the model's config.json"),

        "data.format" => {
            let train = r.str("data.train").unwrap_or("");
            let fmt = recipe_runtime::data::Format::from_extension(train)
                .unwrap_or(recipe_runtime::data::Format::Jsonl);
            derived(
                w(fmt.name()),
                "from the training file's extension",
                vec![format!("data.train = \"{train}\"")],
            )
        }
        "data.text" => d(Val::Str("text".into()), "the usual field name"),
        "data.label" => d(Val::Str("label".into()), "the usual field name"),
        "data.max_len" => d(Val::Int(128), "recipe default"),
        "data.shuffle" => d(Val::Bool(true), "HF Trainer shuffles the training set"),
        "data.drop_last" => d(Val::Bool(false), "HF dataloader_drop_last default"),
        "data.workers" => d(Val::Int(0), "HF dataloader_num_workers default"),

        "batch.eval_micro" => r.int("batch.micro").and_then(|m| {
            derived(
                Val::Int(m),
                "the training micro batch",
                vec![format!("batch.micro = {m}")],
            )
        }),

        "optimizer.lr" => d(float(5e-5), "HF TrainingArguments.learning_rate"),
        "optimizer.betas" => d(
            Val::List(vec![float(0.9), float(0.999)]),
            "HF adam_beta1/adam_beta2 (also DeepSpeed's)",
        ),
        "optimizer.eps" => d(float(1e-8), "HF adam_epsilon (also DeepSpeed's)"),
        "optimizer.weight_decay" => d(float(0.0), "HF weight_decay (also DeepSpeed's)"),
        "optimizer.no_decay" => d(
            Val::List(vec![
                Val::Str("bias".into()),
                Val::Str("LayerNorm.weight".into()),
            ]),
            "HF Trainer's grouping: no decay for biases and LayerNorm weights",
        ),
        "optimizer.momentum" => d(float(0.0), "torch SGD"),
        "optimizer.nesterov" => d(Val::Bool(false), "torch SGD"),
        "optimizer.bias_correction" => d(Val::Bool(true), "DeepSpeed Adam"),
        "optimizer.amsgrad" => d(Val::Bool(false), "DeepSpeed Adam"),
        "optimizer.torch_adam" => d(Val::Bool(false), "DeepSpeed Adam"),
        "optimizer.owner" => d(
            w("deepspeed"),
            "recipe default: a DeepSpeed optimizer section",
        ),

        "schedule.warmup" => d(Val::Int(0), "HF warmup_steps"),
        "schedule.warmup_type" => d(
            w("linear"),
            "recipe default, like HF's warmup (DeepSpeed's own is log)",
        ),
        "schedule.min_lr" => d(float(0.0), "HF's auto value for warmup_min_lr"),
        "schedule.max_lr" => r.f64("optimizer.lr").and_then(|lr| {
            derived(
                float(lr),
                "the optimizer's learning rate",
                vec![format!("optimizer.lr = {}", super::value::fmt_f64(lr))],
            )
        }),
        "schedule.warmup_min_ratio" => d(float(0.0), "DeepSpeed WarmupCosineLR"),
        "schedule.cos_min_ratio" => d(
            float(0.0),
            "recipe default for HF parity (DeepSpeed's own is 1e-4)",
        ),
        "schedule.num_cycles" => match r.word("schedule.kind") {
            Some("cosine_with_restarts") => d(float(1.0), "HF cosine_with_restarts"),
            _ => d(float(0.5), "HF cosine"),
        },
        "schedule.power" => d(float(1.0), "HF polynomial"),
        "schedule.lr_end" => d(float(1e-7), "HF polynomial"),
        "schedule.cycle_max_lr" => r.f64("optimizer.lr").and_then(|lr| {
            derived(
                float(lr),
                "the optimizer's learning rate",
                vec![format!("optimizer.lr = {}", super::value::fmt_f64(lr))],
            )
        }),
        "schedule.cycle_first_step_size" => d(Val::Int(2000), "DeepSpeed OneCycle"),
        "schedule.cycle_first_stair_count" => d(Val::Int(0), "DeepSpeed OneCycle"),
        "schedule.decay_lr_rate" => d(float(0.0), "DeepSpeed OneCycle"),
        "schedule.decay_step_size" => d(Val::Int(0), "DeepSpeed OneCycle"),
        "schedule.cycle_momentum" => d(Val::Bool(true), "DeepSpeed OneCycle"),
        "schedule.cycle_min_mom" => d(float(0.8), "DeepSpeed OneCycle"),
        "schedule.cycle_max_mom" => d(float(0.9), "DeepSpeed OneCycle"),
        "schedule.decay_mom_rate" => d(float(0.0), "DeepSpeed OneCycle"),
        "schedule.start_lr" => d(float(1e-3), "DeepSpeed LRRangeTest"),
        "schedule.step_size" => d(Val::Int(2000), "DeepSpeed LRRangeTest"),
        "schedule.step_rate" => d(float(1.0), "DeepSpeed LRRangeTest"),
        "schedule.staircase" => d(Val::Bool(false), "DeepSpeed LRRangeTest"),
        "schedule.min_lr_ratio" => d(float(0.0), "HF warmup_stable_decay"),
        "schedule.factor" => d(float(0.1), "torch ReduceLROnPlateau"),
        "schedule.patience" => d(Val::Int(10), "torch ReduceLROnPlateau"),

        "train.epochs" => d(float(3.0), "HF num_train_epochs"),
        "train.clip" => d(float(1.0), "HF max_grad_norm"),
        "train.precision" => d(w("fp32"), "recipe default: full precision"),
        "train.eval_precision" => r.word("train.precision").and_then(|p| {
            derived(
                w(p),
                "the training precision",
                vec![format!("train.precision = {p}")],
            )
        }),
        "train.fp16_backend" => d(w("amp"), "HF half_precision_backend (torch AMP)"),
        "train.loss_scale" => d(w("dynamic"), "DeepSpeed fp16.loss_scale 0 = dynamic"),
        "train.initial_scale_power" => d(Val::Int(16), "DeepSpeed fp16 (since 0.8.0)"),
        "train.loss_scale_window" => d(Val::Int(1000), "DeepSpeed fp16"),
        "train.hysteresis" => d(Val::Int(2), "DeepSpeed fp16"),
        "train.min_loss_scale" => d(Val::Int(1), "DeepSpeed fp16"),
        "train.seed" => d(Val::Int(42), "HF seed"),
        "train.script" => d(
            Val::Str("run_classification.py".into()),
            "HF's examples/pytorch/text-classification/run_classification.py",
        ),
        "train.output_dir" => {
            let name = r.str("recipe.name").unwrap_or("recipe");
            derived(
                Val::Str(format!("out/{name}")),
                "out/<recipe name>",
                vec![format!("recipe.name = \"{name}\"")],
            )
        }
        "train.logging_steps" => d(Val::Int(10), "recipe default"),
        // HF's Trainer refuses an evaluation strategy without evaluation data.
        "train.eval_every" => match r.str("data.eval") {
            Some(e) => derived(
                w("epoch"),
                "evaluate at each epoch end when there is evaluation data",
                vec![format!("data.eval = \"{e}\"")],
            ),
            None => derived(w("never"), "no evaluation data (data.eval)", vec![]),
        },
        "train.save_every" => d(w("epoch"), "recipe default"),
        "train.auto_find_batch_size" => d(Val::Bool(false), "HF auto_find_batch_size"),

        "zero.offload optimizer" => d(w("none"), "DeepSpeed: no offload"),
        "zero.offload param" => d(w("none"), "DeepSpeed: no offload"),
        "zero.overlap_comm" => derived(
            Val::Bool(stage == 3),
            "DeepSpeed: true for stage 3, else false",
            vec![format!("zero.stage = {stage}")],
        ),
        "zero.contiguous_gradients" => d(Val::Bool(true), "DeepSpeed (since 0.4.3)"),
        "zero.reduce_scatter" => d(Val::Bool(true), "DeepSpeed (since 0.4.0)"),
        "zero.reduce_bucket" => match r.int("model.hidden_size") {
            Some(h) => derived(
                Val::Int(h * h),
                "hidden_size² (HF's auto value)",
                vec![format!("model.hidden_size = {h}")],
            ),
            None => d(Val::Int(500_000_000), "DeepSpeed reduce_bucket_size 5e8"),
        },
        "zero.allgather_partitions" => d(Val::Bool(true), "DeepSpeed"),
        "zero.allgather_bucket" => d(Val::Int(500_000_000), "DeepSpeed allgather_bucket_size 5e8"),
        "zero.round_robin_gradients" => d(Val::Bool(false), "DeepSpeed"),
        "zero.sub_group_size" => d(Val::Int(1_000_000_000), "DeepSpeed 1e9"),
        "zero.prefetch_bucket" => match r.int("model.hidden_size") {
            Some(h) => derived(
                Val::Int((0.9 * (h * h) as f64) as i64),
                "int(0.9 × hidden_size²) (HF's auto value)",
                vec![format!("model.hidden_size = {h}")],
            ),
            None => d(
                Val::Int(50_000_000),
                "DeepSpeed stage3_prefetch_bucket_size 5e7",
            ),
        },
        "zero.param_persistence_threshold" => match r.int("model.hidden_size") {
            Some(h) => derived(
                Val::Int(10 * h),
                "10 × hidden_size (HF's auto value)",
                vec![format!("model.hidden_size = {h}")],
            ),
            None => d(
                Val::Int(100_000),
                "DeepSpeed stage3_param_persistence_threshold 1e5",
            ),
        },
        "zero.max_live_parameters" => d(Val::Int(1_000_000_000), "DeepSpeed 1e9"),
        "zero.max_reuse_distance" => d(Val::Int(1_000_000_000), "DeepSpeed 1e9"),
        "zero.gather_16bit_weights_on_model_save" => d(
            Val::Bool(true),
            "recipe default: a loadable model.safetensors (DeepSpeed's is false)",
        ),
        "zero.load_from_fp32_weights" => d(Val::Bool(true), "DeepSpeed"),
        "zero.ignore_unused_parameters" => d(Val::Bool(true), "DeepSpeed"),
        "zero.elastic_checkpoint" => d(Val::Bool(false), "DeepSpeed (since 0.5.10)"),

        "cluster.gpus" => d(Val::Int(1), "one GPU (use --gpus or cluster.gpus)"),
        "cluster.nodes" => d(Val::Int(1), "one node (use --nodes or cluster.nodes)"),
        "cluster.master_port" => d(Val::Int(29500), "DeepSpeed launcher"),
        _ => None,
    }
}
