"""Sage on sm_100a / sm_100f (cuDNN frontend's SM100 Sage FP8 kernel and its quantizer, AOT-built:
aot/kernels/cudnn_sm100.py) through the runtime, without a GPU.

The calls run the public path (``ops.attention.sparse_attention``: validation, ``serve``, the
backend's ``check_call``, plan preparation, the quantizer, the attention launch) on CPU tensors
against a stub library: the real shim C (aot/shim.py) generated for the exports' C arguments (the
registry's specs) and compiled against stub kernels that log every argument block
(tests/cpu/test_replay.py). A launch must reach the right kernel and variant with the argument
bytes ``abi`` packs for the values the backend built; the refusals must come before any launch.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from aot.kernels import cudnn_sm100  # noqa: E402
from subblock_sage import abi, unvalidated, validation  # noqa: E402
from subblock_sage.backends import sm100  # noqa: E402
from subblock_sage.contract import modes_served  # noqa: E402
from subblock_sage.ops import attention as ops_attention  # noqa: E402
from subblock_sage.plan import PlanSpec  # noqa: E402
from tests.cpu import test_replay as T  # noqa: E402
from tests.cpu.test_cudnn_sm90_runtime import LOGGED_ARGS, _expected_blocks, _launched, _layout  # noqa: E402

SPECS = {"cudnn_sage_sm100_fp8": cudnn_sm100.FP8_ARGS, "cudnn_sage_quant_sm100": cudnn_sm100.QUANT_ARGS}


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory):
    entries = []
    for k in cudnn_sm100.KERNELS:
        for v in k.variants:
            entries.append({"kernel": k.name, "variant": v.name, "params": dict(v.params),
                            "args": [_layout(a) for a in SPECS[k.name]]})
    assert len(entries) == 3
    lib, raw, _ = T.build_fake_library(tmp_path_factory.mktemp("cudnn_sm100_stub"), entries, target="sm_100a",
                                       major=10)
    return lib, raw, [e["kernel"] + ":" + e["variant"] for e in entries]


@pytest.fixture
def cpu_calls(monkeypatch):
    """The public path on CPU tensors: stream 0x5000, device 0, no CUDA device context."""
    monkeypatch.setattr(abi, "_current_stream", lambda index: 0x5000)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)
    monkeypatch.setenv(unvalidated.ENV, "1")
    seen: list = []
    real_launch, real_prepare = abi.launch, abi.prepare

    def launch(kernel, params, values, **kw):
        seen.append((kernel, dict(params), dict(values)))
        return real_launch(kernel, params, values, **kw)

    def prepare(kernel, params, values, **kw):
        seen.append((kernel, dict(params), dict(values)))
        return real_prepare(kernel, params, values, **kw)

    monkeypatch.setattr(abi, "launch", launch)
    monkeypatch.setattr(abi, "prepare", prepare)
    return seen


def _inputs(B=1, H=2, Sq=192, Sk=256, cap=4, bk=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, 128, generator=g).to(torch.bfloat16) for S in (Sq, Sk, Sk))
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    index = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(B * H * gq)]).view(B, H, gq, cap)
    return q, k, v, index.int().contiguous()


def _call(lib, q, k, v, index, counts=None, **kw):
    return ops_attention.sparse_attention(q, k, v, index, counts, compute_mode="sage_fp8", library=lib, **kw)


@pytest.mark.parametrize("bk", [64, 128])
def test_fixed_count_call_launches_quantizer_then_kernel(stub_lib, cpu_calls, bk):
    """A topk plan: cuDNN's quantizer on contiguous BHSD copies of q, k, v, then one attention
    launch with the fixed count (2 x topk for a 128-key plan) on the prepared index, each argument
    block the one abi packs for the values the backend built."""
    lib, raw, names = stub_lib
    q, k, v, index = _inputs(Sk=256, cap=2, bk=bk)
    _launched(raw, names)
    out = torch.zeros_like(q)  # the stub kernels write nothing
    assert _call(lib, q, k, v, index, topk=2, block_size_k=bk, softmax_scale=0.1, out=out) is out
    got = _launched(raw, names)
    # the prepared index's capacity (2, or 4 in 64-key blocks) against the 4 key blocks: upstream's rule
    short = bk == 64
    assert [n for n, _ in got] == ["cudnn_sage_quant_sm100:bhsd", f"cudnn_sage_sm100_fp8:{'short' if short else 'long'}"]
    (qk, qp, qv), (ak, ap, av) = cpu_calls
    assert (qk, qp, ak) == ("cudnn_sage_quant_sm100", {"v_layout": "bhsd"}, "cudnn_sage_sm100_fp8")
    assert ap == {"use_clc_scheduler": False, "short_tile_opt": short}
    for (_, blocks), (kern, params, values) in zip(got, cpu_calls):
        want = _expected_blocks(lib, kern, params, values)
        assert [b[:len(w)] for b, w in zip(blocks, want)] == want[:LOGGED_ARGS]
    # the quantizer reads BHSD copies of the BSHD inputs and writes the attention's operands
    assert torch.equal(qv["q"].view(1, 2, 192, 128), q.permute(0, 2, 1, 3))
    assert (qv["batch_size"], qv["num_heads"], qv["seqlen_q"], qv["seqlen_k"]) == (1, 2, 192, 256)
    assert (qv["num_k_chunks"], qv["num_v_chunks"], qv["seqlen_k_float"]) == (1, 1, 256.0)
    assert av["q"].data_ptr() == qv["q_fp8"].data_ptr() and av["v"].data_ptr() == qv["v_fp8"].data_ptr()
    assert av["k_scale"].shape == (1, 2, 16) and av["v_scale"].shape == (2, 128)
    assert av["block_sparse_num"] == 2 * (bk // 64) and av["softmax_scale"] == pytest.approx(0.1)
    # the kernel writes a contiguous BHSD output, as the wrapper allocates it; a BSHD out is
    # filled from it after the launch
    assert av["out"].is_contiguous() and av["out"].shape == (1, 2, 192, 128)
    assert torch.equal(out.view(torch.int16), av["out"].permute(0, 2, 1, 3).view(torch.int16))  # bitwise
    # every id the kernel reads is the prepared plan's: valid, ascending (a 128-key id j -> 2j, 2j+1)
    live = av["q2k_block_index"][..., :av["block_sparse_num"]]
    want = torch.sort(index if bk == 64 else torch.stack([2 * index, 2 * index + 1], -1).flatten(-2), -1).values
    assert torch.equal(live, want)


def test_bhsd_out_is_written_in_place(stub_lib, cpu_calls):
    lib, raw, names = stub_lib
    q, k, v, index = _inputs(cap=2)
    qh, kh, vh = (t.permute(0, 2, 1, 3).contiguous() for t in (q, k, v))
    out = torch.zeros_like(qh)
    _call(lib, qh, kh, vh, index, topk=2, layout="BHSD", out=out)
    av = cpu_calls[-1][2]
    assert av["out"].data_ptr() == out.data_ptr() and av["out"].stride() == out.stride()
    assert not out.any()  # nothing copied over it, nothing poisoned


def test_short_tile_variant_follows_upstreams_rule(stub_lib, cpu_calls):
    lib, raw, names = stub_lib
    q, k, v, index = _inputs(Sk=640, cap=3)  # 3 of 10 key blocks: under 90 %
    _call(lib, q, k, v, index, topk=3)
    assert [n for n, _ in _launched(raw, names)][-1] == "cudnn_sage_sm100_fp8:short"
    assert cpu_calls[-1][1] == {"use_clc_scheduler": False, "short_tile_opt": True}
    assert sm100.sage_short_tile(8, 640) and not sm100.sage_short_tile(9, 640)


def test_rows_that_lost_an_id_are_poisoned_not_misread(stub_lib, cpu_calls):
    """A topk plan repeating an id: the prepared row holds fewer blocks than the fixed count; the
    kernel (reading valid ids only) cannot skip the slot, so that query block's rows come out NaN,
    on the device, without a host read; every other row is the kernel's."""
    lib, raw, names = stub_lib
    q, k, v, index = _inputs(cap=3)
    index[0, 1, 2, 1] = index[0, 1, 2, 0]  # a repeat in head 1, query block 2
    for layout in ("BSHD", "BHSD"):
        qq, kk, vv = (t if layout == "BSHD" else t.permute(0, 2, 1, 3).contiguous() for t in (q, k, v))
        out = torch.zeros_like(qq)
        _call(lib, qq, kk, vv, index, topk=3, out=out, layout=layout)
        o = out if layout == "BSHD" else out.permute(0, 2, 1, 3)  # [B, Sq, H, 128]
        kernel = cpu_calls[-1][2]["out"].permute(0, 2, 1, 3)  # what the (stub) kernel left there
        nan = torch.isnan(o.float())
        assert nan[0, 128:192, 1].all(), layout
        keep = torch.ones_like(nan)
        keep[0, 128:192, 1] = False
        assert torch.equal(o.view(torch.int16)[keep], kernel.view(torch.int16)[keep]), layout


def test_empty_plan_launches_only_the_quantizer(stub_lib, cpu_calls):
    lib, raw, names = stub_lib
    q, k, v, index = _inputs(cap=2)
    _launched(raw, names)
    out = _call(lib, q, k, v, index, topk=0)
    assert [n for n, _ in _launched(raw, names)] == ["cudnn_sage_quant_sm100:bhsd"]
    assert not out.any()


@pytest.mark.parametrize("case,match", [
    ("ragged_q", "Sq a multiple of 64.*Fix: use compute_mode='bf16'"),
    ("ragged_k", "Sk of 64.*Fix:"),
    ("k128_ragged", "Sk of 128.*Fix:"),
    ("counts", "not per-row block_counts.*Fix: pass block_counts=None and topk="),
])
def test_refusals_come_before_any_launch(stub_lib, cpu_calls, case, match):
    lib, raw, names = stub_lib
    kw: dict = {"topk": 2}
    Sq, Sk, bk = {"ragged_q": (150, 256, 64), "ragged_k": (192, 200, 64), "k128_ragged": (192, 320, 128)}.get(
        case, (192, 256, 64))
    q, k, v, index = _inputs(Sq=Sq, Sk=Sk, cap=2, bk=bk)
    kw["block_size_k"] = bk
    if case == "counts":
        kw = {"topk": None}
        counts = torch.full(index.shape[:3], 2, dtype=torch.int32)
    else:
        counts = None
    _launched(raw, names)
    with pytest.raises(ValueError, match=match):
        _call(lib, q, k, v, index, counts, **kw)
    assert _launched(raw, names) == [] and cpu_calls == []


def test_routed_plans_map_without_dense_rows(monkeypatch):
    """subblock_attention's plan (no caller plan): every row holds topk ids (capacity == topk): one
    launch reading the router's index, nothing to poison; a routed plan whose rows could hold more
    (capacity > topk, as route(..., dense_rows=...) makes) raises with the fix."""
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)  # CPU tensors
    q, k, v, index = _inputs(cap=2)
    args = validation.check_attention_args(q, k, v, index, topk=2, compute_mode="sage_fp8", runtime=False)
    routed = dataclasses.replace(args, plan=None, spec=PlanSpec(2, True, 2, 64, 256))
    assert sm100.sage_refusal(routed) == ""
    dense = dataclasses.replace(routed, spec=PlanSpec(4, True, 2, 64, 256))
    assert "Fix: route without dense rows" in sm100.sage_refusal(dense)
    from subblock_sage.plan import Plan

    bufs = sm100.cudnn_sage_buffers(1, 2, 192, 256, "meta")
    plan = Plan(index, torch.full((1, 2, 3), 2, dtype=torch.int32), 0, 64, 256)
    out = torch.empty(1, 2, 192, 128, dtype=torch.bfloat16).permute(0, 2, 1, 3)  # BHSD storage
    launches, finish = sm100.sage_launches(routed, plan, bufs, out)
    assert finish is None and len(launches) == 1 and launches[0].values["block_sparse_num"] == 2


def test_batch_elements_launch_apart_where_int32_coordinates_end(monkeypatch):
    """The wrapper's rank-6 Int32 K/V rule (its Int64 variant is not built): a batch stride of
    2**27 elements or more with B > 1 -> one launch per batch element (each B = 1, whose batch
    basis is inactive); a head past the 32-bit TMA coordinates raises."""
    from subblock_sage.plan import Plan

    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)  # meta tensors
    B, H, S = 2, 16, 65536  # H * S * 128 = 2**27
    q = torch.empty(B, S, H, 128, dtype=torch.bfloat16, device="meta")
    index = torch.zeros(B, H, S // 64, 2, dtype=torch.int32, device="meta")
    args = validation.check_attention_args(q, q, q, index, topk=2, compute_mode="sage_fp8", runtime=False)
    bufs = sm100.cudnn_sage_buffers(B, H, S, S, "meta")
    plan = Plan(index, torch.zeros(B, H, S // 64, dtype=torch.int32, device="meta"), 0, 64, S)
    launches, _ = sm100.sage_launches(args, plan, bufs, torch.empty(B, S, H, 128, dtype=torch.bfloat16, device="meta"))
    assert len(launches) == 2
    for b, L in enumerate(launches):
        assert L.values["q"].shape[0] == 1 and L.values["v_scale"].shape == (H, 128)
    small = sm100.cudnn_sage_buffers(B, 2, 1024, 1024, "meta")
    assert not sm100._batches(small)
    huge = sm100.cudnn_sage_buffers(1, 1, 64, 2**24, "meta")
    with pytest.raises(ValueError, match="32-bit TMA.*Fix:"):
        sm100._batches(huge)


def test_sage_is_opt_in_and_needs_cudnns_quantizer(stub_lib, monkeypatch):
    lib = stub_lib[0]
    monkeypatch.delenv(unvalidated.ENV, raising=False)
    assert sm100.BACKEND.modes(lib) == ("sage_fp8",)  # the stub has no bf16 kernel
    with pytest.raises(ValueError, match="UNVALIDATED.*Fix:.*SUBBLOCK_SAGE_ALLOW_UNVALIDATED"):
        sm100.BACKEND.can_implement(lib, "sage_fp8", 64)
    with unvalidated.allowing():
        sm100.BACKEND.can_implement(lib, "sage_fp8", 64)
    monkeypatch.setenv(unvalidated.ENV, "1")
    sm100.BACKEND.can_implement(lib, "sage_fp8", 128)
    # the manifest's modes: the kernel without cuDNN's quantizer serves no Sage
    assert modes_served(["fi_sm100_bf16_fwd", "cudnn_sage_sm100_fp8", "sage_quant_kv"]) == ("bf16",)
    assert modes_served(["fi_sm100_bf16_fwd", "cudnn_sage_sm100_fp8", "cudnn_sage_quant_sm100"]) == ("sage_fp8", "bf16")
    assert not sm100.BACKEND.fuses_plan(lib, "sage_fp8")  # cuDNN's quantizer has no plan role
