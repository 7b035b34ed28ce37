#!/usr/bin/env bash
# Creates conformance/.venv with the pinned library stack the harness runs against.
# Idempotent: a venv that already has exactly these versions is left alone.
# Everything runs on CPU; torch from PyPI is the default (CUDA) build, ~5.7 GB, that is expected.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
PY="${PYTHON:-python3.11}"

TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.24.0
ACCELERATE_VERSION=1.15.0
DEEPSPEED_VERSION=0.19.8     # newest 0.19.x on PyPI when this was written

want="torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION accelerate==$ACCELERATE_VERSION deepspeed==$DEEPSPEED_VERSION"

if [ -x "$VENV/bin/python" ]; then
  have="$("$VENV/bin/python" - <<'PY' 2>/dev/null || true
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("torch", "transformers", "accelerate", "deepspeed")))
PY
)"
  if [ "$have" = "$want" ]; then
    echo "setup: $VENV already has $want"
    exit 0
  fi
  echo "setup: venv has '${have:-nothing}', want '$want'; (re)installing"
else
  "$PY" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
CONSTRAINTS=()
# constraints.txt (committed) pins the transitive dependencies resolved on the first install.
[ -f "$HERE/constraints.txt" ] && CONSTRAINTS=(-c "$HERE/constraints.txt")

"${PIP[@]}" install -q --upgrade pip setuptools wheel
# torch first: deepspeed's setup.py imports it (hence --no-build-isolation below).
"${PIP[@]}" install "${CONSTRAINTS[@]}" "torch==$TORCH_VERSION" numpy
"${PIP[@]}" install "${CONSTRAINTS[@]}" "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION"
# DeepSpeed is an sdist: build it with no ops (no CUDA compile, no nvcc needed).
DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 "${PIP[@]}" install "${CONSTRAINTS[@]}" --no-build-isolation \
  "deepspeed==$DEEPSPEED_VERSION"

if [ ! -f "$HERE/constraints.txt" ]; then
  "${PIP[@]}" freeze --exclude-editable | grep -v '^pip==\|^setuptools==\|^wheel==' > "$HERE/constraints.txt"
  echo "setup: wrote $HERE/constraints.txt"
fi
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
for p in ("torch", "transformers", "accelerate", "deepspeed", "numpy", "pydantic"):
    print(f"setup: {p}=={version(p)}")
PY
