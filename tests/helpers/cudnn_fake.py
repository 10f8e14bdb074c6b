"""Run cuDNN frontend's public block-sparse wrappers under a torch fake mode and record what they
would JIT-compile (tests/cpu/test_cudnn_sm90_aot.py runs this in a process of its own, with the
build env's DSL and a CPU torch, and compares the record with aot/kernels/cudnn_sm90.py).

No GPU and no compile: the wrapper runs as on an H100/H200 (capability 9.0, 132 SMs, 50 MiB L2);
``from_dlpack`` (which needs real memory) is replaced by a recorder of the tensor it gets, the
marking the wrapper asks for and the alignment it assumes; ``cute.compile`` by a recorder of the
class instance (its constructor arguments) and the arguments, which launches nothing. Our
launcher's views (benchmark/lab/cudnn_sm90.py) are built from the same fake tensors
and recorded next to them. Prints one line ``RESULT<json>``.

    python tests/helpers/cudnn_fake.py bf16 B Sq Sk H cap kv_splits
    python tests/helpers/cudnn_fake.py sage B S H cap count block_k
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]

import torch  # noqa: E402

SMS, L2 = 132, 50 * 2**20  # an H100 SXM / H200
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(multi_processor_count=SMS, L2_cache_size=L2)
torch.cuda.current_device = lambda: 0
torch.cuda.current_stream = lambda *a: types.SimpleNamespace(cuda_stream=0)
torch.cuda.device = lambda *a: contextlib.nullcontext()
torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()

from aot.upstream import cudnn_import  # noqa: E402

cudnn_import.install_stub_packages()
cudnn_import.check_files()
import cutlass.cute as cute  # noqa: E402

utils = cudnn_import.import_module("cudnn.block_sparse_attention.csrc.utils.cute_dsl_utils")
# teaches the DSL's TVM-FFI converter (needs apache-tvm-ffi, not in the build env); _interface
# runs it at import, and no SM90 path compiles with TVM-FFI
utils._install_constexpr_tvm_ffi_converter = lambda: None
api = cudnn_import.import_module("cudnn.block_sparse_attention.api")
iface = cudnn_import.import_module("cudnn.block_sparse_attention._interface")

record: dict = {"compiles": [], "ctors": []}


class Marked:
    """What from_dlpack(t, assumed_align=...).mark_layout_dynamic(...) would describe."""

    def __init__(self, t, assumed_align=None, **_):
        self.shape, self.stride = list(t.shape), list(t.stride())
        self.dtype = str(t.dtype).replace("torch.", "")
        self.align = assumed_align if assumed_align is not None else t.element_size()
        self.leading = None
        self.marked = False

    def mark_layout_dynamic(self, leading_dim=None):
        if leading_dim is None:  # the DSL's rule: the one stride-1 dimension
            ones = [i for i, s in enumerate(self.stride) if s == 1]
            leading_dim = ones[0] if len(ones) == 1 else None
        self.leading, self.marked = leading_dim, True
        return self

    def mark_compact_shape_dynamic(self, **kw):
        raise AssertionError("the SM90 paths mark no compact shapes")

    def describe(self):
        dtype = getattr(self, "element_type", None)
        return {"dtype": dtype.__name__ if dtype is not None else self.dtype, "align": self.align,
                "shape": self.shape, "stride": self.stride, "leading": self.leading, "marked": self.marked}


iface.from_dlpack = Marked
utils.from_dlpack = Marked


def fake_compile(fn, *args, **kw):
    seen = []
    for a in args:
        if isinstance(a, Marked):
            same = [i for i, b in enumerate(args) if b is a]
            seen.append({**a.describe(), "first": same[0]})
        elif type(a).__name__ in ("Int32", "Float32"):
            seen.append({"scalar": type(a).__name__, "value": a.value if hasattr(a, "value") else None})
        elif isinstance(a, (int, float)):
            seen.append({"scalar": type(a).__name__, "value": a})
        else:
            seen.append({"other": type(a).__name__})
    record["compiles"].append({"class": type(fn).__name__, "args": seen, "kwargs": sorted(kw)})
    return lambda *a, **k: None


cute.compile = fake_compile
for key in cudnn_import.CLASSES:
    cls = cudnn_import.load_class(key)
    real = cls.__init__

    def spy(self, *a, _real=real, _name=cls.__name__, **kw):
        record["ctors"].append({"class": _name, "args": [repr(x) for x in a],
                                "kwargs": {k: repr(v) for k, v in kw.items()}})
        return _real(self, *a, **kw)

    cls.__init__ = spy

from benchmark.lab.cudnn_sm90 import CudnnSM90, SageBuffers  # noqa: E402


def views(values: dict) -> dict:
    return {n: ({"shape": list(t.shape), "stride": list(t.stride())} if isinstance(t, torch.Tensor) else t)
            for n, t in values.items()}


from torch._subclasses import FakeTensorMode  # noqa: E402

what, *nums = sys.argv[1:]
with FakeTensorMode():
    if what == "bf16":
        B, Sq, Sk, H, cap = map(int, nums[:5])
        splits = nums[5]
        q = torch.empty(B, Sq, H, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(B, Sk, H, 128, dtype=torch.bfloat16, device="cuda")
        v = torch.empty_like(k)
        idx = torch.empty(B, H, Sq // 64, cap, dtype=torch.int32, device="cuda")
        cnt = torch.empty(B, H, Sq // 64, dtype=torch.int32, device="cuda")
        res = api.block_sparse_attention_forward(q, k, v, idx, q2k_block_nums=cnt, sparse_block_size=64,
                                                 allow_empty_block_nums=True, softmax_scale=0.125, layout="bshd",
                                                 kv_splits=splits if splits == "auto" else int(splits))
        record["out"] = {"shape": list(res["o_tensor"].shape), "stride": list(res["o_tensor"].stride())}
        out = torch.empty_like(q)
        lse = torch.empty(B, H, Sq, dtype=torch.float32, device="cuda")
        record["ours"] = [views(CudnnSM90.bf16_values(q, k, v, idx, cnt, out, lse, 0.125))]
    else:
        B, S, H, cap, count, bk = map(int, nums)
        q, k, v = (torch.empty(B, H, S, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        idx = torch.empty(B, H, S // bk, cap, dtype=torch.int32, device="cuda")
        res = api.block_sparse_attention_fp8_forward(q, k, v, idx, count, softmax_scale=0.125, sparse_block_size=bk)
        record["out"] = {"shape": list(res["o_tensor"].shape), "stride": list(res["o_tensor"].stride())}
        bufs = SageBuffers.like(q, k)
        record["ours"] = [views(CudnnSM90.quant_values(q, k, v, bufs)),
                          views(CudnnSM90.sage_values(bufs, idx, count, 0.125))]
print("RESULT" + json.dumps(record))
