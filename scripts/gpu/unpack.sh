#!/usr/bin/env bash
# Unpacks what scripts/gpu-assets.sh packed (xz, to fit the device tool's 64 MiB) on the GPU
# machine, with that machine's python3: `unpack.sh BIN` writes the binary to BIN unless one is
# there; `unpack.sh BIN DIR` also writes MiniLM (config, tokenizer, fp16 weights) into DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
xz_to() {
    "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$1" "$2.tmp" && mv "$2.tmp" "$2"
}
if [ -f gpu-assets/recipe.xz ] && [ ! -x "$1" ]; then
    mkdir -p "$(dirname "$1")"
    xz_to gpu-assets/recipe.xz "$1"
    chmod +x "$1"
fi
if [ -n "${2:-}" ] && [ -f gpu-assets/minilm/model.safetensors.xz ]; then
    mkdir -p "$2"
    cp gpu-assets/minilm/config.json "$2/"
    for f in model.safetensors tokenizer.json; do
        xz_to "gpu-assets/minilm/$f.xz" "$2/$f"
    done
fi
