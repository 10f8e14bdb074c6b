"""GPU-test helpers: inputs, plans, comparisons, and what the current device serves."""

from __future__ import annotations

import pytest
import torch


def attention_modes(device=None) -> tuple:
    """Compute modes ``sparse_attention`` serves on ``device`` (empty while its backend is not
    in this build yet)."""
    from subblock_sage import loader
    from subblock_sage.backends import backend_for
    from subblock_sage.errors import SubblockSageError

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    try:
        lib = loader.library_for_device(index)
        return tuple(backend_for(lib.target).modes(lib))
    except SubblockSageError:
        return ()


def need_mode(mode: str, device=None) -> None:
    modes = attention_modes(device)
    if mode not in modes:
        from subblock_sage import loader

        dev = torch.device(device) if device is not None else torch.device("cuda")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        try:
            target = loader.library_for_device(index).target
        except Exception as e:  # noqa: BLE001
            target = f"? ({e})"
        pytest.skip(f"sparse_attention compute_mode={mode!r} is not available for {target} in this "
                    f"build (serves {modes or 'nothing yet'})")


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


def compare(got, ref, mode):
    g, r = got.double().flatten(), ref.double().to(got.device).flatten()
    assert torch.isfinite(g).all()
    rel = float((g - r).abs().sum() / r.abs().sum().clamp_min(1e-30))
    cos = float(torch.nn.functional.cosine_similarity(g, r, dim=0))
    lim = 0.06 if mode == "sage_fp8" else 0.01
    assert rel < lim, f"{mode}: relative L1 {rel:.4f}, cosine {cos:.6f}"


def quant_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key].to(a[key].device)
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), key


