"""The Sage operand layout (the 16-token V permutation, the shapes of every quantized operand, the
scale constants) checked at build time against FlashInfer's own code in the pinned package, not
against literals we wrote (issue 21).

Where FlashInfer defines it: ``flashinfer/cute_dsl/sparse/bsa_utils/sage_quant_sm120.py`` (the
Triton quantizer that produces exactly the operands ``BlockSparseAttnForwardSageSm120Blk64``
consumes). That module imports torch and triton at the top, and the build environment has
neither, so it is never imported. Instead (method):

* the permutation: the module's source is parsed (``ast``) and, inside the Triton kernel
  ``_quantize_sage_kv_kernel``, only the statements that compute the stored column
  (``row_mod = ...``, ``physical_row = ...``) are compiled and executed with plain Python ints
  for ``local_row`` / ``block_idx`` and the ``BLOCK_SIZE`` the host code launches it with (Triton's
  integer ``%`` and ``//`` agree with Python's for the non-negative values involved). The store
  that uses ``physical_row`` is checked to write V transposed (``dim * stride_d + column``);
* the shapes: the host functions ``quantize_sage_q_sm120`` / ``quantize_sage_kv_sm120`` are
  executed as written, with stand-ins for torch (tensors that carry only shape, dtype and
  strides) and triton (``cdiv``; kernel launches recorded, not run). Their outputs' shapes and
  the constants they launch with are compared with ours.

Ours, from each place the layout is written: ``aot/kernels/sage_quant/`` (our quantizer kernel:
``perm16``, constants), ``aot/kernels/sm90/config.py`` (``V_PERM16``, the inverse map our
Hopper kernel reads with) and ``python/subblock_sage/reference.py`` (``sage_perm16``,
``sage_quant_shapes``, constants; extracted the same way since it imports torch).
"""

from __future__ import annotations

import ast
import importlib.metadata
import math
import typing
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot

ROOT = Path(__file__).resolve().parents[2]
QUANT_FILE = "flashinfer/cute_dsl/sparse/bsa_utils/sage_quant_sm120.py"
SHAPES = [(1, 1, 1, 1), (2, 3, 300, 333), (1, 2, 129, 65), (1, 14, 37760, 37760), (3, 1, 64, 4097)]


@pytest.fixture(scope="module")
def fi_source():
    from aot.upstream.flashinfer_import import DIST, VERSION

    dist = importlib.metadata.distribution(DIST)
    assert dist.version == VERSION, f"build env has {DIST} {dist.version}, the pin is {VERSION}"
    path = Path(dist.locate_file(QUANT_FILE))
    assert path.is_file(), f"{QUANT_FILE} not in the installed {DIST} {VERSION}"
    return ast.parse(path.read_text(), filename=str(path))


def _function(tree, name) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{name} not found in FlashInfer's {QUANT_FILE}: the upstream layout code moved")


def _assignment(fn: ast.FunctionDef, name: str) -> ast.Assign:
    hits = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    assert len(hits) == 1, f"{fn.name}: expected one assignment to {name}, found {len(hits)}"
    return hits[0]


# ---------------------------------------------------------------------------------------------
# Stand-ins for torch and triton (host code only: shapes, dtypes, strides, launches)


class _Tensor:
    def __init__(self, shape, dtype="bfloat16"):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.device = "cuda:0"
        self.is_cuda = True
        self.ndim = len(self.shape)

    def stride(self, dim=None):
        st, acc = [], 1
        for n in reversed(self.shape):
            st.append(acc)
            acc *= n
        st = tuple(reversed(st))
        return st if dim is None else st[dim]

    def is_contiguous(self):
        return True


class _Launches(list):
    def kernel(self, name, params):
        launches = self

        class K:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launches.append((name, grid, dict(zip(params, args)), kwargs))
                return launch
        return K()


def _torch_standin():
    class _Cuda:
        @staticmethod
        def get_device_capability(device=None):
            return (12, 0)

    class T:
        Tensor = _Tensor
        bfloat16, int8, float32, float8_e4m3fn = "bfloat16", "int8", "float32", "float8_e4m3fn"
        cuda = _Cuda
        dtype = str
        device = str

        @staticmethod
        def empty(shape, dtype=None, device=None):
            return _Tensor(shape, dtype)

        @staticmethod
        def empty_like(t):
            return _Tensor(t.shape, t.dtype)

    return T


class _Triton:
    @staticmethod
    def cdiv(a, b):
        return -(-a // b)


def _host_namespace(tree):
    """Module-level constants and the host functions of FlashInfer's quantizer, executed with the
    stand-ins; every Triton kernel replaced by a launch recorder (parameter names from its def)."""
    launches = _Launches()
    ns = {"torch": _torch_standin(), "triton": _Triton, "Optional": typing.Optional,
          "Sequence": typing.Sequence, "math": math}
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            keep.append(node)
        elif isinstance(node, ast.FunctionDef):
            if node.decorator_list:  # @triton.jit kernels
                ns[node.name] = launches.kernel(node.name, [a.arg for a in node.args.args])
            else:
                keep.append(node)
    exec(compile(ast.Module(body=keep, type_ignores=[]), QUANT_FILE, "exec"), ns)
    return ns, launches


def _ours_from_reference():
    """sage_perm16, sage_quant_shapes and the constants of python/subblock_sage/reference.py
    (which imports torch at the top), extracted like FlashInfer's."""
    tree = ast.parse((ROOT / "python" / "subblock_sage" / "reference.py").read_text())
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name in ("sage_perm16", "_ceil_div",
                                                                                   "sage_quant_shapes"))
            or (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.startswith("SAGE_")
                                                  for t in n.targets))]
    from aot.contract import HEAD_DIM, ceil_div  # reference.py imports them from the contract

    ns = {"ceil_div": ceil_div, "HEAD_DIM": HEAD_DIM}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "reference.py", "exec"), ns)
    return ns


# ---------------------------------------------------------------------------------------------


def _flashinfer_columns(tree, block_size):
    """token index (within a K block of ``block_size`` keys, block_idx = 0 and 1) -> stored column,
    from FlashInfer's own statements."""
    fn = _function(tree, "_quantize_sage_kv_kernel")
    local = _assignment(fn, "local_row")
    assert ast.unparse(local.value) == "tl.arange(0, BLOCK_SIZE)", ast.unparse(local.value)
    stmts = [_assignment(fn, "row_mod"), _assignment(fn, "physical_row")]
    code = compile(ast.Module(body=stmts, type_ignores=[]), QUANT_FILE, "exec")
    out = {}
    for block_idx in (0, 1):
        for t in range(block_size):
            ns = {"local_row": t, "block_idx": block_idx, "BLOCK_SIZE": block_size}
            exec(code, ns)
            out[block_idx * block_size + t] = ns["physical_row"]
    # the store that uses physical_row writes V transposed: column = physical_row, row = channel
    stores = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.store"
              and "physical_row" in ast.unparse(n)]
    assert len(stores) == 1
    text = ast.unparse(stores[0].args[0]).replace(" ", "")
    assert "dim_idx[:,None]*v8_stride_d" in text and "physical_row[None,:]" in text, text
    return out


def test_v_permutation_matches_flashinfer(fi_source):
    ns, launches = _host_namespace(fi_source)
    # the block size the host code launches the V kernel with
    ns["quantize_sage_kv_sm120"](_Tensor((1, 1, 100, 128)), _Tensor((1, 1, 100, 128)))
    (kv,) = [kw for name, _, _, kw in launches if name == "_quantize_sage_kv_kernel"]
    block = kv["BLOCK_SIZE"]
    cols = _flashinfer_columns(fi_source, block)
    theirs16 = tuple(cols[t] for t in range(16))
    assert sorted(theirs16) == list(range(16))
    for t, c in cols.items():  # the same permutation in every 16-token group of every block
        assert c == (t // 16) * 16 + theirs16[t % 16], (t, c)
    assert theirs16 != tuple(range(16))  # it really is a permutation (the check can fail)

    from aot.kernels import sage_quant
    from aot.kernels.sm90 import config as sm90_config

    assert block == sage_quant.K_BLOCK
    assert tuple(sage_quant.perm16(t) for t in range(16)) == theirs16, "aot/kernels/sage_quant/"
    inverse = tuple(theirs16.index(p) for p in range(16))  # stored column p holds token inverse[p]
    assert sm90_config.V_PERM16 == inverse, "aot/kernels/sm90/config.py V_PERM16"
    ref = _ours_from_reference()
    assert tuple(ref["sage_perm16"](t) for t in range(16)) == theirs16, "reference.sage_perm16"
    assert ref["SAGE_PERM16"] == theirs16, "reference.SAGE_PERM16"


def test_operand_shapes_and_constants_match_flashinfer(fi_source):
    ns, launches = _host_namespace(fi_source)
    ref = _ours_from_reference()
    from aot.kernels import sage_quant

    for B, H, Sq, Sk in SHAPES:
        launches.clear()
        q_int8, q_scale = ns["quantize_sage_q_sm120"](_Tensor((B, H, Sq, 128)))
        k_int8, v_fp8, k_scale, v_scale = ns["quantize_sage_kv_sm120"](_Tensor((B, H, Sk, 128)),
                                                                      _Tensor((B, H, Sk, 128)))
        theirs = {"q_int8": q_int8, "q_scale": q_scale, "k_int8": k_int8, "k_scale": k_scale,
                  "v_fp8": v_fp8, "v_scale": v_scale}
        ours = ref["sage_quant_shapes"](B, H, Sq, Sk)
        for name, t in theirs.items():
            assert t.shape == tuple(ours[name]), (name, (B, H, Sq, Sk), t.shape, ours[name])
        assert (q_int8.dtype, q_scale.dtype, k_int8.dtype, k_scale.dtype, v_fp8.dtype, v_scale.dtype) == (
            "int8", "float32", "int8", "float32", "float8_e4m3fn", "float32")
        kw = {name: kwargs for name, _, _, kwargs in launches}
        assert kw["_quantize_sage_q_kernel"]["GROUP_SIZE"] == ref["SAGE_Q_GROUP"] == sage_quant.Q_GROUP
        assert kw["_sage_kv_stats_finalize_kernel"]["SCALE_MAX"] == ref["SAGE_V_SCALE_MAX"] == sage_quant.V_SCALE_MAX
        assert kw["_quantize_sage_kv_kernel"]["BLOCK_SIZE"] == ref["SAGE_K_BLOCK"] == sage_quant.K_BLOCK
    assert ns["SAGE_Q_BLOCK_SIZE"] == ref["SAGE_Q_TILE"] == sage_quant.Q_TILE
    assert ns["SAGE_HEAD_DIM"] == ref["HEAD_DIM"] == sage_quant.HEAD_DIM


def test_the_extraction_can_fail(fi_source):
    """A different permutation written the way FlashInfer writes it is told apart (the method
    reads the statements, it does not assume their result)."""
    tree = ast.parse(ast.unparse(fi_source))  # a copy
    expr = _assignment(_function(tree, "_quantize_sage_kv_kernel"), "physical_row").value
    two = next(n for n in ast.walk(expr) if isinstance(n, ast.Constant) and n.value == 2)
    two.value = 3  # e.g. (row_mod // 8) * 2 -> * 3
    cols = _flashinfer_columns(tree, 64)
    from aot.kernels import sage_quant

    assert tuple(cols[t] for t in range(16)) != tuple(sage_quant.perm16(t) for t in range(16))
