"""Per-stream device memory of the calls: the workspace of a replayed call, the Sage quantizer's
buffer (``sync_buffer``) and the slot where the replay keeps the next call's result.

Both call paths use it: the full path takes the quantizer buffer from here
(``ops/quantize.py``), the replayed path (``replay.py``) takes the workspace, the quantizer
buffer and the spare result. One ``PerStream`` per (device, raw stream) holds all three with
their pointers and sizes as plain ints, so that a steady-state replayed call makes no tensor
call for them and one dict lookup finds all three (0.5 us less per call than a dict each, build
machine, ``benchmark/host_stub.py``).

Why memory per stream is safe: every kernel that touches it runs on that stream, in order, and
nothing of a call outlives the call's kernels; a grown buffer's old memory returns to torch's
caching allocator, which hands it out again in the stream's order (the caller holds the tensor
until its launches are enqueued). Why not ``torch.empty`` per call: 2.5 us while the GPU is
busy and 9-42 us right after a synchronize on the H200 host (MEASUREMENTS.md), more than the
kernels at small shapes. The memory stays held until :func:`release_workspaces` (what torch's
cache would hold anyway after the first call).
"""

from __future__ import annotations

from .contract import SAGE_SYNC_EPOCHS

# bytes; above it a call allocates its own workspace (its kernels take milliseconds, so the
# allocation is noise there, and the process does not keep gigabytes it may not need again).
# Sage at H=14 S=37760 needs ~140 MB, at S=75776 ~280 MB.
WORKSPACE_KEEP_MAX = 512 << 20


class PerStream:
    """What one (device, raw stream) keeps between eager calls: its workspace
    (:func:`stream_workspace`), its Sage quantizer buffer (:func:`stream_sync`) and the next
    replayed call's result (the spare, ``replay.Replay.launch``)."""
    __slots__ = ("ws", "ws_ptr", "ws_bytes", "sync", "sync_ptr", "sync_words", "launches", "spare", "spare_spec")

    def __init__(self):
        self.ws, self.ws_ptr, self.ws_bytes = None, 0, 0
        self.sync, self.sync_ptr, self.sync_words = None, 0, 0
        self.launches = 0  # quantizer launches since ``sync`` was zeroed
        self.spare, self.spare_spec = None, None  # the next result and its (shape, stride, dtype)


streams: dict[tuple, PerStream] = {}  # (device, raw stream) -> its PerStream; cleared, never rebound


def per_stream(device, stream: int) -> PerStream:
    st = streams.get((device, stream))
    if st is None:
        st = streams[(device, stream)] = PerStream()
    return st


def stream_workspace(device, stream: int, nbytes: int, fresh: bool):
    """The workspace of a replayed call on ``stream``: the stream's own buffer (grown to the
    largest a call needed), or, with ``fresh`` (the stream is being captured into a CUDA graph,
    or the call needs more than WORKSPACE_KEEP_MAX), a ``torch.empty`` of its own (from the
    graph's pool under capture: a graph may be replayed on any stream, so it must not share
    memory with eager calls)."""
    import torch

    if fresh or nbytes > WORKSPACE_KEEP_MAX:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    st = per_stream(device, stream)
    if st.ws_bytes < nbytes:
        st.ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
        st.ws_ptr, st.ws_bytes = st.ws.data_ptr(), nbytes
    return st.ws


def _zeros(words: int, device):
    """A zeroed int32 buffer, made outside any dispatch mode (the replay recorder's watch would
    take its fill for device work of the call: it is the buffer's, once)."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.zeros(words, dtype=torch.int32, device=device)


def stream_sync(device, stream: int, words: int, capturing: bool):
    """The quantizer buffer of a launch on ``stream`` (:func:`sync_buffer`)."""
    if capturing:
        # a graph gets its own, zeroed in every replay (the fill is a node of the graph): it may
        # be replayed on any stream, beside eager calls
        return _zeros(words, device)
    st = per_stream(device, stream)
    if st.sync is None or st.sync_words < words or st.launches >= SAGE_SYNC_EPOCHS:
        n = max(words, st.sync_words)
        st.sync = _zeros(n, device)
        st.sync_ptr, st.sync_words, st.launches = st.sync.data_ptr(), n, 0
    st.launches += 1
    return st.sync


def sync_buffer(device: int, words: int):
    """The workspace of a ``sage_quant_kv`` launch on the current stream of ``device`` (at least
    ``words`` int32): the stream's own buffer, zeroed when it is made and never refilled.

    Why no per-call filling: the kernel's CTAs wait for one another's statistics slot by slot,
    so a slot must say whether *this* launch wrote it. Each slot holds {value, tag} and the tag
    is the launch's epoch (``contract.sage_sync_tag``), which the launch's last ticket advances;
    a stale slot has an older tag. A fill per call would be device work outside the call's
    launches, which a replayed call (exactly its recorded launches) cannot have. Every
    SAGE_SYNC_EPOCHS launches the stream gets a fresh zeroed buffer (tags repeat after 2**31
    epochs); under CUDA-graph capture each call gets its own zeroed buffer
    (the zeroing is captured with it). The replay recorder learns that this tensor is the buffer
    from the launch that takes it (its ``contract.SAGE_SYNC_ARG`` argument:
    ``replay.Recorder.add``), so a replay takes its stream's buffer instead; this function calls
    nothing of another module, so taking the buffer adds no step to a call's path
    (docs/design/call-path.md)."""
    return stream_sync(device, current_stream(device), words, capturing())


def capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph (torch's C call: ~0.2 us)."""
    import torch

    return torch._C._cuda_isCurrentStreamCapturing()


def current_stream(device: int) -> int:
    """The raw current stream of ``device``."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device)


def release_workspaces() -> None:
    """Free the per-stream workspaces, quantizer buffers and spare results (the next call on a
    stream allocates its own again). For a process that is done with attention for a while and
    wants the memory."""
    streams.clear()


__all__ = ["PerStream", "streams", "per_stream", "stream_workspace", "stream_sync", "sync_buffer", "capturing",
           "current_stream", "release_workspaces", "WORKSPACE_KEEP_MAX"]
