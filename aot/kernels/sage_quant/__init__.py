"""The Sage quantizer (CuTe-DSL): bf16 Q/K/V -> the operands of the Sage attention kernels, in one
launch per call, ``sage_quant_kv``.

Contract: the operands of FlashInfer 0.7.2.post1's SM120 Sage kernel
(``BlockSparseAttnForwardSageSm120Blk64``, quantized by its Triton
``cute_dsl/sparse/bsa_utils/sage_quant_sm120.py``), which the sm_90a Sage kernels consume too.

* Q: symmetric INT8, one scale per 32 rows. ``scale = max(amax, 1e-7) / 127``,
  ``code = clamp(rint(q / scale), -127, 127)``. ``q_scale`` has ``ceil(Sq/128)*4`` groups per
  (b, h); groups wholly past Sq (pad groups) get ``1e-7 / 127``. Q is not smoothed.
* K: centred by a per-channel mean of K (per b, h), then INT8 with one scale per 64 keys; the
  amax is taken over the centred values of the valid rows only. The mean is that of a strided
  sample of keys (``contract.sage_k_mean_rows``: all keys up to SAGE_K_MEAN_ROWS = 512, else 512
  keys ``Sk // 512`` apart), kept in fp32 and returned as ``k_mean``.
* V: FP8-E4M3 (round to nearest even, satfinite), per-channel ``v_scale = max(amax|V|, bound,
  1e-7) / 2.25`` (amax over all keys; ``bound``: ``contract.SAGE_V_BOUND_MARGIN`` = 4x the amax
  over the K mean's sample keys), stored transposed ``[B, H, 128, round_up(Sk, 64)]`` with
  FlashInfer's 16-token row permutation: token ``t = 64*blk + 16*g + i`` lands at column
  ``64*blk + 16*g + PERM16[i]``, ``PERM16[i] = (i%16//8)*2 + (i//2%4)*4 + i%2`` (``perm16``).
  Columns of tokens >= Sk are exact zeros (+0.0, byte 0x00).
* Codes are ``x * (1/scale)``, and every division (scales, their inverses, the K mean) is
  ``div.full.f32`` (within 2 ulp): a code can differ from FlashInfer's by one INT8 / E4M3 step at
  a rounding tie, a scale by ~2.4e-7 relative.

Where this differs from FlashInfer, and why:
- The K mean is that of 512 sample keys, not of all Sk. Softmax is invariant to a per-channel
  shift of K, so the mean only decides where each block's INT8 range is centred; a 512-key sample
  lies ~0.044 sigma from the exact mean, which moves a block's amax by at most that. In return K
  is read once and no K unit waits for statistics over every key.
- V's scale is at least ``bound``. E4M3 keeps its relative precision at any scale, so a larger
  scale costs only the subnormal range, values under ~1/36 of the amax; known before V is read,
  the bound lets every V unit be quantized in its only read. A head with a key above its bound
  (an outlier token off the sample) is quantized again with its exact amax (the redo tickets).
  Read twice, V moves 42 MB more from DRAM at H=14 S=37760 and its CTAs wait for their head's
  reductions: the quantizer takes 0.191 ms instead of 0.185 there, 0.402 instead of 0.371 at
  S=75776 (H200; MEASUREMENTS.md, 2026-12-02: "V read once by the Sage quantizer").
- FlashInfer rounds the K mean to bf16 before subtracting it; it is fp32 here.

Tensors (canonical mode order: a BHSD tensor is passed as its ``(B,S,H,D)`` view,
``x.permute(0,2,1,3)``; NB = ceil(Sk/64); the V rows of a segment: ``contract.sage_v_rows``):
  q        bf16 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   16-byte aligned
  q_int8   int8 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  q_scale  f32  (B, H, ceil(Sq/128)*4) strides (sym, sym, 1)
  k, v     bf16 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)
  k_mean   f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  v_scale  f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  k_int8   int8 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  k_scale  f32  (B, H, NB)           strides (sym, sym, 1)
  v_fp8    fp8e4m3 (B, H, 128, NB*64) strides (sym/16, sym/16, sym/16, 1)
  sync     int32 (N,)                the stream's workspace, N >= ``contract.sage_sync_words(B, H,
                                     NB)``, 8-byte aligned; zeroed once, never refilled
  plan tensors (variants cnt / topk): as ``plan_prepare`` (their B and H are q's)
  pooled_q bf16 (B, H, CQ, 128)      strides (sym/8, sym/8, sym/8, 1)   variant pool; q_int8 then
  pooled_k bf16 (B, H, CK, 128)      strides (sym/8, sym/8, sym/8, 1)   has Sq or 0 rows
  q_pool_scale float32               softmax_scale * log2 e
The runtime's ``subblock_sage.quantize_sage(q, k, v, layout)`` returns them as a dict: ``q_int8``
(int8 [B,H,Sq,128]), ``q_scale``, ``k_int8`` (int8 [B,H,Sk,128]), ``k_scale``, ``v_fp8``
(float8_e4m3fn [B,H,128,NB*64]), ``v_scale``, ``k_mean``.

The launch (``kernel.py``; the schedule as integer functions: ``schedule.py``): 256 threads per
CTA, grid ``schedule.launch_ctas``: the ticket CTAs, then the plan CTAs (plan variants), spread
over the grid by block index (``plan_every``).
- Every CTA first triggers its grid's dependents (``griddepcontrol.launch_dependents``): the
  attention kernel after it, a programmatic dependent launch on sm_90a, is dispatched once the
  last CTA has started and waits for this grid's end on the GPU (``sm90/config.py: PDL``).
- A ticket CTA takes a ticket from the workspace's counter (``sync.py``): tickets follow the order
  in which CTAs start. Tickets ``[0, SAGE_K_MEAN_SPLIT*B*H)`` are the sample partials,
  SAGE_K_MEAN_SPLIT per (b, h) (``roles.sample_part``): V's per-channel amax of the sample (the head's V units take
  their bound from it) and K's fp32 sums (the head's K units add them up: the K mean).
- Of the tickets after them, one in every ``Q_EVERY`` is a Q tile while both last (128 rows; none
  when q has no rows: the K/V-only pass for the sm_90a kernels that quantize Q themselves with
  ``q_tile``'s functions). Q tiles wait on nothing and keep DRAM busy while K/V CTAs wait.
- The other tickets, in order, are K/V tickets: 2*B*H segments (V of (b, h), then K of (b, h),
  ``schedule.kv_unit``) of NU = ceil(NB/UNIT_BLOCKS) units of UNIT_BLOCKS 64-key blocks (warps
  0-3 the unit's first block, 4-7 its second), each read once (evict_first). A K unit is centred
  by the K mean and quantized. A V unit publishes its per-channel amax row, is quantized with the
  bound's scale (its codes staged in shared memory and written a channel line at a time), and
  publishes its done slot after a release fence; the CTA of a group's last unit (STATS_GROUP
  units) reduces the group's rows, that of the segment's last unit the group rows into the
  exact amax and ``v_scale``.
- Then the redo tickets (``schedule.redo_ticket``: REDO_UNITS units of one head): each reads its
  head's exact amax and bound; only if an amax exceeds its bound does it wait for each unit's
  done slot (acquire), read the unit again and overwrite its codes.
- Variant pool (``pool.py``): the Q tiles and K units also write the router's pooled cells
  (``router_pool``'s ``pooled_q``, ``pooled_k``, bit for bit) from the rows they load, so a
  routed Sage call reads Q and K once; its Q tiles quantize Q only when ``q_int8`` has rows
  (else they only pool: the sm_90a Q-fused call). 3 CTAs per SM on every target.
- Plan CTAs (variants cnt / topk) take no ticket and wait on nothing: ``plan_prepare``'s rows,
  one per warp, 8 rows per CTA while a row's key blocks fit an eighth of the 32 KiB bitmap (else
  4: ``schedule.plan_rows``). At H=14 S=37760 on the H200, 8 rows take the K/V pass with the plan
  role from 149.9 to 147.8 us (MEASUREMENTS.md, 2026-12-02: "8 plan rows per plan CTA").
- Every statistic is reduced in a fixed order (no float atomics): bit-identical results whatever
  the schedule. Every wait is on slots of earlier tickets, whose CTAs have started and wait only
  on earlier tickets themselves, so every wait ends whatever the residency or dispatch order.
- The workspace is never refilled (its slots carry the launch's tag): a fill launch would cost a
  Sage call one more host launch, and this one launch takes 2-5 us less GPU time than a fill
  launch and the quantizer (H=4 S=8192 to H=14 S=37760, H200; MEASUREMENTS.md, 2026-12-02: "a
  Sage call in two launches").

Constraints:
- Head dim 128 (static), last dim contiguous, rows 16-byte aligned; every other extent and stride
  symbolic. Sq may be 0 (the K/V-only pass).
- ``sync`` must hold ``contract.sage_sync_words`` words; a smaller one makes the ticket CTAs do
  nothing (no access out of bounds). One launch at a time per workspace (the runtime keeps one per
  stream).
- Every target of ``TARGETS`` ships it, compiled under a launch bound (``KV_CTAS_PER_SM``) without
  local memory (tests/cpu/test_sage_quant_export.py).

To build and test (no GPU needed to build; the kernel runs on sm_90a, sm_100 and sm_120):

.. code-block:: bash

    # one target's library (CMake drives `python -m aot.export`; the quantizer is in every one)
    cmake -S . -B build -G Ninja -DSBS_PYTHON=wheels/.buildenv/bin/python -DSBS_TARGETS=sm_90a
    cmake --build build
    # the four variants alone, as objects in OUT
    wheels/.buildenv/bin/python -m aot.export unit --module aot.kernels.sage_quant --target sm_90a \\
        --out OUT --unit sage_quant_kv:noplan --unit sage_quant_kv:cnt --unit sage_quant_kv:topk \\
        --unit sage_quant_kv:pool
    # the schedule and the exports (CPU), the numerics against the reference (GPU)
    pytest tests/cpu/test_sage_quant_tickets.py tests/cpu/test_sage_quant_export.py tests/gpu/test_quantize.py

Layout of the package (imported top-down; importing the package does not import CuTe-DSL):
- ``spec.py``: constants and launch geometry; ``schedule.py``: which CTA does what;
  ``variants.py``: the registry entry (``KERNELS``), argument specs and compile spec.
- CuTe-DSL: ``sync.py`` (the workspace's tickets and slots), ``roles.py`` (the K/V roles' device
  code), ``pool.py`` (the pooling role), ``kernel.py`` (``SageQuantKV``: entry points, launch,
  dispatch).
- Shared with the sm_90a Q-fused kernels, in ``aot/kernels/sage_numerics`` (a package of its own,
  so that an edit here re-exports only the quantizer): ``ptx.py`` (inline PTX), ``q_tile.py`` (the
  Q numerics) and their constants (``consts.py``, re-exported by ``spec.py``).
"""

from .spec import HEAD_DIM, K_BLOCK, KV_CTAS_PER_SM, KV_THREADS, Q_GROUP, Q_TILE, TARGETS, V_SCALE_MAX, perm16
from .variants import KERNELS, PLAN_VARIANTS, POOL_VARIANT, kv_args

__all__ = ["HEAD_DIM", "KERNELS", "KV_CTAS_PER_SM", "KV_THREADS", "K_BLOCK", "PLAN_VARIANTS", "POOL_VARIANT",
           "Q_GROUP", "Q_TILE", "TARGETS", "V_SCALE_MAX", "kv_args", "perm16"]
