#!/usr/bin/env python3
"""Issue 20's owner table: every optimizer kind × owner and every schedule kind × owner, what the
real stack builds against what `recipe check` / `recipe explain` state.

    PATH=$PWD/conformance/.venv/bin:$PATH DS_ACCELERATOR=cpu \
        conformance/.venv/bin/python conformance/owners.py [--recipe BIN] [--out FILE] [--only SUBSTR] [--jobs N]
    conformance/.venv/bin/python conformance/owners.py --write-recipes   # regenerate conformance/owners/*.rcp
    conformance/.venv/bin/python conformance/owners.py --table           # README's table from the fixture

`--reuse` keeps the real runs of an earlier run (conformance/build/owners/<case>/run*.json) and only
re-judges them; `--only SUBSTR` prints the matching records instead of writing the fixture.

The recipes are `conformance/owners/opt-<kind>-<owner>.rcp` (each optimizer kind of the language
with a few non-default keys) and `sched-<kind>-<owner>.rcp` (each schedule kind, with the optimizer
`adamw { lr = 1e-4 }` built by `<owner>`; the metric-driven kinds evaluate every 2 steps); all
train 96 samples, micro 4, one epoch: 24 optimizer steps, world size 1. `opt-<kind>-<owner>-offload`
adds `zero 2 { offload optimizer = cpu }` for the kinds in `OFFLOAD`.

For each recipe: `recipe check --format json` (codes), `recipe explain --format json`. A recipe
with errors is not built (`recipe build` writes nothing); its record names the refusal codes and
the evidence that the real stack refuses or misbuilds it (an existing fixture, or, for R0402, the
real `TrainingArguments(optim=<kind>)` refusal run here). An accepted recipe is built
(`recipe build`, explicit values) and trained for real in a subprocess (`--worker`): the HF
`Trainer.train()` loop with the emitted `training_args.json` and `ds_config.json` (HF → accelerate
→ `deepspeed.initialize` → `DeepSpeedEngine`, CPU, one process, DS_ACCELERATOR=cpu), on a tiny
model whose parameter names are BERT-like (`dense`, `LayerNorm`, `classifier`) so that HF's
no-decay grouping shows. Recorded: who built the optimizer (the engine's client optimizer is HF's;
none means DeepSpeed built it from its `optimizer` section), DeepSpeed's basic optimizer class and
its parameter groups' hyperparameters before the first step, the scheduler classes, and the LR of
every optimizer step (the engine's LR at `on_step_begin`, i.e. what the step runs at). For the
metric-driven kinds `Trainer.evaluate` is replaced by a stub returning the fixed eval losses
`EVAL_LOSSES` (one per evaluation, in order): HF steps its scheduler with them (`Trainer._evaluate`).

The fixture (`fixtures/owners.json`) holds one record per (kind, owner); tests/owners.rs re-runs
check and explain on each recipe and compares them with the recorded real values (no Python).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RECIPES = HERE / "owners"
OVERLAYS = HERE / ".overlays"
FORMAT = "recipe-conformance-owners/1"
BNB = "bitsandbytes-0.50.2"

# One eval loss per evaluation (evaluations every 2 steps: steps 2, 4, …, 24), fed to HF's scheduler.
EVAL_LOSSES = [1.0, 0.9, 0.95, 0.95, 0.8, 0.85, 0.85, 0.85, 0.85, 0.85, 0.85, 0.85]

HEAD = '''recipe "owners-{name}"
model bert {{ from = "bert-base-uncased", task = classify(labels: 2), hidden_size = 768 }}
data {{ train = "train.jsonl"{eval}, samples = 96 }}
batch {{ micro = 4 }}
'''

OPTIMIZERS = {
    "adamw": "lr = 3e-5, betas = (0.8, 0.95), eps = 1e-6, weight_decay = 0.01",
    "adam": "lr = 1e-4, betas = (0.85, 0.98), eps = 1e-7, weight_decay = 0.01",
    "sgd": "lr = 0.05, momentum = 0.9, weight_decay = 0.01",
    "adagrad": "lr = 0.01, eps = 1e-6, weight_decay = 0.01",
    "lamb": "lr = 1e-3, betas = (0.85, 0.98), eps = 1e-7, weight_decay = 0.01",
    "lion": "lr = 1e-4, betas = (0.85, 0.98), weight_decay = 0.1",
    "adafactor": "lr = 1e-3, weight_decay = 0.01",
    "onebitadam": "lr = 1e-4, betas = (0.85, 0.98), eps = 1e-7, weight_decay = 0.01",
    "zerooneadam": "lr = 1e-4, betas = (0.85, 0.98), eps = 1e-7, weight_decay = 0.01",
    "onebitlamb": "lr = 1e-3, betas = (0.85, 0.98), eps = 1e-7, weight_decay = 0.01",
}

SCHEDULES = {
    "linear": "warmup = 4",
    "cosine": "warmup = 4",
    "cosine_with_restarts": "warmup = 4, num_cycles = 2",
    "polynomial": "warmup = 4, power = 2.0, lr_end = 1e-6",
    "constant": "",
    "constant_with_warmup": "warmup = 4",
    "inverse_sqrt": "warmup = 4, timescale = 6",
    "reduce_lr_on_plateau": "factor = 0.5, patience = 1",
    "cosine_with_min_lr": "warmup = 4, min_lr = 1e-5",
    "cosine_warmup_with_min_lr": "warmup = 4, min_lr_rate = 0.1",
    "warmup_stable_decay": "warmup = 4, decay = 8, min_lr_ratio = 0.1",
    "greedy": "factor = 0.5, patience = 1, min_lr = 1e-5, max_lr = 1e-3",
    "WarmupLR": "warmup = 4, min_lr = 1e-6",
    "WarmupDecayLR": "warmup = 4, min_lr = 1e-6",
    "WarmupCosineLR": "warmup = 4, warmup_min_ratio = 0.1, cos_min_ratio = 0.05",
    "OneCycle": "cycle_min_lr = 1e-5, cycle_first_step_size = 8, cycle_second_step_size = 8, "
                "decay_lr_rate = 0.5, decay_step_size = 4, cycle_momentum = false",
    "LRRangeTest": "start_lr = 1e-5, step_size = 4, step_rate = 0.5",
}
METRIC = {"reduce_lr_on_plateau", "greedy"}
# Also run under ZeRO 2 with the optimizer offloaded to the CPU (`opt-<kind>-<owner>-offload`): which
# CPU optimizer DeepSpeed / accelerate put in place of the one the recipe names.
OFFLOAD = ("adamw", "adam", "sgd", "adagrad", "lamb", "lion", "adafactor")
OWNERS = ("hf", "deepspeed")

# Evidence for the refusals whose real behaviour is already recorded elsewhere.
EVIDENCE = {
    "R0410": "conformance/fixtures/rejected/{n}: DeepSpeed 0.19.8's engine raises "
             "\"{cls} is not a supported DeepSpeed Optimizer\" (reproduced: true)",
    "R0409": "conformance/fixtures/rejected/035-R0409-adafactor-owner-deepspeed.json: the real engine "
             "builds torch.optim.Adafactor (DeepSpeed looks the name up in torch.optim), not HF's "
             "transformers.optimization.Adafactor (silent_engine, reproduced: true)",
    "R0315": "conformance/fixtures/{f}: a real DeepSpeed 0.19.8 engine steps HF's {kind} after every "
             "optimizer step with the batch size as the metric (conformance/plateau_engine.py)",
}
R0410_FIXTURES = {"onebitadam": ("007-R0410-onebitadam-removed.json", "OneBitAdam"),
                  "zerooneadam": ("008-R0410-zerooneadam-removed.json", "ZeroOneAdam"),
                  "onebitlamb": ("009-R0410-onebitlamb-removed.json", "OneBitLamb")}

# Optimizer settings compared: explain's key → how the real optimizer's value is read.
OPT_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum")
# The language's no_decay (parameter-name substrings) against the real parameter groups.
TINY_PARAMS = ["LayerNorm.bias", "LayerNorm.weight", "classifier.bias", "classifier.weight",
               "dense.bias", "dense.weight"]


def write_recipes() -> None:
    RECIPES.mkdir(exist_ok=True)
    for kind, keys in OPTIMIZERS.items():
        for owner in OWNERS:
            name = f"opt-{kind}-{owner}"
            text = HEAD.format(name=name, eval="") + f"optimizer {kind} {{ {keys}, owner = {owner} }}\n"
            text += "train { epochs = 1 }\n"
            (RECIPES / f"{name}.rcp").write_text(text)
            if kind in OFFLOAD:
                text = text.replace(f'"owners-{name}"', f'"owners-{name}-offload"')
                text += "zero 2 { offload optimizer = cpu }\n"
                (RECIPES / f"{name}-offload.rcp").write_text(text)
    for kind, keys in SCHEDULES.items():
        for owner in OWNERS:
            name = f"sched-{kind}-{owner}"
            ev = ', eval = "dev.jsonl"' if kind in METRIC else ""
            text = HEAD.format(name=name, eval=ev) + f"optimizer adamw {{ lr = 1e-4, owner = {owner} }}\n"
            text += f"schedule {kind} {{ {keys} }}\n" if keys else f"schedule {kind}\n"
            text += "train { epochs = 1, eval_every = 2 }\n" if kind in METRIC else "train { epochs = 1 }\n"
            (RECIPES / f"{name}.rcp").write_text(text)


# ---------------------------------------------------------------------------------------------
# Worker: one case, the real Trainer.train() with DeepSpeed on the CPU.


def _jsonable(v):
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    try:
        import torch
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return float(v.item())
    except Exception:  # noqa: BLE001
        pass
    return repr(v)


def worker(case_dir: Path, out: Path) -> None:
    import contextlib
    import io
    import traceback
    import warnings

    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 300))
    warnings.filterwarnings("ignore")
    res: dict = {}
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            res = train(case_dir)
    except Exception as e:  # noqa: BLE001 — recorded: the real stack refused
        sys.path.insert(0, str(HERE))
        from train_run import raised_at  # the innermost library frame, site-packages-relative

        res = {"error": f"{type(e).__name__}: {str(e)[:1500]}", "raised_at": raised_at(e)}
    out.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")


def train(case_dir: Path) -> dict:
    import torch
    import transformers
    import accelerate
    import deepspeed
    from transformers import Trainer, TrainerCallback, TrainingArguments

    transformers.logging.set_verbosity_error()
    case = json.loads((case_dir / "case.json").read_text())
    targs = json.loads((case_dir / "training_args.json").read_text())
    targs["deepspeed"] = str(case_dir / "ds_config.json")
    targs["output_dir"] = tempfile.mkdtemp(prefix="recipe-owners-")
    targs.update({"save_strategy": "no", "report_to": "none", "disable_tqdm": True})
    args = TrainingArguments(**targs)
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Linear(4, 4)
            self.LayerNorm = torch.nn.LayerNorm(4)
            self.classifier = torch.nn.Linear(4, 2)

        def forward(self, x, labels):
            logits = self.classifier(self.LayerNorm(self.dense(x)))
            return {"loss": torch.nn.functional.cross_entropy(logits, labels)}

    samples = int(case["samples"])
    train_ds = [{"x": torch.randn(4), "labels": torch.tensor(i % 2)} for i in range(samples)]
    eval_ds = train_ds[:8] if case.get("has_eval") else None
    model = Tiny()
    names = {id(p): n for n, p in model.named_parameters()}
    lrs: list = []
    evals: list = []
    first: dict = {}

    class FixedEval(Trainer):
        def evaluate(self, *a, **k):  # the stated eval losses, in order
            loss = EVAL_LOSSES[len(evals) % len(EVAL_LOSSES)]
            evals.append({"after_step": self.state.global_step, "eval_loss": loss})
            return {"eval_loss": loss}

    class Record(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            e = trainer.model_wrapped
            if not first:
                basic = getattr(e, "basic_optimizer", None) or trainer.optimizer
                first["optimizer"] = f"{type(basic).__module__}.{type(basic).__qualname__}"
                first["wrapper"] = f"{type(e.optimizer).__module__}.{type(e.optimizer).__qualname__}"
                client = getattr(e, "client_optimizer", None)
                first["built_by"] = "hf" if client is not None else "deepspeed"
                first["defaults"] = _jsonable({k: v for k, v in getattr(basic, "defaults", {}).items()})
                for attr in ("adam_w_mode", "adamw_mode", "torch_adam"):
                    if hasattr(basic, attr):
                        first.setdefault("attrs", {})[attr] = _jsonable(getattr(basic, attr))
                # Under ZeRO 1/2 the basic optimizer's groups hold flat partitions: the ZeRO
                # optimizer's `bit16_groups` keeps each group's model parameters.
                held = getattr(e.optimizer, "bit16_groups", None)
                first["param_groups"] = [
                    {**{k: _jsonable(v) for k, v in g.items() if k != "params"},
                     "params": sorted(names.get(id(p), "?")
                                      for p in (held[i] if held and len(held) == len(basic.param_groups)
                                                else g["params"]))}
                    for i, g in enumerate(basic.param_groups) if g["params"]]
                sched = getattr(e, "lr_scheduler", None)
                first["engine_scheduler"] = type(sched).__name__ if sched is not None else None
                hs = trainer.lr_scheduler
                first["trainer_scheduler"] = type(hs).__name__ if hs is not None else None
            lrs.append(float(e.get_lr()[0]))

    trainer = FixedEval(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                        callbacks=[Record()])
    trainer.train()
    return {
        "versions": {m.__name__: m.__version__.split("+")[0] for m in (torch, transformers, accelerate, deepspeed)},
        **first,
        "lr": lrs,
        "evaluations": evals,
        "hf_global_step": trainer.state.global_step,
    }


# ---------------------------------------------------------------------------------------------
# Driver


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def portable(text: str) -> str:
    return text.replace(f"{REPO}/", "").replace(f"{sys.base_prefix}/", "<python>/")


def check(recipe: str, rcp: Path) -> dict:
    p = run([recipe, "check", "--format", "json", str(rcp.relative_to(REPO))])
    diags = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return {"exit": p.returncode,
            "errors": sorted({d["code"] for d in diags if d["severity"] == "error"}),
            "warnings": sorted({d["code"] for d in diags if d["severity"] == "warning"}),
            "notes": sorted({d["code"] for d in diags if d["severity"] not in ("error", "warning")}),
            "messages": sorted({f"{d['code']}: {d['message']}" for d in diags})}


def setting(ex: dict, key: str):
    for s in ex["settings"]:
        if s["key"] == key:
            return s["json"]
    return None


def explained(ex: dict) -> dict:
    opt = {k: setting(ex, f"optimizer.{k}") for k in ("kind", "owner", "no_decay") + OPT_KEYS}
    opt = {k: v for k, v in opt.items() if v is not None}
    side = ex.get("schedule_owner")
    return {
        "optimizer": opt,
        "schedule": {"kind": setting(ex, "schedule.kind"), "owner": side,
                     "hf_schedule": ex.get("hf_schedule"), "deepspeed_schedule": ex.get("deepspeed_schedule")},
        "steps": ex["steps"]["total"],
        "lr": [row.get(side) for row in ex.get("lr", [])] if side else [],
        "notes": [n for n in ex.get("notes", []) if n.startswith(("schedule", "optimizer"))],
    }


def close(a, b, rel=1e-9) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def real_optimizer(run_: dict) -> dict:
    """The hyperparameters the optimizer was built with, from the parameter group holding
    `dense.weight` (the one that decays), before the first step."""
    g = next((g for g in run_.get("param_groups", []) if "dense.weight" in g["params"]), {})
    d = run_.get("defaults", {})
    out = {"class": run_.get("optimizer"), "built_by": run_.get("built_by")}
    out["lr"] = d.get("lr", g.get("initial_lr", g.get("lr")))
    for k in ("betas", "eps", "weight_decay", "momentum"):
        if k in g:
            out[k] = g[k]
        elif k in d:
            out[k] = d[k]
    if "betas" not in out and "beta1" in d:  # Adafactor-style names
        out["beta1"] = d["beta1"]
    out["no_decay_groups"] = [sorted(gr["params"]) for gr in run_.get("param_groups", [])
                              if gr.get("weight_decay") == 0]
    if run_.get("attrs"):
        out["attrs"] = run_["attrs"]
    return out


def compare_optimizer(ex: dict, real: dict) -> tuple[bool, list[str]]:
    diffs = []
    if real.get("built_by") != ex["optimizer"].get("owner"):
        diffs.append(f"built by {real.get('built_by')}, explain says owner = {ex['optimizer'].get('owner')}")
    for k in OPT_KEYS:
        if k not in ex["optimizer"]:
            continue
        mine = ex["optimizer"][k]
        if k not in real:
            diffs.append(f"{k}: explain {mine}, the real optimizer has no `{k}`")
        elif not close(mine, real[k]):
            diffs.append(f"{k}: explain {mine}, real {real[k]}")
    mode = (real.get("attrs") or {}).get("adam_w_mode")
    if mode is not None and ex["optimizer"].get("weight_decay"):
        # DeepSpeed's Adam family: decoupled decay (AdamW) or an L2 penalty (Adam, R0401's note).
        if bool(mode) != (ex["optimizer"]["kind"] == "adamw"):
            diffs.append(f"adam_w_mode: the real optimizer {mode}, explain's kind {ex['optimizer']['kind']}")
    if ex["optimizer"].get("weight_decay") and "no_decay" in ex["optimizer"]:
        said = sorted(p for p in TINY_PARAMS if any(n in p for n in ex["optimizer"]["no_decay"]))
        got = sorted(p for g in real.get("no_decay_groups", []) for p in g)
        if said != got:
            diffs.append(f"no_decay: explain {ex['optimizer']['no_decay']} leaves {said} undecayed, "
                         f"the real optimizer {got}")
    return not diffs, diffs


def first_free_steps(notes: list[str]) -> int | None:
    """The steps explain says run at its table's LR whatever the metric ("steps 1–N run at")."""
    for n in notes:
        m = re.search(r"steps 1[–-](\d+) run at", n)
        if m:
            return int(m.group(1))
        m = re.search(r"step 1 runs at", n)
        if m:
            return 1
    return None


def compare_lr(ours: list, real: list) -> dict:
    n = min(len(ours), len(real))
    first = None
    max_rel = 0.0
    for i in range(n):
        a, b = ours[i], real[i]
        if a is None:
            first = first or {"step": i + 1, "ours": None, "real": b}
            continue
        d = abs(a - b)
        rel = d / abs(b) if b else (0.0 if a == 0 else math.inf)
        max_rel = max(max_rel, rel)
        if first is None and rel > 1e-9:
            first = {"step": i + 1, "ours": a, "real": b}
    return {"ours_steps": len(ours), "real_steps": len(real),
            "max_rel_err": max_rel if math.isfinite(max_rel) else "inf",
            "first_difference": first,
            "equal": first is None and len(ours) == len(real)}


def refusal_evidence(kind: str, codes: list[str]) -> list[str]:
    ev = []
    for c in codes:
        if c == "R0410" and kind in R0410_FIXTURES:
            n, cls = R0410_FIXTURES[kind]
            ev.append(EVIDENCE[c].format(n=n, cls=cls))
        elif c == "R0409":
            ev.append(EVIDENCE[c])
        elif c == "R0315":
            f = "plateau-engine.json" if kind == "reduce_lr_on_plateau" else "greedy-engine.json"
            ev.append(EVIDENCE[c].format(f=f, kind=kind))
        elif c == "R0402":
            ev.append(r0402_real(kind))
        else:  # the corpus-rejected cases of this code, as the harness judged them
            for f in sorted((HERE / "fixtures" / "rejected").glob(f"*-{c}-*.json")):
                r = json.loads(f.read_text()).get("rejected") or {}
                ev.append(f"{f.relative_to(REPO)}: {r.get('why')} (reproduced: {r.get('reproduced')})")
    return ev


def corpus_evidence() -> dict:
    """(table, kind, owner) → the corpus cases (fixtures/corpus/*.json, the harness's run) with
    that optimizer kind / schedule kind and optimizer owner, and whether their LR per step
    matched within 1e-9 relative."""
    out: dict = {}
    for f in sorted((HERE / "fixtures" / "corpus").glob("*.json")):
        d = json.loads(f.read_text())
        rcp = REPO / (d.get("recipe") or "")
        if not rcp.is_file():
            continue
        text = rcp.read_text()
        owner = "hf" if re.search(r"owner\s*=\s*hf", text) else "deepspeed"
        m = re.search(r"^optimizer\s+(\w+)", text, re.M)
        opt = m.group(1) if m else "adamw"
        m = re.search(r"^schedule\s+(\w+)", text, re.M)
        sched = m.group(1) if m else "linear"
        c = d.get("lr_compare") or {}
        rel = c.get("max_rel_err")
        ok = d.get("verdict") == "ok" and isinstance(rel, (int, float)) and rel <= 1e-9
        for key in (("optimizer", opt, owner), ("schedule", sched, owner)):
            e = out.setdefault(key, {"cases": 0, "lr_equal": 0, "examples": []})
            e["cases"] += 1
            e["lr_equal"] += ok
            if len(e["examples"]) < 3:
                e["examples"].append(str(f.relative_to(REPO)))
    return out


def r0402_real(kind: str) -> str:
    """HF's TrainingArguments with `optim = <kind>`, the name the language uses (the real stack has
    no such optim); run in this process (the venv)."""
    try:
        from transformers import TrainingArguments
        with tempfile.TemporaryDirectory() as tmp:
            TrainingArguments(output_dir=tmp, optim=kind, report_to="none")
        return f"TrainingArguments(optim={kind!r}) is accepted"
    except Exception as e:  # noqa: BLE001
        msg = str(e).split(", please select")[0]
        return f"real TrainingArguments(optim={kind!r}): {type(e).__name__}: {msg}"


def run_worker(case_dir: Path, reuse: bool = False, overlay: str | None = None) -> dict:
    """The worker on `case_dir`; `overlay` (a conformance/.overlays/ name) goes on PYTHONPATH."""
    path = str(OVERLAYS / overlay) if overlay else ""
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=path, TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="",
               TORCH_EXTENSIONS_DIR=str(OVERLAYS / "torch_extensions"))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # ninja for DeepSpeed's JIT ops
    out = case_dir / (f"run-{overlay}.json" if overlay else "run.json")
    if reuse and out.exists():
        r = json.loads(out.read_text())
        if "error" in r:
            r["error"] = portable(r["error"])
        return r
    out.unlink(missing_ok=True)
    p = subprocess.run([sys.executable, __file__, "--worker", str(case_dir), str(out)],
                       capture_output=True, text=True, env=env, timeout=1200)
    if not out.exists():
        return {"error": portable(f"worker exit {p.returncode}: {p.stderr[-1500:]}")}
    r = json.loads(out.read_text())
    if "error" in r:
        r["error"] = portable(r["error"])
    return r


def markdown_table(fixture: dict) -> str:
    """The README's table (markdown) from the fixture."""
    rows = ["| recipe | check | the real stack builds / runs | equal | evidence |", "|---|---|---|---|---|"]
    for r in fixture["records"]:
        codes = ", ".join(r["check"]["errors"] + [f"{c} (warning)" for c in r["check"]["warnings"]]
                          + [f"{c} (note)" for c in r["check"]["notes"]]) or "clean"
        verdict = ("refused: " if r["verdict"] == "refused" else "accepted") + ("" if r["verdict"] == "refused" else (f": {codes}" if codes != "clean" else ""))
        if r["verdict"] == "refused":
            verdict += codes
            real = "; ".join(e.split(": ", 1)[0] if e.startswith("conformance/") else e
                             for e in r["evidence"])
            rows.append(f"| `{r['name']}` | {verdict} | — | — | {real} |")
            continue
        real = r["real"]
        if "error" in real:
            what = f"`{real['error'][:90]}` at `{real.get('raised_at')}`"
        else:
            what = f"`{real['class'].rsplit('.', 1)[-1]}` built by {real['built_by']}"
            if r["table"] == "schedule":
                what += f"; scheduler {real.get('engine_scheduler') or real.get('trainer_scheduler')}"
        eq = {True: "yes", False: "**no**", None: "n/a (CPU)"}[r["equal"]]
        if r["kind"] in METRIC and r["verdict"] == "accepted":
            eq += f" (steps 1–{r['metric_free_steps']})"
        c = r.get("corpus")
        ev = "this run" + (f"; corpus {c['lr_equal']}/{c['cases']} LR equal" if c else "")
        rows.append(f"| `{r['name']}` | {verdict} | {what} | {eq} | {ev} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(REPO / "target" / "release" / "recipe"))
    ap.add_argument("--out", default=str(HERE / "fixtures" / "owners.json"))
    ap.add_argument("--only")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--work", default=str(HERE / "build" / "owners"))
    ap.add_argument("--reuse", action="store_true", help="reuse WORK/<case>/run.json from an earlier run")
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--write-recipes", action="store_true")
    ap.add_argument("--table", action="store_true", help="print the README table from --out and exit")
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker[0]), Path(a.worker[1]))
        return 0
    if a.write_recipes:
        write_recipes()
        return 0
    if a.table:
        print(markdown_table(json.loads(Path(a.out).read_text())))
        return 0
    t0 = time.time()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    records, todo = [], []
    for rcp in sorted(RECIPES.glob("*.rcp")):
        name = rcp.stem
        if a.only and a.only not in name:
            continue
        table, kind, owner, *variant = name.split("-")
        rec = {"name": name, "table": "optimizer" if table == "opt" else "schedule", "kind": kind,
               "owner": owner, "variant": variant[0] if variant else None,
               "recipe": str(rcp.relative_to(REPO))}
        rec["check"] = check(a.recipe, rcp)
        p = run([a.recipe, "explain", "--format", "json", str(rcp.relative_to(REPO))])
        ex = json.loads(p.stdout)
        rec["explain"] = explained(ex)
        if rec["check"]["errors"]:
            rec["verdict"] = "refused"
            rec["evidence"] = refusal_evidence(kind, rec["check"]["errors"])
            # A real run of this very recipe, from before the checker refused it (--reuse keeps
            # it): the best evidence there is.
            for saved in sorted((work / name).glob("run*.json")):
                r = json.loads(saved.read_text())
                if "error" in r:
                    rec["real"] = {"error": r["error"], "raised_at": r.get("raised_at")}
                    rec["evidence"] = [f"the real Trainer run of this recipe ({saved.name}) stops: "
                                       f"{r['error']} at {r.get('raised_at')}"]
                    break
            records.append(rec)
            continue
        rec["verdict"] = "accepted"
        out = work / name
        if a.reuse and (out / "run.json").exists():
            keep = {f.name: f.read_text() for f in out.glob("run*.json")}
        else:
            keep = {}
        b = run([a.recipe, "build", str(rcp), "-o", str(out)])
        if b.returncode != 0:
            print(f"{name}: recipe build failed:\n{b.stderr}", file=sys.stderr)
            return 1
        for fname, text in keep.items():
            (out / fname).write_text(text)
        (out / "case.json").write_text(json.dumps({"samples": ex["steps"]["samples"],
                                                    "has_eval": "eval = " in rcp.read_text()}))
        records.append(rec)
        todo.append((rec, out))
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for (rec, _), r in zip(todo, pool.map(lambda t: run_worker(t[1], a.reuse), todo)):
            judge(rec, r)
        # HF's Lion is bitsandbytes' (R0416 warns that transformers does not install it): run
        # again with the bitsandbytes overlay (setup.sh overlays), as hf_optimizers.py does.
        again = [(rec, out) for rec, out in todo if "R0416" in rec["check"]["warnings"]]
        for rec, out in again:
            first = rec["real"]
            if not (OVERLAYS / BNB / ".pins").exists():
                rec["notes"].append(f"overlay {BNB} not installed: not run with bitsandbytes")
                continue
            judge(rec, run_worker(out, a.reuse, BNB))
            rec["stack"] = f"venv + {BNB} overlay"
            rec["real_without_bitsandbytes"] = first
            rec["notes"].append("without bitsandbytes (the venv) the real Trainer stops: "
                                f"{first.get('error')} (R0416 warns of it)")
    corpus = corpus_evidence()
    for r in records:
        r["corpus"] = corpus.get((r["table"], r["kind"], r["owner"])) if not r["variant"] else None
    versions = next((r["real_versions"] for r in records if r.get("real_versions")), None)
    for r in records:
        r.pop("real_versions", None)
    fixture = {"format": FORMAT, "versions": versions, "eval_losses": EVAL_LOSSES,
               "records": records}
    if a.only:
        print(json.dumps(fixture, indent=1, sort_keys=True))
    else:
        Path(a.out).write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    for r in records:
        what = r.get("real", {}).get("class") or r.get("real", {}).get("error") or "; ".join(r.get("evidence", []))[:90]
        print(f"{r['name']:<42} {r['verdict']:<8} {','.join(r['check']['errors'] + r['check']['warnings']) or '-':<14} "
              f"equal={r.get('equal')!s:<5} {what}")
    print(f"{len(records)} records in {time.time() - t0:.0f} s")
    return 0


def judge(rec: dict, r: dict) -> None:
    ex = rec["explain"]
    if "error" in r:
        rec["real"] = {"error": r["error"], "raised_at": r.get("raised_at")}
        if "not been implemented on CPU backend" in r["error"]:
            rec["equal"] = None  # not known on this machine
            fused = {"lamb": "deepspeed.ops.lamb.FusedLamb", "lion": "deepspeed.ops.lion.FusedLion"}
            rec["notes"] = [f"CPU-only limitation: without offload DeepSpeed's engine picks "
                            f"{fused.get(rec['kind'], 'a fused optimizer')} (engine.py "
                            "_configure_basic_optimizer), whose op builder has no CPU implementation "
                            "(DS_ACCELERATOR=cpu); on a GPU it builds the fused CUDA kernel. Not a "
                            "disagreement; the hyperparameters are not checked here"]
        else:
            rec["equal"] = False
            rec["notes"] = ["the real stack refused a recipe the checker accepts"]
        return
    rec["real_versions"] = r["versions"]
    real = real_optimizer(r)
    real["engine_scheduler"] = r.get("engine_scheduler")
    real["trainer_scheduler"] = r.get("trainer_scheduler")
    real["constructor_lr"] = real.pop("lr")
    real["lr"] = r["lr"]
    if r.get("evaluations"):
        real["evaluations"] = r["evaluations"]
    rec["real"] = real
    notes = []
    if rec["table"] == "optimizer":
        ok, diffs = compare_optimizer(ex, {**real, "lr": real["constructor_lr"]})
        rec["optimizer_equal"] = ok
        notes += diffs
    cmp = compare_lr(ex["lr"], r["lr"])
    rec["lr_compare"] = cmp
    if rec["kind"] in METRIC:
        free = first_free_steps(ex["notes"])
        rec["metric_free_steps"] = free
        pre = compare_lr(ex["lr"][:free or 0], r["lr"][:free or 0]) if free else None
        rec["lr_compare_before_metric"] = pre
        rec["equal"] = bool(pre and pre["equal"])
        notes.append(f"metric-driven: explain states steps 1–{free} only (the rest depends on the eval "
                     f"losses); with the stated losses the real LR first differs at "
                     f"{cmp['first_difference']}")
    else:
        rec["equal"] = cmp["equal"] and rec.get("optimizer_equal", True)
        if not cmp["equal"]:
            notes.append(f"LR differs: {cmp['first_difference']}")
    rec["notes"] = notes


if __name__ == "__main__":
    sys.exit(main())
