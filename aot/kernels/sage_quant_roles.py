"""Device functions of the Sage quantizer launches (contract, sizes and why:
``aot/kernels/sage_quant.py`` and ``NOTES-sage-quant.md``): the Q tile, the K/V statistics of one
unit and their reductions, the cross-CTA ticket / arrival / wait, the 16-byte row views, the L2
cache-policy loads and stores and the packed two-lane PTX ops. A module of
its own so that each stays one concern (tests/cpu/test_contract.py: modules of ~600 lines at most).
"""

from functools import cache
from types import SimpleNamespace


def _build_device():
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int8, Int16, Int32, Int64

    from aot.kernels.sage_quant import AMAX_FLOOR, HEAD_DIM, KV_HALF, Q_GROUP, Q_ROWS, UNIT_BLOCKS

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

    # ---------------------------------------------------------------- cross-CTA ordering (sage_quant_kv)
    @dsl_user_op
    def gaddr(ptr, *, loc=None, ip=None):
        """The global address of a cute pointer (for the PTX below)."""
        return Int64(llvm.ptrtoint(T.i64(), ptr.llvm_ptr, loc=loc, ip=ip))

    @dsl_user_op
    def atom_add_gpu(addr, val, *, loc=None, ip=None):
        """``atom.relaxed.gpu.add.u32``: the old value (ordering comes from the fences around it,
        the pattern of a cooperative-groups grid barrier)."""
        return Int32(llvm.inline_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip)],
                                     "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def ld_acquire_gpu(addr, *, loc=None, ip=None):
        return Int32(llvm.inline_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                                     "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
                                     has_side_effects=True, is_align_stack=False,
                                     asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @dsl_user_op
    def nanosleep(ns, *, loc=None, ip=None):
        llvm.inline_asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r",
                        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                        loc=loc, ip=ip)

    @dsl_user_op
    def trap(*, loc=None, ip=None):
        llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    @dsl_user_op
    def l2_policy(kind: str, *, loc=None, ip=None):
        """A 64-bit L2 cache policy (``createpolicy.fractional.L2::<kind>``, fraction 1.0) for the
        ``.L2::cache_hint`` loads below: the statistics read of a block marks its lines evict_last
        (they are read again ``lag`` tickets later), the quantize read evict_first (last use)."""
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

    @cute.jit
    def load_row(g2d, r, cc, pol):
        """``_row(g2d, r, cc).load()`` (8 bf16, one 16-byte load) with an L2 cache policy."""
        words = _ld16_hint(gaddr(_row(g2d, r, cc).iterator), pol)
        w = cute.make_rmem_tensor(cute.make_layout((4,)), Int32)
        for i in cutlass.range_constexpr(4):
            w[i] = words[i]
        return w.load().bitcast(BFloat16)

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

    @cute.jit
    def take_ticket(mSync: cute.Tensor, tidx, sFlag: cute.Tensor):
        """The CTA's ticket (``mSync[0]``, relaxed atomic add by thread 0): tickets follow the
        order in which CTAs start. No memory ordering is needed for it, so no fence."""
        if tidx == 0:
            sFlag[0] = atom_add_gpu(gaddr(mSync.iterator), 1)
        cute.arch.sync_threads()
        return sFlag[0]

    @cute.jit
    def arrive(mSync: cute.Tensor, word, tidx, sFlag: cute.Tensor, slot: cutlass.Constexpr, last):
        """Thread 0 counts this CTA in at ``mSync[word]`` after everything the CTA wrote (barrier,
        fence, relaxed atomic add: a cooperative-groups grid barrier's release); returns whether
        it was arrival ``last`` (0-based), in which case thread 0 also fenced (acquire) before
        the barrier, so the CTA sees what every earlier arrival wrote."""
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            old = atom_add_gpu(gaddr(mSync.iterator + word), 1)
            if old == last:
                cute.arch.fence_acq_rel_gpu()
            sFlag[slot] = old
        cute.arch.sync_threads()
        return sFlag[slot] == last

    @cute.jit
    def wait_ready(mSync: cute.Tensor, word, tidx):
        """Thread 0 polls ``mSync[word]`` until it is non-zero (acquire loads, 128 ns apart, the
        first one at once), then the CTA goes on. A word that never becomes non-zero (a workspace not zeroed by launch 1:
        a bug, not an input) traps after ~2**24 polls (seconds) instead of hanging the GPU."""
        if tidx == 0:
            addr = gaddr(mSync.iterator + word)
            polls = Int32(0)
            seen = ld_acquire_gpu(addr)
            while seen == 0:
                nanosleep(Int32(128))
                seen = ld_acquire_gpu(addr)
                polls = polls + 1
                if polls > (1 << 24):
                    trap()
        cute.arch.sync_threads()  # (the acquire load orders thread 0; the barrier the others)

    # ---------------------------------------------------------------- K/V statistics of one unit

    @cute.jit
    def kv_stats_unit(mX: cute.Tensor, mP: cute.Tensor, b, h, u, tidx, lane, sRed: cute.Tensor,
                      is_v: cutlass.Constexpr):
        """Row ``u`` of ``mP`` (k_part for K, v_part for V): per channel, the fp32 sum of K (or the
        amax |V|) over the valid keys of unit ``u``: warps 0-3 read block ``2u``, warps 4-7 block
        ``2u+1`` (8 rows of 16 bytes in flight per thread). Fixed order: per thread in key order,
        lanes l and l^16, then the 8 warps in index order."""
        t = tidx % KV_HALF
        cc = t % NCC
        S = mX.shape[1]
        row0 = (u * UNIT_BLOCKS + tidx // KV_HALF) * 64 + (t // NCC) * 8
        warp = tidx // 32
        pol = l2_policy("evict_last")
        gX = mX[b, None, h, None]
        if cutlass.const_expr(not is_v):
            zero = cute.full((VEC,), 0.0, Float32)
            ksum = cute.full((VEC,), 0.0, Float32)
            for j in cutlass.range_constexpr(8):
                r = row0 + j
                kx = load_row(gX, cutlass.min(r, S - 1), cc, pol).to(Float32)
                ksum = ksum + cute.where(_rows_valid(r, S), kx, zero)
            for j in cutlass.range_constexpr(VEC):
                a = ksum[j]
                a = a + cute.arch.shuffle_sync_bfly(a, offset=16)
                if lane < NCC:
                    sRed[warp, cc * VEC + j] = a
        else:
            # |V| amax on packed bf16 pairs: sign bits cleared, max.bf16x2 (exact; a duplicated
            # valid row past Sk leaves it unchanged)
            packed = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
            packed.store(cute.full((VEC // 2,), 0, Int32))
            for j in cutlass.range_constexpr(8):
                vw = load_row(gX, cutlass.min(row0 + j, S - 1), cc, pol).bitcast(Int32)
                for p in cutlass.range_constexpr(VEC // 2):
                    packed[p] = _bf16x2("max", packed[p], vw[p] & Int32(0x7FFF7FFF))
            vmax = packed.load().bitcast(BFloat16).to(Float32)
            for j in cutlass.range_constexpr(VEC):
                m = vmax[j]
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=16))
                if lane < NCC:
                    sRed[warp, cc * VEC + j] = m
        cute.arch.sync_threads()
        if tidx < KV_HALF:
            acc = Float32(0.0)
            for w in cutlass.range_constexpr(8):
                if cutlass.const_expr(not is_v):
                    acc = acc + sRed[w, tidx]
                else:
                    acc = cute.arch.fmax(acc, sRed[w, tidx])
            mP[b, h, u, tidx] = acc

    @cute.jit
    def reduce_rows(mP: cute.Tensor, b, h, r0, n, tidx, sRed: cute.Tensor, is_max: cutlass.Constexpr):
        """Per channel, the sum (or max) of rows ``[r0, r0+n)`` of ``mP``: threads 128c..128c+127
        take the c-th half of the rows (in index order), then the two halves in order: a fixed
        order (deterministic), half the dependent loads per thread. Valid in threads 0-127."""
        ch = tidx % HEAD_DIM
        half = tidx // KV_HALF
        n0 = (n + 1) // 2
        start = r0 + half * n0
        cnt = n0
        if half == 1:
            cnt = n - n0
        acc = Float32(0.0)
        for r in cutlass.range(cnt, unroll=8):
            if cutlass.const_expr(not is_max):
                acc = acc + mP[b, h, start + r, ch]
            else:
                acc = cute.arch.fmax(acc, mP[b, h, start + r, ch])
        sRed[half, ch] = acc
        cute.arch.sync_threads()
        res = sRed[0, ch]
        if cutlass.const_expr(not is_max):
            res = res + sRed[1, ch]
        else:
            res = cute.arch.fmax(res, sRed[1, ch])
        cute.arch.sync_threads()  # (sRed is reused)
        return res

    return SimpleNamespace(VEC=VEC, NCC=NCC, row=_row, bf16x2=_bf16x2, quantize_q_tile=quantize_q_tile,
                           kv_stats_unit=kv_stats_unit, reduce_rows=reduce_rows, arrive=arrive,
                           take_ticket=take_ticket,
                           load_row=load_row, l2_policy=l2_policy, st_hint=st_hint, gaddr=gaddr,
                           wait_ready=wait_ready)


@cache
def device_fns():
    """The shared device functions, built on first use (the DSL is imported lazily)."""
    return _build_device()
