"""Public entry points: :func:`prefill_topk` (plan and run in one call) and :func:`quantize_fp8`."""

from __future__ import annotations

import dataclasses

import torch

from . import envs
from .plan_cache import cached_plan
from .platform import platform_for_device
from .problem import validate
from .step import StepInfo, StepPlan, _Clock, choose_plan  # noqa: F401 - choose_plan re-exported


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
        out: Optional int32 ``[M, topk]`` on the inputs' device (column stride 1, any row
            stride), filled and returned; untouched if validation fails.
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
    problem, inputs = validate(q, k, k_scale, weights, row_starts, row_ends, topk, out)
    options = dict(backend=backend, strategy=strategy, reassembly=reassembly, max_logits_mb=max_logits_mb,
                   tp_shard=tp_shard, min_rows_per_rank=min_rows_per_rank)
    # a plan is reused by later calls with the same bounds and settings (the layers of a
    # step), except where each call must run the ranks' consistency check
    reuse = group is None or not envs.value("CHECK_CONSISTENCY", platform_for_device(problem.device).key)
    # the plan outlives this call: it must not read the caller's bound tensors (their owner
    # may overwrite them before a later call with equal bounds reuses it)
    step = cached_plan(problem, group, options, lambda: StepPlan(
        problem.owning_bounds() if reuse else problem, group=group, check_values="off", **options),
        reuse)  # validate checked the values already
    result = step._run(inputs, out, _Clock(problem.device) if timing else None)
    # a copy: a later call reusing the plan writes its own timings into the plan's info
    return result, dataclasses.replace(step.info)


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
