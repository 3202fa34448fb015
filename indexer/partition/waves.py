"""Waves of a sharded step: every rank's rows cut into the same number of consecutive groups,
so that each wave's rows can be exchanged while the next wave computes.

Pure CPU code, a function of the row plan and of each rank's row cuts: every rank computes
the same waves for every rank without talking to the others.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .plan import Range, RowPlan

AUTO_MAX_WAVES = 8
"""Most waves ``auto`` makes: each wave is one more collective launch (tens of microseconds
on NCCL), and 8 leave an eighth of the exchange to wait for."""


def even_cuts(rows: int, waves: int) -> list[int]:
    """Offsets (into a rank's ``rows`` rows, in order) that cut them into ``waves`` groups
    whose sizes differ by at most one row."""
    if waves < 1:
        raise ValueError(f"waves must be >= 1, got {waves}")
    return [rows * w // waves for w in range(1, waves)]


def chunk_cuts(chunk_rows: Sequence[Range], waves: int) -> list[int]:
    """Offsets that group a rank's chunks (their global row ranges, in the rank's row order)
    into ``waves`` waves of consecutive chunks, as many chunks in each as can be evenly
    (wave ``w`` holds chunks ``[w * C // waves, (w + 1) * C // waves)`` of ``C``), so a wave
    never splits a chunk."""
    count = len(chunk_rows)
    if not 1 <= waves <= max(1, count):
        raise ValueError(f"waves must be in [1, {max(1, count)}] for {count} chunks, got {waves}")
    ends = [sum(b - a for a, b in chunk_rows[:i]) for i in range(count + 1)]
    return [ends[w * count // waves] for w in range(1, waves)]


def split_rows(ranges: Sequence[Range], cuts: Sequence[int]) -> list[list[Range]]:
    """A rank's ordered row ``ranges`` cut at row offsets ``cuts`` (non-decreasing, within
    ``[0, rows]``) into ``len(cuts) + 1`` groups of ranges, adjacent ranges merged.

    >>> split_rows([(0, 4), (10, 12)], [3, 5])
    [[(0, 3)], [(3, 4), (10, 11)], [(11, 12)]]
    """
    total = sum(b - a for a, b in ranges)
    if list(cuts) != sorted(cuts) or any(not 0 <= c <= total for c in cuts):
        raise ValueError(f"cuts must be non-decreasing offsets in [0, {total}], got {list(cuts)}")
    bounds = [*cuts, total]
    groups: list[list[Range]] = [[] for _ in bounds]
    g, offset = 0, 0  # offset: rows of `ranges` before the current range
    for a, b in ranges:
        start = a
        while start < b:
            while offset + (start - a) >= bounds[g]:  # this group is full
                g += 1
            stop = min(b, a + bounds[g] - offset)
            group = groups[g]
            if group and group[-1][1] == start:
                group[-1] = (group[-1][0], stop)
            else:
                group.append((start, stop))
            start = stop
        offset += b - a
    return groups


def wave_plans(plan: RowPlan, groups: Sequence[Sequence[Sequence[Range]]]) -> list[RowPlan]:
    """One :class:`RowPlan` per wave: ``groups[r][w]`` are rank ``r``'s ranges in wave ``w``.

    Each wave's plan keeps the step's ``num_rows`` (its pieces index the whole table) and
    carries no costs of its own (zeros).

    Raises:
        ValueError: ``groups`` does not give every rank the same number of waves, or a rank's
            waves are not exactly its rows in the plan.
    """
    world = plan.world_size
    if len(groups) != world or len({len(g) for g in groups}) != 1:
        raise ValueError(f"groups must give each of the {world} ranks the same number of waves")
    for r in range(world):
        if _merged(rg for wave in groups[r] for rg in wave) != _merged(plan.pieces[r]):
            raise ValueError(f"rank {r}'s waves must be its rows {list(plan.pieces[r])}, in order")
    waves = len(groups[0])
    return [replace(plan, pieces=tuple(tuple(groups[r][w]) for r in range(world)), costs=(0,) * world)
            for w in range(waves)]


def _merged(ranges) -> list[Range]:
    out: list[Range] = []
    for a, b in ranges:
        if a == b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
