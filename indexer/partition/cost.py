"""Per-row cost model used by the planner.

A row's cost is what one rank pays to produce its top-k:

    cost(m) = per_key * keys(m) + per_width * width + per_row      (0 for an empty row)

``keys(m) = row_ends[m] - row_starts[m]`` is the work of the logits kernel. ``width`` is the
number of logits columns the top-k reads for the row: a top-k that scans the whole
``[M, N]`` logits row (torch.topk on a vendor kernel's output) pays for ``N`` columns
whatever the row's history, and a model of keys alone under-prices short early rows
(measured on 2x H200: it turned a 1.54x contiguous split into 1.40x). ``per_row`` covers
fixed per-row work (writing ``topk`` indices, launch tails).

Integer coefficients keep every plan an exact, platform-independent function of its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CostModel:
    """Integer cost coefficients of one backend.

    Attributes:
        per_key: Cost per key scored by the logits kernel.
        per_width: Cost per logits column the top-k reads (the full row width ``N``).
        per_row: Fixed cost per non-empty row.
    """

    per_key: int = 1
    per_width: int = 0
    per_row: int = 128

    def __post_init__(self) -> None:
        for name in ("per_key", "per_width", "per_row"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"CostModel.{name} must be an int >= 0, got {v!r}")

    def row_costs(self, row_starts: torch.Tensor, row_ends: torch.Tensor, width: int) -> torch.Tensor:
        """Cost of every row.

        Args:
            row_starts: int64 ``[M]`` (CPU).
            row_ends: int64 ``[M]`` (CPU).
            width: Logits columns the top-k reads per row (usually ``N``).

        Returns:
            int64 ``[M]``; 0 for rows with ``row_ends <= row_starts``.
        """
        keys = (row_ends - row_starts).clamp_min(0)
        cost = keys * self.per_key + (self.per_width * int(width) + self.per_row)
        return torch.where(keys > 0, cost, torch.zeros_like(cost))


DEFAULT_COST_MODEL = CostModel()
