"""cuDNN frontend 1.32.0's SM90 block-sparse kernels (bench contenders, test library only) against
the float64 reference and against ours, on H100/H200: the bf16 64-key kernel on per-row-count
plans (empty rows included), the Sage FP8 path (cuDNN's quantizer + its 64- and 128-key kernels)
on fixed-count plans.

Needs the test library (SBS_TEST_LIBS=ON ./wheels/build.sh; SUBBLOCK_SAGE_TEST_LIBS or
SUBBLOCK_SAGE_TEST_LIB_DIR pointing at it) and an sm_90 GPU; skipped otherwise.
"""

from __future__ import annotations

import pytest
import torch

import subblock_sage
from subblock_sage.reference import reference_sparse_attention

from benchmark.lab import contenders as ctd
from benchmark.lab import cudnn_sm90
from tests.helpers.gpu import contender_from_test_library

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def contender():
    return contender_from_test_library(cudnn_sm90)


def _inputs(B, H, S, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, 128, generator=gen).to(torch.bfloat16).cuda() for _ in range(3))
    k = k + 3.0 * torch.randn(1, 1, H, 128, generator=gen).to(torch.bfloat16).cuda()  # peaked rows
    return q, k, v, gen


def _plan(B, H, gq, gk, cap, gen, fixed=None):
    """Distinct key blocks per row in random order; per-row counts 0..cap (one empty, one full
    row) or one ``fixed`` count."""
    idx = torch.stack([torch.randperm(gk, generator=gen)[:cap] for _ in range(B * H * gq)]).view(B, H, gq, cap)
    if fixed is not None:
        counts = torch.full((B, H, gq), fixed)
    else:
        counts = torch.randint(0, cap + 1, (B, H, gq), generator=gen)
        counts[0, 0, 0] = 0
        counts[-1, -1, -1] = cap
    return idx.int().cuda().contiguous(), counts.int().cuda()


@pytest.mark.parametrize("B,H,S,cap", [(2, 3, 1024, 4), (1, 2, 2048, 8), (1, 2, 1024, 16)],
                         ids=["random", "compact", "dense"])
def test_bf16_matches_reference_and_ours(contender, B, H, S, cap):
    q, k, v, gen = _inputs(B, H, S, seed=S + cap)
    idx, counts = _plan(B, H, S // 64, S // 64, cap, gen)
    scale = 128 ** -0.5
    out = torch.full_like(q, float("nan"))
    got = contender.run_bf16(q, k, v, idx, counts, scale, out=out)
    torch.cuda.synchronize()
    assert got is out and torch.isfinite(got.float()).all()
    ref = reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale)
    floor = ctd.rel_l1(reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale,
                                                  dtype=torch.float32).to(torch.bfloat16), ref)
    rel = ctd.rel_l1(got, ref)
    assert rel <= 2 * floor + 1e-3, (rel, floor)
    for b, h, i in (counts == 0).nonzero().tolist()[:4]:
        assert (got[b, i * 64:(i + 1) * 64, h] == 0).all(), "a row with zero blocks writes zeros"
    ours = subblock_sage.sparse_attention(q, k, v, idx, counts, softmax_scale=scale, compute_mode="bf16")
    print(f"cuDNN bf16 rel L1 {rel:.2e}, ours {ctd.rel_l1(ours, ref):.2e}, bf16 floor {floor:.2e}")


@pytest.mark.parametrize("block_k", [64, 128])
@pytest.mark.parametrize("B,H,S,count", [(1, 2, 1024, 2), (2, 3, 2048, 4)], ids=["small", "b2"])
def test_sage_matches_reference(contender, block_k, B, H, S, count):
    q, k, v, gen = _inputs(B, H, S, seed=S + block_k + count)
    g = S // block_k
    idx, _ = _plan(B, H, g, g, g, gen, fixed=count)
    scale = 128 ** -0.5
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    got = contender.run_sage(qh, kh, vh, idx, count, scale, block_k).transpose(1, 2)
    torch.cuda.synchronize()
    assert torch.isfinite(got.float()).all()
    ref = (ctd._reference_128(q, k, v, idx, count, scale) if block_k == 128 else
           reference_sparse_attention(q, k, v, idx, torch.full(idx.shape[:3], count, dtype=torch.int32,
                                                                  device=q.device), softmax_scale=scale))
    rel = ctd.rel_l1(got, ref)
    bar, ours = ctd.sage_check_bar(q, k, v, idx, count, scale, block_k, ref)
    assert rel <= bar, (rel, bar, ours)
    print(f"cuDNN Sage bk{block_k} rel L1 {rel:.2e}, ours {ours:.2e}, bar {bar:.2e}")


def test_bench_check_passes(contender):
    """The bench's own gate (contenders.check_cudnn_sm90) accepts the kernels."""
    errors = ctd.check_cudnn_sm90(contender)
    assert set(errors) == {ctd.CUDNN_BSA_BF16, f"{ctd.CUDNN_BSA_SAGE} bk64", f"{ctd.CUDNN_BSA_SAGE} bk128"}
    print(errors)
