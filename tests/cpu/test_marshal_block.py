"""marshal.pack writes every argument into one struct.Struct block; each argument's bytes must be
exactly the C struct the exported wrapper reads (the ctypes reference layout of _pack_tensor)."""

import ctypes
import types

import pytest

torch = pytest.importorskip("torch")

from subblock_sage import marshal  # noqa: E402


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
    argv, keep = marshal.pack(entry, vals, 0xABCDEF)
    for k, a in enumerate(ARGS):
        if a["kind"] == "tensor":
            ref = marshal._pack_tensor("k", a, vals[a["name"]], {})
            want = bytes(ref)
        elif a["kind"] == "scalar":
            want = bytes(marshal._CTYPES[a["dtype"]](vals[a["name"]]))
        else:
            want = bytes(ctypes.c_void_p(0xABCDEF))
        got = ctypes.string_at(argv[k], len(want))
        assert got == want, a["name"]


def test_scalar_out_of_range_is_a_clear_error():
    entry = types.SimpleNamespace(name="k", variant="v2", args=[ARGS[6], ARGS[7]])
    with pytest.raises(ValueError, match="does not fit its C type"):
        marshal.pack(entry, {"n": 2**31}, 0)


def test_fast_path_refusal_gives_the_precise_error():
    entry = types.SimpleNamespace(name="k", variant="v3", args=[ARGS[0], ARGS[7]])
    bad = torch.empty(1, 10, 2, 128, dtype=torch.bfloat16)[..., :64]  # head dim 64, not 128
    with pytest.raises(ValueError, match="mode 3 must have size 128"):
        marshal.pack(entry, {"x": bad}, 0)
