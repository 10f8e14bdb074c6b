"""The router on a GPU: times, plans against SGLang 0.5.23's SubBlockRouter, a cold start, and a
small ragged workload for compute-sanitizer. Every part prints a table and, with --json, writes
its rows; parts run separately so each fits one device call (benchmark/device_run.sh router-*).

    python benchmark/router_bench.py time   [--heads 2 6 14] [--seqlen 37760] [--json PATH]
    python benchmark/router_bench.py plans  [--heads 2 6 14] [--seqlen 37760] [--json PATH]
    python benchmark/router_bench.py cold   [--json PATH]
    python benchmark/router_bench.py sanitize            # under compute-sanitizer (memcheck/racecheck)

time: GPU ms by CUDA events, after a warm-up (``--warm-s`` seconds, default 1), median of
``--reps`` isolated calls (the GPU idle before each: host path inside) and the mean of the same
number queued back to back, per (H, mode) at B=1:
  * our ``route`` vs SGLang's ``SubBlockRouter.route`` (its four Triton launches, warm; the first
    call's wall time, compile included, reported apart, with a fresh TRITON_CACHE_DIR), and ours
    with ``router_select``'s key split forced to 1 (one fused launch), 2, 4, 8, 16 (back to back);
  * sage_fp8: ``quantize_and_route`` (the pooling quantizer + ``router_select``: Q and K read
    once) vs the quantizer alone, with Q and K/V-only (``_kv``: sm_90a's Q-fused kernels), and the
    quantizer then ``route`` (four launches) beside them;
  * ``subblock_attention`` per call vs ``route`` + ``sparse_attention`` called separately and vs
    ``sparse_attention`` alone on a fixed plan (alternated twice; the faster round's median).
  The geometry is the GPU's target's (``Backend.router_geometry``: sm_90a Sage 128-key blocks,
  n_k 8, granularity 1; bf16 64-key, n_k 4, granularity 8), SGLang's router built with the same.
plans: on structured inputs (``_structured_qk``: SGLang's own test recipe and runs of topics),
  per (H, mode, n_q, n_k) (the defaults and three other pairs per key-block size, PLAN_PAIRS):
  our plan and SGLang's against the exact top-k of the float64 reference scores (recall, and
  recall up to ties), rows identical to SGLang's, and every difference outside the tie tolerance
  (reference.router_plan_differences) with its score margin; fails unless ours is the exact top-k
  up to ties everywhere.
cold: a fresh process (TRITON_CACHE_DIR a new empty folder) imports torch and subblock_sage and
  times its first ``subblock_attention`` call (wall, synchronised) and the second; fails unless
  the call imported no Triton and no CuTe-DSL (``cutlass``) and the Triton cache stayed empty.
sanitize: route (the shipped score phase, and the test library's SIMT cross-check where
  $SUBBLOCK_SAGE_TEST_LIB_DIR holds it; the shipped one fused and split; with and without dense
  rows, every allowed (block_size_k, n_q, n_k) on ragged shapes, rows longer than the staged
  buffer; ``--quick``: fewer) and
  subblock_attention on ragged shapes, synchronised; exits 0 when every call returned (the
  sanitizer's own exit code reports what it found).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("bf16", "sage_fp8")


def _qkv(H, S, seed, with_v=True, B=1):
    """Activations-like inputs (a per-channel offset shared by the tokens, plus noise): the time
    part's (the kernels' time does not depend on the values)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, S, H, 128, device="cuda", generator=g) + 0.5 * torch.randn(1, 1, H, 128, device="cuda", generator=g)
    k = torch.randn(B, S, H, 128, device="cuda", generator=g) + torch.randn(1, 1, H, 128, device="cuda", generator=g)
    out = [q.to(torch.bfloat16), k.to(torch.bfloat16)]
    if with_v:
        out.append(torch.randn(B, S, H, 128, device="cuda", generator=g).to(torch.bfloat16))
    return out


def _structured_qk(kind, H, S, seed):
    """Q and K whose block scores are separated, as those of video latents are (white noise makes
    every block a near-tie of every other, which no selector can order and no comparison can judge):

    * ``topics``: SGLang 0.5.23's own test recipe (``_structured_qkv`` of its SubBlock tests,
      read for its facts): 64 topics laid out in contiguous runs over the sequence, a query of
      topic t near center t, the keys of topic t near center t + 32 (so the wanted keys sit half
      a sequence away), noise 0.3;
    * ``segments``: runs of 16-1024 tokens (log-uniform lengths), each of one of 48 topics drawn at
      random, the queries of topic t wanting the keys of topic perm(t), plus a slow positional
      drift (a random walk over 256-token steps, scale 0.5) and noise 0.5: blocks straddling runs
      and the drift give graded scores rather than two levels.
    """
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "topics":
        n = 64
        centers = torch.randn(n, H, 128, device="cuda", generator=g)
        topic = torch.arange(S, device="cuda") * n // S
        q = centers[topic] + 0.3 * torch.randn(S, H, 128, device="cuda", generator=g)
        k = centers[(topic + n // 2) % n] + 0.3 * torch.randn(S, H, 128, device="cuda", generator=g)
        return q[None].to(torch.bfloat16), k[None].to(torch.bfloat16)
    if kind != "segments":
        raise ValueError(kind)
    n = 48
    cpu = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < S:
        ln = int(torch.exp(torch.empty(1).uniform_(2.77, 6.93, generator=cpu)))  # 16..1024
        lengths.append(ln)
        total += ln
    seg_topic = torch.randint(0, n, (len(lengths),), generator=cpu)
    topic = torch.repeat_interleave(seg_topic, torch.tensor(lengths))[:S].to("cuda")
    perm = torch.randperm(n, generator=cpu).to("cuda")
    centers = torch.randn(n, H, 128, device="cuda", generator=g)
    steps = -(-S // 256) + 1
    walk = torch.cumsum(torch.randn(steps, H, 128, device="cuda", generator=g), 0) * (0.5 / steps ** 0.5)
    pos = torch.arange(S, device="cuda") / 256.0
    lo = pos.floor().long()
    w = (pos - lo).view(S, 1, 1)
    drift = walk[lo] * (1 - w) + walk[lo + 1] * w
    # a key of topic u carries center perm(u): the queries of topic t want the keys of perm^-1(t)
    q = centers[topic] + drift + 0.5 * torch.randn(S, H, 128, device="cuda", generator=g)
    k = centers[perm[topic]] + drift + 0.5 * torch.randn(S, H, 128, device="cuda", generator=g)
    return q[None].to(torch.bfloat16), k[None].to(torch.bfloat16)


def geometry(mode):
    """(block_size_k, n_k default, granularity) of ``mode`` on this GPU's target."""
    from subblock_sage.ops.pipeline import geometry as geo
    from subblock_sage.router_spec import default_n_k

    bk, g = geo("cuda:0", mode)
    return bk, default_n_k(bk), g


def _sglang():
    sys.path.insert(0, str(ROOT))
    from tests.helpers.sglang_router import SGLangRouterUnavailable, load_sglang_router

    try:
        return load_sglang_router(), None
    except SGLangRouterUnavailable as e:
        return None, str(e)


def _time(fn, reps, warm_s):
    from subblock_sage.tools import bench

    one = bench.time_ms(fn, reps=reps, warm_s=warm_s)
    b2b = bench.time_ms(fn, reps=reps, back_to_back=True)
    return round(one, 4), round(b2b, 4)


def _test_library():
    """The sm_90a test library (its SIMT cross-check) where $SUBBLOCK_SAGE_TEST_LIB_DIR holds it
    on an sm_90 GPU, else None."""
    import torch

    lib_dir = os.environ.get("SUBBLOCK_SAGE_TEST_LIB_DIR")
    if not lib_dir or torch.cuda.get_device_capability() != (9, 0):
        return None
    from subblock_sage.loader import Library

    return Library(Path(lib_dir) / "libsubblock_sage_test_sm90a.so")


GPU_STATE = "name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"


def _gpu_state(q: str = GPU_STATE) -> str:
    """The nvidia-smi fields ``q`` now (default: clocks, power and temperature, the row's power
    state), or why they could not be read."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def part_time(args) -> list:
    import torch

    import subblock_sage
    from subblock_sage.backends.router import select_launches
    from subblock_sage.ops.route import check_route_args, route_with_scores

    R, why = _sglang()
    rows = args.rows
    notes = [] if R else [f"SGLang's router not timed: {why}"]
    scale = 128 ** -0.5
    for H in args.heads:
        q, k, v = _qkv(H, args.seqlen, seed=H)
        for mode in MODES:
            bk, n_k, g = geometry(mode)
            kw = dict(sparsity=args.sparsity, n_q=4, n_k=n_k, block_size_k=bk, budget_granularity=g,
                      softmax_scale=scale)
            row = {"H": H, "S": args.seqlen, "mode": mode, "block_size_k": bk, "n_q": 4, "n_k": n_k, "g": g}
            row["route_ms"], row["route_b2b_ms"] = _time(lambda: subblock_sage.route(q, k, **kw), args.reps, args.warm_s)
            # router_select's launch shape forced (backends/router.select_launches: 1 = one fused launch),
            # the kernels alone (back to back): the evidence for the heuristic's thresholds
            row["auto_launches"] = [list(x) for x in select_launches(
                check_route_args(q, k, **kw), torch.cuda.get_device_properties(0).multi_processor_count)]
            for ks in (1, 2, 4, 8, 16):
                _, row[f"route_k_splits{ks}_b2b_ms"] = _time(
                    lambda: route_with_scores(q, k, k_splits=ks, **kw), 10, 0.2)  # noqa: B023
            if R is not None:
                router = R.SubBlockRouter(n_k=n_k, n_q=4, block_size_k=bk, budget_granularity=g)
                call = lambda: router.route(q, k, args.sparsity, scale)  # noqa: E731
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                call()  # compiles its Triton kernels for this geometry (first call of the process)
                torch.cuda.synchronize()
                row["sglang_first_call_s"] = round(time.perf_counter() - t0, 3)
                row["sglang_ms"], row["sglang_b2b_ms"] = _time(call, args.reps, args.warm_s)
                row["ours_over_sglang"] = round(row["route_ms"] / row["sglang_ms"], 3)
            if mode == "sage_fp8":
                from subblock_sage.ops.quantize_route import quantize_and_route
                from subblock_sage.backends.quantizer import quantize_canonical

                # with Q (sm_120a, sm_90a INT8-Q kernels) and K/V only (sm_90a Q-fused kernels:
                # the pooling quantizer then reads Q only to pool it)
                for tag, with_q in (("", True), ("_kv", False)):
                    quant = lambda: quantize_canonical(q, k, v, with_q=with_q)  # noqa: E731
                    fused = lambda: quantize_and_route(q, k, v, with_q=with_q, **kw)  # noqa: E731

                    def two_launch_paths():
                        quantize_canonical(q, k, v, with_q=with_q)
                        subblock_sage.route(q, k, **kw)

                    row[f"quantize{tag}_ms"], _ = _time(quant, args.reps, args.warm_s)
                    row[f"quantize_and_route{tag}_ms"], _ = _time(fused, args.reps, args.warm_s)
                    row[f"quantize_then_route{tag}_ms"], _ = _time(two_launch_paths, args.reps, args.warm_s)
                    row[f"quantize_route_over_quantize{tag}"] = round(
                        row[f"quantize_and_route{tag}_ms"] / row[f"quantize{tag}_ms"], 3)

            def separately():
                plan = subblock_sage.route(q, k, sparsity=args.sparsity, n_q=4, n_k=n_k, block_size_k=bk,
                                           budget_granularity=g)
                return subblock_sage.sparse_attention(q, k, v, plan.index, plan.counts, block_size_k=bk,
                                                      compute_mode=mode)

            # the attention call alone on the same plan (sage_fp8: its quantizer + kernel, as
            # sparse_attention runs them): what the one call adds the router to
            fixed = subblock_sage.route(q, k, sparsity=args.sparsity, n_q=4, n_k=n_k, block_size_k=bk,
                                        budget_granularity=g)
            attention = lambda: subblock_sage.sparse_attention(q, k, v, fixed.index, fixed.counts,  # noqa: E731
                                                               block_size_k=bk, compute_mode=mode)
            one = lambda: subblock_sage.subblock_attention(q, k, v, sparsity=args.sparsity, compute_mode=mode)  # noqa: E731
            # alternated twice (one, separately, attention alone, ...): one power state for the ratios
            for rnd in (1, 2):
                for name, fn in (("subblock_attention", one), ("separately", separately), ("attention", attention)):
                    ms, b2b = _time(fn, args.reps, args.warm_s)
                    row.setdefault(f"{name}_ms_rounds", []).append(ms)
                    row.setdefault(f"{name}_b2b_ms_rounds", []).append(b2b)
            for name in ("subblock_attention", "separately", "attention"):
                row[f"{name}_ms"] = min(row[f"{name}_ms_rounds"])
                row[f"{name}_b2b_ms"] = min(row[f"{name}_b2b_ms_rounds"])
            row["one_call_over_attention"] = round(row["subblock_attention_ms"] / row["attention_ms"], 3)
            row["one_call_over_separately"] = round(row["subblock_attention_ms"] / row["separately_ms"], 3)
            row["gpu"] = _gpu_state()
            rows.append(row)
            args.save()
            print(json.dumps(row), flush=True)
        q = k = v = None  # free before the next shape
        torch.cuda.empty_cache()
    for n in notes:
        print("note:", n)
    return rows


# the (n_q, n_k) pairs compared per key-block size: the defaults (16-token cells) first
PLAN_PAIRS = {64: ((4, 4), (2, 2), (8, 8), (1, 4)), 128: ((4, 8), (4, 4), (8, 2), (1, 1))}


def _recall(index, counts, exact_index, exact_counts, ref):
    """``(recall, recall up to ties)`` of a plan against the exact top-k of the float64 scores
    ``ref``: the share of the exact plan's blocks the plan lists; up to ties, a missed block
    within the tie tolerance of its row's threshold (reference.ROUTER_TIE_*) counts as found."""
    import torch

    from subblock_sage.reference import ROUTER_TIE_ATOL, ROUTER_TIE_RTOL

    gk = ref.shape[-1]

    def mask(ix, ct):
        ix, ct = ix.long().cpu(), ct.long().cpu()
        live = torch.arange(ix.shape[-1]).view(1, 1, 1, -1) < ct.unsqueeze(-1)
        m = torch.zeros(*ref.shape[:-1], gk + 1, dtype=torch.bool)
        m.scatter_(-1, torch.where(live & (ix >= 0) & (ix < gk), ix, gk), True)
        return m[..., :gk]

    mine, exact = mask(index, counts), mask(exact_index, exact_counts)
    total = int(exact.sum())
    missed = exact & ~mine
    kth = torch.sort(ref, dim=-1, descending=True).values
    thr = kth.gather(-1, (exact_counts.long().cpu().clamp(1, gk) - 1).unsqueeze(-1))
    tie = (ref - thr).abs() <= ROUTER_TIE_ATOL + ROUTER_TIE_RTOL * thr.abs()
    return (round(1 - int(missed.sum()) / total, 7), round(1 - int((missed & ~tie).sum()) / total, 7))


def part_plans(args) -> list:
    import torch

    from subblock_sage.ops.route import route_with_scores
    from subblock_sage.reference import reference_block_scores, reference_router_select, router_plan_differences
    from subblock_sage.router_spec import router_budget

    R, why = _sglang()
    if R is None:
        print(f"plans: SGLang's router cannot run here: {why}")
        args.failed = True
        return [{"error": why}]
    rows = args.rows
    scale = 128 ** -0.5
    for kind in args.inputs:
        for H in args.heads:
            q, k = _structured_qk(kind, H, args.seqlen, seed=100 + H)
            for mode in MODES:
                bk, _, g = geometry(mode)
                for n_q, nk in PLAN_PAIRS[bk]:
                    t0 = time.perf_counter()
                    router = R.SubBlockRouter(n_k=nk, n_q=n_q, block_size_k=bk, budget_granularity=g)
                    sg_scores = router.scores(q, k, scale)
                    sg = router.route(q, k, args.sparsity, scale)
                    plan, scores, _, _ = route_with_scores(q, k, sparsity=args.sparsity, softmax_scale=scale,
                                                           n_q=n_q, n_k=nk, block_size_k=bk, budget_granularity=g)
                    # float64 scores of the method's bf16 cells, on the GPU (624 MB of float64 at H=14)
                    ref = reference_block_scores(q, k, n_q=n_q, n_k=nk, block_size_k=bk,
                                                 softmax_scale=scale).cpu()
                    torch.cuda.synchronize()
                    topk = router_budget(ref.shape[-1], args.sparsity, g)
                    sg_counts = torch.full(plan.counts.shape, sg.topk, dtype=torch.int32)
                    exact_idx, exact_cnt = reference_router_select(ref, topk)
                    vs_sglang = router_plan_differences(plan.index, plan.counts, sg.index, sg_counts, ref)
                    vs_exact = router_plan_differences(plan.index, plan.counts, exact_idx, exact_cnt, ref)
                    sg_vs_exact = router_plan_differences(sg.index, sg_counts, exact_idx, exact_cnt, ref)
                    ours_r = _recall(plan.index, plan.counts, exact_idx, exact_cnt, ref)
                    sg_r = _recall(sg.index, sg_counts, exact_idx, exact_cnt, ref)
                    # the score spread that makes the inputs a test: the gap between a row's
                    # threshold and the median block, in natural-log units (white noise: ~0.1)
                    kth = torch.sort(ref, dim=-1, descending=True).values
                    spread = float((kth[..., topk - 1] - kth[..., kth.shape[-1] // 2]).median())
                    row = {"inputs": kind, "H": H, "S": args.seqlen, "mode": mode, "block_size_k": bk,
                           "n_q": n_q, "n_k": nk, "g": g, "topk": plan.topk, "sglang_topk": sg.topk,
                           "reference_topk": topk, "rows": vs_sglang["rows"],
                           "threshold_minus_median": round(spread, 4),
                           "ours_vs_sglang_scores_max_abs": float((scores - sg_scores.float()).abs().max()),
                           "ours_vs_reference_scores_max_abs": float((scores.double().cpu() - ref).abs().max()),
                           "recall_ours": ours_r[0], "recall_ours_up_to_ties": ours_r[1],
                           "recall_sglang": sg_r[0], "recall_sglang_up_to_ties": sg_r[1],
                           "rows_identical_to_sglang": vs_sglang["rows"] - vs_sglang["differing_rows"],
                           "vs_sglang": _summary(vs_sglang), "ours_vs_exact": _summary(vs_exact),
                           "sglang_vs_exact": _summary(sg_vs_exact),
                           "ours_exact_up_to_ties": not vs_exact["bad"] and plan.topk == topk,
                           "seconds": round(time.perf_counter() - t0, 2)}
                    rows.append(row)
                    args.save()
                    print(json.dumps({k_: v_ for k_, v_ in row.items()
                                      if k_ not in ("vs_sglang", "ours_vs_exact", "sglang_vs_exact")}
                                     | {"differing_from_sglang": vs_sglang["differing_rows"],
                                        "outside_ties_vs_sglang": len(vs_sglang["bad"]),
                                        "outside_ties_ours_vs_exact": len(vs_exact["bad"]),
                                        "outside_ties_sglang_vs_exact": len(sg_vs_exact["bad"])}), flush=True)
                    del ref, sg_scores, scores
            q = k = None  # free before the next shape
            torch.cuda.empty_cache()
    args.failed = not rows or not all(r.get("ours_exact_up_to_ties") for r in rows)
    return rows


def _summary(d, shown=50):
    """A plan comparison for the record: counts, and each difference outside the ties with its
    score margin (natural-log units; the first ``shown``)."""
    return {"differing_rows": d["differing_rows"], "outside_ties": len(d["bad"]),
            "worst_margin": round(d["worst_margin"], 6),
            "differences": [{"row": list(b[:3]), "block": b[3], "score_minus_threshold": b[4]} for b in d["bad"][:shown]]}


COLD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
import subblock_sage
t1 = time.perf_counter()
before = set(sys.modules)
q, k, v = (torch.randn(1, 37760, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
torch.cuda.synchronize()
t2 = time.perf_counter()
subblock_sage.subblock_attention(q, k, v, compute_mode=sys.argv[1])
torch.cuda.synchronize()
t3 = time.perf_counter()
subblock_sage.subblock_attention(q, k, v, compute_mode=sys.argv[1])
torch.cuda.synchronize()
t4 = time.perf_counter()
new = sorted(set(sys.modules) - before)
print(json.dumps({"import_s": t1 - t0, "first_call_s": t3 - t2, "second_call_s": t4 - t3,
                  "modules_imported_by_the_calls": [m for m in new if not m.startswith("subblock_sage")][:200],
                  "triton_loaded": "triton" in sys.modules, "triton_loaded_before_call": "triton" in before,
                  "cute_dsl_loaded": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules)}))
"""


def part_cold(args) -> list:
    rows = []
    ok = True
    for mode in MODES:
        cache = tempfile.mkdtemp(prefix="sbs-triton-cache-")
        env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
        p = subprocess.run([sys.executable, "-c", COLD, mode], env=env, capture_output=True, text=True, timeout=300)
        if p.returncode:
            rows.append({"mode": mode, "error": p.stderr[-2000:]})
            ok = False
            continue
        row = json.loads(p.stdout.strip().splitlines()[-1])
        row["mode"] = mode
        row["triton_cache_files"] = sum(len(f) for _, _, f in os.walk(cache))
        compiled = [m for m in row["modules_imported_by_the_calls"] if m.split(".")[0] in ("triton", "cutlass")]
        row["nothing_compiled"] = not compiled and row["triton_cache_files"] == 0 and not row["cute_dsl_loaded"]
        ok &= row["nothing_compiled"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "modules_imported_by_the_calls"}), flush=True)
    print("cold start: " + ("nothing compiled (no Triton, no CuTe-DSL, Triton cache empty)" if ok else "FAILED"))
    args.failed = not ok
    return rows


def part_sanitize(args) -> list:
    import torch

    import subblock_sage
    from subblock_sage.ops.route import route_with_scores

    impls = [{"impl": "mma"}]
    test_lib = _test_library()
    if test_lib is not None:
        impls += [{"impl": "simt", "select_library": test_lib}]
    else:
        print("sanitize: the shipped score phase only (the SIMT cross-check is in the sm_90a test library: "
              "set SUBBLOCK_SAGE_TEST_LIB_DIR)")
    from itertools import product

    from subblock_sage.router_spec import ROUTER_BLOCK_SIZES_K, ROUTER_N_VALUES, RUNTIME_N_IMPLS

    every = [(bk, n_q, n_k) for bk in ROUTER_BLOCK_SIZES_K for n_q, n_k in product(ROUTER_N_VALUES, repeat=2)]
    defaults = [(64, 4, 4), (128, 4, 8)]
    # (B, Sq, Sk, H, the (block_size_k, n_q, n_k) run on it): every allowed pair on the small ragged
    # shapes, the defaults on the long one; --quick (racecheck): three shapes, the runtime-argument
    # score phase only (the shipped kernel)
    cases = [(1, 1, 1, 1, every), (1, 65, 63, 2, every), (2, 300 + 7, 1000 + 9, 3, every),
             (1, 4096 + 37, 4096 + 51, 2, defaults), (1, 65, 64 * 2300 + 7, 1, defaults)]
    if args.quick:
        cases, impls = cases[1:3] + cases[4:], [i for i in impls if i["impl"] in RUNTIME_N_IMPLS]
    # the shipped kernel fused, and split (its score launch on a share of the key tiles, then the
    # selection launch: backends/router.select_launches)
    impls = [dict(i, k_splits=ks) for i in impls for ks in ((1, 3) if i["impl"] in RUNTIME_N_IMPLS else (None,))]
    n = 0
    for B, Sq, Sk, H, pairs in cases:
        g = torch.Generator(device="cuda").manual_seed(Sq)
        q = torch.randn(B, Sq, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(B, Sk, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(B, Sk, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        gq = -(-Sq // 64)
        dense = torch.arange(gq, device="cuda") % 3 == 1
        for bk, n_q, n_k in pairs:
            for impl in impls:
                for rows in (None, dense):
                    route_with_scores(q, k, sparsity=0.7, n_q=n_q, n_k=n_k, block_size_k=bk, dense_rows=rows, **impl)
                    n += 1
        for mode in MODES:
            try:
                subblock_sage.subblock_attention(q, k, v, sparsity=0.6, compute_mode=mode)
                n += 1
            except ValueError as e:  # a mode this target does not ship
                print(f"{mode}: {e}")
        torch.cuda.synchronize()
    print(f"sanitize: {n} calls returned")
    return [{"calls": n}]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("time", "plans", "cold", "sanitize"))
    ap.add_argument("--heads", type=int, nargs="+", default=[2, 6, 14])
    ap.add_argument("--seqlen", type=int, default=37760)
    ap.add_argument("--sparsity", type=float, default=0.75)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm-s", type=float, default=1.0)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--inputs", nargs="+", choices=("topics", "segments"), default=["topics", "segments"],
                    help="plans: the structured inputs (see _structured_qk)")
    ap.add_argument("--quick", action="store_true", help="sanitize: fewer shapes (racecheck)")
    args = ap.parse_args(argv)
    args.failed = False
    args.rows = []

    def save():  # after every row: a part cut off at its time limit keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps({"part": args.part, "argv": sys.argv[1:], "rows": args.rows},
                                                  indent=1))

    args.save = save
    if args.part == "time":
        # a fresh Triton cache: SGLang's first call compiles, and the compile time is reported apart
        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sbs-triton-cache-"))
    rows = globals()[f"part_{args.part}"](args)
    if rows is not args.rows:
        args.rows[:] = rows
    if args.part == "time":
        _table(rows)
    save()
    return 1 if args.failed else 0


def _table(rows) -> None:
    cols = ("H", "mode", "route_ms", "sglang_ms", "ours_over_sglang", "sglang_first_call_s", "quantize_ms",
            "quantize_and_route_ms", "quantize_route_over_quantize", "quantize_route_over_quantize_kv",
            "subblock_attention_ms", "separately_ms", "attention_ms", "one_call_over_attention")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "-")) for c in cols))


if __name__ == "__main__":
    sys.exit(main())
