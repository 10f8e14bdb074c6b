#!/usr/bin/env bash
# Build every wheel into wheels/dist/: the runtime (py3-none-any + sdist) and the kernels wheel
# (py3-none-manylinux_2_28_<arch>), on a machine with no GPU and no CUDA toolkit.
#   ./wheels/build.sh                  # x86_64 kernels wheel + runtime wheel + sdist
#   SBS_HOST_ARCHES="x86_64 aarch64" ./wheels/build.sh
# Creates its own build environment (wheels/.buildenv) from PyPI on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENV=${SBS_BUILD_ENV:-$ROOT/wheels/.buildenv}
PY=$ENV/bin/python
DIST=$ROOT/wheels/dist

if [ ! -x "$PY" ] || ! cmp -s wheels/build-requirements.txt "$ENV/.requirements" 2>/dev/null; then
  echo "==> creating build environment $ENV (from PyPI)"
  python3 -m venv "$ENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r wheels/build-requirements.txt
  "$PY" -m pip install -q --no-deps -r wheels/upstream-requirements.txt
  cp wheels/build-requirements.txt "$ENV/.requirements"
fi

# Reproducible: every timestamp comes from the commit being built.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
export PYTHONHASHSEED=0
mkdir -p "$DIST"

for ARCH in ${SBS_HOST_ARCHES:-x86_64}; do
  BUILD=$ROOT/wheels/.cmake/$ARCH
  STAGE=$ROOT/wheels/stage/$ARCH
  echo "==> kernels for $ARCH: AOT export + link (build dir $BUILD)"
  EXTRA=()
  if [ "$ARCH" != "$(uname -m)" ]; then
    EXTRA+=("-DSBS_STATIC_LIB_DIRS=$("$PY" -m aot.cross_libs --arch "$ARCH")")
  fi
  "$PY" -m cmake -S . -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$ENV/bin/ninja" \
    -DSBS_PYTHON="$PY" -DSBS_HOST_ARCH="$ARCH" -DSBS_TEST_LIBS="${SBS_TEST_LIBS:-OFF}" "${EXTRA[@]}" >/dev/null
  "$PY" -m cmake --build "$BUILD"
  rm -rf "$STAGE"
  "$PY" -m cmake --install "$BUILD" --prefix "$STAGE" --component kernels >/dev/null
  if [ "${SBS_TEST_LIBS:-OFF}" = "ON" ]; then
    "$PY" -m cmake --install "$BUILD" --prefix "$ROOT/wheels/test-libs/$ARCH" --component test >/dev/null
  fi
  "$PY" -m aot.wheel --stage "$STAGE" --out "$DIST" --plat "manylinux_2_28_$ARCH" >/dev/null
done

echo "==> runtime wheel and sdist"
"$PY" -m build --no-isolation --wheel --sdist --outdir "$DIST" . >/dev/null

"$PY" -m aot.summary "$DIST"
