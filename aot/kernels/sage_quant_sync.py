"""The cross-CTA words of the Sage quantizer's workspace (``sync``; contract and why:
``python/subblock_sage/contract.py`` and ``aot/kernels/sage_quant.py``): the ticket counter with
the launch's epoch, the K-mean slots ({value, tag}, 64 bits) and the V statistics slots (a
bf16-exact value with a 16-bit tag, 32 bits), their addresses, stores and polls. A module of its
own so that each stays one concern (tests/cpu/test_contract.py: modules of ~600 lines at most);
``sage_quant_roles`` builds on it.
"""

from functools import cache
from types import SimpleNamespace


def _build_device():
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64

    from aot.contract import (SAGE_SYNC_KROW_WORDS, SAGE_SYNC_ROW0, SAGE_SYNC_VROW_WORDS, SAGE_SYNC_VTAG_MASK,
                              sage_sync_v0)
    from aot.kernels.sage_quant import HI16

    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    SLOT = 8  # bytes per K-mean slot of sync: {fp32 value, tag}
    VSLOT = 4  # bytes per V statistics slot: bf16-exact fp32 value with the tag's low 16 bits
    VROW_BYTES = SAGE_SYNC_VROW_WORDS * 4  # bytes per V statistics row (128 slots)

    @dsl_user_op
    def _f32(bits, *, loc=None, ip=None):
        return Float32(llvm.bitcast(T.f32(), Int32(bits).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))

    @dsl_user_op
    def _i32(x, *, loc=None, ip=None):
        return Int32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))

    @dsl_user_op
    def gaddr(ptr, *, loc=None, ip=None):
        """The global address of a cute pointer (for the PTX below)."""
        return Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))

    @dsl_user_op
    def atom_add_u64(addr, val, *, loc=None, ip=None):
        """``atom.relaxed.gpu.add.u64``: the old value of the workspace's counter (tickets in the
        low half, the epoch in the high half). No ordering is needed: a ticket only says when a
        CTA started, and each statistics slot carries its own validity (its tag)."""
        return Int64(llvm.inline_asm(T.i64(), [Int64(addr).ir_value(loc=loc, ip=ip), Int64(val).ir_value(loc=loc, ip=ip)],
                                     "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;", "=l,l,l",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def ld_slot(addr, *, loc=None, ip=None):
        """``ld.relaxed.gpu.b64`` of one statistics slot as another CTA stored it (served by L2):
        ``(value bits, tag)``. One 64-bit access: value and tag are read together."""
        out = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 2), [Int64(addr).ir_value(loc=loc, ip=ip)],
                              "{ .reg .b64 t; ld.relaxed.gpu.global.b64 t, [$2]; mov.b64 {$0, $1}, t; }", "=r,=r,l",
                              has_side_effects=True, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return tuple(Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(2))

    @dsl_user_op
    def st_slot(addr, bits, tag, *, loc=None, ip=None):
        """``st.relaxed.gpu.b64``: publish one statistics slot {value bits, tag} in one access. No
        fence: each slot carries its own validity (its tag), so no counter has to be ordered
        after it."""
        llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(bits).ir_value(loc=loc, ip=ip),
                               Int32(tag).ir_value(loc=loc, ip=ip)],
                        "{ .reg .b64 t; mov.b64 t, {$1, $2}; st.relaxed.gpu.global.b64 [$0], t; }", "l,r,r",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                        loc=loc, ip=ip)

    @dsl_user_op
    def ld_vslot(addr, *, loc=None, ip=None):
        """``ld.relaxed.gpu.b32`` of one V statistics slot as another CTA stored it (L2)."""
        return Int32(llvm.inline_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                                     "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def ld_vslot_or0(addr, ok, ready, *, loc=None, ip=None):
        """``ld_vslot`` if ``ok`` (Int32 0 / 1), else ``ready`` (a ready +0) without an access."""
        return Int32(llvm.inline_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip), Int32(ok).ir_value(loc=loc, ip=ip),
                                               Int32(ready).ir_value(loc=loc, ip=ip)],
                                     "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, $3; "
                                     "@p ld.relaxed.gpu.global.b32 $0, [$1]; }", "=r,l,r,r",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def st_vslot(addr, word, *, loc=None, ip=None):
        """``st.relaxed.gpu.b32``: publish one V statistics slot (value | tag16) in one access."""
        llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(word).ir_value(loc=loc, ip=ip)],
                        "st.relaxed.gpu.global.b32 [$0], $1;", "l,r", has_side_effects=True,
                        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    @dsl_user_op
    def fence_gpu(*, loc=None, ip=None):
        """``fence.acq_rel.gpu``: with a relaxed store after it, a release of everything this CTA
        wrote before (a ``bar.sync`` first gathers the other threads' writes: fences are
        cumulative); with a relaxed load before it, the matching acquire. Only the V units'
        done slots use it (``sage_quant_kv``: a redo must overwrite the unit's codes, never race
        with them)."""
        llvm.inline_asm(None, [], "fence.acq_rel.gpu;", "", has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    @dsl_user_op
    def nanosleep(ns, *, loc=None, ip=None):
        llvm.inline_asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                        loc=loc, ip=ip)

    @dsl_user_op
    def trap(*, loc=None, ip=None):
        llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    @cute.jit
    def take_ticket(mSync: cute.Tensor, n_tickets, tidx, sFlag: cute.Tensor):
        """The CTA's ticket (the low half of the workspace's 64-bit counter, one relaxed atomic
        add by thread 0: tickets follow the order in which CTAs start) into ``sFlag[0]`` and the
        launch's slot tag (``contract.sage_sync_tag`` of the counter's high half, the epoch) into
        ``sFlag[1]``; returns the ticket. The CTA that takes the last of the ``n_tickets`` tickets
        sets the low half back to 0 and adds 1 to the epoch (one more atomic add: every other
        ticket has been taken), so the next launch on the buffer starts at ticket 0 with a new
        tag and finds no slot of this one valid: the workspace needs no filling between calls."""
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
        """The address of slot 0 of V statistics row ``row`` (from 0: head ``hb``'s rows are
        ``hb * rps ..``) of ``sync`` for ``heads = B*H`` (contract.py: from word
        ``sage_sync_v0(heads)``, rows of 128 4-byte slots). Slot ``c`` is ``VSLOT * c`` bytes
        further."""
        return gaddr(mSync.iterator) + (Int64(sage_sync_v0(heads)) + Int64(row) * SAGE_SYNC_VROW_WORDS) * 4

    @cute.jit
    def publish(addr, x, tag):
        """Store fp32 ``x`` into the K-mean slot at ``addr`` with this launch's ``tag``."""
        st_slot(addr, _i32(x), tag)

    @cute.jit
    def _wait(load: cutlass.Constexpr, addr, tag):
        """The value bits of the slot at ``addr`` once this launch wrote it (``load`` gives
        ``(value bits, tag)``; the slot is valid when the tag is ``tag``): relaxed loads 64 ns
        apart (the first at once). A slot never written (a bug, not an input) traps after ~2**24
        polls (seconds) instead of hanging the GPU."""
        bits, got = load(addr)
        polls = Int32(0)
        while got != tag:
            nanosleep(Int32(64))
            bits, got = load(addr)
            polls = polls + 1
            if polls > (1 << 24):
                trap()
        return _f32(bits)

    def poll(addr, tag):
        """The value of the K-mean slot at ``addr`` once this launch (tag ``tag``) wrote it."""
        return _wait(ld_slot, addr, tag)

    def vtag(tag):
        """The V slots' tag: the low 16 bits of the launch's (odd) tag."""
        return tag & Int32(SAGE_SYNC_VTAG_MASK)

    def publish_v(addr, x, tag):
        """Store the V statistic ``x`` (an amax of bf16 values: its fp32 bits end in 16 zeros,
        which carry ``vtag(tag)``) into the V slot at ``addr``."""
        st_vslot(addr, (_i32(x) & Int32(HI16)) | vtag(tag))

    def vslot_split(w):
        """A V slot's ``(value bits, tag)``."""
        return w & Int32(HI16), w & Int32(SAGE_SYNC_VTAG_MASK)

    def _ld_vslot_split(addr):
        return vslot_split(ld_vslot(addr))

    def poll_v(addr, tag):
        """The V statistic at ``addr`` once this launch wrote it (``poll`` for V slots)."""
        return _wait(_ld_vslot_split, addr, vtag(tag))

    return SimpleNamespace(SLOT=SLOT, VSLOT=VSLOT, VROW_BYTES=VROW_BYTES, f32=_f32, i32=_i32, gaddr=gaddr,
                           ld_vslot=ld_vslot, ld_vslot_or0=ld_vslot_or0, fence_gpu=fence_gpu, take_ticket=take_ticket, sync_row=sync_row,
                           sync_vrow=sync_vrow, publish=publish, poll=poll, vtag=vtag, publish_v=publish_v,
                           poll_v=poll_v, vslot_split=vslot_split, ld_slot=ld_slot)


@cache
def device_fns():
    """The workspace's device functions, built on first use (the DSL is imported lazily)."""
    return _build_device()
