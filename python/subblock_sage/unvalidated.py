"""Compute modes shipped for a GPU but never validated on it, and the opt-in to use them anyway.

Sage (``sage_fp8``) on compute capability 12.1 (DGX Spark, served by the ``sm_120f`` family build)
has not been run anywhere, and FlashInfer itself enables its SM120 Sage kernel on 12.0 only (bf16 on
any 12.x). So ``validate_startup(compute_mode="sage_fp8")`` refuses it there unless the caller opts
in (``allow_unvalidated=True`` or ``SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1``), and ``check`` labels it:
in the listing of the install's libraries (with or without such a GPU) and on each such GPU.
The manifest's ``targets[t]["unvalidated"]`` carries the label; :data:`BUILTIN` covers installs
whose manifest predates it.

Sage on compute capability 10.0 / 10.3 (B200, B300: cuDNN frontend's SM100 Sage kernel, compiled
ahead of time, never run) is labelled the same way and is refused per call too
(``backends/sm100.py``, ``can_implement``) unless opted in.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

from .contract import UNVALIDATED

ENV = "SUBBLOCK_SAGE_ALLOW_UNVALIDATED"
# set by :func:`allowing`: `check`'s launch self-test of an unvalidated mode (it runs under the
# self-test deadline, so a hang fails `check` instead of a server)
_ALLOWING: contextvars.ContextVar[bool] = contextvars.ContextVar("subblock_sage_allowing", default=False)
BUILTIN = UNVALIDATED  # the contract's table: installs whose manifest predates the label


def table(meta: dict, target: str | None) -> dict[str, dict]:
    """``{compute_mode: {"capabilities": [...], "why": ...}}``: the modes this target ships
    unvalidated on some of its capabilities (the manifest's label, else :data:`BUILTIN`)."""
    return meta.get("unvalidated") or BUILTIN.get(target or "", {})


def labels(meta: dict, target: str | None, capability: str) -> dict[str, str]:
    """``{compute_mode: why}`` of the modes unvalidated on ``capability`` for this target."""
    return {mode: info.get("why", "unvalidated") for mode, info in table(meta, target).items()
            if capability in info.get("capabilities", [])}


def listing(mode: str, info: dict) -> str:
    """One line for the library listing: which mode, on which capabilities, the opt-in and why."""
    caps = ", ".join(info.get("capabilities", [])) or "?"
    return (f"{mode} on compute capability {caps} is UNVALIDATED, opt-in only ({ENV}=1): "
            f"{info.get('why', 'unvalidated')}")


def allowed(explicit: bool | None = None) -> bool:
    """The opt-in: ``explicit`` when given, else ``SUBBLOCK_SAGE_ALLOW_UNVALIDATED`` is 1/true/yes."""
    if explicit is not None:
        return bool(explicit)
    return _ALLOWING.get() or os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


@contextlib.contextmanager
def allowing():
    """Inside the block, calls of an unvalidated mode run as if opted in (the self-tests of
    `check`, which report them as UNVALIDATED)."""
    token = _ALLOWING.set(True)
    try:
        yield
    finally:
        _ALLOWING.reset(token)


def refusal(where: str, mode: str, why: str, target: str | None) -> str:
    return (f"{where}: compute_mode={mode!r} is UNVALIDATED on this GPU: {why}. It may work, but "
            f"nobody has checked its output or that it cannot hang here. Fix: use compute_mode='bf16' "
            f"on this GPU, or opt in knowingly with validate_startup(..., allow_unvalidated=True) or "
            f"{ENV}=1 (and check the output against compute_mode='bf16' on your workload)")
