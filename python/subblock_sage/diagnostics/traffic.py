"""Traffic repeatability check: the attention output must not change while other memory traffic runs.

Why: FlashInfer's SM120 classes had a write-after-read race on their K/V shared-memory stages
(fixed upstream by a proxy fence before each stage release; this build applies that fix, see
aot/upstream/PATCHES.md). Such a race only shows when the timing of the TMA loads shifts, e.g.
under concurrent memory traffic; then some output bits change between identical calls. This check
(after upstream's regression test: S=37807, one head, every block) runs each shipped attention
mode once quietly, then ``rounds`` times while a side stream copies 64 MiB buffers, and requires
every output to be bit-identical to the quiet one.

``subblock-sage check`` runs a cheap version on compute capability 12.x (the GPUs of the race) and
on request elsewhere (``subblock-sage check --traffic``); tests/gpu/test_traffic_repeatability.py
runs the full one. Every wait polls an event with the self-test deadline (deadline.py).
"""

from __future__ import annotations

from .. import deadline
from ..contract import ceil_div

SEQLEN = 37807  # upstream's regression shape: 591 query/key blocks, the last one partial
COPY_MIB = 64


def repeatability(device: int, modes, *, seqlen: int = SEQLEN, rounds: int = 3, copies: int = 20,
                  library=None, backend=None, seed: int = 0) -> dict[str, int]:
    """``{mode: number of output elements that differed from the quiet run, over all rounds}``.

    One batch, one head, every key block for every query block (``topk`` = all), bf16 inputs.
    ``library``/``backend``: run another build (the sm_90a test build of the SM120 classes)."""
    import torch

    from ..ops.attention import sparse_attention

    dev = torch.device("cuda", device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(1, seqlen, 1, 128, generator=g).to(torch.bfloat16).to(dev) for _ in range(3))
    gq = gk = ceil_div(seqlen, 64)
    index = torch.arange(gk, dtype=torch.int32, device=dev).expand(1, 1, gq, gk).contiguous()
    n = COPY_MIB * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    side = torch.cuda.Stream(device=dev)
    main = torch.cuda.current_stream(dev)
    diffs = {}
    for mode in modes:
        def call():
            return sparse_attention(q, k, v, index, None, compute_mode=mode, block_size_k=64,
                                    library=library, backend=backend)

        quiet = call()
        deadline.wait_stream(device, f"GPU {device} traffic check ({mode}, quiet run)")
        bad = torch.zeros((), dtype=torch.int64, device=dev)
        for _ in range(rounds):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(copies):
                    dst.copy_(src)
            got = call()  # overlaps the copies (different streams)
            bad += (got.view(torch.int16) != quiet.view(torch.int16)).sum()
            main.wait_stream(side)
        deadline.wait_stream(device, f"GPU {device} traffic check ({mode}, {rounds} rounds)")
        diffs[mode] = int(bad)
    return diffs


def self_test(device: int) -> str:
    """The cheap version for ``subblock-sage check`` (every mode the device's backend ships)."""
    from .. import loader

    lib = loader.library_for_device(device)
    modes = lib.compute_modes
    diffs = repeatability(device, modes, rounds=3, copies=20)
    bad = {m: d for m, d in diffs.items() if d}
    if bad:
        raise RuntimeError(
            f"outputs changed under concurrent memory traffic ({bad} elements differ from the quiet "
            f"run): a shared-memory race in the {lib.target} kernels"
        )
    return (f"{', '.join(modes)}: bit-identical with and without concurrent {COPY_MIB} MiB copies "
            f"(S={SEQLEN}, one head, every block, 3 rounds)")


self_test.supported = lambda lib: bool(lib.compute_modes)
