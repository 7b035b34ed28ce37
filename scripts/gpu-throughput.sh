#!/usr/bin/env bash
# Training throughput of `recipe run` next to PyTorch eager in the same run (issue 15's goal):
# BERT-base (random init), sequence 128, bf16, micro-batch 32, AdamW + clipping, dropout 0.1 —
# ours through scripts/gpu/bert-base.rcp, PyTorch's through scripts/gpu/torch_bert_bench.py
# (autocast bf16, fused AdamW). Writes $OUT/throughput.json: each side's median samples/s over
# the steps after the first 10, their ratio, and each side's MFU with llm.c's FLOP count
# (6·N + 6·L·C·T per token, N every parameter; train_gpt2.cu) against the GPU's dense bf16 peak:
# PEAK_TFLOPS, else the peak the run itself reported its MFU against (`recipe run`'s start
# record: the GPU's own, from runtime/src/flops.rs's table of NVIDIA's data sheets without
# sparsity — 989 for an H100 SXM or H200); for another GPU no MFU, rather than one against the
# wrong peak.
# Ours runs again with its GEMMs on cuBLAS's `cublasGemmEx` family instead of cuBLASLt
# (RECIPE_GEMM_LIBRARY=cublas, docs/cuda.md "GEMMs"), without the fused attention kernels
# (RECIPE_FUSED_ATTENTION=0: the batched products and the softmax kernels, for the A/B), with
# every GEMM on one stream (RECIPE_SIDE_STREAM=0: the weight gradients not beside the rest) and
# with the weight gradients' stream of the compute stream's priority (RECIPE_SIDE_STREAM=equal),
# with each step's updates before the next forward instead of beside it (RECIPE_STEP_ASIDE=0),
# with the word embeddings' rows the next micro-batch names updated first and the rest beside
# its forward (RECIPE_ROWS_FIRST=1; off by default until timed),
# with our kernels as programmatic dependent launches (RECIPE_PDL=1, and =early; off by default until timed),
# and profiled (`recipe run --profile`): $OUT/profile.json says where the GPU's time goes. And
# MiniLM's shape (all-MiniLM-L6-v2, recipes/cls.rcp's model: 6 layers, hidden 384, 12 heads of
# 32) the same way, with and without the fused attention kernels (their heads of 32), and
# BERT-base at twice the length (256 tokens: the long fused kernels, the keys in chunks) with and
# without them (ratio_long_fused_over_unfused). Ours runs
# with its passes replayed as CUDA graphs (the default, docs/cuda.md "CUDA graphs"), and once
# more launching them directly (RECIPE_CUDA_GRAPHS=0). The default run, the unfused one and
# MiniLM's two evaluate once after their last step: the evaluation forward's rows a second,
# through the fused attention kernel and without it (ratio_eval_fused_over_unfused,
# ratio_minilm_eval_fused_over_unfused).
#
#   scripts/gpu-throughput.sh                     # on a GPU (called by scripts/gpu-check.sh)
#   DEVICE=cpu SHAPE=tiny scripts/gpu-throughput.sh   # a dry run of the script on any machine
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
DEVICE="${DEVICE:-cuda}"
SHAPE="${SHAPE:-base}"
BIN="${RECIPE_BIN:-target/release/recipe}"
[[ "$BIN" = /* ]] || BIN="$(pwd)/$BIN"
PY="${PYTHON:-python3}"
W="$OUT/throughput"
rm -rf "$W"; mkdir -p "$W"
cp scripts/gpu/bert-base.rcp scripts/gpu/bert-base.json "$W/"
cp runtime/tests/fixtures/tokenizer/tokenizer.json "$W/"

# shape FILE LAYERS HIDDEN HEADS INTER: bert-base.json's copy FILE with that shape.
shape() {
    "$PY" - "$W/bert-base.json" "$@" <<'PY'
import json, sys
src, dst, l, c, h, i = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
cfg = json.load(open(src))
cfg.update(num_hidden_layers=l, hidden_size=c, num_attention_heads=h, intermediate_size=i)
json.dump(cfg, open(dst, "w"), indent=1)
PY
}
if [ "$SHAPE" = tiny ]; then
    # 2 layers of 64, 8 timed steps of 4: checks the plumbing, measures nothing.
    L=2; C=64; HEADS=2; INTER=128; MICRO=4; SEQ=32; STEPS=12
    shape "$W/bert-base.json" "$L" "$C" "$HEADS" "$INTER"
    shape "$W/minilm.json" 1 64 2 128
else
    L=12; C=768; HEADS=12; INTER=3072; MICRO=32; SEQ=128; STEPS=40
    shape "$W/minilm.json" 6 384 12 1536
fi
sed 's/bert-base\.json/minilm.json/; s/"bert-base-throughput"/"minilm-throughput"/' \
    "$W/bert-base.rcp" > "$W/minilm.rcp"
WARM=10
# Each run (17 in all with the peer and the profile, within scripts/gpu-check.sh's 180 s) is
# bounded, so that one slow or hung run costs its own figure only (a run cut short still logged
# its steps).
RUN_LIMIT="${RUN_LIMIT:-30}"
# The whole script's limit (scripts/gpu-check.sh passes its part's): a run starts only if it
# can end, at its own limit, 5 s before it, so that the summary is always written; the runs
# left out say so in their logs, and the summary names them as missing. The runs go in order
# of what they tell: the default run first, the profile last.
TOTAL_LIMIT="${TOTAL_LIMIT:-180}"

# Rows long enough to fill SEQ tokens each (lower-case words of the tokenizer's vocabulary), so
# every batch of ours is as long as PyTorch's fixed-length one.
"$PY" - "$W/long.jsonl" "$MICRO" "$STEPS" <<'PY'
import json, random, sys
path, micro, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = ("the model trains on every token of this long message about free money offers meeting "
         "notes project updates and weekly reports").split()
rng = random.Random(0)
with open(path, "w") as f:
    for i in range(micro * steps):
        text = " ".join(rng.choice(words) for _ in range(300))
        f.write(json.dumps({"text": text, "label": "spam" if i % 2 else "ham"}) + "\n")
PY

# SETUP_ONLY=1: the work folder only (scripts/gpu-profile.sh runs its own commands there).
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0

# ours NAME MODE STEPS [--profile]: one run of ours into $W/NAME, RECIPE_HALF_GEMM=MODE
# (RECIPE_CUDA_GRAPHS=$GRAPHS, default 1; RECIPE_FUSED_ATTENTION=$FUSED, default 1;
# RECIPE_GEMM_LIBRARY=$LIB, default cublaslt; RECIPE_SIDE_STREAM=$SIDE, default 1;
# RECIPE_GEMM_ALGO=$ALGO, default first; RECIPE_STEP_ASIDE=$STEP, default 1; RECIPE_PDL=$PDL (0, 1, early),
# default 0; RECIPE_ROWS_FIRST=$ROWS, default 0), of $RCP (default bert-base.rcp), rows of $LEN tokens (default $SEQ), at most
# $RUN_LIMIT seconds.
ours() {
    local name=$1 mode=$2 steps=$3
    shift 3
    if [ $((SECONDS + RUN_LIMIT + 5)) -gt "$TOTAL_LIMIT" ]; then
        echo "recipe run ($name) left out: ${SECONDS}s of the ${TOTAL_LIMIT}s spent" \
            | tee "$W/$name.log" >&2
        return
    fi
    ( cd "$W" && RECIPE_HALF_GEMM="$mode" RECIPE_CUDA_GRAPHS="${GRAPHS:-1}" \
        RECIPE_FUSED_ATTENTION="${FUSED:-1}" RECIPE_GEMM_LIBRARY="${LIB:-cublaslt}" \
        RECIPE_SIDE_STREAM="${SIDE:-1}" RECIPE_GEMM_ALGO="${ALGO:-first}" \
        RECIPE_STEP_ASIDE="${STEP:-1}" RECIPE_PDL="${PDL:-0}" RECIPE_ROWS_FIRST="${ROWS:-0}" timeout "$RUN_LIMIT" "$BIN" run --quiet --device "$DEVICE" "$@" "${RCP:-bert-base.rcp}" \
        --set "batch.micro=$MICRO" --set "data.max_len=${LEN:-$SEQ}" --set "train.max_steps=$steps" \
        --set "train.output_dir=\"$name\"" ) > "$W/$name.log" 2>&1 \
        || { echo "recipe run ($name) failed: $W/$name.log" >&2; tail -5 "$W/$name.log" >&2; }
}
# The peer first, so that a slow run of ours cannot cost its figure.
timeout "$RUN_LIMIT" "$PY" scripts/gpu/torch_bert_bench.py --device "$DEVICE" --layers "$L" --hidden "$C" \
    --heads "$HEADS" --intermediate "$INTER" --batch "$MICRO" --seq "$SEQ" \
    --steps "$((STEPS - WARM))" --warmup "$WARM" > "$W/torch.json" 2> "$W/torch.log" \
    || { echo "the PyTorch peer failed: $W/torch.log" >&2; tail -5 "$W/torch.log" >&2; }
# The default run, the unfused one and MiniLM's two also evaluate once, after their last step
# (its record comes after the last step's, so the training rate is the same): the evaluation
# forward's rows per second, through the fused attention kernel and without it.
EVAL=(--set 'data.eval="long.jsonl"')
ours out pack "$STEPS" "${EVAL[@]}"
# The settings still to decide, each against the default run: the step beside the forward, the
# word embeddings' rows first, the weight gradients' stream, the GEMMs' algorithms,
# programmatic dependent launches (and two settings still off by default together: the run
# their flips would make the default).
STEP=0 ours step-before pack "$STEPS"
ROWS=1 ours rows-first pack "$STEPS"
SIDE=0 ours one-stream pack "$STEPS"
ALGO=fastest ours gemm-fastest pack "$STEPS"
PDL=1 ours pdl pack "$STEPS"
PDL=1 ALGO=fastest ours pdl-gemm-fastest pack "$STEPS"
PDL=early ours pdl-early pack "$STEPS"
# MiniLM's shape: heads of 32, through the fused attention kernels and without them.
RCP=minilm.rcp ours minilm pack "$STEPS" "${EVAL[@]}"
RCP=minilm.rcp FUSED=0 ours minilm-unfused pack "$STEPS" "${EVAL[@]}"
# BERT-base at twice the length: the long fused kernels (keys in chunks) and without them.
LEN=$((2 * SEQ)) ours long pack "$STEPS"
LEN=$((2 * SEQ)) FUSED=0 ours long-unfused pack "$STEPS"
# What earlier sessions measured, again.
FUSED=0 ours unfused pack "$STEPS" "${EVAL[@]}"
SIDE=equal ours side-equal pack "$STEPS"
GRAPHS=0 ours direct pack "$STEPS"
LIB=cublas ours cublas pack "$STEPS"
if [ "$DEVICE" = cuda ]; then
    ours profiled pack "$((WARM + 10))" --profile
    cp "$W/profiled/profile.json" "$OUT/profile.json" 2>/dev/null || true
fi

"$PY" scripts/gpu/throughput_summary.py "$W" "$DEVICE" "$L" "$C" "$SEQ" "$WARM" "${PEAK_TFLOPS:-}" \
    "$INTER" > "$OUT/throughput.json"
cat "$OUT/throughput.json"
