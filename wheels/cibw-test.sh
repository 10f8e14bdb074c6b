#!/usr/bin/env bash
# cibuildwheel's test-command (wheels/kernels/pyproject.toml): run the install and wheel tests
# against the kernels wheel cibuildwheel just built, next to a runtime wheel + sdist built from the
# same checkout, exactly as ./tests/run.sh does with ./wheels/build.sh's output.
#   bash wheels/cibw-test.sh <project dir> <built kernels wheel>
set -euo pipefail
PROJECT=$1
WHEEL=$2
DIST=$PROJECT/wheels/dist     # tests/conftest.py reads this folder (a copy of the checkout in CI)
mkdir -p "$DIST"
rm -f "$DIST"/subblock_sage_kernels_cu13-*.whl
cp "$WHEEL" "$DIST"/
if ! ls "$DIST"/subblock_sage-*-py3-none-any.whl >/dev/null 2>&1; then
  python -m build --no-isolation --wheel --sdist --outdir "$DIST" "$PROJECT"
fi
export SBS_HOST_ARCHES
SBS_HOST_ARCHES=$(uname -m)
cd "$PROJECT"
python -m pytest -q -p no:cacheprovider -m "not aot" \
  tests/packaging/test_wheels.py tests/packaging/test_install.py tests/packaging/test_metadata.py
