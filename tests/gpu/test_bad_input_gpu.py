"""Bad input on a real GPU: everything tests/cpu/test_bad_input.py checks, on CUDA tensors, plus
what needs the device (pointer alignment, plan values, mixed CUDA devices, CUDA-graph capture
where value checks are skipped and the kernels must still stay in bounds).

Every refusal must come before any launch: ``abi.launch`` and ``Library.launch_raw`` (where
every launch ends) are trapped while bad calls run.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage.reference import reference_sparse_attention  # noqa: E402
from tests.helpers import bad_input as cpu_cases  # noqa: E402
from tests.helpers.gpu import compare, qkv, random_plan  # noqa: E402
from tests.helpers.served import need_mode  # noqa: E402

MODES = ("bf16", "sage_fp8")


def no_launch_fn(*a, **k):
    raise AssertionError("a kernel was launched for bad input")


@pytest.fixture
def no_launch(monkeypatch):
    from subblock_sage import abi, loader

    from subblock_sage import replay

    replay.clear()  # every call takes the full path first (a replay would end in run_steps)
    monkeypatch.setattr(abi, "launch", no_launch_fn)
    monkeypatch.setattr(loader.Library, "launch_raw", no_launch_fn)  # every full-path launch ends here
    monkeypatch.setattr(loader.Library, "_run_steps", no_launch_fn, raising=False)  # every replay


def _cuda_like(x):
    """A CUDA tensor with the shape, strides and dtype of the (meta) tensor x."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.numel() == 0:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
    span = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
    return torch.zeros(span, dtype=x.dtype, device="cuda").as_strided(x.shape, x.stride())


def _small(a):
    return all(not isinstance(x, torch.Tensor) or x.numel() <= 2**26 for x in a.values())


@pytest.mark.parametrize("name", sorted(cpu_cases.ATTN_CASES))
def test_sparse_attention_metadata_cases_on_cuda(no_launch, name):
    build, exc, msg = cpu_cases.ATTN_CASES[name]
    a = build()
    if not _small(a):
        pytest.skip("too large to allocate")
    a = {n: _cuda_like(x) for n, x in a.items()}
    with pytest.raises(exc, match=msg):
        subblock_sage.sparse_attention(a["q"], a["k"], a["v"], a["idx"], a["cnt"])


@pytest.mark.parametrize("name", sorted(cpu_cases.QUANT_CASES))
def test_quantize_sage_metadata_cases_on_cuda(no_launch, name):
    build, exc, msg = cpu_cases.QUANT_CASES[name]
    a = build()
    if not _small(a):
        pytest.skip("too large to allocate")
    a = {n: _cuda_like(x) for n, x in a.items()}
    with pytest.raises(exc, match=msg):
        subblock_sage.quantize_sage(a["q"], a["k"], a["v"])


@pytest.mark.parametrize("name", sorted(cpu_cases.SCALAR_CASES))
def test_scalar_cases_on_cuda(no_launch, name):
    kw, exc, msg = cpu_cases.SCALAR_CASES[name]
    q, k, v = qkv(1, 200, 300, 2, "cuda")
    idx, cnt = random_plan(1, 2, 200, 300, 3, "cuda")
    with pytest.raises(exc, match=msg):
        subblock_sage.sparse_attention(q, k, v, idx, cnt, **kw)


def test_misaligned_pointer(no_launch):
    q, k, v = qkv(1, 200, 300, 2, "cuda")
    buf = torch.zeros(q.numel() + 8, dtype=torch.bfloat16, device="cuda")
    q_bad = buf[1:1 + q.numel()].view(q.shape)  # 2-byte offset
    idx, cnt = random_plan(1, 2, 200, 300, 3, "cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        subblock_sage.sparse_attention(q_bad, k, v, idx, cnt)
    with pytest.raises(ValueError, match="16-byte aligned"):
        subblock_sage.quantize_sage(q_bad, k, v)
    out_buf = torch.zeros(q.numel() + 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        subblock_sage.sparse_attention(q, k, v, idx, cnt, out=out_buf[4:4 + q.numel()].view(q.shape))


def test_cpu_and_cuda_mixed(no_launch):
    q, k, v = qkv(1, 200, 300, 2, "cuda")
    idx, cnt = random_plan(1, 2, 200, 300, 3, "cuda")
    for bad in (dict(idx=idx.cpu()), dict(cnt=cnt.cpu()), dict(k=k.cpu()), dict(out=torch.empty_like(q).cpu())):
        a = dict(q=q, k=k, v=v, idx=idx, cnt=cnt, out=None)
        a.update(bad)
        with pytest.raises(ValueError, match="one CUDA device"):
            subblock_sage.sparse_attention(a["q"], a["k"], a["v"], a["idx"], a["cnt"], out=a["out"])
    with pytest.raises(ValueError, match="one CUDA device"):
        subblock_sage.quantize_sage(q, k.cpu(), v)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_cuda_devices_mixed(no_launch):
    q, k, v = qkv(1, 200, 300, 2, "cuda:0")
    idx, cnt = random_plan(1, 2, 200, 300, 3, "cuda:0")
    with pytest.raises(ValueError, match="one CUDA device"):
        subblock_sage.sparse_attention(q, k.to("cuda:1"), v, idx, cnt)
    with pytest.raises(ValueError, match="one CUDA device"):
        subblock_sage.sparse_attention(q, k, v, idx.to("cuda:1"), cnt)
    with pytest.raises(ValueError, match="one CUDA device"):
        subblock_sage.quantize_sage(q, k, v.to("cuda:1"))


# ---------------------------------------------------------------------------------------------
# Plan values


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [4, -1, 2**31 - 1])
def test_counts_out_of_range_refused_with_check_plan(mode, bad):
    """check_plan=True: bad counts raise after the plan kernel's summary, before the attention
    kernel (default: clamped, tests/gpu/test_replay_gpu.py)."""
    need_mode(mode)
    q, k, v = qkv(1, 200, 300, 2, "cuda")
    idx, cnt = random_plan(1, 2, 200, 300, 3, "cuda")
    cnt[0, 1, 2] = bad
    from subblock_sage import loader
    from subblock_sage.contract import ATTENTION_KERNELS

    real = loader.Library.launch_raw

    launched = []

    def no_attention(self, entry, *a, **kw):
        # the plan kernel computes the value summary the check reads, and the Sage quantizer is
        # enqueued first (into temporaries: it needs no plan); no attention kernel may run (its
        # arguments are packed before the check, but launch_raw is where every launch happens)
        if entry.name in ATTENTION_KERNELS:
            raise AssertionError(f"{entry.name} was launched for bad input")
        launched.append(entry.name)
        return real(self, entry, *a, **kw)

    out = torch.full_like(q, 7.0)
    loader.Library.launch_raw = no_attention
    try:
        with pytest.raises(ValueError, match=r"block_counts values must be in 0..capacity \(3\)"):
            subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, out=out, check_plan=True)
    finally:
        loader.Library.launch_raw = real
    torch.cuda.synchronize()
    assert launched, "the plan kernel computes the summary"
    assert bool((out == 7.0).all()), "out was written for bad input"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [-1, 5, 10**6, -(2**31)])
def test_index_out_of_range(mode, bad):
    """Skipped by default (like the reference); check_plan=True raises before the launch."""
    need_mode(mode)
    q, k, v = qkv(1, 200, 300, 2, "cuda", seed=3)
    idx, cnt = random_plan(1, 2, 200, 300, 4, "cuda", seed=3)
    cnt[0, 0, 1] = 3
    idx[0, 0, 1, 1] = bad  # live slot; ceil(300/64) = 5 key blocks
    ref = reference_sparse_attention(q, k, v, idx, cnt)
    got = subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode)
    compare(got, ref, mode)
    with pytest.raises(ValueError, match=r"q2k_block_index\[0, 0, 1, 1\]"):
        subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, check_plan=True)


@pytest.mark.parametrize("mode", MODES)
def test_topk_beyond_capacity(mode):
    q, k, v = qkv(1, 200, 300, 2, "cuda")
    idx, _ = random_plan(1, 2, 200, 300, 3, "cuda")
    with pytest.raises(ValueError, match=r"topk must be an int in 0..capacity \(3\), got 4"):
        subblock_sage.sparse_attention(q, k, v, idx, None, topk=4, compute_mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_garbage_plan_under_graph_capture_stays_in_bounds(mode):
    """Under CUDA-graph capture the value checks (a sync) are skipped: counts above capacity or
    negative and indices out of range must still neither read nor write out of bounds. The output
    lives inside a guarded buffer; the result equals the reference of the clamped plan."""
    need_mode(mode)
    B, Sq, Sk, H, cap = 1, 200, 300, 2, 4
    q, k, v = qkv(B, Sq, Sk, H, "cuda", seed=5)
    idx, cnt = random_plan(B, H, Sq, Sk, cap, "cuda", seed=5)
    idx[0, 0, 0, :] = torch.tensor([-5, 99, 2**31 - 1, 1], dtype=torch.int32)
    cnt[0, 0, 0] = 1000  # above capacity
    cnt[0, 1, 1] = -3  # negative
    cnt[0, 1, 2] = 2**31 - 1
    guard = 7.0
    buf = torch.full((B, Sq + 128, H, 128), guard, dtype=torch.bfloat16, device="cuda")
    out = buf[:, 64:64 + Sq]
    subblock_sage.preload(q.device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (loads kernels, allocator pools) with a valid plan
        subblock_sage.sparse_attention(q, k, v, idx.clamp(0, 4), cnt.clamp(0, cap), compute_mode=mode,
                                       out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, out=out)
    out.fill_(0)
    g.replay()
    torch.cuda.synchronize()
    assert bool((buf[:, :64] == guard).all()) and bool((buf[:, 64 + Sq:] == guard).all())
    ref = reference_sparse_attention(q, k, v, idx, cnt.clamp(0, cap))
    compare(out, ref, mode)


@pytest.mark.parametrize("mode", MODES)
def test_empty_and_zero_rows_are_exact_zeros(mode):
    need_mode(mode)  # skips only where the target does not ship the mode (manifest), else fails
    q, k, v = qkv(1, 128, 200, 2, "cuda")
    idx, cnt = random_plan(1, 2, 128, 200, 3, "cuda")
    cnt.zero_()
    out = subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode,
                                         out=torch.full_like(q, float("nan")))
    assert bool((out == 0).all())
