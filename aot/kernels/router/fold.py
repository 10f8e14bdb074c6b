"""The score phase's log-sum-exp folds on the ``mma.sync`` accumulators (``mma.py``), and the
store of a block pair's score.

A lane of the m16n8k16 fragment holds rows ``g, g+8`` and columns ``2t, 2t+1`` of each 8-column
tile. The key tile is staged permuted (``mma.stage``), so a lane's 16 columns are 16 consecutive
key cells, whole key blocks for any ``n_k``: the key side folds in registers
(:func:`fold_permuted`), then a query block's ``n_q`` rows are xor-shuffles over ``g`` (n_q = 2,
4, 8: 1, 2, 3 shuffles; :func:`write_score`); key cells first, then query cells, as SGLang. The
tree levels and shuffle counts come from the launch's ``n_q`` / ``n_k``, the same for every lane
of the grid, so each step is one uniform branch and no lane diverges.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from aot.kernels.router.spec import LN2

from .config import NEG, QSTEPS_MAX


@cute.jit
def write_score(mS: cute.Tensor, score, qsteps, writer, qb, kb, b, h):
    """A key block's score of one query cell -> the query block's, a log-sum-exp (base 2) over its
    ``n_q`` cells: the lanes ``g`` xor 4, 8, 16, ``qsteps`` = log2 n_q butterfly steps (every lane
    of the group gets the result; ``qsteps`` is warp-uniform, so each of the ``QSTEPS_MAX`` steps
    is one uniform branch around its shuffle); the block pair's writer lane stores it in
    natural-log units."""
    s = score
    if qsteps > 0:
        m = score
        for i in cutlass.range_constexpr(QSTEPS_MAX):
            if i < qsteps:
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, 4 << i))
        ssum = cute.math.exp2(score - m, fastmath=True)
        for i in cutlass.range_constexpr(QSTEPS_MAX):
            if i < qsteps:
                ssum = ssum + cute.arch.shuffle_sync_bfly(ssum, 4 << i)
        s = cutlass.select_(m > Float32(NEG / 2), m + cute.math.log2(ssum, fastmath=True), Float32(NEG))
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

