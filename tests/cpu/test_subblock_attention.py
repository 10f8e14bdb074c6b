"""``subblock_attention`` (api.py, calls.py, ops/pipeline.py) and the public
``route`` without a GPU: the router geometry per target and mode (the backends' rule), typed
errors before any launch, the launches of one call recorded on CPU tensors (the router's two,
then the attention launch on the router's own plan), each check and ``can_implement`` once per
call, and the operators' fake shapes and tracing for torch.compile."""

from __future__ import annotations

import contextlib
import re

import pytest

torch = pytest.importorskip("torch")

import subblock_sage  # noqa: E402
from subblock_sage import api, backends, replay, validation  # noqa: E402
from subblock_sage.backends import backend_for  # noqa: E402
from subblock_sage.contract import LOG2E, MAX_ROUTED_LAUNCHES, SAGE_QUANT_KERNEL  # noqa: E402
from subblock_sage.ops import pipeline as P  # noqa: E402
from subblock_sage.backends import router as BR  # noqa: E402
from subblock_sage.ops import route as R  # noqa: E402


from subblock_sage.router_spec import router_budget  # noqa: E402


class FakeLib:
    """A kernel library that has every kernel (the backend's ``can_implement`` asks it) but no
    variant lookup (``kernel``): as a library without the pooling quantizer, the fused Sage path
    does not apply (``FusedLib`` below has it)."""

    def __init__(self, target, kernels=None):
        self.target, self._kernels = target, kernels

    def has_kernel(self, name):
        return self._kernels is None or name in self._kernels

    def kernel(self, name, **params):
        from subblock_sage.errors import LaunchError

        raise LaunchError(f"{self.target}: no variant {params} of {name} (a test library)")


class FusedLib(FakeLib):
    """FakeLib with the variant lookup the backends make (every variant exists)."""

    def kernel(self, name, **params):
        return (name, tuple(sorted(params.items())))


def test_public_names():
    assert subblock_sage.route is api.route and not hasattr(R, "route")
    assert subblock_sage.subblock_attention is api.subblock_attention
    assert subblock_sage.sparse_attention is api.sparse_attention
    assert {"route", "subblock_attention"} <= set(subblock_sage.__all__)
    assert "route" in (api.route.__doc__ or "") and "sparsity" in api.subblock_attention.__doc__


def test_one_default_compute_mode_for_both_attention_calls():
    """Both attention calls (and the validation of sparse_attention) default to the one
    ``contract.DEFAULT_COMPUTE_MODE``, bf16: served by every target (Sage on sm_100 is opt-in and
    takes fixed-count plans only)."""
    import inspect

    from subblock_sage.contract import DEFAULT_COMPUTE_MODE
    from subblock_sage.ops import attention as A

    assert DEFAULT_COMPUTE_MODE == "bf16"
    for fn in (api.sparse_attention, api.subblock_attention, A.sparse_attention, validation.check_attention_args):
        assert inspect.signature(fn).parameters["compute_mode"].default == DEFAULT_COMPUTE_MODE, fn
    for target in ("sm_90a", "sm_100a", "sm_100f", "sm_120a", "sm_120f"):
        assert DEFAULT_COMPUTE_MODE in backend_for(target).kernels, target
    from subblock_sage.contract import UNVALIDATED

    assert all("sage_fp8" in UNVALIDATED[t] for t in ("sm_100a", "sm_100f"))  # why a Sage default would not do


@pytest.mark.parametrize("target,mode,want", [
    ("sm_90a", "sage_fp8", (128, 1)), ("sm_90a", "bf16", (64, 8)),
    ("sm_120a", "sage_fp8", (64, 1)), ("sm_120a", "bf16", (64, 8)), ("sm_120f", "sage_fp8", (64, 1)),
    ("sm_100a", "bf16", (64, 8)), ("sm_100f", "bf16", (64, 8)),
])
def test_geometry_is_sglangs_per_target_and_mode(target, mode, want):
    """128-key blocks on sm_90a Sage, 64 elsewhere; granularity 1 for Sage, 8 for bf16 (SGLang
    0.5.23's backend: ``_sage_key_block_size()`` and ``budget_granularity``); n_k default bk/16."""
    assert P.geometry("cuda:0", mode, library=FakeLib(target)) == want
    from subblock_sage.integrations.sglang import plan_block_size

    assert plan_block_size(target, mode) == want[0] == backend_for(target).router_block_size_k(mode)


def test_budget_granularity_is_stated_once(monkeypatch):
    """The granularity per mode is ``router_spec.BUDGET_GRANULARITY`` alone: the backends'
    geometry reads it (no table of their own), and ``route``'s default per key-block size is the
    granularity of the mode that routes in those blocks (128: sm_90a Sage; 64: bf16)."""
    from subblock_sage import router_spec
    from subblock_sage.backends import base

    assert router_spec.BUDGET_GRANULARITY == {"bf16": 8, "sage_fp8": 1}
    assert not hasattr(base, "ROUTER_GRANULARITY")
    for target in ("sm_90a", "sm_100a", "sm_120a"):
        be = backend_for(target)
        for mode in be.kernels:
            assert be.router_geometry(mode)[1] == router_spec.BUDGET_GRANULARITY[mode], (target, mode)
    assert router_spec.DEFAULT_GRANULARITY == {
        backend_for("sm_90a").router_block_size_k("sage_fp8"): router_spec.BUDGET_GRANULARITY["sage_fp8"],
        backend_for("sm_90a").router_block_size_k("bf16"): router_spec.BUDGET_GRANULARITY["bf16"]}
    monkeypatch.setattr(R, "check_same_cuda_device", lambda t: None)
    assert R.check_route_args(*_qkv()[:2], sparsity=0.5, block_size_k=64, runtime=False).granularity == 8
    assert R.check_route_args(*_qkv()[:2], sparsity=0.5, block_size_k=128, runtime=False).granularity == 1


def test_geometry_refuses_what_the_target_does_not_serve(monkeypatch):
    monkeypatch.delenv("SUBBLOCK_SAGE_ALLOW_UNVALIDATED", raising=False)
    with pytest.raises(ValueError, match=re.escape("sm_100a: compute_mode='sage_fp8' is UNVALIDATED") + ".*Fix:"):
        P.geometry("cuda:0", "sage_fp8", library=FakeLib("sm_100a"))
    with pytest.raises(ValueError, match="compute_mode must be one of"):
        P.geometry("cuda:0", "fp8", library=FakeLib("sm_90a"))


@pytest.fixture
def recorded(monkeypatch):
    """Launches recorded instead of made (``abi.launch``, and ``abi.prepare``'s launcher), on CPU
    tensors: the device checks see them as the one CUDA device, the quantizer's buffer is a CPU
    tensor; ``target["name"]`` picks the fake library's target, ``target["lib"]`` its class
    (``FakeLib``: no pooling quantizer; ``FusedLib``: every variant)."""
    from subblock_sage import abi
    from subblock_sage.backends import quantizer as Qz
    from subblock_sage.ops import quantize_route as QR

    calls = []
    target = {"name": "sm_90a", "lib": FakeLib}
    monkeypatch.setattr(abi, "launch", lambda k, p, v, **kw: calls.append((k, dict(p), v)))
    monkeypatch.setattr(abi, "prepare", lambda kernel, params, values, library=None:
                        lambda: calls.append((kernel, dict(params), values)))
    from subblock_sage.backends import sm90 as S90

    for mod in (BR, Qz, P, S90):
        monkeypatch.setattr(mod, "cuda_device_index", lambda dev, what="": 0)
    monkeypatch.setattr(S90, "sm_count", lambda index: 1)  # one SM: no pair of the bf16 kernel splits
    for mod in (R, QR, P, validation):
        if hasattr(mod, "check_same_cuda_device"):
            monkeypatch.setattr(mod, "check_same_cuda_device", lambda t: None)
    monkeypatch.setattr(BR, "router_library", lambda index, library: library)
    # one SM: every call's query tiles fill it, so router_select is one fused launch
    monkeypatch.setattr(BR, "sm_count", lambda index: 1)
    monkeypatch.setattr(P.loader, "library_for_device", lambda index: target["lib"](target["name"]))
    monkeypatch.setattr(Qz.workspace, "sync_buffer", lambda device, words: torch.empty(words, dtype=torch.int32))
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    replay.clear()
    yield calls, target
    replay.clear()


@pytest.fixture
def fused(recorded):
    recorded[1]["lib"] = FusedLib
    return recorded


def _qkv(B=1, Sq=1000, Sk=1500, H=3, layout="BSHD"):
    shape = (lambda S: (B, S, H, 128)) if layout == "BSHD" else (lambda S: (B, H, S, 128))
    return (torch.zeros(shape(Sq), dtype=torch.bfloat16), torch.zeros(shape(Sk), dtype=torch.bfloat16),
            torch.zeros(shape(Sk), dtype=torch.bfloat16))


def _scale(values):
    """The softmax scale an attention launch got (sm_90a takes it times log2(e))."""
    return values["softmax_scale"] if "softmax_scale" in values else values["scale_log2"] / LOG2E


@pytest.mark.parametrize("target,mode,bk,g", [("sm_90a", "bf16", 64, 8), ("sm_120a", "bf16", 64, 8),
                                              ("sm_100a", "bf16", 64, 8), ("sm_90a", "sage_fp8", 128, 1),
                                              ("sm_120a", "sage_fp8", 64, 1)])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_one_call_is_route_then_attention(recorded, target, mode, bk, g, layout):
    """Without the pooling quantizer: router_pool, router_select, (Sage: the quantizer without the
    plan role), the attention launch on the router's own plan tensors: no plan kernel, whose work
    the router's plan already is."""
    from subblock_sage.router_spec import router_budget

    calls, tgt = recorded
    tgt["name"] = target
    q, k, v = _qkv(layout=layout)
    out = torch.empty_like(q)
    got = subblock_sage.subblock_attention(q, k, v, sparsity=0.8, compute_mode=mode, softmax_scale=0.1,
                                           layout=layout, out=out)
    assert got is out
    att_kernel = backend_for(target).kernels[mode]
    want = ["router_pool", "router_select"] + ([SAGE_QUANT_KERNEL] if mode == "sage_fp8" else []) + [att_kernel]
    assert [c[0] for c in calls] == want and len(want) <= MAX_ROUTED_LAUNCHES[mode]
    (_, _, pool), (_, p_sel, sel) = calls[:2]
    gk = -(-1500 // bk)
    assert p_sel == {} and sel["n_q"] == 4 and sel["n_k"] == bk // 16  # 16-key cells by default
    assert sel["topk"] == router_budget(gk, 0.8, g) and sel["has_dense"] == 0
    assert pool["sub_k"] == 16 and pool["q_scale"] == pytest.approx(0.1 * LOG2E)
    if mode == "sage_fp8":
        assert calls[2][1].get("plan", "none") == "none" and calls[2][2]["q"].data_ptr() == q.data_ptr()
    # the attention gets the router's own plan tensors, in its key blocks, the caller's scale and out
    _, _, att = calls[-1]
    assert att["q2k_block_index"].data_ptr() == sel["q2k_block_index"].data_ptr()
    assert att["block_counts"].data_ptr() == sel["block_counts"].data_ptr()
    assert att["q2k_block_index"].numel() == sel["q2k_block_index"].numel() == 3 * 16 * sel["topk"]
    assert att["out"].data_ptr() == out.data_ptr() and _scale(att) == pytest.approx(0.1)


def test_n_values_and_sparsity_reach_the_router(recorded):
    calls, _ = recorded
    q, k, v = _qkv()
    subblock_sage.subblock_attention(q, k, v, sparsity=0.5, n_q=2, n_k=8)
    (_, _, pool), (_, p_sel, sel) = calls[:2]
    assert p_sel == {} and (sel["n_q"], sel["n_k"], pool["sub_q"], pool["sub_k"]) == (2, 8, 32, 8)
    assert calls[2][0] == backend_for("sm_90a").kernels["bf16"]  # the default mode, 64-key blocks
    assert sel["q2k_block_index"].shape[-1] == sel["topk"] == 16  # ceil(0.5 * 24) = 12, up to 8s


def test_each_check_and_can_implement_once(recorded, monkeypatch):
    """One subblock_attention call and one sparse_attention call each check the mode once and
    ask the backend's ``can_implement`` once (the call's description is made once; the
    pipeline's steps check nothing)."""
    import sys

    from subblock_sage.backends import base

    calls, _ = recorded
    seen = {"mode": 0, "can": 0}
    real_mode, real_can = validation.check_compute_mode, base.Backend.can_implement

    def mode(m):
        seen["mode"] += 1
        return real_mode(m)

    def can(self, lib, m, bk):
        seen["can"] += 1
        return real_can(self, lib, m, bk)

    for name, mod in list(sys.modules.items()):
        if name.startswith("subblock_sage") and getattr(mod, "check_compute_mode", None) is real_mode:
            monkeypatch.setattr(mod, "check_compute_mode", mode)
    monkeypatch.setattr(base.Backend, "can_implement", can)
    q, k, v = _qkv()
    for mode_ in ("bf16", "sage_fp8"):
        seen.update(mode=0, can=0)
        subblock_sage.subblock_attention(q, k, v, compute_mode=mode_)
        assert seen == {"mode": 1, "can": 1}, (mode_, seen)
    idx = torch.zeros(1, 3, 16, 4, dtype=torch.int32)
    monkeypatch.setattr("subblock_sage.plan._kernel_library", lambda device, library: library)
    for mode_ in ("bf16", "sage_fp8"):
        seen.update(mode=0, can=0)
        subblock_sage.sparse_attention(q, k, v, idx, None, topk=4, compute_mode=mode_,
                                       library=FakeLib("sm_90a"))
        assert seen == {"mode": 1, "can": 1}, (mode_, seen)


@pytest.mark.parametrize("kw,exc,what", [
    (dict(sparsity=1.0), ValueError, "sparsity must be in [0, 1)"),
    (dict(sparsity="x"), TypeError, "sparsity must be a float"),
    (dict(n_q=3), ValueError, "n_q must be one of"),
    (dict(n_k=16), ValueError, "n_k must be one of"),
    (dict(compute_mode="fp8"), ValueError, "compute_mode must be one of"),
    (dict(softmax_scale=0.0), ValueError, "softmax_scale"),
    (dict(layout="SBHD"), ValueError, "layout"),
    (dict(v=torch.zeros(1, 1400, 3, 128, dtype=torch.bfloat16)), ValueError, "k and v must have the same shape"),
    (dict(v=torch.zeros(1, 1500, 3, 128)), TypeError, "bfloat16"),
    (dict(out=torch.zeros(1, 999, 3, 128, dtype=torch.bfloat16)), ValueError, "out must have q's shape"),
    (dict(out=torch.zeros(1, 1000, 3, 128)), TypeError, "out must be torch.bfloat16"),
    (dict(out="q"), ValueError, "out shares memory with q"),
])
def test_errors_before_any_launch(recorded, kw, exc, what):
    calls, tgt = recorded
    q, k, v = _qkv()
    kw = dict(kw)
    v = kw.pop("v", v)
    if kw.get("out") == "q":
        kw["out"] = q
    with pytest.raises(exc, match=re.escape(what)):
        subblock_sage.subblock_attention(q, k, v, **kw)
    assert calls == []


def test_target_refusal_before_any_launch(recorded, monkeypatch):
    calls, tgt = recorded
    tgt["name"] = "sm_100a"
    monkeypatch.delenv("SUBBLOCK_SAGE_ALLOW_UNVALIDATED", raising=False)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="sm_100a: compute_mode='sage_fp8' is UNVALIDATED"):
        subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8")
    assert calls == []


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_b200_sage_is_route_then_cudnns_quantizer_and_kernel(fused, monkeypatch, layout):
    """sm_100a Sage with the opt-in (cuDNN's SM100 kernel, docs/design/sage-sm100.md): the router's
    two launches, cuDNN's quantizer (not ours: no pooling in it), one attention launch with the
    fixed count ``topk`` on the router's index (every routed row holds ``topk`` ids); a BSHD out is
    filled from the kernel's contiguous BHSD output. Off the 64-key grid: a ValueError with the fix
    before any launch."""
    from subblock_sage.backends import sm100

    calls, tgt = fused
    tgt["name"] = "sm_100a"
    monkeypatch.setenv("SUBBLOCK_SAGE_ALLOW_UNVALIDATED", "1")
    q, k, v = _qkv(Sq=1024, Sk=1536, layout=layout)
    out = torch.zeros_like(q)
    subblock_sage.subblock_attention(q, k, v, sparsity=0.8, compute_mode="sage_fp8", layout=layout, out=out)
    assert [c[0] for c in calls] == ["router_pool", "router_select", sm100.SAGE_QUANT, sm100.SAGE_KERNEL]
    sel, att = calls[1][2], calls[-1][2]
    assert att["q2k_block_index"].data_ptr() == sel["q2k_block_index"].data_ptr()
    assert att["block_sparse_num"] == sel["topk"] == router_budget(24, 0.8, 1)
    assert calls[-1][1] == {"use_clc_scheduler": False, "short_tile_opt": True}
    assert (att["out"].data_ptr() == out.data_ptr()) is (layout == "BHSD")
    calls.clear()
    q, k, v = _qkv(layout=layout)  # Sq=1000, Sk=1500
    with pytest.raises(ValueError, match="Sq a multiple of 64.*Fix:"):
        subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8", layout=layout)
    assert calls == []


def test_cpu_tensors_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="CUDA device"):
        subblock_sage.subblock_attention(q, k, v)


# ---- traced: the operators' fake implementations and torch.compile


def test_fake_shapes():
    """On fake CUDA tensors (what torch.compile traces) the call goes through the operator, whose
    fake gives q's shape and layout, contiguous; the out variant writes ``out``; no library is
    needed to trace (the target's geometry is decided when the operator runs)."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no data_ptr of a fake tensor
        with FakeTensorMode():
            for layout in ("BSHD", "BHSD"):
                shape = (2, 1000, 3, 128) if layout == "BSHD" else (2, 3, 1000, 128)
                kshape = (2, 1500, 3, 128) if layout == "BSHD" else (2, 3, 1500, 128)
                q = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
                k = torch.empty(kshape, dtype=torch.bfloat16, device="cuda")
                o = subblock_sage.subblock_attention(q, k, k, compute_mode="sage_fp8", layout=layout)
                assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.is_contiguous()
                out = torch.empty_like(q)
                assert subblock_sage.subblock_attention(q, k, k, layout=layout, out=out) is out
                o = torch.ops.subblock_sage.subblock_attention(q, k, k, 0.75, "bf16", 4, None, 0.088, layout)
                assert o.shape == q.shape
            with pytest.raises(ValueError, match="n_k must be one of"):
                subblock_sage.subblock_attention(q, k, k, n_k=3, layout="BHSD")


class _Traced(Exception):
    pass


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_traces_one_node(monkeypatch, dynamic):
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)
    monkeypatch.setattr(R, "check_same_cuda_device", lambda tensors: None)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: (_ for _ in ()).throw(_Traced("traced"))

    def f(q, k, v, out):
        o = subblock_sage.subblock_attention(q, k, v, sparsity=0.8, compute_mode="sage_fp8", n_k=8)
        subblock_sage.subblock_attention(q, k, v, out=out)
        plan = subblock_sage.route(q, k, sparsity=0.75)
        return o * 2, plan.index, out

    q, k, v = _qkv(Sq=300, Sk=400)
    torch._dynamo.reset()
    with pytest.raises(_Traced, match="traced"):
        torch.compile(f, backend=backend, fullgraph=True, dynamic=dynamic)(q, k, v, torch.empty_like(q))
    torch._dynamo.reset()
    code = graphs[0].code
    assert "subblock_sage.subblock_attention(" in code and "subblock_sage.subblock_attention_out" in code
    assert "subblock_sage.route" in code


def test_compile_still_validates(monkeypatch):
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)
    monkeypatch.setattr(R, "check_same_cuda_device", lambda tensors: None)

    def f(q, k, v):
        return subblock_sage.subblock_attention(q, k, v, sparsity=1.5)

    torch._dynamo.reset()
    with pytest.raises(Exception, match=re.escape("sparsity must be in [0, 1)")):
        torch.compile(f, backend="eager", fullgraph=True)(*_qkv(Sq=300, Sk=400))
    torch._dynamo.reset()


# ---- sage_fp8: the fused path (the pooling quantizer, router_select, the attention kernel)


@pytest.mark.parametrize("target", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_sage_reads_q_and_k_once(fused, target, layout):
    """sage_fp8 with the default cells: three launches, the pooling quantizer, router_select on
    the very cells it wrote, and the attention kernel on its operands and the routed plan (as the
    prepared plan); no router_pool launch and no sparse_attention call."""
    from subblock_sage.ops.quantize_route import POOL_PARAMS

    calls, tgt = fused
    tgt["name"] = target
    q, k, v = _qkv(layout=layout)
    got = subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8", layout=layout)

    names = [c[0] for c in calls]
    assert names == [SAGE_QUANT_KERNEL, "router_select", backend_for(target).kernels["sage_fp8"]], names
    (_, p_quant, quant), (_, p_sel, sel), (_, _, att) = calls
    assert p_quant == POOL_PARAMS and sel["pooled_q"] is quant["pooled_q"] and sel["pooled_k"] is quant["pooled_k"]
    bk = 128 if target == "sm_90a" else 64
    assert sel["q2k_block_index"].shape[-1] == sel["topk"] and p_sel == {} and sel["n_k"] == bk // 16
    idx = att["q2k_block_index"]
    assert idx.data_ptr() == sel["q2k_block_index"].data_ptr() and idx.numel() == sel["q2k_block_index"].numel()
    assert att["block_counts"].data_ptr() == sel["block_counts"].data_ptr()
    assert got.shape == q.shape


def test_sage_with_other_cells_takes_two_launch_path(fused):
    """Cells other than 16 tokens (the pooling quantizer's only size): route in two launches, the
    quantizer on its own (no plan role: the routed plan is prepared), then the attention."""
    calls, _ = fused
    q, k, v = _qkv()
    subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8", n_k=4)  # 128-key blocks: 32-key cells
    assert [c[0] for c in calls] == ["router_pool", "router_select", SAGE_QUANT_KERNEL, "sm90_bsa_sage"]
    assert calls[2][1].get("plan", "none") == "none" and calls[1][2]["topk"] == 3  # ceil(0.25 * 12)


@pytest.mark.parametrize("sms,want", [(1, 0), (4, 0), (7, 3), (13, 0), (48, 24), (64, 24)])
def test_the_bf16_launch_splits_its_last_pairs_by_the_rule(recorded, monkeypatch, sms, want):
    """Sq=1000 (16 query blocks), H=3: 24 pairs of query blocks. With ``bf16_tail="rule"`` the
    sm_90a bf16 launch (the ``tail`` export) gets
    ``contract.sm90_tail_pairs``' count for the device's SM count: the pairs of a part-full last
    wave where their halves fit one wave (24 % 7 = 3 pairs, 6 CTAs on 7 SMs; all 24 on 48 or 64
    SMs), none where every wave is full (1, 4 SMs) or the halves would not fit (24 % 13 = 11 pairs,
    22 CTAs on 13 SMs: the last wave would still take a pair's time)."""
    from subblock_sage.backends import sm90 as S90

    monkeypatch.setattr(S90, "sm_count", lambda index: sms)
    calls, _ = recorded
    q, k, v = _qkv()
    with backends.using(S90.BACKEND.with_policy(bf16_tail="rule")):
        subblock_sage.subblock_attention(q, k, v, sparsity=0.5)
    kernel, params, att = calls[-1]
    assert kernel == backend_for("sm_90a").kernels["bf16"] and params["cluster"] == 1 and params["tail"]
    assert att["tail_pairs"] == want
    subblock_sage.subblock_attention(q, k, v, sparsity=0.5)  # the default policy: the shipped kernels
    assert not calls[-1][1]["tail"] and "tail_pairs" not in calls[-1][2]


def test_a_policy_forces_the_split_and_sage_takes_none(recorded, monkeypatch):
    from subblock_sage.backends import sm90 as S90

    monkeypatch.setattr(S90, "sm_count", lambda index: 1)
    calls, _ = recorded
    q, k, v = _qkv()
    be = S90.BACKEND.with_policy(bf16_tail=1000)  # clamped to the launch's 24 pairs
    idx = torch.zeros(1, 3, 16, 4, dtype=torch.int32)
    subblock_sage.sparse_attention(q, k, v, idx, None, topk=4, backend=be)
    assert calls[-1][2]["tail_pairs"] == 24
    subblock_sage.sparse_attention(q, k, v, idx, None, topk=4, compute_mode="sage_fp8", backend=be)
    assert "tail_pairs" not in calls[-1][2]
