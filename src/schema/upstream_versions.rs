//! Per-version key sets of transformers' `TrainingArguments` and of the DeepSpeed config, read from the
//! released packages on PyPI (the same method as [`super::upstream`]; names re-typed, no upstream code copied).
//!
//! # transformers
//!
//! Source: the PyPI wheel `transformers==X` (`python3 -m pip download --no-deps transformers==X`), file
//! `transformers/training_args.py` (`src/transformers/training_args.py` in the repository), parsed with
//! Python's `ast`: every annotated assignment in the body of `class TrainingArguments` (a `@dataclass`
//! with no base class, so these are all its dataclass fields). Versions: 4.6.1, 4.24.0, 4.30.0, 4.41.0,
//! 4.46.0 (a yanked release on PyPI, yanked only for Python 3.8), 4.52.1, 4.57.6, 5.0.0, 5.24.0.
//!
//! * Excluded: `_n_gpu` (`field(init=False)`, 4.6.1 … 4.57.6): it is not an `__init__` argument, so
//!   passing it raises `TypeError`. No other field is `init=False`; no `ClassVar` fields. Plain class
//!   attributes without an annotation (`framework`, `default_optim`, `_VALID_DICT_FIELDS`) are not fields.
//! * Default: `Some(repr)` when the dataclass default (`= X` or `field(default=X)`) is a Python literal
//!   (`ast.literal_eval` succeeds), written as Python's `repr` (so `Some("None")` is a literal `None`
//!   default and `Some("'no'")` the string `no`). `None` when there is no literal default: a
//!   `default_factory`, a non-literal expression, or no default at all (`output_dir` is required up to
//!   4.46.0); the line then carries a comment. These are the dataclass defaults, before `__post_init__`
//!   (which rewrites some of them, e.g. `report_to` and `logging_dir` in 4.x).
//! * Type annotations differ between versions; notably `warmup_steps` is `int` up to 4.57.6 and `float`
//!   in 5.0.0 and 5.24.0 (a value in [0, 1) is then a ratio).
//!
//! # DeepSpeed
//!
//! Source: the PyPI sdists `deepspeed==X` (0.3.16, 0.5.10, 0.8.3, 0.14.2, 0.19.5; `version.txt` and
//! `PKG-INFO` checked), files `deepspeed/runtime/config.py` (`DeepSpeedConfig.__init__`,
//! `_initialize_params`, `_do_warning_check` and every `get_*` reader they call),
//! `deepspeed/runtime/constants.py`, `deepspeed/runtime/zero/{config,constants,offload_config,
//! offload_constants}.py`, plus the section readers reached from there (elasticity, activation
//! checkpointing, flops profiler, aio, autotuning, monitor, comm, compression, data_pipeline, nebula,
//! compile, precision, timers, tensor_parallel, …) and, for 0.19.5, `deepspeed/__init__.py:initialize`.
//! Keys were collected by following the top-level dict through those calls with Python's `ast`
//! (constants resolved through the modules' imports) and checked by hand. The 0.19.5 lists equal
//! [`super::upstream`]'s `DEEPSPEED_TOP_LEVEL` and its strict `zero_optimization` key list.
//!
//! * Top level: DeepSpeed reads it with `dict.get` in every version listed, so an unknown top-level key
//!   is silently ignored; a key missing from a version's list is one that version does not read.
//! * `zero_optimization`: up to 0.5.10 it is a plain dict read with `dict.get` (unknown keys ignored);
//!   in 0.8.3, 0.14.2 and 0.19.5 (first sampled: 0.8.3; [`super::upstream`] dates it to v0.7.0) it is
//!   the pydantic model `DeepSpeedZeroConfig`
//!   (`extra = "forbid"`, field names and aliases both accepted, deprecated fields accepted with a
//!   warning): an unknown key is an error. Listed: the keys the version reads (≤ 0.5.10) or accepts
//!   (≥ 0.8.3: every field name and alias, deprecated ones included).

/// `TrainingArguments` fields of one transformers release: (field name, literal default as the Python
/// `repr` string, or `None` when the default is not a literal). Fields sorted (byte order), no duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfFields {
    /// Release version, e.g. `"4.24.0"`.
    pub version: &'static str,
    /// (field name, literal default as Python `repr`, or `None`), sorted by name.
    pub fields: &'static [(&'static str, Option<&'static str>)],
}

impl HfFields {
    /// The field list of the newest sampled release not newer than `target` (the oldest sampled
    /// one for anything older).
    pub fn for_target(target: crate::upstream::versions::Version) -> &'static HfFields {
        let parse = |f: &HfFields| {
            f.version
                .parse::<crate::upstream::versions::Version>()
                .expect("sampled versions parse")
        };
        TRAINING_ARGUMENTS_BY_VERSION
            .iter()
            .rev()
            .find(|f| parse(f) <= target)
            .unwrap_or(&TRAINING_ARGUMENTS_BY_VERSION[0])
    }

    /// Whether the release has the field `name`.
    pub fn has(&self, name: &str) -> bool {
        self.fields.binary_search_by(|(n, _)| n.cmp(&name)).is_ok()
    }
}

/// `TrainingArguments` dataclass fields of sampled transformers releases, sorted by version (numeric).
/// Source: PyPI wheel `transformers==X`, `src/transformers/training_args.py` (see the module doc).
pub const TRAINING_ARGUMENTS_BY_VERSION: &[HfFields] = &[
    // transformers 4.6.1: PyPI wheel transformers==4.6.1, src/transformers/training_args.py (67 fields)
    HfFields {
        version: "4.6.1",
        fields: &[
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_pin_memory", Some("True")),
            ("ddp_find_unused_parameters", Some("None")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_steps", Some("None")),
            ("evaluation_strategy", Some("'no'")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("gradient_accumulation_steps", Some("1")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("ignore_data_skip", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("logging_dir", None), // default_factory=default_logdir
            ("logging_first_step", Some("False")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("output_dir", None), // no default: required argument
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("sharded_ddp", Some("''")),
            ("skip_memory_metrics", Some("False")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_legacy_prediction_loop", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 4.24.0: PyPI wheel transformers==4.24.0, src/transformers/training_args.py (101 fields)
    HfFields {
        version: "4.24.0",
        fields: &[
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_pin_memory", Some("True")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_steps", Some("None")),
            ("evaluation_strategy", Some("'no'")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("''")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("False")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_inputs_for_metrics", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'passive'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", Some("'adamw_hf'")),
            ("output_dir", None), // no default: required argument
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("sharded_ddp", Some("''")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_ipex", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
            ("xpu_backend", Some("None")),
        ],
    },
    // transformers 4.30.0: PyPI wheel transformers==4.30.0, src/transformers/training_args.py (108 fields)
    HfFields {
        version: "4.30.0",
        fields: &[
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_pin_memory", Some("True")),
            ("ddp_backend", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_steps", Some("None")),
            ("evaluation_strategy", Some("'no'")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("''")),
            ("fsdp_config", Some("None")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("False")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_inputs_for_metrics", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_hf'
            ("optim_args", Some("None")),
            ("output_dir", None), // no default: required argument
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_safetensors", Some("False")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("sharded_ddp", Some("''")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_ipex", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
            ("xpu_backend", Some("None")),
        ],
    },
    // transformers 4.41.0: PyPI wheel transformers==4.41.0, src/transformers/training_args.py (125 fields)
    HfFields {
        version: "4.41.0",
        fields: &[
            ("accelerator_config", Some("None")),
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", None), // non-literal default `None if not is_torch_available() or is_torch_greater_or_equal_than_2_0 else 2`
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("dispatch_batches", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("evaluation_strategy", Some("None")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("''")),
            ("fsdp_config", Some("None")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("False")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_inputs_for_metrics", Some("False")),
            ("include_num_input_tokens_seen", Some("False")),
            ("include_tokens_per_second", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", None), // default_factory=dict
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("neftune_noise_alpha", Some("None")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch'
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", None), // no default: required argument
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_safetensors", Some("True")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("split_batches", Some("None")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_cpu", Some("False")),
            ("use_ipex", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 4.46.0: PyPI wheel transformers==4.46.0, src/transformers/training_args.py (130 fields)
    HfFields {
        version: "4.46.0",
        fields: &[
            ("accelerator_config", Some("None")),
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", None), // non-literal default `None if not is_torch_available() or is_torch_greater_or_equal_than_2_0 else 2`
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("dispatch_batches", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_on_start", Some("False")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("eval_use_gather_object", Some("False")),
            ("evaluation_strategy", Some("None")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("''")),
            ("fsdp_config", Some("None")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("False")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_for_metrics", None), // default_factory=list
            ("include_inputs_for_metrics", Some("False")),
            ("include_num_input_tokens_seen", Some("False")),
            ("include_tokens_per_second", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", None), // default_factory=dict
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("neftune_noise_alpha", Some("None")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch'
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", None), // no default: required argument
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_safetensors", Some("True")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("split_batches", Some("None")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torch_empty_cache_steps", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_cpu", Some("False")),
            ("use_ipex", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_liger_kernel", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 4.52.1: PyPI wheel transformers==4.52.1, src/transformers/training_args.py (128 fields)
    HfFields {
        version: "4.52.1",
        fields: &[
            ("accelerator_config", Some("None")),
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("average_tokens_across_devices", Some("False")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", Some("None")),
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_on_start", Some("False")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("eval_use_gather_object", Some("False")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("''")),
            ("fsdp_config", Some("None")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("None")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_for_metrics", None), // default_factory=list
            ("include_inputs_for_metrics", Some("False")),
            ("include_num_input_tokens_seen", Some("False")),
            ("include_tokens_per_second", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", None), // default_factory=dict
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("neftune_noise_alpha", Some("None")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch'
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", Some("None")),
            ("overwrite_output_dir", Some("False")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_safetensors", Some("True")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torch_empty_cache_steps", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("use_cpu", Some("False")),
            ("use_ipex", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_liger_kernel", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 4.57.6: PyPI wheel transformers==4.57.6, src/transformers/training_args.py (132 fields)
    HfFields {
        version: "4.57.6",
        fields: &[
            ("accelerator_config", Some("None")),
            ("adafactor", Some("False")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("average_tokens_across_devices", Some("True")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", Some("None")),
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_on_start", Some("False")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("eval_use_gather_object", Some("False")),
            ("fp16", Some("False")),
            ("fp16_backend", Some("'auto'")),
            ("fp16_full_eval", Some("False")),
            ("fp16_opt_level", Some("'O1'")),
            ("fsdp", Some("None")),
            ("fsdp_config", Some("None")),
            ("fsdp_min_num_params", Some("0")),
            ("fsdp_transformer_layer_cls_to_wrap", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("half_precision_backend", Some("'auto'")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("None")),
            ("hub_revision", Some("None")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_for_metrics", None), // default_factory=list
            ("include_inputs_for_metrics", Some("False")),
            ("include_num_input_tokens_seen", Some("False")),
            ("include_tokens_per_second", Some("False")),
            ("jit_mode_eval", Some("False")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("liger_kernel_config", Some("None")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", Some("None")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("mp_parameters", Some("''")),
            ("neftune_noise_alpha", Some("None")),
            ("no_cuda", Some("False")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch', 'adamw_torch_fused' with torch >= 2.8
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", Some("None")),
            ("overwrite_output_dir", Some("False")),
            ("parallelism_config", Some("None")),
            ("past_index", Some("-1")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("per_gpu_eval_batch_size", Some("None")),
            ("per_gpu_train_batch_size", Some("None")),
            ("prediction_loss_only", Some("False")),
            ("project", Some("'huggingface'")),
            ("push_to_hub", Some("False")),
            ("push_to_hub_model_id", Some("None")),
            ("push_to_hub_organization", Some("None")),
            ("push_to_hub_token", Some("None")),
            ("ray_scope", Some("'last'")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("None")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_safetensors", Some("True")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torch_empty_cache_steps", Some("None")),
            ("torchdynamo", Some("None")),
            ("tpu_metrics_debug", Some("False")),
            ("tpu_num_cores", Some("None")),
            ("trackio_space_id", Some("'trackio'")),
            ("use_cpu", Some("False")),
            ("use_legacy_prediction_loop", Some("False")),
            ("use_liger_kernel", Some("False")),
            ("use_mps_device", Some("False")),
            ("warmup_ratio", Some("0.0")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 5.0.0: PyPI wheel transformers==5.0.0, src/transformers/training_args.py (109 fields)
    HfFields {
        version: "5.0.0",
        fields: &[
            ("accelerator_config", Some("None")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("average_tokens_across_devices", Some("True")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", Some("None")),
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("enable_jit_checkpoint", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_on_start", Some("False")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("eval_use_gather_object", Some("False")),
            ("fp16", Some("False")),
            ("fp16_full_eval", Some("False")),
            ("fsdp", Some("None")),
            ("fsdp_config", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("False")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("group_by_length", Some("False")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("None")),
            ("hub_revision", Some("None")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_for_metrics", None), // default_factory=list
            ("include_num_input_tokens_seen", Some("'no'")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("liger_kernel_config", Some("None")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_dir", Some("None")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", Some("None")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("neftune_noise_alpha", Some("None")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch', 'adamw_torch_fused' with torch >= 2.8
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", Some("None")),
            ("parallelism_config", Some("None")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("prediction_loss_only", Some("False")),
            ("project", Some("'huggingface'")),
            ("push_to_hub", Some("False")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("'none'")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torch_empty_cache_steps", Some("None")),
            ("trackio_space_id", Some("'trackio'")),
            ("use_cache", Some("False")),
            ("use_cpu", Some("False")),
            ("use_liger_kernel", Some("False")),
            ("warmup_ratio", Some("None")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
    // transformers 5.24.0: PyPI wheel transformers==5.24.0, src/transformers/training_args.py (114 fields)
    HfFields {
        version: "5.24.0",
        fields: &[
            ("accelerator_config", Some("None")),
            ("activation_checkpointing", Some("None")),
            ("activation_checkpointing_kwargs", Some("None")),
            ("adam_beta1", Some("0.9")),
            ("adam_beta2", Some("0.999")),
            ("adam_epsilon", Some("1e-08")),
            ("auto_find_batch_size", Some("False")),
            ("average_tokens_across_devices", Some("True")),
            ("batch_eval_metrics", Some("False")),
            ("bf16", Some("False")),
            ("bf16_full_eval", Some("False")),
            ("data_seed", Some("None")),
            ("dataloader_drop_last", Some("False")),
            ("dataloader_in_order", Some("True")),
            ("dataloader_multiprocessing_context", Some("None")),
            ("dataloader_num_workers", Some("0")),
            ("dataloader_persistent_workers", Some("False")),
            ("dataloader_pin_memory", Some("True")),
            ("dataloader_prefetch_factor", Some("None")),
            ("ddp_backend", Some("None")),
            ("ddp_broadcast_buffers", Some("None")),
            ("ddp_bucket_cap_mb", Some("None")),
            ("ddp_find_unused_parameters", Some("None")),
            ("ddp_static_graph", Some("None")),
            ("ddp_timeout", Some("1800")),
            ("debug", Some("''")),
            ("deepspeed", Some("None")),
            ("disable_tqdm", Some("None")),
            ("do_eval", Some("False")),
            ("do_predict", Some("False")),
            ("do_train", Some("False")),
            ("enable_jit_checkpoint", Some("False")),
            ("eval_accumulation_steps", Some("None")),
            ("eval_delay", Some("0")),
            ("eval_do_concat_batches", Some("True")),
            ("eval_on_start", Some("False")),
            ("eval_steps", Some("None")),
            ("eval_strategy", Some("'no'")),
            ("eval_use_gather_object", Some("False")),
            ("fp16", Some("False")),
            ("fp16_full_eval", Some("False")),
            ("fsdp", Some("None")),
            ("fsdp_config", Some("None")),
            ("full_determinism", Some("False")),
            ("gradient_accumulation_steps", Some("1")),
            ("gradient_checkpointing", Some("None")),
            ("gradient_checkpointing_kwargs", Some("None")),
            ("greater_is_better", Some("None")),
            ("hub_always_push", Some("False")),
            ("hub_model_id", Some("None")),
            ("hub_private_repo", Some("None")),
            ("hub_revision", Some("None")),
            ("hub_strategy", Some("'every_save'")),
            ("hub_token", Some("None")),
            ("ignore_data_skip", Some("False")),
            ("include_for_metrics", None), // default_factory=list
            ("include_num_input_tokens_seen", Some("'no'")),
            ("label_names", Some("None")),
            ("label_smoothing_factor", Some("0.0")),
            ("learning_rate", Some("5e-05")),
            ("length_column_name", Some("'length'")),
            ("liger_kernel_config", Some("None")),
            ("load_best_model_at_end", Some("False")),
            ("local_rank", Some("-1")),
            ("log_level", Some("'passive'")),
            ("log_level_replica", Some("'warning'")),
            ("log_on_each_node", Some("True")),
            ("logging_first_step", Some("False")),
            ("logging_nan_inf_filter", Some("True")),
            ("logging_steps", Some("500")),
            ("logging_strategy", Some("'steps'")),
            ("lr_scheduler_kwargs", Some("None")),
            ("lr_scheduler_type", Some("'linear'")),
            ("max_grad_norm", Some("1.0")),
            ("max_steps", Some("-1")),
            ("metric_for_best_model", Some("None")),
            ("neftune_noise_alpha", Some("None")),
            ("num_train_epochs", Some("3.0")),
            ("optim", None), // non-literal default default_optim: 'adamw_torch', 'adamw_torch_fused' with torch >= 2.8
            ("optim_args", Some("None")),
            ("optim_target_modules", Some("None")),
            ("output_dir", Some("None")),
            ("parallelism_config", Some("None")),
            ("per_device_eval_batch_size", Some("8")),
            ("per_device_train_batch_size", Some("8")),
            ("prediction_loss_only", Some("False")),
            ("project", Some("'huggingface'")),
            ("push_to_hub", Some("False")),
            ("remove_unused_columns", Some("True")),
            ("report_to", Some("'none'")),
            ("restore_callback_states_from_checkpoint", Some("False")),
            ("resume_from_checkpoint", Some("None")),
            ("run_name", Some("None")),
            ("save_on_each_node", Some("False")),
            ("save_only_model", Some("False")),
            ("save_steps", Some("500")),
            ("save_strategy", Some("'steps'")),
            ("save_total_limit", Some("None")),
            ("seed", Some("42")),
            ("skip_memory_metrics", Some("True")),
            ("tf32", Some("None")),
            ("torch_compile", Some("False")),
            ("torch_compile_backend", Some("None")),
            ("torch_compile_mode", Some("None")),
            ("torch_empty_cache_steps", Some("None")),
            ("trackio_bucket_id", Some("None")),
            ("trackio_space_id", Some("None")),
            ("trackio_static_space_id", Some("None")),
            ("train_sampling_strategy", Some("'random'")),
            ("use_cache", Some("False")),
            ("use_cpu", Some("False")),
            ("use_liger_kernel", Some("False")),
            ("warmup_steps", Some("0")),
            ("weight_decay", Some("0.0")),
        ],
    },
];

/// Top-level ds_config keys each DeepSpeed release reads: (version, keys), sorted by version (numeric);
/// keys sorted (byte order), no duplicates. Source: PyPI sdist `deepspeed==X`, `deepspeed/runtime/config.py`,
/// `deepspeed/runtime/constants.py` and the section readers it calls (see the module doc). The 0.19.5
/// entry equals [`super::upstream`]'s `DEEPSPEED_TOP_LEVEL`.
///
/// Checked and not listed: `eigenvalue` (0.5.10 … 0.19.5 read it only nested inside `quantize_training`);
/// `quantize_training` in 0.8.3 and 0.14.2 (`get_eigenvalue_config` refers to an undefined
/// `QUANTIZE_TRAINING` constant there, so the section is never read: with compression weight quantization
/// on, DeepSpeed raises `NameError`); `reduce_scatter` at top level (0.3.16 has an unused
/// `get_zero_reduce_scatter` reader, never called).
pub const DEEPSPEED_TOP_LEVEL_BY_VERSION: &[(&str, &[&str])] = &[
    // DeepSpeed 0.3.16 (30 keys)
    (
        "0.3.16",
        &[
            "activation_checkpointing",
            "aio",
            "allgather_size", // legacy: read only when zero_optimization is a bool
            "amp",
            "checkpoint",
            "disable_allgather",
            "dump_state",
            "elasticity",
            "flops_profiler",
            "fp16",
            "fp32_allreduce", // not read any more from 0.5.10 on
            "gradient_accumulation_steps",
            "gradient_clipping",
            "gradient_predivide_factor",
            "memory_breakdown",
            "optimizer",
            "pipeline",
            "prescale_gradients",
            "progressive_layer_drop",
            "scheduler",
            "sparse_attention",
            "sparse_gradients",
            "steps_per_print",
            "tensorboard",
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "vocabulary_size",
            "wall_clock_breakdown",
            "zero_allow_untested_optimizer",
            "zero_optimization",
        ],
    ),
    // DeepSpeed 0.5.10 (35 keys)
    (
        "0.5.10",
        &[
            "activation_checkpointing",
            "aio",
            "allgather_size", // legacy: read only when zero_optimization is a bool
            "amp",
            "autotuning",
            "bfloat16", // the only bf16 section name in 0.5.10 (no `bf16`)
            "checkpoint",
            "communication_data_type",
            "curriculum_learning",
            "dataloader_drop_last",
            "disable_allgather",
            "dump_state",
            "elasticity",
            "flops_profiler",
            "fp16",
            "gradient_accumulation_steps",
            "gradient_clipping",
            "gradient_predivide_factor",
            "memory_breakdown",
            "optimizer",
            "pipeline",
            "prescale_gradients",
            "progressive_layer_drop",
            "quantize_training", // MoQ section; `eigenvalue` is read nested inside it
            "scheduler",
            "sparse_attention",
            "sparse_gradients",
            "steps_per_print",
            "tensorboard",
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "vocabulary_size",
            "wall_clock_breakdown",
            "zero_allow_untested_optimizer",
            "zero_optimization",
        ],
    ),
    // DeepSpeed 0.8.3 (43 keys)
    (
        "0.8.3",
        &[
            "activation_checkpointing",
            "aio",
            "allgather_size", // legacy: read only when zero_optimization is a bool
            "amp",
            "autotuning",
            "bf16",
            "bfloat16", // legacy name of `bf16`, read when `bf16` is absent
            "checkpoint",
            "comms_logger",
            "communication_data_type",
            "compression_training",
            "csv_monitor",
            "curriculum_learning",
            "data_efficiency",
            "data_types",
            "dataloader_drop_last",
            "disable_allgather",
            "dump_state",
            "elasticity",
            "flops_profiler",
            "fp16",
            "gradient_accumulation_steps",
            "gradient_clipping",
            "gradient_predivide_factor",
            "memory_breakdown",
            "nebula",
            "optimizer",
            "pipeline",
            "prescale_gradients",
            "progressive_layer_drop",
            "scheduler",
            "sparse_attention",
            "sparse_gradients",
            "steps_per_print",
            "tensorboard",
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "vocabulary_size",
            "wall_clock_breakdown",
            "wandb",
            "zero_allow_untested_optimizer",
            "zero_force_ds_cpu_optimizer",
            "zero_optimization",
        ],
    ),
    // DeepSpeed 0.14.2 (49 keys)
    (
        "0.14.2",
        &[
            "activation_checkpointing",
            "aio",
            "allgather_size", // legacy: read only when zero_optimization is a bool
            "amp",
            "autotuning",
            "bf16",
            "bfloat16", // legacy name of `bf16`, read when `bf16` is absent
            "checkpoint",
            "comms_logger",
            "communication_data_type",
            "compile",
            "compression_training",
            "csv_monitor",
            "curriculum_learning",
            "data_efficiency",
            "data_types",
            "dataloader_drop_last",
            "disable_allgather",
            "dump_state",
            "elasticity",
            "flops_profiler",
            "fp16",
            "gradient_accumulation_steps",
            "gradient_clipping",
            "gradient_predivide_factor",
            "graph_harvesting",
            "hybrid_engine",
            "memory_breakdown",
            "nebula",
            "optimizer",
            "pipeline",
            "prescale_gradients",
            "progressive_layer_drop",
            "scheduler",
            "seq_parallel_comm_data_type", // renamed seq_parallel_communication_data_type later
            "sparse_attention",
            "sparse_gradients",
            "steps_per_print",
            "tensorboard",
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "use_data_before_expert_parallelism",
            "vocabulary_size",
            "wall_clock_breakdown",
            "wandb",
            "weight_quantization",
            "zero_allow_untested_optimizer",
            "zero_force_ds_cpu_optimizer",
            "zero_optimization",
        ],
    ),
    // DeepSpeed 0.19.5: the same list the schema checks against (60 keys).
    ("0.19.5", super::upstream::DEEPSPEED_TOP_LEVEL),
];

/// Keys inside `zero_optimization` per DeepSpeed release: (version, keys), sorted by version (numeric);
/// keys sorted (byte order), no duplicates. 0.3.16 and 0.5.10: the keys `DeepSpeedZeroConfig._initialize`
/// and `offload_config.py` read from the plain dict (others are silently ignored). 0.8.3, 0.14.2, 0.19.5:
/// every field name and alias of the strict pydantic model `DeepSpeedZeroConfig` (anything else is
/// rejected, except a key whose value is the string `"auto"`, which is dropped before validation).
/// Source: PyPI sdist `deepspeed==X`, `deepspeed/runtime/zero/{config,constants,offload_config}.py`.
///
/// Checked and not listed: `cpu_offload_use_pin_memory` in 0.3.16 and 0.5.10 (named only in a
/// deprecation check, its value is never read; in 0.5.10 that check is keyed by the constant *names*,
/// so it never even warns).
pub const DEEPSPEED_ZERO_KEYS_BY_VERSION: &[(&str, &[&str])] = &[
    // DeepSpeed 0.3.16 (20 keys)
    (
        "0.3.16",
        &[
            "allgather_bucket_size",
            "allgather_partitions",
            "contiguous_gradients",
            "cpu_offload",
            "cpu_offload_params", // with `s`; pydantic versions name it cpu_offload_param
            "elastic_checkpoint",
            "find_unused_parameters", // renamed ignore_unused_parameters by 0.5.10
            "load_from_fp32_weights",
            "offload_optimizer", // new in 0.3.15 (absent from the 0.3.14 sdist)
            "offload_param",
            "overlap_comm",
            "reduce_bucket_size",
            "reduce_scatter",
            "stage",
            "stage3_gather_fp16_weights_on_model_save",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
            "sub_group_size",
        ],
    ),
    // DeepSpeed 0.5.10 (22 keys)
    (
        "0.5.10",
        &[
            "allgather_bucket_size",
            "allgather_partitions",
            "contiguous_gradients",
            "cpu_offload",
            "cpu_offload_params", // with `s`; pydantic versions name it cpu_offload_param
            "elastic_checkpoint",
            "ignore_unused_parameters",
            "legacy_stage1", // read; true raises (engine: unsupported since 0.5.9)
            "load_from_fp32_weights",
            "offload_optimizer",
            "offload_param",
            "overlap_comm",
            "reduce_bucket_size",
            "reduce_scatter",
            "round_robin_gradients",
            "stage",
            "stage3_gather_fp16_weights_on_model_save",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
            "sub_group_size",
        ],
    ),
    // DeepSpeed 0.8.3 (31 keys)
    (
        "0.8.3",
        &[
            "allgather_bucket_size",
            "allgather_partitions",
            "contiguous_gradients",
            "cpu_offload",                // deprecated -> offload_optimizer
            "cpu_offload_param",          // deprecated -> offload_param
            "cpu_offload_use_pin_memory", // deprecated, value unused
            "elastic_checkpoint",
            "gather_16bit_weights_on_model_save",
            "ignore_unused_parameters",
            "legacy_stage1", // accepted; true raises (engine)
            "load_from_fp32_weights",
            "max_live_parameters",
            "max_reuse_distance",
            "model_persistence_threshold",
            "offload_optimizer",
            "offload_param",
            "overlap_comm",
            "param_persistence_threshold",
            "prefetch_bucket_size",
            "reduce_bucket_size",
            "reduce_scatter",
            "round_robin_gradients",
            "stage",
            "stage3_gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save", // deprecated -> gather_16bit_weights_on_model_save
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_model_persistence_threshold",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
            "sub_group_size",
        ],
    ),
    // DeepSpeed 0.14.2 (41 keys)
    (
        "0.14.2",
        &[
            "allgather_bucket_size",
            "allgather_partitions",
            "contiguous_gradients",
            "cpu_offload",                // deprecated -> offload_optimizer
            "cpu_offload_param",          // deprecated -> offload_param
            "cpu_offload_use_pin_memory", // deprecated, value unused
            "elastic_checkpoint",
            "gather_16bit_weights_on_model_save",
            "ignore_unused_parameters",
            "legacy_stage1", // accepted; true raises (engine)
            "load_from_fp32_weights",
            "max_live_parameters",
            "max_reuse_distance",
            "memory_efficient_linear",
            "mics_hierarchical_params_gather",
            "mics_shard_size",
            "model_persistence_threshold",
            "offload_optimizer",
            "offload_param",
            "overlap_comm",
            "override_module_apply",
            "param_persistence_threshold",
            "pipeline_loading_checkpoint",
            "prefetch_bucket_size",
            "reduce_bucket_size",
            "reduce_scatter",
            "round_robin_gradients",
            "stage",
            "stage3_gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save", // deprecated -> gather_16bit_weights_on_model_save
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_model_persistence_threshold",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
            "sub_group_size",
            "use_multi_rank_bucket_allreduce",
            "zero_hpz_partition_size",
            "zero_quantized_gradients",
            "zero_quantized_nontrainable_weights",
            "zero_quantized_weights",
        ],
    ),
    // DeepSpeed 0.19.5 (53 keys)
    (
        "0.19.5",
        &[
            "allgather_bucket_size",
            "allgather_partitions",
            "allgather_sequential",
            "contiguous_gradients",
            "cpu_offload",                // deprecated -> offload_optimizer
            "cpu_offload_param",          // deprecated -> offload_param
            "cpu_offload_use_pin_memory", // deprecated, value unused
            "elastic_checkpoint",
            "enable_sanity_checks",
            "gather_16bit_weights_on_model_save",
            "ignore_unused_parameters",
            "leaf_module",
            "legacy_stage1", // accepted; true raises (engine)
            "load_from_fp32_weights",
            "log_trace_cache_warnings",
            "max_live_parameters",
            "max_reuse_distance",
            "memory_efficient_linear",
            "mics_hierarchical_params_gather",
            "mics_shard_size",
            "model_persistence_threshold",
            "module_granularity_threshold",
            "offload_optimizer",
            "offload_param",
            "overlap_comm",
            "override_module_apply",
            "param_persistence_threshold",
            "pipeline_loading_checkpoint",
            "prefetch_bucket_size",
            "reduce_bucket_size",
            "reduce_scatter",
            "round_robin_gradients",
            "save_muon_momentum_buffer_in_memory",
            "stage",
            "stage3_allgather_sequential",
            "stage3_gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save", // deprecated -> gather_16bit_weights_on_model_save
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_model_persistence_threshold",
            "stage3_module_granularity_threshold",
            "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size",
            "stage3_use_all_reduce_for_fetch_params",
            "sub_group_size",
            "use_all_reduce_for_fetch_params",
            "use_multi_rank_bucket_allreduce",
            "zenflow",
            "zero_hpz_partition_size",
            "zero_quantized_gradients",
            "zero_quantized_nontrainable_weights",
            "zero_quantized_weights",
            "zeropp_loco_param",
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn vkey(v: &str) -> Vec<u32> {
        v.split('.')
            .map(|p| p.parse().expect("numeric version part"))
            .collect()
    }

    fn hf(version: &str) -> &'static HfFields {
        TRAINING_ARGUMENTS_BY_VERSION
            .iter()
            .find(|h| h.version == version)
            .unwrap_or_else(|| panic!("no transformers {version}"))
    }

    /// `Some(default)` if `field` exists in `version` (default itself may be `None`), else `None`.
    fn field(version: &str, name: &str) -> Option<Option<&'static str>> {
        hf(version)
            .fields
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| *d)
    }

    fn has(version: &str, name: &str) -> bool {
        field(version, name).is_some()
    }

    fn ds<'a>(table: &'a [(&str, &[&str])], version: &str) -> &'a [&'a str] {
        table
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, k)| *k)
            .unwrap_or_else(|| panic!("no DeepSpeed {version}"))
    }

    fn sorted_unique(keys: &[&str]) -> bool {
        keys.windows(2).all(|w| w[0] < w[1])
    }

    const HF_VERSIONS: &[&str] = &[
        "4.6.1", "4.24.0", "4.30.0", "4.41.0", "4.46.0", "4.52.1", "4.57.6", "5.0.0", "5.24.0",
    ];
    const DS_VERSIONS: &[&str] = &["0.3.16", "0.5.10", "0.8.3", "0.14.2", "0.19.5"];

    #[test]
    fn hf_versions_sorted_and_complete() {
        let got: Vec<&str> = TRAINING_ARGUMENTS_BY_VERSION
            .iter()
            .map(|h| h.version)
            .collect();
        assert_eq!(got, HF_VERSIONS);
        assert!(TRAINING_ARGUMENTS_BY_VERSION
            .windows(2)
            .all(|w| vkey(w[0].version) < vkey(w[1].version)));
    }

    #[test]
    fn hf_fields_sorted_unique_and_counted() {
        let counts = [67, 101, 108, 125, 130, 128, 132, 109, 114];
        for (h, n) in TRAINING_ARGUMENTS_BY_VERSION.iter().zip(counts) {
            let names: Vec<&str> = h.fields.iter().map(|(n, _)| *n).collect();
            assert!(
                sorted_unique(&names),
                "transformers {} not sorted/unique",
                h.version
            );
            assert_eq!(names.len(), n, "transformers {} field count", h.version);
            for (name, default) in h.fields {
                assert!(!name.is_empty() && !name.starts_with('_'), "{name}");
                if let Some(d) = default {
                    assert!(!d.is_empty(), "{} {name}", h.version);
                }
            }
        }
    }

    #[test]
    fn hf_facts() {
        // warmup: both in 4.6.1 (warmup_steps: int = 0, warmup_ratio: float = 0.0).
        assert_eq!(field("4.6.1", "warmup_steps"), Some(Some("0")));
        assert_eq!(field("4.6.1", "warmup_ratio"), Some(Some("0.0")));
        assert_eq!(field("5.0.0", "warmup_ratio"), Some(Some("None")));
        assert!(!has("5.24.0", "warmup_ratio"));
        assert_eq!(field("5.24.0", "warmup_steps"), Some(Some("0")));

        // evaluation_strategy -> eval_strategy (renamed in 4.41, old name gone by 4.52.1).
        assert_eq!(field("4.24.0", "evaluation_strategy"), Some(Some("'no'")));
        assert_eq!(field("4.41.0", "evaluation_strategy"), Some(Some("None")));
        assert_eq!(field("4.46.0", "evaluation_strategy"), Some(Some("None")));
        for v in ["4.52.1", "4.57.6", "5.0.0", "5.24.0"] {
            assert!(!has(v, "evaluation_strategy"), "{v}");
        }
        for v in ["4.6.1", "4.24.0", "4.30.0"] {
            assert!(!has(v, "eval_strategy"), "{v}");
        }
        for v in ["4.41.0", "4.46.0", "4.52.1", "4.57.6", "5.0.0", "5.24.0"] {
            assert_eq!(field(v, "eval_strategy"), Some(Some("'no'")), "{v}");
        }

        // optim: new in 4.16.0 (absent in 4.15.0); a literal default only in 4.24.0.
        assert!(!has("4.6.1", "optim"));
        assert_eq!(field("4.24.0", "optim"), Some(Some("'adamw_hf'")));
        for v in &HF_VERSIONS[2..] {
            assert_eq!(field(v, "optim"), Some(None), "{v}");
        }

        // lr_scheduler_kwargs: new in 4.36.0; default_factory=dict up to 4.52.1, literal None later.
        for v in ["4.6.1", "4.24.0", "4.30.0"] {
            assert!(!has(v, "lr_scheduler_kwargs"), "{v}");
        }
        assert_eq!(field("4.41.0", "lr_scheduler_kwargs"), Some(None));
        assert_eq!(field("4.52.1", "lr_scheduler_kwargs"), Some(None));
        assert_eq!(field("4.57.6", "lr_scheduler_kwargs"), Some(Some("None")));
        assert_eq!(field("5.24.0", "lr_scheduler_kwargs"), Some(Some("None")));

        // fp16_backend (4.6.1 … 4.57.6) vs half_precision_backend (4.24.0 … 4.57.6); neither in 5.x.
        assert_eq!(field("4.6.1", "fp16_backend"), Some(Some("'auto'")));
        assert!(!has("4.6.1", "half_precision_backend"));
        for v in ["4.24.0", "4.30.0", "4.41.0", "4.46.0", "4.52.1", "4.57.6"] {
            assert_eq!(field(v, "fp16_backend"), Some(Some("'auto'")), "{v}");
            assert_eq!(
                field(v, "half_precision_backend"),
                Some(Some("'auto'")),
                "{v}"
            );
        }
        for v in ["5.0.0", "5.24.0"] {
            assert!(
                !has(v, "fp16_backend") && !has(v, "half_precision_backend"),
                "{v}"
            );
        }

        // gradient_checkpointing in 4.24 (not 4.6.1); activation_checkpointing only in 5.24.0.
        assert!(!has("4.6.1", "gradient_checkpointing"));
        assert_eq!(
            field("4.24.0", "gradient_checkpointing"),
            Some(Some("False"))
        );
        assert_eq!(
            field("5.24.0", "gradient_checkpointing"),
            Some(Some("None"))
        );
        assert_eq!(
            field("5.24.0", "activation_checkpointing"),
            Some(Some("None"))
        );
        assert!(!has("5.0.0", "activation_checkpointing"));

        // bf16 absent in 4.6.1; save_safetensors 4.30.0 (False) … 4.57.6 (True); adafactor gone in 5.x.
        assert!(!has("4.6.1", "bf16") && has("4.24.0", "bf16") && has("5.24.0", "bf16"));
        assert_eq!(field("4.30.0", "save_safetensors"), Some(Some("False")));
        assert_eq!(field("4.41.0", "save_safetensors"), Some(Some("True")));
        assert!(!has("4.24.0", "save_safetensors") && !has("5.0.0", "save_safetensors"));
        assert!(has("4.57.6", "adafactor") && !has("5.0.0", "adafactor"));
        assert_eq!(field("5.0.0", "report_to"), Some(Some("'none'")));
        assert_eq!(field("4.57.6", "report_to"), Some(Some("None")));

        // deepspeed everywhere; output_dir required up to 4.46.0; _n_gpu (init=False) never listed.
        for v in HF_VERSIONS {
            assert_eq!(field(v, "deepspeed"), Some(Some("None")), "{v}");
            assert!(!has(v, "_n_gpu"), "{v}");
        }
        assert_eq!(field("4.46.0", "output_dir"), Some(None));
        assert_eq!(field("4.52.1", "output_dir"), Some(Some("None")));
    }

    #[test]
    fn ds_tables_sorted_unique() {
        for table in [
            DEEPSPEED_TOP_LEVEL_BY_VERSION,
            DEEPSPEED_ZERO_KEYS_BY_VERSION,
        ] {
            let got: Vec<&str> = table.iter().map(|(v, _)| *v).collect();
            assert_eq!(got, DS_VERSIONS);
            assert!(table.windows(2).all(|w| vkey(w[0].0) < vkey(w[1].0)));
            for (v, keys) in table {
                assert!(sorted_unique(keys), "DeepSpeed {v} not sorted/unique");
            }
        }
        let top: Vec<usize> = DEEPSPEED_TOP_LEVEL_BY_VERSION
            .iter()
            .map(|(_, k)| k.len())
            .collect();
        assert_eq!(top, [30, 35, 43, 49, 60]);
        let zero: Vec<usize> = DEEPSPEED_ZERO_KEYS_BY_VERSION
            .iter()
            .map(|(_, k)| k.len())
            .collect();
        assert_eq!(zero, [20, 22, 31, 41, 53]);
    }

    #[test]
    fn ds_facts() {
        let z = |v| ds(DEEPSPEED_ZERO_KEYS_BY_VERSION, v);
        let t = |v| ds(DEEPSPEED_TOP_LEVEL_BY_VERSION, v);
        // 0.3.16: both the old bool `cpu_offload` and the new `offload_optimizer` (new in 0.3.15).
        for k in [
            "cpu_offload",
            "offload_optimizer",
            "offload_param",
            "cpu_offload_params",
        ] {
            assert!(z("0.3.16").contains(&k), "{k}");
        }
        // `cpu_offload_params` (plain dict, ≤ 0.5.10) became the pydantic field `cpu_offload_param`.
        assert!(z("0.5.10").contains(&"cpu_offload_params"));
        for v in ["0.8.3", "0.14.2", "0.19.5"] {
            assert!(z(v).contains(&"cpu_offload_param") && !z(v).contains(&"cpu_offload_params"));
            assert!(z(v).contains(&"gather_16bit_weights_on_model_save"));
        }
        assert!(!z("0.3.16").contains(&"cpu_offload_use_pin_memory"));
        assert!(z("0.8.3").contains(&"cpu_offload_use_pin_memory"));
        // find_unused_parameters (0.3.16) -> ignore_unused_parameters (0.5.10 on).
        assert!(z("0.3.16").contains(&"find_unused_parameters"));
        assert!(!z("0.5.10").contains(&"find_unused_parameters"));
        assert!(z("0.5.10").contains(&"ignore_unused_parameters"));
        // stage3_* keys in every version (names, then aliases of the pydantic fields).
        for v in DS_VERSIONS {
            for k in [
                "stage",
                "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold",
            ] {
                assert!(z(v).contains(&k), "{v} {k}");
            }
            for k in [
                "zero_optimization",
                "fp16",
                "optimizer",
                "scheduler",
                "gradient_clipping",
            ] {
                assert!(t(v).contains(&k), "{v} {k}");
            }
            assert!(!t(v).contains(&"eigenvalue"), "{v}");
        }
        assert!(z("0.8.3").contains(&"stage3_gather_16bit_weights_on_model_save"));
        // bf16 section names: none in 0.3.16, only `bfloat16` in 0.5.10, both from 0.8.3.
        assert!(!t("0.3.16").contains(&"bf16") && !t("0.3.16").contains(&"bfloat16"));
        assert!(t("0.5.10").contains(&"bfloat16") && !t("0.5.10").contains(&"bf16"));
        for v in ["0.8.3", "0.14.2", "0.19.5"] {
            assert!(t(v).contains(&"bf16") && t(v).contains(&"bfloat16"), "{v}");
        }
        // fp32_allreduce only in 0.3.16; dataloader_drop_last from 0.5.10.
        assert!(
            t("0.3.16").contains(&"fp32_allreduce") && !t("0.5.10").contains(&"fp32_allreduce")
        );
        assert!(
            !t("0.3.16").contains(&"dataloader_drop_last")
                && t("0.5.10").contains(&"dataloader_drop_last")
        );
        // quantize_training: read in 0.5.10 and 0.19.5, not in 0.8.3 / 0.14.2 (undefined constant).
        assert!(
            t("0.5.10").contains(&"quantize_training")
                && t("0.19.5").contains(&"quantize_training")
        );
        assert!(
            !t("0.8.3").contains(&"quantize_training")
                && !t("0.14.2").contains(&"quantize_training")
        );
        // sequence-parallel comm dtype key renamed between 0.14.2 and 0.19.5.
        assert!(t("0.14.2").contains(&"seq_parallel_comm_data_type"));
        assert!(t("0.19.5").contains(&"seq_parallel_communication_data_type"));
        assert!(!t("0.19.5").contains(&"seq_parallel_comm_data_type"));
    }
}
