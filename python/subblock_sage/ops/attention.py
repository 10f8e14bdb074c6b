"""`sparse_attention`: SubBlock block-sparse attention, Sage (INT8 Q·Kᵀ, FP8 P·V) or bf16.

One call: ``validation.check_attention_args`` (every check, once: the frozen ``AttentionArgs``)
-> ``pipeline.serve`` (the backend of the device's target, its ``can_implement`` once) ->
``pipeline.attention``: the plan is prepared (``plan.prepare_plan``: the plan kernel, or for Sage
the plan role of the quantizer's launch) and the backend packs its launch, reads the plan's
verdict when ``check_plan=True`` (bad plan values raise there; ``out`` is never written on that
path) and launches. A plain eager call replays these launches after its first call of a
signature (``calls.py``, ``replay.py``).
"""

from __future__ import annotations

from .. import deadline
from ..contract import COMPUTE_MODES, DEFAULT_COMPUTE_MODE, ceil_div
from . import pipeline


def sparse_attention(q, k, v, q2k_block_index, block_counts=None, *, topk=None, block_size_k=64,
                     softmax_scale=None, compute_mode=DEFAULT_COMPUTE_MODE, layout="BSHD", out=None,
                     check_plan=False, library=None, backend=None):
    """Validate, serve, launch: the full path with nothing in between (self-tests, diagnostics; the
    public ``subblock_sage.sparse_attention`` documents the arguments and replays).
    ``library``, ``backend``: override the loaded library / backend (tests of test-only builds)."""
    return pipeline.attention_full(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
                                   compute_mode, layout, check_plan, library, backend)


def _self_test(device: int, compute_mode: str) -> str:
    """Small launch on a ragged shape with empty, dense and random rows vs the float64 reference;
    on a backend whose kernel takes one count per launch (``fixed_count_modes``: Sage on
    sm_100a/f) a fixed-count plan on the 64-key grid instead. An unvalidated mode runs here
    (``unvalidated.allowing``) and ``check`` labels it."""
    import torch

    from .. import unvalidated
    from ..backends import backend_for
    from ..loader import library_for_device
    from ..reference import attention_verdict, reference_sparse_attention

    g = torch.Generator(device="cpu").manual_seed(7)
    fixed = compute_mode in getattr(backend_for(library_for_device(device).target), "fixed_count_modes", ())
    B, H, Sq, Sk, bk = (1, 2, 192, 320, 64) if fixed else (1, 2, 150, 200, 64)
    dev = f"cuda:{device}"
    q, k, v = (torch.randn(B, S, H, 128, generator=g).to(torch.bfloat16).to(dev) for S in (Sq, Sk, Sk))
    gq, gk = ceil_div(Sq, 64), ceil_div(Sk, bk)
    index = torch.stack([torch.randperm(gk, generator=g) for _ in range(B * H * gq)]).view(B, H, gq, gk)
    if fixed:
        topk, counts = 3, None
        rows = torch.full((B, H, gq), topk, dtype=torch.int32)
    else:
        topk, counts = None, torch.randint(0, gk + 1, (B, H, gq), generator=g)
        counts[0, 0, 0], counts[0, 1, 1] = 0, gk  # one empty row, one dense row
        rows = counts = counts.int().to(dev)
    index = index.int().to(dev)
    with unvalidated.allowing():
        got = sparse_attention(q, k, v, index, counts, topk=topk, compute_mode=compute_mode, block_size_k=bk)
    deadline.wait_stream(device, f"GPU {device} {compute_mode} self-test")  # polls an event: never hangs (deadline.py)
    ref = reference_sparse_attention(q, k, v, index, rows.to(dev), block_size_k=bk).to(got.device)
    return attention_verdict(got, ref, compute_mode)  # thresholds: reference.SELF_TEST_LIMITS


class ModeSelfTest:
    """A compute mode's self-test hook (diagnostics/probes.py ``SELF_TESTS``: ``fn(device) -> str``
    and ``fn.supported(library)``): one per mode of the contract, so a new mode has one."""

    def __init__(self, compute_mode: str):
        self.compute_mode = compute_mode

    def __call__(self, device: int) -> str:
        return _self_test(device, self.compute_mode)

    def supported(self, lib) -> bool:
        return self.compute_mode in lib.compute_modes


SELF_TESTS = {mode: ModeSelfTest(mode) for mode in COMPUTE_MODES}
