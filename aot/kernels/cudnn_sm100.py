"""cuDNN frontend 1.32.0's SM100 Sage FP8 block-sparse forward and its quantizer, AOT-compiled into
the shipped sm_100a (B200/GB200) and sm_100f (B300/GB300) libraries: ``compute_mode="sage_fp8"``
on compute capability 10.0 / 10.3 (docs/design/sage-sm100.md; runtime:
``python/subblock_sage/backends/sm100.py``).

Each export is what the public wrapper builds for our shapes (B, H, S, D = 128, one query head per
K/V head, bf16 inputs, Sq and Sk multiples of 64, a fixed count per launch;
``tests/cpu/test_cudnn_sm100_aot.py`` runs the wrapper under a torch fake mode against the specs
below):

- ``cudnn_sage_sm100_fp8``: ``block_sparse_attention_fp8_forward(q, k, v, index, block_sparse_num,
  sparse_block_size=64)`` on SM100/SM103 -> ``_quantize_sage_bhsd(q, k, v)`` (V stays BHSD), then
  ``bsa_attn_fwd_blk64_cutedsl(..., layout="bhsd", use_clc=False, kv_splits="auto", q_scale=...)``
  -> ``BlockSparseAttnForwardSm100Blk64(128, 128, qhead_per_kvhead=1, pack_gqa=False, 64, 256, 64,
  is_persistent=clc, use_clc_scheduler=clc, allow_empty_block_nums=False, has_block_sizes=False,
  num_splits=1, use_exact_kv_layout=False, use_int64_kv_strides=False, nonpositive_scale=False,
  short_tile_opt=...)`` with ``clc`` False: its FP8 path passes ``use_clc=False`` (the static
  scheduler, one CTA per query tile). The variants are the one choice the wrapper makes from host
  values: ``short_tile_opt`` when capacity * 10 < key blocks * 9 (``short``, else ``long``). Not
  built, so the runtime never selects them: the CLC scheduler (the bf16 path's), split-KV
  (``kv_splits`` > 1 needs FP32 partials and a combine kernel; its "auto" rule splits only
  short-Q launches: fewer than 512 query tiles, or >= 900 blocks a row), the exact-boundary /
  Int64 K/V views (the runtime launches one batch element at a time where the wrapper's rank-6
  Int32 rule would refuse the whole tensors), per-row counts and block sizes (the wrapper refuses
  both for SM100 FP8).
- ``cudnn_sage_quant_sm100``: ``_quantize_sage_bhsd(q, k, v)`` on SM100 ->
  ``_SageFp8Quantizer(is_sm120=False, v_block_size=0, v_layout="bhsd", is_sm90=False)``: seven
  kernels in one call (Q per token, K smoothed by its per-head mean then per 16 keys, V per
  channel over the whole batch, 256-row chunks), on flattened contiguous BHSD tensors; the same C
  ABI as the SM90 quantizer (:data:`aot.kernels.cudnn_sm90.QUANT_ARGS`).

The class reads the DSL's arch at construction (no GPU: the DSL default, sm_100); B300 (SM103)
would construct it with SM103 under the wrapper, which only turns its exp2 emulation off (a speed
choice; the Sage path uses no SM103-only instruction). Upstream imported by
:mod:`aot.upstream.cudnn_import` (never copied here).
"""

from __future__ import annotations

from aot.contract import ATTENTION_QUANTIZERS, HEAD_DIM, Q_BLOCK, SAGE_FP8, attention_kernel, family_targets
from aot.kernels.cudnn_sm90 import QUANT_ARGS, UPSTREAM, _jit, _marked
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Variant
from aot.upstream import cudnn_import

TARGETS = family_targets("sm100")
KERNEL = attention_kernel("sm100", SAGE_FP8.name)  # names: contract.ATTENTION
QUANT_KERNEL = ATTENTION_QUANTIZERS[KERNEL]
TILE_N = 256  # the class's KV tile: four 64-key blocks

# BlockSparseAttnForwardSm100Blk64(HEAD_DIM, HEAD_DIM, **FP8_CTOR, use_clc_scheduler=...,
# is_persistent=..., short_tile_opt=...), as bsa_attn_fwd_blk64_cutedsl constructs it for Sage FP8
# with a fixed count, full 64-key blocks and kv_splits=1
FP8_CTOR = {
    "qhead_per_kvhead": 1, "pack_gqa": False, "m_block_size": Q_BLOCK, "n_block_size": TILE_N,
    "sparse_block_size": Q_BLOCK, "allow_empty_block_nums": False, "has_block_sizes": False,
    "num_splits": 1, "use_exact_kv_layout": False, "use_int64_kv_strides": False,
    "nonpositive_scale": False,
}
# _SageFp8Quantizer(**QUANT_CTOR), as _quantize_sage_bhsd constructs it on SM100/SM103
QUANT_CTOR = {"is_sm120": False, "v_block_size": 0, "v_layout": "bhsd", "is_sm90": False}
QUANT_ROWS_PER_CHUNK = 256  # _SageFp8Quantizer.ROWS_PER_CHUNK (every arch but SM90)

# C-ABI order = __call__ order without the absent tensors (mBlockSizes, mBlockNums, mSplitOffsets:
# None). The wrapper marks every tensor with _to_cute_tensor: leading_dim = last, assumed_align 16
# (4 for LSE and the scales). q/k/v E4M3 [B,H,S,128] (V BHSD), out bf16 [B,H,Sq,128], lse
# [B,H,Sq], q_scale [B,H,Sq] (per token), k_scale [B,H,Sk/16], v_scale [H,128], index [B,H,Gq,cap].
FP8_ARGS = (
    _marked("q", "float8_e4m3fn", 4, 3, 16),
    _marked("k", "float8_e4m3fn", 4, 3, 16),
    _marked("v", "float8_e4m3fn", 4, 3, 16),
    _marked("out", "bfloat16", 4, 3, 16),
    _marked("lse", "float32", 3, 2, 4),
    _marked("q_scale", "float32", 3, 2, 4),
    _marked("k_scale", "float32", 3, 2, 4),
    _marked("v_scale", "float32", 2, 1, 4),
    ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5),
    _marked("q2k_block_index", "int32", 4, 3, 16),
    ScalarArg("block_sparse_num", "int32", 8),
    StreamArg("stream"),
)


def _variants() -> tuple[Variant, ...]:
    return tuple(Variant("short" if short else "long", {"use_clc_scheduler": False, "short_tile_opt": short})
                 for short in (True, False))


VARIANTS = _variants()


def _fp8_spec(target: str, variant: Variant) -> CompileSpec:
    clc = bool(variant.params["use_clc_scheduler"])
    inst = cudnn_import.load_class("sm100_blk64")(
        HEAD_DIM, HEAD_DIM, is_persistent=clc, use_clc_scheduler=clc,
        short_tile_opt=bool(variant.params["short_tile_opt"]), **FP8_CTOR)
    if not str(inst.arch).startswith("sm_100"):
        raise RuntimeError(f"cudnn_sage_sm100_fp8: the CuTe DSL reported arch {inst.arch} while "
                           f"constructing the kernel for {target}; set CUTE_DSL_ARCH=sm_100a for the build")

    def cudnn_sage_sm100_fp8(q, k, v, out, lse, q_scale, k_scale, v_scale, softmax_scale, q2k_block_index,
                             block_sparse_num, stream):
        # no block sizes, no per-row counts, no split offsets (the wrapper's SM100 FP8 call)
        inst(q, k, v, out, lse, q_scale, k_scale, v_scale, softmax_scale, q2k_block_index, None,
             block_sparse_num, None, None, stream)

    return _jit(cudnn_sage_sm100_fp8, FP8_ARGS)


def _quant_spec(target: str, variant: Variant) -> CompileSpec:
    inst = cudnn_import.load_class("sage_quant")(**QUANT_CTOR)

    def cudnn_sage_quant_sm100(q, k, v, q_fp8, k_fp8, v_fp8, q_scale, k_scale, v_scale, k_mean_partial,
                               k_mean, v_amax_partial, batch_size, num_heads, seqlen_q, seqlen_k,
                               num_k_chunks, num_v_chunks, seqlen_k_float, stream):
        inst(q, k, v, q_fp8, k_fp8, v_fp8, q_scale, k_scale, v_scale, k_mean_partial, k_mean,
             v_amax_partial, batch_size, num_heads, seqlen_q, seqlen_k, num_k_chunks, num_v_chunks,
             seqlen_k_float, stream)

    return _jit(cudnn_sage_quant_sm100, QUANT_ARGS)


# CPU cost of one export against one of the Sage quantizer's (aot/export/plan.py starts the
# heaviest export processes first); the FP8 class is the FlashInfer SM100 class's size
EXPORT_WEIGHT = 8
KERNELS = [
    Kernel(
        name=KERNEL,
        doc=f"{UPSTREAM} SM100 Sage FP8 block-sparse forward (64x64 blocks, a fixed count per launch, "
            "Sq and Sk multiples of 64, kv_splits=1), bf16 out + fp32 LSE",
        targets=TARGETS,
        variants=VARIANTS,
        compile_spec=_fp8_spec,
        upstream=UPSTREAM,
    ),
    Kernel(
        name=QUANT_KERNEL,
        doc=f"{UPSTREAM} SM100 Sage FP8 quantizer (bf16 BHSD Q, K, V -> E4M3 + per-token Q, per-16-key "
            "smoothed K and per-channel V scales)",
        targets=TARGETS,
        variants=(Variant("bhsd", {"v_layout": "bhsd"}),),
        compile_spec=_quant_spec,
        upstream=UPSTREAM,
    ),
]
