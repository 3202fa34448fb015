"""Per-row top-k with torch.topk and a deterministic tie rule.

torch.topk may break ties differently depending on the shape of the block it runs on, and
a sharded run sees different blocks than a replicated one. So whenever the k-th value of a
row is tied across the cut, the tied keys are resolved by the lowest key index. That
makes the selected set a function of the row's logits alone: sharded and replicated runs
agree exactly, ties included, as long as the logits themselves are bit-identical.
"""

from __future__ import annotations

import torch

from ..problem import Problem


def _windows(problem: Problem, rows: tuple[int, int], lo: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``(column of each row's first key, keys per row)`` for rows ``[a, b)`` of a block
    whose column 0 is key ``lo``."""
    a, b = rows
    starts = problem.row_starts[a:b].to(torch.int64)
    return starts - lo, problem.row_ends[a:b].to(torch.int64) - starts


def torch_topk(problem: Problem, logits: torch.Tensor, rows: tuple[int, int], lo: int, out: torch.Tensor) -> None:
    """:meth:`Backend.topk` with torch.topk (the reference's top-k)."""
    a, b = rows
    starts_rel, lengths = _windows(problem, rows, lo)
    row_topk(logits, starts_rel, lengths, problem.topk, out, problem.ends_host[a:b] - problem.starts_host[a:b])


def topk_choice(device: torch.device) -> str:
    """The top-k that :func:`chosen_topk` runs on ``device``: ``INDEXER_TOPK``'s value.

    Where the value is only the platform's default (``triton`` on NVIDIA) and Triton cannot
    run, it is ``torch``; a ``triton`` that was asked for explicitly and cannot run raises.

    Raises:
        ValueError: ``INDEXER_TOPK`` (or its platform variant) says ``triton`` and Triton
            cannot run on ``device``.
    """
    from .. import envs
    from ..platform import platform_key
    from .triton import _kernels as tk  # imports triton lazily, never raises

    res = envs.resolve("TOPK", platform_key(device))
    if res.value != "triton":
        return res.value
    reasons = tk.launch_reasons(device)
    if not reasons:
        return "triton"
    if res.source.startswith("default"):
        return "torch"
    raise ValueError(f"{res.source} asks for the Triton top-k, but {'; '.join(reasons)}; set it to 'torch' or install triton")


def topk_row_bytes(problem: Problem) -> int:
    """Bytes per row of the chosen top-k's temporaries, for chunk budgets: torch.topk's k+1
    values and indices, or the Triton kernel's candidate lists."""
    if topk_choice(problem.device) == "triton":
        from .triton._topk import scratch_bytes_per_row

        return scratch_bytes_per_row(problem.topk)
    return 12 * (problem.topk + 1)


def chosen_topk(problem: Problem, logits: torch.Tensor, rows: tuple[int, int], lo: int, out: torch.Tensor) -> None:
    """:meth:`Backend.topk` of the GPU backends: torch.topk or the Triton ragged kernel,
    as :func:`topk_choice` says. Both select the same set from the same logits."""
    if topk_choice(problem.device) == "triton":
        from .triton._topk import ragged_topk

        starts_rel, lengths = _windows(problem, rows, lo)
        # clamp padding rows (empty, anywhere) into the block; they read nothing
        ragged_topk(logits, starts_rel.clamp(0, logits.shape[1]), lengths, problem.topk, out)
        return
    torch_topk(problem, logits, rows, lo, out)


def row_topk(
    logits: torch.Tensor,
    starts_rel: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    lengths_host: torch.Tensor | None = None,
) -> None:
    """Top-k keys of every row of a logits block, as row-relative indices.

    Args:
        logits: float32 ``[R, n]``; column ``j`` is key ``lo + j``, ``-inf`` outside a
            row's window.
        starts_rel: int64 ``[R]``, ``row_starts - lo`` (the column of each row's first key).
        lengths: int64 ``[R]``, keys in each row's window (``row_ends - row_starts``, >= 0).
        topk: Keys kept per row.
        out: int32 ``[R, topk]``; gets indices relative to ``row_starts``, unordered,
            ``-1`` padded when a row has fewer than ``topk`` keys.
        lengths_host: Optional CPU copy of ``lengths`` (saves a device sync).
    """
    rows, n = logits.shape
    device = logits.device
    ar = torch.arange(topk, device=device, dtype=torch.int64)
    # A row with <= topk keys keeps all of them: its answer needs no logits at all.
    result = torch.where(ar[None, :] < lengths[:, None], ar[None, :], -1)
    long_rows = lengths > topk
    # ask the host copy when there is one: no device sync
    any_long = bool((lengths_host > topk).any()) if lengths_host is not None else bool(long_rows.any())
    if n > topk and any_long:
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
        rel = idx - starts_rel[:, None]
        result = torch.where(long_rows[:, None], rel, result)
    out.copy_(result)


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
