#!/usr/bin/env python3
"""Runs `recipe build` artefacts through an OLD transformers + DeepSpeed release's own config
code (transformers 4.6.1 + DeepSpeed 0.3.16, transformers 4.24.0 + DeepSpeed 0.7.7 / 0.8.3), on
CPU.

    legacy_run.py BUILD_DIR OUT.json     (run by legacy.py: the overlays in front of the venv)

BUILD_DIR holds ``cases/`` and ``rejected/``, one directory per case as make_cases.py writes
them (``ds_config.json``, ``training_args.json``, ``case.json``; a rejected case also ``base/``,
its base recipe's unpatched artefacts, run as the control). For each case, in the order a
launch runs them:

1. ``TrainingArguments(**training_args.json, deepspeed=ds_config.json)`` of that release — its
   ``__post_init__`` runs HF's DeepSpeed config processing (4.6.1 ``DeepSpeedConfigHF``, 4.24
   ``HfTrainerDeepSpeedConfig.trainer_config_process`` with its mismatch checks);
2. ``Trainer(model, args, train_dataset).train()`` of that release with the recipe's sample
   count: its own dataloader (sampler at the world size, ``drop_last``) and optimizer-step count
   (recorded, L6), then its ``deepspeed_init`` (the finalize step, the optimizer / scheduler
   ownership rules, the Trainer's ``create_optimizer`` / ``create_scheduler``) up to
   ``deepspeed.initialize``, which records the config HF hands over and stops the run there
   instead of starting an engine (L3);
3. that DeepSpeed release's ``DeepSpeedConfig`` on that config at the case's world size (L4),
   the engine's ``_do_sanity_check``, and with HF's optimizer the engine's ``_configure_optimizer``
   up to the wrapper (L7), otherwise its ``_configure_basic_optimizer`` (L5);
4. the learning rate of every optimizer step 1..total (total: the Trainer's own count): the
   scheduler the run would step (HF's, built in step 2, or DeepSpeed's
   ``_scheduler_from_config``), stepped after each step.

The releases do not import on Python 3.11 + torch 2.15 + numpy 2 unaided; the shims below (S1–S3)
restore names those versions removed, without changing what the old code computes. Everything
else changed is in "PATCHES" (L1–L7) and listed in README.md ("Older stacks, run").
"""

from __future__ import annotations

import collections.abc  # noqa: F401 — torch._six re-exported it; kept importable
import contextlib
import copy
import importlib.util
import inspect
import io
import json
import logging
import math
import os
import sys
import traceback
import types
import warnings
from pathlib import Path

FORMAT = "recipe-conformance-legacy-run/1"
REPO = Path(__file__).resolve().parent.parent


def portable(text: str) -> str:
    """`text` without this machine's paths, so that fixtures are the same wherever they were
    made: the repository's prefix dropped (its files, the conformance venv), the Python
    installation's written `<python>`."""
    return text.replace(f"{REPO}/", "").replace(f"{sys.base_prefix}/", "<python>/")

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# =============================================================================================
# SHIMS — names the old releases import that newer Python packages no longer have.
# =============================================================================================

# S1. `torch._six` (removed in torch 2.0): DeepSpeed 0.3.16 / 0.7.7 import only `inf` from it,
# which was `math.inf` there.
_six = types.ModuleType("torch._six")
_six.inf = math.inf
sys.modules["torch._six"] = _six

# S2. `numpy.BUFSIZE` (removed in numpy 2.0; 8192 before): DeepSpeed 0.7.7's autotuner, imported
# by its config module, passes it as a file buffer size.
import numpy  # noqa: E402

if not hasattr(numpy, "BUFSIZE"):
    numpy.BUFSIZE = 8192

# S3. transformers 4.6.1 checks the installed `tokenizers` against `< 0.11` at import when it is
# installed at all; no such wheel exists for Python 3.11, and the config code never tokenizes.
# For that release `tokenizers` is reported as not installed (`importlib.util.find_spec` → None).
# `datasets` is hidden from every old release: their `trainer.py` imports it when installed, and
# the venv's datasets (5.2.0, added for data_rows.py) needs a huggingface_hub 2.x that the
# overlays' older hub shadows ("cannot import name 'CommitInfo'" under 4.6.1, 'BucketNotFoundError'
# under 4.24.0); the config code never loads a dataset.
_find_spec = importlib.util.find_spec
_HIDDEN = ("datasets", "tokenizers") if os.environ.get("LEGACY_HIDE_TOKENIZERS") == "1" else ("datasets",)


def _find_spec_hiding(name, package=None):
    if name.split(".")[0] in _HIDDEN:
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _find_spec_hiding

import torch  # noqa: E402

torch._six = _six
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    import transformers  # noqa: E402
    import deepspeed  # noqa: E402
    from deepspeed.runtime import lr_schedules  # noqa: E402, F401
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
    from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

TF_VERSION = transformers.__version__
DS_VERSION = deepspeed.__version__
if TF_VERSION.startswith("4.6."):
    from transformers.integrations import deepspeed_init  # noqa: E402
else:
    from transformers.deepspeed import deepspeed_init  # noqa: E402
import transformers.training_args as training_args_module  # noqa: E402

for name in ("transformers", "DeepSpeed", "deepspeed", "torch"):
    logging.getLogger(name).setLevel(logging.ERROR)
transformers.utils.logging.set_verbosity_error()

# =============================================================================================
# PATCHES
# =============================================================================================


def training_arguments_class(world_size: int):
    """L1. One process of a `deepspeed` launch on `world_size` GPUs, without a GPU or a process
    group: `world_size` reports the launch's world size (HF's `train_batch_size` is
    `world_size * micro * GAS`), and `_setup_devices` (which would call
    `deepspeed.init_distributed()` and `torch.cuda.set_device`) returns `cuda:0` with one GPU,
    which is what the launcher gives each process. Everything else of `__post_init__` runs,
    HF's DeepSpeed config processing included."""

    class LaunchedTrainingArguments(TrainingArguments):
        @property
        def world_size(self):  # noqa: D401
            return world_size

        @property
        def _setup_devices(self):
            self._n_gpu = 1
            return torch.device("cuda", 0)

    return LaunchedTrainingArguments


@contextlib.contextmanager
def gpu_bf16():
    """L2. transformers 4.24 refuses bf16 without an Ampere GPU (`is_torch_bf16_gpu_available`);
    the recipes target GPUs, so the check answers True while TrainingArguments is built."""
    saved = getattr(training_args_module, "is_torch_bf16_gpu_available", None)
    if saved is not None:
        training_args_module.is_torch_bf16_gpu_available = lambda *a, **k: True
    try:
        yield
    finally:
        if saved is not None:
            training_args_module.is_torch_bf16_gpu_available = saved


@contextlib.contextmanager
def intercept_initialize(record: dict):
    """L3. `deepspeed.initialize` records what HF's `deepspeed_init` passes (the config, the
    client optimizer and scheduler) and stops the run there (`StopAtInitialize`), instead of
    building an engine (which needs GPUs and a process group)."""
    saved = deepspeed.initialize

    def initialize(**kw):
        record.update(kw)
        record["config_params"] = copy.deepcopy(kw.get("config_params"))
        raise StopAtInitialize

    deepspeed.initialize = initialize
    try:
        yield
    finally:
        deepspeed.initialize = saved


class StopAtInitialize(Exception):
    """Raised by the intercepted `deepspeed.initialize` (L3): the run stops where the engine
    would be built."""


@contextlib.contextmanager
def recording_deepspeed_init(record: dict):
    """L6. The Trainer's `deepspeed_init` (the release's own, as `trainer.py` imported it) is
    wrapped to record the `num_training_steps` the training loop computed, and the length of
    the Trainer's train dataloader; it then runs unchanged."""
    import transformers.trainer as trainer_module

    real = trainer_module.deepspeed_init

    def wrapped(trainer, num_training_steps, *a, **k):
        record["num_training_steps"] = num_training_steps
        record["batches_per_epoch"] = len(trainer.get_train_dataloader())
        return real(trainer, num_training_steps, *a, **k)

    trainer_module.deepspeed_init = wrapped
    try:
        yield
    finally:
        trainer_module.deepspeed_init = real


@contextlib.contextmanager
def deepspeed_world(world_size: int):
    """L4. The process-group queries `DeepSpeedConfig.__init__` makes (rank, world size; it falls
    back to world size 1 without a process group) answer rank 0 of `world_size`. DeepSpeed 0.3.16
    asks `torch.distributed`, 0.7.7 `deepspeed.comm`."""
    targets = [torch.distributed]
    try:
        from deepspeed import comm as ds_comm
        targets.append(ds_comm)
    except ImportError:
        pass
    saved = [(t, t.get_rank, t.get_world_size) for t in targets]
    for t in targets:
        t.get_rank = lambda group=None: 0
        t.get_world_size = lambda group=None: world_size
    try:
        yield
    finally:
        for t, r, w in saved:
            t.get_rank, t.get_world_size = r, w


def engine_shell(ds_config):
    """L5. A `DeepSpeedEngine` without `__init__` (GPU, process group, model), carrying only what
    the engine's config checks and optimizer / scheduler construction read; its methods are
    DeepSpeed's own."""
    e = DeepSpeedEngine.__new__(DeepSpeedEngine)
    e._config = ds_config
    e.client_optimizer = None
    e.client_lr_scheduler = None
    e.pipeline_parallelism = False
    e.global_rank = 0
    return e


@contextlib.contextmanager
def without_optimizer_wrappers(shell, model):
    """L7. `_configure_optimizer` on a client optimizer (HF's) runs the release's own checks on
    it, then wraps it (ZeRO, fp16, bf16 optimizer; the compression scheduler and quantizer),
    which needs the model on a GPU and a process group. On the shell the wrappers return the
    basic optimizer and the two extras nothing: every check before them is the release's. The
    engine's module is the stand-in model (its duplicate-parameter check reads it)."""
    names = ("_configure_zero_optimizer", "_configure_fp16_optimizer",
             "_configure_bf16_optimizer")
    for n in names:
        if hasattr(DeepSpeedEngine, n):
            object.__setattr__(shell, n, lambda opt, *a, **k: opt)
    for n in ("_configure_compression_scheduler", "_configure_quantization"):
        if hasattr(DeepSpeedEngine, n):
            object.__setattr__(shell, n, lambda *a, **k: None)
    # The engine is an nn.Module that never ran Module.__init__: plain attributes.
    object.__setattr__(shell, "module", model)
    try:
        yield
    finally:
        for n in names + ("_configure_compression_scheduler", "_configure_quantization"):
            shell.__dict__.pop(n, None)


@contextlib.contextmanager
def recording_optimizers(record: dict):
    """L5 (cont.). DeepSpeed's kernel optimizers (FusedAdam, DeepSpeedCPUAdam) load CUDA / C++
    kernels in their constructors. While `_configure_basic_optimizer` runs, each is replaced by a
    recorder that binds the arguments DeepSpeed passes to the real class's `__init__` signature
    (a missing or unknown argument fails exactly as the call would) and returns a plain torch
    AdamW with the same lr / betas / eps / weight decay."""
    import deepspeed.ops.adam as adam_mod

    saved = {n: getattr(adam_mod, n) for n in ("FusedAdam", "DeepSpeedCPUAdam")
             if hasattr(adam_mod, n)}

    def recorder(cls):
        sig = inspect.signature(cls.__init__)

        def make(params, *args, **kwargs):
            params = list(params)
            bound = sig.bind(None, params, *args, **kwargs)
            bound.apply_defaults()
            args_ = {k: v for k, v in bound.arguments.items() if k not in ("self", "params")}
            record["class"] = cls.__name__
            record["arguments"] = {k: jsonable(v) for k, v in args_.items()}
            return torch.optim.AdamW(params, lr=args_.get("lr", 1e-3),
                                     betas=tuple(args_.get("betas", (0.9, 0.999))),
                                     eps=args_.get("eps", 1e-8),
                                     weight_decay=args_.get("weight_decay", 0.0))
        return make

    for n, cls in saved.items():
        setattr(adam_mod, n, recorder(cls))
    try:
        yield
    finally:
        for n, cls in saved.items():
            setattr(adam_mod, n, cls)


# =============================================================================================


class Quiet(contextlib.ExitStack):
    def __enter__(self):
        super().__enter__()
        self.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self.enter_context(contextlib.redirect_stderr(io.StringIO()))
        return self


def jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if hasattr(v, "value"):  # enums (IntervalStrategy, SchedulerType, ZeroStageEnum, …)
        return jsonable(v.value)
    return repr(v)


def err_text(e: BaseException) -> dict:
    """The exception and the innermost frame inside the old library that raised it."""
    where = None
    for fr in traceback.extract_tb(e.__traceback__):
        for lib in ("transformers/", "deepspeed/"):
            if f"/{lib}" in fr.filename:
                where = f"{lib}{fr.filename.split('/' + lib, 1)[1]}:{fr.name}"
    return {"type": type(e).__name__, "message": str(e)[:2000], "raised_at": where}


def diff(a, b, prefix=""):
    """Keys whose values differ between the emitted (a) and the processed (b) config."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            key = f"{prefix}{k}"
            if k not in a:
                out.append({"key": key, "emitted": None, "processed": jsonable(b[k])})
            elif k not in b:
                out.append({"key": key, "emitted": jsonable(a[k]), "processed": None})
            else:
                out += diff(a[k], b[k], key + ".")
    elif a != b or type(a) is not type(b) and not (
            isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b):
        out.append({"key": prefix.rstrip("."), "emitted": jsonable(a), "processed": jsonable(b)})
    return out


class TinyModel(torch.nn.Module):
    """A stand-in for the recipe's model: parameters (with a LayerNorm, which HF's
    `create_optimizer` keeps out of weight decay) and the `config.hidden_size` HF reads for the
    ZeRO bucket sizes. The run stops before a forward pass."""

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = torch.nn.Linear(2, 2)
        self.norm = torch.nn.LayerNorm(2)
        self.config = types.SimpleNamespace(hidden_size=hidden)

    def forward(self, input_ids=None, labels=None):  # pragma: no cover — never reached
        raise AssertionError("the run stops at deepspeed.initialize")


class Samples(torch.utils.data.Dataset):
    """`n` training samples (the recipe's count); their content is never read."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.zeros(2, dtype=torch.long), "labels": 0}


def record_lrs(optimizer, scheduler, total: int) -> list[float]:
    """The LR of optimizer steps 1..total: read before the step, the scheduler stepped after it
    (HF's loop and DeepSpeed's `_take_model_step` alike)."""
    out = []
    for _ in range(total):
        out.append(float(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        scheduler.step()
    return out


def parsed(c) -> dict:
    """What DeepSpeed parsed from the config (the values a run uses)."""
    out = {}
    for attr in ("train_batch_size", "train_micro_batch_size_per_gpu",
                 "gradient_accumulation_steps", "gradient_clipping", "fp16_enabled",
                 "optimizer_name", "optimizer_params", "scheduler_name", "scheduler_params",
                 "zero_enabled", "loss_scale", "initial_dynamic_scale", "steps_per_print",
                 "bfloat16_enabled", "bf16_enabled"):
        if hasattr(c, attr):
            out[attr] = jsonable(copy.deepcopy(getattr(c, attr)))
    z = getattr(c, "zero_config", None)
    if z is not None:
        for attr in ("stage", "cpu_offload", "overlap_comm", "contiguous_gradients",
                     "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter"):
            if hasattr(z, attr):
                out[f"zero.{attr}"] = jsonable(getattr(z, attr))
        oo = getattr(z, "offload_optimizer", None)
        if oo is not None:
            dev = oo.get("device") if isinstance(oo, dict) else getattr(oo, "device", None)
            out["zero.offload_optimizer.device"] = jsonable(dev)
    return out


def run_case(case_dir: Path) -> dict:
    case = json.loads((case_dir / "case.json").read_text())
    emitted = json.loads((case_dir / "ds_config.json").read_text())
    targs = json.loads((case_dir / "training_args.json").read_text())
    world = int(case["world_size"])
    samples = int(case["samples"])
    res: dict = {"case": case["case"], "recipe": case["recipe"], "world_size": world,
                 "samples": samples, "errors": []}
    errors = res["errors"]
    model = TinyModel(int(case.get("hidden_size") or 768))

    # 1. TrainingArguments (HF's config processing in __post_init__)
    kw = dict(targs)
    kw["deepspeed"] = str(case_dir / "ds_config.json")
    try:
        with Quiet(), gpu_bf16():
            args = training_arguments_class(world)(**kw)
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "training_args", **err_text(e)})
        return res
    hfc = getattr(args, "deepspeed_config_hf", None) or getattr(args, "hf_deepspeed_config")
    res["hf_processed_diff"] = diff(emitted, hfc.config)

    # 2. Trainer.train() up to deepspeed.initialize: the release's own dataloader (sampler at
    # the world size, drop_last) and optimizer-step count, then deepspeed_init
    handed: dict = {}
    try:
        with Quiet(), intercept_initialize(handed), recording_deepspeed_init(handed):
            trainer = Trainer(model=model, args=args, train_dataset=Samples(samples))
            trainer.train()
    except StopAtInitialize:
        pass
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "train", **err_text(e)})
        return res
    if "config_params" not in handed:
        errors.append({"stage": "train", "type": "NotReached", "raised_at": None,
                       "message": "Trainer.train() returned without calling deepspeed.initialize"})
        return res
    total = int(handed["num_training_steps"])
    res["real_total"] = total
    res["real_batches_per_epoch"] = handed.get("batches_per_epoch")
    final = handed["config_params"]
    res["handed_config"] = final
    res["handed_diff"] = diff(emitted, final)
    client_opt = handed.get("optimizer")
    client_sched = handed.get("lr_scheduler")
    res["client_optimizer"] = type(client_opt).__name__ if client_opt is not None else None
    res["client_scheduler"] = (None if client_sched is None else
                               "callable" if not hasattr(client_sched, "step")
                               else type(client_sched).__name__)

    # 3. DeepSpeed: config at the world size, engine sanity check, basic optimizer
    try:
        with Quiet(), deepspeed_world(world):
            ds = DeepSpeedConfig(copy.deepcopy(final))
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "deepspeed_config", **err_text(e)})
        return res
    res["deepspeed_parsed"] = parsed(ds)
    shell = engine_shell(ds)
    shell.client_optimizer = client_opt
    shell.client_lr_scheduler = client_sched if hasattr(client_sched, "step") else None
    try:
        with Quiet():
            shell._do_sanity_check()
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "engine_sanity_check", **err_text(e)})
    optimizer = client_opt
    if client_opt is not None:
        # HF's optimizer reaches the engine: its optimizer set-up (L7), e.g. DeepSpeed ≥ 0.8.3
        # refusing a client optimizer with ZeRO-Offload (zero_force_ds_cpu_optimizer).
        try:
            with Quiet(), deepspeed_world(world), without_optimizer_wrappers(shell, model):
                shell._configure_optimizer(client_opt, None)
            # (DeepSpeed 0.3.16 keeps no `basic_optimizer`: the client optimizer is it.)
            res["engine_optimizer"] = type(getattr(shell, "basic_optimizer", client_opt)).__name__
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "engine_optimizer", **err_text(e)})
            return res
    if client_opt is None:
        rec: dict = {}
        try:
            with Quiet(), deepspeed_world(world), recording_optimizers(rec):
                optimizer = shell._configure_basic_optimizer(
                    [p for p in model.parameters() if p.requires_grad])
            res["basic_optimizer"] = rec or {"class": type(optimizer).__name__}
        except Exception as e:  # noqa: BLE001
            errors.append({"stage": "basic_optimizer", **err_text(e)})
            return res

    # 4. learning rates: the scheduler the run steps
    try:
        if ds.scheduler_name is not None:
            side = "deepspeed"
            with Quiet():
                sched = shell._scheduler_from_config(optimizer)
        else:
            side = "hf"
            sched = client_sched(optimizer) if not hasattr(client_sched, "step") else client_sched
        res["lr_side"] = side
        res["lr"] = record_lrs(optimizer, sched, total)
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": "lr", **err_text(e)})
    return res


def run_rejected(case_dir: Path) -> dict:
    """A rejected case: its patched artefacts, then (the control) the base recipe's unpatched
    ones (`base/`, make_cases.py) with the same case.json."""
    import shutil
    import tempfile
    res = run_case(case_dir)
    meta = json.loads((case_dir / "case.json").read_text())
    res["rejected"] = meta.get("rejected")
    res["base_recipe"] = meta.get("base_recipe")
    with tempfile.TemporaryDirectory(prefix="legacy-control-") as t:
        ctl = Path(t)
        shutil.copy2(case_dir / "case.json", ctl / "case.json")
        for f in ("ds_config.json", "training_args.json"):
            shutil.copy2(case_dir / "base" / f, ctl / f)
        res["control"] = run_case(ctl)
    return res


def main() -> int:
    import tempfile
    build, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    # TrainingArguments.output_dir is relative: the Trainer may create it.
    os.chdir(tempfile.mkdtemp(prefix="legacy-run-"))
    doc = {"format": FORMAT, "transformers": TF_VERSION, "deepspeed": DS_VERSION,
           "torch": torch.__version__}
    for part, run in (("cases", run_case), ("rejected", run_rejected)):
        results = []
        root = build / part
        dirs = sorted(p for p in root.iterdir() if (p / "case.json").exists()) \
            if root.is_dir() else []
        for d in dirs:
            try:
                results.append(run(d))
            except Exception as e:  # noqa: BLE001 — a harness bug: recorded, never hidden
                results.append({"case": d.name, "harness_error": err_text(e),
                                "traceback": traceback.format_exc()[-3000:]})
        doc[part] = results
        bad = [r["case"] for r in results if r.get("errors") or r.get("harness_error")]
        print(f"legacy_run: transformers {TF_VERSION} + DeepSpeed {DS_VERSION}: {part}: "
              f"{len(results)}, with errors: {bad[:10]}")
    out.write_text(portable(json.dumps(doc, indent=1, sort_keys=True)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
