"""Run cuDNN frontend's public Sage FP8 wrapper as on a B200 (SM100) under a torch fake mode and
record what it would JIT-compile (tests/cpu/test_cudnn_sm100_aot.py runs this in a process of its
own, with the build env's DSL and a CPU torch, and compares the record with
aot/kernels/cudnn_sm100.py and with the C arguments the runtime builds, backends/sm100.py).

The recorders are tests/helpers/cudnn_fake.py's (``from_dlpack`` -> the tensor, its marking and
alignment; ``cute.compile`` -> the class instance's constructor and the arguments), with
capability 10.0 (148 SMs, 126 MiB L2). The SM100 blk64 path compiles with TVM-FFI
(``options="--enable-tvm-ffi"``), which our exports replace with the plain CuTe ABI: the marking
(dynamic extents, 64-bit strides, the unit-stride dimension, the assumed alignment) is the same.
Prints one line ``RESULT<json>``.

    python tests/helpers/cudnn_fake_sm100.py B S H cap count
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

SMS, L2 = 148, 126 * 2**20  # a B200
torch.cuda.get_device_capability = lambda *a: (10, 0)
torch.cuda.get_device_properties = lambda *a: types.SimpleNamespace(multi_processor_count=SMS, L2_cache_size=L2)
torch.cuda.current_device = lambda: 0
torch.cuda.current_stream = lambda *a: types.SimpleNamespace(cuda_stream=0)
torch.cuda.device = lambda *a: contextlib.nullcontext()
torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()
torch.cuda.mem_get_info = lambda *a: (1 << 40, 1 << 40)

from aot.upstream import cudnn_import  # noqa: E402

cudnn_import.install_stub_packages()
cudnn_import.check_files()
import cutlass.cute as cute  # noqa: E402

utils = cudnn_import.import_module("cudnn.block_sparse_attention.csrc.utils.cute_dsl_utils")
utils._install_constexpr_tvm_ffi_converter = lambda: None  # needs apache-tvm-ffi (not in the build env)
api = cudnn_import.import_module("cudnn.block_sparse_attention.api")
iface = cudnn_import.import_module("cudnn.block_sparse_attention._interface")

from tests.helpers import cudnn_fake_record as R  # noqa: E402

R.install(cute, iface, utils, cudnn_import)
from subblock_sage.backends import sm100  # noqa: E402
from torch._subclasses import FakeTensorMode  # noqa: E402

B, S, H, cap, count = map(int, sys.argv[1:])
with FakeTensorMode():
    q, k, v = (torch.empty(B, H, S, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    idx = torch.empty(B, H, S // 64, cap, dtype=torch.int32, device="cuda")
    res = api.block_sparse_attention_fp8_forward(q, k, v, idx, count, softmax_scale=0.125, sparse_block_size=64)
    R.record["out"] = {"shape": list(res["o_tensor"].shape), "stride": list(res["o_tensor"].stride())}
    bufs = sm100.cudnn_sage_buffers(B, H, S, S, q.device)
    out = torch.empty(B, S, H, 128, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3).contiguous()
    lse = torch.empty(B, H, S, dtype=torch.float32, device="cuda")
    R.record["ours"] = [R.views(sm100.cudnn_quant_values(q, k, v, bufs)),
                        R.views(sm100.cudnn_sage_values(bufs, idx, count, 0.125, out, lse))]
    R.record["short_tile_opt"] = sm100.sage_short_tile(cap, S)
print("RESULT" + json.dumps(R.record))
