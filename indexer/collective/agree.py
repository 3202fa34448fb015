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
_agreed: dict[tuple, CostModel] = {}
_agreed_times: dict[tuple, tuple[TimeModel | None, str]] = {}


def _from_rank0(group: object, device: torch.device, load, size: int, dtype: torch.dtype) -> tuple[list, str]:
    """``(values, why)``: what rank 0's ``load()`` returned (``size`` numbers), broadcast.

    Only rank 0 reads its file, so a bad file elsewhere cannot matter; a bad file on rank 0
    (``load`` raising ``ValueError``) makes every rank raise, none waiting in a collective
    the others left."""
    values, why, failed = [0] * size, "", 0
    if dist.get_rank(group) == 0:
        try:
            values, why = load()
        except ValueError as exc:
            failed, why = 1, str(exc)
    t = torch.tensor([failed, *values], dtype=dtype, device=device)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast(t, src=src, group=group)
    failed, *values = t.tolist()
    if failed:
        raise ValueError(why or "rank 0 could not read its cost model file (INDEXER_COST_MODEL_FILE); see rank 0's error")
    return values, why


def agreed_cost_model(group: object, device: torch.device, backend: object, arch: str) -> CostModel:
    """Rank 0's cost model for ``backend`` on ``arch``, the same on every rank of ``group``.

    Collective on first use per (group, its size, backend, arch): every rank must call it
    (all ranks that shard the same step do); cached afterwards, so later calls cost nothing.

    Raises:
        ValueError: on every rank, where rank 0's cost model file is unreadable.
    """
    key = (group, dist.get_world_size(group), getattr(backend, "name"), arch)
    with _lock:
        if key in _agreed:
            return _agreed[key]

    def load():
        mine, why = cost_model_for(backend, arch)
        return [mine.per_key, mine.per_width, mine.per_row], why

    (per_key, per_width, per_row), _ = _from_rank0(group, device, load, 3, torch.int64)
    model = CostModel(per_key=int(per_key), per_width=int(per_width), per_row=int(per_row))
    with _lock:
        _agreed[key] = model
    return model


def agreed_time_model(group: object, device: torch.device, backend: object, arch: str) -> tuple[TimeModel | None, str]:
    """Rank 0's calibrated times for the sharding gate (``(None, why)`` where rank 0 has
    none), the same on every rank of ``group``. Collective on first use per (group, its size,
    backend, arch), like :func:`agreed_cost_model`.

    Raises:
        ValueError: on every rank, where rank 0's cost model file is unreadable.
    """
    world = dist.get_world_size(group)
    key = (group, world, getattr(backend, "name"), arch)
    with _lock:
        if key in _agreed_times:
            return _agreed_times[key]

    def load():
        mine, why = load_time_model(getattr(backend, "name"), arch, backend_name(group, device), world)
        if mine is None:
            return [0.0] * 5, why
        return [1.0, mine.ns_per_key, mine.us_per_row, mine.exchange_us, mine.exchange_gb_per_s], why

    (have, *times), why = _from_rank0(group, device, load, 5, torch.float64)
    agreed = (TimeModel(*times), why or "rank 0's calibration") if have else (None, why or "rank 0 has no calibrated times")
    with _lock:
        _agreed_times[key] = agreed
    return agreed


def forget_agreements() -> None:
    """Drop the cached models (tests that recreate groups, or after recalibrating)."""
    with _lock:
        _agreed.clear()
        _agreed_times.clear()
