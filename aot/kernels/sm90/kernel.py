"""The SM90a attention kernel class: host side (TMA atoms, shared-memory layout, launch), the
device entry (shared memory, one Q/K/V pipeline set per consumer warpgroup) and the dispatch to
the flat or the warp-specialised body. The bodies live in the mixins it is composed of:
``producer.py`` (TMA loads), ``consumer.py`` (warp-specialised MMA mainloop), ``flat.py`` (the
flat mainloop), ``softmax.py`` and ``epilogue.py``. A subclass can add a body that shares one K/V
ring among several warpgroups (the ``shared_ring`` hooks below; aot/experiments/sm90/flat3.py). See the package docstring for what it
computes and how to build it.

CuTe-DSL traces these methods: everything under ``@cute.jit`` / ``@cute.kernel`` is Python that
emits the kernel's IR, so statement order here is instruction order in the kernel.
"""

import dataclasses
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from aot.contract import HEAD_DIM

from .config import PDL, Sm90Config
from .consumer import Sm90Consumer
from .epilogue import Sm90Epilogue
from .flat import Sm90FlatMainloop
from .layout import permuted
from .producer import Sm90Producer
from .softmax import Sm90Softmax

Float32, Int32 = cutlass.Float32, cutlass.Int32


class Sm90SparseAttention(Sm90Producer, Sm90Consumer, Sm90FlatMainloop, Sm90Softmax, Sm90Epilogue):
    """Block-sparse attention forward for one :class:`Sm90Config`; :meth:`run` is the
    ``@cute.jit`` function that ``cute.compile`` exports.

    Hooks for a subclass whose flat warpgroups share one K/V ring (aot/experiments/sm90): with
    ``shared_ring`` set it provides ``ring_stages`` (the ring's buffers), ``ring_barriers`` /
    ``ring_counters`` (its shared-memory words), ``ring_init`` and ``ring_body``."""

    shared_ring = False

    def __init__(self, cfg: Sm90Config):
        if cfg.flat_wgs != 1 and not self.shared_ring:
            raise ValueError(f"flat_wgs={cfg.flat_wgs}: this class runs one warpgroup per flat CTA. "
                             "Fix: build the config with aot.experiments.sm90.flat3.Sm90Flat3Attention.")
        self.cfg = cfg
        self.mode = cfg.mode
        self.sage = cfg.mode == "sage"
        self.bm = 64
        # pair: a flat Sage kernel for 64-key plans that computes two plan entries per
        # 128-key tile (K halves loaded by two TMA boxes; V as two 64-key tiles, or in a dense
        # row as one 128-key tile when the two entries are blocks 2j and 2j+1): the 64-key plan runs at the
        # speed of the 128-key tile. bk is the tile width (128); plan_bk the plan's key-block size.
        self.pair = cfg.pair
        self.bk = cfg.block_k
        self.plan_bk = 64 if cfg.pair else cfg.block_k
        self.hd = HEAD_DIM
        self.k_stages, self.v_stages = cfg.k_stages, cfg.v_stages
        self.wgs = cfg.wgs
        self.flat = cfg.flat
        self.pv_parts = cfg.pv_parts
        self.ctas_per_sm = cfg.ctas_per_sm
        self.refill = cfg.refill
        # flat Sage: bf16 Q in, quantized into sQ by the kernel (``flat.py``); no Q TMA, no q_scale
        self.q_fused = cfg.q_fused
        self.flat_wgs = cfg.flat_wgs
        # flat Sage, 128-key tiles (paired or not): two-CTA clusters sharing a dense pair's K/V tiles by
        # multicast (config.py)
        self.mc2 = cfg.cluster == 2
        # bf16, two consumers: one K/V ring for a CTA whose two rows are dense (config.py)
        self.kv_share = cfg.kv_share
        # PDL (config.py): where the kernel waits for the previous grid. The flat Q-fused body
        # issues its bf16 Q loads first (inputs: no earlier kernel of the call writes them) and
        # waits after them (``flat_body``); every other shape waits once its barriers are set up.
        self.pdl = PDL
        self.late_wait = PDL and self.flat and self.q_fused and not self.shared_ring
        # flat Sage: the Q.K^T accumulator starts at the magic number 0x4B400000 instead of 0
        # (it must be written before the WGMMA anyway, see flat_body), so the S32 -> F32
        # conversion needs no integer add afterwards
        self.qk_bias = self.flat and self.sage
        self.threads = 128 * cfg.flat_wgs if cfg.wgs == 0 else 128 * (1 + cfg.wgs)
        self.num_regs_load = 24
        self.num_regs_mma = 232 if cfg.wgs == 1 else 240

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (B, Sq, H, D); q_fused: bf16 (quantized in the kernel)
        mK: cute.Tensor,  # (B, Sk, H, D)
        mV: cute.Tensor,  # bf16: (B, Sk, H, D); sage: (B, H, D, Sk_pad)
        mO: cute.Tensor,  # (B, Sq, H, D) bf16
        mIdx: cute.Tensor,  # (B, H, NQB, cap) int32
        mCnt: Optional[cute.Tensor],  # (B, H, NQB) int32 or None
        mQs: Optional[cute.Tensor],  # sage: (B, H, ceil(Sq/128)*4) f32, one per 32 rows; None if q_fused
        mKs: Optional[cute.Tensor],  # sage: (B, H, ceil(Sk/64)) f32, one per 64 keys
        mVs: Optional[cute.Tensor],  # sage: (B, H, D) f32
        scale_log2: Float32,
        topk: Int32,
        tail_pairs: Optional[Int32],  # bf16, two consumers, one CTA per cluster: pairs split (ws_split); else None
        stream: cuda.CUstream,
    ):
        bk, hd, bm = self.bk, self.hd, self.bm
        in_dt = mK.element_type  # the Q.K^T operand type (q_fused: Q arrives as bf16)
        v_dt = mV.element_type
        self.in_dt = in_dt
        self.v_dt = v_dt
        self.o_dt = mO.element_type
        # (S, D, H, B) views
        q = permuted(mQ, (1, 3, 2, 0))
        k = permuted(mK, (1, 3, 2, 0))
        o = permuted(mO, (1, 3, 2, 0))
        # V as the B operand of P.V: (N = D, K = keys, H, B)
        if cutlass.const_expr(self.sage):
            v = permuted(mV, (2, 3, 1, 0))
            v_layout = LayoutEnum.ROW_MAJOR  # K-major
        else:
            v = permuted(mV, (3, 1, 2, 0))
            v_layout = LayoutEnum.COL_MAJOR  # MN-major

        qk_tiler = (bm, bk, hd)
        pv_tiler = (bm, hd, bk)
        acc_qk_dt = Int32 if cutlass.const_expr(self.sage) else Float32
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            in_dt, in_dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            acc_qk_dt, (1, 1, 1), qk_tiler[:2],
        )
        # flat shape: P.V in two 64-column halves (a 32-register tile accumulator instead of 64)
        pv_n = hd // self.pv_parts
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            v_dt, v_dt, warpgroup.OperandMajorMode.K, v_layout.sm90_mma_major_mode(),
            Float32, (1, 1, 1), (bm, pv_n), warpgroup.OperandSource.RMEM,
        )
        W = self.flat_wgs if self.flat else max(self.wgs, 1)  # query blocks per CTA
        # K / V buffers: per consumer warpgroup, or (shared_ring) the ring, whose first buffers are
        # also the warpgroups' own
        KS = self.ring_stages if self.shared_ring else self.k_stages * W
        VS = self.ring_stages if self.shared_ring else self.v_stages * W
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, in_dt, W)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, in_dt, KS)
        # TMA view of the K buffer: one 128-key stage, or (pair) two 64-key halves over the
        # same bytes (K-major 128B swizzle: row = key, so rows 64..127 are the second half)
        sKt_layout = sK_layout
        sV_layout = sm90_utils.make_smem_layout_b(v_layout, pv_tiler, v_dt, VS)
        sVw_layout = sV_layout  # pair: the 128-key view of the V buffer (an aligned pair)
        if cutlass.const_expr(self.pair):
            sKt_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (bm, 64, hd), in_dt, 2)
            # V^T rows are channels, so a 64-key block is not a row range: two entries are held
            # as two 64-key tiles and the P.V k-steps 0-1 / 2-3 read the first / second one; in
            # a dense row, blocks 2j, 2j+1 as 128-key tile j in sVw_layout, one TMA box
            # (producer.whole_pair says why and when)
            sV_layout = sm90_utils.make_smem_layout_b(v_layout, (bm, hd, 64), v_dt, 2)
        pbk = self.plan_bk
        halves = 2 if self.pair else 1

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        if cutlass.const_expr(self.q_fused):
            tma_q, tma_tq = None, q  # the kernel loads bf16 Q itself (flat.py q_fused_load)
            self.q_bytes = 0
        else:
            tma_q, tma_tq = cpasync.make_tiled_tma_atom(
                g2s, q, cute.slice_(sQ_layout, (None, None, 0)), (bm, hd)
            )
            self.q_bytes = cute.size_in_bytes(in_dt, cute.slice_(sQ_layout, (None, None, 0)))
        tma_k, tma_tk = cpasync.make_tiled_tma_atom(
            g2s, k, cute.slice_(sKt_layout, (None, None, 0)), (pbk, hd)
        )
        tma_v, tma_tv = cpasync.make_tiled_tma_atom(
            g2s, v, cute.slice_(sV_layout, (None, None, 0)), (hd, pbk)
        )
        # cluster=2: K and V also by multicast (a cluster of two dense rows: each CTA loads half
        # of every box into both CTAs' buffers)
        tma_km, tma_tkm, tma_vm, tma_tvm, tma_vwm, tma_tvwm = None, None, None, None, None, None
        if cutlass.const_expr(self.mc2):
            mc_op = cpasync.CopyBulkTensorTileG2SMulticastOp()
            tma_km, tma_tkm = cpasync.make_tiled_tma_atom(
                mc_op, k, cute.slice_(sKt_layout, (None, None, 0)), (pbk, hd), num_multicast=2
            )
            tma_vm, tma_tvm = cpasync.make_tiled_tma_atom(
                mc_op, v, cute.slice_(sV_layout, (None, None, 0)), (hd, pbk), num_multicast=2
            )
            if cutlass.const_expr(self.pair):  # V of an aligned pair as one 128-key box (producer.whole_pair)
                tma_vwm, tma_tvwm = cpasync.make_tiled_tma_atom(
                    mc_op, v, cute.slice_(sVw_layout, (None, None, 0)), (hd, self.bk), num_multicast=2
                )
        tma_vw, tma_tvw = None, None
        if cutlass.const_expr(self.pair):
            tma_vw, tma_tvw = cpasync.make_tiled_tma_atom(
                g2s, v, cute.slice_(sVw_layout, (None, None, 0)), (hd, self.bk)
            )
        self.k_bytes = cute.size_in_bytes(in_dt, cute.slice_(sKt_layout, (None, None, 0))) * halves
        self.v_bytes = cute.size_in_bytes(v_dt, cute.slice_(sV_layout, (None, None, 0))) * halves

        k_st, v_st = self.k_stages, self.v_stages

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2 * W]
            k_mbar: cute.struct.MemRange[cutlass.Int64, k_st * 2 * W]
            v_mbar: cute.struct.MemRange[cutlass.Int64, v_st * 2 * W]
            if cutlass.const_expr(self.mc2):
                # the multicast pipelines' barriers (a cluster sharing its tiles)
                kv_mbar_mc: cute.struct.MemRange[cutlass.Int64, (k_st + v_st) * 2 * W]
            if cutlass.const_expr(self.kv_share):
                # the shared ring's barriers: every K / V buffer of the CTA as one ring
                kv_mbar_sh: cute.struct.MemRange[cutlass.Int64, (k_st + v_st) * 2 * W]
            sQ: cute.struct.Align[cute.struct.MemRange[in_dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[in_dt, max(cute.cosize(sK_layout), cute.cosize(sKt_layout))], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[v_dt, max(cute.cosize(sV_layout), cute.cosize(sVw_layout))], 1024]
            if cutlass.const_expr(self.q_fused):
                q_amax: cute.struct.MemRange[Int32, 4 * W]  # per warp: its 16 rows' |Q| max (bf16 bits)
            if cutlass.const_expr(self.shared_ring):
                ring_bar: cute.struct.MemRange[cutlass.Int64, self.ring_barriers]
                ring_cnt: cute.struct.MemRange[Int32, self.ring_counters]

        self.shared_storage = SharedStorage

        nqb = (mQ.shape[1] + bm - 1) // bm
        grid = ((nqb + W - 1) // W, mQ.shape[2], mQ.shape[0])
        if cutlass.const_expr(tail_pairs is not None):
            # one CTA per pair of query blocks, in the 3-D grid's order, then two per split pair
            # (kernel: the decode of block_idx)
            grid = ((nqb + W - 1) // W * mQ.shape[2] * mQ.shape[0] + tail_pairs, 1, 1)
        launch_cluster = {}
        if cutlass.const_expr(self.mc2):
            # whole clusters: with an odd count the last CTA is past Sq (no entries, no stores)
            if cutlass.const_expr(W == 1):
                grid = ((nqb + 1) // 2 * 2, mQ.shape[2], mQ.shape[0])
            else:
                grid = (((nqb + W - 1) // W + 1) // 2 * 2, mQ.shape[2], mQ.shape[0])
            launch_cluster = {"cluster": [2, 1, 1]}
        self.kernel(
            qk_mma, pv_mma, tma_q, tma_tq, tma_k, tma_tk, tma_v, tma_tv, tma_vw, tma_tvw,
            tma_km, tma_tkm, tma_vm, tma_tvm, tma_vwm, tma_tvwm, o,
            mIdx, mCnt, mQs, mKs, mVs, scale_log2, topk, mK.shape[1], tail_pairs,
            sQ_layout, sK_layout, sKt_layout, sV_layout, sVw_layout,
        ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream,
                  min_blocks_per_mp=self.ctas_per_sm if self.flat else (2 if W == 1 else 1),
                  preferred_smem_carveout=100, use_pdl=self.pdl, **launch_cluster)

    @cute.jit
    def run(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor, q2k_block_index: cute.Tensor,
            block_counts: Optional[cute.Tensor], q_scale: Optional[cute.Tensor], k_scale: Optional[cute.Tensor],
            v_scale: Optional[cute.Tensor], scale_log2: Float32, topk: Int32, tail_pairs: Optional[Int32],
            stream: cuda.CUstream):
        """The exported entry of every variant. Its parameters are the registry's argument specs by
        name (``variants.args_for``); the tensors a variant has no use for are passed as None
        (``variants.spec``: bf16 has no scales, a Q-fused kernel no ``q_scale``, a ``topk``
        variant no ``block_counts``), so they are compile-time constants, not C ABI arguments;
        ``tail_pairs`` likewise exists only in the ``tail`` variants (:meth:`ws_split`). The C ABI
        takes the arguments in this signature's order (the registry's spec lists them so)."""
        self.__call__(q, k, v, out, q2k_block_index, block_counts, q_scale, k_scale, v_scale, scale_log2, topk,
                      tail_pairs, stream)

    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: Optional[cute.CopyAtom],  # None if q_fused (tq is then the bf16 (S, D, H, B) view)
        tq: cute.Tensor,
        tma_k: cute.CopyAtom,
        tk: cute.Tensor,
        tma_v: cute.CopyAtom,
        tv: cute.Tensor,
        tma_vw: Optional[cute.CopyAtom],  # pair: V of an aligned pair as one 128-key box; else None
        tvw: Optional[cute.Tensor],
        tma_km: Optional[cute.CopyAtom],  # cluster=2: K / V multicast atoms; else None
        tkm: Optional[cute.Tensor],
        tma_vm: Optional[cute.CopyAtom],
        tvm: Optional[cute.Tensor],
        tma_vwm: Optional[cute.CopyAtom],  # pair and cluster=2: the multicast atom of an aligned pair's V
        tvwm: Optional[cute.Tensor],
        o: cute.Tensor,
        mIdx: cute.Tensor,
        mCnt: Optional[cute.Tensor],
        mQs: Optional[cute.Tensor],
        mKs: Optional[cute.Tensor],
        mVs: Optional[cute.Tensor],
        scale_log2: Float32,
        topk: Int32,
        seqlen_k: Int32,
        tail_pairs: Optional[Int32],
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sKt_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sVw_layout: cute.ComposedLayout,
    ):
        """Shared prologue (shared memory, one Q/K/V pipeline set per consumer warpgroup),
        then the flat or the warp-specialised body."""
        bm = self.bm
        W = max(self.wgs, 1)
        tidx, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        prod_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        cons_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)
        pipes = []

        def local(pipe):
            """cluster=2: a CTA-local pipeline releases from lane 0 of each warp. (Its signalling
            lanes come from the CTA's rank in a one-CTA layout, and the second CTA of a cluster,
            rank 1, would otherwise never release: docs/design/kernels-sm90.md.)"""
            if cutlass.const_expr(self.mc2):
                pipe = dataclasses.replace(pipe, is_signaling_thread=tidx % 32 == 0)
            return pipe

        # one Q/K/V pipeline set per consumer warpgroup (shared_ring: the ring's own barriers)
        for st in cutlass.range_constexpr(0 if self.shared_ring else W):
            q_pc = local(pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.q_mbar.data_ptr() + 2 * st, num_stages=1,
                producer_group=prod_group, consumer_group=cons_group,
                tx_count=self.q_bytes, defer_sync=True,
            )).make_participants()
            k_pc = local(pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.k_mbar.data_ptr() + 2 * self.k_stages * st,
                num_stages=self.k_stages, producer_group=prod_group, consumer_group=cons_group,
                tx_count=self.k_bytes, defer_sync=True,
            )).make_participants()
            v_pc = local(pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.v_mbar.data_ptr() + 2 * self.v_stages * st,
                num_stages=self.v_stages, producer_group=prod_group, consumer_group=cons_group,
                tx_count=self.v_bytes, defer_sync=True,
            )).make_participants()
            pipes.append((q_pc, k_pc, v_pc))
        mc = None
        if cutlass.const_expr(self.mc2):
            # a shared tile's buffer is free when both CTAs' consumer warps released it (each warp's
            # lanes 0 and 1 arrive on the barriers of CTA 0 and CTA 1): 8 arrivals per consumer
            # warpgroup; the ring spans every K (V) buffer of the CTA (bf16 kv_share: both consumers')
            mc_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 8 * W)
            mc_pipes = []
            for j, (n, nbytes) in enumerate(((self.k_stages, self.k_bytes), (self.v_stages, self.v_bytes))):
                mc_pipes.append(pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.kv_mbar_mc.data_ptr() + 2 * W * self.k_stages * j, num_stages=n * W,
                    producer_group=prod_group, consumer_group=mc_group, tx_count=nbytes,
                    cta_layout_vmnk=cute.make_layout((1, 2, 1, 1)), defer_sync=True,
                ).make_participants())
            mc = (tma_km, tkm, tma_vm, tvm, (pipes[0][0], mc_pipes[0], mc_pipes[1]))
            if cutlass.const_expr(self.pair):
                mc = mc + ((tma_vwm, tvwm, storage.sV.get_tensor(sVw_layout.outer, swizzle=sVw_layout.inner)),)

        shared = None
        if cutlass.const_expr(self.kv_share):
            # one ring over all K (V) buffers of the CTA, read by both consumers: a buffer is free
            # when the eight consumer warps released it (lane 0 of each arrives)
            sh_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * W)
            shared = []
            for j, (n, nbytes) in enumerate(((self.k_stages, self.k_bytes), (self.v_stages, self.v_bytes))):
                shared.append(local(pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.kv_mbar_sh.data_ptr() + 2 * W * self.k_stages * j,
                    num_stages=n * W, producer_group=prod_group, consumer_group=sh_group, tx_count=nbytes,
                    defer_sync=True,
                )).make_participants())

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sKt = storage.sK.get_tensor(sKt_layout.outer, swizzle=sKt_layout.inner)  # TMA view
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        vw = None  # pair: (TMA atom, TMA tensor, 128-key view of sV) of an aligned pair's V
        if cutlass.const_expr(self.pair):
            vw = (tma_vw, tvw, storage.sV.get_tensor(sVw_layout.outer, swizzle=sVw_layout.inner))
        sQAmax = None
        if cutlass.const_expr(self.q_fused):
            sQAmax = storage.q_amax.get_tensor(cute.make_layout(4 * self.flat_wgs))
        ring_bars = None
        if cutlass.const_expr(self.shared_ring):
            ring_bars = self.ring_init(storage.ring_bar.data_ptr(), storage.ring_cnt, storage.q_mbar.data_ptr(),
                                       warp_idx, tidx)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.pdl and not self.late_wait):
            cute.arch.griddepcontrol_wait()  # before any read of an earlier kernel's output (PDL)

        nqb = (o.shape[0] + bm - 1) // bm
        n_kblocks = (seqlen_k + self.plan_bk - 1) // self.plan_bk  # the plan's key blocks
        if cutlass.const_expr(tail_pairs is not None):
            # a split CTA: one query block, its entries shared by the two consumers (ws_split); split
            # is 1 + the block's place in its pair
            bx, h, b, split = self.tail_decode(bx, tail_pairs, (nqb + W - 1) // W, o.shape[2], o.shape[3])
            if split != 0:
                self.ws_split(
                    qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                    scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, nqb, n_kblocks, tidx, warp_idx,
                    bx * W + split - 1, h, b, storage.sK.data_ptr(), storage.sV.data_ptr(),
                )
            else:
                self.ws_dispatch(qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                                 scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, shared, mc, nqb, n_kblocks,
                                 tidx, warp_idx, bx, h, b)
        elif cutlass.const_expr(self.shared_ring):
            self.ring_body(
                qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2, topk, seqlen_k, sQ, sK, sV, ring_bars, nqb, n_kblocks, tidx, warp_idx,
                bx, h, b, storage.sQ.data_ptr(), sQAmax,
            )
        elif cutlass.const_expr(self.flat):
            self.flat_body(
                qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2, topk, seqlen_k, sQ, sK, sKt, sV, pipes[0], nqb, n_kblocks, tidx,
                warp_idx, bx, h, b, storage.sQ.data_ptr(), sQAmax, vw, mc,
            )
        else:
            self.ws_dispatch(qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                             scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, shared, mc, nqb, n_kblocks,
                             tidx, warp_idx, bx, h, b)

    @cute.jit
    def tail_decode(self, i: Int32, tail_pairs: Int32, X: Int32, H: Int32, B: Int32):
        """``(bx, h, b, split)`` of CTA ``i`` of a tail-split grid (``__call__``): the pairs of
        query blocks in the order of the 3-D grid ``(X, H, B)``, the last ``tail_pairs`` of them
        each as two CTAs of one query block; ``split`` 0 for a pair's CTA, else 1 + the block's
        place in its pair (query block ``2 bx + split - 1``)."""
        n_pair = X * H * B - tail_pairs
        p = i
        split = Int32(0)
        if i >= n_pair:
            j = i - n_pair
            p = n_pair + j // 2
            split = 1 + j % 2
        return p % X, (p // X) % H, p // (X * H), split

    @cute.jit
    def ws_dispatch(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                    scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, pipes, shared, mc,
                    nqb: Int32, n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, h: Int32, b: Int32):
        """A pair's CTA of the two-consumer shape: :meth:`ws_body_shared` (kv_share) or :meth:`ws_body`."""
        if cutlass.const_expr(self.kv_share):
            self.ws_body_shared(
                qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, shared, mc, nqb, n_kblocks, tidx, warp_idx,
                bx, h, b,
            )
        else:
            self.ws_body(
                qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, nqb, n_kblocks, tidx, warp_idx,
                bx, h, b,
            )

    @cute.jit
    def ws_split(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                 scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, pipes, nqb: Int32,
                 n_kblocks: Int32, tidx: Int32, warp_idx: Int32, qb: Int32, h: Int32, b: Int32, sk_ptr, sv_ptr):
        """A split CTA (the grid's tail, ``__call__``): one query block ``qb``, the first
        ``ceil(n / 2)`` entries of its plan row walked by consumer 0 and the rest by consumer 1,
        each on its own Q copy and K/V ring (producer warp ``st`` loads consumer ``st``'s); the
        two partial softmax states merge in shared memory (:meth:`split_epilogue`, over consumer
        1's own K/V buffers, which its last wait left idle) and consumer 0 writes the block. Why:
        a CTA holds two query blocks at one CTA per SM, so a grid whose pairs leave the last wave
        part-full idles those SMs for a whole CTA's time; a split pair takes about half of it in
        two SMs (docs/design/kernels-sm90.md)."""
        W = self.wgs
        n = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)
        n0 = (n + 1) // 2
        counts = (n0, n - n0)
        starts = (Int32(0), n0)
        wg = warp_idx // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.num_regs_load)
            for st in cutlass.range_constexpr(W):
                if warp_idx == st:
                    self.producer(
                        tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, pipes[st][0][0],
                        pipes[st][1][0], pipes[st][2][0], mIdx, counts[st], n_kblocks, qb, h, b, st, starts[st],
                    )
        else:
            cute.arch.setmaxregister_increase(self.num_regs_mma)
            # consumer 1's K buffers hold its O accumulator, its V buffers the row max and sum
            n_o = self.bm * self.hd // 128
            scr_o = cute.make_tensor(cute.recast_ptr(sk_ptr + self.k_stages * self.bk * self.hd, dtype=Float32),
                                     cute.make_layout((n_o, 128), stride=(128, 1)))
            scr_s = cute.make_tensor(cute.recast_ptr(sv_ptr + self.v_stages * self.bk * self.hd, dtype=Float32),
                                     cute.make_layout((4, 128), stride=(128, 1)))
            for st in cutlass.range_constexpr(W):
                if wg == st + 1:
                    self.consumer(
                        qk_mma, pv_mma, sQ, sK, sV, o, mIdx, mQs, mKs, mVs, pipes[st][0][1],
                        pipes[st][1][1], pipes[st][2][1], scale_log2, counts[st], counts[1 - st], n_kblocks,
                        seqlen_k, tidx - 128 * (st + 1), qb, nqb, h, b, st, e0=starts[st], merge=(scr_o, scr_s),
                    )

    @cute.jit
    def ws_body(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, pipes, nqb: Int32,
                n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, h: Int32, b: Int32):
        """Warp-specialised shapes: warpgroup 0 produces (TMA), warpgroups 1..W consume."""
        W = self.wgs
        wg = warp_idx // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.num_regs_load)
            for st in cutlass.range_constexpr(W):
                if warp_idx == st:
                    qb = bx * W + st
                    n_blk = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)
                    self.producer(
                        tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, pipes[st][0][0],
                        pipes[st][1][0], pipes[st][2][0], mIdx, n_blk, n_kblocks, qb, h, b, st,
                    )
        else:
            cute.arch.setmaxregister_increase(self.num_regs_mma)
            for st in cutlass.range_constexpr(W):
                if wg == st + 1:
                    qb = bx * W + st
                    n_blk = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)
                    n_other = n_blk
                    if cutlass.const_expr(W == 2):
                        n_other = self.row_count(mIdx, mCnt, topk, b, h, bx * W + (1 - st), nqb)
                    self.consumer(
                        qk_mma, pv_mma, sQ, sK, sV, o, mIdx, mQs, mKs, mVs, pipes[st][0][1],
                        pipes[st][1][1], pipes[st][2][1], scale_log2, n_blk, n_other, n_kblocks,
                        seqlen_k, tidx - 128 * (st + 1), qb, nqb, h, b, st,
                    )

    @cute.jit
    def ws_body_shared(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                       scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, pipes, shared, mc,
                       nqb: Int32, n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, h: Int32, b: Int32):
        """kv_share (two consumers): when both rows of the CTA (query blocks 2c, 2c+1) are dense,
        which in a prepared plan (ids deduplicated and ascending) makes them identical, the CTA
        loads each K/V tile of the even row once into one ring that both consumers read
        (:meth:`ws_shared_ring`); any other CTA (a sparse row, the last CTA of an odd count of
        query blocks, whose second row is past Sq) runs :meth:`ws_body`. With ``cluster=2`` (``mc``:
        the multicast atoms and pipelines, kernel.py) the CTAs of rows 4c .. 4c+3 form a cluster:
        when all four rows are dense both CTAs walk row 4c and each loads half of every K/V box
        into both CTAs' rings by multicast; otherwise each CTA decides alone as above. Every
        warpgroup of both CTAs decides from the same counts, so the cluster's CTAs take the same
        path and all consumers the same turns (unequal trip counts would leave the rings' barriers
        waiting). The traffic model (what dense rows save, and why a union walk of two sparse rows
        would not pay on random top-k rows): docs/design/kernels-sm90.md."""
        W = self.wgs
        n_even = self.row_count(mIdx, mCnt, topk, b, h, bx * W, nqb)
        n_odd = self.row_count(mIdx, mCnt, topk, b, h, bx * W + 1, nqb)
        own = Int32(0)
        if n_kblocks > 0 and n_even >= n_kblocks and n_odd >= n_kblocks:
            own = Int32(1)
        if cutlass.const_expr(self.mc2):
            rank = bx % 2
            peer = bx + 1 - 2 * rank  # the other CTA of the cluster
            p_even = self.row_count(mIdx, mCnt, topk, b, h, peer * W, nqb)
            p_odd = self.row_count(mIdx, mCnt, topk, b, h, peer * W + 1, nqb)
            both = Int32(0)
            if own != 0 and p_even >= n_kblocks and p_odd >= n_kblocks:
                both = Int32(1)
            if both != 0:
                cute.arch.cluster_arrive_relaxed()  # the peer's barriers are initialised
                cute.arch.cluster_wait()
                n_first = n_even + (p_even - n_even) * rank  # both CTAs walk row 4c, all of it
                self.ws_shared_ring(qk_mma, pv_mma, tma_q, tq, mc[0], mc[1], mc[2], mc[3], o, mIdx, mQs, mKs,
                                    mVs, scale_log2, seqlen_k, sQ, sK, sV, pipes, mc[4][1], mc[4][2], nqb,
                                    n_kblocks, tidx, warp_idx, bx, (bx - rank) * W, n_first, h, b, True)
                cute.arch.cluster_arrive()  # the peer's last releases target this CTA: exit together
                cute.arch.cluster_wait()
            else:
                self.ws_own_ctas(own, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs,
                                 mVs, scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, shared, nqb, n_kblocks,
                                 tidx, warp_idx, bx, n_even, h, b)
        else:
            self.ws_own_ctas(own, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                             scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, shared, nqb, n_kblocks, tidx,
                             warp_idx, bx, n_even, h, b)

    @cute.jit
    def ws_own_ctas(self, own: Int32, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs,
                    mVs, scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sV, pipes, shared,
                    nqb: Int32, n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, n_even: Int32,
                    h: Int32, b: Int32):
        """A CTA that decides alone (no cluster, or a cluster whose four rows are not all dense):
        with ``own`` (both its rows dense) both consumers walk row ``bx * W`` on the CTA's one K/V
        ring (:meth:`ws_shared_ring`, no multicast), else each consumer its own row
        (:meth:`ws_body`)."""
        W = self.wgs
        if own != 0:
            self.ws_shared_ring(qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mQs, mKs, mVs,
                                scale_log2, seqlen_k, sQ, sK, sV, pipes, shared[0], shared[1], nqb,
                                n_kblocks, tidx, warp_idx, bx, bx * W, n_even, h, b, False)
        else:
            self.ws_body(
                qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, nqb, n_kblocks, tidx, warp_idx,
                bx, h, b,
            )

    @cute.jit
    def ws_shared_ring(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mQs, mKs, mVs,
                       scale_log2: Float32, seqlen_k: Int32, sQ, sK, sV, pipes, k_ring, v_ring, nqb: Int32,
                       n_kblocks: Int32, tidx: Int32, warp_idx: Int32, bx: Int32, pr: Int32, n_walk: Int32,
                       h: Int32, b: Int32, mcast: cutlass.Constexpr):
        """Both consumers walk plan row ``pr`` (``n_walk`` entries) on one K/V ring
        (``k_ring`` / ``v_ring``: (producer, consumer) of pipelines spanning every buffer), each
        with its own Q (producer warp ``st`` loads query block ``bx * 2 + st``) and epilogue;
        producer warp 0 loads the ring (``mcast``: the atoms are the cluster's multicast ones,
        this CTA's half of every box into both CTAs)."""
        W = self.wgs
        wg = warp_idx // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.num_regs_load)
            for st in cutlass.range_constexpr(W):
                if warp_idx == st:
                    self.producer_shared(
                        tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, pipes[st][0][0], k_ring[0], v_ring[0],
                        mIdx, n_walk, n_kblocks, bx * W + st, pr, h, b, st, mcast,
                    )
        else:
            cute.arch.setmaxregister_increase(self.num_regs_mma)
            for st in cutlass.range_constexpr(W):
                if wg == st + 1:
                    self.consumer(
                        qk_mma, pv_mma, sQ, sK, sV, o, mIdx, mQs, mKs, mVs, pipes[st][0][1],
                        k_ring[1], v_ring[1], scale_log2, n_walk, n_walk, n_kblocks,
                        seqlen_k, tidx - 128 * (st + 1), bx * W + st, nqb, h, b, st, pr, True,
                    )
