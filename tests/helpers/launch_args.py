"""Recorded launches against the kernels' declared arguments (aot/registry.py ``TensorArg`` /
``ScalarArg``), shared by the CPU tests that record an operator's launches on CPU tensors
(tests/cpu/test_route_args.py, tests/cpu/test_quantize_route.py)."""

from __future__ import annotations

import torch


def _extents(spec, t, ties):
    """Check one tensor against its declared argument: rank, static extents, and one value per
    symbolic extent key across the launch (the ABI ties them)."""
    from aot.registry import Sym  # at call time: collecting the test module needs no aot import

    assert t.dim() == len(spec.shape), spec.name
    for want, got in zip(spec.shape, t.shape):
        if isinstance(want, Sym):
            assert ties.setdefault(want.key, got) == got, (spec.name, want.key)
        else:
            assert want == got, spec.name


def check_declared(specs, values) -> dict:
    """One launch's ``values`` (name -> value) against the kernel's ``specs``: the same names
    (the stream aside) and every tensor's extents; returns the symbolic extents' values."""
    names = [a.name for a in specs if a.name != "stream"]
    assert sorted(names) == sorted(values), (names, sorted(values))
    ties = {}
    for a in specs:
        if isinstance(values.get(a.name), torch.Tensor):
            _extents(a, values[a.name], ties)
    return ties
