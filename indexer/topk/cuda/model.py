"""The native row top-k's algorithm in torch, step for step, for CPU tests and as the table
the CUDA kernel must reproduce bit for bit (its output order included).

The kernel (``row_topk.cu``) selects each row by a radix select over 32-bit order keys:
histograms of the top 11 bits, then the next 11 of the keys in the chosen bin, then the last
10, stopping at the first pass whose bin is needed whole, or whose bin holds one value where
the kernel checks for that (:func:`checks_one_value`); keys tied at the k-th value beyond those
needed are taken lowest column first. It writes the selected columns thread by thread
(thread ``t`` holds columns ``t, t + threads, t + 2 * threads, ...``), so a row's table is
its set sorted by ``(column % threads, column // threads)``.
"""

from __future__ import annotations

import torch

#: the digits of the passes, most significant first
PASS_BITS = (11, 11, 10)


def order_keys(values: torch.Tensor) -> torch.Tensor:
    """int64 keys in ``[0, 2**32)`` of float32 ``values`` whose order is the floats' order:
    ``-0.0`` keys as ``+0.0``, every NaN above every number; ``0`` is no float's key."""
    b = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    b = torch.where(b == 0x80000000, 0, b)
    b = torch.where(values.isnan(), 0x7FFFFFFF, b)
    k = torch.where(b >= 0x80000000, b ^ 0x7FFFFFFF, b)
    return k ^ 0x80000000


def checks_one_value(pass_: int, count: int, prev_count: int, need: int, length: int) -> bool:
    """Whether the kernel checks, after pass ``pass_`` (0-based), that the keys of the chosen bin
    are one value (and then ends the select there): after the first pass where the bin holds
    over 1/16 of the row's ``length`` keys and at least twice the ``need`` keys still to take,
    after a later one where the pass did not narrow the bin (``count == prev_count``)."""
    if pass_ == 0:
        return 16 * count > length and count >= 2 * need
    return count == prev_count


def radix_select(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` selected among ``keys`` (int64 ``[L]`` from :func:`order_keys`,
    ``L > k``, in column order): the passes of the kernel, ties at the k-th key to the lowest
    columns."""
    prefix, width, need, whole, prev = 0, 0, k, False, int(keys.numel())
    for i, bits in enumerate(PASS_BITS):
        shift = 32 - width - bits
        inside = keys if width == 0 else keys[(keys >> (32 - width)) == prefix]
        digit = (inside >> shift) & ((1 << bits) - 1)
        hist = torch.bincount(digit, minlength=1 << bits)
        at_or_above = hist.flip(0).cumsum(0).flip(0)  # keys in a bin or a higher one
        above = at_or_above - hist
        b = int(((above < need) & (need <= at_or_above)).nonzero()[0, 0])
        prefix, width, need = (prefix << bits) | b, width + bits, need - int(above[b])
        count = int(hist[b])
        if count == need:
            whole = True
            break
        if width < 32 and checks_one_value(i, count, prev, need, int(keys.numel())):
            chosen = inside[digit == b]
            if int(chosen.min()) == int(chosen.max()):
                prefix, width = int(chosen[0]), 32
                break
        prev = count
    if whole:
        return (keys >> (32 - width)) >= prefix
    tie = keys == prefix
    return (keys > prefix) | (tie & (tie.cumsum(0) <= need))


def native_table(logits: torch.Tensor, starts_rel: torch.Tensor, lengths: torch.Tensor, topk: int,
                 threads: int) -> torch.Tensor:
    """int32 ``[R, topk]``: the table the native kernel writes for a block of ``threads``
    threads (:func:`indexer.topk.cuda.shape_for`), computed on the host row by row.

    Args:
        logits: float32 ``[R, n]``; row ``r``'s window is columns
            ``[starts_rel[r], starts_rel[r] + lengths[r])``.
        starts_rel, lengths: int ``[R]``.
        topk: Keys kept a row.
        threads: The kernel's block size.
    """
    rows = logits.shape[0]
    out = torch.full((rows, topk), -1, dtype=torch.int32)
    starts, lens = starts_rel.cpu().tolist(), lengths.cpu().tolist()
    for r in range(rows):
        s, n = starts[r], lens[r]
        if n <= topk:
            out[r, :n] = torch.arange(n, dtype=torch.int32)
            continue
        keys = order_keys(logits[r, s:s + n].cpu())
        cols = radix_select(keys, topk).nonzero().flatten()
        order = torch.argsort((cols % threads) * n + cols // threads)
        out[r] = cols[order].to(torch.int32)
    return out
