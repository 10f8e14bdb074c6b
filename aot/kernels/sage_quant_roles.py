"""Device functions of the Sage quantizer launches (contract, sizes and why:
``aot/kernels/sage_quant.py`` and ``NOTES-sage-quant.md``): the Q tile, the K/V statistics of one
unit and their reductions (the cross-CTA ticket and statistics slots they use:
``sage_quant_sync``), the quantization of one K or V block, the 16-byte row views, the L2 cache-policy loads and stores
and the packed PTX ops. A module of its own so that each stays one concern
(tests/cpu/test_contract.py: modules of ~600 lines at most).
"""

from functools import cache
from types import SimpleNamespace


def _build_device():
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float8E4M3FN, Float32, Int32, Int64

    from aot.contract import SAGE_K_MEAN_SPLIT, SAGE_V_BOUND_MARGIN, SAGE_V_BOUND_MAX, sage_k_mean_rows
    from aot.kernels import sage_quant_sync
    from aot.kernels.sage_quant_schedule import v8_chunk
    from aot.kernels.sage_quant import (AMAX_FLOOR, HEAD_DIM, HI16, K_BLOCK, K_ROWS, KV_HALF, KV_K_WARPS, KV_THREADS, Q_GROUP,
                                       Q_ROWS, UNIT_BLOCKS, V8_CHUNKS)

    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    @dsl_user_op
    def _packed2(op: str, a, b, *, loc=None, ip=None):
        """One packed two-lane PTX op on 32-bit words (``max.bf16x2``, ``min.bf16x2``,
        ``max.u16x2``): the DSL lowers a bf16 max to per-element compares and selects, and
        unpacked 16-bit values each take a register."""
        return Int32(llvm.inline_asm(T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
                                     f"{op} $0, $1, $2;", "=r,r,r", has_side_effects=False,
                                     is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    def _bf16x2(op: str, a, b):
        return _packed2(f"{op}.bf16x2", a, b)

    def max_abs_bf16x2(a, b):
        """max(|a|, |b|) per bf16 lane, sign = sign(a) xor sign(b) (``max.xorsign.abs.bf16x2``): a
        running |x| max in one op per word; clear the sign bits (``& 0x7FFF7FFF``) at the end."""
        return _packed2("max.xorsign.abs.bf16x2", a, b)

    @dsl_user_op
    def prmt(a, b, sel, *, loc=None, ip=None):
        """``prmt.b32``: byte i of the result is byte ``sel`` nibble i of the 8 bytes (a, b)."""
        return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, sel)],
                                     "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", has_side_effects=False,
                                     is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    def lo_f32(w):
        """The low bf16 of a packed pair as fp32 (exact: its bits in the high half), one op."""
        return _f32(w << 16)

    def hi_f32(w):
        """The high bf16 of a packed pair as fp32, one op (the DSL's conversion takes two)."""
        return _f32(w & Int32(HI16))

    @dsl_user_op
    def rint_s32(x, *, loc=None, ip=None):
        """``cvt.rni.s32.f32``: round to nearest even and convert in one op (the DSL emits a
        round then a truncating convert)."""
        return Int32(llvm.inline_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.s32.f32 $0, $1;",
                                     "=r,f", has_side_effects=False, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def div_full(a, b, *, loc=None, ip=None):
        """``div.full.f32`` (max 2 ulp): every division of the quantizer kernels (scales and
        their inverses, the K mean), without the IEEE division's slow-path subroutine, whose
        calls spilled registers at the 64 of 4 CTAs/SM (twelfth session). Scales stay within
        the contract's 1e-6 relative; a code can differ by one step at an exact tie."""
        return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b)],
                                       "div.full.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False,
                                       is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def pack_s8x4(a, b, c, d, *, loc=None, ip=None):
        """The low bytes of four int32 (codes in -127..127) as one word, a in byte 0: three
        ``prmt``."""
        return Int32(llvm.inline_asm(
            T.i32(), [Int32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
            "{ .reg .b32 t0, t1; prmt.b32 t0, $1, $2, 0x0040; prmt.b32 t1, $3, $4, 0x0040; "
            "prmt.b32 $0, t0, t1, 0x5410; }", "=r,r,r,r,r", has_side_effects=False,
            is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    W = sage_quant_sync.device_fns()  # the workspace's counter and slots
    SLOT, VSLOT, VROW_BYTES = W.SLOT, W.VSLOT, W.VROW_BYTES
    _f32, _i32, gaddr, ld_slot, ld_vslot, ld_vslot_or0 = W.f32, W.i32, W.gaddr, W.ld_slot, W.ld_vslot, W.ld_vslot_or0
    publish, poll, vtag, publish_v, poll_v, vslot_split = W.publish, W.poll, W.vtag, W.publish_v, W.poll_v, W.vslot_split
    VEC = 8  # bf16 elements per 16-byte load
    NCC = HEAD_DIM // VEC  # 16 column chunks per row

    def _row(g2d, r, cc):
        # 16-byte (bf16) / 8-byte (int8) vector: elements [cc*VEC, cc*VEC+VEC) of row r
        return cute.local_tile(g2d[r, None], (VEC,), (cc,))

    # ---------------------------------------------------------------- Q role
    # One 32-row scale group of Q is quantized by two warps of 16 rows each; lane = (row parity,
    # 16-byte column chunk), 8 loads in flight (32 registers of bf16). The three steps below are
    # shared by the quantizer's Q tiles (``quantize_q_tile``, codes to global memory) and the
    # sm_90a Sage kernel that quantizes its own Q tile (``aot/kernels/sm90/flat.py``, codes to
    # shared memory), so both give the same codes and scales: one definition of the numerics.
    # Plain functions (traced inline, Python loops unroll): the caller's @cute.jit holds the
    # dynamic control flow.
    def q_rows_load(gQ, row0, cc, pol):
        """Rows ``row0 + 2*i`` (i < 8) of the (S, 128) bf16 view ``gQ``, chunk ``cc``: 8 loads in
        flight, as packed words. Rows past S load row S-1 again (the amax is unchanged; callers
        store only rows < S)."""
        S = gQ.shape[0]
        return [load_words(gQ, cutlass.min(row0 + 2 * i, S - 1), cc, pol) for i in range(Q_GROUP // 4)]

    def q_rows_amax(vals):
        """The warp's |x| max over its loads (``q_rows_load``) as bf16 bits; every lane holds it."""
        # |x| max on packed bf16 pairs (one max.xorsign.abs per word, exact), then over the
        # halves as integers (for non-negative floats the integer order is the float order)
        packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
        packed.fill(0)
        for w in vals:
            for p in range(VEC // 2):
                packed[p] = max_abs_bf16x2(packed[p], w[p])
        amax_bits = Int32(0)
        for p in range(VEC // 2):
            wp = packed[p] & Int32(0x7FFF7FFF)
            amax_bits = cutlass.max(amax_bits, cutlass.max(wp & Int32(0xFFFF), wp >> 16))
        return cute.arch.warp_reduction_max(amax_bits)

    def q_group_scale(bits_a, bits_b, group, S):
        """(scale, 1/scale) of scale group ``group`` from its two warps' amax bits: FlashInfer's
        ``max(amax, 1e-7) / 127``; a group wholly past S (pad group) gets ``1e-7 / 127``."""
        amax = _f32(cutlass.max(bits_a, bits_b) << 16)
        amax = Float32(cutlass.select_(group * Q_GROUP >= S, Float32(0.0), amax))
        amax = cute.arch.fmax(amax, Float32(AMAX_FLOOR))
        scale = div_full(amax, Float32(127.0))
        return scale, div_full(Float32(1.0), scale)

    def q_code_words(w, inv):
        """The 8 INT8 codes of one load (``rint(x / scale)``; |code| <= 127 since |x| <= amax)
        packed in 2 words, element 0 in the low byte of the first."""
        y = []
        for p in range(VEC // 2):
            y.append(rint_s32(lo_f32(w[p]) * inv))
            y.append(rint_s32(hi_f32(w[p]) * inv))
        return [pack_s8x4(y[0], y[1], y[2], y[3]), pack_s8x4(y[4], y[5], y[6], y[7])]

    @dsl_user_op
    def st_shared(ptr, words, *, loc=None, ip=None):
        """One 8- or 16-byte ``st.shared.v{2,4}.b32`` of 2 or 4 words at the shared-memory
        pointer ``ptr``."""
        n = len(words)
        regs = ", ".join(f"${i + 1}" for i in range(n))
        addr = Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))
        llvm.inline_asm(None, [addr.ir_value(loc=loc, ip=ip)] + [Int32(w).ir_value(loc=loc, ip=ip) for w in words],
                        f"st.shared.v{n}.b32 [$0], {{{regs}}};", "l" + ",r" * n, has_side_effects=True,
                        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    @dsl_user_op
    def ld_shared16(ptr, *, loc=None, ip=None):
        """One 16-byte ``ld.shared.v4.b32`` at the shared-memory pointer ``ptr``: 4 words."""
        addr = Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))
        out = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 4), [addr.ir_value(loc=loc, ip=ip)],
                              "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", has_side_effects=True,
                              is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]

    @cute.jit
    def quantize_q_tile(mQ: cute.Tensor, mQ8: cute.Tensor, mQS: cute.Tensor, b, h, tile, warp, lane,
                        sQAmax: cute.Tensor):
        """Rows ``[Q_ROWS*tile, Q_ROWS*tile + Q_ROWS)`` of Q(b, h): warps 2w and 2w+1 quantize scale
        group ``tile*4 + w`` (32 rows: 16 each). The group amax is the max of the two warps' amax
        (smem, one CTA barrier: every thread of the CTA is in this function). Q is read and
        written once: its loads and stores are evict_first, so that they do not push out K/V
        lines that the quantize pass reads again (run 38)."""
        cc = lane % NCC
        half = lane // NCC
        S = mQ.shape[1]
        gQ = mQ[b, None, h, None]
        gQ8 = mQ8[b, None, h, None]
        group = tile * (Q_ROWS // Q_GROUP) + warp // 2
        row0 = group * Q_GROUP + (warp % 2) * (Q_GROUP // 2) + half
        pol = l2_policy("evict_first")
        vals = q_rows_load(gQ, row0, cc, pol)
        amax_bits = q_rows_amax(vals)
        if lane == 0:
            sQAmax[warp] = amax_bits
        cute.arch.sync_threads()
        scale, inv = q_group_scale(sQAmax[warp], sQAmax[warp ^ 1], group, S)
        if lane == 0 and warp % 2 == 0:
            if group < mQS.shape[2]:  # the last tile may cover groups past ceil(Sq/128)*4
                mQS[b, h, group] = scale
        for i in cutlass.range_constexpr(Q_GROUP // 4):
            r = row0 + 2 * i
            if r < S:
                st_hint(gaddr(_row(gQ8, r, cc).iterator), q_code_words(vals[i], inv), pol)

    @dsl_user_op
    def l2_policy(kind: str, *, loc=None, ip=None):
        """A 64-bit L2 cache policy (``createpolicy.fractional.L2::<kind>``, fraction 1.0) for the
        ``.L2::cache_hint`` loads below: the only read of a K or V block is evict_first (last use), as are
        the quantized outputs."""
        return Int64(llvm.inline_asm(T.i64(), [], f"createpolicy.fractional.L2::{kind}.b64 $0, 1.0;", "=l",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def _ld16_hint(addr, pol, *, loc=None, ip=None):
        out = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 4),
                              [Int64(addr).ir_value(loc=loc, ip=ip), Int64(pol).ir_value(loc=loc, ip=ip)],
                              "ld.global.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5;", "=r,=r,=r,=r,l,l",
                              has_side_effects=False, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]

    @dsl_user_op
    def _ld16_hint_or0(addr, pol, ok, *, loc=None, ip=None):
        out = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 4),
                              [Int64(addr).ir_value(loc=loc, ip=ip), Int64(pol).ir_value(loc=loc, ip=ip),
                               Int32(ok).ir_value(loc=loc, ip=ip)],
                              "{ .reg .pred p; setp.ne.b32 p, $6, 0; mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; "
                              "mov.b32 $3, 0; @p ld.global.L2::cache_hint.v4.b32 {$0, $1, $2, $3}, [$4], $5; }",
                              "=r,=r,=r,=r,l,l,r", has_side_effects=False, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return [Int32(llvm.extractvalue(T.i32(), out, [i], loc=loc, ip=ip)) for i in range(4)]

    def flag(cond):
        """A staged condition as an Int32 0 / 1 (combined with ``&``)."""
        return Int32(cutlass.select_(cond, Int32(1), Int32(0)))

    def load_words_or0(g2d, r, cc, pol):
        """``load_words`` for rows that may lie past the tensor: row ``r >= len`` reads as zeros
        (a predicated load: no access, no clamp, no select per element)."""
        return _ld16_hint_or0(gaddr(_row(g2d, r, cc).iterator), pol, flag(r < g2d.shape[0]))

    def load_words(g2d, r, cc, pol):
        """Elements ``[cc*VEC, cc*VEC+VEC)`` of row r (8 bf16, one 16-byte load with an L2 cache
        policy) as 4 packed-pair words: element 2p is ``lo_f32(w[p])``, 2p+1 ``hi_f32(w[p])``."""
        return _ld16_hint(gaddr(_row(g2d, r, cc).iterator), pol)

    @dsl_user_op
    def st_hint(addr, words, pol, *, loc=None, ip=None):
        """One 8- or 16-byte global store of 2 or 4 words with an L2 cache policy (the quantized
        outputs: evict_first, so that they do not push out K/V lines still to be re-read)."""
        n = len(words)
        regs = ", ".join(f"${i + 1}" for i in range(n))
        llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)] + [Int32(w).ir_value(loc=loc, ip=ip) for w in words]
                        + [Int64(pol).ir_value(loc=loc, ip=ip)],
                        f"st.global.L2::cache_hint.v{n}.b32 [$0], {{{regs}}}, ${n + 1};", "l," + "r," * n + "l",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                        loc=loc, ip=ip)

    # ---------------------------------------------------------------- the K mean
    KM_BATCH = 8  # sampled rows in flight per thread (32 registers of bf16)

    def k_mean_rows(S):
        """``(n, stride)``: ``contract.sage_k_mean_rows`` on the kernel's integers."""
        return sage_k_mean_rows(S, minimum=cutlass.min, maximum=cutlass.max)

    @cute.jit
    def sample_part(mX: cute.Tensor, row_addr, b, h, part, tidx, lane, sRed: cute.Tensor, sFlag: cute.Tensor,
                    is_v: cutlass.Constexpr):
        """Partial ``part`` (of SAGE_K_MEAN_SPLIT) over the sample keys ``j * stride`` for ``j`` in
        ``[part*c, part*c + c)`` (c = ceil(n / SPLIT); ``contract.sage_k_mean_rows``) of (b, h),
        published as the 128 slots of a row of ``sync`` at ``row_addr`` (tag ``sFlag[1]``): for K
        (``is_v`` False) the per-channel fp32 sum (a K-mean row: ``publish``), for V the
        per-channel amax |V| (a V row: ``publish_v``; bf16-exact), from which the V units take
        their scale bound (``v_bound``). One CTA of 256 threads: thread = 16-byte channel chunk
        ``tidx % 16`` of samples ``tidx // 16 + 16*i``, KM_BATCH loads in flight (one batch at n =
        512: one DRAM round trip). Fixed order (per thread in sample order, lanes l and l^16, the
        8 warps in index order; ``sRed``: 8 x 128 fp32): the same result whatever the schedule.
        Samples past n read as zeros without an access (neutral for both)."""
        n, stride = k_mean_rows(mX.shape[1])
        c = (n + SAGE_K_MEAN_SPLIT - 1) // SAGE_K_MEAN_SPLIT
        j_end = cutlass.min(part * c + c, n)
        cc = tidx % NCC
        warp = tidx // 32
        gX = mX[b, None, h, None]
        pol = l2_policy("evict_first")
        acc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
        acc.fill(0.0)
        packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
        packed.fill(0)
        for j0 in cutlass.range(part * c + tidx // NCC, j_end, NCC * KM_BATCH, unroll=1):
            words = []
            for i in cutlass.range_constexpr(KM_BATCH):
                j = j0 + NCC * i
                words.append(_ld16_hint_or0(gaddr(_row(gX, cutlass.min(j, n - 1) * stride, cc).iterator), pol,
                                            flag(j < j_end)))
            for i in cutlass.range_constexpr(KM_BATCH):
                for p in cutlass.range_constexpr(VEC // 2):
                    if cutlass.const_expr(is_v):
                        packed[p] = max_abs_bf16x2(packed[p], words[i][p])
                    else:
                        acc[2 * p] = acc[2 * p] + lo_f32(words[i][p])
                        acc[2 * p + 1] = acc[2 * p + 1] + hi_f32(words[i][p])
        for j in cutlass.range_constexpr(VEC):
            a = acc[j]
            if cutlass.const_expr(is_v):
                wj = packed[j // 2] & Int32(0x7FFF7FFF)
                a = lo_f32(wj) if j % 2 == 0 else hi_f32(wj)
                a = cute.arch.fmax(a, cute.arch.shuffle_sync_bfly(a, offset=16))
            else:
                a = a + cute.arch.shuffle_sync_bfly(a, offset=16)
            if lane < NCC:
                sRed[warp, cc * VEC + j] = a
        cute.arch.sync_threads()
        if tidx < HEAD_DIM:
            r = Float32(0.0)
            for w in cutlass.range_constexpr(8):
                if cutlass.const_expr(is_v):
                    r = cute.arch.fmax(r, sRed[w, tidx])
                else:
                    r = r + sRed[w, tidx]
            if cutlass.const_expr(is_v):
                publish_v(row_addr + Int64(tidx * VSLOT), r, sFlag[1])
            else:
                publish(row_addr + Int64(tidx * SLOT), r, sFlag[1])

    @cute.jit
    def v_bound(sample_addr, ch, tag):
        """Channel ``ch`` of V's scale bound: ``min(SAGE_V_BOUND_MARGIN * amax, SAGE_V_BOUND_MAX)``
        of the amax over the SAGE_K_MEAN_SPLIT sampled partial rows at ``sample_addr``
        (``sample_part``, the first tickets), loaded together, only a slot not yet written polled.
        ``v_scale = v_scale_of(max(bound, amax))``: the V units quantize with ``v_scale_of(bound)``
        before the exact amax is known, right unless a key exceeds the bound (the redo tickets)."""
        slots = [ld_vslot(sample_addr + Int64(p * VROW_BYTES + ch * VSLOT)) for p in range(SAGE_K_MEAN_SPLIT)]
        acc = Float32(0.0)
        for p in cutlass.range_constexpr(SAGE_K_MEAN_SPLIT):
            bits, got = vslot_split(slots[p])
            x = _f32(bits)
            if got != vtag(tag):
                x = poll_v(sample_addr + Int64(p * VROW_BYTES + ch * VSLOT), tag)
            acc = cute.arch.fmax(acc, x)
        return cute.arch.fmin(acc * Float32(SAGE_V_BOUND_MARGIN), Float32(SAGE_V_BOUND_MAX))

    @cute.jit
    def k_mean_of_parts(parts_addr, S, ch, tag):
        """Channel ``ch`` of the K mean from the SAGE_K_MEAN_SPLIT partial rows at ``parts_addr``
        (``sample_part``, the first tickets of this launch): their sum in index order over n
        (``div.full``). The slots are loaded together (one L2 round trip) and only one not yet
        written is polled: polling them one after another cost every K unit three more round
        trips before its loads (eighteenth session, run 80: the K/V pass 1-5 % slower)."""
        n, _ = k_mean_rows(S)
        slots = [ld_slot(parts_addr + Int64((p * HEAD_DIM + ch) * SLOT)) for p in range(SAGE_K_MEAN_SPLIT)]
        acc = Float32(0.0)
        for p in cutlass.range_constexpr(SAGE_K_MEAN_SPLIT):
            x = _f32(slots[p][0])
            if slots[p][1] != tag:
                x = poll(parts_addr + Int64((p * HEAD_DIM + ch) * SLOT), tag)
            if cutlass.const_expr(p == 0):
                acc = x
            else:
                acc = acc + x
        return div_full(acc, Float32(n))

    # ---------------------------------------------------------------- K/V statistics of one unit
    def block_rows(mX: cute.Tensor, b, h, blk, tidx, pol):
        """This thread's rows of 64-key block ``blk`` of K or V (b, h): 8 rows x 16 bytes
        (channels ``8*(t%16)..+7``, rows ``64*blk + 8*(t//16)..+7``, t = tidx % 128) as 8 x 4
        packed-pair words, one 16-byte load each with L2 policy ``pol``; a row past Sk (or a
        block past NB) reads as zeros without an access. The statistics and the quantization use
        the same mapping; the quantize step issues them before it waits for the segment's
        final row (``sage_quant_kv``)."""
        t = tidx % KV_HALF
        row0 = blk * K_BLOCK + (t // NCC) * K_ROWS
        gX = mX[b, None, h, None]
        return [load_words_or0(gX, row0 + j, t % NCC, pol) for j in range(K_ROWS)]

    @cute.jit
    def v_stats_unit(vals, row_addr, tidx, lane, sRed: cute.Tensor, sFlag: cute.Tensor):
        """The statistics row of a V unit at ``row_addr`` (``publish``: one slot per channel, tag
        ``sFlag[1]``) from
        its rows ``vals`` (``block_rows``; warps 0-3 the unit's first block, warps 4-7 its
        second): per channel the amax |V| over the unit's keys (rows past Sk are zeros: neutral).
        Fixed order: per thread in key order, lanes l and l^16, then the 8 warps in index order.
        (K has no statistics since the seventeenth session: its mean comes from a key sample.)"""
        cc = tidx % KV_HALF % NCC
        warp = tidx // 32
        # |V| amax on packed bf16 pairs, one max.xorsign.abs per word (exact); the sign bits are
        # cleared once at the end
        packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
        packed.fill(0)
        for j in cutlass.range_constexpr(K_ROWS):
            for p in cutlass.range_constexpr(VEC // 2):
                packed[p] = max_abs_bf16x2(packed[p], vals[j][p])
        for j in cutlass.range_constexpr(VEC):
            wj = packed[j // 2] & Int32(0x7FFF7FFF)
            m = lo_f32(wj) if j % 2 == 0 else hi_f32(wj)
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=16))
            if lane < NCC:
                sRed[warp, cc * VEC + j] = m
        cute.arch.sync_threads()
        if tidx < KV_HALF:
            acc = Float32(0.0)
            for w in cutlass.range_constexpr(8):
                acc = cute.arch.fmax(acc, sRed[w, tidx])
            publish_v(row_addr + Int64(tidx * VSLOT), acc, sFlag[1])

    @cute.jit
    def reduce_rows(row0_addr, n, tidx, sRed: cute.Tensor, tag):
        """Per channel, the max of the ``n`` V statistics rows from ``row0_addr`` (rows VROW_BYTES
        apart), each slot waited for (``poll_v``): threads 128c..128c+127 take the c-th half of the
        rows (in index order), 8 loads in flight, then the two halves: the same result whatever
        the schedule. Valid in threads 0-127."""
        ch = tidx % HEAD_DIM
        half = tidx // KV_HALF
        n0 = (n + 1) // 2
        cnt = n0
        if half == 1:
            cnt = n - n0
        base = row0_addr + Int64(half * n0) * VROW_BYTES + Int64(ch * VSLOT)
        t16 = vtag(tag)
        acc = Float32(0.0)
        for r0 in cutlass.range(0, cnt, 8, unroll=1):
            words = []
            for i in cutlass.range_constexpr(8):
                # a row past cnt reads as a ready +0 (neutral for the amax, which is >= 0)
                words.append(ld_vslot_or0(base + Int64(r0 + i) * VROW_BYTES, flag(r0 + i < cnt), t16))
            for i in cutlass.range_constexpr(8):
                bits, got = vslot_split(words[i])
                x = _f32(bits)
                if got != t16:
                    x = poll_v(base + Int64(r0 + i) * VROW_BYTES, tag)
                acc = cute.arch.fmax(acc, x)
        sRed[half, ch] = acc
        cute.arch.sync_threads()
        res = cute.arch.fmax(sRed[0, ch], sRed[1, ch])
        cute.arch.sync_threads()  # (sRed is reused)
        return res

    # ---------------------------------------------------------------- quantize one block
    @cute.jit
    def quantize_k_block(vals, mK8, mKS, b, h, blk, S, tidx, warp, lane, sStat: cute.Tensor, sAmax: cute.Tensor, pol):
        """Block ``blk`` of K(b, h), if ``blk < NB``, from this thread's rows ``vals``
        (``block_rows``: rows past Sk are zeros): centre by ``sStat[0]`` (the K mean), amax of
        the block's valid rows, INT8 codes and ``k_scale``. One warp group (threads 0-127 or
        128-255) per block; thread = 8 rows x 8 channels. The rows stay packed bf16 (32
        registers): the amax pass takes per-channel max / min of the raw values (max(max_x - m,
        m - min_x) == max |x - m| bit for bit: fp32 subtraction is monotonic and sign-symmetric;
        a row past Sk stands in as the thread's first row, a thread without a valid row adds 0)
        and the code pass computes x - m afresh, so no centred fp32 tile is live across the
        barrier. Per element of the code pass: unpack, subtract, scale, cvt.rni, 3/4 prmt."""
        half = tidx // KV_HALF
        t = tidx % KV_HALF
        cc = t % NCC
        g = t // NCC  # 8-row group within the 64-key block
        nb = (S + K_BLOCK - 1) // K_BLOCK
        gK8 = mK8[b, None, h, None]
        if blk < nb:
            row0 = blk * K_BLOCK + g * K_ROWS
            amax = Float32(0.0)
            mean = cute.local_tile(sStat[0, None], (VEC,), (cc,)).load()
            for p in cutlass.range_constexpr(VEC // 2):
                a = vals[0][p]
                z = vals[0][p]
                for j in cutlass.range_constexpr(1, K_ROWS):
                    w = Int32(cutlass.select_(row0 + j < S, vals[j][p], vals[0][p]))
                    a = _bf16x2("max", a, w)
                    z = _bf16x2("min", z, w)
                for e in cutlass.range_constexpr(2):
                    hi = lo_f32(a) if e == 0 else hi_f32(a)
                    lo = lo_f32(z) if e == 0 else hi_f32(z)
                    m = mean[2 * p + e]
                    amax = cute.arch.fmax(amax, cute.arch.fmax(hi - m, m - lo))
            if row0 >= S:
                amax = Float32(0.0)
            amax = cute.arch.warp_reduction_max(amax)
            # the block's 4 warps meet at their warp group's named barrier (one block per warp
            # group and call: sAmax is written once per warp)
            if lane == 0:
                sAmax[warp] = amax
            if half == 0:
                cute.arch.barrier(barrier_id=1, number_of_threads=KV_HALF)
            else:
                cute.arch.barrier(barrier_id=2, number_of_threads=KV_HALF)
            amax = Float32(AMAX_FLOOR)
            for w in cutlass.range_constexpr(KV_K_WARPS):
                amax = cute.arch.fmax(amax, sAmax[half * (KV_K_WARPS) + w])
            scale = div_full(amax, Float32(127.0))
            inv = div_full(Float32(1.0), scale)
            if t == 0:
                if blk < mKS.shape[2]:
                    mKS[b, h, blk] = scale
            for j in cutlass.range_constexpr(K_ROWS):
                r = row0 + j
                if r < S:
                    # the mean from shared memory per row: 8 registers fewer across this loop (the
                    # kernel is at its 64-register bound)
                    mean = cute.local_tile(sStat[0, None], (VEC,), (cc,)).load()
                    mv = [mean[i] for i in range(VEC)]
                    y = []
                    for p in cutlass.range_constexpr(VEC // 2):
                        y.append(rint_s32((lo_f32(vals[j][p]) - mv[2 * p]) * inv))
                        y.append(rint_s32((hi_f32(vals[j][p]) - mv[2 * p + 1]) * inv))
                    st_hint(gaddr(_row(gK8, r, cc).iterator),
                            [pack_s8x4(y[0], y[1], y[2], y[3]), pack_s8x4(y[4], y[5], y[6], y[7])], pol)

    @cute.jit
    def quantize_v_block(vals, sV8: cute.Tensor, blk, S, tidx, lane, sStat: cute.Tensor):
        """Block ``blk`` of V(b, h), if ``blk < NB``, from this thread's rows ``vals``
        (``block_rows``: a token past Sk is +0, so its fp8 byte is 0x00: 0 * inv = +0, inv > 0):
        FP8 per channel (``sStat[1]``: 1 / v_scale), transposed, 16-token permutation (layout:
        ``aot/kernels/sage_quant.py``). Thread = 8 consecutive tokens x 8 channels; lanes l and
        l^16 hold the two token octets of one 16-token group. Each converts its token pairs into
        packed fp8 pairs (cvt.rn.satfinite.e4m3x2), then the pair swaps half of them with its
        partner (8 shuffles) so that each holds 4 whole 16-byte v_fp8 rows: PERM16 puts the
        pairs of a row in the order lo0 hi0 lo1 hi1 lo2 hi2 lo3 hi3 (lo: tokens 0-7, hi: tokens
        8-15); one prmt per output word, its selector set by the lane's half. The rows go to the
        unit's staging area ``sV8`` (``v8_chunk``), which ``store_v_unit`` writes out a whole
        channel line at a time after a barrier: written straight from here, each store of a warp
        touched 32 channels' 16 bytes, 1024 half-sector L2 requests per unit (run 100: the
        K/V pass's 4.8 M write requests, 4.2 M of them V's, at 78 % of the L2's throughput)."""
        t = tidx % KV_HALF
        cc = t % NCC
        o = t // NCC  # token octet within the 64-key block
        upper = o % 2  # tokens 8-15 of their 16-token group (lanes 16-31)
        nb = (S + K_BLOCK - 1) // K_BLOCK
        four = cute.make_rmem_tensor(cute.make_layout((4,)), Int32)
        if blk < nb:
            mine = []  # [wi][c]: fp8 codes of tokens 4wi..4wi+3, channel c, as one word
            for wi in cutlass.range_constexpr(2):
                mine.append([])
                for c in cutlass.range_constexpr(VEC):
                    for e in cutlass.range_constexpr(4):
                        w = vals[4 * wi + e][c // 2]
                        four[e] = (w << 16) if c % 2 == 0 else (w & Int32(HI16))
                    # 1 / scale of the channel from shared memory at its use (the kernel is at its
                    # 64-register bound)
                    y = (four.load().bitcast(Float32) * sStat[1, cc * VEC + c]).to(Float8E4M3FN)
                    mine[wi].append(y.bitcast(Int32)[0])
            sel_a = Int32(cutlass.select_(upper == 1, Int32(0x1054), Int32(0x5410)))
            sel_b = Int32(cutlass.select_(upper == 1, Int32(0x3276), Int32(0x7632)))
            row = cute.make_rmem_tensor(cute.make_layout((4,)), Int32)
            # the lower lane writes channels 0-3 of its chunk, the upper lane 4-7
            for c in cutlass.range_constexpr(VEC // 2):
                for wi in cutlass.range_constexpr(2):
                    k0 = mine[wi][c]
                    k1 = mine[wi][c + VEC // 2]
                    send = Int32(cutlass.select_(upper == 1, k0, k1))
                    kw = Int32(cutlass.select_(upper == 1, k1, k0))
                    got = cute.arch.shuffle_sync_bfly(send, offset=16)
                    # row words 2wi, 2wi+1: (lo pair 2wi, hi pair 2wi), (lo 2wi+1, hi 2wi+1)
                    row[2 * wi] = prmt(kw, got, sel_a)
                    row[2 * wi + 1] = prmt(kw, got, sel_b)
                chan = cc * VEC + upper * (VEC // 2) + c
                st_shared(sV8.iterator + v8_chunk(chan, (blk % UNIT_BLOCKS) * 4 + o // 2, V8_CHUNKS),
                            [row[0], row[1], row[2], row[3]])

    @cute.jit
    def store_v_unit(sV8: cute.Tensor, mV8, b, h, un, S, tidx, pol):
        """The staged codes of V unit ``un`` of (b, h) (``quantize_v_block``, after a barrier) to
        v_fp8: 8 lanes per channel line (the unit's UNIT_BLOCKS * 64 columns), 16 bytes each, so
        that a warp's store is 4 channels' whole lines. Blocks past NB, and any past the output's
        extent (a too-small output; the runtime passes NB*64), are not written."""
        nb = (S + K_BLOCK - 1) // K_BLOCK
        gV8 = mV8[b, h, None, None]
        for k in cutlass.range(HEAD_DIM * V8_CHUNKS // KV_THREADS, unroll=1):  # (unrolled: sm_120a spilled 8 B)
            idx = k * KV_THREADS + tidx
            chan = idx // V8_CHUNKS
            j = idx % V8_CHUNKS
            blk = un * UNIT_BLOCKS + j // 4
            if blk < nb and (blk + 1) * K_BLOCK <= mV8.shape[3]:
                words = ld_shared16(sV8.iterator + v8_chunk(chan, j, V8_CHUNKS))
                st_hint(gaddr(cute.local_tile(gV8[chan, None], (16,), (un * V8_CHUNKS + j,)).iterator), words, pol)

    return SimpleNamespace(VEC=VEC, NCC=NCC, row=_row, bf16x2=_bf16x2, quantize_q_tile=quantize_q_tile,
                           q_rows_load=q_rows_load, q_rows_amax=q_rows_amax, q_group_scale=q_group_scale, q_code_words=q_code_words,
                           st_shared=st_shared,
                           v_stats_unit=v_stats_unit, reduce_rows=reduce_rows, sample_part=sample_part, v_bound=v_bound,
                           k_mean_of_parts=k_mean_of_parts,
                           l2_policy=l2_policy, st_hint=st_hint, gaddr=gaddr,
                           block_rows=block_rows, quantize_k_block=quantize_k_block,
                           quantize_v_block=quantize_v_block, store_v_unit=store_v_unit, div_full=div_full, flag=flag)


@cache
def device_fns():
    """The shared device functions, built on first use (the DSL is imported lazily)."""
    return _build_device()
