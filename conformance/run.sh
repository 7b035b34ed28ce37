#!/usr/bin/env bash
# Conformance run: recipe's artefacts and predictions against the real transformers /
# accelerate / DeepSpeed (CPU only, nothing launched). See conformance/README.md.
#
#   conformance/run.sh            # everything: setup, build, corpus, cases, harness, summary
#   RECIPE=/path/to/recipe conformance/run.sh    # use this binary instead of building one
#   SKIP_SETUP=1 conformance/run.sh              # the venv is already there
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"

if [ -z "${SKIP_SETUP:-}" ]; then
  bash "$HERE/setup.sh"
fi
PY="$HERE/.venv/bin/python"

if [ -z "${RECIPE:-}" ]; then
  if [ -x target/release/recipe ] && [ -n "${USE_EXISTING:-}" ]; then
    RECIPE="$REPO/target/release/recipe"
  else
    cargo build --release --quiet
    RECIPE="$REPO/target/release/recipe"
  fi
fi
echo "run: recipe binary $RECIPE ($("$RECIPE" --version))"

python3 "$HERE/gen_corpus.py" --recipe "$RECIPE"
python3 "$HERE/make_cases.py" --recipe "$RECIPE" --out "$HERE/build"

rm -rf "$HERE/fixtures/corpus" "$HERE/fixtures/rejected"
mkdir -p "$HERE/fixtures"
echo "run: harness on the corpus"
"$PY" "$HERE/harness.py" "$HERE/build/cases" "$HERE/fixtures/corpus" --json-summary
echo "run: harness on the rejected corpus"
"$PY" "$HERE/harness.py" "$HERE/build/rejected" "$HERE/fixtures/rejected" --json-summary
python3 "$HERE/summary.py" "$HERE/fixtures" --json "$HERE/fixtures/summary.json" | tee "$HERE/build/summary.txt"
echo "run: fixtures $(du -sh "$HERE/fixtures" | cut -f1) in $HERE/fixtures"
