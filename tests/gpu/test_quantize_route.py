"""``quantize_and_route`` (ops/quantize_route.py: the pooling quantizer, then ``router_select``)
against the two-launch paths it replaces, bit for bit on ragged shapes:

* the pooled cells equal ``router_pool``'s (``route_with_scores``), bits of every bf16 element
  (signed zeros included), also past the sequence ends (zero cells) -- with Q quantized and with Q
  only pooled (sm_90a's Q-fused call);
* the scores and the plan equal ``route``'s (the same select launch on the same cells);
* the quantized operands equal ``quantize_canonical``'s (the plain quantizer), bits of every
  element, with and without Q;
* no host synchronisation, CUDA-graph capture, torch.compile, refusals before any launch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

from subblock_sage.ops.quantize import quantize_canonical  # noqa: E402
from subblock_sage.ops.quantize_route import quantize_and_route, quantize_and_route_with_cells  # noqa: E402
from subblock_sage.api import route  # noqa: E402
from subblock_sage.ops.route import route_with_scores  # noqa: E402
from tests.helpers.gpu import activation_qkv, poison_allocator  # noqa: E402

DEV = "cuda"


_qkv = activation_qkv


def _bits(t):
    """The tensor's bits as integers (NaN and signed zeros compare by bits)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _canon(t, layout):
    return t if layout == "BSHD" else t.permute(0, 2, 1, 3)


SHAPES = [  # (B, H, Sq, Sk): ragged tails; Sq < 128 (one partial Q tile); an odd number of 64-key
    # blocks (with 128-key blocks the last block's upper half is zero cells); Sk < 16
    (1, 2, 1000, 1500),
    (2, 3, 77, 4099),
    (1, 1, 129, 17),
    (1, 2, 4133, 4117),
    (1, 1, 300, 9),
]


@pytest.mark.parametrize("B,H,Sq,Sk", SHAPES)
@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("with_q", [True, False])
def test_equals_the_two_launch_paths(B, H, Sq, Sk, bk, with_q):
    q, k, v = _qkv(B, Sq, Sk, H, seed=Sq + 7 * Sk + bk)
    kw = dict(sparsity=0.75, softmax_scale=0.0883883, block_size_k=bk)
    plan_r, scores_r, pq_r, pk_r = route_with_scores(q, k, **kw)
    plain = quantize_canonical(q, k, v, with_q=with_q)
    torch.cuda.synchronize()
    poison_allocator()  # cells or outputs the fused launch fails to write show up
    ops, plan, scores, pq, pk = quantize_and_route_with_cells(q, k, v, with_q=with_q, **kw)
    torch.cuda.synchronize()
    # 1. pooled cells, bit for bit (router_pool's arithmetic), zero cells past the ends included
    assert pq.shape == pq_r.shape and pk.shape == pk_r.shape
    assert torch.equal(_bits(pq), _bits(pq_r)), int((_bits(pq) != _bits(pq_r)).sum())
    assert torch.equal(_bits(pk), _bits(pk_r)), int((_bits(pk) != _bits(pk_r)).sum())
    # 2. the same select launch on the same cells: the same scores and plan
    assert torch.equal(_bits(scores), _bits(scores_r))
    assert torch.equal(plan.index, plan_r.index) and torch.equal(plan.counts, plan_r.counts)
    assert (plan.topk, plan.block_size_k, plan.seqlen_k) == (plan_r.topk, plan_r.block_size_k, plan_r.seqlen_k)
    # 3. the quantizer's outputs, bit for bit
    assert set(ops) == set(plain)
    for name, t in ops.items():
        assert torch.equal(_bits(t), _bits(plain[name])), name


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_layouts_and_views(layout):
    """BHSD inputs and strided views (a packed qkv tensor) give what the BSHD call gives."""
    q, k, v = _qkv(1, 700, 900, 2, seed=3, layout=layout)
    ops, plan = quantize_and_route(q, k, v, sparsity=0.6, layout=layout)
    qc, kc, vc = (_canon(t, layout).contiguous() for t in (q, k, v))
    ops_c, plan_c = quantize_and_route(qc, kc, vc, sparsity=0.6)
    packed = torch.stack([kc, vc], dim=2)  # [B, S, 2, H, 128]: k and v as strided views
    ops_p, plan_p = quantize_and_route(qc, packed[:, :, 0], packed[:, :, 1], sparsity=0.6)
    torch.cuda.synchronize()
    for other, other_plan in ((ops_c, plan_c), (ops_p, plan_p)):
        assert torch.equal(plan.index, other_plan.index) and torch.equal(plan.counts, other_plan.counts)
        for name, t in ops.items():
            assert torch.equal(_bits(t), _bits(other[name])), name


def test_dense_rows():
    q, k, v = _qkv(1, 1000, 1300, 2, seed=5)
    rows = torch.zeros(16, dtype=torch.bool, device=DEV)
    rows[3] = rows[15] = True
    _, plan = quantize_and_route(q, k, v, sparsity=0.75, dense_rows=rows)
    want = route(q, k, sparsity=0.75, dense_rows=rows)
    torch.cuda.synchronize()
    assert torch.equal(plan.index, want.index) and torch.equal(plan.counts, want.counts)
    assert int(plan.counts[0, 0, 3]) == plan.num_key_blocks


def test_no_host_sync_and_graph_capture():
    q, k, v = _qkv(1, 2000, 3000, 2, seed=12)
    kw = dict(sparsity=0.75, block_size_k=128, with_q=False)
    ops_e, plan_e = quantize_and_route(q, k, v, **kw)  # warm: loads the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops_a, plan_a = quantize_and_route(q, k, v, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.equal(plan_a.index, plan_e.index) and torch.equal(_bits(ops_a["v_fp8"]), _bits(ops_e["v_fp8"]))

    qs, ks, vs = q.clone(), k.clone(), v.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            ops_c, plan_c = quantize_and_route(qs, ks, vs, **kw)
    torch.cuda.current_stream().wait_stream(s)
    q2, k2, v2 = _qkv(1, 2000, 3000, 2, seed=13)
    qs.copy_(q2)
    ks.copy_(k2)
    vs.copy_(v2)
    g.replay()
    torch.cuda.synchronize()
    ops_w, plan_w = quantize_and_route(q2, k2, v2, **kw)
    torch.cuda.synchronize()
    assert torch.equal(plan_c.index, plan_w.index) and torch.equal(plan_c.counts, plan_w.counts)
    for name, t in ops_c.items():
        assert torch.equal(_bits(t), _bits(ops_w[name])), name


def test_torch_compile():
    q, k, v = _qkv(1, 700, 900, 2, seed=14)

    def f(q, k, v):
        ops, plan = quantize_and_route(q, k, v, sparsity=0.75)
        return ops["k_int8"], ops["q_int8"], plan.index, plan.counts

    got = torch.compile(f, fullgraph=True)(q, k, v)
    want = f(q, k, v)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_refusals_before_any_launch():
    q, k, v = _qkv(1, 200, 300, 2, seed=15)
    with pytest.raises(ValueError, match="pools 16-token cells only"):
        quantize_and_route(q, k, v, sparsity=0.5, n_q=8)
    with pytest.raises(ValueError, match="CUDA device|one CUDA device"):
        quantize_and_route(q, k, v.cpu(), sparsity=0.5)
