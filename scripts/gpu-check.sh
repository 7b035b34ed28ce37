#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one run (docs/cuda.md). For a GPU machine with PyTorch's
# CUDA 13 wheels but no Rust: build `target/release/recipe` elsewhere, carry it with the tree,
# then `scripts/gpu-check.sh`. Writes everything under $OUT (default gpu-check/):
#   nvidia-smi.csv   the GPU and driver
#   kernels.txt      NVRTC on this machine: every kernel for the GPU's architecture
#   selftest.txt/.json  every operation on the GPU against the CPU backend (fp32, fp16, bf16)
#   tiny/            the tiny BERT trained on the CPU and on the GPU; tiny.json compares them
#   spam/, spam.json the main job, recipes/spam.rcp, trained on the GPU (final accuracy >= 0.95),
#                    from gpu-assets/minilm (scripts/gpu-assets.sh: MiniLM in fp16, carried with
#                    the binary; the GPU machine has no network); "skipped" without it
#   throughput.json  BERT-base seq 128 bf16 batch 32: samples/s of ours and of PyTorch eager
#                    (autocast bf16, fused AdamW) in the same run, ratio and MFU
#                    (scripts/gpu-throughput.sh; reported, the goals are not enforced)
#   summary.json     pass/fail/skipped of each part
# Exit 0 only if every part that ran passed. A few minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$(pwd)/${RECIPE_BIN:-target/release/recipe}"
PY="${PYTHON:-python3}"
status=0
declare -A parts
# Whether a part's JSON file says "ok": true.
json_ok() { "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$1"; }

nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv \
    > "$OUT/nvidia-smi.csv" 2>&1 || true

# NVRTC and cuBLAS from PyTorch's wheels (nvidia/cu13/lib).
SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
ARCH="sm_${CAP:-90}"

if "$BIN" kernels --arch "$ARCH" --out "$OUT/kernels" > "$OUT/kernels.txt" 2>&1; then
    parts[kernels]=pass
else
    parts[kernels]=fail; status=1
fi
if "$BIN" kernels --arch "$ARCH" --selftest --out "$OUT/kernels" > "$OUT/selftest.txt" 2>&1; then
    parts[selftest]=pass
else
    parts[selftest]=fail; status=1
fi
cp "$OUT/kernels/selftest.json" "$OUT/selftest.json" 2>/dev/null || true

# The tiny BERT of tests/run.rs (random init, the MiniLM tokenizer, 48 SpamAssassin rows), 8
# optimizer steps with dropout, on the CPU and on the GPU: the same steps and LRs, and losses
# within 1e-4 relative (the GPU's fused multiply-adds and cuBLAS's order differ from the CPU's).
W="$OUT/tiny"
rm -rf "$W"; mkdir -p "$W"
cp runtime/tests/fixtures/tokenizer/tokenizer.json "$W/"
cp runtime/tests/fixtures/data/spam48.jsonl "$W/train.jsonl"
head -12 "$W/train.jsonl" > "$W/eval.jsonl"
cp runtime/tests/fixtures/tiny-bert/config.json runtime/tests/fixtures/tiny-bert/tiny.rcp "$W/"
( cd "$W" && "$BIN" run --quiet --device cpu --set 'train.output_dir="cpu"' tiny.rcp ) \
    > "$W/cpu.log" 2>&1
( cd "$W" && "$BIN" run --quiet --device cuda --set 'train.output_dir="gpu"' tiny.rcp ) \
    > "$W/gpu.log" 2>&1
"$PY" - "$W" > "$OUT/tiny.json" <<'PYTHON'
import json, sys
w = sys.argv[1]
def steps(d):
    try:
        rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    except OSError as e:
        return None, str(e)
    start = next((r for r in rows if r.get("event") == "start"), {})
    return [(r["step"], r["lr"], r["loss"]) for r in rows if "loss" in r], start.get("device")
(cpu, cdev), (gpu, gdev) = steps("cpu"), steps("gpu")
out = {"cpu_device": cdev, "gpu_device": gdev, "ok": False}
if cpu and gpu:
    out["steps"] = len(cpu)
    out["same_steps_and_lr"] = [(s, l) for s, l, _ in cpu] == [(s, l) for s, l, _ in gpu]
    out["max_loss_rel_diff"] = max(abs(a[2] - b[2]) / abs(a[2]) for a, b in zip(cpu, gpu))
    out["ok"] = out["same_steps_and_lr"] and out["max_loss_rel_diff"] <= 1e-4 and len(cpu) == len(gpu)
print(json.dumps(out, indent=1))
PYTHON
if json_ok "$OUT/tiny.json"; then
    parts[tiny]=pass
else
    parts[tiny]=fail; status=1
fi

# The main job on the GPU, from the carried fp16 MiniLM.
if [ -f gpu-assets/minilm/model.safetensors ]; then
    "$BIN" run --quiet --device cuda recipes/spam.rcp \
        --set "model.from=\"$(pwd)/gpu-assets/minilm\"" --set "train.output_dir=\"$OUT/spam\"" \
        > "$OUT/spam.log" 2>&1
    "$PY" - "$OUT/spam" > "$OUT/spam.json" <<'PYTHON'
import json, sys
try:
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
    start = next(r for r in rows if r.get("event") == "start")
    evals = [r["eval"] for r in rows if "eval" in r]
    acc = evals[-1]["accuracy"]
    end = next(r for r in rows if r.get("event") == "end")
    out = {"device": start.get("device"), "steps": end["steps"]["taken"],
           "eval": evals[-1], "ok": start.get("device") != "cpu" and acc >= 0.95}
except (OSError, StopIteration, IndexError, KeyError) as e:
    out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(out, indent=1))
PYTHON
    if json_ok "$OUT/spam.json"; then
        parts[spam]=pass
    else
        parts[spam]=fail; status=1
    fi
else
    parts[spam]=skipped
fi

# Throughput next to PyTorch (needs torch on this machine; transformers if present).
if OUT="$OUT" RECIPE_BIN="${RECIPE_BIN:-target/release/recipe}" PYTHON="$PY" \
    scripts/gpu-throughput.sh > "$OUT/throughput.log" 2>&1 \
    && json_ok "$OUT/throughput.json"; then
    parts[throughput]=pass
else
    parts[throughput]=fail; status=1
fi

{
    echo "{"
    first=1
    for k in kernels selftest tiny spam throughput; do
        [ $first = 1 ] || echo ","
        printf '  "%s": "%s"' "$k" "${parts[$k]}"
        first=0
    done
    printf '\n}\n'
} > "$OUT/summary.json"
cat "$OUT/summary.json"
exit $status
