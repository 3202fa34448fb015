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

from ..partition import CostModel, TimeModel
from ..partition.calibration import cost_model_for, load_time_model
from .probe import backend_name

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


_agreed_times: dict[tuple[object, str, str], tuple[TimeModel | None, str]] = {}


def agreed_time_model(group: object, device: torch.device, backend: object, arch: str) -> tuple[TimeModel | None, str]:
    """Rank 0's calibrated times for the sharding gate (``(None, why)`` where rank 0 has
    none), the same on every rank of ``group``. Collective on first use per (group, backend,
    arch), like :func:`agreed_cost_model`."""
    key = (group, getattr(backend, "name"), arch)
    with _lock:
        if key in _agreed_times:
            return _agreed_times[key]
    world = dist.get_world_size(group)
    mine, why = load_time_model(getattr(backend, "name"), arch, backend_name(group, device), world)
    values = [0.0] * 5 if mine is None else [1.0, mine.ns_per_key, mine.us_per_row, mine.exchange_us,
                                             mine.exchange_gb_per_s]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    have, *times = t.tolist()
    rank0 = dist.get_rank(group) == 0
    agreed = (TimeModel(*times), why if rank0 else "rank 0's calibration") if have else (
        None, why if rank0 else "rank 0 has no calibrated times")
    with _lock:
        _agreed_times[key] = agreed
    return agreed


def forget_agreements() -> None:
    """Drop the cached models (tests that recreate groups, or after recalibrating)."""
    with _lock:
        _agreed.clear()
        _agreed_times.clear()
