"""CPU tests of the router's float64 reference (reference.py) against a direct evaluation of the
method (router_spec.py) written as loops over tokens, cells and blocks."""

import math

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.reference import (  # noqa: E402
    ROUTER_TIE_ATOL,
    reference_block_scores,
    reference_route,
    reference_router_pool,
    reference_router_select,
    router_plan_differences,
)
from subblock_sage.router_spec import (  # noqa: E402
    DEFAULT_GRANULARITY,
    LOG2E,
    ROUTER_N_VALUES,
    default_n_k,
    num_cells,
    router_budget,
    valid_cells,
)


def _x(B, S, H, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, H, 128, generator=g) * scale).to(torch.bfloat16)


def _naive_cells(x, b, h, block, n, scale):
    """Cells of (b, h) token by token: the mean of the real tokens, times scale, bf16-rounded;
    None for a cell without a real token."""
    S = x.shape[1]
    sub = block // n
    out = []
    for c in range(-(-S // block) * n):
        rows = [x[b, t, h].double() for t in range(c * sub, (c + 1) * sub) if t < S]
        if not rows:
            out.append(None)
            continue
        mean = sum(rows[1:], rows[0]) / len(rows)
        out.append((mean * scale).to(torch.bfloat16).double())
    return out


def _naive_scores(q, k, n_q, n_k, bk, softmax_scale):
    B, Sq, H, _ = q.shape
    gq, gk = -(-Sq // 64), -(-k.shape[1] // bk)
    s = torch.empty(B, H, gq, gk, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            qc = _naive_cells(q, b, h, 64, n_q, softmax_scale * LOG2E)
            kc = _naive_cells(k, b, h, bk, n_k, 1.0)
            for i in range(gq):
                for j in range(gk):
                    terms = [float(qc[i * n_q + a] @ kc[j * n_k + c]) for a in range(n_q) for c in range(n_k)
                             if qc[i * n_q + a] is not None and kc[j * n_k + c] is not None]
                    m = max(terms)
                    s[b, h, i, j] = (m + math.log2(math.fsum(2.0 ** (t - m) for t in terms))) * math.log(2)
    return s


def _naive_select(scores, topk):
    B, H, gq, gk = scores.shape
    idx = torch.zeros(B, H, gq, topk, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                row = scores[b, h, i].tolist()
                best = sorted(range(gk), key=lambda j: (-row[j], j))[:topk]
                idx[b, h, i] = torch.tensor(sorted(best), dtype=torch.int32)
    return idx


def test_budget_formula():
    # SGLang's: min(Gk, max(1, ceil(ceil((1 - s) Gk) / g)) g)
    assert router_budget(590, 0.75, 8) == 152
    assert router_budget(590, 0.75, 1) == 148
    assert router_budget(10, 0.0, 8) == 10
    assert router_budget(10, 0.99, 8) == 8
    assert router_budget(1, 0.5, 8) == 1
    assert router_budget(100, 0.999, 1) == 1
    for gk in (1, 7, 64, 295, 590):
        for s in (0.0, 0.3, 0.75, 0.9, 0.999):
            for g in (1, 8):
                t = router_budget(gk, s, g)
                assert 1 <= t <= gk and (t == gk or t % g == 0)
                assert t >= min(gk, math.ceil((1 - s) * gk))
    assert DEFAULT_GRANULARITY == {64: 8, 128: 1}
    assert default_n_k(64) == 4 and default_n_k(128) == 8


def test_cell_counts():
    assert num_cells(100, 64, 4) == 8 and valid_cells(100, 16) == 7
    assert num_cells(128, 128, 8) == 8 and valid_cells(128, 16) == 8
    assert valid_cells(1, 8) == 1


@pytest.mark.parametrize("S,block,n", [(1, 64, 4), (63, 64, 8), (64, 64, 1), (100, 128, 8), (130, 64, 2),
                                       (129, 128, 4)])
def test_pool_matches_token_loop(S, block, n):
    x = _x(2, S, 3, seed=S * 7 + n)
    got = reference_router_pool(x, block // n, block=block, scale=0.37)
    assert got.shape == (2, 3, num_cells(S, block, n), 128) and got.dtype == torch.float64
    for b in range(2):
        for h in range(3):
            cells = _naive_cells(x, b, h, block, n, 0.37)
            for c, want in enumerate(cells):
                if want is None:
                    assert bool((got[b, h, c] == 0).all())
                else:
                    assert torch.equal(got[b, h, c], want)


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("n_q", ROUTER_N_VALUES)
@pytest.mark.parametrize("n_k", ROUTER_N_VALUES)
def test_scores_match_direct_formula(bk, n_q, n_k):
    # ragged: neither length a multiple of a block, nor (for n = 8) of a cell
    Sq, Sk = 64 * 2 + 37, bk * 2 + 29
    q = _x(1, Sq, 2, seed=n_q * 10 + n_k + bk, scale=2.0)
    k = _x(1, Sk, 2, seed=n_q * 10 + n_k + bk + 1)
    got = reference_block_scores(q, k, n_q=n_q, n_k=n_k, block_size_k=bk, softmax_scale=0.2)
    want = _naive_scores(q, k, n_q, n_k, bk, 0.2)
    assert got.shape == want.shape == (1, 2, 3, 3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_padding_cells_are_left_out_not_zero():
    # one real key in the last block: its score is that one cell's dot products, not diluted by
    # exp(0) terms of the empty cells
    q = _x(1, 64, 1, seed=3)
    k = _x(1, 65, 1, seed=4)
    s = reference_block_scores(q, k, n_q=1, n_k=4, block_size_k=64, softmax_scale=0.1)
    qc = reference_router_pool(q, 64, block=64, scale=0.1 * LOG2E)[0, 0, 0]
    kc = reference_router_pool(k, 16, block=64)[0, 0, 4]
    assert math.isclose(float(s[0, 0, 0, 1]), float(qc @ kc) * math.log(2), rel_tol=1e-12)


def test_default_softmax_scale_and_layouts():
    q, k = _x(1, 100, 2, seed=5), _x(1, 150, 2, seed=6)
    a = reference_block_scores(q, k)
    b = reference_block_scores(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), layout="BHSD",
                               softmax_scale=128 ** -0.5)
    assert torch.equal(a, b)


@pytest.mark.parametrize("g", [1, 8])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.75, 0.95])
def test_select_matches_sorted_loop(g, sparsity):
    gen = torch.Generator().manual_seed(int(sparsity * 100) + g)
    scores = torch.randn(2, 2, 5, 37, generator=gen, dtype=torch.float64)
    scores[0, 0, 0, 10:20] = 0.5  # exact ties: lower ids win
    topk = router_budget(37, sparsity, g)
    idx, cnt = reference_router_select(scores, topk)
    assert idx.shape == (2, 2, 5, topk) and idx.dtype == torch.int32
    assert bool((cnt == topk).all())
    assert torch.equal(idx, _naive_select(scores, topk))


def test_select_ties_go_to_lower_ids():
    scores = torch.zeros(1, 1, 1, 16, dtype=torch.float64)
    idx, _ = reference_router_select(scores, 5)
    assert idx.flatten().tolist() == [0, 1, 2, 3, 4]


def test_dense_rows():
    gen = torch.Generator().manual_seed(9)
    scores = torch.randn(1, 2, 4, 20, generator=gen, dtype=torch.float64)
    dense = torch.tensor([False, True, False, True])
    idx, cnt = reference_router_select(scores, 8, dense)
    assert idx.shape == (1, 2, 4, 20)
    assert cnt[0, :, 1].tolist() == [20, 20] and cnt[0, :, 0].tolist() == [8, 8]
    assert idx[0, 1, 3].tolist() == list(range(20))
    routed = _naive_select(scores, 8)
    assert torch.equal(idx[0, :, 0, :8], routed[0, :, 0]) and bool((idx[0, :, 0, 8:] == 0).all())


def test_route_end_to_end_matches_loops():
    q, k = _x(1, 200, 2, seed=11, scale=3.0), _x(1, 333, 2, seed=12)
    idx, cnt, scores, topk = reference_route(q, k, sparsity=0.6, softmax_scale=0.15)
    assert topk == router_budget(6, 0.6, 8) == 6 and cnt.shape == (1, 2, 4)
    want = _naive_scores(q, k, 4, 4, 64, 0.15)
    torch.testing.assert_close(scores, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(idx, _naive_select(want, topk))


def test_empty_and_bad_inputs_rejected():
    q = _x(1, 0, 1, seed=1)
    with pytest.raises(ValueError, match="sequence length must be positive"):
        reference_router_pool(q, 16, block=64)
    with pytest.raises(ValueError, match="topk must be in 1..4"):
        reference_router_select(torch.zeros(1, 1, 1, 4), 0)
    with pytest.raises(ValueError, match="topk must be in 1..4"):
        reference_router_select(torch.zeros(1, 1, 1, 4), 5)
    with pytest.raises(ValueError, match="must divide the block size"):
        reference_router_pool(_x(1, 4, 1, seed=1), 24, block=64)


# ---- the "same blocks" helper


def test_plan_differences_identical_and_ties():
    gen = torch.Generator().manual_seed(21)
    scores = torch.randn(1, 1, 3, 12, generator=gen, dtype=torch.float64)
    scores[0, 0, 1, 3] = scores[0, 0, 1, 7] = 5.0  # tie for the last place of a 1-block row
    idx, cnt = reference_router_select(scores, 1)
    same = router_plan_differences(idx, cnt, idx, cnt, scores)
    assert same["bad"] == [] and same["differing_rows"] == 0
    other = idx.clone()
    other[0, 0, 1, 0] = 7  # the other tied block
    d = router_plan_differences(idx, cnt, other, cnt, scores)
    assert d["bad"] == [] and d["differing_rows"] == 1


def test_plan_differences_flags_real_differences():
    scores = torch.arange(10, dtype=torch.float64).view(1, 1, 1, 10)
    idx, cnt = reference_router_select(scores, 3)
    assert idx.flatten().tolist() == [7, 8, 9]
    near = scores.clone()
    near[..., 6] = 7.0 - ROUTER_TIE_ATOL / 2  # within tolerance of the threshold 7
    swapped = torch.tensor([6, 8, 9], dtype=torch.int32).view(1, 1, 1, 3)
    assert router_plan_differences(idx, cnt, swapped, cnt, near)["bad"] == []
    d = router_plan_differences(idx, cnt, swapped, cnt, scores)  # 6 is a full unit below
    assert d["bad"] == [(0, 0, 0, 6, -1.0)] and d["worst_margin"] == 1.0  # 7 is the threshold itself
    d = router_plan_differences(idx, cnt, idx, cnt + 1, scores)
    assert d["bad"] == [(0, 0, 0, None, None)]


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(Sq=st.integers(1, 150), Sk=st.integers(1, 300), n_q=st.sampled_from(ROUTER_N_VALUES),
       bk=st.sampled_from((64, 128)), n_k=st.sampled_from(ROUTER_N_VALUES),
       sparsity=st.floats(0.0, 0.99), g=st.sampled_from((1, 8)), seed=st.integers(0, 2**16))
def test_route_random_shapes(Sq, Sk, n_q, bk, n_k, sparsity, g, seed):
    q, k = _x(1, Sq, 1, seed=seed, scale=2.0), _x(1, Sk, 1, seed=seed + 1)
    idx, cnt, scores, topk = reference_route(q, k, sparsity=sparsity, n_q=n_q, n_k=n_k, block_size_k=bk,
                                             budget_granularity=g, softmax_scale=0.1)
    want = _naive_scores(q, k, n_q, n_k, bk, 0.1)
    torch.testing.assert_close(scores, want, rtol=1e-12, atol=1e-12)
    assert topk == router_budget(-(-Sk // bk), sparsity, g)
    assert torch.equal(idx, _naive_select(want, topk))
