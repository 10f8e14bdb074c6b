"""``router_select_simt`` (the sm_90a test library only): ``router_select``'s scores in float32
FFMA, compiled per (n_q, n_k): 16 exports.

CTA = 8 query blocks, one warp each; lane ``l`` scores key block ``32 t + l`` of key tile ``t``,
all ``n_q x n_k`` pairs in registers; key cells staged as float32 32 channels at a time. A second
implementation of the same arithmetic in another instruction mix and with every cell count fixed
at compile time, so a fault of the shipped kernel's runtime paths cannot repeat in it: a GPU run
compares the two (tests/gpu/test_router.py). It always scores and selects in one launch, and its
selection reads ``scores`` on every pass (``topk.py``).
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from aot.contract import HEAD_DIM
from aot.kernels.router.spec import LN2

from .config import DC, HIST, KPAD, NEG, TI, TJ, VEC
from .topk import finish_row


def make_simt(n_q: int, n_k: int):
    NQC = TI * n_q  # query cells per CTA

    class RouterSelectSimt:
        @cute.jit
        def run(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows: cute.Tensor,
                q_valid: Int32, k_valid: Int32, topk: Int32, has_dense: Int32, stream: cuda.CUstream):
            gq = scores.shape[2]
            self.kernel(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows,
                        q_valid, k_valid, topk, has_dense).launch(
                grid=[(gq + TI - 1) // TI, scores.shape[1], scores.shape[0]], block=[32 * TI, 1, 1],
                stream=stream)

        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor,
                   mCnt: cute.Tensor, mDense: cute.Tensor, q_valid: Int32, k_valid: Int32, topk: Int32,
                   has_dense: Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bx, h, b = cute.arch.block_idx()
            warp = cute.arch.make_warp_uniform(tidx // 32)
            lane = tidx % 32
            gq = mS.shape[2]
            gk = mS.shape[3]
            smem = cutlass.utils.SmemAllocator()
            sQ = smem.allocate_tensor(Float32, cute.make_layout((NQC, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)
            sK = smem.allocate_tensor(Float32, cute.make_layout((n_k * TJ, KPAD), stride=(KPAD, 1)), 16)
            sHist = smem.allocate_tensor(Int32, cute.make_layout((TI * HIST,)), 16)

            # ---- the CTA's query cells, float32 (cells past the pooled tensor: zeros)
            qc0 = bx * NQC
            for v in cutlass.range(tidx, NQC * (HEAD_DIM // VEC), 32 * TI, unroll=1):
                r = v // (HEAD_DIM // VEC)
                cc = v % (HEAD_DIM // VEC)
                vals = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
                vals.fill(0.0)
                if qc0 + r < mQ.shape[2]:
                    vals.store(cute.local_tile(mQ[b, h, qc0 + r, None], (VEC,), (cc,)).load().to(Float32))
                cute.local_tile(sQ[r, None], (VEC,), (cc,)).store(vals.load())

            i = bx * TI + warp  # this warp's query block
            acc = cute.make_rmem_tensor(cute.make_layout((n_q * n_k,)), Float32)
            for jt in cutlass.range(0, gk, TJ, unroll=1):
                acc.fill(0.0)
                for dc in cutlass.range(0, HEAD_DIM, DC, unroll=1):
                    cute.arch.sync_threads()  # the previous chunk's readers are done
                    # stage key cells [jt*n_k, (jt+TJ)*n_k), channels [dc, dc+DC), as float32
                    for v in cutlass.range(tidx, n_k * TJ * (DC // VEC), 32 * TI, unroll=1):
                        r = v // (DC // VEC)  # cell within the tile: block r // n_k, cell r % n_k
                        cc = v % (DC // VEC)
                        kc = jt * n_k + r
                        vals = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
                        vals.fill(0.0)
                        if kc < mK.shape[2]:
                            vals.store(cute.local_tile(mK[b, h, kc, None], (VEC,), (dc // VEC + cc,))
                                       .load().to(Float32))
                        # stored as [cell r % n_k][block r // n_k]: lanes read consecutive rows
                        srow = (r % n_k) * TJ + r // n_k
                        cute.local_tile(sK[srow, None], (VEC,), (cc,)).store(vals.load())
                    cute.arch.sync_threads()
                    for d4 in cutlass.range_constexpr(DC // 4):
                        qv = [cute.local_tile(sQ[warp * n_q + a, None], (4,), (dc // 4 + d4,)).load()
                              for a in range(n_q)]
                        kv = [cute.local_tile(sK[c * TJ + lane, None], (4,), (d4,)).load()
                              for c in range(n_k)]
                        for a in cutlass.range_constexpr(n_q):
                            for c in cutlass.range_constexpr(n_k):
                                s = acc[a * n_k + c]
                                for e in cutlass.range_constexpr(4):
                                    s = s + qv[a][e] * kv[c][e]
                                acc[a * n_k + c] = s
                # log-sum-exp over the valid pairs: key cells first, then query cells (SGLang's)
                j = jt + lane
                lq = cute.make_rmem_tensor(cute.make_layout((n_q,)), Float32)
                for a in cutlass.range_constexpr(n_q):
                    m = Float32(NEG)
                    for c in cutlass.range_constexpr(n_k):
                        x = cutlass.select_(j * n_k + c < k_valid, acc[a * n_k + c], Float32(NEG))
                        acc[a * n_k + c] = x
                        m = cute.arch.fmax(m, x)
                    ssum = Float32(0.0)
                    for c in cutlass.range_constexpr(n_k):
                        ssum = ssum + cute.math.exp2(acc[a * n_k + c] - m, fastmath=True)
                    la = m + cute.math.log2(ssum, fastmath=True)
                    live = (m > Float32(NEG / 2)) & (i * n_q + a < q_valid)
                    lq[a] = cutlass.select_(live, la, Float32(NEG))
                m2 = Float32(NEG)
                for a in cutlass.range_constexpr(n_q):
                    m2 = cute.arch.fmax(m2, lq[a])
                s2 = Float32(0.0)
                for a in cutlass.range_constexpr(n_q):
                    s2 = s2 + cute.math.exp2(lq[a] - m2, fastmath=True)
                score = cutlass.select_(m2 > Float32(NEG / 2), m2 + cute.math.log2(s2, fastmath=True),
                                        Float32(NEG))
                if i < gq and j < gk:
                    mS[b, h, i, j] = score * Float32(LN2)
            cute.arch.sync_warp()  # the row was written by this warp only
            if i < gq:
                finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, None, topk, b, h, i, warp, lane)

    return RouterSelectSimt

