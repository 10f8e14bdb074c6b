"""Mutation check of the accuracy comparisons (issue 21), on CPU with synthetic tensors.

A correct Sage kernel is stood in for by ``tests.helpers.accuracy.emulate_sage`` (float64, P
rounded to FP8 like the kernels: its error against float64 attention is the ~0.037 relative L1
the real kernel shows). Then faults of the kinds a broken build makes are injected into what the
comparison sees (a wrong V permutation, one wrong 64-row query block, swapped heads, wrong
scales), and the comparison helpers the GPU tests use must reject every one. Some of these faults
pass the old whole-tensor check (relative L1 < 0.06 and cosine > 0.998): those are asserted too,
so this file also shows why the per-block, per-channel and dequantized bounds exist.
The same faults on real kernel output: tests/gpu/test_accuracy_blocks.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.reference import (  # noqa: E402
    SAGE_PERM16,
    reference_quantize_sage,
    reference_sparse_attention,
)

from tests.helpers import accuracy as acc  # noqa: E402

B, H, SQ, SK, BK, CAP = 1, 3, 1024, 768, 64, 8
WRONG_BLOCK = (0, 1, 5)  # (b, h, query block) the one-block faults hit
WRONG_CHANNEL = (0, 0, 7)


@pytest.fixture(scope="module")
def case():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, SQ, H, 128, generator=g).bfloat16()
    k = (torch.randn(B, SK, H, 128, generator=g) + 2 * torch.randn(128, generator=g)).bfloat16()
    v = torch.randn(B, SK, H, 128, generator=g).bfloat16()
    gq, gk = -(-SQ // 64), -(-SK // BK)
    idx = torch.stack([torch.randperm(gk, generator=g)[:CAP] for _ in range(B * H * gq)])
    idx = idx.view(B, H, gq, CAP).int()
    cnt = torch.randint(1, CAP + 1, (B, H, gq), generator=g).int()
    quant = reference_quantize_sage(q, k, v)
    return {
        "q": q, "k": k, "v": v, "idx": idx, "cnt": cnt, "quant": quant,
        "ref": reference_sparse_attention(q, k, v, idx, cnt, block_size_k=BK),
        "dref": acc.dequantized_reference(quant, idx, cnt, block_size_k=BK),
        "good": acc.emulate_sage(quant, idx, cnt, block_size_k=BK),
    }


def old_check_passes(got, ref) -> bool:
    """The whole-tensor check the attention tests used before issue 21."""
    e = acc.attention_errors(got, ref)
    return e["finite"] and e["rel_l1"] < 0.06 and e["cosine"] > 0.998


def check_both(got, c) -> None:
    acc.check_attention(got, c["ref"], "sage_fp8", what="vs float64")
    acc.check_attention(got, c["dref"], acc.DEQUANT_BOUNDS, what="vs dequantized")


def _emulate(c, **changes):
    quant = dict(c["quant"])
    quant.update(changes)
    return acc.emulate_sage(quant, c["idx"], c["cnt"], block_size_k=BK)


def _v_layout(c, perm):
    """v_fp8 written with the 16-token permutation ``perm`` instead of SAGE_PERM16 (what a
    quantizer or kernel with a wrong V layout amounts to)."""
    v8 = c["quant"]["v_fp8"].float()
    tokens = v8.transpose(2, 3).reshape(B, H, -1, 16, 128)[:, :, :, list(SAGE_PERM16)]  # token order
    stored = torch.empty_like(tokens)
    stored[:, :, :, list(perm)] = tokens
    return stored.reshape(B, H, -1, 128).transpose(2, 3).contiguous().to(torch.float8_e4m3fn)


def _scaled(c, name, where, factor):
    t = c["quant"][name].clone()
    t[where] *= factor
    return t


def _swap_heads(t):
    t = t.clone()
    t[:, [1, 2]] = t[:, [2, 1]]
    return t


def _block_rows(t, b, h, i):
    return t[b, i * 64:(i + 1) * 64, h]  # BSHD


def _one_block_from_another(c):
    got = c["good"].clone()
    b, h, i = WRONG_BLOCK
    _block_rows(got, b, h, i).copy_(_block_rows(c["good"], b, h, i + 1))
    return got


def _q_scale_one_block(c):
    b, h, i = WRONG_BLOCK  # q_scale: one entry per 32 rows, so a 64-row block has two
    return _emulate(c, q_scale=_scaled(c, "q_scale", (b, h, slice(2 * i, 2 * i + 2)), 1.15))


# name -> (fault, regex the rejection must match, passes the old whole-tensor check)
BLOCK = r"query block \(b, h, block\) = \(0, 1, 5\)"
MUTATIONS = {
    "v_permutation_identity": (lambda c: _emulate(c, v_fp8=_v_layout(c, range(16))), "relative L1", False),
    "v_permutation_pairs_swapped": (
        lambda c: _emulate(c, v_fp8=_v_layout(c, [SAGE_PERM16[i ^ 1] for i in range(16)])), "relative L1", False),
    "one_query_block_from_its_neighbour": (_one_block_from_another, BLOCK, False),
    "one_query_block_wrong_q_scale": (_q_scale_one_block, BLOCK, True),
    "k_head_stride_swapped": (
        lambda c: _emulate(c, k_int8=_swap_heads(c["quant"]["k_int8"]), k_scale=_swap_heads(c["quant"]["k_scale"])),
        "relative L1", False),
    "output_heads_swapped": (lambda c: c["good"][:, :, [0, 2, 1]].contiguous(), "relative L1", False),
    "v_scale_one_channel": (
        lambda c: _emulate(c, v_scale=_scaled(c, "v_scale", WRONG_CHANNEL, 1.05)),
        r"channel \(b, h, d\) = \(0, 0, 7\): gain 1\.0[45]", True),  # (1.0501 with the bound's scale)
    "k_scale_one_key_block": (lambda c: _emulate(c, k_scale=_scaled(c, "k_scale", (0, 2, 3), 2.0)), "cosine", False),
    "softmax_scale_10pct": (
        lambda c: acc.emulate_sage(c["quant"], c["idx"], c["cnt"], block_size_k=BK, softmax_scale=1.1 * 128 ** -0.5),
        "relative L1", False),
    "output_gain_3pct": (lambda c: c["good"] * 1.03, r"gain 1\.03", True),
}


def test_clean_emulation_passes_with_realistic_error(case):
    """The stand-in has the real kernel's error level, so the faults below are judged against a
    realistic baseline (not against a perfect output)."""
    err = acc.check_attention(case["good"], case["ref"], "sage_fp8")
    assert 0.025 < err["rel_l1"] < 0.05, err["rel_l1"]
    derr = acc.check_attention(case["good"], case["dref"], acc.DEQUANT_BOUNDS)
    assert derr["rel_l1"] < 0.75 * err["rel_l1"], (derr["rel_l1"], err["rel_l1"])
    assert old_check_passes(case["good"], case["ref"])


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_fault_is_rejected(case, name):
    fault, message, hidden_from_old_check = MUTATIONS[name]
    got = fault(case)
    assert not torch.equal(got, case["good"])
    with pytest.raises(AssertionError, match=message):
        check_both(got, case)
    # the faults marked hidden pass the old whole-tensor check: only the new bounds catch them
    assert old_check_passes(got, case["ref"]) == hidden_from_old_check


def test_bf16_faults_rejected(case):
    """bf16 bounds: float64 output rounded to bf16 passes; one wrong block, swapped heads and a 2%
    gain error do not."""
    ref = case["ref"]
    good = ref.to(torch.bfloat16).double()
    acc.check_attention(good, ref, "bf16")
    bad = good.clone()
    b, h, i = WRONG_BLOCK
    _block_rows(bad, b, h, i).mul_(1.1)
    with pytest.raises(AssertionError, match=BLOCK):
        acc.check_attention(bad, ref, "bf16")
    with pytest.raises(AssertionError, match="relative L1"):
        acc.check_attention(good[:, :, [0, 2, 1]], ref, "bf16")
    with pytest.raises(AssertionError, match=r"gain 1\.02"):
        acc.check_attention(good * 1.02, ref, "bf16")


def test_empty_rows_must_be_exact_zeros_and_nan_is_rejected(case):
    ref = case["ref"].clone()
    b, h, i = WRONG_BLOCK
    _block_rows(ref, b, h, i).zero_()  # a row with no valid key block: exact zeros expected
    got = ref.to(torch.bfloat16).double()
    acc.check_attention(got, ref, "bf16")
    _block_rows(got, b, h, i)[3, 5] = 1e-6
    with pytest.raises(AssertionError, match=BLOCK + ": not exactly zero"):
        acc.check_attention(got, ref, "bf16")
    got = ref.to(torch.bfloat16).double()
    got[0, 100, 1, 3] = float("nan")
    with pytest.raises(AssertionError, match="NaN/inf"):
        acc.check_attention(got, ref, "bf16")


def test_plan_mask_agrees_with_reference(case):
    """The helpers' own plan mask (plain loops) and the runtime's reference implement the same
    contract: attention restricted by the mask equals reference_sparse_attention."""
    c = case
    mask = acc.plan_mask(c["idx"], c["cnt"], Sq=SQ, Sk=SK, block_size_k=BK)
    qh, kh, vh = (acc.to_bhsd(x, "BSHD").double() for x in (c["q"], c["k"], c["v"]))
    s = (qh @ kh.transpose(-1, -2) * 128 ** -0.5).masked_fill(~mask, float("-inf"))
    out = acc.from_bhsd(torch.softmax(s, dim=-1) @ vh, "BSHD")
    assert torch.allclose(out, c["ref"], atol=1e-12, rtol=0)
