"""Attention backends, one module per GPU target family, sharing :class:`base.Backend`.

    sm_90a           -> sm90.py   (this project's own Hopper kernels)
    sm_120a, sm_120f -> sm120.py  (FlashInfer's SM120 Sage / bf16 classes, AOT-built)
    sm_100a, sm_100f -> sm100.py  (FlashInfer's SM100 blk64 bf16 class, AOT-built)

``ops.attention`` validates a call once (``validation.check_attention_args``), asks the
backend of the device's target whether it can implement it (``can_implement``: the one place a
target-specific limit is stated), and hands it the canonical views and a prepared ``plan.Plan``.
"""

from __future__ import annotations

import importlib

from ..errors import UnsupportedGPUError

# target -> module whose ``BACKEND`` serves it; imported on first use
BACKENDS: dict[str, str] = {
    "sm_90a": ".sm90",
    "sm_100a": ".sm100",
    "sm_100f": ".sm100",
    "sm_120a": ".sm120",
    "sm_120f": ".sm120",
}


def backend_for(target: str):
    """The backend object serving ``target``."""
    try:
        return importlib.import_module(BACKENDS[target], __name__).BACKEND
    except (KeyError, ImportError, AttributeError) as e:
        raise UnsupportedGPUError(
            f"this build of subblock-sage has no sparse-attention backend for {target} ({e})"
        ) from e


__all__ = ["BACKENDS", "backend_for"]
