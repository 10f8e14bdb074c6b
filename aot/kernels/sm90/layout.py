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


def q_smem_offset(r, cc):
    """Byte offset in the INT8 Q tile (64 x 128, ``make_smem_layout_a`` K-major: 128-byte rows,
    ``Swizzle<3,4,3>``: the 16-byte chunk index XOR the row mod 8) of the 8 codes of row ``r``,
    columns ``8*cc .. 8*cc+7`` (they stay contiguous: the swizzle moves 16-byte chunks).
    Checked against the DSL's own layout by tests/cpu/test_sm90_config.py."""
    return r * 128 + (((cc >> 1) ^ (r & 7)) << 4) + (cc & 1) * 8
