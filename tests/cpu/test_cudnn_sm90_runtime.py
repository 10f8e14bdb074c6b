"""cuDNN's SM90 contenders' runtime side without a GPU (benchmark/lab/cudnn_sm90.py).

Each contender launches through the stub path of tests/cpu/test_replay.py: the real shim C
(aot/shim.py) generated for the three exports' C arguments (the registry's specs, as the export
records them) and compiled against stub kernels that log every argument block; a launch must reach
the right kernel with the argument bytes ``abi`` packs. Also: load() without the test library, the
launchers' refusals, and the fixed-count padding of the Sage group.
"""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from aot.registry import ScalarArg, StreamArg, Sym, TensorArg  # noqa: E402
from subblock_sage import abi  # noqa: E402
from benchmark.lab import contenders as ctd  # noqa: E402
from benchmark.lab import cudnn_sm90, test_library  # noqa: E402
from tests.cpu import test_replay as T  # noqa: E402


def _layout(a) -> dict:
    """One C argument as aot/export/layout.py records it (shapes int32, strides int64)."""
    if isinstance(a, TensorArg):
        def dim(s):
            return {"sym": s.key, "div": s.div} if isinstance(s, Sym) else s
        return {"name": a.name, "kind": "tensor", "dtype": a.dtype, "align": a.align,
                "shape": [dim(s) for s in a.shape], "stride": [dim(s) for s in a.stride],
                "shape_ctype": "int32_t", "stride_ctype": "int64_t"}
    if isinstance(a, ScalarArg):
        return {"name": a.name, "kind": "scalar", "dtype": a.dtype,
                "ctype": {"float32": "float", "int32": "int32_t"}[a.dtype]}
    assert isinstance(a, StreamArg)
    return {"name": a.name, "kind": "stream"}


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory):
    from aot import registry

    entries = []
    for k in registry.all_kernels():
        if k.name in cudnn_sm90.KERNELS:
            for v in k.variants:
                spec_args = {"cudnn_bsa_sm90_bf16": "BF16_ARGS", "cudnn_sage_sm90_fp8": "FP8_ARGS",
                             "cudnn_sage_quant_sm90": "QUANT_ARGS"}[k.name]
                from aot.kernels import cudnn_sm90 as spec

                entries.append({"kernel": k.name, "variant": v.name, "params": dict(v.params),
                                "args": [_layout(a) for a in getattr(spec, spec_args)]})
    assert len(entries) == 4
    lib, raw, _ = T.build_fake_library(tmp_path_factory.mktemp("cudnn_stub"), entries)
    return lib, raw, [e["kernel"] + ":" + e["variant"] for e in entries]


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(abi, "_current_stream", lambda index: 0x5000)
    # the launchers pass q's device: CPU tensors here, which the stubs serve as device 0
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def _aligned(*shape, dtype, align=128):
    """A CPU tensor whose data is ``align``-byte aligned (the exports assume 128 for bf16 Q/K/V/O)."""
    n = 1
    for s in shape:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.zeros(n * size + align, dtype=torch.uint8)
    off = (-raw.data_ptr()) % align
    return raw[off:off + n * size].view(dtype).view(*shape)


LOGGED_ARGS = 16  # the stub logs the first 16 argument blocks of a launch (the quantizer has 20)


def _launched(raw, names):
    """(kernel:variant, the logged argument blocks) of each stub launch since the last call."""
    n = ctypes.c_int32.in_dll(raw, "stub_calls").value
    log = (((ctypes.c_uint8 * T.LOG_ARG) * LOGGED_ARGS) * 64).in_dll(raw, "stub_log")
    kern = (ctypes.c_int32 * 64).in_dll(raw, "stub_kernel")
    nargs = (ctypes.c_int32 * 64).in_dll(raw, "stub_nargs")
    ctypes.c_int32.in_dll(raw, "stub_calls").value = 0
    return [(names[kern[c]], [bytes(log[c][i]) for i in range(min(nargs[c], LOGGED_ARGS))]) for c in range(n)]


def _expected_blocks(lib, kernel, params, values):
    """The first LOG_ARG bytes of each argument block ``abi`` packs for ``values``."""
    entry = lib.kernel(kernel, **params)
    argv, keep = abi.pack(entry, values, 0x5000)
    return [ctypes.string_at(argv[i], min(size, T.LOG_ARG)) for i, size in enumerate(T._arg_sizes(entry))]


def test_bf16_launches_through_the_stub_path(stub_lib, stream):
    lib, raw, names = stub_lib
    B, S, H = 1, 256, 2
    q, k, v, out = (_aligned(B, S, H, 128, dtype=torch.bfloat16) for _ in range(4))
    idx = torch.zeros(B, H, S // 64, 3, dtype=torch.int32)
    counts = torch.full((B, H, S // 64), 2, dtype=torch.int32)
    lse = torch.empty(B, H, S, dtype=torch.float32)
    ctypes.c_int32.in_dll(raw, "stub_calls").value = 0
    got = cudnn_sm90.CudnnSM90(lib).run_bf16(q, k, v, idx, counts, 0.125, out=out, lse=lse)
    assert got is out
    (name, blocks), = _launched(raw, names)
    assert name == "cudnn_bsa_sm90_bf16:blk64"
    want = _expected_blocks(lib, cudnn_sm90.BF16, {}, cudnn_sm90.CudnnSM90.bf16_values(q, k, v, idx, counts, out,
                                                                                     lse, 0.125))
    assert [b[:len(w)] for b, w in zip(blocks, want)] == want
    # the q argument: its pointer, then (S, D, H, B) extents and the three non-unit strides
    assert int.from_bytes(blocks[0][:8], "little") == q.data_ptr()


@pytest.mark.parametrize("block_k", [64, 128])
def test_sage_launches_quantizer_then_kernel(stub_lib, stream, block_k):
    lib, raw, names = stub_lib
    B, H, S = 1, 2, 256
    q, k, v = (_aligned(B, H, S, 128, dtype=torch.bfloat16, align=16) for _ in range(3))
    idx = torch.zeros(B, H, S // block_k, 2, dtype=torch.int32)
    bufs = cudnn_sm90.SageBuffers.like(q, k)
    c = cudnn_sm90.CudnnSM90(lib)
    c.check_sage(q, k, v, idx, 2, block_k, num_sms=132)
    ctypes.c_int32.in_dll(raw, "stub_calls").value = 0
    assert c.run_sage(q, k, v, idx, 2, 0.125, block_k, bufs, checked=True) is bufs.out
    got = _launched(raw, names)
    assert [n for n, _ in got] == ["cudnn_sage_quant_sm90:bhds", f"cudnn_sage_sm90_fp8:blk{block_k}"]
    want_q = _expected_blocks(lib, cudnn_sm90.QUANT, {}, c.quant_values(q, k, v, bufs))
    want_a = _expected_blocks(lib, cudnn_sm90.SAGE, {"block_k": block_k}, c.sage_values(bufs, idx, 2, 0.125))
    assert [b[:len(w)] for b, w in zip(got[0][1], want_q)] == want_q[:LOGGED_ARGS]
    assert [b[:len(w)] for b, w in zip(got[1][1], want_a)] == want_a


def test_launchers_refuse_what_the_exports_cannot_take():
    c = cudnn_sm90.CudnnSM90
    q = _aligned(1, 100, 2, 128, dtype=torch.bfloat16)
    idx, counts = torch.zeros(1, 2, 2, 2, dtype=torch.int32), torch.zeros(1, 2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="multiples of 64.*Fix:"):
        c.check_bf16(q, q, q, idx, counts)
    q = _aligned(1, 128, 2, 128, dtype=torch.bfloat16)
    k1 = _aligned(1, 128, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no GQA"):
        c.check_bf16(q, k1, k1, idx, counts)
    qh = _aligned(1, 2, 256, 128, dtype=torch.bfloat16, align=16)
    sidx = torch.zeros(1, 2, 4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="fixed count"):
        c.check_sage(qh, qh, qh, sidx, 3, 64)
    with pytest.raises(ValueError, match="132"):
        c.check_sage(qh, qh, qh, sidx, 2, 64, num_sms=114)
    q192 = _aligned(1, 2, 192, 128, dtype=torch.bfloat16, align=16)
    with pytest.raises(ValueError, match="multiples of 128"):
        c.check_sage(q192, q192, q192, sidx[:, :, :1], 2, 128)


def test_load_without_the_test_library_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(test_library.ENV, raising=False)
    monkeypatch.delenv(test_library.ENV_LIB_DIR, raising=False)
    assert cudnn_sm90.load() is None and "unset" in cudnn_sm90.load_failure
    assert cudnn_sm90.load(tmp_path) is None and "Fix:" in cudnn_sm90.load_failure
    with pytest.raises(ctd.Unavailable, match="SBS_TEST_LIBS=ON"):
        ctd.load_cudnn_sm90(tmp_path)


def test_fixed_count_plan_pads_sglang_plans_and_states_the_cost():
    from subblock_sage.tools.bench import make_sglang_plan

    index, counts = make_sglang_plan(1, 2, 4096, 4096, device="cpu")
    padded, count, padded_x = ctd.fixed_count_plan(index, counts)
    assert count == 64 and padded.shape[-1] == 64 and padded.is_contiguous()
    # routed rows keep their blocks first, then take distinct ones
    live = counts[0, 0, -1]
    assert torch.equal(padded[0, 0, -1, :live], index[0, 0, -1, :live])
    assert padded[0, 0, -1].unique().numel() == 64
    assert padded_x == pytest.approx(counts.numel() * 64 / float(counts.sum()))
    assert 2.5 < padded_x < 3.5
    idx = torch.tensor([[[[0, 1], [1, 1]]]], dtype=torch.int32)
    with pytest.raises(ValueError, match="twice"):
        ctd.fixed_count_plan(idx, torch.tensor([[[2, 1]]], dtype=torch.int32))
