"""Plan once per forward step, run every layer: :func:`plan` and :class:`StepPlan`.

An engine calls the indexer once per layer with the same row bounds for every layer of a
step. :func:`plan` does, once, everything that depends only on the bounds, the shapes, the
settings and the group: it reads the settings, picks the backend, checks the bounds, gates
and plans the row split, probes the group, cuts this rank's rows into chunks, makes their
device index tensors and the top-k's launch arguments, and allocates every buffer.
:meth:`StepPlan.run` then checks the layer's tensors on the host in O(1) and launches the
kernels and the exchange: no device sync, no env read, no allocation (with ``out`` given)
beyond what a vendor kernel allocates itself, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import envs
from .backends import choose_backend
from .backends.base import chunk_bounds, fill_index, plan_chunks, prepare_chunks, run_chunks
from .collective import (
    RING_STRATEGIES,
    GroupCaps,
    WAVE_MODES,
    ReassemblyError,
    agreed_cost_model,
    agreed_time_model,
    check_consistency,
    choose_mode,
    exchange_bits as choose_exchange_bits,
    fingerprint,
    make_exchange,
    mode_reasons,
    probe_group,
)
from .partition import (DEFAULT_STRIPE_ROWS, RowPlan, chunk_cuts, even_cuts, model_gate, plan_candidates, split_rows,
                        wave_plans)
from .partition.waves import AUTO_MAX_WAVES
from .platform import platform_for_device
from .problem import LayerInputs, Problem, check_bounds, check_inputs, check_out, check_values, make_problem

log = logging.getLogger("indexer")


@dataclass
class StepInfo:
    """What a step plan decided (and, for a timed call, how long its parts took).

    Attributes:
        backend: Backend that computes the logits and top-k.
        sharded: Whether rows are split across the group (else every row computed here).
        world_size: Ranks in the group (1 without a group).
        rank: This rank.
        plan: The row plan (``None`` when not sharded).
        reassembly: Exchange mode (``None`` when not sharded).
        exchange_bits: Width of the indices the exchange moves, 16 or 32 (``None`` when not
            sharded).
        waves: Waves the exchange goes in: each wave's rows are exchanged while the next
            computes (``None`` when not sharded; 1: one exchange after every row).
        reason: Why the step is or is not sharded.
        gate: Which rule decided whether to shard: the calibrated times (with the two
            predicted step times) or the row count (and why not the times).
        notes: What the backend does differently for this problem (e.g. head padding).
        backend_reason: Why this backend: forced (by the ``backend`` argument or
            ``INDEXER_BACKEND`` / its platform's variable, named), or the first of the
            platform's priority list that runs the problem, with the reasons of each one
            skipped before it.
        chunks: Chunks this rank computes.
        compressed_chunks: How many of them are compressed (a chunk spanning requests).
        compute_ms: Time to compute this rank's rows (only with ``timing=True``).
        wait_ms: Time this rank then waited for the slowest rank (only with ``timing=True``).
        exchange_ms: Time of the reassembly alone, what is left of it after the last wave
            computed (all of it with one wave; only with ``timing=True``).
    """

    backend: str
    sharded: bool
    world_size: int
    rank: int
    plan: RowPlan | None = None
    reassembly: str | None = None
    exchange_bits: int | None = None
    waves: int | None = None
    reason: str = ""
    gate: str = ""
    notes: tuple[str, ...] = ()
    backend_reason: str = ""
    chunks: int = 0
    compressed_chunks: int = 0
    compute_ms: float | None = None
    wait_ms: float | None = None
    exchange_ms: float | None = None


def plan(
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    *,
    num_keys: int,
    heads: int,
    head_dim: int,
    topk: int,
    group: object | None = None,
    device: torch.device | str | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    backend: str | None = None,
    strategy: str | None = None,
    reassembly: str | None = None,
    max_logits_mb: float | None = None,
    tp_shard: bool | None = None,
    min_rows_per_rank: int | None = None,
    check_values: str | None = None,
    exchange_bits: str | None = None,
    exchange_waves: str | int | None = None,
) -> "StepPlan":
    """Plan one forward step's indexer top-k; run it every layer with :meth:`StepPlan.run`.

    With a tensor-parallel ``group``, every rank plans the same bounds (collectively: the
    first plan on a group probes it and agrees on the cost model); each then computes only
    its rows and all ranks return the identical full table.

    Args:
        row_starts: int ``[M]`` (int32 or int64), first key of each row's window. Host
            tensors (as engines keep them) make planning sync-free; device tensors cost one
            copy to the host here. Device int32 contiguous bounds are used in place (see
            :meth:`StepPlan.update_bounds`).
        row_ends: int ``[M]``, one past each row's last key; ``row_starts <= row_ends <=
            num_keys``.
        num_keys: ``N``, keys in the step's packed key buffer ``k``.
        heads, head_dim: ``H`` and ``D`` of ``q``.
        topk: Keys kept per row (2048 in DeepSeek-V3.2).
        group: Tensor-parallel process group; ``None`` computes every row here.
        device: Device of the layers' tensors (default: the bounds' device).
        fp8_dtype: dtype of ``q`` and ``k``.
        backend: ``auto`` or a backend name to force (default ``INDEXER_BACKEND``).
        strategy: ``auto|contiguous|remainder0|fold|balanced|striped`` (default
            ``INDEXER_TP_SHARD_STRATEGY``; stripe size ``INDEXER_TP_SHARD_STRIPE_ROWS``).
        reassembly: ``auto|allgatherv|ring|padded|maxreduce`` (default ``INDEXER_REASSEMBLY``).
        max_logits_mb: Working-set budget in MiB (default ``INDEXER_MAX_LOGITS_MB``).
        tp_shard: Split rows across ``group`` (default ``INDEXER_TP_SHARD``).
        min_rows_per_rank: Shard only when ``M >= min_rows_per_rank * world_size``
            (default ``INDEXER_TP_SHARD_MIN_ROWS``, per platform).
        check_values: ``off|async|sync``: each run checks that ``k_scale`` (where a row
            reads it) and ``weights`` are finite (default ``INDEXER_CHECK_VALUES``, off).
        exchange_bits: ``auto|16|32``: width of the indices the ranks exchange; ``auto``
            takes 16 where every window has at most 32768 keys and the reassembly gathers,
            ``16`` up to 65535 keys (default ``INDEXER_EXCHANGE_BITS``).
        exchange_waves: ``auto`` or an int >= 1: a sharded step's rows go in this many
            waves, each wave's rows exchanged while the next computes; ``auto`` takes as many
            as the rank with the fewest chunks has chunks, 1 exchanges once after every row
            (default ``INDEXER_EXCHANGE_WAVES``; only allgatherv and padded go in waves).

    The plan's logits workspace and top-k scratch are the device's, shared with the other
    plans made while the same CUDA stream was current: runs of those plans must not overlap
    (one stream, or ordered). For plans run concurrently on several streams, make each
    while its stream is current.

    Returns:
        The :class:`StepPlan`.

    Raises:
        TypeError, ValueError: Bad bounds, shape or setting, named.
        BackendUnavailableError: The forced backend (or every backend) cannot run.
        ReassemblyError: A forced reassembly cannot exchange the plan on this group.
        InconsistentRanksError: With ``INDEXER_CHECK_CONSISTENCY=1``, ranks disagree.
    """
    problem = make_problem(row_starts, row_ends, num_keys=num_keys, heads=heads, head_dim=head_dim, topk=topk,
                           fp8_dtype=fp8_dtype, device=device)
    return StepPlan(problem, group=group, backend=backend, strategy=strategy, reassembly=reassembly,
                    max_logits_mb=max_logits_mb, tp_shard=tp_shard, min_rows_per_rank=min_rows_per_rank,
                    check_values=check_values, exchange_bits=exchange_bits, exchange_waves=exchange_waves)


class StepPlan:
    """One step's indexer plan (made by :func:`plan`): run it every layer.

    Attributes:
        problem: The step's shapes and row bounds.
        backend: The backend object.
        info: What was decided (:class:`StepInfo`); ``str(plan)`` prints it.
        chunks: This rank's chunks (rows, key range, layout).
    """

    def __init__(self, problem: Problem, *, group: object | None = None, backend: str | None = None,
                 strategy: str | None = None, reassembly: str | None = None, max_logits_mb: float | None = None,
                 tp_shard: bool | None = None, min_rows_per_rank: int | None = None,
                 check_values: str | None = None, exchange_bits: str | None = None,
                 exchange_waves: str | int | None = None):
        envs.check_environment()  # every INDEXER_* variable, before anything runs (cached)
        self.problem = problem
        # update_bounds has run: value checks then read every key of the planned windows'
        # span (a row's window may have moved into a gap between them)
        self._bounds_updated = False
        platform = platform_for_device(problem.device)
        key = platform.key
        requested = envs.resolve("BACKEND", key, backend)
        forced_by = "the backend argument" if requested.source == "argument" else requested.source.removeprefix("env ")
        chosen, backend_reason = choose_backend(problem, platform, requested.value, forced_by)
        budget = int(envs.value("MAX_LOGITS_MB", key, max_logits_mb) * 2**20)
        strategy_req = envs.value("TP_SHARD_STRATEGY", key, strategy)
        reassembly_req = envs.value("REASSEMBLY", key, reassembly)
        shard_on = envs.value("TP_SHARD", key, tp_shard)
        min_rows_set = envs.resolve("TP_SHARD_MIN_ROWS", key, min_rows_per_rank)
        min_rows = min_rows_set.value
        stripe = envs.value("TP_SHARD_STRIPE_ROWS", key)
        bits_req = envs.value("EXCHANGE_BITS", key, exchange_bits)
        waves_req = envs.value("EXCHANGE_WAVES", key, exchange_waves)
        self.check = envs.value("CHECK_VALUES", key, check_values)
        consistency = envs.value("CHECK_CONSISTENCY", key)

        world, rank = 1, 0
        if group is not None:
            if not dist.is_available() or not dist.is_initialized():
                raise ValueError("group was given but torch.distributed is not initialised")
            world, rank = dist.get_world_size(group), dist.get_rank(group)
        m = problem.num_rows
        info = StepInfo(chosen.name, False, world, rank, notes=tuple(chosen.notes(problem)),
                        backend_reason=backend_reason)
        shard = world > 1 and shard_on and m >= min_rows * world
        # the gate: the calibrated times where rank 0 has them, unless the row count was set
        by_model = world > 1 and shard_on and m > 0 and not min_rows_set.is_set
        if consistency and world > 1:
            # before anything that only sharding ranks do, so disagreeing ranks raise, not hang
            digest = fingerprint(
                problem.shape_key(), str(problem.fp8_dtype), chosen.name, shard, by_model, strategy_req,
                reassembly_req, stripe, bits_req, waves_req, budget, tensors=(problem.starts_host, problem.ends_host),
            )
            check_consistency(
                digest, group, problem.device,
                "(M, N, H, D, topk, dtype, backend, row bounds, whether to shard, the gate's rule, strategy, "
                "reassembly, stripe rows, exchange bits, exchange waves, logits budget)",
            )
        row_plan = None
        times, no_times = None, ""
        if world > 1 and shard_on and m > 0:
            # every rank of a sharding-enabled group agrees on rank 0's times (a collective, once
            # per group), whichever rule its own settings pick, so no rank skips it
            times, no_times = agreed_time_model(group, problem.device, chosen, platform.arch)
        if not by_model:
            times, no_times = None, f"min_rows_per_rank set ({min_rows_set.source})"
        if world == 1:
            info.reason = "no tensor-parallel group"
        elif not shard_on:
            info.reason = "sharding disabled (INDEXER_TP_SHARD / tp_shard)"
        elif times is None and not shard:
            info.gate = f"row count ({no_times})" if m else "no rows"
            info.reason = f"M={m} < min_rows_per_rank {min_rows} x tp {world}: replicated"
        else:
            caps = probe_group(group, problem.device)
            model = agreed_cost_model(group, problem.device, chosen, platform.arch)
            row_plan, mode = choose_plan(problem, model, caps, strategy_req, reassembly_req, stripe)
            widest = int((problem.ends_host - problem.starts_host).max()) if m else 0
            try:
                info.exchange_bits, refused = choose_exchange_bits(bits_req, mode, widest), None
            except ReassemblyError as exc:  # raised only if the step shards: a forced width
                info.exchange_bits, refused = 32, exc
            if times is not None:
                decision = model_gate(times, problem.starts_host.to(torch.int64), problem.ends_host.to(torch.int64),
                                      row_plan.pieces, problem.topk, info.exchange_bits)
                info.gate = decision.describe()
            else:
                info.gate = f"row count: M={m} >= min_rows_per_rank {min_rows} x tp {world} ({no_times})"
            if times is not None and not decision.shard:
                row_plan, info.exchange_bits = None, None
                info.reason = f"replicated by the {info.gate}"
            elif refused is not None:
                raise refused
            else:
                info.sharded, info.plan, info.reassembly = True, row_plan, mode
                info.reason = f"sharded: {row_plan.describe()}, reassembly {mode} ({info.exchange_bits}-bit indices"
        # self.chunks[self.wave_ends[w - 1]:self.wave_ends[w]] compute wave w
        waves = None
        if info.sharded:
            waves, self.chunks, self.wave_ends = _plan_waves(chosen, problem, row_plan, rank, budget, waves_req,
                                                              info.reassembly)
            info.waves = len(self.wave_ends)
            info.reason += f", {info.waves} wave(s))"
            if times is not None:
                info.reason += f"; {info.gate}"
        else:
            self.chunks = plan_chunks(chosen, problem, [(0, m)], budget)
            self.wave_ends = [len(self.chunks)]
        self.workspace, self.scratch = prepare_chunks(chosen, problem, self.chunks, budget)
        info.chunks = len(self.chunks)
        info.compressed_chunks = sum(c.compressed for c in self.chunks)
        self.exchange = None
        self.result = None
        # the exchange (and a backend that writes rows at a fixed stride) needs a contiguous
        # table: an `out` that is not gets a copy of the plan's own (made at the first such run)
        self.contiguous = row_plan is not None or not chosen.strided_out
        if row_plan is not None:
            self.exchange = make_exchange(row_plan, rank, group, info.reassembly, problem.topk, problem.device,
                                          info.exchange_bits, widest, waves)
        self.backend, self.info, self.group = chosen, info, group
        log.debug("indexer plan M=%d N=%d: %s", m, problem.num_keys, self)

    def run(self, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """The step's top-k table for one layer.

        Args:
            q: fp8 ``[M, H, D]`` (the plan's dtype; fold any q scale into ``weights``).
            k: Same dtype, ``[N, D]``.
            k_scale: float32 ``[N]`` (or ``[N, 1]``).
            weights: float32 ``[M, H]``.
            out: Optional int32 ``[M, topk]``, column stride 1 and any row stride (a view
                like ``buf[:, :topk]`` of a wider buffer), filled and returned; untouched if
                a check fails. Without it each run allocates its result.

        Returns:
            int32 ``[M, topk]``: per row the indices of its ``topk`` largest logits,
            relative to its window start, unordered, ``-1`` padded.

        Raises:
            TypeError, ValueError: A tensor that does not match the plan, before any kernel.
        """
        inputs = check_inputs(self.problem, q, k, k_scale, weights)
        if out is not None:
            out = check_out(self.problem, out)
        return self._run(inputs, out)

    __call__ = run

    def _run(self, inputs: LayerInputs, out: torch.Tensor | None, clock: "_Clock | None" = None) -> torch.Tensor:
        problem = self.problem
        check_values(problem, inputs, self.check, gaps=not self._bounds_updated)
        if out is None:
            out = torch.empty(problem.num_rows, problem.topk, dtype=torch.int32, device=problem.device)
        ex = self.exchange
        table = out
        if self.contiguous and not out.is_contiguous():
            if self.result is None:
                self.result = torch.empty(problem.num_rows, problem.topk, dtype=torch.int32, device=problem.device)
            table = self.result
        if ex is not None:
            ex.before(table)
        begin = 0
        for w, end in enumerate(self.wave_ends):
            run_chunks(self.backend, problem, inputs, self.chunks[begin:end], table)
            if ex is not None:
                ex.start(table, w)  # async: the next wave computes meanwhile
            begin = end
        if clock is not None:
            self.info.compute_ms = clock.lap()
        if ex is not None:
            if clock is not None:  # so exchange_ms is the exchange left to wait for, not the slower ranks
                dist.barrier(group=self.group)
                self.info.wait_ms = clock.lap()
            ex.finish(table)
            if clock is not None:
                self.info.exchange_ms = clock.lap()
        if table is not out:
            out.copy_(table)
        return out

    def update_bounds(self, row_starts: torch.Tensor | None = None, row_ends: torch.Tensor | None = None) -> None:
        """Refresh the chunks' device index tensors from new row bounds: device work only
        (no sync), so it may sit in a CUDA graph, once per step.

        Give new bounds (int ``[M]``, copied into the plan's device bounds; host tensors
        should be pinned for the copy not to wait), or none after copying them yourself
        into the device int32 tensors the plan was made with (it uses those in place). The
        new windows must fit the planned ones: each row's window inside the key range of
        its chunk (``plan.chunks``), no wider than the plan's widest window where it exchanges
        16-bit indices (``plan.info.exchange_bits``; host bounds are checked for it) and, for a
        compressed chunk, no longer than its width
        (device bounds cannot be checked without a sync: a window past its chunk's keys is
        clipped to them, so only that row's answer is wrong). Host bounds are checked
        (``0 <= row_starts <= row_ends <= N``, and the 16-bit width) before anything is
        copied; one side given alone is checked against ``[0, N]`` only (the other side may
        have been written in place).
        Plan a size bucket with every row at its widest window to reuse it across steps.
        The row split stays the planned one (any split gives the same sets), and value checks
        then look at every key from the planned windows' least start to their largest end
        (a window may have moved into a gap between them).
        """
        p = self.problem
        new = (("row_starts", row_starts, p.row_starts), ("row_ends", row_ends, p.row_ends))
        # every check before anything is copied: a refused call leaves the plan (and bounds
        # it uses in place) as they were
        for name, src, _ in new:
            if src is None:
                continue
            if (not isinstance(src, torch.Tensor) or tuple(src.shape) != (p.num_rows,) or src.dtype.is_floating_point
                    or src.dtype.is_complex or src.dtype == torch.bool):
                raise ValueError(f"{name} must be an int tensor of shape [{p.num_rows}], got {src!r:.80}")
            if src.device.type != "cpu" and src.device != p.device:
                raise ValueError(f"{name} is on {src.device}: give the bounds on the host or on {p.device}")
        # host sides (free to check); the other side's current values are unknown here (the
        # caller may have written it in place, or a graph replayed a copy), so a side given
        # alone is checked against [0, N] only
        starts, ends = (src.to(torch.int64) if src is not None and src.device.type == "cpu" else None
                        for src in (row_starts, row_ends))
        if starts is not None or ends is not None:
            check_bounds(starts if starts is not None else torch.zeros(p.num_rows, dtype=torch.int64),
                         ends if ends is not None else torch.full((p.num_rows,), p.num_keys, dtype=torch.int64),
                         p.num_keys)
        if starts is not None and ends is not None:
            widest = int((ends - starts).max()) if p.num_rows else 0
            carries = getattr(self.exchange, "max_window", None)  # a 16-bit exchange's exact limit
            if carries is not None and widest > carries:
                raise ValueError(f"row_ends - row_starts reaches {widest} keys: this plan exchanges 16-bit indices, "
                                 f"planned for windows of at most {carries} keys (plan with the widest "
                                 "windows, or exchange_bits='32')")
        for _, src, dst in new:
            if src is not None:
                dst.copy_(src, non_blocking=True)
        self._bounds_updated = True
        for c in self.chunks:
            if not c.empty:
                fill_index(p, c)
                c.lengths_host = None  # stale: the torch top-k then selects every row

    def __str__(self) -> str:
        i, p = self.info, self.problem
        parts = [f"indexer plan: M={p.num_rows} N={p.num_keys} H={p.num_heads} D={p.head_dim} topk={p.topk} "
                 f"on {p.device}", f"backend {i.backend}" + (f" ({i.backend_reason})" if i.backend_reason else "")]
        if i.notes:
            parts.append("; ".join(i.notes))
        parts.append(f"rank {i.rank}/{i.world_size}: {i.reason}")
        if i.gate and i.gate not in i.reason:
            parts.append(f"gate: {i.gate}")
        widths = [c.width for c in self.chunks]
        parts.append(f"{i.chunks} chunk(s) ({i.compressed_chunks} compressed), widths "
                     f"{min(widths, default=0)}-{max(widths, default=0)}")
        kinds: dict[str, int] = {}
        notes = set()
        for c in self.chunks:
            if "topk_kind" in c.state:
                kinds[c.state["topk_kind"]] = kinds.get(c.state["topk_kind"], 0) + 1
            if "topk_note" in c.state:
                notes.add(c.state["topk_note"])
        if kinds:
            parts.append("top-k " + " + ".join(f"{k} x{v}" for k, v in kinds.items())
                         + "".join(f" ({n})" for n in sorted(notes)))
        if self.check != "off":
            parts.append(f"value checks {self.check}")
        return ", ".join(parts)

    __repr__ = __str__


def _plan_waves(backend, problem: Problem, row_plan: RowPlan, rank: int, budget: int, requested: str | int,
                mode: str) -> tuple[list[RowPlan] | None, list, list[int]]:
    """The waves of a sharded step: ``(wave plans or None for one wave, this rank's chunks,
    the index in them where each wave's chunks end)``.

    Every rank computes every rank's waves from the same plan and settings. ``auto``: as many
    waves as the rank with the fewest chunks has chunks, at most
    :data:`~indexer.partition.waves.AUTO_MAX_WAVES`, each rank's chunks grouped evenly into
    them, so waves never add chunks. An int ``k``: every rank's rows cut into ``k`` waves of
    about equal rows, at most as many as the rank with the fewest rows has rows, chunked
    within each wave.
    """
    world, pieces = row_plan.world_size, [row_plan.rank_rows(r) for r in range(row_plan.world_size)]
    if mode not in WAVE_MODES or requested == 1 or (requested != "auto" and min(row_plan.rows_per_rank) < 2):
        chunks = plan_chunks(backend, problem, pieces[rank], budget)
        return None, chunks, [len(chunks)]
    if requested == "auto":
        chunks = plan_chunks(backend, problem, pieces[rank], budget)
        # every rank's chunk rows (host work only; this rank's from its own chunks)
        per_rank = [[c.rows for c in chunks] if r == rank else
                    [rows for rows, _, _ in chunk_bounds(backend, problem, pieces[r], budget)] for r in range(world)]
        waves = min(AUTO_MAX_WAVES, *(len(c) for c in per_rank))
        if waves <= 1:
            return None, chunks, [len(chunks)]
        groups = [split_rows(pieces[r], chunk_cuts(per_rank[r], waves)) for r in range(world)]
        ends = [(w + 1) * len(chunks) // waves for w in range(waves)]
    else:
        waves = min(int(requested), *row_plan.rows_per_rank)
        groups = [split_rows(pieces[r], even_cuts(row_plan.rows_per_rank[r], waves)) for r in range(world)]
        chunks, ends = [], []
        for group in groups[rank]:
            chunks += plan_chunks(backend, problem, group, budget)
            ends.append(len(chunks))
    return wave_plans(row_plan, groups), chunks, ends


def choose_plan(
    problem, cost_model, caps: GroupCaps, strategy: str, reassembly: str, stripe_rows: int = DEFAULT_STRIPE_ROWS
) -> tuple[RowPlan, str]:
    """Resolve ``auto`` strategy / reassembly into a plan and an exchange mode.

    ``auto`` strategy takes the plan with the lowest predicted max-rank cost among those
    the reassembly can exchange; plans within 1% of it count as ties, won by the earlier of
    balanced, contiguous, remainder0, fold, striped. A forced reassembly that cannot run on
    the group raises.
    """
    if reassembly != "auto":
        reasons = mode_reasons(reassembly, caps, None)
        if reasons:
            raise ReassemblyError(f"reassembly={reassembly!r} cannot be used: " + "; ".join(reasons))
    if strategy == "auto":
        names = _AUTO_ORDER if reassembly != "ring" else tuple(s for s in _AUTO_ORDER if s in RING_STRATEGIES)
    else:
        names = (strategy,)
    plans = plan_candidates(
        problem.starts_host, problem.ends_host, caps.world_size, names, cost_model=cost_model,
        num_keys=problem.num_keys, stripe_rows=stripe_rows,
    )
    lowest = min(p.max_cost for p in plans)
    # within 1% of the lowest, prefer the earlier strategy: single-piece plans exchange by
    # one collective, fold's two pieces need broadcasts besides
    best = next(p for p in plans if p.max_cost <= lowest * 1.01)
    if len(plans) > 1 and log.isEnabledFor(logging.DEBUG):
        for p in plans:
            log.debug("  candidate %s max-rank cost %d%s", p.describe(), p.max_cost, "  <- chosen" if p is best else "")
    return best, choose_mode(reassembly, caps, best.strategy)


_AUTO_ORDER = ("balanced", "contiguous", "remainder0", "fold", "striped")


class _Clock:
    """Wall time between laps, device-synchronised (``prefill_topk_with_info(timing=True)``)."""

    def __init__(self, device: torch.device) -> None:
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self.sync()
        self.t = time.perf_counter()

    def lap(self) -> float:
        self.sync()
        now = time.perf_counter()
        ms, self.t = (now - self.t) * 1e3, now
        return ms

