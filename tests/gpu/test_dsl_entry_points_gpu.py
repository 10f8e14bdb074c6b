"""The CUDA entry points of aot/toolchain/dsl_entry_points.c on a real GPU (issue 17: they replace
nvidia-cutlass-dsl's libcuda_dialect_runtime_static.a in every library).

- preload on every visible device runs each kernel's init + load_to_device: _cudaLibraryLoadData,
  _cudaDeviceGetAttribute (max opt-in shared memory), _cudaLibraryGetKernel, _cuKernelGetAttribute
  (the driver entry point resolved through cudart) and _cudaKernelSetAttributeForDevice; every
  kernel of the served library must load (rc 0, no error text);
- a call of each compute mode the device serves (bf16 and, where shipped, sage_fp8: the kernels
  with the largest dynamic shared memory) launches through _cudaLaunchKernelEx and matches the
  float64 reference;
- the error path still names the failing call: a launch with a wrong argument count fails with
  cudaErrorInvalidValue before reaching the GPU.
The whole GPU suite (tests/gpu) exercises the same entry points under graphs, threads and streams.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage import loader  # noqa: E402
from subblock_sage.errors import SubblockSageError  # noqa: E402
from subblock_sage.reference import reference_sparse_attention  # noqa: E402
from tests.helpers.gpu import compare, qkv, random_plan  # noqa: E402
from tests.helpers.served import need_mode  # noqa: E402


def test_preload_every_device_loads_every_kernel():
    for dev in range(torch.cuda.device_count()):
        try:
            lib = loader.library_for_device(dev)
        except SubblockSageError as e:  # a GPU this build does not serve
            pytest.skip(f"device {dev}: {e}")
        rc = lib._lib.subblock_sage_v1_preload(dev)
        assert rc == 0, (dev, rc, lib.last_error())


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_launch_matches_reference(mode):
    need_mode(mode)
    q, k, v = qkv(1, 1000, 1500, 2, "cuda", seed=17)
    idx, cnt = random_plan(1, 2, 1000, 1500, 8, "cuda", seed=17)
    got = subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode)
    compare(got, reference_sparse_attention(q, k, v, idx, cnt), mode)


def test_bad_launch_reports_invalid_value():
    dev = torch.cuda.current_device()
    try:
        lib = loader.library_for_device(dev)
    except SubblockSageError as e:
        pytest.skip(str(e))
    rc = lib._lib.subblock_sage_v1_launch(0, dev, None, 1000)
    assert rc == 1, rc
    assert "arguments" in lib.last_error(), lib.last_error()
