"""The Sage Q numerics, shared by the quantizer (``aot/kernels/sage_quant``) and the sm_90a Sage
kernels that quantize their own Q tile (``aot/kernels/sm90/flat.py``, ``q_fused``): ``consts.py``
(the constants they need, without CuTe-DSL), ``ptx.py`` (inline PTX), ``q_tile.py`` (one 32-row
scale group of Q quantized by two warps).

A package of its own, and not part of ``sage_quant``, because an export's cache key covers every
repository file its process imports (aot/export/identity.py): importing ``sage_quant.ptx`` runs
``sage_quant/__init__.py`` and its registry entry, so every edit of the quantizer package
recompiled the 12 shipped sm_90a attention exports too (32 exports instead of 20; 121 s instead of
38.6 s for ``SBS_HOST_ARCHES=x86_64 ./wheels/build.sh`` on the build machine; MEASUREMENTS.md,
2026-12-07: "The loop"). Here the sm_90a kernels import only the three files whose code they run.
This file stays a docstring: every importer of the numerics imports it.
"""
