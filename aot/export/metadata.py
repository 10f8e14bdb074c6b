"""What an export records about itself (``<prefix>.json``) and what a library embeds
(``exports.json``: every unit's record), plus the library's C shim."""

from __future__ import annotations

import json
from pathlib import Path

from aot.contract import ABI_VERSION
from aot.export.plan import Job


def unit_entry(job: Job, ciface: str, args: list[dict]) -> dict:
    """The record of one export (``<prefix>.json``, one entry of ``exports.json``): the kernel,
    its variant and parameters, the target, the symbol prefix, the launch entry (``ciface``,
    from the header), the upstream class it compiles (if any) and its argument layouts
    (:func:`aot.export.layout.arg_layouts`)."""
    return {
        "kernel": job.kernel.name,
        "variant": job.variant.name,
        "params": dict(job.variant.params),
        "target": job.target,
        "prefix": job.prefix,
        "ciface": ciface,
        "upstream": job.kernel.upstream,
        "args": args,
    }


def assemble(lib: str, target: str, host_arch: str, out_dir: Path, prefixes: list[str]) -> dict:
    """``exports.json`` (argument layouts of every kernel, embedded in the library) and ``shim.c``
    from a library's units. Imports neither the DSL nor a kernel module."""
    from aot import shim

    entries = [json.loads((out_dir / f"{p}.json").read_text()) for p in prefixes]
    exports = {
        "abi_version": ABI_VERSION,
        "library": lib,
        "target": target,
        "host_arch": host_arch,
        "kernels": entries,
    }
    text = json.dumps(exports, indent=1, sort_keys=True) + "\n"
    (out_dir / "exports.json").write_text(text)
    (out_dir / "shim.c").write_text(shim.generate(exports))
    return exports
