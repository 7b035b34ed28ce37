#!/usr/bin/env bash
# scripts/gpu-check.sh rehearsed without a GPU: the same script, on runtime/fake-cuda's
# CPU-emulated driver, NVRTC, cuBLAS, cuBLASLt and NCCL with two fake GPUs and asynchronous streams
# (docs/cuda.md, "How the kernels are proven", layer 4). It checks the script itself (every
# part's commands, JSON and bookkeeping) and the backend's host code, not a GPU's numbers or
# speed. The main job (MiniLM) is too slow for the emulation and PyTorch's throughput needs a
# GPU: both skipped unless SKIP says otherwise. Results in $OUT (default fake-gpu-check/).
set -euo pipefail
cd "$(dirname "$0")/.."
# The binary and the fake libraries as `cargo test --release` builds them (the fake is the root
# crate's dev-dependency, its library in target/release/deps/). `cargo build --release` and
# `cargo build -p recipe-fake-cuda` would each resolve the dependencies' features otherwise
# (dev-dependencies turn on a few: getrandom's `std`, aho-corasick's `default`), so after the
# tests each compiled the runtime and its dependencies again: about 3 of CI's 20 minutes.
cargo test --release --no-run --quiet -p recipe --test suite
FAKE="$(pwd)/target/release/deps/librecipe_fake_cuda.so"
LIBS="$(mktemp -d)"
trap 'rm -rf "$LIBS"' EXIT
for name in libcuda.so libcuda.so.1 libnvrtc.so libcublas.so libcublasLt.so libnccl.so libnccl.so.2; do
    ln -s "$FAKE" "$LIBS/$name"
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The fake NVRTC reports a real version: the kernel cache (runtime/src/backend/cuda/
# kernel_cache.rs) would hand its runs a real NVRTC's program, or a real run the fake's.
export RECIPE_KERNEL_CACHE=0
export RECIPE_FAKE_CUDA_GPUS=2 RECIPE_FAKE_CUDA_ASYNC="${RECIPE_FAKE_CUDA_ASYNC:-20}" CHECK_GPUS=2
export SKIP="${SKIP-spam throughput}" OUT="${OUT:-fake-gpu-check}" WORK="${WORK:-/tmp/fake-gpu-check-work}"
export PART_LIMIT="${PART_LIMIT:-300}" BUDGET="${BUDGET:-1200}"
exec scripts/gpu-check.sh
