#!/usr/bin/env bash
# Prepares gpu-assets/ (git-ignored) for a GPU machine that has no network: all-MiniLM-L6-v2 with
# its weights stored in fp16 (45 MB instead of 90: the device tool carries at most 64 MiB, the
# binary included), so that scripts/gpu-check.sh can run the main job (recipes/spam.rcp) on CUDA.
# The runtime reads F16 safetensors as f32 (runtime/src/checkpoint.rs); the initial weights are
# MiniLM's rounded to fp16, on the CPU reference as on the GPU. Then, with the device tool:
#   run(command="scripts/gpu-check.sh", carry=["target/release/recipe", "gpu-assets"])
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
scripts/fetch-minilm.sh
CACHE=${RECIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recipe}
SRC="$CACHE/models/sentence-transformers--all-MiniLM-L6-v2"
DEST=gpu-assets/minilm
mkdir -p "$DEST"
cp "$SRC/config.json" "$SRC/tokenizer.json" "$DEST/"
"$PY" - "$SRC/model.safetensors" "$DEST/model.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
src, dest = sys.argv[1], sys.argv[2]
t = load_file(src)
save_file({k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in t.items()},
          dest + ".tmp")
import os
os.replace(dest + ".tmp", dest)
PY
du -sh "$DEST"
