"""The routing plan: one :class:`Plan` type, and the one place plans are prepared for a backend.

The caller's plan (``q2k_block_index`` + ``block_counts`` or ``topk``), shape-checked by
``validation``, becomes a :class:`Plan` with unchecked values. :func:`prepare_plan` turns it into
the plan a backend launches with: counts clamped, ids outside the key range and repeats of an
earlier id dropped, survivors compacted, optionally each 128-key block split into its two 64-key
blocks (the FlashInfer classes take 64-key blocks), in ascending order. It is one launch of the ``plan_prepare``
kernel (``aot/kernels/plan_prepare.py``) plus a 4-int summary of what was wrong.

Plan values never make the default call wait: out-of-range counts are clamped to
``0..capacity`` and out-of-range ids skipped on the GPU, as on the ``topk`` path (SGLang passes
``block_counts`` on its normal path, and waiting for the summary would cost every call a host
round trip). ``check_plan=True`` is the opt-in that raises on bad counts or ids:
only then is the summary read (:attr:`Plan.verify`, right before the attention launch), from
pinned host memory it is copied to right behind the plan kernel, so the wait never drains the
stream (and under CUDA-graph capture, where nothing may wait, it is skipped).

Why: the same repair as PyTorch ops was ~12 launches, a rows x Gk scratch tensor and ~0.3 ms of
host time per call (H200, MEASUREMENTS.md 2026-11-30). The PyTorch path (:func:`sanitize_plan`,
:func:`check_plan_values`) stays as the fallback (plans with more than ``MAX_KEY_BLOCKS`` key
blocks, CPU tensors, libraries without the kernel) and as the reference the GPU tests compare the
kernel with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import abi
from .contract import MAX_KEY_BLOCKS, PLAN_KERNEL, ceil_div
from .loader import LaunchError, library_for_device


def _no_check() -> None:
    return None


@dataclass(frozen=True)
class PlanSpec:
    """What a call knows of its plan on the host, before any plan value is read and, for a routed
    call, before the plan exists: its shape and scalars. The backends choose their launch from it
    (``quantizes_q``, the sm_90a variant), so a call description carries one
    (``validation.AttentionArgs.spec``) whether the plan is the caller's or the router's."""

    capacity: int  # columns of q2k_block_index
    counts_given: bool  # per-row block_counts (else every row uses ``topk``)
    topk: int
    block_size_k: int
    seqlen_k: int
    num_key_blocks: int = field(init=False)  # ceil(seqlen_k / block_size_k)

    def __post_init__(self):
        # a plain field, computed here by plain arithmetic (contract.ceil_div's): the backends read
        # it on every call's path (``rows_can_be_dense``), and as a property calling ceil_div it
        # made each read a visit to this module (docs/design/call-path.md counts them)
        object.__setattr__(self, "num_key_blocks", -(-int(self.seqlen_k) // int(self.block_size_k)))

    @property
    def rows_can_be_dense(self) -> bool:
        """Some row may list every key block: the rows' counts (``block_counts``, up to the
        capacity, or ``topk``) reach the number of key blocks. Host values only (shapes, ``topk``),
        no GPU read. The sm_90a backend runs its two-CTA cluster kernels only then (a cluster
        shares K/V only for two dense rows, and costs 1-2 % on pairs that do not share)."""
        return (self.capacity if self.counts_given else self.topk) >= self.num_key_blocks

    @property
    def empty(self) -> bool:
        """Every row selects zero blocks: nothing to compute."""
        return not self.counts_given and self.topk == 0


@dataclass
class Plan:
    """A routing plan in key blocks of ``block_size_k`` tokens.

    Before :func:`prepare_plan`: the caller's tensors (shapes checked, values not). After: ids
    valid, distinct and ascending within the first ``counts`` entries of a row, counts in range, and
    ``verify`` raises ValueError on bad caller values (a no-op unless ``check_plan=True``).
    """

    index: Any  # int32 [B, H, Gq, capacity]
    counts: Optional[Any]  # int32 [B, H, Gq]; None: every row uses ``topk``
    topk: int  # the rows' count when ``counts`` is None
    block_size_k: int
    seqlen_k: int
    verify: Callable[[], None] = field(default=_no_check, repr=False)

    @property
    def spec(self) -> PlanSpec:
        return PlanSpec(self.capacity, self.counts_given, self.topk, self.block_size_k, self.seqlen_k)

    @property
    def capacity(self) -> int:
        return int(self.index.shape[-1])

    @property
    def num_key_blocks(self) -> int:
        return self.spec.num_key_blocks

    @property
    def counts_given(self) -> bool:
        return self.counts is not None

    @property
    def rows_can_be_dense(self) -> bool:
        """:attr:`PlanSpec.rows_can_be_dense` of this plan."""
        return self.spec.rows_can_be_dense

    @property
    def empty(self) -> bool:
        """Every row selects zero blocks: nothing to compute."""
        return self.spec.empty


# ---------------------------------------------------------------------------------------------
# PyTorch path: the fallback and the reference of the plan kernel


def sanitize_plan(index, counts, topk: int, num_k_blocks: int):
    """Device-only (no host sync, graph-capturable) plan repair to the routing-plan contract:
    counts clamped to [0, cap]; among each row's first ``count`` entries, ids outside
    [0, num_k_blocks) are dropped (a kernel would read out of bounds) and each other id is kept
    once (a repeat would count a block twice), in ascending order (the plan kernel's order:
    ``aot/kernels/plan_prepare.py`` says why). Returns (index [B,H,Gq,cap] contiguous int32,
    counts [B,H,Gq] int32)."""
    import torch

    cap = index.shape[-1]
    dev = index.device
    if counts is None:
        cnt = torch.full(index.shape[:3], int(topk), dtype=torch.int32, device=dev)
    else:
        cnt = counts.clamp(0, cap)
    pos = torch.arange(cap, dtype=torch.int32, device=dev)
    valid = (pos < cnt.unsqueeze(-1)) & (index >= 0) & (index < num_k_blocks)
    key = torch.where(valid, index, num_k_blocks).long()  # invalid -> a spare bucket
    present = torch.zeros((*index.shape[:3], num_k_blocks + 1), dtype=torch.bool, device=dev)
    present.scatter_(-1, key, True)
    present = present[..., :num_k_blocks]  # the row's set of ids, as a mask over key blocks
    new_counts = present.sum(-1, dtype=torch.int32)
    dest = torch.cumsum(present, -1, dtype=torch.int64) - 1  # rank of each id in the row
    dest = torch.where(present, dest, cap)  # absent ids -> a dump column
    ids = torch.arange(num_k_blocks, dtype=torch.int32, device=dev).expand(present.shape)
    out = torch.zeros((*index.shape[:3], cap + 1), dtype=torch.int32, device=dev)
    out.scatter_(-1, dest, ids)
    return out[..., :cap].contiguous(), new_counts


def _bad_ids(idx, counts, capacity: int, num_key_blocks: int):
    import torch

    cols = torch.arange(capacity, device=idx.device, dtype=torch.int32)
    live = cols.view(1, 1, 1, -1) < counts.clamp(0, capacity).unsqueeze(-1)
    return live & ((idx < 0) | (idx >= num_key_blocks))


def plan_values_error(plan: Plan, counts, *, check_index: bool, counts_bad: bool, index_bad: bool) -> str:
    """The message for bad plan values ('' when there is nothing to raise). Error path only: it
    recomputes the details (exact range, first bad position) with a few device ops."""
    import torch

    cap, nkb = plan.capacity, plan.num_key_blocks
    if counts_bad:
        lo, hi = (int(x) for x in torch.aminmax(counts))
        return (f"block_counts values must be in 0..capacity ({cap}), got min {lo} max {hi}; "
                f"such counts are clamped unless check_plan=True")
    if check_index and index_bad:
        pos = tuple(int(i) for i in _bad_ids(plan.index, counts, cap, nkb).nonzero()[0].tolist())
        return (
            f"q2k_block_index{list(pos)} = {int(plan.index[pos])} is outside [0, {nkb}) "
            f"(ceil(Sk/block_size_k) = ceil({plan.seqlen_k}/{plan.block_size_k})); such entries "
            f"are skipped unless check_plan=True"
        )
    return ""


def check_plan_values(plan: Plan, counts, *, check_index: bool) -> Callable[[], None]:
    """Enqueue the value checks of ``check_plan=True`` as PyTorch reductions and return the
    function that reads them (one host sync) and raises. The GPU path reads the plan kernel's
    summary instead. ``check_index=False``: nothing to check (bad values are repaired)."""
    import torch

    if not check_index:
        return _no_check
    parts = []
    if plan.counts_given:
        lo, hi = torch.aminmax(counts)
        parts.append(((lo < 0) | (hi > plan.capacity)).view(1).int())
    if check_index:
        parts.append(_bad_ids(plan.index, counts, plan.capacity, plan.num_key_blocks).any().view(1).int())
    if not parts:
        return _no_check
    summary = torch.cat(parts)

    def verify() -> None:
        vals = summary.tolist()  # the one sync
        msg = plan_values_error(plan, counts, check_index=check_index,
                                counts_bad=plan.counts_given and bool(vals[0]),
                                index_bad=check_index and bool(vals[-1]))
        if msg:
            raise ValueError(msg)

    return verify


def _prepare_torch(plan: Plan, counts, split: int, bk_out: int, check_index: bool, capturing: bool) -> Plan:
    import torch

    verify = _no_check if capturing else check_plan_values(plan, counts, check_index=check_index)
    nkb_in, nkb_out = plan.num_key_blocks, ceil_div(plan.seqlen_k, bk_out)
    idx = plan.index
    if split > 1:
        c = counts.clamp(0, plan.capacity)
        idx2 = torch.stack([idx * split + s for s in range(split)], dim=-1).flatten(-2)
        # an id j is valid iff j < nkb_in; its halves past nkb_out are dropped by sanitize
        idx2 = torch.where(idx.repeat_interleave(split, -1).ge(nkb_in), -1, idx2)
        new_idx, new_cnt = sanitize_plan(idx2.contiguous(), (c * split).contiguous(), 0, nkb_out)
    else:
        new_idx, new_cnt = sanitize_plan(idx, counts, 0, nkb_in)
    return Plan(new_idx, new_cnt, 0, bk_out, plan.seqlen_k, verify)


# ---------------------------------------------------------------------------------------------
# The plan kernel


def _kernel_library(device: int, library):
    """The library that has the plan kernel: the caller's (test builds may lack it), else the
    device's; None -> PyTorch path."""
    for lib in (library, None):
        try:
            lib = lib or library_for_device(device)
            if lib.has_kernel(PLAN_KERNEL):
                return lib
        except LaunchError:
            continue
    return None


def prepare_plan(plan: Plan, *, block_size_k_out: int, check_index: bool, capturing: bool,
                 library=None, fuse: Optional[Callable[[dict], None]] = None) -> Plan:
    """The kernel-safe :class:`Plan` of a shape-checked caller's plan, in ``block_size_k_out``
    key blocks (``plan.block_size_k`` or 64), each row's ids distinct and ascending. Bad values
    raise in the result's ``verify``.

    ``fuse(values)``: launch the plan kernel's work inside another launch that runs anyway (the
    Sage quantizer's first launch has a plan role: ``quantizer.quantize_canonical``), given
    the values the plan kernel would take; called only on the kernel path (not for the PyTorch
    fallback), in the plan kernel's place."""
    import torch

    bk_in = plan.block_size_k
    if bk_in % block_size_k_out:
        raise ValueError(f"cannot rewrite a {bk_in}-key-block plan in {block_size_k_out}-key blocks")
    split = bk_in // block_size_k_out
    nkb_in, nkb_out = plan.num_key_blocks, ceil_div(plan.seqlen_k, block_size_k_out)
    idx, counts, cap = plan.index, plan.counts, plan.capacity
    dev = idx.device
    lib = None
    if dev.type == "cuda" and nkb_in <= MAX_KEY_BLOCKS:
        lib = _kernel_library(dev.index if dev.index is not None else torch.cuda.current_device(), library)
    if lib is None:
        if counts is None:
            counts = torch.full(idx.shape[:3], plan.topk, dtype=torch.int32, device=dev)
        return _prepare_torch(plan, counts, split, block_size_k_out, check_index, capturing)

    B, H, gq = idx.shape[:3]
    out_idx = torch.empty((B, H, gq, cap * split), dtype=torch.int32, device=dev)
    out_cnt = torch.empty((B, H, gq), dtype=torch.int32, device=dev)
    # Only check_plan=True reads the summary (the kernel's atomics); otherwise bad values are
    # repaired on the GPU and the call never waits on the host.
    needs_sync = check_index and not capturing
    summary = (torch.zeros if needs_sync else torch.empty)(4, dtype=torch.int32, device=dev)
    values = {"q2k_block_index": idx, "out_index": out_idx, "out_counts": out_cnt,
              "summary": summary, "num_key_blocks": nkb_in, "split": split,
              "num_out_blocks": nkb_out}
    if plan.counts_given:
        values["block_counts"] = counts
    else:
        values["topk"] = plan.topk
    if fuse is not None:
        fuse(values)
    else:
        abi.launch(PLAN_KERNEL, {"counts": plan.counts_given}, values, library=lib)
    if not needs_sync:
        return Plan(out_idx, out_cnt, 0, block_size_k_out, plan.seqlen_k)
    host = torch.empty(4, dtype=torch.int32, pin_memory=True)
    host.copy_(summary, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()

    def verify() -> None:
        ready.synchronize()  # the one sync: waits for the plan kernel and the copy only
        neg, over, bad_rows, _dropped = host.tolist()
        if not (neg or over or (check_index and bad_rows)):
            return
        rows = counts if counts is not None else torch.full(idx.shape[:3], plan.topk, dtype=torch.int32,
                                                            device=dev)
        raise ValueError(plan_values_error(plan, rows, check_index=check_index,
                                           counts_bad=bool(neg or over), index_bad=bool(bad_rows)))

    return Plan(out_idx, out_cnt, 0, block_size_k_out, plan.seqlen_k, verify)


__all__ = ["Plan", "PlanSpec", "prepare_plan", "sanitize_plan", "check_plan_values", "MAX_KEY_BLOCKS"]
