"""Inline PTX and bit helpers of the router kernels: the float32 order key the selection sorts by,
and the bf16 ``mma.sync`` of the score phase (the DSL has no warp-level m16n8k16 op)."""

from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
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
