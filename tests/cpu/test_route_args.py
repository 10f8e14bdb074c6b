"""``route`` (python/subblock_sage/ops/route.py) without a GPU: its argument checks (typed errors
with a Fix, raised before anything is launched; every scalar is checked before the tensors, so
the scalar errors show on CPU tensors), the operator's fake shapes, and its two launches recorded
on CPU tensors against the kernels' declared arguments (aot/kernels/router)."""

import re

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.api import route  # noqa: E402
from subblock_sage.ops.route import check_route_args  # noqa: E402
from tests.helpers.launch_args import check_declared  # noqa: E402


def _qk(S=100, H=2, dtype=torch.bfloat16):
    return torch.zeros(1, S, H, 128, dtype=dtype), torch.zeros(1, S, H, 128, dtype=dtype)


@pytest.mark.parametrize("kw,exc,what", [
    (dict(n_q=3), ValueError, "n_q must be one of"),
    (dict(n_k=16), ValueError, "n_k must be one of"),
    (dict(n_q=True), ValueError, "n_q must be one of"),
    # router_select takes n_q, n_k as arguments and trusts them (log2 by popc, shifts): the values
    # it would get wrong never reach it
    (dict(n_q=16), ValueError, "n_q must be one of"),
    (dict(n_k=0), ValueError, "n_k must be one of"),
    (dict(n_k=6), ValueError, "n_k must be one of"),
    (dict(sparsity=1.0), ValueError, "sparsity must be in [0, 1)"),
    (dict(sparsity=-0.1), ValueError, "sparsity must be in [0, 1)"),
    (dict(sparsity=float("nan")), ValueError, "sparsity must be in [0, 1)"),
    (dict(sparsity="0.5"), TypeError, "sparsity must be a float"),
    (dict(block_size_k=32), ValueError, "block_size_k must be one of"),
    (dict(budget_granularity=0), ValueError, "budget_granularity must be >= 1"),
    (dict(budget_granularity=2.5), TypeError, "budget_granularity must be an int"),
    (dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
    (dict(layout="SBHD"), ValueError, "layout"),
])
def test_scalar_errors(kw, exc, what):
    q, k = _qk()
    args = dict(sparsity=0.75, **{k_: v for k_, v in kw.items() if k_ != "sparsity"})
    if "sparsity" in kw:
        args["sparsity"] = kw["sparsity"]
    with pytest.raises(exc, match=re.escape(what)) as e:
        route(q, k, **args)
    if exc is ValueError and "layout" not in kw and "softmax_scale" not in kw:
        assert "Fix:" in str(e.value)


def test_tensor_errors():
    q, k = _qk()
    with pytest.raises(TypeError, match="bfloat16"):
        route(q.half(), k, sparsity=0.5)
    with pytest.raises(ValueError, match="head_dim"):
        route(q[..., :64], k[..., :64], sparsity=0.5)
    with pytest.raises(ValueError, match="empty"):
        route(q[:, :0], k, sparsity=0.5)
    q3, _ = _qk(H=3)
    with pytest.raises(ValueError, match="same batch size and heads"):
        route(q3, k, sparsity=0.5)
    with pytest.raises(ValueError, match="CUDA device"):
        route(q, k, sparsity=0.5)  # every other check passed: only the device is wrong


def test_defaults():
    # the checks up to the device, with the device check bypassed by catching it: the defaults
    # are read off router_spec (n_k: 16-key cells; granularity 8 for 64-key, 1 for 128-key)
    from subblock_sage.ops import route as R

    q, k = _qk(S=200)
    orig = R.check_same_cuda_device
    try:
        R.check_same_cuda_device = lambda t: None
        a = check_route_args(q, k, sparsity=0.75, runtime=False)
        assert (a.n_q, a.n_k, a.granularity, a.block_size_k) == (4, 4, 8, 64)
        assert (a.num_query_blocks, a.num_key_blocks, a.topk, a.capacity) == (4, 4, 4, 4)  # budget 1 rounded up to 8, capped at Gk
        b = check_route_args(q, k, sparsity=0.75, block_size_k=128, runtime=False)
        assert (b.n_k, b.granularity, b.num_key_blocks, b.topk, b.sub_k) == (8, 1, 2, 1, 16)
        with pytest.raises(ValueError, match="does not broadcast"):
            check_route_args(q, k, sparsity=0.5, dense_rows=torch.zeros(5, dtype=torch.bool), runtime=False)
        c = check_route_args(q, k, sparsity=0.5, dense_rows=torch.zeros(4, dtype=torch.bool), runtime=False)
        assert c.capacity == c.num_key_blocks == 4
    finally:
        R.check_same_cuda_device = orig


def test_operator_fake_shapes():
    """The torch.library operator's fake implementation (what torch.compile traces), on fake CUDA
    tensors: the plan's shapes, capacity Gk with dense rows, and route() through the operator."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode


    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no data_ptr of a fake tensor
        with FakeTensorMode():
            q = torch.empty(2, 1000, 3, 128, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(2, 1500, 3, 128, dtype=torch.bfloat16, device="cuda")
            idx, cnt = torch.ops.subblock_sage.route(q, k, 0.75, 0.088, 4, 4, 64, 8, None, "BSHD")
            assert idx.shape == (2, 3, 16, 8) and idx.dtype == torch.int32 and cnt.shape == (2, 3, 16)
            dense = torch.empty(16, dtype=torch.bool, device="cuda")
            idx, _ = torch.ops.subblock_sage.route(q, k, 0.75, 0.088, 4, 4, 64, 8, dense, "BSHD")
            assert idx.shape == (2, 3, 16, 24)  # every key block: Gk = ceil(1500 / 64)
            plan = route(q, k, sparsity=0.75, block_size_k=128)
            assert plan.index.shape == (2, 3, 16, 3) and plan.block_size_k == 128 and plan.seqlen_k == 1500


# ---- the launches, recorded on CPU tensors (no GPU, no kernel library)


@pytest.fixture
def recorded(monkeypatch):
    import contextlib

    from subblock_sage import abi
    from subblock_sage.backends import router as BR
    from subblock_sage.ops import route as R

    calls = []
    monkeypatch.setattr(abi, "launch", lambda k, p, v, **kw: calls.append((k, dict(p), v)))
    monkeypatch.setattr(BR, "cuda_device_index", lambda dev: 0)
    monkeypatch.setattr(R, "check_same_cuda_device", lambda t: None)
    monkeypatch.setattr(BR, "router_library", lambda index, library: None)
    # one SM: every call's query tiles fill it, so router_select is one fused launch
    monkeypatch.setattr(BR, "sm_count", lambda index: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    return calls


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("bk,n_q,n_k", [(64, 4, 4), (128, 4, None), (64, 1, 8), (128, 8, 2)])
def test_launches_match_the_kernels(recorded, dense, bk, n_q, n_k):
    from aot.kernels import router

    from subblock_sage.router_spec import LOG2E, router_budget

    B, Sq, Sk, H = 2, 1000, 1500, 3
    q = torch.zeros(B, Sq, H, 128, dtype=torch.bfloat16)
    k = torch.zeros(B, Sk, H, 128, dtype=torch.bfloat16)
    gq, gk = 16, -(-Sk // bk)
    rows = torch.zeros(gq, dtype=torch.bool) if dense else None
    plan = route(q, k, sparsity=0.75, softmax_scale=0.1, n_q=n_q, n_k=n_k, block_size_k=bk, dense_rows=rows)
    nk = bk // 16 if n_k is None else n_k
    topk = router_budget(gk, 0.75, 8 if bk == 64 else 1)
    assert [c[0] for c in recorded] == ["router_pool", "router_select"]
    (_, p_pool, v_pool), (_, p_sel, v_sel) = recorded
    # the one shipped select export: n_q and n_k are its arguments, not a variant's parameters
    assert p_pool == {} and p_sel == {}
    assert (v_sel["n_q"], v_sel["n_k"]) == (n_q, nk)
    check_declared(router.pool_args(), v_pool)
    check_declared(router.select_args(), v_sel)
    assert v_pool["sub_q"] == 64 // n_q and v_pool["sub_k"] == bk // nk
    assert v_pool["q_scale"] == pytest.approx(0.1 * LOG2E)
    assert v_pool["pooled_q"].shape == (B, H, gq * n_q, 128) and v_pool["pooled_k"].shape == (B, H, gk * nk, 128)
    assert v_sel["pooled_q"] is v_pool["pooled_q"] and v_sel["pooled_k"] is v_pool["pooled_k"]
    assert v_sel["q_valid"] == -(-Sq // (64 // n_q)) and v_sel["k_valid"] == -(-Sk // (bk // nk))
    assert v_sel["topk"] == topk and v_sel["has_dense"] == int(dense)
    assert v_sel["scores"].shape == (B, H, gq, gk) and v_sel["scores"].dtype == torch.float32
    assert plan.index is v_sel["q2k_block_index"] and plan.counts is v_sel["block_counts"]
    assert plan.capacity == (gk if dense else topk) and plan.topk == topk
    assert plan.block_size_k == bk and plan.seqlen_k == Sk


class _FakeLib:
    """A library that has the kernels named (``has_kernel``), for the select-library choice."""

    def __init__(self, *kernels):
        from pathlib import Path

        self.kernels, self.target, self.path = set(kernels), "sm_90a", Path("libsubblock_sage_test_sm90a.so")

    def has_kernel(self, kernel):
        return kernel in self.kernels


@pytest.mark.parametrize("n_q,n_k", [(4, 4), (1, 8), (8, 1)])
def test_simt_launches_the_test_librarys_kernel(recorded, n_q, n_k):
    """impl='simt': the pool launch as route's, then the test library's SIMT kernel selected by
    (n_q, n_k) and given the rest of the select launch's values."""
    from aot.kernels import router

    from subblock_sage.ops.route import route_with_scores

    q, k = torch.zeros(1, 700, 2, 128, dtype=torch.bfloat16), torch.zeros(1, 900, 2, 128, dtype=torch.bfloat16)
    testlib = _FakeLib("router_select_simt")
    route_with_scores(q, k, sparsity=0.5, n_q=n_q, n_k=n_k, impl="simt", select_library=testlib)
    (pool_name, _, v_pool), (name, params, values) = recorded
    assert (pool_name, name, params) == ("router_pool", "router_select_simt", {"n_q": n_q, "n_k": n_k})
    check_declared(router.select_args(runtime_n=False), values)
    assert values["pooled_q"] is v_pool["pooled_q"]


def test_simt_needs_the_test_library(recorded):
    from subblock_sage.errors import LaunchError
    from subblock_sage.ops.route import route_with_scores

    q, k = _qk()
    with pytest.raises(LaunchError, match=r"has no router_select_simt.*Fix: build it with SBS_TEST_LIBS=ON"):
        route_with_scores(q, k, sparsity=0.5, impl="simt", select_library=_FakeLib("router_pool", "router_select"))
    assert recorded == []  # refused before the pool launch
    with pytest.raises(ValueError, match="impl must be one of"):
        route_with_scores(q, k, sparsity=0.5, impl="tf32")


def test_the_router_names_come_from_router_spec():
    """One definition (router_spec.py; tests/cpu/test_router_export.py checks no other file assigns
    them and that the build registers exactly these kernels)."""
    from subblock_sage import router_spec
    from subblock_sage.backends import router as BR

    assert BR.SELECT_IMPLS is router_spec.SELECT_IMPLS and BR.SELECT_IMPLS[0] == "mma"
    assert BR.ROUTER_KERNELS == (router_spec.POOL_KERNEL, router_spec.SELECT_KERNELS["mma"])


def _args(B, H, Sq, Sk, bk=64, n_q=4, n_k=None):
    from subblock_sage.ops.route import RouteArgs
    from subblock_sage.router_spec import default_n_k

    return RouteArgs(None, None, 0.75, 0.1, n_q, n_k or default_n_k(bk), bk, 8, None, B, H, Sq, Sk)


@pytest.mark.parametrize("H,want", [(14, ((0, 1),)), (6, ((1, 5), (2, 1))), (2, ((1, 15), (2, 1)))])
def test_select_launches_split_the_key_tiles_of_small_grids(H, want):
    """S=37760 on 132 SMs: 37 query tiles per head; 14 heads fill the GPU (one fused launch), 6
    and 2 split each query tile's 37 key tiles to reach 8 CTAs per SM, then select."""
    from subblock_sage.backends.router import select_launches
    from subblock_sage.router_spec import PHASE_FUSED, PHASE_SCORES, PHASE_SELECT

    assert (PHASE_FUSED, PHASE_SCORES, PHASE_SELECT) == (0, 1, 2)
    assert select_launches(_args(1, H, 37760, 37760), 132) == want


def test_select_launches_forced_and_bounded():
    from subblock_sage.backends.router import select_launches

    a = _args(1, 2, 37760, 37760)
    assert select_launches(a, 132, k_splits=1) == ((0, 1),)
    assert select_launches(a, 132, k_splits=5) == ((1, 5), (2, 1))
    # never more splits than key tiles: 300 keys = 5 blocks of 64 = 20 cells, one tile
    assert select_launches(_args(1, 1, 65, 300), 132) == ((0, 1),)
    assert select_launches(_args(1, 1, 65, 300), 132, k_splits=7) == ((0, 1),)
    # 128-key blocks, n_k 8: 295 blocks x 8 cells = 37 tiles as well
    assert select_launches(_args(1, 2, 37760, 37760, bk=128), 132) == ((1, 15), (2, 1))


def test_split_launches_in_order(recorded, monkeypatch):
    """Where the query tiles leave SMs idle: router_pool, router_select scoring (phase 1, k_splits)
    then router_select selecting (phase 2), on the same tensors."""
    from subblock_sage.backends import router as BR

    monkeypatch.setattr(BR, "sm_count", lambda index: 132)
    q = torch.zeros(1, 4096, 2, 128, dtype=torch.bfloat16)
    route(q, q, sparsity=0.5)
    assert [c[0] for c in recorded] == ["router_pool", "router_select", "router_select"]
    (_, _, s1), (_, _, s2) = recorded[1:]
    assert (s1["phase"], s2["phase"], s2["k_splits"]) == (1, 2, 1) and s1["k_splits"] == 4
    for name in ("pooled_q", "pooled_k", "scores", "q2k_block_index", "block_counts"):
        assert s1[name] is s2[name], name
