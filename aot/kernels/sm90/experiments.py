"""Timing experiments on the SM90a attention kernels: built only on request, never shipped.

Request: configure CMake with ``-DSBS_EXPERIMENTS=ON`` (or run ``python -m aot.export ...
--experiments``). The registry then lists ``sm90_bsa_bf16`` / ``sm90_bsa_sage`` from this module
instead of ``variants.py``: the same kernels with the variants below added, so that an H200 run
can launch them through the runtime like the shipped ones (e.g. ``SM90Backend.sage_shape[128] =
"flats2"``). A release build (``wheels/build.sh``) never sets the option.

- Alternatives measured against the shipped shapes (correct results): deeper K/V rings
  (``flats2``, ``k2``), three CTAs per SM for k64 (``flatc3``, ``flats2c3``), the eager refill,
  three warpgroups per CTA sharing K/V loads on identical plan rows (``k128_f3[qf]_cnt``,
  ``flat3.py``).
- Ablations (**wrong results on purpose**, timing only): ``k{bk}_abl{half,all}_cnt`` replace half
  / all of the K/V TMA loads by a hand-made transaction completion (``ablation.py``), to measure
  what the L2 -> SM traffic costs (NOTES-sm90.md, MEASUREMENTS.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from aot.registry import Variant

from . import variants as _shipped
from .config import PAIRED, Sm90Config


def experiment_variants(mode: str) -> tuple:
    out = []
    if mode == "sage":
        for bk, tag, params in ((128, "flats2", {"stages": (2, 2)}), (64, "flats2", {"stages": (2, 2)}),
                                (64, "flats2c3", {"stages": (2, 2), "ctas_per_sm": 3}),
                                (64, "flatc3", {"ctas_per_sm": 3})):
            out.append(Variant(f"k{bk}_{tag}_cnt", {"block_k": bk, "counts": True, "wgs": 0, **params}))
        for bk in (64, 128):
            out.append(Variant(f"k{bk}_eager_cnt", {"block_k": bk, "counts": True,
                                                     "pair": ("sage", bk) in PAIRED, "refill": "eager"}))
        # two K buffers, one V buffer (K of entry t+2 under P.V(t)): one more entry of TMA slack
        out.append(Variant("k128_k2_cnt", {"block_k": 128, "counts": True, "wgs": 0, "stages": (2, 1)}))
        # three warpgroups per CTA that share their K/V loads when their plan rows are identical
        # (flat3.py; fifteenth session: 4-7 % slower than the flat kernel, MEASUREMENTS.md), INT8 Q
        # and Q-fused; the runtime selects them with SM90Backend.sage_share3
        for tag, qf in (("f3", False), ("f3qf", True)):
            out.append(Variant(f"k128_{tag}_cnt", {"block_k": 128, "counts": True, "wgs": 0, "flat_wgs": 3,
                                                   **({"q_fused": True} if qf else {})}))
    # ablations (wrong results on purpose): half / all of the K/V TMA loads skipped, default shapes
    for bk in (64, 128) if mode == "bf16" else (128,):
        for tag in ("half", "all"):
            # (pair as the default variant's, so that a selection of the default stays unambiguous)
            # (one CTA: the ablation's loads are not multicast)
            out.append(Variant(f"k{bk}_abl{tag}_cnt", {"block_k": bk, "counts": True, "pair": (mode, bk) in PAIRED,
                                                       "ablate": tag, **({"cluster": 1} if mode == "sage" else {})}))
    return tuple(out)


def _make_kernel(cfg: Sm90Config, params: Mapping[str, Any]):
    if params.get("ablate"):
        from .ablation import Sm90AblationAttention

        return Sm90AblationAttention(cfg, params["ablate"])
    from .kernel import Sm90SparseAttention

    return Sm90SparseAttention(cfg)


KERNELS: list = _shipped.kernels(
    variants_of=lambda mode: _shipped.variants(mode) + experiment_variants(mode),
    spec_of=lambda mode: _shipped.spec(mode, _make_kernel),
)
