"""Launch replay (``replay.py`` + the shim's ``run_steps``) without a GPU.

The real shim C (``aot/shim.py``) is compiled against stub kernels and a stub CUDA runtime that
log every launch's argument bytes and the current device. A call is recorded through ``abi``
(the full path's packer) and replayed with other tensors; every argument block the stubs receive
must be byte for byte what ``abi`` packs for those tensors, with temporaries inside the replay's
workspace. Misaligned pointers and malformed steps must launch nothing.
"""

from __future__ import annotations

import ctypes
import json

import pytest

torch = pytest.importorskip("torch")

from aot.shim import generate  # noqa: E402
from subblock_sage import abi, loader, replay, workspace  # noqa: E402
from subblock_sage.contract import ABI_VERSION, SYMBOL_PREFIX  # noqa: E402
from tests.helpers.cc import zig_cc  # noqa: E402

LOG_ARG = 48  # bytes logged per argument


def _t(name, dtype, shape, stride, align=16, shape_ct="int32_t", stride_ct="int64_t"):
    return {"kind": "tensor", "name": name, "dtype": dtype, "shape": shape, "stride": stride,
            "shape_ctype": shape_ct, "stride_ctype": stride_ct, "align": align}


def sym(key, div=1):
    return {"sym": key, "div": div}


BSHD = [sym("B"), sym("S"), sym("H"), 128]
STRIDES = lambda n: [sym(f"{n}.sb", 8), sym(f"{n}.ss", 8), sym(f"{n}.sh", 8), 1]  # noqa: E731
# "quant": q -> tmp (a temporary), "attn": q, k, tmp, idx, out + a scalar
KERNELS = {
    "quant": [_t("q", "bfloat16", BSHD, STRIDES("q")), _t("tmp", "int8", BSHD, STRIDES("tmp")),
              {"kind": "stream", "name": "stream"}],
    "attn": [_t("q", "bfloat16", BSHD, STRIDES("q")), _t("k", "bfloat16", BSHD, STRIDES("k")),
             _t("tmp", "int8", BSHD, STRIDES("tmp")),
             _t("q2k_block_index", "int32", [sym("B"), sym("H"), sym("G"), sym("C")],
                [sym("i.sb"), sym("i.sh"), sym("i.sg"), 1], align=4),
             _t("out", "bfloat16", BSHD, STRIDES("out")),
             {"kind": "scalar", "name": "scale", "dtype": "float32"},
             {"kind": "stream", "name": "stream"}],
    # "sq": a quantizer-like launch with the stream's buffer (workspace.sync_buffer)
    "sq": [_t("q", "bfloat16", BSHD, STRIDES("q")), _t("sync", "int32", [sym("N")], [1], align=8),
           {"kind": "stream", "name": "stream"}],
}

STUB = r"""
#include <stdint.h>
#include <string.h>
typedef int cudaError_t;
static int g_dev = 0;
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return 0; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 2; return 0; }
cudaError_t cudaGetDevice(int *d) { *d = g_dev; return 0; }
cudaError_t cudaSetDevice(int d) { g_dev = d; return 0; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "stub"; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "stub"; }
cudaError_t cudaDeviceGetAttribute(int *v, int a, int d) { (void)a; (void)d; *v = 9; return 0; }
int stub_current_device(void) { return g_dev; }

#define LOG_ARG __LOG_ARG__
uint8_t stub_log[64][16][LOG_ARG];
int32_t stub_kernel[64], stub_nargs[64], stub_device[64], stub_calls = 0;
static void stub_launch(int32_t kernel, void **args, int32_t n) {
    int c = stub_calls++;
    stub_kernel[c] = kernel; stub_nargs[c] = n - 1; stub_device[c] = g_dev;
    for (int i = 0; i < n - 1 && i < 16; ++i) memcpy(stub_log[c][i], args[i], LOG_ARG);
    *(int32_t *)args[n - 1] = 0;
}
"""


def _stub_kernel(i: int, prefix: str) -> str:
    return (f"void _mlir_{prefix}_cuda_init(void **a) {{ *(cudaError_t *)a[1] = 0; }}\n"
            f"void _mlir_{prefix}_cuda_load_to_device(void **a) {{ *(cudaError_t *)a[2] = 0; }}\n"
            f"void stub_{prefix}(void **args, int32_t n) {{ stub_launch({i}, args, n); }}\n")


def build_fake_library(d, kernels, name: str = "libfake.so", target: str = "sm_90a", major: int = 9):
    """A kernels library of ``kernels`` (name -> declared args, one variant "default" each; or a
    list of export entries: kernel, variant, params, args) whose kernels are the logging stubs
    above, for ``target`` on a GPU of compute capability ``major``.x, built in the folder ``d``
    through the real shim: ``(Library, its ctypes handle, the exports record)``."""
    if isinstance(kernels, dict):
        kernels = [{"kernel": k, "variant": "default", "params": {}, "args": a} for k, a in kernels.items()]
    exports = {"library": "fake", "target": target, "abi_version": ABI_VERSION, "host_arch": "x86_64",
               "kernels": [{**e, "prefix": f"p{i}", "ciface": f"stub_p{i}"} for i, e in enumerate(kernels)]}
    (d / "shim.c").write_text(generate(exports))
    (d / "stub.c").write_text(STUB.replace("__LOG_ARG__", str(LOG_ARG)).replace("*v = 9;", f"*v = {major};") +
                              "".join(_stub_kernel(i, f"p{i}") for i in range(len(kernels))))
    so = d / name
    # -Bsymbolic: the shim's CUDA calls bind to these stubs even where a CUDA build of torch has
    # loaded the real libcudart into the global scope (the shipped libraries link cudart
    # statically with hidden symbols, so they bind locally too)
    zig_cc("-shared", "-fPIC", "-O1", "-Wl,-Bsymbolic", "-o", str(so), str(d / "shim.c"), str(d / "stub.c"),
           "-lpthread")
    lib = loader.Library(so)
    return lib, lib._lib, exports


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    return build_fake_library(tmp_path_factory.mktemp("fake_shim"), KERNELS)


def _reset(raw):
    ctypes.c_int32.in_dll(raw, "stub_calls").value = 0


def _calls(raw):
    n = ctypes.c_int32.in_dll(raw, "stub_calls").value
    log = (((ctypes.c_uint8 * LOG_ARG) * 16) * 64).in_dll(raw, "stub_log")
    kern = (ctypes.c_int32 * 64).in_dll(raw, "stub_kernel")
    nargs = (ctypes.c_int32 * 64).in_dll(raw, "stub_nargs")
    dev = (ctypes.c_int32 * 64).in_dll(raw, "stub_device")
    return [(kern[c], dev[c], [bytes(log[c][i]) for i in range(nargs[c])]) for c in range(n)]


def _inputs(seed_shift=0):
    B, S, H = 2, 100, 3
    big = torch.empty(B, S, 3, H, 128, dtype=torch.bfloat16)  # q and k share one allocation
    q, k = big[:, :, 0], big[:, :, 1]
    idx = torch.empty(B, H, 2, 5, dtype=torch.int32)
    return q, k, idx


def _full_path(lib, q, k, idx, out=None):
    """What a backend does: a temporary, a result, two launches through abi."""
    tmp = torch.empty(q.shape[0], q.shape[2], q.shape[1], 128, dtype=torch.int8).permute(0, 2, 1, 3)
    res = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    abi.launch("quant", {}, {"q": q, "tmp": tmp}, device=0, library=lib)
    go = abi.prepare("attn", {}, {"q": q, "k": k, "tmp": tmp, "q2k_block_index": idx, "out": res,
                                  "scale": 0.5}, device=0, library=lib)
    go()
    return res, tmp


def _arg_sizes(entry):
    blk = abi._block_for(entry)
    offs = list(blk.offsets) + [blk.struct.size]
    return [offs[i + 1] - offs[i] for i in range(len(entry.args))]


def _spared() -> set:
    """The (device, stream) keys holding a spare result."""
    return {key for key, st in workspace.streams.items() if st.spare is not None}


def _workspaces() -> dict:
    """(device, stream) -> the stream's workspace tensor, for the streams that have one."""
    return {key: st.ws for key, st in workspace.streams.items() if st.ws is not None}


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(abi, "_current_stream", lambda index: 0x5000)
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7000)
    monkeypatch.setattr(workspace, "capturing", lambda: False)
    workspace.release_workspaces()
    yield
    workspace.release_workspaces()


def _record(lib, raw, q, k, idx, sync_words=0):
    """The recorded replay of ``_full_path``; ``sync_words``: first a quantizer-like launch that
    takes the stream's buffer (``sq``, ``workspace.sync_buffer``)."""
    rec = replay.Recorder((q, k, k, idx, None, None))
    abi.set_recorder(rec)
    try:
        if sync_words:
            abi.launch("sq", {}, {"q": q, "sync": workspace.sync_buffer("cpu", sync_words)}, device=0, library=lib)
        res, tmp = _full_path(lib, q, k, idx)
    finally:
        abi.set_recorder(None)
    rep = rec.build(res)
    rep.alloc_device = "cpu"
    return rep, res, tmp


def test_replay_reproduces_every_argument_block(fake_lib, stream, monkeypatch):
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    _reset(raw)
    rep, _, _ = _record(lib, raw, q, k, idx)
    assert rep.kernels == ["quant", "attn"]
    recorded = _calls(raw)
    assert len(recorded) == 2

    # later calls: new tensors with the same signature. The first is the stream's first replay
    # (``Replay._launch``: a new workspace, the result allocated); the second is the steady state
    # (``Replay.launch``: the stream's workspace and spare, read as ints), given the pointers
    # ``keyed`` took for the cache key, as ``sparse_attention`` does
    spaces = []
    real_empty = torch.empty

    def spy(*a, **kw):
        t = real_empty(*a, **kw)
        spaces.append(t)
        return t

    for n_call in range(2):
        q2, k2, idx2 = _inputs()
        monkeypatch.setattr(torch, "empty", spy)
        _reset(raw)
        if n_call == 0:
            spare = None
            res2 = rep(q2, k2, k2, idx2, None, None)
        else:
            spare = workspace.streams[("cpu", 0x7000)].spare
            key, ptrs = replay.keyed(q2, k2, k2, idx2, None, None, None, 64, None, "bf16", "BSHD")
            res2 = rep.launch(ptrs, None)
        monkeypatch.setattr(torch, "empty", real_empty)
        assert len(spaces) == 1  # one workspace, made by the first call
        assert res2 is not None and res2.shape == q2.shape and res2.stride() == (q2.shape[1] * q2.shape[2] * 128,
                                                                                  q2.shape[2] * 128, 128, 1)
        assert spare is None or res2 is spare
        got = _calls(raw)
        ws = spaces[0]
        # what abi packs for the new tensors, with the temporary placed where the replay put it
        tmp_ptr = ctypes.c_uint64.from_buffer_copy(got[0][2][1][:8]).value
        assert ws.data_ptr() <= tmp_ptr < ws.data_ptr() + ws.numel()
        B, S, H, _ = q2.shape
        tmp2 = torch.empty(0, dtype=torch.int8).set_(ws.untyped_storage(), tmp_ptr - ws.data_ptr(),
                                                     (B, S, H, 128), (H * S * 128, 128, S * 128, 1))
        assert len(got) == 2
        for (kern, dev, blocks), (name, values) in zip(got, [
                ("quant", {"q": q2, "tmp": tmp2}),
                ("attn", {"q": q2, "k": k2, "tmp": tmp2, "q2k_block_index": idx2, "out": res2, "scale": 0.5})]):
            entry = lib.kernel(name)
            assert kern == entry.index and dev == 0
            argv, keep = abi.pack(entry, values, 0x7000)
            for i, size in enumerate(_arg_sizes(entry)):
                n = min(size, LOG_ARG)
                assert blocks[i][:n] == ctypes.string_at(argv[i], n), (n_call, name, entry.args[i]["name"])
        # the recorded blocks differ from the replayed ones only in pointers and the stream
        assert recorded[1][2][5][:4] == got[1][2][5][:4]  # the scalar
        assert ctypes.c_uint64.from_buffer_copy(got[0][2][2][:8]).value == 0x7000


def test_launches_before_the_result_go_out_before_it_is_allocated(fake_lib, stream, monkeypatch):
    """Nothing Python between a call's launches (the host path right after a wait runs 30-100 us
    on the H200 host): a replay's result is the spare its stream's previous call allocated after its own
    launches, and all launches go out in one run_steps call. Without a spare (the stream's first
    replay, a capture, a result over SPARE_RESULT_MAX), with the Sage quantizer's launch (a
    sync buffer) the steps that do not write the result are launched before the result is
    allocated (the quantizer hides it; an allocation right after a wait costs 14-18 us);
    without it (bf16: the short plan kernel) the result is allocated first and one run_steps
    call launches all (else the GPU waits 11-16 us for the host between the two). With
    ``out`` given there is nothing to allocate, and no spare either."""
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    seen = []
    real = torch.empty_strided

    def spy(*a, **kw):
        seen.append(ctypes.c_int32.in_dll(raw, "stub_calls").value)
        return real(*a, **kw)

    def call(rep, out=None):
        monkeypatch.setattr(torch, "empty_strided", spy)
        seen.clear()
        _reset(raw)
        try:
            return rep(q, k, k, idx, None, out)
        finally:
            monkeypatch.setattr(torch, "empty_strided", real)

    key = ("cpu", 0x7000)
    for sync_words, early in ((300, 2), (0, 0)):
        workspace.release_workspaces()
        rep, _, _ = _record(lib, raw, q, k, idx, sync_words=sync_words)
        names = (["sq"] if sync_words else []) + ["quant", "attn"]
        n = len(names)
        assert rep.kernels == names and rep._early == early  # "attn" writes the result
        res = call(rep)  # the stream's first replay: no spare yet
        assert seen == [early, n], sync_words  # the result, then the next call's spare
        assert [c[0] for c in _calls(raw)] == [lib.kernel(x).index for x in names]
        assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[-1][2][4][:8]).value == res.data_ptr()
        spare = workspace.streams[key].spare
        res2 = call(rep)
        assert res2 is spare and seen == [n]  # all launches first, then the next spare
        assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[-1][2][4][:8]).value == spare.data_ptr()
        assert workspace.streams[key].spare is not spare
        out = torch.empty_like(res)
        held = workspace.streams[key].spare
        assert call(rep, out) is out and seen == [] and workspace.streams[key].spare is held
        assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[-1][2][4][:8]).value == out.data_ptr()
        monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7100)  # another stream: its own
        res3 = call(rep)
        assert res3 is not held and seen == [early, n] and _spared() == {key, ("cpu", 0x7100)}
        monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7000)
        monkeypatch.setattr(workspace, "capturing", lambda: True)  # a capture: neither takes nor leaves one
        res4 = call(rep)
        assert res4 is not held and seen == [early] and workspace.streams[key].spare is held
        monkeypatch.setattr(workspace, "capturing", lambda: False)
        st = workspace.streams[key]
        st.spare, st.spare_spec = torch.empty(1), ((1,), (1,), torch.float32)  # another result spec: not taken
        call(rep)
        assert seen == [early, n]
        bound = replay.SPARE_RESULT_MAX
        monkeypatch.setattr(replay, "SPARE_RESULT_MAX", 0)  # the bound is fixed when recorded
        small = _record(lib, raw, q, k, idx, sync_words=sync_words)[0]
        monkeypatch.setattr(replay, "SPARE_RESULT_MAX", bound)
        for st in workspace.streams.values():
            st.spare = st.spare_spec = None
        call(small)
        assert seen == [early] and _spared() == set()
    workspace.release_workspaces()
    assert workspace.streams == {}


@pytest.mark.parametrize("case", ["capture", "over_keep_max", "first_call", "steady"])
def test_buffers_outlive_the_launches(fake_lib, stream, monkeypatch, case):
    """Every buffer a replay hands to the library (a fresh workspace under capture or past
    WORKSPACE_KEEP_MAX, the stream's workspace, the quantizer buffer, the result) is still
    referenced when ``run_steps`` launches: one dropped before returns its memory to the
    allocator, and the call's next allocation may take it (under capture: the quantizer buffer
    inside the call's dropped workspace, a launch failure). Checked with weak
    references at each ``run_steps`` call, and no two of the buffers may overlap."""
    import weakref

    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    rep, _, _ = _record(lib, raw, q, k, idx, sync_words=300)
    if case == "capture":
        monkeypatch.setattr(workspace, "capturing", lambda: True)
    elif case == "over_keep_max":
        monkeypatch.setattr(workspace, "WORKSPACE_KEEP_MAX", 0)
    elif case == "steady":
        assert rep(q, k, k, idx, None, None) is not None  # the stream's state and spare
    made = []
    real_empty, real_strided, real_zeros = torch.empty, torch.empty_strided, torch.zeros

    def keep(fn):
        def alloc(*a, **kw):
            t = fn(*a, **kw)
            made.append(weakref.ref(t))
            return t
        return alloc

    st = workspace.streams.get(("cpu", 0x7000))
    held = [] if st is None else [t for t in (st.ws, st.sync, st.spare) if t is not None]
    made += [weakref.ref(t) for t in held]
    del held, st
    monkeypatch.setattr(torch, "empty", keep(real_empty))
    monkeypatch.setattr(torch, "empty_strided", keep(real_strided))
    monkeypatch.setattr(torch, "zeros", keep(real_zeros))
    seen = []
    real_run = lib._run_steps

    def run_steps(*a):
        alive = [r() for r in made]
        seen.append(all(t is not None for t in alive))
        spans = sorted((t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in alive if t is not None)
        seen.append(all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])))
        return real_run(*a)

    monkeypatch.setattr(lib, "_run_steps", run_steps)
    res = rep(q, k, k, idx, None, None)
    assert res is not None and seen and all(seen), (case, seen)
    assert len(made) >= 2  # the workspace and the quantizer buffer at least, made or held


def test_workspace_is_the_streams_own_and_fresh_under_capture(fake_lib, stream, monkeypatch):
    """Eager replays on one stream share one workspace (kernels on a stream run in order), grown
    to the largest need; another stream gets its own; a call captured into a CUDA graph gets a
    fresh one (a graph may replay on any stream) and leaves the stream's alone; so does a call
    needing more than WORKSPACE_KEEP_MAX."""
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    rep, _, _ = _record(lib, raw, q, k, idx)

    def ws_ptr():
        _reset(raw)
        assert rep(q, k, k, idx, None, None) is not None
        return ctypes.c_uint64.from_buffer_copy(_calls(raw)[0][2][1][:8]).value

    a = ws_ptr()
    assert ws_ptr() == a  # the same buffer call after call
    held = workspace.streams[("cpu", 0x7000)].ws
    assert held.data_ptr() <= a < held.data_ptr() + held.numel()
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7100)
    b = ws_ptr()
    assert not (held.data_ptr() <= b < held.data_ptr() + held.numel())
    assert set(_workspaces()) == {("cpu", 0x7000), ("cpu", 0x7100)}
    monkeypatch.setattr(workspace, "capturing", lambda: True)
    keep = _workspaces()
    c = ws_ptr()
    assert _workspaces() == keep and c not in (a, b)
    monkeypatch.setattr(workspace, "capturing", lambda: False)
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7000)
    rep.workspace_bytes = held.numel() + 1  # a larger need: a new, larger buffer
    ws_ptr()
    assert workspace.streams[("cpu", 0x7000)].ws.numel() == held.numel() + 1
    monkeypatch.setattr(workspace, "WORKSPACE_KEEP_MAX", held.numel())  # past the bound: a call's own
    keep = _workspaces()
    d = ws_ptr()
    assert _workspaces() == keep and not (held.data_ptr() <= d < held.data_ptr() + held.numel())
    workspace.release_workspaces()
    assert workspace.streams == {}


def test_quantizer_buffer_is_the_streams_own_and_a_root_of_the_replay(fake_lib, stream, monkeypatch):
    """``sync_buffer`` (the Sage quantizer's workspace, never refilled: the kernel tags its slots):
    a stream's buffer is zeroed when made and handed to every later call, grown to the largest
    need; another stream and a CUDA-graph capture get their own (the stream's is untouched);
    after SAGE_SYNC_EPOCHS launches the stream gets a fresh zeroed one (tags repeat after 2**31).
    A recorded call's buffer becomes the replay's SYNC root, patched with the stream's buffer
    of the replayed call, not a workspace slot."""
    lib, raw, _ = fake_lib
    a = workspace.sync_buffer("cpu", 100)
    assert a.dtype == torch.int32 and a.numel() == 100 and not a.any()
    a.fill_(7)  # (a launch's slots and counter)
    assert workspace.sync_buffer("cpu", 50) is a  # no refill, no allocation
    b = workspace.sync_buffer("cpu", 200)  # grown: a new zeroed buffer
    assert b.numel() == 200 and not b.any()
    monkeypatch.setattr(workspace, "capturing", lambda: True)
    c = workspace.sync_buffer("cpu", 10)
    assert c is not b and not c.any() and workspace.streams[("cpu", 0x7000)].sync is b
    monkeypatch.setattr(workspace, "capturing", lambda: False)
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7100)
    assert workspace.sync_buffer("cpu", 10) is not b
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7000)
    monkeypatch.setattr(workspace, "SAGE_SYNC_EPOCHS", 3)
    b.fill_(7)
    assert workspace.sync_buffer("cpu", 10) is b and workspace.sync_buffer("cpu", 10) is b  # launches 2 and 3
    fresh = workspace.sync_buffer("cpu", 10)
    assert fresh is not b and fresh.numel() == 200 and not fresh.any()

    # recorded: the buffer is the SYNC root; the replay's workspace holds only the temporary
    q, k, idx = _inputs()
    rep, res, tmp = _record(lib, raw, q, k, idx, sync_words=300)
    assert rep.sync_words == 300 and rep.kernels == ["sq", "quant", "attn"]
    assert rep.workspace_bytes == -(-tmp.untyped_storage().nbytes() // replay.SLOT_ALIGN) * replay.SLOT_ALIGN
    monkeypatch.setattr(workspace, "current_stream", lambda device: 0x7200)  # a stream with no buffer yet
    q2, k2, idx2 = _inputs()
    _reset(raw)
    assert rep(q2, k2, k2, idx2, None, None) is not None
    held = workspace.streams[("cpu", 0x7200)].sync
    assert held.numel() == 300 and not held.any()
    assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[0][2][1][:8]).value == held.data_ptr()
    _reset(raw)
    rep(q2, k2, k2, idx2, None, None)
    assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[0][2][1][:8]).value == held.data_ptr()
    # replayed calls in the steady state count their launches too: the buffer is renewed (zeroed)
    # after SAGE_SYNC_EPOCHS of them (here 3: the two above and one more)
    held.fill_(7)
    _reset(raw)
    rep(q2, k2, k2, idx2, None, None)
    assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[0][2][1][:8]).value == held.data_ptr()
    _reset(raw)
    rep(q2, k2, k2, idx2, None, None)
    fresh = workspace.streams[("cpu", 0x7200)].sync
    assert fresh is not held and not fresh.any()
    assert ctypes.c_uint64.from_buffer_copy(_calls(raw)[0][2][1][:8]).value == fresh.data_ptr()
    workspace.release_workspaces()
    assert workspace.streams == {}


def test_misaligned_pointer_launches_nothing(fake_lib, stream):
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    rep, _, _ = _record(lib, raw, q, k, idx)
    big = torch.empty(2 * 100 * 3 * 3 * 128 + 8, dtype=torch.bfloat16)
    view = big[1:1 + 2 * 100 * 3 * 3 * 128].view(2, 100, 3, 3, 128)  # 2 bytes off a 16-byte boundary
    q3, k3 = view[:, :, 0], view[:, :, 1]
    assert q3.stride() == q.stride()
    _reset(raw)
    assert rep(q3, k3, k3, idx, None, None) is None
    assert _calls(raw) == []


def test_malformed_steps_and_device_switch(fake_lib, stream):
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    rep, _, _ = _record(lib, raw, q, k, idx)
    roots = replay._Roots(*([0] * replay.N_ROOTS))
    # a kernel index out of range in the second step: the first must not launch either
    rep._steps[1].kernel = 99
    _reset(raw)
    with pytest.raises(loader.LaunchError, match="kernel index 99 out of range"):
        lib.run_steps(rep._address, rep._n, 0, roots)
    assert _calls(raw) == []
    q1, k1, idx1 = _inputs()
    with pytest.raises(loader.LaunchError, match="kernel index 99 out of range"):  # through the replay
        rep(q1, k1, k1, idx1, None, None)
    assert _calls(raw) == []  # one run_steps call for both (no quantizer: nothing goes out early)
    _reset(raw)
    rep._steps[1].kernel = lib.kernel("attn").index
    # a patch outside its block, a root index outside the roots
    p = ctypes.cast(rep._steps[0].patches, ctypes.POINTER(replay._Patch))
    saved = p[0].offset, p[0].root
    for field, bad, msg in (("offset", 4096, "malformed patch"), ("root", 42, "malformed patch"),
                            ("offset", 4, "malformed patch")):
        setattr(p[0], field, bad)
        with pytest.raises(loader.LaunchError, match=msg):
            lib.run_steps(rep._address, rep._n, 0, roots)
        p[0].offset, p[0].root = saved
    assert _calls(raw) == []
    # device 1: both launches on device 1, the caller's device restored afterwards
    q2, k2, idx2 = _inputs()
    rep.device = 1
    _reset(raw)
    assert rep(q2, k2, k2, idx2, None, None) is not None
    assert [c[1] for c in _calls(raw)] == [1, 1]
    assert raw.stub_current_device() == 0
    with pytest.raises(loader.LaunchError, match="device 64 out of range"):
        lib.run_steps(rep._address, rep._n, 64, roots)


def test_run_steps_is_a_required_symbol(fake_lib):
    _, raw, exports = fake_lib
    assert hasattr(raw, SYMBOL_PREFIX + "run_steps")
    assert "run_steps" in generate(exports)
    json.dumps(exports)


def test_freed_and_reused_temporaries_share_a_slot():
    """Two temporaries at one address (the first freed before the second was allocated, as the
    caching allocator does inside one call) get one workspace slot of the larger size."""
    q, k, idx = _inputs()
    rec = replay.Recorder((q, k, k, idx, None, None))
    entry = type("E", (), {"name": "x", "args": KERNELS["quant"], "index": 0})
    blk = type("B", (), {"offsets": (0, 40, 80)})
    rec.lib, rec.device = object(), 0
    t1 = torch.empty(2, 100, 3, 128, dtype=torch.int8)
    rec.seen.append(replay._Seen(entry, blk.offsets, b"\0" * 88,
                                 [(0, q.data_ptr(), replay._base(q), 0, 16),
                                  (1, t1.data_ptr(), replay._base(t1), 1000, 16)], [2]))
    rec.seen.append(replay._Seen(entry, blk.offsets, b"\0" * 88,
                                 [(0, q.data_ptr(), replay._base(q), 0, 16),
                                  (1, t1.data_ptr() + 64, replay._base(t1), 5000, 16)], [2]))
    res = torch.empty(1)
    rep = rec.build(res)
    assert rep.workspace_bytes == 5120  # one slot: max(1000, 5000) rounded to 256
    p0 = ctypes.cast(rep._steps[0].patches, ctypes.POINTER(replay._Patch))
    p1 = ctypes.cast(rep._steps[1].patches, ctypes.POINTER(replay._Patch))
    assert (p0[0].root, p0[0].delta) == (replay.Q, 0)
    assert (p0[1].root, p0[1].delta, p1[1].delta) == (replay.WORKSPACE, 0, 64)
    assert (p0[2].root, p0[2].align) == (replay.STREAM, 0)


def test_signature_separates_pointer_patterns():
    """A recording resolves a pointer to the first input that has it; a call where k is v and one
    where it is not must have different signatures, and allocation sharing alone must not matter."""
    q, k, idx = _inputs()  # q and k: two views into one allocation
    a = replay.signature(q, k, k, idx, None, None, None, 64, None, "bf16", "BSHD")
    big = torch.empty(2, 100, 3, 3, 128, dtype=torch.bfloat16)
    b = replay.signature(big[:, :, 0], big[:, :, 1], big[:, :, 2], idx, None, None, None, 64, None, "bf16", "BSHD")
    assert a != b
    q2 = torch.empty(2, 100, 3, 3, 128, dtype=torch.bfloat16)[:, :, 0]  # q's strides, its own allocation
    assert replay.signature(q2, k, k, idx, None, None, None, 64, None, "bf16", "BSHD") == a
    assert replay.signature(q, k, k, idx, None, None, None, 128, None, "bf16", "BSHD") != a
    assert replay.signature(q, k, k, idx, None, None, 0.1, 64, None, "bf16", "BSHD") is None  # float topk
    assert replay.signature(q, k, k, idx, None, None, None, 64, torch.tensor(0.1), "bf16", "BSHD") is None
    assert replay.signature(q, k, k, idx.to(torch.int64), None, None, None, 64, None, "bf16", "BSHD") != a


def test_offset_view_into_shared_allocation_is_not_replayable():
    q, k, idx = _inputs()  # q and k share an allocation
    rec = replay.Recorder((q, k, k, idx, None, None))
    entry = type("E", (), {"name": "x", "args": KERNELS["quant"], "index": 0})
    rec.lib, rec.device = object(), 0
    inner = q[:, 1:]  # neither q's nor k's data pointer, in their allocation
    rec.seen.append(replay._Seen(entry, (0, 40, 80), b"\0" * 88,
                                 [(0, inner.data_ptr(), replay._base(inner), 0, 16)], [2]))
    with pytest.raises(replay._NotReplayable, match="share an allocation"):
        rec.build(torch.empty(1))


def test_zero_element_tensors_need_no_patch_and_no_workspace():
    """A launch argument with no elements (the quantizer's zero-row Q of a Q-fused call): torch
    gives it data_ptr() 0 whatever it views, and nothing can be read through it, so the recording
    patches nothing for it and reserves no workspace (it once reserved a slot the size of the
    viewed storage, all of q, for every replayed call)."""
    q, k, idx = _inputs()
    rec = replay.Recorder((q, k, k, idx, None, None))
    entry = type("E", (), {"name": "quant", "args": KERNELS["quant"], "index": 0})
    blk = type("B", (), {"offsets": (0, 40, 80)})
    rec.add(entry, blk, object(), 0, b"\0" * 88, {"q": q[:, :0], "tmp": torch.empty(2, 0, 3, 128, dtype=torch.int8)})
    assert q[:, :0].data_ptr() == 0 and q.untyped_storage().nbytes() > 0
    rep = rec.build(torch.empty(1))
    assert rep.workspace_bytes == 1  # (the minimum: no slot)
    assert rep._steps[0].npatch == 1  # the stream only
    p0 = ctypes.cast(rep._steps[0].patches, ctypes.POINTER(replay._Patch))
    assert p0[0].root == replay.STREAM


def test_signature_of_missing_tensors_is_none_and_release_is_public():
    """A call missing a required tensor is not keyed (the full path raises the clear error), and
    the workspaces can be freed through the package."""
    import subblock_sage

    q, k, idx = _inputs()
    for args in ((None, k, k, idx), (q, None, k, idx), (q, k, None, idx), (q, k, k, None)):
        assert replay.signature(*args, None, None, None, 64, None, "bf16", "BSHD") is None
    assert subblock_sage.release_workspaces is workspace.release_workspaces
    assert "release_workspaces" in subblock_sage.__all__


def test_benchmarks_before_path_launches_what_the_replay_launches(fake_lib, stream):
    """``benchmark/host_time.py``'s ``before_call`` (the replay with two ``torch.empty`` per call, the
    "before" side of call_gaps.py and call_timeline.py) must launch exactly what the replay
    launches, the quantizer buffer root included (a root short, the timeline stops on the GPU)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "sbs_host_time", Path(__file__).resolve().parents[2] / "benchmark" / "host_time.py")
    host_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_time)
    lib, raw, _ = fake_lib
    q, k, idx = _inputs()
    rep, res, _ = _record(lib, raw, q, k, idx, sync_words=300)
    out = torch.empty_like(res)
    _reset(raw)
    assert rep(q, k, k, idx, None, out) is out
    want = _calls(raw)
    _reset(raw)
    assert host_time.before_call(rep, replay.pointers(q, k, k, idx, None, out), out) is out
    got = _calls(raw)
    assert [c[0] for c in got] == [c[0] for c in want] == [lib.kernel(n).index for n in ("sq", "quant", "attn")]
    sync = ctypes.c_uint64.from_buffer_copy(got[0][2][1][:8]).value
    assert sync == ctypes.c_uint64.from_buffer_copy(want[0][2][1][:8]).value == workspace.streams[("cpu", 0x7000)].sync.data_ptr()
    # every argument agrees but the temporary (before_call allocates its own workspace)
    for (kern, dev, blocks), (_, dev_w, blocks_w) in zip(got, want):
        entry = next(e for e in (lib.kernel(n) for n in KERNELS) if e.index == kern)
        assert dev == dev_w
        for a, size, b, w in zip(entry.args, _arg_sizes(entry), blocks, blocks_w):
            if a["name"] != "tmp":
                assert b[:min(size, LOG_ARG)] == w[:min(size, LOG_ARG)], (entry.name, a["name"])


def test_result_extent_bytes():
    """``_extent_bytes``: the storage a strided result spans (what SPARE_RESULT_MAX bounds)."""
    assert replay._extent_bytes(((2, 3, 4, 128), (1536, 512, 128, 1), torch.bfloat16)) == 2 * 3 * 4 * 128 * 2
    assert replay._extent_bytes(((2, 3), (1, 2), torch.float32)) == 6 * 4  # transposed
    assert replay._extent_bytes(((2, 3), (8, 1), torch.int8)) == 8 + 3  # padded rows
    assert replay._extent_bytes(((0, 3), (3, 1), torch.float32)) == 0


def test_subblock_attention_records_and_replays_like_sparse_attention(fake_lib, stream, monkeypatch):
    """A plain eager ``subblock_attention`` call goes through the replay as ``sparse_attention``
    does (``calls.subblock``): the first call of a signature runs the full path while recording
    (the routed plan a temporary of the call), the next call of that signature launches the
    recorded steps with its own pointers and runs no Python of the full path; a call with
    another signature records anew."""
    import subblock_sage
    from subblock_sage import calls

    lib, raw, _ = fake_lib
    full = []

    def fake_full(q, k, v, *, out=None, **kw):  # the pipeline's launches, on the stub kernels
        full.append(kw)
        idx = torch.empty(q.shape[0], q.shape[2], 2, 5, dtype=torch.int32)  # the router's plan
        return _full_path(lib, q, k, idx, out)[0]

    monkeypatch.setattr(calls.pipeline, "subblock_full", fake_full)
    replay.clear()
    q, k, _ = _inputs()
    kw = dict(sparsity=0.5, compute_mode="sage_fp8", n_q=2)
    _reset(raw)
    first = subblock_sage.subblock_attention(q, k, k, **kw)
    assert len(full) == 1 and len(_calls(raw)) == 2
    assert full[0] == dict(kw, n_k=None, softmax_scale=None, layout="BSHD")
    key = replay.signature_subblock(q, k, k, None, 0.5, "sage_fp8", 2, None, None, "BSHD")
    rep = replay.lookup(key)
    assert isinstance(rep, replay.Replay) and rep.kernels == ["quant", "attn"]
    assert key != replay.signature(q, k, k, first, None, None, None, 64, None, "sage_fp8", "BSHD")
    rep.alloc_device = "cpu"  # (the stub's device 0 is no CUDA device here)
    for _ in range(2):  # the stream's first replay, then the steady state
        q2, k2, _ = _inputs()
        _reset(raw)
        res = subblock_sage.subblock_attention(q2, k2, k2, **kw)
        assert len(full) == 1, "a replayed call ran the full path"
        got = _calls(raw)
        assert [g[0] for g in got] == [lib.kernel("quant").index, lib.kernel("attn").index]
        assert ctypes.c_uint64.from_buffer_copy(got[1][2][0][:8]).value == q2.data_ptr()
        assert res.shape == q2.shape and res.data_ptr() != first.data_ptr()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    assert subblock_sage.subblock_attention(q, k, k, out=out, **kw) is out and len(full) == 2  # recorded anew
    replay.clear()
