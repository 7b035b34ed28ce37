#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one run (docs/cuda.md). For a GPU machine with PyTorch's
# CUDA 13 wheels but no Rust: build `target/release/recipe` elsewhere, carry it with the tree,
# then `scripts/gpu-check.sh`. Everything is written under $WORK (default
# /tmp/gpu-check-work: models, checkpoints and logs, gigabytes), and after every part three
# small files into $OUT (default gpu-check/), which is what a device session brings back:
#   summary.json   pass/fail/skipped of each part (also printed at the end)
#   results.json   each part's JSON below, and the text of nvidia-smi, the kernels' report and
#                  both self-tests, in one file
#   logs.tgz       every log, metrics.jsonl, selftest.json and profile.json (no models)
# The parts, in $WORK:
#   nvidia-smi.csv   the GPU and driver
#   kernels.txt      NVRTC on this machine: every kernel for the GPU's architecture
#   selftest.txt/.json  every operation on the GPU against the CPU backend (fp32, fp16, bf16),
#                    with CUDA graphs on (the default: graph.replay); its "self-test
#                    on" line names the driver, NVRTC and cuBLAS versions loaded
#   selftest-convert.txt/.json  the same with cuBLAS converting the half GEMMs' operands
#                    (RECIPE_HALF_GEMM=convert, docs/cuda.md "Half-precision GEMMs"), graphs off,
#                    the GEMMs on the fastest of cuBLASLt's answers (RECIPE_GEMM_ALGO=fastest)
#   tiny/            the tiny BERT trained on the CPU and on the GPU, optimizer on the GPU,
#                    20 steps in fp32 (tiny.json compares them; summary's fp32_curve_goal: the
#                    issue's goal, losses within 1e-5 relative, reported; every run replays its
#                    passes as CUDA graphs, the default), the same launched directly
#                    (RECIPE_CUDA_GRAPHS=0: direct.json; same_losses_as_graphs), each run's
#                    checkpoint after 8 steps resumed on the other device (resume.json: the
#                    GPU's on the CPU and the CPU's on the GPU end as the CPU alone), offloaded at
#                    ZeRO-2 in fp16 (offload.json), and
#                    two ranks (one GPU each, or sharing the only one) against the CPU's two:
#                    ZeRO-0 (dp2.json), that ZeRO-2 offload shape (ranks2.json), ZeRO-2
#                    without offload in fp16 (zero2.json) and ZeRO-3 in fp32 (zero3.json)
#   spam-graphs0/1/, spam.json  the main job, recipes/spam.rcp, trained on the GPU (final
#                    accuracy >= 0.95), directly and with its passes replayed as CUDA graphs
#                    (RECIPE_CUDA_GRAPHS=1: samples/s of each, the speedup),
#                    from gpu-assets/minilm (scripts/gpu-assets.sh: MiniLM in fp16, xz-packed
#                    with the binary; the GPU machine has no network); "skipped" without it
#   throughput.json  BERT-base seq 128 bf16 batch 32: samples/s of ours and of PyTorch eager
#                    (autocast bf16, fused AdamW) in the same run, ratio and MFU, ours also
#                    with RECIPE_GEMM_LIBRARY=cublas and with RECIPE_FUSED_ATTENTION=0;
#                    profile.json: where the GPU's time goes (`recipe run --profile`; scripts/gpu-throughput.sh;
#                    reported, the goals are not enforced)
# SKIP="spam throughput" skips those parts. A rehearsal anywhere, on runtime/fake-cuda's
# CPU-emulated GPUs: scripts/fake-gpu-check.sh.
# Exit 0 only if every part that ran passed. About 3–5 minutes on one H200. Each command is
# bounded (PART_LIMIT, default 90 s; the throughput part twice that), sums between ranks too
# (RECIPE_COLLECTIVE_TIMEOUT, default 60 s here), and a part that would start after BUDGET
# seconds (default 300) is skipped, so a hang costs one part, not the session (the last part
# may take 180 s more: under 10 minutes in all).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-gpu-check}"
mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
OUT="${WORK:-/tmp/gpu-check-work}"
rm -rf "$OUT"; mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BIN="$(pwd)/${RECIPE_BIN:-target/release/recipe}"
PY="${PYTHON:-python3}"
# What scripts/gpu-assets.sh packed: the binary, where none was carried, and MiniLM in fp16 for
# the main job.
MINILM=gpu-assets/minilm
PYTHON="$PY" scripts/gpu/unpack.sh "$BIN" "$OUT/minilm"
[ -f "$OUT/minilm/model.safetensors" ] && MINILM="$OUT/minilm"
# Each part's commands are bounded, so a hang fails that part instead of the whole lease.
LIMIT="${PART_LIMIT:-90}"
BUDGET="${BUDGET:-300}"
export RECIPE_COLLECTIVE_TIMEOUT="${RECIPE_COLLECTIVE_TIMEOUT:-60}"
status=0
declare -A parts
ORDER=(kernels selftest selftest_convert tiny fp32_curve_goal direct resume offload dp2 ranks2 zero2 zero3 spam throughput)
# Whether a part's JSON file says "ok": true.
json_ok() { "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$1"; }
# Whether the time left allows part $1 (else it is marked skipped).
in_budget() {
    if [[ " ${SKIP:-} " == *" $1 "* ]]; then
        parts[$1]="skipped (SKIP)"
        return 1
    fi
    if [ "$SECONDS" -ge "$BUDGET" ]; then
        parts[$1]="skipped (budget: ${SECONDS}s of ${BUDGET}s spent)"
        return 1
    fi
}
# summary.json, results.json and logs.tgz into $RESULTS, from what $OUT holds so far.
pack() {
    rm -f "$RESULTS"/*.tmp
    {
        echo "{"
        first=1
        for k in "${ORDER[@]}"; do
            [ $first = 1 ] || echo ","
            printf '  "%s": "%s"' "$k" "${parts[$k]:-not run}"
            first=0
        done
        printf ',\n  "elapsed_s": %s\n}\n' "$SECONDS"
    } > "$RESULTS/summary.json.tmp" && mv "$RESULTS/summary.json.tmp" "$RESULTS/summary.json"
    "$PY" - "$OUT" "$RESULTS" <<'PYTHON'
import json, os, sys
out, results = sys.argv[1], sys.argv[2]
doc = {"summary": json.load(open(f"{results}/summary.json"))}
for name in sorted(os.listdir(out)):
    path = f"{out}/{name}"
    if not os.path.isfile(path):
        continue
    key = name.replace(".", "_").replace("-", "_")
    try:
        doc[key] = json.load(open(path)) if name.endswith(".json") else open(path).read()[-20000:]
    except (OSError, ValueError) as e:
        doc[key] = {"unreadable": str(e)}
with open(f"{results}/results.json.tmp", "w") as f:
    json.dump(doc, f, indent=1)
os.replace(f"{results}/results.json.tmp", f"{results}/results.json")
PYTHON
    # Logs and JSON, not the models, checkpoints, tokenizers or kernels' binaries.
    ( cd "$OUT" && find . \( -name 'checkpoint-*' -o -name model -o -name kernels \
        -o -name 'kernels-*' \) -prune -o \( -name '*.log' -o -name '*.txt' -o -name '*.csv' \
        -o -name 'metrics.jsonl' -o -name '*.json' \) ! -name 'tokenizer*.json' -size -4M -print0 \
        | tar czf "$RESULTS/logs.tgz.tmp" --null -T - ) 2>/dev/null \
        && mv "$RESULTS/logs.tgz.tmp" "$RESULTS/logs.tgz"
    rm -f "$RESULTS"/*.tmp
}

nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv \
    > "$OUT/nvidia-smi.csv" 2>&1 || true

# NVRTC, cuBLAS and NCCL from PyTorch's wheels, under the names cudarc loads.
. scripts/gpu/libs.sh
# (CHECK_GPUS stands in for nvidia-smi's count on the fake GPUs: scripts/fake-gpu-check.sh.)
GPUS="${CHECK_GPUS:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)}"
export GPUS
CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
ARCH="sm_${CAP:-90}"

if timeout "$LIMIT" "$BIN" kernels --arch "$ARCH" --out "$OUT/kernels" > "$OUT/kernels.txt" 2>&1; then
    parts[kernels]=pass
else
    parts[kernels]=fail; status=1
fi
pack
# With CUDA graphs on (the device's own stream, and `graph.replay`); the convert run below
# turns them off (the legacy default stream).
if RECIPE_CUDA_GRAPHS=1 timeout "$LIMIT" "$BIN" kernels --arch "$ARCH" --selftest \
    --out "$OUT/kernels" > "$OUT/selftest.txt" 2>&1; then
    parts[selftest]=pass
else
    parts[selftest]=fail; status=1
fi
cp "$OUT/kernels/selftest.json" "$OUT/selftest.json" 2>/dev/null || true
pack
if ! in_budget selftest_convert; then
    :
# NCCL was checked by the first self-test: not again (RECIPE_NCCL=0). Its GEMMs run on the
# fastest of cuBLASLt's answers (RECIPE_GEMM_ALGO=fastest), and its kernels as programmatic
# dependent launches that let the next kernel be scheduled once they have waited
# (RECIPE_PDL=early, on sm_90 and newer: RECIPE_PDL=1's launches and more), each checked
# against the CPU.
elif RECIPE_NCCL=0 RECIPE_HALF_GEMM=convert RECIPE_CUDA_GRAPHS=0 RECIPE_GEMM_ALGO=fastest RECIPE_PDL=early timeout "$LIMIT" "$BIN" kernels --arch "$ARCH" --selftest \
    --out "$OUT/kernels-convert" > "$OUT/selftest-convert.txt" 2>&1; then
    parts[selftest_convert]=pass
else
    parts[selftest_convert]=fail; status=1
fi
cp "$OUT/kernels-convert/selftest.json" "$OUT/selftest-convert.json" 2>/dev/null || true
pack

# The tiny BERT of tests/run.rs (random init, the MiniLM tokenizer, 48 SpamAssassin rows), 8
# optimizer steps with dropout, on the CPU and on the GPU: the same steps and LRs, and losses
# within 1e-4 relative (the GPU's fused multiply-adds and cuBLAS's order differ from the CPU's).
# Several times: the optimizer resident on the GPU (`tiny`, 20 steps: the issue's fp32 goal is
# the CPU's curve within 1e-5 relative, reported as `fp32_curve_goal`), recipes/cls.rcp's shape, ZeRO-2 with
# the optimizer offloaded to the host in fp16 (`offload`: the pinned copies, once per step each),
# and two ranks against the CPU's two (both ranks on this GPU when it is the only one): `dp2`,
# tiny.rcp at ZeRO-0 (each rank's model and optimizer resident, the gradient averaged on the
# host), `ranks2`, the ZeRO-2 offload shape (passes on the GPU, the rest on the host), `zero2`,
# ZeRO-2 in fp16 without offload, and `zero3`, ZeRO-3 in fp32. On a machine with two GPUs or
# more, all four must sum their gradients GPU to GPU (NCCL), and `zero2`/`zero3` must step each
# rank's partition on its GPU (ZeRO-3 gathering its segments there).
W="$OUT/tiny"
rm -rf "$W"; mkdir -p "$W"
cp runtime/tests/fixtures/tokenizer/tokenizer.json "$W/"
cp runtime/tests/fixtures/data/spam48.jsonl "$W/train.jsonl"
head -12 "$W/train.jsonl" > "$W/eval.jsonl"
cp runtime/tests/fixtures/tiny-bert/config.json runtime/tests/fixtures/tiny-bert/tiny.rcp "$W/"
{ cat "$W/tiny.rcp"; echo 'zero 2 { offload optimizer = cpu }'; } > "$W/offload.rcp"
{ cat "$W/tiny.rcp"; echo 'zero 2'; } > "$W/zero2.rcp"
{ cat "$W/tiny.rcp"; echo 'zero 3'; } > "$W/zero3.rcp"
for part in tiny direct offload dp2 ranks2 zero2 zero3; do
    in_budget "$part" || continue
    sets=()
    rcp=$part.rcp
    graphs=1
    # The fp32 goal's length: 20 optimizer steps (4 per epoch); a checkpoint after 8 for
    # `resume` below.
    [ "$part" = tiny ] && sets=(--set 'train.epochs=5' --set 'train.save_every=8')
    # The same with the GPU's kernels launched directly (RECIPE_CUDA_GRAPHS=0), not replayed.
    [ "$part" = direct ] && { sets=(--set 'train.epochs=5'); rcp=tiny.rcp; graphs=0; }
    [ "$part" = offload ] && sets=(--set 'train.precision=fp16')
    [ "$part" = dp2 ] && { sets=(--gpus 2); rcp=tiny.rcp; }
    [ "$part" = ranks2 ] && { sets=(--set 'train.precision=fp16' --gpus 2); rcp=offload.rcp; }
    [ "$part" = zero2 ] && sets=(--set 'train.precision=fp16' --gpus 2)
    [ "$part" = zero3 ] && sets=(--gpus 2)
    for dev in cpu cuda; do
        ( cd "$W" && RECIPE_CUDA_GRAPHS=$graphs timeout "$LIMIT" "$BIN" run --quiet \
            --device "$dev" ${sets[@]+"${sets[@]}"} \
            --set "train.output_dir=\"$part-$dev\"" "$rcp" ) > "$W/$part-$dev.log" 2>&1
    done
    "$PY" - "$W" "$part" > "$OUT/$part.json" <<'PYTHON'
import json, os, sys
w, part = sys.argv[1], sys.argv[2]
def steps(d):
    try:
        rows = [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
    except OSError as e:
        return None, {"error": str(e)}
    start = next((r for r in rows if r.get("event") == "start"), {})
    keys = ("step", "lr", "loss_scale", "skipped")
    return [(tuple(r.get(k) for k in keys), r["loss"]) for r in rows if "loss" in r], start
(cpu, cstart), (gpu, gstart) = steps(f"{part}-cpu"), steps(f"{part}-cuda")
out = {"cpu_device": cstart.get("device"), "gpu_device": gstart.get("device"), "ok": False}
if cpu and gpu:
    out["model_on_device"] = gstart.get("model_on_device")
    out["optimizer_on_device"] = gstart.get("optimizer_on_device")
    out["steps"] = len(cpu)
    out["same_steps_lr_scales_skips"] = [s for s, _ in cpu] == [s for s, _ in gpu]
    out["max_loss_rel_diff"] = max(abs(a[1] - b[1]) / abs(a[1]) for a, b in zip(cpu, gpu))
    # In fp16 each micro-batch's loss is itself a rounded fp16 value on both devices: one of
    # them a rounding step apart (cuBLAS adds in another order than the CPU) is 2^-11
    # relative to a loss near 1, so the bound is a few of those there, 1e-4 otherwise.
    out["loss_bound"] = 2e-3 if gstart.get("precision") == "fp16" else 1e-4
    if part == "direct":
        # Against the same run replaying graphs (`tiny`): the same kernels, so the same
        # losses, reported (cuBLAS may pick another algorithm inside a capture).
        replayed, _ = steps("tiny-cuda")
        out["same_losses_as_graphs"] = replayed == gpu
    if part == "tiny":
        # The issue's goal, reported (not enforced, like throughput's): fp32, 20 steps, 1e-5.
        out["fp32_curve_goal_1e-5"] = (len(cpu) >= 20 and out["same_steps_lr_scales_skips"]
                                       and out["max_loss_rel_diff"] <= 1e-5)
    out["world"] = gstart.get("world")
    out["exchange_on_device"] = gstart.get("exchange_on_device")
    # One GPU per rank: NCCL; ranks sharing a GPU exchange through the host.
    nccl = out["world"] > 1 and int(os.environ.get("GPUS", "1")) >= out["world"]
    # One rank keeps the model on the GPU, and so does each of several at ZeRO-0, or over NCCL
    # at any stage without offload and at ZeRO 2-3 with it; otherwise the host keeps them.
    stage = gstart.get("zero_stage")
    on_device = (out["world"] == 1 or stage == 0
                 or nccl and (not gstart.get("offload_optimizer") or stage >= 2))
    out["ok"] = (out["same_steps_lr_scales_skips"] and out["max_loss_rel_diff"] <= out["loss_bound"]
                 and len(cpu) == len(gpu) and out["model_on_device"] is on_device
                 and cstart.get("world") == out["world"]
                 and out["exchange_on_device"] is nccl)
print(json.dumps(out, indent=1))
PYTHON
    if [ "$part" = tiny ]; then
        "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("fp32_curve_goal_1e-5") else 1)' \
            "$OUT/tiny.json" && parts[fp32_curve_goal]=met || parts[fp32_curve_goal]=missed
    fi
    if json_ok "$OUT/$part.json"; then
        parts[$part]=pass
    else
        parts[$part]=fail; status=1
    fi
    pack
done

# A run stops on one device and goes on on the other (the checkpoints are the same files):
# `tiny`'s checkpoint after 8 of its 20 steps, the GPU's resumed on the CPU and the CPU's on the
# GPU. Each resumed run's steps, LRs and losses against the CPU's uninterrupted run (the same
# bound as GPU against CPU, 1e-4 relative): resume.json.
if [[ "${parts[tiny]:-skipped}" == skipped* ]]; then
    parts[resume]="skipped (no tiny run to resume)"
elif in_budget resume; then
    for move in cuda-cpu cpu-cuda; do
        ( cd "$W" && timeout "$LIMIT" "$BIN" run --quiet --device "${move#*-}" \
            --set 'train.epochs=5' --set 'train.save_every=8' \
            --set "train.output_dir=\"resume-$move\"" --resume "tiny-${move%-*}/checkpoint-8" \
            tiny.rcp ) > "$W/resume-$move.log" 2>&1
    done
    "$PY" scripts/gpu/resume_summary.py "$W" > "$OUT/resume.json"
    if json_ok "$OUT/resume.json"; then
        parts[resume]=pass
    else
        parts[resume]=fail; status=1
    fi
    pack
fi

# The main job on the GPU, from the carried fp16 MiniLM, launched directly (RECIPE_CUDA_GRAPHS=0)
# and as by default with its passes replayed as CUDA graphs (a small model's step is mostly
# launches): both must reach the accuracy; spam.json reports each one's median samples/s and
# the largest loss difference.
if [ ! -f "$MINILM/model.safetensors" ]; then
    parts[spam]=skipped
elif in_budget spam; then
    for g in 0 1; do
        RECIPE_CUDA_GRAPHS=$g timeout "$LIMIT" "$BIN" run --quiet --device cuda recipes/spam.rcp \
            --set "model.from=\"$(cd "$MINILM" && pwd)\"" \
            --set "train.output_dir=\"$OUT/spam-graphs$g\"" > "$OUT/spam-graphs$g.log" 2>&1
    done
    "$PY" - "$OUT/spam-graphs0" "$OUT/spam-graphs1" > "$OUT/spam.json" <<'PYTHON'
import json, statistics, sys
def run(d):
    rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    start = next(r for r in rows if r.get("event") == "start")
    evals = [r["eval"] for r in rows if "eval" in r]
    end = next(r for r in rows if r.get("event") == "end")
    steps = [r for r in rows if "loss" in r]
    # Each row's samples_per_s is the average since training began (warm-up included):
    # between two rows the rate is Δstep / Δ(step / samples_per_s), whatever the batch.
    t = [r["step"] / r["samples_per_s"] for r in steps]
    rates = [(b["step"] - a["step"]) / (tb - ta)
             for a, b, ta, tb in zip(steps, steps[1:], t, t[1:]) if tb > ta]
    return {"device": start.get("device"), "steps": end["steps"]["taken"], "eval": evals[-1],
            "samples_per_s": statistics.median(rates[len(rates) // 4:] or rates),
            # What the run said of itself: its MFU at the last step (a GPU recipe knows), the
            # GPU memory it took.
            "mfu_reported": steps[-1].get("mfu"), "device_memory": end.get("device_memory"),
            "losses": [r["loss"] for r in steps]}
try:
    plain, graphs = run(sys.argv[1]), run(sys.argv[2])
    lp, lg = plain.pop("losses"), graphs.pop("losses")
    out = {**plain, "graphs": graphs,
           "graphs_speedup": graphs["samples_per_s"] / plain["samples_per_s"],
           "graphs_max_loss_rel_diff": max(abs(a - b) / abs(a) for a, b in zip(lp, lg)),
           "ok": all(r["device"] != "cpu" and r["eval"]["accuracy"] >= 0.95
                     for r in (plain, graphs)) and len(lp) == len(lg)}
except (OSError, StopIteration, IndexError, KeyError, ValueError, ZeroDivisionError) as e:
    out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(out, indent=1))
PYTHON
    if json_ok "$OUT/spam.json"; then
        parts[spam]=pass
    else
        parts[spam]=fail; status=1
    fi
fi
pack

# Throughput next to PyTorch (needs torch on this machine; transformers if present).
if ! in_budget throughput; then
    :
elif OUT="$OUT" RECIPE_BIN="${RECIPE_BIN:-target/release/recipe}" PYTHON="$PY" \
    TOTAL_LIMIT="$((2 * LIMIT))" \
    timeout "$((2 * LIMIT))" scripts/gpu-throughput.sh > "$OUT/throughput.log" 2>&1 \
    && json_ok "$OUT/throughput.json"; then
    parts[throughput]=pass
else
    parts[throughput]=fail; status=1
fi
pack
cat "$RESULTS/summary.json"
exit $status
