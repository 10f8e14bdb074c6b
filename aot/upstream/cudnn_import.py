"""Import cuDNN frontend's block-sparse attention classes without running ``cudnn/__init__.py``.

``nvidia-cudnn-frontend==1.32.0`` ships block-sparse attention as CuTe-DSL programs that its Python
wrapper JIT-compiles at the first call (``cudnn.block_sparse_attention``). We compile its SM90
forwards ahead of time into the *test* library (bench contenders, never shipped: aot/kernels/
cudnn_sm90.py), and its SM100 Sage FP8 forward and quantizer into the *shipped* sm_100a / sm_100f
libraries (aot/kernels/cudnn_sm100.py). The wheel is a build-time package only: pinned by hash in
``wheels/test-build-requirements-cudnn.txt``, installed with ``--no-deps`` into a folder of its own
(``SBS_CUDNN_BUILD_SITE``, default ``.carry/cudnn-build`` of the checkout: wheels/build.sh and the
cibuildwheel build install it there), never into the build environment and never copied into this
repository.

``cudnn/__init__.py`` loads the compiled extension ``_compiled_module`` (pybind11 over libcudnn,
absent from the build machine); the block-sparse kernels need none of it. So, as for SGLang
(:mod:`aot.upstream.sglang_import`), *stub parent packages* whose ``__path__`` points at the
installed folders stand in for ``cudnn`` and ``cudnn.block_sparse_attention``, and only the kernel
modules and what they import run: ``cudnn._cutlass_compat`` (DSL re-exports), three helper modules
under ``csrc/utils`` and the kernel files. The SM90 kernel modules import neither torch nor
``apache-tvm-ffi``; ``_fp8_quant.py`` (the Sage quantizer) imports torch at module level for its
host wrapper, which the compile never runs, so a torch placeholder stands in while it imports
when torch is absent (the build env has none). Import: 3.1 s, mostly the DSL itself.

The wheel's version is pinned (:data:`PINS`), and so are the bytes of every file whose code the
export compiles or whose rule the compile spec follows (:data:`FILE_PINS`) and the signatures the
spec calls (:data:`SIGNATURE_PINS`): a different install fails the build with
:class:`UpstreamMismatch`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import types
from pathlib import Path

from aot.upstream import stubs
from aot.upstream.sglang_import import _placeholder_torch
from aot.upstream.stubs import UpstreamMismatch

# Folder holding the pinned wheel (pip install --no-deps --target ...); put on sys.path by
# :func:`activate`. Only the cuDNN export processes read it, so no other export sees it.
SITE_ENV = "SBS_CUDNN_BUILD_SITE"
REQUIREMENTS = "wheels/test-build-requirements-cudnn.txt"

PINS: dict[str, str] = {"nvidia-cudnn-frontend": "1.32.0"}
UPSTREAM = f"nvidia-cudnn-frontend=={PINS['nvidia-cudnn-frontend']}"

_BSA = "cudnn.block_sparse_attention"
_STUB_PACKAGES = ("cudnn", _BSA)

# key -> (module, class name)
CLASSES: dict[str, tuple[str, str]] = {
    "bf16_blk64": (f"{_BSA}.csrc.fwd.sm90_blk64.bsa_fwd_sm90", "BlockSparseAttnForwardSm90Blk64"),
    "fp8_blk64": (f"{_BSA}.csrc.fwd.sm90_blk64.bsa_fwd_sm90_fp8", "BlockSparseAttnForwardFp8Sm90Blk64"),
    "fp8_blk128": (f"{_BSA}.csrc.fwd.sm90_blk128.bsa_fwd_sm90_fp8", "BlockSparseAttnForwardFp8Sm90Blk128"),
    "sage_quant": (f"{_BSA}._fp8_quant", "_SageFp8Quantizer"),
    # shipped in the sm_100a / sm_100f libraries (aot/kernels/cudnn_sm100.py)
    "sm100_blk64": (f"{_BSA}.csrc.fwd.sm100_blk64.bsa_fwd_sm100", "BlockSparseAttnForwardSm100Blk64"),
}

# sha256 of the pinned files (paths under cudnn/): the compiled kernels, their helpers, and the
# wrapper files whose rules (constructor arguments, tensor marking, kv_splits heuristic) the spec
# follows. Other bytes fail the build, so the export cache (keyed by repository files) stays
# correct without hashing the installed tree.
FILE_PINS: dict[str, str] = {
    "block_sparse_attention/csrc/fwd/sm90_blk64/bsa_fwd_sm90.py":
        "4af3c04dcf6eb1f02f9c3a967259acb0c14bd8027defdfceec2f50678bcb8307",
    "block_sparse_attention/csrc/fwd/sm90_blk64/bsa_fwd_sm90_fp8.py":
        "d014c2f0e5401b4fabd061267796fdfdb430f3a24ad818fee92f34e3a6babf4f",
    "block_sparse_attention/csrc/fwd/sm90_blk128/bsa_fwd_sm90_fp8.py":
        "143007faaa184eb65504f3e95951023b514dd9446b6eb2a530efc0d4a4c30291",
    "block_sparse_attention/_fp8_quant.py": "728bec07e89c50e196d9f9820c70e0223c43b3e2591898b7c67190a90c889cbb",
    "block_sparse_attention/_interface.py": "30015d268370251fbbff8fc67617c2548be724170b68d32bf52f85aba3021060",
    "block_sparse_attention/api.py": "49415a5162c83d009c082f3409be4ac32f6ab32d5c308d29ecc6c46c7e506e40",
    "block_sparse_attention/csrc/utils/batched_static_scheduler.py":
        "68a4eb11e9b52b00b2c83aa74f07736e6194cb3a5dfb9ccb7be359e87fcc4490",
    "block_sparse_attention/csrc/utils/sm90_barriers.py":
        "7f2f48077d367e2c90c557b4ff834d60dd8f73faad69cb2b84a56db9f60b1ee0",
    "block_sparse_attention/csrc/utils/cute_dsl_utils.py":
        "7bed4fe11973fca3f667f99cc5847d415491e2c60dfe8987c9b789848075604e",
    "_cutlass_compat.py": "502447c3fb9fba3e2ab6cca619a668ccfdd5cd793f9cac898742f5c105a79cda",
    # the SM100 blk64 forward (bf16 and Sage FP8 in one class) and the helpers it compiles
    "block_sparse_attention/csrc/fwd/sm100_blk64/bsa_fwd_sm100.py":
        "b97013a142129e36097ba8b7c4d089fbd790e28caf799b7d3fb1d6e786559ba8",
    "block_sparse_attention/csrc/fwd/sm100_blk64/bsa_fwd_helpers.py":
        "24b941d6e8bd0e5981b907aeba6908315bbc3ecc484527a849dc65e410ade205",
    **{f"block_sparse_attention/csrc/utils/{name}.py": digest for name, digest in (
        ("block_sparse_tile_scheduler", "664986aaf60177ecbd1806aa13eaffa58bd89ee9a4fc1e9a18e0ada8ac81d5ab"),
        ("tile_scheduler", "fe01bde2ebc0c2968ca856186ff36de78e2c4234a5717c461e388be6dd059e69"),
        ("copy_utils", "9212ad29491df862de9b7e699a1c406472e91e6e0f3eb469e355010e4926d96c"),
        ("kernel_utils", "2f185f98d74b19fed18f6ddd43b955831e12d6cf46d6edff51f1161277fb88c3"),
        ("layout_utils", "20d43876ff0ff41de7a95c6314e61451a8fbf907158840979032487b6f3ab259"),
        ("mma_sm100_desc", "2e32288b190559d3e5ca8d4f4ce8755001e849d4526aa37809a12593c15cc730"),
        ("named_barrier", "c5ec49ce67184b1b56e0afb613581ec3c7374ea7aa6166017f684c6d0a5d8cb7"),
        ("pack_gqa", "15996d29050520f13b98bbd19a579fe21471595ac7c19d4bc556d5bc9221f2f9"),
        ("pipeline", "502243132a60b27497545f118d9f159800ce13b3021fe40dc82bcd9552981e29"),
        ("seqlen_info", "aa726afa30ea8091a30f294c58abc830b3f46a5c7eb589ec315c0ff4787fa43e"),
        ("softmax", "04fbe6cbe48b3cbcfa0d3bd0e139fdb96738297c1c5ca1b73a903771aa7d09bd"),
        ("tcgen05_mma_helpers", "e0c65d4564629ad636fd6389a91dafaeeee6029a1c7f20a4b3073466a6069420"),
    )},
}

# class key -> method -> ((parameter, default repr or None when required), ...)
SIGNATURE_PINS: dict[str, dict[str, tuple[tuple[str, str | None], ...]]] = {
    "bf16_blk64": {
        "__init__": (
            ("self", None), ("gqa_ratio", "1"), ("head_dim", "128"), ("value_dim", "128"),
            ("blocksparse_blocksize_q", "64"), ("blocksparse_blocksize_k", "64"),
            ("dtype", "<class 'cutlass.base_dsl.typing.BFloat16'>"),
            ("acc_dtype", "<class 'cutlass.base_dsl.typing.Float32'>"), ("has_block_sizes", "True"),
            ("num_splits", "1"), ("allow_empty_block_nums", "False"),
        ),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
            ("blocksparse_indices_q2k", None), ("blocksparse_num_blocks_q2k", None),
            ("blocksparse_varblk", None), ("blocksparse_split_offsets", None), ("softmax_scale", None),
            ("stream", None),
        ),
    },
    "fp8_blk64": {
        "__init__": (("self", None), ("num_sms", None)),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
            ("blocksparse_indices_q2k", None), ("block_sparse_num", None), ("mQScale", None),
            ("mKScale", None), ("mVScale", None), ("softmax_scale", None), ("stream", None),
        ),
    },
    "fp8_blk128": {
        "__init__": (("self", None),),
        "__call__": (
            ("self", None), ("q", None), ("k", None), ("v", None), ("o", None), ("lse", None),
            ("indices", None), ("fixed_count", None), ("q_scale", None), ("k_scale", None),
            ("v_scale", None), ("scale", None), ("stream", None),
        ),
    },
    "sage_quant": {
        "__init__": (("self", None), ("is_sm120", "False"), ("v_block_size", "0"), ("v_layout", "'bhsd'"),
                     ("is_sm90", "False")),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mQFp8", None), ("mKFp8", None),
            ("mVFp8", None), ("mQScale", None), ("mKScale", None), ("mVScale", None),
            ("mKMeanPartial", None), ("mKMean", None), ("mVAmaxPartial", None), ("batch_size", None),
            ("num_heads", None), ("seqlen_q", None), ("seqlen_k", None), ("num_k_chunks", None),
            ("num_v_chunks", None), ("seqlen_k_float", None), ("stream", None),
        ),
    },
}


SIGNATURE_PINS["sm100_blk64"] = {
    "__init__": (
        ("self", None), ("head_dim", None), ("head_dim_v", "None"), ("qhead_per_kvhead", "1"),
        ("pack_gqa", "False"), ("m_block_size", "64"), ("n_block_size", "256"), ("sparse_block_size", "64"),
        ("is_persistent", "True"), ("use_clc_scheduler", "False"), ("allow_empty_block_nums", "False"),
        ("has_block_sizes", "True"), ("num_splits", "1"), ("use_exact_kv_layout", "False"),
        ("use_int64_kv_strides", "False"), ("nonpositive_scale", "False"), ("short_tile_opt", "True"),
    ),
    "__call__": (
        ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
        ("mQScale", None), ("mKScale", None), ("mVScale", None), ("softmax_scale", None),
        ("mBlockIndex", None), ("mBlockSizes", None), ("block_sparse_num", None), ("mBlockNums", None),
        ("mSplitOffsets", None), ("stream", None),
    ),
}


# where wheels/build.sh and the cibuildwheel build install it when SBS_CUDNN_BUILD_SITE is unset
DEFAULT_SITE = Path(__file__).resolve().parents[2] / ".carry" / "cudnn-build"


def site() -> Path | None:
    """The folder of the pinned build-time wheel (``SBS_CUDNN_BUILD_SITE``, else
    :data:`DEFAULT_SITE` when it holds the package), or None."""
    return stubs.env_site(SITE_ENV) or (DEFAULT_SITE if (DEFAULT_SITE / "cudnn").is_dir() else None)


def activate() -> Path:
    """Put the pinned packages' folder on ``sys.path`` (first), checking every pin."""
    import os

    if stubs.env_site(SITE_ENV) is None and (DEFAULT_SITE / "cudnn").is_dir():
        os.environ[SITE_ENV] = str(DEFAULT_SITE)
    return stubs.activate_site(SITE_ENV, PINS, REQUIREMENTS,
                               "cuDNN frontend's kernels (the sm_100a/sm_100f Sage kernels, the test library's "
                               "contenders)", package="cudnn")


def file_sha256(relpath: str) -> str:
    return hashlib.sha256((activate() / "cudnn" / relpath).read_bytes()).hexdigest()


def check_files() -> None:
    bad = {n: got for n, want in FILE_PINS.items() if (got := file_sha256(n)) != want}
    if bad:
        raise UpstreamMismatch(
            f"{UPSTREAM}: these files of cudnn differ from the pinned bytes: "
            + ", ".join(f"{n} (sha256 {h})" for n, h in sorted(bad.items()))
            + f". Fix: reinstall from {REQUIREMENTS}, or review the new files and update FILE_PINS "
            "and the compile spec (aot/kernels/cudnn_sm90.py)"
        )


def _refuse_imported(name: str, mod: types.ModuleType) -> None:
    raise UpstreamMismatch(
        f"{name} is already imported (from {getattr(mod, '__file__', '?')}); the cuDNN contenders "
        "import its kernel modules under stub packages. Fix: export them in a process of their "
        "own (python -m aot.export unit does)"
    )


def install_stub_packages() -> Path:
    where = activate()
    stubs.install_stub_packages(where, _STUB_PACKAGES, UPSTREAM, refuse=_refuse_imported)
    return where


def import_module(module: str) -> types.ModuleType:
    """Import ``module`` (under ``cudnn.block_sparse_attention``) from the pinned install,
    without cudnn's compiled extension, torch-free when torch is absent."""
    install_stub_packages()
    check_files()
    with stubs.torch_placeholder_if_missing(_placeholder_torch):
        return importlib.import_module(module)


def load_class(key: str) -> type:
    """The pinned class ``key`` (see :data:`CLASSES`), signature-checked."""
    module, name = CLASSES[key]
    cls = getattr(import_module(module), name, None)
    if cls is None:
        raise UpstreamMismatch(f"{UPSTREAM}: {module} no longer defines {name}")
    stubs.check_signatures(SIGNATURE_PINS[key], cls, UPSTREAM,
                           "the compile spec (aot/kernels/cudnn_sm90.py) no longer matches it")
    return cls
