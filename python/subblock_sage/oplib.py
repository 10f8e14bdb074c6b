"""How every ``torch.ops.subblock_sage`` operator is registered: :func:`define`, one call per
operator (``torch_ops.py``, ``ops/route.py``, ``ops/quantize_route.py``).

Why not ``torch.library.custom_op``: the operators exist for what traces a call
(``torch.compile``, FakeTensorMode, tensor subclasses); a plain eager call never goes through them
(``api.py``), yet they are registered when the public calls are first imported, so a fresh
process pays for them before its first output. ``custom_op`` builds a ``CustomOpDef`` per operator
(schema inference from annotations, an autograd wrapper, an ADInplaceOrView kernel). Registering
at the dispatcher directly is what it does underneath, minus that: the schema (spelled out), the
real implementation as the ``CompositeExplicitAutograd`` kernel (every backend; the real
implementations validate their inputs and refuse what is not CUDA with a clear error) and the fake
implementation through ``torch.library.register_fake`` (what FakeTensorMode and torch.compile run).
Measured: seven operators in ~2 ms against ~20 ms (build machine, torch 2.14.1), importing no
torch module; ``import subblock_sage`` plus the lookup of a public call 19-22 ms against 27-32 ms
(H100 host, torch 2.11, MEASUREMENTS.md 2026-12-07).

What ``custom_op`` adds and these operators do without: an autograd kernel (none has a backward;
torch's autograd fallback warns if one is ever differentiated) and the version-counter bump of a
mutated ``out`` (the ``_out`` operators write ``out`` and return nothing; torch.compile
functionalizes them from the schema's ``Tensor(a!)``).
"""

from __future__ import annotations

from typing import Callable

NAMESPACE = "subblock_sage"
_LIBRARY = None  # the namespace's torch.library.Library (FRAGMENT), kept alive for the process


def define(name: str, schema: str, real: Callable, fake: Callable) -> None:
    """Register ``torch.ops.subblock_sage.<name>`` with ``schema`` (the argument list and results,
    e.g. ``"(Tensor q, float s) -> Tensor"``), its real implementation and its fake one."""
    global _LIBRARY
    import torch

    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, real, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)


__all__ = ["NAMESPACE", "define"]
