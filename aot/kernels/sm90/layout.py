"""Register-fragment views shared by the SM90a attention kernel's mainloops, softmax and epilogue."""

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
