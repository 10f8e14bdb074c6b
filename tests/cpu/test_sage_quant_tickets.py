"""The ticket roles of the Sage quantizer's launch 2 (``aot.kernels.sage_quant.ticket_role``, the
very function the kernel traces on its integers): every Q tile and every K/V ticket exactly once,
K/V tickets in ticket order (the kernel's deadlock-freedom argument rests on it), Q tiles in order
and one in every Q_EVERY tickets while both last. Pure arithmetic: no DSL, no GPU. (The twelfth
session's bug, Q tiles past the interleave never written when Sq >> Sk, broke the first
property.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aot.contract import sage_kv_units
from aot.kernels.sage_quant import Q_EVERY, Q_ROWS, kv_tickets, kv_unit, ticket_role


def _roles(n_kv: int, n_q: int):
    return [ticket_role(t, n_kv, n_q) for t in range(n_kv + n_q)]


def _check(n_kv: int, n_q: int):
    roles = _roles(n_kv, n_q)
    assert all(is_q in (0, 1) for is_q, _, _ in roles)
    assert [i for is_q, i, _ in roles if is_q] == list(range(n_q))
    assert [tk for is_q, _, tk in roles if not is_q] == list(range(n_kv))
    m = min(n_q, n_kv // (Q_EVERY - 1))
    assert [is_q for is_q, _, _ in roles[:Q_EVERY * m]] == ([0] * (Q_EVERY - 1) + [1]) * m


@settings(max_examples=300, deadline=None)
@given(n_kv=st.integers(1, 4000), n_q=st.integers(1, 4000))
def test_roles_are_a_bijection_in_order(n_kv, n_q):
    _check(n_kv, n_q)


@pytest.mark.parametrize("B,H,Sq,Sk", [(1, 14, 37760, 37760), (1, 2, 37760, 37760), (1, 4, 8192, 8192),
                                       (1, 14, 8192, 64), (2, 7, 4096, 100), (1, 1, 1, 100000)])
def test_roles_at_the_gpu_test_and_bench_shapes(B, H, Sq, Sk):
    """The launch's counts as the kernel derives them (lag: the runtime's, units + 512)."""
    units = sage_kv_units(-(-Sk // 64))
    n_kv = kv_tickets(B * H, units, units + 512)
    n_q = -(-Sq // Q_ROWS) * B * H
    _check(n_kv, n_q)


def _kv_schedule(heads: int, nu: int, lag: int):
    """What each K/V ticket does, as the kernel derives it (``kv_unit`` on ``tk`` and ``tk - lag``):
    lists of (ticket, head, unit) for K quantize, V statistics and V quantize steps."""
    nbt = 2 * heads * nu
    k_q, v_st, v_q = [], [], []
    for tk in range(kv_tickets(heads, nu, lag)):
        if tk < nbt:
            hb, is_k, un = kv_unit(tk, nu)
            (k_q if is_k else v_st).append((tk, hb, un))
        qi = tk - lag
        if 0 <= qi < nbt:
            hb, is_k, un = kv_unit(qi, nu)
            if not is_k:
                v_q.append((tk, hb, un))
    return k_q, v_st, v_q


@settings(max_examples=300, deadline=None)
@given(heads=st.integers(1, 40), nu=st.integers(1, 700), slack=st.integers(0, 2000))
def test_every_k_and_v_unit_once_and_v_quantized_after_its_segment(heads, nu, slack):
    """Each K unit is quantized once, each V unit gives its statistics once and is quantized once,
    within the launch's tickets (the tail is trimmed to the last V quantize step), and every V
    quantize step comes at a later ticket than its segment's last statistics unit (whose CTA
    publishes the final row it waits for): no CTA waits on a later ticket."""
    lag = nu + slack  # (the kernel clamps lag to >= nu)
    k_q, v_st, v_q = _kv_schedule(heads, nu, lag)
    want = sorted((hb, un) for hb in range(heads) for un in range(nu))
    assert sorted((hb, un) for _, hb, un in k_q) == want
    assert sorted((hb, un) for _, hb, un in v_st) == want
    assert sorted((hb, un) for _, hb, un in v_q) == want
    last_stats = {}
    for tk, hb, _ in v_st:
        last_stats[hb] = max(last_stats.get(hb, -1), tk)
    assert all(tk > last_stats[hb] for tk, hb, _ in v_q)
    assert max(tk for tk, _, _ in v_q) == kv_tickets(heads, nu, lag) - 1  # no empty tail ticket


@pytest.mark.parametrize("B,H,Sk", [(1, 14, 37760), (1, 2, 37760), (1, 4, 8192), (2, 3, 77), (1, 1, 1), (3, 5, 6143)])
def test_launch_1_roles_cover_the_workspace_exactly(B, H, Sk):
    """``prep_roles`` (the one definition the grid and the kernel share): the K-mean CTAs' partial
    rows and the fill's rows are all of ``sync``'s rows, each once, the fill CTAs just cover theirs,
    so the plan CTAs start where the grid puts them (run 75: the grid and the kernel counted the
    fill differently and a plan CTA wrote past the plan's heads). A workspace too small for the
    K-mean rows gets no K-mean CTAs."""
    from aot.contract import SAGE_K_MEAN_SPLIT, SAGE_SYNC_ROW0, sage_stats_rows, sage_sync_words
    from aot.kernels.sage_quant import FILL_ROWS, HEAD_DIM, prep_roles

    words = sage_sync_words(B, H, -(-Sk // 64))
    n_km, fill_rows, n_fill = prep_roles(words, B * H)
    assert n_km == B * H * SAGE_K_MEAN_SPLIT
    assert fill_rows == B * H * sage_stats_rows(-(-Sk // 64))
    assert n_km + fill_rows == (words - SAGE_SYNC_ROW0) // HEAD_DIM
    assert (n_fill - 1) * FILL_ROWS < fill_rows <= n_fill * FILL_ROWS
    tiny = SAGE_SYNC_ROW0 + (n_km - 1) * HEAD_DIM
    assert prep_roles(tiny, B * H) == (0, 0, 0)


@settings(max_examples=200, deadline=None)
@given(heads=st.integers(1, 64), nb=st.integers(1, 3000))
def test_launch_2_reads_the_rows_launch_1_fills(heads, nb):
    """The workspace as both launches see it: launch 2's V statistics rows (``v_stats_row``, per
    head ``sage_stats_rows``) are exactly the rows launch 1 fills (``prep_roles``), its K-mean
    partial rows (``hb * SAGE_K_MEAN_SPLIT + part``) exactly the rows launch 1's K-mean CTAs write
    (CTA ``bx`` writes row ``bx``), the two disjoint, and together the whole ``sage_sync_words``."""
    from aot.contract import SAGE_K_MEAN_SPLIT, SAGE_SYNC_ROW0, sage_stats_rows, sage_sync_words
    from aot.kernels.sage_quant import HEAD_DIM, k_part_row, prep_roles, v_stats_row

    rps = sage_stats_rows(nb)
    words = sage_sync_words(1, heads, nb)
    n_km, fill_rows, _ = prep_roles(words, heads)
    filled = set(range(n_km, n_km + fill_rows))
    written = set(range(n_km))  # K-mean CTA bx writes sync row bx
    v_rows = {v_stats_row(heads, hb, rps) + r for hb in range(heads) for r in range(rps)}
    k_rows = {k_part_row(hb) + p for hb in range(heads) for p in range(SAGE_K_MEAN_SPLIT)}
    assert v_rows == filled and k_rows == written and not (filled & written)
    assert v_stats_row(heads, heads, rps) == (words - SAGE_SYNC_ROW0) // HEAD_DIM == n_km + fill_rows
