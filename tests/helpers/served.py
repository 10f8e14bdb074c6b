"""What the GPU under test must serve, decided from the installed manifest, never from whether a
call happens to work.

Why: a helper that catches "no backend / no library" and returns an empty tuple turns every test
that loops over compute modes into a pass that checked nothing (issue 21). Here a GPU whose
compute capability the manifest lists must serve every compute mode its target ships
(:data:`SHIPPED_MODES`, the README's support table): if it does not, the test FAILS. Only a GPU
the manifest does not list at all (nothing is promised for it) makes a test skip.

Public API only: ``subblock_sage.manifest()`` and ``subblock_sage.validate_startup()`` (which
loads the library, checks its sha256 and runs the launch self-tests of the mode).
"""

from __future__ import annotations

import functools

import pytest

# README "What is supported": compute modes of `sparse_attention` per shipped target.
SHIPPED_MODES = {
    "sm_90a": ("bf16", "sage_fp8"),
    "sm_120a": ("bf16", "sage_fp8"),
    "sm_120f": ("bf16", "sage_fp8"),
    "sm_100a": ("bf16",),
    "sm_100f": ("bf16",),
}
MODES = ("bf16", "sage_fp8")


def device_index(device=None) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def manifest_target(device=None) -> str:
    """The manifest's target for this GPU's compute capability; skips the test when the manifest
    lists none (an unsupported GPU: nothing is promised for it)."""
    import torch

    import subblock_sage

    cap = torch.cuda.get_device_capability(device_index(device))
    cc = f"{cap[0]}.{cap[1]}"
    for name, t in sorted(subblock_sage.manifest()["targets"].items()):
        if cc in t["capabilities"]:
            return name
    pytest.skip(f"compute capability {cc} is not served by this install (manifest targets: "
                f"{sorted(subblock_sage.manifest()['targets'])})")


@functools.lru_cache(maxsize=None)
def _validated(index: int) -> tuple:
    import subblock_sage

    target = manifest_target(index)
    assert target in SHIPPED_MODES, f"{target} is in the manifest but not in SHIPPED_MODES: add it"
    for mode in SHIPPED_MODES[target]:
        # raises StartupValidationError (so the test fails) if the library is missing, corrupt,
        # does not load, lacks the mode's kernels or fails its self-test
        subblock_sage.validate_startup(compute_mode=mode, device=index)
    return SHIPPED_MODES[target]


def attention_modes(device=None) -> tuple:
    """Compute modes ``sparse_attention`` must serve on ``device`` (never empty for a GPU the
    manifest lists; the test fails if one of them is not actually served)."""
    return _validated(device_index(device))


def need_mode(mode: str, device=None) -> None:
    """Skip only when the device's target does not ship ``mode`` by design (e.g. Sage on sm_100a);
    fail when it should and does not."""
    modes = attention_modes(device)
    if mode not in modes:
        pytest.skip(f"compute_mode={mode!r} is not shipped for {manifest_target(device)} "
                    f"(it ships {modes})")
