"""Deadline-bounded waits for the startup self-tests (``check`` / ``validate_startup``).

Why: a kernel that never finishes (a scheduler hang on an untested GPU, a pipeline deadlock) would
make ``torch.cuda.synchronize()`` block forever, so a server would hang at startup instead of
failing. The self-tests instead record a CUDA event after their launches and poll
``event.query()`` until a deadline (default 60 s; ``SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S`` overrides
it), then raise :class:`~subblock_sage.errors.SelfTestTimeoutError`.

They run on a dedicated per-device stream (:func:`selftest_stream`): an idle-wait on it before
the first allocation (a blocking host-to-device copy waits on the current stream) makes even a
stream that is already stuck fail within the deadline. A kernel that hangs stays resident on the
GPU; the process should exit (it cannot be cancelled from the host).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

from .errors import SelfTestTimeoutError

ENV = "SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
_streams: dict[int, object] = {}


def timeout_s() -> float:
    """The self-test deadline in seconds (``SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S``, default 60)."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{ENV}={raw!r} is not a positive number of seconds. Fix: unset it (default "
                         f"{DEFAULT_TIMEOUT_S:g} s) or set e.g. {ENV}=120")
    return value


def fix_hint(target: str | None = None) -> str:
    on = f" with the {target} kernels" if target else ""
    return (f"Fix: make sure no other work occupies this GPU and rerun; if it persists, do not "
            f"serve this GPU{on} and report it with the output of `subblock-sage check --json`; "
            f"a GPU that is legitimately slow can get a longer deadline with {ENV}=<seconds> "
            f"(now {timeout_s():g} s)")


def wait_event(event, what: str, *, timeout: float | None = None, clock=time.monotonic,
               sleep=time.sleep) -> float:
    """Poll ``event.query()`` until it is True or ``timeout`` seconds pass; returns the seconds
    waited, raises SelfTestTimeoutError naming ``what`` (the GPU and target) on the deadline."""
    limit = timeout_s() if timeout is None else timeout
    start = clock()
    pause = 1e-4
    while not event.query():
        waited = clock() - start
        if waited >= limit:
            raise SelfTestTimeoutError([f"{what}: the self-test launch did not finish within "
                                        f"{limit:g} s (a kernel that never ends, or a busy GPU). "
                                        f"{fix_hint()}"])
        sleep(min(pause, max(limit - waited, 0.0)))
        pause = min(pause * 2, 0.01)
    return clock() - start


def wait_stream(device: int, what: str, *, timeout: float | None = None) -> float:
    """Record an event on ``device``'s current stream and wait for it with the deadline."""
    import torch

    with torch.cuda.device(device):
        ev = torch.cuda.Event()
        ev.record()
    return wait_event(ev, what, timeout=timeout)


def selftest_stream(device: int):
    """The stream the self-tests of ``device`` run on (created once, non-blocking)."""
    import torch

    if device not in _streams:
        _streams[device] = torch.cuda.Stream(device=device)
    return _streams[device]


@contextlib.contextmanager
def on_selftest_stream(device: int, what: str):
    """Make the self-test stream current, after waiting (with the deadline) for it to be idle."""
    import torch

    s = selftest_stream(device)
    with torch.cuda.device(device), torch.cuda.stream(s):
        wait_stream(device, what)
        yield s
