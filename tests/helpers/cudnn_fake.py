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

from tests.helpers import cudnn_fake_record as R  # noqa: E402

R.install(cute, iface, utils, cudnn_import)
record, views = R.record, R.views

from benchmark.lab.cudnn_sm90 import CudnnSM90, SageBuffers  # noqa: E402


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
