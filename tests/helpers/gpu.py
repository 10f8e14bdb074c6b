"""GPU-test helpers: inputs, plans and comparisons shared by the tests/gpu modules (which compute
modes a GPU must serve: tests/helpers/served.py)."""

from __future__ import annotations

import torch


def qkv(B, Sq, Sk, H, device, seed=0, bias=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, 128, generator=g)
    k = torch.randn(B, Sk, H, 128, generator=g) + bias
    v = torch.randn(B, Sk, H, 128, generator=g)
    return tuple(x.to(torch.bfloat16).to(device) for x in (q, k, v))


def random_plan(B, H, Sq, Sk, cap, device, seed=0, block_size_k=64, with_counts=True):
    g = torch.Generator().manual_seed(seed + 1)
    gq, gk = -(-Sq // 64), -(-Sk // block_size_k)
    idx = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(B * H * gq)])
    if idx.shape[1] < cap:
        idx = torch.cat([idx, torch.zeros(idx.shape[0], cap - idx.shape[1], dtype=idx.dtype)], 1)
    idx = idx.view(B, H, gq, cap).int().to(device)
    counts = None
    if with_counts:
        counts = torch.randint(0, min(cap, gk) + 1, (B, H, gq), generator=g).int().to(device)
    return idx, counts


def compare(got, ref, mode, layout="BSHD"):
    """Whole tensor, every 64-row query block, every head and channel (tests/helpers/accuracy.py)."""
    from tests.helpers.accuracy import check_attention

    check_attention(got, ref, mode, layout, what=mode)


def quant_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key].to(a[key].device)
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), key
