#!/usr/bin/env python3
"""The two backends agree: `recipe run` and `recipe build` + `bash launch.sh` (HF Trainer +
DeepSpeed, CPU accelerator; world 1, or 2 where a recipe says `cluster { gpus = 2 }`) train the
same recipes from the same initial weights, and
this script records, per recipe, how far apart they end up.

    agreement.py [--recipe BIN] [--out FIXTURE] [--only SUBSTRING] [--keep DIR]

Run with the conformance venv (conformance/setup.sh):

    PATH=$PWD/conformance/.venv/bin:$PATH DS_ACCELERATOR=cpu \\
        conformance/.venv/bin/python conformance/agreement.py

What is held equal on both sides: the recipe (conformance/agreement/*.rcp: fp32, `dropout = 0`,
`data.shuffle = false`, which the build passes as `--train_sampling_strategy sequential`), the
data (runtime/tests/fixtures/data/spam48.jsonl as train.jsonl), the tokenizer
(runtime/tests/fixtures/tokenizer/tokenizer.json) and the initial weights: one random-init
`BertForSequenceClassification` of runtime/tests/fixtures/tiny-bert/config.json (torch seed
INIT_SEED, dropout 0, labels ham/spam), saved once with `save_pretrained` into `init/`, which
every recipe loads with `model bert { from = "init" }`.

The HF side runs on the venv's releases, or, for a recipe whose `target` names others, under the
overlay of overlays.txt that pins them (PYTHONPATH=.overlays/<name>); `# run-under: <overlay>`
runs artefacts built for one release under another, `# init-file: NAME JSON` adds a file to the
recipe's copy of `init/`, `# own-script: NAME` writes the recipe's own training script as the
generated train.py without its loss-kwargs fix (a control run), and `# expect: R0912` marks a
recipe whose
stack trains something else than the recipe means, by the amount that rule states
(tests/agreement.rs checks the divergence instead of the agreement).

Per optimizer step it reads the native runtime's metrics.jsonl (step, lr, loss) and the HF
Trainer's `log_history` (trainer_state.json of the last checkpoint, logging_steps = 1), and the
final weights of both (`out/model/model.safetensors`). The fixture
(conformance/fixtures/agreement.json) holds relative paths only; tests/agreement.rs reads it.

How the two logs line up (read in transformers 5.24.0, trainer.py):
* HF's logged `learning_rate` at step k is read after the scheduler stepped (`_maybe_log_save_
  evaluate` runs after `lr_scheduler.step()`): it is the LR step k+1 runs at. The LR step k ran
  at is therefore the logged LR of step k-1, and for step 1 the LR the scheduler starts at, which
  this script takes from HF's own `get_scheduler` on a dummy optimizer (and checks that the same
  replay gives every logged value). The native runtime logs the LR step k ran at.
* HF's logged `loss` at step k (logging_steps = 1) is the sum over the step's micro-batches of
  each micro-batch's mean loss divided by that window's micro-batch count
  (`current_gradient_accumulation_steps`, the short last window included) -- the window mean,
  as the native runtime logs it; train.py sets `model.accepts_loss_kwargs = False` so that HF
  divides by the window (issue 18).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

FORMAT = "recipe-agreement/1"
ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ROOT / "conformance" / ".overlays"  # setup.sh overlays (overlays.txt)
RECIPES = ROOT / "conformance" / "agreement"
FIXTURES = ROOT / "runtime" / "tests" / "fixtures"
INIT_SEED = 0
ROWS = 48  # spam48.jsonl
# The attention key projection's bias has an exactly zero gradient; the native runtime keeps it
# at zero, torch accumulates rounding noise (docs/runtime.md): compared apart from the rest.
ZERO_GRAD = "attention.self.key.bias"
# A short last micro-batch at world 1 once diverged: the native runtime padded it with the epoch's
# first rows (accelerate's BatchSamplerShard), but accelerate shards only when num_processes != 1
# (data_loader.py prepare_data_loader). Fixed in runtime/src/data/shard.rs `trainer_batches`; the
# recipes with a short batch keep it covered.


def rel(p: Path) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


def make_init(dest: Path) -> None:
    """One random-init classifier, saved as HF saves it (config.json + model.safetensors), with
    the tokenizer beside it so that both sides load the model and tokenizer from `init/`."""
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig.from_pretrained(
        str(FIXTURES / "tiny-bert" / "config.json"), num_labels=2,
        id2label={0: "ham", 1: "spam"}, label2id={"ham": 0, "spam": 1},
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(INIT_SEED)
    model = BertForSequenceClassification(cfg)
    model.save_pretrained(str(dest))
    shutil.copy(FIXTURES / "tokenizer" / "tokenizer.json", dest / "tokenizer.json")


def pinned_versions() -> dict:
    import accelerate
    import deepspeed
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "accelerate": accelerate.__version__, "deepspeed": deepspeed.__version__}


def targets(recipe: Path) -> dict:
    """The releases a recipe's `target` line pins (`target transformers "4.48.0", ...`)."""
    for line in recipe.read_text().splitlines():
        if line.startswith("target "):
            return dict(re.findall(r'(\w+)\s+"([^"]+)"', line[len("target "):]))
    return {}


def overlay_for(recipe: Path, pinned: dict) -> str | None:
    """The overlay (overlays.txt) whose pins hold every release the recipe targets that the venv
    does not have; None when the venv is the recipe's stack. The HF side then runs with
    PYTHONPATH=.overlays/<name> in front of the venv, as the harness runs old releases."""
    for line in recipe.read_text().splitlines():
        if line.startswith("# run-under:"):  # artefacts built for one release, run under another
            name = line.split(":", 1)[1].split()[0]
            if not (OVERLAYS / name).is_dir():
                raise RuntimeError(f"overlay {name} is not installed: conformance/setup.sh overlays")
            return name
    want = {lib: v for lib, v in targets(recipe).items() if pinned.get(lib) != v}
    if not want:
        return None
    for line in (ROOT / "conformance" / "overlays.txt").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, *pins = line.split()
            if all(f"{lib}=={v}" in pins for lib, v in want.items()):
                if not (OVERLAYS / name).is_dir():
                    raise RuntimeError(f"overlay {name} is not installed: conformance/setup.sh overlays")
                return name
    raise RuntimeError(f"no overlay in overlays.txt pins {want}")


def stack_versions(env: dict) -> dict:
    """The releases the HF side imports under `env` (an overlay in front of the venv)."""
    code = ("import json, torch, transformers, accelerate, deepspeed; print(json.dumps({m.__name__: "
            "m.__version__ for m in (torch, transformers, accelerate, deepspeed)}))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def expected(recipe: Path) -> list[str]:
    """The codes a recipe says the checker reports for the divergence it shows (`# expect: R0912`):
    tests/agreement.rs checks that the checker does and that the fixture shows that divergence."""
    return [c for line in recipe.read_text().splitlines() if line.startswith("# expect:")
            for c in re.findall(r"\bR\d{4}\b", line)]


def init_files(recipe: Path) -> dict:
    """Files a recipe adds to its copy of `init/` (`# init-file: NAME JSON`): `init/` is written
    as `save_pretrained` writes a model (config.json, model.safetensors) plus tokenizer.json, and
    a recipe that needs what a fuller model directory has says so, e.g.
    `# init-file: tokenizer_config.json {"do_lower_case": true}` for transformers 5.0-5.2 (R0808)."""
    out = {}
    for line in recipe.read_text().splitlines():
        if line.startswith("# init-file:"):
            name, text = line.split(":", 1)[1].split(None, 1)
            out[name] = json.loads(text)
    return out


FIX_LINE = "    model.accepts_loss_kwargs = False\n"


def own_script(recipe: Path) -> str | None:
    """`# own-script: NAME`: the recipe names its own training script NAME (`train.script`), and
    the harness writes it as the generated train.py without its `model.accepts_loss_kwargs =
    False` line -- a user's script copied from HF's examples: the control run of R0912's G× on
    transformers 5.x (issue 18)."""
    for line in recipe.read_text().splitlines():
        if line.startswith("# own-script:"):
            return line.split(":", 1)[1].split()[0]
    return None


def write_own_script(ws: Path, recipe: Path, recipe_bin: str, name: str) -> None:
    """Builds `recipe` without its `script` to get the generated train.py, and writes it as
    `name` in `ws` with the fix line taken out (it must be there exactly once)."""
    text = re.sub(r',\s*script\s*=\s*"[^"]*"', "", recipe.read_text())
    (ws / "_generated.rcp").write_text(text)
    run([recipe_bin, "build", "_generated.rcp", "-o", "_generated"], ws)
    script = (ws / "_generated" / "train.py").read_text()
    assert script.count(FIX_LINE) == 1, "the generated train.py no longer sets accepts_loss_kwargs"
    script = script.replace(FIX_LINE, "    # (control run: accepts_loss_kwargs not set)\n")
    # launch.sh passes an own script run_classification.py's flags too (--model_name_or_path,
    # --train_file, ...); this one takes the same values from its constants (the same recipe).
    parse = "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()"
    assert script.count(parse) == 1, "the generated train.py parses its flags differently"
    script = script.replace(parse, "args = HfArgumentParser(TrainingArguments)"
                            ".parse_args_into_dataclasses(return_remaining_strings=True)[0]")
    (ws / name).write_text(script)


def workspace(base: Path, recipe: Path, init: Path) -> Path:
    base.mkdir(parents=True)
    shutil.copy(recipe, base / recipe.name)
    shutil.copy(FIXTURES / "data" / "spam48.jsonl", base / "train.jsonl")
    shutil.copytree(init, base / "init")
    for name, content in init_files(recipe).items():
        (base / "init" / name).write_text(json.dumps(content))
    return base


def run(cmd: list[str], cwd: Path, env: dict | None = None, log: Path | None = None) -> float:
    t = time.time()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if log is not None:
        log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (in {cwd.name}) exit {p.returncode}:\n"
                           f"{(p.stdout + p.stderr)[-3000:]}")
    return time.time() - t


def native_side(ws: Path, recipe_bin: str, name: str) -> dict:
    secs = run([recipe_bin, "run", "--quiet", name], ws)
    recs = [json.loads(line) for line in (ws / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "loss" in r and "step" in r]
    end = next(r for r in recs if r.get("event") == "end")
    return {"seconds": secs, "steps": [r["step"] for r in steps], "lr": [r["lr"] for r in steps],
            "eval": [(r["step"], r["eval"]["loss"]) for r in recs if "eval" in r and "step" in r],
            "loss": [r["loss"] for r in steps], "grad_norm": [r.get("grad_norm") for r in steps],
            "taken": end["steps"]["taken"],
            "predicted": end["steps"]["predicted"],
            "weights": load_file(str(ws / "out" / "model" / "model.safetensors"))}


def hf_applied_lrs(args: dict, total: int, ds_sched: dict | None = None) -> tuple[list[float], list[float]]:
    """The LR of each step 1..total+1 from the scheduler the run steps, on a dummy optimizer,
    stepped once per optimizer step: HF's own (`get_scheduler`, as `Trainer.create_scheduler`
    calls it), or, where the DeepSpeed config has a `scheduler` section, DeepSpeed's class with
    its params (`runtime/lr_schedules.py`, as the engine's `_scheduler_from_config` builds it;
    the engine steps it after every optimizer step and HF logs its `get_last_lr()`)."""
    from transformers import get_scheduler
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=args["learning_rate"])
    if ds_sched is not None:
        from deepspeed.runtime import lr_schedules
        sched = getattr(lr_schedules, ds_sched["type"])(opt, **(ds_sched.get("params") or {}))
    else:
        warm = args.get("warmup_steps", 0)
        if isinstance(warm, float) and warm < 1:
            warm = math.ceil(warm * total)
        # The schedule's own kwargs (num_cycles, min_lr, num_decay_steps, ...), as the Trainer
        # passes `lr_scheduler_kwargs` (a dict, or its JSON text on the command line).
        kwargs = args.get("lr_scheduler_kwargs") or {}
        if isinstance(kwargs, str):
            kwargs = json.loads(kwargs)
        sched = get_scheduler(args.get("lr_scheduler_type", "linear"), opt,
                              num_warmup_steps=warm, num_training_steps=total,
                              scheduler_specific_kwargs=kwargs)
    out = []
    for _ in range(total + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out[:-1], out[1:]


METRIC_DRIVEN = ("reduce_lr_on_plateau", "greedy")


def metric_driven_replay(args: dict, total: int, evals: list) -> tuple[list[float], float | None]:
    """The LR of each step 1..total under a schedule the Trainer steps only after an evaluation
    (torch's ReduceLROnPlateau, HF's GreedyLR; transformers 5.24.0 trainer.py: no
    `lr_scheduler.step()` after an optimizer step for them, `lr_scheduler.step(metric)` in
    `_evaluate`). The LR HF logs at step k is read right after the optimizer step
    (`learning_rate = self._get_learning_rate()`), before that step's evaluation moves it: it is
    the LR step k ran at, and the applied LR. This replays HF's own scheduler class
    (`get_scheduler`) on a dummy optimizer, stepped with HF's evaluation losses at the steps HF
    evaluated, which must give every logged value; and the verdicts' margin ([`verdict_margin`])."""
    from transformers import get_scheduler
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=args["learning_rate"])
    kwargs = args.get("lr_scheduler_kwargs") or {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs)
    sched = get_scheduler(args["lr_scheduler_type"], opt, scheduler_specific_kwargs=kwargs)
    # Every verdict (metric, best so far) the scheduler takes, for the margin below.
    name = "_is_better" if hasattr(sched, "_is_better") else "is_better"
    verdict = getattr(sched, name)
    seen = []
    setattr(sched, name, lambda a, best: seen.append((a, best)) or verdict(a, best))
    at = dict(evals)
    replay = []
    for k in range(1, total + 1):
        replay.append(opt.param_groups[0]["lr"])
        if k in at:
            sched.step(at[k])
    return replay, verdict_margin(seen, sched.mode, sched.threshold_mode, sched.threshold)


def verdict_margin(seen: list, mode: str, threshold_mode: str, threshold: float) -> float | None:
    """How close the closest verdict came to the other one: min over the (metric, best) pairs
    the scheduler compared of |metric - boundary| / |metric|, the boundary being where
    `is_better` flips (best·(1 ∓ threshold) relative, best ∓ threshold absolute). A verdict
    closer than the two sides' evaluation losses differ could go either way."""
    sign = -1.0 if mode == "min" else 1.0
    margins = []
    for a, best in seen:
        if math.isfinite(best) and a:
            edge = best * (1 + sign * threshold) if threshold_mode == "rel" else best + sign * threshold
            margins.append(abs(a - edge) / abs(a))
    return min(margins, default=None)


def hf_side(ws: Path, recipe_bin: str, name: str, env: dict) -> dict:
    own = own_script(ws / name)
    if own:
        write_own_script(ws, ws / name, recipe_bin, own)
    run([recipe_bin, "build", name], ws)
    (build,) = [p.parent for p in (ws / "build").glob("*/launch.sh")]  # build/<recipe name>/
    args = json.loads((build / "training_args.json").read_text())
    ds = json.loads((build / "ds_config.json").read_text())
    secs = run(["bash", str(build / "launch.sh")], ws, env=env, log=ws / "launch.log")
    out = ws / "out"
    state, ds_steps, _ = last_checkpoint(out)
    logs = [h for h in state["log_history"] if "loss" in h and "step" in h]
    evals = [(h["step"], h["eval_loss"]) for h in state["log_history"] if "eval_loss" in h]
    total = state["max_steps"]
    logged = [h["learning_rate"] for h in logs]
    if args.get("lr_scheduler_type") in METRIC_DRIVEN:
        applied = logged
        replay, margin = metric_driven_replay(args, total, evals)
        matches = logged == replay[:len(logs)]
    else:
        applied, after = hf_applied_lrs(args, total, ds.get("scheduler"))
        matches, margin = logged == after[:len(logs)], None
    return {"seconds": secs, "steps": [h["step"] for h in logs], "global_step": state["global_step"],
            "ds_global_steps": ds_steps,
            "grad_norm": [h.get("grad_norm") for h in logs],
            "max_steps": total, "loss": [h["loss"] for h in logs], "lr_logged": logged,
            "lr": applied[:len(logs)], "lr_replay_matches_log": matches, "eval": evals,
            "verdict_margin": margin,
            "train_sampling_strategy": args.get("train_sampling_strategy"),
            # train.py's own switch: on a release without train_sampling_strategy it visits the
            # rows with a SequentialSampler when this is False (src/emit/train_template.py).
            "train_py_shuffle": re.search(r"^SHUFFLE = (\w+)",
                                          (ws / own if own else build / "train.py").read_text(),
                                          re.M).group(1),
            "own_script": own,
            "micro": args["per_device_train_batch_size"],
            "accumulate": args["gradient_accumulation_steps"],
            "short_batch_steps": short_batch_steps(args["per_device_train_batch_size"],
                                                   args["gradient_accumulation_steps"],
                                                   int(args["num_train_epochs"])),
            "zero_stage": ds.get("zero_optimization", {}).get("stage"),
            "offload_optimizer": (ds.get("zero_optimization", {}).get("offload_optimizer") or {})
            .get("device"),
            "optimizer": ds.get("optimizer", {}).get("type") or "HF (" + args.get("optim", "default") + ")",
            "weights": hf_names(load_file(str(out / "model" / "model.safetensors")))}


def last_checkpoint(out: Path) -> tuple[dict, int | None, list[int]]:
    """The HF run's last checkpoint in `out`: its trainer_state.json, DeepSpeed's own count of
    applied optimizer steps (the engine saves under the tag `global_step{engine.global_steps}`,
    runtime/engine.py:save_checkpoint, DeepSpeed 0.19.8; None without one), and every
    checkpoint's step."""
    ckpts = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((ckpts[-1] / "trainer_state.json").read_text())
    tags = [int(p.name[len("global_step"):]) for p in ckpts[-1].glob("global_step*")]
    return state, (max(tags) if tags else None), [int(p.name.split("-")[1]) for p in ckpts]


def hf_names(w: dict) -> dict:
    """Under ZeRO-3 the HF-saved model.safetensors names LayerNorm parameters `gamma` / `beta`
    (transformers' loaders rename them back to `weight` / `bias`): read them under those names."""
    out = {}
    for n, t in w.items():
        if n.endswith("LayerNorm.gamma"):
            n = n[:-len("gamma")] + "weight"
        elif n.endswith("LayerNorm.beta"):
            n = n[:-len("beta")] + "bias"
        out[n] = t
    return out


def weight_deviation(a: dict, b: dict, init: dict) -> dict:
    """Final weights of the two sides, over every tensor both hold: the largest absolute
    difference, the difference's norm relative to the weights' norm and relative to the training
    update's norm (final - init, HF side), and the worst tensor by the latter."""
    names = sorted(n for n in set(a) & set(b) if not n.endswith(ZERO_GRAD))
    only = sorted(set(a) ^ set(b))
    key_bias = max((float((a[n].double() - b[n].double()).abs().max())
                    for n in set(a) & set(b) if n.endswith(ZERO_GRAD)), default=0.0)
    d2 = w2 = u2 = n2 = 0.0
    max_abs, worst, worst_rel = 0.0, None, 0.0
    for n in names:
        x, y = a[n].double(), b[n].double()
        if x.shape != y.shape:
            raise RuntimeError(f"{n}: shapes {tuple(x.shape)} and {tuple(y.shape)}")
        d = (x - y)
        u = y - init[n].double()
        v = x - init[n].double()
        n2 += float((v * v).sum())
        d2 += float((d * d).sum())
        w2 += float((y * y).sum())
        u2 += float((u * u).sum())
        max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
        r = float(d.norm() / u.norm()) if float(u.norm()) > 0 else 0.0
        if r > worst_rel:
            worst, worst_rel = n, r
    return {"tensors": len(names), "only_one_side": only, "max_abs": max_abs,
            "rel_to_weights": math.sqrt(d2 / w2) if w2 else 0.0,
            "rel_to_update": math.sqrt(d2 / u2) if u2 else 0.0,
            "update_norm": math.sqrt(u2), "native_update_norm": math.sqrt(n2),
            "worst_tensor": worst,
            "key_bias_max_abs": key_bias,
            "worst_tensor_rel_to_update": worst_rel}


def short_batch_steps(micro: int, accumulate: int, epochs: int) -> list[int]:
    """The optimizer steps whose window holds an epoch's short last micro-batch (world 1)."""
    if ROWS % micro == 0:
        return []
    batches = -(-ROWS // micro)
    per_epoch = -(-batches // accumulate)
    return [e * per_epoch + (batches - 1) // accumulate + 1 for e in range(epochs)]


def compare(nat: dict, hf: dict, init: dict) -> dict:
    n = min(len(nat["lr"]), len(hf["lr"]))
    short = hf["short_batch_steps"]
    clean = (short[0] - 1) if short else n
    lr_abs = max((abs(a - b) for a, b in zip(nat["lr"], hf["lr"])), default=0.0)
    lr_rel = max((abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(nat["lr"], hf["lr"])),
                 default=0.0)
    loss_rel = [abs(a - b) / abs(b) for a, b in zip(nat["loss"], hf["loss"])]
    # The gradient norm each side clipped with (HF logs DeepSpeed's `get_global_grad_norm()`).
    norm_rel = [abs(a - b) / abs(b) if a is not None and b else None
                for a, b in zip(nat["grad_norm"], hf["grad_norm"])]
    rows = [{"step": k + 1, "native_lr": nat["lr"][k], "hf_lr": hf["lr"][k],
             "hf_lr_logged": hf["lr_logged"][k], "native_loss": nat["loss"][k],
             "hf_loss": hf["loss"][k], "loss_rel": loss_rel[k],
             "native_grad_norm": nat["grad_norm"][k], "hf_grad_norm": hf["grad_norm"][k],
             "grad_norm_rel": norm_rel[k]} for k in range(n)]
    norms = [x for x in norm_rel if x is not None]
    return {
        "steps": {"native": nat["taken"], "native_predicted": nat["predicted"],
                  "hf_global_step": hf["global_step"], "hf_max_steps": hf["max_steps"],
                  "deepspeed_global_steps": hf["ds_global_steps"],
                  "native_logged": len(nat["steps"]), "hf_logged": len(hf["steps"])},
        "lr": {"max_abs": lr_abs, "max_rel": lr_rel,
               "hf_replay_matches_log": hf["lr_replay_matches_log"]},
        "short_batch_steps": short,
        "loss": {"max_rel": max(loss_rel, default=0.0),
                 "steps_before_short_batch": clean,
                 "max_rel_before_short_batch": max(loss_rel[:clean], default=0.0),
                 "worst_step": 1 + max(range(n), key=lambda k: loss_rel[k]) if n else None,
                 "first_step_rel": loss_rel[0] if n else None},
        "grad_norm": {"compared": len(norms), "max_rel": max(norms, default=None),
                      "max_rel_before_short_batch": max(
                          (x for x in norm_rel[:clean] if x is not None), default=None)},
        "weights": weight_deviation(nat["weights"], hf["weights"], init),
        "eval": {**compare_evals(nat["eval"], hf["eval"]), "verdict_margin": hf["verdict_margin"]},
        "rows": rows,
    }


def compare_evals(nat: list, hf: list) -> dict:
    """The evaluation losses of both sides, at the optimizer steps each evaluated after."""
    rel = [abs(a - b) / abs(b) for (_, a), (_, b) in zip(nat, hf)]
    return {"native_steps": [k for k, _ in nat], "hf_steps": [k for k, _ in hf],
            "native_loss": [x for _, x in nat], "hf_loss": [x for _, x in hf],
            "max_rel": max(rel, default=None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "target" / "release" / "recipe"))
    ap.add_argument("--out", type=Path, default=ROOT / "conformance" / "fixtures" / "agreement.json")
    ap.add_argument("--only")
    ap.add_argument("--recipes", type=Path, default=RECIPES, help="a folder of .rcp files")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    a = ap.parse_args()
    scratch = a.keep or Path(tempfile.mkdtemp(prefix="recipe-agreement-"))
    if a.keep and scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    init = scratch / "init"
    make_init(init)
    init_w = load_file(str(init / "model.safetensors"))
    env = dict(os.environ, DS_ACCELERATOR="cpu",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    pinned = pinned_versions()
    recipes = sorted(a.recipes.resolve().glob("*.rcp"))
    if a.only:
        recipes = [r for r in recipes if a.only in r.name]
    results = []
    for r in recipes:
        t = time.time()
        try:
            overlay = overlay_for(r, pinned)
            env_r = dict(env, PYTHONPATH=str(OVERLAYS / overlay)) if overlay else env
            stack = {"overlay": overlay, "versions": stack_versions(env_r)}
            nat = native_side(workspace(scratch / r.stem / "native", r, init), a.recipe, r.name)
            hf = hf_side(workspace(scratch / r.stem / "hf", r, init), a.recipe, r.name, env_r)
            res = {"recipe": rel(r), "name": r.stem, "stack": stack, "expect": expected(r),
                   "init_files": init_files(r),
                   "hf_build": {k: hf[k] for k in ("train_sampling_strategy", "train_py_shuffle",
                                                   "own_script", "micro",
                                                   "accumulate", "zero_stage",
                                                   "offload_optimizer", "optimizer")},
                   **compare(nat, hf, init_w),
                   "seconds": {"native": round(nat["seconds"], 1), "hf": round(hf["seconds"], 1)}}
        except Exception as e:  # noqa: BLE001 -- recorded, and the exit status says so
            res = {"recipe": rel(r), "name": r.stem, "error": str(e).replace(str(scratch), "<scratch>")}
        results.append(res)
        s = res.get("steps", {})
        print(f"{r.stem}: {time.time() - t:.0f}s steps {s.get('native')}/{s.get('hf_global_step')} "
              f"lr {res.get('lr', {}).get('max_abs')} loss {res.get('loss', {}).get('max_rel')} "
              f"w {res.get('weights', {}).get('rel_to_update')} {res.get('error', '')[-500:]}",
              flush=True)
    fixture = {"format": FORMAT, "versions": pinned,
               "init": {"seed": INIT_SEED, "config": rel(FIXTURES / "tiny-bert" / "config.json"),
                        "tokenizer": rel(FIXTURES / "tokenizer" / "tokenizer.json"),
                        "data": rel(FIXTURES / "data" / "spam48.jsonl")},
               "accelerator": "DeepSpeed CPU accelerator, world 1 (2 for cluster { gpus = 2 })",
               "recipes": results}
    text = json.dumps(fixture, indent=1, sort_keys=True)
    assert str(scratch) not in text and str(ROOT) not in text, "a machine path in the fixture"
    if a.only and a.out.exists():  # merge into the committed fixture
        old = json.loads(a.out.read_text())
        keep = [x for x in old["recipes"] if x["name"] not in {y["name"] for y in results}]
        fixture["recipes"] = sorted(keep + results, key=lambda x: x["name"])
        text = json.dumps(fixture, indent=1, sort_keys=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text + "\n")
    if not a.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if any("error" in x for x in results) else 0


if __name__ == "__main__":
    sys.exit(main())
