"""Which PyTorch the runtime works with, and the one error for a missing or too old one.

torch is no requirement of the wheels (serving stacks bring their own build of it), so
``import subblock_sage``, the loader and ``subblock-sage check`` work without it, and the public
ops check for it when first used (``subblock_sage.__getattr__``, ``subblock-sage bench``).

- Oldest: :data:`TORCH_MIN`, the oldest torch on which the whole CPU suite passes. The ops are
  ``torch.library.custom_op`` operators with ``register_fake`` implementations (both in torch
  since 2.4), but ``torch.compile(fullgraph=True)`` through the public wrappers needs more: on
  2.4.1 dynamo cannot trace them at all (``reconstruct: UserFunctionVariable``), and on 2.6.0,
  2.7.1 and 2.8.0 it traces them but turns a bad argument's ValueError into its own "Observed
  exception" without the message; 2.9.1 passes every CPU test (MEASUREMENTS.md). 2.9 is also the
  first torch with CUDA 13 builds, the CUDA of the kernels, and needs Python >= 3.10, as the
  wheels do. An older torch is refused with :class:`~subblock_sage.errors.TorchVersionError`.
- Newest tested: :data:`TORCH_TESTED`, the newest torch a test suite here has run on (the CPU suite
  on 2.14.1, the torch SGLang 0.5.23 pins and so every plugin user has; the GPU suite on
  2.11.0+cu130, H200). A newer torch is used, with one logged warning
  (and a ``check`` warning): no test has run on it.

tests/cpu/test_torch_support.py checks both ends on the CPU (the tests' torch, and with
``tests/run.sh --torch-min``, as ``.ci/run`` runs it, :data:`TORCH_MIN`'s torch in a venv of its own).
"""

from __future__ import annotations

import logging
import re

from .errors import TorchNotInstalledError, TorchVersionError

TORCH_MIN = (2, 9)
TORCH_TESTED = (2, 14)
# what to install: a CUDA build (the kernels need an NVIDIA driver r580+, i.e. CUDA 13)
INSTALL = (f'pip install "torch>={TORCH_MIN[0]}.{TORCH_MIN[1]}" (a CUDA build, e.g. from PyTorch\'s '
           f'cu130 index; tested up to {TORCH_TESTED[0]}.{TORCH_TESTED[1]})')

_warned: set[str] = set()


def version_tuple(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string (``"2.14.1+cu130"``, ``"2.10.0a0+git..."``);
    None when it does not start with two numbers."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m[1]), int(m[2])) if m else None


def dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def version_problem(version: str) -> str | None:
    """Why torch ``version`` cannot run the ops (one line with a Fix), or None."""
    have = version_tuple(version)
    if have is not None and have < TORCH_MIN:
        return (f"torch {version} is too old: subblock-sage needs torch >= {dotted(TORCH_MIN)} "
                f"(its ops are torch.library custom operators that torch.compile traces). Fix: {INSTALL}")
    return None


def version_warning(version: str) -> str | None:
    """A note when torch ``version`` is newer than any torch the tests have run on, or None."""
    have = version_tuple(version)
    if have is not None and have > TORCH_TESTED:
        return (f"torch {version} is newer than the newest torch subblock-sage has been tested with "
                f"({dotted(TORCH_TESTED)}); it is used, but untested. If a call fails, try torch "
                f"<= {dotted(TORCH_TESTED)} and report it")
    return None


def require_torch(what: str = "this call"):
    """Import and return torch, or raise the one error a user should see: TorchNotInstalledError
    (also an ImportError) when it is missing, TorchVersionError when it is older than
    :data:`TORCH_MIN`. A torch newer than :data:`TORCH_TESTED` logs one warning."""
    try:
        import torch
    except ImportError:
        raise TorchNotInstalledError(f"{what} needs PyTorch, which is not installed. Fix: {INSTALL}") from None
    problem = version_problem(torch.__version__)
    if problem:
        raise TorchVersionError(problem)
    note = version_warning(torch.__version__)
    if note and torch.__version__ not in _warned:
        _warned.add(torch.__version__)
        logging.getLogger("subblock_sage").warning("%s", note)
    return torch


def gpu_problem() -> str | None:
    """Why torch cannot use a GPU here (one line with a Fix), or None when it can."""
    import torch

    if torch.cuda.is_available():
        return None
    if getattr(torch.version, "cuda", None) is None:
        return (f"torch {torch.__version__} is a CPU-only build, so it cannot use a GPU. Fix: {INSTALL} "
                f"on a machine with an NVIDIA GPU (`subblock-sage check` lists what this one lacks)")
    return (f"no CUDA GPU is visible to torch {torch.__version__} (CUDA {torch.version.cuda}). Fix: run "
            f"on a machine with an NVIDIA GPU and driver r580+ (nvidia-smi must list it; check "
            f"CUDA_VISIBLE_DEVICES); `subblock-sage check` says what is missing")
