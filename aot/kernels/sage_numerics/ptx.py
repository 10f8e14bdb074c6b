"""Inline PTX of the Sage quantizer, one instruction (or a short fixed sequence) per function, and
the 16-byte row accesses built on it. Each exists because the DSL's own lowering is longer or
missing: packed bf16x2 max/min (the DSL compares and selects per element), one-op
round-to-int and bf16 -> fp32 conversions, ``div.full.f32``, byte permutes, loads and stores
with an L2 cache policy, and the relaxed / acquire-release accesses of the workspace's slots
(``sync.py``).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .consts import HI16, VEC


def _asm(ret, args, text, constraints, side_effects, loc, ip):
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=side_effects, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


# ---------------------------------------------------------------- registers
@dsl_user_op
def f32(bits, *, loc=None, ip=None):
    """fp32 with the bit pattern ``bits`` (Int32)."""
    return Float32(llvm.bitcast(T.f32(), Int32(bits).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def i32(x, *, loc=None, ip=None):
    """The bit pattern of fp32 ``x`` as an Int32."""
    return Int32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def packed2(op: str, a, b, *, loc=None, ip=None):
    """One packed two-lane PTX op on 32-bit words (``max.bf16x2``, ``min.bf16x2``,
    ``max.u16x2``): the DSL lowers a bf16 max to per-element compares and selects, and
    unpacked 16-bit values each take a register."""
    return Int32(_asm(T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
                      f"{op} $0, $1, $2;", "=r,r,r", False, loc, ip))


def bf16x2(op: str, a, b):
    """``<op>.bf16x2`` on two packed pairs (``op``: max, min)."""
    return packed2(f"{op}.bf16x2", a, b)


def max_abs_bf16x2(a, b):
    """max(|a|, |b|) per bf16 lane, sign = sign(a) xor sign(b) (``max.xorsign.abs.bf16x2``): a
    running |x| max in one op per word; clear the sign bits (``& 0x7FFF7FFF``) at the end."""
    return packed2("max.xorsign.abs.bf16x2", a, b)


@dsl_user_op
def prmt(a, b, sel, *, loc=None, ip=None):
    """``prmt.b32``: byte i of the result is byte ``sel`` nibble i of the 8 bytes (a, b)."""
    return Int32(_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, sel)],
                      "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", False, loc, ip))


def lo_f32(w):
    """The low bf16 of a packed pair as fp32 (exact: its bits in the high half), one op."""
    return f32(w << 16)


def hi_f32(w):
    """The high bf16 of a packed pair as fp32, one op (the DSL's conversion takes two)."""
    return f32(w & Int32(HI16))


@dsl_user_op
def add_bf16(acc, w, hi: bool, *, loc=None, ip=None):
    """``acc + x`` (``add.rn.f32``) for x the low (``hi`` False) or high bf16 of the packed pair
    ``w``, its fp32 made by a ``prmt`` inside the same asm: a sum over rows that other code also
    unpacks (``lo_f32`` / ``hi_f32``: the K unit's quantization) then shares no unpacked value
    with it, so the rows stay 32 packed registers (the compilers would otherwise keep the 64
    unpacked fp32 values live from the sum to their other use)."""
    sel = "0x3244" if hi else "0x1044"  # bytes 2-3 (hi) or 0-1 (lo) of w, over two zero bytes
    return Float32(_asm(T.f32(), [Float32(acc).ir_value(loc=loc, ip=ip), Int32(w).ir_value(loc=loc, ip=ip)],
                        f"{{ .reg .b32 t; prmt.b32 t, $2, 0, {sel}; add.rn.f32 $0, $1, t; }}", "=f,f,r", False,
                        loc, ip))


@dsl_user_op
def rint_s32(x, *, loc=None, ip=None):
    """``cvt.rni.s32.f32``: round to nearest even and convert in one op (the DSL emits a round
    then a truncating convert)."""
    return Int32(_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.s32.f32 $0, $1;", "=r,f", False,
                      loc, ip))


@dsl_user_op
def div_full(a, b, *, loc=None, ip=None):
    """``div.full.f32`` (max 2 ulp): every division of the quantizer (scales and their inverses,
    the K mean). The IEEE division's slow-path subroutine calls spill registers at the 64 of 4
    CTAs per SM; with this one, scales stay within the contract's 1e-6 relative and a code can
    differ by one step at an exact tie."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b)],
                        "div.full.f32 $0, $1, $2;", "=f,f,f", False, loc, ip))


@dsl_user_op
def pack_s8x4(a, b, c, d, *, loc=None, ip=None):
    """The low bytes of four int32 (codes in -127..127) as one word, a in byte 0: three ``prmt``."""
    return Int32(_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
                      "{ .reg .b32 t0, t1; prmt.b32 t0, $1, $2, 0x0040; prmt.b32 t1, $3, $4, 0x0040; "
                      "prmt.b32 $0, t0, t1, 0x5410; }", "=r,r,r,r,r", False, loc, ip))


def flag(cond):
    """A staged condition as an Int32 0 / 1 (combined with ``&``)."""
    return Int32(cutlass.select_(cond, Int32(1), Int32(0)))


# ---------------------------------------------------------------- shared memory
@dsl_user_op
def st_shared(ptr, words, *, loc=None, ip=None):
    """One 8- or 16-byte ``st.shared.v{2,4}.b32`` of 2 or 4 words at the shared-memory pointer
    ``ptr``."""
    n = len(words)
    regs = ", ".join(f"${i + 1}" for i in range(n))
    addr = Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))
    _asm(None, [addr.ir_value(loc=loc, ip=ip)] + [Int32(w).ir_value(loc=loc, ip=ip) for w in words],
         f"st.shared.v{n}.b32 [$0], {{{regs}}};", "l" + ",r" * n, True, loc, ip)


@dsl_user_op
def ld_shared16(ptr, *, loc=None, ip=None):
    """One 16-byte ``ld.shared.v4.b32`` at the shared-memory pointer ``ptr``: 4 words."""
    addr = Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))
    out = _asm(llvm.StructType.get_literal([T.i32()] * 4), [addr.ir_value(loc=loc, ip=ip)],
               "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", True, loc, ip)
    return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]


# ---------------------------------------------------------------- global memory, L2 policies
@dsl_user_op
def gaddr(ptr, *, loc=None, ip=None):
    """The global address of a cute pointer (for the PTX here)."""
    return Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))


@dsl_user_op
def l2_policy(kind: str, *, loc=None, ip=None):
    """A 64-bit L2 cache policy (``createpolicy.fractional.L2::<kind>``, fraction 1.0) for the
    ``.L2::cache_hint`` accesses below: the only read of a K or V block is evict_first (last
    use), as are the quantized outputs."""
    return Int64(_asm(T.i64(), [], f"createpolicy.fractional.L2::{kind}.b64 $0, 1.0;", "=l", True, loc, ip))


@dsl_user_op
def ld16_hint(addr, pol, *, loc=None, ip=None):
    """One 16-byte global load with the L2 policy ``pol``: 4 words."""
    out = _asm(llvm.StructType.get_literal([T.i32()] * 4),
               [Int64(addr).ir_value(loc=loc, ip=ip), Int64(pol).ir_value(loc=loc, ip=ip)],
               "ld.global.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5;", "=r,=r,=r,=r,l,l", False, loc, ip)
    return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld16_hint_or0(addr, pol, ok, *, loc=None, ip=None):
    """``ld16_hint`` if ``ok`` (Int32 0 / 1), else four zero words without an access."""
    out = _asm(llvm.StructType.get_literal([T.i32()] * 4),
               [Int64(addr).ir_value(loc=loc, ip=ip), Int64(pol).ir_value(loc=loc, ip=ip),
                Int32(ok).ir_value(loc=loc, ip=ip)],
               "{ .reg .pred p; setp.ne.b32 p, $6, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
               "mov.b32 $3, 0; @p ld.global.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5; }",
               "=r,=r,=r,=r,l,l,r", False, loc, ip)
    return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def st_hint(addr, words, pol, *, loc=None, ip=None):
    """One 8- or 16-byte global store of 2 or 4 words with an L2 cache policy (the quantized
    outputs: evict_first, so that they do not push out K/V lines still to be read)."""
    n = len(words)
    regs = ", ".join(f"${i + 1}" for i in range(n))
    _asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)] + [Int32(w).ir_value(loc=loc, ip=ip) for w in words]
         + [Int64(pol).ir_value(loc=loc, ip=ip)],
         f"st.global.L2::cache_hint.v{n}.b32 [$0], {{{regs}}}, ${n + 1};", "l," + "r," * n + "l", True, loc, ip)


def row(g2d, r, cc):
    """16-byte (bf16) / 8-byte (int8) view: elements ``[cc*VEC, cc*VEC+VEC)`` of row ``r``."""
    return cute.local_tile(g2d[r, None], (VEC,), (cc,))


def load_words(g2d, r, cc, pol):
    """Elements ``[cc*VEC, cc*VEC+VEC)`` of row r (8 bf16, one 16-byte load with an L2 cache
    policy) as 4 packed-pair words: element 2p is ``lo_f32(w[p])``, 2p+1 ``hi_f32(w[p])``."""
    return ld16_hint(gaddr(row(g2d, r, cc).iterator), pol)


def load_words_or0(g2d, r, cc, pol):
    """``load_words`` for rows that may lie past the tensor: row ``r >= len`` reads as zeros (a
    predicated load: no access, no clamp, no select per element)."""
    return ld16_hint_or0(gaddr(row(g2d, r, cc).iterator), pol, flag(r < g2d.shape[0]))


# ---------------------------------------------------------------- the workspace's slots
@dsl_user_op
def atom_add_u64(addr, val, *, loc=None, ip=None):
    """``atom.relaxed.gpu.add.u64``: the old value of the workspace's counter (tickets in the low
    half, the epoch in the high half). No ordering is needed: a ticket only says when a CTA
    started, and each statistics slot carries its own validity (its tag)."""
    return Int64(_asm(T.i64(), [Int64(addr).ir_value(loc=loc, ip=ip), Int64(val).ir_value(loc=loc, ip=ip)],
                      "atom.relaxed.gpu.global.add.u64 $0, [$1], $2;", "=l,l,l", True, loc, ip))


@dsl_user_op
def ld_slot(addr, *, loc=None, ip=None):
    """``ld.relaxed.gpu.b64`` of one K-mean slot as another CTA stored it (served by L2):
    ``(value bits, tag)``. One 64-bit access: value and tag are read together."""
    out = _asm(llvm.StructType.get_literal([T.i32()] * 2), [Int64(addr).ir_value(loc=loc, ip=ip)],
               "{ .reg .b64 t; ld.relaxed.gpu.global.b64 t, [$2]; mov.b64 {$0, $1}, t; }", "=r,=r,l", True, loc, ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(2))


@dsl_user_op
def st_slot(addr, bits, tag, *, loc=None, ip=None):
    """``st.relaxed.gpu.b64``: publish one K-mean slot {value bits, tag} in one access. No fence:
    each slot carries its own validity (its tag), so no counter has to be ordered after it."""
    _asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(bits).ir_value(loc=loc, ip=ip),
                Int32(tag).ir_value(loc=loc, ip=ip)],
         "{ .reg .b64 t; mov.b64 t, {$1, $2}; st.relaxed.gpu.global.b64 [$0], t; }", "l,r,r", True, loc, ip)


@dsl_user_op
def ld_vslot(addr, *, loc=None, ip=None):
    """``ld.relaxed.gpu.b32`` of one V statistics slot as another CTA stored it (L2)."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)], "ld.relaxed.gpu.global.b32 $0, [$1];",
                      "=r,l", True, loc, ip))


@dsl_user_op
def ld_vslot_or0(addr, ok, ready, *, loc=None, ip=None):
    """``ld_vslot`` if ``ok`` (Int32 0 / 1), else ``ready`` (a ready +0) without an access."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip), Int32(ok).ir_value(loc=loc, ip=ip),
                                Int32(ready).ir_value(loc=loc, ip=ip)],
                      "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, $3; "
                      "@p ld.relaxed.gpu.global.b32 $0, [$1]; }", "=r,l,r,r", True, loc, ip))


@dsl_user_op
def st_vslot(addr, word, *, loc=None, ip=None):
    """``st.relaxed.gpu.b32``: publish one V statistics slot (value | tag16) in one access."""
    _asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(word).ir_value(loc=loc, ip=ip)],
         "st.relaxed.gpu.global.b32 [$0], $1;", "l,r", True, loc, ip)


@dsl_user_op
def fence_gpu(*, loc=None, ip=None):
    """``fence.acq_rel.gpu``: with a relaxed store after it, a release of everything this CTA
    wrote before (a ``bar.sync`` first gathers the other threads' writes: fences are
    cumulative); with a relaxed load before it, the matching acquire. Only the V units' done
    slots use it (a redo must overwrite the unit's codes, never race with them)."""
    _asm(None, [], "fence.acq_rel.gpu;", "", True, loc, ip)


@dsl_user_op
def nanosleep(ns, *, loc=None, ip=None):
    """``nanosleep.u32``: the back-off between two polls of a slot."""
    _asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r", True, loc, ip)


@dsl_user_op
def trap(*, loc=None, ip=None):
    """``trap``: ends a launch that waits on a slot never written."""
    _asm(None, [], "trap;", "", True, loc, ip)
