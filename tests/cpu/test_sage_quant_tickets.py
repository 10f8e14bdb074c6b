"""The Sage quantizer's schedule (``aot.kernels.sage_quant.schedule``, the very functions the
kernel traces on its integers). Ticket roles: every Q tile and every K/V ticket exactly once (Q
tiles past the interleave go unwritten when Sq >> Sk if this breaks), K/V tickets in ticket order
(the kernel's deadlock-freedom argument rests on it), Q tiles in order and one in every Q_EVERY
tickets while both last. Also the grid, the workspace's rows, the plan rows and the staged V
codes. Pure arithmetic: no DSL, no GPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aot.contract import sage_kv_units
from aot.kernels.sage_quant.schedule import (Q_EVERY, REDO_UNITS, interleave, kv_tickets, kv_unit, plan_every,
                                             redo_ticket, ticket_role)
from aot.kernels.sage_quant.spec import Q_ROWS


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


@settings(max_examples=300, deadline=None)
@given(n_a=st.integers(0, 3000), n_b=st.integers(0, 3000), every=st.integers(2, 40))
def test_interleave_is_a_bijection_in_order(n_a, n_b, every):
    """``interleave`` (the plan CTAs among the ticket CTAs, the Q tiles among the K/V tickets):
    every a and every b once, each in order, one b per ``every`` slots while both last."""
    roles = [interleave(x, n_a, n_b, every) for x in range(n_a + n_b)]
    assert [i for is_b, i, _ in roles if is_b] == list(range(n_b))
    assert [ia for is_b, _, ia in roles if not is_b] == list(range(n_a))
    m = min(n_b, n_a // (every - 1))
    assert [is_b for is_b, _, _ in roles[:every * m]] == ([0] * (every - 1) + [1]) * m


@pytest.mark.parametrize("B,H,Sq,Sk", [(1, 14, 37760, 37760), (1, 2, 37760, 37760), (1, 4, 8192, 8192),
                                       (1, 14, 8192, 64), (2, 7, 4096, 100), (1, 1, 1, 100000)])
def test_roles_at_the_gpu_test_and_bench_shapes(B, H, Sq, Sk):
    """The launch's counts as the kernel derives them."""
    units = sage_kv_units(-(-Sk // 64))
    n_kv = kv_tickets(B * H, units)
    n_q = -(-Sq // Q_ROWS) * B * H
    _check(n_kv, n_q)


def _kv_schedule(heads: int, nu: int):
    """What each K/V ticket does, as the kernel derives it (``kv_unit`` on the unit tickets,
    ``redo_ticket`` on the rest): lists of (ticket, head, unit) for K units, V units and the V
    units each redo ticket covers."""
    nbt = 2 * heads * nu
    k_q, v_q, redo = [], [], []
    for tk in range(kv_tickets(heads, nu)):
        if tk < nbt:
            hb, is_k, un = kv_unit(tk, nu)
            (k_q if is_k else v_q).append((tk, hb, un))
        else:
            hb, u0 = redo_ticket(tk - nbt, nu)
            redo += [(tk, hb, un) for un in range(u0, min(u0 + REDO_UNITS, nu))]
    return k_q, v_q, redo


@settings(max_examples=300, deadline=None)
@given(heads=st.integers(1, 40), nu=st.integers(1, 700))
def test_every_k_and_v_unit_once_and_each_v_unit_redone_after_its_segment(heads, nu):
    """Each K unit and each V unit is one ticket; each V unit is covered by exactly one redo
    ticket, which comes after every unit of its segment (the final row and the done slots it
    waits for are earlier tickets' work: no CTA waits on a later ticket), and no redo ticket is
    empty."""
    k_q, v_q, redo = _kv_schedule(heads, nu)
    want = sorted((hb, un) for hb in range(heads) for un in range(nu))
    assert sorted((hb, un) for _, hb, un in k_q) == want
    assert sorted((hb, un) for _, hb, un in v_q) == want
    assert sorted((hb, un) for _, hb, un in redo) == want
    last_v = {}
    for tk, hb, _ in v_q:
        last_v[hb] = max(last_v.get(hb, -1), tk)
    assert all(tk > last_v[hb] for tk, hb, _ in redo)
    assert {tk for tk, _, _ in redo} == set(range(2 * heads * nu, kv_tickets(heads, nu)))


@pytest.mark.parametrize("B,H,Sq,Sk,n_plan", [(1, 14, 37760, 37760, 2065), (1, 2, 0, 37760, 295),
                                              (1, 4, 8192, 8192, 0), (2, 3, 77, 77, 6), (1, 1, 1, 1, 1)])
def test_the_grid_holds_the_tickets_and_the_plan_ctas(B, H, Sq, Sk, n_plan):
    """``launch_ctas`` (the one definition the grid and the kernel share): the K-mean tickets
    (SAGE_K_MEAN_SPLIT per head, ticket t writing sync row t), the K/V tickets and Q tiles of
    ``ticket_role``, and the plan CTAs, which take no ticket; the kernel gives the K/V tickets
    what is left after the K-mean tickets and Q tiles (a grid and a kernel that counted one role
    differently would let a CTA write out of bounds). Every K unit's partial rows come from
    earlier tickets (the K-mean tickets come first), so its waits end. The block indices of the
    plan CTAs (``interleave`` by ``plan_every``) are spread over the whole grid: each plan CTA
    once, exactly ``n_tickets`` ticket CTAs."""
    from aot.contract import SAGE_K_MEAN_SPLIT
    from aot.kernels.sage_quant.schedule import k_part_row, launch_ctas

    heads, nu = B * H, sage_kv_units(-(-Sk // 64))
    n_q = -(-Sq // Q_ROWS) * heads
    n_tickets, grid = launch_ctas(heads, nu, n_q, n_plan)
    n_km = k_part_row(heads)
    assert n_km == heads * SAGE_K_MEAN_SPLIT and grid == n_tickets + n_plan
    n_kv = n_tickets - n_km - n_q  # as the kernel derives it
    assert n_kv == kv_tickets(heads, nu)
    every = plan_every(n_tickets, n_plan)
    roles = [interleave(bx, n_tickets, n_plan, every) for bx in range(grid)]
    assert [i for is_plan, i, _ in roles if is_plan] == list(range(n_plan))
    assert [ia for is_plan, _, ia in roles if not is_plan] == list(range(n_tickets))
    plan_bx = [bx for bx, (is_plan, _, _) in enumerate(roles) if is_plan]
    if 0 < n_plan <= n_tickets:  # spread: the last of every `every` CTAs, as long as there are plan CTAs
        assert plan_bx == [every * i + every - 1 for i in range(n_plan)] and every * n_plan <= grid < (every + 1) * n_plan
    rows = [k_part_row(t // SAGE_K_MEAN_SPLIT) + t % SAGE_K_MEAN_SPLIT for t in range(n_km)]
    assert rows == list(range(n_km))
    for tr in range(n_kv + n_q):
        is_q, _, tk = ticket_role(tr, n_kv, n_q)
        if not is_q and tk < 2 * heads * nu:
            hb, _, _ = kv_unit(tk, nu)
            # a K unit waits on rows k_part_row(hb).., a V unit on its head's sample rows, which
            # K-mean ticket k_part_row(hb) + p writes: tickets < n_km
            assert k_part_row(hb) + SAGE_K_MEAN_SPLIT - 1 < n_km <= n_km + tr


@settings(max_examples=200, deadline=None)
@given(heads=st.integers(1, 64), nb=st.integers(1, 3000))
def test_the_rows_the_kernel_uses_are_the_workspace(heads, nb):
    """The workspace as the kernel sees it: after the counter the K-mean partial rows
    (``k_part_row``: SAGE_K_MEAN_SPLIT per head, 128 slots of 8 bytes), from
    ``sage_sync_v0`` the V statistics rows (head ``hb``'s are ``hb * rps ..``, 128 slots of 4
    bytes), together exactly ``sage_sync_words``; the kernel's size guard (``sync_guard``) passes
    for that workspace and refuses one word less (its ticket CTAs then do nothing rather than
    write past the buffer)."""
    from aot.contract import (SAGE_K_MEAN_SPLIT, SAGE_SYNC_KROW_WORDS, SAGE_SYNC_ROW0, SAGE_SYNC_VROW_WORDS,
                              sage_stats_rows, sage_sync_v0, sage_sync_words)
    from aot.contract import HEAD_DIM
    from aot.kernels.sage_quant.schedule import k_part_row, sync_guard

    assert SAGE_SYNC_KROW_WORDS == 2 * HEAD_DIM and SAGE_SYNC_VROW_WORDS == HEAD_DIM
    assert SAGE_SYNC_ROW0 % 4 == 0  # 16-byte aligned rows, 8-byte aligned slots and counter
    rps = sage_stats_rows(nb)
    words = sage_sync_words(1, heads, nb)
    k_rows = sorted(k_part_row(hb) + p for hb in range(heads) for p in range(SAGE_K_MEAN_SPLIT))
    assert k_rows == list(range(heads * SAGE_K_MEAN_SPLIT))
    v0 = sage_sync_v0(heads)
    assert v0 == SAGE_SYNC_ROW0 + len(k_rows) * SAGE_SYNC_KROW_WORDS
    v_rows = sorted(hb * rps + r for hb in range(heads) for r in range(rps))
    assert v_rows == list(range(heads * rps)) and words == v0 + len(v_rows) * SAGE_SYNC_VROW_WORDS
    assert sync_guard(words, heads, rps) and not sync_guard(words - 1, heads, rps)
    # one segment's rows (sage_v_rows): units, groups, final, the sample partials, the done
    # slots (one per unit, 128 per row), in that order, exactly rps
    from aot.contract import SAGE_STATS_GROUP, sage_v_rows

    nu = sage_kv_units(nb)
    group0, final, sample0, done0, total = sage_v_rows(nu)
    assert (group0, final - group0) == (nu, -(-nu // SAGE_STATS_GROUP)) and sample0 == final + 1
    assert done0 == sample0 + SAGE_K_MEAN_SPLIT and total == rps
    assert (total - done0) * SAGE_SYNC_VROW_WORDS >= nu > (total - done0 - 1) * SAGE_SYNC_VROW_WORDS


@settings(max_examples=300, deadline=None)
@given(epoch=st.integers(0, (1 << 32) - 1), later=st.integers(1, (1 << 15) - 1))
def test_slot_tags_tell_launches_apart(epoch, later):
    """``contract.sage_sync_tag``: odd (a zeroed slot is never valid), and so are its low 16 bits
    (the V slots' tag); both differ for any two epochs less than 2**15 apart, and the runtime
    zeroes a stream's buffer every SAGE_SYNC_EPOCHS launches, inside that."""
    from aot.contract import SAGE_SYNC_EPOCHS, SAGE_SYNC_VTAG_MASK as M, sage_sync_tag

    a, b = sage_sync_tag(epoch), sage_sync_tag((epoch + later) % (1 << 32))
    assert M == 0xFFFF and a % 2 == 1 and 0 < a < 1 << 32 and (a & M) % 2 == 1
    assert a != b and (a & M) != (b & M)
    assert SAGE_SYNC_EPOCHS < 1 << 15


@settings(max_examples=200, deadline=None)
@given(bits=st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=64))
def test_v_statistics_are_bf16_exact(bits):
    """A V slot keeps only the high 16 bits of its fp32 value (the low 16 carry the tag): exact
    because every V statistic is an amax |V| over bf16 values (max.xorsign.abs.bf16x2, widened
    by a shift, then fmax), so its fp32 bits end in 16 zeros, NaN and inf included."""
    import struct

    def f32_of_bf16(b):
        return struct.unpack("<f", struct.pack("<I", (b & 0x7FFF) << 16))[0]  # |x| widened

    m = 0.0
    for b in bits:
        x = f32_of_bf16(b)
        m = x if x != x or m != m else max(m, x)  # (NaN-carrying max, like fmax or not)
    assert struct.unpack("<I", struct.pack("<f", m))[0] & 0xFFFF == 0


@pytest.mark.parametrize("nkb", [1, 295, 590, 32767, 32768, 32769, 65536])
def test_plan_rows_fit_the_bitmap(nkb):
    """``plan_rows``: 8 plan rows per CTA (all warps) while 1/8 of the 32 KiB bitmap holds a row's
    key blocks, 4 above (the plan kernel's shape); each warp's share of the bitmap always holds
    the row (an id past it would count as out of range), up to MAX_KEY_BLOCKS."""
    from aot.contract import MAX_KEY_BLOCKS
    from aot.kernels import plan_prepare
    from aot.kernels.sage_quant.schedule import plan_rows
    from aot.kernels.sage_quant.spec import KV_THREADS, PLAN_ROWS

    rows = plan_rows(nkb, KV_THREADS // 32, PLAN_ROWS)
    assert rows == (8 if nkb <= MAX_KEY_BLOCKS // 2 else 4) and rows <= KV_THREADS // 32
    assert PLAN_ROWS * plan_prepare.WORDS // rows * 32 >= nkb


def _banks(word_offset):
    """The four 4-byte banks (of 32) a 16-byte shared-memory access at ``word_offset`` covers."""
    return {(word_offset + i) % 32 for i in range(4)}


def test_staged_v_codes_are_a_bijection_without_bank_conflicts():
    """``v8_chunk`` (the staged V codes of sage_quant_kv): every (channel, chunk) has its own
    16-byte place in the tile, and the 8 lanes of a quarter warp (one 16-byte access phase) meet
    in no bank, both as quantize_v_block writes (lanes cc = 0..7 / 8..15 of a store: channels
    8*cc + 4*upper + c, the same chunk) and as store_v_unit reads (8 lanes: one channel's chunks)."""
    from aot.kernels.sage_quant.schedule import v8_chunk
    from aot.kernels.sage_quant.spec import HEAD_DIM, KV_THREADS, V8_CHUNKS

    places = {v8_chunk(c, j, V8_CHUNKS) for c in range(HEAD_DIM) for j in range(V8_CHUNKS)}
    assert len(places) == HEAD_DIM * V8_CHUNKS
    assert places == {4 * i for i in range(HEAD_DIM * V8_CHUNKS)}
    for j in range(V8_CHUNKS):
        for upper in range(2):
            for c in range(4):
                for cc0 in (0, 8):
                    banks = [_banks(v8_chunk(8 * cc + 4 * upper + c, j, V8_CHUNKS)) for cc in range(cc0, cc0 + 8)]
                    assert len(set().union(*banks)) == 32, (j, upper, c, cc0)
    for k in range(HEAD_DIM * V8_CHUNKS // KV_THREADS):
        for t0 in range(0, KV_THREADS, 8):
            idx = [k * KV_THREADS + t for t in range(t0, t0 + 8)]
            banks = [_banks(v8_chunk(i // V8_CHUNKS, i % V8_CHUNKS, V8_CHUNKS)) for i in idx]
            assert len(set().union(*banks)) == 32, (k, t0)
