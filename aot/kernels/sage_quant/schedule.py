"""The Sage quantizer's schedule (the package docstring): which CTA does what, as plain
integer functions that the kernel traces on its integers (``select`` / ``minimum`` /
``maximum``: the DSL's) and the tests run on Python ints (tests/cpu/test_sage_quant_tickets.py:
bijections in order, every unit once, every wait on an earlier ticket, the rows the kernel uses
being the workspace). No DSL import: the registry and the tests load it without one.
"""

from aot.contract import MAX_KEY_BLOCKS, SAGE_K_MEAN_SPLIT, SAGE_SYNC_VROW_WORDS, sage_sync_v0

Q_EVERY = 3  # every Q_EVERY-th ticket is a Q tile while Q tiles remain (ticket_role)


def _select_py(cond, a, b):
    return a if cond else b


def interleave(x, n_a, n_b, every, select=_select_py, minimum=min):
    """Slot ``x`` of ``n_a + n_b`` slots shared by ``n_a`` a's and ``n_b`` b's: ``(is_b, i, ia)``,
    1 and the b ``i``, or 0 and the a ``ia``. Slots ``[0, every*m)`` are periods of ``every-1`` a's
    and one b, ``m`` as many periods as both fill; then the a's left, then the b's left. Both keep
    their order. Branch-free, so that the kernel traces it on its integers (``select`` /
    ``minimum``: the DSL's) and the tests run it on Python ints (tests/cpu/test_sage_quant_tickets.py:
    a bijection, in order, for any counts); ``every >= 2``."""
    m = minimum(n_b, n_a // (every - 1))
    tail = x >= every * m
    rest = x - every * m
    a_left = n_a - (every - 1) * m
    period = x // every
    is_b = select(tail, select(rest >= a_left, 1, 0), select(x - period * every == every - 1, 1, 0))
    i = select(tail, m + rest - a_left, period)
    ia = select(tail, (every - 1) * m + rest, x - period)
    return is_b, i, ia


def ticket_role(tq, n_kv, n_q, select=_select_py, minimum=min):
    """What ticket ``tq`` of ``sage_quant_kv`` (after the K-mean tickets) does when ``n_kv`` K/V
    tickets and ``n_q`` Q tiles share the ``n_kv + n_q`` tickets: ``(is_q, i, tk)``, 1 and the Q
    tile ``i``, or 0 and the K/V ticket ``tk``: ``interleave`` with one Q tile in every Q_EVERY
    tickets while both last (Q tiles wait on nothing: they keep DRAM busy while K/V CTAs wait;
    MEASUREMENTS.md, appendix "the Sage quantizer's earlier versions"). K/V tickets keep the
    ticket order (the kernel's ordering argument rests on it)."""
    return interleave(tq, n_kv, n_q, Q_EVERY, select=select, minimum=minimum)


def plan_every(n_tickets, n_plan, maximum=max):
    """One CTA in every ``plan_every`` of the grid is a plan CTA (``interleave`` by block index):
    the plan CTAs spread over the whole launch (they wait on nothing; the K/V pass has waits to
    fill) instead of running after it (at H=14 S=37760 on the H200, 2065 plan CTAs at the grid's end
    make the quantizer 12 us longer than its K/V pass, 15 us as a launch of their own;
    MEASUREMENTS.md, 2026-12-02: "a Sage call in two launches")."""
    return maximum((n_tickets + n_plan) // maximum(n_plan, 1), 2)


def plan_rows(nkb, warps, rows, select=_select_py):
    """Plan rows per plan CTA of ``sage_quant_kv`` for ``nkb`` key blocks: the CTA's bitmap
    (``rows`` rows of ``MAX_KEY_BLOCKS`` bits: ``plan_prepare``'s shape) split over all
    ``warps`` warps when each share holds the row's key blocks (4 rows, 8 warps: ``nkb <=
    MAX_KEY_BLOCKS / 2``, every call below 2M keys at 64-key blocks), else ``rows``. Twice the
    rows per CTA halves the plan CTAs, latency-bound work that the K/V pass hides only in part
    (at 4 rows per CTA, the plan role costs the launch ~10.5 us at H=14 S=37760 on the H200;
    MEASUREMENTS.md, 2026-12-02: "a Sage call in two launches"). One definition for
    the grid and the kernel; each warp's share is ``rows * MAX_KEY_BLOCKS // result`` bits."""
    return select(nkb * warps <= MAX_KEY_BLOCKS * rows, warps, rows)


def k_part_row(hb):
    """The first of head ``hb``'s SAGE_K_MEAN_SPLIT K-mean partial rows of ``sync`` (rows from 0,
    head after head; K-mean ticket ``t`` writes row ``t``); ``k_part_row(B*H)`` is the number of
    K-mean tickets."""
    return hb * SAGE_K_MEAN_SPLIT


def sync_guard(n_words, heads, rps):
    """Whether a ``sync`` of ``n_words`` words holds the rows the kernel uses for ``heads = B*H``
    and ``rps`` V statistics rows per head (``contract.sage_sync_words``): the kernel's test
    before its ticket CTAs do anything (a smaller workspace: no work, no access out of bounds)."""
    return n_words - sage_sync_v0(heads) >= heads * rps * SAGE_SYNC_VROW_WORDS


def launch_ctas(heads, nu, n_q, n_plan):
    """``(n_tickets, grid)`` of ``sage_quant_kv``: the ticket CTAs (the K-mean partials, then the
    K/V tickets and Q tiles of ``ticket_role``) and the ``n_plan`` plan CTAs, which take no
    ticket (``plan_every``: spread over the grid by block index). One definition for the grid
    (host side) and the kernel's role boundaries: counted apart, they can disagree on a role and
    a CTA writes out of bounds."""
    n_tickets = k_part_row(heads) + kv_tickets(heads, nu) + n_q
    return n_tickets, n_tickets + n_plan


def kv_unit(x, nu):
    """Flattened unit ``x`` of ``sage_quant_kv``'s K/V work, ``nu`` units per segment: ``(hb, is_k,
    un)``, the head ``hb = b*H + h``, whether it is K (1) or V (0), the unit in its segment.
    Segments go V of a head, then K of that head: the K units (no long wait: their mean's
    partials come from the first tickets) follow the V statistics whose reductions the head's V quantize steps wait
    for. Plain integer arithmetic, so the kernel traces it and the tests run it on Python ints
    (tests/cpu/test_sage_quant_tickets.py)."""
    sg = x // nu
    hb = sg // 2
    return hb, sg - hb * 2, x - sg * nu


REDO_UNITS = 16  # V units per redo ticket (a head's units quantized again with its exact amax)


def redo_tickets(nu):
    """Redo tickets per V segment of ``nu`` units: ``ceil(nu / REDO_UNITS)``. Each checks whether
    its head's exact amax exceeds the bound its units were quantized with (almost never: then it
    only reads its head's final and sample rows) and, if so, quantizes its units again."""
    return (nu + REDO_UNITS - 1) // REDO_UNITS


def redo_ticket(r, nu):
    """Redo ticket ``r`` (from 0, after every unit's ticket): ``(hb, u0)``, the head and its first
    unit (units ``u0 .. min(u0 + REDO_UNITS, nu) - 1``)."""
    per = redo_tickets(nu)
    hb = r // per
    return hb, (r - hb * per) * REDO_UNITS


def kv_tickets(heads, nu):
    """K/V tickets of ``sage_quant_kv`` for ``heads = B*H``: every unit once (``2*heads*nu``), then
    the redo tickets (``redo_tickets`` per head). Every wait of a redo ticket is on rows that unit
    tickets (earlier ones) write."""
    return 2 * heads * nu + heads * redo_tickets(nu)


def v8_chunk(chan, j, chunks):
    """Word offset, in a V unit's staged codes (``sV8`` of ``sage_quant_kv``: HEAD_DIM rows of
    ``chunks`` 16-byte chunks, a channel's unit of codes in v_fp8's column order), of chunk ``j``
    of channel ``chan``, swizzled (``j ^ (chan / 8) % 8``) so that neither the writers of one
    store (``quantize_v_block``: 8 lanes of a quarter warp, channels 8 apart, the same chunk)
    nor the readers (``store_v_unit``: 8 lanes, one channel's 8 chunks) meet in a bank
    (tests/cpu/test_sage_quant_tickets.py)."""
    return chan * (chunks * 4) + (j ^ ((chan // 8) % 8)) * 4
