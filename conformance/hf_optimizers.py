#!/usr/bin/env python3
"""Which optimizer settings reach the optimizer the HF Trainer builds (`owner = hf`), on the real stack.

    .venv/bin/python hf_optimizers.py [--recipe BIN] [--out FIXTURE]

For every optimizer kind with `owner = hf` and a representative set of its keys, the recipe is
checked and built with `recipe` (default: target/release/recipe), the TrainingArguments of its
training_args.json are constructed by the real transformers, and a tiny torch model (a Linear, a
LayerNorm, a classifier: names like BERT's) is handed to the real `Trainer`, whose
`create_optimizer()` builds the optimizer. Recorded per entry: the TrainingArguments that matter
(optim, optim_args, learning_rate, adam_beta1/2, adam_epsilon, weight_decay), what
`Trainer.get_optimizer_cls_and_kwargs` returns, the class built, its `defaults` and its parameter
groups (weight_decay and parameter names). A recipe our checker refuses (R0415, R0402) cannot be
built: for R0415 the refused keys are removed and that base recipe is built instead (the compiler
writes nothing for those keys anyway), so the entry shows what HF would build; R0402's kinds have
no HF optimizer and record the check only. tests/hf_optimizers.rs compares the fixture with the
checker and the compiler without Python (docs/rules/schedule-optimizer.md, "What reaches the
optimizer HF builds").

The `deepspeed` entry of training_args.json is left out: the optimizer HF builds does not depend
on it (transformers' `deepspeed_optim_sched` calls the same `create_optimizer`), and leaving it
out keeps accelerate's DeepSpeed set-up out of a CPU process. CPU only; nothing is trained.

Stacks: the venv (transformers 5.25.0) and, when installed by `setup.sh overlays`, the
`transformers-4.48.0` overlay (an older release, for the entries that target it);
`bitsandbytes-0.50.2` (overlay) provides HF's `lion_32bit` (bitsandbytes' Lion). A missing
overlay is recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OVERLAYS = HERE / ".overlays"
BNB = "bitsandbytes-0.50.2"

HEAD = """model bert {{ from = "bert-base-uncased", task = classify(labels: 2), hidden_size = 768 }}
data {{ train = "train.jsonl", samples = 64 }}
batch {{ micro = 8 }}
"""

# (name, transformers overlay or None for the venv, target line or "", kind, [(key, value)]).
# Each kind HF builds with the keys the language lets it state; values away from the defaults so
# that a dropped one shows.
ENTRIES = [
    ("adamw-defaults", None, "", "adamw", []),
    ("adamw-all", None, "", "adamw", [
        ("lr", "3e-5"), ("betas", "(0.8, 0.95)"), ("eps", "1e-6"), ("weight_decay", "0.01"),
        ("no_decay", '["bias", "LayerNorm.weight"]'), ("amsgrad", "false"),
        ("bias_correction", "true"), ("torch_adam", "true"),
    ]),
    ("adamw-amsgrad", None, "", "adamw", [("lr", "3e-5"), ("amsgrad", "true")]),
    ("adamw-no-bias-correction", None, "", "adamw", [("lr", "3e-5"), ("bias_correction", "false")]),
    ("adamw-torch-adam-false", None, "", "adamw", [("lr", "3e-5"), ("torch_adam", "false")]),
    ("adamw-no-decay-bias-only", None, "", "adamw", [
        ("lr", "3e-5"), ("weight_decay", "0.01"), ("no_decay", '["bias"]'),
    ]),
    ("adam-no-decay", None, "", "adam", [("lr", "1e-4"), ("betas", "(0.9, 0.98)"), ("eps", "1e-7")]),
    ("sgd", None, "", "sgd", [
        ("lr", "0.1"), ("momentum", "0.9"), ("nesterov", "true"), ("weight_decay", "0.01"),
    ]),
    ("sgd-momentum", None, "", "sgd", [("lr", "0.05"), ("momentum", "0.5")]),
    ("sgd-plain", None, "", "sgd", [("lr", "0.05")]),
    ("adagrad", None, "", "adagrad", [("lr", "0.01"), ("eps", "1e-6"), ("weight_decay", "0.01")]),
    ("adagrad-default-eps", None, "", "adagrad", [("lr", "0.01")]),
    ("lion", None, "", "lion", [("lr", "1e-4"), ("betas", "(0.9, 0.99)"), ("weight_decay", "0.1")]),
    ("adafactor", None, "", "adafactor", [("lr", "1e-3"), ("weight_decay", "0.01")]),
    ("adam-weight-decay", None, "", "adam", [("lr", "1e-4"), ("weight_decay", "0.01")]),
    ("lamb", None, "", "lamb", [("lr", "1e-3")]),
    ("onebitadam", None, "", "onebitadam", [("lr", "1e-4")]),
    ("zerooneadam", None, "", "zerooneadam", [("lr", "1e-4")]),
    ("onebitlamb", None, "", "onebitlamb", [("lr", "1e-3")]),
    # Before transformers 5.3.0 SGD and Adagrad ignore optim_args.
    ("sgd-4.48", "transformers-4.48.0", 'target transformers "4.48.0"\n', "sgd", [
        ("lr", "0.1"), ("momentum", "0.9"), ("nesterov", "true"),
    ]),
    ("adagrad-4.48", "transformers-4.48.0", 'target transformers "4.48.0"\n', "adagrad", [
        ("lr", "0.01"), ("eps", "1e-6"),
    ]),
    ("adamw-4.48", "transformers-4.48.0", 'target transformers "4.48.0"\n', "adamw", [
        ("lr", "3e-5"), ("betas", "(0.8, 0.95)"), ("eps", "1e-6"), ("weight_decay", "0.01"),
    ]),
]

ARGS_KEPT = ["optim", "optim_args", "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay"]


def render(name: str, target: str, kind: str, items: list[tuple[str, str]]) -> tuple[str, dict]:
    """The recipe text, and where each key's value starts in it (offset → key)."""
    head = f'recipe "hfopt-{name}"\n{target}' + HEAD.format()
    text = head + f"optimizer {kind} {{ "
    starts = {}
    for i, (key, value) in enumerate(items + [("owner", "hf")]):
        if i:
            text += ", "
        text += f"{key} = "
        starts[len(text.encode())] = key
        text += value
    return text + " }\n", starts


def check(recipe: str, path: Path) -> list[dict]:
    out = subprocess.run([recipe, "check", "--format", "json", str(path)], capture_output=True, text=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------------------------------------
# Worker: runs under one stack (PYTHONPATH), builds the optimizer for each training_args.json.


def _jsonable(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


def worker(paths: list[str]) -> list[dict]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    # `datasets` is not needed to build an optimizer, and the venv's release does not import with
    # an older stack's huggingface_hub (transformers 4.48's trainer.py imports it when present).
    sys.modules["datasets"] = None
    import torch
    import transformers
    from transformers import Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Linear(4, 4)
            self.LayerNorm = torch.nn.LayerNorm(4)
            self.classifier = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.classifier(self.LayerNorm(self.dense(x)))

    results = []
    for path in paths:
        args = json.loads(Path(path).read_text())
        args.pop("deepspeed", None)
        entry = {"args": {k: args.get(k) for k in ARGS_KEPT}}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                args["output_dir"] = tmp
                args["report_to"] = "none"
                ta = TrainingArguments(**args)
                model = Tiny()
                cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(ta, model)
                entry["handler"] = {
                    "class": f"{cls.__module__}.{cls.__qualname__}",
                    "kwargs": _jsonable({k: v for k, v in kwargs.items() if k not in ("params", "model")}),
                }
                trainer = Trainer(model=model, args=ta)
                opt = trainer.create_optimizer()
                names = {id(p): n for n, p in model.named_parameters()}
                entry["class"] = f"{type(opt).__module__}.{type(opt).__qualname__}"
                entry["defaults"] = _jsonable(dict(opt.defaults))
                entry["param_groups"] = [
                    {"weight_decay": g.get("weight_decay"), "params": sorted(names[id(p)] for p in g["params"])}
                    for g in opt.param_groups
                    if g["params"]
                ]
        except Exception as e:  # recorded: the real stack refused these TrainingArguments
            entry["error"] = f"{type(e).__name__}: {e}"
        results.append(entry)
    return results


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("transformers", "torch", "accelerate", "bitsandbytes"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


# ---------------------------------------------------------------------------------------------
# Driver


def run_stack(overlay: str | None, paths: list[str]) -> tuple[dict, list[dict]] | str:
    """Runs the worker under the venv plus `overlay` (and bitsandbytes when installed)."""
    path = []
    if overlay is not None:
        if not (OVERLAYS / overlay / ".pins").exists():
            return f"overlay {overlay} is not installed (setup.sh overlays)"
        path.append(str(OVERLAYS / overlay))
    if (OVERLAYS / BNB / ".pins").exists():
        path.append(str(OVERLAYS / BNB))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *paths], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        return f"worker failed: {out.stderr.strip().splitlines()[-1:]}"
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["versions"], data["results"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "target" / "release" / "recipe"))
    ap.add_argument("--out", default=str(HERE / "fixtures" / "hf-optimizers.json"))
    ap.add_argument("--worker", nargs="*")
    a = ap.parse_args()
    if a.worker is not None:
        print(json.dumps({"versions": versions(), "results": worker(a.worker)}))
        return 0

    entries = []
    by_stack: dict[str | None, list[tuple[dict, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, overlay, target, kind, items in ENTRIES:
            text, starts = render(name, target, kind, items)
            rcp = tmp / f"{name}.rcp"
            rcp.write_text(text)
            diags = check(a.recipe, rcp)
            errors = [d for d in diags if d["severity"] == "error"]
            entry = {
                "name": name,
                "stack": overlay or "venv",
                "recipe": text,
                "check": sorted({d["code"] for d in diags}),
                "built_from": "recipe",
            }
            if errors:
                refused = [starts.get(d["span"]["start"]["offset"]) for d in errors if d["code"] == "R0415"]
                if len(refused) != len(errors) or None in refused:
                    entry["built_from"] = None  # refused for another reason (R0402): no HF optimizer
                    entries.append(entry)
                    continue
                base_items = [(k, v) for k, v in items if k not in refused]
                text, _ = render(name, target, kind, base_items)
                rcp.write_text(text)
                entry["built_from"] = "base"
                entry["base"] = text
                entry["refused_keys"] = sorted(refused)
            out_dir = tmp / name
            built = subprocess.run([a.recipe, "build", str(rcp), "-o", str(out_dir)], capture_output=True, text=True)
            if built.returncode != 0:
                print(f"{name}: recipe build failed:\n{built.stderr}", file=sys.stderr)
                return 1
            entries.append(entry)
            by_stack.setdefault(overlay, []).append((entry, str(out_dir / "training_args.json")))
        stacks = {}
        for overlay, items in by_stack.items():
            got = run_stack(overlay, [p for _, p in items])
            key = overlay or "venv"
            if isinstance(got, str):
                stacks[key] = {"skipped": got}
                for entry, _ in items:
                    entry["skipped"] = got
                continue
            stacks[key], results = got
            for (entry, _), result in zip(items, results):
                entry.update(result)
    fixture = {"format": "recipe-hf-optimizers/1", "stacks": stacks, "entries": entries}
    Path(a.out).write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    for e in entries:
        what = e.get("class") or e.get("error") or e.get("skipped") or "no HF optimizer"
        print(f"{e['name']:<28} {e['stack']:<20} check={','.join(e['check']) or 'clean':<12} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
