"""Export units and the export cache (issue 22), without CuTe-DSL: ``aot.export.unit.export_job`` is
replaced by a fake that writes deterministic outputs, everything else is the real code running in
its own process (as under Ninja), in a private copy of the repository's ``aot/`` and fixtures."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs one unit with export_job faked: .o/.h derived from the kernel module's RULES, so that an
# input change shows in the output too.
DRIVER = r"""
import sys
from pathlib import Path
import aot.export.unit as u
from aot.export.cli import main

def fake_export_job(job, out_dir, host_arch, spec=None):
    import importlib
    rules = importlib.import_module(job.module).RULES
    (out_dir / f"{job.prefix}.o").write_bytes(f"obj {job.prefix} {host_arch} {rules}".encode())
    (out_dir / f"{job.prefix}.h").write_text(f"// header {job.prefix}\n")
    return {"kernel": job.kernel.name, "variant": job.variant.name, "prefix": job.prefix,
            "args": [], "compile_seconds": 1.0}

u.export_job = fake_export_job
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def repo(tmp_path):
    """A private repository copy: aot/ and the fixture kernel package (editable by the test)."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "aot", root / "aot", ignore=shutil.ignore_patterns("__pycache__"))
    # the build/runtime contract aot/contract.py reads (as aot.runtime.contract)
    (root / "python" / "subblock_sage").mkdir(parents=True)
    shutil.copy(ROOT / "python" / "subblock_sage" / "contract.py", root / "python" / "subblock_sage" / "contract.py")
    fx = root / "tests" / "cpu" / "fixtures"
    fx.mkdir(parents=True)
    for init in ("tests/__init__.py", "tests/cpu/__init__.py", "tests/cpu/fixtures/__init__.py"):
        (root / init).write_text("")
    for name in ("fake_unit_kernel.py", "fake_unit_helper.py", "fake_unit_rules.txt"):
        shutil.copy(ROOT / "tests" / "cpu" / "fixtures" / name, fx / name)
    (tmp_path / "driver.py").write_text(DRIVER)  # outside the repository: not an input
    return root


def run_unit(repo: Path, cache: Path, out: Path, variant="default", host="x86_64", extra=(),
             hosts=""):
    env = dict(os.environ, SBS_EXPORT_CACHE=str(cache), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=str(repo), SBS_EXPORT_HOSTS=hosts)
    res = subprocess.run(
        [sys.executable, str(repo.parent / "driver.py"), "unit", "--module", "tests.cpu.fixtures.fake_unit_kernel",
         "--kernel", "fake_unit", "--variant", variant, "--target", "sm_90a", "--host-arch", host,
         "--out", str(out), "--depfile", str(out / f"sbs_sm90a_fake_unit_{variant}.d"), *extra],
        cwd=repo, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def outputs(out: Path, variant="default") -> dict[str, bytes]:
    p = f"sbs_sm90a_fake_unit_{variant}"
    return {s: (out / f"{p}{s}").read_bytes() for s in (".o", ".h", ".json")}


def test_miss_then_hit_in_another_build_dir(repo, tmp_path):
    cache = tmp_path / "cache"
    log1 = run_unit(repo, cache, tmp_path / "b1")
    assert "compiled" in log1 and "cache hit" not in log1
    log2 = run_unit(repo, cache, tmp_path / "b2")
    assert "cache hit" in log2, log2
    assert outputs(tmp_path / "b1") == outputs(tmp_path / "b2")
    entry = json.loads(outputs(tmp_path / "b2")[".json"])
    assert entry["prefix"] == "sbs_sm90a_fake_unit_default" and "compile_seconds" not in entry
    # a different host CPU or variant is a different unit
    assert "compiled" in run_unit(repo, cache, tmp_path / "b3", host="aarch64")
    assert "compiled" in run_unit(repo, cache, tmp_path / "b3", variant="other")


def test_other_host_cpu_prefilled_by_the_same_process(repo, tmp_path):
    cache = tmp_path / "cache"
    log = run_unit(repo, cache, tmp_path / "x", hosts="x86_64 aarch64")
    assert "compiled +aarch64" in log, log
    assert "cache hit" in run_unit(repo, cache, tmp_path / "a", host="aarch64", hosts="x86_64 aarch64")
    # same bytes as the aarch64 unit compiled by a process of its own
    run_unit(repo, tmp_path / "cache2", tmp_path / "a2", host="aarch64")
    assert outputs(tmp_path / "a") == outputs(tmp_path / "a2")
    assert not list((tmp_path / "x").glob(".*"))  # no leftovers in the build dir
    # on a hit nothing is compiled for the other host
    assert "cache hit" in run_unit(repo, cache, tmp_path / "x", hosts="x86_64 aarch64")


def test_build_dir_inside_the_repository(repo, tmp_path):
    """Outputs written under the repository (build.sh's wheels/.cmake) are not inputs: a second
    clone's build dir hits."""
    cache = tmp_path / "cache"
    run_unit(repo, cache, repo / "wheels" / ".cmake" / "x86_64" / "aot" / "sm90a",
             hosts="x86_64 aarch64")
    other = tmp_path / "clone2"
    shutil.copytree(repo, other, ignore=shutil.ignore_patterns("wheels"))
    assert "cache hit" in run_unit(other, cache, other / "wheels" / ".cmake" / "aarch64" / "aot" / "sm90a",
                                   host="aarch64")
    assert "cache hit" in run_unit(other, cache, other / "wheels" / ".cmake" / "x86_64" / "aot" / "sm90a")


def test_several_units_in_one_process(repo, tmp_path):
    """Units of one kernel module share a process (one DSL import); each is cached by itself."""
    cache = tmp_path / "cache"
    run_unit(repo, cache, tmp_path / "solo", variant="other")  # cached alone first
    out = tmp_path / "b"
    log = run_unit(repo, cache, out, extra=("--unit", "fake_unit:other"))
    lines = [x for x in log.splitlines() if x.startswith("export ")]
    assert len(lines) == 2, log
    assert "sbs_sm90a_fake_unit_default" in lines[0] and "compiled" in lines[0]
    assert "sbs_sm90a_fake_unit_other" in lines[1] and "cache hit" in lines[1]
    assert "2 units of tests.cpu.fixtures.fake_unit_kernel for sm_90a in one process" in log
    assert outputs(out, "other") == outputs(tmp_path / "solo", "other")
    # the first unit's depfile covers the group; each unit has its time record
    assert "fake_unit_helper.py" in (out / "sbs_sm90a_fake_unit_default.d").read_text()
    assert json.loads((out / "sbs_sm90a_fake_unit_other.time.json").read_text())["cached"]
    assert "cache hit" in run_unit(repo, cache, tmp_path / "solo2")  # stored by the group


def test_depfile_lists_exactly_the_files_opened(repo, tmp_path):
    out = tmp_path / "b"
    for _ in range(2):  # compiled, then from the cache: same depfile
        run_unit(repo, tmp_path / "cache", out)
        text = (out / "sbs_sm90a_fake_unit_default.d").read_text()
        lines = [x.strip(" \\") for x in text.splitlines()]
        assert lines[0] == f"{out / 'sbs_sm90a_fake_unit_default.o'}:"
        repo_deps = {Path(x).relative_to(repo).as_posix() for x in lines[1:] if x.startswith(str(repo))}
        assert repo_deps == {
            "aot/__init__.py", "aot/contract.py", "aot/runtime/__init__.py", "python/subblock_sage/contract.py",
            *(f"aot/export/{m}.py" for m in ("__init__", "cli", "fake", "header", "identity", "layout", "metadata",
                                              "plan", "summary", "unit")),
            "aot/registry.py",
            "tests/__init__.py", "tests/cpu/__init__.py", "tests/cpu/fixtures/__init__.py",
            "tests/cpu/fixtures/fake_unit_kernel.py", "tests/cpu/fixtures/fake_unit_helper.py",
            "tests/cpu/fixtures/fake_unit_rules.txt",  # read at import time: an input too
        }, repo_deps


@pytest.mark.parametrize("edit", ["tests/cpu/fixtures/fake_unit_rules.txt",
                                  "tests/cpu/fixtures/fake_unit_helper.py", "aot/registry.py"])
def test_an_input_change_misses_and_reverting_hits_again(repo, tmp_path, edit):
    cache = tmp_path / "cache"
    run_unit(repo, cache, tmp_path / "b")
    before = outputs(tmp_path / "b")
    original = (repo / edit).read_text()
    (repo / edit).write_text(original + "\n# changed\n")
    assert "compiled" in run_unit(repo, cache, tmp_path / "b")
    (repo / edit).write_text(original)
    assert "cache hit" in run_unit(repo, cache, tmp_path / "b")  # both dependency sets remembered
    assert outputs(tmp_path / "b") == before


def test_unrelated_file_change_still_hits(repo, tmp_path):
    cache = tmp_path / "cache"
    run_unit(repo, cache, tmp_path / "b")
    (repo / "aot" / "manifest.py").write_text("# not imported by an export unit\n")
    (repo / "aot" / "export_cache.py").write_text(
        (repo / "aot" / "export_cache.py").read_text() + "\n# the cache itself is no input\n")
    assert "cache hit" in run_unit(repo, cache, tmp_path / "b")


def test_corrupt_entry_is_detected_and_recompiled(repo, tmp_path):
    cache = tmp_path / "cache"
    run_unit(repo, cache, tmp_path / "b1")
    (obj,) = cache.glob("results/*/*/sbs_sm90a_fake_unit_default.o")
    obj.write_bytes(b"garbage")
    log = run_unit(repo, cache, tmp_path / "b2")
    assert "fails its sha256 check" in log and "compiled" in log
    assert outputs(tmp_path / "b2") == outputs(tmp_path / "b1")
    assert "cache hit" in run_unit(repo, cache, tmp_path / "b3")


def test_no_cache_flag_and_off(repo, tmp_path):
    cache = tmp_path / "cache"
    run_unit(repo, cache, tmp_path / "b", extra=("--no-cache",))
    assert not cache.exists()
    for _ in range(2):  # SBS_EXPORT_CACHE=off: never a hit, nothing stored
        assert "compiled" in run_unit(repo, Path("off"), tmp_path / "b")
    assert not (repo / "off").exists()


def _store(args):
    root, i = args
    sys.path.insert(0, str(ROOT))
    from aot.export_cache import Cache

    src = Path(root) / f"src{i}"
    src.mkdir()
    (src / "a.o").write_bytes(b"same bytes")
    c = Cache(Path(root) / "cache")
    c.store("k" * 64, {"x.py": "0" * 64}, {"a.o": src / "a.o"})
    return True


def test_concurrent_stores_of_one_key(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert all(pool.map(_store, [(str(tmp_path), i) for i in range(8)]))
    from aot.export_cache import Cache

    c = Cache(tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("results/*/*/meta.json"))) == 1
    cands = json.loads(c._unit_file("k" * 64).read_text())["candidates"]
    assert len(cands) == 1
    assert not list((tmp_path / "cache").glob("results/*/.tmp-*"))


def test_lru_eviction_keeps_the_recently_used(tmp_path):
    from aot.export_cache import Cache

    c = Cache(tmp_path / "cache", limit=2500)
    srcs = []
    for i in range(3):
        f = tmp_path / f"o{i}"
        f.write_bytes(bytes([i]) * 1000)
        srcs.append(f)
    dep = tmp_path / "dep.py"
    dep.write_text("x")
    from aot.export_cache import file_sha256

    deps = {"dep.py": file_sha256(dep)}
    c.store("a" * 64, deps, {"o": srcs[0]})
    time.sleep(0.05)
    c.store("b" * 64, deps, {"o": srcs[1]})
    time.sleep(0.05)
    assert c.lookup("a" * 64, tmp_path) is not None  # a is now the most recently used
    time.sleep(0.05)
    c.store("c" * 64, deps, {"o": srcs[2]})  # 3000 bytes > 2500: the LRU one (b) goes
    assert c.lookup("b" * 64, tmp_path) is None
    assert c.lookup("a" * 64, tmp_path) is not None and c.lookup("c" * 64, tmp_path) is not None
    s = c.stats()
    assert s["results"] == 2 and s["evicted"] == 1 and s["bytes"] == 2000


def test_size_setting_and_cli(tmp_path, monkeypatch):
    from aot import export_cache

    assert export_cache.parse_size("4G") == 4 << 30 and export_cache.parse_size("500M") == 500 << 20
    assert export_cache.parse_size("1048576") == 1 << 20
    with pytest.raises(ValueError, match="Fix: use e.g. 4G"):
        export_cache.parse_size("lots")
    monkeypatch.setenv("SBS_EXPORT_CACHE", str(tmp_path / "c"))
    assert export_cache.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("SBS_EXPORT_CACHE", "off")
    assert export_cache.default_cache() is None
    monkeypatch.delenv("SBS_EXPORT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert export_cache.cache_dir() == tmp_path / "xdg" / "subblock-sage" / "exports"
    env = dict(os.environ, SBS_EXPORT_CACHE=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-m", "aot.export_cache", "stats"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "0 hits, 0 misses" in out and str(tmp_path / "c") in out
    subprocess.run([sys.executable, "-m", "aot.export_cache", "clear"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
