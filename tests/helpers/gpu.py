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


def pair_plan(B, H, gq, gk, gen, kinds):
    """A raw plan of capacity gk + 3 (CPU, int64; ``cap`` returned) built by row pairs (2c, 2c+1),
    pair c of (b, h) of kind ``kinds[(b*H + h + c) % len(kinds)]`` (offset per head):

    - ``"dense"``: both rows dense, ascending as the plan preparation writes them (counts gk and
      capacity: a CTA or cluster shares their K/V loads; counted in ``shared``);
    - ``"dense+sparse"``: the first row dense, the second below gk entries;
    - ``"same"``: identical sparse rows, below gk entries;
    - ``"empty"``: both rows empty;
    - ``"independent"``: independent random rows with junk ids (skipped), both below gk entries;
    - ``"independent+raw"``: the same, only the second below gk entries (a raw row of gk entries
      may hold junk: the plan preparation would have counted only its valid ids).

    Every row is a random permutation of the capacity's slots, ids past the key blocks junk (-9):
    no id repeats within a row (a raw launch counts a repeat per occurrence, the reference once).
    Counts are drawn in [0, capacity]; the caller sets its own extra rows (empty, past capacity)."""
    cap = gk + 3
    idx = torch.stack([torch.randperm(cap, generator=gen) - 2 for _ in range(B * H * gq)]).view(B, H, gq, cap)
    idx[idx >= gk] = -9
    counts = torch.randint(0, cap + 1, (B, H, gq), generator=gen)
    dense = torch.full((cap,), -9)
    dense[:gk] = torch.arange(gk)
    shared = 0
    for bh in range(B * H):
        b, h = divmod(bh, H)
        for r in range(0, gq - 1, 2):
            kind = kinds[(bh + r // 2) % len(kinds)]
            if kind == "dense":
                idx[b, h, r], idx[b, h, r + 1] = dense, dense
                counts[b, h, r], counts[b, h, r + 1] = gk, cap
                shared += 1
            elif kind == "dense+sparse":
                idx[b, h, r], counts[b, h, r] = dense, gk
                counts[b, h, r + 1] = min(int(counts[b, h, r + 1]), gk - 1)
            elif kind == "same":
                counts[b, h, r] = min(int(counts[b, h, r]), gk - 1)
                idx[b, h, r + 1], counts[b, h, r + 1] = idx[b, h, r], counts[b, h, r]
            elif kind == "empty":
                counts[b, h, r], counts[b, h, r + 1] = 0, 0
            elif kind == "independent":
                counts[b, h, r] = min(int(counts[b, h, r]), gk - 1)
                counts[b, h, r + 1] = min(int(counts[b, h, r + 1]), gk - 1)
            else:
                assert kind == "independent+raw", kind
                counts[b, h, r + 1] = min(int(counts[b, h, r + 1]), gk - 1)
    return idx, counts, cap, shared


def poison_allocator(nbytes: int = 64 << 20):
    """Fill the caching allocator's free blocks with garbage so that outputs the kernels fail to
    write show up as NaN / 0x7f bytes instead of lucky zeros."""
    blocks = []
    for size in (nbytes, nbytes // 4, nbytes // 16, 1 << 20, 1 << 16, 1 << 12, 512):
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        t.fill_(0x7F)  # int8 127, fp8 NaN, fp32 3.4e38
        blocks.append(t)
    torch.cuda.synchronize()
    del blocks


def activation_qkv(B, Sq, Sk, H, seed, layout="BSHD", device="cuda"):
    """bf16 q, k, v shaped like activations (a per-channel offset shared by all tokens plus
    noise): block scores spread over a few units, so a router's selection is the data's and not
    rounding's. ``layout`` "BHSD" returns contiguous [B, H, S, 128] tensors."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, 128, generator=g) + 0.5 * torch.randn(1, 1, H, 128, generator=g)
    k = torch.randn(B, Sk, H, 128, generator=g) + torch.randn(1, 1, H, 128, generator=g)
    v = torch.randn(B, Sk, H, 128, generator=g)
    out = [x.to(torch.bfloat16).to(device) for x in (q, k, v)]
    if layout == "BHSD":
        out = [x.permute(0, 2, 1, 3).contiguous() for x in out]
    return out


def contender_from_test_library(module):
    """The bench contender that ``module`` (``benchmark.lab.sglang_sm90`` or ``cudnn_sm90``)
    loads from the sm_90a test library, or a pytest skip naming why not (another GPU, no test
    library: ``module.load_failure`` carries the fix)."""
    import pytest

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the test library is sm_90a")
    got = module.load()
    if got is None:
        pytest.skip(module.load_failure)
    return got
