"""``quantize_and_route`` (python/subblock_sage/ops/quantize_route.py) without a GPU: its launches
recorded on CPU tensors against the kernels' declared arguments (the pooling quantizer, variant
``pool`` of ``sage_quant_kv``, then ``router_select`` on the very cells it wrote), the Q-pool-only
pass of sm_90a's Q-fused call, the refusal of cells other than 16 tokens before any launch, and
the operator's fake shapes. The numerics are checked on a GPU (tests/gpu/test_quantize_route.py)."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.backends import quantizer as Qz  # noqa: E402
from subblock_sage.ops import quantize_route as QR  # noqa: E402
from subblock_sage.backends import router as BR  # noqa: E402
from subblock_sage.ops import route as R  # noqa: E402
from subblock_sage.router_spec import LOG2E, router_budget  # noqa: E402
from tests.helpers.launch_args import check_declared  # noqa: E402


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(Qz.abi, "launch", lambda k, p, v, **kw: calls.append((k, dict(p), v)))
    for mod in (Qz, BR):
        monkeypatch.setattr(mod, "cuda_device_index", lambda dev: 0)
    from subblock_sage import validation

    for mod in (R, validation):  # (v's device check is validation.check_v's)
        monkeypatch.setattr(mod, "check_same_cuda_device", lambda t: None)
    monkeypatch.setattr(BR, "router_library", lambda index, library: None)
    monkeypatch.setattr(BR, "check_pooling", lambda lib: lib)
    # one SM: every call's query tiles fill it, so router_select is one fused launch
    monkeypatch.setattr(BR, "sm_count", lambda index: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    buffers = {}

    def sync_buffer(device, words):
        buf = buffers.get(device)
        if buf is None or buf.numel() < words:
            buf = buffers[device] = torch.empty(words, dtype=torch.int32)
        return buf

    monkeypatch.setattr(Qz.workspace, "sync_buffer", sync_buffer)
    return calls


def _qkv(B, Sq, Sk, H, layout="BSHD"):
    shape = (lambda S: (B, S, H, 128)) if layout == "BSHD" else (lambda S: (B, H, S, 128))
    return (torch.zeros(shape(Sq), dtype=torch.bfloat16), torch.zeros(shape(Sk), dtype=torch.bfloat16),
            torch.zeros(shape(Sk), dtype=torch.bfloat16))


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("dense", [False, True])
def test_launches_match_the_kernels(recorded, with_q, bk, dense):
    from aot.kernels import router, sage_quant

    B, Sq, Sk, H = 2, 1000, 1500, 3
    q, k, v = _qkv(B, Sq, Sk, H)
    gq, gk = 16, -(-Sk // bk)
    rows = torch.zeros(gq, dtype=torch.bool) if dense else None
    ops, plan = QR.quantize_and_route(q, k, v, sparsity=0.75, softmax_scale=0.1, block_size_k=bk, dense_rows=rows,
                                      with_q=with_q)
    nk = bk // 16
    assert [c[0] for c in recorded] == ["sage_quant_kv", "router_select"]
    (_, p_q, v_q), (_, p_sel, v_sel) = recorded
    assert p_q == {"plan": "none", "pool": True} == QR.POOL_PARAMS
    assert p_sel == {} and (v_sel["n_q"], v_sel["n_k"]) == (4, nk)  # the one shipped select export
    ties = check_declared(sage_quant.kv_args("none", pool=True), v_q)
    check_declared(router.select_args(), v_sel)
    # Q keeps its rows in both passes (its tiles pool it); codes only with Q
    assert v_q["q"].shape == (B, Sq, H, 128) and ties["Sq"] == Sq
    assert ties["Sq8"] == (Sq if with_q else 0) and v_q["q_scale"].shape[2] == (-(-Sq // 128) * 4 if with_q else 0)
    assert v_q["q_pool_scale"] == pytest.approx(0.1 * LOG2E)
    # 16-token cells, every cell of the last block (router_spec's layout), read by the select launch
    assert v_q["pooled_q"].shape == (B, H, gq * 4, 128) and v_q["pooled_k"].shape == (B, H, gk * nk, 128)
    assert v_q["pooled_q"].dtype == v_q["pooled_k"].dtype == torch.bfloat16
    assert v_sel["pooled_q"] is v_q["pooled_q"] and v_sel["pooled_k"] is v_q["pooled_k"]
    assert v_sel["q_valid"] == -(-Sq // 16) and v_sel["k_valid"] == -(-Sk // 16)
    topk = router_budget(gk, 0.75, 8 if bk == 64 else 1)
    assert v_sel["topk"] == topk and v_sel["has_dense"] == int(dense)
    assert plan.index is v_sel["q2k_block_index"] and plan.counts is v_sel["block_counts"]
    assert plan.capacity == (gk if dense else topk) and plan.block_size_k == bk and plan.seqlen_k == Sk
    # the operands are the quantizer's outputs, as quantize_sage returns them
    assert set(ops) == ({"q_int8", "q_scale"} if with_q else set()) | {"k_int8", "k_scale", "v_fp8", "v_scale",
                                                                      "k_mean"}
    assert ops["k_int8"].permute(0, 2, 1, 3).data_ptr() == v_q["k_int8"].data_ptr()
    assert ops["v_fp8"] is v_q["v_fp8"] and ops["k_mean"] is v_q["k_mean"]


def test_bhsd_inputs_are_read_in_place(recorded):
    q, k, v = _qkv(1, 200, 300, 2, layout="BHSD")
    QR.quantize_and_route(q, k, v, sparsity=0.5, layout="BHSD")
    (_, _, v_q), _ = recorded
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert v_q[name].data_ptr() == t.data_ptr() and v_q[name].shape == t.permute(0, 2, 1, 3).shape


@pytest.mark.parametrize("kw", [dict(n_q=2), dict(n_q=8), dict(n_k=8), dict(block_size_k=128, n_k=4),
                                dict(n_k=1)])
def test_other_cells_are_refused_before_any_launch(recorded, kw):
    q, k, v = _qkv(1, 200, 300, 2)
    with pytest.raises(ValueError, match=r"pools 16-token cells only.*Fix: .*subblock_sage\.route"):
        QR.quantize_and_route(q, k, v, sparsity=0.5, **kw)
    assert not recorded


def test_v_is_checked(recorded):
    q, k, v = _qkv(1, 200, 300, 2)
    with pytest.raises(ValueError, match="same shape"):
        QR.quantize_and_route(q, k, v[:, :299], sparsity=0.5)
    with pytest.raises(TypeError, match="bfloat16"):
        QR.quantize_and_route(q, k, v.half(), sparsity=0.5)
    with pytest.raises(ValueError, match="sparsity must be in"):
        QR.quantize_and_route(q, k, v, sparsity=1.5)
    assert not recorded


def test_only_torch_empty_is_allocated(recorded, monkeypatch):
    """A recorded call must replay as its launches: nothing but torch.empty (the dense-rows
    conversion aside, which this call has none of)."""
    def refuse(*a, **kw):
        raise AssertionError("quantize_and_route may allocate with torch.empty only")

    for name in ("zeros", "zeros_like", "ones", "full", "full_like", "empty_like", "tensor"):
        monkeypatch.setattr(torch, name, refuse)
    q = torch.empty(1, 300, 2, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 500, 2, 128, dtype=torch.bfloat16)
    QR.quantize_and_route(q, k, torch.empty_strided(k.shape, k.stride(), dtype=torch.bfloat16), sparsity=0.5)
    assert [c[0] for c in recorded] == ["sage_quant_kv", "router_select"]


def test_library_without_the_pooling_variant_is_refused():
    from subblock_sage.errors import LaunchError

    class Lib:
        target = "sm_90a"

        def has_kernel(self, name):
            return True

        def kernel(self, name, **params):
            raise LaunchError(f"no variant of {name} has {params}")

    with pytest.raises(LaunchError, match=r"no pooling variant.*Fix: install"):
        QR._library(0, Lib())


@pytest.mark.parametrize("with_q", [True, False])
def test_operator_fake_shapes(with_q):
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no data_ptr of a fake tensor
        with FakeTensorMode():
            q = torch.empty(2, 1000, 3, 128, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(2, 1500, 3, 128, dtype=torch.bfloat16, device="cuda")
            v = torch.empty(2, 1500, 3, 128, dtype=torch.bfloat16, device="cuda")
            out = torch.ops.subblock_sage.quantize_and_route(q, k, v, 0.75, 0.088, 4, 8, 128, 1, None, "BSHD", with_q)
            shapes = [tuple(t.shape) for t in out]
            sq = 1000 if with_q else 0
            assert shapes == [(2, 3, sq, 128), (2, 3, -(-sq // 128) * 4), (2, 3, 1500, 128), (2, 3, 24),
                              (2, 3, 128, 1536), (2, 3, 128), (2, 3, 128), (2, 3, 16, 3), (2, 3, 16)]
            assert out[4].dtype == torch.float8_e4m3fn and out[7].dtype == out[8].dtype == torch.int32
            ops, plan = QR.quantize_and_route(q, k, v, sparsity=0.75, block_size_k=128, with_q=with_q)
            assert ("q_int8" in ops) == with_q and ops["v_fp8"].shape == (2, 3, 128, 1536)
            assert plan.index.shape == (2, 3, 16, 3) and plan.block_size_k == 128 and plan.seqlen_k == 1500
