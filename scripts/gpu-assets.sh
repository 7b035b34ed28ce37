#!/usr/bin/env bash
# Packs gpu-assets/ (git-ignored) for a GPU machine that has no network and no Rust: the release
# binary and all-MiniLM-L6-v2 with its weights stored in fp16, both xz-compressed, so that
# scripts/gpu-check.sh can run everything, the main job (recipes/spam.rcp) on CUDA included.
# The device tool carries at most 64 MiB with the tracked tree (19 MB): the weights in fp16 are
# 45 MB (40.9 compressed) instead of 90, the binary 4 MB instead of 16.5. gpu-check.sh unpacks
# them there. The runtime reads F16 safetensors as f32 (runtime/src/checkpoint.rs); the initial
# weights are MiniLM's rounded to fp16, on the CPU reference as on the GPU. Then:
#   cargo build --release && PYTHON=<python with numpy, safetensors> scripts/gpu-assets.sh
#   run(command="scripts/gpu-check.sh", carry=["gpu-assets"])
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
BIN="${RECIPE_BIN:-target/release/recipe}"
if [ ! -x "$BIN" ]; then
    echo "gpu-assets: build the binary first (cargo build --release)" >&2
    exit 2
fi
scripts/fetch-minilm.sh
CACHE=${RECIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recipe}
SRC="$CACHE/models/sentence-transformers--all-MiniLM-L6-v2"
DEST=gpu-assets
rm -rf "$DEST.partial"
mkdir -p "$DEST.partial/minilm"
# MiniLM packed before is kept (its compression takes most of a minute); the binary is repacked.
if [ -f "$DEST/minilm/model.safetensors.xz" ] && [ -f "$DEST/minilm/tokenizer.json.xz" ]; then
    cp "$DEST/minilm/"*.xz "$DEST.partial/minilm/"
fi
cp "$SRC/config.json" "$DEST.partial/minilm/"
"$PY" - "$SRC" "$DEST.partial" "$BIN" <<'PY'
import lzma, os, sys
import numpy as np
from safetensors.numpy import load_file, save
src, dest, binary = sys.argv[1:]
def half():
    t = load_file(f"{src}/model.safetensors")
    return save({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in t.items()})
def xz(data, path):
    with lzma.open(path, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(data)
if not os.path.exists(f"{dest}/minilm/model.safetensors.xz"):
    xz(half(), f"{dest}/minilm/model.safetensors.xz")
    xz(open(f"{src}/tokenizer.json", "rb").read(), f"{dest}/minilm/tokenizer.json.xz")
xz(open(binary, "rb").read(), f"{dest}/recipe.xz")
PY
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
du -ab "$DEST"
