"""One attention step as SGLang users run it, per layer: SGLang 0.5.23's router + its kernel vs ours.

SGLang's SubBlock router followed by the kernel SGLang runs on its plan, against our one call
``subblock_sage.subblock_attention``, on one Hopper GPU, one table from one run (issue 58, item 5).

To run (an sm_90 GPU, the subblock-sage wheels installed; SGLang's rows need its bundle, the test
library and SpargeAttn's library: ``benchmark/device_run.sh sglang-step`` sets all of that up):

    SBS_SGLANG_SITE=<SGLang 0.5.23 site> python benchmark/sglang_step.py \\
        [--shapes 2,37760 6,37760 14,37760] [--modes bf16 sage_fp8] [--sparsity 0.75] \\
        [--rounds 5] [--reps 20] [--warm-s 1] [--inputs random] [--test-libs DIR] [--json OUT]

What is timed, per shape (B=1, D=128, Sq=Sk=S, H heads, fresh random bf16 q, k, v in BSHD; the
same geometry and sparsity on both sides, SGLang's for the GPU: ``router_bench.geometry``):

* bf16 (64-key blocks, n_q 4, n_k 4, budget granularity 8):
  - ``peer step``: SGLang's ``SubBlockRouter.route`` (its Triton kernels), the per-row sort of
    the plan and the ``block_counts`` tensor its backend builds for its SM90 kernel
    (``subblock_sparse_attn._sparse_attention_heads`` / ``_sm90_sparse_attention``), then
    SGLang's own SM90 bf16 kernel (its CuTe-DSL FlashAttention forward, compiled ahead of time
    into the test library: ``benchmark.lab.sglang_sm90``) into a fresh output, as its
    ``flash_attn_func`` allocates one;
  - ``ours step``: ``subblock_attention(q, k, v, sparsity=..., compute_mode="bf16")``.
* sage_fp8 (128-key blocks, n_q 4, n_k 8, granularity 1):
  - ``peer step``: SGLang's router, then what SGLang's sm_90 Sage adapter
    (``sglang.kernels.ops.attention.subblock_sage_fp8_sm90``) runs: the plan turned into
    SpargeAttn's LUT, the quantizers, and SpargeAttn's SM90 Sage kernel without its P·V
    threshold (the variant SGLang launches; ``benchmark/peer_spargeattn``, ``Peer.launch(0)``).
    Two parts are stand-ins, as SpargeAttn's package (its Triton/CUDA quantizers and
    ``block_map_lut_triton``) is not built here: the quantize step is timed with our
    ``quantize_sage`` (Q INT8, K INT8, V FP8 transposed: the same work), and the LUT with a few
    torch operations (``Peer.set_plan``). The kernel reads the inputs ``Peer`` built once from
    our quantizer (the same values every step); SGLang's adapter also copies q, k and v to HND
    first (timed apart as ``peer HND copies`` and left out of the peer step: SGLang's own step
    pays them on top). The harness launches the kernel with per-warp Q scales where SGLang asks for
    per-block ones (one scale load per warp and tile: no measurable difference expected).
  - ``ours step``: ``subblock_attention(..., compute_mode="sage_fp8")``.
* Each part alone, so the table shows where a step's time goes: the routers alone; SGLang's plan
  preparation (bf16: sort + counts; Sage: LUT) and quantizer (Sage) alone; each kernel alone on
  a fixed plan (ours: ``bench.kernel_only``, the launch without quantizer or plan preparation);
  ours ``sparse_attention`` on a fixed plan (the step minus the router).

Timing: CUDA events; every contender of a (shape, mode) warmed up in turn for ``--warm-s``, then
timed in turn, round by round (the order reversed every other round), three warm-up calls before
each: ``ms`` is the median over the rounds of each round's median of ``--reps`` isolated calls
(the GPU idle before each, the host path inside), ``range`` the rounds' spread, ``b2b`` the
median over rounds of the mean of ``--reps`` calls queued back to back (the GPU's time when the
host launches faster than the GPU runs, as inside a model). ratio = peer step / ours step (above
1: ours faster), on both; the issue's targets: >= 1.15 in bf16, >= 1.10 in sage_fp8.
``of step``: a part's ms over its own side's step ms. MHz / W / slowed: SM clock, board power
and clock-slowdown share while each contender ran, pooled over its rounds (NVML:
``subblock_sage.tools.power``; on an H200 these kernels run into the 700 W cap: compare rows in
the same state).

FLOPs (B=1, D=128): dense-equivalent TFLOPS = 4·S·S·D·H / t; kept TFLOPS = 4·D·(kept keys summed
over query rows) / t, each side its own plan (``bench.kept_flops``); on the steps, the kernels and
``sparse_attention`` only.

Correctness, once per shape and mode before any timing (a broken contender must not win): each
step's output against a float64 reference with the plan that side used
(``reference.reference_sparse_attention``), on a few full 64-row query blocks of every head
(relative L1 and cosine; a step over ``CHECK_REL_L1`` is not timed); in bf16 SGLang's step
against ``SGLangSM90.run`` (the test library's checked launch path), bit for bit; and, loosely
(printed, not gated), ours against SGLang's output and the share of SGLang's plan blocks ours
keeps: the plans differ slightly (ours is the exact top-k up to ties, SGLang's selector misses
some blocks), and on random inputs nearly every block is a near-tie (structured inputs:
``--inputs topics|segments``, ``router_bench._structured_qk``), so the outputs differ by their
plans, not their kernels.

Constraints: one sm_90 GPU (SGLang's SM90 kernel and SpargeAttn's are sm_90a code); B=1, D=128,
q, k, v the same length and head count (SGLang's SubBlock path), S >= 64. Missing pieces skip
their rows with the reason printed, never the run: SGLang's router needs ``$SBS_SGLANG_SITE``
(``tests/sglang/build_h200_bundle.sh``) and a real Triton; the bf16 peer kernel the test library
(``SBS_TEST_LIBS=ON ./wheels/build.sh``, ``--test-libs`` or ``$SUBBLOCK_SAGE_TEST_LIBS`` /
``$SUBBLOCK_SAGE_TEST_LIB_DIR``); the Sage peer kernel ``benchmark/peer_spargeattn/
libsparge_sm90.so`` (its ``build.sh``). Without SGLang's router the peer kernel rows run on our
plan (noted). ``--json`` is rewritten after every row: a run cut off keeps what it measured.
Time: estimated ~1-2 minutes at the default shapes, 5 rounds x 20 reps (each contender: 3 + 20 +
20 calls per round, the steps ~6 ms at H=14), plus SGLang's first-call Triton compiles (excluded
from the timing, reported on the summary rows).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # router_bench
sys.path.insert(0, str(HERE.parent))  # the repository root: benchmark.lab
import router_bench  # noqa: E402

MODES = ("bf16", "sage_fp8")
SHAPES = ((2, 37760), (6, 37760), (14, 37760))
TARGET = {"bf16": 1.15, "sage_fp8": 1.10}
# relative L1 against the float64 reference with the side's own plan over which a step is not
# timed: bf16 rounding gives ~0.003, a correct Sage FP8 path ~0.04 (reference.SELF_TEST_LIMITS);
# one key block per row skipped or a wrong scale lands above these
CHECK_REL_L1 = {"bf16": 0.02, "sage_fp8": 0.08}
SCALE = 128 ** -0.5
LEGEND = {
    "peer step": "SGLang's router + its plan preparation + the kernel SGLang runs (bf16: its SM90 kernel; "
                 "sage_fp8: LUT + quantize* + SpargeAttn's SM90 kernel)",
    "peer router": "SGLang 0.5.23 SubBlockRouter.route alone",
    "peer plan prep": "bf16: sort + block_counts (SGLang's backend); sage_fp8: plan -> SpargeAttn LUT (torch stand-in)",
    "peer quantize*": "our quantize_sage, standing in for SpargeAttn's quantizers (not built here)",
    "peer kernel": "the peer kernel alone on a fixed plan",
    "peer HND copies": "q, k, v to HND + K mean, as SGLang's Sage adapter does first (not in the peer step)",
    "ours step": "subblock_attention (one call: route + attention)",
    "ours route": "subblock_sage.route alone",
    "ours attention": "sparse_attention on a fixed plan (the step minus the router)",
    "ours kernel": "the attention kernel alone (bench.kernel_only: no quantizer, no plan preparation)",
}


def _load_compare():
    """benchmark/peer_spargeattn/compare.py as a module (its Peer and load_peer)."""
    path = HERE / "peer_spargeattn" / "compare.py"
    spec = importlib.util.spec_from_file_location("sbs_peer_spargeattn_compare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(kind, H, S, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "random":
        return [torch.randn(1, S, H, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)]
    q, k = router_bench._structured_qk(kind, H, S, seed)
    return [q, k, torch.randn(1, S, H, 128, device="cuda", generator=g, dtype=torch.bfloat16)]


def _sample_blocks(S):
    """A few full 64-row query blocks (first, a third, two thirds, last full one)."""
    full = S // 64
    return sorted({0, full // 3, 2 * full // 3, full - 1})


def _check_rows(out_bshd, q, k, v, index, counts, bk, blocks):
    """(relative L1, cosine) of ``out_bshd`` on the rows of ``blocks`` (every head) against the
    float64 reference with the plan ``index``/``counts``."""
    import torch

    from subblock_sage.reference import reference_sparse_attention
    from benchmark.lab.contenders import rel_l1

    rows = torch.cat([torch.arange(b * 64, b * 64 + 64, device=q.device) for b in blocks])
    ref = reference_sparse_attention(q[:, rows], k, v, index[:, :, blocks], counts[:, :, blocks],
                                     block_size_k=bk, softmax_scale=SCALE)
    got = out_bshd[:, rows]
    cos = torch.nn.functional.cosine_similarity(got.double().flatten(), ref.flatten(), dim=0).item()
    return round(rel_l1(got, ref), 5), round(cos, 6)


def _block_mask(index, counts, gk):
    import torch

    live = torch.arange(index.shape[-1], device=index.device) < counts.long().unsqueeze(-1)
    m = torch.zeros(*index.shape[:-1], gk + 1, dtype=torch.bool, device=index.device)
    m.scatter_(-1, torch.where(live, index.long(), gk), True)
    return m[..., :gk]


def _sglang_bf16_launcher(kernel):
    """SGLang's SM90 bf16 kernel launched as its ``flash_attn_func`` launches it (no LSE, the
    plan's counts and index, no full blocks), on a plan already sorted as SGLang's backend sorts
    it, into a fresh output. ``SGLangSM90.run`` (checked once against this) keeps sorted plans by
    their storage, which a plan made anew every step must not hit nor pay twice."""
    import torch

    from benchmark.lab.sglang_sm90 import KERNEL
    from subblock_sage import abi

    def launch(q, k, v, index, counts, out=None):
        out = torch.empty_like(q) if out is None else out
        abi.launch(KERNEL, {}, {"q": q, "k": k, "v": v, "out": out, "block_counts": counts,
                                "q2k_block_index": index, "softmax_scale": SCALE},
                   device=q.device, library=kernel.library)
        return out

    return launch


def _warm_all(fns, warm_s):
    """Every contender in turn until ``warm_s`` seconds have passed (at least twice each)."""
    import torch

    start, n = time.monotonic(), 0
    while n < 2 or time.monotonic() - start < warm_s:
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        n += 1


def _time_in_turn(contenders, rounds, reps, warm_s, sampler):
    """{name: (isolated ms per round, back-to-back ms per round, power samples)}."""
    from subblock_sage.tools import bench

    _warm_all(list(contenders.values()), warm_s)
    got = {n: ([], [], []) for n in contenders}
    names = list(contenders)
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            fn = contenders[n]
            with sampler:
                got[n][0].append(bench.time_ms(fn, warmup=3, reps=reps))
                got[n][1].append(bench.time_ms(fn, warmup=0, reps=reps, back_to_back=True))
            got[n][2].extend(sampler.samples)
    return got


def run_mode(args, mode, H, S, q, k, v, env, sampler, save):
    """Check and time one (shape, mode); appends its rows and summary to ``args.rows``."""
    import torch

    import subblock_sage
    from benchmark.lab.contenders import rel_l1, short
    from subblock_sage.tools import bench, power

    R, peer_kernel = env["router"], env["kernel"][mode]
    bk, n_k, g = router_bench.geometry(mode)
    kw = dict(sparsity=args.sparsity, n_q=4, n_k=n_k, block_size_k=bk, budget_granularity=g, softmax_scale=SCALE)
    blocks = _sample_blocks(S)
    gk = -(-S // bk)
    summary = {"summary": True, "H": H, "S": S, "mode": mode, "block_size_k": bk, "n_q": 4, "n_k": n_k, "g": g,
               "sparsity": args.sparsity, "inputs": args.inputs, "notes": []}
    notes = summary["notes"]
    fns, meta = {}, {}  # name -> timed call; name -> (side, role, kept flops or None)

    # ours: the step, its router, the attention on our plan, the kernel alone
    try:
        ours_out = subblock_sage.subblock_attention(q, k, v, sparsity=args.sparsity, compute_mode=mode)
        plan = subblock_sage.route(q, k, **kw)
        torch.cuda.synchronize()
        same = torch.equal(ours_out, subblock_sage.sparse_attention(q, k, v, plan.index, plan.counts,
                                                                    block_size_k=bk, compute_mode=mode))
        summary["ours_step_equals_route_then_attention"] = same
        summary["ours_topk"] = plan.topk
        summary["ours_vs_reference_rel_l1"], summary["ours_vs_reference_cos"] = _check_rows(
            ours_out, q, k, v, plan.index, plan.counts, bk, blocks)
        if summary["ours_vs_reference_rel_l1"] > CHECK_REL_L1[mode]:
            raise RuntimeError(f"check failed: relative L1 {summary['ours_vs_reference_rel_l1']} against the "
                               f"float64 reference > {CHECK_REL_L1[mode]}")
        kept = bench.kept_flops(plan.counts, bk, S, S, H)
        kern = bench.kernel_only(q, k, v, plan.index, plan.counts, bk, mode)
        fns["ours step"] = lambda: subblock_sage.subblock_attention(q, k, v, sparsity=args.sparsity,
                                                                    compute_mode=mode)
        fns["ours route"] = lambda: subblock_sage.route(q, k, **kw)
        fns["ours attention"] = lambda: subblock_sage.sparse_attention(q, k, v, plan.index, plan.counts,
                                                                       block_size_k=bk, compute_mode=mode)
        fns["ours kernel"] = kern
        meta.update({"ours step": ("ours", "step", kept), "ours route": ("ours", "part", None),
                     "ours attention": ("ours", "part", kept), "ours kernel": ("ours", "part", kept)})
    except Exception as e:  # noqa: BLE001 - a note and no rows, never the whole run
        ours_out = plan = None
        notes.append(f"ours ({mode}) not timed: {type(e).__name__}: {short(e, 300)}")

    # SGLang's router, its plan (and its first call's time: the Triton compiles)
    router = sg_plan = None
    if R is not None:
        try:
            router = R.SubBlockRouter(n_k=n_k, n_q=4, block_size_k=bk, budget_granularity=g)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sg_plan = router.route(q, k, args.sparsity, SCALE)
            torch.cuda.synchronize()
            summary["sglang_first_call_s"] = round(time.perf_counter() - t0, 3)
            summary["sglang_topk"] = sg_plan.topk
            fns["peer router"] = lambda: router.route(q, k, args.sparsity, SCALE)
            meta["peer router"] = ("sglang", "part", None)
        except Exception as e:  # noqa: BLE001
            router = sg_plan = None
            notes.append(f"SGLang's router ({mode}) failed: {type(e).__name__}: {short(e, 300)}")
    else:
        notes.append(f"SGLang's router not run: {env['router_why']}")
    if sg_plan is not None:
        sg_index = sg_plan.index
        sg_counts = torch.full(sg_index.shape[:-1], sg_plan.topk, dtype=torch.int32, device=q.device)
    elif plan is not None and peer_kernel is not None:
        # no SGLang router: the peer kernel alone on our plan (same count every row here)
        sg_index, sg_counts = plan.index[..., :plan.topk].contiguous(), plan.counts
        notes.append("peer kernel row on our plan (SGLang's router absent); no peer step")
    else:
        sg_index = sg_counts = None
    if sg_plan is not None and plan is not None:
        mine, theirs = _block_mask(plan.index, plan.counts, gk), _block_mask(sg_index, sg_counts, gk)
        summary["share_of_sglang_blocks_in_ours"] = round(float((mine & theirs).sum()) / max(1, int(theirs.sum())), 5)
        del mine, theirs

    # the peer kernel, and the peer step where SGLang's router ran
    peer_out = None
    if peer_kernel is None:
        notes.append(f"peer kernel ({mode}) not run: {env['kernel_why'][mode]}")
    elif sg_index is not None:
        try:
            peer_kept = bench.kept_flops(sg_counts, bk, S, S, H)
            if mode == "bf16":
                launch = _sglang_bf16_launcher(peer_kernel)
                fixed = sg_index.sort(dim=-1).values
                checked = peer_kernel.run(q, k, v, fixed, sg_counts, SCALE)  # its checks, its launch path
                fixed_out = torch.empty_like(q)
                fns["peer kernel"] = lambda: launch(q, k, v, fixed, sg_counts, fixed_out)
                meta["peer kernel"] = ("sglang", "part", peer_kept)
                if router is not None:
                    def peer_step():
                        p = router.route(q, k, args.sparsity, SCALE)
                        index = p.index.sort(dim=-1).values  # SGLang's backend, for its SM90 kernel
                        counts = torch.full(index.shape[:-1], p.topk, dtype=torch.int32, device=index.device)
                        return launch(q, k, v, index, counts)

                    fns["peer plan prep"] = lambda: (
                        sg_plan.index.sort(dim=-1).values,
                        torch.full(sg_plan.index.shape[:-1], sg_plan.topk, dtype=torch.int32, device=q.device))
                    meta["peer plan prep"] = ("sglang", "part", None)
                    peer_out = peer_step()
                    torch.cuda.synchronize()
                    summary["peer_step_equals_checked_launch"] = torch.equal(peer_out, checked)
                else:
                    peer_out = checked
            else:
                compare, lib = peer_kernel
                peer = compare.Peer(lib, q, k, v, sg_index, sg_counts, SCALE)
                fns["peer kernel"] = lambda: peer.launch(0)
                meta["peer kernel"] = ("sglang", "part", peer_kept)
                if router is not None:
                    def peer_step():
                        p = router.route(q, k, args.sparsity, SCALE)
                        peer.set_plan(p.index, torch.full(p.index.shape[:-1], p.topk, dtype=torch.int32,
                                                          device=q.device))
                        subblock_sage.quantize_sage(q, k, v)  # stand-in for SpargeAttn's quantizers
                        peer.launch(0)
                        return peer.out

                    def hnd_copies():
                        kh = k.transpose(1, 2).contiguous()
                        return q.transpose(1, 2).contiguous(), kh, v.transpose(1, 2).contiguous(), \
                            kh.mean(dim=-2, keepdim=True)

                    fns["peer plan prep"] = lambda: peer.set_plan(sg_index, sg_counts)
                    fns["peer quantize*"] = lambda: subblock_sage.quantize_sage(q, k, v)
                    fns["peer HND copies"] = hnd_copies
                    meta.update({"peer plan prep": ("sglang", "part", None),
                                 "peer quantize*": ("sglang", "part", None),
                                 "peer HND copies": ("sglang", "info", None)})
                    peer.out.fill_(float("nan"))
                    peer_out = peer_step().transpose(1, 2)  # its output is BHSD
                else:
                    peer.out.fill_(float("nan"))
                    peer.launch(0)
                    peer_out = peer.out.transpose(1, 2)
                torch.cuda.synchronize()
            summary["peer_vs_reference_rel_l1"], summary["peer_vs_reference_cos"] = _check_rows(
                peer_out, q, k, v, sg_index, sg_counts, bk, blocks)
            bad = summary["peer_vs_reference_rel_l1"] > CHECK_REL_L1[mode] or \
                summary.get("peer_step_equals_checked_launch") is False
            if bad:
                raise RuntimeError(f"check failed: relative L1 {summary['peer_vs_reference_rel_l1']} against the "
                                   f"float64 reference (bar {CHECK_REL_L1[mode]}), step == checked launch: "
                                   f"{summary.get('peer_step_equals_checked_launch')}")
            if router is not None:
                fns["peer step"] = peer_step
                meta["peer step"] = ("sglang", "step", peer_kept)
        except Exception as e:  # noqa: BLE001
            for n in [n for n in fns if n.startswith("peer") and n != "peer router"]:
                fns.pop(n)
            peer_out = None
            notes.append(f"peer ({mode}) not timed: {type(e).__name__}: {short(e, 300)}")
    if peer_out is not None and ours_out is not None:
        # loose: the outputs differ by their plans (near-ties on random inputs), not their kernels
        summary["ours_vs_peer_rel_l1"] = round(rel_l1(ours_out, peer_out), 5)
    del peer_out
    print(json.dumps(summary), flush=True)

    order = [n for n in ("peer step", "ours step", "peer router", "ours route", "peer plan prep", "peer quantize*",
                         "peer kernel", "ours attention", "ours kernel", "peer HND copies") if n in fns]
    for n in list(order):  # one call of each first: a part that cannot run is a note, not a crash
        try:
            fns[n]()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            order.remove(n)
            notes.append(f"{n} ({mode}) not timed: {type(e).__name__}: {short(e, 300)}")
    timed = _time_in_turn({n: fns[n] for n in order}, args.rounds, args.reps, args.warm_s, sampler) if order else {}
    dense = 4 * S * S * 128 * H
    step_ms = {}
    for n in order:
        iso, b2b, samples = timed[n]
        side, role, kept = meta[n]
        ms, ms_b2b = statistics.median(iso), statistics.median(b2b)
        if role == "step":
            step_ms[side] = (ms, ms_b2b)
        row = {"H": H, "S": S, "mode": mode, "contender": n, "side": side, "role": role, "ms": round(ms, 4),
               "range": f"{min(iso):.3f}-{max(iso):.3f}", "ms_rounds": [round(t, 4) for t in iso],
               "b2b_ms": round(ms_b2b, 4), "b2b_range": f"{min(b2b):.3f}-{max(b2b):.3f}",
               "dense_tflops": round(dense / ms / 1e9, 1) if kept else None,
               "kept_tflops": round(kept / ms / 1e9, 1) if kept else None}
        pw = power.summarize(samples)
        if pw is not None:
            row.update(pw.as_row())
        args.rows.append(row)
        save()
    for row in args.rows:
        if row.get("H") == H and row.get("S") == S and row.get("mode") == mode and "side" in row \
                and row["role"] != "step" and row["side"] in step_ms:
            row["of_step"] = round(row["ms"] / step_ms[row["side"]][0], 3)
    if "sglang" in step_ms and "ours" in step_ms:
        summary["ratio"] = round(step_ms["sglang"][0] / step_ms["ours"][0], 3)
        summary["ratio_b2b"] = round(step_ms["sglang"][1] / step_ms["ours"][1], 3)
        summary["target"] = TARGET[mode]
        summary["meets_target"] = summary["ratio"] >= TARGET[mode]
    else:
        notes.append("no ratio: " + ("the peer step" if "sglang" not in step_ms else "our step") + " was not timed")
    args.rows.append(summary)
    save()


def _table(rows, head) -> str:
    cols = ("H", "S", "mode", "contender", "ms", "range", "b2b_ms", "of_step", "dense_tflops", "kept_tflops",
            "MHz", "W", "slowed")
    out = head + ["| " + " | ".join(c.replace("_", " ") for c in cols) + " |",
                  "|" + " --- |" * len(cols)]
    for r in rows:
        if r.get("summary"):
            continue
        out.append("| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in cols) + " |")
    out.append("")
    for s in (r for r in rows if r.get("summary")):
        got = (f"ratio {s['ratio']} (b2b {s['ratio_b2b']}), target >= {s['target']}: "
               f"{'met' if s['meets_target'] else 'NOT met'}") if "ratio" in s else "no ratio"
        checks = ", ".join(f"{k_} {s[k_]}" for k_ in (
            "ours_vs_reference_rel_l1", "peer_vs_reference_rel_l1", "ours_vs_peer_rel_l1",
            "share_of_sglang_blocks_in_ours", "ours_topk", "sglang_topk", "sglang_first_call_s") if k_ in s)
        out.append(f"H={s['H']} S={s['S']} {s['mode']}: {got}" + (f"; {checks}" if checks else ""))
        out.extend(f"  note: {n}" for n in s["notes"])
    out.append("")
    out.extend(f"{k_}: {v_}" for k_, v_ in LEGEND.items())
    out.append("* stand-in: SpargeAttn's own quantizers and LUT builder are Triton/CUDA code of its package, not "
               "built here; the peer step times our quantize_sage and a torch LUT in their place")
    return "\n".join(out)


def _load_peers(args, env) -> None:
    """SGLang's router and the two peer kernels, each with the reason it is absent."""
    env["router"], env["router_why"] = router_bench._sglang()
    env["kernel"], env["kernel_why"] = {}, {}
    if "bf16" in args.modes:
        from benchmark.lab import contenders as ctd

        try:
            env["kernel"]["bf16"] = ctd.load_sglang_sm90(args.test_libs)
        except ctd.Unavailable as e:
            env["kernel"]["bf16"], env["kernel_why"]["bf16"] = None, str(e)
    if "sage_fp8" in args.modes:
        try:
            compare = _load_compare()
            env["kernel"]["sage_fp8"] = (compare, compare.load_peer())
        except (SystemExit, Exception) as e:  # noqa: BLE001 - load_peer exits when the library is absent
            env["kernel"]["sage_fp8"] = None
            env["kernel_why"]["sage_fp8"] = f"SpargeAttn's SM90 kernel: {type(e).__name__}: {e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=[f"{h},{s}" for h, s in SHAPES], metavar="H,S",
                    help="heads,seqlen per shape (B=1, D=128)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--sparsity", type=float, default=0.75)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm-s", type=float, default=1.0, help="warm-up per (shape, mode), contenders in turn")
    ap.add_argument("--inputs", choices=("random", "topics", "segments"), default="random",
                    help="q, k: random (default) or router_bench._structured_qk's; v random")
    ap.add_argument("--test-libs", help="the test-library folder (default: $SUBBLOCK_SAGE_TEST_LIBS, "
                                        "$SUBBLOCK_SAGE_TEST_LIB_DIR)")
    ap.add_argument("--sglang-site", help="SGLang 0.5.23's site (default: $SBS_SGLANG_SITE)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
        if any(len(s) != 2 or s[0] < 1 or s[1] < 64 for s in shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes takes H,S pairs with H >= 1 and S >= 64, got {args.shapes}")
    if args.sglang_site:
        os.environ["SBS_SGLANG_SITE"] = args.sglang_site

    import torch

    import subblock_sage
    from subblock_sage.tools import power

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        print(f"sglang_step: needs an sm_90 GPU (SGLang's SM90 kernel and SpargeAttn's are sm_90a code); "
              f"this one: {cap}")
        return 2
    site = os.environ.get("SBS_SGLANG_SITE", "")
    sg_dist = sorted(Path(p).name for p in glob.glob(os.path.join(site, "sglang-*.dist-info"))) if site else []
    smi = router_bench._gpu_state("name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu")
    meta = {"device": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "cuda": torch.version.cuda, "subblock_sage": subblock_sage.__version__,
            "sglang": sg_dist[0] if sg_dist else None, "argv": sys.argv[1:] if argv is None else list(argv)}
    args.rows = []

    def save():  # after every row: a run cut off keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(dict(meta, rows=args.rows), indent=1))

    env = {}
    _load_peers(args, env)
    meta["absent"] = {k_: v_ for k_, v_ in (("router", env["router_why"]), *env["kernel_why"].items()) if v_}
    for what, why in meta["absent"].items():
        print(f"note: {what}: {why}", flush=True)
    sampler = power.Sampler(0)
    if not sampler.available:
        print("note: no NVML (nvidia-ml-py): no clock / power columns", flush=True)
    save()
    for H, S in shapes:
        q, k, v = _inputs(args.inputs, H, S, seed=H * 1000 + S % 997)
        for mode in args.modes:
            try:
                run_mode(args, mode, H, S, q, k, v, env, sampler, save)
            except Exception as e:  # noqa: BLE001 - the other shapes and modes still run
                args.rows.append({"summary": True, "H": H, "S": S, "mode": mode,
                                  "notes": [f"failed: {type(e).__name__}: {e}"]})
                print(f"H={H} S={S} {mode}: failed: {type(e).__name__}: {e}", flush=True)
                save()
            torch.cuda.empty_cache()  # the mode's plans, outputs and peer buffers
        del q, k, v
        torch.cuda.empty_cache()
    head = [f"{meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']}), subblock-sage {meta['subblock_sage']}, "
            f"{meta['sglang'] or 'no SGLang'}; nvidia-smi: {meta['nvidia_smi']}",
            f"B=1 D=128 sparsity {args.sparsity}, {args.inputs} inputs; ms: median over {args.rounds} rounds of the "
            f"median of {args.reps} isolated calls (range: the rounds'); b2b: mean of {args.reps} queued calls", ""]
    print(_table(args.rows, head), flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
