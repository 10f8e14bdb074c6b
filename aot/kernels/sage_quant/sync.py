"""The inter-CTA hand-off of the Sage quantizer through its workspace ``sync`` (the stream's own,
zeroed once and never refilled; its words: ``python/subblock_sage/contract.py``).

- The ticket counter, one 64-bit word: the tickets taken by the running launch (low half) and the
  launch's epoch (high half). A CTA's ticket orders it after every CTA that started before it,
  whatever the hardware's dispatch order; the CTA that takes the last ticket sets the count to 0
  and advances the epoch, so the next launch on the buffer starts at ticket 0.
- Statistics slots, each valid for this launch iff its tag is ``contract.sage_sync_tag(epoch)``:
  a slot is stored with one relaxed store (value and tag together) and waited for with relaxed
  loads until its tag is this launch's. No slot needs clearing between calls, and no arrival
  counter orders anything: a reader waits on exactly the slots it reads.
  K-mean slots are 64-bit ({fp32 value, tag}); V statistics slots are 32-bit (an amax of bf16
  values, whose fp32 bits end in 16 zeros that carry the tag's low 16 bits).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from aot.contract import SAGE_SYNC_KROW_WORDS, SAGE_SYNC_ROW0, SAGE_SYNC_VROW_WORDS, SAGE_SYNC_VTAG_MASK, sage_sync_v0

from aot.kernels.sage_numerics.ptx import atom_add_u64, f32, gaddr, i32, ld_slot, ld_vslot, nanosleep, st_slot, st_vslot, trap
from .spec import HI16


@cute.jit
def take_ticket(mSync: cute.Tensor, n_tickets, tidx, sFlag: cute.Tensor):
    """The CTA's ticket (the low half of the workspace's 64-bit counter, one relaxed atomic add by
    thread 0: tickets follow the order in which CTAs start) into ``sFlag[0]`` and the launch's
    slot tag (``contract.sage_sync_tag`` of the counter's high half, the epoch) into
    ``sFlag[1]``; returns the ticket. The CTA that takes the last of the ``n_tickets`` tickets
    sets the low half back to 0 and adds 1 to the epoch (one more atomic add: every other ticket
    has been taken), so the next launch on the buffer starts at ticket 0 with a new tag and finds
    no slot of this one valid: the workspace needs no filling between calls."""
    if tidx == 0:
        old = atom_add_u64(gaddr(mSync.iterator), Int64(1))
        t = Int32(old)
        if t == n_tickets - 1:
            atom_add_u64(gaddr(mSync.iterator), (Int64(1) << 32) - Int64(n_tickets))
        sFlag[0] = t
        sFlag[1] = (Int32(old >> 32) << 1) | Int32(1)
    cute.arch.sync_threads()
    return sFlag[0]


def sync_row(mSync: cute.Tensor, row):
    """The address of slot 0 of K-mean partial row ``row`` of ``sync`` (contract.py: from word
    SAGE_SYNC_ROW0, rows of 128 8-byte slots, per (b, h) SAGE_K_MEAN_SPLIT of them; 64-bit
    offsets). Slot ``c`` is ``SLOT * c`` bytes further."""
    return gaddr(mSync.iterator) + (Int64(SAGE_SYNC_ROW0) + Int64(row) * SAGE_SYNC_KROW_WORDS) * 4


def sync_vrow(mSync: cute.Tensor, heads, row):
    """The address of slot 0 of V statistics row ``row`` (from 0: head ``hb``'s rows are ``hb *
    rps ..``) of ``sync`` for ``heads = B*H`` (contract.py: from word ``sage_sync_v0(heads)``,
    rows of 128 4-byte slots). Slot ``c`` is ``VSLOT * c`` bytes further."""
    return gaddr(mSync.iterator) + (Int64(sage_sync_v0(heads)) + Int64(row) * SAGE_SYNC_VROW_WORDS) * 4


@cute.jit
def publish(addr, x, tag):
    """Store fp32 ``x`` into the K-mean slot at ``addr`` with this launch's ``tag``."""
    st_slot(addr, i32(x), tag)


@cute.jit
def wait_slot(load: cutlass.Constexpr, addr, tag):
    """The value bits of the slot at ``addr`` once this launch wrote it (``load`` gives ``(value
    bits, tag)``; the slot is valid when the tag is ``tag``): relaxed loads 64 ns apart (the
    first at once). A slot never written (a bug, not an input) traps after ~2**24 polls
    (seconds) instead of hanging the GPU."""
    bits, got = load(addr)
    polls = Int32(0)
    while got != tag:
        nanosleep(Int32(64))
        bits, got = load(addr)
        polls = polls + 1
        if polls > (1 << 24):
            trap()
    return f32(bits)


def poll(addr, tag):
    """The value of the K-mean slot at ``addr`` once this launch (tag ``tag``) wrote it."""
    return wait_slot(ld_slot, addr, tag)


def vtag(tag):
    """The V slots' tag: the low 16 bits of the launch's (odd) tag."""
    return tag & Int32(SAGE_SYNC_VTAG_MASK)


def publish_v(addr, x, tag):
    """Store the V statistic ``x`` (an amax of bf16 values: its fp32 bits end in 16 zeros, which
    carry ``vtag(tag)``) into the V slot at ``addr``."""
    st_vslot(addr, (i32(x) & Int32(HI16)) | vtag(tag))


def vslot_split(w):
    """A V slot's ``(value bits, tag)``."""
    return w & Int32(HI16), w & Int32(SAGE_SYNC_VTAG_MASK)


def _ld_vslot_split(addr):
    return vslot_split(ld_vslot(addr))


def poll_v(addr, tag):
    """The V statistic at ``addr`` once this launch wrote it (``poll`` for V slots)."""
    return wait_slot(_ld_vslot_split, addr, vtag(tag))
