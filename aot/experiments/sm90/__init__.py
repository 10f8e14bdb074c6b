"""Timing experiments on the SM90a attention kernels (``aot/kernels/sm90``): built only on
request, never shipped (``aot/experiments/__init__.py`` says how they are built and run).

The registry then lists ``sm90_bsa_bf16`` / ``sm90_bsa_sage`` from this module instead of
``aot/kernels/sm90/variants.py``: the same kernels with the variants below added, each recording
its label (``params["label"]``), e.g. ``BACKEND.with_policy(label="f3")`` runs the three-warpgroup
export in place of the default-shape Sage kernel.

- Alternatives measured against the shipped shapes (correct results): deeper K/V rings
  (``s22``, ``s21``), three CTAs per SM for the unpaired k64 kernel (``cta3``, ``s22cta3``), the
  eager refill (``eager``), three warpgroups per CTA sharing K/V loads on identical plan rows
  (``f3``: ``flat3.Sm90Flat3Attention``, a subclass of the shipped kernel; 4-7 % slower than the
  flat kernel on dense and sparse plans).
- Ablations (**wrong results on purpose**, timing only): ``abl{half,all}`` replace half / all of
  the K/V TMA loads by a hand-made transaction completion (``ablation.py``), to measure what the
  L2 -> SM traffic costs (docs/design/kernels-sm90.md, MEASUREMENTS.md). Their variant names carry
  the tag ``abl{half,all}`` after the shipped tags (``k128_c1ablhalf_cnt``).
"""

from __future__ import annotations

from typing import Any, Mapping

from aot.contract import BLOCK_SIZES_K
from aot.kernels.sm90 import EXPORT_WEIGHT  # noqa: F401  (the shipped kernels' classes: their cost)
from aot.kernels.sm90 import variants as _shipped
from aot.kernels.sm90.config import PAIRED, Sm90Config
from aot.registry import Variant


def variant(cfg: Sm90Config, label: str, ablate: str | None = None) -> Variant:
    """An experiment export (per-row counts): the shipped name and params of ``cfg``, plus its
    ``label`` (what a ``SelectionPolicy`` asks for) and, for an ablation, ``ablate`` and its tag."""
    params = {**_shipped.variant_params(cfg, True), "label": label, **({"ablate": ablate} if ablate else {})}
    return Variant(_shipped.variant_name(cfg, True, tag=f"abl{ablate}" if ablate else ""), params)


def experiment_variants(mode: str) -> tuple:
    resolve = Sm90Config.resolve
    out = []
    if mode == "sage":
        for bk, label, knobs in ((128, "s22", {"stages": (2, 2)}), (64, "s22", {"stages": (2, 2)}),
                                 (64, "s22cta3", {"stages": (2, 2), "ctas_per_sm": 3}),
                                 (64, "cta3", {"ctas_per_sm": 3})):
            out.append(variant(resolve(mode, bk, wgs=0, **knobs), label))
        for bk in BLOCK_SIZES_K:
            out.append(variant(resolve(mode, bk, pair=(mode, bk) in PAIRED, refill="eager"), "eager"))
        # two K buffers, one V buffer (K of entry t+2 under P.V(t)): one more entry of TMA slack
        out.append(variant(resolve(mode, 128, wgs=0, stages=(2, 1)), "s21"))
        # three warpgroups per CTA that share their K/V loads when their plan rows are identical
        # (flat3.py), INT8 Q and Q-fused
        for qf in (False, True):
            out.append(variant(resolve(mode, 128, wgs=0, flat_wgs=3, q_fused=qf), "f3"))
    # ablations (wrong results on purpose): half / all of the K/V TMA loads skipped, default shapes
    # (Sage as one CTA: the ablation's loads are not multicast)
    for bk in BLOCK_SIZES_K if mode == "bf16" else (128,):
        cfg = resolve(mode, bk, pair=(mode, bk) in PAIRED, **({"cluster": 1} if mode == "sage" else {}))
        for tag in ("half", "all"):
            out.append(variant(cfg, f"abl{tag}", ablate=tag))
    return tuple(out)


def _make_kernel(cfg: Sm90Config, params: Mapping[str, Any]):
    if params.get("ablate"):
        from .ablation import Sm90AblationAttention

        return Sm90AblationAttention(cfg, params["ablate"])
    if cfg.flat_wgs == 3:
        from .flat3 import Sm90Flat3Attention

        return Sm90Flat3Attention(cfg)
    from aot.kernels.sm90.kernel import Sm90SparseAttention

    return Sm90SparseAttention(cfg)


KERNELS: list = _shipped.kernels(
    variants_of=lambda mode: _shipped.variants(mode) + experiment_variants(mode),
    spec_of=lambda mode: _shipped.spec(mode, _make_kernel),
)
