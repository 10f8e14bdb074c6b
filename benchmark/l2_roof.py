"""How fast can any kernel move the K/V blocks a plan selects from L2 into the SMs? (H200 roof)

A block-sparse attention kernel with 64-row query blocks loads, for every (row, listed block),
the whole K and V block: Sage 2 x 16 KiB (INT8 K, FP8 V^T), bf16 2 x 32 KiB. With random plans
neighbouring rows share few blocks, so these bytes come from L2 once per row. This script times
a load-only Triton kernel with exactly that gather (same plan, same grid order, same layouts:
K [H, S, 128], V^T [H, 128, S_pad]) that does nothing with the data except xor it together, so
its time is a lower bound for any kernel of this tile shape: attention time >= bytes / roof.

    python3 benchmark/l2_roof.py [--shape 14,37760] [--density 0.25] [--json out.json]

Also times a contiguous read of an L2-resident buffer (the plain L2 read roof) and an
HBM-sized read (the DRAM roof) for scale. Timing: CUDA events, warm-up, median of 20.
"""

import argparse
import json
import math
import pathlib

import torch
import triton
import triton.language as tl

from subblock_sage import bench


@triton.jit
def _gather(K, V, IDX, CNT, OUT, S, VROW, GQ, CAP, BK: tl.constexpr, WK: tl.constexpr, WV: tl.constexpr):
    # K rows are WK int32 words (128 elements); V^T has one row of VROW words per channel, a
    # block's BK keys are WV words of it
    qb, h = tl.program_id(0), tl.program_id(1)
    row = h * GQ + qb
    n = tl.load(CNT + row)
    acc_k = tl.zeros([BK, WK], tl.int32)
    acc_v = tl.zeros([128, WV], tl.int32)
    rk = tl.arange(0, BK)[:, None]
    ck = tl.arange(0, WK)[None, :]
    rv = tl.arange(0, 128)[:, None]
    cv = tl.arange(0, WV)[None, :]
    for i in range(n):
        b = tl.load(IDX + row * CAP + i)
        keys = b * BK + rk
        acc_k ^= tl.load(K + (h * S + keys) * WK + ck, mask=keys < S, other=0)
        acc_v ^= tl.load(V + (h * 128 + rv) * VROW + b * WV + cv)
    tl.store(OUT + row, tl.xor_sum(tl.xor_sum(acc_k, 1), 0) ^ tl.xor_sum(tl.xor_sum(acc_v, 1), 0))


@triton.jit
def _stream(X, OUT, N, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid, np_ = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for it in range(ITERS):
        for start in range(pid * BLOCK, N, np_ * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc ^= tl.load(X + offs, mask=offs < N, other=0)
    tl.store(OUT + pid, tl.xor_sum(acc, 0))


def gather_roof(H, S, density, elem_bytes, kind="random", reps=20):
    """(ms, bytes) of the best load-only launch over a few warp counts."""
    bk, D = 128, 128
    nkb = math.ceil(S / bk)
    sp = nkb * bk
    index, counts = bench.make_plan(1, H, S, S, density, kind, block_size_k=bk)
    gq, cap = index.shape[2], index.shape[3]
    wk = D * elem_bytes // 4  # int32 words per K row
    wv = bk * elem_bytes // 4  # int32 words per V^T row segment of one block
    K = torch.randint(-2**31, 2**31 - 1, (H, S, wk), dtype=torch.int32, device="cuda")
    V = torch.randint(-2**31, 2**31 - 1, (H, D, sp * elem_bytes // 4), dtype=torch.int32, device="cuda")
    out = torch.empty(H * gq, dtype=torch.int32, device="cuda")
    moved = int(counts.long().sum()) * 2 * bk * D * elem_bytes
    best = None
    for nw in (4, 8):
        fn = lambda: _gather[(gq, H)](K, V, index, counts, out, S, V.stride(1), gq, cap,  # noqa: E731
                                      BK=bk, WK=wk, WV=wv, num_warps=nw)
        ms = bench.time_ms(fn, warmup=3, reps=reps)
        best = ms if best is None else min(best, ms)
    return best, moved


def stream_roof(nbytes, iters, reps=20):
    n = nbytes // 4
    x = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * 8
    out = torch.empty(grid, dtype=torch.int32, device="cuda")
    fn = lambda: _stream[(grid,)](x, out, n, BLOCK=2048, ITERS=iters, num_warps=8)  # noqa: E731
    ms = bench.time_ms(fn, warmup=3, reps=reps)
    return ms, nbytes * iters


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="14,37760", help="H,S")
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    H, S = (int(x) for x in a.shape.split(","))
    rows = []
    for label, ms, nbytes in (
        ("L2-resident contiguous read (24 MiB x 20)", *stream_roof(24 << 20, 20)),
        ("HBM contiguous read (4 GiB)", *stream_roof(4 << 30, 1)),
    ):
        rows.append({"what": label, "ms": ms, "GB": nbytes / 1e9, "TB/s": nbytes / ms / 1e9})
    cases = [(kind, a.density) for kind in ("random", "local")] + [("random", 1.0)]
    for elem, mode in ((1, "sage (INT8 K + FP8 V)"), (2, "bf16 (bf16 K + V)")):
        for kind, density in cases:
            ms, nbytes = gather_roof(H, S, density, elem, kind)
            plan = f"{density} {kind}" if density < 1 else "1.0"
            rows.append({"what": f"{mode} K/V gather, {plan}", "ms": ms, "GB": nbytes / 1e9,
                         "TB/s": nbytes / ms / 1e9})
    print(f"{torch.cuda.get_device_name()}, H={H} S={S}, 128-key blocks, 64-row query blocks")
    print("| load-only kernel | ms | GB moved | TB/s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['what']} | {r['ms']:.3f} | {r['GB']:.2f} | {r['TB/s']:.2f} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
