#!/usr/bin/env python3
"""Summarises the harness fixtures: counts, and every place where our prediction and the real
stack disagree.

    summary.py FIXTURES_DIR [--json PATH]

Reads FIXTURES_DIR/corpus/*.json and FIXTURES_DIR/rejected/*.json (the harness output) and
prints a text report; `--json PATH` also writes the same numbers as JSON. Standard library only.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from pathlib import Path


def load(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []


def num(x):
    return math.inf if x == "inf" else x


def short(s: str, n: int = 160) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def corpus_summary(cases: list[dict]) -> tuple[dict, list[str]]:
    s: dict = collections.OrderedDict()
    s["cases"] = len(cases)
    s["verdict_ok"] = sum(c.get("verdict") == "ok" for c in cases)
    s["verdict_error"] = sum(c.get("verdict") == "error" for c in cases)
    s["harness_crashes"] = sum(c.get("verdict") == "harness-crash" for c in cases)
    stages = collections.Counter()
    messages = collections.Counter()
    for c in cases:
        for e in c.get("errors") or []:
            stages[e["stage"]] += 1
            messages[(e["stage"], short(e["error"], 200))] += 1
    s["errors_by_stage"] = dict(sorted(stages.items()))
    s["hf_mismatches"] = sum(any(e["stage"] == "finalize" for e in c.get("errors") or []) for c in cases)
    s["deepspeed_rejections"] = sum(any(e["stage"].startswith("deepspeed") for e in c.get("errors") or [])
                                    for c in cases)
    s["config_equal"] = sum(bool(c.get("config_equal")) for c in cases)
    autos = [c for c in cases if c.get("auto")]
    s["auto_builds"] = len(autos)
    s["auto_filled_equal_explicit"] = sum(bool(c["auto"].get("filled_equal_explicit")) for c in autos)
    s["launch_equal"] = sum(bool((c.get("launch") or {}).get("equal")) for c in cases)
    for k in ("total", "warmup", "per_epoch", "batches_per_epoch"):
        s[f"steps_{k}_equal"] = sum(bool((c.get("steps_compare") or {}).get(k, {}).get("equal")) for c in cases)
    lr = [c["lr_compare"] for c in cases if (c.get("lr_compare") or {}).get("max_rel_err") is not None]
    s["lr_cases_compared"] = len(lr)
    s["lr_steps_compared"] = sum(x["compared_steps"] for x in lr)
    m = max((num(x["max_rel_err"]) for x in lr), default=0.0)
    s["lr_max_rel_err"] = "inf" if m == math.inf else m
    s["lr_cases_rel_err_over_1e-9"] = sum(num(x["max_rel_err"]) > 1e-9 for x in lr)
    lo = [c["lr_other_compare"] for c in cases if c.get("lr_other_compare")]
    s["lr_other_cases_compared"] = len(lo)
    m = max((num(x["max_rel_err"]) for x in lo), default=0.0)
    s["lr_other_max_rel_err"] = "inf" if m == math.inf else m
    s["lr_other_real_raised"] = sum(bool(c.get("lr_other_error")) for c in cases)
    s["distinct_errors"] = [{"stage": st, "error": msg, "cases": n}
                            for (st, msg), n in messages.most_common()]

    # An error shared by many cases is listed once under distinct_errors, not per case.
    pervasive = {k for k, n in messages.items() if n > 20}
    lines: list[str] = []
    for c in cases:
        name = c["case"]
        for e in c.get("errors") or []:
            if (e["stage"], short(e["error"], 200)) in pervasive:
                continue
            lines.append(f"{name}: real stack fails at {e['stage']}: {short(e['error'])}")
        a = c.get("auto") or {}
        for x in a.get("diff_vs_explicit") or []:
            lines.append(f"{name}: --auto build: HF fills {x['key']} = {x['real']!r}, the explicit build "
                         f"says {x['emitted']!r}")
        for x in c.get("config_diff") or []:
            lines.append(f"{name}: HF fill changes {x['key']}: {x['emitted']!r} -> {x['real']!r}")
        la = c.get("launch") or {}
        if la and not la.get("equal"):
            lines.append(f"{name}: launch.sh flags differ from training_args.json: "
                         f"{short(json.dumps(la.get('diff') or la.get('error') or la.get('unexpected_flags')))}")
        for k, v in (c.get("steps_compare") or {}).items():
            if not v["equal"]:
                lines.append(f"{name}: steps.{k}: ours {v['ours']}, real {v['real']}")
        x = c.get("lr_compare") or {}
        if x.get("max_rel_err") is not None and num(x["max_rel_err"]) > 1e-9:
            lines.append(f"{name}: LR ({c.get('lr_side')}) max rel err {x['max_rel_err']}, first at "
                         f"{x['first_difference']}")
        x = c.get("lr_other_compare") or {}
        if x.get("max_rel_err") is not None and num(x["max_rel_err"]) > 1e-9:
            lines.append(f"{name}: counterpart LR ({c.get('lr_other_side')}) max rel err "
                         f"{x['max_rel_err']}, first at {x['first_difference']}")
        if c.get("lr_other_error"):
            lines.append(f"{name}: we predict a {c.get('lr_other_side')} counterpart curve; the real "
                         f"scheduler raises: {short(c['lr_other_error'])}")
    return s, lines


def rejected_summary(cases: list[dict]) -> list[dict]:
    out = []
    for c in cases:
        r = c.get("rejected") or {}
        out.append({
            "case": c["case"], "code": r.get("code"), "expect": r.get("expect"),
            "reproduced": r.get("reproduced"),
            "real": [f"{e['stage']}: {short(e['error'], 140)}" for e in c.get("errors") or []],
            "observed": r.get("observed"),
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a corpus case disagrees with the real stack (recipe verify)")
    a = ap.parse_args()
    corpus = load(a.fixtures / "corpus")
    rejected = load(a.fixtures / "rejected")
    s, lines = corpus_summary(corpus)
    rj = rejected_summary(rejected)
    versions = (corpus or rejected or [{}])[0].get("versions")
    print(f"conformance against {json.dumps(versions)}")
    print("corpus:")
    for k, v in s.items():
        if k != "distinct_errors":
            print(f"  {k}: {v}")
    print("  distinct real-stack errors (stage, cases, message):")
    for e in s["distinct_errors"]:
        print(f"    {e['stage']:<20} {e['cases']:>4}  {e['error']}")
    print(f"disagreements ({len(lines)} lines, one per case and finding; errors shared by more than "
          f"20 cases are only in the list above):")
    for line in lines:
        print(f"  {line}")
    if rj:
        print("rejected corpus (our checker's errors vs the real stack):")
    for r in rj:
        print(f"  {r['case']:<45} {r['code']:<6} {r['expect']:<17} reproduced={r['reproduced']}")
        for x in r["real"]:
            print(f"      {x}")
        if r["observed"]:
            print(f"      observed {r['observed']}")
    legacy = []
    for c in load(a.fixtures / "legacy"):
        legacy.append({"stack": c["stack"], "skipped": c.get("skipped"),
                       "transformers_import": (c.get("transformers") or {}).get("import"),
                       "deepspeed_import": (c.get("deepspeed") or {}).get("import"),
                       "compare": c.get("compare")})
    if legacy:
        print("old stacks (legacy.py; sources read with ast where the release does not import):")
    for x in legacy:
        print(f"  {x['stack']}: {x['skipped'] or x['compare']}")
        for lib in ("transformers", "deepspeed"):
            imp = x[f"{lib}_import"] or {}
            if imp and not imp.get("ok"):
                print(f"      {lib} does not import: {imp.get('error')}")
    legacy_run = []
    runs = load(a.fixtures / "legacy-run")
    if runs:
        print("old stacks run (legacy_run.py: the releases' own config code, shims S1-S3):")
    for d in runs:
        if d.get("skipped"):
            print(f"  {d['skipped']}")
            continue
        cases, rej = d.get("cases", []), d.get("rejected", [])
        failed = [c["case"] for c in cases if c.get("errors") or c.get("harness_error")]
        reproduced = [f"{r['case']}: {(r['errors'] or [{}])[0].get('message', 'ran')[:70]}"
                      for r in rej]
        x = {"transformers": d["transformers"], "deepspeed": d["deepspeed"],
             "cases": len(cases), "failed": failed, "rejected": reproduced}
        legacy_run.append(x)
        print(f"  transformers {x['transformers']} + DeepSpeed {x['deepspeed']}: "
              f"{len(cases)} cases, failed {failed}")
        for line in reproduced:
            print(f"      rejected {line}")
    if a.json:
        a.json.write_text(json.dumps({"versions": versions, "corpus": s, "disagreements": lines,
                                      "rejected": rj, "legacy": legacy,
                                      "legacy_run": legacy_run}, indent=1) + "\n")
    if a.strict and (lines or any(c.get("verdict") != "ok" for c in corpus)):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
