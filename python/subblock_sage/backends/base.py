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

from dataclasses import dataclass, field
from typing import Any, Callable

from .. import abi
from ..contract import BLOCK_SIZES_K, MODES, SAGE_QUANT_KERNEL



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
        from ..quantizer import quantize_canonical

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
