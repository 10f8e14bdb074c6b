"""The router kernels' argument specs (the C ABI the runtime marshals) and the compile specs that
build each export. Importing this module does not import CuTe-DSL (the registry must be listable
without it): a kernel module is imported when its export is compiled."""

from aot.contract import HEAD_DIM
from aot.kernels.router.spec import PHASE_FUSED
from aot.registry import CompileSpec, ScalarArg, StreamArg, Sym, TensorArg, Variant


def _s(key: str, div: int = 1) -> Sym:
    return Sym(key, div=div, width=64)


B, H = Sym("B"), Sym("H")


def _bshd(name: str, seq: str) -> TensorArg:
    return TensorArg(name, "bfloat16", (B, Sym(seq), H, HEAD_DIM),
                     (_s(f"{name}.stride_b", 8), _s(f"{name}.stride_s", 8), _s(f"{name}.stride_h", 8), 1), align=16)


def _cells(name: str, cells: str) -> TensorArg:
    return TensorArg(name, "bfloat16", (B, H, Sym(cells), HEAD_DIM),
                     (_s(f"{name}.stride_b", 8), _s(f"{name}.stride_h", 8), _s(f"{name}.stride_c", 8), 1), align=16)


def _bhx(name: str, dtype: str, *last: str) -> TensorArg:
    n = len(last)
    return TensorArg(name, dtype, (B, H, *(Sym(x) for x in last)),
                     tuple(_s(f"{name}.stride_{m}") for m in range(1 + n)) + (1,), align=4)


def pool_args() -> list:
    return [_bshd("q", "Sq"), _bshd("k", "Sk"), _cells("pooled_q", "CQ"), _cells("pooled_k", "CK"),
            ScalarArg("sub_q", "int32", 16), ScalarArg("sub_k", "int32", 16),
            ScalarArg("q_scale", "float32", 0.1275), StreamArg()]


def select_args(runtime_n: bool = True) -> list:
    """``dense_rows`` is read only when ``has_dense`` != 0 (the runtime passes another int32
    [B, H, Gq] tensor otherwise): one export serves both. ``runtime_n``: ``n_q``, ``n_k`` and the
    launch's ``phase`` / ``k_splits`` are arguments (``router_select``); the test library's
    ``simt`` is compiled per (n_q, n_k) and always scores and selects in one launch."""
    n = [ScalarArg("n_q", "int32", 4), ScalarArg("n_k", "int32", 4)] if runtime_n else []
    split = [ScalarArg("phase", "int32", PHASE_FUSED), ScalarArg("k_splits", "int32", 1)] if runtime_n else []
    return [_cells("pooled_q", "CQ"), _cells("pooled_k", "CK"), _bhx("scores", "float32", "GQ", "GK"),
            _bhx("q2k_block_index", "int32", "GQ", "CAP"), _bhx("block_counts", "int32", "GQ"),
            _bhx("dense_rows", "int32", "GQ"), *n, ScalarArg("q_valid", "int32", 1),
            ScalarArg("k_valid", "int32", 1), ScalarArg("topk", "int32", 1), ScalarArg("has_dense", "int32", 0),
            *split, StreamArg()]


def pool_spec(target: str, variant: Variant) -> CompileSpec:
    from .pool import RouterPool

    return CompileSpec(RouterPool().run, pool_args())


def select_spec(target: str, variant: Variant) -> CompileSpec:
    from .mma import RouterSelectMma

    return CompileSpec(RouterSelectMma().run, select_args())


def simt_spec(target: str, variant: Variant) -> CompileSpec:
    from .simt import make_simt

    p = variant.params
    return CompileSpec(make_simt(p["n_q"], p["n_k"])().run, select_args(runtime_n=False))
