#!/usr/bin/env bash
# Install what the tests need and run them (works on a fresh machine, no GPU needed):
#   1. ./wheels/build.sh builds every wheel (and its own build env) into wheels/dist/;
#   2. build-time tests (-m aot) run in that build env (they need CuTe-DSL);
#   3. runtime, packaging and GPU tests run in a fresh test env (.testenv) that installs
#      "subblock-sage[cu130]" from wheels/dist/ only, like a user. GPU tests skip without a GPU.
# Extra arguments go to both pytest runs (e.g. ./tests/run.sh -x -k loader).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ -z "${SBS_SKIP_BUILD:-}" ]; then
  ./wheels/build.sh
fi
BENV=${SBS_BUILD_ENV:-$ROOT/wheels/.buildenv}
"$BENV/bin/python" -m pip install -q -r tests/requirements-aot.txt

echo "==> build-time tests (build env)"
# the test library's SGLang packages (./wheels/build.sh with SBS_TEST_LIBS=ON); their tests skip without
export SBS_SGLANG_BUILD_SITE=${SBS_SGLANG_BUILD_SITE:-$ROOT/.carry/sglang-build}
"$BENV/bin/python" -m pytest -m aot tests "$@"

TENV=${SBS_TEST_ENV:-$ROOT/.testenv}
if [ ! -x "$TENV/bin/python" ]; then
  python3 -m venv "$TENV"
  "$TENV/bin/python" -m pip install -q --upgrade pip
fi
"$TENV/bin/python" -m pip install -q -r tests/requirements.txt
# The user's install: from the freshly built wheels only, same version for both dists.
"$TENV/bin/python" -m pip install -q --force-reinstall --no-deps --no-index --find-links wheels/dist \
  subblock-sage subblock-sage-kernels-cu13
"$TENV/bin/python" -m pip check >/dev/null

# SGLang 0.5.23 for the plugin tests (tests/sglang, marker `sglang`): without its dependency tree,
# into a folder of its own (not the test env: its unmet requirements would fail `pip check`).
# Reinstalled only when tests/requirements-sglang.txt changes.
SGSITE=${SBS_SGLANG_SITE:-$ROOT/.carry/sglang-test-site}
SGSTAMP="$SGSITE/.requirements-sglang.txt"
if ! cmp -s tests/requirements-sglang.txt "$SGSTAMP"; then
  echo "==> SGLang 0.5.23 test site ($SGSITE)"
  t0=$(date +%s)
  rm -rf "$SGSITE"
  "$TENV/bin/python" -m pip install -q --no-deps --target "$SGSITE" -r tests/requirements-sglang.txt
  cp tests/requirements-sglang.txt "$SGSTAMP"
  echo "    installed in $(( $(date +%s) - t0 )) s"
fi
export SBS_SGLANG_SITE="$SGSITE"

echo "==> lint (pyflakes rules: undefined names, unused imports/variables)"
"$TENV/bin/ruff" check --no-cache python aot tests benchmark

echo "==> runtime, packaging and GPU tests (test env)"
"$TENV/bin/python" -m pytest -m "not aot" tests "$@"
