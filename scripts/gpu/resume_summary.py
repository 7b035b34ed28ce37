#!/usr/bin/env python3
"""gpu-check.sh's `resume` part: a run stopped on one device and resumed on the other.

Usage: resume_summary.py W

W holds `tiny-cpu/` (the CPU's uninterrupted run, 20 steps) and `resume-cuda-cpu/`,
`resume-cpu-cuda/` (the GPU's checkpoint after step 8 resumed on the CPU, and the CPU's on the
GPU), each with its metrics.jsonl. Prints resume.json: each resumed run's device (its `resume`
record's), its steps, whether its steps and LRs are the CPU's after step 8, and its largest
loss difference from the CPU's relative to it; `ok` when both runs went on on the device named,
took exactly the steps after 8 at the CPU's LRs, and stayed within 1e-4 (the bound of GPU
against CPU in gpu-check's other parts).
"""
import json
import os
import sys

AFTER = 8
BOUND = 1e-4


def run(w, d):
    rows = [json.loads(line) for line in open(f"{w}/{d}/metrics.jsonl")]
    # A resumed run's first record is `resume`, which names its device as `start` does.
    first = next((r for r in rows if r.get("event") in ("start", "resume")), {})
    steps = {r["step"]: (r.get("lr"), r["loss"]) for r in rows if "loss" in r}
    return first.get("device"), steps


def main(w):
    out = {"ok": False}
    try:
        _, alone = run(w, "tiny-cpu")
        later = sorted(s for s in alone if s > AFTER)
        ok = len(alone) >= 20
        for move in ("cuda-cpu", "cpu-cuda"):
            device, got = run(w, f"resume-{move}")
            same = sorted(got) == later and all(got[s][0] == alone[s][0] for s in later)
            diffs = [abs(got[s][1] - alone[s][1]) / abs(alone[s][1]) for s in later if s in got]
            diff = max(diffs, default=None)
            out[move] = {"device": device, "steps": sorted(got), "same_steps_and_lr": same,
                         "max_loss_rel_diff": diff}
            on_cpu = device == "cpu"
            ok = (ok and same and device is not None and on_cpu == move.endswith("-cpu")
                  and diff is not None and diff <= BOUND)
        out["ok"] = ok
    except OSError as e:
        # Named under W, not the machine's folder (the results are committed: docs/gpu/).
        where = os.path.relpath(e.filename, w) if e.filename else "?"
        out["error"] = f"{type(e).__name__}: W/{where}: {e.strerror}"
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
