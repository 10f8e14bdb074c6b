"""The score phase's log-sum-exp folds on the ``mma.sync`` accumulators (``mma.py``), and the
store of a block pair's score.

A lane of the m16n8k16 fragment holds rows ``g, g+8`` and columns ``2t, 2t+1`` of each 8-column
tile. Shipped layout: a key block's ``n_k`` columns are the lane's two plus xor-shuffles over
``t`` (n_k = 4: 1 shuffle, 8: 2; n_k = 1: the two columns are two key blocks), then a query
block's ``n_q`` rows are xor-shuffles over ``g`` (n_q = 2, 4, 8: 1, 2, 3 shuffles); key cells
first, then query cells, as SGLang. Permuted layout (``router_select_perm``): a lane's 16 columns
are whole key blocks, so the key side folds in registers (:func:`fold_permuted`). The shuffle
counts come from the launch's ``n_q`` / ``n_k``, the same for every lane of the grid, so each
step is one uniform branch and no lane diverges.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from aot.kernels.router.spec import LN2

from .config import NEG, QSTEPS_MAX


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

