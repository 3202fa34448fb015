"""Reassembly: every rank's ``[rows, W]`` slice into the full ``[M, W]`` table on every rank.

Modes (see DESIGN.md):

- ``allgatherv``: one variable-size all_gather straight into the output rows (NCCL/RCCL).
- ``ring``: all_gather of the evenly divisible block straight into the output, plus
  broadcasts for the rest, issued together (``remainder0``: rank 0's extra rows; ``fold``:
  the second-half groups). Any backend.
- ``padded``: all_gather of slices padded to the largest, then strip. Any backend.
- ``maxreduce``: the output prefilled with -1, each rank writes its rows in place, one
  all_reduce(MAX) merges them (-1 is below every valid index). Any backend, any plan; the
  natural fit for ``striped`` plans, whose many pieces it never packs or scatters.

Slices are written in place into ``out`` wherever the layout allows, so the exchange moves
each row once.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from ..partition import RowPlan, fold_split
from .probe import GroupCaps

MODES = ("allgatherv", "ring", "padded", "maxreduce")
RING_STRATEGIES = ("remainder0", "fold")
"""Plans whose layout ``ring`` can exchange."""

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class ReassemblyError(ValueError):
    """The requested reassembly cannot exchange this plan on this group."""


def supported_modes(caps: GroupCaps) -> tuple[str, ...]:
    """Modes the group can run, in ``auto``'s order of preference."""
    return (("allgatherv",) if caps.varsize_allgather else ()) + ("ring", "maxreduce", "padded")


def mode_reasons(mode: str, caps: GroupCaps, strategy: str | None) -> list[str]:
    """Why ``mode`` cannot exchange a ``strategy`` plan on this group (empty: it can)."""
    reasons = []
    if mode == "allgatherv" and not caps.varsize_allgather:
        reasons.append(f"the {caps.backend} process group rejects variable-size all_gather ({caps.how})")
    if mode == "ring" and strategy is not None and strategy not in RING_STRATEGIES:
        reasons.append(f"ring exchanges only {'|'.join(RING_STRATEGIES)} plans, not {strategy!r}")
    return reasons


def _auto_fits(mode: str, strategy: str) -> bool:
    # maxreduce reduces the whole table (about twice the bytes of a gather), so auto keeps
    # it for striped plans, whose many pieces every other mode would pack or scatter
    return mode != "maxreduce" or strategy == "striped"


def choose_mode(requested: str, caps: GroupCaps, strategy: str) -> str:
    """Resolve ``auto`` (or check a forced mode) for a plan of ``strategy``.

    ``auto``: allgatherv where the group supports it (one collective, no padding); else ring
    for the plans it fits (no padding); else maxreduce for striped plans; else padded.

    Raises:
        ReassemblyError: A forced mode cannot run; the message says why.
    """
    if requested != "auto":
        reasons = mode_reasons(requested, caps, strategy)
        if reasons:
            raise ReassemblyError(f"INDEXER_REASSEMBLY / reassembly={requested!r} cannot be used: " + "; ".join(reasons))
        return requested
    for mode in supported_modes(caps):
        if not mode_reasons(mode, caps, strategy) and _auto_fits(mode, strategy):
            return mode
    raise AssertionError("padded supports every plan")


def _global(group: object, rank: int) -> int:
    return dist.get_global_rank(group, rank) if group is not None else rank


def _wait(works: Sequence[object]) -> None:
    for w in works:
        if w is not None:
            w.wait()


def reassemble(local: torch.Tensor, plan: RowPlan, rank: int, group: object, mode: str, out: torch.Tensor) -> None:
    """Fill ``out`` with every rank's rows.

    Args:
        local: ``[plan.rows_per_rank[rank], W]`` this rank's rows, in plan order.
        plan: The plan every rank computed.
        rank: This rank's index in ``group``.
        group: Process group (``None``: the default group).
        mode: ``allgatherv``, ``ring`` or ``padded`` (already resolved).
        out: ``[M, W]`` contiguous, same dtype and device as ``local``.
    """
    if plan.num_rows == 0:
        return
    if mode in ("allgatherv", "padded") and _equal_slices_in_rank_order(plan):
        _all_gather_single(out, local.contiguous(), group=group)
        return
    if mode == "allgatherv":
        _allgatherv(local, plan, rank, group, out)
    elif mode == "ring":
        _ring(local, plan, rank, group, out)
    elif mode == "padded":
        _padded(local, plan, rank, group, out)
    elif mode == "maxreduce":
        _maxreduce(local, plan, rank, group, out)
    else:
        raise ReassemblyError(f"unknown reassembly mode {mode!r}; expected one of {'|'.join(MODES)}")


def _rank_slots(plan: RowPlan, out: torch.Tensor, width: int) -> tuple[list[torch.Tensor], list[int]]:
    """Per-rank receive buffers: the rank's rows of ``out`` when they are one range, else a
    temporary to scatter afterwards (whose ranks are listed second)."""
    slots, scatter = [], []
    for r, pieces in enumerate(plan.pieces):
        if len(pieces) == 1:
            a, b = pieces[0]
            slots.append(out[a:b])
        elif not pieces:
            slots.append(out[:0])
        else:
            slots.append(torch.empty(plan.rows_per_rank[r], width, dtype=out.dtype, device=out.device))
            scatter.append(r)
    return slots, scatter


def _scatter(buf: torch.Tensor, pieces: Sequence[tuple[int, int]], out: torch.Tensor) -> None:
    row = 0
    for a, b in pieces:
        out[a:b].copy_(buf[row : row + b - a])
        row += b - a


def _allgatherv(local: torch.Tensor, plan: RowPlan, rank: int, group: object, out: torch.Tensor) -> None:
    slots, scatter = _rank_slots(plan, out, out.shape[1])
    dist.all_gather(slots, local, group=group)
    for r in scatter:
        _scatter(slots[r], plan.pieces[r], out)


def _padded(local: torch.Tensor, plan: RowPlan, rank: int, group: object, out: torch.Tensor) -> None:
    world, width = plan.world_size, out.shape[1]
    most = max(plan.rows_per_rank)
    send = torch.empty(most, width, dtype=out.dtype, device=out.device)
    send[: local.shape[0]].copy_(local)
    recv = torch.empty(world * most, width, dtype=out.dtype, device=out.device)
    _all_gather_single(recv, send, group=group)
    for r in range(world):
        _scatter(recv[r * most :], plan.pieces[r], out)


def _maxreduce(local: torch.Tensor, plan: RowPlan, rank: int, group: object, out: torch.Tensor) -> None:
    out.fill_(-1)
    _scatter(local, plan.pieces[rank], out)
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)


def _equal_slices_in_rank_order(plan: RowPlan) -> bool:
    """Whether rank r owns rows [r*M/tp, (r+1)*M/tp) exactly: then one all_gather of equal
    slices lands every row in place, with no padding and no scatter."""
    per = plan.num_rows // plan.world_size
    return per * plan.world_size == plan.num_rows and all(
        p == ((r * per, (r + 1) * per),) for r, p in enumerate(plan.pieces)
    )


def _ring(local: torch.Tensor, plan: RowPlan, rank: int, group: object, out: torch.Tensor) -> None:
    world, m = plan.world_size, plan.num_rows
    if plan.strategy == "remainder0":
        base, rem = divmod(m, world)
        # ranks own equal `base`-row blocks of [rem, M) in rank order (rank 0: the tail of
        # its piece), plus rank 0's first `rem` rows, broadcast alongside
        block_src = local[rem:] if rank == 0 else local
        equal = (out[rem:], block_src, base)
        extras = [(0, (0, rem), local[:rem] if rank == 0 else None)] if rem else []
    elif plan.strategy == "fold":
        h1 = fold_split(m, world)
        g1 = h1 // world
        equal = (out[:h1], local[:g1], g1)
        # each rank's second-half group, as the plan cut it, broadcast from its owner
        extras = [
            (src, piece, local[g1:] if rank == src else None)
            for src in range(world)
            for piece in plan.pieces[src]
            if piece[0] >= h1
        ]
    else:
        raise ReassemblyError(f"ring exchanges only {'|'.join(RING_STRATEGIES)} plans, not {plan.strategy!r}")

    works = []
    dst, src_rows, per_rank = equal
    if per_rank:
        works.append(_all_gather_single(dst, src_rows.contiguous(), group=group, async_op=True))
    for src, (a, b), mine in extras:
        buf = out[a:b]
        if mine is not None:
            buf.copy_(mine)
        works.append(dist.broadcast(buf, src=_global(group, src), group=group, async_op=True))
    _wait(works)
