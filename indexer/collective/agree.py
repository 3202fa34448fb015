"""Inputs of the plan that come from a rank's own environment, made the same on every rank.

A plan must be the same on every rank, but the cost model comes from each rank's own
calibration file (``INDEXER_COST_MODEL_FILE``): on several nodes, with different home
directories, or while ``bench calibrate`` rewrites the file, ranks could read different
models, cut different plans and exchange the wrong rows. So the first sharded call on a
group takes rank 0's model, broadcast once, and every later call on that group reuses it.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from ..partition import CostModel
from ..partition.calibration import cost_model_for

_lock = threading.Lock()
_agreed: dict[tuple[object, str, str], CostModel] = {}


def agreed_cost_model(group: object, device: torch.device, backend: object, arch: str) -> CostModel:
    """Rank 0's cost model for ``backend`` on ``arch``, the same on every rank of ``group``.

    Collective on first use per (group, backend, arch): every rank must call it (all ranks
    that shard the same step do); cached afterwards, so later calls cost nothing.
    """
    key = (group, getattr(backend, "name"), arch)
    with _lock:
        if key in _agreed:
            return _agreed[key]
    mine, _ = cost_model_for(backend, arch)
    t = torch.tensor([mine.per_key, mine.per_width, mine.per_row], dtype=torch.int64, device=device)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    per_key, per_width, per_row = (int(x) for x in t.tolist())
    model = CostModel(per_key=per_key, per_width=per_width, per_row=per_row)
    with _lock:
        _agreed[key] = model
    return model


def forget_agreements() -> None:
    """Drop the cached models (tests that recreate groups, or after recalibrating)."""
    with _lock:
        _agreed.clear()
