"""cuDNN frontend 1.32.0's SM100 Sage FP8 forward and quantizer in the shipped sm_100a / sm_100f
libraries (aot/kernels/cudnn_sm100.py; runtime: python/subblock_sage/backends/sm100.py).

Registry tests run anywhere. Build-env tests (``-m aot``) need the pinned wheel of
wheels/test-build-requirements-cudnn.txt in ``SBS_CUDNN_BUILD_SITE`` (default .carry/cudnn-build):

- cuDNN's public ``block_sparse_attention_fp8_forward`` run as on a B200 under a torch fake mode
  (tests/helpers/cudnn_fake_sm100.py) constructs the quantizer and the SM100 class with our
  constructor arguments, compiles them with our argument specs (dtypes, alignments, ranks, the
  unit-stride dimension; the absent tensors None), and the C arguments the runtime builds
  (``cudnn_quant_values``, ``cudnn_sage_values``) are the very views and scalars it passes;
- the wrapper's own split rule answers 1 (the one exported split count) where the runtime's
  shapes are: at least 512 query tiles and fewer than 900 blocks a row;
- the source facts the runtime restates (scale groups, chunk rows, the fixed-count restriction);
- every export compiles for sm_100a and sm_100f without local memory (registers printed).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from aot import export, registry, serving
from aot.kernels import cudnn_sm100
from aot.upstream import cudnn_import
from tests.cpu.test_cudnn_sm90_aot import DSL_NAMES, _fake, _site, needs_dsl

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("cudnn_sage_sm100_fp8", "cudnn_sage_quant_sm100")


def test_shipped_in_the_sm100_libraries():
    ks = {k.name: k for k in registry.all_kernels()}
    for name in KERNELS:
        assert ks[name].targets == ("sm_100a", "sm_100f") and ks[name].test_targets == ()
        assert ks[name].upstream == cudnn_import.UPSTREAM
    assert [v.name for v in ks["cudnn_sage_sm100_fp8"].variants] == ["short", "long"]
    libs = export.plan(targets=["sm_100a", "sm_100f"])
    for lib in ("sm100a", "sm100f"):
        names = [j.kernel.name for j in libs[lib]]
        assert names.count("cudnn_sage_sm100_fp8") == 2 and names.count("cudnn_sage_quant_sm100") == 1
    assert all(serving.is_served(k, v.name, v.params) for k in KERNELS for v in ks[k].variants)


def test_the_runtime_restates_the_build_facts():
    """The runtime cannot import the build: its copies of the facts equal the kernel module's."""
    from subblock_sage.backends import sm100

    assert sm100.SAGE_KERNEL == KERNELS[0] and sm100.SAGE_QUANT == KERNELS[1]
    assert sm100.QUANT_ROWS_PER_CHUNK == cudnn_sm100.QUANT_ROWS_PER_CHUNK
    from aot.kernels.cudnn_sm90 import K_SCALE_ROWS

    assert sm100.K_SCALE_ROWS == K_SCALE_ROWS
    assert dict(sm100.SAGE_QUANT_PARAMS) == dict(registry.all_kernels()[[k.name for k in registry.all_kernels()]
                                                                       .index(KERNELS[1])].variants[0].params)
    assert [a.name for a in cudnn_sm100.FP8_ARGS[:-1]] == list(
        sm100.cudnn_sage_values(_FakeBufs.make(), "i", 1, 0.1, "o", "l"))


class _FakeBufs:
    @staticmethod
    def make() -> dict:
        s = types.SimpleNamespace(shape=(1, 1, 64), reshape=lambda *a: "x")
        return {"q_fp8": "q", "k_fp8": "k", "v_fp8": "v", "q_scale": s, "k_scale": s, "v_scale": s}


def _source(rel: str) -> str:
    _site()
    cudnn_import.check_files()
    return (cudnn_import.activate() / "cudnn" / rel).read_text()


@pytest.mark.aot
def test_source_facts_the_runtime_relies_on():
    """From the pinned sources: the quantizer's scale groups and chunks on SM100, the wrapper's
    SM100 FP8 restrictions (fixed counts, full 64-key blocks, contiguous BHSD, static scheduler),
    and the kernel's clamping of the entries past the count (no out-of-range scale read). The
    runtime's copies of these numbers equal the build's (test_the_runtime_restates_the_build_facts)."""
    from aot.kernels.cudnn_sm90 import K_SCALE_ROWS

    quant = _source("block_sparse_attention/_fp8_quant.py")
    assert re.search(rf"K_BLOCK_ROWS = {K_SCALE_ROWS}\n", quant)
    assert re.search(rf"ROWS_PER_CHUNK = {cudnn_sm100.QUANT_ROWS_PER_CHUNK}\n", quant)
    assert "(num_heads, head_dim)" in quant  # one V scale per head and channel, over the whole batch
    iface = _source("block_sparse_attention/_interface.py")
    assert 'assert q2k_block_nums is None, "SM100 FP8 requires a uniform top-k"' in iface
    assert 'assert block_sizes is None, "SM100 FP8 requires full 64-token KV blocks"' in iface
    assert "use_clc=False," in iface and 'kv_splits="auto",' in iface
    assert "short_tile_opt = int(q2k_block_index.shape[-1]) * 10 < ((seqlen_k + sparse_block_size - 1)" \
           " // sparse_block_size) * 9" in iface
    kernel = _source("block_sparse_attention/csrc/fwd/sm100_blk64/bsa_fwd_sm100.py")
    assert "Clamp their lookup so no\n        # out-of-range global-memory access is generated in the FP8 scale path." \
        in kernel
    assert "seqlen_k_static=(mKScale.shape[2] * 16 if const_expr(self.is_sage_fp8)" in kernel


@pytest.mark.aot
def test_auto_split_is_one_where_it_matters():
    """cuDNN's ``_sm100_blk64_auto_fp8_kv_splits`` (run from the pinned ``_interface.py``): 1 at
    512 query tiles and more under 900 blocks a row (SGLang-sized shapes), so the split-free export
    is what "auto" picks there; short-Q launches split (the export does not: same result, less
    parallelism)."""
    tree = ast.parse(_source("block_sparse_attention/_interface.py"))
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name in ("_sm100_blk64_auto_fp8_kv_splits", "_ceil_div_int")]
    ns: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "_interface.py", "exec"), ns)  # noqa: S102
    split = ns["_sm100_blk64_auto_fp8_kv_splits"]
    for H, S in ((14, 37760), (6, 37760), (2, 37760), (24, 75600), (8, 4096)):
        gk = -(-S // 64)
        for topk in (max(1, gk // 4), min(899, gk)):
            assert split(topk, H, S) == 1, (H, S, topk)
    assert split(256, 2, 1024) > 1  # 32 query tiles: it would split


def _check_compile(rec_compile, spec):
    args = [a for a in rec_compile["args"] if a.get("other") != "NoneType"]
    assert len(args) == len(spec)
    for ours, seen in zip(spec, args):
        if isinstance(ours, registry.TensorArg):
            assert seen["dtype"] in DSL_NAMES[ours.dtype], (ours.name, seen)
            assert seen["align"] == ours.align and seen["marked"], (ours.name, seen)
            assert len(seen["shape"]) == len(ours.shape)
            assert [i for i, s in enumerate(ours.stride) if s == 1] == [seen["leading"]], (ours.name, seen)
        elif isinstance(ours, registry.ScalarArg):
            kind = {"float32": ("Float32", "float"), "int32": ("Int32", "int")}[ours.dtype]
            assert seen.get("scalar") in kind, (ours.name, seen)
        else:
            assert seen.get("other") == "_FakeStream"


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("shape", [(1, 4096, 8, 16, 8), (2, 2048, 3, 32, 31), (1, 8192, 2, 120, 64)],
                         ids=["short", "b2-long", "dense-ish"])
def test_wrapper_compiles_the_exports_with_our_arguments(shape):
    """block_sparse_attention_fp8_forward(q, k, v, index, count, sparse_block_size=64) on SM100:
    the quantizer (QUANT_CTOR, QUANT_ARGS) then the blk64 class (FP8_CTOR with the static
    scheduler and the short-tile choice the runtime makes), compiled with FP8_ARGS; the runtime's
    C arguments have the wrapper's shapes, strides and scalars."""
    B, S, H, cap, count = shape
    rec = _fake(B, S, H, cap, count, helper="cudnn_fake_sm100.py")
    quant, attn = rec["ctors"]
    assert quant == {"class": "_SageFp8Quantizer", "args": [],
                     "kwargs": {k: repr(v) for k, v in cudnn_sm100.QUANT_CTOR.items()}}
    want = {k: repr(v) for k, v in cudnn_sm100.FP8_CTOR.items()}
    want.update(is_persistent="False", use_clc_scheduler="False", short_tile_opt=repr(rec["short_tile_opt"]))
    assert attn == {"class": "BlockSparseAttnForwardSm100Blk64", "args": ["128", "128"], "kwargs": want}
    qc, ac = rec["compiles"]
    _check_compile(qc, cudnn_sm100.QUANT_ARGS)
    _check_compile(ac, cudnn_sm100.FP8_ARGS)
    assert [a.get("other") for a in ac["args"]].count("NoneType") == 3  # block sizes, counts, split offsets
    for comp, ours in zip((qc, ac), rec["ours"]):
        seen = [a for i, a in enumerate(comp["args"]) if "scalar" in a or ("first" in a and a["first"] == i)]
        assert len(seen) == len(ours), (comp["class"], list(ours))
        for (name, v), a in zip(ours.items(), seen):
            if isinstance(v, dict):
                assert (v["shape"], v["stride"]) == (a["shape"], a["stride"]), (name, v, a)
            else:
                assert v == a["value"], (name, v, a)
    assert rec["out"]["shape"] == [B, H, S, 128]


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("target", ["sm_100a", "sm_100f"])
def test_exports_compile_without_local_memory(tmp_path, target):
    """The three exports per target compile, their C arguments are the specs', no kernel has a
    stack frame. Registers (the attention cubin holds one kernel: 512 threads, 128 registers
    before setmaxnreg; the quantizer's seven kernels) are printed for MEASUREMENTS.md."""
    where = _site()
    from tests.helpers.elfcheck import kernels_regs_and_frames

    env = {**os.environ, cudnn_import.SITE_ENV: str(where)}
    units = [f"{k.name}:{v.name}" for k in registry.all_kernels() if k.name in KERNELS for v in k.variants]
    cmd = [sys.executable, "-m", "aot.export", "unit", "--module", "aot.kernels.cudnn_sm100", "--target", target,
           "--out", str(tmp_path)]
    for u in units:
        cmd += ["--unit", u]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, capture_output=True)
    specs = {"cudnn_sage_sm100_fp8": cudnn_sm100.FP8_ARGS, "cudnn_sage_quant_sm100": cudnn_sm100.QUANT_ARGS}
    for k in registry.all_kernels():
        if k.name not in KERNELS:
            continue
        for v in k.variants:
            prefix = registry.symbol_prefix(k.name, v.name, target)
            meta = json.loads((tmp_path / f"{prefix}.json").read_text())
            assert [a["name"] for a in meta["args"]] == [a.name for a in specs[k.name]]
            assert meta["upstream"] == cudnn_sm100.UPSTREAM and meta["params"] == dict(v.params)
            regs, frames = kernels_regs_and_frames(tmp_path / f"{prefix}.o")
            assert frames and not any(frames), (prefix, frames)
            print(f"{prefix}: {regs} registers, frame sizes {frames}")
