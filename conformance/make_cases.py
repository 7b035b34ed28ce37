#!/usr/bin/env python3
"""Builds every corpus recipe into a harness case directory.

    make_cases.py --recipe BIN [--corpus DIR] [--rejected DIR] [--out DIR]

For `corpus/NNN-x.rcp`: `recipe build` (explicit values) into `OUT/NNN-x/`, `recipe build --auto`
into `OUT/NNN-x/auto/`, and `recipe explain --format json` → `OUT/NNN-x/case.json` with the world
size, hidden size, samples and our predictions (steps, schedule owner and names, LR per step).

For `corpus-rejected/NNN-x.rcp` (+ `.json`, + `.base.rcp`): the base recipe is built (the rejected
one cannot be: `recipe build` writes nothing for a recipe with errors), the patch of the `.json` is
applied to its artefacts, and our predictions come from `recipe explain` of the *rejected* recipe
(explain runs on recipes with rule errors), so the case states what the rejected recipe means.
With `--stack transformers=X,accelerate=Y,deepspeed=Z` (what `recipe verify` passes: the
installed releases), each corpus recipe is built for that stack: a library the recipe does not
pin gets `--target LIB=VERSION`; a recipe that pins another release of an installed library is
not built but listed in `OUT/skipped.json` with the reason (its artefacts are for another stack).
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def shown(path: Path) -> str:
    """A recipe path relative to the repository when it is inside it (fixtures stay portable),
    else absolute (`recipe verify` runs these scripts from a temporary directory)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path.resolve())


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def explain(recipe: str, rcp: Path) -> dict:
    return explain_for(recipe, rcp, [])


def setting(ex: dict, key: str):
    for s in ex["settings"]:
        if s["key"] == key:
            return s["json"]
    return None


def explain_for(recipe: str, rcp: Path, flags: list[str]) -> dict:
    p = run([recipe, "explain", "--format", "json", *flags, str(rcp)])
    if p.returncode not in (0, 1) or not p.stdout.strip():
        raise RuntimeError(f"explain {rcp}: exit {p.returncode}: {p.stderr.strip()[:500]}")
    return json.loads(p.stdout)


def numeric(version: str) -> str:
    """The major.minor.patch prefix of an installed version (`5.25.0.dev0` -> `5.25.0`)."""
    parts = []
    for p in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, p))
        if not digits:
            break
        parts.append(digits)
        if digits != p:
            break
    return ".".join(parts)


def stack_flags(recipe: str, rcp: Path, stack: dict) -> tuple[list[str], str | None]:
    """`--target` flags that build `rcp` for `stack`, or (None, why) when the recipe pins another
    release of an installed library."""
    ex = explain(recipe, rcp)
    flags, pinned_other = [], []
    for t in ex["targets"]:
        lib, version = t["library"], t["version"]
        want = stack.get(lib)
        if want is None:
            continue
        if t["from"].startswith("default"):
            flags += ["--target", f"{lib}={want}"]
        elif version != want:
            pinned_other.append(f"{lib} {version} (installed: {want})")
    if pinned_other:
        return [], "the recipe targets " + ", ".join(pinned_other) + ": its artefacts are for that stack"
    return flags, None


def build(recipe: str, rcp: Path, out: Path, auto: bool = False, flags: list[str] = ()) -> None:
    cmd = [recipe, "build", str(rcp), "-o", str(out), *flags] + (["--auto"] if auto else [])
    p = run(cmd)
    if p.returncode != 0:
        # The errors (`×`) are what refused it; warnings before them are left out.
        lines = p.stderr.strip().splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("\u00d7")), None)
        if first is not None:  # back to its code line (`R0204`)
            while first > 0 and not re.fullmatch(r"R\d{4}", lines[first].strip()):
                first -= 1
        shown_err = "\n".join(lines[first:] if first is not None else lines[-30:])
        raise RuntimeError(f"build {rcp}: exit {p.returncode}:\n{shown_err[-3000:]}")


def case_json(name: str, rcp: Path, ex: dict, kind: str) -> dict:
    gpus = setting(ex, "cluster.gpus") or 1
    nodes = setting(ex, "cluster.nodes") or 1
    steps = ex.get("steps") or {}
    return {
        "case": name,
        "kind": kind,
        "recipe": shown(rcp),
        "gpus": gpus,
        "nodes": nodes,
        "world_size": setting(ex, "cluster.world_size") or gpus * nodes,
        "hidden_size": setting(ex, "model.hidden_size"),
        "samples": steps.get("samples") or setting(ex, "data.samples"),
        "has_eval": setting(ex, "data.eval") is not None,
        "targets": {t["library"]: t["version"] for t in ex["targets"]},
        "predicted": {
            "steps": steps,
            "schedule_owner": ex.get("schedule_owner"),
            "hf_schedule": ex.get("hf_schedule"),
            "deepspeed_schedule": ex.get("deepspeed_schedule"),
            "lr": ex.get("lr", []),
        },
    }


def set_path(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def del_path(d: dict, dotted: str) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        d = d.get(p, {})
    d.pop(parts[-1], None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--corpus", type=Path, default=HERE / "corpus")
    ap.add_argument("--rejected", type=Path, default=HERE / "corpus-rejected")
    ap.add_argument("--out", type=Path, default=HERE / "build")
    ap.add_argument("--stack", help="LIB=VERSION,...: build for these installed releases")
    a = ap.parse_args()
    stack = {}
    for pair in (a.stack or "").split(","):
        if pair:
            lib, _, version = pair.partition("=")
            stack[lib] = numeric(version)
    skipped = []
    cases = a.out / "cases"
    rejected = a.out / "rejected"
    for d in (cases, rejected):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    failures = 0
    for rcp in sorted(a.corpus.glob("*.rcp")):
        name = rcp.stem
        out = cases / name
        try:
            flags: list[str] = []
            if stack:
                flags, why = stack_flags(a.recipe, rcp, stack)
                if why:
                    skipped.append({"case": name, "recipe": shown(rcp), "why": why})
                    continue
            build(a.recipe, rcp, out, flags=flags)
            build(a.recipe, rcp, out / "auto", auto=True, flags=flags)
            ex = explain_for(a.recipe, rcp, flags)
            (out / "case.json").write_text(json.dumps(case_json(name, rcp, ex, "corpus"), indent=1) + "\n")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"make_cases: {name}: {e}", file=sys.stderr)
    for meta_path in sorted(a.rejected.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        name = meta_path.stem
        rcp = a.rejected / meta["recipe"]
        base = a.rejected / meta["base"]
        out = rejected / name
        try:
            build(a.recipe, base, out)
            # The base recipe's artefacts as built, before the patch: the control of the
            # `raise_engine` cases (harness.py builds the real engine on both).
            (out / "base").mkdir()
            for fname in ("ds_config.json", "training_args.json"):
                shutil.copy2(out / fname, out / "base" / fname)
            # The control trains with the base recipe's data too (train_run.py reads it).
            (out / "base" / "case.json").write_text(
                json.dumps(case_json(name, base, explain(a.recipe, base), "base"), indent=1) + "\n")
            # launch.sh before the patch, beside the case's (same directory: the same `cd`).
            shutil.copy2(out / "launch.sh", out / "launch.base.sh")
            for op in meta.get("patch", []):
                f = out / op["file"]
                if "replace" in op:  # a text file (launch.sh): one exact replacement
                    old, new = op["replace"]
                    text = f.read_text()
                    if text.count(old) != 1:
                        raise ValueError(f"patch {op}: {old!r} occurs {text.count(old)} times")
                    f.write_text(text.replace(old, new))
                    continue
                d = json.loads(f.read_text())
                if "set" in op:
                    set_path(d, op["set"], op["value"])
                else:
                    del_path(d, op["del"])
                f.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
            ex = explain(a.recipe, rcp)
            c = case_json(name, rcp, ex, "rejected")
            c["base_recipe"] = shown(base)
            c["rejected"] = {k: meta.get(k) for k in ("code", "expect", "why", "checker_errors",
                                                        "silent_key", "silent_value", "patch", "stack",
                                                        "stack_check", "engine_match", "match", "engine_optimizer",
                                                        "control_optimizer")}
            (out / "case.json").write_text(json.dumps(c, indent=1) + "\n")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"make_cases: {name}: {e}", file=sys.stderr)
    if stack:
        (a.out / "skipped.json").write_text(json.dumps(skipped, indent=1) + "\n")
    print(f"make_cases: {len(list(cases.iterdir()))} corpus cases, "
          f"{len(list(rejected.iterdir()))} rejected cases, {len(skipped)} skipped, "
          f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
