"""SM90a (Hopper) block-sparse attention kernels in CuTe-DSL: BF16 and Sage (INT8 QK, FP8 PV).

One CTA per (64-row query block, head, batch) in one of three shapes (``config.py``): flat (one
warpgroup that issues its own TMA loads; three or four CTAs per SM), or warp-specialised
(warpgroup 0 is the TMA producer, one or two consumer warpgroups run warpgroup MMA for Q.K^T and
P.V with the online softmax in FP32, exp2 and the softmax scale folded in).

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

Layout of the package (by concern; importing it does not import CuTe-DSL):
- ``config.py``: the frozen ``Sm90Config``, its ``can_implement`` and the measured defaults.
- ``variants.py``: the registry entries (``KERNELS``): variants, argument specs, compile specs.
- ``kernel.py``: ``Sm90SparseAttention``: host side, shared memory, pipelines, dispatch.
- ``producer.py`` (TMA loads), ``consumer.py`` (warp-specialised MMA mainloop), ``flat.py`` (flat
  mainloop), ``softmax.py``, ``epilogue.py``, ``layout.py`` (fragment views): its mixins.
- Timing experiments on these kernels (subclasses and extra variants, some wrong on purpose)
  live outside this package, in ``aot/experiments/sm90``: built only on request, never shipped.

To run (no GPU needed to build; the kernels run on H100/H200/GH200):

.. code-block:: bash

    # export + link the sm_90a library only (CMake drives `python -m aot.export`)
    cmake -S . -B build -G Ninja -DSBS_PYTHON=wheels/.buildenv/bin/python -DSBS_TARGETS=sm_90a
    cmake --build build
    # the same library with the timing experiments (aot/experiments) added: never shipped
    cmake -S . -B build-exp -G Ninja -DSBS_PYTHON=wheels/.buildenv/bin/python -DSBS_TARGETS=sm_90a \\
          -DSBS_EXPERIMENTS=ON
    # on the H200: the kernels' tests
    pytest tests/gpu/test_sm90_attention.py

Constraints:
- sm_90a only (WGMMA, TMA, ``setmaxnreg``); head dim 128; query block 64 rows.
- Key blocks of 64 or 128 keys; the flat shape and ``pair`` are built for Sage only
  (``Sm90Config.can_implement`` says why a combination is refused).
- The 128-key flat Sage kernels launch as two-CTA clusters (``config.FLAT_CLUSTER``) and take
  prepared plans (each row's ids distinct, in range and ascending: what the runtime's plan
  preparation writes). A raw plan cannot make them read or write out of bounds or hang, but a row
  counted dense (>= the key blocks) next to another one is computed with the even row's ids; the
  one-CTA kernels ``k128_c1[qf]_cnt`` take raw plans.
- Tensors as in the argument specs of ``variants.py``: last dim contiguous, 16-byte aligned
  strides and data pointers (TMA); the runtime checks these before every launch.
"""

from .variants import KERNELS

# CPU cost of one export of this module against one of the Sage quantizer's (1; measured
# 2026-12-01): aot/export/plan.py starts the heaviest export processes first.
EXPORT_WEIGHT = 6

__all__ = ["EXPORT_WEIGHT", "KERNELS"]
