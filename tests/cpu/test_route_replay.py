"""``route``'s launch replay (``calls.route``, ``replay.keyed_route``, ``replay.PlanReplay``)
without a GPU.

The real shim C is compiled against stub kernels named ``router_pool`` and ``router_select`` with
the router's declared arguments (``aot/kernels/router``), and a stub CUDA runtime that logs every
launch's argument bytes (``tests/cpu/test_replay.py``'s stubs). ``ops/route.py``'s full path runs
on CPU tensors (the CUDA-only pieces patched: device index, SM count, device guard) through
``abi``; the public ``subblock_sage.route`` records its first call and replays the next. Checked:
a replayed call runs no Python of the full path and launches the recorded blocks with only the
pointers and the stream changed (q, k, dense rows: the call's; index, counts: the returned plan's;
pooled cells and scores: slots of the stream's workspace); other scalars or shapes key a new
signature; ``library=``, traced calls and ``route_with_scores`` never replay; a misaligned pointer
(dense rows included) launches nothing and the full path names it.
"""

from __future__ import annotations

import contextlib
import ctypes

import pytest

torch = pytest.importorskip("torch")

from subblock_sage import abi, api, calls, replay, workspace  # noqa: E402
from subblock_sage.backends import router as BR  # noqa: E402
from subblock_sage.ops import route as R  # noqa: E402
from tests.cpu.test_replay import LOG_ARG, _arg_sizes, _calls, _reset, build_fake_library  # noqa: E402

STREAM_REC, STREAM_NOW = 0x5000, 0x7000  # abi's stream (recorded call), the replay's current stream
TEMPS = ("pooled_q", "pooled_k", "scores")  # the route's temporaries: workspace slots in a replay


def _layouts(args) -> list:
    """The registry's argument specs as ``exports.json`` describes them (``aot/export/layout.py``)."""
    from aot.registry import ScalarArg, Sym, TensorArg

    def j(xs):
        return [{"sym": s.key, "div": s.div} if isinstance(s, Sym) else s for s in xs]

    def ct(xs):
        return "int64_t" if any(isinstance(s, Sym) and s.width == 64 for s in xs) else "int32_t"

    out = []
    for a in args:
        if isinstance(a, TensorArg):
            out.append({"name": a.name, "kind": "tensor", "dtype": a.dtype, "align": a.align, "shape": j(a.shape),
                        "stride": j(a.stride), "shape_ctype": ct(a.shape), "stride_ctype": ct(a.stride)})
        elif isinstance(a, ScalarArg):
            out.append({"name": a.name, "kind": "scalar", "dtype": a.dtype,
                        "ctype": "float" if a.dtype == "float32" else "int32_t"})
        else:
            out.append({"name": a.name, "kind": "stream"})
    return out


@pytest.fixture(scope="module")
def router_lib(tmp_path_factory):
    from aot.kernels import router

    kernels = {BR.POOL_KERNEL: _layouts(router.pool_args()), BR.SELECT_KERNEL: _layouts(router.select_args())}
    return build_fake_library(tmp_path_factory.mktemp("fake_router"), kernels, "libfake_router.so")[:2]


@pytest.fixture
def cpu_route(router_lib, monkeypatch):
    """``route`` on CPU tensors against the stub library; counts its full-path runs and checks."""
    lib, raw = router_lib
    monkeypatch.setattr(abi, "_current_stream", lambda index: STREAM_REC)
    monkeypatch.setattr(workspace, "current_stream", lambda device: STREAM_NOW)
    monkeypatch.setattr(workspace, "capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(BR, "cuda_device_index", lambda dev, what="": 0)
    monkeypatch.setattr(R, "check_same_cuda_device", lambda t: None)
    monkeypatch.setattr(BR, "router_library", lambda index, library: library or lib)
    monkeypatch.setattr(BR, "sm_count", lambda index: 1)  # one SM: router_select fused
    runs = {"full": 0, "checks": 0}
    real_full, real_check = BR.launch_plan, R.check_route_args

    def full(*a, **kw):
        runs["full"] += 1
        return real_full(*a, **kw)

    def check(*a, **kw):
        runs["checks"] += 1
        return real_check(*a, **kw)

    monkeypatch.setattr(BR, "launch_plan", full)
    monkeypatch.setattr(R, "check_route_args", check)
    replay.clear()
    yield lib, raw, runs
    replay.clear()


def _qk(B=2, Sq=300, Sk=1000, H=3, layout="BSHD", seed=0):
    """q and k as views with row padding (their strides are part of the signature)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "BHSD":
        qb = torch.randn(B, H, Sq, 136, generator=g).to(torch.bfloat16)
        kb = torch.randn(B, H, Sk, 136, generator=g).to(torch.bfloat16)
    else:
        qb = torch.randn(B, Sq, H, 136, generator=g).to(torch.bfloat16)
        kb = torch.randn(B, Sk, H, 136, generator=g).to(torch.bfloat16)
    return qb[..., :128], kb[..., :128]


def _dense(kind, B, H, Sq):
    gq = -(-Sq // 64)
    if kind is None:
        return None
    if kind == "bool":
        d = torch.zeros(gq, dtype=torch.bool)
        d[1] = True
        return d
    d = torch.zeros(B, 1, gq, dtype=torch.int32)  # broadcast over heads, read in place
    d[0, 0, 0] = 1
    return d


def _launches(lib, raw):
    """The logged launches as (kernel name, {argument name: bytes, up to LOG_ARG})."""
    by_index = {lib.kernel(n).index: lib.kernel(n) for n in (BR.POOL_KERNEL, BR.SELECT_KERNEL)}
    out = []
    for kern, dev, blocks in _calls(raw):
        e = by_index[kern]
        assert dev == 0
        out.append((e.name, {a["name"]: b[:min(n, LOG_ARG)] for a, n, b in zip(e.args, _arg_sizes(e), blocks)},
                    {a["name"]: a["kind"] for a in e.args}))
    return out


def _ptr(b: bytes) -> int:
    return ctypes.c_uint64.from_buffer_copy(b[:8]).value


@pytest.mark.parametrize("dense", [None, "bool", "int32"])
@pytest.mark.parametrize("bk,sms", [(64, 1), (128, 1), (64, 132)])  # 132 SMs: the split launch pair
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_second_call_replays_the_recorded_blocks(cpu_route, monkeypatch, dense, bk, sms, layout):
    """The first call of a signature runs the full path, recorded; the next (new tensors, same
    signature) runs none of it (no check, no launch_plan) and launches the recorded steps: every
    argument byte equal but the pointers and the stream, which are the call's own."""
    lib, raw, runs = cpu_route
    monkeypatch.setattr(BR, "sm_count", lambda index: sms)
    B, Sq, Sk, H = 2, 300, 4000, 3  # 4000 keys: several key tiles to split over
    kw = dict(sparsity=0.75, block_size_k=bk, layout=layout)
    q, k = _qk(B, Sq, Sk, H, layout)
    _reset(raw)
    first = api.route(q, k, dense_rows=_dense(dense, B, H, Sq), **kw)
    assert runs == {"full": 1, "checks": 1}
    recorded = _launches(lib, raw)
    names = [BR.POOL_KERNEL, BR.SELECT_KERNEL] + ([BR.SELECT_KERNEL] if sms > 1 else [])
    assert [n for n, _, _ in recorded] == names
    d1 = _dense(dense, B, H, Sq)
    key = replay.signature_route(q, k, d1, 0.75, None, 4, None, bk, None, layout)
    rep = replay.lookup(key)
    assert isinstance(rep, replay.PlanReplay), rep
    assert rep.kernels == names and rep.facts == (first.topk, first.block_size_k, first.seqlen_k)
    rep.alloc_device = "cpu"  # (the stub's device 0 is no CUDA device here)

    for n_call, stream in enumerate((STREAM_NOW, STREAM_NOW, 0x7100)):  # first replay, steady, another stream
        monkeypatch.setattr(workspace, "current_stream", lambda device, s=stream: s)
        q2, k2 = _qk(B, Sq, Sk, H, layout, seed=1 + n_call)
        d2 = _dense(dense, B, H, Sq)
        _reset(raw)
        plan = api.route(q2, k2, dense_rows=d2, **kw)
        assert runs == {"full": 1, "checks": 1}, "a replayed call ran the full path"
        got = _launches(lib, raw)
        assert [n for n, _, _ in got] == names
        for t, t1 in ((plan.index, first.index), (plan.counts, first.counts)):
            assert (t.shape, t.stride(), t.dtype) == (t1.shape, t1.stride(), t1.dtype)
            assert t.data_ptr() != t1.data_ptr()
        assert (plan.topk, plan.block_size_k, plan.seqlen_k, plan.capacity) == (
            first.topk, first.block_size_k, first.seqlen_k, first.capacity)
        ws = workspace.streams[("cpu", stream)].ws
        in_ws = lambda p: ws.data_ptr() <= p < ws.data_ptr() + ws.numel()  # noqa: E731
        temps = {}
        for (name, blocks, kinds), (_, rec_blocks, _) in zip(got, recorded):
            for a, b in blocks.items():
                r = rec_blocks[a]
                if kinds[a] == "stream":
                    assert _ptr(b) == stream and _ptr(r) == STREAM_REC
                    continue
                if kinds[a] == "scalar":
                    assert b == r, (name, a)
                    continue
                assert b[8:] == r[8:], (name, a)  # shapes and strides: the recorded ones
                p = _ptr(b)
                want = {"q": q2.data_ptr(), "k": k2.data_ptr(), "q2k_block_index": plan.index.data_ptr(),
                        "block_counts": plan.counts.data_ptr()}
                if a in want:
                    assert p == want[a], (name, a)
                elif a in TEMPS:
                    assert in_ws(p), (name, a)
                    assert temps.setdefault(a, p) == p  # one slot per temporary, in every launch
                else:
                    assert a == "dense_rows"
                    if dense is None:  # never read: the counts, as the full path passes them
                        assert p == plan.counts.data_ptr()
                    elif dense == "int32":
                        assert p == d2.data_ptr()
                    else:  # the int32 copy made for this call
                        assert p not in (d2.data_ptr(), plan.counts.data_ptr()) and not in_ws(p)
        assert len(set(temps.values())) == len(temps) == 3
        assert ws.numel() == rep.workspace_bytes


def test_replay_allocates_results_and_takes_fresh_workspace_under_capture(cpu_route, monkeypatch):
    """Both results are new tensors per call (torch.empty_strided, the recorded specs), the
    workspace is the stream's own in eager calls and a fresh one under CUDA-graph capture (a graph
    may replay on any stream), which leaves the stream's alone."""
    lib, raw, runs = cpu_route
    q, k = _qk()
    api.route(q, k, sparsity=0.5)
    rep = replay.lookup(replay.signature_route(q, k, None, 0.5, None, 4, None, 64, None, "BSHD"))
    rep.alloc_device = "cpu"
    a = api.route(q, k, sparsity=0.5)
    b = api.route(q, k, sparsity=0.5)
    assert runs["full"] == 1
    assert a.index.data_ptr() != b.index.data_ptr() and a.counts.data_ptr() != b.counts.data_ptr()
    held = workspace.streams[("cpu", STREAM_NOW)].ws
    made = []
    real = workspace.stream_workspace

    def spy(device, stream, nbytes, fresh):
        t = real(device, stream, nbytes, fresh)
        made.append((fresh, t))
        return t

    monkeypatch.setattr(workspace, "stream_workspace", spy)
    monkeypatch.setattr(workspace, "capturing", lambda: True)
    _reset(raw)
    api.route(q, k, sparsity=0.5)
    assert runs["full"] == 1 and [f for f, _ in made] == [True]
    fresh = made[0][1]
    assert fresh is not held and workspace.streams[("cpu", STREAM_NOW)].ws is held
    pool = _launches(lib, raw)[0][1]
    assert fresh.data_ptr() <= _ptr(pool["pooled_q"]) < fresh.data_ptr() + fresh.numel()


def test_scalars_shapes_and_pointer_patterns_key_new_signatures(cpu_route):
    """Every scalar, every tensor's shape, strides and dtype, the dense rows and which inputs share
    a pointer are in the key; a call with another of them records anew, then replays its own."""
    lib, raw, runs = cpu_route
    q, k = _qk()
    d = torch.zeros(5, dtype=torch.bool)
    base = dict(dense_rows=None, sparsity=0.75, softmax_scale=None, n_q=4, n_k=None, block_size_k=64,
                budget_granularity=None, layout="BSHD")

    def key(q_=q, k_=k, **kw):
        a = dict(base, **kw)
        return replay.signature_route(q_, k_, a["dense_rows"], a["sparsity"], a["softmax_scale"], a["n_q"], a["n_k"],
                                      a["block_size_k"], a["budget_granularity"], a["layout"])

    k0 = key()
    others = [key(sparsity=0.5), key(softmax_scale=0.1), key(n_q=2), key(n_k=8), key(block_size_k=128),
              key(budget_granularity=1), key(layout="BHSD"), key(dense_rows=d), key(dense_rows=d.to(torch.int32)),
              key(q_=q.contiguous()), key(q_=q[:, :200]), key(k_=k[:, :640]), key(q_=q.half())]
    assert len({k0, *others}) == len(others) + 1
    q2, k2 = _qk(seed=3)
    qq, _ = _qk(Sk=300)
    assert key(k_=q) != key(k_=q2) == key(q_=qq, k_=q2)  # k is q: another pointer pattern
    assert key(q2, k2) == k0  # new pointers, the same signature
    assert key(q_=q.detach()) == k0
    # unusual scalar types are not keyed: the full path validates them
    for bad in (dict(sparsity=True), dict(sparsity=torch.tensor(0.5)), dict(n_q=4.0), dict(n_k=True),
                dict(softmax_scale=1), dict(block_size_k=64.0), dict(budget_granularity=8.0), dict(layout=None)):
        assert key(**bad) is None, bad

    # through the public call: each new signature records once, then replays
    api.route(q, k, sparsity=0.75)
    for kw in (dict(sparsity=0.5), dict(sparsity=0.75, n_q=2), dict(sparsity=0.75, block_size_k=128)):
        before = runs["full"]
        api.route(q, k, **kw)
        assert runs["full"] == before + 1, kw
        replay.lookup(replay.signature_route(q, k, None, kw["sparsity"], None, kw.get("n_q", 4), None,
                                             kw.get("block_size_k", 64), None, "BSHD")).alloc_device = "cpu"
        api.route(q2, k2, **kw)
        assert runs["full"] == before + 1, kw
    q3, k3 = _qk(Sq=200)  # another shape
    before = runs["full"]
    api.route(q3, k3, sparsity=0.75)
    assert runs["full"] == before + 1


def test_library_and_traced_calls_never_replay(cpu_route, monkeypatch):
    """``library=`` (test builds) always takes the full path, and so does a traced call
    (torch.compile, a dispatch mode, a tensor subclass: ``validation.eager``), which never asks
    the replay; ``route_with_scores`` never does either."""
    lib, raw, runs = cpu_route
    q, k = _qk()
    api.route(q, k, sparsity=0.75)
    rep = replay.lookup(replay.signature_route(q, k, None, 0.75, None, 4, None, 64, None, "BSHD"))
    assert isinstance(rep, replay.PlanReplay)
    rep.alloc_device = "cpu"
    asked = []
    real_eager = calls.route

    def eager_call(*a):
        asked.append(a)
        return real_eager(*a)

    monkeypatch.setattr(calls, "route", eager_call)
    for _ in range(2):
        _reset(raw)
        api.route(q, k, sparsity=0.75, library=lib)
        assert len(_calls(raw)) == 2
    assert runs["full"] == 3 and asked == []
    plan, scores, pq, pk = R.route_with_scores(q, k, sparsity=0.75)
    assert runs["checks"] == 4 and asked == []

    class Traced(Exception):
        def __init__(self):
            super().__init__("traced: the operator path")

    real_check = R.check_route_args

    def check(*a, runtime=True, **kw):  # a traced call checks without pointers, then its operator
        if not runtime:
            raise Traced()
        return real_check(*a, runtime=runtime, **kw)

    monkeypatch.setattr(R, "check_route_args", check)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with pytest.raises(Traced, match="the operator path"), Mode():
        api.route(q, k, sparsity=0.75)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(Traced, match="the operator path"):
        api.route(q, k, sparsity=0.75)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)

    class Sub(torch.Tensor):
        pass

    with pytest.raises(Traced, match="the operator path"):
        api.route(q.as_subclass(Sub), k, sparsity=0.75)
    assert asked == []
    api.route(q, k, sparsity=0.75)  # plain eager again: asks, replays
    assert len(asked) == 1 and runs["full"] == 3


def test_misaligned_pointers_launch_nothing_and_the_full_path_names_them(cpu_route):
    """Alignment is checked per replayed call, in C before the first launch: q 2 bytes off its
    16-byte boundary (same strides, so the same signature) launches nothing and the full path
    raises its error; so does a dense-rows pointer off its 4-byte alignment."""
    lib, raw, runs = cpu_route
    q, k = _qk()
    api.route(q, k, sparsity=0.75)
    rep = replay.lookup(replay.signature_route(q, k, None, 0.75, None, 4, None, 64, None, "BSHD"))
    rep.alloc_device = "cpu"
    raw_q = torch.empty(q.untyped_storage().nbytes() // 2 + 8, dtype=torch.bfloat16)
    q_bad = torch.empty(0, dtype=torch.bfloat16).set_(raw_q.untyped_storage(), 1, q.shape, q.stride())
    assert q_bad.data_ptr() % 16 == 2
    assert replay.signature_route(q_bad, k, None, 0.75, None, 4, None, 64, None, "BSHD") == \
        replay.signature_route(q, k, None, 0.75, None, 4, None, 64, None, "BSHD")
    _reset(raw)
    with pytest.raises(ValueError, match="q: data pointer is not 16-byte aligned"):
        api.route(q_bad, k, sparsity=0.75)
    assert _calls(raw) == [] and runs["full"] == 1
    # the dense rows' pointer is patched and checked like the others
    d = _dense("int32", 2, 3, 300)
    api.route(q, k, sparsity=0.75, dense_rows=d)
    rep = replay.lookup(replay.signature_route(q, k, d, 0.75, None, 4, None, 64, None, "BSHD"))
    assert isinstance(rep, replay.PlanReplay)
    rep.alloc_device = "cpu"
    _reset(raw)
    assert rep.launch((q.data_ptr(), k.data_ptr(), d.data_ptr() + 2, -4, -5, -6)) is None
    assert _calls(raw) == []
    assert rep(q, k, d) is not None and len(_calls(raw)) == 2


def test_plan_recording_maps_both_results():
    """A full path returning a Plan is replayed by a PlanReplay: index is root RESULT, counts is
    RESULT2 (one root past the attention calls' ten), the facts come from the plan; an attention
    recording (one tensor) still builds a plain Replay with its ten roots."""
    from subblock_sage.plan import Plan

    q = torch.empty(1, 64, 1, 128, dtype=torch.bfloat16)
    idx = torch.empty(1, 1, 1, 4, dtype=torch.int32)
    cnt = torch.empty(1, 1, 1, dtype=torch.int32)
    tmp = torch.empty(1, 1, 4, 128, dtype=torch.bfloat16)
    args = [{"kind": "tensor", "name": n, "align": 16} for n in ("q", "tmp", "index", "counts")]
    entry = type("E", (), {"name": "x", "args": args + [{"kind": "stream", "name": "stream"}], "index": 0})
    blk = type("B", (), {"offsets": (0, 8, 16, 24, 32)})
    rec = replay.Recorder((q, q, None, None, None, None))
    rec.add(entry, blk, object(), 0, b"\0" * 40, {"q": q, "tmp": tmp, "index": idx, "counts": cnt})
    rep = rec.build(Plan(idx, cnt, 3, 64, 64))
    assert type(rep) is replay.PlanReplay and rep.facts == (3, 64, 64)
    assert rep.results == (((1, 1, 1, 4), (4, 4, 4, 1), torch.int32), ((1, 1, 1), (1, 1, 1), torch.int32))
    p = ctypes.cast(rep._steps[0].patches, ctypes.POINTER(replay._Patch))
    assert [(p[i].root, p[i].delta) for i in range(5)] == [
        (replay.Q, 0), (replay.WORKSPACE, 0), (replay.RESULT, 0), (replay.RESULT2, 0), (replay.STREAM, 0)]
    assert replay.RESULT2 == replay.N_ROOTS  # the attention replay passes ten roots, unchanged
    one = replay.Recorder((q, q, None, None, None, None))
    one.add(entry, blk, object(), 0, b"\0" * 40, {"q": q, "tmp": tmp, "index": idx, "counts": tmp})
    assert type(one.build(idx)) is replay.Replay
    with pytest.raises(replay._NotReplayable, match="without counts"):
        rec.build(Plan(idx, None, 3, 64, 64))
