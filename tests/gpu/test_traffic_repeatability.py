"""Traffic repeatability (issue 23): every shipped attention kernel and mode gives bit-identical
output with and without concurrent memory traffic (a side stream copying 64 MiB buffers), on the
current GPU and for the sm_90a test build of FlashInfer's SM120 classes (the patched classes with
the K/V release fence, see aot/upstream/PATCHES.md).

Shape after upstream's regression test: S=37807, one head, every block. 20 rounds of 100 copies.
The test build needs SUBBLOCK_SAGE_TEST_LIB_DIR = folder of libsubblock_sage_test_sm90a.so (built
with SBS_TEST_LIBS=ON into wheels/test-libs/); those tests skip without it or off sm_90.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

from subblock_sage import loader  # noqa: E402
from subblock_sage.diagnostics import traffic as selftest_traffic  # noqa: E402

ROUNDS, COPIES = int(os.environ.get("SBS_TRAFFIC_ROUNDS", "20")), 100
LIB_DIR = os.environ.get("SUBBLOCK_SAGE_TEST_LIB_DIR")


def _shipped():
    from subblock_sage.backends import backend_for

    dev = torch.cuda.current_device()
    lib = loader.library_for_device(dev)
    try:
        be = backend_for(lib.target)
    except loader.UnsupportedGPUError as e:
        pytest.skip(str(e))
    return dev, lib, be


@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
def test_shipped_kernels_are_repeatable_under_traffic(mode):
    dev, lib, be = _shipped()
    if mode not in be.modes(lib):
        pytest.skip(f"{mode} is not shipped for {lib.target}")
    diffs = selftest_traffic.repeatability(dev, [mode], rounds=ROUNDS, copies=COPIES)
    assert diffs == {mode: 0}, f"{lib.target} {mode}: output bits changed under traffic: {diffs}"


@pytest.mark.skipif(not LIB_DIR, reason="SUBBLOCK_SAGE_TEST_LIB_DIR not set (needs SBS_TEST_LIBS=ON)")
@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
def test_sm120_classes_test_build_are_repeatable_under_traffic(mode):
    from subblock_sage.backends.sm120 import BACKEND as SM120_BACKEND

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the test build is sm_90a")
    lib = loader.Library(Path(LIB_DIR) / "libsubblock_sage_test_sm90a.so")
    diffs = selftest_traffic.repeatability(torch.cuda.current_device(), [mode], rounds=ROUNDS,
                                           copies=COPIES, library=lib, backend=SM120_BACKEND)
    assert diffs == {mode: 0}, f"SM120 classes (sm_90a test build) {mode}: {diffs}"


def test_the_check_detects_a_changing_output(monkeypatch):
    """The comparison can fail: an 'attention' whose output changes between calls is reported."""
    from subblock_sage.ops import attention

    real = attention.sparse_attention
    n = [0]

    def flaky(*a, **kw):
        out = real(*a, **kw)
        n[0] += 1
        if n[0] == 3:  # the second round
            out.view(-1)[:5] += 1
        return out

    dev, lib, be = _shipped()
    monkeypatch.setattr(attention, "sparse_attention", flaky)
    mode = be.modes(lib)[0]
    diffs = selftest_traffic.repeatability(dev, [mode], rounds=3, copies=2, seqlen=4096)
    assert diffs[mode] > 0


def test_check_runs_the_traffic_self_test():
    from subblock_sage import check

    dev = torch.cuda.current_device()
    r = check(devices=[dev], traffic=True)
    res = r.gpu(dev).self_tests.get("traffic", "")
    assert res.startswith("ok: ") and "bit-identical" in res, (res, r.all_problems)
