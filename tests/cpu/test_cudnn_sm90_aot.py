"""cuDNN frontend 1.32.0's SM90 block-sparse forwards in the test library (bench contenders).

Registry tests run anywhere. Build-env tests (``-m aot``) need the pinned wheel of
wheels/test-build-requirements-cudnn.txt in ``SBS_CUDNN_BUILD_SITE`` (default .carry/cudnn-build;
./wheels/build.sh installs it when SBS_TEST_LIBS=ON; skipped without it):

- the wrapper's own kv_splits heuristic (``_sm90_blk64_auto_kv_splits``, run from the pinned
  ``_interface.py``) answers 1 on every bench shape and plan, on an H100/H200: the one exported
  split count;
- cuDNN's public wrappers run under a torch fake mode (tests/helpers/cudnn_fake.py; a CPU torch is
  needed: the build env's own, else the test env's, ``SBS_TEST_ENV`` or .testenv) construct each
  class with our constructor arguments and compile it with our argument specs (dtypes, alignments,
  ranks, the unit-stride dimension, the counts tensor passed three times), and our launcher builds
  the very views (shapes and strides) and scalars the wrapper passes;
- every export compiles for sm_90a, with its C arguments the spec's, without local memory.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from aot import export, registry
from aot.kernels import cudnn_sm90
from aot.upstream import cudnn_import

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("cudnn_bsa_sm90_bf16", "cudnn_sage_sm90_fp8", "cudnn_sage_quant_sm90")
DSL_NAMES = {"bfloat16": ("bfloat16", "BFloat16"), "float32": ("float32",), "int32": ("int32",),
             "float8_e4m3fn": ("float8_e4m3fn", "Float8E4M3FN")}


def test_only_in_the_test_library():
    ks = {k.name: k for k in registry.all_kernels()}
    for name in KERNELS:
        assert ks[name].targets == () and ks[name].test_targets == ("sm_90a",)
    libs = export.plan(targets=["sm_90a"])
    tested = [j.kernel.name for j in libs["test_sm90a"]]
    assert tested.count("cudnn_sage_sm90_fp8") == 2 and all(tested.count(n) == 1 for n in KERNELS[::2])
    assert all(j.kernel.name not in KERNELS for lib, jobs in libs.items() if not lib.startswith("test_")
               for j in jobs)


def test_pins_are_the_requirements():
    text = (ROOT / cudnn_import.REQUIREMENTS).read_text()
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))
    assert pinned == cudnn_import.PINS
    assert text.count("--hash=sha256:") == len(pinned)  # pip --require-hashes


def _site() -> Path:
    where = cudnn_import.site()
    if where is None:
        where = ROOT / ".carry" / "cudnn-build"
        os.environ[cudnn_import.SITE_ENV] = str(where)
    if not (where / "cudnn").is_dir():
        pytest.skip(f"{cudnn_import.SITE_ENV} unset or empty: the cuDNN wheel of the test library is "
                    "installed by ./wheels/build.sh with SBS_TEST_LIBS=ON")
    return where


needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="needs CuTe-DSL (the build env)")


def _bench_cases():
    """(H, S, fixed count) of every bench shape and plan: 0.25 and 1.0 of the key blocks, and the
    SGLang plan padded to a fixed count (its dense rows: every key block)."""
    if importlib.util.find_spec("subblock_sage") is None:  # the build env: the runtime's sources
        sys.path.insert(0, str(ROOT / "python"))
    from subblock_sage.tools import bench

    shapes = {s for preset in bench.SHAPE_PRESETS.values() for s in preset}
    for H, S in sorted(shapes):
        gk = math.ceil(S / 64)
        for density in (0.25, 1.0):
            yield H, S, min(gk, math.ceil(density * gk))


@pytest.mark.aot
def test_kv_splits_heuristic_picks_one_on_every_bench_shape():
    """cuDNN's own ``_sm90_blk64_auto_kv_splits`` (and the helper it calls), run from the pinned
    ``_interface.py`` with duck-typed tensors and an H100/H200's properties (132 SMs, 50 MiB L2):
    1 on every bench shape, so the exported kv_splits=1 is also what "auto" picks. With per-row
    counts the wrapper never asks it (the fake-mode test records num_splits=1 for "auto")."""
    _site()
    cudnn_import.check_files()
    path = cudnn_import.activate() / "cudnn/block_sparse_attention/_interface.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name in ("_sm90_blk64_auto_kv_splits", "_ceil_div_int")]
    assert len(keep) == 2
    props = types.SimpleNamespace(L2_cache_size=50 * 2**20, multi_processor_count=132)
    fake_torch = types.SimpleNamespace(float16="f16", bfloat16="bf16", Tensor=object,
                                       cuda=types.SimpleNamespace(get_device_properties=lambda d: props))
    ns: dict = {"torch": fake_torch}
    exec(compile("from typing import Optional\n", str(path), "exec"), ns)  # noqa: S102
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102

    def bhsd(H, S):
        return types.SimpleNamespace(is_cuda=True, dtype="bf16", shape=(1, H, S, 128), device=0,
                                     element_size=lambda: 2)

    seen = 0
    for H, S, count in _bench_cases():
        t = bhsd(H, S)
        assert ns["_sm90_blk64_auto_kv_splits"](t, t, t, count) == 1, (H, S, count)
        seen += 1
    assert seen >= 10
    # the heuristic does split where a head's K/V outgrows L2: S = 131072 at 1/8 of the blocks
    t = bhsd(2, 131072)
    assert ns["_sm90_blk64_auto_kv_splits"](t, t, t, 256) > 1


def _torch_path() -> str | None:
    """A folder holding a CPU torch for the fake-mode subprocess ('' when the build env has one)."""
    if importlib.util.find_spec("torch") is not None:
        return ""
    env = Path(os.environ.get("SBS_TEST_ENV") or ROOT / ".testenv")
    found = sorted(env.glob("lib/python3.*/site-packages/torch"))
    return str(found[0].parent) if found else None


def _fake(*argv, helper: str = "cudnn_fake.py") -> dict:
    """The ``RESULT`` record of ``tests/helpers/<helper>`` run with ``argv``."""
    where = _site()
    torch_path = _torch_path()
    if torch_path is None:
        pytest.skip("needs torch for cuDNN's fake mode (the build env has none, and no test env "
                    "exists yet: ./tests/run.sh makes .testenv, or set SBS_TEST_ENV)")
    env = {**os.environ, cudnn_import.SITE_ENV: str(where)}
    if torch_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [torch_path, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests/helpers" / helper), *map(str, argv)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, run.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


def _assert_spec_matches(spec_args, seen_args):
    """Our spec (registry args, C order) against the wrapper's compile arguments: tensors in order
    (a repeated one, e.g. the bf16 counts, counted once), then scalars and the stream."""
    firsts = [a for i, a in enumerate(seen_args) if "scalar" in a or "other" in a or a["first"] == i]
    assert len(firsts) == len(spec_args)
    for ours, seen in zip(spec_args, firsts):
        if isinstance(ours, registry.TensorArg):
            assert seen["dtype"] in DSL_NAMES[ours.dtype], (ours.name, seen)
            assert seen["align"] == ours.align and seen["marked"], (ours.name, seen)
            assert len(seen["shape"]) == len(ours.shape)
            assert all(isinstance(s, registry.Sym) for s in ours.shape)  # every extent dynamic
            unit = [i for i, s in enumerate(ours.stride) if s == 1]
            assert unit == [seen["leading"]], (ours.name, seen)
            assert all(s.width == 64 for s in ours.stride if isinstance(s, registry.Sym))
        elif isinstance(ours, registry.ScalarArg):
            kind = {"float32": ("Float32", "float"), "int32": ("Int32", "int")}[ours.dtype]
            assert seen.get("scalar") in kind, (ours.name, seen)
        else:
            assert seen.get("other") == "_FakeStream"


def _assert_views(record, ours_values):
    """Our launcher's C arguments equal the wrapper's tensors (shape, stride) and scalars."""
    for seen, ours in zip(record["compiles"], ours_values):
        firsts = [a for i, a in enumerate(seen["args"]) if "scalar" in a or "other" in a or a["first"] == i]
        values = list(ours.values())
        assert len(values) == len([a for a in firsts if "other" not in a])
        for v, a in zip(values, firsts):
            if isinstance(v, dict):
                assert (v["shape"], v["stride"]) == (a["shape"], a["stride"]), (seen["class"], v, a)
            else:
                assert v == a["value"], (seen["class"], v, a)


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("shape", [(1, 4096, 4096, 2, 64, "auto"), (2, 1024, 2048, 3, 5, "1"),
                                   (1, 37760, 37760, 1, 590, "auto")],
                         ids=["4096-auto", "sq1024-sk2048-cap5", "sglang-length-auto"])
def test_bf16_wrapper_compiles_the_export(shape):
    """block_sparse_attention_forward(..., q2k_block_nums=counts, sparse_block_size=64,
    allow_empty_block_nums=True, layout="bshd") on SM90 builds BF16_CTOR and BF16_ARGS (with
    kv_splits "auto" too: per-row counts never split) and our launcher's views."""
    rec = _fake("bf16", *shape)
    (ctor,) = rec["ctors"]
    assert ctor["class"] == "BlockSparseAttnForwardSm90Blk64"
    want = {k: repr(v) for k, v in cudnn_sm90.BF16_CTOR.items()}
    want.update(dtype="<class 'cutlass.base_dsl.typing.BFloat16'>", acc_dtype="<class 'cutlass.base_dsl.typing.Float32'>")
    assert ctor == {"class": ctor["class"], "args": [], "kwargs": want}
    (comp,) = rec["compiles"]
    assert [a.get("first") for a in comp["args"][6:9]] == [6, 6, 6]  # counts as block sizes and split offsets
    _assert_spec_matches(cudnn_sm90.BF16_ARGS, comp["args"])
    _assert_views(rec, rec["ours"])


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("block_k", [64, 128])
@pytest.mark.parametrize("shape", [(1, 1024, 2, 8, 3), (2, 4096, 3, 16, 16)], ids=["small", "b2"])
def test_sage_wrapper_compiles_the_exports(shape, block_k):
    """block_sparse_attention_fp8_forward(q, k, v, index, count, sparse_block_size=block_k) on
    SM90: the quantizer (QUANT_CTOR, QUANT_ARGS) then the FP8 class (NUM_SMS for blk64; FP8_ARGS),
    with our launcher's views and scalars."""
    B, S, H, cap, count = shape
    rec = _fake("sage", B, S, H, min(cap, S // block_k), min(count, S // block_k), block_k)
    quant, attn = rec["ctors"]
    assert quant == {"class": "_SageFp8Quantizer", "args": [],
                     "kwargs": {k: repr(v) for k, v in cudnn_sm90.QUANT_CTOR.items()}}
    if block_k == 64:
        assert attn == {"class": "BlockSparseAttnForwardFp8Sm90Blk64", "args": [str(cudnn_sm90.NUM_SMS)], "kwargs": {}}
    else:
        assert attn == {"class": "BlockSparseAttnForwardFp8Sm90Blk128", "args": [], "kwargs": {}}
    qc, ac = rec["compiles"]
    _assert_spec_matches(cudnn_sm90.QUANT_ARGS, qc["args"])
    _assert_spec_matches(cudnn_sm90.FP8_ARGS, ac["args"])
    _assert_views(rec, rec["ours"])
    assert rec["out"]["shape"] == [B, H, S, 128]


@pytest.mark.aot
@needs_dsl
def test_exports_compile_without_local_memory(tmp_path):
    """The four test-library exports for sm_90a: they compile, their C arguments are the specs',
    and no kernel has a stack frame (no spills). Registers (one per kernel of an export's cubin: the
    blk64 Sage class holds two, the quantizer six) are printed for MEASUREMENTS.md."""
    where = _site()
    from tests.helpers.elfcheck import kernels_regs_and_frames

    env = {**os.environ, cudnn_import.SITE_ENV: str(where)}
    units = [f"{k.name}:{v.name}" for k in registry.all_kernels() if k.name in KERNELS for v in k.variants]
    assert len(units) == 4
    cmd = [sys.executable, "-m", "aot.export", "unit", "--module", "aot.kernels.cudnn_sm90", "--target", "sm_90a",
           "--test", "--no-cache", "--out", str(tmp_path)]
    for u in units:
        cmd += ["--unit", u]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True)
    specs = {"cudnn_bsa_sm90_bf16": cudnn_sm90.BF16_ARGS, "cudnn_sage_sm90_fp8": cudnn_sm90.FP8_ARGS,
             "cudnn_sage_quant_sm90": cudnn_sm90.QUANT_ARGS}
    for k in registry.all_kernels():
        if k.name not in KERNELS:
            continue
        for v in k.variants:
            prefix = registry.symbol_prefix(k.name, v.name, "sm_90a", test=True)
            meta = json.loads((tmp_path / f"{prefix}.json").read_text())
            assert [a["name"] for a in meta["args"]] == [a.name for a in specs[k.name]]
            assert meta["upstream"] == cudnn_sm90.UPSTREAM and meta["params"] == dict(v.params)
            regs, frames = kernels_regs_and_frames(tmp_path / f"{prefix}.o")
            assert frames and not any(frames), (prefix, frames)
            print(f"{prefix}: {regs} registers, frame sizes {frames}")
