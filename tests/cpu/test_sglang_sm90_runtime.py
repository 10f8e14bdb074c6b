"""The SGLang SM90 contender's runtime side without a GPU: load() without the test library, and
the plan sorting its kernel needs (benchmark/lab/sglang_sm90.py)."""

from __future__ import annotations

import os

import torch

from benchmark.lab import sglang_sm90, test_library


def test_load_without_the_test_library_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(test_library.ENV, raising=False)
    monkeypatch.delenv(test_library.ENV_LIB_DIR, raising=False)
    assert sglang_sm90.load() is None
    assert "unset" in sglang_sm90.load_failure and "\n" not in sglang_sm90.load_failure
    assert sglang_sm90.load(tmp_path) is None
    assert str(tmp_path) in sglang_sm90.load_failure and "SBS_TEST_LIBS=ON" in sglang_sm90.load_failure


def test_sorted_index_orders_only_the_active_prefix():
    idx = torch.tensor([[[[5, 1, 3, 9], [7, 2, 0, 4], [6, 8, 1, 0]]]], dtype=torch.int32)
    counts = torch.tensor([[[3, 0, 4]]], dtype=torch.int32)
    got = sglang_sm90.SGLangSM90(library=None).sorted_index(idx, counts)
    assert got.tolist() == [[[[1, 3, 5, 9], [7, 2, 0, 4], [0, 1, 6, 8]]]]
    assert got.dtype == torch.int32 and idx.tolist()[0][0][0] == [5, 1, 3, 9]


def test_test_library_packs_the_call(monkeypatch):
    """With the test library built (SBS_TEST_LIBS=ON; else skipped): load() finds it from the
    install prefix, and a ragged call packs into the C ABI (no launch: no GPU needed)."""
    import platform
    from pathlib import Path

    import pytest

    from subblock_sage import abi

    prefix = Path(__file__).resolve().parents[2] / "wheels" / "test-libs" / platform.machine()
    got = sglang_sm90.load(os.environ.get(test_library.ENV) or prefix)
    if got is None:
        pytest.skip(sglang_sm90.load_failure)
    q = torch.zeros(2, 333, 3, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 457, 3, 128, dtype=torch.bfloat16)
    idx = torch.zeros(2, 3, 6, 8, dtype=torch.int32)
    counts = torch.zeros(2, 3, 6, dtype=torch.int32)
    got._check(q, k, k, idx, counts, None)
    entry = got.library.kernel(sglang_sm90.KERNEL)
    abi.pack(entry, {"q": q, "k": k, "v": k, "out": q, "block_counts": counts,
                     "q2k_block_index": idx, "softmax_scale": 0.1}, 0)
    with pytest.raises(ValueError, match="capacity 9"):
        got._check(q, k, k, torch.zeros(2, 3, 6, 9, dtype=torch.int32), counts, None)
