#!/usr/bin/env bash
# Where a BERT-base training step's GPU time goes, kernel by kernel (docs/cuda.md, "Profiling"):
# the shape of scripts/gpu-throughput.sh (seq 128, bf16, micro-batch 32), ours under Nsight
# Compute (each kernel's own duration, cuBLAS's included, with its grid: `recipe run --profile`
# times between events, which counts the GPU's waits for the host), and the PyTorch peer under
# torch.profiler; also ours at micro-batch 64 (does a step cost less per sample when larger: the
# share of fixed costs). For a GPU machine, carried as scripts/gpu-check.sh is:
#   run(command="scripts/gpu-profile.sh", carry=["gpu-assets"])
# Writes into $OUT (default gpu-profile/): ncu-recipe.csv (ncu's raw rows), ncu-sol.csv (the speed
# of light of our kernels), torch-kernels.json, summary.json (per step: each kernel's
# microseconds, ours and PyTorch's; each of our kernels' memory and compute shares), logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-gpu-profile}"
mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
W="${WORK:-/tmp/gpu-profile-work}"
rm -rf "$W"; mkdir -p "$W"
W="$(cd "$W" && pwd)"
BIN="$(pwd)/${RECIPE_BIN:-target/release/recipe}"
PY="${PYTHON:-python3}"
PYTHON="$PY" scripts/gpu/unpack.sh "$BIN"
# The libraries as scripts/gpu-check.sh finds them (PyTorch's CUDA 13 wheels).
. scripts/gpu/libs.sh
SETUP_ONLY=1 OUT="$W" PYTHON="$PY" scripts/gpu-throughput.sh
T="$W/throughput"
STEPS="${STEPS:-5}"
# About 850 kernels a step: skip two steps' launches, then profile enough for one whole step
# between two optimizer steps whatever the count is.
SKIP_LAUNCHES="${SKIP_LAUNCHES:-1700}"
COUNT="${COUNT:-2200}"
NCU="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
ours() {
    local name=$1
    shift
    ( cd "$T" && "$@" "$BIN" run --quiet --device cuda bert-base.rcp --set "data.max_len=128" \
        --set "train.output_dir=\"$name\"" ${EXTRA[@]+"${EXTRA[@]}"} ) > "$RESULTS/$name.log" 2>&1
}
EXTRA=(--set "batch.micro=32" --set "train.max_steps=$STEPS")
# Launched directly (RECIPE_CUDA_GRAPHS=0), as the recorded profiles in docs/gpu/ were.
ours ncu env RECIPE_CUDA_GRAPHS=0 timeout 240 "${NCU:-ncu}" --clock-control none --metrics gpu__time_duration.sum --csv \
    --print-units base --launch-skip "$SKIP_LAUNCHES" --launch-count "$COUNT" \
    --log-file "$RESULTS/ncu-recipe.csv"
# Speed of light of our own kernels (the share of the GPU's memory and compute bandwidth each
# reaches): whether a kernel is bound by memory, by its instructions, or by neither (latency).
EXTRA=(--set "batch.micro=32" --set "train.max_steps=3")
ours sol env RECIPE_CUDA_GRAPHS=0 timeout 120 "${NCU:-ncu}" --clock-control none --section SpeedOfLight --csv \
    --print-units base --kernel-name "regex:^(layernorm|attention_|bias_|gelu_|add_bias|round_rows|embedding_|adamw)" \
    --launch-skip 40 --launch-count 60 --log-file "$RESULTS/ncu-sol.csv"
EXTRA=(--set "batch.micro=64" --set "train.max_steps=20")
ours micro64 timeout 60
# PEER=0 leaves the PyTorch peer out (its profile does not change with ours).
if [ "${PEER:-1}" != 0 ]; then
    timeout 90 "$PY" scripts/gpu/torch_bert_bench.py --steps 10 --warmup 10 \
        --profile "$RESULTS/torch-kernels.json" > "$RESULTS/torch.json" 2> "$RESULTS/torch.log"
fi
cp "$T/micro64/metrics.jsonl" "$RESULTS/micro64.jsonl" 2>/dev/null
rm -f "$RESULTS/torch-kernels.json.trace"
# Against the last profile recorded on the same kind of GPU (docs/gpu/<kind>-<date>/
# profile-summary.json), if any: another GPU's kernel times (an H100's lower bandwidth, say)
# would read as changes of ours.
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
case "$GPU_NAME" in
    *H200*) KIND=h200 ;;
    *H100*) KIND=h100 ;;
    *A100*) KIND=a100 ;;
    *) KIND= ;;
esac
LAST=
[ -n "$KIND" ] && LAST="$(ls -d docs/gpu/"$KIND"-*/profile-summary.json 2>/dev/null | sort | tail -1)"
"$PY" scripts/gpu/profile_summary.py "$RESULTS" ${LAST:+--against "$LAST"} > "$RESULTS/summary.json"
# The logs in one file (the device tool brings back 8 files at most).
( cd "$RESULTS" && tar czf logs.tgz --remove-files ./*.log micro64.jsonl torch.json 2>/dev/null )
cat "$RESULTS/summary.json"
