"""The sharding gate from calibrated times: shard when the predicted sharded step (the slowest
rank's compute plus the exchange) beats the replicated one by a margin.

A row costs ``ns_per_key * keys + us_per_row`` (``bench calibrate``'s fit, where a causal
row's block is about as wide as its window, so the per-column term joins the per-key one); an
exchange of a ``[M, topk]`` table costs ``us + bytes / bandwidth`` (``bench calibrate
--exchange --tp N``, per process-group backend and size). Where either is not calibrated the
gate is the row count (``INDEXER_TP_SHARD_MIN_ROWS``), which also wins whenever it is set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Sharded must be predicted at least this much faster than replicated (5%): the model's
#: error, and the run-to-run noise of the measurements behind it.
MARGIN = 0.05


@dataclass(frozen=True)
class TimeModel:
    """Calibrated times of one backend on one architecture and of one group's exchange.

    Attributes:
        ns_per_key: Compute time per key a row scores (logits and top-k).
        us_per_row: Fixed compute time per non-empty row.
        exchange_us: Fixed time of one exchange.
        exchange_gb_per_s: Bytes of the whole table moved per nanosecond.
    """

    ns_per_key: float
    us_per_row: float
    exchange_us: float
    exchange_gb_per_s: float

    def rows_ms(self, starts: torch.Tensor, ends: torch.Tensor) -> float:
        """Predicted compute of rows with windows ``[starts, ends)`` (int64 host tensors)."""
        keys = (ends - starts).clamp_min(0)
        return float(keys.sum()) * self.ns_per_key * 1e-6 + int((keys > 0).sum()) * self.us_per_row * 1e-3

    def exchange_ms(self, rows: int, topk: int, bits: int) -> float:
        """Predicted exchange of a ``[rows, topk]`` table of ``bits``-wide indices."""
        return (self.exchange_us + rows * topk * bits / 8 / self.exchange_gb_per_s * 1e-3) * 1e-3


@dataclass(frozen=True)
class GateDecision:
    """Whether to shard, the rule's name, and the model's two predictions."""

    shard: bool
    rule: str
    replicated_ms: float
    sharded_ms: float

    def describe(self) -> str:
        return (f"{self.rule}: sharded {self.sharded_ms:.3f} ms (slowest rank + exchange) vs replicated "
                f"{self.replicated_ms:.3f} ms")


def model_gate(model: TimeModel, starts: torch.Tensor, ends: torch.Tensor, pieces, topk: int,
               bits: int) -> GateDecision:
    """Decide from ``model`` for a row plan whose ranks own ``pieces`` (per rank, row ranges).

    Args:
        starts, ends: int64 ``[M]`` host row bounds.
        pieces: ``RowPlan.pieces``: per rank, its ``(first, end)`` row ranges.
        topk: Columns of the exchanged table.
        bits: Width of the exchanged indices.
    """
    replicated = model.rows_ms(starts, ends)
    slowest = max(sum(model.rows_ms(starts[a:b], ends[a:b]) for a, b in mine) for mine in pieces)
    sharded = slowest + model.exchange_ms(starts.numel(), topk, bits)
    shard = sharded < replicated * (1 - MARGIN)
    rule = f"cost model ({'shard' if shard else 'replicate'}: margin {MARGIN:.0%})"
    return GateDecision(shard, rule, replicated, sharded)
