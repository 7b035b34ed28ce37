#!/usr/bin/env bash
# Everything a GPU session measures, in one device call (about 4 minutes on an H200; the device
# tool lends 15 minutes a session, a machine's start included, and brings back 8 files):
# scripts/gpu-check.sh (correctness, the main job, throughput next to PyTorch; 3 files in $OUT),
# then scripts/gpu-profile.sh without the PyTorch peer (each kernel's time and speed of light;
# 4 files in $OUT/profile), then cuBLASLt's candidates for BERT-base's GEMMs timed against the
# heuristic's first (`recipe kernels --gemm-candidates`, printed: docs/cuda.md "GEMMs") and the
# choices RECIPE_GEMM_ALGO=fastest made in the throughput run (printed). Here,
# after `cargo build --release`:
#   PYTHON=<python with numpy, safetensors> scripts/gpu-assets.sh
#   run(command="scripts/gpu-session.sh", carry=["gpu-assets"], timeout_s=420)
# Compare profile/summary.json with docs/gpu/*/profile-summary.json, kernel by kernel.
# Exit status: gpu-check.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-gpu-session}"
mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
OUT="$RESULTS" BUDGET="${BUDGET:-200}" scripts/gpu-check.sh > /dev/null 2>&1
status=$?
OUT="$RESULTS/profile" PEER="${PEER:-0}" timeout "${PROFILE_LIMIT:-240}" scripts/gpu-profile.sh \
    > /dev/null 2>&1
# Printed rather than kept as a file (the device tool brings back 8).
(
    PY="${PYTHON:-python3}"
    . scripts/gpu/libs.sh
    CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
    timeout "${CANDIDATES_LIMIT:-90}" "${RECIPE_BIN:-target/release/recipe}" kernels \
        --arch "sm_${CAP:-90}" --gemm-candidates 8 2>&1 | grep -v '^NVRTC' | cut -c1-100
) || true
# The choices RECIPE_GEMM_ALGO=fastest made (gpu-throughput.sh's recipe_gemm_fastest run) for
# BERT-base's GEMMs: the rank taken and its µs against the heuristic's first.
"${PYTHON:-python3}" - "${RECIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recipe}/gemms" <<'PY' || true
import glob, json, re, sys
for f in glob.glob(sys.argv[1] + "/*.json"):
    b = json.load(open(f))
    print("GEMM choices (column-major m x n x k, batch):", b["device"])
    for shape, c in b["choices"].items():
        m, n, k = (int(x) for x in re.search(r"m: (\d+), n: (\d+), k: (\d+)", shape).groups())
        count = re.search(r"count: (\d+)", shape).group(1)
        us, r = c["us"], c["rank"]
        if m * n * k >= 10**8 and us and us[0] and us[r]:
            print(f"  {m}x{n}x{k} x{count}: rank {r} of {c['of']}, {us[0]:.1f} -> {us[r]:.1f} us")
PY
cat "$RESULTS/summary.json"
"${PYTHON:-python3}" - "$RESULTS/profile/summary.json" <<'PY' || true
import json, sys
s = json.load(open(sys.argv[1]))
r = s.get("recipe", {})
print("profile:", {k: v for k, v in r.items() if k != "rows"})
for row in r.get("rows", [])[:25]:
    print(f'{row["us_per_step"]:9.1f} us/step {row["calls_per_step"]:6.1f} calls  {row["kernel"][:90]}')
c = s.get("compared", {})
if "rows" in c:
    print(f'against {c["against"]}: {c["then_us_per_step"]:.0f} -> {c["now_us_per_step"]:.0f} us/step')
    for row in c["rows"][:15]:
        print(f'{row["then_us"]:9.1f} -> {row["now_us"]:9.1f} us/step  {row["kernel"][:90]}')
PY
exit $status
