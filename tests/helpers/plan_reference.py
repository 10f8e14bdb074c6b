"""Python reference of the plan-preparation contract (aot/kernels/plan_prepare.py), shared by
the CPU tests (PyTorch fallback path) and the GPU tests (the kernel)."""


def prepare_reference(index, counts, topk, num_key_blocks, split, num_out_blocks):
    """Returns (rows of kept ids as lists, ascending; summary list [neg, over, bad_rows, dropped])."""
    B, H, G, cap = index.shape
    rows = {}
    neg = over = bad_rows = dropped = 0
    idx = index.tolist()
    cnt = counts.tolist() if counts is not None else None
    for b in range(B):
        for h in range(H):
            for g in range(G):
                raw = cnt[b][h][g] if cnt is not None else topk
                if raw < 0:
                    neg = max(neg, max(-raw if raw > -(2**31) else -(2**31), 1))  # int32: -INT32_MIN wraps
                if raw > cap:
                    over = max(over, raw)
                n = min(max(raw, 0), cap)
                seen, bad = set(), False
                for j in idx[b][h][g][:n]:
                    if not 0 <= j < num_key_blocks:
                        bad = True
                    elif j in seen:
                        dropped += 1
                    else:
                        seen.add(j)
                bad_rows += bad
                # ascending, whatever the caller's order
                rows[(b, h, g)] = [j * split + s for j in sorted(seen) for s in range(split)
                                   if j * split + s < num_out_blocks]
    return rows, [neg, over, bad_rows, dropped]


def random_plan(B, H, G, cap, nkb, gen, *, with_bad=True):
    """A plan with repeats, negative / too-large ids and counts in [0, cap] (torch, CPU)."""
    import torch

    index = torch.randint(0, max(nkb, 1), (B, H, G, cap), generator=gen, dtype=torch.int32)
    counts = torch.randint(0, cap + 1, (B, H, G), generator=gen, dtype=torch.int32)
    if with_bad:
        flip = torch.rand(index.shape, generator=gen) < 0.1
        index = torch.where(flip, torch.randint(-3, 0, index.shape, generator=gen, dtype=torch.int32), index)
        flip = torch.rand(index.shape, generator=gen) < 0.05
        index = torch.where(flip, nkb + torch.randint(0, 3, index.shape, generator=gen, dtype=torch.int32), index)
    counts[0, 0, 0] = 0  # an empty row
    counts[-1, -1, -1] = cap  # a full row
    return index.contiguous(), counts.contiguous()


def check_prepared(out_idx, out_cnt, rows):
    """Assert a prepared plan equals the reference rows (zeros past each row's count)."""
    idx = out_idx.cpu().tolist()
    cnt = out_cnt.cpu().tolist()
    for (b, h, g), want in rows.items():
        got_n = cnt[b][h][g]
        assert got_n == len(want), ((b, h, g), got_n, want)
        row = idx[b][h][g]
        assert row[:got_n] == want, ((b, h, g), row[:got_n], want)
        assert all(x == 0 for x in row[got_n:]), ((b, h, g), row[got_n:])
