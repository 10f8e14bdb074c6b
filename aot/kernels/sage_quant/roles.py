"""The per-role device code of the Sage quantizer's K/V work: the K-mean sample partials and the
V bound taken from them, the K mean summed from its partials, one unit's rows, V statistics and
their reductions, and the quantization of one K or V block (the kernel and its ticket roles:
``kernel.py``; the Q tiles: ``sage_numerics/q_tile.py``; the slots these publish and wait for: ``sync.py``).
Every reduction runs in a fixed order, so its result is bit-identical whatever the schedule.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float8E4M3FN, Float32, Int32, Int64

from aot.contract import SAGE_K_MEAN_SPLIT, SAGE_V_BOUND_MARGIN, SAGE_V_BOUND_MAX, sage_k_mean_rows

from aot.kernels.sage_numerics.ptx import (bf16x2, div_full, f32, flag, gaddr, hi_f32, l2_policy, ld16_hint_or0, ld_shared16, ld_slot,
                  ld_vslot, ld_vslot_or0, lo_f32, load_words_or0, max_abs_bf16x2, pack_s8x4, prmt, rint_s32, row,
                  st_hint, st_shared)
from .schedule import v8_chunk
from .spec import (AMAX_FLOOR, HEAD_DIM, HI16, K_BLOCK, K_ROWS, KM_BATCH, KV_HALF, KV_K_WARPS, KV_THREADS, NCC,
                   SLOT, UNIT_BLOCKS, V8_CHUNKS, V_SCALE_MAX, VEC, VROW_BYTES, VSLOT)
from .sync import poll, poll_v, publish, publish_v, vslot_split, vtag


def v_scale_of(amax):
    """``v_scale`` from a channel's amax |V| (FlashInfer's ``max(amax, 1e-7) / 2.25``): one
    definition for the reducer, which stores it, and the quantize steps, which invert it."""
    return div_full(cute.arch.fmax(amax, Float32(AMAX_FLOOR)), Float32(V_SCALE_MAX))


def k_mean_rows(S):
    """``(n, stride)``: ``contract.sage_k_mean_rows`` on the kernel's integers."""
    return sage_k_mean_rows(S, minimum=cutlass.min, maximum=cutlass.max)


@cute.jit
def sample_part(mX: cute.Tensor, row_addr, b, h, part, tidx, lane, sRed: cute.Tensor, sFlag: cute.Tensor,
                is_v: cutlass.Constexpr):
    """Partial ``part`` (of SAGE_K_MEAN_SPLIT) over the sample keys ``j * stride`` for ``j`` in
    ``[part*c, part*c + c)`` (c = ceil(n / SPLIT); ``contract.sage_k_mean_rows``) of (b, h),
    published as the 128 slots of a row of ``sync`` at ``row_addr`` (tag ``sFlag[1]``): for K
    (``is_v`` False) the per-channel fp32 sum (a K-mean row: ``publish``), for V the
    per-channel amax |V| (a V row: ``publish_v``; bf16-exact), from which the V units take
    their scale bound (``v_bound``). One CTA of 256 threads: thread = 16-byte channel chunk
    ``tidx % 16`` of samples ``tidx // 16 + 16*i``, KM_BATCH loads in flight (one batch at n =
    512: one DRAM round trip). Fixed order (per thread in sample order, lanes l and l^16, the
    8 warps in index order; ``sRed``: 8 x 128 fp32): the same result whatever the schedule.
    Samples past n read as zeros without an access (neutral for both)."""
    n, stride = k_mean_rows(mX.shape[1])
    c = (n + SAGE_K_MEAN_SPLIT - 1) // SAGE_K_MEAN_SPLIT
    j_end = cutlass.min(part * c + c, n)
    cc = tidx % NCC
    warp = tidx // 32
    gX = mX[b, None, h, None]
    pol = l2_policy("evict_first")
    acc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
    acc.fill(0.0)
    packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
    packed.fill(0)
    for j0 in cutlass.range(part * c + tidx // NCC, j_end, NCC * KM_BATCH, unroll=1):
        words = []
        for i in cutlass.range_constexpr(KM_BATCH):
            j = j0 + NCC * i
            words.append(ld16_hint_or0(gaddr(row(gX, cutlass.min(j, n - 1) * stride, cc).iterator), pol,
                                        flag(j < j_end)))
        for i in cutlass.range_constexpr(KM_BATCH):
            for p in cutlass.range_constexpr(VEC // 2):
                if cutlass.const_expr(is_v):
                    packed[p] = max_abs_bf16x2(packed[p], words[i][p])
                else:
                    acc[2 * p] = acc[2 * p] + lo_f32(words[i][p])
                    acc[2 * p + 1] = acc[2 * p + 1] + hi_f32(words[i][p])
    if cutlass.const_expr(is_v):
        publish_v_amax(packed, row_addr, cc, warp, lane, tidx, sRed, sFlag)
    else:
        for j in cutlass.range_constexpr(VEC):
            a = acc[j]
            a = a + cute.arch.shuffle_sync_bfly(a, offset=16)
            if lane < NCC:
                sRed[warp, cc * VEC + j] = a
        cute.arch.sync_threads()
        if tidx < HEAD_DIM:
            r = Float32(0.0)
            for w in cutlass.range_constexpr(8):
                r = r + sRed[w, tidx]
            publish(row_addr + Int64(tidx * SLOT), r, sFlag[1])


@cute.jit
def publish_v_amax(packed, row_addr, cc, warp, lane, tidx, sRed: cute.Tensor, sFlag: cute.Tensor):
    """A V statistics row at ``row_addr`` (``publish_v``: one slot per channel, tag ``sFlag[1]``)
    from this thread's ``packed`` |V| amax words (VEC // 2 bf16 pairs of channel chunk ``cc``,
    their sign bits cleared here, once): per channel the max over lanes l and l^16, then over the
    8 warps in index order (``sRed``: 8 x 128 fp32); threads 0-127 publish one channel each."""
    for j in cutlass.range_constexpr(VEC):
        wj = packed[j // 2] & Int32(0x7FFF7FFF)
        m = lo_f32(wj) if j % 2 == 0 else hi_f32(wj)
        m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=16))
        if lane < NCC:
            sRed[warp, cc * VEC + j] = m
    cute.arch.sync_threads()
    if tidx < HEAD_DIM:
        acc = Float32(0.0)
        for w in cutlass.range_constexpr(8):
            acc = cute.arch.fmax(acc, sRed[w, tidx])
        publish_v(row_addr + Int64(tidx * VSLOT), acc, sFlag[1])


@cute.jit
def v_bound(sample_addr, ch, tag):
    """Channel ``ch`` of V's scale bound: ``min(SAGE_V_BOUND_MARGIN * amax, SAGE_V_BOUND_MAX)``
    of the amax over the SAGE_K_MEAN_SPLIT sampled partial rows at ``sample_addr``
    (``sample_part``, the first tickets), loaded together, only a slot not yet written polled.
    ``v_scale = v_scale_of(max(bound, amax))``: the V units quantize with ``v_scale_of(bound)``
    before the exact amax is known, right unless a key exceeds the bound (the redo tickets)."""
    slots = [ld_vslot(sample_addr + Int64(p * VROW_BYTES + ch * VSLOT)) for p in range(SAGE_K_MEAN_SPLIT)]
    acc = Float32(0.0)
    for p in cutlass.range_constexpr(SAGE_K_MEAN_SPLIT):
        bits, got = vslot_split(slots[p])
        x = f32(bits)
        if got != vtag(tag):
            x = poll_v(sample_addr + Int64(p * VROW_BYTES + ch * VSLOT), tag)
        acc = cute.arch.fmax(acc, x)
    return cute.arch.fmin(acc * Float32(SAGE_V_BOUND_MARGIN), Float32(SAGE_V_BOUND_MAX))


@cute.jit
def k_mean_of_parts(parts_addr, S, ch, tag):
    """Channel ``ch`` of the K mean from the SAGE_K_MEAN_SPLIT partial rows at ``parts_addr``
    (``sample_part``, the first tickets of this launch): their sum in index order over n
    (``div.full``). The slots are loaded together (one L2 round trip) and only one not yet
    written is polled: polled one after another, they would cost every K unit three more L2
    round trips before its loads."""
    n, _ = k_mean_rows(S)
    slots = [ld_slot(parts_addr + Int64((p * HEAD_DIM + ch) * SLOT)) for p in range(SAGE_K_MEAN_SPLIT)]
    acc = Float32(0.0)
    for p in cutlass.range_constexpr(SAGE_K_MEAN_SPLIT):
        x = f32(slots[p][0])
        if slots[p][1] != tag:
            x = poll(parts_addr + Int64((p * HEAD_DIM + ch) * SLOT), tag)
        if cutlass.const_expr(p == 0):
            acc = x
        else:
            acc = acc + x
    return div_full(acc, Float32(n))


# ---------------------------------------------------------------- K/V statistics of one unit


def block_rows(mX: cute.Tensor, b, h, blk, tidx, pol):
    """This thread's rows of 64-key block ``blk`` of K or V (b, h): 8 rows x 16 bytes
    (channels ``8*(t%16)..+7``, rows ``64*blk + 8*(t//16)..+7``, t = tidx % 128) as 8 x 4
    packed-pair words, one 16-byte load each with L2 policy ``pol``; a row past Sk (or a
    block past NB) reads as zeros without an access. The statistics and the quantization use
    the same mapping."""
    t = tidx % KV_HALF
    row0 = blk * K_BLOCK + (t // NCC) * K_ROWS
    gX = mX[b, None, h, None]
    return [load_words_or0(gX, row0 + j, t % NCC, pol) for j in range(K_ROWS)]


@cute.jit
def v_stats_unit(vals, row_addr, tidx, lane, sRed: cute.Tensor, sFlag: cute.Tensor):
    """The statistics row of a V unit at ``row_addr`` (``publish_v``: one slot per channel, tag
    ``sFlag[1]``) from
    its rows ``vals`` (``block_rows``; warps 0-3 the unit's first block, warps 4-7 its
    second): per channel the amax |V| over the unit's keys (rows past Sk are zeros: neutral).
    Fixed order: per thread in key order, lanes l and l^16, then the 8 warps in index order.
    (K has no statistics: its mean comes from a key sample, ``sample_part``.)"""
    cc = tidx % KV_HALF % NCC
    warp = tidx // 32
    # |V| amax on packed bf16 pairs, one max.xorsign.abs per word (exact); the sign bits are
    # cleared once at the end
    packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
    packed.fill(0)
    for j in cutlass.range_constexpr(K_ROWS):
        for p in cutlass.range_constexpr(VEC // 2):
            packed[p] = max_abs_bf16x2(packed[p], vals[j][p])
    publish_v_amax(packed, row_addr, cc, warp, lane, tidx, sRed, sFlag)


@cute.jit
def reduce_rows(row0_addr, n, tidx, sRed: cute.Tensor, tag):
    """Per channel, the max of the ``n`` V statistics rows from ``row0_addr`` (rows VROW_BYTES
    apart), each slot waited for (``poll_v``): threads 128c..128c+127 take the c-th half of the
    rows (in index order), 8 loads in flight, then the two halves: the same result whatever
    the schedule. Valid in threads 0-127."""
    ch = tidx % HEAD_DIM
    half = tidx // KV_HALF
    n0 = (n + 1) // 2
    cnt = n0
    if half == 1:
        cnt = n - n0
    base = row0_addr + Int64(half * n0) * VROW_BYTES + Int64(ch * VSLOT)
    t16 = vtag(tag)
    acc = Float32(0.0)
    for r0 in cutlass.range(0, cnt, 8, unroll=1):
        words = []
        for i in cutlass.range_constexpr(8):
            # a row past cnt reads as a ready +0 (neutral for the amax, which is >= 0)
            words.append(ld_vslot_or0(base + Int64(r0 + i) * VROW_BYTES, flag(r0 + i < cnt), t16))
        for i in cutlass.range_constexpr(8):
            bits, got = vslot_split(words[i])
            x = f32(bits)
            if got != t16:
                x = poll_v(base + Int64(r0 + i) * VROW_BYTES, tag)
            acc = cute.arch.fmax(acc, x)
    sRed[half, ch] = acc
    cute.arch.sync_threads()
    res = cute.arch.fmax(sRed[0, ch], sRed[1, ch])
    cute.arch.sync_threads()  # (sRed is reused)
    return res


# ---------------------------------------------------------------- quantize one block


@cute.jit
def quantize_k_block(vals, mK8, mKS, b, h, blk, S, tidx, warp, lane, sStat: cute.Tensor, sAmax: cute.Tensor, pol):
    """Block ``blk`` of K(b, h), if ``blk < NB``, from this thread's rows ``vals``
    (``block_rows``: rows past Sk are zeros): centre by ``sStat[0]`` (the K mean), amax of
    the block's valid rows, INT8 codes and ``k_scale``. One warp group (threads 0-127 or
    128-255) per block; thread = 8 rows x 8 channels. The rows stay packed bf16 (32
    registers): the amax pass takes per-channel max / min of the raw values (max(max_x - m,
    m - min_x) == max |x - m| bit for bit: fp32 subtraction is monotonic and sign-symmetric;
    a row past Sk stands in as the thread's first row, a thread without a valid row adds 0)
    and the code pass computes x - m afresh, so no centred fp32 tile is live across the
    barrier. Per element of the code pass: unpack, subtract, scale, cvt.rni, 3/4 prmt."""
    half = tidx // KV_HALF
    t = tidx % KV_HALF
    cc = t % NCC
    g = t // NCC  # 8-row group within the 64-key block
    nb = (S + K_BLOCK - 1) // K_BLOCK
    gK8 = mK8[b, None, h, None]
    if blk < nb:
        row0 = blk * K_BLOCK + g * K_ROWS
        amax = Float32(0.0)
        mean = cute.local_tile(sStat[0, None], (VEC,), (cc,)).load()
        for p in cutlass.range_constexpr(VEC // 2):
            a = vals[0][p]
            z = vals[0][p]
            for j in cutlass.range_constexpr(1, K_ROWS):
                w = Int32(cutlass.select_(row0 + j < S, vals[j][p], vals[0][p]))
                a = bf16x2("max", a, w)
                z = bf16x2("min", z, w)
            for e in cutlass.range_constexpr(2):
                hi = lo_f32(a) if e == 0 else hi_f32(a)
                lo = lo_f32(z) if e == 0 else hi_f32(z)
                m = mean[2 * p + e]
                amax = cute.arch.fmax(amax, cute.arch.fmax(hi - m, m - lo))
        if row0 >= S:
            amax = Float32(0.0)
        amax = cute.arch.warp_reduction_max(amax)
        # the block's 4 warps meet at their warp group's named barrier (one block per warp
        # group and call: sAmax is written once per warp)
        if lane == 0:
            sAmax[warp] = amax
        if half == 0:
            cute.arch.barrier(barrier_id=1, number_of_threads=KV_HALF)
        else:
            cute.arch.barrier(barrier_id=2, number_of_threads=KV_HALF)
        amax = Float32(AMAX_FLOOR)
        for w in cutlass.range_constexpr(KV_K_WARPS):
            amax = cute.arch.fmax(amax, sAmax[half * (KV_K_WARPS) + w])
        scale = div_full(amax, Float32(127.0))
        inv = div_full(Float32(1.0), scale)
        if t == 0:
            if blk < mKS.shape[2]:
                mKS[b, h, blk] = scale
        for j in cutlass.range_constexpr(K_ROWS):
            r = row0 + j
            if r < S:
                # the mean from shared memory per row: 8 registers fewer across this loop (the
                # kernel is at its 64-register bound)
                mean = cute.local_tile(sStat[0, None], (VEC,), (cc,)).load()
                mv = [mean[i] for i in range(VEC)]
                y = []
                for p in cutlass.range_constexpr(VEC // 2):
                    y.append(rint_s32((lo_f32(vals[j][p]) - mv[2 * p]) * inv))
                    y.append(rint_s32((hi_f32(vals[j][p]) - mv[2 * p + 1]) * inv))
                st_hint(gaddr(row(gK8, r, cc).iterator),
                        [pack_s8x4(y[0], y[1], y[2], y[3]), pack_s8x4(y[4], y[5], y[6], y[7])], pol)


@cute.jit
def quantize_v_block(vals, sV8: cute.Tensor, blk, S, tidx, lane, sStat: cute.Tensor):
    """Block ``blk`` of V(b, h), if ``blk < NB``, from this thread's rows ``vals``
    (``block_rows``: a token past Sk is +0, so its fp8 byte is 0x00: 0 * inv = +0, inv > 0):
    FP8 per channel (``sStat[1]``: 1 / v_scale), transposed, 16-token permutation (layout:
    the package docstring). Thread = 8 consecutive tokens x 8 channels; lanes l and
    l^16 hold the two token octets of one 16-token group. Each converts its token pairs into
    packed fp8 pairs (cvt.rn.satfinite.e4m3x2), then the pair swaps half of them with its
    partner (8 shuffles) so that each holds 4 whole 16-byte v_fp8 rows: PERM16 puts the
    pairs of a row in the order lo0 hi0 lo1 hi1 lo2 hi2 lo3 hi3 (lo: tokens 0-7, hi: tokens
    8-15); one prmt per output word, its selector set by the lane's half. The rows go to the
    unit's staging area ``sV8`` (``v8_chunk``), which ``store_v_unit`` writes out a whole
    channel line at a time after a barrier: written straight from here, each store of a warp
    would touch 32 channels' 16 bytes, 1024 half-sector L2 requests per unit (H200,
    H=14, S=37760: 4.2 M of the K/V pass's 4.8 M L2 write requests, the L2 at 78 % of its
    throughput against DRAM at 52 %; MEASUREMENTS.md, 2026-12-02: "the Sage quantizer's V stores,
    a channel line at a time")."""
    t = tidx % KV_HALF
    cc = t % NCC
    o = t // NCC  # token octet within the 64-key block
    upper = o % 2  # tokens 8-15 of their 16-token group (lanes 16-31)
    nb = (S + K_BLOCK - 1) // K_BLOCK
    four = cute.make_rmem_tensor(cute.make_layout((4,)), Int32)
    if blk < nb:
        mine = []  # [wi][c]: fp8 codes of tokens 4wi..4wi+3, channel c, as one word
        for wi in cutlass.range_constexpr(2):
            mine.append([])
            for c in cutlass.range_constexpr(VEC):
                for e in cutlass.range_constexpr(4):
                    w = vals[4 * wi + e][c // 2]
                    four[e] = (w << 16) if c % 2 == 0 else (w & Int32(HI16))
                # 1 / scale of the channel from shared memory at its use (the kernel is at its
                # 64-register bound)
                y = (four.load().bitcast(Float32) * sStat[1, cc * VEC + c]).to(Float8E4M3FN)
                mine[wi].append(y.bitcast(Int32)[0])
        sel_a = Int32(cutlass.select_(upper == 1, Int32(0x1054), Int32(0x5410)))
        sel_b = Int32(cutlass.select_(upper == 1, Int32(0x3276), Int32(0x7632)))
        row = cute.make_rmem_tensor(cute.make_layout((4,)), Int32)
        # the lower lane writes channels 0-3 of its chunk, the upper lane 4-7
        for c in cutlass.range_constexpr(VEC // 2):
            for wi in cutlass.range_constexpr(2):
                k0 = mine[wi][c]
                k1 = mine[wi][c + VEC // 2]
                send = Int32(cutlass.select_(upper == 1, k0, k1))
                kw = Int32(cutlass.select_(upper == 1, k1, k0))
                got = cute.arch.shuffle_sync_bfly(send, offset=16)
                # row words 2wi, 2wi+1: (lo pair 2wi, hi pair 2wi), (lo 2wi+1, hi 2wi+1)
                row[2 * wi] = prmt(kw, got, sel_a)
                row[2 * wi + 1] = prmt(kw, got, sel_b)
            chan = cc * VEC + upper * (VEC // 2) + c
            st_shared(sV8.iterator + v8_chunk(chan, (blk % UNIT_BLOCKS) * 4 + o // 2, V8_CHUNKS),
                        [row[0], row[1], row[2], row[3]])


@cute.jit
def store_v_unit(sV8: cute.Tensor, mV8, b, h, un, S, tidx, pol):
    """The staged codes of V unit ``un`` of (b, h) (``quantize_v_block``, after a barrier) to
    v_fp8: 8 lanes per channel line (the unit's UNIT_BLOCKS * 64 columns), 16 bytes each, so
    that a warp's store is 4 channels' whole lines. Blocks past NB, and any past the output's
    extent (a too-small output; the runtime passes NB*64), are not written."""
    nb = (S + K_BLOCK - 1) // K_BLOCK
    gV8 = mV8[b, h, None, None]
    for k in cutlass.range(HEAD_DIM * V8_CHUNKS // KV_THREADS, unroll=1):  # (unrolled, sm_120a spills 8 bytes)
        idx = k * KV_THREADS + tidx
        chan = idx // V8_CHUNKS
        j = idx % V8_CHUNKS
        blk = un * UNIT_BLOCKS + j // 4
        if blk < nb and (blk + 1) * K_BLOCK <= mV8.shape[3]:
            words = ld_shared16(sV8.iterator + v8_chunk(chan, j, V8_CHUNKS))
            st_hint(gaddr(cute.local_tile(gV8[chan, None], (16,), (un * V8_CHUNKS + j,)).iterator), words, pol)
