"""The Q numerics of the Sage quantizer: one 32-row scale group of Q quantized by two warps of 16
rows each; lane = (row parity, 16-byte column chunk), 8 loads in flight (32 registers of bf16).

The steps (``q_rows_load``, ``q_rows_amax``, ``q_group_scale``, ``q_code_words``) are shared by
the quantizer's Q tiles (``quantize_q_tile``, codes to global memory) and the sm_90a Sage kernels
that quantize their own Q tile (``aot/kernels/sm90/flat.py``, codes to shared memory), so both
give the same codes and scales: one definition of the numerics. They are plain functions (traced
inline, Python loops unroll); the caller's ``@cute.jit`` holds the dynamic control flow.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .ptx import (div_full, f32, gaddr, hi_f32, l2_policy, lo_f32, load_words, max_abs_bf16x2, pack_s8x4, rint_s32,
                  row, st_hint)
from .consts import AMAX_FLOOR, NCC, Q_GROUP, Q_ROWS, VEC


def q_rows_load(gQ, row0, cc, pol):
    """Rows ``row0 + 2*i`` (i < 8) of the (S, 128) bf16 view ``gQ``, chunk ``cc``: 8 loads in
    flight, as packed words. Rows past S load row S-1 again (the amax is unchanged; callers
    store only rows < S)."""
    S = gQ.shape[0]
    return [load_words(gQ, cutlass.min(row0 + 2 * i, S - 1), cc, pol) for i in range(Q_GROUP // 4)]


def q_rows_amax(vals):
    """The warp's |x| max over its loads (``q_rows_load``) as bf16 bits; every lane holds it."""
    # |x| max on packed bf16 pairs (one max.xorsign.abs per word, exact), then over the halves as
    # integers (for non-negative floats the integer order is the float order)
    packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
    packed.fill(0)
    for w in vals:
        for p in range(VEC // 2):
            packed[p] = max_abs_bf16x2(packed[p], w[p])
    amax_bits = Int32(0)
    for p in range(VEC // 2):
        wp = packed[p] & Int32(0x7FFF7FFF)
        amax_bits = cutlass.max(amax_bits, cutlass.max(wp & Int32(0xFFFF), wp >> 16))
    return cute.arch.warp_reduction_max(amax_bits)


def q_group_scale(bits_a, bits_b, group, S):
    """(scale, 1/scale) of scale group ``group`` from its two warps' amax bits: FlashInfer's
    ``max(amax, 1e-7) / 127``; a group wholly past S (pad group) gets ``1e-7 / 127``."""
    amax = f32(cutlass.max(bits_a, bits_b) << 16)
    amax = Float32(cutlass.select_(group * Q_GROUP >= S, Float32(0.0), amax))
    amax = cute.arch.fmax(amax, Float32(AMAX_FLOOR))
    scale = div_full(amax, Float32(127.0))
    return scale, div_full(Float32(1.0), scale)


def q_code_words(w, inv):
    """The 8 INT8 codes of one load (``rint(x / scale)``; |code| <= 127 since |x| <= amax) packed
    in 2 words, element 0 in the low byte of the first."""
    y = []
    for p in range(VEC // 2):
        y.append(rint_s32(lo_f32(w[p]) * inv))
        y.append(rint_s32(hi_f32(w[p]) * inv))
    return [pack_s8x4(y[0], y[1], y[2], y[3]), pack_s8x4(y[4], y[5], y[6], y[7])]


def q_tile_rows(tile, warp, lane):
    """(scale group, first row) of the lane in Q tile ``tile``: warps 2w and 2w+1 take group
    ``4*tile + w``, 16 rows each; the lane's rows are ``row0 + 2*i`` (i < 8; lane = row parity,
    column chunk)."""
    group = tile * (Q_ROWS // Q_GROUP) + warp // 2
    return group, group * Q_GROUP + (warp % 2) * (Q_GROUP // 2) + lane // NCC


@cute.jit
def quantize_q_tile(mQ: cute.Tensor, mQ8: cute.Tensor, mQS: cute.Tensor, b, h, tile, warp, lane,
                    sQAmax: cute.Tensor):
    """Rows ``[Q_ROWS*tile, Q_ROWS*tile + Q_ROWS)`` of Q(b, h): warps 2w and 2w+1 quantize scale
    group ``tile*4 + w`` (32 rows: 16 each). The group amax is the max of the two warps' amax
    (smem, one CTA barrier: every thread of the CTA is in this function). Q is read and written
    once: its loads and stores are evict_first, so that they do not push out the K/V lines of
    the K-mean sample, which the K/V units read again."""
    cc = lane % NCC
    S = mQ.shape[1]
    gQ = mQ[b, None, h, None]
    gQ8 = mQ8[b, None, h, None]
    group, row0 = q_tile_rows(tile, warp, lane)
    pol = l2_policy("evict_first")
    vals = q_rows_load(gQ, row0, cc, pol)
    q_tile_codes(vals, gQ8, mQS, b, h, group, row0, S, warp, lane, sQAmax, pol)


@cute.jit
def q_tile_codes(vals, gQ8: cute.Tensor, mQS: cute.Tensor, b, h, group, row0, S, warp, lane,
                 sQAmax: cute.Tensor, pol):
    """The codes and scale of the lane's rows ``vals`` (``q_rows_load`` at ``q_tile_rows``):
    the group amax from both warps of the group (one CTA barrier: every thread of the CTA
    calls this), the scale to ``q_scale`` (groups < its extent), the codes of rows < S."""
    cc = lane % NCC
    amax_bits = q_rows_amax(vals)
    if lane == 0:
        sQAmax[warp] = amax_bits
    cute.arch.sync_threads()
    scale, inv = q_group_scale(sQAmax[warp], sQAmax[warp ^ 1], group, S)
    if lane == 0 and warp % 2 == 0:
        if group < mQS.shape[2]:  # the last tile may cover groups past ceil(Sq/128)*4
            mQS[b, h, group] = scale
    for i in cutlass.range_constexpr(Q_GROUP // 4):
        r = row0 + 2 * i
        if r < S:
            st_hint(gaddr(row(gQ8, r, cc).iterator), q_code_words(vals[i], inv), pol)
