"""``subblock_attention`` (route + attend in one call) on a GPU, every compute mode the GPU's
target serves (tests/helpers/served.py: a mode that should be served and is not FAILS):

* bit for bit the output of ``route`` then ``sparse_attention`` on that plan (in ``sage_fp8`` the
  one call takes the fused path: the pooling quantizer, ``router_select``, the attention kernel),
  with the target's geometry (``Backend.router_geometry``: 128-key blocks on sm_90a Sage, else 64; granularity 1
  for Sage, 8 for bf16), both layouts, ragged lengths, ``out=``;
* the float64 reference attention on the float64 reference plan, up to the stated ties (the
  plans compared with ``router_plan_differences``; where they differ only among ties, the
  reference attention on our plan), within the mode's accuracy bounds;
* a repeated call replays its recorded launches (``replay.py``, as a repeated
  ``sparse_attention`` call does): the routed call's launches, at most
  ``contract.MAX_ROUTED_LAUNCHES`` and no plan kernel, nothing launched from Python, bit for bit
  the full path's output;
* no host synchronisation, CUDA-graph capture and replay, torch.compile(fullgraph=True);
* typed errors before any launch (nothing enqueued on the stream).
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage import replay  # noqa: E402
from subblock_sage.reference import reference_route, reference_sparse_attention, router_plan_differences  # noqa: E402

from tests.helpers.gpu import activation_qkv, compare  # noqa: E402
from tests.helpers.served import MODES, manifest_target, need_mode  # noqa: E402

DEV = "cuda"


_qkv = activation_qkv


def _geometry(mode):
    from subblock_sage.backends import backend_for

    return backend_for(manifest_target()).router_geometry(mode)


def _separately(q, k, v, mode, layout="BSHD", **kw):
    bk, g = _geometry(mode)
    plan = subblock_sage.route(q, k, sparsity=kw.get("sparsity", 0.75), n_q=kw.get("n_q", 4), n_k=kw.get("n_k"),
                               softmax_scale=kw.get("softmax_scale"), block_size_k=bk, budget_granularity=g,
                               layout=layout)
    out = subblock_sage.sparse_attention(q, k, v, plan.index, plan.counts, block_size_k=plan.block_size_k,
                                         softmax_scale=kw.get("softmax_scale"), compute_mode=mode, layout=layout)
    return out, plan


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("B,Sq,Sk,H", [(1, 1000, 1000, 2), (2, 4096 + 37, 4096 + 37, 3), (1, 65, 5000 + 3, 2)])
def test_equals_route_then_sparse_attention(mode, layout, B, Sq, Sk, H):
    need_mode(mode)
    q, k, v = _qkv(B, Sq, Sk, H, seed=Sq + Sk + H, layout=layout)
    got = subblock_sage.subblock_attention(q, k, v, compute_mode=mode, layout=layout)
    want, _ = _separately(q, k, v, mode, layout)
    torch.cuda.synchronize()
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    assert torch.equal(got, want)
    out = torch.empty_like(q)
    assert subblock_sage.subblock_attention(q, k, v, compute_mode=mode, layout=layout, out=out) is out
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(), dict(sparsity=0.5, n_q=2, n_k=8, softmax_scale=0.07), dict(sparsity=0.9, n_q=8, n_k=1)])
def test_arguments_reach_both_halves(mode, kw):
    need_mode(mode)
    q, k, v = _qkv(1, 2000 + 11, 3000 + 5, 2, seed=3)
    got = subblock_sage.subblock_attention(q, k, v, compute_mode=mode, **kw)
    want, _ = _separately(q, k, v, mode, **kw)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("Sq,Sk", [(1000 + 7, 1500 + 9), (4096 + 37, 4096 + 37)])
@pytest.mark.parametrize("cells", [dict(), dict(n_q=8, n_k=1), dict(n_q=1, n_k=2)])  # the default: 16-token cells
def test_matches_the_float64_reference(mode, Sq, Sk, cells):
    need_mode(mode)
    bk, g = _geometry(mode)
    q, k, v = _qkv(1, Sq, Sk, 2, seed=Sq)
    got = subblock_sage.subblock_attention(q, k, v, compute_mode=mode, sparsity=0.75, **cells)
    _, plan = _separately(q, k, v, mode, **cells)
    torch.cuda.synchronize()
    ref_idx, ref_cnt, scores, topk = reference_route(q.cpu(), k.cpu(), sparsity=0.75, block_size_k=bk,
                                                     budget_granularity=g, **cells)
    d = router_plan_differences(plan.index, plan.counts, ref_idx, ref_cnt, scores)
    assert d["bad"] == [], d
    assert plan.topk == topk and plan.block_size_k == bk
    # the same blocks; where they differ only among ties, the reference attention on our plan
    idx, cnt = (ref_idx, ref_cnt) if d["differing_rows"] == 0 else (plan.index.cpu(), plan.counts.cpu())
    ref = reference_sparse_attention(q.cpu(), k.cpu(), v.cpu(), idx, cnt, block_size_k=bk)
    compare(got, ref.to(DEV), mode)


@pytest.mark.parametrize("mode", MODES)
def test_no_host_sync_graph_capture_and_compile(mode):
    need_mode(mode)
    q, k, v = _qkv(1, 3000 + 1, 3000 + 1, 2, seed=21)
    eager = subblock_sage.subblock_attention(q, k, v, compute_mode=mode)  # loads the kernels, records
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = subblock_sage.subblock_attention(q, k, v, compute_mode=mode)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(again, eager)

    qs, ks, vs = q.clone(), k.clone(), v.clone()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            captured = subblock_sage.subblock_attention(qs, ks, vs, compute_mode=mode)
    torch.cuda.current_stream().wait_stream(s)
    q2, k2, v2 = _qkv(1, 3000 + 1, 3000 + 1, 2, seed=22)
    qs.copy_(q2)
    ks.copy_(k2)
    vs.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    want = subblock_sage.subblock_attention(q2, k2, v2, compute_mode=mode)
    torch.cuda.synchronize()
    assert torch.equal(captured, want)

    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: subblock_sage.subblock_attention(q, k, v, compute_mode=mode) * 1,
                      fullgraph=True)
    got = f(q2, k2, v2)
    torch.cuda.synchronize()
    torch._dynamo.reset()
    assert torch.equal(got, want)


def test_errors_before_any_launch(monkeypatch):
    """A bad v / out / scalar raises before the router's first launch (the attention's launches
    come after the router's, so none of them either)."""
    from subblock_sage import abi

    need_mode("bf16")
    replay.clear()  # the first call takes the full path, which launches through abi.launch
    q, k, v = _qkv(1, 500, 500, 2, seed=31)
    launches = []
    real = abi.launch
    monkeypatch.setattr(abi, "launch", lambda *a, **kw: (launches.append(a[0]), real(*a, **kw))[1])
    subblock_sage.subblock_attention(q, k, v)
    assert launches == ["router_pool", "router_select"]  # the counter sees the router's launches
    for kw, exc, what in ((dict(v=v[:, :400]), ValueError, "k and v must have the same shape"),
                          (dict(out=q), ValueError, "out shares memory with q"),
                          (dict(sparsity=1.0), ValueError, "sparsity must be in [0, 1)"),
                          (dict(v=v.cpu()), ValueError, "one CUDA device"),
                          (dict(compute_mode="fp8"), ValueError, "compute_mode must be one of")):
        launches.clear()
        kw = dict(kw)
        vv = kw.pop("v", v)
        with pytest.raises(exc, match=re.escape(what)):
            subblock_sage.subblock_attention(q, k, vv, **kw)
        assert launches == [], (what, launches)
    torch.cuda.synchronize()


def test_sage_reads_q_and_k_once(monkeypatch):
    """sage_fp8 with the default cells: the pooling quantizer's launch and router_select, no
    router_pool (Q and K read once); with other cells, the two-launch path (router_pool first).
    The outputs of both equal route + sparse_attention (test_equals_route_then_sparse_attention)."""
    from subblock_sage import abi
    from subblock_sage.contract import SAGE_QUANT_KERNEL

    need_mode("sage_fp8")
    replay.clear()  # full paths: a replayed call makes no abi.launch
    q, k, v = _qkv(1, 2000 + 3, 2000 + 3, 2, seed=41)
    launches = []
    real = abi.launch
    # (kernel, variant parameters, the n_q / n_k values it is given)
    monkeypatch.setattr(abi, "launch", lambda *a, **kw: (launches.append(
        (a[0], dict(a[1]), (a[2].get("n_q"), a[2].get("n_k")))), real(*a, **kw))[1])
    subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8")
    torch.cuda.synchronize()
    bk, _ = _geometry("sage_fp8")
    n = _select_launches(q, k, bk, bk // 16)
    assert [n for n, _, _ in launches] == [SAGE_QUANT_KERNEL] + ["router_select"] * n, launches
    assert launches[0][1].get("pool") is True
    # the shipped select kernel, one export, given the cells as arguments (16-token cells)
    assert launches[1][1:] == ({}, (4, bk // 16)), launches
    launches.clear()
    subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8", n_k=bk // 32)  # 32-key cells
    torch.cuda.synchronize()
    n = _select_launches(q, k, bk, bk // 32)
    assert [n for n, _, _ in launches][:1 + n] == ["router_pool"] + ["router_select"] * n, launches
    assert launches[1][1:] == ({}, (4, bk // 32)), launches


def _select_launches(q, k, bk, n_k, layout="BSHD") -> int:
    """router_select's launches for this call on this GPU (backends/router.select_launches: one fused,
    or a split score launch and the selection)."""
    from subblock_sage.backends import router as BR
    from subblock_sage.ops import route as R

    args = R.check_route_args(q, k, sparsity=0.75, n_k=n_k, block_size_k=bk, layout=layout)
    return len(BR.select_launches(args, BR.sm_count(q.device.index or 0)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("with_out", [False, True])
def test_repeated_call_replays(mode, layout, with_out, monkeypatch):
    """The first call of a signature records the routed call's launches (the router's, or the
    pooling quantizer's and router_select's, then the attention kernel: no plan kernel), the
    next call of that signature replays them (nothing launched from Python), on fresh tensors,
    bit for bit the full path's output and the output of route + sparse_attention."""
    from subblock_sage import abi
    from subblock_sage.backends import backend_for
    from subblock_sage.contract import MAX_ROUTED_LAUNCHES, SAGE_QUANT_KERNEL

    need_mode(mode)
    replay.clear()
    q, k, v = _qkv(1, 1500 + 7, 2000 + 9, 3, seed=51, layout=layout)
    out1 = torch.full_like(q, float("nan")) if with_out else None
    r1 = subblock_sage.subblock_attention(q, k, v, compute_mode=mode, layout=layout, out=out1)  # recorded
    rep = replay.lookup(replay.signature_subblock(q, k, v, out1, 0.75, mode, 4, None, None, layout))
    assert isinstance(rep, replay.Replay), rep
    first = SAGE_QUANT_KERNEL if mode == "sage_fp8" else "router_pool"
    bk, _ = _geometry(mode)
    select = ["router_select"] * _select_launches(q, k, bk, bk // 16, layout)
    assert rep.kernels == [first, *select, backend_for(manifest_target()).kernels[mode]], rep.kernels
    assert len(rep.kernels) <= MAX_ROUTED_LAUNCHES[mode]
    launched = []
    real_launch, real_prepare = abi.launch, abi.prepare
    monkeypatch.setattr(abi, "launch", lambda *a, **kw: (launched.append(a[0]), real_launch(*a, **kw))[1])
    monkeypatch.setattr(abi, "prepare", lambda *a, **kw: (launched.append(a[0]), real_prepare(*a, **kw))[1])
    q2, k2, v2 = (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
                  for t in (q, k, v))
    out2 = torch.full_like(q, float("nan")) if with_out else None
    r2 = subblock_sage.subblock_attention(q2, k2, v2, compute_mode=mode, layout=layout, out=out2)  # replayed
    torch.cuda.synchronize()
    assert launched == []
    if with_out:
        assert r1 is out1 and r2 is out2
    assert r2.shape == r1.shape and r2.stride() == r1.stride()
    assert torch.equal(r1, r2)
    want, _ = _separately(q, k, v, mode, layout)
    torch.cuda.synchronize()
    assert torch.equal(r2, want)
    # the pointer-dependent check runs per call (the replay's own where out2's signature is q2's):
    # out overlapping an input is refused before anything is written
    if with_out:
        with pytest.raises(ValueError, match="out shares memory with q"):
            subblock_sage.subblock_attention(q2, k2, v2, compute_mode=mode, layout=layout, out=q2)
