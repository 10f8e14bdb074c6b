"""The contract points of issue 21 on the reference side, on CPU (the GPU side, the kernels against
this reference: tests/gpu/test_contract_points.py). Each case is checked against attention
written out here from first principles (plain softmax over an explicit key list), not against
the reference's own masking code.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.reference import (  # noqa: E402
    SAGE_PERM16,
    dequantize_sage,
    reference_quantize_sage,
    reference_sparse_attention,
)


def _x(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _by_hand(q, k, v, keys_per_row, scale=128 ** -0.5):
    """BSHD float64 attention where row (b, h, s) attends to keys_per_row(b, h, s) (a list)."""
    B, Sq, H, D = q.shape
    out = torch.zeros(B, Sq, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for s in range(Sq):
                keys = keys_per_row(b, h, s)
                if not keys:
                    continue
                sc = (k[b, keys, h].double() @ q[b, s, h].double()) * scale
                out[b, s, h] = torch.softmax(sc, 0) @ v[b, keys, h].double()
    return out


@pytest.mark.parametrize("Sq,Sk,bk", [(33, 33, 128), (1, 33, 128), (63, 33, 64), (50, 129, 128)])
def test_short_sequences(Sq, Sk, bk):
    """Sq < 64 and Sk shorter than one key block: the partial block holds exactly the Sk keys."""
    B, H = 1, 2
    q, k, v = _x(B, Sq, H, 128, seed=1), _x(B, Sk, H, 128, seed=2), _x(B, Sk, H, 128, seed=3)
    gk = -(-Sk // bk)
    idx = torch.tensor([gk - 1, -1, gk], dtype=torch.int32).expand(B, H, 1, 3)
    got = reference_sparse_attention(q, k, v, idx, block_size_k=bk)
    want = _by_hand(q, k, v, lambda b, h, s: list(range((gk - 1) * bk, Sk)))
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("fill", [float("nan"), 1.0e4])
def test_data_past_sk_in_a_strided_view_is_never_read(fill):
    B, H, Sq, Sk, extra = 1, 2, 70, 100, 60
    q = _x(B, Sq, H, 128, seed=4)
    kb, vb = _x(B, Sk + extra, H, 128, seed=5), _x(B, Sk + extra, H, 128, seed=6)
    kb[:, Sk:], vb[:, Sk:] = fill, fill
    k, v = kb[:, :Sk], vb[:, :Sk]
    idx = torch.tensor([1, 0], dtype=torch.int32).expand(B, H, 2, 2)  # the partial block 1 included
    got = reference_sparse_attention(q, k, v, idx)
    assert torch.isfinite(got).all()
    assert torch.equal(got, reference_sparse_attention(q, k.contiguous(), v.contiguous(), idx))
    assert torch.allclose(got, _by_hand(q, k, v, lambda b, h, s: list(range(Sk))), atol=1e-12, rtol=0)
    # the quantizer reference likewise: statistics over the Sk keys only, pad columns +0
    quant = reference_quantize_sage(q, k, v)
    assert all(torch.isfinite(t.float()).all() for t in quant.values())
    clean = reference_quantize_sage(q, k.contiguous(), v.contiguous())
    for name in quant:
        assert torch.equal(quant[name].float(), clean[name].float()), name
    cols = quant["v_fp8"].shape[-1]
    used = {(t // 16) * 16 + SAGE_PERM16[t % 16] for t in range(Sk)}  # token t is stored at this column
    pad = [c for c in range(cols) if c not in used]
    assert len(pad) == cols - Sk and (quant["v_fp8"].float()[..., pad] == 0).all()
    dq = dequantize_sage(quant)
    assert dq["v"].shape[2] == Sk


def test_rows_with_only_invalid_ids_and_topk_zero_are_exact_zeros():
    B, H, Sq, Sk = 1, 2, 130, 200
    q, k, v = _x(B, Sq, H, 128, seed=7), _x(B, Sk, H, 128, seed=8), _x(B, Sk, H, 128, seed=9)
    for bk in (64, 128):
        gk = -(-Sk // bk)
        idx = torch.zeros(B, H, 3, 3, dtype=torch.int32)
        idx[..., 0] = 0
        idx[0, 1, 2] = torch.tensor([-1, gk, 2**31 - 1])  # all invalid
        got = reference_sparse_attention(q, k, v, idx, torch.full((B, H, 3), 3, dtype=torch.int32),
                                         block_size_k=bk)
        assert (got[0, 128:, 1] == 0).all() and (got[0, :, 0] != 0).any()
        want = _by_hand(q, k, v, lambda b, h, s: [] if (h, s // 64) == (1, 2) else list(range(min(bk, Sk))))
        assert torch.allclose(got, want, atol=1e-12, rtol=0)
        zero = reference_sparse_attention(q, k, v, idx, topk=0, block_size_k=bk)
        assert (zero == 0).all()


def test_strided_bhsd_and_bshd_agree():
    """A BHSD view of BSHD storage gives the BSHD result, transposed."""
    B, H, S = 1, 2, 150
    x = _x(B, S, 3, H, 128, seed=10)
    q, k, v = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    idx = torch.tensor([2, 0], dtype=torch.int32).expand(B, H, 3, 2)
    bshd = reference_sparse_attention(q, k, v, idx)
    bhsd = reference_sparse_attention(*(t.permute(0, 2, 1, 3) for t in (q, k, v)), idx, layout="BHSD")
    assert torch.equal(bhsd.permute(0, 2, 1, 3), bshd)
