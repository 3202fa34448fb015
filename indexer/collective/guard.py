"""Consistency guard: ranks compare a fingerprint of the step before exchanging.

A rank that disagrees about the shapes, the row bounds or the plan would otherwise send
slices of the wrong size (a hang) or of the wrong rows (silently wrong results). With
``INDEXER_CHECK_CONSISTENCY=1`` every rank all-gathers one int64 and, on any disagreement,
every rank raises the same error naming the ranks that differ from rank 0.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist


class InconsistentRanksError(RuntimeError):
    """Ranks of the group passed different inputs or settings to the same call."""


def fingerprint(*parts: object, tensors: tuple[torch.Tensor, ...] = ()) -> int:
    """63-bit digest of ``parts`` (reprs) and the bytes of CPU ``tensors``."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(parts).encode())
    for t in tensors:
        # clone: exactly this tensor's bytes (a contiguous slice would share its base's
        # storage); through the storage, not numpy, which torch does not require
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(bytes(t.detach().cpu().clone().untyped_storage()))
    return int.from_bytes(h.digest(), "little") >> 1


def check_consistency(value: int, group: object, device: torch.device, what: str) -> None:
    """All-gather ``value``; raise :class:`InconsistentRanksError` on every rank if any differs.

    Args:
        value: This rank's fingerprint.
        group: Process group (``None``: default group).
        device: Device the group's backend communicates on.
        what: Description of what was fingerprinted, for the message.
    """
    world = dist.get_world_size(group)
    mine = torch.tensor([value], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    values = [int(t.item()) for t in every]
    bad = [r for r, v in enumerate(values) if v != values[0]]
    if bad:
        raise InconsistentRanksError(
            f"ranks {bad} disagree with rank 0 about {what} "
            f"(fingerprints: {', '.join(f'rank {r}: {v:#x}' for r, v in enumerate(values))}); "
            "every rank of the group must pass the same inputs and settings"
        )
