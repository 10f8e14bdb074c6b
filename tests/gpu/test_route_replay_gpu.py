"""``route``'s launch replay (``calls.route``, ``replay.PlanReplay``) on a real GPU: a replayed
call returns the full path's plan bit for bit (fresh tensors, same signature), for both key-block
sizes, without and with dense rows (bool: converted per call; int32: read in place), with
``router_select`` fused and split; on a side stream; and captured into a CUDA graph, replayed on new
inputs. The full path is ``route(..., library=lib)``, which never replays.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage import loader, replay  # noqa: E402
from subblock_sage.backends import router as R  # noqa: E402

DEV = "cuda"


def _qk(B, Sq, Sk, H, seed):
    """Activations-like q, k (as tests/gpu/test_router.py makes them), as row-padded views."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, 136, generator=g) + 0.5 * torch.randn(1, 1, H, 136, generator=g)
    k = torch.randn(B, Sk, H, 136, generator=g) + torch.randn(1, 1, H, 136, generator=g)
    return q.to(torch.bfloat16).to(DEV)[..., :128], k.to(torch.bfloat16).to(DEV)[..., :128]


def _dense(kind, B, gq):
    if kind is None:
        return None
    d = torch.zeros(B, 1, gq, dtype=torch.bool, device=DEV)
    d[0, 0, 1] = True
    d[-1, 0, gq - 1] = True
    return d if kind == "bool" else d.to(torch.int32)


def _like(t):
    """A copy at a new address with t's strides (``clone`` would make the padded views contiguous:
    another signature)."""
    c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return c.copy_(t)


def _same(a, b):
    assert (a.index.shape, a.index.stride(), a.counts.shape, a.counts.stride()) == \
        (b.index.shape, b.index.stride(), b.counts.shape, b.counts.stride())
    assert (a.topk, a.block_size_k, a.seqlen_k) == (b.topk, b.block_size_k, b.seqlen_k)
    assert torch.equal(a.index, b.index) and torch.equal(a.counts, b.counts)


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("dense", [None, "bool", "int32"])
@pytest.mark.parametrize("select", ["split", "fused"])
def test_replayed_route_equals_the_full_path(bk, dense, select, monkeypatch):
    if select == "fused":  # one SM: every grid fills it, so router_select is one launch
        monkeypatch.setattr(R, "sm_count", lambda index: 1)
    replay.clear()
    B, Sq, Sk, H = 2, 1000, 3000, 2
    gq = -(-Sq // 64)
    q, k = _qk(B, Sq, Sk, H, seed=21)
    kw = dict(sparsity=0.75, block_size_k=bk, dense_rows=_dense(dense, B, gq))
    subblock_sage.route(q, k, **kw)  # the full path, recorded
    rep = replay.lookup(replay.signature_route(q, k, kw["dense_rows"], 0.75, None, 4, None, bk, None, "BSHD"))
    assert isinstance(rep, replay.PlanReplay), rep
    assert rep.kernels == [R.POOL_KERNEL] + [R.SELECT_KERNEL] * (1 if select == "fused" else 2)
    lib = loader.library_for_device(q.device.index or 0)

    q2, k2 = _qk(B, Sq, Sk, H, seed=22)  # new tensors, the same signature
    kw2 = dict(kw, dense_rows=_dense(dense, B, gq))
    want = subblock_sage.route(q2, k2, library=lib, **kw2)  # the full path
    got = subblock_sage.route(q2, k2, **kw2)  # replayed
    _same(got, want)
    if dense is not None:
        assert bool((got.counts[0, :, 1] == got.capacity).all())

    s = torch.cuda.Stream()  # a side stream: its own workspace
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        side = subblock_sage.route(q2, k2, **kw2)
    torch.cuda.current_stream().wait_stream(s)
    _same(side, want)

    # captured into a graph (fresh workspace and results from the graph's pool), replayed on new inputs
    qs, ks = _like(q2), _like(k2)
    ds = kw2["dense_rows"]
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        captured = subblock_sage.route(qs, ks, **dict(kw2, dense_rows=ds))
    torch.cuda.current_stream().wait_stream(s)
    q3, k3 = _qk(B, Sq, Sk, H, seed=23)
    qs.copy_(q3)
    ks.copy_(k3)
    if ds is not None:
        ds.copy_(_dense(dense, B, gq).flip(-1))  # the graph reads the new flags too
    g.replay()
    want3 = subblock_sage.route(q3, k3, library=lib, **dict(kw2, dense_rows=ds))
    torch.cuda.synchronize()
    _same(captured, want3)
    assert len([x for x in replay._cache.values() if isinstance(x, replay.PlanReplay)]) == 1  # one signature
