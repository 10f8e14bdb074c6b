"""SGLang 0.5.23's own SM90 bf16 SubBlock kernel in the test library (a bench contender).

Registry tests run anywhere. Build-env tests (``-m aot``) need the pinned packages of
wheels/test-build-requirements.txt in ``SBS_SGLANG_BUILD_SITE`` (./wheels/build.sh installs them
when SBS_TEST_LIBS=ON; skipped without them):

- our compile config is what SGLang's own ``_tile_size_fwd_sm90`` returns (its code from the
  pinned ``interface.py``, run torch-free);
- with torch importable (not in the release build env; e.g. PYTHONPATH with a CPU torch), SGLang's
  own ``flash_attn_func`` under a torch fake mode constructs and compiles the class exactly as the
  export does (constructor arguments, tensor layouts, scalars), for several plan shapes;
- the export compiles for sm_90a, without local memory.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aot import export, registry
from aot.kernels import sglang_sm90
from aot.upstream import sglang_import

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "sglang_sm90_bf16"


def test_only_in_the_test_library():
    k = next(k for k in registry.all_kernels() if k.name == KERNEL)
    assert k.targets == () and k.test_targets == ("sm_90a",)
    libs = export.plan(targets=["sm_90a"])
    assert [j.kernel.name for j in libs["test_sm90a"]].count(KERNEL) == 1
    assert all(j.kernel.name != KERNEL for lib, jobs in libs.items() if not lib.startswith("test_")
               for j in jobs)


def test_pins_are_the_requirements():
    text = (ROOT / sglang_import.REQUIREMENTS).read_text()
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))
    assert {d: pinned.get(d) for d in sglang_import.PINS} == sglang_import.PINS
    # every requirement hash-pinned (pip --require-hashes)
    assert text.count("--hash=sha256:") == len(pinned)


def _site() -> Path:
    where = sglang_import.site()
    if where is None or not (where / "sglang").is_dir():
        pytest.skip(f"{sglang_import.SITE_ENV} unset or empty: the SGLang packages of the test "
                    "library are installed by ./wheels/build.sh with SBS_TEST_LIBS=ON")
    return where


needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="needs CuTe-DSL (the build env)")


@pytest.mark.aot
def test_config_is_sglangs_own_choice():
    """Run FwdConfig and _tile_size_fwd_sm90 from the pinned interface.py (only those two
    definitions: the module imports torch) for the SubBlock shapes: head dim 128 (q and v), not
    causal, not local, sparse block size (64, 64) as SGLang's backend passes it."""
    _site()
    sglang_import.activate()
    sglang_import.check_files()
    path = sglang_import.package_dir() / "kernels/ops/attention/flash_attn/cute/interface.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in ("FwdConfig", "_tile_size_fwd_sm90")]
    assert len(keep) == 2
    ns: dict = {}
    exec(compile("from dataclasses import dataclass\n", str(path), "exec"), ns)  # noqa: S102
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    got = ns["_tile_size_fwd_sm90"](128, 128, False, False, sparse_block_size_q=64, sparse_block_size_kv=64)
    assert {"tile_m": got.m_block_size, "tile_n": got.n_block_size, "mma_pv_is_rs": got.mma_pv_is_rs,
            "intra_wg_overlap": got.intra_wg_overlap} == sglang_sm90.CONFIG
    # without the 64x64 sparse blocks SGLang would pick another tile: the sparse case decides
    dense = ns["_tile_size_fwd_sm90"](128, 128, False, False)
    assert (dense.m_block_size, dense.n_block_size) != (64, 64)


# Runs SGLang's own flash_attn_func on fake tensors in a process of its own (its stub packages,
# the DSL's per-process caches), recording the constructor arguments of the SM90 class and the
# arguments of the cute.compile call, as JSON on stdout.
_FAKE = r"""
import json, os, sys, types
sys.path.insert(0, {root!r})
os.environ.update(FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", SGLANG_CUTE_AOT_CACHE_DIR="")
import torch
if not hasattr(torch._C, "_cuda_getCurrentRawStream"):  # CPU torch: read by tvm_ffi at import
    torch._C._cuda_getCurrentRawStream = lambda index: 0
from aot.upstream import sglang_import
# sglang.kernels.jit.utils imports SGLang's serving stack (numpy, ...); interface.py reads only
# is_arch_support_pdl from it, on the relative-bias path a SubBlock call never takes.
standin = types.ModuleType("sglang.kernels.jit.utils")
def is_arch_support_pdl():
    raise RuntimeError("import-only stand-in")
standin.is_arch_support_pdl = is_arch_support_pdl
sglang_import.activate()
sglang_import._install_stub_packages(sglang_import.site())
sys.modules["sglang.kernels.jit.utils"] = standin
cute_pkg = "sglang.kernels.ops.attention.flash_attn.cute"
interface = sglang_import.import_module(cute_pkg + ".interface")
sparsity = sglang_import.import_module(cute_pkg + ".block_sparsity")
sm90 = sglang_import.import_module(cute_pkg + ".flash_fwd_sm90")
seen = {{}}
init = sm90.FlashAttentionForwardSm90.__init__
def spy_init(self, *a, **kw):
    seen["ctor"] = {{"args": [repr(x) for x in a], "kwargs": {{k: repr(v) for k, v in kw.items()}}}}
    return init(self, *a, **kw)
sm90.FlashAttentionForwardSm90.__init__ = spy_init
compile_ = interface.cute.compile
def describe(x):
    if x is None or isinstance(x, (int, float, bool, str)):
        return repr(x) if not isinstance(x, float) else "float"
    if type(x).__name__ == "_Tensor":
        return {{"dtype": x.element_type.__name__, "align": x._assumed_align, "layout": repr(x).split(" o ")[1]}}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {{type(x).__name__: {{f: describe(getattr(x, f)) for f in x._fields}}}}
    return type(x).__name__
def spy_compile(*a, **kw):
    seen["compile"] = [describe(x) for x in a[1:]]
    seen["options"] = kw.get("options")
    return compile_(*a, **kw)
interface.cute.compile = spy_compile
B, Sq, Sk, H, cap = (int(x) for x in sys.argv[1:6])
from torch._subclasses import FakeTensorMode
with FakeTensorMode():
    q = torch.empty(B, Sq, H, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(B, Sk, H, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.empty_like(k)
    gq = -(-Sq // 64)
    idx = torch.empty(B, H, gq, cap, dtype=torch.int32, device="cuda")
    cnt = torch.empty(B, H, gq, dtype=torch.int32, device="cuda")
    bst = sparsity.BlockSparseTensorsTorch(mask_block_cnt=cnt, mask_block_idx=idx, full_block_cnt=None,
                                           full_block_idx=None, block_size=(64, 64))
    out, lse = interface.flash_attn_func(q, k, v, softmax_scale=128 ** -0.5, causal=False,
                                         num_splits=1, block_sparse_tensors=bst)
seen["lse"] = lse is None
seen["cached"] = len(interface._flash_attn_fwd.compile_cache.cache)
print("RESULT" + json.dumps(seen))
"""


def _ours() -> tuple[dict, list]:
    """What the export constructs and compiles, in the words of the fake-mode record."""
    import cutlass

    ctor = {"args": [repr(cutlass.BFloat16), "128", "128", "1"],
            "kwargs": {k: repr(v) for k, v in sglang_sm90.CTOR.items()}}
    by_name = {a.name: a for a in sglang_sm90.ARGS}

    def tensor(name):
        a = by_name[name]
        dtype = {"bfloat16": "BFloat16", "int32": "Int32"}[a.dtype]
        rank = len(a.shape)
        layout = "(" + ",".join("?" * rank) + "):(" + ",".join(["?{i64}"] * (rank - 1) + ["1"]) + ")>"
        return {"dtype": dtype, "align": a.align, "layout": layout}

    none = "None"
    sparse = {"BlockSparseTensors": {
        "mask_block_cnt": tensor("block_counts"), "mask_block_idx": tensor("q2k_block_index"),
        **{f: none for f in ("full_block_cnt", "full_block_idx", "cu_total_m_blocks",
                             "cu_block_idx_offsets", "dq_write_order", "dq_write_order_full")}}}
    # __call__(mQ, mK, mV, mO, mLSE, softmax_scale, cu_seqlens q/k, seqused q/k, page table,
    #          window left/right, learnable_sink, blocksparse_tensors, aux_data, mBias, stream)
    call = [tensor("q"), tensor("k"), tensor("v"), tensor("out"), none, "float",
            *[none] * 8, sparse, {"AuxData": {"tensors": none, "scalars": none}}, none, "_FakeStream"]
    return ctor, call


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("shape", [(1, 4096, 4096, 2, 64), (2, 1000, 1000, 3, 16), (1, 333, 457, 1, 3)],
                         ids=["dense-4096", "ragged-1000", "ragged-q333-k457-compact"])
def test_fake_mode_compile_is_the_export(shape):
    """SGLang's flash_attn_func (the exact call of its SubBlock runner) under a torch fake mode:
    the class is constructed with our CTOR and compiled with our argument layouts; the only
    difference is the host calling convention (``--enable-tvm-ffi``; the export: plain CuTe ABI)."""
    where = _site()
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch for SGLang's fake mode (the build env has none): put a CPU torch "
                    "on PYTHONPATH to run it")
    env = {**os.environ, sglang_import.SITE_ENV: str(where)}
    run = subprocess.run([sys.executable, "-c", _FAKE.format(root=str(ROOT)), *map(str, shape)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, run.stderr[-3000:]
    seen = json.loads(line[len("RESULT"):])
    ctor, call = _ours()
    assert seen["ctor"] == ctor
    assert seen["compile"] == call
    assert seen["options"] == "--enable-tvm-ffi" and seen["lse"] and seen["cached"] == 1


@pytest.mark.aot
@needs_dsl
def test_export_compiles_without_local_memory(tmp_path):
    """The test-library export for sm_90a: compiles, its C arguments are the spec's, and the
    kernel has no stack frame (no spills). Registers are printed for MEASUREMENTS.md."""
    where = _site()
    from tests.helpers.elfcheck import regs_and_frames

    env = {**os.environ, sglang_import.SITE_ENV: str(where)}
    subprocess.run([sys.executable, "-m", "aot.export", "unit", "--module", "aot.kernels.sglang_sm90",
                    "--target", "sm_90a", "--test", "--unit", f"{KERNEL}:bsa64", "--no-cache",
                    "--out", str(tmp_path)], check=True, cwd=ROOT, env=env, capture_output=True)
    k = next(k for k in registry.all_kernels() if k.name == KERNEL)
    prefix = registry.symbol_prefix(k.name, k.variants[0].name, "sm_90a", test=True)
    meta = json.loads((tmp_path / f"{prefix}.json").read_text())
    assert [a["name"] for a in meta["args"]] == [a.name for a in sglang_sm90.ARGS]
    assert meta["upstream"] == sglang_sm90.UPSTREAM
    regs, frames = regs_and_frames(tmp_path / f"{prefix}.o")
    assert frames and not any(frames), frames
    print(f"{prefix}: {regs} registers, frame sizes {frames}")
