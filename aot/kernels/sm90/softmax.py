"""Online softmax of the SM90a attention kernel, in FP32 with exp2 and the softmax scale folded in.

Sage: the INT8 Q.K^T accumulator (S32) is converted exactly to FP32 with the 2^23 magic-number
trick, its row max is taken on the raw integers (one branch on the scale's sign per tile), and P
comes out pre-multiplied by ``P_SCALE`` (folded into the exp2 bias) and is converted to E4M3 in
the order of the FP8 A-operand registers (``convert_p``; the V permutation ``V_PERM16`` makes
that a register renaming). bf16: the FP32 accumulator is used as it is. Keys at or past Sk are
masked on a separate path that only tiles reaching Sk take.
"""

import math

import cutlass
import cutlass.cute as cute

from .config import P_SCALE
from .layout import acc_mn

Float32, Int32 = cutlass.Float32, cutlass.Int32


class Sm90Softmax:
    """Mixin of ``Sm90SparseAttention``: scores -> P (in place) and the row max / sum state."""

    @cute.jit
    def softmax_tile(self, acc_s, tScS_mn, blk: Int32, sc: Float32, sc1: Float32, row_max, row_sum, alpha,
                     seqlen_k: Int32):
        key0 = blk * self.bk
        self.softmax_keys(acc_s, tScS_mn, key0, key0 + 64, sc, sc1, row_max, row_sum, alpha, seqlen_k)

    @cute.jit
    def softmax_keys(self, acc_s, tScS_mn, key0: Int32, key1: Int32, sc: Float32, sc1: Float32, row_max,
                     row_sum, alpha, seqlen_k: Int32):
        """key0 / key1: first key of the tile's first / second 64 columns (a 64-key tile has
        only the first); the masked path runs when any column reaches seqlen_k."""
        last = key0 + self.bk
        if cutlass.const_expr(self.bk == 128):
            last = cutlass.max(key0, key1) + 64
        # the common unmasked path first: the fall-through, no jump over the masked code
        if last <= seqlen_k:
            self.softmax_tile_impl(acc_s, tScS_mn, key0, key1, sc, sc1, row_max, row_sum, alpha, seqlen_k, False)
        else:
            self.softmax_tile_impl(acc_s, tScS_mn, key0, key1, sc, sc1, row_max, row_sum, alpha, seqlen_k, True)

    @cute.jit
    def col_key(self, key0: Int32, key1: Int32, tScS_mn, c: cutlass.Constexpr, n_cols: cutlass.Constexpr) -> Int32:
        """Key position of accumulator column c: columns [0, n_cols/2) of a 128-key tile are
        its first 64 keys (accumulator order: pair, then 8-column chunk), the rest start at key1."""
        base = key0
        if cutlass.const_expr(self.bk == 128 and c >= n_cols // 2):
            base = key1 - 64
        return base + tScS_mn[0, c][1]

    @cute.jit
    def mask_p(self, p: Float32, key0: Int32, key1: Int32, tScS_mn, c: cutlass.Constexpr, n_cols: cutlass.Constexpr,
               seqlen_k: Int32, masked: cutlass.Constexpr) -> Float32:
        """p of accumulator column c, or 0 where its key is at or past seqlen_k (masked path only)."""
        if cutlass.const_expr(masked):
            if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                p = Float32(0.0)
        return p

    @cute.jit
    def softmax_tile_impl(self, acc_s, tScS_mn, key0: Int32, key1: Int32, sc: Float32, sc1: Float32, row_max,
                          row_sum, alpha, seqlen_k: Int32, masked: cutlass.Constexpr):
        """acc_s (S32 for sage, F32 for bf16) -> P (F32, in place; x448 for sage).
        Scores in log2 units are acc * sc; the row max is taken on the raw accumulator."""
        s_raw = acc_mn(acc_s)
        n_rows = cute.size(s_raw, mode=[0])
        n_cols = cute.size(s_raw, mode=[1])
        pos = sc >= 0.0
        if cutlass.const_expr(self.sage):
            big = Int32(4194303)  # 2^22 - 1: keeps the magic-number conversion exact
            bias = Int32(0)  # what the accumulator started from (see qk_bias)
            if cutlass.const_expr(self.qk_bias):
                bias = Int32(0x4B400000)
            if cutlass.const_expr(masked):
                for c in cutlass.range_constexpr(n_cols):
                    if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                        for r in cutlass.range_constexpr(n_rows):
                            if pos:
                                s_raw[r, c] = bias - big
                            else:
                                s_raw[r, c] = bias + big
            # columns [0, n_cols/2) are keys 0..63 of the tile, the rest keys 64..127
            # (accumulator column order: pair, then 8-column chunk)
            half = n_cols // 2 if cutlass.const_expr(self.bk == 128) else n_cols
            mx = cute.make_rmem_tensor(cute.make_layout(n_rows), Float32)
            # raw row extremes per 64-key half: one branch on the scale's sign per tile (the
            # sign decides max or min); the four chains are independent
            mi = cute.make_rmem_tensor(cute.make_layout((n_rows, 2)), Int32)
            if pos:
                self.row_extremes(s_raw, mi, half, True)
            else:
                self.row_extremes(s_raw, mi, half, False)
            for r in cutlass.range_constexpr(n_rows):
                mf = Float32(mi[r, 0] - bias) * sc
                if cutlass.const_expr(half < n_cols):
                    mf = cute.arch.fmax(mf, Float32(mi[r, 1] - bias) * sc1)
                mx[r] = mf
            # float(x) = as_float(x + 0x4B400000) - 12582912 for |x| < 2^22
            if cutlass.const_expr(not self.qk_bias):
                acc_s.store(acc_s.load() + Int32(0x4B400000))
            s_f = acc_mn(cute.recast_tensor(acc_s, Float32))
            for r in cutlass.range_constexpr(n_rows):
                m = mx[r]
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                m_new = cute.arch.fmax(row_max[r], m)
                alpha[r] = cute.math.exp2(row_max[r] - m_new, fastmath=True)
                row_max[r] = m_new
                bias0 = Float32(12582912.0) * sc + m_new - Float32(math.log2(P_SCALE))
                bias1 = Float32(12582912.0) * sc1 + m_new - Float32(math.log2(P_SCALE))
                acc_sum = Float32(0.0)
                for c in cutlass.range_constexpr(n_cols):
                    p = Float32(0.0)
                    if cutlass.const_expr(c < half):
                        p = cute.math.exp2(s_f[r, c] * sc - bias0, fastmath=True)
                    else:
                        p = cute.math.exp2(s_f[r, c] * sc1 - bias1, fastmath=True)
                    p = self.mask_p(p, key0, key1, tScS_mn, c, n_cols, seqlen_k, masked)
                    s_f[r, c] = p
                    acc_sum = acc_sum + p
                row_sum[r] = row_sum[r] * alpha[r] + acc_sum
        else:
            if cutlass.const_expr(masked):
                for c in cutlass.range_constexpr(n_cols):
                    if self.col_key(key0, key1, tScS_mn, c, n_cols) >= seqlen_k:
                        for r in cutlass.range_constexpr(n_rows):
                            if pos:
                                s_raw[r, c] = -Float32.inf
                            else:
                                s_raw[r, c] = Float32.inf
            for r in cutlass.range_constexpr(n_rows):
                m = s_raw[r, 0]
                if pos:
                    for c in cutlass.range_constexpr(1, n_cols):
                        m = cute.arch.fmax(m, s_raw[r, c])
                    m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                    m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                else:
                    for c in cutlass.range_constexpr(1, n_cols):
                        m = cute.arch.fmin(m, s_raw[r, c])
                    m = cute.arch.fmin(m, cute.arch.shuffle_sync_bfly(m, offset=1))
                    m = cute.arch.fmin(m, cute.arch.shuffle_sync_bfly(m, offset=2))
                m_new = cute.arch.fmax(row_max[r], m * sc)
                alpha[r] = cute.math.exp2(row_max[r] - m_new, fastmath=True)
                row_max[r] = m_new
                acc_sum = Float32(0.0)
                for c in cutlass.range_constexpr(n_cols):
                    p = cute.math.exp2(s_raw[r, c] * sc - m_new, fastmath=True)
                    p = self.mask_p(p, key0, key1, tScS_mn, c, n_cols, seqlen_k, masked)
                    s_raw[r, c] = p
                    acc_sum = acc_sum + p
                row_sum[r] = row_sum[r] * alpha[r] + acc_sum

    @cute.jit
    def row_extremes(self, s_raw, mi, half: cutlass.Constexpr, take_max: cutlass.Constexpr):
        """mi[r, 0] / mi[r, 1]: max (or min) of row r of s_raw over columns [0, half) / [half, end)."""
        n_cols = cute.size(s_raw, mode=[1])
        for r in cutlass.range_constexpr(cute.size(s_raw, mode=[0])):
            for part in cutlass.range_constexpr(2):
                c0 = 0 if part == 0 else half
                c1 = half if part == 0 else n_cols
                if cutlass.const_expr(c0 < c1):
                    m = s_raw[r, c0]
                    for c in cutlass.range_constexpr(c0 + 1, c1):
                        if cutlass.const_expr(take_max):
                            m = cutlass.max(m, s_raw[r, c])
                        else:
                            m = cutlass.min(m, s_raw[r, c])
                    mi[r, part] = m

    @cute.jit
    def convert_p(self, acc_s, tOrP):
        if cutlass.const_expr(self.sage):
            s_f = cute.recast_tensor(acc_s, Float32)
            n = cute.size(s_f)
            # fp32 registers in the FP8 A-operand order (keys permuted by V_PERM16)
            p_perm = cute.make_rmem_tensor(cute.make_layout(n), Float32)
            for g in cutlass.range_constexpr(n // 8):
                for e in cutlass.range_constexpr(8):
                    p_perm[g * 8 + e] = s_f[g * 8 + (0, 1, 4, 5, 2, 3, 6, 7)[e]]
            p_view = cute.make_tensor(tOrP.iterator, cute.make_layout(n))
            p_view.store(p_perm.load().to(self.v_dt))
        else:
            p_view = cute.make_tensor(tOrP.iterator, acc_s.layout)
            p_view.store(acc_s.load().to(self.v_dt))
