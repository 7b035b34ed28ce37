#!/usr/bin/env bash
# The CUDA kernels' compile gate, on any machine (no GPU, no driver, no CUDA install):
# installs the pinned NVRTC wheel into a cache, compiles every kernel of runtime/kernels/ through
# the runtime's own NVRTC path for sm_75 (T4), sm_80 (A100), sm_90 (H100, H200) and sm_100
# (B200, GB200), reads the registers and spills of each kernel from the report of the assembler
# NVRTC runs for the CUBIN, and fails on a compile error or a register spill (docs/cuda.md, "How
# the kernels are proven").
#
#   scripts/check-kernels.sh            # uses target/release/recipe, building it if missing
#   RECIPE_BIN=path/to/recipe scripts/check-kernels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# CUDA 13.0.x: the NVRTC must not be newer than the drivers the PTX meets (580 = 13.0).
NVRTC=nvidia-cuda-nvrtc==13.0.88
CACHE="${RECIPE_CUDA_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/recipe/cuda-13.0.88}"
CU13="$CACHE/nvidia/cu13"

if [ ! -e "$CU13/lib/libnvrtc.so.13" ]; then
    echo "check-kernels: installing $NVRTC into $CACHE" >&2
    rm -rf "$CACHE.partial"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$CACHE.partial" "$NVRTC"
    rm -rf "$CACHE"
    mv "$CACHE.partial" "$CACHE"
fi

BIN="${RECIPE_BIN:-target/release/recipe}"
if [ ! -x "$BIN" ]; then
    cargo build --release --bin recipe
fi
# libnvrtc loads libnvrtc-builtins by bare name, so the folder goes on the library path.
export LD_LIBRARY_PATH="$CU13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# sm_100 is compiled as the program `RECIPE_PDL=early` makes (each kernel's wait followed by
# griddepcontrol.launch_dependents; docs/cuda.md, "Programmatic dependent launch"): the same
# kernels plus one instruction each, so one compile proves both, and its PTX must hold as many
# signals as waits. (Its text is the same for any architecture from sm_90 on: `GRID_WAIT` is
# guarded by __CUDA_ARCH__ >= 900.) Compiled beside the others (each architecture is a thread of
# `recipe kernels`), its report printed after theirs.
EARLY="$(mktemp -d)"
trap 'rm -rf "$EARLY"' EXIT
RECIPE_PDL=early "$BIN" kernels --arch sm_100 --out "$EARLY" \
    > "$EARLY/report.txt" 2>&1 &
early=$!
status=0
"$BIN" kernels --arch sm_75 --arch sm_80 --arch sm_90 || status=$?
wait "$early" || status=$?
cat "$EARLY/report.txt"
[ "$status" -eq 0 ] || exit "$status"
waits="$(grep -c 'griddepcontrol.wait;' "$EARLY/kernels.sm_100.ptx" || true)"
signals="$(grep -c 'griddepcontrol.launch_dependents;' "$EARLY/kernels.sm_100.ptx" || true)"
echo "RECIPE_PDL=early, sm_100: $waits waits, $signals launch_dependents"
if [ "$waits" -eq 0 ] || [ "$waits" != "$signals" ]; then
    echo "error: the early program's PTX has $waits waits and $signals launch_dependents" >&2
    exit 1
fi
