# Sourced by the GPU scripts (scripts/gpu-check.sh, scripts/gpu-profile.sh) with PY set: puts
# PyTorch's CUDA 13 wheels on LD_LIBRARY_PATH under the names cudarc loads (docs/cuda.md,
# "Running on a GPU").
# NVRTC and cuBLAS from PyTorch's wheels (nvidia/cu13/lib), NCCL from its nvidia-nccl wheel.
SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# cudarc loads NCCL as libnccl.so, and the wheel ships libnccl.so.2 only: a link (docs/cuda.md).
LINKS="$(mktemp -d)"
if [ -f "$SP/nvidia/nccl/lib/libnccl.so.2" ]; then
    ln -s "$SP/nvidia/nccl/lib/libnccl.so.2" "$LINKS/libnccl.so"
fi
# cudarc tries each library's unversioned name before `.so.13`, and the wheels ship only the
# latter: without these links a CUDA 12 toolkit in the loader's cache (as in nvidia/cuda
# images) would be found first. selftest.txt's first line names the versions loaded.
for lib in cublas cublasLt nvrtc; do
    if [ -f "$SP/nvidia/cu13/lib/lib$lib.so.13" ]; then
        ln -s "$SP/nvidia/cu13/lib/lib$lib.so.13" "$LINKS/lib$lib.so"
    fi
done
export LD_LIBRARY_PATH="$SP/nvidia/cu13/lib:$LINKS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
