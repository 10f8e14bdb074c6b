"""Epilogue of the SM90a attention kernel: O / row sum, v_scale for Sage, predicated bf16 stores."""

import cutlass
import cutlass.cute as cute

from .layout import acc_mn

Float32, Int32 = cutlass.Float32, cutlass.Int32


class Sm90Epilogue:
    """Mixin of ``Sm90SparseAttention``: the output tile from the O accumulator."""

    @cute.jit
    def epilogue(self, acc_o, row_sum, thr_pv, o, mVs, qb: Int32, nqb: Int32, h: Int32, b: Int32):
        """O / row sum (exact zeros for rows without a valid block), x v_scale for Sage,
        predicated bf16 stores of the rows < Sq."""
        bm, hd = self.bm, self.hd
        acc_o_mn = acc_mn(acc_o)
        n_rows = cute.size(acc_o_mn, mode=[0])
        for r in cutlass.range_constexpr(n_rows):
            s = row_sum[r]
            s = s + cute.arch.shuffle_sync_bfly(s, offset=1)
            s = s + cute.arch.shuffle_sync_bfly(s, offset=2)
            inv = Float32(0.0)
            if s > 0.0:
                inv = cute.arch.rcp_approx(s)
            for c in cutlass.range_constexpr(cute.size(acc_o_mn, mode=[1])):
                acc_o_mn[r, c] = acc_o_mn[r, c] * inv

        seqlen_q = o.shape[0]
        gO = cute.local_tile(o[None, None, h, b], (bm, hd), (cutlass.min(qb, nqb - 1), 0))
        cO = cute.make_identity_tensor((bm, hd))
        tOgO = thr_pv.partition_C(gO)
        tOcO = thr_pv.partition_C(cO)
        if qb < nqb:
            if cutlass.const_expr(self.sage):
                for e in cutlass.range_constexpr(cute.size(acc_o)):
                    acc_o[e] = acc_o[e] * mVs[b, h, tOcO[e][1]]
            rO = cute.make_rmem_tensor(acc_o.layout, self.o_dt)
            rO.store(acc_o.load().to(self.o_dt))
            row0 = qb * bm
            for e in cutlass.range_constexpr(cute.size(rO)):
                if row0 + tOcO[e][0] < seqlen_q:
                    tOgO[e] = rO[e]
