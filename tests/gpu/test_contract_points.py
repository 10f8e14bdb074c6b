"""Each point of the plan / call contract (README "Plan contract") on the GPU, every served mode
(issue 21). CPU twins of the reference side: tests/cpu/test_contract_reference.py.

* Sq < 64, and Sk shorter than one key block (Sk = 33 with 128-key blocks);
* finite or NaN data sitting past Sk (and past Sq) in a strided view never affects the output;
* a row whose listed ids are all invalid gives exact zeros (counts and topk plans);
* strided BHSD views (the sm_90a kernels' BHSD path with non-contiguous sequence strides);
* ``out=`` with a real plan, eager, BHSD and BSHD, ``out`` with gaps between rows (gaps untouched);
* ``topk=0`` gives exact zeros; ``check_plan=True`` with 128-key blocks accepts the valid ids and
  rejects an id that is valid only in 64-key units, before anything is written.

Public API only (``sparse_attention``, ``quantize_sage``, ``reference``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

import subblock_sage  # noqa: E402
from subblock_sage.reference import reference_sparse_attention  # noqa: E402

from tests.helpers import accuracy as acc  # noqa: E402
from tests.helpers.served import MODES, need_mode  # noqa: E402


def _randn(*shape, seed, bias=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if bias:
        x = x + bias * torch.randn(shape[-1], generator=g)
    return x.to(torch.bfloat16).cuda()


def _check(mode, got, q, k, v, idx, counts=None, *, topk=None, bk=64, layout="BSHD", what="", scale=None):
    """Per-block bounds vs float64 (and for Sage vs its dequantized operands). With fewer than 32
    rows the per-channel gain (a ratio over the rows) is not meaningful and is left out."""
    Sq = q.shape[1] if layout == "BSHD" else q.shape[2]
    relax = (lambda b: dataclasses.replace(b, channel_gain=math.inf)) if Sq < 32 else (lambda b: b)
    ref = reference_sparse_attention(q, k, v, idx, counts, topk=topk, block_size_k=bk, layout=layout,
                                     softmax_scale=scale)
    acc.check_attention(got, ref, relax(acc.BOUNDS[mode]), layout, what=f"{what} vs float64")
    if mode == "sage_fp8":
        quant = subblock_sage.quantize_sage(q, k, v, layout=layout)
        dref = acc.dequantized_reference(quant, idx, counts, topk=topk, block_size_k=bk, layout=layout,
                                         softmax_scale=scale)
        acc.check_attention(got, dref, relax(acc.DEQUANT_BOUNDS), layout, what=f"{what} vs dequantized")


# ---------------------------------------------------------------------------------------------
# Short sequences


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("Sq,Sk,bk", [(33, 33, 128), (1, 33, 128), (63, 33, 64), (17, 100, 128),
                                      (50, 129, 128), (64, 127, 128)])
def test_short_sequences(mode, Sq, Sk, bk):
    """Sq < 64 (one partial query block) and Sk shorter than one key block: every row attends to
    the one partial key block (plus skipped junk), then a second row layout with counts."""
    need_mode(mode)
    B, H = 2, 3
    q, k, v = _randn(B, Sq, H, 128, seed=Sq), _randn(B, Sk, H, 128, seed=Sk, bias=2.0), _randn(B, Sk, H, 128, seed=7)
    gk = -(-Sk // bk)
    idx = torch.tensor([gk - 1, -1, gk, 0], dtype=torch.int32).expand(B, H, 1, 4).contiguous().cuda()
    got = subblock_sage.sparse_attention(q, k, v, idx, None, topk=3, block_size_k=bk, compute_mode=mode)
    torch.cuda.synchronize()
    _check(mode, got, q, k, v, idx, topk=3, bk=bk, what=f"{mode} Sq{Sq} Sk{Sk} bk{bk} topk")
    counts = torch.tensor([[[4], [1], [0]], [[2], [4], [1]]], dtype=torch.int32).cuda()
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode=mode)
    torch.cuda.synchronize()
    _check(mode, got, q, k, v, idx, counts, bk=bk, what=f"{mode} Sq{Sq} Sk{Sk} bk{bk} counts")
    assert bool((got[0, :, 2] == 0).all())  # counts[0, 2] = 0


# ---------------------------------------------------------------------------------------------
# Data past Sk / Sq in strided views


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("fill", [float("nan"), 1.0e4])
def test_data_past_sk_does_not_affect_output(mode, layout, fill):
    """q/k/v are views into larger buffers whose rows past Sq / Sk hold NaN or huge finite values;
    every key block of the plan (the partial last one included) is listed. The output must equal,
    bit for bit, the output on contiguous copies, and match the reference."""
    need_mode(mode)
    B, H, Sq, Sk, extra = 2, 3, 150, 200, 72
    for bk in (64, 128):
        bufs = []
        for S, seed in ((Sq, 1), (Sk, 2), (Sk, 3)):
            shape = (B, S + extra, H, 128) if layout == "BSHD" else (B, H, S + extra, 128)
            buf = _randn(*shape, seed=seed, bias=2.0 if seed == 2 else 0.0)
            if layout == "BSHD":
                buf[:, S:] = fill
                bufs.append(buf[:, :S])
            else:
                buf[:, :, S:] = fill
                bufs.append(buf[:, :, :S])
        q, k, v = bufs
        assert not k.is_contiguous()
        gq, gk = -(-Sq // 64), -(-Sk // bk)
        idx = torch.arange(gk, dtype=torch.int32).flip(0).expand(B, H, gq, gk).contiguous().cuda()
        kw = dict(block_size_k=bk, compute_mode=mode, layout=layout)
        got = subblock_sage.sparse_attention(q, k, v, idx, None, **kw)
        clean = subblock_sage.sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), idx, None, **kw)
        torch.cuda.synchronize()
        assert bool(torch.isfinite(got.float()).all())
        assert torch.equal(got, clean), f"bk{bk}: data past Sk/Sq changed the output"
        _check(mode, got, q.contiguous(), k.contiguous(), v.contiguous(), idx, bk=bk, layout=layout,
               what=f"{mode} {layout} bk{bk} fill {fill}")


# ---------------------------------------------------------------------------------------------
# Rows whose listed ids are all invalid


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bk", [64, 128])
def test_row_with_only_invalid_ids_is_exact_zeros(mode, bk):
    need_mode(mode)
    B, H, Sq, Sk = 1, 2, 300, 333
    q, k, v = _randn(B, Sq, H, 128, seed=1), _randn(B, Sk, H, 128, seed=2, bias=2.0), _randn(B, Sk, H, 128, seed=3)
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    g = torch.Generator().manual_seed(4)
    idx = torch.stack([torch.randperm(gk, generator=g)[:3] for _ in range(B * H * gq)]).view(B, H, gq, 3).int()
    idx[0, 1, 2] = torch.tensor([-1, gk, gk + 7], dtype=torch.int32)  # all invalid
    idx[0, 0, 4] = torch.tensor([-(2**31), 2**31 - 1, -5], dtype=torch.int32)  # the partial last query block
    idx = idx.cuda()
    counts = torch.full((B, H, gq), 3, dtype=torch.int32, device="cuda")
    for name, cnt, topk in (("counts", counts, None), ("topk", None, 3)):
        out = torch.full_like(q, float("nan"))
        got = subblock_sage.sparse_attention(q, k, v, idx, cnt, topk=topk, block_size_k=bk, compute_mode=mode,
                                             out=out)
        torch.cuda.synchronize()
        assert got.data_ptr() == out.data_ptr()
        assert bool((got[0, 128:192, 1] == 0).all()), name
        assert bool((got[0, 256:300, 0] == 0).all()), name
        _check(mode, got, q, k, v, idx, cnt, topk=topk, bk=bk, what=f"{mode} bk{bk} {name}")


# ---------------------------------------------------------------------------------------------
# Strided BHSD


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("storage", ["packed_head_dim", "bshd_storage"])
def test_strided_bhsd_views(mode, storage):
    """BHSD views that are not contiguous: slices of a packed [B, H, S, 3*128] tensor (sequence
    stride 384) and permuted views of BSHD storage (head stride 128, sequence stride 3*H*128)."""
    need_mode(mode)
    B, H, S = 2, 3, 333
    if storage == "packed_head_dim":
        x = _randn(B, H, S, 3 * 128, seed=5)
        x[..., 128:256] += 2.0  # K bias
        q, k, v = (x[..., i * 128:(i + 1) * 128] for i in range(3))
    else:
        x = _randn(B, S, 3, H, 128, seed=6)
        x[:, :, 1] += 2.0
        q, k, v = (x[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    assert not q.is_contiguous() and q.shape == (B, H, S, 128)
    for bk in (64, 128):
        gq, gk = -(-S // 64), -(-S // bk)
        g = torch.Generator().manual_seed(bk)
        cap = min(4, gk)
        idx = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(B * H * gq)]).view(B, H, gq, cap)
        idx = idx.int().cuda()
        counts = torch.randint(0, cap + 1, (B, H, gq), generator=g).int().cuda()
        got = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode=mode, layout="BHSD")
        torch.cuda.synchronize()
        assert got.shape == q.shape
        _check(mode, got, q, k, v, idx, counts, bk=bk, layout="BHSD", what=f"{mode} {storage} bk{bk}")
        contiguous = subblock_sage.sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), idx, counts,
                                                    block_size_k=bk, compute_mode=mode, layout="BHSD")
        assert torch.equal(got, contiguous)


# ---------------------------------------------------------------------------------------------
# out= with gaps


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["BHSD", "BSHD"])
def test_out_with_gaps_between_rows(mode, layout):
    """Eager call, real plan (random counts, an empty row), ``out`` a view with gaps between its
    rows: every row is written, the gaps are not."""
    need_mode(mode)
    B, H, Sq, Sk, bk = 2, 3, 300, 500, 64
    shape = (lambda S: (B, S, H, 128)) if layout == "BSHD" else (lambda S: (B, H, S, 128))
    q, k, v = _randn(*shape(Sq), seed=8), _randn(*shape(Sk), seed=9, bias=2.0), _randn(*shape(Sk), seed=10)
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    g = torch.Generator().manual_seed(11)
    idx = torch.stack([torch.randperm(gk, generator=g)[:5] for _ in range(B * H * gq)]).view(B, H, gq, 5).int().cuda()
    counts = torch.randint(0, 6, (B, H, gq), generator=g).int()
    counts[0, 0, 0] = 0
    counts = counts.cuda()
    sentinel = 7.0
    if layout == "BHSD":
        buf = torch.full((B, H, Sq, 192), sentinel, dtype=torch.bfloat16, device="cuda")  # 64 unused columns per row
        out, gaps = buf[..., :128], buf[..., 128:]
    else:
        buf = torch.full((B, Sq, H + 1, 128), sentinel, dtype=torch.bfloat16, device="cuda")  # one unused head slot
        out, gaps = buf[:, :, :H], buf[:, :, H:]
    assert not out.is_contiguous()
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, compute_mode=mode, layout=layout, out=out)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr() and got.stride() == out.stride()
    assert bool((gaps == sentinel).all()), "the gaps between out's rows were written"
    _check(mode, out, q, k, v, idx, counts, bk=bk, layout=layout, what=f"{mode} {layout} out with gaps")
    fresh = subblock_sage.sparse_attention(q, k, v, idx, counts, compute_mode=mode, layout=layout)
    assert torch.equal(out, fresh)


# ---------------------------------------------------------------------------------------------
# topk = 0 and check_plan with 128-key blocks


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bk", [64, 128])
def test_topk_zero_gives_exact_zeros(mode, bk):
    need_mode(mode)
    B, H, Sq, Sk = 1, 2, 200, 300
    q, k, v = _randn(B, Sq, H, 128, seed=12), _randn(B, Sk, H, 128, seed=13), _randn(B, Sk, H, 128, seed=14)
    gq = -(-Sq // 64)
    idx = torch.zeros(B, H, gq, 2, dtype=torch.int32, device="cuda")
    for check_plan in (False, True):
        out = torch.full_like(q, float("nan"))
        got = subblock_sage.sparse_attention(q, k, v, idx, None, topk=0, block_size_k=bk, compute_mode=mode,
                                             out=out, check_plan=check_plan)
        torch.cuda.synchronize()
        assert bool((got == 0).all()), f"check_plan={check_plan}"


@pytest.mark.parametrize("mode", MODES)
def test_check_plan_with_128_key_blocks(mode):
    """Sk = 300: 3 key blocks of 128 (5 of 64). check_plan=True accepts ids 0..2 (same output as
    without the check) and rejects a live id 3 (valid only in 64-key units) before anything is
    written; a dead slot (past the row's count) holding 3 is not an error."""
    need_mode(mode)
    B, H, Sq, Sk, bk = 1, 2, 200, 300, 128
    q, k, v = _randn(B, Sq, H, 128, seed=15), _randn(B, Sk, H, 128, seed=16, bias=2.0), _randn(B, Sk, H, 128, seed=17)
    gq = -(-Sq // 64)
    g = torch.Generator().manual_seed(18)
    idx = torch.stack([torch.randperm(3, generator=g) for _ in range(B * H * gq)]).view(B, H, gq, 3).int()
    idx = torch.cat([idx, torch.full((B, H, gq, 1), 3, dtype=torch.int32)], dim=-1).cuda()  # slot 3: dead
    counts = torch.randint(1, 4, (B, H, gq), generator=g).int().cuda()
    kw = dict(block_size_k=bk, compute_mode=mode)
    checked = subblock_sage.sparse_attention(q, k, v, idx, counts, check_plan=True, **kw)
    unchecked = subblock_sage.sparse_attention(q, k, v, idx, counts, **kw)
    torch.cuda.synchronize()
    assert torch.equal(checked, unchecked)
    _check(mode, checked, q, k, v, idx, counts, bk=bk, what=f"{mode} check_plan bk128")
    # topk plan through the same check
    checked = subblock_sage.sparse_attention(q, k, v, idx, None, topk=3, check_plan=True, **kw)
    torch.cuda.synchronize()
    _check(mode, checked, q, k, v, idx, topk=3, bk=bk, what=f"{mode} check_plan topk bk128")
    bad = idx.clone()
    bad[0, 1, 2, 0] = 3  # live (counts >= 1)
    out = torch.full_like(q, 7.0)
    msg = (r"q2k_block_index\[0, 1, 2, 0\] = 3 is outside \[0, 3\) "
           r"\(ceil\(Sk/block_size_k\) = ceil\(300/128\)\)")
    with pytest.raises(ValueError, match=msg):
        subblock_sage.sparse_attention(q, k, v, bad, counts, check_plan=True, out=out, **kw)
    with pytest.raises(ValueError, match=msg):
        subblock_sage.sparse_attention(q, k, v, bad, None, topk=3, check_plan=True, out=out, **kw)
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "out was written for a refused plan"
    # the same id in 64-key units is valid
    subblock_sage.sparse_attention(q, k, v, bad, counts, check_plan=True, block_size_k=64, compute_mode=mode)
