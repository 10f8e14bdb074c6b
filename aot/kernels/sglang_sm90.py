"""SGLang 0.5.23's own SM90 bf16 SubBlock kernel, AOT-compiled into the test library only.

A bench contender (never shipped): on H100/H200 SGLang runs its bf16 SubBlock attention through
its vendored FlashAttention CuTe forward (``flash_attn_func`` with block-sparse tensors). The H200
has no room for the DSL, so this build compiles that class for it, with exactly what SGLang's
``interface._flash_attn_fwd`` builds for a SubBlock plan (bf16, head dim 128, 64x64 sparse blocks,
not causal, ``num_splits=1``, mask count + index tensors, no full-block tensors, no LSE since
SGLang's runner neither asks for it nor needs gradients):

- config: ``_tile_size_fwd_sm90(128, 128, False, False, 64, 64)`` = ``FwdConfig(tile 64 x 64,
  mma_pv_is_rs=True, intra_wg_overlap=True)`` (:data:`CONFIG`; tests/cpu/test_sglang_sm90_aot.py
  runs SGLang's own function, and its ``flash_attn_func`` under a fake mode, against it);
- constructor: :data:`CTOR` (``q_stage = 1`` on SM90, so ``q_subtile_factor = 64 / 64 = 1``);
- tensors: as ``to_cute_tensor`` marks them (every extent dynamic and independent, every stride
  a dynamic int64 except the unit last one; 16-byte base alignment for q/k/v/out, 4 for the
  int32 plan tensors); ``softmax_scale`` a run-time float; the stream an argument.

SGLang compiles with ``--enable-tvm-ffi``; this export uses the plain CuTe ABI instead (the same
kernel, a different host calling convention) so that our C shim launches it like every other
export. Upstream imported by :mod:`aot.upstream.sglang_import` (never copied here).
"""

from __future__ import annotations

from typing import Any

from aot.contract import HEAD_DIM, Q_BLOCK
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant
from aot.upstream import sglang_import

UPSTREAM = sglang_import.UPSTREAM
BLOCK = Q_BLOCK  # SGLang's sparse blocks: 64 query rows by 64 keys

# interface._tile_size_fwd_sm90's answer for head dim 128 with 64x64 sparse blocks
CONFIG = {"tile_m": 64, "tile_n": 64, "mma_pv_is_rs": True, "intra_wg_overlap": True}
# FlashAttentionForwardSm90(dtype, head_dim, head_dim_v, qhead_per_kvhead, **CTOR), as
# interface._flash_attn_fwd calls it for that config (bf16 is passed as the DSL type)
CTOR: dict[str, Any] = {
    "is_causal": False, "is_local": False, "is_split_kv": False, "pack_gqa": False,
    "tile_m": CONFIG["tile_m"], "tile_n": CONFIG["tile_n"], "num_stages": 2, "num_threads": 384,
    "Q_in_regs": False, "intra_wg_overlap": CONFIG["intra_wg_overlap"],
    "mma_pv_is_rs": CONFIG["mma_pv_is_rs"], "mask_mod": None, "score_mod": None,
    "has_aux_tensors": False, "q_subtile_factor": 1, "paged_kv_non_tma": False, "has_bias": False,
    "bias_block_size": CONFIG["tile_m"], "rel_extent_padded": 0,
}


def _marked_dynamic(name: str, dtype: str, rank: int, align: int) -> TensorArg:
    """``to_cute_tensor(t).mark_layout_dynamic(leading_dim=rank-1)``: independent dynamic
    extents, dynamic 64-bit strides (no divisibility assumed) but a unit last stride."""
    return TensorArg(
        name, dtype,
        tuple(Sym(f"{name}.shape{i}") for i in range(rank)),
        (*(Sym(f"{name}.stride{i}", width=64) for i in range(rank - 1)), 1),
        align=align,
    )


# C-ABI order; torch order (BSHD q/k/v/out, [B,H,Gq] counts, [B,H,Gq,cap] index) = CuTe order
ARGS = (
    _marked_dynamic("q", "bfloat16", 4, 16),
    _marked_dynamic("k", "bfloat16", 4, 16),
    _marked_dynamic("v", "bfloat16", 4, 16),
    _marked_dynamic("out", "bfloat16", 4, 16),
    _marked_dynamic("block_counts", "int32", 3, 4),
    _marked_dynamic("q2k_block_index", "int32", 4, 4),
    ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5),
    StreamArg("stream"),
)


def _compile_spec(target: str, variant: Variant) -> CompileSpec:
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    cls = sglang_import.load_class("sm90_fwd")
    sglang_import.load_class("fwd_base")  # signature check of the constructor's base
    sparsity = sglang_import.import_module(f"{sglang_import._CUTE}.block_sparsity")
    utils = sglang_import.import_module(f"{sglang_import._CUTE}.utils")
    # The class reads the DSL's arch when constructed (outside cute.compile, where a machine
    # without a GPU gives the DSL default) and accepts only SM 9.x: construct it for `target`,
    # as SGLang's CPU-only compile does with CUTE_DSL_ARCH=sm_90a.
    from cutlass.base_dsl.dsl import BaseDSL

    envar = BaseDSL._get_dsl().envar
    saved = envar._arch
    envar.arch = target
    try:
        inst = cls(cutlass.BFloat16, HEAD_DIM, HEAD_DIM, 1, **CTOR)
    finally:
        envar.arch = saved
    if str(inst.arch) != target:
        raise RuntimeError(f"sglang_sm90_bf16: constructed for {inst.arch}, not {target}")

    def sglang_sm90_bf16(q, k, v, out, block_counts, q2k_block_index, softmax_scale, stream):
        # interface._flash_attn_fwd's positional call for SM90 (no LSE, cu_seqlens, seqused,
        # page table, window, sink, aux data or bias), mask-only block-sparse tensors
        inst(q, k, v, out, None, softmax_scale, None, None, None, None, None, None, None, None,
             sparsity.BlockSparseTensors(mask_block_cnt=block_counts, mask_block_idx=q2k_block_index,
                                         full_block_cnt=None, full_block_idx=None),
             utils.AuxData(None, None), None, stream)

    # real objects, not the strings `from __future__ import annotations` would leave
    sglang_sm90_bf16.__annotations__ = {
        **{a.name: cute.Tensor for a in ARGS if isinstance(a, TensorArg)},
        "softmax_scale": cutlass.Float32, "stream": cuda.CUstream,
    }
    # no control flow of its own: skip the AST preprocessor (it needs a source file)
    return CompileSpec(cute.jit(preprocess=False)(sglang_sm90_bf16), list(ARGS))


KERNELS = [
    Kernel(
        name="sglang_sm90_bf16",
        doc="SGLang 0.5.23's SM90 bf16 SubBlock kernel (vendored FlashAttention CuTe forward, "
            "64x64 block-sparse), bench contender",
        targets=(),  # never shipped
        variants=(Variant("bsa64"),),
        compile_spec=_compile_spec,
        test_targets=("sm_90a",),
        upstream=UPSTREAM,
    )
]
