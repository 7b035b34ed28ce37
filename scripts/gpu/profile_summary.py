"""Summary of scripts/gpu-profile.sh's files in DIR: per training step, the GPU microseconds of
each of our kernels (cuBLAS's by kernel and grid) from Nsight Compute's CSV, the PyTorch peer's
from torch.profiler, and ours at micro-batch 64. Prints JSON.

    python3 profile_summary.py DIR [--against OLD_SUMMARY]

With --against, also each of our kernels' microseconds per step next to an earlier summary's
(docs/gpu/*/profile-summary.json), the largest changes first.
"""
import csv
import json
import statistics
import sys

d = sys.argv[1].rstrip("/") or "/"


def err(e):
    # The error, its folder written as DIR (a result file names no machine's paths).
    return f"{type(e).__name__}: {e}".replace(d, "DIR")


against = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--against" else None
out = {}


def per_step_rates(path, warm=5):
    rows = [json.loads(l) for l in open(path)]
    steps = [r for r in rows if "loss" in r]
    t = [r["step"] / r["samples_per_s"] for r in steps]
    rates = [(b["step"] - a["step"]) / (tb - ta)
             for a, b, ta, tb in zip(steps, steps[1:], t, t[1:]) if a["step"] >= warm and tb > ta]
    return statistics.median(rates)


try:
    with open(f"{d}/ncu-recipe.csv") as f:
        lines = f.read().splitlines()
    # ncu prints its own lines (==PROF==) before the CSV header.
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[start:])
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    names = [r["Kernel Name"] for r in rows]
    # Whole steps only: from after the first optimizer step to the last one.
    ends = [i for i, n in enumerate(names) if n.startswith("adamw_step")]
    if len(ends) < 2:
        raise ValueError(f"{len(ends)} optimizer steps captured")
    window = rows[ends[0] + 1:ends[-1] + 1]
    steps = len(ends) - 1
    groups = {}
    for r in window:
        name = r["Kernel Name"]
        ours = "(" not in name and "<" not in name and len(name) < 40
        key = name if ours else f"{name[:90]} grid{r['Grid Size']} block{r['Block Size']}"
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += float(r["Metric Value"].replace(",", "")) / 1e3
    total = sum(g[1] for g in groups.values())
    out["recipe"] = {
        "steps": steps,
        "kernels_per_step": len(window) / steps,
        "gpu_us_per_step": total / steps,
        "rows": sorted(({"kernel": k, "calls_per_step": c / steps, "us_per_step": t / steps,
                         "mean_us": t / c} for k, (c, t) in groups.items()),
                       key=lambda r: -r["us_per_step"]),
    }
except (OSError, StopIteration, ValueError, KeyError) as e:
    out["recipe"] = {"error": err(e)}
try:
    rows = json.load(open(f"{d}/torch-kernels.json"))
    out["torch"] = {"gpu_us_per_step": sum(r["us_per_step"] for r in rows),
                    "kernels_per_step": sum(r["calls_per_step"] for r in rows),
                    "rows": rows[:40]}
    out["torch"]["bench"] = json.loads(open(f"{d}/torch.json").read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError, KeyError) as e:
    out.setdefault("torch", {})["error"] = err(e)
try:
    # Nsight Compute's SpeedOfLight section: each metric's mean over a kernel's calls.
    with open(f"{d}/ncu-sol.csv") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    sol = {}
    for r in csv.DictReader(lines[start:]):
        name = r["Kernel Name"].split("(")[0]
        m = sol.setdefault(name, {}).setdefault(f'{r["Metric Name"]} [{r["Metric Unit"]}]', [])
        try:
            m.append(float(r["Metric Value"].replace(",", "")))
        except ValueError:
            pass
    out["recipe_speed_of_light"] = {k: {m: sum(v) / len(v) for m, v in ms.items() if v}
                                    for k, ms in sol.items()}
except (OSError, StopIteration, KeyError) as e:
    out["recipe_speed_of_light"] = {"error": err(e)}
try:
    out["recipe_micro64_samples_per_s"] = per_step_rates(f"{d}/micro64.jsonl")
except (OSError, ValueError, KeyError, statistics.StatisticsError) as e:
    out["recipe_micro64_samples_per_s"] = {"error": err(e)}
if against:
    try:
        # Kernels by name (cuBLAS's by name and grid), in µs per step, then and now.
        def per_kernel(summary):
            return {r["kernel"]: r["us_per_step"] for r in summary["recipe"]["rows"]}
        old, new = per_kernel(json.load(open(against))), per_kernel(out)
        rows = [{"kernel": k, "then_us": old.get(k, 0.0), "now_us": new.get(k, 0.0),
                 "change_us": new.get(k, 0.0) - old.get(k, 0.0)} for k in old.keys() | new.keys()]
        total_then = sum(old.values())
        out["compared"] = {"against": against, "then_us_per_step": total_then,
                           "now_us_per_step": sum(new.values()),
                           "rows": sorted(rows, key=lambda r: abs(r["change_us"]), reverse=True)}
    except (OSError, ValueError, KeyError) as e:
        out["compared"] = {"error": err(e)}
print(json.dumps(out, indent=1))
