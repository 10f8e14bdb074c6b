"""``router_select``: block scores on bf16 tensor cores, then the per-row top-k (``topk.py``).

CTA = 4 warps = 64 query cells (``64 / n_q`` query blocks). Its ``phase`` argument (``spec.PHASE_*``;
``ops/route.select_launches`` chooses) gives the launch's shape: FUSED, grid ``(ceil(CQ/64), H,
B)``, each CTA scores its query tile against every key tile, then its warps select their rows; or
SCORES, grid ``(ceil(CQ/64) * k_splits, H, B)``, each CTA scoring its query tile against a
``1/k_splits`` share of the key tiles, followed by a SELECT launch, grid ``(ceil(Gq/4), H, B)``,
one row per warp. The split exists for small grids: a CTA's warps depend on their own MMA, exp2
and shuffle results in turn, and with one CTA per SM (H=2 at S=37760: 74 CTAs) nothing hides
those latencies. The CTA's query cells are staged once in shared memory (bf16 pairs as 32-bit
words, rows padded to 68 words so a warp's fragment loads hit 32 distinct banks) and each warp
keeps the A fragments of its 16 cells (``m16n8k16``, all 8 k-steps: 32 registers) for the whole
launch. Per key tile of 64 key cells a warp issues 8 x 8 bf16 ``mma.sync`` with float32
accumulators (32 registers): its 16 x 64 cell-pair dots. The log-sum-exp runs on the accumulators
(``fold.py``); the pair matrix never leaves the registers, and the lane holding a block pair's
first cells writes its float32 score to ``scores`` ``[B, H, Gq, Gk]``.

The key tile is staged permuted (cell ``16 t + 2 nt + e`` in row ``8 nt + 2 t + e``), so lane
(g, t)'s 16 accumulator columns are 16 consecutive key cells, whole key blocks for any n_k: each
block's log-sum-exp runs in registers (a max / sum tree of ``log2 n_k`` uniform levels), and the
query side's shuffles run once per key block (n_k = 4: 8 per tile; n_k = 8: 4). With the key tile
staged in natural order, a key block's columns sit in ``n_k / 2`` lanes: ``log2 n_k - 1`` key-side
shuffles per column pair and the query-side shuffles once per column pair (16 per tile), ~1100
instructions per warp and key tile beside 64 HMMA; the permuted score phase takes 0.80-0.88x of
that kernel's time at S=37760, H=14 on an H100 (128- and 64-key blocks) and the same within
noise at S=4000 (MEASUREMENTS.md, 2026-12-07, the H100 run on 99e1ff2). No local memory; 128
registers on sm_90a (4 CTAs per SM), 133-134 on sm_100a / sm_120a (3 CTAs per SM).

``n_q`` and ``n_k`` are runtime arguments: nothing sized depends on them (the staged tiles, the
fragments and the 32 accumulators are per 64 cells), and what does -- the tree levels and
shuffle counts (``popc(n - 1)`` = log2 n), the writer predicate (``g % n_q == 0``), the block
ids (shifts) and the rows per warp (``16 / n_q``) -- is the same for every lane of the grid. One
export per target serves all 16 pairs (per pair it would be 16, 2-5 CPU-s each: most of the
build). The runtime checks n_q, n_k before any launch (``ops/route.py``): the kernel trusts them
to be powers of two up to 8.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from aot.contract import HEAD_DIM
from aot.kernels.router.spec import PHASE_FUSED, PHASE_SCORES, PHASE_SELECT

from .config import HIST, MMA_CELLS, MMA_WARPS, VEC, WROW
from .fold import fold_permuted
from .ptx import mma_bf16
from .topk import finish_row


@cute.jit
def stage(mX: cute.Tensor, sX: cute.Tensor, c0: Int32, b, h, tidx, permuted: cutlass.Constexpr = False):
    """CTA: cells [c0, c0 + MMA_CELLS) of (b, h) into sX as bf16 pairs (zeros past the tensor).
    ``permuted``: cell ``16 t + 2 nt + e`` goes to row ``8 nt + 2 t + e``, the row the mma's
    B fragment gives lane (g, t) as its column ``2 t + e`` of n-tile ``nt``: a lane's 16
    accumulator columns are then 16 consecutive cells, whole key blocks for any n_k."""
    for v in cutlass.range(tidx, MMA_CELLS * (HEAD_DIM // VEC), 32 * MMA_WARPS, unroll=2):
        r = v // (HEAD_DIM // VEC)
        cc = v % (HEAD_DIM // VEC)
        w = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
        w.fill(0)
        if c0 + r < mX.shape[2]:
            w.store(cute.local_tile(mX[b, h, c0 + r, None], (VEC,), (cc,)).load().bitcast(Int32))
        srow = r
        if cutlass.const_expr(permuted):
            srow = 8 * ((r % 16) // 2) + 2 * (r // 16) + r % 2
        cute.local_tile(sX[srow, None], (VEC // 2,), (cc,)).store(w.load())


class RouterSelectMma:
    """``router_select``: block scores on bf16 tensor cores, then the per-row top-k."""

    @cute.jit
    def run(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
            q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows: cute.Tensor,
            n_q: Int32, n_k: Int32, q_valid: Int32, k_valid: Int32, topk: Int32, has_dense: Int32,
            phase: Int32, k_splits: Int32, stream: cuda.CUstream):
        q_tiles = (pooled_q.shape[2] + MMA_CELLS - 1) // MMA_CELLS
        # PHASE_FUSED: a CTA per query tile; PHASE_SCORES: k_splits per query tile; PHASE_SELECT:
        # a CTA per MMA_WARPS rows
        gx = Int32(q_tiles)
        if phase == PHASE_SCORES:
            gx = q_tiles * k_splits
        if phase == PHASE_SELECT:
            gx = (scores.shape[2] + MMA_WARPS - 1) // MMA_WARPS
        self.kernel(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows,
                    n_q, n_k, q_valid, k_valid, topk, has_dense, phase, k_splits).launch(
            grid=[gx, scores.shape[1], scores.shape[0]], block=[32 * MMA_WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor,
               mCnt: cute.Tensor, mDense: cute.Tensor, n_q: Int32, n_k: Int32, q_valid: Int32,
               k_valid: Int32, topk: Int32, has_dense: Int32, phase: Int32, k_splits: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        gq = mS.shape[2]
        smem = cutlass.utils.SmemAllocator()
        # the staged Q and K tiles, then (selection) the warps' row buffers, in one allocation
        sBuf = smem.allocate_tensor(Int32, cute.make_layout((2 * MMA_CELLS * WROW,)), 16)
        sHist = smem.allocate_tensor(Int32, cute.make_layout((MMA_WARPS * HIST,)), 16)
        if phase == PHASE_SELECT:
            i = bx * MMA_WARPS + warp
            if i < gq:
                finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, sBuf, topk, b, h, i, warp, lane)
        else:
            qt = bx
            k_tiles = (mK.shape[2] + MMA_CELLS - 1) // MMA_CELLS
            kt0 = Int32(0)
            kt1 = k_tiles
            if phase == PHASE_SCORES:
                qt = bx // k_splits
                per = (k_tiles + k_splits - 1) // k_splits
                kt0 = (bx - qt * k_splits) * per
                kt1 = cutlass.min(kt0 + per, k_tiles)
            self.scores(mQ, mK, mS, sBuf, n_q, n_k, q_valid, k_valid, qt, kt0, kt1, b, h, tidx, warp, lane)
            if phase == PHASE_FUSED:
                cute.arch.sync_threads()  # every warp is done with the staged tiles: rows reuse them
                lq = cute.arch.popc(n_q - 1)
                qc0 = qt * MMA_CELLS
                for rr in cutlass.range(Int32(16) >> lq, unroll=1):  # the warp's 16 query cells: 16 / n_q rows
                    i = ((qc0 + warp * 16) >> lq) + rr
                    if i < gq:
                        finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, sBuf, topk, b, h, i, warp, lane)

    @cute.jit
    def scores(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, sBuf: cute.Tensor, n_q: Int32,
               n_k: Int32, q_valid: Int32, k_valid: Int32, qt: Int32, kt0: Int32, kt1: Int32, b, h, tidx,
               warp, lane):
        """CTA: the block scores of query tile ``qt`` (MMA_CELLS query cells) against key tiles
        [kt0, kt1), written to ``scores``."""
        g = lane // 4  # the mma fragments' group (row) and thread-in-group (column pair)
        t = lane % 4
        # n_q, n_k: powers of two (checked by the runtime), the same for every lane of the grid
        lq = cute.arch.popc(n_q - 1)  # log2 n_q: shuffles over g per query block
        lk = cute.arch.popc(n_k - 1)  # log2 n_k: tree levels per key block, in registers
        # bf16 cells as 32-bit words, rows padded to WROW words: the fragment loads of a warp
        # (rows g, words 8 ks + t) hit 32 distinct banks
        tile = cute.make_layout((MMA_CELLS, WROW), stride=(WROW, 1))
        sQ = cute.make_tensor(sBuf.iterator, tile)
        sK = cute.make_tensor(sBuf.iterator + MMA_CELLS * WROW, tile)

        qc0 = qt * MMA_CELLS
        stage(mQ, sQ, qc0, b, h, tidx)
        cute.arch.sync_threads()
        # A fragments of the warp's 16 query cells, all 8 k-steps, kept in registers
        r0 = warp * 16 + g
        afr = cute.make_rmem_tensor(cute.make_layout((32,)), Int32)
        for ks in cutlass.range_constexpr(8):
            afr[4 * ks + 0] = sQ[r0, 8 * ks + t]
            afr[4 * ks + 1] = sQ[r0 + 8, 8 * ks + t]
            afr[4 * ks + 2] = sQ[r0, 8 * ks + t + 4]
            afr[4 * ks + 3] = sQ[r0 + 8, 8 * ks + t + 4]
        qcell = (qc0 + r0, qc0 + r0 + 8)  # this lane's two query cells (accumulator rows)
        acc = cute.make_rmem_tensor(cute.make_layout((32,)), Float32)
        for kt in cutlass.range(kt0, kt1, unroll=1):
            kc0 = kt * MMA_CELLS
            cute.arch.sync_threads()  # the previous tile's readers are done
            stage(mK, sK, kc0, b, h, tidx, permuted=True)
            cute.arch.sync_threads()
            acc.fill(0.0)
            for nt in cutlass.range_constexpr(MMA_CELLS // 8):
                for ks in cutlass.range_constexpr(8):
                    bw = (sK[8 * nt + g, 8 * ks + t], sK[8 * nt + g, 8 * ks + t + 4])
                    a = [afr[4 * ks + e] for e in range(4)]
                    d = mma_bf16(a, bw, [acc[4 * nt + e] for e in range(4)])
                    for e in cutlass.range_constexpr(4):
                        acc[4 * nt + e] = d[e]
            # the query side's writer: the block's first query cell's lanes
            fold_permuted(mS, acc, kc0, t, qcell, q_valid, k_valid, n_k, lq, lk, (g & (n_q - 1)) == 0, b, h)
