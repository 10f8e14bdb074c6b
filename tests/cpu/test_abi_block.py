"""abi.pack writes every argument into one struct.Struct block; each argument's bytes must be
exactly the C struct the exported wrapper reads (the ctypes reference layout of _pack_tensor)."""

import ctypes
import types

import pytest

torch = pytest.importorskip("torch")

from subblock_sage import abi  # noqa: E402


def _t(name, dtype, shape, stride, shape_ct="int32_t", stride_ct="int64_t", align=16):
    return {"kind": "tensor", "name": name, "dtype": dtype, "shape": shape, "stride": stride,
            "shape_ctype": shape_ct, "stride_ctype": stride_ct, "align": align}


def sym(key, div=1):
    return {"sym": key, "div": div}


ARGS = [
    _t("x", "bfloat16", [sym("B"), sym("S"), sym("H"), 128], [sym("x.sb", 8), sym("x.ss", 8), sym("x.sh", 8), 1]),
    _t("i", "int32", [sym("B"), sym("H"), sym("G"), sym("C")], [sym("i.sb"), sym("i.sh"), sym("i.sg"), 1], align=4),
    _t("s", "int32", [4], [1], align=4),  # fully static: data pointer only
    _t("c", "int32", [sym("B"), sym("H"), sym("G")], [sym("c.sb"), sym("c.sh"), 1], align=4),
    _t("w", "float32", [sym("B"), sym("H"), 128], [sym("w.sb", 4), sym("w.sh", 4), 1], "int64_t", "int32_t"),
    {"kind": "scalar", "name": "a", "dtype": "float32"},
    {"kind": "scalar", "name": "n", "dtype": "int32"},
    {"kind": "stream", "name": "stream"},
]


def test_block_bytes_match_ctypes_structs():
    entry = types.SimpleNamespace(name="k", variant="v", args=ARGS)
    B, S, H, G, C = 2, 300, 3, 5, 7
    vals = {
        "x": torch.empty(B, H, S, 128, dtype=torch.bfloat16).permute(0, 2, 1, 3),
        "i": torch.empty(B, H, G, C, dtype=torch.int32),
        "s": torch.empty(4, dtype=torch.int32),
        "c": torch.empty(B, H, G, dtype=torch.int32),
        "w": torch.empty(B, H, 128),
        "a": 0.125, "n": -7,
    }
    argv, keep = abi.pack(entry, vals, 0xABCDEF)
    for k, a in enumerate(ARGS):
        if a["kind"] == "tensor":
            ref = abi._pack_tensor("k", a, vals[a["name"]], {})
            want = bytes(ref)
        elif a["kind"] == "scalar":
            want = bytes(abi._CTYPES[a["dtype"]](vals[a["name"]]))
        else:
            want = bytes(ctypes.c_void_p(0xABCDEF))
        got = ctypes.string_at(argv[k], len(want))
        assert got == want, a["name"]


def test_scalar_out_of_range_is_a_clear_error():
    entry = types.SimpleNamespace(name="k", variant="v2", args=[ARGS[6], ARGS[7]])
    with pytest.raises(ValueError, match="does not fit its C type"):
        abi.pack(entry, {"n": 2**31}, 0)


def test_fast_path_refusal_gives_the_precise_error():
    entry = types.SimpleNamespace(name="k", variant="v3", args=[ARGS[0], ARGS[7]])
    bad = torch.empty(1, 10, 2, 128, dtype=torch.bfloat16)[..., :64]  # head dim 64, not 128
    with pytest.raises(ValueError, match="mode 3 must have size 128"):
        abi.pack(entry, {"x": bad}, 0)


# The generated fast path and the generic per-argument checks must agree on every input: the same
# flat values when both accept, and the fast path must never accept what the generic path refuses.
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_DTYPES = [torch.bfloat16, torch.int32, torch.float32, torch.int8]


@st.composite
def _values(draw):
    """A valid argument set, or one with a single fault in one argument (half of the draws)."""
    B, S, H, G, C = (draw(st.integers(1, 4)) for _ in range(5))
    fault = draw(st.sampled_from(["none"] * 8 + ["size", "dtype", "misalign", "transpose", "rank",
                                                 "missing", "extra", "slice"]))
    victim = draw(st.sampled_from(["x", "i", "s", "c", "w"]))

    def tensor(name, shape, dtype, perm=None):
        bad = fault if name == victim else "none"
        if bad == "size":
            m = draw(st.integers(0, len(shape) - 1))
            shape = [x + 1 if j == m else x for j, x in enumerate(shape)]
        if bad == "dtype":
            dtype = draw(st.sampled_from([d for d in _DTYPES if d != dtype]))
        n = 1
        for x in shape:
            n *= x
        off = 1 if bad == "misalign" else 0
        t = torch.empty(n + off, dtype=dtype)[off:].view(shape)
        if perm:
            t = t.permute(*perm)
        if bad == "transpose" and t.dim() > 1:
            t = t.transpose(0, 1)
        if bad == "slice":  # a view whose strides are not multiples of the required divisor
            t = torch.empty(*t.shape[:-1], t.shape[-1] + 1, dtype=dtype)[..., 1:]
        if bad == "rank":
            t = t.unsqueeze(0)
        return t

    vals = {
        "x": tensor("x", [B, H, S, 128], torch.bfloat16, (0, 2, 1, 3)) if draw(st.booleans())
        else tensor("x", [B, S, H, 128], torch.bfloat16),
        "i": tensor("i", [B, H, G, C], torch.int32),
        "s": tensor("s", [4], torch.int32),
        "c": tensor("c", [B, H, G], torch.int32),
        "w": tensor("w", [B, H, 128], torch.float32),
        "a": draw(st.floats(-1, 1)), "n": draw(st.integers(-5, 5)),
    }
    if fault == "missing":
        vals.pop(victim)
    if fault == "extra":
        vals["extra"] = 1
    return vals


@settings(max_examples=300, deadline=None)
@given(_values())
def test_fast_path_agrees_with_the_generic_checks(vals):
    entry = types.SimpleNamespace(name="k", variant="hyp", args=ARGS)
    blk = abi._block_for(entry)
    try:
        want = list(abi._flat_checked(entry, blk, vals, 7))
    except (TypeError, ValueError) as e:
        want = e
    try:
        got = list(blk.fast(vals, 7))
    except (abi._Slow, KeyError, AttributeError, TypeError, IndexError):
        got = None
    if isinstance(want, Exception):
        assert got is None, f"fast path accepted what the generic path refuses: {want}"
    else:
        assert got is not None, "fast path refused a valid argument set"
        assert got == want


def test_launch_buffer_is_reused_per_thread():
    import threading

    entry = types.SimpleNamespace(name="k", variant="tls", args=[ARGS[6], ARGS[7]])
    blk = abi._block_for(entry)
    assert blk.thread_buffer() is blk.thread_buffer()
    other = []
    th = threading.Thread(target=lambda: other.append(blk.thread_buffer()))
    th.start()
    th.join()
    assert other[0] is not blk.thread_buffer()


def test_prepare_packs_now_and_launches_later(monkeypatch):
    """abi.prepare: checks and packs at once (bad input raises there, before anything is
    launched), launches only when called, with the same bytes launch() would pass, from its own
    block (a launch of the same entry in between does not change it)."""
    entry = types.SimpleNamespace(name="k", variant="prep", args=[ARGS[4], ARGS[6], ARGS[7]])
    calls = []

    class Lib:
        def kernel(self, kernel, **params):
            return entry

        def launch_raw(self, e, device, argv):
            calls.append([ctypes.string_at(argv[k], 8) for k in range(len(argv))])

    monkeypatch.setattr(abi, "_current_stream", lambda index: 0x1234)
    w = torch.empty(2, 3, 128)
    go = abi.prepare("k", {}, {"w": w, "n": 5}, device=0, library=Lib())
    assert calls == []
    abi.launch("k", {}, {"w": w, "n": 6}, device=0, library=Lib())  # same entry in between
    go()
    assert len(calls) == 2
    assert calls[1][0] == ctypes.c_uint64(w.data_ptr()).value.to_bytes(8, "little")
    assert calls[1][1][:4] == (5).to_bytes(4, "little") and calls[0][1][:4] == (6).to_bytes(4, "little")
    assert calls[1][2] == (0x1234).to_bytes(8, "little")
    with pytest.raises(ValueError, match="does not fit"):
        abi.prepare("k", {}, {"w": w, "n": 2**40}, device=0, library=Lib())
    assert len(calls) == 2
