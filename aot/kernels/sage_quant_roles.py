"""Device functions of ``sage_quant_prep``'s roles and the helpers both Sage quantizer launches
share (contract, sizes and why: ``aot/kernels/sage_quant.py`` and ``NOTES-sage-quant.md``): the Q
tile, the K/V statistics chunk, the 16-byte row views and the packed two-lane PTX ops. A module of
its own so that each stays one concern (tests/cpu/test_contract.py: modules of ~600 lines at most).
"""

from functools import cache
from types import SimpleNamespace


def _build_device():
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int8, Int16, Int32

    from aot.kernels.sage_quant import AMAX_FLOOR, HEAD_DIM, PREP_THREADS, Q_GROUP, Q_ROWS, STATS_CHUNK

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

    VEC = 8  # bf16 elements per 16-byte load
    NCC = HEAD_DIM // VEC  # 16 column chunks per row

    def _row(g2d, r, cc):
        # 16-byte (bf16) / 8-byte (int8) vector: elements [cc*VEC, cc*VEC+VEC) of row r
        return cute.local_tile(g2d[r, None], (VEC,), (cc,))

    def _rows_valid(r, n):
        return cute.full((VEC,), r, Int32) < n

    # ---------------------------------------------------------------- Q role
    @cute.jit
    def quantize_q_tile(mQ: cute.Tensor, mQ8: cute.Tensor, mQS: cute.Tensor, b, h, tile, warp, lane,
                        sQAmax: cute.Tensor):
        """Rows ``[Q_ROWS*tile, Q_ROWS*tile + Q_ROWS)`` of Q(b, h): warps 2w and 2w+1 quantize scale
        group ``tile*4 + w`` (32 rows: 16 each); lane = (row parity, 16-byte column chunk), 8 loads
        in flight (32 registers of bf16). The group amax is the max of the two warps' amax (smem,
        one CTA barrier: every thread of a Q-role CTA is in this function)."""
        cc = lane % NCC
        half = lane // NCC
        S = mQ.shape[1]
        gQ = mQ[b, None, h, None]
        gQ8 = mQ8[b, None, h, None]
        group = tile * (Q_ROWS // Q_GROUP) + warp // 2
        row0 = group * Q_GROUP + (warp % 2) * (Q_GROUP // 2) + half

        vals = []
        # amax on the bf16 bit patterns (|x| = bits & 0x7fff; for non-negative floats the
        # integer order is the float order), so only the bf16 values stay live in registers
        bmax = cute.full((VEC,), 0, Int32)
        for i in cutlass.range_constexpr(Q_GROUP // 4):
            r = cutlass.min(row0 + 2 * i, S - 1)  # duplicate a valid row past Sq: amax unchanged
            x = _row(gQ, r, cc).load()
            vals.append(x)
            a = x.bitcast(Int16).to(Int32) & 0x7FFF
            bmax = cute.where(a > bmax, a, bmax)
        amax_bits = bmax[0]
        for j in cutlass.range_constexpr(1, VEC):
            amax_bits = cutlass.max(amax_bits, bmax[j])
        amax_bits = cute.arch.warp_reduction_max(amax_bits)
        if lane == 0:
            sQAmax[warp] = amax_bits
        cute.arch.sync_threads()
        amax_bits = cutlass.max(sQAmax[warp], sQAmax[warp ^ 1])
        amax = cute.full((1,), amax_bits << 16, Int32).bitcast(Float32)[0]
        if group * Q_GROUP >= S:
            amax = Float32(0.0)  # pad group: FlashInfer's scale is 1e-7/127
        amax = cute.arch.fmax(amax, Float32(AMAX_FLOOR))
        scale = amax / Float32(127.0)
        inv = Float32(1.0) / scale
        if lane == 0 and warp % 2 == 0:
            if group < mQS.shape[2]:  # the last tile may cover groups past ceil(Sq/128)*4
                mQS[b, h, group] = scale
        for i in cutlass.range_constexpr(Q_GROUP // 4):
            r = row0 + 2 * i
            y = cute.math.roundeven(vals[i].to(Float32) * inv)
            if r < S:
                _row(gQ8, r, cc).store(y.to(Int8))

    # ---------------------------------------------------------------- K/V statistics role
    STATS_RG = PREP_THREADS // NCC  # 16 row groups
    STATS_UNROLL = 4  # rows per thread per loop trip: 4 K + 4 V loads in flight

    @cute.jit
    def kv_stats_chunk(mK: cute.Tensor, mV: cute.Tensor, mKP: cute.Tensor, mVP: cute.Tensor, b, h, c, tidx,
                       warp, lane, sSum: cute.Tensor, sMax: cute.Tensor):
        """Partial row ``c`` of k_part / v_part: per channel, the fp32 sum of K and the amax |V|
        over keys ``[STATS_CHUNK*c, STATS_CHUNK*(c+1))`` (valid keys only), in a fixed order:
        per thread in key order, then lanes l / l^16, then the 8 warps in index order."""
        cc = lane % NCC
        rg = tidx // NCC
        S = mK.shape[1]
        gK = mK[b, None, h, None]
        gV = mV[b, None, h, None]
        kacc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
        # |V| amax on packed bf16 pairs: sign bits cleared, max.bf16x2 (exact, and like fmax it
        # drops a NaN operand); 4 words instead of 8 fp32 and no conversion per row
        vacc = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
        kacc.store(cute.full((VEC,), 0.0, Float32))
        vacc.store(cute.full((VEC // 2,), 0, Int32))
        zero = cute.full((VEC,), 0.0, Float32)
        start = c * STATS_CHUNK
        step = STATS_RG * STATS_UNROLL
        trips = (cutlass.min(S - start, STATS_CHUNK) + step - 1) // step  # a short last chunk stops early
        for t in cutlass.range(trips, unroll=1):
            ksum = kacc.load()
            for i in cutlass.range_constexpr(STATS_UNROLL):
                r = start + t * step + i * STATS_RG + rg
                rc = cutlass.min(r, S - 1)
                kx = _row(gK, rc, cc).load().to(Float32)
                vw = _row(gV, rc, cc).load().bitcast(Int32)
                ksum = ksum + cute.where(_rows_valid(r, S), kx, zero)
                for p in cutlass.range_constexpr(VEC // 2):  # duplicated valid row: amax unchanged
                    vacc[p] = _bf16x2("max", vacc[p], vw[p] & Int32(0x7FFF7FFF))
            kacc.store(ksum)
        ksum = kacc.load()
        vmax = vacc.load().bitcast(BFloat16).to(Float32)
        # combine the two row groups of each warp (lanes l and l^16 share channels)
        ks = []
        vm = []
        for j in cutlass.range_constexpr(VEC):
            a = ksum[j]
            m = vmax[j]
            a = a + cute.arch.shuffle_sync_bfly(a, offset=16)
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=16))
            ks.append(a)
            vm.append(m)
        if lane < NCC:
            for j in cutlass.range_constexpr(VEC):
                sSum[warp, cc * VEC + j] = ks[j]
                sMax[warp, cc * VEC + j] = vm[j]
        cute.arch.sync_threads()
        ch = tidx % HEAD_DIM
        if tidx < HEAD_DIM:
            acc = Float32(0.0)
            for w in cutlass.range_constexpr(PREP_THREADS // 32):
                acc = acc + sSum[w, ch]
            mKP[b, h, c, ch] = acc
        else:
            acc = Float32(0.0)
            for w in cutlass.range_constexpr(PREP_THREADS // 32):
                acc = cute.arch.fmax(acc, sMax[w, ch])
            mVP[b, h, c, ch] = acc

    return SimpleNamespace(VEC=VEC, NCC=NCC, row=_row, bf16x2=_bf16x2, quantize_q_tile=quantize_q_tile,
                           kv_stats_chunk=kv_stats_chunk)


@cache
def device_fns():
    """The shared device functions, built on first use (the DSL is imported lazily)."""
    return _build_device()
