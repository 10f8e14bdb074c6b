"""The router kernels' compile-time geometry: CTA shapes, staged-tile layouts, the radix
histogram, and the sentinel of a cell pair with no real token. No CuTe-DSL import (the registry
and the CPU tests read these)."""

from aot.contract import HEAD_DIM
from aot.kernels.router.spec import ROUTER_N_VALUES, SELECT_TILE_CELLS

POOL_WARPS = 8  # cells per pooling CTA (one warp each)
TI = 8  # query blocks per router_select CTA (one warp each)
TJ = 32  # key blocks per key tile (one per lane)
DC = 32  # channels per staged chunk of the key tile
KPAD = DC + 4  # floats per staged key-cell row: 16-byte lane reads hit disjoint banks
VEC = 8  # bf16 per 16-byte global load
NEG = -1.0e30  # "no valid pair" (SGLang's sentinel): exp2(NEG - m) = 0 for any real m
HIST = 256  # radix bins per warp
MMA_WARPS = 4  # router_select (mma): warps per CTA, 16 query cells each
MMA_CELLS = SELECT_TILE_CELLS  # query cells per CTA, and key cells per staged key tile
assert MMA_CELLS == 16 * MMA_WARPS  # one m16 fragment row block per warp
WROW = HEAD_DIM // 2 + 4  # 32-bit words per staged cell row (68: 4 words of padding)
ROW_WORDS = 2 * MMA_CELLS * WROW // MMA_WARPS  # a warp's row buffer in the staged tiles' memory: 2176 keys
QSTEPS_MAX = max(ROUTER_N_VALUES).bit_length() - 1  # shuffles over a query block's rows: log2 n_q <= 3
