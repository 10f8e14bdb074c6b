"""SGLang drop-in: the runner SGLang's SubBlock sparse-attention backend calls.

SGLang's MiniMax-H3 ``subblock_sparse_attn`` backend resolves one runner per CUDA device and
calls it as::

    out = runner(q, k, v, q2k_block_index, topk, softmax_scale, block_counts)

with ``q, k, v`` bf16 ``[B, S, H, 128]`` (BSHD; often strided views, e.g. slices of one packed
buffer after the Ulysses all-to-all, used in place here), ``q2k_block_index`` int32
``[B, H, ceil(Sq/64), capacity]``, ``topk`` the number of leading entries every row uses when
``block_counts`` is None, and ``block_counts`` int32 ``[B, H, ceil(Sq/64)]`` for plans whose rows
differ (SGLang's heterogeneous sparse/dense rows). It returns bf16 ``[B, Sq, H, 128]``.

Key-block size: every path plans keys in 64-token blocks except Hopper Sage, where SGLang's router
plans ``ceil(Sk/128)`` key blocks per row (Q64 x K128 tiles); :func:`key_block_size` says which,
and the runner for ``(sm_90a, "sage_fp8")`` takes 128-token key blocks by default. Index order
within a row does not matter (no sort needed on any target).

    from subblock_sage.integrations.sglang import get_runner, key_block_size, validate
    validate(device, "sage_fp8")                     # at server start: raises with the fix
    runner = get_runner(device, "sage_fp8")          # per device, cached
    out = runner(q, k, v, plan_index, plan_topk, scale, block_counts)
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .. import loader
from ..contract import DEFAULT_COMPUTE_MODE
from ..validation import check_block_size_k, check_compute_mode, cuda_device_index

__all__ = ["get_runner", "key_block_size", "make_runner", "subblock_sparse_attention", "validate"]



def plan_block_size(target: str, compute_mode: str) -> int:
    """The key-block size SGLang's router plans in for ``compute_mode`` on ``target`` (128 for
    sm_90a Sage, else 64): the backend's rule (``backends.base.Backend.router_geometry``)."""
    from ..backends import backend_for

    return backend_for(target).router_block_size_k(compute_mode)

_lock = threading.Lock()
_runners: dict = {}


def target_for_device(device) -> str:
    """The kernel target serving ``device`` (raises UnsupportedGPUError naming the supported GPUs,
    NoGPUError / DriverTooOldError with their fixes)."""
    return loader.library_for_device(cuda_device_index(device, "SubBlock sparse attention")).target


def key_block_size(device, compute_mode: str = DEFAULT_COMPUTE_MODE) -> int:
    """Key-block size (64 or 128) SGLang's router should plan in for this device and mode."""
    check_compute_mode(compute_mode)
    return plan_block_size(target_for_device(device), compute_mode)


def make_runner(compute_mode: str = DEFAULT_COMPUTE_MODE, *, block_size_k: Optional[int] = None,
                check_plan: bool = False) -> Callable:
    """A runner with SGLang's signature ``(q, k, v, q2k_block_index, topk, softmax_scale,
    block_counts=None) -> out``.

    Args:
        compute_mode: ``"bf16"`` or ``"sage_fp8"``.
        block_size_k: key-block size of the plans it will get (64 or 128); ``None``: SGLang's
            convention for the device of each call (128 for Hopper Sage, else 64).
        check_plan: raise on index values outside ``[0, ceil(Sk/block_size_k))`` (a sync per call)
            instead of skipping them.
    """
    check_compute_mode(compute_mode)
    if block_size_k is not None:
        check_block_size_k(block_size_k)

    def runner(q, k, v, q2k_block_index, topk, softmax_scale, block_counts=None):
        from ..api import sparse_attention

        bk = block_size_k
        if bk is None:
            bk = 64
            dev = getattr(q, "device", None)
            if dev is not None and dev.type == "cuda":
                bk = key_block_size(dev, compute_mode)
        return sparse_attention(q, k, v, q2k_block_index, block_counts, topk=topk,
                                block_size_k=bk, softmax_scale=softmax_scale,
                                compute_mode=compute_mode, layout="BSHD", check_plan=check_plan)

    runner.compute_mode = compute_mode
    runner.block_size_k = block_size_k
    runner.__name__ = f"subblock_sage_{compute_mode}_runner"
    return runner


def get_runner(device, compute_mode: str = DEFAULT_COMPUTE_MODE) -> Callable:
    """The runner for ``device`` (resolved once per device and mode, like SGLang's
    ``_get_subblock_sparse_attention_runner``). Raises at once on a GPU no library serves."""
    check_compute_mode(compute_mode)
    index = cuda_device_index(device, "SubBlock sparse attention")
    key = (index, compute_mode)
    with _lock:
        r = _runners.get(key)
    if r is not None:
        return r
    from ..backends import backend_for

    lib = loader.library_for_device(index)
    target = lib.target
    backend_for(target).can_implement(lib, compute_mode, 64)  # ValueError naming what it serves
    bk = plan_block_size(target, compute_mode)
    r = make_runner(compute_mode, block_size_k=bk)
    with _lock:
        _runners[key] = r
    return r


def subblock_sparse_attention(q, k, v, q2k_block_index, topk, softmax_scale, block_counts=None,
                              *, compute_mode: str = DEFAULT_COMPUTE_MODE, block_size_k: Optional[int] = None):
    """One call with SGLang's argument order (``block_size_k`` default: SGLang's convention)."""
    return make_runner(compute_mode, block_size_k=block_size_k)(
        q, k, v, q2k_block_index, topk, softmax_scale, block_counts)


def validate(device=None, compute_mode: str = DEFAULT_COMPUTE_MODE):
    """Startup check for the backend resolver: raises StartupValidationError listing every
    problem with its fix (unsupported GPU such as a B300, old driver, broken install, failing
    self-test) instead of failing after the dense denoise steps."""
    from ..diagnostics.probes import validate_startup

    return validate_startup(compute_mode=compute_mode, device=device)
