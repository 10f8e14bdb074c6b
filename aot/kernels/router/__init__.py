"""The SubBlock router as two CuTe-DSL launches: ``router_pool`` (Q and K -> pooled cells) and
``router_select`` (block scores + per-row top-k). Method, pooled-cell layout and budget:
``spec.py`` (``python/subblock_sage/router_spec.py``); runtime op: ``ops/route.py``.

``router_pool`` -- one warp per cell, 8 cells per CTA, grid ``(ceil(CQ/8) + ceil(CK/8), H, B)``
(the Q cells' CTAs first, then K's: one launch for both). Half-warp ``t % 2`` of a warp sums the
cell's tokens ``t``, each lane 8 channels (one 16-byte load per token, four in flight), the halves
are added with one shuffle, and lanes 0-15 write the mean times the scale as bf16 (16 bytes
each). It reads Q and K once (bf16 ``[B, S, H, 128]``, any strides the ABI allows) and writes
1/sub of that: at H=14 S=37760, 271 MB read, 34 MB written, ~60 us at the H200's ~4.8 TB/s.

``router_select`` -- block scores, then per-row top-k, in one launch. Three score phases, each a
kernel of its own (names: ``spec.SELECT_KERNELS``):

* ``mma`` (``router_select``, the one shipped): CTA = 4 warps = 64 query cells (``64 / n_q`` query
  blocks). Its ``phase`` argument (``spec.PHASE_*``; ``ops/route.select_launches`` chooses) gives
  the launch's shape: FUSED, grid ``(ceil(CQ/64), H, B)``, each CTA scores its query tile against
  every key tile, then its warps select their rows; or SCORES, grid ``(ceil(CQ/64) * k_splits, H,
  B)``, each CTA scoring its query tile against a ``1/k_splits`` share of the key tiles, followed
  by a SELECT launch, grid ``(ceil(Gq/4), H, B)``, one row per warp. The split exists for small
  grids: a CTA's warps depend on their own MMA, exp2 and shuffle results in turn, and with one
  CTA per SM (H=2 at S=37760: 74 CTAs) nothing hides those latencies (H100: the fused launch 245
  us at H=2 against 326 us at H=14, seven times the work). The CTA's query cells are staged once in shared memory
  (bf16 pairs as 32-bit words, rows padded to 68 words so a warp's fragment loads hit 32 distinct
  banks) and each warp keeps the A fragments of its 16 cells (``m16n8k16``, all 8 k-steps: 32
  registers) for the whole launch. Per key tile of 64 key cells (staged the same way) a warp issues
  8 x 8 bf16 ``mma.sync`` with float32 accumulators (32 registers): its 16 x 64 cell-pair dots. The
  log-sum-exp runs on the accumulators: a lane holds rows ``g, g+8`` and columns ``2t, 2t+1`` of
  each 8-column tile, so a key block's ``n_k`` columns are the lane's two plus xor-shuffles over
  ``t`` (n_k = 4: 1 shuffle, 8: 2; n_k = 1: the two columns are two key blocks), then a query
  block's ``n_q`` rows are xor-shuffles over ``g`` (n_q = 2, 4, 8: 1, 2, 3 shuffles); key cells
  first, then query cells, as SGLang. The pair matrix never leaves the registers; the lane holding
  a block pair's first cells writes its float32 score to ``scores`` ``[B, H, Gq, Gk]``.
  ``n_q`` and ``n_k`` are runtime arguments: nothing sized depends on them (the staged tiles, the
  fragments and the 32 accumulators are per 64 cells), and what does -- the shuffle counts
  (``popc(n - 1)`` = log2 n), the writer predicate (``g % n_q == 0``, ``t % (n_k / 2) == 0``),
  the block ids (shifts) and the rows per warp (``16 / n_q``) -- is the same for every lane of the
  grid, so each shuffle step is one uniform branch and no lane diverges. One export per target
  serves all 16 pairs (per pair it would be 16, 2-5 CPU-s each: most of the build). The cost, sm_90a
  (MEASUREMENTS.md, 2026-12-07): 96 registers against 94 for the kernel compiled for n_q = n_k = 4
  (the same 5 CTAs per SM), no local memory; per warp and key tile at that pair 1200 instructions
  in the MMA and fold region against 1033, with the same 64 HMMA, 96 SHFL and 80 MUFU: the rest
  are the uniform branches and their predicates. The runtime checks n_q, n_k before any launch
  (``ops/route.py``): the kernel trusts them to be powers of two up to 8.
* ``simt`` (``router_select_simt``, the sm_90a test library only): the same scores with float32
  FFMA (CTA = 8 query blocks, one warp each; lane ``l`` scores key block ``32 t + l`` of key tile
  ``t``, all ``n_q x n_k`` pairs in registers; key cells staged as float32 32 channels at a time),
  compiled per (n_q, n_k): 16 exports. A second implementation of the same arithmetic in another
  instruction mix and with every cell count fixed at compile time, so a fault of the shipped
  kernel's runtime paths cannot repeat in it: a GPU run compares the two (tests/gpu/test_router.py).
* ``perm`` (``router_select_perm``, the sm_90a test library only): ``mma`` with the key tile
  staged permuted (cell ``16 t + 2 nt + e`` in row ``8 nt + 2 t + e``), so lane (g, t)'s 16
  accumulator columns are 16 consecutive key cells, whole key blocks for any n_k: each block's
  log-sum-exp runs in registers (a max / sum tree of ``log2 n_k`` uniform levels) instead of
  xor-shuffles over ``t``, and the query side's shuffles run once per block rather than once per
  column pair (n_k = 4: 8 instead of 16 per tile; n_k = 8: 4). 128 registers (4 CTAs per SM),
  no local memory. The candidate for the H=14 bound (docs/design/open-work.md); not run on a GPU
  yet: its GPU tests and bench rows are written (tests/gpu/test_router.py,
  benchmark/router_bench.py ``perm_over_shipped_b2b``).

All: bf16 x bf16 products are exact in float32, so either gives SGLang's score (its ``tl.dot`` on
the same bf16 cells) up to the float32 summation order. Cells with no real token are left out
(NEG, SGLang's sentinel). Then each warp selects its rows (FUSED: their scores were written by the
same warp, read back after a CTA barrier; SELECT: by the previous launch): the row's order keys
are read from ``scores`` once into the warp's ``ROW_WORDS`` (2176) words of the shared memory the
staged tiles used (rows of more key blocks read ``scores`` on every pass: each pass over global
memory is a chain of ~19 dependent L2 reads per lane at Gk = 590, ~5 us, five passes per row and
four rows per warp: ~100 us per fused launch on an H100, MEASUREMENTS.md 2026-12-07);
an exact radix select (four 8-bit passes over the keys, a 256-bin histogram per warp in shared
memory) finds the ``topk``-th largest key and how many of the blocks equal to it to take; one more
pass writes the chosen ids in ascending order (ballot prefix sums: blocks above the threshold,
then the equal ones from the lowest id), zeros after them, and the row's count. Rows flagged in
``dense_rows`` (read only when ``has_dense``) list every key block. The SIMT kernel keeps the
global-memory passes: a GPU run compares the two selections too.

Why tensor cores, with the arithmetic (H200, H=14 S=37760, n_q = n_k = 4: 2360 cells per head and
side): the pair dots are ``14 x 2360^2 x 128`` = 10.0 G multiply-adds. SIMT float32 peaks at 67
TFLOPS (132 SMs x 128 lanes x 1.98 GHz x 2): >= 0.30 ms, ~0.5 ms at a realistic 60 %, 2-3x
SGLang's whole router (its pooling ~2 x 40 us, its score kernel on tensor cores, top-k ~30 us).
bf16 ``mma.sync`` runs the same 20 GFLOP at several hundred TFLOPS: ~40-60 us. The epilogue is
~78 M exp2 + ~20 M log2 over 132 x 16 MUFU lanes/clk (~20-30 us), and pooled K is re-read once per
CTA: ``Gk n_k x 256 B`` = 0.6 MB x 516 CTAs = 0.31 GB from L2 (~40 us at ~8 TB/s), overlapping the
MMAs of the other CTAs on the SM (shared memory 39 KB per CTA, 4+ CTAs per SM). Selection: 8260
rows x 5 passes over 590 scores. Estimated ~0.15-0.2 ms with the pooling; measured (H100): pooling
105 us, the fused select launch ~300 us, bound by its instruction stream (MEASUREMENTS.md,
2026-12-07; ``perm`` is the candidate against it).

Limits (checked before any launch by ``can_implement`` and ``check_route_args`` in ``ops/route.py``):
head dim 128; ``n_q``, ``n_k`` in {1, 2, 4, 8}; H, B <= 65535 (grid y, z); ``1 <= topk <= Gk``;
capacity >= ``topk`` (>= ``Gk`` with dense rows); S * 128 < 2^31 (int32 token arithmetic). No
host wait: every value is an argument, nothing is read back, so the launches are CUDA-graph
capturable.
"""


from functools import cache

from aot.contract import HEAD_DIM
from aot.contract import TARGET_NAMES as TARGETS  # every target ships the router
from aot.kernels.router.spec import (LN2, PHASE_FUSED, PHASE_SCORES, PHASE_SELECT, POOL_KERNEL, ROUTER_N_VALUES,
                                     SELECT_KERNELS, SELECT_TILE_CELLS)
from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

POOL_WARPS = 8  # cells per pooling CTA (one warp each)
TI = 8  # query blocks per router_select CTA (one warp each)
TJ = 32  # key blocks per key tile (one per lane)
DC = 32  # channels per staged chunk of the key tile
KPAD = DC + 4  # floats per staged key-cell row: 16-byte lane reads hit disjoint banks
VEC = 8  # bf16 per 16-byte global load
NEG = -1.0e30  # "no valid pair" (SGLang's sentinel): exp2(NEG - m) = 0 for any real m
HIST = 256  # radix bins per warp
MMA_WARPS = 4  # router_select (mma): warps per CTA, 16 query cells each
MMA_CELLS = SELECT_TILE_CELLS  # query cells per CTA, and key cells per staged key tile
assert MMA_CELLS == 16 * MMA_WARPS  # one m16 fragment row block per warp
WROW = HEAD_DIM // 2 + 4  # 32-bit words per staged cell row (68: 4 words of padding)
ROW_WORDS = 2 * MMA_CELLS * WROW // MMA_WARPS  # a warp's row buffer in the staged tiles' memory: 2176 keys
QSTEPS_MAX = max(ROUTER_N_VALUES).bit_length() - 1  # shuffles over a query block's rows: log2 n_q <= 3
KSTEPS_MAX = QSTEPS_MAX - 1  # over a key block's column pairs: log2 n_k - 1 <= 2


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

    @cute.jit
    def row_key(mS: cute.Tensor, sRow, staged, rb, b, h, i, c):
        """Column ``c``'s unsigned order key (as int32) of row (b, h, i): from the warp's staged
        copy (``staged``) or from ``scores``."""
        u = Int32(0)
        if cutlass.const_expr(sRow is None):
            u = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
        else:
            if staged:
                u = sRow[rb + c]
            else:
                u = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
        return u

    @cute.jit
    def select_row(mS: cute.Tensor, mIdx: cute.Tensor, mCnt: cute.Tensor, sHist: cute.Tensor, sRow,
                   topk: Int32, b, h, i, warp, lane):
        """Warp: the ``topk`` best blocks of row (b, h, i), ties to the lower id, ascending; then
        zeros up to the capacity, and the row's count. ``sHist``: HIST int32 per warp. ``sRow``
        (None: read ``scores`` on every pass): ROW_WORDS int32 per warp; a row of at most that many
        blocks is read from ``scores`` once, its keys kept there for the five passes (each pass
        over global memory is a chain of dependent L2 reads: ~5 us per pass of 590 blocks)."""
        gk = mS.shape[3]
        cap = mIdx.shape[3]
        hb = warp * HIST
        rb = warp * ROW_WORDS
        staged = gk <= ROW_WORDS
        if cutlass.const_expr(sRow is not None):
            # the warp's previous row is done with the buffer (its last pass reads a clamped
            # column another lane now writes)
            cute.arch.sync_warp()
            if staged:
                for c in cutlass.range(lane, gk, 32, unroll=4):
                    sRow[rb + c] = order_key(mS[b, h, i, c]) ^ Int32(-0x80000000)
                cute.arch.sync_warp()
        need = topk  # blocks still to take among those matching the prefix
        prefix = Int32(0)  # the threshold's high bits found so far (unsigned key)
        for p in cutlass.range_constexpr(4):
            for r in cutlass.range_constexpr(HIST // 32):
                sHist[hb + lane * (HIST // 32) + r] = Int32(0)
            cute.arch.sync_warp()
            for c in cutlass.range(lane, gk, 32, unroll=1):
                u = row_key(mS, sRow, staged, rb, b, h, i, c)
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
            key = row_key(mS, sRow, staged, rb, b, h, i, cutlass.min(c, gk - 1)) ^ Int32(-0x80000000)
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

    @cute.jit
    def finish_row(mS: cute.Tensor, mIdx: cute.Tensor, mCnt: cute.Tensor, mDense: cute.Tensor, has_dense: Int32,
                   sHist: cute.Tensor, sRow, topk: Int32, b, h, i, warp, lane):
        """Warp: row i's plan: every key block when it is dense, else :func:`select_row`."""
        gk = mS.shape[3]
        is_dense = Int32(0)
        if has_dense != 0:
            is_dense = mDense[b, h, i]
        if is_dense != 0:
            for c in cutlass.range(lane, mIdx.shape[3], 32, unroll=1):
                mIdx[b, h, i, c] = cutlass.select_(c < gk, c, Int32(0))
            if lane == 0:
                mCnt[b, h, i] = gk
        else:
            select_row(mS, mIdx, mCnt, sHist, sRow, topk, b, h, i, warp, lane)

    @cute.jit
    def lse_lanes(x, t0, t1, base: cutlass.Constexpr[int], steps, max_steps: cutlass.Constexpr[int]):
        """Log-sum-exp (base 2) over a group of lanes: this lane's terms ``t0`` and ``t1`` (``t1``
        None: one term), the lanes reached by xor-ing ``base << s`` for ``s < steps`` (a butterfly:
        every lane of the group gets the result). ``steps`` is warp-uniform (from the launch's
        ``n_q`` / ``n_k``), so each of the ``max_steps`` steps is one uniform branch around its
        shuffle. ``x``: this lane's value for the group's maximum, at least its largest term (so no
        exp2 argument is positive)."""
        m = x
        for s in cutlass.range_constexpr(max_steps):
            if s < steps:
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, base << s))
        ssum = cute.math.exp2(t0 - m, fastmath=True)
        if cutlass.const_expr(t1 is not None):
            ssum = ssum + cute.math.exp2(t1 - m, fastmath=True)
        for s in cutlass.range_constexpr(max_steps):
            if s < steps:
                ssum = ssum + cute.arch.shuffle_sync_bfly(ssum, base << s)
        return cutlass.select_(m > Float32(NEG / 2), m + cute.math.log2(ssum, fastmath=True), Float32(NEG))

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

    @cute.jit
    def stage(mX: cute.Tensor, sX: cute.Tensor, c0: Int32, b, h, tidx, permuted: cutlass.Constexpr = False):
        """CTA: cells [c0, c0 + MMA_CELLS) of (b, h) into sX as bf16 pairs (zeros past the tensor).
        ``permuted``: cell ``16 t + 2 nt + e`` goes to row ``8 nt + 2 t + e``, the row the mma's
        B fragment gives lane (g, t) as its column ``2 t + e`` of n-tile ``nt``: a lane's 16
        accumulator columns are then 16 consecutive cells, whole key blocks for any n_k."""
        for v in cutlass.range(tidx, MMA_CELLS * (HEAD_DIM // VEC), 32 * MMA_WARPS, unroll=2):
            r = v // (HEAD_DIM // VEC)
            cc = v % (HEAD_DIM // VEC)
            w = cute.make_rmem_tensor(cute.make_layout((VEC // 2,)), Int32)
            w.fill(0)
            if c0 + r < mX.shape[2]:
                w.store(cute.local_tile(mX[b, h, c0 + r, None], (VEC,), (cc,)).load().bitcast(Int32))
            srow = r
            if cutlass.const_expr(permuted):
                srow = 8 * ((r % 16) // 2) + 2 * (r // 16) + r % 2
            cute.local_tile(sX[srow, None], (VEC // 2,), (cc,)).store(w.load())

    @cute.jit
    def fold_permuted(mS: cute.Tensor, acc: cute.Tensor, kc0, t, qcell, q_valid, k_valid, n_k, lq, lk, writer,
                      b, h):
        """Warp, after a permuted key tile's MMAs: lane (g, t)'s accumulator columns ``2 nt + e``
        are key cells ``kc0 + 16 t + 2 nt + e``, 16/n_k whole key blocks. Per query cell (rows g,
        g+8): each block's log-sum-exp over its n_k cells in registers (tree levels ``s < log2
        n_k``, uniform branches), then the query side across lanes (:func:`write_score`)."""
        for half in cutlass.range_constexpr(2):
            x = cute.make_rmem_tensor(cute.make_layout((16,)), Float32)
            m = cute.make_rmem_tensor(cute.make_layout((16,)), Float32)
            for j in cutlass.range_constexpr(16):
                kcell = kc0 + 16 * t + j
                x[j] = cutlass.select_((kcell < k_valid) & (qcell[half] < q_valid),
                                       acc[4 * (j // 2) + 2 * half + j % 2], Float32(NEG))
                m[j] = x[j]
            for s in cutlass.range_constexpr(3):  # block maxima at each block's first cell
                if s < lk:
                    for j in cutlass.range_constexpr(0, 16, 2 << s):
                        m[j] = cute.arch.fmax(m[j], m[j + (1 << s)])
            for s in cutlass.range_constexpr(2, -1, -1):  # ... and back to every cell of the block
                if s < lk:
                    for j in cutlass.range_constexpr(0, 16, 2 << s):
                        m[j + (1 << s)] = m[j]
            for j in cutlass.range_constexpr(16):
                x[j] = cute.math.exp2(x[j] - m[j], fastmath=True)
            for s in cutlass.range_constexpr(3):  # block sums at each block's first cell
                if s < lk:
                    for j in cutlass.range_constexpr(0, 16, 2 << s):
                        x[j] = x[j] + x[j + (1 << s)]
            for j in cutlass.range_constexpr(16):
                if (j & (n_k - 1)) == 0:  # a block's first cell (uniform: n_k is the launch's)
                    score = cutlass.select_(m[j] > Float32(NEG / 2), m[j] + cute.math.log2(x[j], fastmath=True),
                                            Float32(NEG))
                    write_score(mS, score, lq, writer, qcell[half] >> lq, (kc0 + 16 * t + j) >> lk, b, h)

    def make_simt(n_q: int, n_k: int):
        NQC = TI * n_q  # query cells per CTA

        class RouterSelectSimt:
            @cute.jit
            def run(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                    q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows: cute.Tensor,
                    q_valid: Int32, k_valid: Int32, topk: Int32, has_dense: Int32, stream: cuda.CUstream):
                gq = scores.shape[2]
                self.kernel(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows,
                            q_valid, k_valid, topk, has_dense).launch(
                    grid=[(gq + TI - 1) // TI, scores.shape[1], scores.shape[0]], block=[32 * TI, 1, 1],
                    stream=stream)

            @cute.kernel
            def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor,
                       mCnt: cute.Tensor, mDense: cute.Tensor, q_valid: Int32, k_valid: Int32, topk: Int32,
                       has_dense: Int32):
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
                        mS[b, h, i, j] = score * Float32(LN2)
                cute.arch.sync_warp()  # the row was written by this warp only
                if i < gq:
                    finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, None, topk, b, h, i, warp, lane)

        return RouterSelectSimt

    @cute.jit
    def write_score(mS: cute.Tensor, score, qsteps, writer, qb, kb, b, h):
        """A key block's score of one query cell -> the query block's (its ``n_q`` cells are the
        lanes ``g`` xor 4, 8, 16: ``qsteps`` = log2 n_q shuffles); the block pair's writer lane
        stores it in natural-log units."""
        s = score
        if qsteps > 0:
            s = lse_lanes(score, score, None, 4, qsteps, QSTEPS_MAX)
        if writer & (qb < mS.shape[2]) & (kb < mS.shape[3]):
            mS[b, h, qb, kb] = s * Float32(LN2)

    def make_mma(permuted: bool):
        """``router_select`` (``permuted`` False: the shipped kernel) or the test library's
        ``router_select_perm``: the same kernel with the key tile staged permuted and the key-side
        log-sum-exp in registers (:func:`fold_permuted`)."""

        class RouterSelectMma:
            @cute.jit
            def run(self, pooled_q: cute.Tensor, pooled_k: cute.Tensor, scores: cute.Tensor,
                    q2k_block_index: cute.Tensor, block_counts: cute.Tensor, dense_rows: cute.Tensor,
                    n_q: Int32, n_k: Int32, q_valid: Int32, k_valid: Int32, topk: Int32, has_dense: Int32,
                    phase: Int32, k_splits: Int32, stream: cuda.CUstream):
                q_tiles = (pooled_q.shape[2] + MMA_CELLS - 1) // MMA_CELLS
                # PHASE_FUSED: a CTA per query tile; PHASE_SCORES: k_splits per query tile; PHASE_SELECT:
                # a CTA per MMA_WARPS rows
                gx = Int32(q_tiles)
                if phase == PHASE_SCORES:
                    gx = q_tiles * k_splits
                if phase == PHASE_SELECT:
                    gx = (scores.shape[2] + MMA_WARPS - 1) // MMA_WARPS
                self.kernel(pooled_q, pooled_k, scores, q2k_block_index, block_counts, dense_rows,
                            n_q, n_k, q_valid, k_valid, topk, has_dense, phase, k_splits).launch(
                    grid=[gx, scores.shape[1], scores.shape[0]], block=[32 * MMA_WARPS, 1, 1], stream=stream)

            @cute.kernel
            def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mIdx: cute.Tensor,
                       mCnt: cute.Tensor, mDense: cute.Tensor, n_q: Int32, n_k: Int32, q_valid: Int32,
                       k_valid: Int32, topk: Int32, has_dense: Int32, phase: Int32, k_splits: Int32):
                tidx, _, _ = cute.arch.thread_idx()
                bx, h, b = cute.arch.block_idx()
                warp = cute.arch.make_warp_uniform(tidx // 32)
                lane = tidx % 32
                gq = mS.shape[2]
                smem = cutlass.utils.SmemAllocator()
                # the staged Q and K tiles, then (selection) the warps' row buffers, in one allocation
                sBuf = smem.allocate_tensor(Int32, cute.make_layout((2 * MMA_CELLS * WROW,)), 16)
                sHist = smem.allocate_tensor(Int32, cute.make_layout((MMA_WARPS * HIST,)), 16)
                if phase == PHASE_SELECT:
                    i = bx * MMA_WARPS + warp
                    if i < gq:
                        finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, sBuf, topk, b, h, i, warp, lane)
                else:
                    qt = bx
                    k_tiles = (mK.shape[2] + MMA_CELLS - 1) // MMA_CELLS
                    kt0 = Int32(0)
                    kt1 = k_tiles
                    if phase == PHASE_SCORES:
                        qt = bx // k_splits
                        per = (k_tiles + k_splits - 1) // k_splits
                        kt0 = (bx - qt * k_splits) * per
                        kt1 = cutlass.min(kt0 + per, k_tiles)
                    self.scores(mQ, mK, mS, sBuf, n_q, n_k, q_valid, k_valid, qt, kt0, kt1, b, h, tidx, warp, lane)
                    if phase == PHASE_FUSED:
                        cute.arch.sync_threads()  # every warp is done with the staged tiles: rows reuse them
                        lq = cute.arch.popc(n_q - 1)
                        qc0 = qt * MMA_CELLS
                        for rr in cutlass.range(Int32(16) >> lq, unroll=1):  # the warp's 16 query cells: 16 / n_q rows
                            i = ((qc0 + warp * 16) >> lq) + rr
                            if i < gq:
                                finish_row(mS, mIdx, mCnt, mDense, has_dense, sHist, sBuf, topk, b, h, i, warp, lane)

            @cute.jit
            def scores(self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, sBuf: cute.Tensor, n_q: Int32,
                       n_k: Int32, q_valid: Int32, k_valid: Int32, qt: Int32, kt0: Int32, kt1: Int32, b, h, tidx,
                       warp, lane):
                """CTA: the block scores of query tile ``qt`` (MMA_CELLS query cells) against key tiles
                [kt0, kt1), written to ``scores``."""
                g = lane // 4  # the mma fragments' group (row) and thread-in-group (column pair)
                t = lane % 4
                # n_q, n_k: powers of two (checked by the runtime), the same for every lane of the grid
                lq = cute.arch.popc(n_q - 1)  # log2 n_q: shuffles over g per query block
                lk = cute.arch.popc(n_k - 1)  # log2 n_k
                ksteps = cutlass.max(lk - 1, 0)  # shuffles over t per key block (n_k = 4: 1, 8: 2)
                # the writer of a block pair: its first query cell's lanes (g % n_q == 0) and, for
                # n_k > 2, the first lane of its column pairs (t % (n_k / 2) == 0)
                writer = ((g & (n_q - 1)) | (t & (cutlass.max(n_k >> 1, 1) - 1))) == 0
                # bf16 cells as 32-bit words, rows padded to WROW words: the fragment loads of a warp
                # (rows g, words 8 ks + t) hit 32 distinct banks
                tile = cute.make_layout((MMA_CELLS, WROW), stride=(WROW, 1))
                sQ = cute.make_tensor(sBuf.iterator, tile)
                sK = cute.make_tensor(sBuf.iterator + MMA_CELLS * WROW, tile)

                qc0 = qt * MMA_CELLS
                stage(mQ, sQ, qc0, b, h, tidx)
                cute.arch.sync_threads()
                # A fragments of the warp's 16 query cells, all 8 k-steps, kept in registers
                r0 = warp * 16 + g
                afr = cute.make_rmem_tensor(cute.make_layout((32,)), Int32)
                for ks in cutlass.range_constexpr(8):
                    afr[4 * ks + 0] = sQ[r0, 8 * ks + t]
                    afr[4 * ks + 1] = sQ[r0 + 8, 8 * ks + t]
                    afr[4 * ks + 2] = sQ[r0, 8 * ks + t + 4]
                    afr[4 * ks + 3] = sQ[r0 + 8, 8 * ks + t + 4]
                qcell = (qc0 + r0, qc0 + r0 + 8)  # this lane's two query cells (accumulator rows)
                acc = cute.make_rmem_tensor(cute.make_layout((32,)), Float32)
                for kt in cutlass.range(kt0, kt1, unroll=1):
                    kc0 = kt * MMA_CELLS
                    cute.arch.sync_threads()  # the previous tile's readers are done
                    stage(mK, sK, kc0, b, h, tidx, permuted)
                    cute.arch.sync_threads()
                    acc.fill(0.0)
                    for nt in cutlass.range_constexpr(MMA_CELLS // 8):
                        for ks in cutlass.range_constexpr(8):
                            bw = (sK[8 * nt + g, 8 * ks + t], sK[8 * nt + g, 8 * ks + t + 4])
                            a = [afr[4 * ks + e] for e in range(4)]
                            d = mma_bf16(a, bw, [acc[4 * nt + e] for e in range(4)])
                            for e in cutlass.range_constexpr(4):
                                acc[4 * nt + e] = d[e]
                    if cutlass.const_expr(permuted):
                        # the query side's writer: the block's first query cell's lanes
                        fold_permuted(mS, acc, kc0, t, qcell, q_valid, k_valid, n_k, lq, lk, (g & (n_q - 1)) == 0,
                                      b, h)
                    else:
                        # accumulator (nt, e): query cell qcell[e // 2], key cell kc0 + 8 nt + 2 t + e % 2
                        for nt in cutlass.range_constexpr(MMA_CELLS // 8):
                            kcell = kc0 + 8 * nt + 2 * t
                            for half in cutlass.range_constexpr(2):
                                x0 = cutlass.select_((kcell < k_valid) & (qcell[half] < q_valid),
                                                     acc[4 * nt + 2 * half], Float32(NEG))
                                x1 = cutlass.select_((kcell + 1 < k_valid) & (qcell[half] < q_valid),
                                                     acc[4 * nt + 2 * half + 1], Float32(NEG))
                                qb = qcell[half] >> lq
                                # key side first: one log-sum-exp per (query cell, key block), then the
                                # query side (write_score); n_k = 1: x0 and x1 are two key blocks
                                l0 = x0
                                if n_k > 1:
                                    l0 = lse_lanes(cute.arch.fmax(x0, x1), x0, x1, 1, ksteps, KSTEPS_MAX)
                                write_score(mS, l0, lq, writer, qb, kcell >> lk, b, h)
                                if n_k == 1:
                                    write_score(mS, x1, lq, writer, qb, kcell + 1, b, h)

        return RouterSelectMma

    return RouterPool, make_mma, make_simt


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


def select_args(runtime_n: bool = True) -> list:
    """``dense_rows`` is read only when ``has_dense`` != 0 (the runtime passes another int32
    [B, H, Gq] tensor otherwise): one export serves both. ``runtime_n``: ``n_q``, ``n_k`` and the
    launch's ``phase`` / ``k_splits`` are arguments (``router_select``); the test library's
    ``simt`` is compiled per (n_q, n_k) and always scores and selects in one launch."""
    n = [ScalarArg("n_q", "int32", 4), ScalarArg("n_k", "int32", 4)] if runtime_n else []
    split = [ScalarArg("phase", "int32", PHASE_FUSED), ScalarArg("k_splits", "int32", 1)] if runtime_n else []
    return [_cells("pooled_q", "CQ"), _cells("pooled_k", "CK"), _bhx("scores", "float32", "GQ", "GK"),
            _bhx("q2k_block_index", "int32", "GQ", "CAP"), _bhx("block_counts", "int32", "GQ"),
            _bhx("dense_rows", "int32", "GQ"), *n, ScalarArg("q_valid", "int32", 1),
            ScalarArg("k_valid", "int32", 1), ScalarArg("topk", "int32", 1), ScalarArg("has_dense", "int32", 0),
            *split, StreamArg()]


def _pool_spec(target: str, variant: Variant) -> CompileSpec:
    return CompileSpec(_classes()[0]().run, pool_args())


def _select_spec(target: str, variant: Variant) -> CompileSpec:
    return CompileSpec(_classes()[1](False)().run, select_args())


def _perm_spec(target: str, variant: Variant) -> CompileSpec:
    return CompileSpec(_classes()[1](True)().run, select_args())


def _simt_spec(target: str, variant: Variant) -> CompileSpec:
    p = variant.params
    return CompileSpec(_classes()[2](p["n_q"], p["n_k"])().run, select_args(runtime_n=False))


KERNELS: list[Kernel] = [
    Kernel(POOL_KERNEL, "SubBlock router: Q and K -> pooled bf16 cells (mean of the real tokens; Q times "
           "softmax_scale*log2 e)", TARGETS, (Variant("bf16", {}),), _pool_spec),
    Kernel(SELECT_KERNELS["mma"], "SubBlock router: block scores (log-sum-exp over the n_q x n_k cell pairs on "
           "bf16 mma.sync accumulators; n_q, n_k runtime arguments) + exact per-row top-k -> q2k_block_index, "
           "block_counts", TARGETS, (Variant("mma", {}),), _select_spec),
    # the GPU cross-check of the shipped kernel (tests/gpu/test_router.py): never shipped
    Kernel(SELECT_KERNELS["simt"], "SubBlock router, test library: router_select's scores in float32 FFMA, "
           "compiled per (n_q, n_k)", (), tuple(Variant(f"q{nq}k{nk}", {"n_q": nq, "n_k": nk})
                                              for nq in ROUTER_N_VALUES for nk in ROUTER_N_VALUES),
           _simt_spec, test_targets=("sm_90a",)),
    # a candidate for the shipped kernel, verified and timed by a GPU run first (tests/gpu/test_router.py,
    # benchmark/router_bench.py): never shipped
    Kernel(SELECT_KERNELS["perm"], "SubBlock router, test library: router_select with the key tile staged so a "
           "lane's accumulator columns are whole key blocks (key-side log-sum-exp in registers)", (),
           (Variant("perm", {}),), _perm_spec, test_targets=("sm_90a",)),
]
