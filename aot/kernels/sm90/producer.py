"""TMA loads of the SM90a attention kernel: the producer warp of the warp-specialised shapes and
the refills that warp 0 of the flat shape issues between its own MMAs.

Entries of the plan with an id outside ``[0, ceil(Sk/bk))`` are not loaded by the producer (the
consumer skips them too); the flat refill loads block 0 instead (always in bounds) so that every
buffer it hands over has completed its barrier.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

Int32 = cutlass.Int32


class Sm90Producer:
    """Mixin of ``Sm90SparseAttention``: everything that issues TMA loads."""

    @cute.jit
    def tma_views(self, tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb: Int32, h: Int32, b: Int32,
                  mc: cutlass.Constexpr = False):
        """TMA source/destination partitions of the Q tile and of all K / V blocks of (b, h);
        ``mc``: of this CTA's half of each K / V box (multicast atoms, cluster=2)."""
        bm, hd = self.bm, self.hd
        tQsQ, tQgQ = None, None  # q_fused: the kernel loads and quantizes Q itself (flat.py)
        if cutlass.const_expr(not self.q_fused):
            gQ = cute.local_tile(tq[None, None, h, b], (bm, hd), (qb, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2),
            )
        crd, cl = self.cluster_coord(mc)
        gK = cute.local_tile(tk[None, None, h, b], (self.plan_bk, hd), (None, 0))
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, crd, cl, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2),
        )
        gV = cute.local_tile(tv[None, None, h, b], (hd, self.plan_bk), (0, None))
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, crd, cl, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2),
        )
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    def cluster_coord(self, mc: bool):
        """(this CTA's coordinate, the CTA layout) that a TMA partition takes: the CTA's rank in
        its two-CTA cluster for a multicast atom (``mc``), else the one-CTA layout."""
        if mc:
            return cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()), cute.make_layout(2)
        return 0, cute.make_layout(1)

    @cute.jit
    def vw_views(self, vw, h: Int32, b: Int32, dense: Int32, mc: cutlass.Constexpr = False):
        """Paired kernel: (TMA atom, source partition of all 128-key V tiles of (b, h),
        destination partition of the buffer's 128-key view, ``dense``) for an aligned pair's V,
        from ``vw`` = (atom, TMA tensor, 128-key view of sV); None when not paired. ``dense``: 1
        if the row lists as many entries as there are key blocks (:meth:`whole_pair`). ``mc``:
        ``vw`` holds the multicast atom (cluster=2), partitioned to this CTA's half of the box."""
        out = None
        if cutlass.const_expr(vw is not None):
            tma_vw, tvw, sVw = vw
            crd, cl = self.cluster_coord(mc)
            gVw = cute.local_tile(tvw[None, None, h, b], (self.hd, self.bk), (0, None))
            tVwsV, tVwgV = cpasync.tma_partition(
                tma_vw, crd, cl, cute.group_modes(sVw, 0, 2), cute.group_modes(gVw, 0, 2),
            )
            out = (tma_vw, tVwgV, tVwsV, dense)
        return out

    @cute.jit
    def prefetch_descriptors(self, tma_q, tma_k, tma_v, tma_vw=None):
        """Prefetch the TMA descriptors (Q's only when there is a Q TMA: not with q_fused; the
        aligned pairs' V one only in the paired kernel)."""
        if cutlass.const_expr(tma_q is not None):
            cpasync.prefetch_descriptor(tma_q)
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        if cutlass.const_expr(tma_vw is not None):
            cpasync.prefetch_descriptor(tma_vw)

    @cute.jit
    def producer(self, tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, q_prod, k_prod, v_prod, mIdx,
                 n_blk: Int32, n_kblocks: Int32, qb: Int32, h: Int32, b: Int32, st: cutlass.Constexpr, e0=None):
        """Producer warp ``st``: the Q tile of query block ``qb`` into Q slot ``st`` and the K/V
        blocks of its plan row's ``n_blk`` entries from ``e0`` (None: the first; a split CTA's
        consumer 1 starts half-way, ``kernel.ws_split``) into consumer ``st``'s rings."""
        if cutlass.const_expr(st == 0):
            self.prefetch_descriptors(tma_q, tma_k, tma_v)
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
            tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb, h, b)
        if n_blk > 0:
            qh = q_prod.acquire_and_advance()
            cute.copy(tma_q, tQgQ, tQsQ[(None, st)], tma_bar_ptr=qh.barrier)
        for i in cutlass.range(n_blk, unroll=1):
            e = i
            if cutlass.const_expr(e0 is not None):
                e = e0 + i
            blk = mIdx[b, h, qb, e]
            if blk >= 0 and blk < n_kblocks:
                kh = k_prod.acquire_and_advance()
                self.tma_load(tma_k, tKgK[(None, blk)], tKsK[(None, kh.index + st * self.k_stages)],
                              kh.barrier, self.k_bytes, i)
                vh = v_prod.acquire_and_advance()
                self.tma_load(tma_v, tVgV[(None, blk)], tVsV[(None, vh.index + st * self.v_stages)],
                              vh.barrier, self.v_bytes, i)

    @cute.jit
    def producer_shared(self, tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, q_prod, k_prod, v_prod, mIdx,
                        n_blk: Int32, n_kblocks: Int32, qb: Int32, pr: Int32, h: Int32, b: Int32,
                        st: cutlass.Constexpr, mc: cutlass.Constexpr = False):
        """kv_share, a CTA of two dense rows (``kernel.ws_shared_ring``): warp ``st`` loads the Q
        tile of query block ``qb`` into Q slot ``st``; warp 0 also every K/V block of plan row
        ``pr`` (``n_blk`` entries) into the shared ring, whose indices span all the CTA's
        buffers. ``mc``: the K/V atoms are the cluster's multicast ones (this CTA's half of every
        box, into both CTAs' rings)."""
        if cutlass.const_expr(st == 0):
            self.prefetch_descriptors(tma_q, tma_k, tma_v)
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
            tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb, h, b, mc)
        if n_blk > 0:
            qh = q_prod.acquire_and_advance()
            cute.copy(tma_q, tQgQ, tQsQ[(None, st)], tma_bar_ptr=qh.barrier)
        if cutlass.const_expr(st == 0):
            for i in cutlass.range(n_blk, unroll=1):
                blk = mIdx[b, h, pr, i]
                if blk >= 0 and blk < n_kblocks:
                    kh = k_prod.acquire_and_advance()
                    self.tma_load(tma_k, tKgK[(None, blk)], tKsK[(None, kh.index)], kh.barrier, self.k_bytes, i,
                                  mcast=mc)
                    vh = v_prod.acquire_and_advance()
                    self.tma_load(tma_v, tVgV[(None, blk)], tVsV[(None, vh.index)], vh.barrier, self.v_bytes, i,
                                  mcast=mc)

    @cute.jit
    def flat_refill(self, prod, tma_x, tXgX, tXsX, mIdx, b: Int32, h: Int32, qb: Int32, i: Int32,
                    n_blk: Int32, n_kblocks: Int32, warp_idx: Int32, vw=None, mc: cutlass.Constexpr = False):
        """Flat shape, warp 0: TMA of plan entry i's K or V block into the buffer just released
        (``vw``: the paired kernel's V, :meth:`vw_views`). Returns the producer: its state
        changes inside the branch, and only a returned value carries that change back. ``mc``:
        the atom is the cluster's multicast one (this CTA's half, into both CTAs)."""
        if warp_idx == 0:
            if cutlass.const_expr(self.pair):
                # tile i = entries 2i, 2i+1 into the two 64-key halves; both boxes are always
                # issued (the barrier expects both), a missing second entry loads block 0. V of
                # blocks 2j, 2j+1 goes as 128-key tile j in one box (the same bytes).
                if i * 2 < n_blk:
                    ld = self.load_id(mIdx, b, h, qb, i * 2, n_kblocks)
                    ld2 = Int32(0)
                    if i * 2 + 1 < n_blk:
                        ld2 = self.load_id(mIdx, b, h, qb, i * 2 + 1, n_kblocks)
                    xn = prod.acquire_and_advance()
                    half = self.k_bytes // 2  # one 64-key box (K and V tiles have the same byte count)
                    if cutlass.const_expr(vw is None):  # K: two boxes into the two row halves
                        self.tma_load(tma_x, tXgX[(None, ld)], tXsX[(None, 0)], xn.barrier, half, i, mcast=mc)
                        self.tma_load(tma_x, tXgX[(None, ld2)], tXsX[(None, 1)], xn.barrier, half, i, mcast=mc)
                    else:
                        tma_vw, tVwgV, tVwsV, dense = vw
                        if self.whole_pair(ld, ld2, dense) != 0:
                            self.tma_load(tma_vw, tVwgV[(None, ld // 2)], tVwsV[(None, 0)], xn.barrier,
                                          self.k_bytes, i, mcast=mc)
                        else:
                            self.tma_load(tma_x, tXgX[(None, ld)], tXsX[(None, 0)], xn.barrier, half, i, mcast=mc)
                            self.tma_load(tma_x, tXgX[(None, ld2)], tXsX[(None, 1)], xn.barrier, half, i, mcast=mc)
            else:
                if i < n_blk:
                    ld = self.load_id(mIdx, b, h, qb, i, n_kblocks)
                    xn = prod.acquire_and_advance()
                    # (K and V tiles of the flat Sage kernel have the same byte count)
                    self.tma_load(tma_x, tXgX[(None, ld)], tXsX[(None, xn.index)], xn.barrier, self.k_bytes, i,
                                  mcast=mc)
        return prod

    @cute.jit
    def whole_pair(self, ld: Int32, ld2: Int32, dense: Int32) -> Int32:
        """1 if the blocks a paired tile loads (:meth:`load_id` of its two entries; 0 for a
        missing one) are 2j and 2j+1, i.e. 128-key tile j, in a dense row (``dense``): the
        refill loads V as one box and the consumer reads it in the 128-key layout. Both sides
        decide from the same values. Why (H200, 700 W cap, ``benchmark/pair_ab.py``,
        MEASUREMENTS.md): on a dense 64-key plan the paired kernel took
        1.010-1.016x the 128-key kernel's time with two 64-key V tiles, and an ablation showed
        the second entry's id loads and checks cost nothing, V as one box all of it; with one box
        1.003-1.014x (one run of four without a gain). Why dense rows only: on local+random rows,
        where whole and split tiles alternate, one box for every aligned pair cost 0.4-1.9 %
        (not understood); gated, sparse rows time as before."""
        w = Int32(0)
        if dense != 0 and ld % 2 == 0 and ld2 == ld + 1:
            w = Int32(1)
        return w

    @cute.jit
    def load_id(self, mIdx, b: Int32, h: Int32, qb: Int32, i: Int32, n_kblocks: Int32) -> Int32:
        """Key block to load for plan entry i: its id, or block 0 for an id out of range."""
        blk = mIdx[b, h, qb, i]
        ld = Int32(0)
        if blk >= 0 and blk < n_kblocks:
            ld = blk
        return ld

    @cute.jit
    def tma_load(self, tma_x, src, dst, bar, nbytes: cutlass.Constexpr, i: Int32, mcast: cutlass.Constexpr = False):
        """TMA of plan entry i's K or V block (nbytes) into dst, completing on barrier bar. The one
        place every K/V load goes through, so that the timing experiments (aot/experiments/sm90)
        can replace it; the shipped kernel uses neither nbytes nor i. ``mcast``: a multicast atom
        (cluster=2), whose box half goes to both CTAs of the cluster."""
        if cutlass.const_expr(mcast):
            cute.copy(tma_x, src, dst, tma_bar_ptr=bar, mcast_mask=cutlass.Int16(3))
        else:
            cute.copy(tma_x, src, dst, tma_bar_ptr=bar)
