#!/usr/bin/env bash
# The emulated kernels' tests (runtime/emu/tests) with the kernels built with AddressSanitizer
# (RECIPE_EMU_SANITIZE=address, runtime/emu/build.rs): a kernel that reads or writes outside a
# buffer, its shared memory or its stack, in any test, through the runtime's own launch code and
# buffer sizes, fails the run with ASan's report — on a GPU the read would return a neighbour's
# bytes (or stop at an illegal address) and the write corrupt a neighbour silently.
# runtime/emu/tests/asan.rs shows the check live (a read past a row, reported); it, tsan.rs and
# fibers.rs build C++ programs of their own (the `programs` test binary) and are left out: this
# runs the `kernels` binary (runtime/emu/tests/kernels.rs).
#
#   scripts/emu-asan.sh          # about 2 minutes on 2 cores; run by .ci/run
#
# The test binaries run with the compiler's libasan preloaded (cargo's runner for the host
# target), so that ASan also allocates the Rust side's buffers, with redzones around them.
# Built in the usual target folder: the next ordinary build compiles the emulator again.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX="${CXX:-g++}"
ASAN_LIB="$("$CXX" -print-file-name=libasan.so)"
if [ ! -f "$ASAN_LIB" ]; then
    echo "emu-asan: $CXX has no libasan.so (install its AddressSanitizer runtime)" >&2
    exit 1
fi
HOST="$(rustc -vV | sed -n 's/^host: //p')"
RUNNER="CARGO_TARGET_$(echo "$HOST" | tr 'a-z-' 'A-Z_')_RUNNER"
export RECIPE_EMU_SANITIZE=address
export "$RUNNER=env LD_PRELOAD=$ASAN_LIB ASAN_OPTIONS=detect_leaks=0:halt_on_error=1"
# The root package is selected too (its test binary has another name), so that the
# dependencies' features resolve as in the workspace's `cargo test --release`, whose build this
# one reuses; the emulator's package alone resolves a few otherwise (dev-dependencies turn them
# on) and compiled the runtime and its dependencies again, about 40 s of CI.
cargo test --release -p recipe-kernel-emu -p recipe --test kernels
