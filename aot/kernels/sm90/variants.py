"""Registry entries of the SM90a attention kernels: the exported variants, their argument specs
(the C ABI the runtime marshals) and the compile spec that builds each one.

Importing this module does not import CuTe-DSL (the registry must be listable without it): the
kernel class is imported when a variant is compiled.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import dataclasses

from aot.contract import BF16, BLOCK_SIZES_K, HEAD_DIM, SAGE_FP8, SM90_KERNELS, family_targets, sm90_takes_tail
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

from .config import ALT_WGS, PAIRED, Sm90Config

# A variant's name, derived from its config by ``variant_name`` (names are part of the exported
# symbols, ``registry.symbol_prefix``): ``k{plan key block}[_{tags}][_cnt]``, the tags joined in
# this order, each saying where the config differs from the measured default of its key block
# (``Sm90Config.resolve``; the default itself has no tag):
#   ws / ws2 / flat  the other CTA shape: a TMA producer warpgroup and one / two consumer
#                    warpgroups, or flat (on 64-key plans: one entry per 64-key tile, not paired)
#   s{K}{V}          K / V ring depths other than the shape's default
#   cta{n}           n CTAs per SM (the flat shape's launch bound) other than the default
#   pv{n}            the Sage P.V tile in n column slices other than the default
#   eager            K/V refills issued as soon as a buffer is released (default: in the shadow
#                    of the next MMAs)
#   f{n}             n flat warpgroups per CTA
#   c{n}             n CTAs per cluster where the default differs (c1: one CTA where the default
#                    runs two-CTA clusters; c2: two-CTA clusters where it runs one)
#   kvs              (bf16, two consumers) one K/V ring shared by a CTA's two dense rows
#   tail             (bf16, two consumers) the launch's last pairs of query blocks split (tail_pairs)
#   qf               the kernel quantizes its own bf16 Q tile (no q_scale argument)
#   _cnt             per-row block counts (``block_counts``) instead of the scalar ``topk``
# (a build outside the release, aot/experiments, may append a tag of its own: ``variant_name``'s
# ``tag``)
# e.g. ``k64_c1qf_cnt``: 64-key plans in the default shape (paired flat Sage), one CTA per
# cluster, Q quantized by the kernel, per-row counts.


def plan_block_k(cfg: Sm90Config) -> int:
    """The plan's key-block size of a kernel config (a paired kernel takes 64-key plans)."""
    return 64 if cfg.pair else cfg.block_k


def variant_params(cfg: Sm90Config, counts: bool) -> dict:
    """What an export records as its ``params`` (exports.json, manifest.json): the full resolved
    config (``tile_k`` the tile width, ``block_k`` the plan's key block) and ``counts``. The
    runtime selects by the ``contract.SM90_SELECT_AXES`` among them."""
    p = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "block_k"}
    p.update(block_k=plan_block_k(cfg), tile_k=cfg.block_k, counts=counts)
    return p


def config_of(params) -> Sm90Config:
    """The kernel config an export's ``params`` record (``variant_params``)."""
    fields = {f.name for f in dataclasses.fields(Sm90Config)} - {"block_k"}
    return Sm90Config(block_k=params["tile_k"], **{k: params[k] for k in fields})


def variant_name(cfg: Sm90Config, counts: bool, tag: str = "") -> str:
    """The variant name of ``cfg`` (the table above); ``tag`` goes after the table's tags."""
    bk = plan_block_k(cfg)
    shape = Sm90Config.resolve(cfg.mode, bk, wgs=cfg.wgs, pair=cfg.pair)
    tags = []
    default = Sm90Config.resolve(cfg.mode, bk, pair=(cfg.mode, bk) in PAIRED)
    if (cfg.wgs, cfg.pair) != (default.wgs, default.pair):
        tags.append({0: "flat", 1: "ws", 2: "ws2"}[cfg.wgs])
    if (cfg.k_stages, cfg.v_stages) != (shape.k_stages, shape.v_stages):
        tags.append(f"s{cfg.k_stages}{cfg.v_stages}")
    # the launch bound the config's other knobs imply (flat_wgs=3 forces one CTA per SM)
    knobs = Sm90Config.resolve(cfg.mode, bk, wgs=cfg.wgs, pair=cfg.pair, stages=(cfg.k_stages, cfg.v_stages),
                               refill=cfg.refill, q_fused=cfg.q_fused, flat_wgs=cfg.flat_wgs)
    if cfg.ctas_per_sm != knobs.ctas_per_sm:
        tags.append(f"cta{cfg.ctas_per_sm}")
    if cfg.pv_parts != shape.pv_parts:
        tags.append(f"pv{cfg.pv_parts}")
    if cfg.refill != "shadow":
        tags.append(cfg.refill)
    if cfg.flat_wgs != 1:
        tags.append(f"f{cfg.flat_wgs}")
    if cfg.cluster != knobs.cluster:
        tags.append(f"c{cfg.cluster}")
    if cfg.kv_share:
        tags.append("kvs")
    if cfg.tail:
        tags.append("tail")
    if cfg.q_fused:
        tags.append("qf")
    if tag:
        tags.append(tag)
    return f"k{bk}" + (f"_{''.join(tags)}" if tags else "") + ("_cnt" if counts else "")


def variant(cfg: Sm90Config, counts: bool = True) -> Variant:
    """The registry entry of one export: its name and params, both from ``cfg``."""
    return Variant(variant_name(cfg, counts), variant_params(cfg, counts))


def _bshd(name: str, dtype: str, seq: str) -> TensorArg:
    # (B, S, H, 128), last dim contiguous; strides in elements must keep 16-byte alignment
    # (TMA): the runtime checks stride % (16 // itemsize) == 0 and data_ptr % 16 == 0.
    div = 16 if dtype in ("int8", "float8_e4m3fn") else 8
    return TensorArg(
        name, dtype, (Sym("B"), Sym(seq), Sym("H"), HEAD_DIM),
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


# the tensors of ``Sm90SparseAttention.run`` that a variant's C ABI may leave out (passed as None)
OPTIONAL_TENSORS = ("block_counts", "q_scale", "k_scale", "v_scale")


def args_for(mode: str, counts: bool, q_fused: bool = False, tail: bool = False) -> list:
    """The exported entry's arguments, in the order of ``Sm90SparseAttention.run``'s parameters
    less the ``OPTIONAL_TENSORS`` the variant has no use for (``q_fused``: bf16 Q, quantized by the
    kernel itself, so no ``q_scale``); ``tail`` (``contract.sm90_takes_tail``): ``tail_pairs``, the
    pairs of query blocks the launch splits (``kernel.ws_split``)."""
    if mode == "bf16":
        args = [_bshd("q", "bfloat16", "SQ"), _bshd("k", "bfloat16", "SK"), _bshd("v", "bfloat16", "SK")]
    else:
        args = [
            _bshd("q", "bfloat16" if q_fused else "int8", "SQ"),
            _bshd("k", "int8", "SK"),
            # FP8 V^T, (B, H, 128, SKP): SKP = round_up(Sk, 64), keys permuted by V_PERM16
            TensorArg(
                "v", "float8_e4m3fn", (Sym("B"), Sym("H"), HEAD_DIM, Sym("SKP")),
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
            TensorArg("v_scale", "float32", (Sym("B"), Sym("H"), HEAD_DIM),
                      (Sym("vs_sb", 1, 64), Sym("vs_sh", 1, 64), 1), align=4),
        ]
    args += [ScalarArg("scale_log2", "float32", 1.0), ScalarArg("topk", "int32", 1)]
    if tail:
        args.append(ScalarArg("tail_pairs", "int32", 0))
    return args + [StreamArg()]


def variants(mode: str) -> tuple:
    """The shipped variants (in export order): every key block with and without per-row counts
    in the default CTA shape, and (Sage) with per-row counts: the default shape quantizing its own
    Q tile, and the default shape as one CTA beside its two-CTA cluster kernel (with and without Q
    quantized); (bf16, with per-row counts) the default shape whose two consumers share one K/V
    ring on a pair of dense rows."""
    resolve = Sm90Config.resolve
    out = [variant(resolve(mode, bk, pair=(mode, bk) in PAIRED), counts)
           for bk in BLOCK_SIZES_K for counts in (True, False)]
    if mode == "sage":
        out += [variant(resolve(mode, bk, pair=(mode, bk) in PAIRED, q_fused=True)) for bk in BLOCK_SIZES_K]
        out += [variant(resolve(mode, bk, pair=(mode, bk) in PAIRED, cluster=1, q_fused=qf))
                for bk in BLOCK_SIZES_K for qf in (False, True)]
    else:
        out += [variant(resolve(mode, bk, kv_share=True)) for bk in BLOCK_SIZES_K]
    return tuple(out)


def bench_variants(mode: str) -> tuple:
    """The variants only a benchmark or a GPU test selects (``SelectionPolicy.sage_alt_shape``,
    ``bf16_cluster=4``, ``bf16_tail``; the default policy never does), built into the sm_90a test
    library (``Kernel.test_variants``): (Sage) the other CTA shape of each key block, (bf16) the
    shared-ring kernel in two-CTA clusters (four dense rows per load) and the default and
    shared-ring kernels whose last pairs of query blocks split (``tail``: not shipped until a GPU
    run has timed them)."""
    resolve = Sm90Config.resolve
    if mode == "sage":
        return tuple(variant(resolve(mode, bk, wgs=ALT_WGS[(mode, bk)])) for bk in BLOCK_SIZES_K)
    return tuple(variant(resolve(mode, bk, kv_share=share, cluster=cl, tail=tail)) for bk in BLOCK_SIZES_K
                 for share, cl, tail in ((True, 2, False), (False, 1, True), (True, 1, True)))


def _default_kernel(cfg: Sm90Config, params: Mapping[str, Any]):
    from .kernel import Sm90SparseAttention

    return Sm90SparseAttention(cfg)


def spec(mode: str, make_kernel: Callable[[Sm90Config, Mapping[str, Any]], Any] = _default_kernel):
    """The registry's ``compile_spec`` of one mode; ``make_kernel`` builds the kernel object of a
    variant (aot/experiments/sm90 passes its own)."""

    def compile_spec(target: str, variant: Variant) -> CompileSpec:
        counts = variant.params["counts"]
        cfg = config_of(variant.params)
        kern = make_kernel(cfg, variant.params)
        args = args_for(mode, counts, cfg.q_fused, sm90_takes_tail(variant.params))
        given = {a.name for a in args}
        absent = {name: None for name in OPTIONAL_TENSORS + ("tail_pairs",) if name not in given}
        return CompileSpec(kern.run, args, absent, by_name=True)

    return compile_spec


def kernels(variants_of: Callable[[str], tuple] = variants, spec_of: Callable[[str], Callable] = spec) -> list:
    """The two registered kernels (aot/experiments/sm90 builds them with more variants)."""
    return [
        Kernel(name=name, doc=doc, targets=family_targets("sm90"), variants=variants_of(mode),
               compile_spec=spec_of(mode), test_variants=bench_variants(mode))
        for (name, mode), doc in (
            (SM90_KERNELS[BF16.name],  # names and modes: contract.ATTENTION, ComputeMode.sm90_mode
             "SM90a block-sparse attention, BF16 WGMMA (TMA + warp-specialized producer/consumer)"),
            (SM90_KERNELS[SAGE_FP8.name],
             "SM90a block-sparse Sage attention: INT8 Q.K^T (s32), FP8-E4M3 P.V, two-level FP32 accumulation"),
        )
    ]


KERNELS: list = kernels()
