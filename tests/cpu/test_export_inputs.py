"""Which exports an edit invalidates (issue 59: "a quantizer edit recompiles only the quantizer's
exports"), by computing the export cache's keys, not by compiling.

Each shipped kernel module runs once as an export process would (``python -m aot.export unit``,
every unit of the module for its first target, no cache), with ``export_job`` replaced by one that
does all but the compile: the kernel's compile spec and its fake arguments, which import what the
compile traces (the kernel classes). Its depfile lists the repository files the process read: the
dependency set the export cache records with each unit. The units of every target are then stored
in a private cache with those sets, and looked up against a copy of the files with one file
edited: a miss is an export the edit recompiles. (A module imports the same files for every
target; the target is in the unit key.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot

ROOT = Path(__file__).resolve().parents[2]
QUANTIZER = "aot.kernels.sage_quant"

# `aot.export unit` with the compile left out (outside the repository: not an input itself)
DRIVER = r"""
import sys
import aot.export.unit as u
from aot.export.cli import main
from aot.export.fake import make_fakes

def spec_only_export_job(job, out_dir, host_arch, spec=None):
    spec = spec or job.kernel.compile_spec(job.target, job.variant)
    spec.bind(make_fakes(spec.args))
    (out_dir / f"{job.prefix}.o").write_bytes(b"")
    (out_dir / f"{job.prefix}.h").write_text("")
    return {"prefix": job.prefix, "compile_seconds": 0.0}

u.export_job = spec_only_export_job
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def module_inputs(tmp_path_factory) -> tuple[dict[str, set[str]], list[tuple]]:
    """({kernel module: repository files its export process reads}, every shipped unit as
    (module, kernel, variant, target))."""
    from aot.export import plan

    tmp = tmp_path_factory.mktemp("inputs")
    (tmp / "driver.py").write_text(DRIVER)
    units: list[tuple] = []
    first: dict[str, str] = {}
    for lib, jobs in plan().items():
        if lib.startswith("test_"):
            continue
        for j in jobs:
            units.append((j.module, j.kernel.name, j.variant.name, j.target))
            first.setdefault(j.module, j.target)

    def deps(module: str) -> tuple[str, set[str]]:
        target = first[module]
        todo = [f"{k}:{v}" for m, k, v, t in units if m == module and t == target]
        out = tmp / module
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(ROOT), SBS_EXPORT_HOSTS="")
        res = subprocess.run(
            [sys.executable, str(tmp / "driver.py"), "unit", "--module", module, "--target", target,
             *(a for u in todo for a in ("--unit", u)), "--no-cache", "--out", str(out),
             "--depfile", str(out / "deps.d")],
            cwd=ROOT, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = [x.strip(" \\") for x in (out / "deps.d").read_text().splitlines()[1:]]
        return module, {Path(x).relative_to(ROOT).as_posix() for x in lines if x.startswith(f"{ROOT}/")}

    with ThreadPoolExecutor(2) as pool:
        inputs = dict(pool.map(deps, sorted(first)))
    return inputs, units


def recompiled(module_inputs, tmp_path: Path, edit: str) -> list[tuple]:
    """The shipped units whose cache entry (stored with their module's inputs) misses once
    ``edit`` (a repository path) has changed: the export cache's own lookup, on a copy of the
    inputs with ``edit`` changed."""
    from aot import export_cache
    from aot.export.identity import unit_identity

    inputs, units = module_inputs
    src = tmp_path / "src"
    for rel in set().union(*inputs.values()):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, src / rel)
    cache = export_cache.Cache(tmp_path / "cache")
    (tmp_path / "x.o").write_bytes(b"x")
    keys = {}
    for module, k, v, t in units:
        keys[(module, k, v, t)] = key = export_cache.digest(unit_identity(module, k, v, t, False, "x86_64"))
        deps = {rel: export_cache.file_sha256(src / rel) for rel in sorted(inputs[module])}
        cache.store(key, deps, {"x.o": tmp_path / "x.o"})
    assert all(cache.lookup(key, src_root=src) for key in keys.values())  # unchanged: every unit hits
    (src / edit).write_text((src / edit).read_text() + "\n# edited\n")
    return [u for u, key in keys.items() if cache.lookup(key, src_root=src) is None]


def test_a_quantizer_edit_recompiles_only_the_quantizer(module_inputs, tmp_path):
    """Its 20 exports (4 variants x 5 targets), no other: the sm_90a kernels run the quantizer's
    Q numerics but import them from aot/kernels/sage_numerics, not from the quantizer package."""
    inputs, units = module_inputs
    quantizer_files = sorted(p for p in inputs[QUANTIZER] if p.startswith("aot/kernels/sage_quant/"))
    assert "aot/kernels/sage_quant/__init__.py" in quantizer_files
    assert "aot/kernels/sage_quant/kernel.py" in quantizer_files  # what the compile traces
    assert {m for m, files in inputs.items() if set(quantizer_files) & files} == {QUANTIZER}, {
        m: sorted(set(quantizer_files) & files) for m, files in inputs.items()}
    again = recompiled(module_inputs, tmp_path, "aot/kernels/sage_quant/__init__.py")
    assert sorted(again) == sorted(u for u in units if u[0] == QUANTIZER)
    assert len(again) == 20, json.dumps(again)


def test_the_shared_numerics_recompile_both_users(module_inputs, tmp_path):
    """aot/kernels/sage_numerics/q_tile.py: the quantizer's and the sm_90a kernels' exports."""
    again = recompiled(module_inputs, tmp_path, "aot/kernels/sage_numerics/q_tile.py")
    assert {u[0] for u in again} == {QUANTIZER, "aot.kernels.sm90"}
    assert len(again) == len([u for u in module_inputs[1] if u[0] in (QUANTIZER, "aot.kernels.sm90")])


@pytest.mark.parametrize("shared", ["python/subblock_sage/contract.py", "aot/contract.py", "aot/registry.py"])
def test_a_shared_file_edit_recompiles_every_importer(module_inputs, tmp_path, shared):
    """The contract (read by every kernel module and by the registry) and the registry: every
    shipped export."""
    assert recompiled(module_inputs, tmp_path, shared) == module_inputs[1]
