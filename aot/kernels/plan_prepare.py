"""Routing-plan preparation kernel (CuTe-DSL): one launch that turns a caller's plan into the
plan every attention kernel can take, and summarises what was wrong with it.

Why a kernel: the same repair written as PyTorch ops took ~12 launches, a (rows x Gk) scratch
tensor and ~0.3 ms of host time per call (measured on the H200, MEASUREMENTS.md), which the
whole ``sparse_attention`` call paid on top of the attention kernel.

Contract (per row ``(b, h, qb)``; ``n = clamp(count, 0, cap)`` with ``count`` from
``block_counts`` or the scalar ``topk``):
* among the first ``n`` entries of ``q2k_block_index[b, h, qb]``, each id with
  ``0 <= id < num_key_blocks`` is kept once (a repeat of an earlier entry is dropped);
* each kept id ``j`` is written as ``split`` consecutive ids ``j*split + s`` (``s < split``,
  dropping those ``>= num_out_blocks``): ``split = 2`` rewrites a 128-key-block plan into the
  64-key blocks the FlashInfer classes take; ``split = 1`` copies;
* ``out_index[b, h, qb, :m]`` holds the ``m`` written ids in ascending order, the rest of the row
  zeros. The caller's order is not kept: attention over a set of key blocks does not depend on it
  (only rounding does), and ascending ids make the CTAs of a head that run together walk K/V in
  the same order (H200, dense plan at H=14 S=37760, K/V 135 MB against a 50 MB L2: the Sage
  kernel takes 12.56-12.58 ms on sorted rows vs 12.74-12.79 on rows in random order; cuDNN's FP8
  SDPA time / its time is 0.991-1.003 instead of 0.981-0.994; ncu at H=4: 21.4 GB of L2 traffic
  instead of 23.0 GB; MEASUREMENTS.md); and identical sets give identical rows, which the K/V-sharing experiment
  ``flat_wgs=3`` needs;
  ``out_counts[b, h, qb] = m``;
* ``summary`` (int32[4], zeroed by the caller) collects: ``[0]`` max of ``max(-count, 1)`` (``-count`` wraps for INT32_MIN) over rows
  with a negative count, ``[1]`` max of ``count`` over rows with ``count > cap``, ``[2]`` number
  of rows with an id outside ``[0, num_key_blocks)`` among their first ``n`` entries, ``[3]``
  number of repeated entries dropped. Rows in range touch no atomics.

The row body is one device function (``device_fns()``: ``prepare_row``), shared with the plan
role of the Sage quantizer's launch ``sage_quant_kv`` (``aot/kernels/sage_quant.py``), which takes the
same arguments (``plan_args``) and writes the same outputs.

One warp per row, four rows per CTA. The row's ids are marked in a per-warp bitmap of its key
blocks in shared memory (``atomicOr`` returns whether the bit was already set: a repeat), then the
bitmap is read 32 words at a time and each nonzero word's bits are compacted with a warp prefix
sum (empty words cost a shuffle: a sparse row of a long sequence pays ~``num_key_blocks / 32``
shuffles). ``num_key_blocks`` must be <= ``MAX_KEY_BLOCKS``
(the runtime falls back to its PyTorch implementation above that).
"""

from functools import cache

from aot.contract import MAX_KEY_BLOCKS  # the runtime's fallback threshold: one definition
from aot.contract import TARGET_NAMES as TARGETS  # every target ships it
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

WARPS = 4
WORDS = MAX_KEY_BLOCKS // 32
SUMMARY_LEN = 4


def _build_device():
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32

    @cute.jit
    def prepare_row(mIdx: cute.Tensor, mCnt, mOut: cute.Tensor, mOutCnt: cute.Tensor, mSum: cute.Tensor,
                    nkb: Int32, topk: Int32, split: Int32, nout: Int32, b, h, qb, warp, lane, sBits: cute.Tensor,
                    words=WORDS):
        """One warp prepares row ``(b, h, qb)`` (nothing when ``qb`` is past the plan's rows).
        ``sBits``: the CTA's bitmap, ``words`` int32 per warp (``words * 32 >= nkb``: the caller
        checks; ids past it would count as out of range); ``mCnt`` None: every row uses ``topk``.
        Shared by the ``plan_prepare`` kernel and the plan role of ``sage_quant_kv``."""
        bits_base = sBits.iterator + warp * words
        cap = mIdx.shape[3]
        out_cap = mOut.shape[3]
        if qb < mIdx.shape[2]:
            raw = topk
            if cutlass.const_expr(mCnt is not None):
                raw = mCnt[b, h, qb]
                if lane == 0:
                    if raw < 0:
                        # -raw wraps to INT32_MIN for raw = INT32_MIN: at least 1 keeps it visible
                        cute.arch.atomic_max(mSum.iterator + 0, cutlass.max(-raw, Int32(1)))
                    if raw > cap:
                        cute.arch.atomic_max(mSum.iterator + 1, raw)
            n = cutlass.min(cutlass.max(raw, 0), cap)
            nkb_c = cutlass.max(cutlass.min(nkb, words * 32), 0)  # never past the bitmap
            for w in cutlass.range(lane, (nkb_c + 31) // 32, 32, unroll=1):
                sBits[warp * words + w] = Int32(0)
            cute.arch.sync_warp()

            # 1. mark the row's valid ids in the bitmap (a repeat finds its bit set)
            bad = Int32(0)
            dropped = Int32(0)
            for c in cutlass.range(0, n, 32, unroll=1):
                i = c + lane
                if i < n:
                    blk = mIdx[b, h, qb, i]
                    if blk >= 0 and blk < nkb_c:
                        bit = Int32(1) << (blk % 32)
                        old = cute.arch.atomic_or(bits_base + blk // 32, bit)
                        if (old & bit) != 0:
                            dropped = dropped + 1
                    else:
                        bad = Int32(1)
            cute.arch.sync_warp()

            # 2. emit the marked ids in ascending order: lane l loads word c + l, then each
            # nonzero word is broadcast and its 32 bits compacted with a warp prefix sum
            nw = (nkb_c + 31) // 32
            base = Int32(0)
            for c in cutlass.range(0, nw, 32, unroll=1):
                mine = Int32(0)
                if c + lane < nw:
                    mine = sBits[warp * words + c + lane]
                for src in cutlass.range(0, cutlass.min(nw - c, 32), unroll=1):
                    word = cute.arch.shuffle_sync(mine, src)
                    if word != 0:  # warp-uniform
                        blk = (c + src) * 32 + lane
                        emit = Int32(0)
                        if ((word >> lane) & 1) != 0:
                            emit = cutlass.min(split, nout - blk * split)
                        # exclusive prefix sum of emit over the warp
                        incl = emit
                        for d in cutlass.range_constexpr(5):
                            t = cute.arch.shuffle_sync_up(incl, 1 << d)
                            if lane >= (1 << d):
                                incl = incl + t
                        total = cute.arch.shuffle_sync(incl, 31)
                        pos = base + incl - emit
                        for s in cutlass.range(emit, unroll=1):
                            if pos + s < out_cap:
                                mOut[b, h, qb, pos + s] = blk * split + s
                        base = base + total
            for j in cutlass.range(base + lane, out_cap, 32, unroll=1):
                mOut[b, h, qb, j] = Int32(0)
            if cute.arch.vote_any_sync(bad != 0):
                if lane == 0:
                    cute.arch.atomic_add(mSum.iterator + 2, Int32(1))
            dropped = cute.arch.warp_reduction_sum(dropped)
            if lane == 0:
                mOutCnt[b, h, qb] = cutlass.min(base, out_cap)
                if dropped > 0:
                    cute.arch.atomic_add(mSum.iterator + 3, dropped)

    return prepare_row


@cache
def device_fns():
    """The device function(s) of the plan contract, built on first use: ``prepare_row``."""
    return _build_device()


def _build():
    import cuda.bindings.driver as cuda

    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32

    prepare_row = device_fns()

    class PlanPrepare:
        @cute.jit
        def run_cnt(self, q2k_block_index: cute.Tensor, block_counts: cute.Tensor, out_index: cute.Tensor,
                    out_counts: cute.Tensor, summary: cute.Tensor, num_key_blocks: Int32, split: Int32,
                    num_out_blocks: Int32, stream: cuda.CUstream):
            self.launch(q2k_block_index, block_counts, out_index, out_counts, summary, num_key_blocks,
                        Int32(0), split, num_out_blocks, stream)

        @cute.jit
        def run_topk(self, q2k_block_index: cute.Tensor, out_index: cute.Tensor, out_counts: cute.Tensor,
                     summary: cute.Tensor, num_key_blocks: Int32, topk: Int32, split: Int32,
                     num_out_blocks: Int32, stream: cuda.CUstream):
            self.launch(q2k_block_index, None, out_index, out_counts, summary, num_key_blocks, topk, split,
                        num_out_blocks, stream)

        @cute.jit
        def launch(self, mIdx, mCnt, mOut, mOutCnt, mSum, nkb: Int32, topk: Int32, split: Int32,
                   nout: Int32, stream: cuda.CUstream):
            nqb = mIdx.shape[2]
            self.kernel(mIdx, mCnt, mOut, mOutCnt, mSum, nkb, topk, split, nout).launch(
                grid=[(nqb + WARPS - 1) // WARPS, mIdx.shape[1], mIdx.shape[0]],
                block=[32 * WARPS, 1, 1], stream=stream,
            )

        @cute.kernel
        def kernel(self, mIdx: cute.Tensor, mCnt, mOut: cute.Tensor, mOutCnt: cute.Tensor,
                   mSum: cute.Tensor, nkb: Int32, topk: Int32, split: Int32, nout: Int32):
            cute.arch.griddepcontrol_launch_dependents()  # as sage_quant_kv (PDL, sm90/config.py)
            tidx, _, _ = cute.arch.thread_idx()
            bx, h, b = cute.arch.block_idx()
            warp = cute.arch.make_warp_uniform(tidx // 32)
            lane = tidx % 32
            smem = cutlass.utils.SmemAllocator()
            sBits = smem.allocate_tensor(Int32, cute.make_layout((WARPS * WORDS,)), 16)
            prepare_row(mIdx, mCnt, mOut, mOutCnt, mSum, nkb, topk, split, nout, b, h, bx * WARPS + warp,
                        warp, lane, sBits)

    return PlanPrepare


@cache
def get_class():
    """The kernel class, built on first use (the DSL is imported lazily)."""
    return _build()


# ---------------------------------------------------------------------------------------------
# Registry

def _i32(name: str, shape: tuple, stride: tuple) -> TensorArg:
    return TensorArg(name, "int32", shape, stride, align=4)


def plan_args(counts: bool) -> list:
    """The plan kernel's arguments, without the stream (the plan role of ``sage_quant_kv`` takes
    the same ones): ``block_counts`` when ``counts``, else the scalar ``topk``."""
    B, H, NQB = Sym("B"), Sym("H"), Sym("NQB")
    args = [_i32("q2k_block_index", (B, H, NQB, Sym("CAP")),
                 (Sym("idx_sb", 1, 64), Sym("idx_sh", 1, 64), Sym("idx_sq", 1, 64), 1))]
    if counts:
        args.append(_i32("block_counts", (B, H, NQB), (Sym("cnt_sb", 1, 64), Sym("cnt_sh", 1, 64), 1)))
    args += [
        _i32("out_index", (B, H, NQB, Sym("OCAP")),
             (Sym("oidx_sb", 1, 64), Sym("oidx_sh", 1, 64), Sym("oidx_sq", 1, 64), 1)),
        _i32("out_counts", (B, H, NQB), (Sym("ocnt_sb", 1, 64), Sym("ocnt_sh", 1, 64), 1)),
        _i32("summary", (SUMMARY_LEN,), (1,)),
        ScalarArg("num_key_blocks", "int32", 1),
    ]
    if not counts:
        args.append(ScalarArg("topk", "int32", 1))
    args += [ScalarArg("split", "int32", 1), ScalarArg("num_out_blocks", "int32", 1)]
    return args


def _spec(target: str, variant: Variant) -> CompileSpec:
    cls = get_class()()
    counts = variant.params["counts"]
    return CompileSpec(cls.run_cnt if counts else cls.run_topk, [*plan_args(counts), StreamArg()])


KERNELS: list[Kernel] = [
    Kernel(
        "plan_prepare",
        "routing plan -> kernel-safe plan (counts clamped, out-of-range and repeated ids dropped, "
        "compacted, optional 128->64 key-block split) + a summary of what was wrong",
        TARGETS,
        (Variant("cnt", {"counts": True}), Variant("topk", {"counts": False})),
        _spec,
    ),
]
