"""The reference per-row top-k: torch.topk with a deterministic tie rule.

torch.topk may break ties differently depending on the shape of the block it runs on, and
a sharded run sees different blocks than a replicated one. So ties at the k-th value of a
row are resolved by the lowest key index. That makes the selected set a function of the
row's logits alone: sharded and replicated runs agree exactly, ties included, as long as
the logits themselves are bit-identical. Every other top-k is tested against this one.
"""

from __future__ import annotations

import torch


def row_topk(
    logits: torch.Tensor,
    starts_rel: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    lengths_host: torch.Tensor | None = None,
    sync_free: bool | None = None,
) -> None:
    """Top-k keys of every row of a logits block, as row-relative indices.

    Off the CPU (or with ``sync_free=True``) this makes no host sync (graph-capturable): each key is ranked by its value
    and then its column in one int64 (:func:`_ranked_keys`), so torch.topk sees no ties.
    On the CPU, torch.topk on the values, and the rows tied across the cut again by the
    lowest index (fewer passes; a sync there costs nothing).

    Args:
        logits: float32 ``[R, n]``; column ``j`` is key ``lo + j``. Off the CPU the values
            outside a row's window are never read; on the CPU they must be ``-inf``.
        starts_rel: int ``[R]``, the column of each row's first key.
        lengths: int ``[R]``, keys in each row's window (>= 0).
        topk: Keys kept per row.
        out: int32 ``[R, topk]``; gets indices relative to the row's first key, unordered,
            ``-1`` padded when a row has fewer than ``topk`` keys.
        lengths_host: Optional CPU copy of ``lengths``: rows no longer than ``topk`` skip
            the selection without a sync.
        sync_free: Which of the two ways (``None``: sync-free off the CPU). Both select
            the same set.
    """
    rows, n = logits.shape
    device = logits.device
    ar = torch.arange(topk, device=device, dtype=torch.int64)
    lengths = lengths.to(torch.int64)
    starts_rel = starts_rel.to(torch.int64)
    # A row with <= topk keys keeps all of them: its answer needs no logits at all.
    result = torch.where(ar[None, :] < lengths[:, None], ar[None, :], -1)
    long_rows = lengths > topk
    any_long = bool((lengths_host > topk).any()) if lengths_host is not None else True
    if n > topk and any_long:
        if not (device.type != "cpu" if sync_free is None else sync_free):
            idx = _topk_then_ties(logits, starts_rel, lengths, long_rows, topk)
        else:
            idx = torch.empty(rows, topk, dtype=torch.int64, device=device)
            step = max(1, -(-rows // 8))  # int64 keys of an eighth of the rows at a time
            for a in range(0, rows, step):
                b = min(rows, a + step)
                keys = _ranked_keys(logits[a:b], starts_rel[a:b], lengths[a:b])
                idx[a:b] = torch.topk(keys, topk, dim=1, sorted=False).indices
        result = torch.where(long_rows[:, None], idx - starts_rel[:, None], result)
    out.copy_(result)


def _ranked_keys(x: torch.Tensor, starts_rel: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """int64 ``[R, n]``: the value's order-preserving int32 (NaN above every number, ``-0.0``
    equal to ``0.0``) in the high word, ``2**31 - 1 - column`` in the low word, so larger
    means larger value, then lower column; keys outside a row's window the least int64."""
    x = torch.where(x.isnan(), float("nan"), x + 0.0)  # one NaN, one zero
    bits = x.view(torch.int32)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    col = torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    ranked = key * (1 << 32) + (0x7FFFFFFF - col)
    inside = (col >= starts_rel[:, None]) & (col < (starts_rel + lengths)[:, None])
    return torch.where(inside, ranked, torch.iinfo(torch.int64).min)


def _topk_then_ties(logits, starts_rel, lengths, long_rows, topk) -> torch.Tensor:
    # k+1 sorted values tell whether the k-th value is tied across the cut without
    # another pass over the block
    vals, idx = torch.topk(logits, topk + 1, dim=1, sorted=True)
    kth = vals[:, topk - 1]
    # NaN == NaN is false, yet NaNs tie with each other (torch.topk ranks them highest)
    tied = long_rows & ((vals[:, topk] == kth) | (vals[:, topk].isnan() & kth.isnan()))
    idx = idx[:, :topk]
    tied_rows = torch.nonzero(tied).flatten()
    if tied_rows.numel():
        idx[tied_rows] = _lowest_index_topk(logits, tied_rows, kth, topk, starts_rel, lengths)
    return idx


def _lowest_index_topk(
    logits: torch.Tensor, rows: torch.Tensor, kth: torch.Tensor, topk: int, starts_rel: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Columns of the top-k of ``rows``, ties at the k-th value going to the lowest columns.

    Only columns inside each row's window count, so a tie at ``-inf`` (in-window logits
    that overflowed) can never pick a column of another row's window."""
    picked = []
    step = max(1, logits.shape[0] // 4)  # bound the temporaries to a fraction of the block
    for i in range(0, rows.numel(), step):
        sel_rows = rows[i : i + step]
        x = logits.index_select(0, sel_rows)
        v = kth.index_select(0, sel_rows)[:, None]
        col = torch.arange(x.shape[1], device=x.device)[None, :]
        s = starts_rel.index_select(0, sel_rows)[:, None]
        inside = (col >= s) & (col < s + lengths.index_select(0, sel_rows)[:, None])
        # NaNs rank above every number, as in torch.topk (x > v is false for them)
        nan, v_nan = x.isnan(), v.isnan()
        above = torch.where(v_nan, False, (x > v) | nan) & inside
        equal = torch.where(v_nan, nan, x == v) & inside
        need = topk - above.sum(dim=1, keepdim=True)
        keep = above | (equal & (torch.cumsum(equal, dim=1, dtype=torch.int32) <= need))
        picked.append(torch.nonzero(keep)[:, 1].view(sel_rows.numel(), topk))
    return torch.cat(picked)
