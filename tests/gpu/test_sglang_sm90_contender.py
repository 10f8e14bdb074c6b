"""SGLang 0.5.23's own SM90 bf16 SubBlock kernel (the bench contender, test library only) against
the float64 reference and against our bf16 kernel, on H100/H200.

Needs the test library (SBS_TEST_LIBS=ON ./wheels/build.sh; SUBBLOCK_SAGE_TEST_LIBS or
SUBBLOCK_SAGE_TEST_LIB_DIR pointing at it) and an sm_90 GPU; skipped otherwise.
"""

from __future__ import annotations

import pytest
import torch

import subblock_sage
from subblock_sage.reference import reference_sparse_attention

from benchmark.lab import sglang_sm90
from tests.helpers.gpu import contender_from_test_library

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def contender():
    return contender_from_test_library(sglang_sm90)


def _inputs(B, H, Sq, Sk, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, 128, generator=gen).to(torch.bfloat16).cuda() for S in (Sq, Sk, Sk))
    k = k + 3.0 * torch.randn(1, 1, H, 128, generator=gen).to(torch.bfloat16).cuda()  # peaked rows
    return q, k, v, gen


def _random_plan(B, H, Sq, Sk, cap, gen):
    """Distinct key blocks per row in random (unsorted) order; counts 0..cap, one empty and one
    full row; the partial last key block (ragged Sk) appears in many rows."""
    gq, gk = -(-Sq // 64), -(-Sk // 64)
    idx = torch.stack([torch.randperm(gk, generator=gen)[:cap] for _ in range(B * H * gq)])
    idx = idx.view(B, H, gq, cap).int()
    counts = torch.randint(0, cap + 1, (B, H, gq), generator=gen).int()
    counts[0, 0, 0] = 0
    counts[-1, -1, -1] = cap
    return idx.cuda(), counts.cuda()


def _dense_plan(B, H, Sq, Sk):
    gq, gk = -(-Sq // 64), -(-Sk // 64)
    idx = torch.arange(gk, dtype=torch.int32).expand(B, H, gq, gk).contiguous()
    return idx.cuda(), torch.full((B, H, gq), gk, dtype=torch.int32).cuda()


def _rel_l1(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return ((a - b).abs().sum() / b.abs().sum().clamp_min(1e-30)).item()


PLANS = {
    # name: (B, H, Sq, Sk, plan kind, capacity or None)
    "random-0.25": (2, 3, 1024, 1024, "random", 4),
    "random-compact": (1, 2, 2048, 2048, "random", 8),  # capacity 8 < ceil(Sk/64) = 32
    "dense": (1, 2, 1024, 1024, "dense", None),
    "ragged": (2, 3, 333, 457, "random", 8),  # neither length a multiple of 64
    "ragged-dense": (1, 2, 1000, 777, "dense", None),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_matches_reference_and_ours(contender, name):
    B, H, Sq, Sk, kind, cap = PLANS[name]
    q, k, v, gen = _inputs(B, H, Sq, Sk, seed=len(name) * 7919 + Sq)
    idx, counts = _dense_plan(B, H, Sq, Sk) if kind == "dense" else _random_plan(B, H, Sq, Sk, cap, gen)
    scale = 128 ** -0.5
    out = torch.full_like(q, float("nan"))
    got = contender.run(q, k, v, idx, counts, scale, out=out)
    torch.cuda.synchronize()
    assert got is out and torch.isfinite(got.float()).all()
    ref = reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale)
    ref_bf16 = reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale,
                                          dtype=torch.float32).to(torch.bfloat16)
    floor = _rel_l1(ref_bf16, ref)  # bf16 rounding of the output alone
    rel = _rel_l1(got, ref)
    assert rel <= 2 * floor + 1e-3, (rel, floor)
    empty = (counts == 0).nonzero()
    for b, h, i in empty.tolist()[:4]:
        assert (got[b, i * 64:(i + 1) * 64, h] == 0).all(), "a row with zero blocks writes zeros"
    ours = subblock_sage.sparse_attention(q, k, v, idx, counts, softmax_scale=scale, compute_mode="bf16")
    rel_ours = _rel_l1(ours, ref)
    assert _rel_l1(got, ours) <= rel + rel_ours + 1e-3
    print(f"{name}: SGLang rel L1 {rel:.2e}, ours {rel_ours:.2e}, bf16 floor {floor:.2e}")


def test_plan_is_sorted_once_and_unchanged(contender):
    """run() sorts each active prefix (the kernel needs ascending lists) into a kept copy: the
    caller's index is untouched, the same plan is sorted once, an in-place edit re-sorts."""
    B, H, Sq, Sk = 1, 1, 256, 512
    q, k, v, gen = _inputs(B, H, Sq, Sk, seed=5)
    idx, counts = _random_plan(B, H, Sq, Sk, 8, gen)
    before = idx.clone()
    contender.run(q, k, v, idx, counts, 0.1)
    first = contender.sorted_index(idx, counts)
    assert torch.equal(idx, before)
    assert contender.sorted_index(idx, counts) is first
    idx[0, 0, 0, 0] = idx[0, 0, 0, 0]  # bumps the version counter
    assert contender.sorted_index(idx, counts) is not first


def test_rejects_what_the_kernel_cannot_take(contender):
    q, k, v, gen = _inputs(1, 2, 128, 256, seed=9)
    idx, counts = _random_plan(1, 2, 128, 256, 4, gen)
    with pytest.raises(ValueError, match="Fix:"):
        contender.run(q, k[:, :, :1], v[:, :, :1], idx, counts, 0.1)  # GQA
    wide = torch.zeros(1, 2, 2, 5, dtype=torch.int32, device="cuda")  # capacity 5 > 4 key blocks
    with pytest.raises(ValueError, match="capacity"):
        contender.run(q, k, v, wide, counts, 0.1)
    with pytest.raises(ValueError, match="bf16"):
        contender.run(q.float(), k, v, idx, counts, 0.1)
