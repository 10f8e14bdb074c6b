"""The contract between the build (``aot/``) and the runtime (``subblock_sage``), stated once.

Both sides import this module: the runtime as ``subblock_sage.contract``, the build as
``aot.runtime.contract`` (aot/runtime/__init__.py: the build environment never installs the
runtime). Pure Python, no dependencies, so that either side can read it anywhere.

Why one module: the ABI version, the exported symbol prefix, the distribution names and the
plan limits used to be spelled out on both sides and kept in step by hand (and by a test that
grepped source text). A kernel is now selected by its variant *parameters*, which the build
records for every export (``exports.json`` / ``manifest.json``: ``params``), never by a variant
name assembled on the runtime side; and which compute modes a target serves follows from the
kernels its manifest lists (:func:`modes_served`), not from a second table.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from os import PathLike
from typing import Any, Iterable, Mapping, NamedTuple, Optional

# --- C ABI -------------------------------------------------------------------------------------
ABI_VERSION = 1
# Every symbol a kernel library exports starts with this (aot/shim.py generates them, the link
# step's version script aot/toolchain/exports.map keeps only these global; a test checks it).
SYMBOL_PREFIX = f"subblock_sage_v{ABI_VERSION}_"

# --- Distributions -----------------------------------------------------------------------------
RUNTIME_DIST = "subblock-sage"
KERNELS_DIST = "subblock-sage-kernels-cu13"
KERNELS_PACKAGE = "subblock_sage_kernels"  # import name of the kernels distribution
MANIFEST_SCHEMA = 1


# --- File digests ------------------------------------------------------------------------------
def sha256_file(path: str | PathLike) -> str:
    """The hex sha256 of a file's bytes: the digest the build writes into ``manifest.json`` for
    every library (aot/manifest.py) and the runtime checks it against (loader.py, ``check``); the
    export cache (aot/export_cache.py) and the SBOM (wheels/sbom.py) use it too. Read in 1 MiB
    chunks, so a large file is never held whole (the digest does not depend on the chunk size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- Problem shape -----------------------------------------------------------------------------
HEAD_DIM = 128
LOG2E = 1.4426950408889634  # log2(e): the kernels' softmax runs in exp2 with the scale folded in
Q_BLOCK = 64  # query rows per routing-plan block
BLOCK_SIZES_K = (64, 128)  # key-block sizes a plan may be written in
# Largest ceil(Sk / block_size_k) the plan kernel takes (its per-warp bitmap: 8 KiB per warp,
# 32 KiB per CTA); longer plans are prepared by the PyTorch fallback.
MAX_KEY_BLOCKS = 65536
# Every kernel launches with grid (blocks, H, B): CUDA caps grid dimensions y and z at 65535.
MAX_GRID_YZ = 65535

# --- GPU targets, compute modes, attention kernels ---------------------------------------------
# The one declaration of each (docs/design/extending.md: what else a new one needs). Everything
# else derives from these three tables: the build's registry (aot/registry.py TARGETS) and its
# kernel modules' target lists, the runtime's backend map (backends/__init__.py BACKENDS), each
# backend's kernels, the validation of ``compute_mode``, the router's granularity, the launch
# bounds, the self-tests. A mode's name ("sage_fp8", "bf16") is the public API value; no other
# file of python/ spells it in code (tests/cpu/test_extending.py).


@dataclass(frozen=True)
class Target:
    """A GPU target the build compiles for and the runtime serves."""

    name: str  # the --gpu-arch name given to the DSL
    folder: str  # folder (and library suffix) in the kernels wheel
    sm: int  # SM number in the cubin's ELF e_flags
    capabilities: tuple[tuple[int, int], ...]  # compute capabilities the runtime maps to it
    gpus: str  # human-readable list of the GPUs served
    family: str  # its attention kernels' family: the runtime's backends/<family>.py serves it


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_90a", "sm90a", 90, ((9, 0),), "H100, H200, GH200", "sm90"),
        Target("sm_100a", "sm100a", 100, ((10, 0),), "B200, GB200", "sm100"),
        Target("sm_120a", "sm120a", 120, ((12, 0),), "RTX PRO 5000/6000 Blackwell, RTX 5090", "sm120"),
        # Family targets (cubins run on every member of the family): built from the same sources,
        # shipped for the capabilities the arch-specific builds cannot serve.
        Target("sm_100f", "sm100f", 100, ((10, 3),), "B300, GB300", "sm100"),
        Target("sm_120f", "sm120f", 120, ((12, 1),), "DGX Spark (GB10)", "sm120"),
    )
}
TARGET_NAMES = tuple(TARGETS)  # build order; the kernels every target ships (quantizer, plan, router)


def family_targets(family: str) -> tuple[str, ...]:
    """The targets whose attention kernels are ``family``'s (e.g. "sm120": sm_120a, sm_120f)."""
    return tuple(t.name for t in TARGETS.values() if t.family == family)


@dataclass(frozen=True)
class ComputeMode:
    """One compute mode of ``sparse_attention`` / ``subblock_attention``: what every layer asks
    of a mode, read here instead of comparing its name."""

    name: str  # the public value of ``compute_mode``
    quantizes: bool  # the Sage quantizer (SAGE_QUANT_KERNELS) converts Q/K/V before its kernel
    # the router's budget granularity, as SGLang 0.5.23's SubBlock backend sets it
    # (router_spec.BUDGET_GRANULARITY says why)
    budget_granularity: int
    # key-block size its plans are routed in (subblock_attention, the SGLang integration), per
    # attention-kernel family where not Q_BLOCK: sm90 Sage in 128 (the Q64 x K128 tiles of
    # SGLang's sm_90a Sage path, whose router plans ceil(Sk/128) key blocks; ours take either size)
    router_blocks: tuple[tuple[str, int], ...]
    max_launches: int  # launches of a sparse_attention call, at most (MAX_LAUNCHES)
    max_routed_launches: int  # launches of a subblock_attention call, at most (MAX_ROUTED_LAUNCHES)
    sm90_mode: str  # the sm90 attention kernels' ``mode`` parameter (aot/kernels/sm90/config.py)
    # self-test verdict (reference.attention_verdict): (largest relative L1, smallest cosine) of
    # a kernel's output against the float64 reference on a small ragged problem; a correct Sage
    # kernel gives ~0.037 / 0.9993, bf16 ~0.003 / 0.99999
    self_test_limits: tuple[float, float]

    @property
    def kernels(self) -> dict[str, str]:
        """Attention-kernel family -> the kernel of that family serving this mode."""
        return {k.family: k.name for k in ATTENTION if k.mode == self.name}

    @property
    def targets(self) -> tuple[str, ...]:
        """The targets with an attention kernel for this mode (a library serves it if it ships
        that kernel and, where ``quantizes``, the quantizer: ``modes_served``)."""
        return tuple(t.name for t in TARGETS.values() if t.family in self.kernels)

    def router_block_size_k(self, family: str) -> int:
        return dict(self.router_blocks).get(family, Q_BLOCK)


# Launch bounds (every launch costs host time and a GPU gap at small per-GPU shapes;
# tests/gpu/test_replay_gpu.py counts them): sparse_attention = the quantizer with the plan role +
# attention, or plan + attention. subblock_attention = the router's (router_pool, then
# router_select once, or twice where its key tiles are split: backends/router.select_launches; for Sage
# with 16-token cells the pooling quantizer takes router_pool's place), then the attention launch;
# the router's plan is already what the plan kernel makes, so no plan kernel runs, and only Sage
# with other cells launches the quantizer on its own.
SAGE_FP8 = ComputeMode("sage_fp8", quantizes=True, budget_granularity=1, router_blocks=(("sm90", 128),),
                       max_launches=2, max_routed_launches=5, sm90_mode="sage",
                       self_test_limits=(0.05, 0.998))
BF16 = ComputeMode("bf16", quantizes=False, budget_granularity=8, router_blocks=(),
                   max_launches=2, max_routed_launches=4, sm90_mode="bf16",
                   self_test_limits=(0.01, 0.9999))
MODES: dict[str, ComputeMode] = {m.name: m for m in (SAGE_FP8, BF16)}
COMPUTE_MODES = tuple(MODES)
# The compute_mode of sparse_attention and subblock_attention when the caller passes none: bf16,
# because it is served on every target (Sage on sm_100a / sm_100f is opt-in and takes fixed-count
# plans only, so a Sage default would raise there) and it is exact up to bf16 rounding, where Sage rounds Q/K to
# INT8 and P/V to FP8 (reference.SELF_TEST_LIMITS). It is SGLang's default too; its plugin passes
# the mode explicitly. Sage is the faster mode where served: pass compute_mode="sage_fp8".
DEFAULT_COMPUTE_MODE = BF16.name


@dataclass(frozen=True)
class AttentionKernel:
    """An attention kernel: its name (the build's Kernel.name, the runtime's launch name), the
    family of targets it is compiled for, the compute mode it implements."""

    name: str
    family: str
    mode: str
    # the quantizer kernel it reads where not ours (SAGE_QUANT_KERNELS, for a mode that
    # ``quantizes``): cuDNN's SM100 Sage kernel reads cuDNN's E4M3 Q/K/V and scales (backends/sm100.py)
    quantizer: str = ""


ATTENTION: tuple[AttentionKernel, ...] = (
    AttentionKernel("sm90_bsa_sage", "sm90", SAGE_FP8.name),  # aot/kernels/sm90/ (own)
    AttentionKernel("sm90_bsa_bf16", "sm90", BF16.name),
    AttentionKernel("fi_sm120_sage_fwd", "sm120", SAGE_FP8.name),  # aot/kernels/flashinfer_sm120.py
    AttentionKernel("fi_sm120_bf16_fwd", "sm120", BF16.name),
    AttentionKernel("fi_sm100_bf16_fwd", "sm100", BF16.name),  # aot/kernels/flashinfer_sm100.py
    # aot/kernels/cudnn_sm100.py (cuDNN frontend's, opt-in: UNVALIDATED below)
    AttentionKernel("cudnn_sage_sm100_fp8", "sm100", SAGE_FP8.name, quantizer="cudnn_sage_quant_sm100"),
)
# attention kernel -> the compute mode it implements (Sage kernels also need the quantizer)
ATTENTION_KERNELS = {k.name: k.mode for k in ATTENTION}
# Sage attention kernels that read another quantizer than SAGE_QUANT_KERNELS: kernel -> that quantizer
ATTENTION_QUANTIZERS = {k.name: k.quantizer for k in ATTENTION if k.quantizer}


def attention_kernel(family: str, mode: str) -> str:
    """The name of ``family``'s attention kernel for compute mode ``mode`` (KeyError: none)."""
    return MODES[mode].kernels[family]


def family_kernels(family: str) -> dict[str, str]:
    """Compute mode -> ``family``'s attention kernel for it (a backend's ``kernels``)."""
    return {k.mode: k.name for k in ATTENTION if k.family == family}


# the Sage quantizer: one launch (Q, the K mean, K/V, optionally the plan role): each extra launch
# costs a launch gap and a drain on the stream
SAGE_QUANT_KERNELS = ("sage_quant_kv",)
SAGE_QUANT_KERNEL = SAGE_QUANT_KERNELS[0]  # the launch with the plan role (ops/quantize.py)
# The Sage quantizer (aot/kernels/sage_quant/) works on segments (V of one (b, h), then K of
# that (b, h)) in units of SAGE_KV_UNIT_BLOCKS 64-key blocks (one ticket each, one block per warp
# group). Its one workspace, ``sync`` (int32 words), is the stream's own and is never refilled
# (the runtime zeroes it once, ``workspace.sync_buffer``): words 0-1 a 64-bit counter (low half the
# tickets taken by the running launch, high half the launch's *epoch*; the CTA that takes the
# last ticket sets the low half to 0 and adds 1 to the epoch). From word SAGE_SYNC_ROW0, per
# (b, h) SAGE_K_MEAN_SPLIT rows of partial K sums, 128 slots of 8 bytes each ({fp32 value, tag},
# one 64-bit word: SAGE_SYNC_KROW_WORDS words per row); from word ``sage_sync_v0(B*H)``, per
# (b, h) ``sage_stats_rows`` rows of V statistics (``sage_v_rows``: one per unit, one per group of
# SAGE_STATS_GROUP units, one final, the sampled amax partials, the units' done slots), 128 slots of 4 bytes each (SAGE_SYNC_VROW_WORDS): a V
# statistic is an amax of bf16 values, so its fp32 bits end in 16 zeros, which carry the low 16
# bits of the tag instead (half the bytes of 8-byte slots: the zeroing of a graph's buffer and
# the slots' L2 footprint). A slot is written in this launch iff its tag is
# ``sage_sync_tag(epoch)`` (V slots: its low 16 bits); tags are odd, so a zeroed slot never is
# valid; two launches' V tags differ until 2**15 epochs apart, so the runtime zeroes a stream's
# buffer every SAGE_SYNC_EPOCHS launches.
SAGE_KV_UNIT_BLOCKS = 2
SAGE_STATS_GROUP = 32
SAGE_SYNC_ROW0 = 4  # (16-byte aligned rows)
SAGE_SYNC_KROW_WORDS = 256  # a K-mean partial row: 128 slots of {value, tag}
SAGE_SYNC_VROW_WORDS = 128  # a V statistics row: 128 slots of bf16-exact value | 16-bit tag
SAGE_SYNC_VTAG_MASK = 0xFFFF  # a V slot's tag bits (the low half of the launch's tag)
SAGE_SYNC_EPOCHS = 1 << 14  # launches per stream buffer between zeroings (V tags repeat after 2**15)
SAGE_SYNC_ARG = "sync"  # the launch argument that takes the buffer (the replay recorder knows it by this name)


def sage_sync_tag(epoch: int) -> int:
    """The tag (uint32) of a slot written by the launch of ``epoch``: ``2 * epoch + 1`` mod
    2**32 (odd: never the 0 of a zeroed slot). The kernels compute the same with 32-bit ints."""
    return (2 * epoch + 1) & 0xFFFFFFFF


# Keys whose mean smooths K: softmax is invariant to a per-channel shift of
# K, so the mean only sets where K's INT8 blocks are centred; a strided sample of 512 keys puts it
# about sigma/sqrt(512) = 0.044 sigma from the exact mean (sigma: the channel's spread over keys),
# which moves a block's amax of |K - mean|, hence its INT8 step, by that much at most, and lets
# the quantizer read K once, without waiting for a per-head reduction.
SAGE_K_MEAN_ROWS = 512
# K-mean tickets per (b, h): 128 sampled keys each, one batch of loads per thread (one CTA per
# head needs 4 dependent round trips to L2, which made the quantizer 2 us slower at H=4 S=8192 on
# an H200; MEASUREMENTS.md)
SAGE_K_MEAN_SPLIT = 4


def sage_k_mean_rows(seqlen_k: int, minimum=min, maximum=max) -> tuple[int, int]:
    """``(n, stride)``: the keys ``0, stride, ..., (n-1)*stride`` whose per-channel mean smooths
    K (all keys when ``seqlen_k <= SAGE_K_MEAN_ROWS``). ``minimum`` / ``maximum``: the DSL's when
    the quantizer kernels trace it on their integers (one definition for the kernels and the
    reference)."""
    n = maximum(minimum(seqlen_k, SAGE_K_MEAN_ROWS), 1)
    return n, maximum(seqlen_k // n, 1)


def sage_kv_units(num_blocks: int) -> int:
    """The quantizer's units (tickets) per (b, h) and tensor for ``num_blocks`` 64-key blocks."""
    return ceil_div(num_blocks, SAGE_KV_UNIT_BLOCKS)


# V's scale bound: ``v_scale = max(SAGE_V_BOUND_MARGIN * sampled amax, amax,
# 1e-7) / 2.25`` per channel, the sampled amax over the K mean's sample keys
# (``sage_k_mean_rows``). When no key of the head exceeds the margin times its sample's amax
# (every Gaussian-like V: the amax of 37760 keys is ~1.5x that of 512 strided ones) the scale is
# known before any V unit is read, so each unit is quantized in its only read; otherwise the head
# is quantized again after its exact amax (the quantizer's redo tickets). FP8-E4M3 keeps its
# relative precision at any scale: a 4x larger scale only moves values under 1/36 of the amax
# into the subnormal range (absolute error <= scale * 2**-10), far under the rounding error of
# the large values. Power of two: the product is exact.
SAGE_V_BOUND_MARGIN = 4.0
SAGE_V_BOUND_MAX = 2.0 ** 126  # the bound's clamp: margin x a huge amax stays finite


class SageVRows(NamedTuple):
    """The V statistics rows of one segment, as offsets from its first row (``sage_v_rows``)."""

    group0: Any  # the first group row (one per SAGE_STATS_GROUP units); unit rows are 0 .. units-1
    final: Any  # the final row: the exact amax
    sample0: Any  # the first of SAGE_K_MEAN_SPLIT rows of sampled amax partials
    done0: Any  # the first row of the units' done slots (one V slot each, 128 per row)
    rows: Any  # rows in all


def sage_v_rows(units) -> SageVRows:
    """The V statistics rows of one segment of ``units`` units: one row per unit from 0, one per
    group of SAGE_STATS_GROUP units, the final (exact amax) row, SAGE_K_MEAN_SPLIT rows of sampled
    amax partials, then the units' done slots, in that order. Plain ``+ // *`` only: the kernel
    traces it on its integers."""
    groups = (units + SAGE_STATS_GROUP - 1) // SAGE_STATS_GROUP
    final = units + groups
    sample0 = final + 1
    done0 = sample0 + SAGE_K_MEAN_SPLIT
    return SageVRows(units, final, sample0, done0, done0 + (units + SAGE_SYNC_VROW_WORDS - 1) // SAGE_SYNC_VROW_WORDS)


def sage_stats_rows(num_blocks: int) -> int:
    """Statistics rows per V segment for ``num_blocks`` 64-key blocks per (b, h) (``sage_v_rows``)."""
    return sage_v_rows(sage_kv_units(num_blocks)).rows


def sage_sync_v0(heads: int) -> int:
    """The word of the quantizer's workspace where the V statistics rows begin, after the
    counter and the K-mean partial rows of ``heads = B*H`` heads."""
    return SAGE_SYNC_ROW0 + heads * SAGE_K_MEAN_SPLIT * SAGE_SYNC_KROW_WORDS


def sage_sync_words(B: int, H: int, num_blocks: int) -> int:
    """int32 words of the quantizer's workspace: the counter, per (b, h) SAGE_K_MEAN_SPLIT rows
    of partial K sums (SAGE_SYNC_KROW_WORDS words each), then per (b, h) ``sage_stats_rows`` rows
    of V statistics (SAGE_SYNC_VROW_WORDS words each)."""
    return sage_sync_v0(B * H) + B * H * sage_stats_rows(num_blocks) * SAGE_SYNC_VROW_WORDS


PLAN_KERNEL = "plan_prepare"
# Launches per call, at most, by mode (ComputeMode: why)
MAX_LAUNCHES = {m.name: m.max_launches for m in MODES.values()}
MAX_ROUTED_LAUNCHES = {m.name: m.max_routed_launches for m in MODES.values()}

# Compute modes a target ships but that nobody has validated on a capability it serves: the runtime
# refuses them in validate_startup() without an explicit opt-in (SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1)
# and `check` labels them; the build copies this into the manifest. Sage on 12.1 (DGX Spark):
# FlashInfer itself enables its SM120 Sage kernel on 12.0 only (bf16 on any 12.x), and no run on a
# GB10 exists.
UNVALIDATED: dict[str, dict[str, dict[str, Any]]] = {
    "sm_120f": {
        SAGE_FP8.name: {
            "capabilities": ["12.1"],
            "status": "unvalidated",
            "why": "FlashInfer enables its SM120 Sage kernel on compute capability 12.0 only, and "
                   "it has never been run on a 12.1 GPU (DGX Spark) by this project",
        },
    },
    # cuDNN frontend's SM100 Sage FP8 kernel, compiled ahead of time (docs/design/sage-sm100.md):
    # built without a GPU, never run by this project
    **{target: {
        SAGE_FP8.name: {
            "capabilities": [cap],
            "status": "unvalidated",
            "why": "cuDNN frontend's SM100 Sage FP8 kernel is compiled ahead of time for it and has "
                   f"never been run on a {cap} GPU ({gpus}) by this project",
        },
    } for target, cap, gpus in (("sm_100a", "10.0", "B200/GB200"), ("sm_100f", "10.3", "B300/GB300"))},
}


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def modes_served(kernel_names: Iterable[str]) -> tuple[str, ...]:
    """The compute modes a library with these kernels serves (in ``COMPUTE_MODES`` order)."""
    have = set(kernel_names)
    quant = all(k in have for k in SAGE_QUANT_KERNELS)

    def complete(k: AttentionKernel) -> bool:  # an attention kernel together with the quantizer it reads
        if k.quantizer:
            return k.quantizer in have
        return quant or not MODES[k.mode].quantizes

    modes = {k.mode for k in ATTENTION if k.name in have and complete(k)}
    return tuple(m for m in COMPUTE_MODES if m in modes)


def select_variant(kernel: str, variants: Iterable[tuple[str, Mapping[str, Any]]],
                   params: Mapping[str, Any]) -> str:
    """The one variant of ``kernel`` whose recorded parameters match ``params``.

    ``variants``: (variant name, recorded params) pairs, as the build records them. A variant
    matches when it has every given parameter with an equal value; a given value of ``None``
    means "the variant does not set this parameter" (e.g. ``label``: every sm90 export of a
    release build lacks it). Among several matches the one setting the fewest parameters beyond
    those given wins; a tie is an error, so a selection can never silently change when a variant
    is added. Raises LookupError (no match / ambiguous).
    """
    matches = []
    for name, have in variants:
        ok = all((k not in have) if want is None else (k in have and have[k] == want)
                 for k, want in params.items())
        if ok:
            matches.append((len(set(have) - set(params)), name))
    if not matches:
        raise LookupError(f"no variant of {kernel} has {dict(params)}")
    matches.sort()
    if len(matches) > 1 and matches[0][0] == matches[1][0]:
        tied = [n for e, n in matches if e == matches[0][0]]
        raise LookupError(f"{dict(params)} selects several variants of {kernel}: {tied}")
    return matches[0][1]


# --- SM90 variant selection --------------------------------------------------------------------
# The runtime selects an sm90 attention export by these parameters; every sm90 export records
# them (with the rest of its resolved config: ``aot/kernels/sm90/variants.py``, ``variant_params``)
# and every request gives all of them (``sm90_request``). ``label`` is None for every export of a
# release build; a build outside the release may add exports that carry one (``SelectionPolicy``).
SM90_SELECT_AXES = ("mode", "block_k", "counts", "wgs", "pair", "q_fused", "flat_wgs", "cluster", "kv_share",
                    "tail", "label")
# The sm90 attention kernels by compute mode (the kernel's ``mode`` parameter).
SM90_KERNELS = {mode: (kernel, MODES[mode].sm90_mode) for mode, kernel in family_kernels("sm90").items()}
# CTA shape (``wgs``, ``pair``) of each sm90 kernel per (mode, plan key block): "default" serves
# calls, "alt" is the other shape built for the same key block, into the never-shipped test
# library (benchmarks and the GPU tests compare both; a policy selects it, a backend with the test
# library, ``SM90Backend.with_library``, runs it). wgs: 0 = flat (one warpgroup that issues
# its own TMA loads), 1 / 2 = a TMA producer warpgroup and one / two consumer warpgroups; pair: a
# 64-key plan run two entries per 128-key tile. Measured on an H200 (docs/design/kernels-sm90.md):
# Sage runs fastest flat (three or four CTAs per SM) and its 64-key plans paired (3.31-3.42 ms
# against 3.47-3.69 unpaired, H=14 S=37760); bf16, bound by the K/V traffic, runs fastest with
# two ping-pong consumers (flat bf16 measured no faster).
SM90_SHAPES: Mapping[tuple[str, int], Mapping[str, tuple[int, bool]]] = {
    ("bf16", 64): {"default": (2, False)},
    ("bf16", 128): {"default": (2, False)},
    ("sage", 64): {"default": (0, True), "alt": (0, False)},
    ("sage", 128): {"default": (0, False), "alt": (1, False)},
}


@dataclass(frozen=True)
class SelectionPolicy:
    """How the sm90 backend chooses among the exports of a library: one frozen value, held by the
    backend (``SM90Backend(policy)``, ``BACKEND.with_policy(...)``); tests and benchmarks pass
    their own instead of changing the backend. The defaults are the measured choices:

    - ``sage_alt_shape`` (plan key-block sizes on which Sage runs the "alt" CTA shape of
      ``SM90_SHAPES``): none. The default shapes are the faster ones on every measured plan.
    - ``sage_cluster`` (Sage in the default shape; 128-key tiles, 64-key plans paired): None =
      two-CTA clusters exactly when a row of the plan can list every key block
      (``Plan.rows_can_be_dense``), else one CTA; 1 / 2 force either. A cluster whose two rows are
      both dense loads each K/V tile once for both CTAs (half the L2 -> SM traffic): on an H200 at
      its 700 W cap, kernel only, dense H=14 S=37760, 11.93-12.30 ms against 12.39-12.77 for one
      CTA (the SM clock rises from 1785-1845 to 1875-1905 MHz at the same power). On plans whose
      rows are sparse no pair shares and the cluster kernel takes -0.6 to +2.1 % longer than the
      one-CTA kernel (median +0.9 % over 30 timed pairs); on SGLang-like plans
      (full capacity, some query blocks dense) the cluster kernel is level at a tenth of the rows
      dense (0.992-0.997 of the one-CTA time) and ahead at a quarter (0.971-0.986).
    - ``bf16_cluster`` (bf16, both key blocks): the query blocks that one K/V load serves where
      rows are dense. 1 = each row loads its own tiles; 2 = the shared-ring kernel
      (``kv_share``: a CTA of the two-consumer shape holds query blocks 2c and 2c+1, and when both
      rows are dense its producer loads each K/V tile once into one ring that both consumers
      read; any other CTA runs as the one-ring-per-row kernel); 4 = the same kernel in two-CTA
      clusters (rows 4c .. 4c+3: when all four are dense each CTA loads half of every tile into
      both CTAs' rings by TMA multicast; a cluster with one CTA's pair dense shares within it);
      (its kernels are in the test library only: ``SM90Backend.with_library``);
      None (the default) = 2 exactly when a row of the plan can list every key block
      (``Plan.rows_can_be_dense``: SGLang's plans, whose capacity is every key block), else 1.
      Why: H100 at its 700 W cap, kernel only, H=14 S=37760, median of two alternated rounds,
      outputs bit-identical to 1 on every plan: a dense plan takes 21.47 -> 16.44 ms with 128-key
      blocks (-23 %; level with cuDNN's dense bf16 SDPA, 16.51) and 20.18 -> 19.02 with 64-key
      blocks (-6 %); SGLang-like plans (full capacity, 10 % / 25 % of the rows dense) -3.5 % /
      -7.4 % (128-key) and -1.1 % / -3.8 % (64-key); a full-capacity plan with no dense row
      pays the shared-ring kernel's other path, +0.7 % (64-key) / +1.9 % (128-key), measured on
      random 0.25 plans. 4 gains on dense 64-key plans only (18.19 ms, -10 %) and costs up to
      +5 % on sparse ones, so None never picks it.
    - ``q_fused`` / ``q_fused_min_ctas``: Sage in the default shape runs the kernel that quantizes
      its own Q tile (the quantizer then moves K and V only) for calls of at least 1024 query
      blocks (B x H x ceil(Sq/64), one CTA each). Each CTA spends ~1.5-2.5 us loading and
      quantizing its 16 KiB of bf16 Q before its first MMA, which the quantizer's saved Q pass
      repays only over several waves of CTAs: H200, whole call, H=14 S=37760 (8260 CTAs) 3.49-3.51
      ms against 3.52 with INT8 Q, H=2 S=37760 (1180) 0.539 against 0.548-0.572, but H=4 S=8192
      (512 CTAs, 1.3 waves) 0.0816-0.0829 against 0.0800-0.0804 ms.
    - ``bf16_tail`` (bf16): None = the shipped kernels, nothing split. ``"rule"`` = the kernels
      that split the pairs of query blocks of a part-full last wave, each into two CTAs of one
      query block whose two consumers share its plan row (``tail`` exports, the kernel's
      ``ws_split``; in the test library until a GPU run has timed them: docs/design/kernels-sm90.md),
      as many as :func:`sm90_tail_pairs` says; an int >= 0 forces that many (the last ones).
    - ``label``: None. A label that an export of a library built outside the release carries in
      its params: the call runs that export of its mode, key block and Q choice instead of the
      selection above, so that a benchmark times a kernel the release does not ship through the
      runtime's own call path. A release library has no labelled export (LookupError).

    Numbers: MEASUREMENTS.md.
    """

    sage_alt_shape: frozenset = frozenset()
    sage_cluster: Optional[int] = None
    bf16_cluster: Optional[int] = None
    q_fused: bool = True
    q_fused_min_ctas: int = 1024
    bf16_tail: Optional[int | str] = None
    label: Optional[str] = None

    def __post_init__(self):
        object.__setattr__(self, "sage_alt_shape", frozenset(self.sage_alt_shape))
        if not self.sage_alt_shape <= set(BLOCK_SIZES_K):
            raise ValueError(f"sage_alt_shape={sorted(self.sage_alt_shape)}: key-block sizes are "
                             f"{BLOCK_SIZES_K}. Fix: pass a subset of those.")
        if self.sage_cluster not in (None, 1, 2):
            raise ValueError(f"sage_cluster={self.sage_cluster!r}. Fix: None (by the plan), 1 or 2.")
        if self.bf16_cluster not in (None, 1, 2, 4):
            raise ValueError(f"bf16_cluster={self.bf16_cluster!r}. Fix: None (by the plan), 1, 2 or 4.")
        if self.q_fused_min_ctas < 0:
            raise ValueError(f"q_fused_min_ctas={self.q_fused_min_ctas}. Fix: pass a count >= 0.")
        t = self.bf16_tail
        if t is not None and t != "rule" and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"bf16_tail={t!r}. Fix: None (nothing split), 'rule' or a count >= 0.")


def sm90_request(policy: SelectionPolicy, compute_mode: str, block_k: int, *, q_fused: bool,
                 dense_rows: bool, counts: bool = True) -> dict:
    """The complete selection (every ``SM90_SELECT_AXES`` parameter) of the sm90 attention export
    that ``policy`` runs for a call: ``block_k`` the plan's key block, ``q_fused`` whether the
    kernel quantizes Q itself, ``dense_rows`` whether a row of the plan can list every key block.
    With ``policy.label`` the export of that label is asked for (its shape is its own)."""
    mode = SM90_KERNELS[compute_mode][1]
    if policy.label is not None:
        return {"mode": mode, "block_k": block_k, "counts": counts, "q_fused": q_fused, "label": policy.label}
    alt = mode == "sage" and block_k in policy.sage_alt_shape
    wgs, pair = SM90_SHAPES[(mode, block_k)]["alt" if alt else "default"]
    kv_share = False
    if mode == "bf16":
        share = policy.bf16_cluster or (2 if dense_rows else 1)  # query blocks per K/V load
        cluster, kv_share = (2 if share == 4 else 1), share > 1
    elif alt:
        cluster = 1
    else:
        cluster = policy.sage_cluster or (2 if dense_rows else 1)
    tail = mode == "bf16" and policy.bf16_tail is not None
    return {"mode": mode, "block_k": block_k, "counts": counts, "wgs": wgs, "pair": pair,
            "q_fused": q_fused, "flat_wgs": 1, "cluster": cluster, "kv_share": kv_share, "tail": tail, "label": None}


def sm90_takes_tail(params: Mapping[str, Any]) -> bool:
    """Whether the sm90 export recorded with ``params`` takes ``tail_pairs`` (its last pairs of
    query blocks split, ``aot/kernels/sm90/kernel.py`` ``ws_split``): the ``tail`` exports. The
    build's argument list and the runtime's values read this."""
    return bool(params.get("tail"))


def sm90_tail_pairs(policy: SelectionPolicy, pairs: int, sms: int) -> int:
    """How many of a bf16 launch's ``pairs`` (CTAs of two query blocks, one CTA per SM) run split
    on a GPU of ``sms`` SMs: each split pair is two CTAs of one query block, its plan row shared by
    the two consumers and merged at the end, so it takes about half a pair's time. The pairs fill
    ``pairs // sms`` waves and ``pairs % sms`` SMs of a last one, whose other SMs idle for a whole
    pair's time: split, those last pairs become twice as many half-length CTAs. That pays where they
    fit one wave (``2 * (pairs % sms) <= sms``): at H=2 S=37760 on 132 SMs 590 pairs run 4.47
    waves as 5 pair-times, split 4.5; otherwise the last wave stays a pair-time long.
    An int ``policy.bf16_tail`` overrides the rule (clamped to ``pairs``)."""
    if isinstance(policy.bf16_tail, int):
        return min(policy.bf16_tail, pairs)
    rem = pairs % sms if sms > 0 else 0
    return rem if 2 * rem <= sms else 0


def sm90_selectable(params: Mapping[str, Any]) -> bool:
    """Whether some policy of a release build can select the sm90 export recorded with ``params``
    (the build's serving rule: aot/serving.py): per-row counts (the runtime always prepares them),
    no label, and the axes of an ``sm90_request``."""
    if not params.get("counts") or params.get("label") is not None:
        return False
    compute_mode = next((m for m, (_, mode) in SM90_KERNELS.items() if mode == params.get("mode")), None)
    if compute_mode is None or (params["mode"], params.get("block_k")) not in SM90_SHAPES:
        return False
    want = {k: params.get(k) for k in SM90_SELECT_AXES}
    bk = params["block_k"]
    for alt in ((), (bk,)):
        for cluster, share in ((1, 1), (2, 2), (2, 4)):
            for dense_rows, q_fused, tail in itertools.product((False, True), (False, True), (None, "rule")):
                try:
                    policy = SelectionPolicy(sage_alt_shape=alt, sage_cluster=cluster, bf16_cluster=share,
                                             bf16_tail=tail)
                except ValueError:
                    continue
                if sm90_request(policy, compute_mode, bk, q_fused=q_fused, dense_rows=dense_rows) == want:
                    return True
    return False
