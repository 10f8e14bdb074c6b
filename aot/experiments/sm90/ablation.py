"""K/V-traffic ablation of the SM90a attention kernel (**wrong results on purpose**, timing only;
built only with the experiments: ``aot/experiments/sm90/__init__.py``).

Some or all K/V loads skip the TMA: one thread completes the barrier's transaction count by hand
instead, so the consumer runs on the buffer's old bytes and the time without that L2 -> SM traffic
can be measured (docs/design/kernels-sm90.md: the traffic is not what limits Sage; bf16 is
traffic-bound).
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

from aot.kernels.sm90.config import Sm90Config
from aot.kernels.sm90.kernel import Sm90SparseAttention

Int32 = cutlass.Int32


def _complete_tx(mbar_ptr, nbytes):
    """`mbarrier.complete_tx` (the DSL has no wrapper) on a shared-memory barrier, as if a TMA of
    nbytes had landed."""
    addr = llvm.ptrtoint(T.i32(), mbar_ptr.to_llvm_ptr())
    llvm.inline_asm(None, [addr, Int32(nbytes).ir_value()],
                    "mbarrier.complete_tx.shared::cta.b64 [$0], $1;", "r,r",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class Sm90AblationAttention(Sm90SparseAttention):
    """The shipped kernel with the K/V loads of "half" (every odd plan entry) or "all" entries
    skipped once each ring buffer has held real data."""

    def __init__(self, cfg: Sm90Config, ablate: str):
        if ablate not in ("half", "all"):
            raise ValueError(f"ablate={ablate!r}. Fix: 'half' or 'all'.")
        super().__init__(cfg)
        self.ablate = ablate

    @cute.jit
    def ablate_skip(self, i: Int32) -> Int32:
        """1 if plan entry i's K/V loads are to be skipped."""
        sk = Int32(0)
        if i >= self.k_stages:
            sk = Int32(1)
            if cutlass.const_expr(self.ablate == "half"):
                sk = i % 2
        return sk

    @cute.jit
    def tma_load(self, tma_x, src, dst, bar, nbytes: cutlass.Constexpr, i: Int32, mcast: cutlass.Constexpr = False):
        """No copy for a skipped entry: one thread completes the barrier's transaction count
        instead (the buffer keeps its old bytes)."""
        skip = self.ablate_skip(i)
        if skip != 0:
            with cute.arch.elect_one():
                _complete_tx(bar, nbytes)
        else:
            cute.copy(tma_x, src, dst, tma_bar_ptr=bar)
