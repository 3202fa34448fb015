"""The one interface every backend implements, the chunk table, and the driver that runs it.

A backend supplies two kernels, ``logits`` (fill a float32 ``[R, width]`` block for the rows
and keys of one chunk) and ``topk`` (turn that block into row-relative int32 indices), plus
``not_supported_reasons`` and a cost model. Everything that depends only on the row bounds
is made once per step (:func:`plan_chunks`, :func:`prepare_chunks`): the chunks, whose
working set stays under a byte budget, their device index tensors, the top-k's launch
arguments and one workspace. :func:`run_chunks` then only launches kernels, every layer.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..partition import CostModel
from ..problem import LayerInputs, Problem
from ..workspace import MAX_CHUNK_BYTES, logits_workspace, scratch_workspace


@dataclass(eq=False)
class Chunk:
    """Rows ``[a, b)`` computed together: one logits block and one top-k.

    Attributes:
        rows: Global row range ``(a, b)``.
        cols: Key range ``(lo, hi)`` the logits kernel reads; covers every row's window.
        width: Columns of the logits block: ``hi - lo`` full-width, else the longest window.
        compressed: Column ``j`` of row ``i`` is key ``row_starts[a + i] + j`` (the row's
            own window start), instead of key ``lo + j``.
        starts, ends: int32 ``[R]`` on the device: each row's window relative to ``lo``
            (empty rows clamped into the block, still empty), as logits kernels take them.
        block_starts: int32 ``[R]``: column of each row's first key in the block
            (``starts``, or zeros when compressed).
        lengths: int32 ``[R]``: keys in each row's window.
        lengths_host: int64 ``[R]`` CPU copy of ``lengths``.
        workspace: float32 ``[R, width]`` view of the plan's workspace for the logits, or
            ``None`` for a backend whose kernel allocates its own.
        state: What the backend prepared for this chunk (its top-k launch, buffers).
    """

    rows: tuple[int, int]
    cols: tuple[int, int]
    width: int
    compressed: bool = False
    starts: torch.Tensor | None = None
    ends: torch.Tensor | None = None
    block_starts: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    lengths_host: torch.Tensor | None = None
    workspace: torch.Tensor | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def empty(self) -> bool:
        """Every row of the chunk is empty: its result is all ``-1``, no kernel runs."""
        return self.width == 0


class Backend(abc.ABC):
    """A logits + top-k implementation.

    Subclasses set ``name`` and ``cost_model`` and implement ``not_supported_reasons``,
    ``logits`` and ``topk``. Vendor packages are imported inside the methods, never at
    module import.
    """

    name: ClassVar[str]
    cost_model: ClassVar[CostModel] = CostModel()
    uses_workspace: ClassVar[bool] = True
    """Whether :meth:`logits` writes into the plan's workspace (else its kernel allocates)."""
    max_chunk_rows: ClassVar[int | None] = None
    """Cap on rows per chunk, for kernels whose arithmetic changes with the row count."""
    key_align: ClassVar[int] = 1
    """A chunk's first key is a multiple of this: for kernels that need the addresses of
    ``k[lo:]`` and ``k_scale[lo:]`` aligned (TMA descriptors: 16 bytes)."""
    strided_out: ClassVar[bool] = True
    """Whether :meth:`topk` writes an ``out`` with any row stride (else a run gives it a
    contiguous table and copies)."""

    @abc.abstractmethod
    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        """Why this backend cannot run ``problem`` (empty list: it can).

        With ``problem=None`` only environment reasons are given (package, device), as
        ``python -m indexer info`` shows them.
        """

    def compressed_logits(self, problem: Problem) -> bool:
        """Whether :meth:`logits` can write compressed blocks (:attr:`Chunk.compressed`), so
        that one chunk may span the requests of a packed batch."""
        return False

    def prepare(self, problem: Problem, chunks: Sequence[Chunk]) -> None:
        """Plan time: whatever the chunks' launches need besides their index tensors (the
        top-k's arguments, padded buffers), in ``chunk.state``. Runs once per plan, before
        the workspace is allocated; a backend may ask for top-k scratch in
        ``chunk.state["scratch_numel"]`` (int64 elements, placed in the workspace)."""

    def bind(self, problem: Problem, chunks: Sequence[Chunk]) -> None:
        """Plan time, after the workspace is placed: bind buffers that live in it (each
        chunk's ``state["scratch"]``)."""

    @abc.abstractmethod
    def logits(self, problem: Problem, inputs: LayerInputs, chunk: Chunk) -> torch.Tensor:
        """The logits block of one chunk.

        Returns:
            float32 ``[R, chunk.width]`` (column stride 1, any row stride): entry ``[i, j]``
            is the logit of row ``a + i`` and key ``lo + j`` (compressed: key
            ``row_starts[a + i] + j``). Values outside a row's window are unspecified: every
            top-k reads each row's window only. Usually ``chunk.workspace``; a vendor kernel
            that allocates its own output returns that.
        """

    @abc.abstractmethod
    def topk(self, problem: Problem, chunk: Chunk, logits: torch.Tensor, out: torch.Tensor) -> None:
        """Write each row's top-k keys from a chunk's logits block.

        Args:
            out: int32 ``[R, topk]`` (column stride 1); row-relative indices (key -
                row_starts), ``-1`` padded.
        """

    def max_chunk_bytes(self, problem: Problem) -> int | None:
        """Cap on one chunk's float32 logits block in bytes (as :meth:`logits_alloc_bytes`
        counts them), for kernels that index it with 32-bit offsets; ``None``: the budget
        alone."""
        return MAX_CHUNK_BYTES

    def chunk_rows_quantum(self, problem: Problem) -> int:
        """Rows a chunk cut short by the budget is best a multiple of: where the logits
        kernel gives each SM whole blocks of rows, a row count between two multiples of
        (rows a block) x (SMs) costs the time of the next one. 1: no such step."""
        return 1

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
        planner keeps it below 2^31 because kernels index it with 32-bit offsets."""
        return rows * width * 4

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def fill_index(problem: Problem, chunk: Chunk) -> None:
    """Compute (or refresh, after the bounds changed in place) a chunk's device index
    tensors from ``problem.row_starts`` / ``row_ends``: device work only, no sync."""
    a, b = chunk.rows
    lo, hi = chunk.cols
    n = hi - lo
    torch.sub(problem.row_starts[a:b], lo, out=chunk.starts).clamp_(0, n)
    torch.sub(problem.row_ends[a:b], lo, out=chunk.ends).clamp_(0, n)
    if chunk.compressed:
        # a window longer than the block (bounds refreshed past the plan) must not write
        # into the next row: clipped, only its own answer is wrong
        torch.minimum(chunk.ends, chunk.starts + chunk.width, out=chunk.ends)
    torch.sub(chunk.ends, chunk.starts, out=chunk.lengths)


def new_chunk(problem: Problem, rows: tuple[int, int], cols: tuple[int, int], compressed: bool = False) -> Chunk:
    """A :class:`Chunk` of rows ``[a, b)`` over keys ``[lo, hi)`` with its index tensors
    (no workspace or backend state yet)."""
    a, b = rows
    lo, hi = cols
    r, device = b - a, problem.device
    length = (problem.ends_host[a:b].clamp(lo, hi) - problem.starts_host[a:b].clamp(lo, hi)).clamp_min(0)
    width = 0 if hi <= lo else (int(length.max()) if compressed and r else hi - lo)
    idx = torch.empty(3, r, dtype=torch.int32, device=device)
    # a compressed block's rows all start at column 0; a full-width one's at their starts
    block_starts = torch.zeros(r, dtype=torch.int32, device=device) if compressed else idx[0]
    chunk = Chunk(rows, cols, width, compressed, idx[0], idx[1], block_starts, idx[2], length)
    fill_index(problem, chunk)
    return chunk


def chunk_end(backend: Backend, problem: Problem, start: int, stop: int, budget: int, hint: int = 1024,
               compressed: bool = False) -> tuple[int, int, int]:
    """Largest chunk ``[start, end)`` within ``[start, stop)`` that fits the budget.

    Full-width (``compressed=False``), a chunk also ends before a row whose window does
    not overlap the chunk's union so far (the next request of a packed batch): a block
    spanning two requests would compute, and its top-k would scan, the keys of both
    requests for every row. Compressed, a block is as wide as its longest window, so a
    chunk may span requests.

    Returns ``(end, lo, hi)`` where ``[lo, hi)`` is the union of the chunk's row windows
    (empty rows ignored). At least one row is always taken. Only a window of about
    ``hint`` rows (doubled while it all fits) is scanned, so cutting M rows into many
    chunks stays linear in M.
    """
    big = torch.iinfo(torch.int64).max
    cap = backend.max_chunk_bytes(problem)
    window = max(1, min(stop - start, hint))
    while True:
        starts = problem.starts_host[start : start + window]
        ends = problem.ends_host[start : start + window]
        empty = ends <= starts
        lo = torch.cummin(torch.where(empty, big, starts), 0).values
        hi = torch.cummax(torch.where(empty, -1, ends), 0).values
        count = torch.arange(1, window + 1, dtype=torch.int64)
        if compressed:
            width = torch.cummax(torch.where(empty, 0, ends - starts), 0).values
            apart = torch.zeros(window, dtype=torch.bool)
        else:
            width = (hi - lo).clamp_min(0)
            hi_before = torch.cat((torch.tensor([-1]), hi[:-1]))
            lo_before = torch.cat((torch.tensor([big]), lo[:-1]))
            apart = ~empty & (hi_before >= 0) & ((starts >= hi_before) | (ends <= lo_before))
        fits = (
            (count <= (backend.max_chunk_rows or window))
            & (backend.chunk_bytes(count, width, problem) <= budget)
            & ((backend.logits_alloc_bytes(count, width) <= cap) if cap is not None else True)
            & ~apart
        )
        take = int(torch.cumprod(fits, 0).sum())  # the fitting chunks are a prefix
        if take < window or window == stop - start:
            break
        window = min(stop - start, 2 * window)
    if take < window and not bool(apart[take]):
        # cut by the budget (not at a request's start): to whole steps of the logits kernel
        quantum = backend.chunk_rows_quantum(problem)
        if take >= quantum > 1:
            take = take // quantum * quantum
    take = max(1, take)
    end = start + take
    if width[take - 1] == 0:
        return end, 0, 0
    return end, int(lo[take - 1]), int(hi[take - 1])


def chunk_bounds(backend: Backend, problem: Problem, ranges: Sequence[tuple[int, int]],
                 budget_bytes: int) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """Where :func:`plan_chunks` cuts the given global row ranges, host work only: per chunk
    ``(rows, key columns, compressed)``, in order (for other ranks' chunks, whose index
    tensors this rank never needs).

    Where the backend writes compressed blocks, a chunk is compressed only where that buys
    more rows than a full-width one (it spans requests, or windows that overlap only in
    part); on one request full-width (faster in DeepGEMM's kernel) is kept.
    """
    compressed_ok = problem.num_rows > 0 and backend.compressed_logits(problem)
    bounds = []
    # the first scan covers up to 16384 rows at once: a scan's cost is its few dozen tensor
    # ops, not their length, so a step of a few thousand rows is planned in one scan
    hint = 16384
    for a, b in ranges:
        start = a
        # rows whose windows all start at one key (one request's chunk) gain nothing from
        # compressed rows: the same chunks, so the second scan is skipped
        firsts = problem.starts_host[a:b][problem.ends_host[a:b] > problem.starts_host[a:b]]
        varied = compressed_ok and bool((firsts != firsts[:1]).any())
        while start < b:
            end, lo, hi = chunk_end(backend, problem, start, b, budget_bytes, hint)
            compressed = False
            if varied:
                end_c, lo_c, hi_c = chunk_end(backend, problem, start, b, budget_bytes, hint, compressed=True)
                if end_c > end:
                    end, lo, hi, compressed = end_c, lo_c, hi_c, True
            hint = max(1024, 2 * (end - start))
            if hi > lo:  # a few more keys on the left, read by no row (windows are relative to lo)
                lo -= lo % backend.key_align
            bounds.append(((start, end), (lo, hi), compressed))
            start = end
    return bounds


def plan_chunks(backend: Backend, problem: Problem, ranges: Sequence[tuple[int, int]], budget_bytes: int) -> list[Chunk]:
    """The chunks of the given global row ranges, in order (:func:`chunk_bounds`), with their
    index tensors."""
    return [new_chunk(problem, rows, cols, compressed)
            for rows, cols, compressed in chunk_bounds(backend, problem, ranges, budget_bytes)]


def prepare_chunks(backend: Backend, problem: Problem, chunks: Sequence[Chunk],
                   budget_bytes: int | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Plan time: the backend's per-chunk state, then the buffers of the largest chunk, and
    each chunk's views into them: the logits workspace (where the backend writes its logits
    there) and the top-k scratch. The device's shared ones
    (:func:`~indexer.workspace.logits_workspace`, :func:`~indexer.workspace.scratch_workspace`:
    chunks run one after another), or with ``budget_bytes=None`` buffers of their own.

    Returns:
        ``(logits workspace, scratch)``, each ``None`` where no chunk needs it.
    """
    backend.prepare(problem, chunks)
    live = [c for c in chunks if not c.empty]
    logits_need = max((c.num_rows * c.width for c in live), default=0) if backend.uses_workspace else 0
    scratch_need = max((c.state.get("scratch_numel", 0) for c in live), default=0)
    own = budget_bytes is None
    ws = scratch = None
    if logits_need:
        ws = (torch.empty(logits_need, dtype=torch.float32, device=problem.device) if own
              else logits_workspace(problem.device, logits_need, budget_bytes))
    if scratch_need:
        scratch = (torch.empty(scratch_need, dtype=torch.int64, device=problem.device) if own
                   else scratch_workspace(problem.device, scratch_need))
    for c in live:
        if ws is not None:
            c.workspace = ws[: c.num_rows * c.width].view(c.num_rows, c.width)
        if c.state.get("scratch_numel", 0):
            c.state["scratch"] = scratch[: c.state["scratch_numel"]]
    backend.bind(problem, chunks)
    return ws, scratch


def single_chunk(backend: Backend, problem: Problem, rows: tuple[int, int], cols: tuple[int, int],
                 compressed: bool = False) -> Chunk:
    """One chunk of rows ``[a, b)`` over keys ``[lo, hi)``, prepared with buffers of its
    own (benchmarks and tests that call a backend's ``logits`` and ``topk`` directly)."""
    chunk = new_chunk(problem, rows, cols, compressed)
    prepare_chunks(backend, problem, [chunk], None)
    return chunk


def run_chunks(backend: Backend, problem: Problem, inputs: LayerInputs, chunks: Sequence[Chunk], out: torch.Tensor,
               first: int = 0) -> None:
    """Launch every chunk: its logits, then its top-k into ``out[a - first : b - first]``
    (``out``'s row 0 is global row ``first``)."""
    for c in chunks:
        a, b = c.rows
        dst = out[a - first : b - first]
        if c.empty:
            dst.fill_(-1)
            continue
        backend.topk(problem, c, backend.logits(problem, inputs, c), dst)


def run_rows(
    backend: Backend,
    problem: Problem,
    inputs: LayerInputs,
    ranges: Sequence[tuple[int, int]],
    out: torch.Tensor,
    budget_bytes: int,
) -> None:
    """Plan and run the given rows in one go (tests, calibration): ``out`` holds the rows of
    ``ranges`` one after another.

    Args:
        out: int32 ``[sum of range lengths, topk]``.
    """
    chunks = plan_chunks(backend, problem, ranges, budget_bytes)
    prepare_chunks(backend, problem, chunks, budget_bytes)
    row = 0
    for a, b in ranges:
        part = [c for c in chunks if a <= c.rows[0] < b]
        run_chunks(backend, problem, inputs, part, out[row : row + b - a], first=a)
        row += b - a
