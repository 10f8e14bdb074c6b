"""Compile-time configuration of the SM90a attention kernel: one frozen :class:`Sm90Config` per
exported variant, the measured defaults it is resolved from, and the ``can_implement`` check.

Nothing here imports CuTe-DSL: the registry (``variants.py``) builds configs while listing the
exports, and an impossible combination fails there, before anything is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from aot.contract import BLOCK_SIZES_K, SM90_SHAPES

P_SCALE = 448.0  # P in [0, 1] is scaled into the E4M3 range before the FP8 P.V MMA
# Stored position p (within each 16 keys) of the Sage V^T tensor holds key V_PERM16[p].
V_PERM16 = tuple(2 * (p // 4) + (0, 1, 8, 9)[p % 4] for p in range(16))

# CTA shape by (compute mode, plan key block), from the runtime contract's SM90_SHAPES (which says
# why): 0 = flat (one warpgroup, three or four CTAs per SM), 1 = warp-specialised producer + one
# consumer warpgroup (two CTAs per SM), 2 = producer + two ping-pong consumer warpgroups (one CTA
# per SM). ALT_WGS: the other shape the build ships for Sage; PAIRED: default kernels that take a
# 64-key plan two entries per 128-key tile.
DEFAULT_WGS = {key: shapes["default"][0] for key, shapes in SM90_SHAPES.items()}
ALT_WGS = {key: shapes["alt"][0] for key, shapes in SM90_SHAPES.items() if "alt" in shapes}
PAIRED = {key for key, shapes in SM90_SHAPES.items() if shapes["default"][1]}
# Flat-shape parameters: CTAs per SM (the launch bound: registers <= 64K / (128 * n)) and the
# number of column slices of the Sage P.V tile (fewer live registers for four CTAs per SM).
FLAT_PARAMS = {
    ("sage", 64): {"ctas_per_sm": 4, "pv_parts": 2},
    ("sage", 128): {"ctas_per_sm": 3, "pv_parts": 1},
    ("bf16", 64): {"ctas_per_sm": 3},
    ("bf16", 128): {"ctas_per_sm": 3},
}
# CTAs per cluster of the flat single-buffered Sage kernel on 128-key tiles (one warpgroup; the
# 128-key plans' kernel and, keyed by its tile, the paired kernel of 64-key plans): with 2, a
# cluster whose two rows (query blocks 2c, 2c+1) are both dense loads each K/V tile once for both
# CTAs, half of every TMA box each by multicast; other clusters run as two flat CTAs.
# Measured (H200, 700 W cap, benchmark/cluster_ab.py, kernel only, H=14 S=37760): dense
# 11.93-12.30 ms against 12.39-12.77 for one CTA and cuDNN's FP8 SDPA 12.45-12.54 (half the
# L2 -> SM traffic: the clock rises 1785-1845 -> 1875-1905 MHz at the same 690 W); on sparse plans
# -0.6 to +2.1 % slower (median +0.9 %), which is why the runtime takes it only where a row can be dense
# (``contract.SelectionPolicy``). The one-CTA kernel ships beside it (``k{64,128}_c1[qf]_cnt``).
# Applied by ``Sm90Config.resolve`` wherever ``can_implement`` allows it.
FLAT_CLUSTER = {("sage", 128): 2}
# (K stages, V stages) of the warp-specialised shapes: two CTAs (<= ~110 KiB of shared memory
# each) must fit one SM.
STAGES = {("bf16", 64): (3, 2), ("bf16", 128): (1, 1), ("sage", 64): (4, 4), ("sage", 128): (3, 2)}
# flat shape: single-buffered K and V. Deeper rings measured 15-25% slower (docs/design/kernels-sm90.md).
FLAT_STAGES = {64: (1, 1), 128: (1, 1)}
# Programmatic dependent launch: every SM90a attention kernel is
# launched with ``programmaticStreamSerializationAllowed`` and waits (``griddepcontrol.wait``)
# before it reads anything an earlier kernel of the stream wrote, so its CTAs are dispatched
# and set up (barriers, descriptors; the Q-fused kernel its bf16 Q loads) while the previous
# kernel (the Sage quantizer or the plan kernel, which trigger their dependents at their start)
# drains, instead of after it: the launch gap (~1.1 us between kernels, CUPTI) and the first wave's
# prologue leave the critical path. The wait returns at once when nothing is in flight.
# What may come before the wait: loads of the call's inputs only (q), which the kernel right
# before it in the runtime's call (the quantizer's K/V pass) reads but never writes.
PDL = True


@dataclass(frozen=True)
class Sm90Config:
    """One kernel's compile-time shape (hashable; two equal configs compile the same kernel).

    ``block_k`` is the tile width in keys; with ``pair`` the tile (128) holds two entries of a
    64-key plan. ``wgs``: 0 = flat (one warpgroup that also issues its own TMA loads, serial
    mainloop, ``ctas_per_sm`` CTAs per SM), 1 = TMA producer warpgroup + one consumer (two CTAs
    per SM), 2 = producer + two ping-pong consumers (FA3-style: the consumers take turns issuing
    their MMAs; one CTA per SM). ``refill`` (flat shape, where warp 0 issues the K/V refills):
    "shadow" issues V of entry t right after Q.K^T(t) and K of entry t+1 right after P.V(t),
    under the warpgroup's own MMAs, when all four warps have already released the buffer;
    "eager" refills as soon as the buffer is released and was measured 3-4% slower
    (warp 0 then arrives late at the next WGMMA; docs/design/kernels-sm90.md).
    """

    mode: str  # "bf16" or "sage"
    block_k: int
    k_stages: int
    v_stages: int
    wgs: int = 1
    pv_parts: int = 1  # flat Sage: P.V in this many column slices of D (fewer live registers)
    ctas_per_sm: int = 3  # flat shape: the launch bound (registers <= 64K / (128 * n))
    pair: bool = False
    refill: str = "shadow"
    # flat Sage: the kernel quantizes its own Q tile (bf16 in, INT8 codes into shared memory, the
    # quantizer's numerics), so the Sage quantizer skips Q: a third of its bytes
    q_fused: bool = False
    # flat Sage, 128-key tiles: warpgroups per CTA, each on its own query block (1 or 3). With 3,
    # a CTA whose three plan rows are identical (dense rows, repeated rows) loads each K/V block
    # once for all three (a shared ring, aot/experiments/sm90/flat3.py); otherwise each warpgroup
    # runs the flat mainloop on its own buffers (an experiment, never shipped: 4-7 % slower than one
    # warpgroup per CTA, on dense and sparse plans)
    flat_wgs: int = 1
    # flat Sage, 128-key tiles: CTAs per cluster (FLAT_CLUSTER). With 2, the CTAs of query blocks
    # 2c and 2c+1 run as one cluster; when both rows are dense (identical in a prepared plan) it
    # loads each K/V tile once for both, each CTA half of it by TMA multicast into both
    cluster: int = 1
    # bf16, producer + two ping-pong consumers (wgs=2): a CTA whose two query blocks (2c, 2c+1)
    # are both dense (identical rows in a prepared plan) loads each K/V tile once into one ring
    # that both consumers read (half the L2 -> SM traffic of the pair, the same MMAs in the same
    # order: bit-identical outputs); any other CTA runs the two rows on their own rings, as the
    # kernel without it (docs/design/kernels-sm90.md). With cluster=2 two such CTAs (query blocks
    # 4c .. 4c+3) run as one cluster: when all four rows are dense each CTA loads half of every
    # K/V box by TMA multicast into both CTAs' rings (a quarter of the traffic); a cluster with
    # only a CTA's own pair dense shares within that CTA, any other runs as the default kernel
    kv_share: bool = False
    # bf16, two consumers, one CTA per cluster: the launch's last ``tail_pairs`` pairs of query blocks
    # each run as two CTAs of one query block whose consumers halve its plan row (kernel.ws_split;
    # contract.sm90_tail_pairs says how many); the kernel takes ``tail_pairs`` and a 1-D grid
    tail: bool = False

    def __post_init__(self):
        why = self.can_implement(self.mode, self.block_k, self.k_stages, self.v_stages, self.wgs,
                                 self.pair, self.refill, self.q_fused, self.flat_wgs, self.ctas_per_sm,
                                 self.cluster, self.kv_share, self.tail)
        if why:
            raise ValueError(f"Sm90Config{(self.mode, self.block_k, self.wgs)}: {why}")

    @staticmethod
    def can_implement(mode: str, block_k: int, k_stages: int, v_stages: int, wgs: int, pair: bool,
                      refill: str, q_fused: bool = False, flat_wgs: int = 1,
                      ctas_per_sm: int = 3, cluster: int = 1, kv_share: bool = False,
                      tail: bool = False) -> Optional[str]:
        """None if the kernel can be built in this shape, else why not (with a "Fix:")."""
        if mode not in ("bf16", "sage"):
            return f"mode {mode!r} is not 'bf16' or 'sage'. Fix: use one of those."
        if block_k not in BLOCK_SIZES_K:
            return f"block_k={block_k}: the tiles are 64 or 128 keys wide. Fix: use 64 or 128."
        if wgs not in (0, 1, 2):
            return f"wgs={wgs}: 0 (flat), 1 or 2 (warp-specialised) consumer warpgroups. Fix: use one of those."
        if wgs == 0 and mode != "sage":
            # flat bf16 was measured no faster than the ws shapes (docs/design/kernels-sm90.md)
            return "the flat shape (wgs=0) is built for the Sage mode only. Fix: use wgs=1 or 2 for bf16."
        if pair and not (block_k == 128 and mode == "sage" and wgs == 0 and (k_stages, v_stages) == (1, 1)):
            return ("pair needs the flat single-buffered Sage kernel with 128-key tiles. "
                    "Fix: block_k=128, mode='sage', wgs=0, stages (1, 1).")
        if wgs == 0 and v_stages > k_stages:
            return f"flat shape: the V ring ({v_stages}) is never deeper than the K ring ({k_stages}). Fix: v_stages <= k_stages."
        if refill not in ("eager", "shadow"):
            return f"refill={refill!r}. Fix: 'shadow' (default) or 'eager'."
        if q_fused and not (mode == "sage" and wgs == 0):
            return ("q_fused (Q quantized inside the kernel) is built for the flat Sage kernel only. "
                    "Fix: mode='sage', wgs=0, or leave q_fused off.")
        if flat_wgs not in (1, 3):
            return f"flat_wgs={flat_wgs}: one or three warpgroups per flat CTA. Fix: use 1 or 3."
        if flat_wgs == 3:
            if not (mode == "sage" and wgs == 0 and block_k == 128 and not pair and (k_stages, v_stages) == (1, 1)
                    and refill == "shadow"):
                return ("flat_wgs=3 is built for the flat single-buffered Sage kernel with 128-key tiles "
                        "(not paired, shadow refills). Fix: mode='sage', block_k=128, wgs=0, stages (1, 1).")
            if ctas_per_sm != 1:
                return f"flat_wgs=3 holds 384 threads: one CTA per SM, not {ctas_per_sm}. Fix: ctas_per_sm=1."
        if cluster not in (1, 2):
            return f"cluster={cluster}: one or two CTAs per cluster. Fix: use 1 or 2."
        if cluster == 2 and mode == "bf16":
            if not (wgs == 2 and kv_share):
                return ("cluster=2 for bf16 is built for the two-consumer kernel whose consumers share one "
                        "K/V ring (four query blocks per load). Fix: wgs=2, kv_share=True.")
        elif cluster == 2 and not (mode == "sage" and wgs == 0 and block_k == 128
                                   and (k_stages, v_stages) == (1, 1) and flat_wgs == 1 and refill == "shadow"):
            return ("cluster=2 is built for the flat single-buffered Sage kernel with 128-key tiles "
                    "(one warpgroup, shadow refills; paired or not). Fix: mode='sage', block_k=128, wgs=0, "
                    "stages (1, 1).")
        if kv_share and not (mode == "bf16" and wgs == 2):
            return ("kv_share (two consumers reading one K/V ring) is built for the bf16 kernel with a "
                    "producer and two consumer warpgroups. Fix: mode='bf16', wgs=2, or leave kv_share off.")
        if tail and not (mode == "bf16" and wgs == 2 and cluster == 1):
            return ("tail (split pairs of query blocks) is built for the bf16 kernel with a producer and two "
                    "consumer warpgroups, one CTA per cluster. Fix: mode='bf16', wgs=2, cluster=1, or leave tail off.")
        return None

    @classmethod
    def resolve(cls, mode: str, block_k: int, *, stages=None, wgs=None, pair: bool = False, **flat) -> "Sm90Config":
        """The config of a variant: the measured defaults (tables above) for what it leaves open.
        ``block_k`` is the plan's key block; a paired kernel runs it on 128-key tiles."""
        tile = 128 if pair else block_k
        if wgs is None:
            wgs = DEFAULT_WGS[(mode, block_k)]
        knobs = {**FLAT_PARAMS[(mode, tile)], **flat}
        if stages is None:
            stages = FLAT_STAGES[tile] if wgs == 0 else STAGES[(mode, tile)]
        pv_parts = knobs.pop("pv_parts", 1)
        if wgs != 0 or mode != "sage":
            pv_parts = 1  # only the flat Sage kernel slices its P.V tile
        if knobs.get("flat_wgs", 1) == 3:
            knobs["ctas_per_sm"] = 1  # 384 threads at the 3-CTA register budget: one CTA per SM
        if "cluster" not in knobs:  # FLAT_CLUSTER wherever the shape allows it
            c = FLAT_CLUSTER.get((mode, tile), 1)
            why = cls.can_implement(mode, tile, *stages, wgs, pair, knobs.get("refill", "shadow"),
                                    knobs.get("q_fused", False), knobs.get("flat_wgs", 1),
                                    knobs.get("ctas_per_sm", 3), c)
            knobs["cluster"] = c if why is None else 1
        return cls(mode, tile, *stages, wgs=wgs, pv_parts=pv_parts, pair=pair, **knobs)

    @property
    def flat(self) -> bool:
        return self.wgs == 0
