#!/usr/bin/env bash
# Build the small SGLang 0.5.23 bundle that tests/sglang/run_h200.sh needs on the H200 (Python
# 3.12 with torch/triton/numpy, no network, <= 64 MiB carried per call): one archive,
#   .carry/sglang/site-py312.tar.xz   a ready --target site: SGLang 0.5.23's pure-Python files
#       (its compiled extensions are cp311 and not on the SubBlock path; model definitions,
#       servers, parsers and other test suites left out: none is on the SubBlock import chain)
#       with its dist-info and the kernels/jit include/ and csrc/ folders it checks at import,
#       plus the cp312 manylinux / pure wheels of tests/requirements-sglang.txt (minus sglang and
#       numpy) and tests/sglang/requirements-h200-extra.txt, installed without dependency
#       resolution (pinned lists). xz: ~half the size of the wheels.
# sgl_kernel and torchvision are import-only stand-ins (tests/sglang/stubs, tracked in git).
# Usage: tests/sglang/build_h200_bundle.sh    (needs network: pip download; ~3 min)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=.carry/sglang
PY=${PYTHON:-python3}
rm -rf "$OUT"
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
SITE="$tmp/site"

grep -v -E '^(#|$|sglang==|numpy==)' tests/requirements-sglang.txt > "$tmp/deps.txt"
grep -v -E '^(#|$)' tests/sglang/requirements-h200-extra.txt >> "$tmp/deps.txt"
"$PY" -m pip install -q --no-deps --no-compile --target "$SITE" --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --platform any -r "$tmp/deps.txt"
rm -rf "$SITE/bin"

"$PY" -m pip download -q --no-deps sglang==0.5.23 -d "$tmp"
mkdir "$tmp/x"
"$PY" -m zipfile -e "$tmp"/sglang-0.5.23-*.whl "$tmp/x"
(
  cd "$tmp/x"
  skip='^sglang/(test|srt/(models|disaggregation|entrypoints|function_call|parser|debug_utils)|multimodal_gen/(test|runtime/pipelines_core))/'
  {
    find sglang -name '*.py' | grep -v -E "$skip"
    find sglang/multimodal_gen/test -name '__init__.py'
    echo sglang/multimodal_gen/test/unit/test_subblock_sparse_attention.py
    echo sglang-0.5.23.dist-info
    echo sglang/kernels/jit/include
    echo sglang/kernels/jit/csrc
  } > "$tmp/list"
  tar cf - -T "$tmp/list" | tar xf - -C "$SITE"
)
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
tar cf - -C "$SITE" . | xz -T2 -6 > "$OUT/site-py312.tar.xz"
echo "bundle: $OUT/site-py312.tar.xz $(du -m "$OUT/site-py312.tar.xz" | cut -f1) MiB" \
  "($(du -sm "$SITE" | cut -f1) MiB unpacked)"
