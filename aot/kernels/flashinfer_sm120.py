"""FlashInfer's SM120 blk64 block-sparse attention classes (Sage INT8/FP8 and BF16), AOT-compiled.

Upstream: ``flashinfer.cute_dsl.sparse.sm120_blk64`` of the pinned ``flashinfer-python`` (imported
from the installed package by :mod:`aot.upstream.flashinfer_import`, never copied here).

Kernels (one per class):
  ``fi_sm120_sage_fwd``  ``BlockSparseAttnForwardSageSm120Blk64`` (INT8 Q·Kᵀ, FP8-E4M3 P·V)
  ``fi_sm120_bf16_fwd``  ``BlockSparseAttnForwardSm120Blk64`` (BF16, also writes LSE)
Targets: sm_120a (shipped); sm_90a (test library only: checks the marshalling on an H200).

Variants (the classes' compile-time flags): ``has_block_nums`` (per-row counts tensor, or the
scalar ``block_sparse_num`` for every row) x ``block_sizes_mode`` (0: no block-size tensor, the
partial last key block is masked from Sk; 1: ``[Gk]``; 2: ``[B, Gk]``; 3: ``[B, H, Gk]`` valid-token
counts per key block). Names: ``topk_bs0`` ... ``rows_bs3``.

Kernel argument layouts are CuTe mode orders (docs/design/kernels-flashinfer.md has the torch views that
produce them, and ``python/subblock_sage/backends/sm120.py`` for the runtime side):
  q, k, o   (S, 128, H, B)   head dim contiguous (BHSD or BSHD memory, via permute)
  v (Sage)  (128, Skp, H, B) key axis contiguous: the quantizer's HDS ``[B,H,128,round_up(Sk,64)]``
  v (bf16)  (128, Sk, H, B)  head dim contiguous
  scales    (G, H, B)        contiguous G
  index     (cap, Gq, H, B)  from ``q2k_block_index [B,H,Gq,cap]``; counts (Gq, H, B)
"""

from __future__ import annotations

import keyword
from typing import Any, Callable, Mapping, Sequence

from aot.registry import (
    ArgSpec,
    CompileSpec,
    Kernel,
    ScalarArg,
    StreamArg,
    Sym,
    TensorArg,
    Variant,
)
from aot.contract import BF16, HEAD_DIM, MODES, Q_BLOCK, SAGE_FP8, family_kernels, family_targets
from aot.upstream import flashinfer_import

UPSTREAM = flashinfer_import.UPSTREAM
BLOCK = Q_BLOCK  # the class's sparse tiles: 64 query rows by 64 keys (128-key plans arrive as 64-key pairs)

# ---------------------------------------------------------------------------------------------
# Shared with flashinfer_sm100.


def jit_wrapper(
    call: Callable[..., Any],
    params: Sequence[tuple[ArgSpec, str]],
    fixed: Mapping[str, Any],
    name: str,
) -> Callable[..., Any]:
    """``@cute.jit def name(<our names>): call(<upstream kw>=<our name>, ..., **fixed)``.

    The exporter names each C argument struct after the compiled function's parameters and passes
    the spec'd arguments positionally, while the upstream ``__call__`` wants ``None`` for absent
    optional tensors in the middle of its list. So each variant compiles through this wrapper:
    its parameters are exactly our spec names (C-ABI order), annotated for the C header
    generator; ``fixed`` carries the compile-time constants. ``params``: (spec, upstream keyword).
    """
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    scalar_types = {"int32": cutlass.Int32, "float32": cutlass.Float32}
    annotations: dict[str, Any] = {}
    for spec, theirs in params:
        ours = spec.name
        if not ours.isidentifier() or keyword.iskeyword(ours) or not theirs.isidentifier():
            raise ValueError(f"bad parameter name {ours!r} -> {theirs!r}")
        if isinstance(spec, TensorArg):
            annotations[ours] = cute.Tensor
        elif isinstance(spec, ScalarArg):
            annotations[ours] = scalar_types[spec.dtype]
        else:
            annotations[ours] = cuda.CUstream
    if not name.isidentifier():
        raise ValueError(f"bad function name {name!r}")
    sig = ", ".join(s.name for s, _ in params)
    fwd = ", ".join(f"{t}={s.name}" for s, t in params)
    src = f"def {name}({sig}):\n    _call({fwd}, **_fixed)\n"
    ns: dict[str, Any] = {"_call": call, "_fixed": dict(fixed)}
    exec(compile(src, f"<subblock_sage wrapper {name}>", "exec"), ns)  # noqa: S102
    fn = ns[name]
    fn.__annotations__ = annotations
    # No control flow here: skip the AST preprocessor (it needs a source file).
    return cute.jit(preprocess=False)(fn)


# Dynamic extents (equal keys tie equal extents across arguments).
B = Sym("B")
H = Sym("H")
SQ = Sym("Sq")
SK = Sym("Sk")
GQ = Sym("Gq64")  # ceil(Sq / 64)
GK = Sym("Gk64")  # ceil(Sk / 64)
CAP = Sym("cap")  # q2k_block_index capacity


def st(key: str, div: int = 1) -> Sym:
    """A dynamic 64-bit stride (``div`` in elements)."""
    return Sym(key, div=div, width=64)


ELEM_BYTES = {"bfloat16": 2, "float16": 2, "int8": 1, "float8_e4m3fn": 1, "float32": 4, "int32": 4}


def tma_operand(name: str, dtype: str, shape: tuple, contiguous_mode: int) -> TensorArg:
    """A TMA-loaded/stored rank-4 operand: one unit-stride mode, every other stride a dynamic
    multiple of 16 bytes, base 16-byte aligned (what cuTensorMapEncodeTiled requires)."""
    div = 16 // ELEM_BYTES[dtype]
    stride = tuple(
        1 if i == contiguous_mode else st(f"{name}.stride{i}", div) for i in range(len(shape))
    )
    return TensorArg(name, dtype, shape, stride, align=16)


def plain(name: str, dtype: str, shape: tuple) -> TensorArg:
    """A plainly indexed tensor: unit stride in mode 0, dynamic others, element alignment."""
    stride = (1, *(st(f"{name}.stride{i}") for i in range(1, len(shape))))
    return TensorArg(name, dtype, shape, stride, align=ELEM_BYTES[dtype])


BLOCK_SIZES_SHAPES = {1: (GK,), 2: (GK, B), 3: (GK, H, B)}


# ---------------------------------------------------------------------------------------------
# SM120

VARIANTS = tuple(
    Variant(f"{'rows' if nums else 'topk'}_bs{mode}",
            {"has_block_nums": nums, "block_sizes_mode": mode})
    for nums in (False, True)
    for mode in (0, 1, 2, 3)
)


def _sm120_args(sage: bool, has_block_nums: bool, block_sizes_mode: int):
    """Ordered (spec, upstream keyword) pairs and the fixed (absent) upstream arguments."""
    if sage:
        pairs = [
            (tma_operand("q", "int8", (SQ, HEAD_DIM, H, B), 1), "mQ"),
            (tma_operand("k", "int8", (SK, HEAD_DIM, H, B), 1), "mK"),
            (tma_operand("v", "float8_e4m3fn", (HEAD_DIM, Sym("Sk_pad64", div=BLOCK), H, B), 1),
             "mV"),
            (tma_operand("out", "bfloat16", (SQ, HEAD_DIM, H, B), 1), "mO"),
            (plain("q_scale", "float32", (Sym("Gq128x4", div=4), H, B)), "mQScale"),
            (plain("k_scale", "float32", (GK, H, B)), "mKScale"),
            (plain("v_scale", "float32", (HEAD_DIM, H, B)), "mVScale"),
        ]
    else:
        pairs = [
            (tma_operand("q", "bfloat16", (SQ, HEAD_DIM, H, B), 1), "mQ"),
            (tma_operand("k", "bfloat16", (SK, HEAD_DIM, H, B), 1), "mK"),
            (tma_operand("v", "bfloat16", (HEAD_DIM, SK, H, B), 0), "mV"),
            (tma_operand("out", "bfloat16", (SQ, HEAD_DIM, H, B), 1), "mO"),
            (plain("lse", "float32", (SQ, H, B)), "mLSE"),
        ]
    fixed: dict[str, Any] = {}
    pairs.append((plain("q2k_block_index", "int32", (CAP, GQ, H, B)), "blocksparse_indices_q2k"))
    if has_block_nums:
        pairs.append((plain("block_counts", "int32", (GQ, H, B)), "blocksparse_num_blocks_q2k"))
    else:
        fixed["blocksparse_num_blocks_q2k"] = None
    pairs.append((ScalarArg("block_sparse_num", "int32", 1), "block_sparse_num"))
    if block_sizes_mode:
        pairs.append(
            (plain("block_sizes", "int32", BLOCK_SIZES_SHAPES[block_sizes_mode]),
             "blocksparse_varblk")
        )
    else:
        fixed["blocksparse_varblk"] = None
    pairs.append((ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5), "softmax_scale"))
    pairs.append((StreamArg("stream"), "stream"))
    return pairs, fixed


def _sm120_compile_spec(sage: bool):
    key = "sm120_sage" if sage else "sm120_bf16"

    def compile_spec(target: str, variant: Variant) -> CompileSpec:
        cls = flashinfer_import.load_class(key)
        nums = bool(variant.params["has_block_nums"])
        mode = int(variant.params["block_sizes_mode"])
        kwargs = dict(
            gqa_ratio=1,
            head_dim=HEAD_DIM,
            value_dim=HEAD_DIM,
            blocksparse_blocksize_q=BLOCK,
            blocksparse_blocksize_k=BLOCK,
            has_block_sizes=mode != 0,
            has_block_nums=nums,
            block_sizes_mode=mode,
        )
        if not sage:
            import cutlass

            kwargs.update(dtype=cutlass.BFloat16, acc_dtype=cutlass.Float32)
        inst = cls(**kwargs)
        pairs, fixed = _sm120_args(sage, nums, mode)
        fn = jit_wrapper(
            inst.__call__,
            pairs,
            fixed,
            f"fi_{key}_{variant.name}",
        )
        return CompileSpec(fn, [spec for spec, _ in pairs])

    return compile_spec


# CPU cost of one export of this module against one of the Sage quantizer's (1; measured
# 2026-12-01): aot/export/plan.py starts the heaviest export processes first.
EXPORT_WEIGHT = 3
FAMILY = "sm120"  # contract.Target.family: the targets, and the kernel names by mode (contract.ATTENTION)
KERNELS = [
    Kernel(
        name=family_kernels(FAMILY)[mode],
        doc=doc,
        targets=family_targets(FAMILY),
        variants=VARIANTS,
        compile_spec=_sm120_compile_spec(sage=MODES[mode].quantizes),
        test_targets=("sm_90a",),  # test library only: the H200 checks the marshalling
        upstream=UPSTREAM,
    )
    for mode, doc in (
        (SAGE_FP8.name, "FlashInfer SM120 blk64 Sage block-sparse attention (INT8 QK, FP8 PV), bf16 out"),
        (BF16.name, "FlashInfer SM120 blk64 BF16 block-sparse attention, bf16 out + fp32 LSE"),
    )
]
