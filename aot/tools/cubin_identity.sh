#!/usr/bin/env bash
# Build the sm_90a library of REV (default: main) and of this working tree, then compare their
# kernels with `python -m aot.tools.cubin_identity` (exit 1 if any kernel changed).
#   aot/tools/cubin_identity.sh [REV]
# Environment:
#   SBS_BUILD_ENV        build environment (default wheels/.buildenv, as wheels/build.sh makes it)
#   SBS_CUBIN_WORK       scratch folder for the two source copies and builds (default /tmp/sbs-cubin-identity)
#   SBS_CUBIN_BEFORE     an existing CMake build dir of the reference to use instead of building REV
#   SBS_CUBIN_ARGS       more arguments for the comparison (e.g. --allow-added for a change that adds variants)
# Each build is one sm_90a-only, x86_64 CMake build (a few minutes on 2 cores); the copies are
# plain file trees, so the comparison sees exactly what git tracks (plus untracked, unignored files).
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:-main}
ENV=${SBS_BUILD_ENV:-$PWD/wheels/.buildenv}
PY=$ENV/bin/python
WORK=${SBS_CUBIN_WORK:-/tmp/sbs-cubin-identity}
export SOURCE_DATE_EPOCH=315532800 PYTHONHASHSEED=0 TZ=UTC LC_ALL=C.UTF-8

build() {  # SRC BUILD
  (cd "$1" && "$PY" -m cmake -S . -B "$2" -G Ninja -DCMAKE_MAKE_PROGRAM="$ENV/bin/ninja" \
     -DSBS_PYTHON="$PY" -DSBS_HOST_ARCH=x86_64 -DSBS_TARGETS=sm_90a >/dev/null && "$PY" -m cmake --build "$2")
}

mkdir -p "$WORK"
BEFORE=${SBS_CUBIN_BEFORE:-}
if [ -z "$BEFORE" ]; then
  BEFORE=$WORK/before-build
  rm -rf "$WORK/before-src" "$BEFORE" && mkdir -p "$WORK/before-src"
  git archive "$REV" | tar -x -C "$WORK/before-src"
  echo "==> reference: $REV"
  build "$WORK/before-src" "$BEFORE"
fi
rm -rf "$WORK/after-src" "$WORK/after-build" && mkdir -p "$WORK/after-src"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -cf - -T - | tar -xf - -C "$WORK/after-src"
echo "==> this tree"
build "$WORK/after-src" "$WORK/after-build"
"$PY" -m aot.tools.cubin_identity "$BEFORE" "$WORK/after-build" --markdown ${SBS_CUBIN_ARGS:-}
