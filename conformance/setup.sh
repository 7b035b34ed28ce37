#!/usr/bin/env bash
# Creates conformance/.venv with the pinned library stack the harness runs against.
# Idempotent: a venv that already has exactly these versions is left alone.
# Everything runs on CPU; torch from PyPI is the default (CUDA) build, ~5.7 GB, that is expected.
#
#   conformance/setup.sh            # the venv
#   conformance/setup.sh overlays   # the venv, then the optional old-release overlays
#                                   # (overlays.txt → .overlays/<name>) and DeepSpeed's CPU ops
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
PY="${PYTHON:-python3.11}"
STEP="${1:-venv}"

overlays() {
  # Each line of overlays.txt: <name> <pkg==version> ... — installed with --no-deps into
  # .overlays/<name> (never torch). A directory whose pins are already installed is kept.
  local O="$HERE/.overlays"
  mkdir -p "$O"
  grep -v '^\s*#' "$HERE/overlays.txt" | while read -r name pins; do
    [ -n "$name" ] || continue
    if [ -f "$O/$name/.pins" ] && [ "$(cat "$O/$name/.pins")" = "$pins" ]; then
      echo "setup: overlay $name already has $pins"
      continue
    fi
    rm -rf "${O:?}/$name"
    # DeepSpeed releases are sdists whose setup.py imports torch (from the venv) and DeepSpeed
    # itself: no build isolation, no ops compiled, and the overlay's other pins (pydantic 1.x
    # for DeepSpeed 0.7–0.9) installed first and on PYTHONPATH while it builds.
    local others ds
    others="$(tr ' ' '\n' <<< "$pins" | grep -v '^deepspeed==' | tr '\n' ' ' || true)"
    ds="$(tr ' ' '\n' <<< "$pins" | grep '^deepspeed==' || true)"
    # shellcheck disable=SC2086 — one word per pin
    if [ -n "${others// /}" ]; then
      "$VENV/bin/python" -m pip --disable-pip-version-check \
        install -q --no-deps --no-build-isolation --target "$O/$name" $others
    fi
    if [ -n "$ds" ]; then
      PYTHONPATH="$O/$name" DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 "$VENV/bin/python" -m pip \
        --disable-pip-version-check install -q --no-deps --no-build-isolation \
        --target "$O/$name" --upgrade $ds
    fi
    echo "$pins" > "$O/$name/.pins"
    echo "setup: overlay $name: $pins"
  done
  # train_run.py trains through DeepSpeed on CPU: the shm communicator and the CPU FusedAdam are
  # JIT-compiled (ninja from the venv, g++) once, here, rather than in the first run (~5 min).
  PATH="$VENV/bin:$PATH" TORCH_EXTENSIONS_DIR="$O/torch_extensions" DS_ACCELERATOR=cpu \
    "$VENV/bin/python" - <<'PY'
from deepspeed.accelerator import get_accelerator
for op in ("ShareMemCommBuilder", "FusedAdamBuilder"):
    get_accelerator().create_op_builder(op).load(verbose=False)
    print(f"setup: DeepSpeed CPU op {op} built")
PY
}

TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.25.0
ACCELERATE_VERSION=1.16.0
DEEPSPEED_VERSION=0.19.8     # newest 0.19.x on PyPI when this was written
DATASETS_VERSION=5.2.0       # the training script's loaders, for data_rows.py's row counts

want="torch==$TORCH_VERSION transformers==$TRANSFORMERS_VERSION accelerate==$ACCELERATE_VERSION deepspeed==$DEEPSPEED_VERSION datasets==$DATASETS_VERSION"

if [ -x "$VENV/bin/python" ]; then
  have="$("$VENV/bin/python" - <<'PY' 2>/dev/null || true
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("torch", "transformers", "accelerate", "deepspeed", "datasets")))
PY
)"
  if [ "$have" = "$want" ]; then
    echo "setup: $VENV already has $want"
    [ "$STEP" = overlays ] && overlays
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
"${PIP[@]}" install "${CONSTRAINTS[@]}" "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION" \
  "datasets==$DATASETS_VERSION"
# DeepSpeed is an sdist: build it with no ops (no CUDA compile, no nvcc needed).
DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 "${PIP[@]}" install "${CONSTRAINTS[@]}" --no-build-isolation \
  "deepspeed==$DEEPSPEED_VERSION"

if [ ! -f "$HERE/constraints.txt" ]; then
  "${PIP[@]}" freeze --exclude-editable | grep -v '^pip==\|^setuptools==\|^wheel==' > "$HERE/constraints.txt"
  echo "setup: wrote $HERE/constraints.txt"
fi
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
for p in ("torch", "transformers", "accelerate", "deepspeed", "datasets", "numpy", "pydantic"):
    print(f"setup: {p}=={version(p)}")
PY
[ "$STEP" = overlays ] && overlays
exit 0
