"""The router's pooling as a role of the Sage quantizer's pass (variant ``pool``): the pooled
cells of Q and K (``python/subblock_sage/router_spec.py``: bf16 ``[B, H, cells, 128]``, the float32
mean of a cell's real tokens, Q's times ``softmax_scale * log2 e``, rounded to bf16 once) taken
from the rows a Q tile or a K unit has just loaded, so that the router reads Q and K no second
time. Cells are ``POOL_CELL`` (16) tokens: the default cells on every path (64-row query blocks
in 4, 64-key blocks in 4, 128-key blocks in 8), and 16 divides the quantizer's 32-row Q scale
groups and 64-key K blocks, so each cell lies in one warp's rows.

The arithmetic is ``router_pool``'s (``aot/kernels/router``) to the bit: there a warp pools a
cell, half-warp ``e`` summing the cell's tokens ``e, e+2, e+4, ...`` (real tokens only, in order,
from +0.0), the two halves added, then ``sum / max(n, 1) * scale`` (``div.rn.f32``) and one
conversion to bf16. Here:

* Q tile (``pool_q_tile``): warp ``w`` of tile ``t`` holds rows ``128t + 16w ..`` (``q_tile_rows``:
  lane = row parity, column chunk): one cell, laid out as ``router_pool``'s warp; the same adds
  in the same order, then the xor-16 shuffle. The Q codes (``q_tile_codes``) are made from the
  same registers when ``q_int8`` has rows; with none (the sm_90a kernels that quantize their own
  Q tile) the tile only pools.
* K unit (``pool_k_sums``): warp ``w`` of a warp group holds keys ``64*blk + 16w ..``, lane half
  ``e`` the 8 consecutive keys ``8e ..`` (``block_rows``): one cell whose even and odd tokens
  are split across the halves the other way. The lower half sums its even and odd tokens (four
  chains per channel pair, from +0.0) and leaves them in shared memory, the upper half continues
  them with its own tokens: the chains ``router_pool``'s half-warps form, added the same way.
  The sums wait in shared memory while the block is quantized; the cells are written after
  (``store_cell``).

A Q row past S is left out of its chain (a Q tile loads row S-1 in its place). A K row past S is
zero (``block_rows``) and is added: a chain starts at +0.0, so it is never -0.0, and ``x + 0.0``
is ``x`` for every other x. A cell with no real token is stored as zeros; cells past the pooled
tensor's extent are not written. The runtime passes ``num_cells`` cells, which the Q tiles
(``8 * ceil(Sq/128)`` cells) and the K units (``UNIT_BLOCKS * 4`` cells each, ``8 * ceil(Sk/128)``
in all) cover for both key-block sizes.

Registers: the variant is compiled at 3 CTAs per SM on every target (``POOL_CTAS_PER_SM``: at
most 80 registers, none spilled). Two choices keep it there: the sums unpack the bf16 rows
inside their own asm (``ptx.add_bf16``), so the compilers do not share the unpacked values with
the quantization and keep 64 fp32 values live instead of 32 packed words; and the K chains pass
between the half-warps through shared memory rather than shuffles (with shuffles both halves run
both halves' adds, and sm_120's ptxas spills 8 bytes).
"""

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32

from aot.kernels.sage_numerics.ptx import add_bf16, l2_policy
from aot.kernels.sage_numerics.q_tile import q_rows_load, q_tile_codes, q_tile_rows
from .spec import K_BLOCK, K_ROWS, KV_HALF, NCC, POOL_CELL, VEC


def cell_count(t0, S):
    """Real tokens of the cell starting at token ``t0``: ``clamp(S - t0, 0, POOL_CELL)``."""
    return cutlass.max(cutlass.min(S - t0, POOL_CELL), 0)


@cute.jit
def store_cell(sSum: cute.Tensor, mP: cute.Tensor, b, h, cell, S, scale, warp, lane):
    """Pooled cell ``cell`` from its float32 channel sums, the warp's row ``sSum[warp]`` (written
    by this warp: a warp barrier first): ``sum / max(n, 1) * scale`` over its ``n`` real tokens
    (``scale`` None: no factor), bf16, lane ``l`` channels ``4l .. 4l+3``; a cell past ``mP``'s
    extent is not written."""
    cute.arch.sync_warp()
    if cell < mP.shape[2]:
        cnt = Float32(cutlass.max(cell_count(cell * POOL_CELL, S), 1))
        out = cute.make_rmem_tensor(cute.make_layout((4,)), Float32)
        for e in cutlass.range_constexpr(4):
            if cutlass.const_expr(scale is None):
                out[e] = sSum[warp, 4 * lane + e] / cnt
            else:
                out[e] = sSum[warp, 4 * lane + e] / cnt * scale
        cute.local_tile(mP[b, h, cell, None], (4,), (lane,)).store(out.load().to(BFloat16))


@cute.jit
def pool_q_tile(mQ: cute.Tensor, mQ8: cute.Tensor, mQS: cute.Tensor, mPQ: cute.Tensor, scale: Float32, b, h, tile,
                warp, lane, sQAmax: cute.Tensor, sSum: cute.Tensor):
    """Q tile ``tile`` of (b, h) (``quantize_q_tile``'s rows and loads): its 8 pooled cells, warp
    ``w`` cell ``8*tile + w`` (``scale``: softmax_scale * log2 e; the sums staged in ``sSum``,
    8 x 128 fp32), and its codes and scales when ``q_int8`` has rows (every thread of the CTA
    is here: the codes' barrier)."""
    cc = lane % NCC
    S = mQ.shape[1]
    gQ = mQ[b, None, h, None]
    group, row0 = q_tile_rows(tile, warp, lane)
    pol = l2_policy("evict_first")
    vals = q_rows_load(gQ, row0, cc, pol)  # (rows past S: row S-1 again, left out below)
    if mQ8.shape[1] != 0:
        q_tile_codes(vals, mQ8[b, None, h, None], mQS, b, h, group, row0, S, warp, lane, sQAmax, pol)
    acc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
    acc.fill(0.0)
    for i in cutlass.range_constexpr(len(vals)):
        ok = row0 + 2 * i < S
        for p in cutlass.range_constexpr(VEC // 2):
            acc[2 * p] = cutlass.select_(ok, add_bf16(acc[2 * p], vals[i][p], False), acc[2 * p])
            acc[2 * p + 1] = cutlass.select_(ok, add_bf16(acc[2 * p + 1], vals[i][p], True), acc[2 * p + 1])
    for e in cutlass.range_constexpr(VEC):
        acc[e] = acc[e] + cute.arch.shuffle_sync_bfly(acc[e], offset=16)
    if lane < NCC:
        cute.local_tile(sSum[warp, None], (VEC,), (cc,)).store(acc.load())
    store_cell(sSum, mPQ, b, h, row0 // POOL_CELL, S, scale, warp, lane)


@cute.jit
def pool_k_sums(vals, sSum: cute.Tensor, sChain: cute.Tensor, blk, S, tidx, warp, lane):
    """The channel sums of the 4 cells of 64-key block ``blk`` of K from its warp group's rows
    ``vals`` (``block_rows``: thread ``t`` holds keys ``64*blk + 8*(t//16) ..+7``, chunk
    ``t % 16``), warp ``w`` of the group cell ``4*blk + w``, to ``sSum[warp]`` (``store_cell``
    turns them into the cell after the block's quantization). The lower half-warp sums its
    tokens into the four chains of each channel pair (even / odd tokens, low / high channel)
    and leaves them in ``sChain[warp]`` (8 x 256 fp32); after a warp barrier the upper half
    continues them with its own tokens. Keys past S are zeros (``block_rows``), added: a chain
    starts at +0.0 and so is never -0.0, and ``x + 0.0 == x`` for every other x."""
    t = tidx % KV_HALF
    cc = t % NCC
    upper = lane // NCC
    for rnd in cutlass.range_constexpr(2):
        if cutlass.const_expr(rnd == 1):
            cute.arch.sync_warp()
        if upper == rnd:
            for p in cutlass.range_constexpr(VEC // 2):
                c0 = cc * 2 * VEC + 4 * p  # the pair's 4 chains in sChain[warp]
                ch = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
                if cutlass.const_expr(rnd == 1):
                    ch = [sChain[warp, c0 + k] for k in range(4)]
                for j in cutlass.range_constexpr(K_ROWS):
                    o = 2 * (j % 2)
                    ch[o] = add_bf16(ch[o], vals[j][p], False)
                    ch[o + 1] = add_bf16(ch[o + 1], vals[j][p], True)
                if cutlass.const_expr(rnd == 0):
                    for k in cutlass.range_constexpr(4):
                        sChain[warp, c0 + k] = ch[k]
                else:
                    sSum[warp, cc * VEC + 2 * p] = ch[0] + ch[2]
                    sSum[warp, cc * VEC + 2 * p + 1] = ch[1] + ch[3]


def cell_of_k(blk, tidx):
    """The K cell whose keys thread ``tidx`` holds in 64-key block ``blk`` (one per warp)."""
    return blk * (K_BLOCK // POOL_CELL) + tidx % KV_HALF // 32
