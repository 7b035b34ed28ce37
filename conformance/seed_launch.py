#!/usr/bin/env python3
"""`recipe build recipes/cls.rcp && bash launch.sh` trains: the seed recipe's own artefacts, run
for real with HF Trainer + DeepSpeed on the CPU (issue 18, "What must hold").

    seed_launch.py [--recipe BIN] [--out FIXTURE] [--keep DIR] [--native]

Run with the conformance venv (conformance/setup.sh) after `scripts/fetch-minilm.sh`:

    PATH=$PWD/conformance/.venv/bin:$PATH DS_ACCELERATOR=cpu \\
        conformance/.venv/bin/python conformance/seed_launch.py --native   # ~20 minutes on 2 quiet cores

What is substituted, and why (recorded in the fixture):
* `precision = fp16` becomes fp32: DeepSpeed's CPU accelerator has no fp16
  (`get_accelerator().is_fp16_supported()` is None on DeepSpeed 0.19.8's `cpu` accelerator; its
  `supported_dtypes()` are float32 and bfloat16);
* the training file is its first 640 rows (`--rows N`; `--rows 0` keeps all 4,708): an optimizer
  step of 64 rows at max_len 128 takes ~10 s on 2 cores, the full 222 steps ~35 minutes per side.
Nothing else: the evaluation file (all 1,176 held-out rows, after each epoch), the model
(all-MiniLM-L6-v2, as `scripts/fetch-minilm.sh` caches it, laid out as a Hugging Face hub cache so
that `from_pretrained("sentence-transformers/all-MiniLM-L6-v2")` finds it offline), ZeRO-2 with
the optimizer offloaded to the CPU, accumulation 4, WarmupDecayLR, clipping, 3 epochs, seed 42,
and launch.sh as built.

Recorded (conformance/fixtures/seed-launch.json, relative paths only): the releases, the
substitutions, HF's global_step and DeepSpeed's own count (the checkpoint tag) against
`recipe steps`, the logged loss / LR / gradient norm (logging_steps 10), the evaluation after each
epoch, and the wall time. With `--native`, `recipe run` trains the same substituted recipe too
and its evaluation is recorded beside HF's (different shuffles and dropout masks: the same
training, not the same numbers). tests/agreement.rs reads the fixture.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cls.rcp"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
FORMAT = "recipe-seed-launch/1"
SUBSTITUTIONS = [("precision = fp16", "precision = fp32",
                  "DeepSpeed's CPU accelerator has no fp16 (is_fp16_supported() is None; "
                  "supported_dtypes() float32, bfloat16)")]


def cached_model() -> Path:
    """Where scripts/fetch-minilm.sh put the model (src/cli/model_files.rs `cache_root`)."""
    base = (Path(os.environ["RECIPE_CACHE"]) if os.environ.get("RECIPE_CACHE") else
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recipe")
    d = base / "models" / HUB_ID.replace("/", "--")
    if not (d / "model.safetensors").is_file():
        sys.exit(f"error: {HUB_ID} is not in the cache ({d}): run scripts/fetch-minilm.sh")
    return d


def hub_cache(dest: Path, model: Path) -> None:
    """The cached files as a Hugging Face hub cache (hub/models--org--name/snapshots/REV, refs/main
    naming REV), which from_pretrained reads with HF_HUB_OFFLINE=1."""
    repo = dest / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    snap = repo / "snapshots" / "local"
    snap.mkdir(parents=True)
    for f in model.iterdir():
        os.symlink(f, snap / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("local")


def run(cmd: list[str], cwd: Path, env: dict, log: Path) -> float:
    t = time.time()
    with open(log, "w") as out:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exit {p.returncode}:\n{log.read_text()[-3000:]}")
    return time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "target" / "release" / "recipe"))
    ap.add_argument("--out", type=Path,
                    default=ROOT / "conformance" / "fixtures" / "seed-launch.json")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    ap.add_argument("--native", action="store_true", help="also train it with `recipe run`")
    ap.add_argument("--rows", type=int, default=640,
                    help="train on the first ROWS training rows (0: all 4,708)")
    a = ap.parse_args()
    scratch = a.keep or Path(tempfile.mkdtemp(prefix="recipe-seed-launch-"))
    if scratch.exists():
        shutil.rmtree(scratch)
    # The recipe's relative paths as in the repository: recipes/cls.rcp reads ../data/spamassassin.
    (scratch / "recipes").mkdir(parents=True)
    (scratch / "data").mkdir()
    data = scratch / "data" / "spamassassin"
    data.mkdir()
    os.symlink(ROOT / "data" / "spamassassin" / "test.jsonl", data / "test.jsonl")
    subs = list(SUBSTITUTIONS)
    if a.rows:
        rows = (ROOT / "data" / "spamassassin" / "train.jsonl").read_text().splitlines(True)
        (data / f"train{a.rows}.jsonl").write_text("".join(rows[:a.rows]))
        subs.append(('train   = "../data/spamassassin/train.jsonl"',
                     f'train   = "../data/spamassassin/train{a.rows}.jsonl"',
                     f"the first {a.rows} of the {len(rows)} training rows: on the 2-core CPU an "
                     "optimizer step of 64 rows at max_len 128 takes ~10 s, the full 222 steps "
                     "about 35 minutes per side"))
    text = RECIPE.read_text()
    for old, new, _ in subs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (scratch / "recipes" / "cls.rcp").write_text(text)
    hub_cache(scratch / "hf", cached_model())
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HOME=str(scratch / "hf"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    rdir = scratch / "recipes"
    steps = json.loads(subprocess.run([a.recipe, "steps", "--format", "json", "cls.rcp"], cwd=rdir,
                                      capture_output=True, text=True, check=True).stdout)
    run([a.recipe, "build", "cls.rcp", "-o", "build/cls"], rdir, env, scratch / "build.log")
    secs = run(["bash", "build/cls/launch.sh"], rdir, env, scratch / "launch.log")
    args = json.loads((rdir / "build" / "cls" / "training_args.json").read_text())
    out = rdir / args["output_dir"]
    from agreement import last_checkpoint  # conformance/agreement.py, beside this script
    state, ds_steps, ckpts = last_checkpoint(out)
    import accelerate
    import deepspeed
    import torch
    import transformers
    logs = state["log_history"]
    fixture = {
        "format": FORMAT, "recipe": "recipes/cls.rcp",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "accelerate": accelerate.__version__, "deepspeed": deepspeed.__version__},
        "accelerator": "DeepSpeed CPU accelerator, world 1",
        "substitutions": [{"from": o, "to": n, "why": w} for o, n, w in subs],
        "model": HUB_ID, "launch": "bash build/cls/launch.sh (unchanged)",
        "steps": {"predicted": steps["native"]["total"],
                  "predicted_hf": [t["hf_steps"] for t in steps["timelines"]],
                  "predicted_deepspeed": [t["deepspeed_steps"] for t in steps["timelines"]],
                  "hf_global_step": state["global_step"], "hf_max_steps": state["max_steps"],
                  "deepspeed_global_steps": ds_steps, "checkpoints": ckpts},
        "train": [{k: h[k] for k in ("step", "epoch", "loss", "learning_rate", "grad_norm") if k in h}
                  for h in logs if "loss" in h],
        "eval": [{k: v for k, v in h.items() if k in ("step", "epoch", "eval_loss", "eval_accuracy",
                                                      "eval_f1")}
                 for h in logs if "eval_loss" in h],
        "seconds": round(secs),
    }
    if a.native:
        nsecs = run([a.recipe, "run", "--quiet", "cls.rcp"], rdir, env, scratch / "native.log")
        recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] \
            if (out / "metrics.jsonl").exists() else []
        end = next((r for r in recs if r.get("event") == "end"), {})
        fixture["native"] = {"seconds": round(nsecs), "steps": end.get("steps"),
                             "eval": [{"step": r["step"], **r["eval"]} for r in recs
                                      if "eval" in r and "step" in r]}
    text = json.dumps(fixture, indent=1, sort_keys=True)
    assert str(scratch) not in text and str(ROOT) not in text, "a machine path in the fixture"
    a.out.write_text(text + "\n")
    print(text[:2000])
    if not a.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
