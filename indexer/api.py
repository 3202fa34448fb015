"""Public entry point: :func:`prefill_topk`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import envs
from .backends import run_rows, select_backend
from .backends.topk_torch import topk_choice
from .collective import (
    RING_STRATEGIES,
    agreed_cost_model,
    GroupCaps,
    ReassemblyError,
    check_consistency,
    choose_mode,
    fingerprint,
    mode_reasons,
    probe_group,
    reassemble,
)
from .partition import DEFAULT_STRIPE_ROWS, RowPlan, plan_candidates
from .platform import platform_for_device
from .problem import validate

log = logging.getLogger("indexer")


@dataclass
class StepInfo:
    """What one :func:`prefill_topk` call did.

    Attributes:
        backend: Backend that computed the logits and top-k.
        sharded: Whether rows were split across the group (else every row computed here).
        world_size: Ranks in the group (1 without a group).
        rank: This rank.
        plan: The row plan (``None`` when not sharded).
        reassembly: Exchange mode used (``None`` when not sharded).
        reason: Why the step was or was not sharded.
        notes: What the backend did differently for this problem (e.g. head padding).
        compute_ms: Time to compute this rank's rows (only with ``timing=True``).
        wait_ms: Time this rank then waited for the slowest rank (only with ``timing=True``).
        exchange_ms: Time of the reassembly alone (only with ``timing=True``).
    """

    backend: str
    sharded: bool
    world_size: int
    rank: int
    plan: RowPlan | None = None
    reassembly: str | None = None
    reason: str = ""
    notes: tuple[str, ...] = ()
    compute_ms: float | None = None
    wait_ms: float | None = None
    exchange_ms: float | None = None


@torch.no_grad()
def prefill_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    topk: int,
    *,
    group: object | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    strategy: str | None = None,
    reassembly: str | None = None,
    max_logits_mb: float | None = None,
    tp_shard: bool | None = None,
    min_rows_per_rank: int | None = None,
) -> torch.Tensor:
    """Top-k keys of every query row of a lightning-indexer prefill step.

    ``logits[m, n] = sum_h weights[m, h] * relu(q[m, h] . k[n]) * k_scale[n]`` for
    ``row_starts[m] <= n < row_ends[m]``; the result holds, per row, the indices of the
    ``topk`` largest logits relative to ``row_starts[m]``, in unspecified order, ``-1``
    padded when the row has fewer than ``topk`` keys.

    With a tensor-parallel ``group``, every rank passes the same replicated inputs; each
    computes only its rows of the plan and all ranks return the identical full table,
    equal per row (as a set) to the replicated computation.

    Args:
        q: float8_e4m3fn (or e4m3fnuz) ``[M, H, D]`` queries (fold any q scale into ``weights``).
        k: Same fp8 dtype, ``[N, D]`` keys of every request of the step, packed.
        k_scale: float32 ``[N]`` (or ``[N, 1]``) per-key scales.
        weights: float32 ``[M, H]`` per-row head weights.
        row_starts: int32 ``[M]``, first key of each row's window.
        row_ends: int32 ``[M]``, one past each row's last key; ``row_starts <= row_ends <= N``.
        topk: Keys kept per row (2048 in DeepSeek-V3.2).
        group: Tensor-parallel process group (``torch.distributed``); ``None`` computes every
            row here.
        out: Optional int32 ``[M, topk]`` contiguous tensor on the inputs' device, filled
            and returned; untouched if validation fails.
        backend: ``auto`` or a backend name to force (default ``INDEXER_BACKEND``).
        strategy: ``auto|contiguous|remainder0|fold|balanced|striped`` (default
            ``INDEXER_TP_SHARD_STRATEGY``; stripe size ``INDEXER_TP_SHARD_STRIPE_ROWS``).
        reassembly: ``auto|allgatherv|ring|padded|maxreduce`` (default ``INDEXER_REASSEMBLY``).
        max_logits_mb: Working-set budget in MiB (default ``INDEXER_MAX_LOGITS_MB``).
        tp_shard: Split rows across ``group`` (default ``INDEXER_TP_SHARD``).
        min_rows_per_rank: Shard only when ``M >= min_rows_per_rank * world_size``
            (default ``INDEXER_TP_SHARD_MIN_ROWS``, per platform).

    Returns:
        int32 ``[M, topk]`` (``out`` when given).

    Raises:
        TypeError, ValueError: Bad input or setting, before anything runs.
        BackendUnavailableError: The forced backend (or every backend) cannot run.
        ReassemblyError: A forced reassembly cannot exchange the plan on this group.
        InconsistentRanksError: With ``INDEXER_CHECK_CONSISTENCY=1``, ranks disagree.
    """
    result, _ = prefill_topk_with_info(
        q, k, k_scale, weights, row_starts, row_ends, topk, group=group, out=out, backend=backend,
        strategy=strategy, reassembly=reassembly, max_logits_mb=max_logits_mb, tp_shard=tp_shard,
        min_rows_per_rank=min_rows_per_rank,
    )
    return result


@torch.no_grad()
def prefill_topk_with_info(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    topk: int,
    *,
    group: object | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    strategy: str | None = None,
    reassembly: str | None = None,
    max_logits_mb: float | None = None,
    tp_shard: bool | None = None,
    min_rows_per_rank: int | None = None,
    timing: bool = False,
) -> tuple[torch.Tensor, StepInfo]:
    """:func:`prefill_topk` that also returns a :class:`StepInfo`.

    Args:
        timing: Measure compute and exchange time (synchronises the device; for demos and
            benchmarks, not for production).
    """
    problem = validate(q, k, k_scale, weights, row_starts, row_ends, topk, out)
    platform = platform_for_device(problem.device)
    key = platform.key
    chosen = select_backend(problem, platform, envs.value("BACKEND", key, backend))
    if chosen.configurable_topk:
        topk_choice(problem.device)  # an INDEXER_TOPK that cannot run raises here, not mid-step
    budget = int(envs.value("MAX_LOGITS_MB", key, max_logits_mb) * 2**20)
    strategy_req = envs.value("TP_SHARD_STRATEGY", key, strategy)
    reassembly_req = envs.value("REASSEMBLY", key, reassembly)
    shard_on = envs.value("TP_SHARD", key, tp_shard)
    min_rows = envs.value("TP_SHARD_MIN_ROWS", key, min_rows_per_rank)
    check = envs.value("CHECK_CONSISTENCY", key)

    world, rank = 1, 0
    if group is not None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("group was given but torch.distributed is not initialised")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
    m = problem.num_rows
    info = StepInfo(chosen.name, False, world, rank, notes=tuple(chosen.notes(problem)))
    stripe = envs.value("TP_SHARD_STRIPE_ROWS", key)
    shard = world > 1 and shard_on and m >= min_rows * world
    if check and world > 1:
        # before anything that only sharding ranks do, so disagreeing ranks raise, not hang
        digest = fingerprint(
            problem.shape_key(), str(problem.fp8_dtype), chosen.name, shard, strategy_req, reassembly_req, stripe,
            tensors=(problem.starts_host, problem.ends_host),
        )
        check_consistency(
            digest, group, problem.device,
            "(M, N, H, D, topk, dtype, backend, row bounds, whether to shard, strategy, reassembly, stripe rows)",
        )
    plan = None
    if world == 1:
        info.reason = "no tensor-parallel group"
    elif not shard_on:
        info.reason = "sharding disabled (INDEXER_TP_SHARD / tp_shard)"
    elif not shard:
        info.reason = f"M={m} < min_rows_per_rank {min_rows} x tp {world}: replicated"
    else:
        caps = probe_group(group, problem.device)
        model = agreed_cost_model(group, problem.device, chosen, platform.arch)
        plan, mode = choose_plan(problem, model, caps, strategy_req, reassembly_req, stripe)
        info.sharded, info.plan, info.reassembly = True, plan, mode
        info.reason = f"sharded: {plan.describe()}, reassembly {mode}"
    log.debug("prefill_topk M=%d N=%d backend=%s: %s", m, problem.num_keys, chosen.name, info.reason)

    result = out if out is not None else torch.empty(m, topk, dtype=torch.int32, device=problem.device)
    clock = _Clock(problem.device, timing)
    if plan is None:
        run_rows(chosen, problem, [(0, m)], result, budget)
        info.compute_ms = clock.lap()
        return result, info
    local = torch.empty(plan.rows_per_rank[rank], topk, dtype=torch.int32, device=problem.device)
    run_rows(chosen, problem, plan.rank_rows(rank), local, budget)
    info.compute_ms = clock.lap()
    if timing:  # so exchange_ms is the exchange alone, not the wait for slower ranks
        dist.barrier(group=group)
        info.wait_ms = clock.lap()
    reassemble(local, plan, rank, group, info.reassembly, result)
    info.exchange_ms = clock.lap()
    return result, info


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
    # within 1% of the lowest, prefer the earlier strategy: single-piece plans exchange
    # straight into the output, fold's two pieces go through a temporary
    best = next(p for p in plans if p.max_cost <= lowest * 1.01)
    if len(plans) > 1 and log.isEnabledFor(logging.DEBUG):
        for p in plans:
            log.debug("  candidate %s max-rank cost %d%s", p.describe(), p.max_cost, "  <- chosen" if p is best else "")
    return best, choose_mode(reassembly, caps, best.strategy)


_AUTO_ORDER = ("balanced", "contiguous", "remainder0", "fold", "striped")


class _Clock:
    """Wall time between laps, device-synchronised; a no-op unless enabled."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        if enabled:
            self.sync()
            self.t = time.perf_counter()

    def lap(self) -> float | None:
        if not self.enabled:
            return None
        self.sync()
        now = time.perf_counter()
        ms, self.t = (now - self.t) * 1e3, now
        return ms


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise along the last dimension with one float32 scale per vector.

    Args:
        x: Float tensor ``[..., D]``.
        dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``.

    Returns:
        ``(x_fp8, scale)``: ``x_fp8`` of shape ``x.shape`` and ``dtype``, ``scale`` float32
        ``x.shape[:-1]`` with ``x ~= x_fp8.float() * scale[..., None]``.
    """
    if dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {dtype}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    fmax = torch.finfo(dtype).max
    amax = x.detach().abs().amax(dim=-1).float().clamp_min(1e-12)
    scale = amax / fmax
    x_fp8 = (x.float() / scale[..., None]).clamp(-fmax, fmax).to(dtype)
    return x_fp8, scale
