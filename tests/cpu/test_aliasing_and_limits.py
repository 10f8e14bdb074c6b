"""Issue 20: aliased or self-overlapping `out`, scalars the kernels' float32 arithmetic cannot hold,
and grid limits are refused before any launch (metadata only: CPU tensors stand in for device ones,
the checks read only data pointers, shapes and strides)."""

from __future__ import annotations

import math

import pytest
import torch

from subblock_sage import validation
from subblock_sage.contract import MAX_GRID_YZ


def _qkv(B=1, S=256, H=2):
    qkv = torch.empty(B, S, 3, H, 128, dtype=torch.bfloat16)
    return qkv, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def test_out_equal_to_q_is_refused():
    _, q, k, v = _qkv()
    with pytest.raises(ValueError, match="out shares memory with q"):
        validation.check_out_aliasing(q, {"q": q, "k": k, "v": v})


def test_out_partly_overlapping_q_is_refused():
    base = torch.empty(1, 300, 2, 128, dtype=torch.bfloat16)
    q, out = base[:, :256], base[:, 44:]
    with pytest.raises(ValueError, match="out shares memory with q"):
        validation.check_out_aliasing(out, {"q": q})


def test_out_in_the_same_buffer_but_disjoint_rows_is_fine():
    """A fourth slot of a packed [B, S, 4, H, D] buffer interleaves with q/k/v byte ranges but
    shares no byte with them: the exact row test must accept it (a byte-range test would not)."""
    buf = torch.empty(1, 256, 4, 2, 128, dtype=torch.bfloat16)
    q, k, v, out = (buf[:, :, i] for i in range(4))
    validation.check_out_aliasing(out, {"q": q, "k": k, "v": v})


def test_out_sharing_a_row_with_v_in_a_packed_buffer_is_refused():
    buf = torch.empty(1, 256, 3, 2, 128, dtype=torch.bfloat16)
    q, k, v = (buf[:, :, i] for i in range(3))
    with pytest.raises(ValueError, match="out shares memory with v"):
        validation.check_out_aliasing(buf[:, :, 2], {"q": q, "k": k, "v": v})


def test_out_overlapping_the_plan_is_refused():
    raw = torch.empty(1 * 256 * 2 * 128 * 2, dtype=torch.uint8)
    out = raw.view(torch.bfloat16).view(1, 256, 2, 128)
    idx = raw[:64].view(torch.int32).view(1, 2, 2, 4)
    with pytest.raises(ValueError, match="out shares memory with q2k_block_index"):
        validation.check_out_aliasing(out, {"q2k_block_index": idx})


def test_separate_out_is_fine():
    _, q, k, v = _qkv()
    validation.check_out_aliasing(torch.empty_like(q), {"q": q, "k": k, "v": v})


@pytest.mark.parametrize("strides, ok", [
    ((256 * 128, 128, 128 * 256 // 2, 1), False),  # heads overlap rows of the sequence
    ((256 * 2 * 128, 2 * 128, 128, 1), True),       # contiguous BSHD
    ((256 * 264 + 64, 264, 128, 1), True),          # gaps between rows and batches: fine
    ((256 * 2 * 128 + 64, 2 * 128 + 8, 128, 1), False),  # batch 1 starts inside batch 0
    ((256 * 2 * 128, 128, 128, 1), False),          # H and S rows alias (S stride = H stride)
    ((2 * 128, 2 * 128, 128, 1), False),            # batches alias each other
])
def test_self_overlapping_out_is_refused(strides, ok):
    B, S, H = 2, 256, 2
    need = sum((n - 1) * st for n, st in zip((B, S, H, 128), strides)) + 1
    out = torch.empty(need, dtype=torch.bfloat16).as_strided((B, S, H, 128), strides)
    q = torch.empty(B, S, H, 128, dtype=torch.bfloat16)
    validation.check_out_shape(out, q)  # metadata checks pass: the overlap is a run-time check
    if ok:
        validation.check_out_aliasing(out, {"q": q})
    else:
        with pytest.raises(ValueError, match="rows that overlap each other"):
            validation.check_out_aliasing(out, {"q": q})


@pytest.mark.parametrize("scale", [1e39, 3e38, 1e-39, 1e-45])
def test_scale_outside_float32_is_refused(scale):
    with pytest.raises(ValueError, match="float32 arithmetic"):
        validation.check_scale(scale)


@pytest.mark.parametrize("scale", [1 / math.sqrt(128), 1.0, 1e30, 1e-30])
def test_representable_scales_pass(scale):
    assert validation.check_scale(scale) == scale


@pytest.mark.parametrize("B, H", [(MAX_GRID_YZ + 1, 1), (1, MAX_GRID_YZ + 1)])
def test_grid_limits(B, H):
    q = torch.empty(B, 8, H, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=f"must each be <= {MAX_GRID_YZ}"):
        validation.check_qkv_shapes(q, q, q, "BSHD")


def test_grid_limit_holds_at_the_limit():
    q = torch.empty(1, 8, MAX_GRID_YZ, 128, dtype=torch.bfloat16, device="meta")
    validation.check_qkv_shapes(q, q, q, "BSHD")
