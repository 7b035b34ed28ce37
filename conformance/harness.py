#!/usr/bin/env python3
"""Runs the artefacts of `recipe build` through the REAL transformers / accelerate / DeepSpeed
code, on CPU, without launching distributed training, and records what they do.

    harness.py CASES_DIR OUT_DIR [--json-summary] [--only SUBSTRING]

CASES_DIR holds one directory per case (``ds_config.json``, ``training_args.json``,
``case.json``; optionally ``auto/ds_config.json`` + ``auto/training_args.json`` from
``recipe build --auto``). OUT_DIR receives ``<case>.json`` (the fixture format, see README.md).

Everything this script changes in the libraries is in the block "PATCHES" below and listed in
README.md ("What is patched"). Every other step calls the libraries' own functions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import math
import os
import sys
import tempfile
import traceback
import types
import warnings
from pathlib import Path

FORMAT = "recipe-conformance-fixture/1"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402
import accelerate  # noqa: E402

with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    import deepspeed  # noqa: E402
import deepspeed.comm as ds_dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.runtime import lr_schedules as ds_lr_schedules  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import Trainer, TrainingArguments, get_scheduler  # noqa: E402
from transformers.integrations.deepspeed import (  # noqa: E402
    HfTrainerDeepSpeedConfig,
    deepspeed_optim_sched,
)
from accelerate.data_loader import prepare_data_loader  # noqa: E402
from accelerate.utils import DummyOptim, DummyScheduler  # noqa: E402

for name in ("transformers", "accelerate", "DeepSpeed", "deepspeed", "torch"):
    logging.getLogger(name).setLevel(logging.ERROR)
transformers.utils.logging.set_verbosity_error()
try:
    deepspeed.utils.logger.setLevel(logging.ERROR)
except Exception:  # pragma: no cover
    pass

VERSIONS = {
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "accelerate": accelerate.__version__,
    "deepspeed": deepspeed.__version__,
}

# =============================================================================================
# PATCHES — the only places where library behaviour is changed. See README.md.
# =============================================================================================


def training_arguments_class(world_size: int):
    """P1. `TrainingArguments.world_size` reports `world_size`.

    HF computes the `train_batch_size` it fills/matches as ``args.world_size * micro * GAS``
    (`HfTrainerDeepSpeedConfig.trainer_config_process`). In this single CPU process accelerate's
    `PartialState` is not distributed (world size 1); rather than start a process group of
    `world_size` ranks, a subclass overrides the property. Nothing else of TrainingArguments is
    changed: `__post_init__` runs as in a real launch, including the DeepSpeed plugin set-up.
    """

    class PatchedTrainingArguments(TrainingArguments):
        @property
        def world_size(self):  # noqa: D401
            return world_size

    return PatchedTrainingArguments


@contextlib.contextmanager
def deepspeed_world(world_size: int):
    """P2. `deepspeed.comm.get_rank()` = 0 and `get_world_size()` = `world_size` while
    DeepSpeed validates a config. `DeepSpeedConfig.__init__` reads both (and falls back to a world
    size of 1 when the process group is not initialised); its batch inference and assertion
    (`_configure_train_batch_size`, `_batch_assertion`) use that world size."""
    saved = (ds_dist.get_rank, ds_dist.get_world_size)
    ds_dist.get_rank = lambda group=None: 0
    ds_dist.get_world_size = lambda group=None: world_size
    try:
        yield
    finally:
        ds_dist.get_rank, ds_dist.get_world_size = saved


@contextlib.contextmanager
def gpu_dtype_support():
    """P3. The CPU accelerator says fp16 is unsupported (and is asked by the engine's
    `_do_sanity_check`: "Type fp16 is not supported on your device."). The recipes target GPUs,
    so while the engine sanity check runs the accelerator reports fp16 and bf16 as supported."""
    acc = get_accelerator()
    saved = (acc.is_fp16_supported, acc.is_bf16_supported)
    acc.is_fp16_supported = lambda: True
    acc.is_bf16_supported = lambda: True
    try:
        yield
    finally:
        acc.is_fp16_supported, acc.is_bf16_supported = saved


@contextlib.contextmanager
def gpu_bf16_for_training_arguments():
    """P5. `TrainingArguments._validate_args` refuses bf16 without a bf16-capable GPU ("Your
    setup doesn't support bf16/gpu. You need to assign use_cpu …"). The recipes target GPUs, so
    while TrainingArguments is built, `is_torch_bf16_gpu_available` (as imported by
    transformers.training_args) answers True."""
    import transformers.training_args as ta
    saved = ta.is_torch_bf16_gpu_available
    ta.is_torch_bf16_gpu_available = lambda *a, **k: True
    try:
        yield
    finally:
        ta.is_torch_bf16_gpu_available = saved


@contextlib.contextmanager
def stub_op_builders():
    """P6. DeepSpeed's kernel loaders (`OpBuilder.load`, the base of every CUDA/CPU op builder)
    return a stub instead of compiling or loading a kernel, while the engine builds its basic
    optimizer. The optimizer classes (FusedAdam, DeepSpeedCPUAdam, FusedLamb, FusedLion, …) then
    run their own constructors, argument checks included, without a GPU or a compiler."""
    from unittest import mock
    from deepspeed.ops.op_builder.builder import OpBuilder
    import deepspeed.ops.op_builder.cpu.no_impl  # noqa: F401 — the CPU "not implemented" builder

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    # Every class that defines its own `load` (the CPU accelerator maps ops it lacks, e.g.
    # FusedLamb, FusedLion, to a builder whose load() raises "not implemented on CPU backend").
    owners = [c for c in [OpBuilder, *subclasses(OpBuilder)] if "load" in c.__dict__]
    saved = [(c, c.__dict__["load"]) for c in owners]
    for c in owners:
        c.load = lambda self, *a, **k: mock.MagicMock(name=f"{type(self).__name__}.load()")
    try:
        yield
    finally:
        for c, f in saved:
            c.load = f


def engine_shell(ds_config: DeepSpeedConfig, client_optimizer):
    """P4. A `DeepSpeedEngine` object without `__init__` (which would need a process group, a
    device and the model), carrying only what the engine's own config checks read: `_config`,
    the client optimizer / scheduler, no pipeline. Its methods are DeepSpeed's own."""
    e = DeepSpeedEngine.__new__(DeepSpeedEngine)
    e._config = ds_config
    e.client_optimizer = client_optimizer
    e.client_lr_scheduler = None
    e.pipeline_parallelism = False
    e.global_rank = 0
    return e


# Replayed (not patched) pieces of code that runs inside objects the harness does not build —
# `Trainer.create_accelerator_and_postprocess` and `Accelerator._prepare_deepspeed`. Each copies
# the upstream logic for the HF Trainer path literally; see README.md.


def replay_trainer_checks(args, has_eval: bool) -> list[str]:
    """R1. Checks of `Trainer.__init__` that need no model, copied from transformers 5.24.0 (the same in 5.25.0), in
    the order `__init__` runs them: `Trainer.create_accelerator_and_postprocess` (save_only_model
    + load_best_model_at_end; auto_find_batch_size + ZeRO-3), `--fsdp` with `--deepspeed`, then
    `Trainer._validate_args`
    (eval_strategy without an eval dataset). All failing checks are returned (upstream stops at
    the first). The eval dataset exists iff the recipe names `data.eval`: the launched script
    (HF's run_classification.py) passes `eval_dataset` only with `--do_eval` and a validation
    file (`TrainingArguments.__post_init__` switches `do_eval` on whenever `eval_strategy !=
    "no"`, and the script then stops with "--do_eval requires a validation dataset" when there is
    none)."""
    out = []
    plugin = args.deepspeed_plugin
    if args.save_only_model and args.load_best_model_at_end:
        out.append("ValueError: DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`.")
    if plugin.zero_stage == 3 and args.auto_find_batch_size:
        out.append("ValueError: `auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3. Please consider "
                   "using Zero-2, Zero-1, or FSDP")
    # Trainer.__init__, after create_accelerator_and_postprocess (every args here has --deepspeed).
    if args.fsdp:
        out.append("ValueError: Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those "
                   "flags.")
    if args.eval_strategy is not None and args.eval_strategy != "no" and not has_eval:
        out.append(
            f"ValueError: You have set `args.eval_strategy` to {args.eval_strategy} but you didn't pass an "
            "`eval_dataset` to `Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`. ")
    return out


def replay_accelerate_fill(plugin, optimizer, scheduler, hidden_size: int, num_processes: int) -> None:
    """R2. `Accelerator._prepare_deepspeed` (accelerate 1.15.0; its config_kwargs the same in 1.16.0) for `prepare(model, optimizer
    [, scheduler])` as the Trainer calls it (no dataloader in the call): builds the same
    `config_kwargs` and calls the plugin's real `deepspeed_config_process(must_match=False)`,
    which fills what is still "auto" and raises for an "auto" nothing fills."""
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=1)
    config_kwargs = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    batch_size_per_device = None
    if not plugin.is_auto("train_micro_batch_size_per_gpu"):
        batch_size_per_device = plugin.get_value("train_micro_batch_size_per_gpu")
    if batch_size_per_device is not None:
        config_kwargs["train_micro_batch_size_per_gpu"] = batch_size_per_device
        config_kwargs["train_batch_size"] = (
            batch_size_per_device * plugin.get_value("gradient_accumulation_steps") * num_processes
        )
    keys = [
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
    ]
    if any(plugin.is_auto(k) for k in keys):
        config_kwargs.update({
            keys[0]: hidden_size * hidden_size,
            keys[1]: int(0.9 * hidden_size * hidden_size),
            keys[2]: 10 * hidden_size,
        })
    if isinstance(optimizer, DummyOptim):
        config_kwargs.update({"optimizer.params.lr": optimizer.lr,
                              "optimizer.params.weight_decay": optimizer.weight_decay})
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        max_lr = (getattr(scheduler.optimizer, "lr", None)
                  if getattr(scheduler.optimizer, "defaults", None) is None
                  else scheduler.optimizer.defaults["lr"])
        config_kwargs.update({
            "scheduler.params.warmup_min_lr": 0,
            "scheduler.params.warmup_max_lr": max_lr,
            "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps),
        })
        if scheduler.total_num_steps is not None:
            config_kwargs["scheduler.params.total_num_steps"] = math.ceil(
                scheduler.total_num_steps / num_processes)
    plugin.deepspeed_config_process(must_match=False, **config_kwargs)


# =============================================================================================
# Helpers
# =============================================================================================


def flatten(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                out.update(flatten(v, key + "."))
            else:
                out[key] = v
    return out


def jsonable(v):
    """JSON without non-finite numbers (Python would write `Infinity`): they become strings."""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    if isinstance(v, torch.dtype):
        return str(v)
    return repr(v)


def diff(a: dict, b: dict) -> list[dict]:
    """Keys (dotted) where a and b differ, with Python `==` (1 == 1.0, as HF compares)."""
    fa, fb = flatten(a), flatten(b)
    out = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k, "<absent>"), fb.get(k, "<absent>")
        if va != vb or (k in fa) != (k in fb):
            out.append({"key": k, "emitted": jsonable(va), "real": jsonable(vb)})
    return out


def err_text(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 2000 else s[:2000] + "…"


class Quiet:
    """Silences stdout/stderr (DeepSpeed and accelerate print on construction)."""

    def __enter__(self):
        self._o, self._e = io.StringIO(), io.StringIO()
        self._a = contextlib.redirect_stdout(self._o)
        self._b = contextlib.redirect_stderr(self._e)
        self._a.__enter__()
        self._b.__enter__()
        return self

    def __exit__(self, *exc):
        self._b.__exit__(*exc)
        self._a.__exit__(*exc)
        return False


def dummy_optimizer(lr: float, betas=(0.9, 0.999), groups: int = 1):
    """An AdamW over `groups` parameter groups of one parameter each: 2 stands for the optimizer
    Trainer.create_optimizer builds (the weights that decay, then biases and LayerNorm weights),
    1 for the one DeepSpeed builds from the flat parameter list HF passes it."""
    ps = [{"params": [torch.nn.Parameter(torch.zeros(1))]} for _ in range(groups)]
    return torch.optim.AdamW(ps, lr=lr, betas=tuple(betas))


def record_lrs(optimizer, scheduler, total: int) -> list[float]:
    """The LR each optimizer step 1..total runs at: read before the step; the scheduler is
    stepped after every (applied) optimizer step — the HF loop and the DeepSpeed engine
    (`_take_model_step`) alike."""
    from transformers.optimization import GreedyLR
    # Metric-driven schedulers are stepped by the Trainer at evaluation, with the metric
    # (`Trainer._evaluate`), never after an optimizer step (`Trainer._run_epoch`): without a
    # metric the LR stays where the constructor left it.
    metric_driven = isinstance(scheduler, (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR))
    out = []
    for _ in range(total):
        out.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        if not metric_driven:
            scheduler.step()
    return out


def hf_lrs(args, lr: float, betas, total: int, warmup: int, groups: int = 1) -> list[float]:
    # Per-group scheduler arguments (GreedyLR's / ReduceLROnPlateau's `min_lr` lists) are
    # counted against the optimizer's parameter groups.
    opt = dummy_optimizer(lr, betas, groups)
    sched = get_scheduler(args.lr_scheduler_type, optimizer=opt, num_warmup_steps=warmup,
                          num_training_steps=total,
                          scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    return record_lrs(opt, sched, total)


def ds_lrs(sched_section: dict, lr: float, betas, total: int) -> list[float]:
    """DeepSpeed's `_scheduler_from_config`: `getattr(lr_schedules, type)(optimizer, **params)`."""
    opt = dummy_optimizer(lr, betas)
    name = sched_section["type"]
    if hasattr(ds_lr_schedules, name):
        cls = getattr(ds_lr_schedules, name)
    else:
        assert hasattr(torch.optim.lr_scheduler, name), f"DeepSpeed does not recognize LR scheduler {name}"
        cls = getattr(torch.optim.lr_scheduler, name)
    with Quiet():
        sched = cls(opt, **(sched_section.get("params") or {}))
    return record_lrs(opt, sched, total)


def real_steps(args, samples: int, world_size: int) -> dict:
    """L from accelerate's own sharded dataloader (rank 0 of `world_size`, the Trainer's defaults:
    split_batches False, even_batches True, seedable sampler), then transformers'
    `Trainer.set_initial_training_values` for U and max_steps, `args.get_warmup_steps` for W."""
    dl = DataLoader(list(range(samples)), batch_size=args.per_device_train_batch_size,
                    shuffle=True, drop_last=args.dataloader_drop_last)
    with Quiet():
        pdl = prepare_data_loader(dl, num_processes=world_size, process_index=0,
                                  split_batches=False, put_on_device=False, even_batches=True,
                                  use_seedable_sampler=True)
    stub = types.SimpleNamespace(args=args)
    stub.get_total_train_batch_size = lambda a: (a.per_device_train_batch_size
                                                 * a.gradient_accumulation_steps * world_size)
    stub.get_sp_size = lambda: 1
    stub.num_examples = lambda d: Trainer.num_examples(stub, d)
    (epochs, per_epoch, _ex, _ns, _tb, steps_in_epoch, max_steps) = \
        Trainer.set_initial_training_values(stub, args, pdl)[:7]
    return {
        "batches_per_epoch": len(pdl),
        "per_epoch": per_epoch,
        "total": max_steps,
        "warmup": args.get_warmup_steps(max_steps),
    }


# The training script's own arguments that launch.sh passes to a recipe's own `train.script` (HF's
# run_classification.py interface; the generated train.py takes only TrainingArguments).
SCRIPT_FLAGS = {"model_name_or_path", "config_name", "train_file", "validation_file", "test_file",
                "text_column_names", "label_column_name", "max_seq_length"}
LAUNCHER_FLAGS = {"--num_gpus", "--num_nodes", "--hostfile", "--master_addr", "--master_port"}


def launcher_tokens(case_dir: Path, script: str = "launch.sh") -> tuple[list[str], list[str], str]:
    """launch.sh's `deepspeed` command: the launcher's flags, the rest, and the directory it
    `cd`s to (relative to the case directory)."""
    import re
    import shlex
    text = (case_dir / script).read_text()
    m = re.search(r'^cd "\$\(dirname "\$0"\)"/(.+)$', text, re.M)
    rel = shlex.split(m.group(1))[0] if m else "."
    toks = shlex.split(text[text.index("exec deepspeed"):].replace("\\\n", " "))
    i = 2
    while i < len(toks) and toks[i] in LAUNCHER_FLAGS:
        i += 2
    return toks[2:i], toks[i:], rel


def check_launcher(case_dir: Path, world: int, final: dict | None,
                   script: str = "launch.sh") -> dict:
    """The launcher's half of launch.sh, through DeepSpeed's own launcher code
    (`deepspeed.launcher.runner`): its `parse_args` on the flags, `fetch_hostfile` on the
    hostfile (from the directory launch.sh runs in), `parse_inclusion_exclusion` and
    `apply_num_nodes_and_gpus` → the processes it starts (`world_size`). A hostfile that is not
    here (the cluster's, or DeepSpeed's default /job/hostfile) is stood in for by 64 hosts of 16
    slots, more than any case asks for, so that the flags alone decide (`hostfile_read` false);
    one node without a hostfile is the launcher's local path (the GPUs of the machine, also 16
    here). When the launcher's world size is not the recipe's, DeepSpeed's config validation is
    run again at the launcher's (`deepspeed_at_launcher_world`: "ok" or the error) — what the
    started processes would meet."""
    import collections
    from deepspeed.launcher import runner

    flags, rest, rel = launcher_tokens(case_dir, script)
    with Quiet():
        a = runner.parse_args(flags + rest[:1])
    workdir = (case_dir / rel).resolve()
    hostfile = Path(a.hostfile) if Path(a.hostfile).is_absolute() else workdir / a.hostfile
    out: dict = {"num_gpus": a.num_gpus, "num_nodes": a.num_nodes, "hostfile": a.hostfile,
                 "hostfile_read": hostfile.is_file()}
    if hostfile.is_file():
        with Quiet():
            pool = runner.fetch_hostfile(str(hostfile))
    elif a.num_nodes > 1:
        pool = collections.OrderedDict((f"node-{i}", 16) for i in range(64))
    else:
        pool = collections.OrderedDict([("localhost", 16)])
    active = runner.parse_inclusion_exclusion(pool, a.include, a.exclude)
    active = runner.apply_num_nodes_and_gpus(active, a.num_nodes, a.num_gpus)
    out["hosts"] = len(active)
    out["world_size"] = sum(len(v) for v in active.values())
    out["world_matches"] = out["world_size"] == world
    if not out["world_matches"] and final is not None:
        try:
            with Quiet(), deepspeed_world(out["world_size"]):
                DeepSpeedConfig(copy.deepcopy(final))
            out["deepspeed_at_launcher_world"] = "ok"
        except Exception as e:  # noqa: BLE001
            out["deepspeed_at_launcher_world"] = err_text(e)
    return out


def check_launch(case_dir: Path, world: int, json_args) -> dict:
    """launch.sh passes the TrainingArguments as flags: parse them with transformers' own
    `HfArgumentParser` (as run_classification.py does), from the directory launch.sh `cd`s to,
    and compare field by field with the TrainingArguments built from training_args.json."""
    from transformers import HfArgumentParser

    _, toks, rel = launcher_tokens(case_dir)
    script, rest = toks[0], toks[1:]
    workdir = (case_dir / rel).resolve()
    out: dict = {"script": script, "workdir_exists": workdir.is_dir()}
    old = os.getcwd()
    try:
        os.chdir(workdir)
        parser = HfArgumentParser(training_arguments_class(world))
        with Quiet(), gpu_bf16_for_training_arguments():
            parsed, remaining = parser.parse_args_into_dataclasses(
                args=rest, return_remaining_strings=True, look_for_args_file=False)
        ds_file = Path(parsed.deepspeed)
        out["deepspeed_path_ok"] = ds_file.is_file() and ds_file.resolve() == (case_dir / "ds_config.json").resolve()
    except BaseException as e:  # noqa: BLE001 — argparse exits with SystemExit
        out["error"] = err_text(e)
        return out
    finally:
        os.chdir(old)
    flags = [t[2:] for t in remaining if t.startswith("--")]
    out["script_flags"] = flags
    out["unexpected_flags"] = [f for f in flags if f not in SCRIPT_FLAGS]
    a, b = json_args.to_dict(), parsed.to_dict()
    d = []
    for k in sorted(set(a) | set(b)):
        if k == "deepspeed":
            continue
        if a.get(k) != b.get(k):
            d.append({"field": k, "training_args_json": jsonable(a.get(k)), "launch_sh": jsonable(b.get(k))})
    out["diff"] = d
    out["equal"] = not d and not out["unexpected_flags"] and out["deepspeed_path_ok"]
    return out


# =============================================================================================
# One case
# =============================================================================================


def run_chain(emitted: dict, targs: dict, ds_path: Path, case: dict, res: dict, errors: list,
              want_lr: bool, args=None) -> dict | None:
    """S1 … S4 + DeepSpeed for one (ds_config, training_args) pair. Returns what the run
    would see, or None when TrainingArguments itself fails. `args`: TrainingArguments already
    built by the caller (with `training_arguments_class(world)`, `deepspeed` = `ds_path`, e.g.
    by `HfArgumentParser`, pairs.py); then `targs` is not used and S1 is the caller's."""
    world = int(case["world_size"])
    hidden = int(case.get("hidden_size") or 768)
    samples = int(case["samples"])
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden))

    # ---- S1: TrainingArguments (HF fill/match recorded, DeepSpeedPlugin) ----------------------
    if args is None:
        kw = dict(targs)
        kw["deepspeed"] = str(ds_path)  # the emitted path is relative to the recipe's directory
        try:
            with Quiet(), gpu_bf16_for_training_arguments():
                args = training_arguments_class(world)(**kw)
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "S1", "error": err_text(e)})
            return None

    for msg in replay_trainer_checks(args, bool(case.get("has_eval"))):  # R1
        errors.append({"stage": "trainer", "error": msg})

    try:
        steps = real_steps(args, samples, world)
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "steps", "error": err_text(e)})
        steps = None
    # Without the real count, our prediction (none when our checker says there are no steps).
    total = steps["total"] if steps else int((case.get("steps") or {}).get("total") or 0)

    # ---- HF fill + finalize alone, on a fresh copy: the "filled" config ----------------------
    filled = None
    try:
        with Quiet():
            hf = HfTrainerDeepSpeedConfig(copy.deepcopy(emitted))
            hf.trainer_config_process(args)  # as TrainingArguments.__post_init__ calls it
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "fill", "error": err_text(e)})
        hf = None
    if hf is not None:
        try:
            with Quiet():
                hf.trainer_config_finalize(args, model, total)
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "finalize", "error": err_text(e)})
        filled = hf.config

    # ---- the run's own chain on args.hf_deepspeed_config (shared with accelerate's plugin) ----
    final = None
    try:
        with Quiet():
            plugin = args.deepspeed_plugin
            # S2: AcceleratorState → DeepSpeedPlugin.set_mixed_precision
            plugin.set_mixed_precision(args.mixed_precision)
            # S3: deepspeed_init → trainer_config_finalize → deepspeed_optim_sched
            hfc = args.hf_deepspeed_config
            hfc.trainer_config_finalize(args, model, total)
            params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
            stub = types.SimpleNamespace(args=args, lr_scheduler=None)
            # Trainer.create_optimizer's two parameter groups (the weights that decay, then
            # biases and LayerNorm weights with weight_decay 0), which per-group scheduler
            # arguments (GreedyLR / ReduceLROnPlateau `min_lr` lists) are counted against.
            stub.create_optimizer = lambda: torch.optim.AdamW(
                [{"params": [params[0]], "weight_decay": args.weight_decay},
                 {"params": [params[1]], "weight_decay": 0.0}],
                lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                eps=args.adam_epsilon, weight_decay=args.weight_decay)
            optimizer, scheduler = deepspeed_optim_sched(stub, hfc, args, total, params)
            # S4: accelerate's last fill
            replay_accelerate_fill(plugin, optimizer, scheduler, hidden, world)  # R2
            final = plugin.deepspeed_config
    except Exception as e:  # noqa: BLE001
        stage = "finalize" if "mismatch" in str(e) else "accelerate"
        if not any(x["error"] == err_text(e) for x in errors):  # the same mismatch as above
            errors.append({"stage": stage, "error": err_text(e)})
        final = args.hf_deepspeed_config.config
        chain_failed = True
    else:
        chain_failed = False

    # ---- DeepSpeed: config validation at the world size, then the engine's config checks ----
    ds_conf = None
    if chain_failed and "auto" in flatten(final).values():
        # The run stops before DeepSpeed; "auto" strings left in the config would only give
        # DeepSpeed errors a real run never reaches.
        pass
    else:
        try:
            with Quiet(), deepspeed_world(world):
                ds_conf = DeepSpeedConfig(copy.deepcopy(final))
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "deepspeed", "error": err_text(e)})
    if ds_conf is not None:
        client = None
        if "optimizer" not in final:
            client = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
        try:
            with Quiet(), gpu_dtype_support():
                engine_shell(ds_conf, client)._do_sanity_check()
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "deepspeed-engine", "error": err_text(e)})
        # The basic optimizer DeepSpeed builds from its `optimizer` section (kernels stubbed, P6),
        # then the engine's ZeRO optimizer check.
        if client is None and ds_conf.optimizer_name is not None:
            try:
                with Quiet(), deepspeed_world(world), stub_op_builders():
                    sh = engine_shell(ds_conf, None)
                    try:
                        from deepspeed.runtime.zenflow.engine import configure_zenflow
                        configure_zenflow(sh)
                    except Exception:  # noqa: BLE001
                        sh.zenflow = False
                    basic = sh._configure_basic_optimizer([torch.nn.Parameter(torch.zeros(1))])
                    sh._do_optimizer_sanity_check(basic)
            except Exception as e:  # noqa: BLE001
                errors.append({"stage": "deepspeed-optimizer", "error": err_text(e)})

    out = {"args": args, "filled": filled, "final": final, "steps": steps, "total": total}
    if not want_lr:
        return out
    if (ds_path.parent / "launch.sh").exists():
        try:
            res["launch"] = check_launch(ds_path.parent, world, args)
        except Exception as e:  # noqa: BLE001
            res["launch"] = {"error": err_text(e), "equal": False}
        try:
            res["launch"]["launcher"] = check_launcher(ds_path.parent, world, final)
        except Exception as e:  # noqa: BLE001
            res["launch"]["launcher"] = {"error": err_text(e)}

    # ---- learning rates --------------------------------------------------------------------
    cfg = final if final is not None else emitted
    ds_opt = cfg.get("optimizer")
    if ds_opt is not None:
        p = ds_opt.get("params") or {}
        peak = p.get("lr", 1e-3)
        betas = p.get("betas", [0.9, 0.999])
    else:
        peak, betas = args.learning_rate, [args.adam_beta1, args.adam_beta2]
    if not isinstance(peak, (int, float)):
        peak = args.learning_rate
    if not isinstance(betas, list):
        betas = [args.adam_beta1, args.adam_beta2]
    hf_warmup = args.get_warmup_steps(total)
    side = "deepspeed" if "scheduler" in cfg else "hf"
    res["lr_side"] = side
    try:
        res["lr"] = (ds_lrs(cfg["scheduler"], peak, betas, total) if side == "deepspeed"
                     else hf_lrs(args, peak, betas, total, hf_warmup,
                                 groups=1 if "optimizer" in cfg else 2))
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": f"{side}-scheduler", "error": err_text(e)})
        res["lr"] = None
    # The counterpart, where our prediction names one.
    pred = case.get("predicted", {})
    res["lr_other"] = None
    res["lr_other_error"] = None
    if side == "deepspeed" and pred.get("hf_schedule"):
        res["lr_other_side"] = "hf"
        try:
            res["lr_other"] = hf_lrs(args, peak, betas, total, hf_warmup)
        except Exception as e:  # noqa: BLE001
            res["lr_other_error"] = err_text(e)
    elif side == "hf" and pred.get("deepspeed_schedule"):
        res["lr_other_side"] = "deepspeed"
        name = pred["deepspeed_schedule"]
        # docs/upstream.md §7 counterparts: linear warmup, min 0, max = lr, and the warmup /
        # total steps HF itself writes for "auto" (`trainer_config_finalize`:
        # warmup_num_steps = max(1, get_warmup_steps(T)), total_num_steps = T).
        hf_warmup_ds = max(1, hf_warmup)
        if args.lr_scheduler_type.value == "constant":
            params = {"warmup_min_lr": peak, "warmup_max_lr": peak, "warmup_num_steps": 1,
                      "warmup_type": "linear"}
        elif name == "WarmupLR":
            params = {"warmup_min_lr": 0, "warmup_max_lr": peak, "warmup_num_steps": hf_warmup_ds,
                      "warmup_type": "linear"}
        elif name == "WarmupDecayLR":
            params = {"warmup_min_lr": 0, "warmup_max_lr": peak, "warmup_num_steps": hf_warmup_ds,
                      "warmup_type": "linear", "total_num_steps": total}
        else:  # WarmupCosineLR
            params = {"warmup_min_ratio": 0, "cos_min_ratio": 0, "warmup_num_steps": hf_warmup_ds,
                      "warmup_type": "linear", "total_num_steps": total}
        res["lr_other_params"] = params
        try:
            res["lr_other"] = ds_lrs({"type": name, "params": params}, peak, betas, total)
        except Exception as e:  # noqa: BLE001
            res["lr_other_error"] = err_text(e)
    else:
        res["lr_other_side"] = None
    res["peak_lr"] = peak
    return out


def compare_lr(ours: list, real: list, peak: float) -> dict:
    """Max relative error |ours − real| / |real| over steps where real ≠ 0; steps where real
    is 0 must be 0 in ours too (else counted in `zero_mismatch`). Also the error relative to
    the peak and the first step that differs by more than 1e-9 relative."""
    n = min(len(ours), len(real))
    max_rel, max_abs_peak, first, zero_mis = 0.0, 0.0, None, 0
    for i in range(n):
        a, b = ours[i], real[i]
        if a is None:
            continue
        d = abs(a - b)
        if b != 0:
            rel = d / abs(b)
        else:
            rel = 0.0 if a == 0 else math.inf
            if a != 0:
                zero_mis += 1
        if rel > max_rel:
            max_rel = rel
        if peak:
            max_abs_peak = max(max_abs_peak, d / abs(peak))
        if first is None and (rel > 1e-9):
            first = {"step": i + 1, "ours": a, "real": b}
    return {"compared_steps": n, "ours_steps": len(ours), "real_steps": len(real),
            "max_rel_err": max_rel if max_rel != math.inf else "inf",
            "max_abs_err_over_peak": max_abs_peak, "zero_mismatch": zero_mis,
            "first_difference": first}


def run_case(case_dir: Path) -> dict:
    case = json.loads((case_dir / "case.json").read_text())
    emitted = json.loads((case_dir / "ds_config.json").read_text())
    targs = json.loads((case_dir / "training_args.json").read_text())
    res: dict = {"format": FORMAT, "case": case["case"], "kind": case.get("kind", "corpus"),
                 "recipe": case.get("recipe"), "world_size": case["world_size"],
                 "gpus": case.get("gpus"), "nodes": case.get("nodes"),
                 "hidden_size": case.get("hidden_size"), "samples": case["samples"],
                 "versions": VERSIONS}
    errors: list = []
    chain = run_chain(emitted, targs, (case_dir / "ds_config.json").resolve(), case, res, errors,
                      want_lr=True)
    res["emitted_config"] = emitted
    res["emitted_training_args"] = targs
    if chain is None:
        res.update({"filled_config": None, "config_equal": False, "config_diff": None,
                    "final_config": None, "final_config_diff": None, "lr": None,
                    "lr_other": None, "steps": None})
    else:
        filled = chain["filled"]
        res["filled_config"] = jsonable(filled) if filled is not None else None
        res["config_equal"] = filled == emitted if filled is not None else False
        res["config_diff"] = diff(emitted, filled) if filled is not None else None
        res["final_config_diff"] = diff(emitted, chain["final"]) if chain["final"] is not None else None
        res["steps"] = chain["steps"]
    res["errors"] = errors
    res["verdict"] = "error" if errors else "ok"
    res["error"] = errors[0]["error"] if errors else None
    res["stage"] = errors[0]["stage"] if errors else None

    # ---- our predictions vs the real run ---------------------------------------------------
    pred = case.get("predicted", {})
    ours_steps = pred.get("steps") or {}
    cmp: dict = {}
    if res.get("steps"):
        for k in ("batches_per_epoch", "per_epoch", "total"):
            if k in ours_steps:
                cmp[k] = {"ours": ours_steps[k], "real": res["steps"][k],
                          "equal": ours_steps[k] == res["steps"][k]}
        if "warmup" in ours_steps:
            cmp["warmup"] = {"ours": ours_steps["warmup"], "real": res["steps"]["warmup"],
                             "equal": ours_steps["warmup"] == res["steps"]["warmup"]}
    res["steps_compare"] = cmp
    side = res.get("lr_side")
    peak = res.get("peak_lr") or 0.0
    if res.get("lr") and pred.get("lr"):
        ours = [row.get(side) for row in pred["lr"]]
        res["lr_compare"] = compare_lr(ours, res["lr"], peak) if any(x is not None for x in ours) \
            else {"note": f"no prediction on the {side} side"}
    else:
        res["lr_compare"] = None
    other = res.get("lr_other_side")
    if res.get("lr_other") and pred.get("lr") and other:
        ours = [row.get(other) for row in pred["lr"]]
        res["lr_other_compare"] = compare_lr(ours, res["lr_other"], peak)
    else:
        res["lr_other_compare"] = None

    # ---- --auto build: does HF fill the "auto" keys to exactly the explicit values? ---------
    auto_dir = case_dir / "auto"
    if (auto_dir / "ds_config.json").exists():
        a_emitted = json.loads((auto_dir / "ds_config.json").read_text())
        a_targs = json.loads((auto_dir / "training_args.json").read_text())
        a_err: list = []
        a_res: dict = {}
        a_chain = run_chain(a_emitted, a_targs, (auto_dir / "ds_config.json").resolve(), case,
                            a_res, a_err, want_lr=False)
        entry = {"errors": a_err}
        if a_chain is not None and a_chain["filled"] is not None:
            entry["filled_equal_explicit"] = a_chain["filled"] == emitted
            entry["diff_vs_explicit"] = diff(emitted, a_chain["filled"])
            if a_chain["final"] is not None and chain is not None and chain["final"] is not None:
                entry["final_equal_explicit_final"] = jsonable(a_chain["final"]) == jsonable(chain["final"])
                entry["final_diff_vs_explicit_final"] = diff(chain["final"], a_chain["final"])
        res["auto"] = entry
    else:
        res["auto"] = None

    if case.get("rejected"):
        if case["rejected"].get("stack"):
            res["stack_run"] = stack_runs(case_dir, case["rejected"]["stack"])
        if case["rejected"].get("expect") in ("raise_engine", "silent_engine"):
            res["engine_run"] = engine_runs(case_dir)
        if case["rejected"].get("expect") == "launch" and chain is not None:
            # The control: the base recipe's launch.sh (make_cases.py keeps it beside).
            try:
                res["launch_control"] = check_launcher(case_dir, int(case["world_size"]),
                                                       chain["final"],
                                                       "launch.base.sh")
            except Exception as e:  # noqa: BLE001
                res["launch_control"] = {"error": err_text(e)}
        res["rejected"] = judge_rejected(case["rejected"], res, chain)
    return res


# =============================================================================================
# Older stacks: a rejected case may name an overlay (`stack`, overlays.txt) under which the real
# training loop shows the misbehaviour the rule exists for (train_run.py, in a subprocess).
# =============================================================================================

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def portable(text: str) -> str:
    """`text` without this machine's paths, so that fixtures are the same wherever they were
    made: the repository's prefix dropped (its files, the conformance venv), the Python
    installation's written `<python>`."""
    return text.replace(f"{REPO}/", "").replace(f"{sys.base_prefix}/", "<python>/")


OVERLAYS = HERE / ".overlays"


def overlay_pins(name: str) -> dict | None:
    """The exact pins of overlay `name` in overlays.txt, as {package: version}."""
    for line in (HERE / "overlays.txt").read_text().splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and parts[0] == name:
            return dict(p.split("==", 1) for p in parts[1:])
    return None


def train_in_subprocess(case_dir: Path, overlay: Path | None, extra: tuple = ()) -> dict:
    """train_run.py on the case, with `overlay` (if any) in front of the venv on PYTHONPATH;
    `extra`: more train_run.py arguments (`--engine`, `--artefacts DIR`)."""
    import subprocess
    env = dict(os.environ)
    env["PYTHONPATH"] = str(overlay) if overlay else ""
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # ninja for the JIT ops
    env["TORCH_EXTENSIONS_DIR"] = str(OVERLAYS / "torch_extensions")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        p = subprocess.run([sys.executable, str(HERE / "train_run.py"), str(case_dir), str(out), *extra],
                           env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
        if not out.exists():
            return {"error": f"train_run.py exit {p.returncode}: {p.stderr[-2000:]}"}
        return json.loads(out.read_text())


def stack_runs(case_dir: Path, stack: str) -> dict:
    """The case trained under the named overlay and, as the control, under the pinned stack."""
    pins = overlay_pins(stack)
    if pins is None:
        return {"stack": stack, "skipped": f"overlay {stack} is not in overlays.txt"}
    d = OVERLAYS / stack
    if not (d / ".pins").exists():
        return {"stack": stack, "skipped": f"overlay {stack} is not installed "
                                           "(conformance/setup.sh overlays)"}
    out = {"stack": stack, "pins": pins,
           "overlay": train_in_subprocess(case_dir, d), "pinned": train_in_subprocess(case_dir, None)}
    got = (out["overlay"].get("versions") or {})
    out["overlay_versions_ok"] = all(got.get(k) == v for k, v in pins.items()
                                     if k in ("transformers", "accelerate", "deepspeed", "torch"))
    return out


def engine_runs(case_dir: Path) -> dict:
    """The real engine built from the case's (patched) artefacts and, as the control, from the
    base recipe's unpatched ones (`base/`, make_cases.py): `train_run.py --engine`, pinned stack,
    world size 1, stopped after one optimizer step. Each run: the engine and optimizer classes
    it got, or `exception` = {type, message, raised_at}."""
    def brief(r: dict) -> dict:
        if "exception" in r:
            return {"built": False, "exception": r["exception"]}
        if "error" in r:  # train_run.py itself could not run the case
            return {"built": False, "error": r["error"][-1000:]}
        s = r.get("summary") or {}
        return {"built": True, "deepspeed_engine": r.get("deepspeed_engine"),
                "deepspeed_optimizer": r.get("deepspeed_optimizer"),
                "deepspeed_basic_optimizer": r.get("deepspeed_basic_optimizer"),
                "deepspeed_basic_optimizer_module": r.get("deepspeed_basic_optimizer_module"),
                "versions": r.get("versions"), "hf_global_step": s.get("hf_global_step"),
                "ds_global_steps": s.get("ds_global_steps"), "max_steps": s.get("max_steps"),
                "micro_batches": s.get("micro_batches"), "epoch_reached": s.get("epoch_reached")}
    out = {"case": brief(train_in_subprocess(case_dir, None, ("--engine",)))}
    if (case_dir / "base" / "ds_config.json").exists():
        out["control"] = brief(train_in_subprocess(
            case_dir, None, ("--engine", "--artefacts", str(case_dir / "base"))))
    else:
        out["control"] = {"built": False, "error": "no base/ artefacts (make_cases.py)"}
    return out


def judge_engine(meta: dict, run: dict) -> object:
    """`raise_engine`: reproduced when the real engine refuses the patched artefacts (the
    message contains `engine_match`, when given) and builds from the base recipe's artefacts
    (so the refusal is the rule's, not something the base recipe already hits on CPU)."""
    case, control = run["case"], run["control"]
    if case.get("built"):
        return "the real engine accepted the artefacts (one optimizer step taken)"
    if "exception" not in case:
        return f"the engine run failed before the engine: {case.get('error', '')[-300:]}"
    exc = case["exception"]
    match = meta.get("engine_match")
    if match and match not in exc["message"]:
        return f"the engine raised something else: {exc['type']}: {exc['message'][:300]}"
    if not control.get("built"):
        got = control.get("exception") or {"type": "error", "message": control.get("error", "")}
        return (f"not reproducible on CPU: the base recipe's artefacts fail the same way "
                f"({got['type']}: {got['message'][:300]} at {got.get('raised_at')}), so the "
                "refusal is not the rule's")
    return True


def judge_silent_engine(meta: dict, run: dict) -> object:
    """`silent_engine`: reproduced when the real engine builds from the patched artefacts with
    another optimizer than the recipe names (`engine_optimizer`, `module.Class` of DeepSpeed's
    basic optimizer) and takes a step, while the base recipe's artefacts (the control) build
    with `control_optimizer`: the run trains, with the wrong optimizer."""
    def name(r: dict) -> str:
        return f"{r.get('deepspeed_basic_optimizer_module')}.{r.get('deepspeed_basic_optimizer')}"
    case, control = run["case"], run["control"]
    if not case.get("built"):
        got = case.get("exception") or {"type": "error", "message": case.get("error", "")}
        return f"the engine refused instead: {got['type']}: {got['message'][:300]}"
    if name(case) != meta["engine_optimizer"]:
        return f"the engine built {name(case)}, not {meta['engine_optimizer']}"
    if not control.get("built"):
        return f"the control did not build: {control.get('exception') or control.get('error')}"
    if name(control) != meta["control_optimizer"]:
        return f"the control built {name(control)}, not {meta['control_optimizer']}"
    return True


def judge_stack(check: str, run: dict, match: str | None = None) -> tuple[object, dict]:
    """(reproduced, observed) for an `expect = "silent_run"` case. `check` names what the rule
    exists for (docs/upstream.md §5.7): `refused` (the old release refuses the artefacts with a
    message containing `match`, the pinned stack trains them), `step_drift` (docs/upstream.md R-S02:
    DeepSpeed updates the weights a different number of times than HF counts optimizer steps, and
    the pinned stack — accelerate ≥ 1.8 — does not drift), `early_stop` (docs/upstream.md R-S04:
    the Trainer stops before `num_train_epochs`, with fewer optimizer steps than the pinned stack
    takes on the same artefacts)."""
    if "skipped" in run:
        return f"skipped: {run['skipped']}", {}
    o, p = run["overlay"], run["pinned"]
    if check == "refused":
        # The old release refuses the artefacts (`match`); the pinned stack trains them.
        exc = o.get("exception") or {}
        observed = {"overlay_versions": o.get("versions"), "overlay_exception": exc,
                    "pinned_error": (p.get("exception") or {}).get("message")}
        if not run["overlay_versions_ok"]:
            return f"the overlay did not load the pinned versions: {o.get('versions')}", observed
        if not exc:
            return "the old release did not refuse the artefacts", observed
        if match and match not in exc.get("message", ""):
            return f"refused for another reason: {exc.get('message', '')[:300]}", observed
        if "error" in p:
            return f"the pinned run failed: {p['error'][-300:]}", observed
        return True, observed
    for side, r in (("overlay", o), ("pinned", p)):
        if "error" in r:
            return f"the {side} run failed: {r['error'][-500:]}", {}
    if not run["overlay_versions_ok"]:
        return f"the overlay did not load the pinned versions: {o.get('versions')}", {}
    so, sp = o["summary"], p["summary"]
    keep = ("hf_global_step", "ds_global_steps", "max_steps", "epoch_reached", "micro_batches",
            "micro_batches_per_epoch", "final_lr")
    observed = {"stack": {k: so[k] for k in keep}, "pinned": {k: sp[k] for k in keep}}
    if check == "step_drift":
        first = next((r for r in o["rows"] if r["hf_global_step"] != r["ds_global_steps"]), None)
        observed["first_disagreement"] = first
        ok = (so["hf_global_step"] != so["ds_global_steps"] and first is not None
              and sp["hf_global_step"] == sp["ds_global_steps"])
    elif check == "early_stop":
        ok = (so["hf_global_step"] < sp["hf_global_step"]
              and so["epoch_reached"] < so["num_train_epochs"]
              and sp["epoch_reached"] == sp["num_train_epochs"])
    else:
        return f"unknown stack_check {check!r}", observed
    return ok, observed


def judge_rejected(meta: dict, res: dict, chain) -> dict:
    """Whether the real stack shows what our checker's error says. Only errors the base recipe
    does not have count: the base recipes name an eval file, so the eval_strategy check of
    `Trainer._validate_args` does not fire for them."""
    expect = meta.get("expect")
    relevant = [e for e in res["errors"] if "eval_strategy" not in e["error"]]
    out = {k: meta.get(k) for k in ("code", "expect", "why", "checker_errors")}
    final = chain["final"] if chain else None
    if expect == "not_reproducible":
        out["reproduced"] = "not reproducible with the pinned stack"
    elif expect == "silent_run":
        run = res.get("stack_run") or {"skipped": "no stack named"}
        out["stack"] = meta.get("stack")
        out["stack_check"] = meta.get("stack_check")
        out["reproduced"], out["observed"] = judge_stack(meta.get("stack_check"), run,
                                                         meta.get("match"))
    elif expect == "silent":
        val = flatten(final or {}).get(meta["silent_key"])
        out["observed"] = {meta["silent_key"]: jsonable(val)}
        out["reproduced"] = (val == meta["silent_value"]) and not relevant
        if relevant:
            out["note"] = "the real stack raised instead of misbehaving silently"
            out["reproduced"] = True
    elif expect == "raise_engine":
        run = res.get("engine_run") or {"case": {}, "control": {}}
        out["engine_match"] = meta.get("engine_match")
        out["observed"] = run
        out["reproduced"] = judge_engine(meta, run)
    elif expect == "silent_engine":
        run = res.get("engine_run") or {"case": {}, "control": {}}
        out["engine_optimizer"] = meta.get("engine_optimizer")
        out["control_optimizer"] = meta.get("control_optimizer")
        out["observed"] = run
        out["reproduced"] = judge_silent_engine(meta, run)
    elif expect == "launch":
        # DeepSpeed's launcher refuses the hostfile (its `error` contains `match`), or starts
        # another world size than the recipe's and DeepSpeed's config validation refuses the
        # config at that size (`deepspeed_at_launcher_world`); the base recipe's launch.sh
        # starts the recipe's world size.
        run = (res.get("launch") or {}).get("launcher") or {}
        ctl = res.get("launch_control") or {}
        out["match"] = meta.get("match")
        out["observed"] = {"case": run, "control": ctl}
        said = run.get("error") or run.get("deepspeed_at_launcher_world") or ""
        if "error" not in run and run.get("world_matches") is not False:
            out["reproduced"] = "the launcher starts the recipe's world size"
        elif meta.get("match") not in said:
            out["reproduced"] = f"the launcher / DeepSpeed said something else: {said[:300]}"
        elif ctl.get("world_matches") is not True:
            out["reproduced"] = f"the control does not launch the recipe's world size: {ctl}"
        else:
            out["reproduced"] = not relevant
    elif expect == "runtime" and not relevant:
        out["reproduced"] = "not reproducible without an engine/GPU"
    else:  # raise, raise_trainer, runtime: with `match`, the refusal must say it
        match = meta.get("match")
        hits = [e for e in relevant if not match or match in e["error"]]
        out["match"] = match
        out["matched_error"] = hits[0]["error"] if hits else None
        out["reproduced"] = bool(hits) if relevant else False
        if relevant and not hits:
            out["reproduced"] = f"the real stack refused for another reason: {relevant[0]['error'][:300]}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--json-summary", action="store_true", help="print the counts as JSON")
    ap.add_argument("--only", help="only cases whose name contains this")
    a = ap.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    a.out_dir = a.out_dir.resolve()
    dirs = sorted(p.resolve() for p in a.cases_dir.iterdir() if (p / "case.json").exists())
    if a.only:
        dirs = [d for d in dirs if a.only in d.name]
    counts = {"cases": 0, "ok": 0, "error": 0, "by_stage": {}, "config_equal": 0,
              "hf_mismatches": 0, "deepspeed_rejections": 0, "steps_total_disagree": 0,
              "lr_max_rel_err": 0.0, "lr_cases_compared": 0, "harness_crashes": 0}
    old_cwd = os.getcwd()
    scratch = tempfile.mkdtemp(prefix="recipe-conformance-")
    os.chdir(scratch)  # TrainingArguments' output_dir is relative: keep it out of the repo
    try:
        for d in dirs:
            try:
                res = run_case(d)
            except Exception:  # noqa: BLE001 — a harness bug, not a library verdict
                counts["harness_crashes"] += 1
                res = {"format": FORMAT, "case": d.name, "verdict": "harness-crash",
                       "error": traceback.format_exc()[-3000:]}
            text = portable(json.dumps(jsonable(res), indent=1, sort_keys=True))
            (a.out_dir / f"{res['case']}.json").write_text(text + "\n")
            counts["cases"] += 1
            v = res.get("verdict")
            counts[v] = counts.get(v, 0) + 1
            for e in res.get("errors") or []:
                counts["by_stage"][e["stage"]] = counts["by_stage"].get(e["stage"], 0) + 1
            if any(e["stage"] == "finalize" for e in res.get("errors") or []):
                counts["hf_mismatches"] += 1
            if any(e["stage"].startswith("deepspeed") for e in res.get("errors") or []):
                counts["deepspeed_rejections"] += 1
            counts["config_equal"] += bool(res.get("config_equal"))
            sc = (res.get("steps_compare") or {}).get("total")
            if sc and not sc["equal"]:
                counts["steps_total_disagree"] += 1
            lc = res.get("lr_compare") or {}
            if "max_rel_err" in lc:
                counts["lr_cases_compared"] += 1
                m = lc["max_rel_err"]
                m = math.inf if m == "inf" else m
                counts["lr_max_rel_err"] = max(counts["lr_max_rel_err"], m)
    finally:
        os.chdir(old_cwd)
    if counts["lr_max_rel_err"] == math.inf:
        counts["lr_max_rel_err"] = "inf"
    if a.json_summary:
        print(json.dumps(counts, indent=1, sort_keys=True))
    else:
        print(f"harness: {counts['cases']} cases, {counts.get('ok', 0)} ok, "
              f"{counts.get('error', 0)} error, {counts['harness_crashes']} harness crashes")
    return 0 if counts["harness_crashes"] == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
