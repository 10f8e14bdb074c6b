"""Three flat warpgroups per CTA (``Sm90Config.flat_wgs == 3``, flat Sage, 128-key tiles) with a
K/V ring they share when their plan rows are identical: ``Sm90Flat3Attention``, a subclass of the
shipped kernel built only with the experiments (``__init__.py`` here). Measured 4-7 % slower than the
one-warpgroup flat kernel on dense and sparse plans (H200, 128-key plans, H=14 S=37760), so the
runtime never selects it.

Why: under the H200's 700 W cap the Sage kernel's time is its energy per call, and the L2 -> SM
K/V traffic is a measured part of it (the ablation of ``ablation.py`` on a dense plan: half the
traffic -5 %, none -13 %; MEASUREMENTS.md). On a dense plan (and on any rows that list the same blocks)
three neighbouring query blocks load the very same K/V blocks, so one load can feed all three.

How: each warpgroup owns one query block (``qb = 3 * blockIdx.x + wg``) and runs the flat
mainloop of ``flat.py`` (the same Q.K^T / softmax / P.V steps and helpers). At the start the CTA
compares its three plan rows (count and ids, ``rows_identical``: one ``bar.red.and``):
- identical: the K and V rings are shared, ``SHARE_STAGES`` deep. Warp 0 of warpgroup 0 issues
  the first entries; every later refill is issued by the *last* of the twelve warps to release the
  entry that frees its stage (a shared-memory counter per stage elects it, ``release_count``, ``elected``), in
  the shadow of that warp's next MMAs, as the flat kernel's warp 0 does. So no warpgroup waits
  for a producer that is busy elsewhere, and the three can drift up to ``SHARE_STAGES`` entries
  apart (their natural staggering: one in softmax while another uses the tensor core).
- otherwise: each warpgroup has its own single K and V buffer and its warp 0 refills them, i.e.
  the flat kernel three times over in one CTA (measured as fast as three one-warpgroup CTAs).
Pipeline positions are computed from the entry index (``ring_pos``), so the two modes share one
loop. The output equals the one-warpgroup kernel's bit for bit in both modes (the same
arithmetic per row; GPU test).
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from aot.kernels.sm90.kernel import Sm90SparseAttention
from aot.kernels.sm90.layout import acc_mn

Float32, Int32, Int64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
W3 = 3  # warpgroups per CTA
# The depth of the K/V ring that the three share when their plan rows are identical (each has its
# own single buffer, the ring's first three, otherwise), so that they can drift up to this many
# entries apart. A power of two (the ring position is a mask) >= 3; 4 x 32 KiB + 24 KiB of Q fit
# one SM.
SHARE_STAGES = 4
_SHARE_LOG2 = SHARE_STAGES.bit_length() - 1
assert SHARE_STAGES == 1 << _SHARE_LOG2 and SHARE_STAGES >= W3, "the shared ring: a power of two >= 3"
# Warpgroup wg > 0 starts its first entry after about wg * STAGGER_NS ns (``nanosleep``), so that the
# three do not begin in phase (all on the tensor core, then all on the MUFU): three CTAs on an SM
# start at unrelated times, one CTA's warpgroups at the same instant. 0: no stagger.
STAGGER_NS = 800
SEP = W3  # barrier slots 0..2: each warpgroup's own buffer; SEP..SEP+SHARE_STAGES-1: the shared ring


@dsl_user_op
def atom_add_shared(ptr, val, *, loc=None, ip=None):
    """``atom.shared.add.u32`` on a shared-memory word: the old value."""
    addr = Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))
    return Int32(llvm.inline_asm(T.i32(), [addr.ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip)],
                                 "atom.shared.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def nanosleep(ns, *, loc=None, ip=None):
    """``nanosleep.u32``: suspend the warp for about ``ns`` nanoseconds (PTX: in [0, 2 ns])."""
    llvm.inline_asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def sync_threads_and(pred, *, loc=None, ip=None):
    """``bar.red.and.pred`` on barrier 1 over the whole CTA: 1 if ``pred`` (Int32) is non-zero in
    every thread, else 0 (CUDA's ``__syncthreads_and``)."""
    return Int32(llvm.inline_asm(T.i32(), [Int32(pred).ir_value(loc=loc, ip=ip)],
                                 "{ .reg .pred p, q; setp.ne.b32 p, $1, 0; bar.red.and.pred q, 1, p; "
                                 "selp.b32 $0, 1, 0, q; }", "=r,r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class Sm90Flat3Mainloop:
    """The ``flat_wgs == 3`` body (the ``shared_ring`` hooks of ``Sm90SparseAttention``)."""

    shared_ring = True
    ring_stages = SHARE_STAGES
    ring_barriers = 4 * (SEP + SHARE_STAGES)  # full / empty of K and V: SEP own slots + the ring
    ring_counters = 2 * SHARE_STAGES  # release counters (K, V)

    @cute.jit
    def ring_init(self, bar, cnt_mem, q_bar, warp_idx: Int32, tidx: Int32):
        """Initialise the barriers (warp 0, one thread) and zero the release counters; the
        kernel's prologue fences and synchronises after it. Returns ``ring_body``'s ``bars``."""
        n = SEP + SHARE_STAGES
        k_full, k_empty, v_full, v_empty = bar, bar + n, bar + 2 * n, bar + 3 * n
        if warp_idx == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(n):
                    arrivals = 4 if i < SEP else 4 * W3  # one per consumer warp
                    for full, empty in ((k_full, k_empty), (v_full, v_empty)):
                        cute.arch.mbarrier_init(full + i, 1)
                        cute.arch.mbarrier_init(empty + i, arrivals)
                for i in cutlass.range_constexpr(W3):
                    cute.arch.mbarrier_init(q_bar + i, 1)
        cnt = cnt_mem.get_tensor(cute.make_layout(2 * SHARE_STAGES))
        if tidx < 2 * SHARE_STAGES:
            cnt[tidx] = Int32(0)
        return q_bar, k_full, k_empty, v_full, v_empty, cnt_mem.data_ptr()

    @cute.jit
    def rows_identical(self, mIdx, mCnt, topk: Int32, b: Int32, h: Int32, qb0: Int32, nqb: Int32,
                       tidx: Int32) -> Int32:
        """1 if the CTA's three plan rows walk the same entries (equal clamped counts, equal ids
        up to it), else 0; the same value in every thread (one CTA barrier). Rows past Sq have
        count 0. Ids are compared raw: an id out of range is skipped alike in every row."""
        n0 = self.row_count(mIdx, mCnt, topk, b, h, qb0, nqb)
        n1 = self.row_count(mIdx, mCnt, topk, b, h, qb0 + 1, nqb)
        n2 = self.row_count(mIdx, mCnt, topk, b, h, qb0 + 2, nqb)
        ok = Int32(0)
        if n0 == n1 and n0 == n2:
            ok = Int32(1)
        if ok != 0:
            # n0 > 0 here means all three rows are < nqb (a row past Sq has count 0)
            for i in cutlass.range(tidx, n0, W3 * 128, unroll=1):
                x = mIdx[b, h, qb0, i]
                if x != mIdx[b, h, qb0 + 1, i] or x != mIdx[b, h, qb0 + 2, i]:
                    ok = Int32(0)
        return sync_threads_and(ok)

    @cute.jit
    def ring_pos(self, e: Int32, shared: Int32, wg: Int32):
        """(barrier slot, buffer slot, phase) of entry e: the shared ring (SHARE_STAGES deep, barrier
        slots SEP..) or this warpgroup's own buffer (one deep, barrier and buffer slot wg)."""
        bi = wg
        slot = wg
        ph = e & 1
        if shared != 0:
            slot = e & (SHARE_STAGES - 1)
            bi = SEP + slot
            ph = (e >> _SHARE_LOG2) & 1
        return bi, slot, ph

    @cute.jit
    def ring_load(self, tma_x, tXgX, tXsX, full, empty, e: Int32, shared: Int32, wg: Int32, mIdx, b: Int32,
                  h: Int32, qb: Int32, n_kblocks: Int32):
        """One warp: wait until entry e's buffer is free, then TMA entry e's K or V block (block 0
        for an id out of range, so that the barrier completes) into it."""
        bi, slot, ph = self.ring_pos(e, shared, wg)
        cute.arch.mbarrier_wait(empty + bi, ph ^ 1)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full + bi, self.k_bytes)
        ld = self.load_id(mIdx, b, h, qb, e, n_kblocks)
        self.tma_load(tma_x, tXgX[(None, ld)], tXsX[(None, slot)], full + bi, self.k_bytes, e)

    @cute.jit
    def release_count(self, empty, cnt, e: Int32, shared: Int32, wg: Int32) -> Int32:
        """Release entry e's buffer (one arrive per warp) and, in the shared ring, count this warp
        in (lane 0: a shared-memory ``atom.add`` on the stage's counter). Returns the counter's old
        value (lane 0; 0 elsewhere and in a warpgroup's own buffer), for :meth:`elected`. The
        atom's result is read only there, under the softmax or the next entry's Q.K^T: read right
        away, its round trip stalls the warp twice per entry on the warpgroup's critical chain."""
        bi, slot, ph = self.ring_pos(e, shared, wg)
        lane = cute.arch.lane_idx()
        if lane == 0:
            cute.arch.mbarrier_arrive(empty + bi)
        old = Int32(0)
        if shared != 0:
            if lane == 0:
                old = atom_add_shared(cnt + slot, 1)
        return old

    @cute.jit
    def elected(self, old: Int32, shared: Int32, lwarp: Int32) -> Int32:
        """1 if this warp refills the buffer it released with :meth:`release_count` (which
        returned ``old``) with entry e + depth: in the shared ring the last of the CTA's twelve
        warps to release it, in a warpgroup's own buffer its warp 0."""
        mine = Int32(0)
        if shared != 0:
            if cute.arch.shuffle_sync(old, 0) % (4 * W3) == 4 * W3 - 1:
                mine = Int32(1)
        else:
            if lwarp == 0:
                mine = Int32(1)
        return mine

    @cute.jit
    def ring_body(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                   scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, bars, nqb: Int32,
                   n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, h: Int32, b: Int32, sQ_ptr, sQAmax):
        """``bars``: (q_full[3], k_full, k_empty, v_full, v_empty [SEP + SHARE_STAGES each], counters
        [2 * SHARE_STAGES]) as shared-memory pointers, initialised by the kernel's prologue."""
        bm, bk = self.bm, self.bk
        q_full, k_full, k_empty, v_full, v_empty, cnt = bars
        wg = warp_idx // 4
        lwarp = warp_idx % 4
        ctid = tidx % 128
        qb = bx * W3 + wg
        n_it = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
            tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb, h, b)
        if cutlass.const_expr(self.q_fused):
            q_vals = self.q_fused_load(tq, ctid, lwarp, qb, h, b)
        shared = self.rows_identical(mIdx, mCnt, topk, b, h, bx * W3, nqb, tidx)
        depth = Int32(1)
        producer = Int32(0)  # issues the first entries of this warp's ring(s)
        if shared != 0:
            depth = Int32(SHARE_STAGES)
            if warp_idx == 0:
                producer = Int32(1)
        else:
            if lwarp == 0:
                producer = Int32(1)
        if lwarp == 0:
            if wg == 0:
                self.prefetch_descriptors(tma_q, tma_k, tma_v)
            if cutlass.const_expr(not self.q_fused):
                if n_it > 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(q_full + wg, self.q_bytes)
                    cute.copy(tma_q, tQgQ, tQsQ[(None, wg)], tma_bar_ptr=q_full + wg)
        if producer != 0:
            for i in cutlass.range(cutlass.min(n_it, depth), unroll=1):
                self.ring_load(tma_k, tKgK, tKsK, k_full, k_empty, i, shared, wg, mIdx, b, h, qb, n_kblocks)
                self.ring_load(tma_v, tVgV, tVsV, v_full, v_empty, i, shared, wg, mIdx, b, h, qb, n_kblocks)

        thr_qk, thr_pv, tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, alpha, tScS_mn = self.consumer_setup(
            qk_mma, pv_mma, sQ, sK, sV, ctid)
        acc_o_mn = acc_mn(acc_o)
        n_rows = cute.size(acc_o_mn, mode=[0])
        if cutlass.const_expr(self.q_fused):
            row_scale = scale_log2 * self.q_fused_store(q_vals, tq, sQ_ptr + wg * (bm * 128), sQAmax, ctid,
                                                        lwarp, qb, amax_base=wg * 4)
        else:
            row_scale = self.q_row_scale(mQs, scale_log2, ctid, qb, nqb, b, h)
        num_kb_pv = cute.size(tOrV, mode=[2])

        if cutlass.const_expr(not self.q_fused):
            if n_it > 0:
                cute.arch.mbarrier_wait(q_full + wg, 0)
        if cutlass.const_expr(STAGGER_NS > 0):
            if wg > 0:
                nanosleep(wg * STAGGER_NS)
        v_old = Int32(-1)  # release_count of V(t-1) (-1 before the first entry: never elected)
        for t in cutlass.range(n_it, unroll=1):
            blk, valid, ks0, ks1, key0, key1 = self.entry_head(mIdx, mKs, b, h, qb, t, n_kblocks)
            bi, slot, ph = self.ring_pos(t, shared, wg)
            cute.arch.mbarrier_wait(k_full + bi, ph)
            if valid != 0:
                acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((bm, bk)))
                acc_s.fill(0x4B400000)  # qk_bias, as in flat_body
                qk_mma = self.flat_qk(qk_mma, acc_s, tSrQ, tSrK, wg, slot)
                v_mine = Int32(0)  # this warp refills V entry t - 1 + depth
                if t > 0:
                    v_mine = self.elected(v_old, shared, lwarp)
                if v_mine != 0:
                    if t - 1 + depth < n_it:
                        self.ring_load(tma_v, tVgV, tVsV, v_full, v_empty, t - 1 + depth, shared, wg, mIdx, b, h,
                                       qb, n_kblocks)
                cute.nvgpu.warpgroup.wait_group(0)
                k_old = self.release_count(k_empty, cnt, t, shared, wg)
                self.softmax_keys(acc_s, tScS_mn, key0, key1, row_scale * ks0, row_scale * ks1, row_max,
                                  row_sum, alpha, seqlen_k)
                k_mine = self.elected(k_old, shared, lwarp)
                tOrP = cute.make_rmem_tensor(thr_pv.partition_shape_A((bm, bk)), self.v_dt)
                self.convert_p(acc_s, tOrP)
                cute.arch.mbarrier_wait(v_full + bi, ph)
                acc_t = thr_pv.make_fragment_C(thr_pv.partition_shape_C((bm, self.hd // self.pv_parts)))
                acc_t.fill(0.0)
                acc_t_mn = acc_mn(acc_t)
                for nh in cutlass.range_constexpr(self.pv_parts):
                    pv_mma = self.flat_pv(pv_mma, acc_t, tOrP, tOrV, slot, nh, num_kb_pv)
                    if cutlass.const_expr(nh == 0):
                        if k_mine != 0:
                            if t + depth < n_it:
                                self.ring_load(tma_k, tKgK, tKsK, k_full, k_empty, t + depth, shared, wg, mIdx, b,
                                               h, qb, n_kblocks)
                    cute.nvgpu.warpgroup.wait_group(0)
                    self.flat_fold(acc_o_mn, acc_t_mn, alpha, nh, n_rows)
                v_old = self.release_count(v_empty, cnt + SHARE_STAGES, t, shared, wg)
            else:
                k_mine = self.elected(self.release_count(k_empty, cnt, t, shared, wg), shared, lwarp)
                if k_mine != 0:
                    if t + depth < n_it:
                        self.ring_load(tma_k, tKgK, tKsK, k_full, k_empty, t + depth, shared, wg, mIdx, b, h, qb,
                                       n_kblocks)
                v_mine = Int32(0)
                if t > 0:
                    v_mine = self.elected(v_old, shared, lwarp)
                if v_mine != 0:
                    if t - 1 + depth < n_it:
                        self.ring_load(tma_v, tVgV, tVsV, v_full, v_empty, t - 1 + depth, shared, wg, mIdx, b, h,
                                       qb, n_kblocks)
                cute.arch.mbarrier_wait(v_full + bi, ph)
                v_old = self.release_count(v_empty, cnt + SHARE_STAGES, t, shared, wg)

        self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)


class Sm90Flat3Attention(Sm90Flat3Mainloop, Sm90SparseAttention):
    """The shipped kernel with three flat warpgroups per CTA sharing a K/V ring (experiments only)."""

    def __init__(self, cfg):
        if cfg.flat_wgs != W3:
            raise ValueError(f"flat_wgs={cfg.flat_wgs}: this class runs {W3} warpgroups per flat CTA. "
                             f"Fix: flat_wgs={W3}, or Sm90SparseAttention for one.")
        super().__init__(cfg)
