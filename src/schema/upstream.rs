//! Key sets of the upstream libraries: the hand-curated part.
//!
//! The per-release tables (transformers' `TrainingArguments` fields, the DeepSpeed top-level and
//! `zero_optimization` keys) are extracted from the released packages by
//! `conformance/extract_upstream.py` into [`super::upstream_versions`] (generated; do not edit it,
//! rerun the script: conformance/README.md, "Upstream key tables"). This file takes the newest of
//! those lists from there ([`DEEPSPEED_TOP_LEVEL`], the strict `zero_optimization` keys in
//! [`DEEPSPEED_STRICT_SECTIONS`], [`TRAINING_ARGUMENTS_FIELDS`]) and adds what the script cannot
//! derive: which sections are strict and their keys, renamed and deprecated keys with their history,
//! and per-key notes.
//!
//! Sources of the hand-curated tables (all read directly, names re-typed here; no upstream code is
//! copied):
//!
//! * DeepSpeed: `deepspeedai/DeepSpeed@v0.19.5` (git tag; `version.txt` = 0.19.5) and the 0.19.8
//!   sdist (its strict sections' new fields: `compile`, `hybrid_engine`, `tensor_parallel`,
//!   `zero_optimization`; the pydantic models of the two releases compared field by field), files
//!   `deepspeed/runtime/config.py` (`DeepSpeedConfig._initialize_params` and its getters),
//!   `deepspeed/runtime/constants.py`, `deepspeed/runtime/config_utils.py` (`DeepSpeedConfigModel`),
//!   `deepspeed/runtime/zero/{config,offload_config,leaf_module_config}.py`,
//!   `deepspeed/runtime/zenflow/zenflow_config.py`, `deepspeed/runtime/precision_config.py`,
//!   `deepspeed/monitor/config.py`, `deepspeed/comm/config.py`, `deepspeed/compile/config.py`,
//!   `deepspeed/utils/config.py`, `deepspeed/runtime/tensor_parallel/config.py`,
//!   `deepspeed/inference/config.py` (`WeightQuantConfig`), `deepspeed/__init__.py` (`initialize`),
//!   `deepspeed/runtime/data_pipeline/config.py`, `deepspeed/compression/config.py`,
//!   `deepspeed/runtime/swap_tensor/aio_config.py`, `deepspeed/module_inject/auto_ep_config.py`,
//!   `deepspeed/runtime/engine.py`; history via `git log -S` / older tags (v0.3.16 … v0.18.0) for the
//!   renamed table.
//! * transformers: `huggingface/transformers@v5.25.0:src/transformers/training_args.py`, read from the
//!   PyPI wheel of the same version (byte for byte v5.24.0's file); the 4.x/5.x history from the
//!   wheels of v4.24.0, v4.30.0, v4.33.0, v4.36.2, v4.41.0, v4.46.0, v4.47.0, v4.49.0, v4.50.0,
//!   v4.51.0, v4.52.1, v4.54.0, v4.56.0, v4.57.6, v5.0.0, v5.1.0, v5.2.0, v5.12.0, v5.14.1, v5.15.0,
//!   v5.18.0, v5.21.0, v5.22.0, v5.23.0, v5.24.0 (same file).
//!
//! The hand-curated tables describe DeepSpeed v0.19.8 and transformers v5.25.0, the newest sampled
//! releases (a test fails when the script samples a newer one, so that they are reviewed with it).
//!
//! Behaviour notes the checker relies on:
//! * DeepSpeed reads top-level keys with `dict.get`: an unknown top-level key is silently ignored
//!   (hence [`DEEPSPEED_TOP_LEVEL`] as a whitelist).
//! * Every pydantic section ([`DEEPSPEED_STRICT_SECTIONS`]) derives from `DeepSpeedConfigModel`
//!   (`extra="forbid"`, `populate_by_name=True`): an unknown key is an error, and both a field's name and
//!   its alias are accepted. Caveat: where a model is built by keyword (`Model(**dict)`: `zero_optimization`,
//!   `fp16`, `bf16`/`bfloat16`, `comms_logger`, `compile`, `hybrid_engine`, `tensor_parallel`,
//!   `timers.throughput`, `weight_quantization`), keys whose value is the string `"auto"` are dropped
//!   *before* validation, so an unknown key set to `"auto"` slips through there. Nested sub-models
//!   (`offload_optimizer`, `offload_param`, `zenflow`, `leaf_module`, `tensor_parallel.tp`, and
//!   `tensorboard`/`wandb`/`csv_monitor`/`comet`, which sit inside one monitor model) get no such filtering.

use super::upstream_versions::{
    DEEPSPEED_TOP_LEVEL_BY_VERSION, DEEPSPEED_ZERO_KEYS_BY_VERSION, TRAINING_ARGUMENTS_BY_VERSION,
};

/// `TrainingArguments` fields of one transformers release (the entries of the generated
/// [`TRAINING_ARGUMENTS_BY_VERSION`]): (field name, literal default as the Python `repr` string, or
/// `None` when the default is not a literal). Fields sorted (byte order), no duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfFields {
    /// Release version, e.g. `"4.24.0"`.
    pub version: &'static str,
    /// (field name, literal default as Python `repr`, or `None`), sorted by name.
    pub fields: &'static [(&'static str, Option<&'static str>)],
    /// Why a field's default is `None` in `fields` (exactly those fields, sorted by name): `no default:
    /// required argument`, `default_factory=...`, or `non-literal default `EXPR`` (for a class
    /// attribute, with the literals assigned to it in the class body).
    pub default_notes: &'static [(&'static str, &'static str)],
}

impl HfFields {
    /// The field list of the newest sampled release not newer than `target` (the oldest sampled
    /// one for anything older).
    pub fn for_target(target: crate::upstream::versions::Version) -> &'static HfFields {
        super::sampled::nearest(TRAINING_ARGUMENTS_BY_VERSION, target)
    }

    /// Whether the release has the field `name`.
    pub fn has(&self, name: &str) -> bool {
        self.fields.binary_search_by(|(n, _)| n.cmp(&name)).is_ok()
    }
}

/// The keys of the newest release in a generated per-version table (its last entry).
const fn newest(
    table: &'static [(&'static str, &'static [&'static str])],
) -> &'static [&'static str] {
    table[table.len() - 1].1
}

/// The field names of `fields`, in order (`N` = `fields.len()`).
const fn field_names<const N: usize>(
    fields: &'static [(&'static str, Option<&'static str>)],
) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = fields[i].0;
        i += 1;
    }
    out
}

/// Top-level keys DeepSpeed v0.19.8 reads from the ds_config dict (`deepspeed/runtime/config.py`
/// `DeepSpeedConfig.__init__`/`_initialize_params`/`_do_warning_check`, the sub-config getters it calls,
/// and `deepspeed/__init__.py:initialize`). Sorted (byte order), no duplicates: the last entry of the
/// generated [`DEEPSPEED_TOP_LEVEL_BY_VERSION`]; per-key notes in [`DEEPSPEED_KEY_NOTES`].
///
/// Not listed on purpose: `eigenvalue` (only read nested inside `quantize_training`), `fp32_allreduce`,
/// `seq_parallel_comm_data_type` (old names, no longer read; see [`DEEPSPEED_RENAMED`]). The
/// sections of the features 0.19.8 removed (`amp`, `sparse_attention`, …) are in older releases'
/// lists; 0.19.8 refuses them, which R0909 reports.
pub const DEEPSPEED_TOP_LEVEL: &[&str] = newest(DEEPSPEED_TOP_LEVEL_BY_VERSION);

/// Notes on ds_config keys of the sampled releases (dotted key, note), for readers of the generated
/// tables; renames and deprecations are in [`DEEPSPEED_RENAMED`]. Sorted by key, no duplicates; every
/// key is in some release's table in [`super::upstream_versions`].
pub const DEEPSPEED_KEY_NOTES: &[(&str, &str)] = &[
    ("activation_checkpointing", "read with dict.get, not strict"),
    (
        "allgather_size",
        "legacy: read only when `zero_optimization` is a bool (old format); becomes allgather_bucket_size",
    ),
    ("amp", "Apex AMP; every key but `enabled` is passed through to amp.initialize"),
    (
        "bfloat16",
        "the only bf16 section name in 0.5.10 (no `bf16`); from 0.6 on (sampled: 0.6.7) the legacy name \
         of `bf16`, read only when `bf16` is absent",
    ),
    ("curriculum_learning", "legacy curriculum (pre-data_efficiency); still read"),
    (
        "data_parallel_size",
        "read only in deepspeed.initialize, and only together with sequence_parallel_size (mesh device)",
    ),
    ("expert_parallel", "since v0.19.2"),
    ("fp32_allreduce", "not read any more from 0.5.10 on"),
    ("log_level", "since v0.19.3"),
    ("managed_gradient_accumulation", "since v0.19.4"),
    (
        "quantize_training",
        "legacy MoQ section: only its nested `eigenvalue` block is still read, and only when \
         compression_training weight quantization is enabled (see DEEPSPEED_RENAMED)",
    ),
    ("seq_parallel_comm_data_type", "renamed seq_parallel_communication_data_type in v0.16.5"),
    ("vocabulary_size", "only used for a tensor-core alignment warning"),
    ("weight_quantization", "inference-style WeightQuantConfig (post-init quantization)"),
    (
        "zero_optimization.cpu_offload_params",
        "with `s` (plain dict, up to 0.5.10); the pydantic versions name it cpu_offload_param",
    ),
    ("zero_optimization.find_unused_parameters", "renamed ignore_unused_parameters by 0.5.10"),
    (
        "zero_optimization.legacy_stage1",
        "read (0.5.10) / accepted (0.8.3 on); true raises (engine: unsupported since 0.5.9)",
    ),
    ("zero_optimization.offload_optimizer", "new in 0.3.15 (absent from the 0.3.14 sdist)"),
];

/// Sections DeepSpeed v0.19.8 validates strictly (pydantic models derived from `DeepSpeedConfigModel`,
/// `extra="forbid"`): dotted path of the section, then every accepted key (field names and aliases).
/// Sorted by section; each key list sorted; no duplicates.
///
/// Checked and NOT strict (plain `dict.get` readers, unknown keys ignored): `activation_checkpointing`,
/// `aio`, `amp`, `autotuning`, `checkpoint`, `compression_training`, `data_efficiency`, `data_types`,
/// `elasticity`, `expert_parallel`, `flops_profiler`, `nebula`, `optimizer`, `pipeline`,
/// `progressive_layer_drop`, `scheduler` (its `params` go to the scheduler constructor: unknown → TypeError),
/// `sparse_attention`, `timers` itself (only `timers.throughput` is a model), `datastates_ckpt`.
/// `zero_optimization.zeropp_loco_param` and `tensor_parallel.partition_config` are free-form dicts.
pub const DEEPSPEED_STRICT_SECTIONS: &[(&str, &[&str])] = &[
    // DeepSpeedBF16Config (strict since v0.17.1). Note: `check_overflow` (shown in a constants.py
    // docstring) is NOT a field.
    (
        "bf16",
        &[
            "bf16_master_weights_and_grads",
            "bf16_optimizer_states",
            "check_grad_overflow",
            "enabled",
            "immediate_grad_update",
        ],
    ),
    // Legacy section name, parsed by the same model as `bf16` (used only if `bf16` is absent).
    (
        "bfloat16",
        &[
            "bf16_master_weights_and_grads",
            "bf16_optimizer_states",
            "check_grad_overflow",
            "enabled",
            "immediate_grad_update",
        ],
    ),
    // monitor/config.py CometConfig
    (
        "comet",
        &[
            "api_key",
            "enabled",
            "experiment_key",
            "experiment_name",
            "mode",
            "online",
            "project",
            "samples_log_interval",
            "workspace",
        ],
    ),
    // comm/config.py CommsLoggerConfig
    (
        "comms_logger",
        &["debug", "enabled", "prof_all", "prof_ops", "verbose"],
    ),
    // compile/config.py CompileConfig (0.19.8 adds `autoep_non_moe`, `offload_activation_pin_memory`)
    (
        "compile",
        &[
            "autoep_non_moe",
            "debug_log",
            "deepcompile",
            "double_buffer",
            "free_activation",
            "free_activation_threshold",
            "keep_all_input_tensors",
            "keep_int_input_tensors",
            "offload_activation",
            "offload_activation_pin_memory",
            "offload_opt_states",
            "offload_parameters",
            "passes",
            "symmetric_memory",
            "sync_after_allgather",
            "sync_after_reduce",
            "sync_before_allgather",
            "sync_before_reduce",
        ],
    ),
    // monitor/config.py CSVConfig
    ("csv_monitor", &["enabled", "job_name", "output_path"]),
    // DeepSpeedFP16Config (strict since v0.17.1)
    (
        "fp16",
        &[
            "auto_cast",
            "consecutive_hysteresis",
            "enabled",
            "fp16_master_weights_and_grads",
            "hysteresis",
            "initial_scale_power",
            "loss_scale",
            "loss_scale_window",
            "min_loss_scale",
        ],
    ),
    // runtime/config.py HybridEngineConfig (0.19.8 adds `enable_cuda_graph`)
    (
        "hybrid_engine",
        &[
            "enable_cuda_graph",
            "enabled",
            "inference_tp_size",
            "max_out_tokens",
            "pin_parameters",
            "release_inference_cache",
            "tp_gather_partition_size",
        ],
    ),
    // tensor_parallel/config.py TPTrainingConfig; aliases: tp -> tensor_parallel,
    // kernel_inject -> replace_with_kernel_inject. (`dtype` expects a torch.dtype object.) 0.19.8
    // adds `vocab_parallel_ce_backend`, `vocab_parallel_lm_head`.
    (
        "tensor_parallel",
        &[
            "autotp_size",
            "dtype",
            "injection_policy_tuple",
            "keep_module_on_host",
            "kernel_inject",
            "partition_config",
            "preset_model",
            "replace_with_kernel_inject",
            "tensor_parallel",
            "tp",
            "tp_overlap_comm",
            "vocab_parallel_ce_backend",
            "vocab_parallel_lm_head",
        ],
    ),
    // TPConfig, reachable under either name of the field.
    (
        "tensor_parallel.tensor_parallel",
        &["mpu", "tp_grain_size", "tp_group", "tp_size"],
    ),
    (
        "tensor_parallel.tp",
        &["mpu", "tp_grain_size", "tp_group", "tp_size"],
    ),
    // monitor/config.py TensorBoardConfig
    ("tensorboard", &["enabled", "job_name", "output_path"]),
    // utils/config.py DeepSpeedThroughputTimerConfig
    ("timers.throughput", &["enabled", "synchronized"]),
    // monitor/config.py WandbConfig
    ("wandb", &["enabled", "group", "project", "team"]),
    // inference/config.py WeightQuantConfig (built only if the key is present)
    (
        "weight_quantization",
        &[
            "enabled",
            "num_bits",
            "post_init_quant",
            "q_groups",
            "q_type",
            "quantized_initialization",
        ],
    ),
    // zero/config.py DeepSpeedZeroConfig (strict since v0.7.0). Field name / alias pairs:
    // prefetch_bucket_size/stage3_prefetch_bucket_size, param_persistence_threshold/
    // stage3_param_persistence_threshold, model_persistence_threshold/stage3_model_persistence_threshold,
    // max_live_parameters/stage3_max_live_parameters, max_reuse_distance/stage3_max_reuse_distance,
    // gather_16bit_weights_on_model_save/stage3_gather_16bit_weights_on_model_save,
    // module_granularity_threshold/stage3_module_granularity_threshold,
    // use_all_reduce_for_fetch_params/stage3_use_all_reduce_for_fetch_params,
    // allgather_sequential/stage3_allgather_sequential.
    // Deprecated but accepted: cpu_offload, cpu_offload_param, cpu_offload_use_pin_memory,
    // stage3_gather_fp16_weights_on_model_save; legacy_stage1 (true raises).
    // Keys: the last entry of the generated DEEPSPEED_ZERO_KEYS_BY_VERSION (every name and alias).
    ("zero_optimization", newest(DEEPSPEED_ZERO_KEYS_BY_VERSION)),
    // zero/leaf_module_config.py DeepSpeedZeroLeafModuleConfig
    (
        "zero_optimization.leaf_module",
        &["classes", "name_suffixes", "names"],
    ),
    // zero/offload_config.py DeepSpeedZeroOffloadOptimizerConfig
    (
        "zero_optimization.offload_optimizer",
        &[
            "buffer_count",
            "cpuadam_cores_perc",
            "device",
            "fast_init",
            "nvme_path",
            "pin_memory",
            "pipeline_read",
            "pipeline_write",
            "ratio",
            "super_offload",
        ],
    ),
    // zero/offload_config.py DeepSpeedZeroOffloadParamConfig
    (
        "zero_optimization.offload_param",
        &[
            "buffer_count",
            "buffer_size",
            "device",
            "max_in_cpu",
            "nvme_path",
            "pin_memory",
        ],
    ),
    // zenflow/zenflow_config.py ZenFlowConfig (`steps_per_epoch` is a field, documented as set at runtime)
    (
        "zero_optimization.zenflow",
        &[
            "auto_ratio",
            "full_warm_up_rounds",
            "offload",
            "overlap_step",
            "pt_reserved_cores_perc",
            "select_interval",
            "select_strategy",
            "steps_per_epoch",
            "topk_ratio",
            "update_interval",
        ],
    ),
];

/// Deprecated / renamed DeepSpeed keys: (dotted old key, dotted new key or "", note incl. version,
/// honoured: whether v0.19.5 and v0.19.8 still apply the old key's value; if not, it is ignored or rejected).
/// Sorted by old key, no duplicate old keys.
pub const DEEPSPEED_RENAMED: &[(&str, &str, &str, bool)] = &[
    (
        "aio.thread_count",
        "aio.intra_op_parallelism",
        "renamed in v0.16.4 (PR #7056); old key silently ignored since (aio is not strict)",
        false,
    ),
    (
        "allgather_size",
        "zero_optimization.allgather_bucket_size",
        "legacy format `zero_optimization: true|false` + top-level allgather_size; still read in v0.19.5 \
         (true -> stage 1) with a deprecation warning",
        true,
    ),
    (
        "bf16.check_overflow",
        "bf16.check_grad_overflow",
        "never a field (appears only in a constants.py docstring since v0.17.1); rejected by the strict bf16 model",
        false,
    ),
    (
        "bfloat16",
        "bf16",
        "section renamed in v0.6.0; old name still read in v0.19.5, but only when `bf16` is absent",
        false,
    ),
    (
        "curriculum_learning",
        "data_efficiency.data_sampling.curriculum_learning",
        "legacy curriculum learning; data-efficiency library since v0.8.0; legacy top-level key still read",
        true,
    ),
    (
        "eigenvalue",
        "quantize_training.eigenvalue",
        "never read at top level: only nested in quantize_training (and eigenvalue MoQ asserts disabled since v0.7.0)",
        false,
    ),
    (
        "fp32_allreduce",
        "communication_data_type",
        "removed in v0.5.8 (PR #1487); use communication_data_type: \"fp32\"; old key silently ignored",
        false,
    ),
    (
        "optimizer.params.max_grad_norm",
        "gradient_clipping",
        "not an optimizer param: ValueError when DeepSpeed builds the optimizer (all versions since v0.3.x)",
        false,
    ),
    (
        "quantize_training",
        "compression_training",
        "MoQ section superseded by compression_training in v0.7.0; since then only its eigenvalue block is read",
        false,
    ),
    (
        "seq_parallel_comm_data_type",
        "seq_parallel_communication_data_type",
        "the old spelling was the real key in v0.11.2-v0.16.4; fixed in v0.16.5 (PR #7175); old key now ignored",
        false,
    ),
    (
        "zero_optimization.cpu_offload",
        "zero_optimization.offload_optimizer",
        "deprecated since v0.3.15; true -> {device: cpu} with a warning; both given -> error; \
         v0.7.0 only: mapped to device none (no offload, fixed v0.7.1)",
        true,
    ),
    (
        "zero_optimization.cpu_offload_param",
        "zero_optimization.offload_param",
        "deprecated (name since v0.7.0); true -> {device: cpu} with a warning; both given -> error",
        true,
    ),
    (
        "zero_optimization.cpu_offload_params",
        "zero_optimization.offload_param",
        "plural spelling of v0.3.x-v0.6.x; rejected (extra=forbid) since v0.7.0",
        false,
    ),
    (
        "zero_optimization.cpu_offload_use_pin_memory",
        "zero_optimization.offload_optimizer.pin_memory",
        "deprecated; warning only, value NOT applied: set pin_memory in offload_optimizer / offload_param",
        false,
    ),
    (
        "zero_optimization.find_unused_parameters",
        "zero_optimization.ignore_unused_parameters",
        "v0.3.x name (inverted meaning); renamed in v0.4.0; rejected (extra=forbid) since v0.7.0",
        false,
    ),
    (
        "zero_optimization.legacy_stage1",
        "",
        "old ZeRO-1 implementation removed in v0.5.9; key still accepted, true raises",
        true,
    ),
    (
        "zero_optimization.stage3_gather_fp16_weights_on_model_save",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "deprecated in v0.6.0; still accepted with a warning; both given -> error",
        true,
    ),
];

/// Fields of transformers' `TrainingArguments` at v5.25.0 (`src/transformers/training_args.py`,
/// dataclass fields; none is `init=False`). Sorted, complete (114): the names of the last entry of the
/// generated [`TRAINING_ARGUMENTS_BY_VERSION`]; per-field notes in [`TRAINING_ARGUMENTS_FIELD_NOTES`].
pub const TRAINING_ARGUMENTS_FIELDS: &[&str] = &NEWEST_TRAINING_ARGUMENTS;

const NEWEST_HF: HfFields = TRAINING_ARGUMENTS_BY_VERSION[TRAINING_ARGUMENTS_BY_VERSION.len() - 1];
const NEWEST_TRAINING_ARGUMENTS: [&str; NEWEST_HF.fields.len()] = field_names(NEWEST_HF.fields);

/// Notes on fields of [`TRAINING_ARGUMENTS_FIELDS`] (field, note), from the wheels listed in the module
/// doc. Sorted by field, no duplicates.
pub const TRAINING_ARGUMENTS_FIELD_NOTES: &[(&str, &str)] = &[
    (
        "activation_checkpointing",
        "since v5.23.0 (replaces gradient_checkpointing)",
    ),
    ("activation_checkpointing_kwargs", "since v5.23.0"),
    ("dataloader_in_order", "since v5.15.0"),
    ("dataloader_multiprocessing_context", "since v5.15.0"),
    (
        "ddp_static_graph",
        "since v5.3-v5.12 (absent in v5.2.0, present in v5.12.0)",
    ),
    ("enable_jit_checkpoint", "since v5.0.0"),
    (
        "gradient_checkpointing",
        "deprecated alias of activation_checkpointing since v5.23.0",
    ),
    (
        "gradient_checkpointing_kwargs",
        "deprecated alias of activation_checkpointing_kwargs since v5.23.0",
    ),
    ("trackio_bucket_id", "since v5.3-v5.12"),
    ("trackio_static_space_id", "since v5.3-v5.12"),
    (
        "train_sampling_strategy",
        "since v5.2.0 (replaces group_by_length)",
    ),
    ("use_cache", "since v5.0.0"),
    (
        "warmup_steps",
        "float since v5.0: value in [0, 1) is a ratio of total steps",
    ),
];

/// `TrainingArguments` fields of transformers 4.x (v4.24.0 … v4.57.6, incl. fields that lived only between
/// them) that were removed or renamed by v5.25.0: (old field, new v5.25.0 field or "", note).
/// Sorted by old field, no duplicates. None of the old fields is accepted by v5.25.0 (passing one raises
/// `TypeError: unexpected keyword argument`). Version bounds are the sampled releases listed in the
/// module doc. Renamed fields that v5.25.0 still accepts are in [`TRAINING_ARGUMENTS_DEPRECATED_ALIASES`].
pub const TRAINING_ARGUMENTS_RENAMED: &[(&str, &str, &str)] = &[
    ("adafactor", "optim", "use optim=\"adafactor\"; removed in v5.0.0"),
    (
        "dispatch_batches",
        "accelerator_config",
        "deprecated: pass {\"dispatch_batches\": ...} in accelerator_config; removed in v4.51.0",
    ),
    (
        "evaluation_strategy",
        "eval_strategy",
        "renamed in v4.41.0 (old name deprecated); old field removed in v4.51.0",
    ),
    (
        "fp16_backend",
        "",
        "deprecated alias of half_precision_backend, both removed in v5.0.0 (v5: torch AMP only, no apex)",
    ),
    ("fp16_opt_level", "", "Apex AMP opt level; removed in v5.0.0 (no apex in v5)"),
    (
        "fsdp_min_num_params",
        "fsdp_config",
        "deprecated: use fsdp_config min_num_params; removed in v5.0.0",
    ),
    (
        "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_config",
        "deprecated: use fsdp_config transformer_layer_cls_to_wrap; removed in v5.0.0",
    ),
    (
        "group_by_length",
        "train_sampling_strategy",
        "removed in v5.2.0: use train_sampling_strategy=\"group_by_length\"",
    ),
    (
        "half_precision_backend",
        "",
        "removed in v5.0.0 (apex / cpu_amp backends gone; fp16/bf16 use torch AMP)",
    ),
    (
        "include_inputs_for_metrics",
        "include_for_metrics",
        "deprecated in v4.46.0: use include_for_metrics=[\"inputs\"]; removed in v5.0.0",
    ),
    ("include_tokens_per_second", "", "removed in v5.0.0"),
    ("jit_mode_eval", "", "removed in v5.0.0"),
    (
        "logging_dir",
        "",
        "deprecated in v5.0.0 (set env TENSORBOARD_LOGGING_DIR instead); removed in v5.15.0",
    ),
    ("mp_parameters", "", "SageMaker model-parallel args; removed in v5.0.0"),
    ("no_cuda", "use_cpu", "deprecated (use_cpu exists since v4.31-v4.33); removed in v5.0.0"),
    ("overwrite_output_dir", "", "removed in v5.0.0"),
    ("past_index", "", "removed in v5.0.0"),
    (
        "per_gpu_eval_batch_size",
        "per_device_eval_batch_size",
        "long deprecated; removed in v5.0.0",
    ),
    (
        "per_gpu_train_batch_size",
        "per_device_train_batch_size",
        "long deprecated; removed in v5.0.0",
    ),
    ("push_to_hub_model_id", "hub_model_id", "deprecated; removed in v5.0.0"),
    (
        "push_to_hub_organization",
        "hub_model_id",
        "deprecated: use hub_model_id=\"org/name\"; removed in v5.0.0",
    ),
    ("push_to_hub_token", "hub_token", "deprecated; removed in v5.0.0"),
    ("ray_scope", "", "Ray hyperparameter-search scope; removed in v5.0.0"),
    (
        "save_safetensors",
        "",
        "removed in v5.0.0 (no switch any more; checkpoints are safetensors)",
    ),
    (
        "sharded_ddp",
        "",
        "fairscale sharded DDP; removed between v4.33.0 and v4.36.2 (use fsdp or deepspeed)",
    ),
    (
        "split_batches",
        "accelerator_config",
        "deprecated: pass {\"split_batches\": true} in accelerator_config; removed in v4.51.0",
    ),
    (
        "torchdynamo",
        "torch_compile_backend",
        "deprecated: use torch_compile_backend; removed in v5.0.0",
    ),
    (
        "tp_size",
        "",
        "tensor-parallel size, only in v4.50-v4.51 (absent in v4.52.1); TP is configured via parallelism_config \
         (v4.56+) / model loading",
    ),
    (
        "tpu_metrics_debug",
        "debug",
        "deprecated: use debug=\"tpu_metrics_debug\"; removed in v5.0.0",
    ),
    ("tpu_num_cores", "", "removed in v5.0.0"),
    (
        "use_ipex",
        "",
        "Intel Extension for PyTorch switch; removed in v4.57 (present in v4.56.0, absent in v4.57.6)",
    ),
    ("use_legacy_prediction_loop", "", "removed in v5.0.0"),
    (
        "use_mps_device",
        "",
        "deprecated (mps is picked automatically like cuda); removed in v5.0.0",
    ),
    (
        "warmup_ratio",
        "warmup_steps",
        "deprecated in v5.0.0 (warmup_steps takes a float in [0, 1) as a ratio; note 1 means one step); \
         removed in v5.15.0",
    ),
    (
        "xpu_backend",
        "ddp_backend",
        "removed between v4.30.0 and v4.33.0; ddp_backend (since v4.25-v4.30) covers it",
    ),
];

/// Fields renamed in v5.x that v5.25.0 still accepts as deprecated aliases (FutureWarning; the value is
/// copied to the new field when the new one is unset): (old field, new field, note). Both names are in
/// [`TRAINING_ARGUMENTS_FIELDS`]. Sorted, no duplicates.
pub const TRAINING_ARGUMENTS_DEPRECATED_ALIASES: &[(&str, &str, &str)] = &[
    (
        "gradient_checkpointing",
        "activation_checkpointing",
        "renamed in v5.23.0; old name still accepted in v5.25.0 (FutureWarning, removal planned for v6)",
    ),
    (
        "gradient_checkpointing_kwargs",
        "activation_checkpointing_kwargs",
        "renamed in v5.23.0; old name still accepted in v5.25.0 (FutureWarning, removal planned for v6)",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_sorted_unique(name: &str, items: &[&str]) {
        assert!(!items.is_empty(), "{name} is empty");
        for w in items.windows(2) {
            assert!(
                w[0] < w[1],
                "{name}: {:?} must sort strictly before {:?}",
                w[0],
                w[1]
            );
        }
    }

    fn first_segment(key: &str) -> &str {
        key.split('.').next().unwrap_or(key)
    }

    #[test]
    fn deepspeed_top_level_sorted_unique() {
        assert_sorted_unique("DEEPSPEED_TOP_LEVEL", DEEPSPEED_TOP_LEVEL);
        assert_eq!(DEEPSPEED_TOP_LEVEL.len(), 52);
    }

    #[test]
    fn hand_tables_describe_the_newest_sampled_releases() {
        // The strict sections, DEEPSPEED_RENAMED's `honoured` and the TrainingArguments rename
        // tables are for DeepSpeed v0.19.8 and transformers v5.25.0. When
        // conformance/extract_upstream.py samples a newer release, review them, then update this test.
        let ds = DEEPSPEED_TOP_LEVEL_BY_VERSION.last().map(|(v, _)| *v);
        assert_eq!(ds, Some("0.19.8"));
        assert_eq!(DEEPSPEED_ZERO_KEYS_BY_VERSION.last().map(|(v, _)| *v), ds);
        assert_eq!(
            TRAINING_ARGUMENTS_BY_VERSION.last().map(|h| h.version),
            Some("5.25.0")
        );
        let names: Vec<&str> = NEWEST_HF.fields.iter().map(|(n, _)| *n).collect();
        assert_eq!(TRAINING_ARGUMENTS_FIELDS, names.as_slice());
    }

    #[test]
    fn deepspeed_key_notes_name_sampled_keys() {
        let keys: Vec<&str> = DEEPSPEED_KEY_NOTES.iter().map(|(k, _)| *k).collect();
        assert_sorted_unique("DEEPSPEED_KEY_NOTES", &keys);
        for (key, note) in DEEPSPEED_KEY_NOTES {
            assert!(!note.is_empty(), "{key}: empty note");
            let (table, leaf) = match key.split_once('.') {
                None => (DEEPSPEED_TOP_LEVEL_BY_VERSION, *key),
                Some(("zero_optimization", leaf)) => (DEEPSPEED_ZERO_KEYS_BY_VERSION, leaf),
                Some(_) => panic!("{key}: only top-level and zero_optimization keys are sampled"),
            };
            assert!(
                table.iter().any(|(_, keys)| keys.contains(&leaf)),
                "{key} is in no sampled release"
            );
        }
    }

    #[test]
    fn training_arguments_field_notes_name_fields() {
        let fields: Vec<&str> = TRAINING_ARGUMENTS_FIELD_NOTES
            .iter()
            .map(|(f, _)| *f)
            .collect();
        assert_sorted_unique("TRAINING_ARGUMENTS_FIELD_NOTES", &fields);
        for (field, note) in TRAINING_ARGUMENTS_FIELD_NOTES {
            assert!(!note.is_empty(), "{field}: empty note");
            assert!(
                TRAINING_ARGUMENTS_FIELDS.contains(field),
                "{field} is not a v5.25.0 field"
            );
        }
    }

    #[test]
    fn deepspeed_strict_sections_sorted_unique() {
        let names: Vec<&str> = DEEPSPEED_STRICT_SECTIONS.iter().map(|(s, _)| *s).collect();
        assert_sorted_unique("DEEPSPEED_STRICT_SECTIONS (sections)", &names);
        for (section, keys) in DEEPSPEED_STRICT_SECTIONS {
            assert_sorted_unique(section, keys);
            assert!(
                DEEPSPEED_TOP_LEVEL.contains(&first_segment(section)),
                "strict section {section} is not under a top-level key"
            );
        }
        for required in [
            "bf16",
            "fp16",
            "zero_optimization",
            "zero_optimization.offload_optimizer",
            "zero_optimization.offload_param",
        ] {
            assert!(
                names.contains(&required),
                "missing strict section {required}"
            );
        }
    }

    #[test]
    fn deepspeed_strict_subsections_are_fields_of_their_parent() {
        for (section, _) in DEEPSPEED_STRICT_SECTIONS {
            let Some((parent, child)) = section.rsplit_once('.') else {
                continue;
            };
            let parent_keys = DEEPSPEED_STRICT_SECTIONS
                .iter()
                .find(|(s, _)| *s == parent)
                .map(|(_, keys)| *keys);
            if let Some(keys) = parent_keys {
                assert!(keys.contains(&child), "{child} is not a key of {parent}");
            }
        }
    }

    #[test]
    fn deepspeed_renamed_sorted_unique_and_consistent() {
        let olds: Vec<&str> = DEEPSPEED_RENAMED.iter().map(|(o, _, _, _)| *o).collect();
        assert_sorted_unique("DEEPSPEED_RENAMED (old keys)", &olds);
        for (old, new, note, _) in DEEPSPEED_RENAMED {
            assert!(!note.is_empty(), "{old}: empty note");
            assert_ne!(old, new);
            // Under a top-level key of some sampled release (0.19.8 removed `quantize_training`,
            // where `eigenvalue` moved).
            if !new.is_empty() {
                assert!(
                    DEEPSPEED_TOP_LEVEL_BY_VERSION
                        .iter()
                        .any(|(_, keys)| keys.contains(&first_segment(new))),
                    "{old}: new key {new} is not under a top-level key"
                );
            }
        }
    }

    #[test]
    fn training_arguments_fields_sorted_unique() {
        assert_sorted_unique("TRAINING_ARGUMENTS_FIELDS", TRAINING_ARGUMENTS_FIELDS);
        assert_eq!(TRAINING_ARGUMENTS_FIELDS.len(), 114);
    }

    #[test]
    fn training_arguments_renamed_sorted_unique_and_consistent() {
        let olds: Vec<&str> = TRAINING_ARGUMENTS_RENAMED
            .iter()
            .map(|(o, _, _)| *o)
            .collect();
        assert_sorted_unique("TRAINING_ARGUMENTS_RENAMED (old fields)", &olds);
        for (old, new, note) in TRAINING_ARGUMENTS_RENAMED {
            assert!(!note.is_empty(), "{old}: empty note");
            assert_ne!(old, new);
            assert!(
                !TRAINING_ARGUMENTS_FIELDS.contains(old),
                "{old} is still a v5.25.0 field"
            );
            if !new.is_empty() {
                assert!(
                    TRAINING_ARGUMENTS_FIELDS.contains(new),
                    "{old}: replacement {new} is not a v5.25.0 field"
                );
            }
        }
    }

    #[test]
    fn training_arguments_deprecated_aliases_are_fields() {
        let olds: Vec<&str> = TRAINING_ARGUMENTS_DEPRECATED_ALIASES
            .iter()
            .map(|(o, _, _)| *o)
            .collect();
        assert_sorted_unique("TRAINING_ARGUMENTS_DEPRECATED_ALIASES", &olds);
        for (old, new, _) in TRAINING_ARGUMENTS_DEPRECATED_ALIASES {
            assert!(TRAINING_ARGUMENTS_FIELDS.contains(old), "{old} missing");
            assert!(TRAINING_ARGUMENTS_FIELDS.contains(new), "{new} missing");
            assert!(
                !TRAINING_ARGUMENTS_RENAMED.iter().any(|(o, _, _)| o == old),
                "{old} is also in TRAINING_ARGUMENTS_RENAMED"
            );
        }
    }
}
