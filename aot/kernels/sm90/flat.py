"""The flat mainloop of the SM90a attention kernel (``wgs == 0``, Sage only): one warpgroup per
CTA that issues its own TMA loads (warp 0) and runs Q.K^T, softmax and P.V serially per tile;
three or four CTAs per SM provide the overlap. Measured against the warp-specialised shapes in
docs/design/kernels-sm90.md.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from aot.kernels.sage_numerics import consts as _QSPEC, ptx as _QPTX, q_tile as _QTILE  # the quantizer's Q numerics

from .layout import acc_mn, q_smem_offset

Float32, Int32 = cutlass.Float32, cutlass.Int32


class Sm90FlatMainloop:
    """Mixin of ``Sm90SparseAttention``: the flat shape's body."""

    @cute.jit
    def flat_body(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                  scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sKt, sV, pipes, nqb: Int32,
                  n_kblocks: Int32, tidx: Int32, warp_idx: Int32, qb: Int32, h: Int32, b: Int32,
                  sQ_ptr, sQAmax, vw=None, mc=None):
        """Flat shape: one warpgroup per CTA, three CTAs per SM. Warp 0 issues the TMA loads
        (Q once; with the default refill="shadow", V of entry t under Q.K^T(t) and K of entry
        t+1 under P.V(t), when all warps have released the buffer). Per entry,
        serially: Q.K^T (INT8 WGMMA), online softmax -> FP8 P, P.V (FP8 WGMMA) into a per-tile
        FP32 accumulator, O = O * alpha + tile (two-level accumulation in one FFMA). The
        overlap comes from the other two CTAs on the SM. Entries with an id outside
        [0, ceil(Sk/bk)) load block 0 (always in bounds) and skip the math. With `pair`, a
        tile holds plan entries 2t and 2t+1 (64 keys each; a missing or invalid half is
        masked like keys past Sk); ``vw`` (kernel.py) holds what loads and reads V of a tile
        whose entries are blocks 2j, 2j+1 as one 128-key tile. With ``q_fused`` the CTA quantizes its own Q tile
        (:meth:`q_fused_load`, :meth:`q_fused_store`) instead of loading the quantizer's INT8 Q by TMA. With ``cluster=2``, ``mc`` holds the
        multicast K/V atoms and their pipelines (kernel.py): a cluster whose two rows are dense
        loads each tile once for both CTAs (docs/design/kernels-sm90.md; the paired kernel too,
        each CTA half of each 64-key K box and of V's box or boxes)."""
        q_vals = None
        if cutlass.const_expr(self.q_fused):
            q_vals = self.q_fused_load(tq, tidx, warp_idx, qb, h, b)  # before the K/V TMA: the long pole
        if cutlass.const_expr(self.late_wait):
            cute.arch.griddepcontrol_wait()  # PDL: the plan and the K/V operands come from the quantizer
        n_blk = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)  # plan entries
        args = (qk_mma, pv_mma, tma_q, tq, o, mIdx, mQs, mKs, mVs, scale_log2, seqlen_k, sQ, sK, sKt, sV,
                nqb, n_kblocks, tidx, warp_idx, qb, h, b, sQ_ptr, sQAmax)
        if cutlass.const_expr(self.mc2):
            # a cluster shares K/V when both its rows are dense: in a prepared plan (ids
            # deduplicated and ascending) those rows are identical. Both CTAs decide from the same
            # two counts; both then walk the even row with its count (the same loads and trip
            # count whatever the plan holds: unequal trip counts would hang the pair).
            n_peer = self.row_count(mIdx, mCnt, topk, b, h, qb + 1 - 2 * (qb % 2), nqb)
            if n_blk >= n_kblocks and n_peer >= n_kblocks:
                cute.arch.cluster_arrive_relaxed()  # the peer's barriers are initialised
                cute.arch.cluster_wait()
                n_even = n_blk + (n_peer - n_blk) * (qb % 2)  # both walk the even row, all of it
                vw_mc = mc[5] if cutlass.const_expr(self.pair) else None  # the paired kernel's V multicast
                self.flat_tiles(*args, vw_mc, q_vals, qb - qb % 2, n_even, mc[4], mc[0], mc[1], mc[2], mc[3], True)
                cute.arch.cluster_arrive()  # the peer's last releases target this CTA: exit together
                cute.arch.cluster_wait()
            else:
                self.flat_tiles(*args, vw, q_vals, qb, n_blk, pipes, tma_k, tk, tma_v, tv, False)
        else:
            self.flat_tiles(*args, vw, q_vals, qb, n_blk, pipes, tma_k, tk, tma_v, tv, False)

    @cute.jit
    def flat_tiles(self, qk_mma, pv_mma, tma_q, tq, o, mIdx, mQs, mKs, mVs, scale_log2: Float32, seqlen_k: Int32,
                   sQ, sK, sKt, sV, nqb: Int32, n_kblocks: Int32, tidx: Int32, warp_idx: Int32, qb: Int32,
                   h: Int32, b: Int32, sQ_ptr, sQAmax, vw, q_vals, pr: Int32, n_blk: Int32, pipes, tma_k, tk,
                   tma_v, tv, mc: cutlass.Constexpr):
        """:meth:`flat_body` from the first K/V load to the epilogue, walking plan row ``pr``
        (``n_blk`` entries) with ``pipes`` and the K/V atoms given (``vw``: the paired kernel's
        aligned-pair V, kernel.py); ``mc``: they are the cluster's multicast ones (each CTA loads
        half of every TMA box into both CTAs' buffers)."""
        bm, bk, hd = self.bm, self.bk, self.hd
        E = 2 if self.pair else 1  # plan entries per tile
        q_prod = pipes[0][0]
        q_cons = pipes[0][1]
        k_prod = pipes[1][0]
        k_cons = pipes[1][1]
        v_prod = pipes[2][0]
        v_cons = pipes[2][1]
        n_it = (n_blk + E - 1) // E  # tiles
        S = self.k_stages  # K ring depth (1 by default); the V ring is never deeper (Sm90Config)
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
            tma_q, tq, tma_k, tk, tma_v, tv, sQ, sKt, sV, qb, h, b, mc)
        # (atom, source, destination, dense row) of an aligned pair's V, or None
        vwv = self.vw_views(vw, h, b, Int32(1) if n_blk >= n_kblocks else Int32(0), mc)
        if warp_idx == 0:
            self.prefetch_descriptors(tma_q, tma_k, tma_v, vw[0] if cutlass.const_expr(vw is not None) else None)
            if cutlass.const_expr(not self.q_fused):
                if n_blk > 0:
                    qh = q_prod.acquire_and_advance()
                    cute.copy(tma_q, tQgQ, tQsQ[(None, 0)], tma_bar_ptr=qh.barrier)
        shadow = self.refill == "shadow"
        # shadow: entry t's V is issued inside entry t (under its Q.K^T), one fewer up front
        SV = self.v_stages - 1 if shadow else self.v_stages
        for i in cutlass.range(cutlass.min(n_it, S), unroll=1):
            k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, pr, i, n_blk, n_kblocks, warp_idx, None, mc)
            if i < SV:
                v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, pr, i, n_blk, n_kblocks,
                                          warp_idx, vwv, mc)

        ctid = tidx
        thr_qk, thr_pv, tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, alpha, tScS_mn = self.consumer_setup(
            qk_mma, pv_mma, sQ, sK, sV, ctid)
        tOrVw = None  # the paired kernel's 128-key view of the V buffer (an aligned pair)
        if cutlass.const_expr(vw is not None):
            tOrVw = thr_pv.make_fragment_B(thr_pv.partition_B(vw[2]))
        acc_o_mn = acc_mn(acc_o)
        n_rows = cute.size(acc_o_mn, mode=[0])
        if cutlass.const_expr(self.q_fused):
            # under the first K/V loads, issued above
            row_scale = scale_log2 * self.q_fused_store(q_vals, tq, sQ_ptr, sQAmax, tidx, warp_idx, qb)
        else:
            row_scale = self.q_row_scale(mQs, scale_log2, ctid, qb, nqb, b, h)
        num_kb_pv = cute.size(tOrV, mode=[2]) * E  # k-steps of P.V over the whole tile

        if cutlass.const_expr(not self.q_fused):
            if n_blk > 0:
                qh = q_cons.wait_and_advance()
        for t in cutlass.range(n_it, unroll=1):
            blk, valid, ks0, ks1, key0, key1 = self.entry_head(mIdx, mKs, b, h, pr, t * E, n_kblocks)
            whole = Int32(0)
            if cutlass.const_expr(self.pair):
                valid, ks1, key0, key1, whole = self.pair_second(mIdx, mKs, b, h, pr, t, n_blk, n_kblocks,
                                                                 blk, valid, key0, seqlen_k, vwv[3])
            kh = k_cons.wait_and_advance()
            # Everything that touches the tile accumulators sits in this one branch: with the
            # work split over several `if valid` blocks the accumulators were merged across
            # them (LLVM kept a second copy of the 64-register fill for the skip path).
            if valid != 0:
                # The WGMMA asm reads its accumulator registers even when it overwrites them,
                # so without the fill the tile accumulator would be carried around the loop
                # (live across iterations: spills at 168 registers).
                acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((bm, bk)))
                acc_s.fill(0x4B400000)  # qk_bias: S32 -> F32 by reinterpretation in the softmax
                qk_mma = self.flat_qk(qk_mma, acc_s, tSrQ, tSrK, 0, kh.index)
                if cutlass.const_expr(shadow):
                    v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, pr, t + SV, n_blk,
                                              n_kblocks, warp_idx, vwv, mc)
                cute.nvgpu.warpgroup.wait_group(0)
                kh.release()
                if cutlass.const_expr(not shadow):
                    k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, pr, t + S, n_blk,
                                              n_kblocks, warp_idx, None, mc)
                self.softmax_keys(acc_s, tScS_mn, key0, key1, row_scale * ks0, row_scale * ks1, row_max,
                                  row_sum, alpha, seqlen_k)
                tOrP = cute.make_rmem_tensor(thr_pv.partition_shape_A((bm, bk)), self.v_dt)
                self.convert_p(acc_s, tOrP)
                vh = v_cons.wait_and_advance()
                # P.V per column slice of D into a fresh FP32 tile accumulator, folded into O
                # as O = O * alpha + tile (two-level accumulation, one FFMA per element). One
                # tile accumulator serves every slice.
                acc_t = thr_pv.make_fragment_C(thr_pv.partition_shape_C((bm, hd // self.pv_parts)))
                acc_t.fill(0.0)  # ptxas drops the fill (the first WGMMA reads RZ)
                acc_t_mn = acc_mn(acc_t)
                for nh in cutlass.range_constexpr(self.pv_parts):
                    pv_mma = self.flat_pv(pv_mma, acc_t, tOrP, tOrV, vh.index, nh, num_kb_pv, tOrVw, whole)
                    if cutlass.const_expr(shadow and nh == 0):
                        k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, pr, t + S, n_blk,
                                                  n_kblocks, warp_idx, None, mc)
                    cute.nvgpu.warpgroup.wait_group(0)
                    self.flat_fold(acc_o_mn, acc_t_mn, alpha, nh, n_rows)
                vh.release()
            else:
                kh.release()
                k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, pr, t + S, n_blk,
                                          n_kblocks, warp_idx, None, mc)
                if cutlass.const_expr(shadow):
                    v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, pr, t + SV, n_blk,
                                              n_kblocks, warp_idx, vwv, mc)
                vh = v_cons.wait_and_advance()
                vh.release()
            if cutlass.const_expr(not shadow):
                v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, pr, t + SV, n_blk,
                                          n_kblocks, warp_idx, vwv, mc)

        self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)

    @cute.jit
    def pair_second(self, mIdx, mKs, b: Int32, h: Int32, qb: Int32, t: Int32, n_blk: Int32, n_kblocks: Int32,
                    blk: Int32, valid: Int32, key0: Int32, seqlen_k: Int32, dense: Int32):
        """Paired tile t: entry 2t+1 joins entry 2t (``blk``, ``valid``, ``key0`` of
        :meth:`entry_head`). Returns the tile's validity, the second half's k scale, the first
        key of each half (seqlen_k for a missing or invalid half: masked like keys past Sk) and
        1 if V came as one 128-key tile (``whole_pair`` of the ids the refill loaded, ``dense``
        the row's flag)."""
        blk2 = Int32(-1)
        if t * 2 + 1 < n_blk:
            blk2 = mIdx[b, h, qb, t * 2 + 1]
        ks1, _ = self.k_scales(mKs, blk2, n_kblocks, b, h)
        valid2 = Int32(0)
        if blk2 >= 0 and blk2 < n_kblocks:
            valid2 = Int32(1)
        key1 = blk2 * 64
        ld, ld2 = blk, blk2  # the refill's load_id: block 0 for an invalid or missing entry
        if valid == 0:
            key0 = seqlen_k
            ld = Int32(0)
        if valid2 == 0:
            key1 = seqlen_k
            ld2 = Int32(0)
        return valid | valid2, ks1, key0, key1, self.whole_pair(ld, ld2, dense)

    @cute.jit
    def entry_head(self, mIdx, mKs, b: Int32, h: Int32, qb: Int32, i: Int32, n_kblocks: Int32):
        """Plan entry i of row qb: its id, 1 if the id is in ``[0, n_kblocks)`` (else the tile's
        math is skipped), its two k scales (branch-free loads, first used after the Q.K^T wait, so
        their latency overlaps it) and the first key of each 64-column half of the tile (a half
        at or past seqlen_k is masked)."""
        blk = mIdx[b, h, qb, i]
        valid = Int32(0)
        if blk >= 0 and blk < n_kblocks:
            valid = Int32(1)
        ks0, ks1 = self.k_scales(mKs, blk, n_kblocks, b, h)
        key0 = blk * self.plan_bk
        return blk, valid, ks0, ks1, key0, key0 + 64

    @cute.jit
    def flat_qk(self, qk_mma, acc_s, tSrQ, tSrK, qslot, kbuf: Int32):
        """Issue Q.K^T of Q slot ``qslot`` and K buffer ``kbuf`` into acc_s (one WGMMA group,
        accumulating onto the bias the caller filled in). Returns qk_mma (its ACCUMULATE field
        is set here; only a returned value carries that back to the caller)."""
        cute.nvgpu.warpgroup.fence()
        qk_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, qslot], tSrK[None, None, kb, kbuf], acc_s)
        cute.nvgpu.warpgroup.commit_group()
        return qk_mma

    @cute.jit
    def flat_pv(self, pv_mma, acc_t, tOrP, tOrV, vbuf: Int32, nh: cutlass.Constexpr, num_kb_pv: cutlass.Constexpr,
                tOrVw=None, whole: Int32 = 0):
        """Issue P.V of column slice ``nh`` of D on V buffer ``vbuf`` into the fresh tile
        accumulator acc_t (one WGMMA group). Paired: k-steps 0-1 read the first 64-key V tile
        (entry 2t), 2-3 the second (entry 2t+1), or (``whole``) all four the 128-key view
        ``tOrVw`` of the same buffer. Returns pv_mma (as :meth:`flat_qk`)."""
        if cutlass.const_expr(self.pair):
            if whole != 0:
                pv_mma = self.pv_steps(pv_mma, acc_t, tOrP, tOrVw, 0, nh, num_kb_pv, False)
            else:
                pv_mma = self.pv_steps(pv_mma, acc_t, tOrP, tOrV, 0, nh, num_kb_pv, True)
        else:
            pv_mma = self.pv_steps(pv_mma, acc_t, tOrP, tOrV, vbuf, nh, num_kb_pv, False)
        return pv_mma

    @cute.jit
    def pv_steps(self, pv_mma, acc_t, tOrP, tOrV, vbuf, nh: cutlass.Constexpr, num_kb_pv: cutlass.Constexpr,
                 halves: cutlass.Constexpr):
        """The P.V k-steps of :meth:`flat_pv` on one view of the V buffer (``halves``: the
        paired kernel's two 64-key tiles, k-steps 0-1 on the first). Fence and commit inside,
        so that each branch of the paired choice is a whole WGMMA group."""
        cute.nvgpu.warpgroup.fence()
        for kb in cutlass.range_constexpr(num_kb_pv):
            pv_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            kv, vb = kb, vbuf
            if cutlass.const_expr(halves):
                kv, vb = kb % (num_kb_pv // 2), kb // (num_kb_pv // 2)
            if cutlass.const_expr(self.pv_parts == 1):
                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb], tOrV[None, None, kv, vb], acc_t)
            else:
                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb],
                          cute.append_ones(tOrV[None, nh, kv, vb], up_to_rank=2), acc_t)
        cute.nvgpu.warpgroup.commit_group()
        return pv_mma

    @cute.jit
    def flat_fold(self, acc_o_mn, acc_t_mn, alpha, nh: cutlass.Constexpr, n_rows: cutlass.Constexpr):
        """O = O * alpha + tile for column slice ``nh`` (two-level accumulation, one FFMA each)."""
        half_cols = cute.size(acc_t_mn, mode=[1])
        for r in cutlass.range_constexpr(n_rows):
            for c in cutlass.range_constexpr(half_cols):
                acc_o_mn[r, c + nh * half_cols] = acc_o_mn[r, c + nh * half_cols] * alpha[r] + acc_t_mn[r, c]

    def q_fused_load(self, tq, tidx: Int32, warp_idx: Int32, qb: Int32, h: Int32, b: Int32):
        """q_fused, first statement of the CTA's work: this thread's 8 loads of the bf16 Q tile
        of query block ``qb`` (8 x 16 bytes), in flight while warp 0 issues the first K/V loads.
        Warp w loads rows 16w..16w+15, the rows of its own Q.K^T accumulator; warps 2g and 2g+1
        share scale group g (32 rows, FlashInfer's Q contract). A plain function (traced inline):
        the loads are issued for every CTA, also one whose row has no plan entries (they stay in
        bounds: rows past Sq read row Sq-1)."""
        lane = tidx % 32
        gQ = tq[None, None, h, b]  # (Sq, 128) bf16
        row0 = (qb * 2 + warp_idx // 2) * 32 + (warp_idx % 2) * 16 + lane // _QSPEC.NCC
        return _QTILE.q_rows_load(gQ, row0, lane % _QSPEC.NCC, _QPTX.l2_policy("evict_first"))

    def q_fused_store(self, vals, tq, sQ_ptr, sQAmax, tidx: Int32, warp_idx: Int32, qb: Int32,
                      amax_base=None) -> Float32:
        """q_fused: the loads of :meth:`q_fused_load` -> INT8 codes in ``sQ`` (the K-major
        128-byte-swizzled WGMMA layout, ``q_smem_offset``) and this warp's scale, with the
        quantizer's own functions (``sage_numerics.q_tile``: the same codes and scales as
        ``quantize_sage``, so the outputs equal the INT8-Q kernel's bit for bit: GPU test). Rows
        past Sq hold a copy of row Sq-1 (finite; the epilogue stores only rows < Sq). Every
        thread of the CTA runs it (two CTA barriers). ``warp_idx`` is the warp within its
        warpgroup; ``amax_base`` (flat_wgs=3) the warpgroup's first word of ``sQAmax``."""
        lane = tidx % 32
        half = lane // _QSPEC.NCC
        group = qb * 2 + warp_idx // 2
        aw = warp_idx if amax_base is None else amax_base + warp_idx
        sQAmax[aw] = _QTILE.q_rows_amax(vals)  # the same value from every lane
        cute.arch.sync_threads()
        scale, inv = _QTILE.q_group_scale(sQAmax[aw], sQAmax[aw ^ 1], group, tq.shape[0])
        for i in range(len(vals)):
            r = warp_idx * 16 + half + 2 * i
            _QPTX.st_shared(sQ_ptr + q_smem_offset(r, lane % _QSPEC.NCC), _QTILE.q_code_words(vals[i], inv))
        # the codes were written by the generic proxy; WGMMA reads sQ through the async proxy
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()
        return scale
