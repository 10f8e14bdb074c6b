"""The plan_prepare kernel (aot/kernels/plan_prepare.py) against the Python reference of its
contract, on random plans with repeats, negative and too-large ids, counts outside 0..cap, the
topk variant, the 128 -> 64 split with a partial last block, and large key-block counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

from subblock_sage import abi  # noqa: E402
from tests.helpers.plan_reference import check_prepared, prepare_reference, random_plan  # noqa: E402


# Both launches that prepare a plan: the plan kernel, and the plan role of the fused Sage launch
# (sage_quant_kv via quantize_canonical(plan_values=...)), which must give the same outputs.
VIA = ["plan_prepare", "sage_quant_kv"]


def run_kernel(index, counts, topk, nkb, split, nout, via="plan_prepare"):
    B, H, G, cap = index.shape
    dev = "cuda"
    out_idx = torch.full((B, H, G, cap * split), -77, dtype=torch.int32, device=dev)  # poison
    out_cnt = torch.full((B, H, G), -77, dtype=torch.int32, device=dev)
    summary = torch.zeros(4, dtype=torch.int32, device=dev)
    values = {"q2k_block_index": index.to(dev), "out_index": out_idx, "out_counts": out_cnt,
              "summary": summary, "num_key_blocks": nkb, "split": split, "num_out_blocks": nout}
    if counts is not None:
        values["block_counts"] = counts.to(dev)
    else:
        values["topk"] = topk
    if via == "plan_prepare":
        abi.launch("plan_prepare", {"counts": counts is not None}, values)
    else:
        from subblock_sage.ops.quantize import quantize_canonical
        from tests.helpers.gpu import qkv

        q, k, v = qkv(B, 64 * G - 5, 333, H, dev, seed=G)
        quantize_canonical(q, k, v, plan_values=values)
    torch.cuda.synchronize()
    return out_idx, out_cnt, summary.tolist()


@pytest.mark.parametrize("via", VIA)
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("use_counts", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7, 6), (1, 2, 9, 40, 37), (1, 1, 3, 100, 1000)])
def test_kernel_matches_reference(split, use_counts, shape, via):
    B, H, G, cap, nkb = shape
    g = torch.Generator().manual_seed(hash(shape) % 1000 + split)
    index, counts = random_plan(B, H, G, cap, nkb, g)
    if use_counts:
        counts[0, 0, -1] = -4  # negative
        counts[-1, 0, 0] = cap + 9  # above capacity
    topk = cap - 1
    nout = nkb * split - (1 if split == 2 else 0)  # split: the last 128-block is partial
    rows, summary = prepare_reference(index, counts if use_counts else None, topk, nkb, split, nout)
    out_idx, out_cnt, got = run_kernel(index, counts if use_counts else None, topk, nkb, split, nout, via)
    check_prepared(out_idx, out_cnt, rows)
    assert got == summary


@pytest.mark.parametrize("via", VIA)
def test_kernel_clean_plan_has_empty_summary(via):
    g = torch.Generator().manual_seed(3)
    B, H, G, nkb = 1, 4, 16, 300
    index = torch.stack([torch.randperm(nkb, generator=g)[:50] for _ in range(B * H * G)]).view(B, H, G, 50).int()
    counts = torch.randint(0, 51, (B, H, G), generator=g, dtype=torch.int32)
    rows, summary = prepare_reference(index, counts, 0, nkb, 1, nkb)
    out_idx, out_cnt, got = run_kernel(index, counts, 0, nkb, 1, nkb, via)
    check_prepared(out_idx, out_cnt, rows)
    assert got == summary == [0, 0, 0, 0]


@pytest.mark.parametrize("via", VIA)
def test_kernel_many_key_blocks(via):
    """A long row near the bitmap limit: ids spread over 60000 key blocks, many repeats."""
    g = torch.Generator().manual_seed(4)
    nkb, cap = 60000, 2000
    index = torch.randint(0, nkb, (1, 1, 2, cap), generator=g, dtype=torch.int32)
    index[..., 1000:] = index[..., :1000]  # every id of the first half repeated
    counts = torch.tensor([[[cap, 1500]]], dtype=torch.int32)
    rows, summary = prepare_reference(index, counts, 0, nkb, 1, nkb)
    out_idx, out_cnt, got = run_kernel(index, counts, 0, nkb, 1, nkb, via)
    check_prepared(out_idx, out_cnt, rows)
    assert got == summary


@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
def test_topk_call_never_syncs(mode):
    """With topk (no block_counts) and check_plan=False there is nothing to raise after the host
    checks: the call must not synchronize (CUDA sync debug mode turns a sync into an error).
    With check_plan=True the host waits on an event for the plan summary, not on the stream."""
    import subblock_sage
    from tests.helpers.gpu import qkv, random_plan
    from tests.helpers.served import need_mode

    need_mode(mode)
    q, k, v = qkv(1, 300, 333, 2, "cuda", seed=9)
    idx, cnt = random_plan(1, 2, 300, 333, 4, "cuda", seed=9)
    subblock_sage.sparse_attention(q, k, v, idx, None, topk=3, compute_mode=mode)  # warm-up: loads
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = subblock_sage.sparse_attention(q, k, v, idx, None, topk=3, compute_mode=mode)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    from subblock_sage.reference import reference_sparse_attention
    from tests.helpers.gpu import compare

    compare(out, reference_sparse_attention(q, k, v, idx, topk=3), mode)  # and the result is right
    # check_plan=True reads the summary: it waits on an event for the plan kernel, which is not a
    # stream synchronization either (the attention kernel of the previous call keeps running),
    # and refuses bad counts (the default call never waits: tests/gpu/test_replay_gpu.py)
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, check_plan=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    compare(out, reference_sparse_attention(q, k, v, idx, cnt), mode)
    bad = cnt.clone()
    bad[0, 1, 0] = 5  # capacity 4
    with pytest.raises(ValueError, match=r"block_counts values must be in 0..capacity \(4\)"):
        subblock_sage.sparse_attention(q, k, v, idx, bad, compute_mode=mode, check_plan=True)


@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
def test_topk_plan_with_check_plan_raises_on_bad_ids(mode):
    """topk plan (no counts) + check_plan=True: an id out of range among the first topk entries
    raises and names it; one past topk is never read."""
    import subblock_sage
    from tests.helpers.gpu import qkv, random_plan
    from tests.helpers.served import need_mode

    need_mode(mode)
    q, k, v = qkv(1, 200, 300, 2, "cuda", seed=4)
    idx, _ = random_plan(1, 2, 200, 300, 4, "cuda", seed=4)
    idx[0, 1, 2, 1] = 99  # ceil(300/64) = 5 key blocks
    with pytest.raises(ValueError, match=r"q2k_block_index\[0, 1, 2, 1\] = 99 is outside \[0, 5\)"):
        subblock_sage.sparse_attention(q, k, v, idx, None, topk=2, compute_mode=mode, check_plan=True)
    subblock_sage.sparse_attention(q, k, v, idx, None, topk=1, compute_mode=mode, check_plan=True)
    torch.cuda.synchronize()


@pytest.mark.parametrize("mode", ["sage_fp8", "bf16"])
@pytest.mark.parametrize("block_size_k", [64, 128])
def test_attention_does_not_depend_on_the_callers_order(mode, block_size_k):
    """The prepared rows are ascending whatever the caller's order (aot/kernels/plan_prepare.py),
    so a plan whose rows are permuted, or that lists a block twice, gives the same output bit for
    bit. With the caller's order kept it differed in rounding (the online softmax and the FP8
    P.V accumulate in plan order), which is what makes this test fail on such a build."""
    import subblock_sage
    from subblock_sage.reference import reference_sparse_attention
    from tests.helpers.gpu import compare, qkv, random_plan
    from tests.helpers.served import need_mode

    need_mode(mode)
    B, H, Sq, Sk, cap = 1, 2, 300, 2000, 12
    q, k, v = qkv(B, Sq, Sk, H, "cuda", seed=21)
    idx, _ = random_plan(B, H, Sq, Sk, cap, "cuda", seed=21, block_size_k=block_size_k, with_counts=False)
    g = torch.Generator(device="cuda").manual_seed(5)
    perm = torch.rand(idx.shape, generator=g, device="cuda").argsort(dim=-1)
    shuffled = idx.gather(-1, perm).contiguous()
    repeated = torch.cat([shuffled, shuffled[..., :3]], dim=-1).contiguous()  # three ids listed twice
    kw = dict(block_size_k=block_size_k, compute_mode=mode)
    out = subblock_sage.sparse_attention(q, k, v, idx, None, topk=cap, **kw)
    compare(out, reference_sparse_attention(q, k, v, idx, topk=cap, block_size_k=block_size_k), mode)
    assert torch.equal(subblock_sage.sparse_attention(q, k, v, shuffled, None, topk=cap, **kw), out)
    assert torch.equal(subblock_sage.sparse_attention(q, k, v, repeated, None, topk=cap + 3, **kw), out)
