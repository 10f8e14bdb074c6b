"""Issue 20 on the GPU: an aliased or self-overlapping `out`, and a softmax scale the kernels'
float32 arithmetic cannot hold, raise before anything runs: every input and `out` keep their
bytes (the quantizer and plan kernel used to run before the scale failed)."""

from __future__ import annotations

import pytest
import torch

import subblock_sage
from subblock_sage.contract import COMPUTE_MODES
from tests.helpers.served import need_mode


def _setup(mode):
    torch.manual_seed(0)
    S, H = 200, 2
    buf = torch.randn(1, S, 4, H, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = buf[:, :, 0], buf[:, :, 1], buf[:, :, 2]
    gq = gk = -(-S // 64)
    idx = torch.arange(gk, device="cuda", dtype=torch.int32).expand(1, H, gq, gk).contiguous()
    return buf, q, k, v, idx


def _nothing_enqueued(call, match, *tensors):
    before = [t.clone() for t in tensors]
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=match) as e:
        call()
    torch.cuda.synchronize()
    for a, b in zip(before, tensors):
        assert torch.equal(a, b), "a refused call changed memory"
    return str(e.value)


@pytest.mark.parametrize("mode", COMPUTE_MODES)
@pytest.mark.parametrize("case", ["out_is_q", "out_overlaps_v", "out_rows_overlap", "scale_1e39"])
def test_refused_before_any_launch(mode, case):
    need_mode(mode)
    buf, q, k, v, idx = _setup(mode)
    out, scale, match = None, None, "shares memory"
    if case == "out_is_q":
        out = q
    elif case == "out_overlaps_v":  # every row of out covers the second half of a row of v
        out = torch.as_strided(buf, q.shape, q.stride(), v.storage_offset() + 64)
    elif case == "out_rows_overlap":
        out = torch.empty(q.numel(), device="cuda", dtype=torch.bfloat16).as_strided(
            q.shape, (q.shape[1] * 128, 128, 128, 1))
        match = "rows that overlap each other"
    else:
        scale, match = 1e39, "float32 arithmetic"
    msg = _nothing_enqueued(
        lambda: subblock_sage.sparse_attention(q, k, v, idx, None, topk=idx.shape[-1], compute_mode=mode,
                                               out=out, softmax_scale=scale),
        match, buf, idx)
    assert "Fix:" in msg, msg


@pytest.mark.parametrize("mode", COMPUTE_MODES)
def test_fourth_slot_of_a_packed_buffer_is_a_valid_out(mode):
    need_mode(mode)
    buf, q, k, v, idx = _setup(mode)
    out = buf[:, :, 3]
    ref = subblock_sage.sparse_attention(q, k, v, idx, None, topk=idx.shape[-1], compute_mode=mode)
    got = subblock_sage.sparse_attention(q, k, v, idx, None, topk=idx.shape[-1], compute_mode=mode, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref)
