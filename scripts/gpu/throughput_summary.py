#!/usr/bin/env python3
"""scripts/gpu-throughput.sh's summary of its runs: each run's median samples/s over the steps
after the warm-up, their ratio to PyTorch's, each A/B run's largest loss difference from the
default run, and MFU against the GPU's dense bf16 peak. Prints throughput.json.

    throughput_summary.py DIR DEVICE LAYERS HIDDEN SEQ WARM [PEAK_TFLOPS [INTER]]

DIR holds one folder per run (out, cublas, …, minilm, minilm-unfused, long, long-unfused, each
with the run's metrics.jsonl; out, unfused, minilm and minilm-unfused also evaluate once, after their last
step: their `eval_samples_per_s`, and the fused runs' ratios to the unfused ones), profiled/ and torch.json; an empty PEAK_TFLOPS takes the peak the default run measured its
own MFU against (its `start` record's `peak_tflops`: the GPU's, from runtime/src/flops.rs's
table); INTER is the feed-forward's width (4 × HIDDEN, BERT's, when absent).

MFU counts llm.c's FLOPs a sample, (6N + 6·L·C·T)·T, what the goal names. Ours runs the last
layer's attention output and feed-forward on the [CLS] rows only (runtime/src/model/bert.rs,
`tail_rows`), so it executes 6·(C² + 2·C·I)·(T − 1) FLOPs a sample fewer than that count; the
utilization of the FLOPs it executes is printed beside MFU (`executed_utilization_recipe`)."""
import json, statistics, sys
w, device, L, C, T, warm = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), int(sys.argv[6])
peak = sys.argv[7] if len(sys.argv) > 7 else ""
inter = int(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] else 4 * C
out = {"device": device, "shape": {"layers": L, "hidden": C, "seq": T}, "ok": False}
def rate(run):
    try:
        recs = [json.loads(l) for l in open(f"{w}/{run}/metrics.jsonl")]
        start = next(r for r in recs if r.get("event") == "start")
        steps = [r for r in recs if "loss" in r]
        # A row's samples_per_s is the average since training began, warm-up included (the
        # first step loads cuBLAS's kernels): each step's own rate is Δstep / Δ(step / rate).
        t = [r["step"] / r["samples_per_s"] for r in steps]
        rates = [(b["step"] - a["step"]) / (tb - ta)
                 for a, b, ta, tb in zip(steps, steps[1:], t, t[1:]) if a["step"] >= warm and tb > ta]
        summary = {"device": start.get("device"), "parameters": start["parameters"],
                   "precision": start.get("precision"), "steps_timed": len(rates),
                   "samples_per_s": statistics.median(rates),
                   "losses": [r["loss"] for r in steps]}
        # The peak the run measured its own MFU against (`recipe run`, runtime/src/flops.rs).
        for k in ("peak_tflops", "peak_from"):
            if k in start:
                summary[k] = start[k]
        # And that MFU at its last step: over every step, the warm-up included, so at most
        # the steady figure below (mfu_recipe), which it cross-checks.
        if steps and "mfu" in steps[-1]:
            summary["mfu_reported"] = steps[-1]["mfu"]
        # The GPU memory the run took (its `end` record; `recipe run` on a GPU).
        ends = [r for r in recs if r.get("event") == "end" and "device_memory" in r]
        if ends:
            summary["device_memory"] = ends[-1]["device_memory"]
        # The evaluation after the last step (the runs given an eval file): rows per second.
        evals = [r["eval"] for r in recs if "eval" in r]
        if evals and "samples_per_s" in evals[-1]:
            summary["eval_samples_per_s"] = evals[-1]["samples_per_s"]
        return summary
    except (OSError, StopIteration, KeyError, statistics.StatisticsError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
out["recipe"] = rate("out")
# The same run with one setting changed, each as recipe_<key> (and ratio_<key>_over_torch).
AB = (
    ("cublas", "cublas"),  # GEMMs on cuBLAS instead of cuBLASLt (RECIPE_GEMM_LIBRARY=cublas)
    ("direct", "direct"),  # kernels launched directly, not as graphs (RECIPE_CUDA_GRAPHS=0)
    ("unfused", "unfused_attention"),  # no fused attention kernels (RECIPE_FUSED_ATTENTION=0)
    ("one-stream", "one_stream"),  # every GEMM on one stream (RECIPE_SIDE_STREAM=0)
    ("side-equal", "side_equal"),  # the side stream of the same priority (RECIPE_SIDE_STREAM=equal)
    ("gemm-fastest", "gemm_fastest"),  # each GEMM's fastest cuBLASLt algorithm (RECIPE_GEMM_ALGO=fastest)
    ("step-before", "step_before"),  # each step's updates before the next forward (RECIPE_STEP_ASIDE=0)
    ("rows-first", "rows_first"),  # the word embeddings' named rows first, the rest aside (RECIPE_ROWS_FIRST=1)
    ("pdl", "pdl"),  # our kernels as programmatic dependent launches (RECIPE_PDL=1)
    ("pdl-early", "pdl_early"),  # those, each letting the next be scheduled once it has waited (RECIPE_PDL=early)
    ("pdl-gemm-fastest", "pdl_gemm_fastest"),  # both of the last two (RECIPE_PDL=1, RECIPE_GEMM_ALGO=fastest)
)
for run, key in AB:
    out[f"recipe_{key}"] = rate(run)
# Each A/B run's losses against the default run's, step by step (the same data and seed): 0 where
# the setting keeps the bits (graphs, the streams), small where it changes a sum's order.
base = out["recipe"].pop("losses", None)
for _, key in AB:
    other = out[f"recipe_{key}"].pop("losses", None)
    if base and other and len(base) == len(other):
        out[f"recipe_{key}"]["max_loss_rel_diff"] = max(
            abs(a - b) / abs(a) if a else abs(b) for a, b in zip(base, other))
# Pairs of runs through the fused attention kernels and without them (RECIPE_FUSED_ATTENTION=0):
# MiniLM's shape (heads of 32), and BERT-base's at twice the length (the long kernels, keys in
# chunks). Their rates, the fused run's speed-up and the two runs' largest loss difference (the
# products' order).
pairs = {}
for run, key in (("minilm", "minilm"), ("long", "long")):
    fused, unfused = rate(run), rate(f"{run}-unfused")
    pairs[key] = (fused.pop("losses", None), unfused.pop("losses", None))
    out[f"recipe_{key}"], out[f"recipe_{key}_unfused"] = fused, unfused
    if fused.get("samples_per_s") and unfused.get("samples_per_s"):
        out[f"ratio_{key}_fused_over_unfused"] = fused["samples_per_s"] / unfused["samples_per_s"]
mini, mini_u = out["recipe_minilm"], out["recipe_minilm_unfused"]
# The evaluation forward through the fused attention kernel against the batched products, where
# both runs evaluated: BERT-base's shape and MiniLM's.
for key, fused, unfused in (("ratio_eval_fused_over_unfused", out["recipe"],
                             out["recipe_unfused_attention"]),
                            ("ratio_minilm_eval_fused_over_unfused", mini, mini_u)):
    if fused.get("eval_samples_per_s") and unfused.get("eval_samples_per_s"):
        out[key] = fused["eval_samples_per_s"] / unfused["eval_samples_per_s"]
for key, (a_losses, b_losses) in pairs.items():
    if a_losses and b_losses and len(a_losses) == len(b_losses):
        out[f"recipe_{key}_unfused"]["max_loss_rel_diff"] = max(
            abs(a - b) / abs(a) if a else abs(b) for a, b in zip(a_losses, b_losses))
for run, key in (("profiled", "profile"),):
    try:
        p = json.load(open(f"{w}/{run}/profile.json"))
        out[key] = {"busy_share": p["busy_s"] / p["span_s"] if p["span_s"] else None,
                    "top": [{k: r[k] for k in ("name", "calls", "share", "mean_us")}
                            for r in p["rows"][:12]]}
    except (OSError, KeyError, json.JSONDecodeError) as e:
        out[key] = {"error": f"{type(e).__name__}: {e}"}
try:
    out["torch"] = json.loads(open(f"{w}/torch.json").read().strip().splitlines()[-1])
except (OSError, IndexError, json.JSONDecodeError) as e:
    out["torch"] = {"error": f"{type(e).__name__}: {e}"}
ours, theirs = out["recipe"].get("samples_per_s"), out["torch"].get("samples_per_s")
if ours and theirs:
    n = out["recipe"]["parameters"]
    flops_per_sample = (6 * n + 6 * L * C * T) * T
    # The last layer's output projection and feed-forward, forward and backward, on the T − 1
    # rows other than [CLS], which ours leaves out.
    pruned = 6 * (C * C + 2 * C * inter) * (T - 1) if L > 0 else 0
    out["flops_per_sample"] = flops_per_sample
    out["flops_executed_per_sample_recipe"] = flops_per_sample - pruned
    out["ratio_recipe_over_torch"] = ours / theirs
    for _, key in AB:
        other = out[f"recipe_{key}"].get("samples_per_s")
        if other:
            out[f"ratio_{key}_over_torch"] = other / theirs
    if device == "cuda":
        gpu = out["recipe"].get("device")
        # The run's peak is its precision's: a half-precision run's is the tensor cores'.
        half = out["recipe"].get("precision") in ("bf16", "fp16")
        run_peak = out["recipe"].get("peak_tflops") if half else None
        out["peak_tflops_bf16"] = float(peak) if peak else run_peak
        out["peak_from"] = "PEAK_TFLOPS" if peak else out["recipe"].get("peak_from")
        if out["peak_tflops_bf16"]:
            out["mfu_recipe"] = ours * flops_per_sample / (out["peak_tflops_bf16"] * 1e12)
            out["executed_utilization_recipe"] = (
                ours * (flops_per_sample - pruned) / (out["peak_tflops_bf16"] * 1e12))
            out["mfu_torch"] = theirs * flops_per_sample / (out["peak_tflops_bf16"] * 1e12)
        else:
            out["mfu_note"] = f"no bf16 peak known for {gpu!r}: set PEAK_TFLOPS"
    # Issue 15's goals: >= 1.3x PyTorch eager and >= 40 % MFU (reported, not enforced here).
    out["ok"] = True
print(json.dumps(out, indent=1))
