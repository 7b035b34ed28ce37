//! Target library versions, and every version-dependent fact the rules and emitters need, as
//! one table ([`CHANGES`]). Nothing else compares version numbers: code asks [`Facts`].
//!
//! Each row cites the upstream change it records (`repo@tag path:function`).

use std::fmt;
use std::str::FromStr;

/// A release number `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = String;

    /// Accepts `4`, `4.24`, `4.24.0` (missing parts are 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        if parts.is_empty() || parts.len() > 3 {
            return Err(format!("`{s}` is not a version (major.minor.patch)"));
        }
        let mut nums = [0u32; 3];
        for (i, p) in parts.iter().enumerate() {
            nums[i] = p
                .parse()
                .map_err(|_| format!("`{s}` is not a version (major.minor.patch)"))?;
        }
        Ok(Version::new(nums[0], nums[1], nums[2]))
    }
}

/// The libraries whose rules a recipe follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Library {
    /// huggingface/transformers
    Transformers,
    /// huggingface/accelerate
    Accelerate,
    /// deepspeedai/DeepSpeed
    DeepSpeed,
}

impl Library {
    /// All three, in the order `target` lists them.
    pub const ALL: [Library; 3] = [
        Library::Transformers,
        Library::Accelerate,
        Library::DeepSpeed,
    ];

    /// The `target` key naming it.
    pub fn key(self) -> &'static str {
        match self {
            Library::Transformers => "transformers",
            Library::Accelerate => "accelerate",
            Library::DeepSpeed => "deepspeed",
        }
    }

    /// The newest release the rules know.
    pub fn newest(self) -> Version {
        match self {
            Library::Transformers => Version::new(5, 25, 0),
            Library::Accelerate => Version::new(1, 16, 0),
            Library::DeepSpeed => Version::new(0, 19, 8),
        }
    }
}

/// The versions a recipe targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Targets {
    /// transformers release.
    pub transformers: Version,
    /// accelerate release.
    pub accelerate: Version,
    /// DeepSpeed release.
    pub deepspeed: Version,
}

impl Targets {
    /// The newest known releases.
    pub fn newest() -> Self {
        Targets {
            transformers: Library::Transformers.newest(),
            accelerate: Library::Accelerate.newest(),
            deepspeed: Library::DeepSpeed.newest(),
        }
    }

    /// The version of one library.
    pub fn get(&self, lib: Library) -> Version {
        match lib {
            Library::Transformers => self.transformers,
            Library::Accelerate => self.accelerate,
            Library::DeepSpeed => self.deepspeed,
        }
    }

    /// Sets the version of one library.
    pub fn set(&mut self, lib: Library, v: Version) {
        match lib {
            Library::Transformers => self.transformers = v,
            Library::Accelerate => self.accelerate = v,
            Library::DeepSpeed => self.deepspeed = v,
        }
    }
}

/// When the HF Trainer takes an optimizer step inside an epoch (docs/upstream.md §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfStepRule {
    /// ≤ 4.26: `i % G == 0`, or `L <= G` and `i == L`; a leftover `L % G` is carried into the
    /// next epoch's first window (gradients neither stepped nor zeroed).
    EpochModulo,
    /// 4.27 – 4.46: `c % G == 0` over micro-batches since `train()` began, or `L <= G` and `i == L`.
    Cumulative,
    /// ≥ 4.47: `i % G == 0` or `i == L`: every epoch ends with a (possibly short) step.
    EpochModuloOrLast,
}

pub use recipe_runtime::accounting::{Rounding, Sharding};

/// What decides a DeepSpeed optimizer update under the Trainer (docs/upstream.md §5.4, §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsBoundary {
    /// DeepSpeed's own never-reset micro-step counter: an update when `c % G == 0`.
    OwnCounter,
    /// The boundary is forced from HF's `sync_gradients` (accelerate ≥ 1.8): same steps as HF.
    FollowsHf,
}

/// How TrainingArguments express warmup (docs/upstream.md §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmupArgs {
    /// `warmup_steps` only (4.6.1; DS auto ignores the ratio).
    StepsOnly,
    /// `warmup_steps` (int) wins when > 0, else `ceil(T * warmup_ratio)`.
    StepsOrRatio,
    /// `warmup_steps` is a float: `>= 1` whole steps, `< 1` a ratio; `warmup_ratio` deprecated.
    FloatStepsRatioDeprecated,
    /// `warmup_steps` is a float as above; `warmup_ratio` no longer exists.
    FloatSteps,
}

/// When HF's DeepSpeed integration reads `model.config.hidden_size` (docs/upstream.md §2.2, issue
/// #21342).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenSizeRead {
    /// Under ZeRO-3 only, unconditionally there.
    Zero3,
    /// Always, whatever the DeepSpeed config says.
    Always,
    /// Only when a hidden-size key is `"auto"`, with the `hidden_sizes` fallback.
    AutoKeysOnly,
}

/// How the HF Trainer scales each micro-batch's loss for gradient accumulation under DeepSpeed
/// (`Trainer.training_step`; rules/compat.rs R0912). G is `gradient_accumulation_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaScaling {
    /// The window's gradient is the mean over its micro-batches: HF leaves the loss alone and
    /// DeepSpeed's `backward` divides it by G (or HF divides and DeepSpeed does not).
    Mean,
    /// `loss *= G` before `accelerator.backward`, whatever the model: DeepSpeed's division by G
    /// undoes it, so the gradient is G× the mean, and the logged loss G× too.
    TimesG,
    /// HF divides by G when the model does not take loss kwargs (`model_accepts_loss_kwargs`
    /// false, from the model's `accepts_loss_kwargs` attribute when it has one), and DeepSpeed's
    /// `backward` divides again: the gradient is 1/G of the mean (the logged loss is the mean).
    DividedTwice,
    /// HF passes `scale_wrt_gas=False` under DeepSpeed and divides by G only when the model does
    /// not take loss kwargs: a model whose `forward` takes `**kwargs` but whose loss ignores
    /// `num_items_in_batch` gets G× the mean, and logs G× the loss.
    UndividedWithLossKwargs,
}

/// Every version-dependent fact, for one set of targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// HF optimizer-step rule.
    pub hf_step_rule: HfStepRule,
    /// Rounding of updates per epoch.
    pub updates_per_epoch: Rounding,
    /// Data sharding across ranks.
    pub sharding: Sharding,
    /// How warmup is passed to TrainingArguments.
    pub warmup_args: WarmupArgs,
    /// HF's DeepSpeed `warmup_num_steps` auto value is clamped with `max(1, ·)`.
    pub hf_ds_warmup_at_least_one: bool,
    /// HF records and raises DeepSpeed/TrainingArguments mismatches.
    pub hf_mismatch_checks: bool,
    /// HF calls `deepspeed.initialize` itself (no accelerate prepare, no `"auto"` fill at S4).
    pub hf_direct_deepspeed_init: bool,
    /// HF fills `amp.enabled` from `fp16_backend == "apex"`.
    pub hf_apex_amp: bool,
    /// HF fills `stage3_prefetch_bucket_size` as a float (`0.9 * h * h`).
    pub hf_float_prefetch_bucket: bool,
    /// HF fills the hidden-size `"auto"` of `reduce_bucket_size` at any ZeRO stage (else only
    /// under ZeRO-3).
    pub hf_hidden_autos_any_stage: bool,
    /// The name of the gradient checkpointing field of TrainingArguments.
    pub hf_checkpointing_field: &'static str,
    /// DeepSpeed updates follow HF's steps, or count on their own.
    pub ds_boundary: DsBoundary,
    /// DeepSpeed's `gradient_clipping` default.
    pub ds_clipping_default: f64,
    /// DeepSpeed's offload `pin_memory` default.
    pub ds_pin_memory_default: bool,
    /// DeepSpeed rejects a `warmup_num_steps` that is not a positive int.
    pub ds_warmup_steps_positive_int: bool,
    /// `WarmupLR` without `warmup_max_lr` peaks at the optimizer's lr (else at 0.001).
    pub ds_warmup_lr_defaults_to_optimizer_lr: bool,
    /// DeepSpeed has `WarmupCosineLR`.
    pub ds_has_warmup_cosine: bool,
    /// `WarmupCosineLR` clamps its progress at 1 and guards `T == W'`.
    pub ds_cosine_clamped: bool,
    /// The `Warmup*` schedulers write the `it = -1` LR into the optimizer when built, so step 1
    /// runs at the minimum (before: at the optimizer's lr).
    pub ds_warmup_init_writes_lr: bool,
    /// `OneCycle` with `decay_step_size = 0` (its default, "no decay") holds the minimum LR after
    /// the cycle; before, the first scheduler step after the cycle divides by it
    /// (`ZeroDivisionError`).
    pub ds_one_cycle_zero_decay_ok: bool,
    /// When a scheduler's `step()` raises TypeError (it needs an argument, as torch's
    /// `ReduceLROnPlateau.step(metrics)` does), the engine retries with `step(train_batch_size())`,
    /// so the batch size becomes the metric; before, the retry is `step(increment=…)`, which
    /// raises again and stops the run (DeepSpeed `runtime/engine.py:_take_model_step`).
    pub ds_scheduler_step_batch_size_fallback: bool,
    /// `OneCycle`'s stair counts take effect.
    pub ds_one_cycle_stairs: bool,
    /// DeepSpeed's `warmup_type` exists (else warmup is always log).
    pub ds_has_warmup_type: bool,
    /// DeepSpeed reads `fp16.auto_cast`.
    pub ds_has_fp16_auto_cast: bool,
    /// The config section for bf16 (`None`: no bf16 support).
    pub ds_bf16_key: Option<&'static str>,
    /// ZeRO optimizer offload is written `offload_optimizer` (else the legacy `cpu_offload`).
    pub ds_offload_optimizer_section: bool,
    /// DeepSpeed refuses the removed legacy features (sparse attention, elasticity, progressive
    /// layer drop, compression training, nebula, …) with "has been removed".
    pub ds_removed_legacy_features: bool,
    /// ZeRO stages below 2 need fp16.
    pub ds_zero_needs_fp16: bool,
    /// At ZeRO stage 0, `engine.backward` does not scale an fp16 loss (it scales only for a
    /// `ZeROOptimizer`), while `FP16_Optimizer.step` still divides the gradients by the scale.
    pub ds_zero0_fp16_unscaled: bool,
    /// bf16 steps whose gradients hold an inf or NaN are skipped like fp16 overflows
    /// (`bf16.check_grad_overflow`, default true).
    pub ds_bf16_skips_overflow: bool,
    /// fp16 `initial_scale_power` default.
    pub ds_initial_scale_power: u32,
    /// The ZeRO-2 estimator uses the post-0.14.3 formula.
    pub ds_zero2_estimate_new: bool,
    /// Unknown keys in ZeRO / offload sections are rejected (pydantic `extra="forbid"`).
    pub ds_strict_zero_sections: bool,
    /// HF fills DeepSpeed's `fp16.enabled` / `bf16.enabled` from `fp16 or fp16_full_eval` /
    /// `bf16 or bf16_full_eval`, so half-precision evaluation turns on half-precision training.
    pub hf_full_eval_enables_ds_half: bool,
    /// ZeRO stages 2 and 3 run without fp16 (before, while [`Facts::ds_zero_needs_fp16`], every
    /// ZeRO stage needs fp16; after, only stage 1 until that fact ends).
    pub ds_zero23_without_fp16: bool,
    /// transformers raises "ZeRO Offload can only work with DeepSpeed optimizers" when HF builds
    /// the optimizer and its `is_offload()` sees an offload (stage 2 `cpu_offload`, stage 3
    /// `offload_optimizer`/`offload_param` device cpu or nvme).
    pub hf_offload_needs_ds_optimizer: bool,
    /// `TrainingArguments.lr_scheduler_kwargs` exists: HF's schedule arguments other than the
    /// warmup (num_cycles, power, lr_end, …) reach `get_scheduler`. Before, every HF schedule
    /// runs with its function's defaults.
    pub hf_scheduler_kwargs: bool,
    /// HF's `sgd` and `adagrad` optimizers read `optim_args` (SGD: momentum, dampening,
    /// weight_decay, nesterov; Adagrad: lr_decay, weight_decay, eps). Before, the Trainer builds
    /// `torch.optim.SGD` / `torch.optim.Adagrad` with `lr` alone and ignores `optim_args`.
    pub hf_sgd_adagrad_optim_args: bool,
    /// The `optim` values (`TrainingArguments.optim`, enum `OptimizerNames`) the release has,
    /// among those the compiler writes (src/emit/training_args.rs `hf_optim`); empty before the
    /// field exists, when the Trainer builds AdamW (or Adafactor with `adafactor = true`).
    pub hf_optim_names: &'static [&'static str],
    /// The `lr_scheduler_type` values (`SchedulerType`) the release knows; any other value stops
    /// `TrainingArguments` with "'<name>' is not a valid SchedulerType".
    pub hf_scheduler_kinds: &'static [&'static str],
    /// The error transformers raises when DeepSpeed builds the optimizer and HF the scheduler
    /// (no DeepSpeed `scheduler` section); `None` when that combination works.
    pub hf_ds_optimizer_hf_scheduler_error: Option<&'static str>,
    /// accelerate rebuilds an HF optimizer under optimizer offload by class (AdamW →
    /// DeepSpeedCPUAdam adamw_mode, Adagrad → DeepSpeedCPUAdagrad, bnb 32-bit Lion →
    /// DeepSpeedCPULion, anything else → DeepSpeedCPUAdam with adamw_mode false); before, every
    /// optimizer became `DeepSpeedCPUAdam(lr, weight_decay)` with its default adamw_mode.
    pub acc_cpu_optimizer_by_class: bool,
    /// DeepSpeed rejects a client optimizer other than DeepSpeedCPUAdam under ZeRO optimizer
    /// offload unless `zero_force_ds_cpu_optimizer` is false (the key exists from then on).
    pub ds_force_cpu_optimizer: bool,
    /// DeepSpeed's own optimizer types (`DEEPSPEED_OPTIMIZERS`, lower case); any other `type` is
    /// looked up in `torch.optim` with its exact case.
    pub ds_optimizers: &'static [&'static str],
    /// Optimizer kinds DeepSpeed's ZeRO accepts without `zero_allow_untested_optimizer`
    /// (`ZERO_SUPPORTED_OPTIMIZERS`, as recipe optimizer kinds).
    pub ds_zero_supported_optimizers: &'static [&'static str],
    /// With bf16 (and fp16 off) DeepSpeed's loss scale is a fixed 1.0, not dynamic, so LAMB's
    /// "requires dynamic loss scaling" assertion fails.
    pub ds_bf16_fixed_loss_scale: bool,
    /// When HF reads `model.config.hidden_size` (an AttributeError for configs without it).
    pub hf_hidden_size_read: HiddenSizeRead,
    /// The accelerate release the Trainer requires at run time (`None`: no version check).
    pub hf_min_accelerate: Option<Version>,
    /// DeepSpeed reads `managed_gradient_accumulation`, and asserts in
    /// `set_gradient_accumulation_boundary` when it is false.
    pub ds_managed_gradient_accumulation: bool,
    /// `TrainingArguments.train_sampling_strategy` exists (`"sequential"`: a `SequentialSampler`
    /// in `Trainer._get_train_sampler`). Before, the Trainer's training sampler is a
    /// `RandomSampler` (or `LengthGroupedSampler`) and no field turns the shuffling off.
    pub hf_train_sampling_strategy: bool,
    /// How the Trainer scales the loss for gradient accumulation under DeepSpeed.
    pub hf_ga_scaling: GaScaling,
    /// `BertForSequenceClassification.forward` takes `**kwargs`, so the Trainer (without an
    /// `accepts_loss_kwargs` attribute on the model) takes it for a model that reads
    /// `num_items_in_batch`; its loss is a plain `CrossEntropyLoss()` mean that does not.
    pub hf_bert_forward_kwargs: bool,
    /// The `do_lower_case` BERT's tokenizer takes when tokenizer_config.json does not say; the
    /// tokenizer rebuilds tokenizer.json's normalizer with `lowercase = do_lower_case` whatever
    /// the file says.
    pub hf_bert_do_lower_case_default: bool,
}

/// One version-dependent fact, as a table row applies it.
#[derive(Debug, Clone, Copy)]
pub enum Fact {
    /// See [`Facts::hf_step_rule`].
    HfStepRule(HfStepRule),
    /// See [`Facts::updates_per_epoch`].
    UpdatesPerEpoch(Rounding),
    /// See [`Facts::sharding`].
    Sharding(Sharding),
    /// See [`Facts::warmup_args`].
    WarmupArgs(WarmupArgs),
    /// See [`Facts::hf_ds_warmup_at_least_one`].
    HfDsWarmupAtLeastOne(bool),
    /// See [`Facts::hf_mismatch_checks`].
    HfMismatchChecks(bool),
    /// See [`Facts::hf_direct_deepspeed_init`].
    HfDirectDeepSpeedInit(bool),
    /// See [`Facts::hf_apex_amp`].
    HfApexAmp(bool),
    /// See [`Facts::hf_float_prefetch_bucket`].
    HfFloatPrefetchBucket(bool),
    /// See [`Facts::hf_hidden_autos_any_stage`].
    HfHiddenAutosAnyStage(bool),
    /// See [`Facts::hf_checkpointing_field`].
    HfCheckpointingField(&'static str),
    /// See [`Facts::ds_boundary`].
    DsBoundary(DsBoundary),
    /// See [`Facts::ds_clipping_default`].
    DsClippingDefault(f64),
    /// See [`Facts::ds_pin_memory_default`].
    DsPinMemoryDefault(bool),
    /// See [`Facts::ds_warmup_steps_positive_int`].
    DsWarmupStepsPositiveInt(bool),
    /// See [`Facts::ds_warmup_lr_defaults_to_optimizer_lr`].
    DsWarmupLrDefaultsToOptimizerLr(bool),
    /// See [`Facts::ds_has_warmup_cosine`].
    DsHasWarmupCosine(bool),
    /// See [`Facts::ds_cosine_clamped`].
    DsCosineClamped(bool),
    /// See [`Facts::ds_warmup_init_writes_lr`].
    DsWarmupInitWritesLr(bool),
    /// See [`Facts::ds_one_cycle_stairs`].
    DsOneCycleStairs(bool),
    /// See [`Facts::ds_one_cycle_zero_decay_ok`].
    DsOneCycleZeroDecayOk(bool),
    /// See [`Facts::ds_scheduler_step_batch_size_fallback`].
    DsSchedulerStepBatchSizeFallback(bool),
    /// See [`Facts::ds_has_warmup_type`].
    DsHasWarmupType(bool),
    /// See [`Facts::ds_has_fp16_auto_cast`].
    DsHasFp16AutoCast(bool),
    /// See [`Facts::ds_bf16_key`].
    DsBf16Key(Option<&'static str>),
    /// See [`Facts::ds_offload_optimizer_section`].
    DsOffloadOptimizerSection(bool),
    /// See [`Facts::ds_removed_legacy_features`].
    DsRemovedLegacyFeatures(bool),
    /// See [`Facts::ds_zero_needs_fp16`].
    DsZeroNeedsFp16(bool),
    /// See [`Facts::ds_zero0_fp16_unscaled`].
    DsZero0Fp16Unscaled(bool),
    /// See [`Facts::ds_bf16_skips_overflow`].
    DsBf16SkipsOverflow(bool),
    /// See [`Facts::ds_initial_scale_power`].
    DsInitialScalePower(u32),
    /// See [`Facts::ds_zero2_estimate_new`].
    DsZero2EstimateNew(bool),
    /// See [`Facts::ds_strict_zero_sections`].
    DsStrictZeroSections(bool),
    /// See [`Facts::hf_full_eval_enables_ds_half`].
    HfFullEvalEnablesDsHalf(bool),
    /// See [`Facts::ds_zero23_without_fp16`].
    DsZero23WithoutFp16(bool),
    /// See [`Facts::hf_offload_needs_ds_optimizer`].
    HfOffloadNeedsDsOptimizer(bool),
    /// See [`Facts::hf_scheduler_kwargs`].
    HfSchedulerKwargs(bool),
    /// See [`Facts::hf_sgd_adagrad_optim_args`].
    HfSgdAdagradOptimArgs(bool),
    /// See [`Facts::hf_optim_names`].
    HfOptimNames(&'static [&'static str]),
    /// See [`Facts::hf_scheduler_kinds`].
    HfSchedulerKinds(&'static [&'static str]),
    /// See [`Facts::hf_ds_optimizer_hf_scheduler_error`].
    HfDsOptimizerHfSchedulerError(Option<&'static str>),
    /// See [`Facts::acc_cpu_optimizer_by_class`].
    AccCpuOptimizerByClass(bool),
    /// See [`Facts::ds_force_cpu_optimizer`].
    DsForceCpuOptimizer(bool),
    /// See [`Facts::ds_optimizers`].
    DsOptimizers(&'static [&'static str]),
    /// See [`Facts::ds_zero_supported_optimizers`].
    DsZeroSupportedOptimizers(&'static [&'static str]),
    /// See [`Facts::ds_bf16_fixed_loss_scale`].
    DsBf16FixedLossScale(bool),
    /// See [`Facts::hf_hidden_size_read`].
    HfHiddenSizeRead(HiddenSizeRead),
    /// See [`Facts::hf_min_accelerate`].
    HfMinAccelerate(Option<Version>),
    /// See [`Facts::ds_managed_gradient_accumulation`].
    DsManagedGradientAccumulation(bool),
    /// See [`Facts::hf_train_sampling_strategy`].
    HfTrainSamplingStrategy(bool),
    /// See [`Facts::hf_ga_scaling`].
    HfGaScaling(GaScaling),
    /// See [`Facts::hf_bert_forward_kwargs`].
    HfBertForwardKwargs(bool),
    /// See [`Facts::hf_bert_do_lower_case_default`].
    HfBertDoLowerCaseDefault(bool),
}

/// A row of the table: from `since` on (until a later row sets the same fact), `fact` holds.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    /// The library whose version decides.
    pub library: Library,
    /// First release with this behaviour.
    pub since: Version,
    /// What holds from then on.
    pub fact: Fact,
    /// Where upstream it comes from.
    pub cite: &'static str,
}

const fn row(library: Library, since: (u32, u32, u32), fact: Fact, cite: &'static str) -> Change {
    Change {
        library,
        since: Version::new(since.0, since.1, since.2),
        fact,
        cite,
    }
}

use Fact::*;
use Library::{Accelerate as A, DeepSpeed as D, Transformers as T};

/// The table. Rows for one fact are in version order; a `since` of 0.0.0 is the oldest behaviour.
pub static CHANGES: &[Change] = &[
    // ---- transformers ----
    row(T, (0, 0, 0), HfStepRule(self::HfStepRule::EpochModulo), "transformers@v4.24.0 trainer.py:_inner_training_loop"),
    row(T, (4, 27, 0), HfStepRule(self::HfStepRule::Cumulative), "transformers PR #22098 (total_batched_samples), v4.27.0"),
    row(T, (4, 47, 0), HfStepRule(self::HfStepRule::EpochModuloOrLast), "transformers PR #33673, v4.47.0"),
    row(T, (0, 0, 0), UpdatesPerEpoch(Rounding::Floor), "transformers@v4.51.3 trainer.py:set_initial_training_values"),
    row(T, (4, 52, 0), UpdatesPerEpoch(Rounding::Ceil), "transformers PR #37923, v4.52.0"),
    row(T, (0, 0, 0), Sharding(self::Sharding::DistributedSampler), "transformers@v4.24.0 trainer.py:_get_train_sampler"),
    row(T, (4, 30, 0), Sharding(self::Sharding::BatchSamplerShard), "transformers PR #24028 (DataLoader through accelerator.prepare), v4.30.0"),
    row(T, (0, 0, 0), WarmupArgs(self::WarmupArgs::StepsOnly), "transformers@v4.6.1 integrations.py:DeepSpeedConfigHF.config_process"),
    row(T, (4, 24, 0), WarmupArgs(self::WarmupArgs::StepsOrRatio), "transformers@v4.24.0 training_args.py:get_warmup_steps"),
    row(T, (5, 0, 0), WarmupArgs(self::WarmupArgs::FloatStepsRatioDeprecated), "transformers@v5.0.0 training_args.py"),
    row(T, (5, 15, 0), WarmupArgs(self::WarmupArgs::FloatSteps), "transformers v5.15.0 removed warmup_ratio"),
    row(T, (0, 0, 0), HfDsWarmupAtLeastOne(false), "transformers@v5.0.0 deepspeed.py:trainer_config_finalize"),
    row(T, (5, 24, 0), HfDsWarmupAtLeastOne(true), "transformers@v5.24.0 integrations/deepspeed.py:trainer_config_finalize (first release read with max(1, ·))"),
    row(T, (0, 0, 0), HfMismatchChecks(false), "transformers@v4.6.1 integrations.py (only _set_if_auto)"),
    row(T, (4, 24, 0), HfMismatchChecks(true), "transformers@v4.24.0 deepspeed.py:fill_match"),
    row(T, (0, 0, 0), HfDirectDeepSpeedInit(true), "transformers@v4.24.0 deepspeed.py:deepspeed_init"),
    row(T, (4, 30, 0), HfDirectDeepSpeedInit(false), "transformers PR #24028 era: Trainer prepares through accelerate"),
    row(T, (0, 0, 0), HfApexAmp(true), "transformers@v4.6.1 integrations.py:DeepSpeedConfigHF.config_process (amp.enabled from fp16_backend)"),
    row(T, (5, 0, 0), HfApexAmp(false), "transformers v5.0.0 removed apex"),
    row(T, (0, 0, 0), HfHiddenAutosAnyStage(false), "transformers@v4.6.1 integrations.py:DeepSpeedConfigHF.config_process (hidden-size autos under ZeRO-3 only)"),
    row(T, (4, 24, 0), HfHiddenAutosAnyStage(true), "transformers@v4.24.0 deepspeed.py:trainer_config_finalize (reduce_bucket_size at any stage)"),
    row(T, (0, 0, 0), HfFloatPrefetchBucket(true), "transformers@v4.24.0 deepspeed.py:trainer_config_finalize"),
    row(T, (4, 45, 0), HfFloatPrefetchBucket(false), "transformers v4.45.0 int(0.9*h*h)"),
    row(T, (0, 0, 0), HfCheckpointingField("gradient_checkpointing"), "transformers@v4.24.0 training_args.py"),
    row(T, (5, 23, 0), HfCheckpointingField("activation_checkpointing"), "transformers v5.23.0 renamed it"),
    row(T, (0, 0, 0), HfFullEvalEnablesDsHalf(false), "transformers@v4.6.1 integrations.py:DeepSpeedConfigHF.config_process (fp16.enabled from args.fp16 only)"),
    row(T, (4, 24, 0), HfFullEvalEnablesDsHalf(true), "transformers@v4.24.0 deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_process (fp16 or fp16_full_eval, bf16 or bf16_full_eval)"),
    // ---- accelerate ----
    row(A, (0, 0, 0), DsBoundary(self::DsBoundary::OwnCounter), "accelerate@v1.7.0 utils/deepspeed.py:DeepSpeedEngineWrapper.backward"),
    row(A, (1, 8, 0), DsBoundary(self::DsBoundary::FollowsHf), "accelerate PR #3630, v1.8.0"),
    // ---- DeepSpeed ----
    row(D, (0, 0, 0), DsClippingDefault(0.0), "DeepSpeed@v0.19.2 runtime/constants.py:GRADIENT_CLIPPING_DEFAULT"),
    row(D, (0, 19, 3), DsClippingDefault(1.0), "DeepSpeed PR #8068, v0.19.3"),
    row(D, (0, 0, 0), DsPinMemoryDefault(false), "DeepSpeed@v0.19.4 zero/offload_config.py"),
    row(D, (0, 19, 5), DsPinMemoryDefault(true), "DeepSpeed PR #8207, v0.19.5"),
    row(D, (0, 0, 0), DsWarmupStepsPositiveInt(false), "DeepSpeed@v0.19.2 lr_schedules.py"),
    row(D, (0, 19, 3), DsWarmupStepsPositiveInt(true), "DeepSpeed PR #8126, v0.19.3"),
    row(D, (0, 0, 0), DsWarmupLrDefaultsToOptimizerLr(false), "DeepSpeed@v0.17.1 lr_schedules.py:WarmupLR"),
    row(D, (0, 17, 2), DsWarmupLrDefaultsToOptimizerLr(true), "DeepSpeed PR #7360, v0.17.2"),
    row(D, (0, 0, 0), DsHasWarmupCosine(false), "DeepSpeed@v0.12.2 lr_schedules.py"),
    row(D, (0, 12, 3), DsHasWarmupCosine(true), "DeepSpeed v0.12.3 WarmupCosineLR"),
    row(D, (0, 0, 0), DsCosineClamped(false), "DeepSpeed@v0.19.2 lr_schedules.py:WarmupCosineLR"),
    row(D, (0, 19, 3), DsCosineClamped(true), "DeepSpeed v0.19.3 WarmupCosineLR clamp"),
    row(D, (0, 0, 0), DsWarmupInitWritesLr(false), "DeepSpeed@v0.15.2 lr_schedules.py (constructors write no LR)"),
    row(D, (0, 15, 3), DsWarmupInitWritesLr(true), "DeepSpeed PR #6597, v0.15.3"),
    row(D, (0, 0, 0), DsOneCycleStairs(false), "DeepSpeed@v0.19.3 lr_schedules.py:OneCycle (stair counts never read)"),
    row(D, (0, 19, 4), DsOneCycleStairs(true), "DeepSpeed PR #8179, v0.19.4"),
    row(D, (0, 0, 0), DsOneCycleZeroDecayOk(false), "DeepSpeed@v0.5.4 lr_schedules.py:OneCycle._get_decay_lr (divides by decay_step_size; released sdist)"),
    row(D, (0, 5, 5), DsOneCycleZeroDecayOk(true), "DeepSpeed@v0.5.5 lr_schedules.py:OneCycle (skip_lr_decay when decay_step_size is 0; released sdist)"),
    row(D, (0, 0, 0), DsSchedulerStepBatchSizeFallback(false), "DeepSpeed@v0.10.0 runtime/engine.py:DeepSpeedEngine._take_model_step (lr_scheduler.step(**lr_kwargs); on TypeError step(increment=train_batch_size()); v0.3.16 has no retry)"),
    row(D, (0, 10, 1), DsSchedulerStepBatchSizeFallback(true), "DeepSpeed@v0.10.1 runtime/engine.py:DeepSpeedEngine._take_model_step (on TypeError step(train_batch_size()); PR #4152)"),
    row(D, (0, 0, 0), DsHasWarmupType(false), "DeepSpeed@v0.5.6 lr_schedules.py (log warmup only)"),
    row(D, (0, 5, 7), DsHasWarmupType(true), "DeepSpeed PR #1530, v0.5.7"),
    row(D, (0, 0, 0), DsZero0Fp16Unscaled(false), "DeepSpeed@v0.18.2 runtime/engine.py:backward calls self.optimizer.backward(loss): FP16_Optimizer scales loss.float() * cur_scale"),
    row(D, (0, 18, 3), DsZero0Fp16Unscaled(true), "DeepSpeed PR #7665 (v0.18.3) runtime/engine.py:backward scales only `isinstance(self.optimizer, ZeROOptimizer)`; FP16_Optimizer is not one, its step still unscales (still so in v0.19.8)"),
    row(D, (0, 0, 0), DsBf16SkipsOverflow(false), "DeepSpeed@v0.19.2 runtime/precision_config.py: no bf16 check_grad_overflow"),
    row(D, (0, 19, 3), DsBf16SkipsOverflow(true), "DeepSpeed v0.19.3 runtime/precision_config.py: check_grad_overflow = True; engine.py _configure_zero_optimizer passes it"),
    row(D, (0, 0, 0), DsHasFp16AutoCast(false), "DeepSpeed@v0.6.7 runtime/constants.py: no FP16_AUTO_CAST"),
    row(D, (0, 7, 0), DsHasFp16AutoCast(true), "DeepSpeed@v0.7.0 runtime/constants.py: FP16_AUTO_CAST = \"auto_cast\""),
    row(D, (0, 0, 0), DsBf16Key(None), "DeepSpeed@v0.5.4 (no bf16)"),
    row(D, (0, 5, 5), DsBf16Key(Some("bfloat16")), "DeepSpeed v0.5.5 runtime/config.py"),
    row(D, (0, 6, 0), DsBf16Key(Some("bf16")), "DeepSpeed v0.6.0 renamed bfloat16 to bf16"),
    row(D, (0, 0, 0), DsOffloadOptimizerSection(false), "DeepSpeed@v0.3.14 zero/config.py (cpu_offload)"),
    row(D, (0, 3, 15), DsOffloadOptimizerSection(true), "DeepSpeed v0.3.15 offload_optimizer"),
    row(D, (0, 0, 0), DsRemovedLegacyFeatures(false), "DeepSpeed@v0.19.5 still reads them (schema/upstream.rs)"),
    row(D, (0, 19, 8), DsRemovedLegacyFeatures(true), "DeepSpeed 0.19.8 as installed by conformance/setup.sh: \"… has been removed\" (conformance/fixtures; first release with the removal not pinned between 0.19.6 and 0.19.8)"),
    row(D, (0, 0, 0), DsZeroNeedsFp16(true), "DeepSpeed@v0.3.16 runtime/config.py"),
    row(D, (0, 4, 0), DsZeroNeedsFp16(false), "DeepSpeed PR #1042, v0.4.0"),
    row(D, (0, 0, 0), DsInitialScalePower(32), "DeepSpeed@v0.7.x runtime/constants.py"),
    row(D, (0, 8, 0), DsInitialScalePower(16), "DeepSpeed v0.8.0"),
    row(D, (0, 0, 0), DsZero2EstimateNew(false), "DeepSpeed@v0.14.2 zero/stage_1_and_2.py:estimate_zero2_model_states_mem_needs"),
    row(D, (0, 14, 3), DsZero2EstimateNew(true), "DeepSpeed PR #5099, v0.14.3"),
    row(D, (0, 0, 0), DsStrictZeroSections(false), "DeepSpeed@v0.6.x zero/config.py"),
    row(D, (0, 7, 0), DsStrictZeroSections(true), "DeepSpeed v0.7.0 pydantic extra=forbid"),
    row(D, (0, 0, 0), DsZero23WithoutFp16(false), "DeepSpeed@v0.3.15 runtime/config.py:DeepSpeedConfig._do_error_check (every ZeRO stage asserts fp16)"),
    row(D, (0, 3, 16), DsZero23WithoutFp16(true), "DeepSpeed PR #1004 (full precision for ZeRO stages 2 and 3), v0.3.16"),
    // ---- optimizer / scheduler ownership and DeepSpeed optimizers (rules/schedule.rs, rules/optimizer.rs) ----
    row(T, (0, 0, 0), HfOffloadNeedsDsOptimizer(true), "transformers@v4.6.1 integrations.py:deepspeed_init (docs/upstream.md §4.2)"),
    row(T, (0, 0, 0), HfSchedulerKwargs(false), "transformers@v4.35.2 training_args.py: no lr_scheduler_kwargs (released wheel)"),
    row(T, (0, 0, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"]), "transformers@v4.26.0 trainer_utils.py:SchedulerType (same in v4.6.1, released wheels)"),
    row(T, (4, 27, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"]), "transformers@v4.27.0 trainer_utils.py:SchedulerType (released wheel)"),
    row(T, (4, 29, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau"]), "transformers@v4.29.0 trainer_utils.py:SchedulerType (released wheel)"),
    row(T, (4, 40, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr"]), "transformers@v4.40.0 trainer_utils.py:SchedulerType (released wheel)"),
    row(T, (4, 41, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "warmup_stable_decay"]), "transformers@v4.41.0 trainer_utils.py:SchedulerType (released wheel; unchanged through v5.24.0 for these names)"),
    row(T, (4, 54, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "warmup_stable_decay", "cosine_warmup_with_min_lr"]), "transformers@v4.54.0 trainer_utils.py:SchedulerType (released wheel; absent in v4.53.3)"),
    row(T, (5, 4, 0), HfSchedulerKinds(&["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau", "cosine_with_min_lr", "warmup_stable_decay", "cosine_warmup_with_min_lr", "greedy"]), "transformers@v5.4.0 trainer_utils.py:SchedulerType (released wheel; absent in v5.3.0)"),
    row(T, (4, 36, 0), HfSchedulerKwargs(true), "transformers@v4.36.0 training_args.py: lr_scheduler_kwargs (released wheel)"),
    row(T, (0, 0, 0), HfSgdAdagradOptimArgs(false), "transformers@v5.2.0 trainer_optimizer.py:_get_sgd, _get_adagrad (lr only; v4.24.0–v5.0.0 trainer.py:Trainer.get_optimizer_cls_and_kwargs likewise; released wheels)"),
    // Read in the released wheels' training_args.py (`class OptimizerNames`, the `optim` field):
    // absent in 4.6.1 … 4.15.0; 4.16.0–4.18.0 adamw_* and adafactor; sgd and adagrad from 4.19.0;
    // lion_32bit from 4.30.0 (absent in 4.29.0); all five in every later release sampled.
    row(T, (0, 0, 0), HfOptimNames(&[]), "transformers@v4.15.0 training_args.py:TrainingArguments (no `optim` field; trainer.py:create_optimizer builds AdamW, or Adafactor when `adafactor`)"),
    row(T, (4, 16, 0), HfOptimNames(&["adafactor", "adamw_torch"]), "transformers@v4.16.0 training_args.py:OptimizerNames, TrainingArguments.optim"),
    row(T, (4, 19, 0), HfOptimNames(&["adafactor", "adagrad", "adamw_torch", "sgd"]), "transformers@v4.19.0 training_args.py:OptimizerNames (SGD, ADAGRAD; absent in v4.18.0)"),
    row(T, (4, 30, 0), HfOptimNames(&["adafactor", "adagrad", "adamw_torch", "lion_32bit", "sgd"]), "transformers@v4.30.0 training_args.py:OptimizerNames (LION; absent in v4.29.0; same in v5.24.0)"),
    row(T, (5, 3, 0), HfSgdAdagradOptimArgs(true), "transformers PR #44203, v5.3.0 trainer_optimizer.py:_get_sgd, _get_adagrad (parse optim_args; released wheel, same in v5.24.0)"),
    row(T, (4, 9, 0), HfOffloadNeedsDsOptimizer(false), "transformers PR #12690 (non-native optimizers with ZeRO-Offload), v4.9.0: deepspeed.py:deepspeed_init only logs"),
    row(T, (0, 0, 0), HfDsOptimizerHfSchedulerError(Some("At the moment HF scheduler + DeepSpeed optimizer combination is not possible")), "transformers@v4.6.1 integrations.py:deepspeed_init (docs/upstream.md §4.2); same in v4.9.0 deepspeed.py"),
    row(T, (4, 10, 0), HfDsOptimizerHfSchedulerError(None), "transformers PR #13216 (DS callable API for the HF scheduler), v4.10.0 deepspeed.py:deepspeed_init"),
    row(T, (4, 30, 0), HfDsOptimizerHfSchedulerError(Some("Found `optimizer` configured in the DeepSpeed config, but no `scheduler`. Please configure a scheduler in the DeepSpeed config.")), "transformers@v4.30.0 deepspeed.py:deepspeed_optim_sched (DummyOptim without DummyScheduler)"),
    row(T, (4, 34, 0), HfDsOptimizerHfSchedulerError(None), "transformers PR #25863, v4.34.0 integrations/deepspeed.py:deepspeed_optim_sched (DummyScheduler lr_scheduler_callable)"),
    row(A, (0, 0, 0), AccCpuOptimizerByClass(false), "accelerate@v1.1.1 accelerator.py:Accelerator._prepare_deepspeed (DeepSpeedCPUAdam for every optimizer)"),
    row(A, (1, 2, 0), AccCpuOptimizerByClass(true), "accelerate PR #3255, v1.2.0 utils/deepspeed.py:map_pytorch_optim_to_deepspeed"),
    row(D, (0, 0, 0), DsForceCpuOptimizer(false), "DeepSpeed@v0.8.2 runtime/engine.py:DeepSpeedEngine._configure_optimizer (no check)"),
    row(D, (0, 8, 3), DsForceCpuOptimizer(true), "DeepSpeed PR #2971, v0.8.3 runtime/engine.py:_configure_optimizer (ZeRORuntimeException)"),
    row(D, (0, 0, 0), DsOptimizers(&["adam", "adamw", "lamb", "onebitadam", "onebitlamb"]), "DeepSpeed@v0.3.16 runtime/config.py:DEEPSPEED_OPTIMIZERS"),
    row(D, (0, 5, 5), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb"]), "DeepSpeed@v0.5.5 runtime/config.py:DEEPSPEED_OPTIMIZERS (adagrad)"),
    row(D, (0, 6, 1), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam"]), "DeepSpeed@v0.6.1 runtime/config.py:DEEPSPEED_OPTIMIZERS (0/1 Adam)"),
    row(D, (0, 10, 2), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "muadam", "muadamw", "musgd"]), "DeepSpeed@v0.10.2 runtime/config.py:DEEPSPEED_OPTIMIZERS (mup)"),
    row(D, (0, 11, 0), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "muadam", "muadamw", "musgd", "lion"]), "DeepSpeed@v0.11.0 runtime/config.py:DEEPSPEED_OPTIMIZERS (lion)"),
    row(D, (0, 17, 6), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "muadam", "muadamw", "musgd", "lion", "muon"]), "DeepSpeed@v0.17.6 runtime/config.py:DEEPSPEED_OPTIMIZERS (muon)"),
    row(D, (0, 19, 8), DsOptimizers(&["adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon"]), "DeepSpeed PR #8490 (1-bit Adam, 1-bit LAMB and 0/1 Adam deleted), v0.19.8 runtime/config.py:DEEPSPEED_OPTIMIZERS; found by the conformance harness"),
    row(D, (0, 0, 0), DsZeroSupportedOptimizers(&["adam", "adamw"]), "DeepSpeed@v0.3.16 runtime/zero/utils.py:ZERO_SUPPORTED_OPTIMIZERS (torch Adam, AdamW, FusedAdam, DeepSpeedCPUAdam)"),
    row(D, (0, 9, 2), DsZeroSupportedOptimizers(&["adam", "adamw", "adagrad"]), "DeepSpeed@v0.9.2 runtime/zero/utils.py:ZERO_SUPPORTED_OPTIMIZERS (+ torch Adagrad, DeepSpeedCPUAdagrad)"),
    row(D, (0, 11, 0), DsZeroSupportedOptimizers(&["adam", "adamw", "adagrad", "lion"]), "DeepSpeed@v0.11.0 runtime/zero/utils.py:ZERO_SUPPORTED_OPTIMIZERS (+ DeepSpeedCPULion, FusedLion)"),
    row(D, (0, 0, 0), DsBf16FixedLossScale(false), "DeepSpeed@v0.5.4 runtime/config.py:get_loss_scale (no bf16)"),
    row(D, (0, 5, 5), DsBf16FixedLossScale(true), "DeepSpeed@v0.5.5 runtime/config.py:get_loss_scale (bf16 → 1.0)"),
    row(D, (0, 17, 1), DsBf16FixedLossScale(false), "DeepSpeed PR #6976, v0.17.1 engine.py:dynamic_loss_scale reads float16_config.loss_scale (0 unless fp16 sets it)"),
    // ---- data / model / compat (rules/model.rs, rules/compat.rs) ----
    row(T, (0, 0, 0), HfHiddenSizeRead(self::HiddenSizeRead::Zero3), "transformers@v4.17.0 deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_finalize (inside is_zero3(); v4.6.1 integrations.py:DeepSpeedConfigHF.config_finalize likewise)"),
    row(T, (4, 18, 0), HfHiddenSizeRead(self::HiddenSizeRead::Always), "transformers@v4.18.0 deepspeed.py:HfTrainerDeepSpeedConfig.trainer_config_finalize (unconditional; same in v4.26.1; issue #21342)"),
    row(T, (4, 27, 0), HfHiddenSizeRead(self::HiddenSizeRead::AutoKeysOnly), "transformers PR #21504, v4.27.0 deepspeed.py:trainer_config_finalize (only for auto keys, hidden_sizes fallback)"),
    row(T, (0, 0, 0), HfMinAccelerate(None), "transformers@v4.27.0 training_args.py:TrainingArguments.__post_init__ (--deepspeed checks accelerate is installed, no version; earlier releases do not use it)"),
    row(T, (4, 30, 0), HfMinAccelerate(Some(Version::new(0, 20, 1))), "transformers@v4.30.0 training_args.py:TrainingArguments._setup_devices (is_accelerate_available(min_version=\"0.20.1\"))"),
    row(T, (4, 45, 2), HfMinAccelerate(Some(Version::new(0, 26, 0))), "transformers@v4.45.2 utils/import_utils.py:ACCELERATE_MIN_VERSION, checked in training_args.py:_setup_devices (first release read with 0.26.0; same in v4.57.6)"),
    row(T, (5, 0, 0), HfMinAccelerate(Some(Version::new(1, 1, 0))), "transformers@v5.0.0 utils/import_utils.py:ACCELERATE_MIN_VERSION (same in v5.24.0)"),
    row(D, (0, 0, 0), DsManagedGradientAccumulation(false), "DeepSpeed@v0.19.3 runtime/config.py (no managed_gradient_accumulation)"),
    row(D, (0, 19, 4), DsManagedGradientAccumulation(true), "DeepSpeed@v0.19.4 runtime/engine.py:DeepSpeedEngine.set_gradient_accumulation_boundary (assert; docs/upstream.md §5.4)"),
    // ---- the training sampler and the loss scaling of accumulation (rules/data.rs R0707, rules/compat.rs R0912) ----
    row(T, (0, 0, 0), HfTrainSamplingStrategy(false), "transformers@v5.1.0 trainer.py:Trainer._get_train_sampler (RandomSampler unless group_by_length; same in v4.46.0, released wheels)"),
    row(T, (5, 2, 0), HfTrainSamplingStrategy(true), "transformers@v5.2.0 training_args.py:TrainingArguments.train_sampling_strategy, trainer.py:_get_train_sampler (\"sequential\": SequentialSampler; absent in v5.1.0; same in v5.24.0)"),
    row(T, (0, 0, 0), HfGaScaling(GaScaling::Mean), "transformers@v4.45.2 trainer.py:Trainer.training_step (returns loss / G; accelerate divides, DeepSpeed's backward divides under DeepSpeed)"),
    row(T, (4, 46, 0), HfGaScaling(GaScaling::TimesG), "transformers@v4.46.0 trainer.py:Trainer.training_step (`loss *= self.args.gradient_accumulation_steps` before accelerator.backward; same in v4.46.1)"),
    row(T, (4, 46, 2), HfGaScaling(GaScaling::Mean), "transformers@v4.46.2 trainer.py:Trainer.training_step (backward of the loss as computed; DeepSpeed divides; same in v4.47.1)"),
    row(T, (4, 48, 0), HfGaScaling(GaScaling::DividedTwice), "transformers@v4.48.0 trainer.py:Trainer.training_step (`loss / gradient_accumulation_steps` when num_items_in_batch is None; v4.48.1-v4.48.3: when not model_accepts_loss_kwargs; DeepSpeed's backward divides again)"),
    row(T, (4, 49, 0), HfGaScaling(GaScaling::UndividedWithLossKwargs), "transformers PR #35808, v4.49.0 trainer.py:Trainer.training_step (scale_wrt_gas=False under DeepSpeed; same in v4.57.6, v5.0.0; v5.24.0: loss_is_scaled_for_ga)"),
    row(T, (0, 0, 0), HfBertForwardKwargs(false), "transformers@v4.57.6 models/bert/modeling_bert.py:BertForSequenceClassification.forward (no **kwargs; likewise v4.46.0-v4.52.1)"),
    row(T, (5, 0, 0), HfBertForwardKwargs(true), "transformers@v5.0.0 models/bert/modeling_bert.py:BertForSequenceClassification.forward (**kwargs: Unpack[TransformersKwargs]; same in v5.24.0)"),
    // ---- BERT's tokenizer and tokenizer.json's lowercasing (rules/model.rs R0808) ----
    row(T, (0, 0, 0), HfBertDoLowerCaseDefault(true), "transformers@v4.57.6 models/bert/tokenization_bert_fast.py:BertTokenizerFast.__init__ (do_lower_case=True; the normalizer rebuilt when its lowercase differs; same in v4.41.0)"),
    row(T, (5, 0, 0), HfBertDoLowerCaseDefault(false), "transformers@v5.0.0 models/bert/tokenization_bert.py:BertTokenizer.__init__ (do_lower_case: bool = False; BertNormalizer(lowercase=do_lower_case); same in v5.1.0, v5.2.0)"),
    row(T, (5, 3, 0), HfBertDoLowerCaseDefault(true), "transformers@v5.3.0 models/bert/tokenization_bert.py:BertTokenizer.__init__ (do_lower_case: bool = True; same in v5.24.0)"),
];

impl Fact {
    fn apply(self, f: &mut Facts) {
        match self {
            HfStepRule(v) => f.hf_step_rule = v,
            UpdatesPerEpoch(v) => f.updates_per_epoch = v,
            Sharding(v) => f.sharding = v,
            WarmupArgs(v) => f.warmup_args = v,
            HfDsWarmupAtLeastOne(v) => f.hf_ds_warmup_at_least_one = v,
            HfMismatchChecks(v) => f.hf_mismatch_checks = v,
            HfDirectDeepSpeedInit(v) => f.hf_direct_deepspeed_init = v,
            HfApexAmp(v) => f.hf_apex_amp = v,
            HfFloatPrefetchBucket(v) => f.hf_float_prefetch_bucket = v,
            HfHiddenAutosAnyStage(v) => f.hf_hidden_autos_any_stage = v,
            HfCheckpointingField(v) => f.hf_checkpointing_field = v,
            DsBoundary(v) => f.ds_boundary = v,
            DsClippingDefault(v) => f.ds_clipping_default = v,
            DsPinMemoryDefault(v) => f.ds_pin_memory_default = v,
            DsWarmupStepsPositiveInt(v) => f.ds_warmup_steps_positive_int = v,
            DsWarmupLrDefaultsToOptimizerLr(v) => f.ds_warmup_lr_defaults_to_optimizer_lr = v,
            DsHasWarmupCosine(v) => f.ds_has_warmup_cosine = v,
            DsCosineClamped(v) => f.ds_cosine_clamped = v,
            DsWarmupInitWritesLr(v) => f.ds_warmup_init_writes_lr = v,
            DsOneCycleStairs(v) => f.ds_one_cycle_stairs = v,
            DsOneCycleZeroDecayOk(v) => f.ds_one_cycle_zero_decay_ok = v,
            DsSchedulerStepBatchSizeFallback(v) => f.ds_scheduler_step_batch_size_fallback = v,
            DsHasWarmupType(v) => f.ds_has_warmup_type = v,
            DsHasFp16AutoCast(v) => f.ds_has_fp16_auto_cast = v,
            DsBf16Key(v) => f.ds_bf16_key = v,
            DsOffloadOptimizerSection(v) => f.ds_offload_optimizer_section = v,
            DsRemovedLegacyFeatures(v) => f.ds_removed_legacy_features = v,
            DsZeroNeedsFp16(v) => f.ds_zero_needs_fp16 = v,
            DsZero0Fp16Unscaled(v) => f.ds_zero0_fp16_unscaled = v,
            DsBf16SkipsOverflow(v) => f.ds_bf16_skips_overflow = v,
            DsInitialScalePower(v) => f.ds_initial_scale_power = v,
            DsZero2EstimateNew(v) => f.ds_zero2_estimate_new = v,
            DsStrictZeroSections(v) => f.ds_strict_zero_sections = v,
            HfFullEvalEnablesDsHalf(v) => f.hf_full_eval_enables_ds_half = v,
            DsZero23WithoutFp16(v) => f.ds_zero23_without_fp16 = v,
            HfOffloadNeedsDsOptimizer(v) => f.hf_offload_needs_ds_optimizer = v,
            HfSchedulerKwargs(v) => f.hf_scheduler_kwargs = v,
            HfSgdAdagradOptimArgs(v) => f.hf_sgd_adagrad_optim_args = v,
            HfOptimNames(v) => f.hf_optim_names = v,
            HfSchedulerKinds(v) => f.hf_scheduler_kinds = v,
            HfDsOptimizerHfSchedulerError(v) => f.hf_ds_optimizer_hf_scheduler_error = v,
            AccCpuOptimizerByClass(v) => f.acc_cpu_optimizer_by_class = v,
            DsForceCpuOptimizer(v) => f.ds_force_cpu_optimizer = v,
            DsOptimizers(v) => f.ds_optimizers = v,
            DsZeroSupportedOptimizers(v) => f.ds_zero_supported_optimizers = v,
            DsBf16FixedLossScale(v) => f.ds_bf16_fixed_loss_scale = v,
            HfHiddenSizeRead(v) => f.hf_hidden_size_read = v,
            HfMinAccelerate(v) => f.hf_min_accelerate = v,
            DsManagedGradientAccumulation(v) => f.ds_managed_gradient_accumulation = v,
            HfTrainSamplingStrategy(v) => f.hf_train_sampling_strategy = v,
            HfGaScaling(v) => f.hf_ga_scaling = v,
            HfBertForwardKwargs(v) => f.hf_bert_forward_kwargs = v,
            HfBertDoLowerCaseDefault(v) => f.hf_bert_do_lower_case_default = v,
        }
    }
}

impl Facts {
    /// The facts that hold for these targets: every row whose version is reached, in order.
    pub fn for_targets(targets: &Targets) -> Facts {
        // Placeholder values; the 0.0.0 rows overwrite every field (tested below).
        let mut facts = Facts {
            hf_step_rule: self::HfStepRule::EpochModulo,
            updates_per_epoch: Rounding::Floor,
            sharding: self::Sharding::DistributedSampler,
            warmup_args: self::WarmupArgs::StepsOnly,
            hf_ds_warmup_at_least_one: false,
            hf_mismatch_checks: false,
            hf_direct_deepspeed_init: true,
            hf_apex_amp: false,
            hf_float_prefetch_bucket: true,
            hf_hidden_autos_any_stage: false,
            hf_checkpointing_field: "gradient_checkpointing",
            ds_boundary: self::DsBoundary::OwnCounter,
            ds_clipping_default: 0.0,
            ds_pin_memory_default: false,
            ds_warmup_steps_positive_int: false,
            ds_warmup_lr_defaults_to_optimizer_lr: false,
            ds_has_warmup_cosine: false,
            ds_cosine_clamped: false,
            ds_warmup_init_writes_lr: false,
            ds_one_cycle_stairs: false,
            ds_one_cycle_zero_decay_ok: false,
            ds_scheduler_step_batch_size_fallback: false,
            ds_has_warmup_type: false,
            ds_has_fp16_auto_cast: false,
            ds_bf16_key: None,
            ds_offload_optimizer_section: false,
            ds_removed_legacy_features: false,
            ds_zero_needs_fp16: true,
            ds_zero0_fp16_unscaled: false,
            ds_bf16_skips_overflow: false,
            ds_initial_scale_power: 32,
            ds_zero2_estimate_new: false,
            ds_strict_zero_sections: false,
            hf_full_eval_enables_ds_half: false,
            ds_zero23_without_fp16: false,
            hf_offload_needs_ds_optimizer: true,
            hf_scheduler_kwargs: false,
            hf_sgd_adagrad_optim_args: false,
            hf_optim_names: &[],
            hf_scheduler_kinds: &[],
            hf_ds_optimizer_hf_scheduler_error: None,
            acc_cpu_optimizer_by_class: false,
            ds_force_cpu_optimizer: false,
            ds_optimizers: &[],
            ds_zero_supported_optimizers: &[],
            ds_bf16_fixed_loss_scale: false,
            hf_hidden_size_read: self::HiddenSizeRead::Zero3,
            hf_min_accelerate: None,
            ds_managed_gradient_accumulation: false,
            hf_train_sampling_strategy: false,
            hf_ga_scaling: GaScaling::Mean,
            hf_bert_forward_kwargs: false,
            hf_bert_do_lower_case_default: true,
        };
        for change in CHANGES {
            if targets.get(change.library) >= change.since {
                change.fact.apply(&mut facts);
            }
        }
        // Under transformers ≤ 4.26 HF steps DeepSpeed on every micro-batch itself, whatever
        // accelerate is installed (docs/upstream.md §5.5): DeepSpeed counts on its own.
        if facts.hf_step_rule == self::HfStepRule::EpochModulo {
            facts.ds_boundary = self::DsBoundary::OwnCounter;
        }
        facts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(tf: &str, acc: &str, ds: &str) -> Targets {
        Targets {
            transformers: tf.parse().unwrap(),
            accelerate: acc.parse().unwrap(),
            deepspeed: ds.parse().unwrap(),
        }
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!("4.24".parse::<Version>().unwrap(), Version::new(4, 24, 0));
        assert!(Version::new(4, 9, 0) < Version::new(4, 24, 0));
        assert!("4.x".parse::<Version>().is_err());
        assert_eq!(Version::new(0, 19, 8).to_string(), "0.19.8");
    }

    #[test]
    fn rows_of_one_fact_are_in_version_order_and_start_at_zero() {
        use std::collections::HashMap;
        let mut last: HashMap<std::mem::Discriminant<Fact>, Version> = HashMap::new();
        for c in CHANGES {
            let d = std::mem::discriminant(&c.fact);
            match last.get(&d) {
                None => assert_eq!(
                    c.since,
                    Version::new(0, 0, 0),
                    "first row of {:?} must be 0.0.0",
                    c.fact
                ),
                Some(prev) => assert!(*prev < c.since, "{:?} out of order", c.fact),
            }
            last.insert(d, c.since);
        }
        // Every field has a 0.0.0 row: 53 facts.
        assert_eq!(last.len(), 53);
    }

    #[test]
    fn newest_stack() {
        let f = Facts::for_targets(&Targets::newest());
        assert_eq!(f.hf_step_rule, HfStepRule::EpochModuloOrLast);
        assert_eq!(f.updates_per_epoch, Rounding::Ceil);
        assert_eq!(f.ds_boundary, DsBoundary::FollowsHf);
        assert_eq!(f.warmup_args, WarmupArgs::FloatSteps);
        assert!(f.hf_ds_warmup_at_least_one && f.ds_cosine_clamped && f.ds_pin_memory_default);
        assert_eq!(f.ds_clipping_default, 1.0);
        assert_eq!(f.ds_bf16_key, Some("bf16"));
        assert_eq!(f.hf_checkpointing_field, "activation_checkpointing");
        assert!(f.hf_scheduler_kwargs && f.ds_one_cycle_zero_decay_ok);
        assert!(f.hf_train_sampling_strategy && f.hf_bert_forward_kwargs);
        assert_eq!(f.hf_ga_scaling, GaScaling::UndividedWithLossKwargs);
        // Every HF kind of the newest release is a `schedule` kind, and every HF `schedule`
        // kind is one of the newest release: a new upstream kind, or a new language kind,
        // trips this.
        let mut newest: Vec<&str> = f.hf_scheduler_kinds.to_vec();
        let mut language = crate::schema::blocks::HF_SCHEDULES.to_vec();
        newest.sort_unstable();
        language.sort_unstable();
        assert_eq!(newest, language);
    }

    #[test]
    fn seed_article_stack() {
        let f = Facts::for_targets(&t("4.6.1", "1.15.0", "0.3.16"));
        assert_eq!(f.hf_step_rule, HfStepRule::EpochModulo);
        assert_eq!(f.ds_boundary, DsBoundary::OwnCounter);
        assert_eq!(f.updates_per_epoch, Rounding::Floor);
        assert_eq!(f.warmup_args, WarmupArgs::StepsOnly);
        assert!(!f.hf_mismatch_checks && f.ds_zero_needs_fp16 && f.ds_offload_optimizer_section);
        assert_eq!(f.ds_bf16_key, None);
        assert!(!f.hf_scheduler_kwargs && !f.ds_one_cycle_zero_decay_ok);
        assert!(!f.hf_scheduler_kinds.contains(&"inverse_sqrt"));
        let f = Facts::for_targets(&t("4.36.0", "1.15.0", "0.5.5"));
        assert!(f.hf_scheduler_kwargs && f.ds_one_cycle_zero_decay_ok);
        assert!(!f.hf_scheduler_kinds.contains(&"cosine_with_min_lr"));
    }

    #[test]
    fn drift_window_newest_transformers_old_accelerate() {
        let f = Facts::for_targets(&t("5.24.0", "1.7.0", "0.19.8"));
        assert_eq!(f.hf_step_rule, HfStepRule::EpochModuloOrLast);
        assert_eq!(f.ds_boundary, DsBoundary::OwnCounter);
    }
}
