"""Inline PTX and bit helpers of the router kernels: the float32 order key the selection sorts by,
the bf16 ``mma.sync`` of the score phase (the DSL has no warp-level m16n8k16 op) and the
``ldmatrix`` that loads its B fragments (the test library's ``router_select_ldm``)."""

from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def f32_bits(x, *, loc=None, ip=None):
    return Int32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))

def order_key(x):
    """A signed integer with the order of the float32 ``x`` (negative floats: magnitude bits
    flipped); as unsigned, ``key ^ 0x80000000``."""
    bits = f32_bits(x)
    return bits ^ ((bits >> 31) & Int32(0x7FFFFFFF))



@dsl_user_op
def mma_bf16(a, bb, c, *, loc=None, ip=None):
    """``mma.sync.m16n8k16`` bf16 x bf16 -> f32: a (4 words), bb (2 words), c (4 floats)."""
    ops = [Int32(x).ir_value(loc=loc, ip=ip) for x in (*a, *bb)] + [Float32(x).ir_value(loc=loc, ip=ip)
                                                                    for x in c]
    out = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * 4), ops,
                          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, "
                          "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                          "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", has_side_effects=False, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), out, [e], loc=loc, ip=ip)) for e in range(4)]


@dsl_user_op
def ldmatrix_x4(ptr, *, loc=None, ip=None):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: four 8 x 8 b16 matrices, 4 words per lane.
    ``ptr``: this lane's row, a 16-byte aligned shared-memory pointer; lanes 8 j .. 8 j + 7 give
    the rows 0-7 of matrix j, and lane (g, t) = (lane // 4, lane % 4) receives as word j the
    elements (g, 2 t) and (g, 2 t + 1) of matrix j (low half first), the same 32 bits a 32-bit
    load of that row's word t gives. Through the NVVM dialect's op, not inline assembly: LLVM
    knows it reads shared memory, so it stays between the barriers around the staged tile and is
    not hoisted out of the key-tile loop (its addresses are the same every tile)."""
    out = nvvm.ldmatrix(ptr.llvm_ptr, 4, nvvm.MMALayout.row,
                        results=[llvm.StructType.get_literal([T.i32()] * 4)], loc=loc, ip=ip)
    return [Int32(llvm.extractvalue(T.i32(), out, [j], loc=loc, ip=ip)) for j in range(4)]
