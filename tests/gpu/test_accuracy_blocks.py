"""Accuracy of every 64-row query block, head and channel on the GPU (any served target), and the
mutation check on real kernel output (issue 21).

* every compute mode the manifest says this GPU serves, ragged shapes, both layouts, 64- and
  128-key plans: bounded per block / head / channel against float64 attention, and Sage also
  against exact attention on its own dequantized operands (``quantize_sage``'s outputs);
* mutation check: real kernel output with the faults a broken build makes (a wrong V token
  permutation, one wrong 64-row query block, swapped heads, wrong scales) must be rejected by the
  same comparison (the CPU twin with synthetic tensors: tests/cpu/test_mutation.py).

Public API only (``sparse_attention``, ``quantize_sage``, ``reference``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage.reference import SAGE_PERM16, reference_sparse_attention  # noqa: E402

from tests.helpers import accuracy as acc  # noqa: E402
from tests.helpers.served import MODES, need_mode  # noqa: E402


def _inputs(B, Sq, Sk, H, layout, seed, bias=2.0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda S: (B, S, H, 128)) if layout == "BSHD" else (lambda S: (B, H, S, 128))
    q = torch.randn(shape(Sq), generator=g)
    k = torch.randn(shape(Sk), generator=g) + bias * torch.randn(128, generator=g)
    v = torch.randn(shape(Sk), generator=g)
    return tuple(x.to(torch.bfloat16).cuda() for x in (q, k, v))


def _plan(B, H, Sq, Sk, bk, cap, seed, empty_row=True):
    g = torch.Generator().manual_seed(seed + 1)
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    idx = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(B * H * gq)])
    if idx.shape[1] < cap:
        idx = torch.cat([idx, torch.full((idx.shape[0], cap - idx.shape[1]), -1, dtype=idx.dtype)], 1)
    idx = idx.view(B, H, gq, cap).int()
    counts = torch.randint(1, cap + 1, (B, H, gq), generator=g).int()
    if empty_row:
        counts[0, 0, 0] = 0
    return idx.cuda(), counts.cuda()


CASES = [
    # B, H, Sq, Sk, block_size_k, layout
    (2, 3, 300, 333, 64, "BSHD"),
    (1, 4, 1000, 700, 128, "BHSD"),
    (2, 2, 257, 1000, 128, "BSHD"),
    (1, 3, 640, 2048, 64, "BHSD"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,H,Sq,Sk,bk,layout", CASES)
def test_every_block_head_and_channel_within_bounds(mode, B, H, Sq, Sk, bk, layout):
    need_mode(mode)
    q, k, v = _inputs(B, Sq, Sk, H, layout, seed=Sq + Sk)
    idx, counts = _plan(B, H, Sq, Sk, bk, cap=min(6, -(-Sk // bk)), seed=Sq + Sk)
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode=mode, layout=layout)
    torch.cuda.synchronize()
    what = f"{mode} B{B} H{H} Sq{Sq} Sk{Sk} bk{bk} {layout}"
    if mode == "bf16":
        ref = reference_sparse_attention(q, k, v, idx, counts, block_size_k=bk, layout=layout)
        acc.check_attention(got, ref, "bf16", layout, what=what)
    else:
        quant = subblock_sage.quantize_sage(q, k, v, layout=layout)
        acc.check_sage(got, q, k, v, quant, idx, counts, block_size_k=bk, layout=layout, what=what)
    first = got[0, :64, 0] if layout == "BSHD" else got[0, 0, :64]
    assert bool((first == 0).all())  # counts[0, 0, 0] = 0


# ---------------------------------------------------------------------------------------------
# Mutation check on real kernel output

B, H, SQ, SK, BK, CAP = 1, 3, 1024, 768, 64, 8
BLOCK = r"query block \(b, h, block\) = \(0, 1, 5\)"


@pytest.fixture(scope="module")
def case():
    q, k, v = _inputs(B, SQ, SK, H, "BSHD", seed=0)
    idx, counts = _plan(B, H, SQ, SK, BK, CAP, seed=0, empty_row=False)
    return {"q": q, "k": k, "v": v, "idx": idx, "cnt": counts,
            "ref": reference_sparse_attention(q, k, v, idx, counts)}


def _run(c, mode, q=None, k=None, v=None, **kw):
    out = subblock_sage.sparse_attention(c["q"] if q is None else q, c["k"] if k is None else k,
                                         c["v"] if v is None else v, c["idx"], c["cnt"], compute_mode=mode, **kw)
    torch.cuda.synchronize()
    return out


def _check(c, mode, got):
    if mode == "bf16":
        acc.check_attention(got, c["ref"], "bf16", what="bf16")
    else:
        quant = subblock_sage.quantize_sage(c["q"], c["k"], c["v"])  # of the unmutated inputs
        acc.check_sage(got, c["q"], c["k"], c["v"], quant, c["idx"], c["cnt"], what="sage_fp8")


def _v_tokens_permuted(v):
    """V with the keys of every 16-token group in SAGE_PERM16 order: what a kernel that reads V
    with a wrong (e.g. doubly applied) permutation computes with."""
    n = v.shape[1] // 16 * 16
    out = v.clone()
    out[:, :n] = v[:, :n].unflatten(1, (-1, 16))[:, :, list(SAGE_PERM16)].flatten(1, 2)
    return out


def _q_block_scaled(q):
    out = q.clone()
    out[0, 5 * 64:6 * 64, 1] *= 1.15  # query block 5 of head 1 (like a wrong q_scale for it)
    return out


def _v_channel_scaled(v):
    out = v.clone()
    out[0, :, 0, 7] *= 1.05  # channel 7 of head 0 (like a wrong v_scale entry)
    return out


# name -> (modes, how the faulty output is made, what the rejection must say)
FAULTS = {
    "v_permutation": (MODES, lambda c, m: _run(c, m, v=_v_tokens_permuted(c["v"])), "relative L1"),
    "one_query_block": (MODES, lambda c, m: _run(c, m, q=_q_block_scaled(c["q"])), BLOCK),
    "k_head_stride_swapped": (MODES, lambda c, m: _run(c, m, k=c["k"][:, :, [0, 2, 1]]), "relative L1"),
    "output_heads_swapped": (MODES, lambda c, m: _run(c, m)[:, :, [0, 2, 1]], "relative L1"),
    "softmax_scale_10pct": (MODES, lambda c, m: _run(c, m, softmax_scale=1.1 * 128 ** -0.5), "relative L1"),
    "output_gain_3pct": (MODES, lambda c, m: _run(c, m) * 1.03, r"gain 1\.0[2-4]"),
    "v_scale_one_channel": (("sage_fp8",), lambda c, m: _run(c, m, v=_v_channel_scaled(c["v"])),
                            r"channel \(b, h, d\) = \(0, 0, 7\)"),
}


@pytest.mark.parametrize("mode", MODES)
def test_unmutated_output_passes(case, mode):
    need_mode(mode)
    _check(case, mode, _run(case, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_mutated_output_is_rejected(case, mode, fault):
    modes, make, message = FAULTS[fault]
    if mode not in modes:
        pytest.skip(f"{fault} is a Sage-only fault (per-channel V scale)")
    need_mode(mode)
    got = make(case, mode)
    with pytest.raises(AssertionError, match=message):
        _check(case, mode, got)
