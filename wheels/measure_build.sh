#!/usr/bin/env bash
# Build-speed measurements (recorded in MEASUREMENTS.md). Re-run on a quiet machine:
#   ./wheels/measure_build.sh            # all steps, prints one line per step + the load
#   STEPS="scratch warm" ./wheels/measure_build.sh
# Works on fresh clones of HEAD (committed files only) in a scratch folder, with a private, empty
# export cache and the DSL's own file cache off, so "scratch" compiles every export.
# Steps:
#   scratch   ./wheels/build.sh, both CPUs, clone 1, empty export cache
#   warm      ./wheels/build.sh, both CPUs, clone 2 (new path, no build dir), warm export cache;
#             its wheels must be byte-identical to scratch's
#   nochange  x86_64 rebuild in clone 2, nothing changed
#   touchq    x86_64 rebuild after `touch aot/kernels/sage_quant/kernel.py` (mtime only: cache hits)
#   editq     x86_64 rebuild after a comment is appended to aot/kernels/sage_quant/kernel.py (recompiles
#             its 15 exports: three variants x five targets)
#   edita     x86_64 rebuild after a comment is appended to aot/kernels/flashinfer_sm100.py
#             (recompiles its 4 exports, the slowest kernel)
# Environment: SBS_BUILD_ENV (build env, default wheels/.buildenv), SBS_MEASURE_DIR (scratch
# folder, default a new temporary one; removed at the end unless SBS_MEASURE_KEEP=1),
# SBS_MEASURE_REF (commit to measure, default HEAD; e.g. an older commit for a baseline
# on the same machine: STEPS="scratch nochange editq" SBS_MEASURE_REF=<commit> ./wheels/measure_build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STEPS=${STEPS:-scratch warm nochange touchq editq edita}
W=${SBS_MEASURE_DIR:-$(mktemp -d /tmp/sbs-measure.XXXXXX)}
mkdir -p "$W"
export SBS_BUILD_ENV=${SBS_BUILD_ENV:-$ROOT/wheels/.buildenv}
export SBS_EXPORT_CACHE=$W/export-cache CUTE_DSL_DISABLE_FILE_CACHING=1 SBS_SUMMARY=0
export SBS_CROSS_CACHE=${SBS_CROSS_CACHE:-$ROOT/wheels/.cross}
unset SBS_DIST SBS_WORK SUBBLOCK_SAGE_KERNEL_MODULES
for c in c1 clone-two; do
  if [ ! -d "$W/$c" ]; then
    git clone -q --no-hardlinks "$ROOT" "$W/$c"
    git -C "$W/$c" checkout -q "${SBS_MEASURE_REF:-HEAD}"
  fi
done
echo "machine: $(nproc) cores, $(uname -m), $(date -u +%F)"

step() {  # step NAME DIR ARCHES: time ./wheels/build.sh; print the time, load and export summary
  local name=$1 dir=$2 arches=$3 t0 t1 log=$W/$1.log
  t0=$(date +%s.%N)
  (cd "$dir" && SBS_HOST_ARCHES=$arches ./wheels/build.sh >"$log" 2>&1) || { tail -30 "$log"; exit 1; }
  t1=$(date +%s.%N)
  printf '%-9s %-15s %7.1f s   load after: %s\n' "$name" "$arches" "$(echo "$t1 - $t0" | bc)" \
    "$(uptime | sed 's/.*load average: //')"
  grep -E '^exports: ' "$log" | sed 's/^/          /' || true  # one line per host CPU
}

for s in $STEPS; do
  case $s in
    scratch) step scratch "$W/c1" "x86_64 aarch64" ;;
    warm)
      step warm "$W/clone-two" "x86_64 aarch64"
      for w in "$W"/c1/wheels/dist/*.whl; do
        cmp -s "$w" "$W/clone-two/wheels/dist/$(basename "$w")" \
          && echo "          identical: $(basename "$w")" || { echo "DIFFERENT: $(basename "$w")"; exit 1; }
      done ;;
    nochange) step nochange "$W/clone-two" x86_64 ;;
    touchq) touch "$W/clone-two/aot/kernels/sage_quant/kernel.py"; step touchq "$W/clone-two" x86_64 ;;
    editq) echo "# measure_build.sh edit $(date +%s%N)" >>"$W/clone-two/aot/kernels/sage_quant/kernel.py"
           step editq "$W/clone-two" x86_64 ;;
    edita) echo "# measure_build.sh edit $(date +%s%N)" >>"$W/clone-two/aot/kernels/flashinfer_sm100.py"
           step edita "$W/clone-two" x86_64 ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
"$SBS_BUILD_ENV/bin/python" -m aot.export_cache stats 2>/dev/null || true
[ "${SBS_MEASURE_KEEP:-0}" = 1 ] || rm -rf "$W"
