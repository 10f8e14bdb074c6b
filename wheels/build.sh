#!/usr/bin/env bash
# Build every wheel into wheels/dist/: the runtime (py3-none-any + sdist, hatchling) and one kernels
# wheel (py3-none-manylinux_2_28_<arch>, scikit-build-core from wheels/kernels/pyproject.toml) per
# host CPU, on a machine with no GPU and no CUDA toolkit. The release runs the same backend through
# cibuildwheel (wheels/kernels/pyproject.toml [tool.cibuildwheel]).
#   ./wheels/build.sh                          # this machine's CPU's kernels wheel, runtime wheel, sdist
#   SBS_HOST_ARCHES="x86_64 aarch64" ./wheels/build.sh   # both host CPUs (what CI and the release build)
# Creates its own build environment (wheels/.buildenv) from PyPI on first use; the static
# cudart of a non-native host CPU comes from that CPU's PyPI wheel (python -m aot.cross_libs).
#
# Environment:
#   SBS_HOST_ARCHES   host CPUs of the kernel libraries (default: this machine's, `uname -m`; a
#                     second one repeats every device compile: 114 s -> ~195 s+ fresh on 2 cores,
#                     MEASUREMENTS.md 2026-12-07 "the loop"; .ci/run builds both)
#   SBS_BUILD_ENV     build environment to use/create (default wheels/.buildenv)
#   SBS_DIST          output directory (default wheels/dist)
#   SBS_WORK          scratch directory for the CMake build trees (default wheels/)
#   SBS_TARGETS       comma-separated subset of GPU targets (e.g. sm_90a) for a quick build
#   SBS_TEST_LIBS     ON: also build the test-only libraries into $SBS_WORK/test-libs/<arch>
#   SBS_SGLANG_BUILD_SITE  folder of the test library's pinned SGLang packages (default
#                     .carry/sglang-build; wheels/test-build-requirements.txt, SBS_TEST_LIBS=ON only)
#   SBS_CUDNN_BUILD_SITE   folder of the pinned cuDNN frontend wheel (default .carry/cudnn-build;
#                     wheels/test-build-requirements-cudnn.txt: the sm_100a/sm_100f Sage kernels)
#   SBS_SUMMARY       0: skip the summary table
#   SBS_KERNELS_SDIST 1: also write the kernels sdist (not published: it builds only where the
#                     DSL toolchain runs; tests/packaging/test_kernels_sdist.py builds from it)
#   SBS_EXPORT_JOBS   parallel export processes (default: the CPU count)
#   SBS_EXPORT_CACHE  export cache folder, or "off" (default ~/.cache/subblock-sage/exports; aot/export_cache.py)
#   SOURCE_DATE_EPOCH every timestamp (default: the commit date of HEAD) -> byte-identical output
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ENV=${SBS_BUILD_ENV:-$ROOT/wheels/.buildenv}
PY=$ENV/bin/python
DIST=${SBS_DIST:-$ROOT/wheels/dist}
WORK=${SBS_WORK:-$ROOT/wheels}
ARCHES=${SBS_HOST_ARCHES:-$(uname -m)}

if [ ! -x "$PY" ] || ! cmp -s wheels/build-requirements.txt "$ENV/.requirements" 2>/dev/null; then
  echo "==> creating build environment $ENV (from PyPI)"
  python3 -m venv "$ENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r wheels/build-requirements.txt
  "$PY" -m pip install -q --no-deps -r wheels/upstream-requirements.txt
  cp wheels/build-requirements.txt "$ENV/.requirements"
fi

# Reproducible: every timestamp comes from the commit being built, nothing depends on the
# checkout's path (the compiler maps the build dir away; the linker's build-id is a content hash).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
export PYTHONHASHSEED=0
export TZ=UTC LC_ALL=C.UTF-8
umask 022
mkdir -p "$DIST"
# every host CPU of this build: an export compiled for the first also compiles for the others in
# the same process and leaves them in the export cache (one DSL import instead of two)
export SBS_EXPORT_HOSTS="$ARCHES"

# The test library also compiles SGLang's own SM90 kernel (a bench contender): its pinned packages
# go into a folder of their own (never the build env), which only that export reads.
if [ "${SBS_TEST_LIBS:-OFF}" = "ON" ]; then
  export SBS_SGLANG_BUILD_SITE=${SBS_SGLANG_BUILD_SITE:-$ROOT/.carry/sglang-build}
  if ! cmp -s wheels/test-build-requirements.txt "$SBS_SGLANG_BUILD_SITE/.test-build-requirements.txt"; then
    echo "==> SGLang packages of the test library ($SBS_SGLANG_BUILD_SITE)"
    rm -rf "$SBS_SGLANG_BUILD_SITE"
    "$PY" -m pip install -q --no-deps --require-hashes --target "$SBS_SGLANG_BUILD_SITE" \
      -r wheels/test-build-requirements.txt
    cp wheels/test-build-requirements.txt "$SBS_SGLANG_BUILD_SITE/.test-build-requirements.txt"
  fi
fi
# cuDNN frontend's block-sparse kernels (the sm_100a/sm_100f Sage kernels, the test library's SM90
# contenders), from its pinned wheel in a folder of its own (aot/upstream/cudnn_import.py)
export SBS_CUDNN_BUILD_SITE=${SBS_CUDNN_BUILD_SITE:-$ROOT/.carry/cudnn-build}
if ! cmp -s wheels/test-build-requirements-cudnn.txt "$SBS_CUDNN_BUILD_SITE/.test-build-requirements-cudnn.txt"; then
  echo "==> cuDNN frontend wheel ($SBS_CUDNN_BUILD_SITE)"
  rm -rf "$SBS_CUDNN_BUILD_SITE"
  "$PY" -m pip install -q --no-deps --require-hashes --target "$SBS_CUDNN_BUILD_SITE" \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --only-binary=:all: \
    -r wheels/test-build-requirements-cudnn.txt
  cp wheels/test-build-requirements-cudnn.txt "$SBS_CUDNN_BUILD_SITE/.test-build-requirements-cudnn.txt"
fi

for ARCH in $ARCHES; do
  case "$ARCH" in x86_64|aarch64) ;; *) echo "unsupported host arch $ARCH (x86_64, aarch64)" >&2; exit 2;; esac
  BUILD=$WORK/.cmake/$ARCH
  echo "==> kernels wheel for $ARCH: scikit-build-core -> CMake (AOT export + link; build dir $BUILD)"
  # wheels/kernels/pyproject.toml: SBS_HOST_ARCH picks the CPU (a non-native one is a cross build:
  # CMake fetches that CPU's libcudart_static.a, aot/cross_libs.py) and the wheel's platform tag.
  # No isolation: the build env above is the pinned toolchain (flashinfer-python without its deps).
  rm -f "$DIST"/subblock_sage_kernels_cu13-*-manylinux_*_"$ARCH".whl
  SBS_HOST_ARCH=$ARCH SBS_TEST_LIBS=${SBS_TEST_LIBS:-OFF} \
    "$PY" -m build --no-isolation --skip-dependency-check --wheel --outdir "$DIST" \
    -Cbuild-dir="$BUILD" wheels/kernels | grep -v '^\*\*\* \|^-- \|^loading initial cache' || true
  ls "$DIST"/subblock_sage_kernels_cu13-*-py3-none-manylinux_2_28_"$ARCH".whl >/dev/null
  if [ "${SBS_TEST_LIBS:-OFF}" = "ON" ]; then
    "$PY" -m cmake --install "$BUILD" --prefix "$WORK/test-libs/$ARCH" --component test >/dev/null
  fi
done

echo "==> runtime wheel and sdist"
rm -f "$DIST"/subblock_sage-*-py3-none-any.whl "$DIST"/subblock_sage-*.tar.gz
"$PY" -m build --no-isolation --wheel --sdist --outdir "$DIST" . >/dev/null
if [ "${SBS_KERNELS_SDIST:-0}" = 1 ]; then
  rm -f "$DIST"/subblock_sage_kernels_cu13-*.tar.gz
  "$PY" -m build --no-isolation --skip-dependency-check --sdist --outdir "$DIST" wheels/kernels >/dev/null
fi

if [ "${SBS_SUMMARY:-1}" != 0 ]; then
  "$PY" -m aot.summary "$DIST"
fi
