"""The Sage quantizer's kernel, ``SageQuantKV``: its entry points (one per plan variant), the
launch, and the dispatch of every CTA to its role (the K-mean sample partials, the Q tiles, the
K and V units, the redo tickets and the plan rows). Contract, schedule and why: the package
docstring; the roles' device code: ``sage_numerics/q_tile.py``, ``roles.py``; the slots: ``sync.py``.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from aot.contract import SAGE_K_MEAN_SPLIT, sage_v_rows
from aot.contract import SAGE_STATS_GROUP as STATS_GROUP  # units per group row of the V statistics
from aot.kernels import plan_prepare

from .pool import cell_of_k, pool_k_sums, pool_q_tile, store_cell
from aot.kernels.sage_numerics.ptx import div_full, fence_gpu, l2_policy
from aot.kernels.sage_numerics.q_tile import quantize_q_tile
from .roles import (block_rows, k_mean_of_parts, quantize_k_block, quantize_v_block, reduce_rows, sample_part,
                    store_v_unit, v_bound, v_scale_of, v_stats_unit)
from .schedule import (REDO_UNITS, interleave, k_part_row, kv_unit, launch_ctas, plan_every, plan_rows, redo_ticket,
                       sync_guard, ticket_role)
from .spec import (HEAD_DIM, K_BLOCK, KV_HALF, KV_THREADS, PLAN_ROWS, Q_ROWS, SMEM_AMAX, SMEM_CARVEOUT_DEFAULT,
                   SMEM_FLAG, SMEM_QAMAX, SMEM_RED, SMEM_V8, SMEM_WORDS, UNIT_BLOCKS, V8_CHUNKS,
                   VROW_BYTES, VSLOT)
from .sync import poll_v, publish_v, sync_row, sync_vrow, take_ticket

prepare_plan_row = plan_prepare.device_fns()  # the plan role: plan_prepare's row


def _select_i32(cond, a, b):
    return Int32(cutlass.select_(cond, Int32(a), Int32(b)))


class SageQuantKV:
    """The quantizer's one launch. Its compile-time parameter is the launch bound ``ctas_per_sm``
    (``KV_CTAS_PER_SM`` of the target); its entry points ``run_noplan``, ``run_cnt``,
    ``run_topk`` and ``run_pool`` are the variants (``variants.py``)."""

    def __init__(self, ctas_per_sm: int = 4):
        self.ctas_per_sm = ctas_per_sm  # the launch bound (KV_CTAS_PER_SM of the target)

    @cute.jit
    def run_noplan(self, q: cute.Tensor, q_int8: cute.Tensor, q_scale: cute.Tensor, k: cute.Tensor,
                   v: cute.Tensor, k_mean: cute.Tensor, v_scale: cute.Tensor, k_int8: cute.Tensor,
                   k_scale: cute.Tensor, v_fp8: cute.Tensor, sync: cute.Tensor,
                   stream: cuda.CUstream):
        self.launch(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                    None, None, None, None, None, Int32(0), Int32(0), Int32(1), Int32(0), stream)

    @cute.jit
    def run_cnt(self, q: cute.Tensor, q_int8: cute.Tensor, q_scale: cute.Tensor, k: cute.Tensor,
                v: cute.Tensor, k_mean: cute.Tensor, v_scale: cute.Tensor, k_int8: cute.Tensor,
                k_scale: cute.Tensor, v_fp8: cute.Tensor, sync: cute.Tensor,
                q2k_block_index: cute.Tensor, block_counts: cute.Tensor, out_index: cute.Tensor,
                out_counts: cute.Tensor, summary: cute.Tensor, num_key_blocks: Int32, split: Int32,
                num_out_blocks: Int32, stream: cuda.CUstream):
        self.launch(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                    q2k_block_index, block_counts, out_index, out_counts, summary, num_key_blocks,
                    Int32(0), split, num_out_blocks, stream)

    @cute.jit
    def run_topk(self, q: cute.Tensor, q_int8: cute.Tensor, q_scale: cute.Tensor, k: cute.Tensor,
                 v: cute.Tensor, k_mean: cute.Tensor, v_scale: cute.Tensor, k_int8: cute.Tensor,
                 k_scale: cute.Tensor, v_fp8: cute.Tensor, sync: cute.Tensor,
                 q2k_block_index: cute.Tensor, out_index: cute.Tensor, out_counts: cute.Tensor,
                 summary: cute.Tensor, num_key_blocks: Int32, topk: Int32, split: Int32,
                 num_out_blocks: Int32, stream: cuda.CUstream):
        self.launch(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                    q2k_block_index, None, out_index, out_counts, summary, num_key_blocks, topk, split,
                    num_out_blocks, stream)

    @cute.jit
    def run_pool(self, q: cute.Tensor, q_int8: cute.Tensor, q_scale: cute.Tensor, k: cute.Tensor,
                 v: cute.Tensor, k_mean: cute.Tensor, v_scale: cute.Tensor, k_int8: cute.Tensor,
                 k_scale: cute.Tensor, v_fp8: cute.Tensor, sync: cute.Tensor, pooled_q: cute.Tensor,
                 pooled_k: cute.Tensor, q_pool_scale: Float32, stream: cuda.CUstream):
        self.launch(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                    None, None, None, None, None, Int32(0), Int32(0), Int32(1), Int32(0), stream,
                    pooled_q, pooled_k, q_pool_scale)

    @cute.jit
    def launch(self, q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
               mIdx, mCnt, mOut, mOutCnt, mSum, nkb: Int32, topk: Int32, split: Int32, nout: Int32,
               stream: cuda.CUstream, mPQ=None, mPK=None, qps=None):
        nu = ((k.shape[1] + K_BLOCK - 1) // K_BLOCK + UNIT_BLOCKS - 1) // UNIT_BLOCKS
        n_q = (q.shape[1] + Q_ROWS - 1) // Q_ROWS * q.shape[2] * q.shape[0]  # Q tiles
        n_plan = Int32(0)
        if cutlass.const_expr(mIdx is not None):
            rows = plan_rows(nkb, KV_THREADS // 32, PLAN_ROWS, select=_select_i32)
            n_plan = (mIdx.shape[2] + rows - 1) // rows * mIdx.shape[1] * mIdx.shape[0]
        n_tickets, n_grid = launch_ctas(k.shape[0] * k.shape[2], nu, n_q, n_plan)
        self.kernel(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                    n_tickets, n_plan, mIdx, mCnt, mOut, mOutCnt, mSum, nkb, topk, split, nout, mPQ, mPK,
                    qps).launch(
            grid=[cutlass.max(n_grid, 1), 1, 1], block=[KV_THREADS, 1, 1], stream=stream,
            min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=SMEM_CARVEOUT_DEFAULT,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mQ8: cute.Tensor,
        mQS: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKMean: cute.Tensor,
        mVScale: cute.Tensor,
        mK8: cute.Tensor,
        mKS: cute.Tensor,
        mV8: cute.Tensor,
        mSync: cute.Tensor,
        n_tickets: Int32,
        n_plan: Int32,
        mIdx,
        mCnt,
        mOut,
        mOutCnt,
        mSum,
        nkb: Int32,
        topk: Int32,
        split: Int32,
        nout: Int32,
        mPQ,
        mPK,
        qps,
    ):
        # the attention kernel after it (PDL, sm90/config.py) may be dispatched once every
        # CTA of this grid has started: it waits for this grid's end before its first read
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        B = mK.shape[0]
        S = mK.shape[1]
        H = mK.shape[2]
        nb = (S + K_BLOCK - 1) // K_BLOCK
        nu = (nb + UNIT_BLOCKS - 1) // UNIT_BLOCKS  # units (tickets) per segment
        vr = sage_v_rows(nu)  # one V segment's rows (contract.SageVRows)
        nbt = 2 * B * H * nu  # segments: V of (b, h), then K of (b, h), head-major
        n_km = k_part_row(B * H)  # the K-mean tickets come first

        # Shared memory: one region, carved per role (a CTA has one role). With a plan it is
        # the plan role's 32 KiB bitmap (4 rows x MAX_KEY_BLOCKS bits), which is what keeps
        # sm_120a at 3 CTAs per SM; the quantizer's 21 KiB (SMEM_WORDS) alias its start.
        smem = cutlass.utils.SmemAllocator()
        words = SMEM_WORDS
        if cutlass.const_expr(mIdx is not None):
            words = max(SMEM_WORDS, PLAN_ROWS * plan_prepare.WORDS)
        sBits = smem.allocate_tensor(Int32, cute.make_layout((words,)), 16)
        base = sBits.iterator
        sStat = cute.make_tensor(cute.recast_ptr(base, dtype=Float32),
                                 cute.make_layout((2, HEAD_DIM), stride=(HEAD_DIM, 1)))
        sRed = cute.make_tensor(cute.recast_ptr(base + SMEM_RED, dtype=Float32),
                                cute.make_layout((KV_THREADS // 32, HEAD_DIM), stride=(HEAD_DIM, 1)))
        sAmax = cute.make_tensor(cute.recast_ptr(base + SMEM_AMAX, dtype=Float32),
                                 cute.make_layout(KV_THREADS // 32))  # [warp]
        sFlag = cute.make_tensor(base + SMEM_FLAG, cute.make_layout((4,)))  # ticket, tag, redo
        sQAmax = cute.make_tensor(base + SMEM_QAMAX, cute.make_layout((KV_THREADS // 32,)))
        sV8 = cute.make_tensor(base + SMEM_V8, cute.make_layout((HEAD_DIM * V8_CHUNKS * 4,)))
        ch = tidx % HEAD_DIM
        nq_tile = (mQ.shape[1] + Q_ROWS - 1) // Q_ROWS
        n_q = nq_tile * B * H
        n_kv = n_tickets - n_km - n_q
        is_plan, lin, _ = interleave(bx, n_tickets, n_plan, plan_every(n_tickets, n_plan, maximum=cutlass.max),
                                     select=_select_i32, minimum=cutlass.min)
        if is_plan == 0:
            # a workspace smaller than the shape needs (the runtime sizes it: contract.py) -> no
            # work (and no ticket taken); sync rows: the K-mean partials, then the V statistics
            if sync_guard(mSync.shape[0], B * H, vr.rows):
                tq = take_ticket(mSync, n_tickets, tidx, sFlag)
                if tq < n_km:
                    # partial tq % SPLIT of head tq // SPLIT's samples: V's amax first (the
                    # head's V units, the next tickets, take their scale bound from it),
                    # then K's sum (the K units after them wait for it)
                    hk = tq // SAGE_K_MEAN_SPLIT
                    bk = hk // H
                    part = tq - hk * SAGE_K_MEAN_SPLIT
                    sample_part(mV, sync_vrow(mSync, B * H, hk * vr.rows + vr.sample0 + part), bk, hk - bk * H,
                                part, tidx, lane, sRed, sFlag, True)
                    cute.arch.sync_threads()  # (threads 0-127 may still read sRed)
                    sample_part(mK, sync_row(mSync, tq), bk, hk - bk * H, part, tidx, lane, sRed, sFlag, False)
                else:
                    self.ticket(mQ, mQ8, mQS, mK, mV, mKMean, mVScale, mK8, mKS, mV8, mSync, tq - n_km,
                                n_kv, n_q, nq_tile, nu, vr, nbt, tidx, warp, lane, ch, sStat, sRed, sAmax,
                                sFlag, sQAmax, sV8, mPQ, mPK, qps)
        else:
            # the plan role (variants cnt / topk), no ticket: plan CTA lin takes ``rows``
            # rows (row group, then h, then b) of (b, h) = divmod(lin // per, H), one per warp,
            # each warp with its 1/rows of the bitmap
            if cutlass.const_expr(mIdx is not None):
                rows = plan_rows(nkb, KV_THREADS // 32, PLAN_ROWS, select=_select_i32)
                per = (mIdx.shape[2] + rows - 1) // rows
                hb = lin // per
                idx = lin - hb * per
                bb = hb // mIdx.shape[1]
                hh = hb - bb * mIdx.shape[1]
                if warp < rows:
                    prepare_plan_row(mIdx, mCnt, mOut, mOutCnt, mSum, nkb, topk, split, nout, bb, hh,
                                     idx * rows + warp, warp, lane, sBits, PLAN_ROWS * plan_prepare.WORDS // rows)

    @cute.jit
    def ticket(self, mQ, mQ8, mQS, mK, mV, mKMean, mVScale, mK8, mKS, mV8, mSync, tr, n_kv, n_q, nq_tile,
               nu, rows, nbt, tidx, warp, lane, ch, sStat, sRed, sAmax, sFlag, sQAmax, sV8, mPQ, mPK, qps):
        """Ticket ``tr`` after the K-mean tickets: a Q tile, a K or V unit or a redo ticket
        (``ticket_role``, ``kv_unit``, ``redo_ticket``); with pooled tensors (variant pool) the
        Q tiles and K units also pool their rows (``pool.py``)."""
        B = mK.shape[0]
        H = mK.shape[2]
        is_q, i, tk = ticket_role(tr, n_kv, n_q, select=_select_i32, minimum=cutlass.min)
        if is_q != 0:
            hb = i // nq_tile
            bq = hb // H
            if cutlass.const_expr(mPQ is None):
                quantize_q_tile(mQ, mQ8, mQS, bq, hb - bq * H, i - hb * nq_tile, warp, lane, sQAmax)
            else:
                pool_q_tile(mQ, mQ8, mQS, mPQ, qps, bq, hb - bq * H, i - hb * nq_tile, warp, lane, sQAmax,
                            sRed)
            tk = Int32(-1)  # (no K/V work)
        if tk >= 0 and tk < nbt:
            hb, is_k, un = kv_unit(tk, nu)
            bb = hb // H
            hh = hb - bb * H
            if is_k == 1:
                self.quantize_k_unit(mK, mK8, mKS, mKMean, sync_row(mSync, k_part_row(hb)), un, bb, hh,
                                     un * UNIT_BLOCKS + tidx // KV_HALF, tidx, warp, lane, sStat, sAmax, sFlag,
                                     mPK, sRed, sV8)
            else:
                self.v_unit(mV, mV8, mVScale, sync_vrow(mSync, B * H, hb * rows.rows), rows, nu, un, bb, hh, tidx,
                            lane, ch, sStat, sRed, sFlag, sV8)
        if tk >= nbt and tk < n_kv:
            hb, u0 = redo_ticket(tk - nbt, nu)
            bb = hb // H
            self.redo(mV, mV8, sync_vrow(mSync, B * H, hb * rows.rows), rows, nu, u0, bb, hb - bb * H, tidx, lane,
                      sStat, sFlag, sV8)

    @cute.jit
    def v_unit(self, mV, mV8, mVScale, seg, rows, nu, un, b, h, tidx, lane, ch, sStat, sRed, sFlag, sV8):
        """V unit ``un`` of (b, h) (its segment's rows at ``seg``), in its only read: its rows
        are loaded (evict_first), their per-channel amax published as the unit's statistics
        row, and the unit quantized with ``v_scale_of(bound)`` (``v_bound``: the sampled amax
        times the margin, from the first tickets); then, after a release fence, its done
        slot (the redo tickets wait for it before they overwrite the codes). The CTA of a
        group's last unit reduces the group's rows into the segment's group row, that of
        the segment's last unit the group rows into the final row (the exact amax) and
        ``v_scale = v_scale_of(max(bound, amax))``: the scale the codes were made with
        unless a key exceeds the bound. Every slot waited for is an earlier ticket's; rows
        are reduced in index order (deterministic)."""
        group0, final, sample0, done0 = rows.group0, rows.final, rows.sample0, rows.done0
        ng = final - group0
        blk = un * UNIT_BLOCKS + tidx // KV_HALF
        pol = l2_policy("evict_first")
        vals = block_rows(mV, b, h, blk, tidx, pol)
        # the bound's L2 round trip under the rows' DRAM loads (before the statistics, which
        # wait for the rows)
        if tidx < KV_HALF:
            bound = v_bound(seg + Int64(sample0) * VROW_BYTES, tidx, sFlag[1])
            sStat[0, tidx] = bound
            sStat[1, tidx] = div_full(Float32(1.0), v_scale_of(bound))
        v_stats_unit(vals, seg + Int64(un) * VROW_BYTES, tidx, lane, sRed, sFlag)
        cute.arch.sync_threads()
        quantize_v_block(vals, sV8, blk, mV.shape[1], tidx, lane, sStat)
        cute.arch.sync_threads()
        store_v_unit(sV8, mV8, b, h, un, mV.shape[1], tidx, pol)
        cute.arch.sync_threads()  # every thread's codes, before the release
        if tidx == 0:
            fence_gpu()
            publish_v(seg + Int64(done0) * VROW_BYTES + Int64(un * VSLOT), Float32(0.0), sFlag[1])
        grp = un // STATS_GROUP
        n_in = cutlass.min(STATS_GROUP, nu - grp * STATS_GROUP)
        if un == grp * STATS_GROUP + n_in - 1:
            acc = reduce_rows(seg + Int64(grp * STATS_GROUP) * VROW_BYTES, n_in, tidx, sRed, sFlag[1])
            if tidx < KV_HALF:
                publish_v(seg + Int64(group0 + grp) * VROW_BYTES + Int64(ch * VSLOT), acc, sFlag[1])
            if un == nu - 1:
                acc = reduce_rows(seg + Int64(group0) * VROW_BYTES, ng, tidx, sRed, sFlag[1])
                if tidx < KV_HALF:
                    # the final row holds the exact amax (bf16-exact, like every V slot); the
                    # redo tickets compare it with the bound
                    publish_v(seg + Int64(final) * VROW_BYTES + Int64(ch * VSLOT), acc, sFlag[1])
                    mVScale[b, h, ch] = v_scale_of(cute.arch.fmax(acc, sStat[0, ch]))

    @cute.jit
    def redo(self, mV, mV8, seg, rows, nu, u0, b, h, tidx, lane, sStat, sFlag, sV8):
        """Redo ticket of units ``u0 ..`` (REDO_UNITS) of V(b, h): once the segment's final row
        is there (an earlier ticket's), if a channel's exact amax exceeds its bound, the
        units were quantized with too small a scale: each is read and quantized again with
        ``v_scale_of(max(bound, amax))`` (``v_scale``), after its done slot (an acquire: the
        unit's first codes are then written, so these overwrite them). Otherwise (every
        Gaussian-like V) nothing more: the ticket read two rows."""
        sFlag[2] = Int32(0)
        cute.arch.sync_threads()
        if tidx < KV_HALF:
            amax = poll_v(seg + Int64(rows.final) * VROW_BYTES + Int64(tidx * VSLOT), sFlag[1])
            bound = v_bound(seg + Int64(rows.sample0) * VROW_BYTES, tidx, sFlag[1])
            sStat[1, tidx] = div_full(Float32(1.0), v_scale_of(cute.arch.fmax(amax, bound)))
            if amax > bound:
                sFlag[2] = Int32(1)
        cute.arch.sync_threads()
        if sFlag[2] != 0:
            pol = l2_policy("evict_first")
            for un in cutlass.range(u0, cutlass.min(u0 + REDO_UNITS, nu), unroll=1):
                if tidx == 0:
                    poll_v(seg + Int64(rows.done0) * VROW_BYTES + Int64(un * VSLOT), sFlag[1])
                    fence_gpu()
                cute.arch.sync_threads()
                blk = un * UNIT_BLOCKS + tidx // KV_HALF
                vals = block_rows(mV, b, h, blk, tidx, pol)
                quantize_v_block(vals, sV8, blk, mV.shape[1], tidx, lane, sStat)
                cute.arch.sync_threads()
                store_v_unit(sV8, mV8, b, h, un, mV.shape[1], tidx, pol)

    @cute.jit
    def quantize_k_unit(self, mK, mK8, mKS, mKMean, parts, un, b, h, blk, tidx, warp, lane, sStat, sAmax,
                        sFlag, mPK=None, sSum=None, sScratch=None):
        """Block ``blk`` of unit ``un`` of K(b, h), each warp group its own: the K mean (the sum
        of the head's K-mean partial rows at ``parts``, each slot waited for: earlier tickets;
        unit 0 also writes it to ``k_mean``) goes to shared memory, its rows are loaded
        (evict_first: the only read of these lines), then the block is centred and quantized.
        (The mean before the loads: after them ptxas spills 8 bytes at the 64-register bound.)
        With ``mPK`` (variant pool) the block's cells are summed from the loaded rows (into
        ``sSum``, the K unit's free ``sRed``; the half-warps' partial chains in ``sScratch``, its
        free ``sV8``) and stored after the quantization."""
        if tidx < KV_HALF:
            m = k_mean_of_parts(parts, mK.shape[1], tidx, sFlag[1])
            sStat[0, tidx] = m
            if un == 0:
                mKMean[b, h, tidx] = m
        pol = l2_policy("evict_first")
        vals = block_rows(mK, b, h, blk, tidx, pol)
        if cutlass.const_expr(mPK is not None):
            sChain = cute.make_tensor(cute.recast_ptr(sScratch.iterator, dtype=Float32),
                                      cute.make_layout((KV_THREADS // 32, 2 * HEAD_DIM), stride=(2 * HEAD_DIM, 1)))
            pool_k_sums(vals, sSum, sChain, blk, mK.shape[1], tidx, warp, lane)
        cute.arch.sync_threads()
        quantize_k_block(vals, mK8, mKS, b, h, blk, mK.shape[1], tidx, warp, lane, sStat, sAmax, pol)
        if cutlass.const_expr(mPK is not None):
            store_cell(sSum, mPK, b, h, cell_of_k(blk, tidx), mK.shape[1], None, warp, lane)

