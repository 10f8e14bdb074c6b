"""Registry entry of the Sage quantizer: its variants (the runtime's ``plan`` parameter), argument
specs (the C ABI the runtime marshals) and the compile spec that builds each one.

Importing this module does not import CuTe-DSL (the registry must be listable without it): the
kernel class is imported when a variant is compiled.
"""

from __future__ import annotations

from aot.contract import HEAD_DIM, SAGE_SYNC_ARG
from aot.kernels import plan_prepare
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

from .spec import K_BLOCK, KV_CTAS_PER_SM, POOL_CTAS_PER_SM, TARGETS

# variants of sage_quant_kv: name -> its "plan" parameter (what the runtime selects by)
PLAN_VARIANTS = {"noplan": "none", "cnt": "counts", "topk": "topk"}
# and the one that also pools Q and K for the router (``pool.py``): plan "none", "pool" True
POOL_VARIANT = "pool"

B = Sym("B")
H = Sym("H")
SQ = Sym("Sq")
SK = Sym("Sk")


def _s(key: str, div: int = 1) -> Sym:
    return Sym(key, div=div, width=64)


def _bshd(name: str, dtype: str, seq: Sym, div: int) -> TensorArg:
    return TensorArg(
        name,
        dtype,
        (B, seq, H, HEAD_DIM),
        (_s(f"{name}.stride_b", div), _s(f"{name}.stride_s", div), _s(f"{name}.stride_h", div), 1),
        align=16,
    )


def _bhx(name: str, last: int | Sym, div: int = 1, align: int = 4) -> TensorArg:
    return TensorArg(
        name, "float32", (B, H, last), (_s(f"{name}.stride_b", div), _s(f"{name}.stride_h", div), 1), align=align
    )


def _sync() -> TensorArg:
    return TensorArg(SAGE_SYNC_ARG, "int32", (Sym("NSync"),), (1,), align=8)  # 8: the 64-bit counter and slots


def _cells(name: str, cells: str) -> TensorArg:
    return TensorArg(name, "bfloat16", (B, H, Sym(cells), HEAD_DIM),
                     (_s(f"{name}.stride_b", 8), _s(f"{name}.stride_h", 8), _s(f"{name}.stride_c", 8), 1), align=16)


def kv_args(plan: str = "none", pool: bool = False) -> list:
    """The arguments of ``sage_quant_kv`` with the ``plan`` parameter ``plan``: the quantizer's,
    then (plan variants) exactly the plan kernel's, then the stream. ``pool`` (plan "none"):
    the quantizer's, with ``q_int8``'s rows an extent of their own (``Sq`` or 0: Q pooled only),
    then the pooled cells of Q and K (``router_pool``'s ``pooled_q``, ``pooled_k``) and Q's
    factor ``q_pool_scale`` (softmax_scale * log2 e), then the stream."""
    assert not (pool and plan != "none"), "the pool variant has no plan role"
    args = [
        _bshd("q", "bfloat16", SQ, 8),
        _bshd("q_int8", "int8", Sym("Sq8") if pool else SQ, 8),
        _bhx("q_scale", Sym("Gq")),
        _bshd("k", "bfloat16", SK, 8),
        _bshd("v", "bfloat16", SK, 8),
        _bhx("k_mean", HEAD_DIM, 4, 16),
        _bhx("v_scale", HEAD_DIM, 4, 16),
        _bshd("k_int8", "int8", SK, 8),
        _bhx("k_scale", Sym("NBk")),
        TensorArg(
            "v_fp8",
            "float8_e4m3fn",
            (B, H, HEAD_DIM, Sym("Skp", div=K_BLOCK)),
            (_s("v_fp8.stride_b", 16), _s("v_fp8.stride_h", 16), _s("v_fp8.stride_d", 16), 1),
            align=16,
        ),
        _sync(),
    ]
    if plan != "none":
        args += plan_prepare.plan_args(plan == "counts")
    if pool:
        args += [_cells("pooled_q", "CQ"), _cells("pooled_k", "CK"), ScalarArg("q_pool_scale", "float32", 0.1275)]
    return [*args, StreamArg()]


def _spec_kv(target: str, variant: Variant) -> CompileSpec:
    from .kernel import SageQuantKV

    pool = bool(variant.params.get("pool"))
    kernel = SageQuantKV((POOL_CTAS_PER_SM if pool else KV_CTAS_PER_SM)[target])
    plan = variant.params["plan"]
    if pool:
        return CompileSpec(kernel.run_pool, kv_args(plan, pool=True))
    fn = {"none": kernel.run_noplan, "counts": kernel.run_cnt, "topk": kernel.run_topk}[plan]
    return CompileSpec(fn, kv_args(plan))


KERNELS: list[Kernel] = [
    Kernel(
        "sage_quant_kv",
        "a Sage call's one quantizer launch (ticket-ordered CTAs): bf16 Q -> INT8 + a scale per 32 rows; the K "
        "mean of 512 sampled keys; K smoothed, INT8 per 64 keys; V amax/2.25 per channel, FP8-E4M3 transposed "
        "HDS with the 16-token permutation; variants cnt/topk also do the plan_prepare role, variant pool the "
        "router's pooling of Q and K (router_pool's cells)",
        TARGETS,
        (*(Variant(name, {"plan": plan}) for name, plan in PLAN_VARIANTS.items()),
         Variant(POOL_VARIANT, {"plan": "none", "pool": True})),
        _spec_kv,
    ),
]
