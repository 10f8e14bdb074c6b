"""Exceptions. Every message names the cause and the fix."""

from __future__ import annotations


class SubblockSageError(RuntimeError):
    """Base class of the runtime's own errors (bad input raises ValueError/TypeError instead)."""


class KernelsNotInstalledError(SubblockSageError):
    pass


class TorchNotInstalledError(SubblockSageError, ImportError):
    """PyTorch is missing (torch_support.py). Also an ImportError, so that code which treats the
    ops as optional with ``except ImportError`` keeps working."""


class TorchVersionError(SubblockSageError):
    """The installed PyTorch is older than the runtime supports (torch_support.TORCH_MIN)."""


class VersionMismatchError(SubblockSageError):
    pass


class NoGPUError(SubblockSageError):
    pass


class DriverTooOldError(SubblockSageError):
    pass


class UnsupportedGPUError(SubblockSageError):
    pass


class LibraryIntegrityError(SubblockSageError):
    """A library is missing, corrupted (sha256 mismatch) or not what the manifest describes."""


class LaunchError(SubblockSageError):
    pass


class StartupValidationError(SubblockSageError):
    """Raised by validate_startup(): lists every problem found, each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"subblock-sage cannot serve this machine:\n{body}")


class SelfTestTimeoutError(StartupValidationError):
    """A self-test launch did not finish within the deadline (a kernel that never ends, or a GPU
    busy with other work): startup fails with this instead of hanging the server. A subclass of
    StartupValidationError, so callers catching that still catch it."""
