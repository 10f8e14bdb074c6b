"""No object of nvidia-cutlass-dsl's libcuda_dialect_runtime_static.a goes into a kernel library
(issue 17: its license forbids redistributing it). The DSL's exported objects call eight CUDA
entry points; aot/toolchain/dsl_entry_points.c implements them over the public CUDA runtime.

Proof on the fixture kernel, built by the project's CMakeLists.txt with SBS_STRIP=OFF (same inputs
and link line as a release, only the symbol table kept so there is something to inspect):
  * the link line (build.ninja) names no such archive, but our wrapper object and cudart_static;
  * every `_cu*` symbol the exported objects leave undefined is one of our wrappers;
  * the library defines our wrappers, has no symbol that only that archive defines, and none of
    the archive's member files (STT_FILE) went in, while dsl_entry_points.c did.
The archive is only read as a symbol table (ar member names + ELF .symtab), never disassembled."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot
ROOT = Path(__file__).resolve().parents[2]
LIB = "libsubblock_sage_sm90a.so"
WRAPPERS = {
    "_cudaGetDevice", "_cudaDeviceGetAttribute", "_cudaFuncSetAttribute",
    "_cudaKernelSetAttributeForDevice", "_cudaLaunchKernelEx", "_cudaLibraryGetKernel",
    "_cudaLibraryLoadData", "_cuKernelGetAttribute",
}


def read_ar(path: Path) -> dict[str, bytes]:
    """Members of a System V / GNU ar archive: name -> bytes (symbol index and name table skipped)."""
    data = path.read_bytes()
    assert data[:8] == b"!<arch>\n", path
    pos, longnames, out = 8, b"", {}
    while pos + 60 <= len(data):
        hdr = data[pos:pos + 60]
        name = hdr[:16].decode().strip()
        size = int(hdr[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name == "//":
            longnames = body
        elif name in ("/", "/SYM64/"):
            continue
        elif name.startswith("/") and name[1:].isdigit():
            off = int(name[1:])
            out[longnames[off:longnames.index(b"/\n", off)].decode()] = body
        else:
            out[name.rstrip("/")] = body
    return out


def elf_symbols(blob: bytes) -> tuple[set[str], set[str], set[str]]:
    """(defined, undefined, file) symbol names from an ELF's .symtab."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(blob))
    defined, undefined, files = set(), set(), set()
    symtab = elf.get_section_by_name(".symtab")
    for s in symtab.iter_symbols() if symtab else ():
        if not s.name:
            continue
        if s["st_info"]["type"] == "STT_FILE":
            files.add(s.name)
        elif s["st_shndx"] == "SHN_UNDEF":
            undefined.add(s.name)
        else:
            defined.add(s.name)
    return defined, undefined, files


def archive_symbols(path: Path) -> tuple[set[str], set[str]]:
    members = read_ar(path)
    defined: set[str] = set()
    for blob in members.values():
        if blob[:4] == b"\x7fELF":
            d, _, _ = elf_symbols(blob)
            defined |= d
    return set(members), defined


def dsl_archive() -> Path:
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    assert spec, "nvidia-cutlass-dsl is not installed in the build environment"
    path = Path(spec.submodule_search_locations[0]) / "cu13" / "lib" / "libcuda_dialect_runtime_static.a"
    assert path.exists(), f"{path} is gone: update this test to what the DSL ships now"
    return path


@pytest.fixture(scope="module")
def unstripped(tmp_path_factory) -> Path:
    pytest.importorskip("cutlass")
    build = tmp_path_factory.mktemp("cmake-unstripped")
    env = dict(os.environ, SUBBLOCK_SAGE_KERNEL_MODULES="tests.cpu.fixtures.scale_kernel")
    bindir = Path(sys.executable).parent
    for cmd in (
        ["-S", str(ROOT), "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={bindir / 'ninja'}",
         f"-DSBS_PYTHON={sys.executable}", "-DSBS_TARGETS=sm_90a", "-DSBS_STRIP=OFF"],
        ["--build", str(build)],
    ):
        res = subprocess.run([sys.executable, "-m", "cmake", *cmd], env=env, cwd=ROOT,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return build


def test_link_line_has_no_dsl_runtime(unstripped):
    ninja = (unstripped / "build.ninja").read_text()
    assert "cuda_dialect_runtime" not in ninja
    (link,) = [b for b in ninja.split("\nbuild ") if b.startswith(f"{LIB}:")]
    assert "dsl_entry_points.c.o" in link, link
    assert "libcudart_static.a" in link, link
    assert "--no-undefined" in link, link


def test_exported_objects_need_only_our_wrappers(unstripped):
    objs = sorted((unstripped / "aot" / "sm90a").glob("*.o"))
    assert objs
    needed: set[str] = set()
    for o in objs:
        _, undefined, _ = elf_symbols(o.read_bytes())
        needed |= {s for s in undefined if s.startswith("_cu")}
    assert needed == WRAPPERS, f"the DSL now needs {sorted(needed - WRAPPERS)}: add them to dsl_entry_points.c"


def test_library_has_our_wrappers_and_nothing_of_the_archive(unstripped):
    defined, undefined, files = elf_symbols((unstripped / LIB).read_bytes())
    assert WRAPPERS <= defined, sorted(WRAPPERS - defined)
    assert "dsl_entry_points.c" in files, sorted(files)

    members, archive_defined = archive_symbols(dsl_archive())
    cudart = Path(importlib.util.find_spec("nvidia").submodule_search_locations[0]) / "cu13" / "lib"
    _, cudart_defined = archive_symbols(cudart / "libcudart_static.a")
    only_in_archive = archive_defined - WRAPPERS - cudart_defined
    assert len(only_in_archive) > 50, "archive symbol table not read"  # e.g. _cudaMalloc, _cuTensorMapEncodeTiled
    assert not (only_in_archive & (defined | undefined)), sorted(only_in_archive & (defined | undefined))
    stems = {m.removesuffix(".o") for m in members}  # "CudaDialectRuntime.c", ...
    assert len(stems) >= 5
    assert not (stems & files), sorted(stems & files)
