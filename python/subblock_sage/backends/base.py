"""What every attention backend shares: the :class:`Backend` interface and the argument views of
one launch (:class:`Launch`).

A backend receives a call validated once (``validation.AttentionArgs``: canonical (B, S, H, 128)
views, scale, mode) and a prepared ``plan.Plan`` (ids valid and distinct, counts in range, in
``plan_block_size_k`` key blocks). It re-checks nothing the public entry checked; what it alone
knows (which modes and key-block sizes its kernels take) it states once, in ``can_implement``.
Everything a kernel was compiled to assume is checked again by the ABI packer (``abi``) against
the layouts the library embeds, because a mismatch there would be memory corruption, not an error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import abi
from ..contract import BLOCK_SIZES_K, MODES, SAGE_QUANT_KERNEL
from ..plan import Plan, prepare_plan
from ..router_spec import CELL_TOKENS
from ..validation import capturing
from . import router


@dataclass(frozen=True)
class Served:
    """The library and backend serving one call, after the backend's ``can_implement`` said yes
    for its mode and key-block size (:meth:`Backend.serve`: one backend call answers all of it).
    A routed call (``subblock_attention``) also gets the router's geometry and whether its plan
    and the Sage quantizer's pooled cells fit the backend, all host facts of (target, mode)."""

    lib: Any
    backend: Any
    compute_mode: str
    block_size_k: int
    granularity: Optional[int] = None  # the router's budget granularity (a routed call)
    takes_routed_plan: bool = True  # the kernels take the plan in ``block_size_k`` key blocks
    pools_cells: bool = False  # Sage whose quantizer can write the router's 16-token cells



@dataclass
class Launch:
    """One kernel launch: ``values`` maps every non-stream argument name to its tensor/scalar;
    ``params`` selects the variant (``Library.kernel``).

    ``zero_output``: nothing to compute (every row selects zero blocks); ``out`` was zero-filled
    and the launch must be skipped. ``scratch`` keeps temporaries alive until after the launch.
    """

    kernel: str
    params: dict[str, Any]
    values: dict[str, Any]
    out: Any
    zero_output: bool = False
    scratch: list = field(default_factory=list)

    def finish(self, plan) -> "Launch":
        if plan.empty:
            self.out.zero_()
            self.zero_output = True
        return self


def _has_pool_variant(lib) -> bool:
    from ..errors import LaunchError

    try:
        router.check_pooling(lib)
    except LaunchError:
        return False
    return True


class Backend:
    """Base of the per-target backends. Subclasses set ``target_family`` and ``kernels``
    (compute mode -> attention kernel name: ``contract.family_kernels(target_family)``) and
    implement :meth:`launch`."""

    target_family = "?"
    kernels: dict[str, str] = {}
    block_sizes_k: tuple[int, ...] = BLOCK_SIZES_K

    def router_block_size_k(self, compute_mode: str) -> int:
        """The key-block size a plan for ``compute_mode`` is routed in (``subblock_attention``,
        the SGLang integration): 64-row query blocks by 64-key blocks unless the mode's kernels of
        this family take wider key blocks (``ComputeMode.router_blocks``: sm90 Sage 128, as SGLang)."""
        return MODES[compute_mode].router_block_size_k(self.target_family)

    def router_geometry(self, compute_mode: str) -> tuple[int, int]:
        """``(block_size_k, budget_granularity)`` of the router for ``compute_mode`` on this target:
        SGLang's per-target key blocks and its per-mode granularity (``router_spec.BUDGET_GRANULARITY``)."""
        return self.router_block_size_k(compute_mode), MODES[compute_mode].budget_granularity

    def plan_block_size_k(self, block_size_k: int) -> int:
        """The key-block size the backend's kernels take the plan in."""
        return block_size_k

    def serve(self, lib, compute_mode: str, block_size_k: Optional[int] = None) -> Served:
        """The call's :class:`Served` after :meth:`can_implement` (once per call). ``block_size_k``
        None: a routed call, served in the router's geometry (:meth:`router_geometry`), with what
        its launches decide by: whether the kernels take the routed plan as it is and whether the
        Sage quantizer pools the router's cells (``ops/pipeline.py``: Q and K read once), i.e.
        :meth:`fuses_plan` (its operands are the quantizer's) and a library whose quantizer has the
        pooling variant (an older one has not: the call then routes in two launches)."""
        if block_size_k is not None:
            self.can_implement(lib, compute_mode, block_size_k)
            return Served(lib, self, compute_mode, block_size_k)
        bk, g = self.router_geometry(compute_mode)
        self.can_implement(lib, compute_mode, bk)
        takes = self.plan_block_size_k(bk) == bk
        return Served(lib, self, compute_mode, bk, g, takes,
                      takes and self.fuses_plan(lib, compute_mode) and _has_pool_variant(lib))

    def modes(self, lib) -> tuple[str, ...]:
        """The compute modes this backend serves with ``lib`` (its kernels decide)."""
        return tuple(m for m, k in self.kernels.items() if lib.has_kernel(k))

    def can_implement(self, lib, compute_mode: str, block_size_k: int) -> None:
        """Raise ValueError (with a fix) unless this backend can run the call with ``lib``."""
        modes = self.modes(lib)
        if compute_mode not in modes:
            raise ValueError(
                f"compute_mode={compute_mode!r} is not available on {lib.target}; it serves {modes}. "
                f"Fix: pass compute_mode={modes[0]!r}" if modes else
                f"{lib.target} ships no sparse-attention kernel in this build"
            )
        if block_size_k not in self.block_sizes_k:
            raise ValueError(
                f"block_size_k={block_size_k} is not supported on {lib.target}; use one of "
                f"{self.block_sizes_k} (rewrite the plan in {self.block_sizes_k[0]}-token key blocks)"
            )

    def check_call(self, lib, args) -> None:
        """Raise ValueError (with a fix) for a call (``validation.AttentionArgs``; ``plan`` None in
        a routed call) whose shapes or plan kind this backend's kernels cannot run exactly; called
        once, before the call's first launch. Host values only. Every call of the base passes."""

    def fuses_plan(self, lib, compute_mode: str) -> bool:
        """Whether :meth:`prepare` can take the plan kernel's work (``plan_values``) in its
        launch: the Sage quantizer of every target has the plan role."""
        return MODES[compute_mode].quantizes and lib.has_kernel(SAGE_QUANT_KERNEL)

    def quantizes_q(self, lib, args) -> bool:
        """Sage: whether the attention kernel ``lib`` would run for ``args`` quantizes its own Q
        tile (then the quantizer skips Q: :meth:`prepare`). No kernel of the base does."""
        return False

    def prepare(self, args, lib, plan_values=None):
        """Enqueue the input conversion the kernel needs (the Sage quantizer; nothing for bf16),
        with the plan kernel's work when ``plan_values`` is given (:meth:`fuses_plan`); its
        result is passed to :meth:`pack` as ``operands`` (without ``q_int8`` when the kernel
        quantizes Q itself: :meth:`quantizes_q`)."""
        if not MODES[args.compute_mode].quantizes:
            return None
        from .quantizer import quantize_canonical

        with_q = not self.quantizes_q(lib, args)
        return quantize_canonical(args.q, args.k, args.v, plan_values=plan_values, with_q=with_q)

    def launch(self, args, plan, operands, out_c) -> Launch:
        """The :class:`Launch` of the attention kernel (its arguments, as views)."""
        raise NotImplementedError

    def pack(self, lib, args, plan, operands, out_c) -> Callable[[], None]:
        """Check and pack the attention launch now; the returned function only launches it."""
        L = self.launch(args, plan, operands, out_c)
        if L.zero_output:
            return lambda: None
        return abi.prepare(L.kernel, L.params, L.values, library=lib)

    def run(self, lib, args, plan, operands, out_c) -> None:
        go = self.pack(lib, args, plan, operands, out_c)  # all Python work before the wait
        plan.verify()  # after the quantizer and plan launches, before the attention launch
        go()

    def stage(self, lib, args):
        """The steps before the attention launch of a call with the caller's plan: the input
        conversion and the plan. Sage: the quantizer's launch also prepares the plan (its plan
        role), so the call is two launches (each launch costs host time and a GPU gap, which
        dominate at small shapes); bf16: the plan kernel. Returns (operands, prepared plan); bad
        plan values raise in ``plan.verify()``."""
        box: dict = {}
        fuse = None
        if self.fuses_plan(lib, args.compute_mode):
            def fuse(values):
                box["operands"] = self.prepare(args, lib, plan_values=values)
        plan = prepare_plan(args.plan, block_size_k_out=self.plan_block_size_k(args.spec.block_size_k),
                            check_index=args.check_plan, capturing=capturing(), library=lib, fuse=fuse)
        operands = box["operands"] if "operands" in box else self.prepare(args, lib)  # PyTorch plan fallback
        return operands, plan

    def attention(self, lib, args, out, plan=None, operands=None) -> None:
        """A checked call's steps from its plan to its attention launch, in one backend call: the
        caller's plan staged (:meth:`stage`), or a prepared ``plan`` (the router's) with its
        ``operands`` (the pooling quantizer's) or :meth:`prepare`'s; then :meth:`run` into
        ``out`` (the caller's layout)."""
        if plan is None:
            operands, plan = self.stage(lib, args)
        elif operands is None:
            operands = self.prepare(args, lib)  # Sage: the quantizer alone; bf16: nothing
        self.run(lib, args, plan, operands, args.canonical(out))

    def subblock(self, served: Served, route_args, args, out) -> None:
        """A routed call's launches (``subblock_attention``, checked: ``ops/pipeline.py``), in one
        backend call: the router's (:func:`router.launch`: ``router_pool``, or the Sage quantizer's
        pooling variant where ``served.pools_cells`` and the cells are 16 tokens, so Q and K are
        read once; then ``router_select``), then :meth:`attention` on the routed plan. The router
        writes each row's ids valid, distinct and ascending and its count in range, which is what
        the plan kernel would make of it: a backend that takes the plan's key blocks
        (``served.takes_routed_plan``) runs it as a prepared plan, with the pooling quantizer's
        operands; any other stages it through the plan kernel into its own key blocks."""
        lib, r = served.lib, route_args
        quantize = None
        if served.pools_cells and r.sub_q == CELL_TOKENS and r.sub_k == CELL_TOKENS:
            quantize = (args.v, not self.quantizes_q(lib, args))
        idx, counts, _, _, _, operands = router.launch(r, library=lib, quantize=quantize)
        if served.takes_routed_plan:
            self.attention(lib, args, out, Plan(idx, counts, 0, r.block_size_k, r.seqlen_k), operands)
        else:
            self.attention(lib, dataclasses.replace(args, plan=router.routed_plan(r, idx, counts)), out)
