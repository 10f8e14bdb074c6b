"""Routing-plan preparation on the device: the caller's plan -> the plan a backend launches with.

One launch of the ``plan_prepare`` kernel (``aot/kernels/plan_prepare.py``): counts clamped,
ids outside the key range and repeats of an earlier id dropped, survivors compacted, optionally
each 128-key block split into its two 64-key blocks (the FlashInfer classes take 64-key blocks),
plus a 4-int summary of what was wrong. Reading that summary is the call's one host sync
(:meth:`PreparedPlan.verify`), done before any attention launch. The summary is copied into
pinned host memory right behind the plan kernel and `verify` waits on an event for that copy
only; the backends verify just before their attention launch, after the quantizer (enqueued
before the plan kernel), so the host wait never drains the stream.

Why: the same repair as PyTorch ops was ~12 launches, a rows x Gk scratch tensor and ~0.3 ms of
host time per call (H200, MEASUREMENTS.md 2026-11-30). The PyTorch path stays as the fallback
(plans with more than ``MAX_KEY_BLOCKS`` key blocks, libraries without the kernel) and as the
reference the GPU tests compare the kernel with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .. import marshal
from ..loader import LaunchError, library_for_device

MAX_KEY_BLOCKS = 65536  # aot/kernels/plan_prepare.py MAX_KEY_BLOCKS (tests check they agree)
KERNEL = "plan_prepare"


@dataclass
class PreparedPlan:
    """A kernel-safe plan in the backend's key-block units."""

    index: object  # int32 [B, H, Gq, capacity]: first counts[...] entries valid, distinct ids
    counts: object  # int32 [B, H, Gq]
    block_size_k: int
    num_key_blocks: int  # ceil(Sk / block_size_k)
    # Raises ValueError on bad plan values (one host sync); a no-op under CUDA-graph capture.
    verify: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def capacity(self) -> int:
        return self.index.shape[-1]


def _kernel_library(device: int, library):
    """The library that has the plan kernel: the caller's (test builds may lack it), else the
    device's; None -> PyTorch fallback."""
    for lib in (library, None):
        try:
            lib = lib or library_for_device(device)
            lib.entry(KERNEL, "cnt")
            return lib
        except LaunchError:
            continue
    return None


def prepare_plan(vplan, *, block_size_k_out: int, seqlen_k: int, check_index: bool,
                 capturing: bool, library=None) -> PreparedPlan:
    """``vplan``: a shape-checked ``validation.Plan`` (values unchecked). ``block_size_k_out``:
    the key-block size the backend takes (``vplan.block_size_k`` or 64)."""
    import torch

    from ..validation import check_plan_values, plan_values_error
    from .flashinfer_marshal import sanitize_plan

    bk_in = vplan.block_size_k
    if bk_in % block_size_k_out:
        raise ValueError(f"cannot rewrite a {bk_in}-key-block plan in {block_size_k_out}-key blocks")
    split = bk_in // block_size_k_out
    nkb_in = vplan.num_key_blocks
    nkb_out = -(-seqlen_k // block_size_k_out)
    idx, counts, cap = vplan.index, vplan.counts, vplan.capacity
    dev = idx.device
    lib = None
    if dev.type == "cuda" and nkb_in <= MAX_KEY_BLOCKS:
        lib = _kernel_library(dev.index if dev.index is not None else torch.cuda.current_device(), library)

    if lib is None:  # PyTorch path: value checks as reductions, then the repair as tensor ops
        if counts is None:
            counts = torch.full(idx.shape[:3], vplan.topk, dtype=torch.int32, device=dev)
        verify = lambda: None  # noqa: E731
        if not capturing:
            verify = check_plan_values(idx, counts, capacity=cap, num_key_blocks=nkb_in, Sk=seqlen_k,
                                       block_size_k=bk_in, check_index=check_index,
                                       counts_given=vplan.counts_given)
        if split > 1:
            c = counts.clamp(0, cap)
            idx2 = torch.stack([idx * split + s for s in range(split)], dim=-1).flatten(-2)
            # an id j is valid iff j < nkb_in; its halves past nkb_out are dropped by sanitize
            idx2 = torch.where(idx.repeat_interleave(split, -1).ge(nkb_in), -1, idx2)
            new_idx, new_cnt = sanitize_plan(idx2.contiguous(), (c * split).contiguous(), 0, nkb_out)
        else:
            new_idx, new_cnt = sanitize_plan(idx, counts, 0, nkb_in)
        return PreparedPlan(new_idx, new_cnt, block_size_k_out, nkb_out, verify)

    B, H, gq = idx.shape[:3]
    out_idx = torch.empty((B, H, gq, cap * split), dtype=torch.int32, device=dev)
    out_cnt = torch.empty((B, H, gq), dtype=torch.int32, device=dev)
    # Nothing to raise without counts (topk was checked on the host) unless ids are checked:
    # then the call needs no host sync at all, and the summary (the kernel's atomics) is never read.
    needs_sync = (vplan.counts_given or check_index) and not capturing
    summary = (torch.zeros if needs_sync else torch.empty)(4, dtype=torch.int32, device=dev)
    values = {"q2k_block_index": idx, "out_index": out_idx, "out_counts": out_cnt,
              "summary": summary, "num_key_blocks": nkb_in, "split": split,
              "num_out_blocks": nkb_out}
    if vplan.counts_given:
        values["block_counts"] = counts
        variant = "cnt"
    else:
        values["topk"] = vplan.topk
        variant = "topk"
    marshal.launch(KERNEL, variant, values, library=lib)
    if needs_sync:
        host = torch.empty(4, dtype=torch.int32, pin_memory=True)
        host.copy_(summary, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()

    def verify() -> None:
        ready.synchronize()  # the one sync: waits for the plan kernel and the copy only
        neg, over, bad_rows, _dropped = host.tolist()
        if not (neg or over or (check_index and bad_rows)):
            return
        rows = counts if counts is not None else torch.full(idx.shape[:3], vplan.topk, dtype=torch.int32,
                                                            device=dev)
        raise ValueError(plan_values_error(idx, rows, capacity=cap, num_key_blocks=nkb_in, Sk=seqlen_k,
                                           block_size_k=bk_in, check_index=check_index,
                                           counts_bad=bool(neg or over), index_bad=bool(bad_rows)))

    return PreparedPlan(out_idx, out_cnt, block_size_k_out, nkb_out, verify if needs_sync else (lambda: None))


__all__ = ["PreparedPlan", "prepare_plan", "MAX_KEY_BLOCKS"]

