"""Timing experiments on the SM90a attention kernels: built only on request, never shipped.

Request: configure CMake with ``-DSBS_EXPERIMENTS=ON`` (or run ``python -m aot.export ...
--experiments``). The registry then lists ``sm90_bsa_bf16`` / ``sm90_bsa_sage`` from this module
instead of ``variants.py``: the same kernels with the variants below added, each recording its
experiment's label (``params["experiment"]``), so that an H200 run can launch one through the
runtime like the shipped ones: ``BACKEND.with_policy(SelectionPolicy(experiment="f3"))`` runs the
label's export in place of the default-shape Sage kernel. A release build (``wheels/build.sh``)
never sets the option.

- Alternatives measured against the shipped shapes (correct results): deeper K/V rings
  (``s22``, ``s21``), three CTAs per SM for the unpaired k64 kernel (``cta3``, ``s22cta3``), the
  eager refill (``eager``), three warpgroups per CTA sharing K/V loads on identical plan rows
  (``f3``: ``flat3.Sm90Flat3Attention``, a subclass of the shipped kernel; 4-7 % slower than the
  flat kernel on dense and sparse plans).
- Ablations (**wrong results on purpose**, timing only): ``abl{half,all}`` replace half / all of
  the K/V TMA loads by a hand-made transaction completion (``ablation.py``), to measure what the
  L2 -> SM traffic costs (docs/design/kernels-sm90.md, MEASUREMENTS.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from aot.contract import BLOCK_SIZES_K

from . import variants as _shipped
from .config import PAIRED, Sm90Config


def experiment_variants(mode: str) -> tuple:
    resolve, variant = Sm90Config.resolve, _shipped.variant
    out = []
    if mode == "sage":
        for bk, label, knobs in ((128, "s22", {"stages": (2, 2)}), (64, "s22", {"stages": (2, 2)}),
                                 (64, "s22cta3", {"stages": (2, 2), "ctas_per_sm": 3}),
                                 (64, "cta3", {"ctas_per_sm": 3})):
            out.append(variant(resolve(mode, bk, wgs=0, **knobs), experiment=label))
        for bk in BLOCK_SIZES_K:
            out.append(variant(resolve(mode, bk, pair=(mode, bk) in PAIRED, refill="eager"), experiment="eager"))
        # two K buffers, one V buffer (K of entry t+2 under P.V(t)): one more entry of TMA slack
        out.append(variant(resolve(mode, 128, wgs=0, stages=(2, 1)), experiment="s21"))
        # three warpgroups per CTA that share their K/V loads when their plan rows are identical
        # (flat3.py), INT8 Q and Q-fused
        for qf in (False, True):
            out.append(variant(resolve(mode, 128, wgs=0, flat_wgs=3, q_fused=qf), experiment="f3"))
    # ablations (wrong results on purpose): half / all of the K/V TMA loads skipped, default shapes
    # (Sage as one CTA: the ablation's loads are not multicast)
    for bk in BLOCK_SIZES_K if mode == "bf16" else (128,):
        cfg = resolve(mode, bk, pair=(mode, bk) in PAIRED, **({"cluster": 1} if mode == "sage" else {}))
        for tag in ("half", "all"):
            out.append(variant(cfg, experiment=f"abl{tag}", ablate=tag))
    return tuple(out)


def _make_kernel(cfg: Sm90Config, params: Mapping[str, Any]):
    if params.get("ablate"):
        from .ablation import Sm90AblationAttention

        return Sm90AblationAttention(cfg, params["ablate"])
    if cfg.flat_wgs == 3:
        from .flat3 import Sm90Flat3Attention

        return Sm90Flat3Attention(cfg)
    from .kernel import Sm90SparseAttention

    return Sm90SparseAttention(cfg)


KERNELS: list = _shipped.kernels(
    variants_of=lambda mode: _shipped.variants(mode) + experiment_variants(mode),
    spec_of=lambda mode: _shipped.spec(mode, _make_kernel),
)
