#!/usr/bin/env bash
# Install what the tests need and run them (works on a fresh machine, no GPU needed):
#   1. ./wheels/build.sh builds every wheel (and its own build env) into wheels/dist/;
#   2. build-time tests (-m aot) run in that build env (they need CuTe-DSL);
#   3. runtime, packaging and GPU tests run in a fresh test env (.testenv) that installs
#      "subblock-sage[cu130]" from wheels/dist/ only, like a user, with the torch every SGLang
#      0.5.23 user has (tests/requirements.txt: 2.14.1, TORCH_TESTED), made while step 2 runs.
#      GPU tests skip without a GPU;
#   4. with --torch-min (first argument; .ci/run passes it): the CPU tests again with the oldest
#      supported torch (tests/requirements-torch-min.txt, TORCH_MIN), in a venv kept outside the
#      checkout. Off by default: a first run then installs one torch, not two (the second: 102 s,
#      and 56 s of tests; MEASUREMENTS.md, 2026-12-07).
# Other arguments go to every pytest run (e.g. ./tests/run.sh -x -k loader). Every suite runs on
# all cores (pytest-xdist; SBS_TEST_JOBS: the worker count, default "auto", 0 = in-process): on
# the 2-core build machine the test-env suite takes 277 s instead of 527 s and the build-time one
# 103 s instead of 226 s (MEASUREMENTS.md, 2026-12-07).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=(-n "${SBS_TEST_JOBS:-auto}")
TORCH_MIN=0
if [ "${1:-}" = "--torch-min" ]; then
  TORCH_MIN=1
  shift
fi

if [ -z "${SBS_SKIP_BUILD:-}" ]; then
  ./wheels/build.sh
fi
BENV=${SBS_BUILD_ENV:-$ROOT/wheels/.buildenv}
TENV=${SBS_TEST_ENV:-$ROOT/.testenv}
SGSITE=${SBS_SGLANG_SITE:-$ROOT/.carry/sglang-test-site}

# The test env and the SGLang test site, made while the build-time tests run: their downloads and
# unpacking overlap the tests (on a fresh 2-core machine ~100 s of installs, 76 s of tests).
prepare_test_env() {
  if [ ! -x "$TENV/bin/python" ]; then
    python3 -m venv "$TENV"
    "$TENV/bin/python" -m pip install -q --upgrade pip
  fi
  "$TENV/bin/python" -m pip install -q -r tests/requirements.txt
  # The user's install: from the freshly built wheels only, same version for both dists.
  "$TENV/bin/python" -m pip install -q --force-reinstall --no-deps --no-index --find-links wheels/dist \
    subblock-sage subblock-sage-kernels-cu13
  "$TENV/bin/python" -m pip check >/dev/null
  # SGLang 0.5.23 for the plugin tests (tests/sglang, marker `sglang`): without its dependency
  # tree, into a folder of its own (not the test env: its unmet requirements would fail `pip
  # check`). Reinstalled only when tests/requirements-sglang.txt changes.
  local stamp="$SGSITE/.requirements-sglang.txt" t0
  if ! cmp -s tests/requirements-sglang.txt "$stamp"; then
    echo "==> SGLang 0.5.23 test site ($SGSITE)"
    t0=$(date +%s)
    rm -rf "$SGSITE"
    "$TENV/bin/python" -m pip install -q --no-deps --target "$SGSITE" -r tests/requirements-sglang.txt
    cp tests/requirements-sglang.txt "$stamp"
    echo "    installed in $(( $(date +%s) - t0 )) s"
  fi
}
ENV_LOG=$(mktemp)
prepare_test_env > "$ENV_LOG" 2>&1 &
ENV_PID=$!
trap 'kill "$ENV_PID" 2>/dev/null || true; rm -f "$ENV_LOG"' EXIT

"$BENV/bin/python" -m pip install -q -r tests/requirements-aot.txt
echo "==> build-time tests (build env)"
# the test library's SGLang packages (./wheels/build.sh with SBS_TEST_LIBS=ON); their tests skip without
export SBS_SGLANG_BUILD_SITE=${SBS_SGLANG_BUILD_SITE:-$ROOT/.carry/sglang-build}
"$BENV/bin/python" -m pytest "${JOBS[@]}" -m aot tests "$@"

echo "==> test env ($TENV)"
if ! wait "$ENV_PID"; then
  cat "$ENV_LOG" >&2
  echo "error: making the test env failed (its output above). Fix: see the failing pip command's message" >&2
  exit 1
fi
cat "$ENV_LOG"
export SBS_SGLANG_SITE="$SGSITE"

echo "==> lint (pyflakes rules: undefined names, unused imports/variables)"
"$TENV/bin/ruff" check --no-cache python aot tests benchmark

echo "==> runtime, packaging and GPU tests (test env)"
"$TENV/bin/python" -m pytest "${JOBS[@]}" -m "not aot" tests "$@"

# The low end of the supported torch range (subblock_sage.torch_support.TORCH_MIN; the tests' own
# torch above is the high end, TORCH_TESTED): the CPU suite in a venv of its own. PyPI's x86_64
# torch is a CUDA build (about 5 GB installed), so the venv lives outside the checkout, one per
# pin, and is made once per machine.
if [ "$TORCH_MIN" = 1 ]; then
  PIN=$(grep -E '^torch==' tests/requirements-torch-min.txt)
  MENV=${SBS_TORCH_MIN_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/subblock-sage/torch-min/${PIN#torch==}}
  if ! cmp -s tests/requirements-torch-min.txt "$MENV/.requirements-torch-min.txt" \
      || ! cmp -s tests/requirements.txt "$MENV/.requirements.txt"; then
    echo "==> test env with $PIN ($MENV)"
    t0=$(date +%s)
    rm -rf "$MENV"
    python3 -m venv "$MENV"
    # every test requirement at its pin, torch at the low end's
    grep -v '^torch==' tests/requirements.txt > "$MENV/.requirements-rest.txt"
    "$MENV/bin/python" -m pip install -q -r "$MENV/.requirements-rest.txt" -r tests/requirements-torch-min.txt
    cp tests/requirements-torch-min.txt "$MENV/.requirements-torch-min.txt"
    cp tests/requirements.txt "$MENV/.requirements.txt"
    echo "    installed in $(( $(date +%s) - t0 )) s"
  fi
  "$MENV/bin/python" -m pip install -q --force-reinstall --no-deps --no-index --find-links wheels/dist \
    subblock-sage subblock-sage-kernels-cu13
  echo "==> CPU tests with the oldest supported torch ($("$MENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
  "$MENV/bin/python" -m pytest "${JOBS[@]}" -m "not aot" tests/cpu "$@"
fi
