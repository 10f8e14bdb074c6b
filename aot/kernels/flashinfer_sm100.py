"""FlashInfer's SM100 blk64 BF16 block-sparse attention class, AOT-compiled for sm_100a.

Upstream: ``flashinfer.cute_dsl.sparse.sm100_blk64.bsa_fwd_sm100.BlockSparseAttnForwardSm100Blk64``
of the pinned ``flashinfer-python`` (imported by :mod:`aot.upstream.flashinfer_import`).

Kernel ``fi_sm100_bf16_fwd`` (bf16 in/out, fp32 LSE, MHA, D=128, 64-token blocks, kv_splits=1).
Compile-time flags the runtime selects between (variant name = ``<sched>_<counts>_<bs>_<strides>``):
  counts   ``topk``: every row uses the scalar ``block_sparse_num`` (``allow_empty_block_nums``
           False, upstream's kv_splits=1 setting; the runtime never launches it with 0: a zero
           top-k is an all-zero output);  ``rows``: per-row ``block_counts`` tensor, rows may be
           empty (``allow_empty_block_nums`` True: empty tiles write exact zeros).
  sched    ``static``: one CTA per (q block, head, batch);  ``clc``: CLC persistent scheduler.
           Upstream policy (``choose_sm100_blk64_use_clc``): always CLC with per-row counts,
           shape heuristic otherwise. (The persistent *static* scheduler queries the SM count at
           compile time, which needs a GPU: not built.)
  bs       ``bs``: a ``[Gk]`` int32 valid-token count per key block is read (masks the partial last
           key block: this kernel does NOT mask by Sk; upstream also forces it with per-row counts);
           ``nobs``: every selected block is a full 64 keys.
  strides  ``i32``: rank-6 TMA views with Int32 coordinates (fast; reads whole 64-row key blocks, so
           K/V must be addressable up to round_up(Sk, 64) rows);  ``i64``: rank-5 Int64 views
           (upstream ``sm100_blk64_requires_int64_kv_strides``: huge strides).
"""

from __future__ import annotations

from typing import Any

from aot.kernels.flashinfer_sm120 import (
    B,
    CAP,
    GK,
    GQ,
    H,
    HEAD_DIM,
    SK,
    SQ,
    UPSTREAM,
    jit_wrapper,
    st,
)
from aot.contract import BF16, Q_BLOCK, attention_kernel, family_targets
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, TensorArg, Variant
from aot.upstream import flashinfer_import

BLOCK = Q_BLOCK  # the class's sparse tiles: 64 query rows by 64 keys (128-key plans arrive as 64-key pairs)
TILE_N = 256


def _bhsd(name: str, dtype: str, shape: tuple) -> TensorArg:
    # Upstream wraps Q/K/V/O in assume_tensor_aligned: every stride but the last is assumed a
    # multiple of 128 bits (8 bf16 elements); TMA wants 16-byte aligned bases.
    return TensorArg(name, dtype, shape, tuple(st(f"{name}.stride{i}", 8) for i in range(3)) + (1,),
                     align=16)


def _int32(name: str, shape: tuple, align: int = 16) -> TensorArg:
    # Upstream converts these with to_cute_tensor(assumed_align=16, leading_dim=-1).
    n = len(shape)
    return TensorArg(name, "int32", shape, tuple(st(f"{name}.stride{i}") for i in range(n - 1)) + (1,),
                     align=align)


def _variants() -> tuple[Variant, ...]:
    out = []
    for counts, scheds, bss in (("topk", ("static", "clc"), (False, True)), ("rows", ("clc",), (True,))):
        for sched in scheds:
            for bs in bss:
                for i64 in (False, True):
                    name = f"{sched}_{counts}_{'bs' if bs else 'nobs'}_{'i64' if i64 else 'i32'}"
                    out.append(Variant(name, {
                        "use_clc_scheduler": sched == "clc",
                        "has_block_nums": counts == "rows",
                        "allow_empty_block_nums": counts == "rows",
                        "has_block_sizes": bs,
                        "use_int64_kv_strides": i64,
                    }))
    return tuple(out)


VARIANTS = _variants()


def sm100_args(has_block_nums: bool, has_block_sizes: bool):
    pairs: list[tuple[Any, str]] = [
        (_bhsd("q", "bfloat16", (B, H, SQ, HEAD_DIM)), "mQ"),
        (_bhsd("k", "bfloat16", (B, H, SK, HEAD_DIM)), "mK"),
        (_bhsd("v", "bfloat16", (B, H, SK, HEAD_DIM)), "mV"),
        (_bhsd("out", "bfloat16", (B, H, SQ, HEAD_DIM)), "mO"),
        (TensorArg("lse", "float32", (B, H, SQ), (st("lse.stride0"), st("lse.stride1"), 1), align=4),
         "mLSE"),
        (ScalarArg("softmax_scale", "float32", HEAD_DIM**-0.5), "softmax_scale"),
        (_int32("q2k_block_index", (B, H, GQ, CAP)), "mBlockIndex"),
    ]
    fixed: dict[str, Any] = {"mQScale": None, "mKScale": None, "mVScale": None, "mSplitOffsets": None}
    if has_block_sizes:
        pairs.append((_int32("block_sizes", (GK,)), "mBlockSizes"))
    else:
        fixed["mBlockSizes"] = None
    pairs.append((ScalarArg("block_sparse_num", "int32", 8), "block_sparse_num"))
    if has_block_nums:
        pairs.append((_int32("block_counts", (B, H, GQ)), "mBlockNums"))
    else:
        fixed["mBlockNums"] = None
    pairs.append((StreamArg("stream"), "stream"))
    return pairs, fixed


def compile_spec(target: str, variant: Variant) -> CompileSpec:
    cls = flashinfer_import.load_class("sm100_bf16")
    p = variant.params
    clc = bool(p["use_clc_scheduler"])
    inst = cls(
        HEAD_DIM,
        HEAD_DIM,
        qhead_per_kvhead=1,
        pack_gqa=False,
        m_block_size=64,
        n_block_size=TILE_N,
        sparse_block_size=BLOCK,
        is_persistent=clc,  # upstream: is_persistent = use_clc_scheduler
        use_clc_scheduler=clc,
        allow_empty_block_nums=bool(p["allow_empty_block_nums"]),
        has_block_sizes=bool(p["has_block_sizes"]),
        num_splits=1,
        use_int64_kv_strides=bool(p["use_int64_kv_strides"]),
    )
    # The class reads the DSL's arch at construction (outside cute.compile, where no GPU means the
    # DSL default): it must be a plain SM100 (not SM103: that flips ex2 emulation off).
    if not (str(inst.arch).startswith("sm_100") and inst.enable_ex2_emu):
        raise RuntimeError(
            f"fi_sm100_bf16_fwd: the CuTe DSL reported arch {inst.arch} while constructing the "
            f"kernel for {target}; set CUTE_DSL_ARCH=sm_100a for the build"
        )
    pairs, fixed = sm100_args(bool(p["has_block_nums"]), bool(p["has_block_sizes"]))
    fn = jit_wrapper(inst.__call__, pairs, fixed, f"fi_sm100_bf16_{variant.name}")
    return CompileSpec(fn, [s for s, _ in pairs])


# CPU cost of one export of this module against one of the Sage quantizer's (1; measured
# 2026-12-01): aot/export/plan.py starts the heaviest export processes first.
EXPORT_WEIGHT = 8
FAMILY = "sm100"  # contract.Target.family: the targets it is built for
KERNELS = [
    Kernel(
        name=attention_kernel(FAMILY, BF16.name),  # contract.ATTENTION
        doc="FlashInfer SM100 blk64 BF16 block-sparse attention, bf16 out + fp32 LSE",
        targets=family_targets(FAMILY),
        variants=VARIANTS,
        compile_spec=compile_spec,
        upstream=UPSTREAM,
    ),
]
