"""SM90a (Hopper) block-sparse attention kernels in CuTe-DSL: BF16 and Sage (INT8 QK, FP8 PV).

One CTA per (64-row query block, head, batch): warpgroup 0 is the TMA producer (one warp issues
the loads of Q and of the selected K/V blocks into a multi-stage ring), warpgroup 1 is the
consumer (warpgroup MMA for Q.K^T and P.V, online softmax in FP32 with exp2 and the softmax
scale folded in). Two CTAs fit one SM, so one CTA's softmax overlaps the other's MMAs.

Compute modes
- ``bf16``: Q.K^T and P.V with ``MmaF16BF16Op`` (FP32 accumulation). V is read as [Sk, D]
  (MN-major B operand).
- ``sage``: consumes exactly the tensors of ``aot/kernels/sage_quant.py`` (the FlashInfer SM120
  operand layout): INT8 Q/K ``[B,H,S,128]`` (any strides), ``q_scale`` one per 32 rows,
  ``k_scale`` one per 64 keys (K smoothed by its channel mean), FP8 V^T ``[B,H,128,Sk_pad64]``
  with each 16-token group permuted (``SAGE_PERM16``; stored column p holds key ``V_PERM16[p]``)
  and a per-channel ``v_scale``. Q.K^T with ``MmaI8Op`` (S32), converted exactly to FP32 with the
  2^23 magic-number trick and scaled by ``q_scale * k_scale * softmax_scale * log2(e)`` inside
  one FFMA; P is produced pre-multiplied by 448 (folded into the exp2 bias), converted to E4M3 in
  the order of the FP8 A-operand registers (the V permutation makes this a register renaming),
  P.V with ``MmaF8Op`` into a per-tile FP32 accumulator added to the FP32 output accumulator
  (two-level accumulation); ``v_scale`` is applied in the epilogue.

Plan contract: ``q2k_block_index[b, h, qb, i]`` for ``i < count`` (``count`` from
``block_counts[b, h, qb]`` or the scalar ``topk``, clamped to ``[0, capacity]``); indices outside
``[0, ceil(Sk/block_k))`` are skipped; keys >= Sk are masked; a row with no valid block writes
zeros.
"""

import math
import os
from typing import Optional

from aot import registry
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

LOG2E = 1.4426950408889634
P_SCALE = 448.0  # P in [0, 1] is scaled into the E4M3 range before the FP8 P.V MMA
# Stored position p (within each 16 keys) of the Sage V^T tensor holds key V_PERM16[p].
V_PERM16 = tuple(2 * (p // 4) + (0, 1, 8, 9)[p % 4] for p in range(16))

_CLASSES = None
# CTA shape by (compute mode, key block): 0 = flat (one warpgroup, three or four CTAs per SM),
# 1 = warp-specialised producer + one consumer warpgroup (two CTAs per SM), 2 = producer + two
# ping-pong consumer warpgroups (one CTA per SM). Chosen by measurement on the H200
# (NOTES-sm90.md, MEASUREMENTS.md).
DEFAULT_WGS = {("bf16", 64): 2, ("bf16", 128): 2, ("sage", 64): 0, ("sage", 128): 0}
# The other shape of each Sage key block, shipped as k{bk}_ws_cnt / k{bk}_flat_cnt (bench, tests).
ALT_WGS = {("sage", 64): 0, ("sage", 128): 1}
# Default kernels that take a 64-key plan two entries per 128-key tile (the flat k128 kernel's
# speed for 64-key plans: 3.31-3.42 vs 3.47-3.69 ms, NOTES-sm90.md); the one-entry flat kernel
# ships as the alternative k64_flat_cnt.
PAIRED = {("sage", 64)}
# Flat-shape parameters: CTAs per SM (the launch bound: registers <= 64K / (128 * n)) and the
# number of column slices of the Sage P.V tile (fewer live registers for four CTAs per SM).
FLAT_PARAMS = {
    ("sage", 64): {"ctas_per_sm": 4, "pv_parts": 2},
    ("sage", 128): {"ctas_per_sm": 3, "pv_parts": 1},
    ("bf16", 64): {"ctas_per_sm": 3},
    ("bf16", 128): {"ctas_per_sm": 3},
}


def _build_classes():
    """Import CuTe-DSL lazily: the registry must be listable without it."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import cpasync, warpgroup
    from cutlass.utils import LayoutEnum
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    Float32, Int32 = cutlass.Float32, cutlass.Int32

    def _complete_tx(mbar_ptr, nbytes):
        """Experiments only: `mbarrier.complete_tx` (the DSL has no wrapper) on a shared-memory
        barrier, as if a TMA of nbytes had landed."""
        addr = llvm.ptrtoint(T.i32(), mbar_ptr.to_llvm_ptr())
        llvm.inline_asm(None, [addr, Int32(nbytes).ir_value()],
                        "mbarrier.complete_tx.shared::cta.b64 [$0], $1;", "r,r",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)

    def acc_mn(t):
        """View a (64 x N) warpgroup accumulator fragment ((2,2,V),M,N) as (rows, cols)."""
        l = t.layout
        s0, d0 = l.shape[0], l.stride[0]
        return cute.make_tensor(
            t.iterator,
            cute.make_layout(
                ((s0[1], l.shape[1]), (s0[0], s0[2], l.shape[2])),
                stride=((d0[1], l.stride[1]), (d0[0], d0[2], l.stride[2])),
            ),
        )

    class Sm90SparseAttention:
        # (K stages, V stages): two CTAs (<= ~110 KiB of shared memory each) must fit one SM.
        STAGES = {("bf16", 64): (3, 2), ("bf16", 128): (1, 1), ("sage", 64): (4, 4), ("sage", 128): (3, 2)}
        # flat shape: single-buffered K and V. Deeper rings measured 15-25% slower (NOTES-sm90.md).
        FLAT_STAGES = {64: (1, 1), 128: (1, 1)}

        def __init__(self, compute_mode: str, block_k: int, stages=None, wgs: int = 1, pv_parts: int = 1,
                     ctas_per_sm: int = 3, pair: bool = False, refill: str = "shadow", ablate: str = ""):
            assert compute_mode in ("bf16", "sage")
            # experiments only (wrong results on purpose): K/V loads that skip the TMA and
            # complete the barrier's transaction count by hand (`ablate_skip`: "half" / "all" of
            # them), to measure what the L2 -> SM traffic costs
            assert ablate in ("", "half", "all")
            self.ablate = ablate
            assert block_k in (64, 128)
            self.mode = compute_mode
            self.sage = compute_mode == "sage"
            self.bm = 64
            # pair: a flat Sage kernel for 64-key plans that computes two plan entries per
            # 128-key tile (K halves loaded by two TMA boxes, V as two 64-key halves): the 64-key
            # plan runs at the speed of the 128-key tile. block_k is the tile width (128);
            # plan_bk the plan's key-block size.
            self.pair = pair
            self.bk = block_k
            self.plan_bk = 64 if pair else block_k
            assert not pair or (block_k == 128 and compute_mode == "sage" and wgs == 0 and stages in (None, (1, 1)))
            self.hd = 128
            if stages is None:
                stages = self.FLAT_STAGES[block_k] if wgs == 0 else self.STAGES[(compute_mode, block_k)]
            self.k_stages, self.v_stages = stages
            # wgs == 1: one consumer warpgroup per CTA, two CTAs per SM.
            # wgs == 2: two consumer warpgroups (two query blocks, own K/V rings) per CTA, one CTA
            # per SM, FA3-style ping-pong: the warpgroups take turns issuing their MMAs.
            # wgs == 0 ("flat", sage only): one warpgroup per CTA that also issues its own TMA
            # loads, no producer warpgroup, serial mainloop, three CTAs per SM (<= 168 registers).
            assert wgs in (0, 1, 2)
            # flat bf16 was measured no faster than the ws shapes (NOTES-sm90.md): not built
            assert wgs != 0 or self.sage, "the flat shape is built for the Sage mode only"
            self.wgs = wgs
            self.flat = wgs == 0
            # flat shape: P.V in pv_parts column slices of D (fewer live tile-accumulator registers)
            self.pv_parts = pv_parts if self.flat and self.sage else 1
            self.ctas_per_sm = ctas_per_sm  # flat shape: launch bound (registers <= 64K / (128 * n))
            # Flat shape, where warp 0 issues the K/V refills. "shadow" (default): under the
            # warpgroup's own MMAs, V of entry t right after Q.K^T(t) is issued and K of entry t+1
            # right after P.V(t) is issued; the buffer's release by all four warps is then
            # already in (no wait) and warp 0's id load and TMA issue cost no time. "eager": as
            # soon as the buffer is released (K after the Q.K^T wait, V at the end of the entry):
            # warp 0 waits for the other warps' release and loads the id, then arrives late at
            # the next WGMMA, where the other three wait for it (ncu "warpgroup_arrive" stalls:
            # 32K vs 7K samples; 3-4% slower, NOTES-sm90.md).
            assert refill in ("eager", "shadow")
            self.refill = refill
            # flat Sage: the Q.K^T accumulator starts at the magic number 0x4B400000 instead of 0
            # (it must be written before the WGMMA anyway, see flat_body), so the S32 -> F32
            # conversion needs no integer add afterwards
            self.qk_bias = self.flat and self.sage
            self.threads = 128 if wgs == 0 else 128 * (1 + wgs)
            self.num_regs_load = 24
            self.num_regs_mma = 232 if wgs == 1 else 240
            self.align = 1024

        @cute.jit
        def __call__(
            self,
            mQ: cute.Tensor,  # (B, Sq, H, D)
            mK: cute.Tensor,  # (B, Sk, H, D)
            mV: cute.Tensor,  # bf16: (B, Sk, H, D); sage: (B, H, D, Sk_pad)
            mO: cute.Tensor,  # (B, Sq, H, D) bf16
            mIdx: cute.Tensor,  # (B, H, NQB, cap) int32
            mCnt: Optional[cute.Tensor],  # (B, H, NQB) int32 or None
            mQs: Optional[cute.Tensor],  # sage: (B, H, ceil(Sq/128)*4) f32, one per 32 rows
            mKs: Optional[cute.Tensor],  # sage: (B, H, ceil(Sk/64)) f32, one per 64 keys
            mVs: Optional[cute.Tensor],  # sage: (B, H, D) f32
            scale_log2: Float32,
            topk: Int32,
            stream: cuda.CUstream,
        ):
            bk, hd, bm = self.bk, self.hd, self.bm
            in_dt = mQ.element_type
            v_dt = mV.element_type
            self.in_dt = in_dt
            self.v_dt = v_dt
            self.o_dt = mO.element_type
            # (S, D, H, B) views
            q = cute.make_tensor(
                mQ.iterator,
                cute.make_layout(
                    (mQ.shape[1], mQ.shape[3], mQ.shape[2], mQ.shape[0]),
                    stride=(mQ.stride[1], mQ.stride[3], mQ.stride[2], mQ.stride[0]),
                ),
            )
            k = cute.make_tensor(
                mK.iterator,
                cute.make_layout(
                    (mK.shape[1], mK.shape[3], mK.shape[2], mK.shape[0]),
                    stride=(mK.stride[1], mK.stride[3], mK.stride[2], mK.stride[0]),
                ),
            )
            o = cute.make_tensor(
                mO.iterator,
                cute.make_layout(
                    (mO.shape[1], mO.shape[3], mO.shape[2], mO.shape[0]),
                    stride=(mO.stride[1], mO.stride[3], mO.stride[2], mO.stride[0]),
                ),
            )
            # V as the B operand of P.V: (N = D, K = keys, H, B)
            if cutlass.const_expr(self.sage):
                v = cute.make_tensor(
                    mV.iterator,
                    cute.make_layout(
                        (mV.shape[2], mV.shape[3], mV.shape[1], mV.shape[0]),
                        stride=(mV.stride[2], mV.stride[3], mV.stride[1], mV.stride[0]),
                    ),
                )
                v_layout = LayoutEnum.ROW_MAJOR  # K-major
            else:
                v = cute.make_tensor(
                    mV.iterator,
                    cute.make_layout(
                        (mV.shape[3], mV.shape[1], mV.shape[2], mV.shape[0]),
                        stride=(mV.stride[3], mV.stride[1], mV.stride[2], mV.stride[0]),
                    ),
                )
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
            W = max(self.wgs, 1)
            sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, in_dt, W)
            sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, in_dt, self.k_stages * W)
            # TMA view of the K buffer: one 128-key stage, or (pair) two 64-key halves over the
            # same bytes (K-major 128B swizzle: row = key, so rows 64..127 are the second half)
            sKt_layout = sK_layout
            sV_layout = sm90_utils.make_smem_layout_b(v_layout, pv_tiler, v_dt, self.v_stages * W)
            if cutlass.const_expr(self.pair):
                sKt_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (bm, 64, hd), in_dt, 2)
                # V^T rows are channels, so a 64-key block is not a row range: V is held as two
                # 64-key tiles and the P.V k-steps 0-1 / 2-3 read the first / second one
                sV_layout = sm90_utils.make_smem_layout_b(v_layout, (bm, hd, 64), v_dt, 2)
            pbk = self.plan_bk
            halves = 2 if self.pair else 1

            g2s = cpasync.CopyBulkTensorTileG2SOp()
            tma_q, tma_tq = cpasync.make_tiled_tma_atom(
                g2s, q, cute.slice_(sQ_layout, (None, None, 0)), (bm, hd)
            )
            tma_k, tma_tk = cpasync.make_tiled_tma_atom(
                g2s, k, cute.slice_(sKt_layout, (None, None, 0)), (pbk, hd)
            )
            tma_v, tma_tv = cpasync.make_tiled_tma_atom(
                g2s, v, cute.slice_(sV_layout, (None, None, 0)), (hd, pbk)
            )
            self.q_bytes = cute.size_in_bytes(in_dt, cute.slice_(sQ_layout, (None, None, 0)))
            self.k_bytes = cute.size_in_bytes(in_dt, cute.slice_(sKt_layout, (None, None, 0))) * halves
            self.v_bytes = cute.size_in_bytes(v_dt, cute.slice_(sV_layout, (None, None, 0))) * halves

            k_st, v_st = self.k_stages, self.v_stages

            @cute.struct
            class SharedStorage:
                q_mbar: cute.struct.MemRange[cutlass.Int64, 2 * W]
                k_mbar: cute.struct.MemRange[cutlass.Int64, k_st * 2 * W]
                v_mbar: cute.struct.MemRange[cutlass.Int64, v_st * 2 * W]
                sQ: cute.struct.Align[cute.struct.MemRange[in_dt, cute.cosize(sQ_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[in_dt, max(cute.cosize(sK_layout), cute.cosize(sKt_layout))], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[v_dt, cute.cosize(sV_layout)], 1024]

            self.shared_storage = SharedStorage

            nqb = (mQ.shape[1] + bm - 1) // bm
            grid = ((nqb + W - 1) // W, mQ.shape[2], mQ.shape[0])
            self.kernel(
                qk_mma, pv_mma, tma_q, tma_tq, tma_k, tma_tk, tma_v, tma_tv, o,
                mIdx, mCnt, mQs, mKs, mVs, scale_log2, topk, mK.shape[1],
                sQ_layout, sK_layout, sKt_layout, sV_layout,
            ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream,
                      min_blocks_per_mp=self.ctas_per_sm if self.flat else (2 if W == 1 else 1),
                      preferred_smem_carveout=100)

        # Entry points whose positional parameters match the registry's argument specs.
        @cute.jit
        def run_bf16_cnt(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor,
                         q2k_block_index: cute.Tensor, block_counts: cute.Tensor,
                         scale_log2: Float32, topk: Int32, stream: cuda.CUstream):
            self.__call__(q, k, v, out, q2k_block_index, block_counts, None, None, None, scale_log2, topk, stream)

        @cute.jit
        def run_bf16(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor,
                     q2k_block_index: cute.Tensor, scale_log2: Float32, topk: Int32, stream: cuda.CUstream):
            self.__call__(q, k, v, out, q2k_block_index, None, None, None, None, scale_log2, topk, stream)

        @cute.jit
        def run_sage_cnt(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor,
                         q2k_block_index: cute.Tensor, block_counts: cute.Tensor, q_scale: cute.Tensor,
                         k_scale: cute.Tensor, v_scale: cute.Tensor, scale_log2: Float32, topk: Int32,
                         stream: cuda.CUstream):
            self.__call__(q, k, v, out, q2k_block_index, block_counts, q_scale, k_scale, v_scale,
                          scale_log2, topk, stream)

        @cute.jit
        def run_sage(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor,
                     q2k_block_index: cute.Tensor, q_scale: cute.Tensor, k_scale: cute.Tensor,
                     v_scale: cute.Tensor, scale_log2: Float32, topk: Int32, stream: cuda.CUstream):
            self.__call__(q, k, v, out, q2k_block_index, None, q_scale, k_scale, v_scale,
                          scale_log2, topk, stream)

        def entry(self, counts: bool):
            return getattr(self, f"run_{self.mode}{'_cnt' if counts else ''}")

        @cute.kernel
        def kernel(
            self,
            qk_mma: cute.TiledMma,
            pv_mma: cute.TiledMma,
            tma_q: cute.CopyAtom,
            tq: cute.Tensor,
            tma_k: cute.CopyAtom,
            tk: cute.Tensor,
            tma_v: cute.CopyAtom,
            tv: cute.Tensor,
            o: cute.Tensor,
            mIdx: cute.Tensor,
            mCnt: Optional[cute.Tensor],
            mQs: Optional[cute.Tensor],
            mKs: Optional[cute.Tensor],
            mVs: Optional[cute.Tensor],
            scale_log2: Float32,
            topk: Int32,
            seqlen_k: Int32,
            sQ_layout: cute.ComposedLayout,
            sK_layout: cute.ComposedLayout,
            sKt_layout: cute.ComposedLayout,
            sV_layout: cute.ComposedLayout,
        ):
            """Shared prologue (shared memory, one Q/K/V pipeline set per consumer warpgroup),
            then the flat or the warp-specialised body."""
            bm, bk, hd = self.bm, self.bk, self.hd
            W = max(self.wgs, 1)
            tidx, _, _ = cute.arch.thread_idx()
            bx, h, b = cute.arch.block_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

            smem = utils.SmemAllocator()
            storage = smem.allocate(self.shared_storage)

            prod_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
            cons_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)
            pipes = []
            for st in cutlass.range_constexpr(W):  # one Q/K/V pipeline set per consumer warpgroup
                q_pc = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.q_mbar.data_ptr() + 2 * st, num_stages=1,
                    producer_group=prod_group, consumer_group=cons_group,
                    tx_count=self.q_bytes, defer_sync=True,
                ).make_participants()
                k_pc = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.k_mbar.data_ptr() + 2 * self.k_stages * st,
                    num_stages=self.k_stages, producer_group=prod_group, consumer_group=cons_group,
                    tx_count=self.k_bytes, defer_sync=True,
                ).make_participants()
                v_pc = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.v_mbar.data_ptr() + 2 * self.v_stages * st,
                    num_stages=self.v_stages, producer_group=prod_group, consumer_group=cons_group,
                    tx_count=self.v_bytes, defer_sync=True,
                ).make_participants()
                pipes.append((q_pc, k_pc, v_pc))

            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sKt = storage.sK.get_tensor(sKt_layout.outer, swizzle=sKt_layout.inner)  # TMA view
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()

            nqb = (o.shape[0] + bm - 1) // bm
            n_kblocks = (seqlen_k + self.plan_bk - 1) // self.plan_bk  # the plan's key blocks
            if cutlass.const_expr(self.flat):
                self.flat_body(
                    qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                    scale_log2, topk, seqlen_k, sQ, sK, sKt, sV, pipes[0], nqb, n_kblocks, tidx,
                    warp_idx, bx, h, b,
                )
            else:
                self.ws_body(
                    qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                    scale_log2, topk, seqlen_k, sQ, sK, sV, pipes, nqb, n_kblocks, tidx, warp_idx,
                    bx, h, b,
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
        def tma_views(self, tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb: Int32, h: Int32, b: Int32):
            """TMA source/destination partitions of the Q tile and of all K / V blocks of (b, h)."""
            bm, bk, hd = self.bm, self.bk, self.hd
            gQ = cute.local_tile(tq[None, None, h, b], (bm, hd), (qb, 0))
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2),
            )
            gK = cute.local_tile(tk[None, None, h, b], (self.plan_bk, hd), (None, 0))
            tKsK, tKgK = cpasync.tma_partition(
                tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2),
            )
            gV = cute.local_tile(tv[None, None, h, b], (hd, self.plan_bk), (0, None))
            tVsV, tVgV = cpasync.tma_partition(
                tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2),
            )
            return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

        @cute.jit
        def flat_body(self, qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, mIdx, mCnt, mQs, mKs, mVs,
                      scale_log2: Float32, topk: Int32, seqlen_k: Int32, sQ, sK, sKt, sV, pipes, nqb: Int32,
                      n_kblocks: Int32, tidx: Int32, warp_idx: Int32, qb: Int32, h: Int32, b: Int32):
            """Flat shape: one warpgroup per CTA, three CTAs per SM. Warp 0 issues the TMA loads
            (Q once; with the default refill="shadow", V of entry t under Q.K^T(t) and K of entry
            t+1 under P.V(t), when all warps have released the buffer). Per entry,
            serially: Q.K^T (INT8 WGMMA), online softmax -> FP8 P, P.V (FP8 WGMMA) into a per-tile
            FP32 accumulator, O = O * alpha + tile (two-level accumulation in one FFMA). The
            overlap comes from the other two CTAs on the SM. Entries with an id outside
            [0, ceil(Sk/bk)) load block 0 (always in bounds) and skip the math. With `pair`, a
            tile holds plan entries 2t and 2t+1 (64 keys each; a missing or invalid half is
            masked like keys past Sk)."""
            bm, bk, hd = self.bm, self.bk, self.hd
            E = 2 if self.pair else 1  # plan entries per tile
            q_prod = pipes[0][0]
            q_cons = pipes[0][1]
            k_prod = pipes[1][0]
            k_cons = pipes[1][1]
            v_prod = pipes[2][0]
            v_cons = pipes[2][1]
            n_blk = self.row_count(mIdx, mCnt, topk, b, h, qb, nqb)  # plan entries
            n_it = (n_blk + E - 1) // E  # tiles
            S = self.k_stages  # K ring depth (1 by default); the V ring is never deeper
            assert self.v_stages <= S
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
                tma_q, tq, tma_k, tk, tma_v, tv, sQ, sKt, sV, qb, h, b)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                if n_blk > 0:
                    qh = q_prod.acquire_and_advance()
                    cute.copy(tma_q, tQgQ, tQsQ[(None, 0)], tma_bar_ptr=qh.barrier)
            shadow = self.refill == "shadow"
            # shadow: entry t's V is issued inside entry t (under its Q.K^T), one fewer up front
            SV = self.v_stages - 1 if shadow else self.v_stages
            for i in cutlass.range(cutlass.min(n_it, S), unroll=1):
                k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, qb, i, n_blk, n_kblocks, warp_idx)
                if i < SV:
                    v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, qb, i, n_blk, n_kblocks,
                                              warp_idx)

            ctid = tidx
            thr_qk, thr_pv, tSrQ, tSrK, tOrV, acc_o, row_max, row_sum, alpha, tScS_mn = self.consumer_setup(
                qk_mma, pv_mma, sQ, sK, sV, ctid)
            acc_o_mn = acc_mn(acc_o)
            n_rows = cute.size(acc_o_mn, mode=[0])
            row_scale = self.q_row_scale(mQs, scale_log2, ctid, qb, nqb, b, h)
            num_kb = cute.size(tSrQ, mode=[2])
            num_kb_pv = cute.size(tOrV, mode=[2]) * E  # k-steps of P.V over the whole tile

            if n_blk > 0:
                qh = q_cons.wait_and_advance()
            for t in cutlass.range(n_it, unroll=1):
                blk = mIdx[b, h, qb, t * E]
                valid = Int32(0)
                if blk >= 0 and blk < n_kblocks:
                    valid = Int32(1)
                # branch-free loads, first used after the Q.K^T wait (their latency overlaps it)
                ks0, ks1 = self.k_scales(mKs, blk, n_kblocks, b, h)
                # first key of each 64-column half of the tile (seqlen_k: the half is masked)
                key0 = blk * self.plan_bk
                key1 = key0 + 64
                if cutlass.const_expr(self.pair):
                    blk2 = Int32(-1)
                    if t * 2 + 1 < n_blk:
                        blk2 = mIdx[b, h, qb, t * 2 + 1]
                    ks1, _ = self.k_scales(mKs, blk2, n_kblocks, b, h)
                    valid2 = Int32(0)
                    if blk2 >= 0 and blk2 < n_kblocks:
                        valid2 = Int32(1)
                    key1 = blk2 * 64
                    if valid == 0:
                        key0 = seqlen_k
                    if valid2 == 0:
                        key1 = seqlen_k
                    valid = valid | valid2
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
                    cute.nvgpu.warpgroup.fence()
                    qk_mma.set(warpgroup.Field.ACCUMULATE, True)
                    for kb in cutlass.range_constexpr(num_kb):
                        cute.gemm(qk_mma, acc_s, tSrQ[None, None, kb, 0], tSrK[None, None, kb, kh.index], acc_s)
                    cute.nvgpu.warpgroup.commit_group()
                    if cutlass.const_expr(shadow):
                        v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, qb, t + SV, n_blk,
                                                  n_kblocks, warp_idx)
                    cute.nvgpu.warpgroup.wait_group(0)
                    kh.release()
                    if cutlass.const_expr(not shadow):
                        k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, qb, t + S, n_blk,
                                                  n_kblocks, warp_idx)
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
                        cute.nvgpu.warpgroup.fence()
                        for kb in cutlass.range_constexpr(num_kb_pv):
                            pv_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                            # V k-step and buffer; paired: k-steps 0-1 entry 2t, 2-3 entry 2t+1
                            kv, vbuf = kb, vh.index
                            if cutlass.const_expr(self.pair):
                                kv, vbuf = kb % (num_kb_pv // 2), kb // (num_kb_pv // 2)
                            if cutlass.const_expr(self.pv_parts == 1):
                                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb], tOrV[None, None, kv, vbuf], acc_t)
                            else:
                                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb],
                                          cute.append_ones(tOrV[None, nh, kv, vbuf], up_to_rank=2), acc_t)
                        cute.nvgpu.warpgroup.commit_group()
                        if cutlass.const_expr(shadow and nh == 0):
                            k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, qb, t + S, n_blk,
                                                      n_kblocks, warp_idx)
                        cute.nvgpu.warpgroup.wait_group(0)
                        half_cols = cute.size(acc_t_mn, mode=[1])
                        for r in cutlass.range_constexpr(n_rows):
                            for c in cutlass.range_constexpr(half_cols):
                                acc_o_mn[r, c + nh * half_cols] = (
                                    acc_o_mn[r, c + nh * half_cols] * alpha[r] + acc_t_mn[r, c])
                    vh.release()
                else:
                    kh.release()
                    k_prod = self.flat_refill(k_prod, tma_k, tKgK, tKsK, mIdx, b, h, qb, t + S, n_blk,
                                              n_kblocks, warp_idx)
                    if cutlass.const_expr(shadow):
                        v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, qb, t + SV, n_blk,
                                                  n_kblocks, warp_idx)
                    vh = v_cons.wait_and_advance()
                    vh.release()
                if cutlass.const_expr(not shadow):
                    v_prod = self.flat_refill(v_prod, tma_v, tVgV, tVsV, mIdx, b, h, qb, t + SV, n_blk,
                                              n_kblocks, warp_idx)

            self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)

        @cute.jit
        def k_scales(self, mKs, blk: Int32, n_kblocks: Int32, b: Int32, h: Int32):
            """k_scales_any for Sage; 1.0 for bf16 (no k scales)."""
            k0 = Float32(1.0)
            k1 = Float32(1.0)
            if cutlass.const_expr(self.sage):
                k0, k1 = self.k_scales_any(mKs, blk, n_kblocks, b, h)
            return k0, k1

        @cute.jit
        def flat_refill(self, prod, tma_x, tXgX, tXsX, mIdx, b: Int32, h: Int32, qb: Int32, i: Int32,
                        n_blk: Int32, n_kblocks: Int32, warp_idx: Int32):
            """Flat shape, warp 0: TMA of plan entry i's K or V block into the buffer just released.
            Returns the producer: its state changes inside the branch, and only a returned value
            carries that change back to the caller."""
            if warp_idx == 0:
                if cutlass.const_expr(self.pair):
                    # tile i = entries 2i, 2i+1 into the two 64-key halves; both boxes are always
                    # issued (the barrier expects both), a missing second entry loads block 0
                    if i * 2 < n_blk:
                        ld = self.load_id(mIdx, b, h, qb, i * 2, n_kblocks)
                        ld2 = Int32(0)
                        if i * 2 + 1 < n_blk:
                            ld2 = self.load_id(mIdx, b, h, qb, i * 2 + 1, n_kblocks)
                        xn = prod.acquire_and_advance()
                        cute.copy(tma_x, tXgX[(None, ld)], tXsX[(None, 0)], tma_bar_ptr=xn.barrier)
                        cute.copy(tma_x, tXgX[(None, ld2)], tXsX[(None, 1)], tma_bar_ptr=xn.barrier)
                else:
                    if i < n_blk:
                        ld = self.load_id(mIdx, b, h, qb, i, n_kblocks)
                        xn = prod.acquire_and_advance()
                        # (K and V tiles of the flat Sage kernel have the same byte count)
                        self.tma_load(tma_x, tXgX[(None, ld)], tXsX[(None, xn.index)], xn.barrier, self.k_bytes,
                                      self.ablate_skip(i))
            return prod

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
        def load_id(self, mIdx, b: Int32, h: Int32, qb: Int32, i: Int32, n_kblocks: Int32) -> Int32:
            """Key block to load for plan entry i: its id, or block 0 for an id out of range."""
            blk = mIdx[b, h, qb, i]
            ld = Int32(0)
            if blk >= 0 and blk < n_kblocks:
                ld = blk
            return ld

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
        def producer(self, tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, q_prod, k_prod, v_prod, mIdx,
                     n_blk: Int32, n_kblocks: Int32, qb: Int32, h: Int32, b: Int32, st: cutlass.Constexpr):
            bm, bk, hd = self.bm, self.bk, self.hd
            if cutlass.const_expr(st == 0):
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(
                tma_q, tq, tma_k, tk, tma_v, tv, sQ, sK, sV, qb, h, b)
            if n_blk > 0:
                qh = q_prod.acquire_and_advance()
                cute.copy(tma_q, tQgQ, tQsQ[(None, st)], tma_bar_ptr=qh.barrier)
            for i in cutlass.range(n_blk, unroll=1):
                blk = mIdx[b, h, qb, i]
                if blk >= 0 and blk < n_kblocks:
                    skip = self.ablate_skip(i)
                    kh = k_prod.acquire_and_advance()
                    self.tma_load(tma_k, tKgK[(None, blk)], tKsK[(None, kh.index + st * self.k_stages)],
                                  kh.barrier, self.k_bytes, skip)
                    vh = v_prod.acquire_and_advance()
                    self.tma_load(tma_v, tVgV[(None, blk)], tVsV[(None, vh.index + st * self.v_stages)],
                                  vh.barrier, self.v_bytes, skip)

        @cute.jit
        def ablate_skip(self, i: Int32) -> Int32:
            """Experiments (`ablate`): 1 if plan entry i's K/V loads are to be skipped: every entry
            ("all") or every odd one ("half") once each ring buffer has held real data."""
            sk = Int32(0)
            if cutlass.const_expr(self.ablate != ""):
                if i >= self.k_stages:
                    sk = Int32(1)
                    if cutlass.const_expr(self.ablate == "half"):
                        sk = i % 2
            return sk

        @cute.jit
        def tma_load(self, tma_x, src, dst, bar, nbytes: cutlass.Constexpr, skip: Int32):
            """TMA of one block into dst. Experiments (`ablate`, skip != 0): no copy; one thread
            completes the barrier's transaction count instead (the buffer keeps its old bytes)."""
            if cutlass.const_expr(self.ablate != ""):
                if skip != 0:
                    with cute.arch.elect_one():
                        _complete_tx(bar, nbytes)
                else:
                    cute.copy(tma_x, src, dst, tma_bar_ptr=bar)
            else:
                cute.copy(tma_x, src, dst, tma_bar_ptr=bar)

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
        ):
            """Software-pipelined mainloop: while the softmax of tile j runs, the tensor cores
            work on Q.K^T(j) (issued first) and P.V(j-1). One turn per plan entry plus one for
            the last P.V; with two warpgroups both take max(n0, n1) + 1 turns so the ping-pong
            barriers always pair up."""
            bm, bk, hd = self.bm, self.bk, self.hd
            ks_off = st * self.k_stages
            vs_off = st * self.v_stages
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
                qh = q_cons.wait_and_advance()
            n_turns = n_blk + 1
            if cutlass.const_expr(self.wgs == 2):
                n_turns = cutlass.max(n_blk, n_other) + 1
                if cutlass.const_expr(st == 1):
                    cute.arch.barrier_arrive(barrier_id=1, number_of_threads=256)  # WG 0 starts
            have_prev = False
            # the plan entry and its k scales are loaded one turn ahead (their global-load
            # latency would otherwise sit at the head of every turn)
            blk_next = Int32(-1)
            if n_blk > 0:
                blk_next = mIdx[b, h, qb, 0]
            ks_next0, ks_next1 = self.k_scales(mKs, blk_next, n_kblocks, b, h)
            for t in cutlass.range(n_turns, unroll=1):
                if cutlass.const_expr(self.wgs == 2):
                    cute.arch.barrier(barrier_id=1 + st, number_of_threads=256)
                blk = blk_next
                ks0 = ks_next0
                ks1 = ks_next1
                nxt = Int32(-1)
                if t + 1 < n_blk:
                    nxt = mIdx[b, h, qb, t + 1]
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
                        cute.nvgpu.warpgroup.fence()
                        if cutlass.const_expr(self.sage):
                            for kb in cutlass.range_constexpr(num_kb_pv):
                                pv_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb], tOrV[None, None, kb, vh.index + vs_off], acc_t)
                        else:
                            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
                            for kb in cutlass.range_constexpr(num_kb_pv):
                                cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb, vh.index + vs_off], acc_o)
                        cute.nvgpu.warpgroup.commit_group()
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
                        cute.nvgpu.warpgroup.fence()
                        if cutlass.const_expr(self.sage):
                            for kb in cutlass.range_constexpr(num_kb_pv):
                                pv_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
                                cute.gemm(pv_mma, acc_t, tOrP[None, None, kb], tOrV[None, None, kb, vh.index + vs_off], acc_t)
                        else:
                            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
                            for kb in cutlass.range_constexpr(num_kb_pv):
                                cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb, vh.index + vs_off], acc_o)
                        cute.nvgpu.warpgroup.commit_group()
                        self.pp_arrive(st, t, n_turns)
                        cute.nvgpu.warpgroup.wait_group(0)
                        vh.release()
                        if cutlass.const_expr(self.sage):
                            acc_o.store(acc_o.load() + acc_t.load())
                        have_prev = False
                    else:
                        self.pp_arrive(st, t, n_turns)

            self.epilogue(acc_o, row_sum, thr_pv, o, mVs, qb, nqb, h, b)

        @cute.jit
        def epilogue(self, acc_o, row_sum, thr_pv, o, mVs, qb: Int32, nqb: Int32, h: Int32, b: Int32):
            """O / row sum (exact zeros for rows without a valid block), x v_scale for Sage,
            predicated bf16 stores of the rows < Sq."""
            bm, hd = self.bm, self.hd
            acc_o_mn = acc_mn(acc_o)
            n_rows = cute.size(acc_o_mn, mode=[0])
            for r in cutlass.range_constexpr(n_rows):
                s = row_sum[r]
                s = s + cute.arch.shuffle_sync_bfly(s, offset=1)
                s = s + cute.arch.shuffle_sync_bfly(s, offset=2)
                inv = Float32(0.0)
                if s > 0.0:
                    inv = cute.arch.rcp_approx(s)
                for c in cutlass.range_constexpr(cute.size(acc_o_mn, mode=[1])):
                    acc_o_mn[r, c] = acc_o_mn[r, c] * inv

            seqlen_q = o.shape[0]
            gO = cute.local_tile(o[None, None, h, b], (bm, hd), (cutlass.min(qb, nqb - 1), 0))
            cO = cute.make_identity_tensor((bm, hd))
            tOgO = thr_pv.partition_C(gO)
            tOcO = thr_pv.partition_C(cO)
            if qb < nqb:
                if cutlass.const_expr(self.sage):
                    for e in cutlass.range_constexpr(cute.size(acc_o)):
                        acc_o[e] = acc_o[e] * mVs[b, h, tOcO[e][1]]
                rO = cute.make_rmem_tensor(acc_o.layout, self.o_dt)
                rO.store(acc_o.load().to(self.o_dt))
                row0 = qb * bm
                for e in cutlass.range_constexpr(cute.size(rO)):
                    if row0 + tOcO[e][0] < seqlen_q:
                        tOgO[e] = rO[e]

        @cute.jit
        def softmax_tile(self, acc_s, tScS_mn, blk: Int32, sc: Float32, sc1: Float32, row_max, row_sum, alpha,
                         seqlen_k: Int32):
            key0 = blk * self.bk
            self.softmax_keys(acc_s, tScS_mn, key0, key0 + 64, sc, sc1, row_max, row_sum, alpha, seqlen_k)

        @cute.jit
        def softmax_keys(self, acc_s, tScS_mn, key0: Int32, key1: Int32, sc: Float32, sc1: Float32, row_max,
                         row_sum, alpha, seqlen_k: Int32):
            """key0 / key1: first key of the tile's first / second 64 columns (a 64-key tile has
            only the first); the masked path runs when any column reaches seqlen_k."""
            last = key0 + self.bk
            if cutlass.const_expr(self.bk == 128):
                last = cutlass.max(key0, key1) + 64
            # the common unmasked path first: the fall-through, no jump over the masked code
            if last <= seqlen_k:
                self.softmax_tile_impl(acc_s, tScS_mn, key0, key1, sc, sc1, row_max, row_sum, alpha, seqlen_k, False)
            else:
                self.softmax_tile_impl(acc_s, tScS_mn, key0, key1, sc, sc1, row_max, row_sum, alpha, seqlen_k, True)

        @cute.jit
        def col_key(self, key0: Int32, key1: Int32, tScS_mn, c: cutlass.Constexpr, n_cols: cutlass.Constexpr) -> Int32:
            """Key position of accumulator column c: columns [0, n_cols/2) of a 128-key tile are
            its first 64 keys (accumulator order: pair, then 8-column chunk), the rest start at key1."""
            base = key0
            if cutlass.const_expr(self.bk == 128 and c >= n_cols // 2):
                base = key1 - 64
            return base + tScS_mn[0, c][1]

        @cute.jit
        def softmax_tile_impl(self, acc_s, tScS_mn, key0: Int32, key1: Int32, sc: Float32, sc1: Float32, row_max,
                              row_sum, alpha, seqlen_k: Int32, masked: cutlass.Constexpr):
            """acc_s (S32 for sage, F32 for bf16) -> P (F32, in place; x448 for sage).
            Scores in log2 units are acc * sc; the row max is taken on the raw accumulator."""
            s_raw = acc_mn(acc_s)
            n_rows = cute.size(s_raw, mode=[0])
            n_cols = cute.size(s_raw, mode=[1])
            pos = sc >= 0.0
            if cutlass.const_expr(self.sage):
                big = Int32(4194303)  # 2^22 - 1: keeps the magic-number conversion exact
                bias = Int32(0)  # what the accumulator started from (see qk_bias)
                if cutlass.const_expr(self.qk_bias):
                    bias = Int32(0x4B400000)
                if cutlass.const_expr(masked):
                    for c in cutlass.range_constexpr(n_cols):
                        if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                            for r in cutlass.range_constexpr(n_rows):
                                if pos:
                                    s_raw[r, c] = bias - big
                                else:
                                    s_raw[r, c] = bias + big
                # columns [0, n_cols/2) are keys 0..63 of the tile, the rest keys 64..127
                # (accumulator column order: pair, then 8-column chunk)
                half = n_cols // 2 if cutlass.const_expr(self.bk == 128) else n_cols
                mx = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
                # raw row extremes per 64-key half: one branch on the scale's sign per tile (the
                # sign decides max or min); the four chains are independent
                mi = cute.make_rmem_tensor(cute.make_layout((n_rows, 2)), Int32)
                if pos:
                    self.row_extremes(s_raw, mi, half, True)
                else:
                    self.row_extremes(s_raw, mi, half, False)
                for r in cutlass.range_constexpr(n_rows):
                    mf = Float32(mi[r, 0] - bias) * sc
                    if cutlass.const_expr(half < n_cols):
                        mf = cute.arch.fmax(mf, Float32(mi[r, 1] - bias) * sc1)
                    mx[r] = mf
                # float(x) = as_float(x + 0x4B400000) - 12582912 for |x| < 2^22
                if cutlass.const_expr(not self.qk_bias):
                    acc_s.store(acc_s.load() + Int32(0x4B400000))
                s_f = acc_mn(cute.recast_tensor(acc_s, Float32))
                for r in cutlass.range_constexpr(n_rows):
                    m = mx[r]
                    m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                    m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                    m_new = cute.arch.fmax(row_max[r], m)
                    alpha[r] = cute.math.exp2(row_max[r] - m_new, fastmath=True)
                    row_max[r] = m_new
                    bias0 = Float32(12582912.0) * sc + m_new - Float32(math.log2(P_SCALE))
                    bias1 = Float32(12582912.0) * sc1 + m_new - Float32(math.log2(P_SCALE))
                    acc_sum = Float32(0.0)
                    for c in cutlass.range_constexpr(n_cols):
                        p = Float32(0.0)
                        if cutlass.const_expr(c < half):
                            p = cute.math.exp2(s_f[r, c] * sc - bias0, fastmath=True)
                        else:
                            p = cute.math.exp2(s_f[r, c] * sc1 - bias1, fastmath=True)
                        if cutlass.const_expr(masked):
                            if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                                p = Float32(0.0)
                        s_f[r, c] = p
                        acc_sum = acc_sum + p
                    row_sum[r] = row_sum[r] * alpha[r] + acc_sum
            else:
                if cutlass.const_expr(masked):
                    for c in cutlass.range_constexpr(n_cols):
                        if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                            for r in cutlass.range_constexpr(n_rows):
                                if pos:
                                    s_raw[r, c] = -Float32.inf
                                else:
                                    s_raw[r, c] = Float32.inf
                for r in cutlass.range_constexpr(n_rows):
                    m = s_raw[r, 0]
                    if pos:
                        for c in cutlass.range_constexpr(1, n_cols):
                            m = cute.arch.fmax(m, s_raw[r, c])
                        m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                        m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                    else:
                        for c in cutlass.range_constexpr(1, n_cols):
                            m = cute.arch.fmin(m, s_raw[r, c])
                        m = cute.arch.fmin(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                        m = cute.arch.fmin(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                    m_new = cute.arch.fmax(row_max[r], m * sc)
                    alpha[r] = cute.math.exp2(row_max[r] - m_new, fastmath=True)
                    row_max[r] = m_new
                    acc_sum = Float32(0.0)
                    for c in cutlass.range_constexpr(n_cols):
                        p = cute.math.exp2(s_raw[r, c] * sc - m_new, fastmath=True)
                        if cutlass.const_expr(masked):
                            if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                                p = Float32(0.0)
                        s_raw[r, c] = p
                        acc_sum = acc_sum + p
                    row_sum[r] = row_sum[r] * alpha[r] + acc_sum

        @cute.jit
        def row_extremes(self, s_raw, mi, half: cutlass.Constexpr, take_max: cutlass.Constexpr):
            """mi[r, 0] / mi[r, 1]: max (or min) of row r of s_raw over columns [0, half) / [half, end)."""
            n_cols = cute.size(s_raw, mode=[1])
            for r in cutlass.range_constexpr(cute.size(s_raw, mode=[0])):
                for part in cutlass.range_constexpr(2):
                    c0 = 0 if part == 0 else half
                    c1 = half if part == 0 else n_cols
                    if cutlass.const_expr(c0 < c1):
                        m = s_raw[r, c0]
                        for c in cutlass.range_constexpr(c0 + 1, c1):
                            if cutlass.const_expr(take_max):
                                m = cutlass.max(m, s_raw[r, c])
                            else:
                                m = cutlass.min(m, s_raw[r, c])
                        mi[r, part] = m

        @cute.jit
        def convert_p(self, acc_s, tOrP):
            if cutlass.const_expr(self.sage):
                s_f = cute.recast_tensor(acc_s, Float32)
                n = cute.size(s_f)
                # fp32 registers in the FP8 A-operand order (keys permuted by V_PERM16)
                p_perm = cute.make_rmem_tensor(cute.make_layout(n), Float32)
                for g in cutlass.range_constexpr(n // 8):
                    for e in cutlass.range_constexpr(8):
                        p_perm[g * 8 + e] = s_f[g * 8 + (0, 1, 4, 5, 2, 3, 6, 7)[e]]
                p_view = cute.make_tensor(tOrP.iterator, cute.make_layout(n))
                p_view.store(p_perm.load().to(self.v_dt))
            else:
                p_view = cute.make_tensor(tOrP.iterator, acc_s.layout)
                p_view.store(acc_s.load().to(self.v_dt))

    return Sm90SparseAttention


def get_class():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build_classes()
    return _CLASSES


# ---------------------------------------------------------------------------------------------
# Registry: argument specs and variants.

def _bshd(name: str, dtype: str, seq: str) -> TensorArg:
    # (B, S, H, 128), last dim contiguous; strides in elements must keep 16-byte alignment
    # (TMA): the runtime checks stride % (16 // itemsize) == 0 and data_ptr % 16 == 0.
    div = 16 if dtype in ("int8", "float8_e4m3fn") else 8
    return TensorArg(
        name, dtype, (Sym("B"), Sym(seq), Sym("H"), 128),
        (Sym(f"{name}_sb", div, 64), Sym(f"{name}_ss", div, 64), Sym(f"{name}_sh", div, 64), 1),
    )


def _plan_args(with_counts: bool) -> list:
    args = [
        TensorArg(
            "q2k_block_index", "int32", (Sym("B"), Sym("H"), Sym("NQB"), Sym("CAP")),
            (Sym("idx_sb", 1, 64), Sym("idx_sh", 1, 64), Sym("idx_sq", 1, 64), 1), align=4,
        )
    ]
    if with_counts:
        args.append(
            TensorArg(
                "block_counts", "int32", (Sym("B"), Sym("H"), Sym("NQB")),
                (Sym("cnt_sb", 1, 64), Sym("cnt_sh", 1, 64), 1), align=4,
            )
        )
    return args


def _variants(mode: str) -> tuple:
    out = []
    for bk in (64, 128):
        for counts in (True, False):
            pair = (mode, bk) in PAIRED
            out.append(Variant(f"k{bk}{'_cnt' if counts else ''}", {"block_k": bk, "counts": counts, "pair": pair}))
    if mode == "sage":
        # the other CTA shape of each key block (k64: one-entry flat; k128: warp-specialised), so
        # that `subblock-sage bench` can compare both in one run and the runtime can switch
        # without a rebuild
        for bk in (64, 128):
            alt = ALT_WGS[("sage", bk)]
            out.append(Variant(f"k{bk}_{'ws' if alt else 'flat'}_cnt", {"block_k": bk, "counts": True, "wgs": alt}))
        if os.environ.get("SBS_SM90_EXPERIMENTS"):  # scratch builds for measurements, never shipped
            for bk, tag, params in ((128, "flats2", {"stages": (2, 2)}), (64, "flats2", {"stages": (2, 2)}),
                                    (64, "flats2c3", {"stages": (2, 2), "ctas_per_sm": 3}),
                                    (64, "flatc3", {"ctas_per_sm": 3})):
                out.append(Variant(f"k{bk}_{tag}_cnt", {"block_k": bk, "counts": True, "wgs": 0, **params}))
            for bk in (64, 128):
                out.append(Variant(f"k{bk}_eager_cnt", {"block_k": bk, "counts": True,
                                                         "pair": ("sage", bk) in PAIRED, "refill": "eager"}))
            # two K buffers, one V buffer (K of entry t+2 under P.V(t)): one more entry of TMA slack
            out.append(Variant("k128_k2_cnt", {"block_k": 128, "counts": True, "wgs": 0, "stages": (2, 1)}))
    if os.environ.get("SBS_SM90_EXPERIMENTS"):
        # ablations (wrong results on purpose, timing only): half / all of the K/V TMA loads
        # replaced by a hand-made transaction completion (`ablate_skip`), default shapes
        for bk in (64, 128) if mode == "bf16" else (128,):
            for tag in ("half", "all"):
                out.append(Variant(f"k{bk}_abl{tag}_cnt", {"block_k": bk, "counts": True, "ablate": tag}))
    return tuple(out)


def _spec(mode: str):
    def compile_spec(target: str, variant: Variant) -> CompileSpec:
        bk = variant.params["block_k"]
        counts = variant.params["counts"]
        cls = get_class()
        m = "sage" if mode == "sage" else "bf16"
        pair = bool(variant.params.get("pair"))
        tile = 128 if pair else bk  # a paired kernel computes two 64-key plan entries per 128-key tile
        flat = {**FLAT_PARAMS[(m, tile)], **{k: v for k, v in variant.params.items() if k in ("pv_parts", "ctas_per_sm", "refill", "ablate")}}
        kern = cls(m, tile, stages=variant.params.get("stages"),
                   wgs=variant.params.get("wgs", DEFAULT_WGS[(m, bk)]), pair=pair, **flat)
        if mode == "bf16":
            args = [_bshd("q", "bfloat16", "SQ"), _bshd("k", "bfloat16", "SK"), _bshd("v", "bfloat16", "SK")]
        else:
            args = [
                _bshd("q", "int8", "SQ"),
                _bshd("k", "int8", "SK"),
                # FP8 V^T, (B, H, 128, SKP): SKP = round_up(Sk, 64), keys permuted by V_PERM16
                TensorArg(
                    "v", "float8_e4m3fn", (Sym("B"), Sym("H"), 128, Sym("SKP")),
                    (Sym("v_sb", 16, 64), Sym("v_sh", 16, 64), Sym("v_sd", 16, 64), 1),
                ),
            ]
        args.append(_bshd("out", "bfloat16", "SQ"))
        args += _plan_args(counts)
        if mode == "sage":
            args += [
                # layouts of aot/kernels/sage_quant.py (FlashInfer SM120 contract):
                # q_scale one per 32 rows [B,H,ceil(Sq/128)*4], k_scale one per 64 keys
                TensorArg("q_scale", "float32", (Sym("B"), Sym("H"), Sym("NQ32")),
                          (Sym("qs_sb", 1, 64), Sym("qs_sh", 1, 64), 1), align=4),
                TensorArg("k_scale", "float32", (Sym("B"), Sym("H"), Sym("NK64")),
                          (Sym("ks_sb", 1, 64), Sym("ks_sh", 1, 64), 1), align=4),
                TensorArg("v_scale", "float32", (Sym("B"), Sym("H"), 128),
                          (Sym("vs_sb", 1, 64), Sym("vs_sh", 1, 64), 1), align=4),
            ]
        args += [ScalarArg("scale_log2", "float32", 1.0), ScalarArg("topk", "int32", 1), StreamArg()]
        return CompileSpec(kern.entry(counts), args, {})

    return compile_spec


KERNELS: list = [
    Kernel(
        name="sm90_bsa_bf16",
        doc="SM90a block-sparse attention, BF16 WGMMA (TMA + warp-specialized producer/consumer)",
        targets=("sm_90a",),
        variants=_variants("bf16"),
        compile_spec=_spec("bf16"),
    ),
    Kernel(
        name="sm90_bsa_sage",
        doc="SM90a block-sparse Sage attention: INT8 Q.K^T (s32), FP8-E4M3 P.V, two-level FP32 accumulation",
        targets=("sm_90a",),
        variants=_variants("sage"),
        compile_spec=_spec("sage"),
    ),
]
