"""The one interface every backend implements, and the chunked driver that runs it.

A backend supplies two kernels, ``logits`` (fill a float32 ``[R, n]`` block for rows
``[a, b)`` and key columns ``[lo, hi)``) and ``topk`` (turn that block into row-relative
int32 indices), plus ``not_supported_reasons`` and a cost model. :func:`run_rows` drives
them over any set of row ranges in chunks whose working set stays under a byte budget,
using one workspace that is reused across chunks and calls.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Sequence

import torch

from ..partition import CostModel
from ..problem import Problem
from ..workspace import MAX_CHUNK_BYTES, logits_workspace


class Backend(abc.ABC):
    """A logits + top-k implementation.

    Subclasses set ``name`` and ``cost_model`` and implement the three methods. Vendor
    packages are imported inside the methods, never at module import.
    """

    name: ClassVar[str]
    cost_model: ClassVar[CostModel] = CostModel()
    uses_workspace: ClassVar[bool] = True
    """Whether :meth:`logits` writes into the shared workspace (else it gets ``None``)."""
    configurable_topk: ClassVar[bool] = False
    """Whether :meth:`topk` follows ``INDEXER_TOPK`` (checked before any kernel runs)."""
    max_chunk_rows: ClassVar[int | None] = None
    """Cap on rows per chunk, for kernels whose arithmetic changes with the row count."""

    @abc.abstractmethod
    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        """Why this backend cannot run ``problem`` (empty list: it can).

        With ``problem=None`` only environment reasons are given (package, device), as
        ``python -m indexer info`` shows them.
        """

    @abc.abstractmethod
    def logits(self, problem: Problem, rows: tuple[int, int], cols: tuple[int, int], workspace: torch.Tensor) -> torch.Tensor:
        """The logits of rows ``[a, b)`` over key columns ``[lo, hi)``.

        Args:
            problem: The validated step.
            rows: Global row range ``(a, b)``.
            cols: Key range ``(lo, hi)``; covers every row's window in the chunk.
            workspace: float32 ``[b - a, hi - lo]`` contiguous view of the reused
                workspace, for backends that can write into a given buffer.

        Returns:
            float32 ``[b - a, hi - lo]`` (column stride 1, any row stride): entry ``[i, j]``
            is the logit of row ``a + i`` and key ``lo + j``, ``-inf`` outside the row's
            window. Usually ``workspace``; a vendor kernel that allocates its own output
            returns that.
        """

    @abc.abstractmethod
    def topk(self, problem: Problem, logits: torch.Tensor, rows: tuple[int, int], lo: int, out: torch.Tensor) -> None:
        """Write each row's top-k keys from a logits block.

        Args:
            problem: The validated step.
            logits: float32 ``[R, n]`` block written by :meth:`logits`, column ``j`` is key ``lo + j``.
            rows: Global row range ``(a, b)`` with ``b - a == R``.
            lo: Key of column 0.
            out: int32 ``[R, topk]``; row-relative indices (key - row_starts), ``-1`` padded.
        """

    def notes(self, problem: Problem) -> list[str]:
        """What the backend does differently for ``problem`` while still supporting it
        (shown by ``info`` and kept in :class:`indexer.StepInfo`)."""
        return []

    def chunk_bytes(self, rows: torch.Tensor, width: torch.Tensor, problem: Problem) -> torch.Tensor:
        """Working-set bytes of a chunk of ``rows`` rows and ``width`` key columns.

        Args:
            rows: int64 tensor of candidate row counts.
            width: int64 tensor of the matching column widths.

        Returns:
            int64 tensor of bytes; the default counts the float32 logits only.
        """
        return rows * width * 4

    def logits_alloc_bytes(self, rows: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
        """Bytes of the logits block as the kernel allocates it (row padding included); the
        driver keeps it below 2^31 because kernels index it with 32-bit offsets."""
        return rows * width * 4

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def relative_bounds(problem: Problem, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 contiguous ``(starts, ends)`` of rows ``[a, b)`` relative to key ``lo``, as vendor
    kernels take them. Non-empty rows lie inside ``[lo, hi)`` by construction; empty rows
    (padding) may sit anywhere, so they are clamped into the block, still empty."""
    a, b = rows
    lo, hi = cols
    n = hi - lo
    starts = (problem.row_starts[a:b] - lo).clamp(0, n).to(torch.int32).contiguous()
    ends = (problem.row_ends[a:b] - lo).clamp(0, n).to(torch.int32).contiguous()
    return starts, ends


def _chunk_end(backend: Backend, problem: Problem, start: int, stop: int, budget: int, hint: int = 1024) -> tuple[int, int, int]:
    """Largest chunk ``[start, end)`` within ``[start, stop)`` that fits the budget.

    A chunk also ends before a row whose window does not overlap the chunk's union so far
    (the next request of a packed batch): a block spanning two requests would compute, and
    its top-k would scan, the keys of both requests for every row.

    Returns ``(end, lo, hi)`` where ``[lo, hi)`` is the union of the chunk's row windows
    (empty rows ignored). At least one row is always taken. Only a window of about
    ``hint`` rows (doubled while it all fits) is scanned, so cutting M rows into many
    chunks stays linear in M.
    """
    big = torch.iinfo(torch.int64).max
    window = max(1, min(stop - start, hint))
    while True:
        starts = problem.starts_host[start : start + window]
        ends = problem.ends_host[start : start + window]
        empty = ends <= starts
        lo = torch.cummin(torch.where(empty, big, starts), 0).values
        hi = torch.cummax(torch.where(empty, -1, ends), 0).values
        width = (hi - lo).clamp_min(0)
        hi_before = torch.cat((torch.tensor([-1]), hi[:-1]))
        lo_before = torch.cat((torch.tensor([big]), lo[:-1]))
        disjoint = ~empty & (hi_before >= 0) & ((starts >= hi_before) | (ends <= lo_before))
        count = torch.arange(1, window + 1, dtype=torch.int64)
        fits = (
            (count <= (backend.max_chunk_rows or window))
            & (backend.chunk_bytes(count, width, problem) <= budget)
            & (backend.logits_alloc_bytes(count, width) <= MAX_CHUNK_BYTES)
            & ~disjoint
        )
        take = int(torch.cumprod(fits, 0).sum())  # the fitting chunks are a prefix
        if take < window or window == stop - start:
            break
        window = min(stop - start, 2 * window)
    take = max(1, take)
    end = start + take
    if width[take - 1] == 0:
        return end, 0, 0
    return end, int(lo[take - 1]), int(hi[take - 1])


def run_rows(
    backend: Backend,
    problem: Problem,
    ranges: Sequence[tuple[int, int]],
    out: torch.Tensor,
    budget_bytes: int,
) -> None:
    """Compute the top-k of the given rows into ``out``.

    Args:
        backend: Backend to run.
        problem: The validated step.
        ranges: Global half-open row ranges, in the order their rows appear in ``out``.
        out: int32 ``[sum of range lengths, topk]``.
        budget_bytes: Working-set budget for one chunk (see :meth:`Backend.chunk_bytes`).
    """
    row = 0
    hint = 1024
    for a, b in ranges:
        start = a
        while start < b:
            end, lo, hi = _chunk_end(backend, problem, start, b, budget_bytes, hint)
            hint = max(1024, 2 * (end - start))
            dst = out[row + start - a : row + end - a]
            if hi <= lo:  # every row in the chunk is empty
                dst.fill_(-1)
            else:
                ws = logits_workspace(problem.device, (end - start) * (hi - lo), budget_bytes) if backend.uses_workspace else None
                ws = ws.view(end - start, hi - lo) if ws is not None else None
                block = backend.logits(problem, (start, end), (lo, hi), ws)
                backend.topk(problem, block, (start, end), lo, dst)
            start = end
        row += b - a
