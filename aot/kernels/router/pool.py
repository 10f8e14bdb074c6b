"""``router_pool``: Q and K -> the pooled cells, in one launch.

One warp per cell, ``POOL_WARPS`` (8) cells per CTA, grid ``(ceil(CQ/8) + ceil(CK/8), H, B)`` (the
Q cells' CTAs first, then K's: one launch for both). Half-warp ``t % 2`` of a warp sums the
cell's tokens ``t``, each lane 8 channels (one 16-byte load per token, four in flight), the halves
are added with one shuffle, and lanes 0-15 write the mean times the scale as bf16 (16 bytes
each). It reads Q and K once (bf16 ``[B, S, H, 128]``, any strides the ABI allows) and writes
1/sub of that: at H=14 S=37760, 271 MB read, 34 MB written, ~60 us at the H200's ~4.8 TB/s.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

from .config import POOL_WARPS, VEC


@cute.jit
def pool_cell(mX: cute.Tensor, mP: cute.Tensor, cell: Int32, sub: Int32, scale: Float32, b, h, lane):
    """Warp: pooled cell ``cell`` of (b, h): mean of its real tokens x scale, bf16."""
    S = mX.shape[1]
    if cell < mP.shape[2]:
        t0 = cell * sub
        n = cutlass.max(cutlass.min(sub, S - t0), 0)
        half = lane // 16
        cc = lane % 16
        acc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
        acc.fill(0.0)
        for t in cutlass.range(half, n, 2, unroll=4):
            v = cute.local_tile(mX[b, t0 + t, h, None], (VEC,), (cc,)).load().to(Float32)
            acc.store(acc.load() + v)
        for e in cutlass.range_constexpr(VEC):
            acc[e] = acc[e] + cute.arch.shuffle_sync_bfly(acc[e], 16)
        if lane < 16:
            cnt = Float32(cutlass.max(n, 1))
            out = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
            for e in cutlass.range_constexpr(VEC):
                out[e] = acc[e] / cnt * scale
            cute.local_tile(mP[b, h, cell, None], (VEC,), (cc,)).store(out.load().to(BFloat16))

class RouterPool:
    @cute.jit
    def run(self, q: cute.Tensor, k: cute.Tensor, pooled_q: cute.Tensor, pooled_k: cute.Tensor,
            sub_q: Int32, sub_k: Int32, q_scale: Float32, stream: cuda.CUstream):
        nq = (pooled_q.shape[2] + POOL_WARPS - 1) // POOL_WARPS
        nk = (pooled_k.shape[2] + POOL_WARPS - 1) // POOL_WARPS
        self.kernel(q, k, pooled_q, pooled_k, sub_q, sub_k, q_scale, nq).launch(
            grid=[nq + nk, q.shape[2], q.shape[0]], block=[32 * POOL_WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, pooled_q: cute.Tensor, pooled_k: cute.Tensor,
               sub_q: Int32, sub_k: Int32, q_scale: Float32, nq: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        if bx < nq:
            pool_cell(q, pooled_q, bx * POOL_WARPS + warp, sub_q, q_scale, b, h, lane)
        else:
            pool_cell(k, pooled_k, (bx - nq) * POOL_WARPS + warp, sub_k, Float32(1.0), b, h, lane)

