"""cuDNN's FP8 SDPA (nvidia-cudnn-frontend, import name `cudnn`) as a dense contender of the lab
bench (``python -m benchmark.lab.bench``; not shipped: `subblock-sage bench` times our kernels and
torch's SDPA only): optional, a note when nvidia-cudnn-frontend is missing.

What is timed: dense, non-causal attention with FP8-E4M3 Q/K/V and an FP8-E4M3 output (on
Hopper cuDNN's FP8 SDPA writes only FP8 output, so the row says "fp8 out"), the same B, H, S and
D = 128 as the other rows, softmax scale 1/sqrt(D). Per-tensor scales from the inputs' amax
(Q, K, V quantized to +-448; the softmax probabilities to [0, 448], the documented S bound for E4M3
without dropout; O to the range of V, which bounds it). The graph is built and its plan finalized
once per shape, outside the timing; a timed call is one `graph.execute`.

Written against nvidia-cudnn-frontend 1.32's Python API (`cudnn.pygraph`, `sdpa_fp8`, the classic
validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans
sequence); every failure (not importable, graph not supported on this GPU or cuDNN) becomes a
one-line note, never an exception out of the bench.
"""

from __future__ import annotations

import math

ROW = "cudnn sdpa fp8 dense (fp8 out)"
FP8_MAX = 448.0  # largest finite float8_e4m3fn


class Unavailable(Exception):
    """The contender cannot run here; str() is the one-line note the bench prints."""


def load():
    """The `cudnn` module; Unavailable with the note when it cannot be imported (not installed, or
    installed without a loadable cuDNN library)."""
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - ImportError, OSError of a missing libcudnn, ...
        raise Unavailable(f"{ROW}: skipped: nvidia-cudnn-frontend is not importable "
                          f"({type(e).__name__}: {_short(e)}); pip install nvidia-cudnn-frontend to add it") from None
    return cudnn


def _short(e: BaseException, n: int = 120) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _quantize(x):
    """(fp8 tensor of x's shape and layout, descale: 1x1x1x1 float32 that maps it back)."""
    import torch

    amax = x.detach().abs().amax().float().clamp_min(1e-12)
    fp8 = (x.float() * (FP8_MAX / amax)).to(torch.float8_e4m3fn)
    return fp8, (amax / FP8_MAX).reshape(1, 1, 1, 1).contiguous()


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":  # (CPU tensors: the tests' fake cudnn module)
        torch.cuda.synchronize(dev)


def _stream(dev) -> int:
    import torch

    return torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0


def _scalar(value, like):
    import torch

    return torch.full((1, 1, 1, 1), float(value), dtype=torch.float32, device=like.device)


def build(cudnn, q, k, v):
    """Build cuDNN's FP8 SDPA for BSHD bf16 ``q, k, v`` (B, S, H, D). Returns ``(call, result)``:
    ``call()`` runs one forward on the current stream; ``result()`` is the last output dequantized
    to float32, BSHD. Raises Unavailable with a one-line note when no plan can be built."""
    errors = []
    # amax_s: the frontend asks to leave it virtual (docs: "Amax S"); older backends wanted it as
    # an output, so that is tried second
    for amax_s_output in (False, True):
        try:
            return _build(cudnn, q, k, v, amax_s_output)
        except Unavailable:
            raise
        except Exception as e:  # noqa: BLE001 - cudnnGraphNotSupportedError, RuntimeError, TypeError, ...
            errors.append(f"{type(e).__name__}: {_short(e)}")
            _sync(q.device)
    raise Unavailable(f"{ROW}: skipped at B={q.shape[0]} H={q.shape[2]} S={q.shape[1]}: no plan ({errors[-1]})")


def _build(cudnn, q, k, v, amax_s_output: bool):
    import torch

    dev = q.device
    q8, dq = _quantize(q)
    k8, dk = _quantize(k)
    v8, dv = _quantize(v)
    v_amax = float(dv) * FP8_MAX
    so = _scalar(FP8_MAX / max(v_amax, 1e-12), q)  # |O| <= max |V|: O fills the E4M3 range
    do = 1.0 / float(so)
    ss, ds = _scalar(FP8_MAX, q), _scalar(1.0 / FP8_MAX, q)  # probabilities in [0, 1] -> [0, 448]
    out8 = torch.empty_like(q8)
    # cuDNN's logical layout is (B, H, S, D); BSHD storage is that with strides (S*H*D, D, H*D, 1)
    qv, kv, vv, ov = (x.transpose(1, 2) for x in (q8, k8, v8, out8))

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=_stream(dev))
    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

    def desc(x, name, dtype):
        return g.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=dtype)

    tq, tk, tv = desc(qv, "q", e4m3), desc(kv, "k", e4m3), desc(vv, "v", e4m3)
    scalars = {"descale_q": dq, "descale_k": dk, "descale_v": dv, "descale_s": ds, "scale_s": ss, "scale_o": so}
    tscal = {name: desc(x, name, f32) for name, x in scalars.items()}
    o, _stats, amax_s, amax_o = g.sdpa_fp8(
        tq, tk, tv, tscal["descale_q"], tscal["descale_k"], tscal["descale_v"], tscal["descale_s"],
        tscal["scale_s"], tscal["scale_o"],
        attn_scale=1.0 / math.sqrt(q.shape[-1]), generate_stats=False, name="sdpa_fp8")
    o.set_output(True).set_dim(list(ov.shape)).set_stride(list(ov.stride())).set_data_type(e4m3)
    amax_o_buf = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=dev)
    amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    pack = {tq: qv, tk: kv, tv: vv, o: ov, amax_o: amax_o_buf}
    pack.update({tscal[name]: x for name, x in scalars.items()})
    amax_s.set_output(amax_s_output).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    if amax_s_output:
        pack[amax_s] = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=dev)

    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    workspace = torch.empty(max(1, int(g.get_workspace_size())), dtype=torch.uint8, device=dev)
    keep = (g, handle, pack, workspace, out8)  # alive as long as the call

    def call():
        keep[0].execute(pack, workspace, handle=handle)

    def result():
        return out8.float() * do

    call()  # a first run inside the build: an execute-time failure is also "no plan"
    _sync(dev)
    return call, result


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| (float64 sums; the sanity check shown next to the row)."""
    ref = ref.float()
    return float((out.float() - ref).norm().double() / ref.norm().double().clamp_min(1e-30))
