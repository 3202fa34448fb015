"""Row plans: which query rows each tensor-parallel rank computes.

A plan is a pure function of (row bounds, world size, strategy, cost model): every rank
computes the same plan from the same replicated inputs without talking to the others.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .cost import DEFAULT_COST_MODEL, CostModel

Range = tuple[int, int]
"""Half-open row range ``[start, stop)``."""

STRATEGIES = ("contiguous", "remainder0", "fold", "balanced", "striped")
DEFAULT_STRIPE_ROWS = 512
"""Rows per stripe of the ``striped`` strategy (SGLang's DSA M-split uses 512)."""
"""Strategy names accepted by :func:`plan_rows` (``auto`` is resolved by the caller)."""


@dataclass(frozen=True)
class RowPlan:
    """Per-rank row ranges of one prefill step.

    Attributes:
        strategy: Strategy that produced the plan.
        world_size: Number of ranks.
        num_rows: Total rows ``M``.
        pieces: ``pieces[r]`` is rank ``r``'s tuple of half-open row ranges, in row order,
            empty ranges dropped.
        costs: Predicted cost of each rank under the plan's cost model.
    """

    strategy: str
    world_size: int
    num_rows: int
    pieces: tuple[tuple[Range, ...], ...]
    costs: tuple[int, ...]

    def rank_rows(self, rank: int) -> list[Range]:
        """Half-open row ranges owned by ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return list(self.pieces[rank])

    @property
    def rows_per_rank(self) -> tuple[int, ...]:
        return tuple(sum(b - a for a, b in p) for p in self.pieces)

    @property
    def cost_per_rank(self) -> tuple[int, ...]:
        return self.costs

    @property
    def max_cost(self) -> int:
        return max(self.costs) if self.costs else 0

    @property
    def imbalance(self) -> float:
        """Max rank cost over mean rank cost (1.0 is perfect; 1.0 when there is no work)."""
        total = sum(self.costs)
        if total == 0:
            return 1.0
        return self.max_cost * self.world_size / total

    def rank_index(self, rank: int) -> torch.Tensor:
        """int64 ``[rows_per_rank[rank]]``: the global row ids of ``rank``, in order."""
        parts = [torch.arange(a, b, dtype=torch.int64) for a, b in self.pieces[rank]]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def fingerprint(self) -> int:
        """Stable 63-bit digest of the plan (same on every rank and every run)."""
        text = repr((self.strategy, self.world_size, self.num_rows, self.pieces))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1

    def describe(self) -> str:
        rows = ",".join(map(str, self.rows_per_rank))
        return f"{self.strategy}: rows/rank [{rows}], imbalance {self.imbalance:.3f}"


def _as_int64_cpu(x: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(list(x), dtype=torch.int64)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must hold integers, got {t.dtype}")
    return t.detach().to("cpu", torch.int64)


def _contiguous(m: int, tp: int, _prefix: torch.Tensor, _stripe: int) -> list[list[Range]]:
    return [[(r * m // tp, (r + 1) * m // tp)] for r in range(tp)]


def _remainder0(m: int, tp: int, _prefix: torch.Tensor, _stripe: int) -> list[list[Range]]:
    # Every rank floor(M/tp) rows; rank 0 also takes the M mod tp extra rows, which are the
    # earliest (cheapest) ones. Ranks 0..tp-1 then own equal blocks of [rem, M).
    base, rem = divmod(m, tp)
    out = [[(0, rem + base)]]
    out += [[(rem + r * base, rem + (r + 1) * base)] for r in range(1, tp)]
    return out


def fold_split(m: int, tp: int) -> int:
    """Row where the fold's second half starts: about M/2, a multiple of ``tp``."""
    return (m // 2) // tp * tp


def _fold(m: int, tp: int, _prefix: torch.Tensor, _stripe: int) -> list[list[Range]]:
    # First half (a multiple of tp) in tp equal groups, second half in tp near-equal
    # groups; rank r pairs first-half group r (cheap, early) with second-half group
    # tp-1-r (expensive, late), so causal cost evens out without a cost model.
    h1 = fold_split(m, tp)
    g1 = h1 // tp
    m2 = m - h1
    second = [(h1 + j * m2 // tp, h1 + (j + 1) * m2 // tp) for j in range(tp)]
    return [[(r * g1, (r + 1) * g1), second[tp - 1 - r]] for r in range(tp)]


def _balanced(m: int, tp: int, prefix: torch.Tensor, _stripe: int) -> list[list[Range]]:
    # Cut where the prefix sum of cost is nearest to k/tp of the total, in integers:
    # compare prefix*tp with k*total so no rounding differs between ranks or machines.
    total = int(prefix[-1])
    if total == 0:
        return _contiguous(m, tp, prefix, _stripe)
    scaled = prefix * tp
    targets = torch.arange(1, tp, dtype=torch.int64) * total
    his = torch.searchsorted(scaled, targets, side="left")
    los = (his - 1).clamp_min(0)
    hi_vals, lo_vals = scaled[his].tolist(), scaled[los].tolist()
    cuts = [0]
    for k, (hi, target) in enumerate(zip(his.tolist(), targets.tolist())):
        # nearest of the two candidate cuts; ties go to the earlier cut
        if hi > 0 and target - lo_vals[k] <= hi_vals[k] - target:
            hi -= 1
        cuts.append(max(hi, cuts[-1]))
    cuts.append(m)
    return [[(cuts[r], cuts[r + 1])] for r in range(tp)]


def _striped(m: int, tp: int, _prefix: torch.Tensor, stripe: int) -> list[list[Range]]:
    # fixed-size stripes dealt round-robin: causal cost evens out without a cost model,
    # at the price of many pieces per rank (exchanged by maxreduce, padded or allgatherv)
    out: list[list[Range]] = [[] for _ in range(tp)]
    for i, a in enumerate(range(0, m, stripe)):
        out[i % tp].append((a, min(m, a + stripe)))
    return out


_STRATEGY_FUNCS: dict[str, Callable[[int, int, torch.Tensor, int], list[list[Range]]]] = {  # (M, tp, prefix, stripe)
    "contiguous": _contiguous,
    "remainder0": _remainder0,
    "fold": _fold,
    "balanced": _balanced,
    "striped": _striped,
}


def plan_rows(
    row_starts: torch.Tensor | Sequence[int],
    row_ends: torch.Tensor | Sequence[int],
    world_size: int,
    strategy: str,
    *,
    cost_model: CostModel | None = None,
    num_keys: int | None = None,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
) -> RowPlan:
    """Split the query rows of one prefill step across ``world_size`` ranks.

    Args:
        row_starts: int ``[M]``, first key of each row's window (tensor or sequence).
        row_ends: int ``[M]``, one past the last key of each row's window.
        world_size: Number of ranks (>= 1).
        strategy: ``contiguous``, ``remainder0``, ``fold``, ``balanced`` or ``striped``.
        cost_model: Per-row cost coefficients; the default counts keys plus a constant.
        num_keys: Width ``N`` of the logits rows, for the cost model's width term;
            defaults to ``max(row_ends)``.
        stripe_rows: Rows per stripe of ``striped``.

    Returns:
        The :class:`RowPlan`; every row is owned by exactly one rank.

    Raises:
        ValueError: Unknown strategy, ``world_size < 1`` or mismatched bounds.
    """
    return plan_candidates(
        row_starts, row_ends, world_size, (strategy,), cost_model=cost_model, num_keys=num_keys, stripe_rows=stripe_rows
    )[0]


def plan_candidates(
    row_starts: torch.Tensor | Sequence[int],
    row_ends: torch.Tensor | Sequence[int],
    world_size: int,
    strategies: Sequence[str],
    *,
    cost_model: CostModel | None = None,
    num_keys: int | None = None,
    stripe_rows: int = DEFAULT_STRIPE_ROWS,
) -> list[RowPlan]:
    """:func:`plan_rows` for several strategies at once, sharing the row costs."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if isinstance(stripe_rows, bool) or not isinstance(stripe_rows, int) or stripe_rows < 1:
        raise ValueError(f"stripe_rows must be an int >= 1, got {stripe_rows!r}")
    for strategy in strategies:
        if strategy not in _STRATEGY_FUNCS:
            raise ValueError(f"strategy must be one of {'|'.join(STRATEGIES)}, got {strategy!r}")
    starts = _as_int64_cpu(row_starts, "row_starts")
    ends = _as_int64_cpu(row_ends, "row_ends")
    if starts.shape != ends.shape:
        raise ValueError(
            f"row_starts and row_ends must have the same length, got {starts.numel()} and {ends.numel()}"
        )
    m = starts.numel()
    model = cost_model or DEFAULT_COST_MODEL
    width = num_keys if num_keys is not None else (int(ends.max()) if m else 0)
    prefix = torch.zeros(m + 1, dtype=torch.int64)
    if m:
        torch.cumsum(model.row_costs(starts, ends, width), 0, out=prefix[1:])
    plans = []
    for strategy in strategies:
        pieces = tuple(tuple((a, b) for a, b in rank if b > a) for rank in _STRATEGY_FUNCS[strategy](m, world_size, prefix, stripe_rows))
        bounds = torch.tensor([x for rank in pieces for piece in rank for x in piece] or [0], dtype=torch.int64)
        at = iter(prefix[bounds].tolist())
        costs = tuple(sum(-next(at) + next(at) for _ in rank) for rank in pieces)
        plans.append(RowPlan(strategy, world_size, m, pieces, costs))
    return plans
