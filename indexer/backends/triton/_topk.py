"""Triton per-row ragged top-k: radix select, no sort.

For each row it reads only the row's own window ``[start, start + length)`` of a (possibly
row-padded, non-contiguous) float32 logits block and writes the ``k`` row-relative indices
of its largest values, ``-1`` padded, unordered:

1. Map each float to an order-preserving 32-bit key.
2. Four passes of 8-bit radix select (most significant digit first): a 256-bin histogram
   of the current digit among the keys that match the digits found so far gives the bin
   holding the k-th largest key. After the fourth pass the k-th key is known exactly, and
   so is how many keys equal to it belong to the top k.
3. One more pass writes every key above the k-th, and the needed number of keys equal to
   it in column order: ties go to the lowest index, the same rule as the torch path, so
   both select the same set from the same logits.

Rows with at most ``k`` keys skip the passes and list all of them. Triton is imported
lazily; :func:`is_available` reports whether it is there.
"""

from __future__ import annotations

import torch

from ._kernels import device_guard

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported by _kernels.is_available
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def _order_key(v):
        # float32 -> int64 in [0, 2^32) with the same order as the floats; -0.0 maps to
        # +0.0's key, since the two compare equal (and the torch path ties them)
        bits = v.to(tl.int32, bitcast=True).to(tl.int64)
        bits = tl.where(bits == -2147483648, 0, bits)
        flip = tl.where(bits < 0, 0xFFFFFFFF, 0x80000000)
        return (bits & 0xFFFFFFFF) ^ flip

    @triton.jit
    def _radix_topk_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr,
        stride_lm, stride_om,
        K: tl.constexpr,
        KP: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        start = tl.load(starts_ptr + row).to(tl.int64)
        length = tl.load(lengths_ptr + row)
        base = logits_ptr + row.to(tl.int64) * stride_lm + start
        obase = out_ptr + row.to(tl.int64) * stride_om
        kk = tl.arange(0, KP)
        if length <= K:
            tl.store(obase + kk, tl.where(kk < length, kk, -1), mask=kk < K)
        else:
            bins = tl.arange(0, 512)
            prefix = tl.full((), 0, tl.int64)
            prefix_mask = tl.full((), 0, tl.int64)
            need = tl.full((), K, tl.int32)
            for p in tl.static_range(4):
                shift = 24 - 8 * p
                hist = tl.zeros((512,), dtype=tl.int32)
                for c0 in range(0, length, BLOCK):
                    cols = c0 + tl.arange(0, BLOCK)
                    m = cols < length
                    key = _order_key(tl.load(base + cols, mask=m, other=0.0))
                    match = m & ((key & prefix_mask) == prefix)
                    digit = ((key >> shift) & 255).to(tl.int32)
                    hist += tl.histogram(tl.where(match, digit, 256), 512)
                hist = tl.where(bins < 256, hist, 0)
                # suffix[d] = keys whose digit is >= d; the k-th largest sits in the largest
                # bin whose suffix still reaches `need`
                suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
                b = tl.max(tl.where((bins < 256) & (suffix >= need), bins, -1), axis=0)
                need -= tl.sum(tl.where(bins > b, hist, 0), axis=0)
                prefix = prefix | (b.to(tl.int64) << shift)
                prefix_mask = prefix_mask | (255 << shift)
            taken = tl.full((), 0, tl.int32)
            eq_seen = tl.full((), 0, tl.int32)
            for c0 in range(0, length, BLOCK):
                cols = c0 + tl.arange(0, BLOCK)
                m = cols < length
                key = _order_key(tl.load(base + cols, mask=m, other=0.0))
                eq = (m & (key == prefix)).to(tl.int32)
                sel = (m & (key > prefix)) | ((eq_seen + tl.cumsum(eq, axis=0) <= need) & (eq > 0))
                pos = taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                tl.store(obase + pos, cols, mask=sel)
                taken += tl.sum(sel.to(tl.int32), axis=0)
                eq_seen += tl.sum(eq, axis=0)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def ragged_topk(logits: torch.Tensor, starts_rel: torch.Tensor, lengths: torch.Tensor, topk: int, out: torch.Tensor, block: int = 1024) -> None:
    """Per-row top-k of a logits block, reading each row's window only.

    Args:
        logits: float32 ``[R, n]``, column stride 1, any row stride (padded rows welcome);
            values outside a row's window are never read.
        starts_rel: int ``[R]``, column of each row's first key.
        lengths: int ``[R]``, keys in each row's window (``starts_rel + lengths <= n``).
        topk: Keys kept per row.
        out: int32 ``[R, topk]`` contiguous rows; gets indices relative to each row's first
            key, unordered, ``-1`` padded.
    """
    if triton is None:
        raise RuntimeError("triton is not importable")
    rows = logits.shape[0]
    if rows == 0:
        return
    if logits.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("logits and out need column stride 1")
    starts = starts_rel.to(torch.int32).contiguous()
    lens = lengths.to(torch.int32).contiguous()

    with device_guard(logits):
        _radix_topk_kernel[(rows,)](
            logits, starts, lens, out, logits.stride(0), out.stride(0),
            K=topk, KP=_next_pow2(topk), BLOCK=block, num_warps=8 if block >= 1024 else 4,
        )
