"""The constants of the Sage Q numerics (``ptx.py``, ``q_tile.py``), without CuTe-DSL; the
quantizer's other geometry is ``aot/kernels/sage_quant/spec.py``, which re-exports these."""

from aot.contract import HEAD_DIM

# FlashInfer's operand contract (tests/cpu/test_flashinfer_layout.py compares these with its source)
Q_GROUP = 32  # rows per Q scale
AMAX_FLOOR = 1.0e-7  # scale = max(amax, AMAX_FLOOR) / 127 (Q, K); / V_SCALE_MAX (V)
Q_ROWS = 4 * Q_GROUP  # 128 Q rows per Q tile: one scale group per 2 warps of 16 rows, 8 warps
VEC = 8  # bf16 elements per 16-byte load
NCC = HEAD_DIM // VEC  # 16 column chunks per row
HI16 = -0x10000  # 0xFFFF0000 as an int32: the high bf16 of a packed pair, as an fp32 bit pattern
