"""Consumer side of the SM90a attention kernel: a consumer warpgroup's MMA fragments and softmax
state, the per-row plan count and scales, and the software-pipelined mainloop of the
warp-specialised shapes (one or two ping-pong consumer warpgroups behind a TMA producer).
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from .layout import acc_mn

Float32, Int32 = cutlass.Float32, cutlass.Int32


class Sm90Consumer:
    """Mixin of ``Sm90SparseAttention``: the warpgroup MMA side of the warp-specialised shapes and
    the per-row helpers that the flat mainloop shares."""

    @cute.jit
    def consumer_setup(self, qk_mma, pv_mma, sQ, sK, sV, ctid: Int32):
        """A consumer warpgroup's MMA slices and operand fragments, the zeroed O accumulator,
        the online-softmax row state and the score coordinates (for the tail mask)."""
        bm, bk, hd = self.bm, self.bk, self.hd
        thr_qk = qk_mma.get_slice(ctid)
        thr_pv = pv_mma.get_slice(ctid)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
        acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((bm, hd)))
        acc_o.fill(0.0)
        n_rows = cute.size(acc_mn(acc_o), mode=[0])  # 2 rows per thread
        row_max = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
        row_sum = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
        alpha = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        tScS_mn = acc_mn(thr_qk.partition_C(cute.make_identity_tensor((bm, bk))))
        return thr_qk, thr_pv, tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, alpha, tScS_mn

    @cute.jit
    def q_row_scale(self, mQs, scale_log2: Float32, ctid: Int32, qb: Int32, nqb: Int32, b: Int32,
                    h: Int32) -> Float32:
        """Sage: softmax scale (log2 units) x the q scale of this warp's 32-row group."""
        warp_in_wg = ctid // 32
        return scale_log2 * mQs[b, h, cutlass.min(qb, nqb - 1) * 2 + warp_in_wg // 2]

    @cute.jit
    def row_count(self, mIdx, mCnt, topk: Int32, b: Int32, h: Int32, qb: Int32, nqb: Int32) -> Int32:
        """Entries of the plan row to walk: counts (or topk) clamped to [0, cap]; 0 past Sq."""
        cap = mIdx.shape[3]
        n = topk
        if cutlass.const_expr(mCnt is not None):
            n = mCnt[b, h, cutlass.min(qb, nqb - 1)]
        n = cutlass.min(cutlass.max(n, 0), cap)
        if qb >= nqb:
            n = Int32(0)
        return n

    @cute.jit
    def k_scales(self, mKs, blk: Int32, n_kblocks: Int32, b: Int32, h: Int32):
        """k_scales_any for Sage; 1.0 for bf16 (no k scales)."""
        k0 = Float32(1.0)
        k1 = Float32(1.0)
        if cutlass.const_expr(self.sage):
            k0, k1 = self.k_scales_any(mKs, blk, n_kblocks, b, h)
        return k0, k1

    @cute.jit
    def k_scales_any(self, mKs, blk: Int32, n_kblocks: Int32, b: Int32, h: Int32):
        """Sage: the k scales of the two 64-key halves of key block blk (one per 64 keys; equal
        for a 64-key tile), without branches: the id is clamped into range (the values of an
        id out of range are never used), so the loads issue before anything depends on them."""
        kb64 = cutlass.max(cutlass.min(blk, n_kblocks - 1), 0) * (self.plan_bk // 64)
        k0 = mKs[b, h, kb64]
        k1 = k0
        if cutlass.const_expr(self.plan_bk == 128):
            k1 = mKs[b, h, cutlass.min(kb64 + 1, mKs.shape[2] - 1)]
        return k0, k1

    @cute.jit
    def pp_arrive(self, st: cutlass.Constexpr, t: Int32, n_turns: Int32):
        """Hand the MMA turn to the other warpgroup (ping-pong; warpgroup 1 skips its last)."""
        if cutlass.const_expr(self.wgs == 2):
            if cutlass.const_expr(st == 0):
                cute.arch.barrier_arrive(barrier_id=2, number_of_threads=256)
            else:
                if t + 1 < n_turns:
                    cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)

    @cute.jit
    def consumer(
        self, qk_mma, pv_mma, sQ, sK, sV, o, mIdx, mQs, mKs, mVs, q_cons, k_cons, v_cons,
        scale_log2: Float32, n_blk: Int32, n_other: Int32, n_kblocks: Int32, seqlen_k: Int32,
        ctid: Int32, qb: Int32, nqb: Int32, h: Int32, b: Int32, st: cutlass.Constexpr,
        pr=None, ring: cutlass.Constexpr = False, e0=None, merge=None,
    ):
        """Software-pipelined mainloop: while the softmax of tile j runs, the tensor cores
        work on Q.K^T(j) (issued first) and P.V(j-1). One turn per plan entry plus one for
        the last P.V; with two warpgroups both take max(n0, n1) + 1 turns so the ping-pong
        barriers always pair up. ``pr``: the plan row to walk (default: ``qb``, the row of the
        output); ``ring``: the K/V pipelines are the CTA's shared ring (kv_share: buffer indices
        span every buffer, no per-warpgroup offset). ``e0``: the first entry of the row to walk
        (None: entry 0); ``merge``: the shared-memory scratch of a split CTA (``kernel.ws_split``):
        the two consumers' states merge there (:meth:`split_epilogue`) instead of each writing its
        rows."""
        bm, bk, hd = self.bm, self.bk, self.hd
        ks_off = st * self.k_stages
        vs_off = st * self.v_stages
        if cutlass.const_expr(ring):
            ks_off, vs_off = 0, 0
        if cutlass.const_expr(pr is None):
            pr = qb
        thr_qk, thr_pv, tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, alpha, tScS_mn = self.consumer_setup(
            qk_mma, pv_mma, sQ, sK, sV, ctid)
        acc_o_mn = acc_mn(acc_o)
        n_rows = cute.size(acc_o_mn, mode=[0])  # 2 rows per thread
        row_scale = scale_log2
        acc_t = None
        if cutlass.const_expr(self.sage):
            row_scale = self.q_row_scale(mQs, scale_log2, ctid, qb, nqb, b, h)
            acc_t = thr_pv.make_fragment_C(thr_pv.partition_shape_C((bm, hd)))

        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((bm, bk)))
        tOrP = cute.make_rmem_tensor(thr_pv.partition_shape_A((bm, bk)), self.v_dt)
        num_kb = cute.size(tSrQ, mode=[2])
        num_kb_pv = cute.size(tOrV, mode=[2])

        if n_blk > 0:
            q_cons.wait_and_advance()
        n_turns = n_blk + 1
        if cutlass.const_expr(self.wgs == 2):
            n_turns = cutlass.max(n_blk, n_other) + 1
            if cutlass.const_expr(st == 1):
                cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)  # WG 0 starts
        have_prev = False
        # the plan entry and its k scales are loaded one turn ahead (their global-load
        # latency would otherwise sit at the head of every turn)
        first = 0
        if cutlass.const_expr(e0 is not None):
            first = e0
        blk_next = Int32(-1)
        if n_blk > 0:
            blk_next = mIdx[b, h, pr, first]
        ks_next0, ks_next1 = self.k_scales(mKs, blk_next, n_kblocks, b, h)
        for t in cutlass.range(n_turns, unroll=1):
            if cutlass.const_expr(self.wgs == 2):
                cute.arch.barrier(barrier_id=1 + st, number_of_threads=256)
            blk = blk_next
            ks0 = ks_next0
            ks1 = ks_next1
            nxt = Int32(-1)
            if t + 1 < n_blk:
                nxt = mIdx[b, h, pr, first + t + 1]
            blk_next = nxt
            ks_next0, ks_next1 = self.k_scales(mKs, nxt, n_kblocks, b, h)
            if blk >= 0 and blk < n_kblocks:
                sc = row_scale * ks0
                sc1 = row_scale * ks1
                kh = k_cons.wait_and_advance()
                cute.nvgpu.warpgroup.fence()
                for kb in cutlass.range_constexpr(num_kb):
                    qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                    cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, st], tSrK[None, None, kb, kh.index + ks_off], acc_s)
                cute.nvgpu.warpgroup.commit_group()
                if have_prev:
                    vh = v_cons.wait_and_advance()
                    pv_mma = self.issue_pv(pv_mma, acc_o, acc_t, tOrP, tOrV, vh.index + vs_off, num_kb_pv)
                    self.pp_arrive(st, t, n_turns)
                    cute.nvgpu.warpgroup.wait_group(1)
                    kh.release()
                    self.softmax_tile(acc_s, tScS_mn, blk, sc, sc1, row_max, row_sum, alpha, seqlen_k)
                    cute.nvgpu.warpgroup.wait_group(0)
                    vh.release()
                else:
                    self.pp_arrive(st, t, n_turns)
                    cute.nvgpu.warpgroup.wait_group(0)
                    kh.release()
                    self.softmax_tile(acc_s, tScS_mn, blk, sc, sc1, row_max, row_sum, alpha, seqlen_k)
                # O <- (O [+ acc_t]) * alpha; skipped while no row max of the warp moved
                # (O is still zero before the first P.V)
                if have_prev:
                    a_min = alpha[0]
                    for r in cutlass.range_constexpr(1, n_rows):
                        a_min = cute.arch.fmin(a_min, alpha[r])
                    if cute.arch.vote_any_sync(a_min < Float32(1.0)):
                        for r in cutlass.range_constexpr(n_rows):
                            if cutlass.const_expr(self.sage):
                                acc_t_mn = acc_mn(acc_t)
                                for c in cutlass.range_constexpr(cute.size(acc_o_mn, mode=[1])):
                                    acc_o_mn[r, c] = (acc_o_mn[r, c] + acc_t_mn[r, c]) * alpha[r]
                            else:
                                for c in cutlass.range_constexpr(cute.size(acc_o_mn, mode=[1])):
                                    acc_o_mn[r, c] = acc_o_mn[r, c] * alpha[r]
                    else:
                        if cutlass.const_expr(self.sage):
                            acc_o.store(acc_o.load() + acc_t.load())
                self.convert_p(acc_s, tOrP)
                have_prev = True
            else:
                if have_prev and t >= n_blk:
                    # the last P.V
                    vh = v_cons.wait_and_advance()
                    pv_mma = self.issue_pv(pv_mma, acc_o, acc_t, tOrP, tOrV, vh.index + vs_off, num_kb_pv)
                    self.pp_arrive(st, t, n_turns)
                    cute.nvgpu.warpgroup.wait_group(0)
                    vh.release()
                    if cutlass.const_expr(self.sage):
                        acc_o.store(acc_o.load() + acc_t.load())
                    have_prev = False
                else:
                    self.pp_arrive(st, t, n_turns)

        if cutlass.const_expr(merge is None):
            self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)
        else:
            self.split_epilogue(acc_o, row_max, row_sum, thr_pv, o, mVs, qb, nqb, h, b, st, ctid, merge)

    @cute.jit
    def split_epilogue(self, acc_o, row_max, row_sum, thr_pv, o, mVs, qb: Int32, nqb: Int32, h: Int32, b: Int32,
                       st: cutlass.Constexpr, ctid: Int32, merge):
        """A split CTA's two partial softmax states into one (``kernel.ws_split``): consumer 1
        stores its O accumulator, row max and partial row sum in the scratch (thread ``ctid`` of
        either warpgroup holds the same elements of the tile: one column of the scratch each, no
        bank conflict) and arrives on named barrier 3; consumer 0 waits there, rescales both
        states to the larger max (a state without any key, max -inf, weighs 0) and writes the block
        through :meth:`epilogue`."""
        scr_o, scr_s = merge
        acc_o_mn = acc_mn(acc_o)
        n_rows = cute.size(acc_o_mn, mode=[0])
        n_cols = cute.size(acc_o_mn, mode=[1])
        if cutlass.const_expr(st == 1):
            for r in cutlass.range_constexpr(n_rows):
                for c in cutlass.range_constexpr(n_cols):
                    scr_o[r * n_cols + c, ctid] = acc_o_mn[r, c]
                scr_s[r, ctid] = row_max[r]
                scr_s[n_rows + r, ctid] = row_sum[r]
            cute.arch.barrier_arrive(barrier_id=3, number_of_threads=256)
        else:
            cute.arch.barrier(barrier_id=3, number_of_threads=256)
            neg_inf = -Float32.inf
            for r in cutlass.range_constexpr(n_rows):
                m0 = row_max[r]
                m1 = scr_s[r, ctid]
                m = cute.arch.fmax(m0, m1)
                a0 = Float32(0.0)
                a1 = Float32(0.0)
                if m0 > neg_inf:
                    a0 = cute.math.exp2(m0 - m, fastmath=True)
                if m1 > neg_inf:
                    a1 = cute.math.exp2(m1 - m, fastmath=True)
                row_sum[r] = row_sum[r] * a0 + scr_s[n_rows + r, ctid] * a1
                for c in cutlass.range_constexpr(n_cols):
                    acc_o_mn[r, c] = acc_o_mn[r, c] * a0 + scr_o[r * n_cols + c, ctid] * a1
            self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)

    @cute.jit
    def issue_pv(self, pv_mma, acc_o, acc_t, tOrP, tOrV, vbuf: Int32, num_kb_pv: cutlass.Constexpr):
        """Issue P.V on V buffer vbuf (one WGMMA group): Sage into the fresh per-tile accumulator
        acc_t (two-level accumulation), bf16 straight into O. Returns pv_mma: its ACCUMULATE
        field changes here, and only a returned value carries that change back to the caller
        (the tracer does not see attributes set inside a helper)."""
        cute.nvgpu.warpgroup.fence()
        if cutlass.const_expr(self.sage):
            for kb in cutlass.range_constexpr(num_kb_pv):
                pv_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb], tOrV[None, None, kb, vbuf], acc_t)
        else:
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            for kb in cutlass.range_constexpr(num_kb_pv):
                cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb, vbuf], acc_o)
        cute.nvgpu.warpgroup.commit_group()
        return pv_mma
