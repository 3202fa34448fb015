"""What a process group can do, probed once and cached per group."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger("indexer")

_VARSIZE_BACKENDS = {"nccl": True, "rccl": True, "gloo": False}
"""Backends whose answer is known: NCCL/RCCL run torch's uneven all_gather as grouped
broadcasts; gloo rejects it (``ProcessGroupGloo::allgather: invalid tensor size``)."""


@dataclass(frozen=True)
class GroupCaps:
    """Capabilities of one process group for one device type.

    Attributes:
        backend: Collective backend name for the tensors' device (``nccl``, ``gloo``...).
        world_size: Ranks in the group.
        rank: This process's rank in the group.
        varsize_allgather: Whether ``all_gather`` accepts slices of different sizes.
        how: ``known`` (from the backend name) or ``probed`` (a trial collective).
    """

    backend: str
    world_size: int
    rank: int
    varsize_allgather: bool
    how: str


_cache: dict[tuple[object, str], GroupCaps] = {}
_lock = threading.Lock()


def backend_name(group: object, device: torch.device) -> str:
    """Collective backend that serves ``device`` tensors in ``group``.

    ``dist.get_backend`` answers ``gloo`` or ``nccl``, or ``cpu:gloo,cuda:nccl`` for a group
    with one backend per device type.
    """
    name = str(dist.get_backend(group)).lower()
    if ":" in name:
        table = dict(part.split(":", 1) for part in name.split(","))
        name = table.get(device.type, next(iter(table.values())))
    return name


def _trial_varsize(group: object, device: torch.device, world: int, rank: int) -> bool:
    # Every rank tries, then all agree on the minimum, so no rank goes on alone.
    ok = 1
    try:
        parts = [torch.empty(r + 1, dtype=torch.int32, device=device) for r in range(world)]
        dist.all_gather(parts, torch.full((rank + 1,), rank, dtype=torch.int32, device=device), group=group)
        ok = int(all(bool((p == r).all()) for r, p in enumerate(parts)))
    except Exception as exc:  # noqa: BLE001 - a refusal is the answer we are probing for
        log.debug("variable-size all_gather refused: %s", exc)
        ok = 0
    flag = torch.tensor([ok], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def probe_group(group: object, device: torch.device) -> GroupCaps:
    """Capabilities of ``group`` for tensors on ``device`` (cached per group and device type).

    Backends with a known answer cost nothing; an unknown backend gets one trial
    variable-size all_gather plus one all_reduce, collectively on every rank, once.
    """
    key = (group, device.type)
    with _lock:
        if key in _cache:
            return _cache[key]
    name = backend_name(group, device)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if name in _VARSIZE_BACKENDS:
        caps = GroupCaps(name, world, rank, _VARSIZE_BACKENDS[name], "known")
    else:
        caps = GroupCaps(name, world, rank, _trial_varsize(group, device, world, rank), "probed")
    log.debug("process group capabilities: %s", caps)
    with _lock:
        _cache[key] = caps
    return caps


def clear_cache() -> None:
    """Forget every probed group (for tests that create and destroy groups)."""
    with _lock:
        _cache.clear()
