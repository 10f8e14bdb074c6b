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
    call's wall time, compile included, reported apart, with a fresh TRITON_CACHE_DIR);
  * sage_fp8: ``quantize_and_route`` (the pooling quantizer + ``router_select``: Q and K read
    once) vs the quantizer alone, with Q and K/V-only (``_kv``: sm_90a's Q-fused kernels), and the
    quantizer then ``route`` (four launches) beside them;
  * ``subblock_attention`` per call vs ``route`` + ``sparse_attention`` called separately.
  The geometry is the GPU's target's (``Backend.router_geometry``: sm_90a Sage 128-key blocks,
  n_k 8, granularity 1; bf16 64-key, n_k 4, granularity 8), SGLang's router built with the same.
plans: on activations-shaped random inputs (a per-channel offset shared by the tokens, plus
  noise), every (H, mode, n_q, n_k) the defaults use, our plan against SGLang's and against the
  exact selection of SGLang's own float32 scores: rows that differ, and every difference outside
  the tie tolerance (reference.router_plan_differences) with its score margin.
cold: a fresh process (TRITON_CACHE_DIR a new empty folder) imports torch and subblock_sage and
  times its first ``subblock_attention`` call (wall, synchronised) and the second; fails unless
  the call imported no Triton and no CuTe-DSL (``cutlass``) and the Triton cache stayed empty.
sanitize: route (the shipped score phase, and the test library's SIMT cross-check where
  $SUBBLOCK_SAGE_TEST_LIB_DIR holds it; dense rows, 64/128-key, several n_q x n_k) and
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
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, S, H, 128, device="cuda", generator=g) + 0.5 * torch.randn(1, 1, H, 128, device="cuda", generator=g)
    k = torch.randn(B, S, H, 128, device="cuda", generator=g) + torch.randn(1, 1, H, 128, device="cuda", generator=g)
    out = [q.to(torch.bfloat16), k.to(torch.bfloat16)]
    if with_v:
        out.append(torch.randn(B, S, H, 128, device="cuda", generator=g).to(torch.bfloat16))
    return out


def geometry(mode):
    """(block_size_k, n_k default, granularity) of ``mode`` on this GPU's target."""
    from subblock_sage.ops.subblock import geometry as geo
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


def part_time(args) -> list:
    import torch

    import subblock_sage

    R, why = _sglang()
    rows = []
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
                from subblock_sage.quantizer import quantize_canonical

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

            one = lambda: subblock_sage.subblock_attention(q, k, v, sparsity=args.sparsity, compute_mode=mode)  # noqa: E731
            row["subblock_attention_ms"], row["subblock_attention_b2b_ms"] = _time(one, args.reps, args.warm_s)
            row["separately_ms"], row["separately_b2b_ms"] = _time(separately, args.reps, args.warm_s)
            rows.append(row)
            print(json.dumps(row), flush=True)
        q = k = v = None  # free before the next shape
        torch.cuda.empty_cache()
    for n in notes:
        print("note:", n)
    return rows


def part_plans(args) -> list:
    import torch

    from subblock_sage.ops.route import route_with_scores
    from subblock_sage.reference import reference_router_select, router_plan_differences

    R, why = _sglang()
    if R is None:
        print(f"plans: SGLang's router cannot run here: {why}")
        return [{"error": why}]
    rows = []
    scale = 128 ** -0.5
    for H in args.heads:
        q, k = _qkv(H, args.seqlen, seed=100 + H, with_v=False)
        for mode in MODES:
            bk, n_k, g = geometry(mode)
            for n_q, nk in ((4, n_k),):  # the defaults' cells: 16 tokens (SGLang's schedule)
                router = R.SubBlockRouter(n_k=nk, n_q=n_q, block_size_k=bk, budget_granularity=g)
                sg_scores = router.scores(q, k, scale)
                sg = router.route(q, k, args.sparsity, scale)
                plan, scores, _, _ = route_with_scores(q, k, sparsity=args.sparsity, softmax_scale=scale, n_q=n_q,
                                                       n_k=nk, block_size_k=bk, budget_granularity=g)
                torch.cuda.synchronize()
                ref = sg_scores.double().cpu()
                sg_counts = torch.full(plan.counts.shape, sg.topk, dtype=torch.int32)
                vs_sglang = router_plan_differences(plan.index, plan.counts, sg.index, sg_counts, ref)
                exact_idx, exact_cnt = reference_router_select(ref, sg.topk)
                vs_exact = router_plan_differences(plan.index, plan.counts, exact_idx, exact_cnt, ref)
                sg_vs_exact = router_plan_differences(sg.index, sg_counts, exact_idx, exact_cnt, ref)
                row = {"H": H, "S": args.seqlen, "mode": mode, "block_size_k": bk, "n_q": n_q, "n_k": nk, "g": g,
                       "topk": plan.topk, "sglang_topk": sg.topk, "rows": vs_sglang["rows"],
                       "max_abs_score_diff": float((scores - sg_scores.float()).abs().max()),
                       "vs_sglang": _summary(vs_sglang), "vs_exact_of_sglang_scores": _summary(vs_exact),
                       "sglang_vs_exact": _summary(sg_vs_exact),
                       "equal_up_to_ties": not vs_sglang["bad"] and plan.topk == sg.topk}
                rows.append(row)
                print(json.dumps(row), flush=True)
        q = k = None  # free before the next shape
        torch.cuda.empty_cache()
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
    lib_dir = os.environ.get("SUBBLOCK_SAGE_TEST_LIB_DIR")
    if lib_dir and torch.cuda.get_device_capability() == (9, 0):
        from subblock_sage.loader import Library

        impls.append({"impl": "simt", "select_library": Library(Path(lib_dir) / "libsubblock_sage_test_sm90a.so")})
    else:
        print("sanitize: the shipped score phase only (the SIMT cross-check is in the sm_90a test library: "
              "set SUBBLOCK_SAGE_TEST_LIB_DIR)")
    cases = [(1, 1, 1, 1), (1, 65, 63, 2), (2, 300 + 7, 1000 + 9, 3), (1, 4096 + 37, 4096 + 51, 2)]
    n = 0
    for B, Sq, Sk, H in cases:
        g = torch.Generator(device="cuda").manual_seed(Sq)
        q = torch.randn(B, Sq, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(B, Sk, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(B, Sk, H, 128, device="cuda", generator=g).to(torch.bfloat16)
        gq = -(-Sq // 64)
        dense = torch.arange(gq, device="cuda") % 3 == 1
        for bk, n_q, n_k in ((64, 4, 4), (128, 4, 8), (64, 1, 8), (128, 8, 1), (64, 2, 2)):
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
    args = ap.parse_args(argv)
    args.failed = False
    if args.part == "time":
        # a fresh Triton cache: SGLang's first call compiles, and the compile time is reported apart
        os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sbs-triton-cache-"))
    rows = globals()[f"part_{args.part}"](args)
    if args.part == "time":
        _table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"part": args.part, "argv": sys.argv[1:], "rows": rows}, indent=1))
    if args.part == "plans":
        args.failed = not all(r.get("equal_up_to_ties") for r in rows)
    return 1 if args.failed else 0


def _table(rows) -> None:
    cols = ("H", "mode", "route_ms", "sglang_ms", "ours_over_sglang", "sglang_first_call_s", "quantize_ms",
            "quantize_and_route_ms", "quantize_route_over_quantize", "quantize_route_over_quantize_kv",
            "subblock_attention_ms", "separately_ms")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "-")) for c in cols))


if __name__ == "__main__":
    sys.exit(main())
