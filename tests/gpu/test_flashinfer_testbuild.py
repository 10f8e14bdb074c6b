"""FlashInfer's SM120 Sage / bf16 classes, built for sm_90a into the test-only library, run on a
Hopper GPU through the same marshalling path the shipped sm_120a library uses (DESIGN fact 9).

Needs SUBBLOCK_SAGE_TEST_LIB_DIR = folder holding libsubblock_sage_test_sm90a.so (built with
SBS_TEST_LIBS=ON; never shipped). Skipped otherwise, and on non-sm_90 GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import subblock_sage
from subblock_sage.loader import Library
from subblock_sage.reference import reference_sparse_attention

LIB_DIR = os.environ.get("SUBBLOCK_SAGE_TEST_LIB_DIR")
pytestmark = pytest.mark.skipif(not LIB_DIR, reason="SUBBLOCK_SAGE_TEST_LIB_DIR not set")


@pytest.fixture(scope="module")
def testlib():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the test build is sm_90a")
    return Library(Path(LIB_DIR) / "libsubblock_sage_test_sm90a.so")


def _plan(B, H, Sq, Sk, bk, gen, dev):
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    cap = gk + 2
    idx = torch.randint(0, gk, (B, H, gq, cap), generator=gen)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                idx[b, h, i, :gk] = torch.randperm(gk, generator=gen)
    counts = torch.randint(0, gk + 1, (B, H, gq), generator=gen)
    counts[0, 0, 0] = 0  # empty row
    counts[-1, -1, -1] = gk  # dense row
    return idx.int().to(dev), counts.int().to(dev)


def _metrics(out, ref):
    o, r = out.double().flatten(), ref.double().flatten()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    rel_l1 = ((o - r).abs().sum() / r.abs().sum()).item()
    return cos, rel_l1


@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("bk", [64, 128])
def test_matches_reference(testlib, mode, layout, bk):
    from subblock_sage.backends.sm120 import BACKEND as SM120_BACKEND

    gen = torch.Generator().manual_seed(hash((mode, layout, bk)) % 2**31)
    dev = "cuda"
    B, H, Sq, Sk = 2, 3, 333, 457  # ragged: neither a multiple of 64 nor 128
    packed = torch.randn(B, max(Sq, Sk), 3, H, 128, generator=gen).to(torch.bfloat16).to(dev)
    q, k, v = packed[:, :Sq, 0], packed[:, :Sk, 1], packed[:, :Sk, 2]  # strided BSHD views
    k = k + 5.0 * torch.randn(1, 1, H, 128, generator=gen).to(torch.bfloat16).to(dev)
    if layout == "BHSD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    idx, counts = _plan(B, H, Sq, Sk, bk, gen, dev)
    out = torch.full_like(q, float("nan"))
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode=mode,
                                         layout=layout, out=out, library=testlib, backend=SM120_BACKEND)
    torch.cuda.synchronize()
    ref = reference_sparse_attention(q, k, v, idx, counts, block_size_k=bk, layout=layout)
    assert torch.isfinite(got.float()).all()
    cos, rel = _metrics(got, ref)
    empty = got[0, :64, 0] if layout == "BSHD" else got[0, 0, :64]
    assert (empty == 0).all(), "a row with zero blocks must be exact zeros"
    if mode == "sage_fp8":
        assert cos >= 0.999 and rel <= 0.05, (cos, rel)
    else:
        ref_bf16 = reference_sparse_attention(q, k, v, idx, counts, block_size_k=bk, layout=layout,
                                              dtype=torch.float32).to(torch.bfloat16)
        _, rel_ref = _metrics(ref_bf16, ref)
        assert rel <= 2 * rel_ref + 1e-3, (rel, rel_ref)
    print(f"{mode} {layout} bk={bk}: cosine {cos:.6f} rel L1 {rel:.4f}")


def test_out_of_range_indices_are_skipped(testlib):
    from subblock_sage.backends.sm120 import BACKEND as SM120_BACKEND

    gen = torch.Generator().manual_seed(3)
    B, H, Sq, Sk = 1, 2, 200, 300
    q, k, v = (torch.randn(B, S, H, 128, generator=gen).to(torch.bfloat16).cuda() for S in (Sq, Sk, Sk))
    gq, gk = 4, 5
    idx = torch.tensor([0, -1, 99, 2, 2, gk]).repeat(B, H, gq, 1).int().cuda()
    counts = torch.full((B, H, gq), 6, dtype=torch.int32).cuda()
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, compute_mode="bf16", library=testlib,
                                         backend=SM120_BACKEND)
    ref = reference_sparse_attention(q, k, v, idx, counts)
    cos, rel = _metrics(got, ref)
    assert rel < 0.02, rel
    with pytest.raises(ValueError, match="outside"):
        subblock_sage.sparse_attention(q, k, v, idx, counts, compute_mode="bf16", check_plan=True,
                                       library=testlib, backend=SM120_BACKEND)
