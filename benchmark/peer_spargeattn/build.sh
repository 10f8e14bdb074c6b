#!/usr/bin/env bash
# Build the SpargeAttn peer library for compare.py (needs nvcc >= 12.4 with sm_90a; no GPU, no
# torch). SPARGEATTN_SRC: a checkout of https://github.com/thu-ml/SpargeAttn (measured at commit
# bfd980b, 2026-11-30). Output: libsparge_sm90.so next to this script (not tracked by git).
#   SPARGEATTN_SRC=/path/to/SpargeAttn bash benchmark/peer_spargeattn/build.sh
set -euo pipefail
: "${SPARGEATTN_SRC:?set SPARGEATTN_SRC to a SpargeAttn checkout}"
here=$(cd "$(dirname "$0")" && pwd)
# the flags of SpargeAttn's own setup.py (-O3, fast math, half operators), for sm_90a only
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --use_fast_math \
  -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -diag-suppress=174 \
  -Xcompiler -fPIC -Xcompiler -Wno-deprecated-declarations -shared -Xptxas=-v \
  -I"$SPARGEATTN_SRC/csrc/qattn" -I"$SPARGEATTN_SRC/csrc" \
  "$here/harness.cu" -o "$here/libsparge_sm90.so"
echo "built $here/libsparge_sm90.so"
