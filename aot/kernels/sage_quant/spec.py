"""The Sage quantizer's geometry and numerics constants, without CuTe-DSL: what the registry, the
tests and the device modules of this package share (the runtime's side of the contract, the
workspace's words and the K-mean sample, is ``python/subblock_sage/contract.py``).
"""

from aot.contract import HEAD_DIM
from aot.contract import SAGE_KV_UNIT_BLOCKS as UNIT_BLOCKS  # 64-key blocks per K/V unit (one ticket)
from aot.contract import SAGE_SYNC_VROW_WORDS
from aot.contract import TARGET_NAMES as TARGETS  # every target ships the quantizer
from aot.contract import TARGETS as _TARGET_TABLE
from aot.kernels import plan_prepare
from aot.kernels.sage_numerics.consts import AMAX_FLOOR, HI16, NCC, Q_GROUP, Q_ROWS, VEC  # noqa: F401
from aot.runtime.router_spec import CELL_TOKENS  # not aot.kernels.router: the router package is no input


# FlashInfer's operand contract (tests/cpu/test_flashinfer_layout.py compares these with its source)
Q_TILE = 128  # q_scale holds 4 groups per 128 rows (the attention kernel's Q tile): the padding unit
K_BLOCK = 64  # keys per K scale
V_SCALE_MAX = 2.25  # v_scale = max(amax, AMAX_FLOOR) / V_SCALE_MAX
# Q_GROUP, AMAX_FLOOR, Q_ROWS, VEC, NCC, HI16: aot/kernels/sage_numerics/consts.py (shared with sm90)

KV_THREADS = 256  # warps 0-3 and 4-7 each take one 64-key block of a K/V unit
KV_HALF = KV_THREADS // 2
KV_K_WARPS = KV_HALF // 32
assert Q_ROWS == (KV_THREADS // 64) * Q_GROUP  # one Q scale group per 2 warps of a Q tile
K_ROWS = K_BLOCK * (HEAD_DIM // 8) // KV_HALF  # 8 rows of 8 channels per K (and V) thread
KM_BATCH = 8  # sampled rows in flight per thread of a K-mean ticket (32 registers of bf16)
# The pooling role (variant pool, ``pool.py``): the router's default cell, 16 tokens, is one warp's
# rows in a Q tile (half a scale group) and in a K block (two threads' 8 rows)
POOL_CELL = CELL_TOKENS
assert POOL_CELL == Q_GROUP // 2 == 2 * K_ROWS
PLAN_ROWS = plan_prepare.WARPS  # plan rows per plan-role CTA (one warp each; up to all 8: schedule.plan_rows)

# Shared memory of a quantizer CTA, in int32 words from the start of its one region (the plan
# role's bitmap in the plan variants): sStat (2 x 128 fp32), sRed (8 x 128), sAmax (8), sFlag (4:
# ticket, tag, a redo ticket's flag), sQAmax (8), sV8 (a V unit's codes, staged: HEAD_DIM x
# V8_CHUNKS x 16 bytes); 16-byte aligned.
SMEM_RED = 2 * 128
SMEM_AMAX = SMEM_RED + (KV_THREADS // 32) * 128
SMEM_FLAG = SMEM_AMAX + KV_THREADS // 32
SMEM_QAMAX = SMEM_FLAG + 4
SMEM_V8 = SMEM_QAMAX + KV_THREADS // 32
V8_CHUNKS = UNIT_BLOCKS * K_BLOCK // 16  # 16-byte chunks of a channel's line in a V unit
SMEM_WORDS = SMEM_V8 + HEAD_DIM * V8_CHUNKS * 4
assert SMEM_V8 % 4 == 0  # (16-byte accesses)
# the pooling role's K chains (``pool.pool_k_sums``: 256 fp32 per warp) use a K unit's free sV8
assert (KV_THREADS // 32) * 2 * HEAD_DIM <= HEAD_DIM * V8_CHUNKS * 4

# The launch bound per target: 4 CTAs of 256 threads -> at most 64 registers on sm_90a, with no
# local memory; the sm_100 / sm_120 ptxas spills this kernel at 64 (8-24 bytes of frame), so there
# 3 CTAs (at most 80 registers; 71-80 used). tests/cpu/test_sage_quant_export.py checks both. A new
# target gets 3 unless it is an SM 90 one (the bound that no ptxas measured here spills at).
KV_CTAS_PER_SM = {t: 4 if _TARGET_TABLE[t].sm == 90 else 3 for t in TARGETS}
# The pooling variant (``pool.py``) at 3 CTAs on every target (at most 80 registers): at sm_90a's 4
# (64 registers) ptxas spills it, 8-360 bytes of stack in every arrangement of the pooling roles
# tried (``ptxas -v``: the K unit's 8 rows stay live from the pooling sums to their quantization).
POOL_CTAS_PER_SM = {t: 3 for t in KV_CTAS_PER_SM}
# With a launch bound the DSL queries the GPU at compile time unless a carveout is given; -1 =
# cudaSharedmemCarveoutDefault (the driver's choice, what a launch without the attribute gets):
# the kernel uses 21 KiB of shared memory (SMEM_WORDS; 32 KiB in the plan variants, the plan
# role's bitmap) and leaves the rest to L1.
SMEM_CARVEOUT_DEFAULT = -1

# The workspace's statistics slots (python/subblock_sage/contract.py: their words)
SLOT = 8  # bytes per K-mean slot: {fp32 value, tag}
VSLOT = 4  # bytes per V statistics slot: a bf16-exact fp32 value with the tag's low 16 bits
VROW_BYTES = SAGE_SYNC_VROW_WORDS * 4  # bytes per V statistics row (128 slots)


def perm16(i: int) -> int:
    """Physical column (within a 16-token group) of token i of that group (FlashInfer's layout)."""
    m = i % 16
    return (m // 8) * 2 + ((m // 2) % 4) * 4 + m % 2
