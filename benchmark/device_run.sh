#!/usr/bin/env bash
# One H200 device run (the `device` tool: one command, results under $OUT), from wheels built here
# with `SBS_HOST_ARCHES=x86_64 SBS_TARGETS=sm_90a SBS_TEST_LIBS=ON ./wheels/build.sh` and carried
# (wheels/dist, wheels/test-libs; for the cuDNN FP8 row also .carry/nvidia_cudnn_frontend-*.whl).
#   benchmark/device_run.sh suite gaps sweep memcheck bench      # any subset, in any order
# suite: tests/gpu/device.sh (installs like a user, `subblock-sage check`, the GPU suite);
# gaps:  benchmark/call_gaps.py, Q-fused and INT8-Q Sage kernels alternated (A B A B), bf16 once;
# memcheck: compute-sanitizer memcheck of benchmark/memcheck.py (Q-fused Sage kernels; INT8-Q --quick),
#        racecheck --quick of the Q-fused ones;
# sweep: benchmark/quant_sweep.py, the whole quantizer and its K/V-only pass;
# bench: the lab bench (`python3 -m benchmark.lab.bench`: `subblock-sage bench` with the lab's
#        contenders, benchmark/lab) --shapes host --warm-s 1 (with cuDNN's FP8 SDPA when carried);
# share3: the flat_wgs=3 kernels' GPU tests, then benchmark/share3_ab.py (against the flat kernel
#        and cuDNN's FP8 SDPA, alternated; needs an experiments build of the library; SBS_SHARE3_Q:
#        the --q choices to run, default "auto");
# hostab: benchmark/call_gaps.py with the earlier host path (--path before) and the current
#        one, alternated (before, current, before, current);
# timeline: benchmark/call_timeline.py (a CUPTI timeline of isolated calls: host path, launches,
#        kernel starts and gaps, at the host shapes);
# quantab: benchmark/quant_sweep.py (--no-host, passes $SBS_QUANTAB_PASSES: whole and/or kv (--kv-only))
#        with the wheels in .carry/old-dist (a build of an earlier commit), the current ones and
#        those of .carry/alt-dist when carried, alternated (old, new[, alt], twice): a quantizer
#        change against its base in one power state;
# timelineab: benchmark/call_timeline.py with the wheels in .carry/old-dist and the current ones,
#        alternated (old, new, old, new): a call-path change (launches, host path) against its base;
# orderab: benchmark/share3_ab.py --flat-only (the shipped flat kernel on plans as given and sorted
#        by the caller, cuDNN's FP8 SDPA alternated) with the wheels in .carry/old-dist and the
#        current ones, alternated (old, new, old, new): a plan-preparation change against its base;
# pairab: benchmark/pair_ab.py (the 64-key paired kernel on dense and sparse plans, the 128-key
#        kernel and cuDNN's FP8 SDPA) with the wheels in .carry/old-dist and the current ones,
#        alternated (old, new, old, new): a paired-kernel change against its base;
# cluster: GPU tests -k "${SBS_CLUSTER_TESTS:-cluster2}" (under a timeout: a cluster barrier bug
#        hangs), then benchmark/cluster_ab.py (the two-CTA cluster kernel against the one-CTA flat
#        kernel and cuDNN's FP8 SDPA, alternated); the bf16 shared-ring kernel:
#        SBS_CLUSTER_TESTS=kv_share SBS_CLUSTER_ARGS="--mode bf16 --bk 64 128 --hetero";
# hostwait: benchmark/host_wait.py (one timed call after a blocking, polling or sleeping wait
#        for the previous one: the host's part of the one-call whole/kernel ratio);
# ncu:   benchmark/ncu_kernel.sh per $SBS_NCU ("SET,H,S ..."; default router at H=14 and bf16
#        against cuDNN's SM90 bf16 kernel at H=2, S=37760): counters only, no disassembly;
# peer:  benchmark/peer_spargeattn/compare.py --rounds 3 (SpargeAttn's SM90 kernel; carry its
#        libsparge_sm90.so, built here by benchmark/peer_spargeattn/build.sh);
# contenders: the lab bench (`python3 -m benchmark.lab.bench --warm-s 1`, benchmark/lab) with every
#        contender, --shapes sglang then
#        --shapes host (contenders-sglang / contenders-host: one of them; each fits one device
#        call): our bf16 call on every 64-key plan timed in turn with SGLang's own SM90 kernel
#        (AOT, from the carried test libraries wheels/test-libs/x86_64: build with
#        SBS_TEST_LIBS=ON), FlexAttention, cuDNN's block-sparse attention (a note where its
#        CuTe-DSL dependency is absent), cuDNN's SM90 bf16 block-sparse kernel (cudnn_bsa_bf16, AOT
#        from the same test library) and cuDNN's dense bf16 SDPA; on every plan padded to a fixed
#        count, our Sage call timed in turn with cuDNN's SM90 Sage FP8 path (cudnn_bsa_sage: its
#        quantizer + its 64- or 128-key kernel, AOT, test library; rows carry padded_x); the Sage
#        kernel alternated with cuDNN's FP8 SDPA on dense plans; clocks and power on every row.
#        First, tests/gpu/test_cudnn_sm90_contender.py (cuDNN's AOT kernels against the float64
#        reference; the bench also refuses them when its own small-shape check fails).
#        SBS_CONTENDER_SHAPES="H,S ..." runs those shapes with the preset's plans instead of its
#        shapes (to split a preset over several calls).
# kvshare-memcheck: compute-sanitizer memcheck of benchmark/memcheck.py --bf16-cluster 2 and 4 (the
#        bf16 shared-ring kernels, one CTA and two-CTA clusters: hostile plans, ragged shapes, dense
#        rows that share), then racecheck --quick of both;
# testbuild-memcheck: compute-sanitizer memcheck and racecheck of tests/gpu/test_flashinfer_testbuild.py
#        (the sm_90a test build of FlashInfer's SM120 classes, through the shipped marshalling);
# sglang: tests/sglang/run_h200.sh (SGLang 0.5.23's SubBlock suite through the plugin, both modes,
#        SUBBLOCK_SAGE_SGLANG_MODES=bf16,sage_fp8; needs .carry/sglang/site-py312.tar.xz);
# peakmem: benchmark/peak_memory.py (peak reserved memory of a sequence of calls at the SGLang
#        shapes: ours in both modes, SGLang's SM90 kernel from the test library, cuDNN dense);
# router: the router's steps below in one go (longer than one 10-minute device call: run them as
#        separate calls, in this order);
# router-tests: the GPU tests of the router, quantize_and_route and subblock_attention (tests/gpu/device.sh -k,
#        SBS_ROUTER_K= (empty) for the whole suite;
#        `subblock-sage check` and its router self-test first), with SGLang 0.5.23's router from
#        the carried bundle (.carry/sglang/site-py312.tar.xz, tests/sglang/build_h200_bundle.sh)
#        for tests/gpu/test_router.py's comparison;
# router-memcheck: compute-sanitizer memcheck, then racecheck, of benchmark/router_bench.py
#        sanitize (both score impls, dense rows, both key-block sizes, ragged shapes);
# router-bench: benchmark/router_bench.py time (ours vs SGLang's router, quantize + route, one
#        call vs two; H=2,6,14 S=37760) then cold (a fresh process's first subblock_attention);
# router-plans: benchmark/router_bench.py plans (ours against SGLang's router, both modes);
# cold: benchmark/cold_start.py --profile (a fresh process's import and first call of both entry
#        points and modes, broken down, and `subblock-sage check`'s wall time), with the wheels in
#        .carry/old-dist first when carried (the base of a cold-start change), then the current ones;
# router-sglang: tests/sglang/run_h200.sh (SGLang's SubBlock suite through the plugin) with
#        SUBBLOCK_SAGE_SGLANG_ROUTER=1;
# tail: the bf16 kernel's split last wave (SelectionPolicy.bf16_tail_pairs): its GPU tests, then
#        benchmark/tail_ab.py (split / unsplit / cuDNN's SM90 bf16 kernel; SBS_TAIL_ARGS, SBS_TAIL_AB_S),
#        then memcheck and racecheck of one case of the tests;
# sglang-step: benchmark/sglang_step.py (the step as SGLang users run it: SGLang's router + its SM90
#        bf16 kernel from the test library, and + SpargeAttn's SM90 Sage kernel (carry its
#        libsparge_sm90.so), against our subblock_attention, parts alone; H=2,6,14 S=37760;
#        needs .carry/sglang/site-py312.tar.xz; SBS_SGLANG_STEP_ARGS: extra arguments).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
# the device tool brings back only a few files per command: everything goes back as one tarball
# (single files were left out: a suite log and half an A/B once)
pack() { (cd "$OUT" && tar czf /tmp/sbs-results.tgz . && rm -rf ./* && mv /tmp/sbs-results.tgz results.tgz); }
trap pack EXIT
git rev-parse HEAD > "$OUT/COMMIT" 2>/dev/null || true
# the device copy's git HEAD can be stale (it was, for hours once); the
# kernels wheel's manifest names the commit it was built from (``-dirty``: uncommitted changes)
python3 - > "$OUT/BUILD_COMMIT" 2>&1 <<'PY' || true
import glob, json, zipfile
for w in sorted(glob.glob("wheels/dist/subblock_sage_kernels_cu13-*.whl")):
    print(w.split("/")[-1], json.loads(zipfile.ZipFile(w).read("subblock_sage_kernels/manifest.json")).get("build_commit"))
PY
SITE=/tmp/sbs-gpu-site
# the wheels of DIST (runtime + x86_64 kernels) into the --target folder DIR, again whenever the
# wheels differ from those installed there (a warm machine keeps /tmp between calls: a stale
# install once judged a new build's contenders with the old runtime)
install_site() {
  local sum
  sum=$(cat "$2"/subblock_sage-*-py3-none-any.whl "$2"/subblock_sage_kernels_cu13-*x86_64.whl | sha256sum)
  if [ ! -d "$1/subblock_sage" ] || [ "$(cat "$1/.sbs-wheels" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$1"; python3 -m pip install -q --no-index --no-deps --target "$1" \
      "$2"/subblock_sage-*-py3-none-any.whl "$2"/subblock_sage_kernels_cu13-*x86_64.whl
    echo "$sum" > "$1/.sbs-wheels"
  fi
}
# cuDNN's frontend (the FP8 SDPA contender) into /tmp/cfe-site, when its wheel was carried
install_cfe() {
  local fe=(.carry/nvidia_cudnn_frontend-*.whl)
  if [ -f "${fe[0]}" ] && [ ! -d /tmp/cfe-site ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/cfe-site "${fe[0]}"
  fi
}
OLD=/tmp/sbs-old-site
ALT=/tmp/sbs-alt-site
# an A/B step's sides: the current wheels in $SITE, those of .carry/old-dist in $OLD and, when
# carried, a third build's in .carry/alt-dist ($ALT: a variant against the same base in the same
# power state); then "$@" once per round and side (old, new[, alt], old, new[, alt]) with $site
# and $side set
alternate() {
  local name=$1; shift
  local sides="old new"
  install_site "$SITE" wheels/dist
  install_site "$OLD" .carry/old-dist
  cat .carry/old-dist/COMMIT > "$OUT/$name-old-commit.txt" 2>/dev/null || true
  if [ -d .carry/alt-dist ]; then
    install_site "$ALT" .carry/alt-dist
    cat .carry/alt-dist/COMMIT > "$OUT/$name-alt-commit.txt" 2>/dev/null || true
    sides="old new alt"
  fi
  for r in 1 2; do
    for side in $sides; do
      case "$side" in old) site=$OLD ;; alt) site=$ALT ;; *) site=$SITE ;; esac
      "$@"
    done
  done
}
quantab_side() {
  for pass in ${SBS_QUANTAB_PASSES:-whole kv}; do
    kv=""; [ "$pass" = kv ] && kv=--kv-only
    echo "## $side round $r $kv" | tee -a "$OUT/quantab.txt"
    PYTHONPATH=$site PYTHONUNBUFFERED=1 python3 benchmark/quant_sweep.py --no-host \
      $kv --json "$OUT/quantab-$side-$r$kv.json" 2>&1 \
      | tee -a "$OUT/quantab.txt"
  done
}
orderab_side() {
  echo "## $side round $r" | tee -a "$OUT/orderab.txt"
  PYTHONPATH=$site:/tmp/cfe-site PYTHONUNBUFFERED=1 python3 benchmark/share3_ab.py --flat-only --rounds 2 \
    ${SBS_ORDERAB_SHAPES:-} --json "$OUT/orderab-$side-$r.json" 2>&1 | tee -a "$OUT/orderab.txt"
}
pairab_side() {
  echo "## $side round $r" | tee -a "$OUT/pairab.txt"
  PYTHONPATH=$site:/tmp/cfe-site PYTHONUNBUFFERED=1 python3 benchmark/pair_ab.py --rounds 2 \
    ${SBS_PAIRAB_ARGS:-} --json "$OUT/pairab-$side-$r.json" 2>&1 | tee -a "$OUT/pairab.txt"
}
timelineab_side() {
  echo "## $side round $r" >> "$OUT/timelineab.txt"
  PYTHONPATH=$site PYTHONUNBUFFERED=1 python3 benchmark/call_timeline.py --json "$OUT/tl-$side-$r.json" \
    >> "$OUT/timelineab.txt" 2>&1
}
# SGLang 0.5.23's pure-Python files from the carried bundle, once per machine; sets SBS_SGLANG_SITE
sglang_site() {
  if [ ! -d /tmp/sbs-sglang-site/sglang ]; then
    mkdir -p /tmp/sbs-sglang-site
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      .carry/sglang/site-py312.tar.xz /tmp/sbs-sglang-site \
      || echo "warning: no SGLang bundle (.carry/sglang/site-py312.tar.xz): SGLang's router is not compared" >&2
  fi
  export SBS_SGLANG_SITE=/tmp/sbs-sglang-site
}
steps=()
for step in "$@"; do
  if [ "$step" = router ]; then steps+=(router-tests router-memcheck router-bench router-plans router-sglang)
  else steps+=("$step"); fi
done
for step in "${steps[@]}"; do
  case "$step" in
    router-tests)
      sglang_site
      # SBS_ROUTER_K: the -k expression (empty: the whole GPU suite, SGLang's router comparison included)
      k=${SBS_ROUTER_K-"router or subblock_attention or quantize_route"}
      OUT="$OUT/gpu" tests/gpu/device.sh ${k:+-k "$k"} > "$OUT/router-tests.txt" 2>&1
      echo "router tests rc=$?" >> "$OUT/router-tests.txt"; tail -3 "$OUT/router-tests.txt" ;;
    router-memcheck|router-bench|router-plans)
      install_site "$SITE" wheels/dist
      export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv \
        >> "$OUT/env.txt" 2>&1
      # the test library (the SIMT cross-check of the shipped router_select): sanitized too where
      # it was carried
      tl=$(find wheels/test-libs/x86_64 -name 'libsubblock_sage_test_sm90a.so' 2>/dev/null | head -1)
      if [ -n "$tl" ]; then export SUBBLOCK_SAGE_TEST_LIB_DIR=$(cd "$(dirname "$tl")" && pwd); fi
      if [ "$step" = router-memcheck ]; then
        for tool in memcheck racecheck; do
          f="$OUT/router-$tool.txt"
          q=""; [ $tool = racecheck ] && q=--quick
          timeout 280 compute-sanitizer --tool $tool --error-exitcode 1 python3 benchmark/router_bench.py sanitize $q > "$f" 2>&1
          echo "router $tool rc=$?" | tee -a "$f"; tail -4 "$f"
        done
      elif [ "$step" = router-bench ]; then
        sglang_site
        # SBS_ROUTER_TIME_ARGS: extra arguments of the time part (e.g. --heads 2 6)
        python3 benchmark/router_bench.py time ${SBS_ROUTER_TIME_ARGS:-} --json "$OUT/router-time.json" \
          > "$OUT/router-time.txt" 2>&1
        echo "router time rc=$?" >> "$OUT/router-time.txt"; cat "$OUT/router-time.txt"
        python3 benchmark/router_bench.py cold --json "$OUT/router-cold.json" > "$OUT/router-cold.txt" 2>&1
        echo "router cold rc=$?" >> "$OUT/router-cold.txt"; cat "$OUT/router-cold.txt"
      else
        sglang_site
        python3 benchmark/router_bench.py plans --json "$OUT/router-plans.json" > "$OUT/router-plans.txt" 2>&1
        echo "router plans rc=$?" >> "$OUT/router-plans.txt"; cat "$OUT/router-plans.txt"
      fi ;;
    tail)
      # the bf16 kernel's split last wave (aot/kernels/sm90/kernel.py ws_split): its GPU tests, then
      # benchmark/tail_ab.py, then memcheck and racecheck of one case of the tests (the shared-memory merge)
      OUT="$OUT/gpu" tests/gpu/device.sh -k tail_split > "$OUT/tail-tests.txt" 2>&1
      echo "tail tests rc=$?" >> "$OUT/tail-tests.txt"; tail -3 "$OUT/tail-tests.txt"
      install_site "$SITE" wheels/dist
      export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      export SUBBLOCK_SAGE_TEST_LIBS=$PWD/wheels/test-libs/x86_64  # the tail kernels, cuDNN's contender
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv \
        >> "$OUT/env.txt" 2>&1
      timeout "${SBS_TAIL_AB_S:-300}" python3 benchmark/tail_ab.py \
        ${SBS_TAIL_ARGS:-} --json "$OUT/tail-ab.json" 2>&1 | tee "$OUT/tail-ab.txt" | grep -v "^# H=.*diff" | tail -40
      echo "tail ab rc=${PIPESTATUS[0]}" | tee -a "$OUT/tail-ab.txt"
      for tool in memcheck racecheck; do
        timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider \
          tests/gpu/test_sm90_attention.py -k "tail_split and 1000-2100 and True-1000" > "$OUT/tail-$tool.txt" 2>&1
        echo "tail $tool rc=$?" | tee -a "$OUT/tail-$tool.txt"; grep -E "SUMMARY|passed|failed" "$OUT/tail-$tool.txt" | tail -3
      done ;;
    cold)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv >> "$OUT/env.txt" 2>&1
      sides="new"; [ -d .carry/old-dist ] && sides="old new"
      for side in $sides; do
        if [ "$side" = old ]; then site=$OLD; install_site "$OLD" .carry/old-dist; cat .carry/old-dist/COMMIT > "$OUT/cold-old-commit.txt" 2>/dev/null
        else site=$SITE; install_site "$SITE" wheels/dist; fi
        echo "## $side" | tee -a "$OUT/cold.txt"
        PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1 python3 benchmark/cold_start.py --profile \
          ${SBS_COLD_ARGS:-} --json "$OUT/cold-$side.json" >> "$OUT/cold.txt" 2>&1
        echo "cold $side rc=$?" >> "$OUT/cold.txt"
      done
      grep -v "^ \|^$\|ncalls\|Ordered\|function calls" "$OUT/cold.txt" | head -40 ;;
    sglang-step)
      install_site "$SITE" wheels/dist
      sglang_site
      tl=wheels/test-libs/x86_64
      [ -d "$tl" ] || echo "warning: no $tl (build with SBS_TEST_LIBS=ON and carry it): no SGLang SM90 bf16 kernel rows" \
        | tee -a "$OUT/sglang-step.txt"
      [ -f benchmark/peer_spargeattn/libsparge_sm90.so ] || echo "warning: no benchmark/peer_spargeattn/libsparge_sm90.so" \
        "(its build.sh; carry it): no SpargeAttn kernel rows" | tee -a "$OUT/sglang-step.txt"
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv \
        >> "$OUT/env.txt" 2>&1
      PYTHONPATH=$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 SUBBLOCK_SAGE_TEST_LIBS=$tl \
        timeout 420 python3 benchmark/sglang_step.py ${SBS_SGLANG_STEP_ARGS:-} --json "$OUT/sglang-step.json" 2>&1 \
        | tee -a "$OUT/sglang-step.txt"
      echo "sglang-step rc=${PIPESTATUS[0]}" | tee -a "$OUT/sglang-step.txt" ;;
    router-sglang)
      SUBBLOCK_SAGE_SGLANG_ROUTER=1 OUT="$OUT/sglang" tests/sglang/run_h200.sh > "$OUT/router-sglang.txt" 2>&1
      echo "SGLang suite with the router switch on rc=$?" >> "$OUT/router-sglang.txt"; tail -40 "$OUT/router-sglang.txt" ;;
    kvshare-memcheck)
      install_site "$SITE" wheels/dist
      export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      for share in 2 4; do
        f="$OUT/kvshare-memcheck-$share.txt"
        timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmark/memcheck.py \
          --bf16-cluster $share > "$f" 2>&1
        echo "memcheck --bf16-cluster $share rc=$?" | tee -a "$f"; tail -3 "$f"
        f="$OUT/kvshare-racecheck-$share.txt"
        timeout 240 compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmark/memcheck.py \
          --quick --bf16-cluster $share > "$f" 2>&1
        echo "racecheck --quick --bf16-cluster $share rc=$?" | tee -a "$f"; tail -3 "$f"
      done ;;
    testbuild-memcheck)
      install_site "$SITE" wheels/dist
      tl=$(find wheels/test-libs/x86_64 -name 'libsubblock_sage_test_sm90a.so' | head -1)
      export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 SUBBLOCK_SAGE_TEST_LIB_DIR=$(dirname "$tl")
      for tool in memcheck racecheck; do
        f="$OUT/testbuild-$tool.txt"
        timeout 240 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider \
          tests/gpu/test_flashinfer_testbuild.py > "$f" 2>&1
        echo "testbuild $tool rc=$?" | tee -a "$f"; tail -3 "$f"
      done ;;
    sglang)
      OUT="$OUT/sglang" PYTHON=python3 tests/sglang/run_h200.sh > "$OUT/sglang.txt" 2>&1
      echo "SGLang suite rc=$?" >> "$OUT/sglang.txt"; tail -50 "$OUT/sglang.txt" ;;
    ncu)
      install_site "$SITE" wheels/dist
      install_cfe
      # SBS_NCU: "SET,H,S ..." (benchmark/kernel_profile.py --set): the router at H=14, bf16 against
      # cuDNN's SM90 bf16 kernel at H=2 by default
      for spec in ${SBS_NCU:-router,14,37760 bf16,2,37760}; do
        IFS=, read -r set h s <<< "$spec"
        SITE=$SITE SET=$set SHAPE=$h,$s SUBBLOCK_SAGE_TEST_LIBS=$PWD/wheels/test-libs/x86_64 \
          benchmark/ncu_kernel.sh "$OUT/ncu-$set-$h"
        tail -2 "$OUT/ncu-$set-$h"/*.txt
      done ;;
    peakmem)
      install_site "$SITE" wheels/dist
      export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      python3 benchmark/peak_memory.py --test-libs wheels/test-libs/x86_64 --json "$OUT/peakmem.json" \
        > "$OUT/peakmem.txt" 2>&1
      echo "peakmem rc=$?" >> "$OUT/peakmem.txt"; cat "$OUT/peakmem.txt" ;;
    suite)
      OUT="$OUT/gpu" tests/gpu/device.sh > "$OUT/suite.txt" 2>&1
      echo "suite rc=$?" >> "$OUT/suite.txt"; tail -3 "$OUT/suite.txt" ;;
    share3)
      OUT="$OUT/gpu" tests/gpu/device.sh -k "share3" > "$OUT/share3-tests.txt" 2>&1
      echo "share3 tests rc=$?" >> "$OUT/share3-tests.txt"; tail -3 "$OUT/share3-tests.txt"
      install_cfe
      for qm in ${SBS_SHARE3_Q:-auto}; do
        PYTHONPATH=$SITE:/tmp/cfe-site PYTHONUNBUFFERED=1 python3 benchmark/share3_ab.py --q "$qm" \
          --json "$OUT/share3-$qm.json" 2>&1 | tee -a "$OUT/share3.txt"
      done ;;
    cluster)
      OUT="$OUT/gpu" timeout 300 tests/gpu/device.sh -k "${SBS_CLUSTER_TESTS:-cluster2}" > "$OUT/cluster-tests.txt" 2>&1
      echo "cluster tests rc=$?" >> "$OUT/cluster-tests.txt"; tail -3 "$OUT/cluster-tests.txt"
      install_site "$SITE" wheels/dist
      install_cfe
      PYTHONPATH=$SITE:/tmp/cfe-site PYTHONUNBUFFERED=1 timeout 400 python3 benchmark/cluster_ab.py \
        ${SBS_CLUSTER_ARGS:-} --json "$OUT/cluster.json" 2>&1 | tee -a "$OUT/cluster.txt" ;;
    quantab)
      alternate quantab quantab_side ;;
    pairab)
      install_cfe
      alternate pairab pairab_side ;;
    orderab)
      install_cfe
      alternate orderab orderab_side ;;
    timelineab)
      alternate timelineab timelineab_side
      tail -2 "$OUT/timelineab.txt" ;;
    contenders|contenders-sglang|contenders-host)
      install_site "$SITE" wheels/dist
      install_cfe
      export PYTHONPATH=$SITE:/tmp/cfe-site PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      tl=wheels/test-libs/x86_64
      if [ ! -d "$tl" ]; then
        echo "warning: no $tl (build with SBS_TEST_LIBS=ON and carry it): SGLang's and cuDNN's AOT rows are notes" \
          | tee -a "$OUT/contenders.txt"
      fi
      SUBBLOCK_SAGE_TEST_LIBS=$tl timeout 300 python3 -m pytest -q -p no:cacheprovider -rs \
        tests/gpu/test_cudnn_sm90_contender.py > "$OUT/cudnn-contender-tests.txt" 2>&1
      echo "cuDNN AOT contender tests rc=$?" | tee -a "$OUT/cudnn-contender-tests.txt"; tail -5 "$OUT/cudnn-contender-tests.txt"
      case "$step" in contenders) presets="sglang host" ;; *) presets=${step#contenders-} ;; esac
      for preset in $presets; do
        args=(--shapes "$preset")
        if [ -n "${SBS_CONTENDER_SHAPES:-}" ]; then
          args=(--plans "$preset"); for s in $SBS_CONTENDER_SHAPES; do args+=(--shape "$s"); done
        fi
        f="$OUT/contenders-$preset${SBS_CONTENDER_SHAPES:+-${SBS_CONTENDER_SHAPES//[ ,]/_}}"
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv \
          > "$f-env.txt" 2>&1
        python3 -m benchmark.lab.bench "${args[@]}" --warm-s 1 --test-libs "$tl" --json "$f.json" > "$f.txt" 2>&1
        echo "bench ${args[*]} rc=$?" >> "$f.txt"; cat "$f.txt"
      done ;;
    gaps|bench|sweep|memcheck|peer|timeline|hostab|hostwait)
      install_site "$SITE" wheels/dist
      install_cfe
      export PYTHONPATH=$SITE:/tmp/cfe-site PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv \
        >> "$OUT/env.txt" 2>&1
      if [ "$step" = memcheck ]; then
        for args in "--q fused" "--quick --q int8"; do
          f="$OUT/memcheck-${args// /}.txt"
          timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmark/memcheck.py $args > "$f" 2>&1
          echo "memcheck $args rc=$?" | tee -a "$f"; tail -4 "$f"
        done
        compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmark/memcheck.py --quick --q fused \
          > "$OUT/racecheck-fused.txt" 2>&1
        echo "racecheck --quick --q fused rc=$?" | tee -a "$OUT/racecheck-fused.txt"; tail -3 "$OUT/racecheck-fused.txt"
      elif [ "$step" = sweep ]; then
        for kv in "" --kv-only; do
          python3 benchmark/quant_sweep.py --no-host $kv --json "$OUT/sweep$kv.json" 2>&1 | tee -a "$OUT/sweeps.txt"
        done
      elif [ "$step" = peer ]; then
        python3 benchmark/peer_spargeattn/compare.py --rounds 3 --json "$OUT/peer.json" > "$OUT/peer.txt" 2>&1
        echo "peer rc=$?" >> "$OUT/peer.txt"; cat "$OUT/peer.txt"
      elif [ "$step" = hostab ]; then
        for r in 1 2; do
          for p in before current; do
            python3 benchmark/call_gaps.py --path $p --json "$OUT/hostab-$p-$r.json" 2>&1 | tee -a "$OUT/hostab.txt"
          done
        done
      elif [ "$step" = hostwait ]; then
        python3 benchmark/host_wait.py --json "$OUT/hostwait.json" 2>&1 | tee -a "$OUT/hostwait.txt"
      elif [ "$step" = timeline ]; then
        python3 benchmark/call_timeline.py --json "$OUT/timeline.json" 2>&1 | tee -a "$OUT/timeline.txt"
      elif [ "$step" = gaps ]; then
        for r in 1 2; do
          for qm in fused int8; do
            python3 benchmark/call_gaps.py --mode sage_fp8 --q $qm --json "$OUT/gaps-$qm-$r.json" 2>&1 | tee -a "$OUT/gaps.txt"
          done
        done
        python3 benchmark/call_gaps.py --mode bf16 --json "$OUT/gaps-bf16.json" 2>&1 | tee -a "$OUT/gaps.txt"
      else
        python3 -m benchmark.lab.bench --shapes host --warm-s 1 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
        echo "bench rc=$?" >> "$OUT/bench.txt"; cat "$OUT/bench.txt"
      fi ;;
    *) echo "unknown step $step (kvshare-memcheck, testbuild-memcheck, sglang, sglang-step, peakmem, router, router-tests, router-memcheck, router-bench, router-plans, router-sglang, suite, gaps, sweep, memcheck, bench, contenders, contenders-sglang, contenders-host, share3, cluster, orderab, pairab, peer, timeline, timelineab, hostab, hostwait, quantab)" >&2; exit 2 ;;
  esac
done
