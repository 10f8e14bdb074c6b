"""The whole AOT path on a tiny fixture kernel: export (all three targets, symbolic shapes) ->
C shim -> CMake/zig link -> manifest; then inspect what was linked and load it with ctypes."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.elfcheck import dynamic_info, embedded_cubin_sms, glibc_tuple

pytestmark = pytest.mark.aot
ROOT = Path(__file__).resolve().parents[2]
ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6",
                  "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


@pytest.fixture(scope="module")
def fixture_build(tmp_path_factory):
    pytest.importorskip("cutlass")
    build = tmp_path_factory.mktemp("cmake")
    stage = tmp_path_factory.mktemp("stage")
    env = dict(os.environ, SUBBLOCK_SAGE_KERNEL_MODULES="tests.cpu.fixtures.scale_kernel")
    bindir = Path(sys.executable).parent
    subprocess.run([sys.executable, "-m", "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
                    f"-DCMAKE_MAKE_PROGRAM={bindir / 'ninja'}", f"-DSBS_PYTHON={sys.executable}"],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    subprocess.run([sys.executable, "-m", "cmake", "--build", str(build)], check=True, env=env,
                   cwd=ROOT, capture_output=True)
    subprocess.run([sys.executable, "-m", "cmake", "--install", str(build), "--prefix", str(stage),
                    "--component", "kernels"], check=True, env=env, capture_output=True)
    return stage / "subblock_sage_kernels"


@pytest.mark.parametrize("folder,sm", [("sm90a", 90), ("sm100a", 100), ("sm120a", 120)])
def test_library_embeds_cubin_of_its_sm(fixture_build, folder, sm):
    lib = fixture_build / folder / f"libsubblock_sage_{folder}.so"
    sms = embedded_cubin_sms(lib)
    assert sms and set(sms) == {sm}, sms


@pytest.mark.parametrize("folder", ["sm90a", "sm100a", "sm120a"])
def test_library_is_self_contained(fixture_build, folder):
    info = dynamic_info(fixture_build / folder / f"libsubblock_sage_{folder}.so")
    assert set(info["needed"]) <= ALLOWED_NEEDED, info["needed"]
    assert glibc_tuple(info["glibc"][-1]) <= (2, 28), info["glibc"]
    assert info["exported"] and all(s.startswith("subblock_sage_v1_") for s in info["exported"]), info["exported"]


def test_library_loads_and_describes_itself(fixture_build):
    lib = ctypes.CDLL(str(fixture_build / "sm90a" / "libsubblock_sage_sm90a.so"))
    lib.subblock_sage_v1_target.restype = ctypes.c_char_p
    lib.subblock_sage_v1_exports_json.restype = ctypes.c_char_p
    lib.subblock_sage_v1_kernel_name.restype = ctypes.c_char_p
    assert lib.subblock_sage_v1_abi_version() == 1
    assert lib.subblock_sage_v1_target() == b"sm_90a"
    assert lib.subblock_sage_v1_num_kernels() == 1
    assert lib.subblock_sage_v1_kernel_name(0) == b"test_scale/default"
    assert lib.subblock_sage_v1_kernel_name(5) is None
    exports = json.loads(lib.subblock_sage_v1_exports_json())
    (k,) = exports["kernels"]
    x = k["args"][0]
    # symbolic B and S, static head dim; symbolic row strides, unit last stride
    assert x["shape"][2] == 128 and x["shape"][0]["sym"] == "B" and x["stride"][2] == 1
    assert [a["kind"] for a in k["args"]] == ["tensor", "tensor", "scalar", "stream"]


def test_launch_without_gpu_reports_error(fixture_build):
    lib = ctypes.CDLL(str(fixture_build / "sm90a" / "libsubblock_sage_sm90a.so"))
    lib.subblock_sage_v1_last_error.restype = ctypes.c_char_p
    rc = lib.subblock_sage_v1_launch(0, 0, None, 4)
    assert rc != 0
    assert lib.subblock_sage_v1_last_error()
    rc = lib.subblock_sage_v1_launch(7, 0, None, 4)
    assert rc == 1 and b"out of range" in lib.subblock_sage_v1_last_error()


def test_manifest_describes_every_library(fixture_build):
    import hashlib

    m = json.loads((fixture_build / "manifest.json").read_text())
    assert set(m["targets"]) == {"sm_90a", "sm_100a", "sm_120a"}
    assert m["toolchain"]["nvidia-cutlass-dsl"] == "4.8.1"
    for t in m["targets"].values():
        lib = fixture_build / t["library"]
        assert hashlib.sha256(lib.read_bytes()).hexdigest() == t["sha256"]
        assert t["kernels"][0]["args"]


def test_header_parser_matches_generated_header(fixture_build, tmp_path):
    from aot import export

    os.environ["SUBBLOCK_SAGE_KERNEL_MODULES"] = "tests.cpu.fixtures.scale_kernel"
    try:
        (job,) = export.plan(targets=["sm_90a"])["sm90a"]
        entry = export.export_job(job, tmp_path, "x86_64")
    finally:
        del os.environ["SUBBLOCK_SAGE_KERNEL_MODULES"]
    assert entry["ciface"].startswith(f"_mlir_{job.prefix}__mlir_ciface_")
    hdr = export.parse_header((tmp_path / f"{job.prefix}.h").read_text(), job.prefix)
    assert hdr["structs"][f"{job.prefix}_Tensor_x"] == [("void", "data", None),
                                                        ("int32_t", "dynamic_shapes", 2),
                                                        ("int64_t", "dynamic_strides", 2)]
