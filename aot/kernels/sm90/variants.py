"""Registry entries of the SM90a attention kernels: the exported variants, their argument specs
(the C ABI the runtime marshals) and the compile spec that builds each one.

Importing this module does not import CuTe-DSL (the registry must be listable without it): the
kernel class is imported when a variant is compiled.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

from .config import ALT_WGS, PAIRED, Sm90Config

# Variant parameters that set config fields (the rest choose the entry point, `counts`, or are
# read by whoever builds the kernel object); `block_k` is the plan's key block.
_CONFIG_PARAMS = ("stages", "wgs", "pair", "pv_parts", "ctas_per_sm", "refill", "q_fused", "flat_wgs", "cluster")


def _bshd(name: str, dtype: str, seq: str) -> TensorArg:
    # (B, S, H, 128), last dim contiguous; strides in elements must keep 16-byte alignment
    # (TMA): the runtime checks stride % (16 // itemsize) == 0 and data_ptr % 16 == 0.
    div = 16 if dtype in ("int8", "float8_e4m3fn") else 8
    return TensorArg(
        name, dtype, (Sym("B"), Sym(seq), Sym("H"), 128),
        (Sym(f"{name}_sb", div, 64), Sym(f"{name}_ss", div, 64), Sym(f"{name}_sh", div, 64), 1),
    )


def _plan_args(with_counts: bool) -> list:
    args = [
        TensorArg(
            "q2k_block_index", "int32", (Sym("B"), Sym("H"), Sym("NQB"), Sym("CAP")),
            (Sym("idx_sb", 1, 64), Sym("idx_sh", 1, 64), Sym("idx_sq", 1, 64), 1), align=4,
        )
    ]
    if with_counts:
        args.append(
            TensorArg(
                "block_counts", "int32", (Sym("B"), Sym("H"), Sym("NQB")),
                (Sym("cnt_sb", 1, 64), Sym("cnt_sh", 1, 64), 1), align=4,
            )
        )
    return args


def args_for(mode: str, counts: bool, q_fused: bool = False) -> list:
    """The exported entry's arguments, in the order of ``Sm90SparseAttention.run_<mode>[_qf][_cnt]``
    (``q_fused``: bf16 Q, quantized by the kernel itself, so no ``q_scale``)."""
    if mode == "bf16":
        args = [_bshd("q", "bfloat16", "SQ"), _bshd("k", "bfloat16", "SK"), _bshd("v", "bfloat16", "SK")]
    else:
        args = [
            _bshd("q", "bfloat16" if q_fused else "int8", "SQ"),
            _bshd("k", "int8", "SK"),
            # FP8 V^T, (B, H, 128, SKP): SKP = round_up(Sk, 64), keys permuted by V_PERM16
            TensorArg(
                "v", "float8_e4m3fn", (Sym("B"), Sym("H"), 128, Sym("SKP")),
                (Sym("v_sb", 16, 64), Sym("v_sh", 16, 64), Sym("v_sd", 16, 64), 1),
            ),
        ]
    args.append(_bshd("out", "bfloat16", "SQ"))
    args += _plan_args(counts)
    if mode == "sage":
        if not q_fused:
            # layouts of aot/kernels/sage_quant.py (FlashInfer SM120 contract):
            # q_scale one per 32 rows [B,H,ceil(Sq/128)*4], k_scale one per 64 keys
            args.append(TensorArg("q_scale", "float32", (Sym("B"), Sym("H"), Sym("NQ32")),
                                  (Sym("qs_sb", 1, 64), Sym("qs_sh", 1, 64), 1), align=4))
        args += [
            TensorArg("k_scale", "float32", (Sym("B"), Sym("H"), Sym("NK64")),
                      (Sym("ks_sb", 1, 64), Sym("ks_sh", 1, 64), 1), align=4),
            TensorArg("v_scale", "float32", (Sym("B"), Sym("H"), 128),
                      (Sym("vs_sb", 1, 64), Sym("vs_sh", 1, 64), 1), align=4),
        ]
    args += [ScalarArg("scale_log2", "float32", 1.0), ScalarArg("topk", "int32", 1), StreamArg()]
    return args


def variants(mode: str) -> tuple:
    """The shipped variants: every key block with and without per-row counts in the default CTA
    shape, and (Sage) the other shape of each key block."""
    out = []
    for bk in (64, 128):
        for counts in (True, False):
            pair = (mode, bk) in PAIRED
            out.append(Variant(f"k{bk}{'_cnt' if counts else ''}", {"block_k": bk, "counts": counts, "pair": pair}))
    if mode == "sage":
        # the other CTA shape of each key block (k64: one-entry flat; k128: warp-specialised), so
        # that `subblock-sage bench` can compare both in one run and the runtime can switch
        # without a rebuild
        for bk in (64, 128):
            alt = ALT_WGS[("sage", bk)]
            out.append(Variant(f"k{bk}_{'ws' if alt else 'flat'}_cnt", {"block_k": bk, "counts": True, "wgs": alt}))
        # the default (flat) shape of each key block quantizing its own Q tile: the runtime's
        # choice when the build has it (backends/sm90.py), the int8-Q kernels beside it for A/B
        for bk in (64, 128):
            out.append(Variant(f"k{bk}_qf_cnt", {"block_k": bk, "counts": True, "pair": (mode, bk) in PAIRED,
                                                  "q_fused": True}))
        # the default kernel of each key block (on 128-key tiles: paired for 64-key plans) as one
        # CTA, not in two-CTA clusters (config.FLAT_CLUSTER): the runtime's choice for plans whose
        # rows cannot be dense and its alternative (SM90Backend.sage_cluster = 1), for A/B and the
        # bit-identity test
        for bk in (64, 128):
            for tag, qf in (("c1", False), ("c1qf", True)):
                out.append(Variant(f"k{bk}_{tag}_cnt", {"block_k": bk, "counts": True,
                                                        **({"pair": True} if (mode, bk) in PAIRED else {}),
                                                        "cluster": 1, **({"q_fused": True} if qf else {})}))
    return tuple(out)


def config_of(mode: str, params: Mapping[str, Any]) -> Sm90Config:
    """A variant's kernel config: its parameters over the measured defaults (``config.py``)."""
    knobs = {k: v for k, v in params.items() if k in _CONFIG_PARAMS}
    return Sm90Config.resolve(mode, params["block_k"], **knobs)


def _default_kernel(cfg: Sm90Config, params: Mapping[str, Any]):
    from .kernel import Sm90SparseAttention

    return Sm90SparseAttention(cfg)


def spec(mode: str, make_kernel: Callable[[Sm90Config, Mapping[str, Any]], Any] = _default_kernel):
    """The registry's ``compile_spec`` of one mode; ``make_kernel`` builds the kernel object of a
    variant (the experiments module passes its own)."""

    def compile_spec(target: str, variant: Variant) -> CompileSpec:
        counts = variant.params["counts"]
        cfg = config_of(mode, variant.params)
        kern = make_kernel(cfg, variant.params)
        return CompileSpec(kern.entry(counts), args_for(mode, counts, cfg.q_fused), {})

    return compile_spec


def kernels(variants_of: Callable[[str], tuple] = variants, spec_of: Callable[[str], Callable] = spec) -> list:
    """The two registered kernels (the experiments module builds them with more variants)."""
    return [
        Kernel(name=name, doc=doc, targets=("sm_90a",), variants=variants_of(mode), compile_spec=spec_of(mode))
        for name, mode, doc in (
            ("sm90_bsa_bf16", "bf16",
             "SM90a block-sparse attention, BF16 WGMMA (TMA + warp-specialized producer/consumer)"),
            ("sm90_bsa_sage", "sage",
             "SM90a block-sparse Sage attention: INT8 Q.K^T (s32), FP8-E4M3 P.V, two-level FP32 accumulation"),
        )
    ]


KERNELS: list = kernels()
