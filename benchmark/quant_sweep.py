"""The Sage quantizer against a copy of the same bytes (issue 19: >= 0.8), at the bench's shapes and
S=75776, whole or its K/V-only pass, and the host cost of a replayed call split into its parts. GPU time per call from CUDA graphs of 10 calls (no host
time in it); median of 15 replays.

To run (GPU machine, wheels installed):
    python benchmark/quant_sweep.py [--json PATH] [--no-host] [--l2-persist-mb MB] [--kv-only]
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage import replay
from subblock_sage.ops import quantize as Q
from subblock_sage.tools import bench

from host_time import host_us_per_call, write_rows  # benchmark/host_time.py (this script's folder)

SHAPES = ((14, 37760), (2, 37760), (4, 8192), (14, 75776))


def graph_ms(fn, n: int = 10, reps: int = 15) -> float:
    """GPU ms per call of ``fn``: a CUDA graph of ``n`` calls, median of ``reps`` replays."""
    return bench.graph_ms(bench.capture(fn, n), n, reps=reps)


def host_parts(h: int, s: int) -> dict:
    """Host microseconds of the pieces of one replayed Sage call (GPU kept busy)."""
    q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    gq, gk = -(-s // 64), -(-s // 128)
    idx = torch.rand(1, h, gq, gk, device="cuda").topk(gk // 4, dim=-1).indices.int().contiguous()
    cnt = torch.full((1, h, gq), gk // 4, dtype=torch.int32, device="cuda")
    call = lambda: subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=128,  # noqa: E731
                                                  compute_mode="sage_fp8")
    call()
    key, ptrs = replay.keyed(q, k, v, idx, cnt, None, None, 128, None, "sage_fp8", "BSHD")
    rep = replay.lookup(key)
    parts = {
        "whole call": call,
        "keyed (key and pointers)": lambda: replay.keyed(q, k, v, idx, cnt, None, None, 128, None, "sage_fp8", "BSHD"),
        "Replay.launch": lambda: rep.launch(ptrs, None),
        "two torch.empty": lambda: (torch.empty(rep.workspace_bytes, dtype=torch.uint8, device=0),
                                    torch.empty_like(q)),
    }
    res = {}
    for name, fn in parts.items():
        low, mid = host_us_per_call(fn, 50, rounds=6)
        res[name] = round(low, 1), round(mid, 1)
    return res


def set_persisting_l2(mb: float) -> str:
    """``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)``, the L2 set-aside for lines marked
    persisting (an experiment: can the statistics reads' ``evict_last`` lines stay in L2 for the
    second read?); returns the L2 attributes and the limit set. Run 44 (MEASUREMENTS.md,
    thirteenth session): every set-aside made the quantizer and a plain copy slower."""
    import ctypes

    rt = ctypes.CDLL("libcudart.so.13")  # (torch has it loaded)
    torch.cuda.init()
    dev = torch.cuda.current_device()
    val = ctypes.c_int()
    rt.cudaDeviceGetAttribute(ctypes.byref(val), 108, dev)  # cudaDevAttrMaxPersistingL2CacheSize
    max_b = val.value
    rt.cudaDeviceGetAttribute(ctypes.byref(val), 38, dev)  # cudaDevAttrL2CacheSize
    l2 = val.value
    want = min(int(mb * 2**20), max_b)
    err = rt.cudaDeviceSetLimit(0x06, ctypes.c_size_t(want))  # cudaLimitPersistingL2CacheSize
    got = ctypes.c_size_t()
    rt.cudaDeviceGetLimit(ctypes.byref(got), 0x06)
    return f"L2 {l2 / 2**20:.1f} MiB, max persisting {max_b / 2**20:.1f} MiB, set {want} -> error {err}, limit {got.value}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--no-host", action="store_true", help="skip the host-cost parts")
    ap.add_argument("--l2-persist-mb", type=float, default=0.0,
                    help="set an L2 set-aside for persisting lines first (the run 44 experiment)")
    ap.add_argument("--kv-only", action="store_true",
                    help="K and V only (with_q=False: the pass of a call whose kernel quantizes Q itself)")
    ns = ap.parse_args(argv)
    if ns.l2_persist_mb:
        print("#", set_persisting_l2(ns.l2_persist_mb))
    rows = []
    print(f"# {torch.cuda.get_device_name()}; GPU ms per call from CUDA graphs")
    for h, s in SHAPES:
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        quant = (lambda: Q.quantize_canonical(q, k, v, with_q=False)) if ns.kv_only else (  # noqa: E731
            lambda: subblock_sage.quantize_sage(q, k, v))
        nbytes = (6 if ns.kv_only else 9) * q.numel()
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy = graph_ms(lambda: dst.copy_(src))
        print(f"H={h} S={s}: copy of the same bytes {copy:.4f} ms")
        base = quant()
        again = quant()
        same = all(torch.equal(base[x].view(torch.uint8) if base[x].dtype == torch.float8_e4m3fn else base[x],
                               again[x].view(torch.uint8) if again[x].dtype == torch.float8_e4m3fn else again[x])
                   for x in base)
        ms = graph_ms(quant)
        rows.append(dict(H=h, S=s, kv_only=ns.kv_only, ms=round(ms, 4), copy_ms=round(copy, 4),
                         of_copy=round(copy / ms, 3), identical=same))
        print(f"  quantizer: {ms:.4f} ms, {copy / ms:.3f} of copy, two calls identical: {same}", flush=True)
    for h, s in () if ns.no_host else ((4, 8192), (14, 37760)):
        parts = host_parts(h, s)
        print(f"host us (min, median) of a replayed sage_fp8 call at H={h} S={s}: {parts}")
        rows.append(dict(H=h, S=s, host_parts_us=parts))
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
