#!/usr/bin/env python3
"""Trains one case for real: the HF `Trainer.train()` loop with the case's `training_args.json`
and `ds_config.json`, on CPU, one process, with whatever transformers / accelerate / DeepSpeed
are importable (the harness runs it with an overlay in front of the venv, `PYTHONPATH`, to get
an older release; see README.md, "Older stacks").

    train_run.py CASE_DIR OUT_JSON [--engine] [--artefacts DIR]

`--engine` (the `raise_engine` cases, README.md): the same `Trainer.train()`, stopped after the
first optimizer step. What is recorded is whether the real engine gets built — HF Trainer →
accelerate `prepare` → `deepspeed.initialize` → `DeepSpeedEngine.__init__` (basic optimizer, ZeRO
wrapper) — and took one step, or the exception it raised (type, message, and the innermost
library frame: `raised_at` = file:function). `--artefacts DIR` takes `ds_config.json` /
`training_args.json` from DIR instead of CASE_DIR (the harness's control run on the base recipe's
unpatched artefacts, `CASE_DIR/base/`).

Records, at every optimizer step HF takes (`TrainerCallback.on_step_end`): HF's `global_step`
and `epoch`, the micro-batches the model has seen, and the DeepSpeed engine's own counters
(`DeepSpeedEngine.global_steps` — weight updates — and `micro_steps`) and learning rate. Nothing
in the libraries is patched; what differs from a real launch (all in `OVERRIDES` and `TinyModel`):

* T1 the model is a one-layer stand-in (the step accounting does not depend on the model);
* T2 the dataset is `samples` random items (plus 8 for evaluation when the recipe has an eval
  file), so the Trainer's dataloader has the recipe's length;
* T3 `output_dir` is a temporary directory, `save_strategy = "no"` (checkpoints change no
  counter; kept when `load_best_model_at_end`, which HF requires to match the evaluation),
  `report_to = "none"`, `disable_tqdm = True`;
* T4 one process (`WORLD_SIZE=1`, gloo through DeepSpeed's CPU accelerator): only cases with a
  world size of 1 are run.

DeepSpeed's CPU ops (the shm communicator, the CPU FusedAdam) are JIT-compiled once into
`TORCH_EXTENSIONS_DIR` (the harness points it at conformance/.overlays/torch_extensions).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
             ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
    os.environ.setdefault(k, v)
warnings.filterwarnings("ignore")

OVERRIDES = {"save_strategy": "no", "report_to": "none", "disable_tqdm": True}


def raised_at(exc: BaseException) -> str | None:
    """`path:function` of the innermost frame inside transformers / accelerate / DeepSpeed / torch
    (path relative to site-packages): where the library refused."""
    where = None
    for fr in traceback.extract_tb(exc.__traceback__):
        parts = Path(fr.filename).parts
        if "site-packages" in parts:
            rel = parts[parts.index("site-packages") + 1:]
            if rel and rel[0] in ("deepspeed", "transformers", "accelerate", "torch"):
                where = f"{'/'.join(rel)}:{fr.name}"
    return where


def main() -> int:
    argv = sys.argv[1:]
    engine = "--engine" in argv
    artefacts = None
    if "--artefacts" in argv:
        artefacts = Path(argv[argv.index("--artefacts") + 1]).resolve()
    pos = [a for i, a in enumerate(argv)
           if not a.startswith("--") and (i == 0 or argv[i - 1] != "--artefacts")]
    case_dir, out = Path(pos[0]).resolve(), Path(pos[1])
    res: dict = {"overrides": OVERRIDES}
    log = io.StringIO()
    try:  # the versions first: recorded even when the run is refused
        from importlib.metadata import version
        res["versions"] = {m: version(m) for m in ("torch", "transformers", "accelerate", "deepspeed")}
    except Exception:  # noqa: BLE001
        pass
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            res.update(train(case_dir, engine=engine, artefacts=artefacts or case_dir))
    except Exception as e:  # noqa: BLE001 — recorded, the harness judges
        res["error"] = traceback.format_exc()[-3000:]
        res["exception"] = {"type": type(e).__name__, "message": str(e)[:2000],
                            "raised_at": raised_at(e)}
    res["log_tail"] = log.getvalue()[-1500:] if "error" in res else None
    out.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


def train(case_dir: Path, engine: bool = False, artefacts: Path | None = None) -> dict:
    import torch
    import transformers
    import accelerate
    import deepspeed
    from transformers import Trainer, TrainerCallback, TrainingArguments

    versions = {m.__name__: m.__version__ for m in (torch, transformers, accelerate, deepspeed)}
    # Which copy was imported: the overlay on PYTHONPATH (by name) or the venv.
    overlay = os.environ.get("PYTHONPATH") or None
    where = {m.__name__: (f"overlay {Path(overlay).name}" if overlay and Path(m.__file__).resolve()
                          .is_relative_to(Path(overlay).resolve()) else "venv")
             for m in (torch, transformers, accelerate, deepspeed)}
    # A control (`--artefacts DIR`) runs with DIR's own case.json when it has one: the base
    # recipe's data (make_cases.py writes it), e.g. an evaluation set the rejected one lacks.
    own = (artefacts or case_dir) / "case.json"
    case = json.loads((own if own.exists() else case_dir / "case.json").read_text())
    if int(case["world_size"]) != 1:
        return {"versions": versions, "error": f"world size {case['world_size']}: only 1 is run"}
    artefacts = artefacts or case_dir
    targs = json.loads((artefacts / "training_args.json").read_text())
    targs["deepspeed"] = str(artefacts / "ds_config.json")
    targs["output_dir"] = tempfile.mkdtemp(prefix="recipe-train-")
    overrides = dict(OVERRIDES)
    if targs.get("load_best_model_at_end"):
        # T3 exception: HF requires save_strategy == eval_strategy for it (the case is about
        # what the Trainer does with it, R0906).
        overrides.pop("save_strategy")
    targs.update(overrides)
    args = TrainingArguments(**targs)

    torch.manual_seed(0)

    class TinyModel(torch.nn.Module):  # T1
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
            self.train_forwards = 0

        def forward(self, x, labels):
            if self.training:
                self.train_forwards += 1
            return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}

    samples = int(case["samples"])
    train_ds = [{"x": torch.randn(4), "labels": torch.tensor(1.0)} for _ in range(samples)]  # T2
    eval_ds = train_ds[:8] if case.get("has_eval") else None
    model = TinyModel()
    rows: list = []
    per_epoch: list = []

    class Record(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            e = trainer.model_wrapped
            rows.append({
                "hf_global_step": state.global_step,
                "epoch": state.epoch,
                "micro_batches": model.train_forwards,
                "ds_global_steps": getattr(e, "global_steps", None),
                "ds_micro_steps": getattr(e, "micro_steps", None),
                "lr": e.get_lr()[0] if hasattr(e, "get_lr") else None,
            })

            if engine:  # --engine: the engine is built and took one optimizer step
                control.should_training_stop = True

        def on_epoch_end(self, a, state, control, **kw):
            per_epoch.append(model.train_forwards - sum(per_epoch))

    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      callbacks=[Record()])
    trainer.train()
    e = trainer.model_wrapped
    classes = {  # --engine: what the engine built
        "deepspeed_optimizer": type(getattr(e, "optimizer", None)).__name__,
        "deepspeed_basic_optimizer": type(getattr(e, "basic_optimizer", None)).__name__,
        "deepspeed_basic_optimizer_module": type(getattr(e, "basic_optimizer", None)).__module__,
    } if engine else {}
    return {
        **classes,
        "versions": versions,
        "imported_from": where,
        "deepspeed_engine": type(e).__name__,
        "rows": rows,
        "summary": {
            "num_train_epochs": args.num_train_epochs,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "max_steps": trainer.state.max_steps,
            "hf_global_step": trainer.state.global_step,
            "epoch_reached": trainer.state.epoch,
            "micro_batches": model.train_forwards,
            "micro_batches_per_epoch": per_epoch,
            "ds_global_steps": getattr(e, "global_steps", None),
            "ds_micro_steps": getattr(e, "micro_steps", None),
            "final_lr": e.get_lr()[0] if hasattr(e, "get_lr") else None,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
