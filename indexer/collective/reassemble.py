"""Reassembly: every rank's ``[rows, W]`` slice into the full ``[M, W]`` table on every rank.

Modes (see docs/design.md):

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


def _equal_slices_in_rank_order(plan: RowPlan) -> bool:
    """Whether rank r owns rows [r*M/tp, (r+1)*M/tp) exactly: then one all_gather of equal
    slices lands every row in place, with no padding and no scatter."""
    per = plan.num_rows // plan.world_size
    return per * plan.world_size == plan.num_rows and all(
        p == ((r * per, (r + 1) * per),) for r, p in enumerate(plan.pieces)
    )


GATHER_MODES = ("allgatherv", "ring", "padded")
"""Modes that move rows without combining them: they can move 16-bit indices."""
WAVE_MODES = ("allgatherv", "padded")
"""Modes that can exchange any subset of rows, so a step's rows can go in waves (``ring``
follows its strategy's whole-table layout; ``maxreduce`` reduces the whole table)."""
NARROW_MAX_WINDOW = 65535
"""Widest row window whose indices (at most 65534) and -1 padding fit 16 bits."""
NARROW_AUTO_WINDOW = 32768
"""Widest row window ``auto`` exchanges as 16 bits: its indices (at most 32767) widen back by
one sign-extending copy. Wider windows need a mask pass besides, which on an H200 cost more
(0.25 ms at 16K rows x 2048, 1.0 ms at 64K rows) than the whole 32-bit exchange measured on
2x H200 (0.30 and 1.07 ms); docs/benchmarks.md, "Exchange"."""


def exchange_bits(requested: str, mode: str, max_window: int) -> int:
    """Index width the exchange moves (``requested``: ``auto``, ``16`` or ``32``).

    ``auto``: 16 where every row's window has at most :data:`NARROW_AUTO_WINDOW` keys and
    ``mode`` gathers, else 32. ``16``: where every window has at most
    :data:`NARROW_MAX_WINDOW` keys and ``mode`` gathers.

    Raises:
        ReassemblyError: ``16`` forced where it cannot hold the indices or the mode reduces.
    """
    if requested == "32":
        return 32
    gathers = mode in GATHER_MODES
    if requested == "16":
        if max_window <= NARROW_MAX_WINDOW and gathers:
            return 16
        why = (f"a row's window holds {max_window} keys, more than {NARROW_MAX_WINDOW}"
               if max_window > NARROW_MAX_WINDOW else f"{mode} reduces the table (a max over int32)")
        raise ReassemblyError(f"INDEXER_EXCHANGE_BITS / exchange_bits='16' cannot be used: {why}")
    return 16 if max_window <= NARROW_AUTO_WINDOW and gathers else 32


class Exchange:
    """One rank's reassembly of one plan, prepared once and run every layer.

    Each rank computes its rows straight into their places in the ``[M, W]`` output; the
    exchange then fills in the other ranks' rows. Where the layout allows (one piece per
    rank for ``allgatherv``; ``ring``; ``maxreduce``) the collectives read and write the
    output itself; otherwise the temporaries (packed slices, padded buffers) are allocated
    here, at plan time, never per run.

    Args:
        plan: The plan every rank computed.
        rank: This rank's index in ``group``.
        group: Process group (``None``: the default group).
        mode: ``allgatherv``, ``ring``, ``padded`` or ``maxreduce`` (already resolved).
        width: Columns ``W`` of the table (topk).
        dtype, device: Of the table.
    """

    def __init__(self, plan: RowPlan, rank: int, group: object, mode: str, width: int, dtype: torch.dtype,
                 device: torch.device):
        if mode not in MODES:
            raise ReassemblyError(f"unknown reassembly mode {mode!r}; expected one of {'|'.join(MODES)}")
        if mode == "ring" and plan.strategy not in RING_STRATEGIES:
            raise ReassemblyError(f"ring exchanges only {'|'.join(RING_STRATEGIES)} plans, not {plan.strategy!r}")
        self.plan, self.rank, self.group, self.mode = plan, rank, group, mode
        self.equal = mode in ("allgatherv", "padded") and _equal_slices_in_rank_order(plan)
        mine = plan.pieces[rank]
        rows = plan.rows_per_rank
        new = lambda r: torch.empty(r, width, dtype=dtype, device=device)  # noqa: E731
        self.send = self.recv = None
        self.slots: dict[int, torch.Tensor] = {}
        self.mine = mine
        self._pending: list[_Pending] = []
        # a wave of a step (partition.waves) may hold no rows at all: nothing to exchange
        self.idle = sum(rows) == 0
        if self.idle or self.equal:
            return
        if mode == "allgatherv":
            # ranks of several pieces gather through a packed slot (their own: packed first)
            self.slots = {r: new(rows[r]) for r, p in enumerate(plan.pieces) if len(p) > 1}
        elif mode == "padded":
            most = max(rows)
            self.send = new(most)
            self.recv = new(plan.world_size * most)

    def before(self, out: torch.Tensor) -> None:
        """Before this rank computes into ``out``: ``maxreduce`` starts from ``-1`` (below
        every valid index) in the rows other ranks fill."""
        if self.mode == "maxreduce" and self.plan.num_rows and not self.equal:
            out.fill_(-1)

    def __call__(self, out: torch.Tensor) -> None:
        """Fill ``out`` (contiguous ``[M, W]``, this rank's rows already in place) with
        every other rank's rows."""
        self.start(out)
        self.finish(out)

    def start(self, out: torch.Tensor) -> None:
        """Issue the exchange of ``out`` (this rank's rows of it in place) without waiting:
        the collectives run as async work (on NCCL, ordered after the work already queued on
        the current stream), so the caller can queue more work before :meth:`finish`."""
        if self.idle:
            return
        if self.equal:
            per = self.plan.num_rows // self.plan.world_size
            work = _all_gather_single(out, out[self.rank * per : (self.rank + 1) * per], group=self.group,
                                      async_op=True)
            self._pending.append(_Pending([work]))
        elif self.mode == "allgatherv":
            self._pending.append(self._allgatherv(out))
        elif self.mode == "ring":
            self._pending.append(self._ring(out))
        elif self.mode == "padded":
            self._pending.append(self._padded(out))
        else:
            self._pending.append(_Pending([dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.group,
                                                           async_op=True)]))

    def finish(self, out: torch.Tensor) -> None:
        """Wait for what :meth:`start` issued (on NCCL: the current stream waits, the host
        does not) and place rows that arrived packed."""
        pending, self._pending = self._pending, []
        for p in pending:
            p.wait()

    def _allgatherv(self, out: torch.Tensor) -> "_Pending":
        plan = self.plan
        slots = [self.slots.get(r, out[p[0][0] : p[0][1]] if p else out[:0]) for r, p in enumerate(plan.pieces)]
        local = slots[self.rank]
        if self.rank in self.slots:
            _gather_pieces(out, self.mine, local)
        work = dist.all_gather(slots, local, group=self.group, async_op=True)

        def place() -> None:
            for r, buf in self.slots.items():
                if r != self.rank:
                    _scatter(buf, plan.pieces[r], out)

        return _Pending([work], place)

    def _padded(self, out: torch.Tensor) -> "_Pending":
        plan, world = self.plan, self.plan.world_size
        most = self.send.shape[0]
        _gather_pieces(out, self.mine, self.send)
        work = _all_gather_single(self.recv, self.send, group=self.group, async_op=True)

        def place() -> None:
            for r in range(world):
                if r != self.rank:
                    _scatter(self.recv[r * most :], plan.pieces[r], out)

        return _Pending([work], place)

    def _ring(self, out: torch.Tensor) -> "_Pending":
        plan, rank, world, m, group = self.plan, self.rank, self.plan.world_size, self.plan.num_rows, self.group
        if plan.strategy == "remainder0":
            base, rem = divmod(m, world)
            # ranks own equal `base`-row blocks of [rem, M) in rank order (rank 0: the tail
            # of its piece), plus rank 0's first `rem` rows, broadcast alongside
            equal = (out[rem:], out[rem + rank * base : rem + (rank + 1) * base], base)
            extras = [(0, (0, rem))] if rem else []
        else:  # fold
            h1 = fold_split(m, world)
            g1 = h1 // world
            equal = (out[:h1], out[rank * g1 : (rank + 1) * g1], g1)
            # each rank's second-half group, as the plan cut it, broadcast from its owner
            extras = [(src, piece) for src in range(world) for piece in plan.pieces[src] if piece[0] >= h1]
        works = []
        dst, src_rows, per_rank = equal
        if per_rank:
            works.append(_all_gather_single(dst, src_rows, group=group, async_op=True))
        for src, (a, b) in extras:
            works.append(dist.broadcast(out[a:b], src=_global(group, src), group=group, async_op=True))
        return _Pending(works)


class _Pending:
    """Async collectives of one exchange and what to do once they are done."""

    __slots__ = ("works", "then")

    def __init__(self, works: Sequence[object], then=None):
        self.works, self.then = works, then

    def wait(self) -> None:
        _wait(self.works)
        if self.then is not None:
            self.then()


class WaveExchange:
    """A step's exchange in waves: one :class:`Exchange` per wave (``waves``: one row plan
    each, :func:`indexer.partition.waves.wave_plans`; ``None``: the whole plan, one wave).
    ``start(out, w)`` issues wave ``w``'s collectives once its rows are computed;
    ``finish(out)`` waits for them all.

    Args:
        As :class:`Exchange`'s, with
        waves: The wave plans (their pieces together are ``plan``'s); several only for the
            modes of :data:`WAVE_MODES`.
    """

    def __init__(self, plan: RowPlan, rank: int, group: object, mode: str, width: int, dtype: torch.dtype,
                 device: torch.device, waves: Sequence[RowPlan] | None = None):
        waves = tuple(waves) if waves else (plan,)
        if len(waves) > 1 and mode not in WAVE_MODES:
            raise ReassemblyError(f"an exchange in waves needs one of {'|'.join(WAVE_MODES)}, not {mode!r}")
        self.plan, self.rank, self.mode, self.waves = plan, rank, mode, waves
        self.parts = [Exchange(w, rank, group, mode, width, dtype, device) for w in waves]
        self.num_waves = len(self.parts)

    def before(self, out: torch.Tensor) -> None:
        """Before this rank computes into ``out`` (``maxreduce``'s prefill, one wave)."""
        for part in self.parts:
            part.before(out)

    def start(self, out: torch.Tensor, wave: int) -> None:
        self.parts[wave].start(out)

    def finish(self, out: torch.Tensor) -> None:
        for part in self.parts:
            part.finish(out)

    def __call__(self, out: torch.Tensor) -> None:
        for w in range(self.num_waves):
            self.start(out, w)
        self.finish(out)


class NarrowExchange:
    """:class:`Exchange` of 16-bit indices into an int32 table: half the bytes on the wire.

    This rank's rows are narrowed into a 16-bit copy of the table (index ``i`` as its low 16
    bits, ``-1`` as ``0xFFFF``), the copy is exchanged as bytes, two a column (NCCL has no
    int16; gathers and broadcasts move the bytes unchanged) and widened back into the table.
    Exact where every index is at most 65534 (:func:`exchange_bits`). Where every index is at
    most 32767 (``max_window <= 32768``) the widening is one sign-extending copy; above, the
    copy is followed by a mask to 16 bits and ``0xFFFF`` back to ``-1``. The 16-bit table and
    the mask are allocated here, at plan time. ``max_window``: the widest window it carries
    exactly (:data:`NARROW_AUTO_WINDOW` without the mask, else :data:`NARROW_MAX_WINDOW`).

    Args:
        As :class:`Exchange`'s, with ``mode`` one of :data:`GATHER_MODES`, and
        max_window: The widest row window of the plan (keys).
        waves: As :class:`WaveExchange`'s.
    """

    def __init__(self, plan: RowPlan, rank: int, group: object, mode: str, width: int, device: torch.device,
                 max_window: int = NARROW_MAX_WINDOW, waves: Sequence[RowPlan] | None = None):
        if mode not in GATHER_MODES:
            raise ReassemblyError(f"16-bit exchange needs one of {'|'.join(GATHER_MODES)}, not {mode!r}")
        # as bytes, two a column: NCCL has no int16, and as float16 the -1 padding (0xFFFF)
        # and indices 31745-32767 are NaNs, which TORCH_NCCL_NAN_CHECK=1 refuses
        self.inner = WaveExchange(plan, rank, group, mode, 2 * width, torch.uint8, device, waves)
        self.num_waves = self.inner.num_waves
        self.plan, self.rank, self.mode = plan, rank, mode
        self.table = torch.empty(plan.num_rows, width, dtype=torch.int16, device=device)
        self.mask = None
        self.max_window = NARROW_AUTO_WINDOW
        if max_window > NARROW_AUTO_WINDOW:  # indices of 32768 and up arrive sign-extended
            self.mask = torch.empty(plan.num_rows, width, dtype=torch.bool, device=device)
            self.max_window = NARROW_MAX_WINDOW

    def before(self, out: torch.Tensor) -> None:
        """Nothing: gathers need no prefill."""

    def __call__(self, out: torch.Tensor) -> None:
        """Fill ``out`` (contiguous int32 ``[M, W]``, this rank's rows in place) with every
        other rank's rows."""
        for w in range(self.num_waves):
            self.start(out, w)
        self.finish(out)

    def start(self, out: torch.Tensor, wave: int) -> None:
        """Narrow this rank's rows of wave ``wave`` and issue their exchange (async)."""
        for a, b in self.inner.waves[wave].pieces[self.rank]:
            self.table[a:b].copy_(out[a:b])  # int32 -> int16 keeps the low 16 bits
        self.inner.start(self.table.view(torch.uint8), wave)

    def finish(self, out: torch.Tensor) -> None:
        """Wait for every wave, then widen the table into ``out``."""
        self.inner.finish(self.table.view(torch.uint8))
        if self.plan.num_rows == 0:
            return
        out.copy_(self.table)  # sign-extends: -1 and 0..32767 arrive as they left
        if self.mask is not None:
            out.bitwise_and_(0xFFFF)  # i >= 32768 arrived as i - 65536, -1 as -1
            torch.eq(out, 0xFFFF, out=self.mask)
            out.masked_fill_(self.mask, -1)


def make_exchange(plan: RowPlan, rank: int, group: object, mode: str, width: int, device: torch.device,
                  bits: int = 32, max_window: int = NARROW_MAX_WINDOW,
                  waves: Sequence[RowPlan] | None = None) -> "WaveExchange | NarrowExchange":
    """The exchange of an int32 ``[M, width]`` table, moving ``bits``-wide indices
    (``max_window``: the plan's widest row window, for 16 bits), in ``waves`` (the wave
    plans, :func:`indexer.partition.waves.wave_plans`; ``None`` or one: a single exchange).

    Every one has ``num_waves`` and ``before(out)``, ``start(out, wave)``, ``finish(out)``
    and ``__call__(out)`` (every wave, then finish)."""
    if bits == 16:
        return NarrowExchange(plan, rank, group, mode, width, device, max_window, waves)
    return WaveExchange(plan, rank, group, mode, width, torch.int32, device, waves)


def _wait(works: Sequence[object]) -> None:
    for w in works:
        if w is not None:
            w.wait()


def _gather_pieces(out: torch.Tensor, pieces: Sequence[tuple[int, int]], buf: torch.Tensor) -> None:
    row = 0
    for a, b in pieces:
        buf[row : row + b - a].copy_(out[a:b])
        row += b - a


def _scatter(buf: torch.Tensor, pieces: Sequence[tuple[int, int]], out: torch.Tensor) -> None:
    row = 0
    for a, b in pieces:
        out[a:b].copy_(buf[row : row + b - a])
        row += b - a


def reassemble(local: torch.Tensor, plan: RowPlan, rank: int, group: object, mode: str, out: torch.Tensor) -> None:
    """Fill ``out`` with every rank's rows, from this rank's rows packed in ``local`` (a
    one-off :class:`Exchange`).

    Args:
        local: ``[plan.rows_per_rank[rank], W]`` this rank's rows, in plan order.
        out: ``[M, W]`` contiguous, same dtype and device as ``local``.
    """
    ex = Exchange(plan, rank, group, mode, out.shape[1], out.dtype, out.device)
    ex.before(out)
    _scatter(local, plan.pieces[rank], out)
    ex(out)
