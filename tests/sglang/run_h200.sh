#!/usr/bin/env bash
# SGLang 0.5.23's whole test_subblock_sparse_attention.py on a GPU, with the subblock-sage plugin
# loaded through SGLang's own loader (load_plugins/apply_plugin_hooks), in bf16 and with the
# SubBlock schedule in sage_fp8 for the tests that build their plans through SGLang's router.
# Self-contained (no network): needs the bundle from tests/sglang/build_h200_bundle.sh
# (.carry/sglang/site-py312.tar.xz) and subblock-sage installed, or its wheels in wheels/dist.
# Stand-ins (each logged with "[harness stand-in]"): sgl_kernel and torchvision import-only;
# the test module's kernel gate probes subblock-sage; dense attention is SGLang's TORCH_SDPA backend.
# Results: $OUT (or ./sglang-h200-out): summary.txt, bf16.{log,json}, sage_fp8.{log,json},
# report.{json,log}, check.txt. SUBBLOCK_SAGE_SGLANG_ROUTER passes through (1: the router hook too).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
O=${OUT:-$PWD/sglang-h200-out}
mkdir -p "$O"
SITE=$(mktemp -d)/site
mkdir -p "$SITE"
"$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  .carry/sglang/site-py312.tar.xz "$SITE" || { echo "bundle missing: run tests/sglang/build_h200_bundle.sh" | tee "$O/summary.txt"; exit 2; }
shopt -s nullglob
whl=(wheels/dist/subblock_sage-*.whl wheels/dist/subblock_sage_kernels_cu13-*x86_64*.whl)
if [ ${#whl[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "${whl[@]}"
fi
export PYTHONPATH="$SITE:$PWD/tests/sglang/stubs"
unset SUBBLOCK_SAGE_SGLANG_PLUGIN SGLANG_PLUGINS
# our kernels in both modes: the plugin's default leaves sm_90a bf16 to SGLang's own kernel
# (unmeasured against ours), which this bundle cannot run (no CuTe DSL on the GPU machine)
export SUBBLOCK_SAGE_SGLANG_MODES=bf16,sage_fp8

{
  echo "== $(date -u) $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)"
  echo "SUBBLOCK_SAGE_SGLANG_ROUTER=${SUBBLOCK_SAGE_SGLANG_ROUTER:-} (1: SGLang's SubBlockRouter runs subblock-sage's router)"
  "$PY" -c "import sys,torch,triton,subblock_sage; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'subblock-sage', subblock_sage.__version__, subblock_sage.__file__)"
} > "$O/summary.txt" 2>&1
"$PY" -m subblock_sage check > "$O/check.txt" 2>&1
echo "subblock-sage check: rc=$?" >> "$O/summary.txt"
"$PY" tests/sglang/harness.py report > "$O/report.json" 2> "$O/report.log"
echo "plugin activation through SGLang's loader: rc=$? ($(grep -c 'dist=subblock-sage' "$O/report.log") hooks applied)" >> "$O/summary.txt"
rc=0
for mode in bf16 sage_fp8; do
  "$PY" tests/sglang/harness.py unittest --gpu --compute-mode $mode --json "$O/$mode.json" > "$O/$mode.log" 2>&1
  r=$?; [ $r -ne 0 ] && rc=1
  echo "== $mode: rc=$r" >> "$O/summary.txt"
  "$PY" - "$O/$mode.json" >> "$O/summary.txt" 2>&1 <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for t, o in sorted(d["outcomes"].items()):
    print(f"  {o.split(':')[0]:8s} {t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]}")
PYEOF
  grep -h "^\[harness stand-in\]\|Ran \|^OK\|^FAILED" "$O/$mode.log" | sed 's/^/  /' >> "$O/summary.txt"
done
cat "$O/summary.txt"
exit $rc
