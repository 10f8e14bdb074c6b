"""Build-time source patches of pinned upstream files (applied in memory, never written anywhere).

Why: FlashInfer 0.7.2.post1's SM120 classes have a write-after-read race on the K/V shared-memory
stages. The consumer warps read a K or V tile with ordinary (generic-proxy) loads and then arrive
on the stage's *empty* mbarrier; the producer's next TMA load (async proxy) may overwrite the stage
before those reads are ordered, because an mbarrier arrive alone is not a cross-proxy fence.
Upstream fixed it in flashinfer-ai/flashinfer commit 33a9d8720800e7497838f2445896a06c270aa2ef by
one ``cute.arch.fence_view_async_shared()`` immediately before ``K_pipeline.consumer_release(...)``
and before ``V_pipeline.consumer_release(...)`` in the consumer loop of both kernels. No release on
PyPI carries the fix yet, so the build applies exactly that change to the installed, pinned files.

The rule is deliberately small and explicit (:class:`SourcePatch`):

* if the fence statement already sits right before *every* anchor line (a FlashInfer release
  with the fix), nothing is changed and that is recorded (``status="already-fixed"``);
* otherwise the file's sha256 must be the pinned one (the exact 0.7.2.post1 bytes), and each
  anchor must occur exactly once as a whole line; anything else fails the build with
  :class:`UpstreamPatchError` naming the file and the anchor;
* the fence is inserted before each anchor with the anchor's indentation.

:mod:`aot.upstream.flashinfer_import` compiles the patched text as the module (real module name,
package and relative imports; a ``<file> [patched ...]`` code filename whose source is served from
memory, so the DSL's source inspection sees the patched text). The manifest records every patch
(:func:`manifest_records`); ``aot/upstream/PATCHES.md`` describes them for humans.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aot.contract import BF16, SAGE_FP8, attention_kernel

FENCE = "cute.arch.fence_view_async_shared()"
FENCE_COMMIT = "33a9d8720800e7497838f2445896a06c270aa2ef"
FENCE_REASON = (
    "SM120 K/V stage-reuse race: consumer warps read a K/V shared-memory stage with ordinary loads "
    "and then release it; without a proxy fence the next TMA load (async proxy) may overwrite the "
    "stage before those reads are ordered. Upstream fix: a fence_view_async_shared() immediately "
    "before K_pipeline.consumer_release and V_pipeline.consumer_release (flashinfer-ai/flashinfer "
    f"commit {FENCE_COMMIT}, not yet in a PyPI release)."
)
_K_RELEASE = "            K_pipeline.consumer_release(K_consumer_state)"
_V_RELEASE = "            V_pipeline.consumer_release(V_consumer_state)"


class UpstreamPatchError(RuntimeError):
    """An upstream file is not exactly what a patch rule expects: the build must stop."""


@dataclass(frozen=True)
class SourcePatch:
    """Insert ``statement`` (indented like the anchor) right before each anchor line.

    ``relpath`` is relative to the installed package directory (``flashinfer/``); ``sha256`` is
    the digest of the pinned, unpatched file; ``anchors`` are whole lines, indentation included.
    """

    module: str
    relpath: str
    sha256: str
    anchors: tuple[str, ...]
    statement: str
    reason: str
    upstream_commit: str
    kernels: tuple[str, ...] = ()


@dataclass(frozen=True)
class PatchResult:
    text: str
    status: str  # "patched" | "already-fixed"
    original_sha256: str
    patched_sha256: str


def _fence_patch(name: str, sha256: str, kernel: str) -> SourcePatch:
    """The upstream fence fix for one of the two SM120 kernel files (same anchors, same reason)."""
    return SourcePatch(
        module=f"flashinfer.cute_dsl.sparse.sm120_blk64.{name}",
        relpath=f"cute_dsl/sparse/sm120_blk64/{name}.py",
        sha256=sha256,
        anchors=(_K_RELEASE, _V_RELEASE),
        statement=FENCE,
        reason=FENCE_REASON,
        upstream_commit=FENCE_COMMIT,
        kernels=(kernel,),
    )


# sha256 of the pinned, unpatched flashinfer-python 0.7.2.post1 files
PATCHES: tuple[SourcePatch, ...] = (
    _fence_patch("flash_fwd_sm120", "0ebb538477f8f4e7e0ce3e3d5e94583d3e8c68c7eb381c5d8d0955994b16ee8f",
                 attention_kernel("sm120", BF16.name)),
    _fence_patch("flash_fwd_sm120_sage", "e0801d56003fd6a9cdb8a9415f82e14d5d97831185f71d8ac62caac7500b8fdb",
                 attention_kernel("sm120", SAGE_FP8.name)),
)
BY_MODULE = {p.module: p for p in PATCHES}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _previous_code_line(lines: list[str], i: int) -> str | None:
    for j in range(i - 1, -1, -1):
        if lines[j].strip():
            return lines[j].strip()
    return None


def apply(patch: SourcePatch, text: str, *, filename: str | None = None) -> PatchResult:
    """Apply ``patch`` to the file content ``text`` (see the module docstring for the rule)."""
    where = filename or patch.relpath
    lines = text.splitlines(keepends=True)
    bare = [ln.rstrip("\r\n") for ln in lines]
    positions = {}
    for anchor in patch.anchors:
        hits = [i for i, ln in enumerate(bare) if ln == anchor]
        positions[anchor] = hits
    fixed = [a for a in patch.anchors
             if len(positions[a]) == 1 and _previous_code_line(bare, positions[a][0]) == patch.statement]
    original = _sha(text)
    if len(fixed) == len(patch.anchors):
        return PatchResult(text, "already-fixed", original, original)
    if fixed:
        raise UpstreamPatchError(
            f"{where}: the fence {patch.statement!r} is present before {fixed} but not before the "
            f"other anchors of {patch.anchors}; this is neither the pinned file nor the upstream fix "
            f"(commit {patch.upstream_commit}). Fix: review the file and update aot/upstream/patches.py"
        )
    if original != patch.sha256:
        raise UpstreamPatchError(
            f"{where}: sha256 {original} is not the pinned {patch.sha256}, and the fence of commit "
            f"{patch.upstream_commit} is not already there; the patch rule only applies to the exact "
            f"pinned bytes. Fix: reinstall the pinned flashinfer-python, or review the new file and "
            f"update the pin in aot/upstream/patches.py"
        )
    for anchor, hits in positions.items():
        if len(hits) != 1:
            raise UpstreamPatchError(
                f"{where}: anchor line {anchor.strip()!r} (exact indentation) occurs {len(hits)} "
                f"times, expected exactly once. Fix: update the anchors in aot/upstream/patches.py"
            )
    inserts = sorted((hits[0], anchor) for anchor, hits in positions.items())
    out = list(lines)
    for i, anchor in reversed(inserts):
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        eol = lines[i][len(bare[i]):] or "\n"
        out.insert(i, f"{indent}{patch.statement}{eol}")
    patched = "".join(out)
    return PatchResult(patched, "patched", original, _sha(patched))


def apply_installed(patch: SourcePatch, package_dir: Path) -> tuple[Path, PatchResult]:
    path = package_dir / patch.relpath
    if not path.is_file():
        raise UpstreamPatchError(f"{path}: file to patch is missing. Fix: reinstall the pinned flashinfer-python")
    return path, apply(patch, path.read_bytes().decode(), filename=str(path))


def manifest_records(package_dir: Path, kernels: set[str] | None = None) -> list[dict]:
    """One record per patched upstream file whose kernels are in ``kernels`` (all when None)."""
    out = []
    for p in PATCHES:
        if kernels is not None and not set(p.kernels) & kernels:
            continue
        _, res = apply_installed(p, package_dir)
        out.append({
            "file": f"flashinfer/{p.relpath}",
            "module": p.module,
            "kernels": list(p.kernels),
            "status": res.status,
            "original_sha256": res.original_sha256,
            "patched_sha256": res.patched_sha256,
            "change": f"insert `{p.statement}` before each of: " + "; ".join(a.strip() for a in p.anchors),
            "reason": p.reason,
            "upstream_commit": p.upstream_commit,
        })
    return out
