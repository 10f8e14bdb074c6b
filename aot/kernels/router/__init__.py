"""The SubBlock router as two CuTe-DSL launches: ``router_pool`` (Q and K -> pooled cells) and
``router_select`` (block scores + per-row top-k). Method, pooled-cell layout and budget:
``spec.py`` (``python/subblock_sage/router_spec.py``); runtime op: ``ops/route.py``.

``router_pool`` -- one warp per cell, 8 cells per CTA, grid ``(ceil(CQ/8) + ceil(CK/8), H, B)``
(the Q cells' CTAs first, then K's: one launch for both). Half-warp ``t % 2`` of a warp sums the
cell's tokens ``t``, each lane 8 channels (one 16-byte load per token, four in flight), the halves
are added with one shuffle, and lanes 0-15 write the mean times the scale as bf16 (16 bytes
each). It reads Q and K once (bf16 ``[B, S, H, 128]``, any strides the ABI allows) and writes
1/sub of that: at H=14 S=37760, 271 MB read, 34 MB written, ~60 us at the H200's ~4.8 TB/s.

``router_select`` -- CTA = ``TI`` (8) query blocks of one head, one warp each; lane ``l`` of a warp
scores key block ``32 t + l`` of key tile ``t``, all ``n_q x n_k`` cell pairs in registers (one
float32 accumulator each, at most 64), so the ``[Gq n_q, Gk n_k]`` pair matrix never leaves the
registers. Per key tile the CTA stages the tile's pooled K cells in shared memory as float32, 32
channels at a time (``[n_k][32 blocks][32 + 4 pad]``: 16-byte reads of 8 consecutive lanes land
on disjoint banks), and the CTA's 8 x n_q query cells stay in shared memory for the whole launch
(float32, broadcast reads: every lane of a warp reads the same query cell). Per channel quad a lane
does ``n_q + n_k`` 16-byte shared loads and ``4 n_q n_k`` FFMA (n = 4: 8 loads, 64 FFMA). The
log-sum-exp (key cells first, then query cells, as SGLang; exp2/log2, cells with no real token
left out) gives one float32 score per (query block, key block), written to ``scores``
(``[B, H, Gq, Gk]``). Then each warp selects its row: an exact radix select (four 8-bit passes
over the row's order-preserving integer keys, a 256-bin histogram per warp in shared memory)
finds the ``topk``-th largest key and how many of the blocks equal to it to take; one more pass
writes the chosen ids in ascending order (ballot prefix sums: blocks above the threshold, then
the equal ones from the lowest id), zeros after them, and the row's count. The row's scores were
written by the same warp, so only a warp barrier separates the two phases, and they are read back
from L1/L2 (``Gk`` x 4 bytes x 5 passes per row). Dense rows (variant ``dense``: an int32 flag per
row) list every key block.

Why SIMT float32 and not tensor cores (bf16 ``mma.sync``, which SGLang's ``tl.dot`` uses): with
bf16 cells the products are exact in float32 either way, so both give SGLang's score up to the
summation order; the cost differs. Work at H=14 S=37760, n_q = n_k = 4: ``14 x 2360^2 x 128`` =
10.0 G FFMA, 0.30 ms at the H200's 67 TFLOPS FP32 peak (132 SMs x 128 lanes x 1.98 GHz x 2),
~0.5 ms at a realistic 60 %; on tensor cores (~700 dense bf16 TFLOPS on mma.sync) the same work
is ~30-60 us. Pooled K re-read per CTA: ``Gk n_k x 256 B`` = 0.6 MB x 1036 CTAs = 0.63 GB from
L2 (~80 us at ~8 TB/s), pooled Q once. So this SIMT kernel is expected to be 2-3x *slower* than
SGLang's Triton router at that shape (its pooling ~2 x 40 us, score on tensor cores, top-k
~30 us); the tensor-core version (the ``m16n8k16`` bf16 fragments read from the same shared tiles,
the log-sum-exp reduced across the 4-lane quads that hold a block's cells) is the next step.
What this version buys: exact (radix) selection, one launch for score + select, no JIT, no
host wait, and a numerics reference the faster kernel must reproduce.

Limits (``can_implement``): head dim 128; ``n_q``, ``n_k`` in {1, 2, 4, 8}; grid dims y, z <= 65535
(H, B); ``1 <= topk <= Gk``; capacity >= ``topk`` (>= ``Gk`` with dense rows). No host wait:
every value is an argument, nothing is read back, so the launches are CUDA-graph capturable.
"""


from functools import cache

from aot.contract import HEAD_DIM, MAX_GRID_YZ
from aot.kernels.router.spec import ROUTER_N_VALUES
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

TARGETS = ("sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f")
POOL_WARPS = 8  # cells per pooling CTA (one warp each)
TI = 8  # query blocks per router_select CTA (one warp each)
TJ = 32  # key blocks per key tile (one per lane)
DC = 32  # channels per staged chunk of the key tile
KPAD = DC + 4  # floats per staged key-cell row: 16-byte lane reads hit disjoint banks
VEC = 8  # bf16 per 16-byte global load
NEG = -1.0e30  # "no valid pair" (SGLang's sentinel): exp2(NEG - m) = 0 for any real m
HIST = 256  # radix bins per warp


def can_implement(*, n_q: int, n_k: int, B: int, H: int, head_dim: int, num_key_blocks: int, topk: int,
                  capacity: int, dense: bool) -> None:
    """Raise ValueError (with a Fix) for a problem these kernels cannot run."""
    if head_dim != HEAD_DIM:
        raise ValueError(f"router kernels take head dim {HEAD_DIM}, got {head_dim}. Fix: route heads of 128")
    if n_q not in ROUTER_N_VALUES or n_k not in ROUTER_N_VALUES:
        raise ValueError(f"n_q, n_k must be in {ROUTER_N_VALUES}, got {n_q}, {n_k}. Fix: use one of those")
    if H > MAX_GRID_YZ or B > MAX_GRID_YZ:
        raise ValueError(f"B={B}, H={H}: the router's grid takes at most {MAX_GRID_YZ} in each. "
                         f"Fix: split the batch or the heads into several calls")
    if not 1 <= topk <= num_key_blocks:
        raise ValueError(f"topk={topk} must be in 1..{num_key_blocks} (the key blocks). Fix: a budget in range")
    need = num_key_blocks if dense else topk
    if capacity < need:
        raise ValueError(f"plan capacity {capacity} < {need}. Fix: allocate q2k_block_index with "
                         f"{'Gk (dense rows list every block)' if dense else 'topk'} columns")


def _build():
    import cuda.bindings.driver as cuda

    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32
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

    @cute.jit
    def pool_cell(mX: cute.Tensor, mP: cute.Tensor, cell: Int32, sub: Int32, scale: Float32, b, h, lane):
        """Warp: pooled cell ``cell`` of (b, h): mean of its real tokens x scale, bf16."""
        S = mX.shape[1]
        if cell < mP.shape[2]:
            t0 = cell * sub
            n = cutlass.max(cutlass.min(sub, S - t0), 0)
            half = lane // 16
            cc = lane % 16
            acc = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
            acc.fill(0.0)
            for t in cutlass.range(half, n, 2, unroll=4):
                v = cute.local_tile(mX[b, t0 + t, h, None], (VEC,), (cc,)).load().to(Float32)
                acc.store(acc.load() + v)
            for e in cutlass.range_constexpr(VEC):
                acc[e] = acc[e] + cute.arch.shuffle_sync_bfly(acc[e], 16)
            if lane < 16:
                cnt = Float32(cutlass.max(n, 1))
                out = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
                for e in cutlass.range_constexpr(VEC):
                    out[e] = acc[e] / cnt * scale
                cute.local_tile(mP[b, h, cell, None], (VEC,), (cc,)).store(out.load().to(BFloat16))

    class RouterPool:
        @cute.jit
        def run(self, q: cute.Tensor, k: cute.Tensor, pooled_q: cute.Tensor, pooled_k: cute.Tensor,
                sub_q: Int32, sub_k: Int32, q_scale: Float32, stream: cuda.CUstream):
            nq = (pooled_q.shape[2] + POOL_WARPS - 1) // POOL_WARPS
            nk = (pooled_k.shape[2] + POOL_WARPS - 1) // POOL_WARPS
            self.kernel(q, k, pooled_q, pooled_k, sub_q, sub_k, q_scale, nq).launch(
                grid=[nq + nk, q.shape[2], q.shape[0]], block=[32 * POOL_WARPS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, q: cute.Tensor, k: cute.Tensor, pooled_q: cute.Tensor, pooled_k: cute.Tensor,
                   sub_q: Int32, sub_k: Int32, q_scale: Float32, nq: Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bx, h, b = cute.arch.block_idx()
            warp = cute.arch.make_warp_uniform(tidx // 32)
            lane = tidx % 32
            if bx < nq:
                pool_cell(q, pooled_q, bx * POOL_WARPS + warp, sub_q, q_scale, b, h, lane)
            else:
                pool_cell(k, pooled_k, (bx - nq) * POOL_WARPS + warp, sub_k, Float32(1.0), b, h, lane)

    def make_select(n_q: int, n_k: int, dense: bool):
        NQC = TI * n_q  # query cells per CTA

        class RouterSelect:
            @cute.jit
            def run(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                    q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows,
                    q_valid: Int32, k_valid: Int32, topk: Int32, stream: cuda.CUstream):
                gq = scores.shape[2]
                self.kernel(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows,
                            q_valid, k_valid, topk).launch(
                    grid=[(gq + TI - 1) // TI, scores.shape[1], scores.shape[0]], block=[32 * TI, 1, 1],
                    stream=stream)

            @cute.jit
            def run_dense(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                          q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows: cute.Tensor,
                          q_valid: Int32, k_valid: Int32, topk: Int32, stream: cuda.CUstream):
                self.run(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows, q_valid,
                         k_valid, topk, stream)

            @cute.jit
            def run_routed(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                           q2k_block_index: cute.Tensor, block_counts: cute.Tensor, q_valid: Int32,
                           k_valid: Int32, topk: Int32, stream: cuda.CUstream):
                self.run(pooled_q, pooled_k, scores, q2k_block_index, block_counts, None, q_valid, k_valid,
                         topk, stream)

            @cute.kernel
            def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor,
                       mCnt: cute.Tensor, mDense, q_valid: Int32, k_valid: Int32, topk: Int32):
                tidx, _, _ = cute.arch.thread_idx()
                bx, h, b = cute.arch.block_idx()
                warp = cute.arch.make_warp_uniform(tidx // 32)
                lane = tidx % 32
                gq = mS.shape[2]
                gk = mS.shape[3]
                smem = cutlass.utils.SmemAllocator()
                sQ = smem.allocate_tensor(Float32, cute.make_layout((NQC, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)
                sK = smem.allocate_tensor(Float32, cute.make_layout((n_k * TJ, KPAD), stride=(KPAD, 1)), 16)
                sHist = smem.allocate_tensor(Int32, cute.make_layout((TI * HIST,)), 16)

                # ---- the CTA's query cells, float32 (cells past the pooled tensor: zeros)
                qc0 = bx * NQC
                for v in cutlass.range(tidx, NQC * (HEAD_DIM // VEC), 32 * TI, unroll=1):
                    r = v // (HEAD_DIM // VEC)
                    cc = v % (HEAD_DIM // VEC)
                    vals = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
                    vals.fill(0.0)
                    if qc0 + r < mQ.shape[2]:
                        vals.store(cute.local_tile(mQ[b, h, qc0 + r, None], (VEC,), (cc,)).load().to(Float32))
                    cute.local_tile(sQ[r, None], (VEC,), (cc,)).store(vals.load())

                i = bx * TI + warp  # this warp's query block
                acc = cute.make_rmem_tensor(cute.make_layout((n_q * n_k,)), Float32)
                for jt in cutlass.range(0, gk, TJ, unroll=1):
                    acc.fill(0.0)
                    for dc in cutlass.range(0, HEAD_DIM, DC, unroll=1):
                        cute.arch.sync_threads()  # the previous chunk's readers are done
                        # stage key cells [jt*n_k, (jt+TJ)*n_k), channels [dc, dc+DC), as float32
                        for v in cutlass.range(tidx, n_k * TJ * (DC // VEC), 32 * TI, unroll=1):
                            r = v // (DC // VEC)  # cell within the tile: block r // n_k, cell r % n_k
                            cc = v % (DC // VEC)
                            kc = jt * n_k + r
                            vals = cute.make_rmem_tensor(cute.make_layout((VEC,)), Float32)
                            vals.fill(0.0)
                            if kc < mK.shape[2]:
                                vals.store(cute.local_tile(mK[b, h, kc, None], (VEC,), (dc // VEC + cc,))
                                           .load().to(Float32))
                            # stored as [cell r % n_k][block r // n_k]: lanes read consecutive rows
                            srow = (r % n_k) * TJ + r // n_k
                            cute.local_tile(sK[srow, None], (VEC,), (cc,)).store(vals.load())
                        cute.arch.sync_threads()
                        for d4 in cutlass.range_constexpr(DC // 4):
                            qv = [cute.local_tile(sQ[warp * n_q + a, None], (4,), (dc // 4 + d4,)).load()
                                  for a in range(n_q)]
                            kv = [cute.local_tile(sK[c * TJ + lane, None], (4,), (d4,)).load()
                                  for c in range(n_k)]
                            for a in cutlass.range_constexpr(n_q):
                                for c in cutlass.range_constexpr(n_k):
                                    s = acc[a * n_k + c]
                                    for e in cutlass.range_constexpr(4):
                                        s = s + qv[a][e] * kv[c][e]
                                    acc[a * n_k + c] = s
                    # log-sum-exp over the valid pairs: key cells first, then query cells (SGLang's)
                    j = jt + lane
                    lq = cute.make_rmem_tensor(cute.make_layout((n_q,)), Float32)
                    for a in cutlass.range_constexpr(n_q):
                        m = Float32(NEG)
                        for c in cutlass.range_constexpr(n_k):
                            x = cutlass.select_(j * n_k + c < k_valid, acc[a * n_k + c], Float32(NEG))
                            acc[a * n_k + c] = x
                            m = cute.arch.fmax(m, x)
                        ssum = Float32(0.0)
                        for c in cutlass.range_constexpr(n_k):
                            ssum = ssum + cute.math.exp2(acc[a * n_k + c] - m, fastmath=True)
                        la = m + cute.math.log2(ssum, fastmath=True)
                        live = (m > Float32(NEG / 2)) & (i * n_q + a < q_valid)
                        lq[a] = cutlass.select_(live, la, Float32(NEG))
                    m2 = Float32(NEG)
                    for a in cutlass.range_constexpr(n_q):
                        m2 = cute.arch.fmax(m2, lq[a])
                    s2 = Float32(0.0)
                    for a in cutlass.range_constexpr(n_q):
                        s2 = s2 + cute.math.exp2(lq[a] - m2, fastmath=True)
                    score = cutlass.select_(m2 > Float32(NEG / 2), m2 + cute.math.log2(s2, fastmath=True),
                                            Float32(NEG))
                    if i < gq and j < gk:
                        mS[b, h, i, j] = score * Float32(0.6931471805599453)
                cute.arch.sync_warp()  # the row was written by this warp only

                # ---- selection of row i
                if i < gq:
                    cap = mIdx.shape[3]
                    is_dense = Int32(0)
                    if cutlass.const_expr(dense):
                        is_dense = mDense[b, h, i]
                    if is_dense != 0:
                        for c in cutlass.range(lane, cap, 32, unroll=1):
                            mIdx[b, h, i, c] = cutlass.select_(c < gk, c, Int32(0))
                        if lane == 0:
                            mCnt[b, h, i] = gk
                    else:
                        self.select_row(mS, mIdx, mCnt, sHist, topk, b, h, i, warp, lane)

            @cute.jit
            def select_row(self, mS: cute.Tensor, mIdx: cute.Tensor, mCnt: cute.Tensor, sHist: cute.Tensor,
                           topk: Int32, b, h, i, warp, lane):
                """Warp: the ``topk`` best blocks of row (b, h, i), ties to the lower id, ascending."""
                gk = mS.shape[3]
                cap = mIdx.shape[3]
                hb = warp * HIST
                need = topk  # blocks still to take among those matching the prefix
                prefix = Int32(0)  # the threshold's high bits found so far (unsigned key)
                for p in cutlass.range_constexpr(4):
                    for r in cutlass.range_constexpr(HIST // 32):
                        sHist[hb + lane * (HIST // 32) + r] = Int32(0)
                    cute.arch.sync_warp()
                    for c in cutlass.range(lane, gk, 32, unroll=1):
                        u = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
                        match = True
                        if cutlass.const_expr(p > 0):
                            match = ((u >> (32 - 8 * p)) & Int32((1 << (8 * p)) - 1)) == prefix
                        if match:
                            cute.arch.atomic_add(sHist.iterator + hb + ((u >> (24 - 8 * p)) & Int32(0xFF)), Int32(1))
                    cute.arch.sync_warp()
                    # lane l owns bins 255-8l .. 248-8l (descending digits); scan the lanes
                    own = Int32(0)
                    for r in cutlass.range_constexpr(HIST // 32):
                        own = own + sHist[hb + HIST - 1 - lane * (HIST // 32) - r]
                    incl = own
                    for d in cutlass.range_constexpr(5):
                        t = cute.arch.shuffle_sync_up(incl, 1 << d)
                        if lane >= (1 << d):
                            incl = incl + t
                    hit = cute.arch.vote_ballot_sync(incl >= need)
                    src = cute.arch.popc(~hit & (hit - 1))  # the first lane reaching ``need``
                    digit = Int32(0)
                    above = Int32(0)
                    if lane == src:
                        cum = incl - own
                        found = Int32(0)
                        for r in cutlass.range_constexpr(HIST // 32):
                            bin_ = HIST - 1 - lane * (HIST // 32) - r
                            cnt = sHist[hb + bin_]
                            if (found == 0) & (cum + cnt >= need):
                                found = Int32(1)
                                digit = bin_
                                above = cum
                            cum = cum + cnt
                    digit = cute.arch.shuffle_sync(digit, src)
                    above = cute.arch.shuffle_sync(above, src)
                    need = need - above
                    prefix = (prefix << 8) | digit
                    cute.arch.sync_warp()
                thr = prefix ^ Int32(-0x80000000)  # back to the signed order key
                lt_mask = (Int32(1) << lane) - 1
                base = Int32(0)
                eq_seen = Int32(0)
                for c0 in cutlass.range(0, gk, 32, unroll=1):
                    c = c0 + lane
                    valid = c < gk
                    key = order_key(mS[b, h, i, cutlass.min(c, gk - 1)])
                    gt = valid & (key > thr)
                    eq = valid & (key == thr)
                    eq_mask = cute.arch.vote_ballot_sync(eq)
                    take_eq = eq & ((eq_seen + cute.arch.popc(eq_mask & lt_mask)) < need)
                    sel = gt | take_eq
                    sel_mask = cute.arch.vote_ballot_sync(sel)
                    if sel:
                        mIdx[b, h, i, base + cute.arch.popc(sel_mask & lt_mask)] = c
                    base = base + cute.arch.popc(sel_mask)
                    eq_seen = eq_seen + cute.arch.popc(eq_mask)
                for c in cutlass.range(base + lane, cap, 32, unroll=1):
                    mIdx[b, h, i, c] = Int32(0)
                if lane == 0:
                    mCnt[b, h, i] = base

        return RouterSelect

    return RouterPool, make_select


@cache
def _classes():
    return _build()


# ---------------------------------------------------------------------------------------------
# Registry


def _s(key: str, div: int = 1) -> Sym:
    return Sym(key, div=div, width=64)


B, H = Sym("B"), Sym("H")


def _bshd(name: str, seq: str) -> TensorArg:
    return TensorArg(name, "bfloat16", (B, Sym(seq), H, HEAD_DIM),
                     (_s(f"{name}.stride_b", 8), _s(f"{name}.stride_s", 8), _s(f"{name}.stride_h", 8), 1), align=16)


def _cells(name: str, cells: str) -> TensorArg:
    return TensorArg(name, "bfloat16", (B, H, Sym(cells), HEAD_DIM),
                     (_s(f"{name}.stride_b", 8), _s(f"{name}.stride_h", 8), _s(f"{name}.stride_c", 8), 1), align=16)


def _bhx(name: str, dtype: str, *last: str) -> TensorArg:
    n = len(last)
    return TensorArg(name, dtype, (B, H, *(Sym(x) for x in last)),
                     tuple(_s(f"{name}.stride_{m}") for m in range(1 + n)) + (1,), align=4)


def pool_args() -> list:
    return [_bshd("q", "Sq"), _bshd("k", "Sk"), _cells("pooled_q", "CQ"), _cells("pooled_k", "CK"),
            ScalarArg("sub_q", "int32", 16), ScalarArg("sub_k", "int32", 16),
            ScalarArg("q_scale", "float32", 0.1275), StreamArg()]


def select_args(dense: bool) -> list:
    args = [_cells("pooled_q", "CQ"), _cells("pooled_k", "CK"), _bhx("scores", "float32", "GQ", "GK"),
            _bhx("q2k_block_index", "int32", "GQ", "CAP"), _bhx("block_counts", "int32", "GQ")]
    if dense:
        args.append(_bhx("dense_rows", "int32", "GQ"))
    return args + [ScalarArg("q_valid", "int32", 1), ScalarArg("k_valid", "int32", 1),
                   ScalarArg("topk", "int32", 1), StreamArg()]


def _pool_spec(target: str, variant: Variant) -> CompileSpec:
    return CompileSpec(_classes()[0]().run, pool_args())


def _select_spec(target: str, variant: Variant) -> CompileSpec:
    p = variant.params
    cls = _classes()[1](p["n_q"], p["n_k"], p["dense"])()
    return CompileSpec(cls.run_dense if p["dense"] else cls.run_routed, select_args(p["dense"]))


SELECT_VARIANTS = tuple(
    Variant(f"q{nq}k{nk}{'_dense' if d else ''}", {"n_q": nq, "n_k": nk, "dense": d})
    for nq in ROUTER_N_VALUES for nk in ROUTER_N_VALUES for d in (False, True))

KERNELS: list[Kernel] = [
    Kernel("router_pool", "SubBlock router: Q and K -> pooled bf16 cells (mean of the real tokens; Q times "
           "softmax_scale*log2 e)", TARGETS, (Variant("bf16", {}),), _pool_spec),
    Kernel("router_select", "SubBlock router: block scores (log-sum-exp over the n_q x n_k cell pairs, in "
           "registers) + exact per-row top-k -> q2k_block_index, block_counts", TARGETS, SELECT_VARIANTS,
           _select_spec),
]
