#!/usr/bin/env bash
# The GPU suite, run on a GPU machine from prebuilt wheels (no CuTe-DSL, no compiler, no network there).
#
# On the build machine (no GPU):
#   SBS_TEST_LIBS=ON ./wheels/build.sh          # wheels/dist + the test-only libraries in wheels/test-libs
# On the GPU machine, in a copy of the repository holding wheels/dist and wheels/test-libs:
#   tests/gpu/device.sh [extra pytest arguments]
#
# Installs both dists like a user (from wheels/dist only, into a private --target folder: the
# machine's own torch/pytest are used), runs `subblock-sage check`, then pytest tests/gpu with the
# sm_90a test build of FlashInfer's SM120 classes (SUBBLOCK_SAGE_TEST_LIB_DIR), so the sm_120a
# marshalling is checked on every Hopper run. On an sm_90 GPU a missing test build is an error,
# not a skip. Logs go to $OUT (or ./gpu-logs). Exit status: pytest's, or 3 if check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG=${OUT:-$PWD/gpu-logs}
mkdir -p "$LOG"
ARCH=$(uname -m)
SITE=${SBS_GPU_SITE:-/tmp/sbs-gpu-site}
rm -rf "$SITE"  # a stale install would silently win (docs/design/testing.md, "Device runs")
shopt -s nullglob
wheels=(wheels/dist/subblock_sage-*-py3-none-any.whl wheels/dist/subblock_sage_kernels_cu13-*"$ARCH".whl)
if [ ${#wheels[@]} -ne 2 ]; then
  echo "error: need exactly one runtime and one $ARCH kernels wheel in wheels/dist, found: ${wheels[*]:-none}" >&2
  echo "Fix: run ./wheels/build.sh on the build machine and bring wheels/dist along." >&2
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}" || exit 2
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1

testlib=$(find wheels/test-libs/"$ARCH" -name 'libsubblock_sage_test_sm90a.so' 2>/dev/null | head -1)
cap=$(python3 -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null || echo none)
if [ -n "$testlib" ]; then
  export SUBBLOCK_SAGE_TEST_LIB_DIR=$(cd "$(dirname "$testlib")" && pwd)
elif [ "$cap" = 90 ]; then
  echo "error: no sm_90a test build in wheels/test-libs/$ARCH (the SM120 marshalling check needs it)" >&2
  echo "Fix: build with SBS_TEST_LIBS=ON ./wheels/build.sh and bring wheels/test-libs along." >&2
  exit 2
fi

{ nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,power.draw,power.limit --format=csv
  python3 -c 'import torch, subblock_sage; print("torch", torch.__version__, "subblock_sage", subblock_sage.__version__)'
  git rev-parse HEAD 2>/dev/null; } > "$LOG/env.txt" 2>&1
cat "$LOG/env.txt"

python3 -m subblock_sage check > "$LOG/check.txt" 2>&1
rc_check=$?
cat "$LOG/check.txt"

python3 -m pytest -q -p no:cacheprovider -rs tests/gpu "$@" 2>&1 | tee "$LOG/pytest-gpu.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ] && [ "$rc_check" -ne 0 ]; then rc=3; fi
exit "$rc"
