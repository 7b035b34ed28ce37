#!/usr/bin/env bash
# Conformance run: recipe's artefacts and predictions against the real transformers /
# accelerate / DeepSpeed (CPU only, nothing launched). See conformance/README.md.
#
#   conformance/run.sh            # everything: setup, build, corpus, cases, harness, summary
#   RECIPE=/path/to/recipe conformance/run.sh    # use this binary instead of building one
#   SKIP_SETUP=1 conformance/run.sh              # the venv is already there
#   CONFORMANCE_VENV=/path/to/.venv conformance/run.sh # another venv (default conformance/.venv)
# The old-release overlays (conformance/setup.sh overlays) are optional: without them the cases
# that need them are recorded as skipped and listed at the end.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"

if [ -z "${SKIP_SETUP:-}" ]; then
  bash "$HERE/setup.sh"
fi
PY="${CONFORMANCE_VENV:-$HERE/.venv}/bin/python"

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
python3 "$HERE/gen_legacy.py" --recipe "$RECIPE"
python3 "$HERE/make_cases.py" --recipe "$RECIPE" --out "$HERE/build"

rm -rf "$HERE/fixtures/corpus" "$HERE/fixtures/rejected" "$HERE/fixtures/legacy" \
  "$HERE/fixtures/legacy-run" "$HERE/fixtures/launcher" "$HERE/fixtures/examples"
mkdir -p "$HERE/fixtures"
echo "run: harness on the corpus"
"$PY" "$HERE/harness.py" "$HERE/build/cases" "$HERE/fixtures/corpus" --json-summary
echo "run: harness on the example recipes (recipes/*.rcp for this stack; legacy_seed.rcp is skipped: its own stack)"
mkdir -p "$HERE/build/no-rejected"
python3 "$HERE/make_cases.py" --recipe "$RECIPE" --corpus "$REPO/recipes" \
  --rejected "$HERE/build/no-rejected" --out "$HERE/build/examples" \
  --stack transformers=5.25.0,accelerate=1.16.0,deepspeed=0.19.8
"$PY" "$HERE/harness.py" "$HERE/build/examples/cases" "$HERE/fixtures/examples" --json-summary
echo "run: harness on the rejected corpus"
"$PY" "$HERE/harness.py" "$HERE/build/rejected" "$HERE/fixtures/rejected" --json-summary
echo "run: DeepSpeed's launcher on the hostfile corpus (launcher.py)"
mkdir -p "$HERE/fixtures/launcher"
"$PY" "$HERE/launcher.py" "$HERE/fixtures/launcher/hostfiles.json"
echo "run: row counts of tricky data files, HF datasets against recipe (data_rows.py)"
"$PY" "$HERE/data_rows.py" --recipe "$RECIPE"
echo "run: what the real Trainer builds for owner = hf (hf_optimizers.py)"
"$PY" "$HERE/hf_optimizers.py" --recipe "$RECIPE"
echo "run: the seed article's old stacks (legacy.py, legacy_run.py)"
"$PY" "$HERE/legacy.py" --recipe "$RECIPE"
python3 "$HERE/summary.py" "$HERE/fixtures" --json "$HERE/fixtures/summary.json" | tee "$HERE/build/summary.txt"
# Cases that need an old release (overlays.txt) are recorded as skipped without the overlays.
if grep -l '"reproduced": "skipped' "$HERE/fixtures/rejected/"*.json >/dev/null 2>&1 \
   || grep -l '"skipped"' "$HERE/fixtures/legacy/"*.json "$HERE/fixtures/legacy-run/"*.json >/dev/null 2>&1; then
  echo "run: SKIPPED (overlays not installed; conformance/setup.sh overlays):"
  grep -l '"reproduced": "skipped\|"skipped"' "$HERE/fixtures/rejected/"*.json "$HERE/fixtures/legacy/"*.json \
    "$HERE/fixtures/legacy-run/"*.json \
    | sed 's/^/run:   /'
fi
echo "run: fixtures $(du -sh "$HERE/fixtures" | cut -f1) in $HERE/fixtures"
