"""The SGLang SM90 contender's runtime side without a GPU: load() without the test library, and
the plan sorting its kernel needs (python/subblock_sage/tools/sglang_sm90.py)."""

from __future__ import annotations

import torch

from subblock_sage.tools import sglang_sm90


def test_load_without_the_test_library_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(sglang_sm90.ENV, raising=False)
    monkeypatch.delenv(sglang_sm90.ENV_LIB_DIR, raising=False)
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
