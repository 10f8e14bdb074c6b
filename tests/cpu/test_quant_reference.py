"""CPU tests of the Sage quantizer reference (python/subblock_sage/reference.py)."""

import math

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.reference import (  # noqa: E402
    SAGE_PERM16,
    dequantize_sage,
    reference_quantize_sage,
    sage_perm16,
    sage_quant_shapes,
)

FP8_MAX_REL_HALF_STEP = 2.0**-4  # E4M3: 3 mantissa bits


def _qkv(B, H, Sq, Sk, seed, k_bias=0.0, layout="BSHD"):
    g = torch.Generator().manual_seed(seed)

    def mk(S, bias=0.0):
        x = torch.randn(B, S, H, 128, generator=g) * (0.5 + torch.rand(1, 1, H, 128, generator=g))
        x = x + bias * torch.randn(1, 1, H, 128, generator=g).abs()
        x = x.to(torch.bfloat16)
        return x if layout == "BSHD" else x.permute(0, 2, 1, 3).contiguous()

    return mk(Sq), mk(Sk, k_bias), mk(Sk)


def _bhsd(x, layout):
    return x.permute(0, 2, 1, 3) if layout == "BSHD" else x


def test_perm16_is_flashinfer_permutation():
    assert SAGE_PERM16 == (0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)
    assert sorted(SAGE_PERM16) == list(range(16))
    # Pairs of consecutive tokens stay adjacent (the FP8 byte pairs the MMA consumes).
    for m in range(8):
        assert SAGE_PERM16[2 * m + 1] == SAGE_PERM16[2 * m] + 1
    assert [sage_perm16(i + 16) for i in range(16)] == list(SAGE_PERM16)


@pytest.mark.parametrize("B,H,Sq,Sk", [(1, 1, 128, 64), (2, 3, 200, 77), (1, 2, 33, 130), (2, 1, 1, 1)])
def test_shapes_dtypes(B, H, Sq, Sk):
    q, k, v = _qkv(B, H, Sq, Sk, seed=B * 1000 + Sq + Sk)
    out = reference_quantize_sage(q, k, v)
    shapes = sage_quant_shapes(B, H, Sq, Sk)
    dtypes = {
        "q_int8": torch.int8,
        "q_scale": torch.float32,
        "k_int8": torch.int8,
        "k_scale": torch.float32,
        "k_mean": torch.float32,
        "v_fp8": torch.float8_e4m3fn,
        "v_scale": torch.float32,
    }
    assert set(out) == set(shapes)
    for name, t in out.items():
        assert tuple(t.shape) == shapes[name], name
        assert t.dtype == dtypes[name], name
        assert t.is_contiguous(), name
    assert shapes["q_scale"][2] == math.ceil(Sq / 128) * 4
    assert shapes["v_fp8"][3] % 64 == 0 and shapes["v_fp8"][3] >= Sk


def test_layouts_and_strided_views_agree():
    B, H, Sq, Sk = 2, 3, 150, 100
    g = torch.Generator().manual_seed(7)
    # packed [B, S, 3, H, 128] (Sq == Sk for the packed case), sliced into strided BSHD views
    qkv = (torch.randn(B, Sk, 3, H, 128, generator=g) + 0.3).to(torch.bfloat16)
    qs, ks, vs = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not qs.is_contiguous()
    a = reference_quantize_sage(qs, ks, vs, layout="BSHD")
    b = reference_quantize_sage(qs.contiguous(), ks.contiguous(), vs.contiguous(), layout="BSHD")
    c = reference_quantize_sage(
        qs.permute(0, 2, 1, 3).contiguous(),
        ks.permute(0, 2, 1, 3).contiguous(),
        vs.permute(0, 2, 1, 3).contiguous(),
        layout="BHSD",
    )
    for name in a:
        for other in (b, c):
            x, y = a[name], other[name]
            if x.dtype == torch.float8_e4m3fn:
                x, y = x.view(torch.uint8), y.view(torch.uint8)
            assert torch.equal(x, y), name
    # different Sq and Sk with BHSD
    q, k, v = _qkv(B, H, Sq, Sk, seed=3, layout="BHSD")
    d = reference_quantize_sage(q, k, v, layout="BHSD")
    e = reference_quantize_sage(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3))
    for name in d:
        x, y = d[name], e[name]
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), name


def test_against_naive_loops():
    """An independent scalar re-derivation on a small ragged case."""
    B, H, Sq, Sk = 1, 2, 70, 83
    q, k, v = _qkv(B, H, Sq, Sk, seed=11, k_bias=2.0)
    out = reference_quantize_sage(q, k, v)
    qf, kf, vf = (x.permute(0, 2, 1, 3).float() for x in (q, k, v))
    for h in range(H):
        # Q groups of 32 rows, 4 groups per 128-row tile; pad groups -> 1e-7/127
        for gi in range(out["q_scale"].shape[2]):
            rows = qf[0, h, gi * 32 : min(gi * 32 + 32, Sq)]
            amax = max(float(rows.abs().max()) if rows.numel() else 0.0, 1e-7)
            scale = torch.tensor(amax, dtype=torch.float32) / 127.0
            assert out["q_scale"][0, h, gi] == scale
            for r in range(rows.shape[0]):
                want = torch.clamp(torch.round(rows[r] / scale), -127, 127).to(torch.int8)
                assert torch.equal(out["q_int8"][0, h, gi * 32 + r], want)
        # K: mean over all keys, amax of centred valid rows per 64-key block
        mean = kf[0, h].double().sum(0) / Sk
        assert torch.allclose(out["k_mean"][0, h].double(), mean, rtol=0, atol=1e-6)
        m32 = out["k_mean"][0, h]
        for blk in range(out["k_scale"].shape[2]):
            rows = kf[0, h, blk * 64 : min(blk * 64 + 64, Sk)] - m32
            scale = torch.tensor(max(float(rows.abs().max()), 1e-7), dtype=torch.float32) / 127.0
            assert out["k_scale"][0, h, blk] == scale
            want = torch.clamp(torch.round(rows / scale), -127, 127).to(torch.int8)
            assert torch.equal(out["k_int8"][0, h, blk * 64 : blk * 64 + rows.shape[0]], want)
        # V: per-channel scale; element (token t, channel d) at [d, 64*blk + 16*g + perm[i]]
        # (Sk <= 512: every key is sampled, so the bound is 4x the amax and decides the scale)
        vs = torch.clamp(vf[0, h].abs().amax(0) * 4.0, min=1e-7) / 2.25
        assert torch.equal(out["v_scale"][0, h], vs)
        v8 = out["v_fp8"][0, h].view(torch.uint8)
        for t in range(0, Sk, 5):
            col = (t // 16) * 16 + SAGE_PERM16[t % 16]
            want = (vf[0, h, t] / vs).to(torch.float8_e4m3fn).view(torch.uint8)
            assert torch.equal(v8[:, col], want), t


def test_pad_positions_are_exact_zero():
    B, H, Sq, Sk = 2, 3, 50, 77  # 77 keys -> 128 columns, 51 pad columns
    q, k, v = _qkv(B, H, Sq, Sk, seed=5)
    out = reference_quantize_sage(q, k, v)
    v8 = out["v_fp8"].view(torch.uint8)
    valid_cols = {(t // 16) * 16 + SAGE_PERM16[t % 16] for t in range(Sk)}
    pad_cols = [c for c in range(v8.shape[3]) if c not in valid_cols]
    assert len(pad_cols) == 128 - 77
    assert int(v8[..., pad_cols].abs().sum()) == 0  # +0.0 is byte 0x00
    # pad q groups: Sq=50 -> 4 groups, groups 2 and 3 lie past Sq
    assert torch.all(out["q_scale"][:, :, 2:] == torch.tensor(1e-7, dtype=torch.float32) / 127.0)
    assert torch.all(out["q_scale"][:, :, :2] > 1e-3)


def test_scale_formulas():
    B, H, Sq, Sk = 2, 3, 256, 192
    q, k, v = _qkv(B, H, Sq, Sk, seed=9, k_bias=3.0)
    out = reference_quantize_sage(q, k, v)
    qf, kf, vf = (_bhsd(x, "BSHD").float() for x in (q, k, v))
    q_amax = qf.reshape(B, H, -1, 32, 128).abs().amax((3, 4))
    assert torch.equal(out["q_scale"], q_amax / 127.0)
    kc = kf - kf.double().mean(2, keepdim=True).float()
    k_amax = kc.reshape(B, H, -1, 64, 128).abs().amax((3, 4))
    assert torch.equal(out["k_scale"], k_amax / 127.0)
    assert torch.equal(out["v_scale"], vf.abs().amax(2) * 4.0 / 2.25)  # (all keys sampled: the bound)
    # codes use the full INT8 range in every group / block; V's codes reach 2.25 / 4 (the bound's
    # margin; E4M3 0.5625 exact)
    assert torch.all(out["q_int8"].reshape(B, H, -1, 32 * 128).abs().amax(-1) == 127)
    assert torch.all(out["k_int8"].reshape(B, H, -1, 64 * 128).abs().amax(-1) == 127)
    assert torch.all(out["v_fp8"].float().abs().amax(-1) == 2.25 / 4)


def test_v_scale_is_the_bound_unless_a_key_exceeds_it():
    """``v_scale = max(bound, amax, 1e-7) / 2.25``, the bound 4x the amax over the K mean's
    sample keys (``0, stride, ..``): on Gaussian V at S=37760 the bound decides every channel
    (the quantizer then reads V once); a key off the sample above the bound (an outlier token,
    a channel that is zero on the sample) makes that channel's scale its exact amax, and no
    code then leaves E4M3's +-2.25."""
    from subblock_sage.contract import sage_k_mean_rows
    from subblock_sage.reference import reference_v_bound

    Sk = 37760
    n, stride = sage_k_mean_rows(Sk)
    g = torch.Generator().manual_seed(5)
    v = torch.randn(1, 2, Sk, 128, generator=g).to(torch.bfloat16).float()
    bound = reference_v_bound(v)
    sample_amax = v[:, :, ::stride][:, :, :n].abs().amax(2)
    assert torch.equal(bound, sample_amax * 4.0)
    assert torch.all(v.abs().amax(2) < bound)  # Gaussian: the amax of all keys is ~1.5x the sample's
    out = reference_quantize_sage(v, v, v, layout="BHSD")
    assert torch.equal(out["v_scale"], bound / 2.25)
    # an outlier on a key off the sample (key 1; stride 73), a channel zero on the sample
    v[0, 0, 1, 3] = 1000.0
    v[0, 1, :, 7] = 0.0
    v[0, 1, stride + 1, 7] = -0.5
    out = reference_quantize_sage(v, v, v, layout="BHSD")
    assert float(out["v_scale"][0, 0, 3]) == pytest.approx(1000.0 / 2.25, rel=1e-6)
    assert float(out["v_scale"][0, 1, 7]) == pytest.approx(0.5 / 2.25, rel=1e-6)
    assert torch.equal(out["v_scale"][0, 0, 4:], bound[0, 0, 4:] / 2.25)  # other channels: the bound
    assert float(out["v_fp8"].float().abs().max()) <= 2.25


def test_v_bound_costs_no_accuracy():
    """FP8-E4M3 keeps its relative precision at any scale: with the bound's scale (~2.7x the
    exact amax's on Gaussian V) the dequantized V is as close as with the exact scale (only
    values under ~1/36 of the amax turn subnormal, their error <= scale * 2**-10)."""
    g = torch.Generator().manual_seed(6)
    v = torch.randn(1, 2, 37760, 128, generator=g).to(torch.bfloat16).float()
    out = reference_quantize_sage(v, v, v, layout="BHSD")
    deq = dequantize_sage(out)["v"]
    exact = v.abs().amax(2, keepdim=True) / 2.25
    deq_exact = (v / exact).to(torch.float8_e4m3fn).float() * exact
    rel = lambda a: float((a - v).norm() / v.norm())  # noqa: E731
    assert rel(deq) < rel(deq_exact) * 1.01, (rel(deq), rel(deq_exact))


def test_k_mean_is_the_mean_of_the_sampled_keys():
    """Past SAGE_K_MEAN_ROWS keys the mean is taken over keys 0, stride, ... (stride = Sk // n):
    exactly those keys, and (biased K, as the smoothing is for) close to the exact mean, so the
    INT8 blocks stay centred."""
    from subblock_sage.contract import SAGE_K_MEAN_ROWS, sage_k_mean_rows

    assert sage_k_mean_rows(1) == (1, 1) and sage_k_mean_rows(SAGE_K_MEAN_ROWS) == (SAGE_K_MEAN_ROWS, 1)
    assert sage_k_mean_rows(SAGE_K_MEAN_ROWS + 1) == (SAGE_K_MEAN_ROWS, 1)
    assert sage_k_mean_rows(3 * SAGE_K_MEAN_ROWS + 7) == (SAGE_K_MEAN_ROWS, 3)
    for Sk in (1, 83, SAGE_K_MEAN_ROWS + 1, 3 * SAGE_K_MEAN_ROWS + 7, 20000):
        n, stride = sage_k_mean_rows(Sk)
        assert (n - 1) * stride < Sk and n * stride <= Sk and (Sk < SAGE_K_MEAN_ROWS or n == SAGE_K_MEAN_ROWS)
    q, k, v = _qkv(1, 2, 64, 3 * SAGE_K_MEAN_ROWS + 7, seed=5, k_bias=3.0)
    out = reference_quantize_sage(q, k, v)
    kf = k.permute(0, 2, 1, 3).double()
    sampled = kf[:, :, 0 : 3 * SAGE_K_MEAN_ROWS : 3].mean(dim=2)
    assert torch.allclose(out["k_mean"].double(), sampled, rtol=0, atol=1e-6)
    exact = kf.mean(dim=2)
    spread = kf.std(dim=2)
    assert not torch.equal(out["k_mean"].double(), exact.float().double())  # really a sample
    assert float(((sampled - exact).abs() / spread).max()) < 0.2  # ~0.044 sigma typical, 4.5 sigma bound


def test_sampled_k_mean_keeps_the_int8_error_of_the_exact_mean():
    """What the sample must preserve: K's INT8 error after smoothing. A K with a large channel bias
    and a drift along the sequence (as frames of a video differ), 6000 keys: the dequantized K's
    error with the sampled mean is within 3 % of the error with the exact mean, and both are far
    below the error without smoothing (a sample of the first 512 keys only, which the drift
    defeats, is the failure this guards against)."""
    from subblock_sage.reference import dequantize_sage

    g = torch.Generator().manual_seed(3)
    Sk, H = 6000, 2
    t = torch.linspace(0, 1, Sk)[None, :, None, None]
    k = (torch.randn(1, Sk, H, 128, generator=g) + 4.0 * torch.randn(1, 1, H, 128, generator=g)
         + 1.5 * t * torch.randn(1, 1, H, 128, generator=g)).to(torch.bfloat16)
    q = k[:, :64]
    kf = k.permute(0, 2, 1, 3).float()

    def err(mean):
        out = reference_quantize_sage(q, k, k, k_mean=mean)
        return float((dequantize_sage(out, seqlen_k=Sk)["k"] - kf).norm() / kf.norm())

    sampled = err(None)
    exact = err(kf.double().mean(dim=2).float())
    first = err(kf[:, :, :512].double().mean(dim=2).float())
    raw = err(torch.zeros(1, H, 128))
    assert sampled <= 1.03 * exact, (sampled, exact)
    # (measured: 0.00232 sampled, 0.00232 exact, 0.00271 first 512 keys, 0.00779 unsmoothed)
    assert raw > 2 * exact and first > 1.08 * exact, (raw, first, exact)


def test_k_mean_override():
    q, k, v = _qkv(1, 2, 64, 128, seed=13, k_bias=1.0)
    base = reference_quantize_sage(q, k, v)
    mean = base["k_mean"] + 0.01
    out = reference_quantize_sage(q, k, v, k_mean=mean)
    assert torch.equal(out["k_mean"], mean)
    deq = dequantize_sage(out)
    kf = k.permute(0, 2, 1, 3).float()
    assert torch.allclose(deq["k"], kf, atol=float(out["k_scale"].max()) * 0.51)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_round_trip_error(layout):
    B, H, Sq, Sk = 2, 3, 300, 211
    q, k, v = _qkv(B, H, Sq, Sk, seed=21, k_bias=4.0, layout=layout)
    out = reference_quantize_sage(q, k, v, layout=layout)
    deq = dequantize_sage(out)
    qf, kf, vf = (_bhsd(x, layout).float() for x in (q, k, v))
    qs = torch.repeat_interleave(out["q_scale"], 32, 2)[:, :, :Sq, None]
    assert torch.all((deq["q"] - qf).abs() <= qs * 0.5 * (1 + 1e-5))
    ks = torch.repeat_interleave(out["k_scale"], 64, 2)[:, :, :Sk, None]
    assert torch.all((deq["k"] - kf).abs() <= ks * 0.5 * (1 + 1e-5) + 1e-6)
    # FP8: relative half step, or half the smallest subnormal step (2^-9) scaled
    vs = out["v_scale"][:, :, None, :]
    bound = torch.maximum(vf.abs() * FP8_MAX_REL_HALF_STEP, vs * 2.0**-10) * (1 + 1e-5)
    assert torch.all((deq["v"] - vf).abs() <= bound)
    # sanity of overall accuracy
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(deq["q"], qf) < 0.02 and rel(deq["k"], kf) < 0.02 and rel(deq["v"], vf) < 0.04


def test_k_smoothing_reduces_error_on_biased_k():
    q, k, v = _qkv(1, 2, 64, 512, seed=31, k_bias=8.0)
    out = reference_quantize_sage(q, k, v)
    kf = k.permute(0, 2, 1, 3).float()
    smooth = dequantize_sage(out)["k"]
    plain = reference_quantize_sage(q, k, v, k_mean=torch.zeros(1, 2, 128))
    plain_k = dequantize_sage(plain)["k"]
    err_s = float((smooth - kf).norm())
    err_p = float((plain_k - kf).norm())
    assert err_s < err_p / 2, (err_s, err_p)


def test_rejects_bad_input():
    q, k, v = _qkv(1, 1, 8, 8, seed=1)
    with pytest.raises(ValueError, match="layout must be 'BSHD' or 'BHSD', got 'BSDH'"):
        reference_quantize_sage(q, k, v, layout="BSDH")
    with pytest.raises(ValueError, match="q must have head dim 128, got 64"):
        reference_quantize_sage(q[..., :64], k, v)
    with pytest.raises(ValueError, match="k, v must have the same shape"):
        reference_quantize_sage(q, k, v[:, :4])
