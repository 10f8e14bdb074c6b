"""Attention backends, one module per GPU target family, sharing :class:`base.Backend`.

    sm_90a           -> sm90.py   (this project's own Hopper kernels)
    sm_120a, sm_120f -> sm120.py  (FlashInfer's SM120 Sage / bf16 classes, AOT-built)
    sm_100a, sm_100f -> sm100.py  (FlashInfer's SM100 blk64 bf16 class, AOT-built)

(a target's ``family`` in ``contract.TARGETS`` names its module; the family's kernels per mode:
``contract.ATTENTION``).

The call pipeline (``ops/pipeline.py``) validates a call once (its frozen description), asks the
backend of the device's target once whether it can implement it (``pipeline.serve`` ->
``can_implement``: the one place a target-specific limit is stated), and hands it the canonical
views and a prepared ``plan.Plan``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib

from ..contract import TARGETS
from ..errors import UnsupportedGPUError

# target -> module whose ``BACKEND`` serves it (``.<family>``: contract.TARGETS); imported on first use
BACKENDS: dict[str, str] = {t.name: f".{t.family}" for t in TARGETS.values()}


# target family -> the backend that ``using`` put in place of the module's ``BACKEND``
_USING: contextvars.ContextVar[dict] = contextvars.ContextVar("subblock_sage_backends_using", default={})


def backend_for(target: str):
    """The backend object serving ``target`` (the one ``using`` put in place, if any)."""
    try:
        backend = importlib.import_module(BACKENDS[target], __name__).BACKEND
    except (KeyError, ImportError, AttributeError) as e:
        raise UnsupportedGPUError(
            f"this build of subblock-sage has no sparse-attention backend for {target} ({e})"
        ) from e
    return _USING.get().get(backend.target_family, backend)


@contextlib.contextmanager
def using(backend):
    """Serve every call on ``backend``'s target family with ``backend`` inside the block, e.g.
    ``with using(sm90.BACKEND.with_policy(sage_cluster=1)):`` (benchmarks and tests that run
    another selection policy through the public call; a single call can pass ``backend=``
    instead). Calls replayed from a recording made outside the block keep the kernels they
    recorded: enter it before the first call of a shape."""
    token = _USING.set({**_USING.get(), backend.target_family: backend})
    try:
        yield backend
    finally:
        _USING.reset(token)


__all__ = ["BACKENDS", "backend_for", "using"]
