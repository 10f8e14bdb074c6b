"""cuDNN frontend 1.32.0's SM90 block-sparse attention forwards, AOT-compiled into the test library.

Bench contenders (never shipped): NVIDIA's own answer to our workload, which its wrapper
(``cudnn.block_sparse_attention``) JIT-compiles with the CuTe DSL at the first call. The H200 has
no room for the DSL (486 MB installed, 64 MiB per device call), so this build compiles the classes
for it, each with exactly what the public wrapper builds for our shapes (B, H, S, D = 128, one
query head per K/V head, bf16 inputs; ``tests/cpu/test_cudnn_sm90_aot.py`` runs the wrapper under
a torch fake mode against the specs below):

- ``cudnn_bsa_sm90_bf16/blk64``: ``block_sparse_attention_forward(q, k, v, index,
  q2k_block_nums=counts, sparse_block_size=64, allow_empty_block_nums=True, layout="bshd")`` on
  SM90 -> ``BlockSparseAttnForwardSm90Blk64(gqa_ratio=1, head_dim=128, value_dim=128, 64, 64,
  BFloat16, Float32, has_block_sizes=False, num_splits=1, allow_empty_block_nums=True)``. The
  wrapper passes ``kv_splits=1`` unless asked for ``"auto"``, and its ``"auto"`` heuristic
  (``_sm90_blk64_auto_kv_splits``) also answers 1 on every bench shape: with per-row counts it is
  never consulted, and with fixed counts it splits only when a head's K/V (512 bytes a key: 19.3 MB
  at S = 37760) exceeds 3/4 of L2 (37.5 MiB on a 50 MiB H100/H200). So one export, split-free:
  no FP32 partials, no combine kernel. The kernel writes LSE (the wrapper always allocates it);
  the counts tensor is passed where the kernel takes variable block sizes and split offsets too,
  as the wrapper does when it has neither.
- ``cudnn_sage_sm90_fp8/blk64`` and ``/blk128``: ``block_sparse_attention_fp8_forward(q, k, v,
  index, block_sparse_num, sparse_block_size=64|128)`` on SM90 -> the quantizer below, then
  ``BlockSparseAttnForwardFp8Sm90Blk64(num_sms)`` / ``BlockSparseAttnForwardFp8Sm90Blk128()`` on
  contiguous E4M3 Q/K (BHSD), V (BHDS), per-token Q scales, per-16-key K scales, per-channel V
  scales, a fixed count per query block (``Int32``) and full key blocks only (S a multiple of the
  key block). The blk64 class is a persistent kernel sized by the SM count at construction:
  compiled for :data:`NUM_SMS` = 132 (H100 SXM and H200); the launcher refuses another count.
- ``cudnn_sage_quant_sm90/bhds``: ``_quantize_sage_bhsd(q, k, v, v_layout="bhds")`` ->
  ``_SageFp8Quantizer(is_sm90=True, v_layout="bhds")``, five kernels in one call (Q per token, K
  smoothed by its per-head mean then per 16 keys, V per channel and transposed to BHDS), on
  flattened contiguous tensors. It is the wrapper's own quantization step, a CuTe-DSL program of
  its own: the Sage contender times it with the attention kernel, as the wrapper runs it.

Every tensor is marked as the wrapper marks it (``from_dlpack(...).mark_layout_dynamic(leading_dim
=...)``): every extent dynamic and independent, 64-bit dynamic strides except the unit one, the
wrapper's assumed alignment (128 bytes for bf16 Q/K/V/O, 16 for FP8, the element size for the
plan). The C ABI takes the CuTe-order views the wrapper builds (``permute``), which the launcher
(``python/subblock_sage/tools/cudnn_sm90.py``) builds the same way. The wrapper compiles without
TVM-FFI (``enable_tvm_ffi=False``): the same plain CuTe ABI as our exports. Upstream imported by
:mod:`aot.upstream.cudnn_import` (never copied here).
"""

from __future__ import annotations

import contextlib
from typing import Any

from aot.contract import HEAD_DIM
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant
from aot.upstream import cudnn_import

UPSTREAM = cudnn_import.UPSTREAM
NUM_SMS = 132  # SMs of an H100 SXM and an H200: the blk64 FP8 kernel's persistent grid

# BlockSparseAttnForwardSm90Blk64(**BF16_CTOR) (dtype and acc dtype are added as DSL types), as
# _interface._bsa_attn_fwd_sm90_blk64 constructs it for BSHD bf16 MHA with per-row counts
BF16_CTOR: dict[str, Any] = {
    "gqa_ratio": 1, "head_dim": HEAD_DIM, "value_dim": HEAD_DIM, "blocksparse_blocksize_q": 64,
    "blocksparse_blocksize_k": 64, "has_block_sizes": False, "num_splits": 1,
    "allow_empty_block_nums": True,
}
# _SageFp8Quantizer(**QUANT_CTOR), as _quantize_sage_bhsd constructs it on SM90 for the SM90 Sage path
QUANT_CTOR: dict[str, Any] = {"is_sm120": False, "v_block_size": 0, "v_layout": "bhds", "is_sm90": True}
# the quantizer's chunking on SM90 (_SageFp8Quantizer.SM90_ROWS_PER_CHUNK) and K scale group
QUANT_ROWS_PER_CHUNK = 64
K_SCALE_ROWS = 16


def _marked(name: str, dtype: str, rank: int, leading: int, align: int) -> TensorArg:
    """``from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=leading)``: every
    extent dynamic and independent, dynamic 64-bit strides but a unit one at ``leading``."""
    return TensorArg(
        name, dtype,
        tuple(Sym(f"{name}.shape{i}") for i in range(rank)),
        tuple(1 if i == leading else Sym(f"{name}.stride{i}", width=64) for i in range(rank)),
        align=align,
    )


# C-ABI order = the class's __call__ order. CuTe views: q/k/out (S, D, H, B), v (D, S, H, B),
# lse (S, H, B), index (cap, Gq, H, B), counts (Gq, H, B) — the BSHD/BHSD storage permuted.
BF16_ARGS = (
    _marked("q", "bfloat16", 4, 1, 128),
    _marked("k", "bfloat16", 4, 1, 128),
    _marked("v", "bfloat16", 4, 0, 128),
    _marked("out", "bfloat16", 4, 1, 128),
    _marked("lse", "float32", 3, 0, 4),
    _marked("q2k_block_index", "int32", 4, 0, 4),
    _marked("block_counts", "int32", 3, 0, 4),
    ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5),
    StreamArg("stream"),
)

# q/k (S, D, H, B) E4M3, v (D, S, H, B) from BHDS storage (unit stride on S), out bf16 like q,
# lse (S, H, B), index (cap, Gq, H, B), q_scale (Sq, H, B), k_scale (Sk/16, H, B), v_scale (D, H)
FP8_ARGS = (
    _marked("q", "float8_e4m3fn", 4, 1, 16),
    _marked("k", "float8_e4m3fn", 4, 1, 16),
    _marked("v", "float8_e4m3fn", 4, 1, 16),
    _marked("out", "bfloat16", 4, 1, 16),
    _marked("lse", "float32", 3, 0, 4),
    _marked("q2k_block_index", "int32", 4, 0, 4),
    ScalarArg("block_sparse_num", "int32", 1),
    _marked("q_scale", "float32", 3, 0, 4),
    _marked("k_scale", "float32", 3, 0, 4),
    _marked("v_scale", "float32", 2, 0, 4),
    ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5),
    StreamArg("stream"),
)

# every tensor flattened (tensor.view(-1)), 16-byte aligned; the shapes travel as scalars
QUANT_TENSORS = (("q", "bfloat16"), ("k", "bfloat16"), ("v", "bfloat16"), ("q_fp8", "float8_e4m3fn"),
                 ("k_fp8", "float8_e4m3fn"), ("v_fp8", "float8_e4m3fn"), ("q_scale", "float32"),
                 ("k_scale", "float32"), ("v_scale", "float32"), ("k_mean_partial", "float32"),
                 ("k_mean", "float32"), ("v_amax_partial", "float32"))
QUANT_ARGS = (
    *(_marked(n, d, 1, 0, 16) for n, d in QUANT_TENSORS),
    *(ScalarArg(n, "int32", 1) for n in ("batch_size", "num_heads", "seqlen_q", "seqlen_k",
                                         "num_k_chunks", "num_v_chunks")),
    ScalarArg("seqlen_k_float", "float32", 64.0),
    StreamArg("stream"),
)


# CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR of every sm_90 GPU (H100, H200: 228 KiB)
SM90_MAX_SMEM_PER_SM = 233472


@contextlib.contextmanager
def _sm90_device():
    """While a class traces its launches, answer the one device query the DSL makes at compile
    time with the sm_90 value. A launch with ``min_blocks_per_mp > 1`` (the bf16 class asks for
    up to 3 CTAs per SM) and no explicit carveout makes the DSL read the GPU's shared memory per
    SM (``cutlass_dsl/cutlass.py``, ``smem.max_smem_per_mp``) from device 0 through the driver,
    which a build machine has not. Any other attribute still goes to the driver (and fails
    loudly there)."""
    from cutlass.base_dsl.runtime import cuda as cuda_helpers

    real = cuda_helpers.get_device_attribute
    wanted = cuda_helpers.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR

    def attribute(attr, device_id=0):
        return SM90_MAX_SMEM_PER_SM if attr == wanted else real(attr, device_id)

    cuda_helpers.get_device_attribute = attribute
    try:
        yield
    finally:
        cuda_helpers.get_device_attribute = real


def _jit(fn, args):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    types = {"float32": cutlass.Float32, "int32": cutlass.Int32}
    # real objects, not the strings `from __future__ import annotations` would leave
    fn.__annotations__ = {a.name: (cute.Tensor if isinstance(a, TensorArg) else
                                   cuda.CUstream if isinstance(a, StreamArg) else types[a.dtype])
                          for a in args}
    # no control flow of its own: skip the AST preprocessor (it needs a source file)
    return CompileSpec(cute.jit(preprocess=False)(fn), list(args))


def _bf16_spec(target: str, variant: Variant) -> CompileSpec:
    import cutlass

    inst = cudnn_import.load_class("bf16_blk64")(dtype=cutlass.BFloat16, acc_dtype=cutlass.Float32, **BF16_CTOR)

    def cudnn_bsa_sm90_bf16(q, k, v, out, lse, q2k_block_index, block_counts, softmax_scale, stream):
        # no block sizes, no split offsets: the wrapper passes its counts tensor in both places
        with _sm90_device():
            inst(q, k, v, out, lse, q2k_block_index, block_counts, block_counts, block_counts, softmax_scale,
                 stream)

    return _jit(cudnn_bsa_sm90_bf16, BF16_ARGS)


def _fp8_spec(target: str, variant: Variant) -> CompileSpec:
    block = variant.params["block_k"]
    inst = (cudnn_import.load_class("fp8_blk64")(NUM_SMS) if block == 64
            else cudnn_import.load_class("fp8_blk128")())

    def cudnn_sage_sm90_fp8(q, k, v, out, lse, q2k_block_index, block_sparse_num, q_scale, k_scale,
                            v_scale, softmax_scale, stream):
        with _sm90_device():
            inst(q, k, v, out, lse, q2k_block_index, block_sparse_num, q_scale, k_scale, v_scale,
                 softmax_scale, stream)

    return _jit(cudnn_sage_sm90_fp8, FP8_ARGS)


def _quant_spec(target: str, variant: Variant) -> CompileSpec:
    inst = cudnn_import.load_class("sage_quant")(**QUANT_CTOR)

    def cudnn_sage_quant_sm90(q, k, v, q_fp8, k_fp8, v_fp8, q_scale, k_scale, v_scale, k_mean_partial,
                              k_mean, v_amax_partial, batch_size, num_heads, seqlen_q, seqlen_k,
                              num_k_chunks, num_v_chunks, seqlen_k_float, stream):
        with _sm90_device():
            inst(q, k, v, q_fp8, k_fp8, v_fp8, q_scale, k_scale, v_scale, k_mean_partial, k_mean,
                 v_amax_partial, batch_size, num_heads, seqlen_q, seqlen_k, num_k_chunks, num_v_chunks,
                 seqlen_k_float, stream)

    return _jit(cudnn_sage_quant_sm90, QUANT_ARGS)


KERNELS = [
    Kernel(
        name="cudnn_bsa_sm90_bf16",
        doc=f"{UPSTREAM} SM90 bf16 block-sparse forward (64x64 blocks, per-row counts, kv_splits=1), "
            "bench contender",
        targets=(),  # never shipped
        variants=(Variant("blk64", {"block_k": 64, "kv_splits": 1}),),
        compile_spec=_bf16_spec,
        test_targets=("sm_90a",),
        upstream=UPSTREAM,
    ),
    Kernel(
        name="cudnn_sage_sm90_fp8",
        doc=f"{UPSTREAM} SM90 Sage FP8 block-sparse forward (fixed counts, full blocks), bench contender",
        targets=(),
        variants=(Variant("blk64", {"block_k": 64, "num_sms": NUM_SMS}), Variant("blk128", {"block_k": 128})),
        compile_spec=_fp8_spec,
        test_targets=("sm_90a",),
        upstream=UPSTREAM,
    ),
    Kernel(
        name="cudnn_sage_quant_sm90",
        doc=f"{UPSTREAM} SM90 Sage FP8 quantizer (Q, K, V -> E4M3 + scales, V to BHDS), the Sage "
            "contender's own first step",
        targets=(),
        variants=(Variant("bhds", {"v_layout": "bhds"}),),
        compile_spec=_quant_spec,
        test_targets=("sm_90a",),
        upstream=UPSTREAM,
    ),
]
