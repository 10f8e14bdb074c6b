"""Tensor views of the SM90a attention kernel: the (rows, cols) view of a warpgroup accumulator
fragment (mainloops, softmax, epilogue) and the mode-permuted views of the global tensors (host side)."""

import cutlass.cute as cute


def acc_mn(t):
    """View a (64 x N) warpgroup accumulator fragment ((2,2,V),M,N) as (rows, cols)."""
    lay = t.layout
    s0, d0 = lay.shape[0], lay.stride[0]
    return cute.make_tensor(
        t.iterator,
        cute.make_layout(
            ((s0[1], lay.shape[1]), (s0[0], s0[2], lay.shape[2])),
            stride=((d0[1], lay.stride[1]), (d0[0], d0[2], lay.stride[2])),
        ),
    )


def permuted(t, order):
    """``t`` with its modes reordered (``order[i]`` = the mode of ``t`` that becomes mode i)."""
    return cute.make_tensor(
        t.iterator,
        cute.make_layout(tuple(t.shape[i] for i in order), stride=tuple(t.stride[i] for i in order)),
    )
