#!/usr/bin/env python3
"""The old stacks of the seed article: what `recipe build` writes for transformers 4.6.1 +
DeepSpeed 0.3.16 and transformers 4.24.0 + DeepSpeed 0.7.7, checked against those releases.

    legacy.py --recipe BIN [--out DIR]      (run with conformance/.venv/bin/python)

None of these releases runs its config code on Python 3.11 + torch 2.15 (see README.md, "Older
stacks"): each import is attempted in a subprocess with the overlay in front of the venv
(`PYTHONPATH=.overlays/<name>`, installed by `setup.sh overlays`) and the error is recorded.
What can be checked without running the broken part is read from the installed sources with
`ast` (no import): the `TrainingArguments` dataclass fields (name, annotation), DeepSpeed's
config key names (the string constants of `runtime/constants.py`, `runtime/zero/*constants.py`,
`runtime/lr_schedules.py`; for 0.7.7 also the pydantic field names and aliases of
`runtime/zero/config.py` and `offload_config.py`) and the optimizer constructors' parameters
(`DeepSpeedCPUAdam`, `FusedAdam`). transformers 4.24.0 does import: its `TrainingArguments`
fields are also read from the live class and must equal the AST reading.

Writes OUT/<stack>.json (default conformance/fixtures/legacy/): see README.md.

Then runs the releases' own config code on the stack's built corpus (legacy_run.py, in a
subprocess with the overlays in front of the venv and the shims it lists) and writes
RUN_OUT/<stack>.json (default conformance/fixtures/legacy-run/).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def portable(text: str) -> str:
    """`text` without this machine's paths, so that fixtures are the same wherever they were
    made: the repository's prefix dropped (its files, the conformance venv), the Python
    installation's written `<python>`."""
    return text.replace(f"{REPO}/", "").replace(f"{sys.base_prefix}/", "<python>/")


OVERLAYS = HERE / ".overlays"

# name → (recipe, transformers overlay, DeepSpeed overlay)
STACKS = {
    "transformers-4.6.1+deepspeed-0.3.16": ("recipes/legacy_seed.rcp", "transformers-4.6.1",
                                            "deepspeed-0.3.16"),
    "transformers-4.24.0+deepspeed-0.7.7": ("conformance/legacy/seed-4.24.rcp",
                                            "transformers-4.24.0", "deepspeed-0.7.7"),
    "transformers-4.24.0+deepspeed-0.8.3": ("conformance/legacy/seed-4.24-ds0.8.3.rcp",
                                            "transformers-4.24.0", "deepspeed-0.8.3"),
}


def try_import(overlay: str, code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(OVERLAYS / overlay), DS_ACCELERATOR="cpu",
               TRANSFORMERS_VERBOSITY="error")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd="/")
    if p.returncode == 0:
        return {"ok": True, "stdout": p.stdout.strip()[-4000:]}
    # The exception line of the traceback (transformers' version check adds a "Try: …" line).
    lines = [ln for ln in p.stderr.strip().splitlines() if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    return {"ok": False, "error": lines[-1] if lines else p.stderr.strip()[-500:]}


def dataclass_fields(path: Path, cls: str) -> dict:
    """Annotated class-level names of `cls` (a dataclass): {name: annotation source}."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {s.target.id: ast.unparse(s.annotation) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise KeyError(cls)


def string_constants(path: Path) -> set[str]:
    """Every module-level `NAME = "string"` (DeepSpeed spells its config keys this way)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            out.add(node.value.value)
    return out


def pydantic_names(path: Path) -> set[str]:
    """Field names and `alias=` / `new_param=` strings of the classes in a pydantic module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for s in node.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                    out.add(s.target.id)
        if isinstance(node, ast.keyword) and node.arg in ("alias", "new_param") \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.add(node.value.value)
    return out


def init_params(path: Path, cls: str) -> list[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return [a.arg for a in f.args.args[1:]]
    raise KeyError(cls)


def leaf_names(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "params":
            out += leaf_names(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


def run_stack(name: str, recipe_bin: str, out_dir: Path) -> dict:
    rcp, tf, ds = STACKS[name]
    build = HERE / "build" / "legacy" / name
    subprocess.run([recipe_bin, "build", str(REPO / rcp), "-o", str(build)], check=True,
                   capture_output=True)
    emitted = json.loads((build / "ds_config.json").read_text())
    targs = json.loads((build / "training_args.json").read_text())
    res: dict = {"format": "recipe-conformance-legacy/1", "stack": name, "recipe": rcp,
                 "emitted_config": emitted, "emitted_training_args": targs}
    for ov in (tf, ds):
        if not (OVERLAYS / ov).is_dir():
            res["skipped"] = f"overlay {ov} is not installed (conformance/setup.sh overlays)"
            return res

    # --- transformers ---------------------------------------------------------------------
    t_root = OVERLAYS / tf / "transformers"
    fields = dataclass_fields(t_root / "training_args.py", "TrainingArguments")
    res["transformers"] = {
        "version": tf.split("-", 1)[1],
        "import": try_import(tf, "import transformers; from transformers import TrainingArguments;"
                                 "import dataclasses, json;"
                                 "print(json.dumps(sorted(f.name for f in "
                                 "dataclasses.fields(TrainingArguments))))"),
        "training_args_fields": fields,
    }
    imp = res["transformers"]["import"]
    if imp["ok"]:
        live = json.loads(imp.pop("stdout").splitlines()[-1])
        res["transformers"]["live_fields_equal_ast"] = live == sorted(fields)
    # --- DeepSpeed --------------------------------------------------------------------------
    d_root = OVERLAYS / ds / "deepspeed"
    names: set[str] = set()
    sources = ["runtime/constants.py", "runtime/lr_schedules.py", "runtime/zero/constants.py",
               "runtime/zero/offload_constants.py", "runtime/zero/config.py",
               "runtime/zero/offload_config.py", "runtime/fp16/loss_scaler.py"]
    read = []
    for rel in sources:
        p = d_root / rel
        if p.exists():
            names |= string_constants(p) | pydantic_names(p)
            read.append(rel)
    opt = {"DeepSpeedCPUAdam": init_params(d_root / "ops/adam/cpu_adam.py", "DeepSpeedCPUAdam"),
           "FusedAdam": init_params(d_root / "ops/adam/fused_adam.py", "FusedAdam")}
    res["deepspeed"] = {
        "version": ds.split("-", 1)[1],
        "import": try_import(ds, "import deepspeed; from deepspeed.runtime.config import "
                                 "DeepSpeedConfig"),
        "sources_read": read,
        "key_names": sorted(names),
        "optimizer_init_params": opt,
    }
    # --- comparison -------------------------------------------------------------------------
    unknown_args = sorted(k for k in targs if k not in fields)
    unknown_keys = sorted(k for k in leaf_names(emitted) if k.split(".")[-1] not in names)
    # `_configure_basic_optimizer` pops torch_adam / adam_w_mode and passes the rest of
    # `optimizer.params` to DeepSpeedCPUAdam (offload) or FusedAdam as keyword arguments.
    params = (emitted.get("optimizer") or {}).get("params") or {}
    ctor = "DeepSpeedCPUAdam" if (emitted.get("zero_optimization") or {}).get(
        "offload_optimizer", {}).get("device") == "cpu" or \
        (emitted.get("zero_optimization") or {}).get("cpu_offload") else "FusedAdam"
    popped = {"torch_adam", "adam_w_mode"}
    unknown_params = sorted(k for k in params if k not in popped and k not in opt[ctor])
    res["compare"] = {"unknown_training_args": unknown_args, "unknown_config_keys": unknown_keys,
                      "optimizer_ctor": ctor, "unknown_optimizer_params": unknown_params}
    return res


def run_old_stack(name: str, recipe_bin: str, out_dir: Path) -> str:
    """The stack's corpus (gen_legacy.py → corpus-legacy/<stack>[-rejected]/) built into cases
    (make_cases.py → build/legacy-cases/<stack>/), then legacy_run.py on them in a subprocess
    with the stack's overlays in front of the venv. Writes OUT/<stack>.json."""
    _, tf, ds = STACKS[name]
    build = HERE / "build" / "legacy-cases" / name
    corpus = HERE / "corpus-legacy"
    subprocess.run(["python3", str(HERE / "make_cases.py"), "--recipe", recipe_bin,
                    "--corpus", str(corpus / name), "--rejected", str(corpus / f"{name}-rejected"),
                    "--out", str(build)], check=True)
    out = out_dir / f"{name}.json"
    for ov in (tf, ds):
        if not (OVERLAYS / ov).is_dir():
            out.write_text(json.dumps({"format": "recipe-conformance-legacy-run/1",
                                       "skipped": f"overlay {ov} is not installed "
                                                  "(conformance/setup.sh overlays)"}) + "\n")
            return "skipped"
    env = dict(os.environ, PYTHONPATH=f"{OVERLAYS / tf}:{OVERLAYS / ds}", DS_ACCELERATOR="cpu",
               TRANSFORMERS_VERBOSITY="error")
    if tf == "transformers-4.6.1":
        env["LEGACY_HIDE_TOKENIZERS"] = "1"  # legacy_run.py S3
    p = subprocess.run([sys.executable, str(HERE / "legacy_run.py"), str(build), str(out)],
                       env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"legacy_run.py {name}: exit {p.returncode}: {p.stderr[-3000:]}")
    return p.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--out", type=Path, default=HERE / "fixtures" / "legacy")
    ap.add_argument("--run-out", type=Path, default=HERE / "fixtures" / "legacy-run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.run_out.mkdir(parents=True, exist_ok=True)
    for name in STACKS:
        res = run_stack(name, a.recipe, a.out)
        text = portable(json.dumps(res, indent=1, sort_keys=True))
        (a.out / f"{name}.json").write_text(text + "\n")
        c = res.get("compare", {})
        print(f"legacy: {name}: {res.get('skipped') or c}")
        print(f"legacy: {name}: {run_old_stack(name, a.recipe, a.run_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
