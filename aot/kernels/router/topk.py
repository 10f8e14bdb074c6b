"""The per-row top-k of ``router_select`` (each warp selects its rows, in either launch shape).

The row's order keys (``ptx.order_key``) are read from ``scores`` once into the warp's
``ROW_WORDS`` (2176) words of the shared memory the staged tiles used (rows of more key blocks
read ``scores`` on every pass: each pass over global memory is a chain of ~19 dependent L2 reads
per lane at Gk = 590, ~5 us, five passes per row and four rows per warp: ~100 us per fused launch
on an H100, MEASUREMENTS.md 2026-12-07); an exact radix select (four 8-bit passes over the keys, a
256-bin histogram per warp in shared memory) finds the ``topk``-th largest key and how many of
the blocks equal to it to take; one more pass writes the chosen ids in ascending order (ballot
prefix sums: blocks above the threshold, then the equal ones from the lowest id), zeros after
them, and the row's count. Rows flagged in ``dense_rows`` (read only when ``has_dense``) list
every key block. The SIMT kernel (``simt.py``) keeps the global-memory passes (``sRow`` None): a
GPU run compares the two selections too.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from .config import HIST, ROW_WORDS
from .ptx import order_key


@cute.jit
def row_key(mS: cute.Tensor, sRow, staged, rb, b, h, i, c):
    """Column ``c``'s unsigned order key (as int32) of row (b, h, i): from the warp's staged
    copy (``staged``) or from ``scores``."""
    u = Int32(0)
    if cutlass.const_expr(sRow is None):
        u = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
    else:
        if staged:
            u = sRow[rb + c]
        else:
            u = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
    return u

@cute.jit
def select_row(mS: cute.Tensor, mIdx: cute.Tensor, mCnt: cute.Tensor, sHist: cute.Tensor, sRow,
               topk: Int32, b, h, i, warp, lane):
    """Warp: the ``topk`` best blocks of row (b, h, i), ties to the lower id, ascending; then
    zeros up to the capacity, and the row's count. ``sHist``: HIST int32 per warp. ``sRow``
    (None: read ``scores`` on every pass): ROW_WORDS int32 per warp; a row of at most that many
    blocks is read from ``scores`` once, its keys kept there for the five passes (each pass
    over global memory is a chain of dependent L2 reads: ~5 us per pass of 590 blocks)."""
    gk = mS.shape[3]
    cap = mIdx.shape[3]
    hb = warp * HIST
    rb = warp * ROW_WORDS
    staged = gk <= ROW_WORDS
    if cutlass.const_expr(sRow is not None):
        # the warp's previous row is done with the buffer (its last pass reads a clamped
        # column another lane now writes)
        cute.arch.sync_warp()
        if staged:
            for c in cutlass.range(lane, gk, 32, unroll=4):
                sRow[rb + c] = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
            cute.arch.sync_warp()
    need = topk  # blocks still to take among those matching the prefix
    prefix = Int32(0)  # the threshold's high bits found so far (unsigned key)
    for p in cutlass.range_constexpr(4):
        for r in cutlass.range_constexpr(HIST // 32):
            sHist[hb + lane * (HIST // 32) + r] = Int32(0)
        cute.arch.sync_warp()
        for c in cutlass.range(lane, gk, 32, unroll=1):
            u = row_key(mS, sRow, staged, rb, b, h, i, c)
            match = True
            if cutlass.const_expr(p > 0):
                match = ((u >> (32 - 8 * p)) & Int32((1 << (8 * p)) - 1)) == prefix
            if match:
                cute.arch.atomic_add(sHist.iterator + hb + ((u >> (24 - 8 * p)) & Int32(0xFF)), Int32(1))
        cute.arch.sync_warp()
        # lane l owns bins 255-8l .. 248-8l (descending digits); scan the lanes
        own = Int32(0)
        for r in cutlass.range_constexpr(HIST // 32):
            own = own + sHist[hb + HIST - 1 - lane * (HIST // 32) - r]
        incl = own
        for d in cutlass.range_constexpr(5):
            t = cute.arch.shuffle_sync_up(incl, 1 << d)
            if lane >= (1 << d):
                incl = incl + t
        hit = cute.arch.vote_ballot_sync(incl >= need)
        src = cute.arch.popc(~hit & (hit - 1))  # the first lane reaching ``need``
        digit = Int32(0)
        above = Int32(0)
        if lane == src:
            cum = incl - own
            found = Int32(0)
            for r in cutlass.range_constexpr(HIST // 32):
                bin_ = HIST - 1 - lane * (HIST // 32) - r
                cnt = sHist[hb + bin_]
                if (found == 0) & (cum + cnt >= need):
                    found = Int32(1)
                    digit = bin_
                    above = cum
                cum = cum + cnt
        digit = cute.arch.shuffle_sync(digit, src)
        above = cute.arch.shuffle_sync(above, src)
        need = need - above
        prefix = (prefix << 8) | digit
        cute.arch.sync_warp()
    thr = prefix ^ Int32(-0x80000000)  # back to the signed order key
    lt_mask = (Int32(1) << lane) - 1
    base = Int32(0)
    eq_seen = Int32(0)
    for c0 in cutlass.range(0, gk, 32, unroll=1):
        c = c0 + lane
        valid = c < gk
        key = row_key(mS, sRow, staged, rb, b, h, i, cutlass.min(c, gk - 1)) ^ Int32(-0x80000000)
        gt = valid & (key > thr)
        eq = valid & (key == thr)
        eq_mask = cute.arch.vote_ballot_sync(eq)
        take_eq = eq & ((eq_seen + cute.arch.popc(eq_mask & lt_mask)) < need)
        sel = gt | take_eq
        sel_mask = cute.arch.vote_ballot_sync(sel)
        if sel:
            mIdx[b, h, i, base + cute.arch.popc(sel_mask & lt_mask)] = c
        base = base + cute.arch.popc(sel_mask)
        eq_seen = eq_seen + cute.arch.popc(eq_mask)
    for c in cutlass.range(base + lane, cap, 32, unroll=1):
        mIdx[b, h, i, c] = Int32(0)
    if lane == 0:
        mCnt[b, h, i] = base

@cute.jit
def finish_row(mS: cute.Tensor, mIdx: cute.Tensor, mCnt: cute.Tensor, mDense: cute.Tensor, has_dense: Int32,
               sHist: cute.Tensor, sRow, topk: Int32, b, h, i, warp, lane):
    """Warp: row i's plan: every key block when it is dense, else :func:`select_row`."""
    gk = mS.shape[3]
    is_dense = Int32(0)
    if has_dense != 0:
        is_dense = mDense[b, h, i]
    if is_dense != 0:
        for c in cutlass.range(lane, mIdx.shape[3], 32, unroll=1):
            mIdx[b, h, i, c] = cutlass.select_(c < gk, c, Int32(0))
        if lane == 0:
            mCnt[b, h, i] = gk
    else:
        select_row(mS, mIdx, mCnt, sHist, sRow, topk, b, h, i, warp, lane)

