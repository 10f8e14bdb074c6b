"""Sage quantizer kernels (CuTe-DSL): bf16 Q/K/V -> the operands of FlashInfer's SM120 Sage kernel.

Numerics and layouts follow FlashInfer 0.7.2.post1 ``cute_dsl/sparse/bsa_utils/sage_quant_sm120.py``
(the Triton quantizer whose output ``BlockSparseAttnForwardSageSm120Blk64`` consumes):

* Q: symmetric INT8, one scale per 32 rows. ``scale = max(amax, 1e-7) / 127``,
  ``code = clamp(rint(q / scale), -127, 127)``. ``q_scale`` has ``ceil(Sq/128)*4`` groups per
  (b, h); groups that lie wholly past Sq (pad groups) get ``1e-7 / 127``. Q is not smoothed.
* K: smoothed by a per-channel mean of K (per b, h), then INT8 with one scale per 64 keys; the
  amax is taken over the *centred* values of the valid rows only. The mean is that of a strided
  sample of keys (``contract.sage_k_mean_rows``: all keys up to SAGE_K_MEAN_ROWS = 512, else 512
  keys ``stride = Sk // 512`` apart), not of all keys as in FlashInfer: see "Deviations".
* V: FP8-E4M3 (round to nearest even, satfinite), per-channel scale ``max(amax|V|, bound, 1e-7) /
  2.25`` (amax over all keys; the bound 4x the amax over the K mean's sample keys,
  ``contract.SAGE_V_BOUND_MARGIN``: see "Deviations"), stored transposed ``[B, H, 128, round_up(Sk, 64)]`` with FlashInfer's
  16-token row permutation: token ``t = 64*blk + 16*g + i`` lands at column
  ``64*blk + 16*g + PERM16[i]``, ``PERM16[i] = (i%16//8)*2 + (i//2%4)*4 + i%2``.
  Columns of tokens >= Sk are written as exact zeros (+0.0, byte 0x00).

Deviations from FlashInfer, on purpose: the K mean is taken over a sample of 512 keys, not all Sk
(seventeenth session: softmax is invariant to a per-channel shift of K, so the mean only decides
where each block's INT8 range is centred; a sample lies ~0.044 sigma from the exact mean, which
moves a block's amax by at most that, and it lets the quantizer read K once, with no per-head wait);
V's scale is at least 4x the amax of the same sample keys (twentieth session: E4M3 keeps its
relative precision at any scale, so a larger scale costs only the subnormal range of values under
~1/36 of the amax; known before V is read, it lets the quantizer read V once, and a head with a
key above it is quantized again with its exact amax: the redo tickets);
FlashInfer stores the K mean in bf16 before subtracting it, we keep it in fp32. Codes use ``x * (1/scale)`` instead of ``x / scale``, and every division (scales,
their inverses, the K mean) is ``div.full.f32`` (within 2 ulp; no slow-path call): a code can
differ by one INT8 / E4M3 step at a rounding tie, scales by ~2.4e-7 relative.

Kernel (head dim static 128 with stride 1; every other extent and stride symbolic). Tensors are
passed in *canonical mode order*; a BHSD tensor is passed as its ``(B,S,H,D)`` view
(``x.permute(0,2,1,3)``), outputs likewise. One launch (eighteenth session; issue 19: a Sage call
in two, the attention kernel being the second):

``sage_quant_kv``: (q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
[plan arguments], stream), 256 threads, grid ``launch_ctas``: the ticket CTAs, ``KS*B*H`` K-mean
tickets + ``kv_tickets(B*H, NU)`` (= ``2*B*H*NU + B*H*ceil(NU/REDO_UNITS)``) K/V tickets + NQT Q tiles, then
the plan CTAs. Variants (the runtime's ``plan`` parameter): ``noplan`` (no plan arguments, no plan
CTAs), ``cnt`` (q2k_block_index, block_counts, out_index, out_counts, summary, num_key_blocks,
split, num_out_blocks) and ``topk`` (q2k_block_index, out_index, out_counts, summary,
num_key_blocks, topk, split, num_out_blocks): the plan role, exactly ``plan_prepare`` (same
contract and outputs, ``aot/kernels/plan_prepare.py``), one row per warp: 8 rows per CTA, each
warp with 1/8 of the CTA's 32 KiB bitmap, while that holds a row's key blocks (``nkb <=
MAX_KEY_BLOCKS / 2``), else 4 (warps 4-7 idle, 8 KiB per row: ``sage_quant_schedule.plan_rows``;
the other roles' 5 KiB alias the bitmap), ceil(NQB/rows) CTAs per (b, h) of the plan, in the
order (row group, then h, then b); 8 rows took the K/V pass with the plan role from 149.9 to
147.8 us at H=14 S=37760 (run 87). The plan CTAs take no ticket and wait on nothing; one CTA in every ``plan_every`` of the
grid (by block index, ``interleave``) is one, so that they fill the K/V pass's waits. Every CTA
first triggers its grid's dependents (``griddepcontrol.launch_dependents``): the attention kernel
after it, a programmatic dependent launch on sm_90a, is dispatched once the last CTA has started
and waits for this grid's end on the GPU (``sm90/config.py: PDL``).

The workspace ``sync`` (``contract.sage_sync_words``) is the stream's own and is never refilled:
its 64-bit counter holds the tickets taken by the running launch (low half) and the launch's
epoch (high half); every statistics slot is {fp32 value, tag}, stored and loaded as one 64-bit
word, valid for this launch iff its tag is ``contract.sage_sync_tag(epoch)``; the CTA that takes
the last ticket sets the ticket count to 0 and advances the epoch (``take_ticket``). Until the
seventeenth session a first launch filled the workspace with a sentinel (SAGE_EMPTY) in every
call: 3.7 us of GPU time and one more host launch (~5-15 us) per call.
Each ticket CTA takes a ticket (an atomic counter: tickets follow the order in which CTAs start,
whatever the hardware's dispatch order). Tickets ``[0, KS*B*H)`` are the samples' partials, KS
per (b, h) (``sage_quant_roles.sample_part``: each a quarter of the sample keys): V's per-channel
amax into the head's sample rows (its V units, the next tickets, take their scale bound from
them: ``v_bound``), then K's fp32 sums in a fixed order into the first KS*B*H rows of ``sync``
(the K units of the head wait for them and add them up: ``k_mean``). Of the tickets after them,
every Q_EVERY-th ticket, while both last, is one of the
NQT = ceil(Sq/128)*B*H Q tiles (none when q has zero rows: the runtime's K/V-only pass for an
attention kernel that quantizes Q itself, sm_90a ``k*_qf_cnt``, with these same Q functions) (the K/V or Q tiles left over come after, in that order): 128 rows
(2 warps per scale group of 32); they wait on nothing and keep the memory busy while K/V CTAs
wait (run 37). The other tickets (``ticket_role``), in order, are K/V tickets ``t``. The K/V work
is 2*B*H *segments* (V of (b, h), then K of (b, h), head-major: ``kv_unit``), each NU =
ceil(NB/UNIT_BLOCKS) *units* of UNIT_BLOCKS 64-key blocks (warps 0-3 take the unit's first block,
warps 4-7 its second). K/V ticket ``t``:
  1. ``t < 2*B*H*NU``: flattened unit ``t``, read once (evict_first). A K unit is centred by the
     K mean (the sum of its head's partial rows, each slot waited for; unit 0 writes it to
     ``k_mean``) and quantized. A V unit publishes its statistics row (per channel its amax |V|),
     is quantized with ``v_scale_of(bound)`` (``v_unit``; its codes staged in shared memory and
     written a channel line at a time, ``store_v_unit``: run 101), and after a release fence publishes
     its done slot. The CTA of a group's last V unit (groups of STATS_GROUP units) reduces the
     group's rows into the segment's group row; that of the segment's last unit reduces the
     group rows into the segment's final row (the exact amax) and ``v_scale = v_scale_of(max(
     bound, amax))``, the scale the codes were made with unless a key exceeds the bound.
     Every statistics slot is stored with one relaxed store (value and tag together) and waited
     for slot by slot (relaxed loads until the tag is this launch's): no arrival counter (runs
     34-35). Rows are reduced in index order (split over the two warp groups, then the two
     halves in order): bit-identical results whatever the schedule, no float atomics.
  2. ``t >= 2*B*H*NU``: redo ticket ``t - 2*B*H*NU`` (``redo_ticket``: REDO_UNITS units of one
     head), after every unit: it reads its segment's final row and the bound; if some channel's
     amax exceeds its bound (a key off the sample above 4x the sample's amax: an outlier token),
     it waits for each unit's done slot (an acquire: the first codes are written, so the new
     ones overwrite them), reads the unit again and quantizes it with ``v_scale``. Otherwise it
     ends there (two rows read).
     Every wait is on slots of earlier tickets, whose CTAs have started and wait only on earlier
     tickets themselves, so every wait ends whatever the residency or dispatch order.
Why one read: V's scale (per-channel, over all keys) was needed before any V block could be
quantized, so until the nineteenth session each V unit was read twice, the second time ``lag``
tickets after the first (partly from L2): the K/V work moved ~630 MB at H=14 S=37760, 42 MB of it
V read again from DRAM, at 0.78 of the copy's rate, and its CTAs waited for their segment's
reductions (0.75 of copy for the whole quantizer, 0.66 for its K/V pass; bench run 90). A bound
known up front (from the K mean's sample) takes the second read and the waits out; the exact
amax is still reduced, for the redo decision and for ``v_scale`` where a key exceeds the bound.
Tried before and measured no faster (NOTES-sage-quant.md, runs 22-50): cp.async prefetch;
persistent CTAs looping over prefetched tickets; 16 % fewer instructions; owners holding their
unit in shared memory until the exact amax (single read; 30 % slower); an L2 set-aside for the
statistics reads; Q tiles spread evenly over all tickets; Q tiles after all K/V tickets (run 78).

Shapes (B batch, H heads, Sq/Sk lengths; NB = ceil(Sk/64); the V rows of a segment:
``contract.sage_v_rows``):
  q        bf16 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   16-byte aligned
  q_int8   int8 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  q_scale  f32  (B, H, ceil(Sq/128)*4) strides (sym, sym, 1)
  sync     int32 (N,)                workspace, N >= sage_sync_words(B, H, NB), 8-byte aligned
                                     (``contract.sage_sync_words``); zeroed once, never refilled
  k, v     bf16 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)
  k_mean   f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  v_scale  f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  k_int8   int8 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  k_scale  f32  (B, H, NB)           strides (sym, sym, 1)
  v_fp8    fp8e4m3 (B, H, 128, NB*64) strides (sym/16, sym/16, sym/16, 1)
  plan tensors: as ``plan_prepare`` (their B and H are q's)
A workspace smaller than the shape needs makes the ticket CTAs do nothing (no access out of bounds).

The public ``subblock_sage.quantize_sage(q, k, v, layout)`` returns a dict with keys
``q_int8`` (int8 [B,H,Sq,128] contiguous), ``q_scale`` (f32 [B,H,ceil(Sq/128)*4]),
``k_int8`` (int8 [B,H,Sk,128] contiguous), ``k_scale`` (f32 [B,H,ceil(Sk/64)]),
``v_fp8`` (float8_e4m3fn [B,H,128,ceil(Sk/64)*64] contiguous), ``v_scale`` (f32 [B,H,128]),
``k_mean`` (f32 [B,H,128]).
"""

from aot.contract import SAGE_K_MEAN_SPLIT, SAGE_KV_UNIT_BLOCKS, SAGE_STATS_GROUP  # (one definition)
from aot.kernels import plan_prepare, sage_quant_roles, sage_quant_sync
from aot.contract import sage_v_rows
from aot.kernels.sage_quant_schedule import (REDO_UNITS, interleave, k_part_row, kv_unit, launch_ctas, plan_every,
                                             plan_rows, redo_ticket, sync_guard, ticket_role)
from aot.registry import CompileSpec, Kernel, StreamArg, Sym, TensorArg, Variant

HEAD_DIM = 128
Q_GROUP = 32  # rows per Q scale
Q_TILE = 128  # q_scale holds 4 groups per 128 rows (the attention kernel's Q tile): the padding unit
K_BLOCK = 64  # keys per K scale
UNIT_BLOCKS = SAGE_KV_UNIT_BLOCKS  # 64-key blocks per ticket of sage_quant_kv; see the docstring
STATS_GROUP = SAGE_STATS_GROUP  # units per group row of the statistics
PLAN_ROWS = plan_prepare.WARPS  # plan rows per plan-role CTA (one warp each; all 8 warps when the bitmap allows: plan_rows)
KV_THREADS = 256  # sage_quant_kv: warps 0-3 and 4-7 each take one 64-key block of the unit
# shared memory of a quantizer CTA, in int32 words from the start of the one region (the plan
# role's bitmap in the plan variants): sStat (2 x 128 fp32), sRed (8 x 128), sAmax (8), sFlag
# (4: ticket, tag, a redo ticket's flag), sQAmax (8), sV8 (16 KiB); 16-byte aligned
SMEM_RED = 2 * 128
SMEM_AMAX = SMEM_RED + (KV_THREADS // 32) * 128
SMEM_FLAG = SMEM_AMAX + KV_THREADS // 32
SMEM_QAMAX = SMEM_FLAG + 4
SMEM_V8 = SMEM_QAMAX + KV_THREADS // 32  # a V unit's codes, staged (sV8: HEAD_DIM x V8_CHUNKS x 16 bytes)
V8_CHUNKS = UNIT_BLOCKS * K_BLOCK // 16  # 16-byte chunks of a channel's line in a V unit
SMEM_WORDS = SMEM_V8 + HEAD_DIM * V8_CHUNKS * 4
assert SMEM_V8 % 4 == 0  # (16-byte accesses)
Q_ROWS = (KV_THREADS // 64) * Q_GROUP  # 128 Q rows per Q tile of sage_quant_kv: one scale group per 2 warps
KV_HALF = KV_THREADS // 2
KV_K_WARPS = KV_HALF // 32
K_ROWS = K_BLOCK * (HEAD_DIM // 8) // KV_HALF  # 8 rows of 8 channels per K (and V) thread
# sage_quant_kv launch bound per target: 4 x 256 threads -> <= 64 registers on sm_90a (no local
# memory); the sm_100 / sm_120 ptxas spilled the single-pass kernel at 64 (8-24 B of frame), so
# there 3 CTAs (<= 80 registers; 71 used).
# tests/cpu/test_sage_quant_export.py checks both.
KV_CTAS_PER_SM = {"sm_90a": 4, "sm_100a": 3, "sm_100f": 3, "sm_120a": 3, "sm_120f": 3}
# With a launch bound (min_blocks_per_mp) the DSL queries the GPU at compile time unless a carveout
# is given; -1 = cudaSharedmemCarveoutDefault (the driver's choice, what a launch without the
# attribute gets): these kernels use ~1-41 KiB of shared memory and want the rest as L1.
SMEM_CARVEOUT_DEFAULT = -1
V_SCALE_MAX = 2.25
HI16 = -0x10000  # 0xFFFF0000 as an int32: the high bf16 of a packed pair, as an fp32 bit pattern
AMAX_FLOOR = 1.0e-7

TARGETS = ("sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f")


def perm16(i: int) -> int:
    """Physical column (within a 16-token group) of token i of that group (FlashInfer's layout)."""
    m = i % 16
    return (m // 8) * 2 + ((m // 2) % 4) * 4 + m % 2


# ---------------------------------------------------------------------------------------------
# CuTe-DSL kernels. The DSL is imported lazily so that the registry can be listed without it.


def _build():
    import cuda.bindings.driver as cuda

    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64

    def _select_i32(cond, a, b):
        return Int32(cutlass.select_(cond, Int32(a), Int32(b)))

    prepare_plan_row = plan_prepare.device_fns()
    roles = sage_quant_roles.device_fns()
    quantize_q_tile, v_stats_unit, reduce_rows = roles.quantize_q_tile, roles.v_stats_unit, roles.reduce_rows
    W = sage_quant_sync.device_fns()  # the workspace: ticket counter and statistics slots
    take_ticket, sync_row, sync_vrow, poll_v, publish_v = W.take_ticket, W.sync_row, W.sync_vrow, W.poll_v, W.publish_v
    fence_gpu = W.fence_gpu
    VSLOT, VROW_BYTES = W.VSLOT, W.VROW_BYTES  # bytes per V statistics slot / row
    l2_policy, div_full, block_rows = roles.l2_policy, roles.div_full, roles.block_rows
    quantize_k_block, quantize_v_block, store_v_unit = roles.quantize_k_block, roles.quantize_v_block, roles.store_v_unit
    sample_part, v_bound, k_mean_of_parts = roles.sample_part, roles.v_bound, roles.k_mean_of_parts

    def v_scale_of(amax):
        """``v_scale`` from a channel's amax |V| (FlashInfer's ``max(amax, 1e-7) / 2.25``): one
        definition for the reducer, which stores it, and the quantize steps, which invert it."""
        return div_full(cute.arch.fmax(amax, Float32(AMAX_FLOOR)), Float32(V_SCALE_MAX))

    # ---------------------------------------------------------------- the one launch
    class SageQuantKV:
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
        def launch(self, q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                   mIdx, mCnt, mOut, mOutCnt, mSum, nkb: Int32, topk: Int32, split: Int32, nout: Int32,
                   stream: cuda.CUstream):
            nu = ((k.shape[1] + K_BLOCK - 1) // K_BLOCK + UNIT_BLOCKS - 1) // UNIT_BLOCKS
            n_q = (q.shape[1] + Q_ROWS - 1) // Q_ROWS * q.shape[2] * q.shape[0]  # Q tiles
            n_plan = Int32(0)
            if cutlass.const_expr(mIdx is not None):
                rows = plan_rows(nkb, KV_THREADS // 32, PLAN_ROWS, select=_select_i32)
                n_plan = (mIdx.shape[2] + rows - 1) // rows * mIdx.shape[1] * mIdx.shape[0]
            n_tickets, n_grid = launch_ctas(k.shape[0] * k.shape[2], nu, n_q, n_plan)
            self.kernel(q, q_int8, q_scale, k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, sync,
                        n_tickets, n_plan, mIdx, mCnt, mOut, mOutCnt, mSum, nkb, topk, split, nout).launch(
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
            # sm_120a at 3 CTAs per SM; the quantizer's 5 KiB alias its start.
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
                                    sFlag, sQAmax, sV8)
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
                   nu, rows, nbt, tidx, warp, lane, ch, sStat, sRed, sAmax, sFlag, sQAmax, sV8):
            """Ticket ``tr`` after the K-mean tickets: a Q tile, a K or V unit or a redo ticket
            (``ticket_role``, ``kv_unit``, ``redo_ticket``)."""
            B = mK.shape[0]
            H = mK.shape[2]
            is_q, i, tk = ticket_role(tr, n_kv, n_q, select=_select_i32, minimum=cutlass.min)
            if is_q != 0:
                hb = i // nq_tile
                bq = hb // H
                quantize_q_tile(mQ, mQ8, mQS, bq, hb - bq * H, i - hb * nq_tile, warp, lane, sQAmax)
                tk = Int32(-1)  # (no K/V work)
            if tk >= 0 and tk < nbt:
                hb, is_k, un = kv_unit(tk, nu)
                bb = hb // H
                hh = hb - bb * H
                if is_k == 1:
                    self.quantize_k_unit(mK, mK8, mKS, mKMean, sync_row(mSync, k_part_row(hb)), un, bb, hh,
                                         un * UNIT_BLOCKS + tidx // KV_HALF, tidx, warp, lane, sStat, sAmax, sFlag)
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
                            sFlag):
            """Block ``blk`` of unit ``un`` of K(b, h), each warp group its own: the K mean (the sum
            of the head's K-mean partial rows at ``parts``, each slot waited for: earlier tickets;
            unit 0 also writes it to ``k_mean``) goes to shared memory, its rows are loaded
            (evict_first: the only read of these lines), then the block is centred and quantized.
            (The mean before the loads: after them ptxas spilled 8 bytes at the 64-register bound.)"""
            if tidx < KV_HALF:
                m = k_mean_of_parts(parts, mK.shape[1], tidx, sFlag[1])
                sStat[0, tidx] = m
                if un == 0:
                    mKMean[b, h, tidx] = m
            pol = l2_policy("evict_first")
            vals = block_rows(mK, b, h, blk, tidx, pol)
            cute.arch.sync_threads()
            quantize_k_block(vals, mK8, mKS, b, h, blk, mK.shape[1], tidx, warp, lane, sStat, sAmax, pol)

    return SageQuantKV


_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build()
    return _CLASSES


# ---------------------------------------------------------------------------------------------
# Argument specs


def _s(key: str, div: int = 1) -> Sym:
    return Sym(key, div=div, width=64)


B = Sym("B")
H = Sym("H")
SQ = Sym("Sq")
SK = Sym("Sk")


def _bshd(name: str, dtype: str, seq: Sym, div: int) -> TensorArg:
    return TensorArg(
        name,
        dtype,
        (B, seq, H, HEAD_DIM),
        (_s(f"{name}.stride_b", div), _s(f"{name}.stride_s", div), _s(f"{name}.stride_h", div), 1),
        align=16,
    )


def _bhx(name: str, last: int | Sym, div: int = 1, align: int = 4) -> TensorArg:
    return TensorArg(
        name, "float32", (B, H, last), (_s(f"{name}.stride_b", div), _s(f"{name}.stride_h", div), 1), align=align
    )


# variants of sage_quant_kv: name -> its "plan" parameter (what the runtime selects by)
PLAN_VARIANTS = {"noplan": "none", "cnt": "counts", "topk": "topk"}


def _sync() -> TensorArg:
    return TensorArg("sync", "int32", (Sym("NSync"),), (1,), align=8)  # 8: the 64-bit counter and slots


def _args_kv(plan: str = "none") -> list:
    args = [
        _bshd("q", "bfloat16", SQ, 8),
        _bshd("q_int8", "int8", SQ, 8),
        _bhx("q_scale", Sym("Gq")),
        _bshd("k", "bfloat16", SK, 8),
        _bshd("v", "bfloat16", SK, 8),
        _bhx("k_mean", HEAD_DIM, 4, 16),
        _bhx("v_scale", HEAD_DIM, 4, 16),
        _bshd("k_int8", "int8", SK, 8),
        _bhx("k_scale", Sym("NBk")),
        TensorArg(
            "v_fp8",
            "float8_e4m3fn",
            (B, H, HEAD_DIM, Sym("Skp", div=K_BLOCK)),
            (_s("v_fp8.stride_b", 16), _s("v_fp8.stride_h", 16), _s("v_fp8.stride_d", 16), 1),
            align=16,
        ),
        _sync(),
    ]
    if plan != "none":
        args += plan_prepare.plan_args(plan == "counts")
    return [*args, StreamArg()]


def _spec_kv(target: str, variant: Variant) -> CompileSpec:
    cls = _classes()(KV_CTAS_PER_SM[target])
    plan = variant.params["plan"]
    fn = {"none": cls.run_noplan, "counts": cls.run_cnt, "topk": cls.run_topk}[plan]
    return CompileSpec(fn, _args_kv(plan))


KERNELS: list[Kernel] = [
    Kernel(
        "sage_quant_kv",
        "a Sage call's one quantizer launch (ticket-ordered CTAs): bf16 Q -> INT8 + a scale per 32 rows; the K "
        "mean of 512 sampled keys; K smoothed, INT8 per 64 keys; V amax/2.25 per channel, FP8-E4M3 transposed "
        "HDS with the 16-token permutation; variants cnt/topk also do the plan_prepare role",
        TARGETS,
        tuple(Variant(name, {"plan": plan}) for name, plan in PLAN_VARIANTS.items()),
        _spec_kv,
    ),
]
