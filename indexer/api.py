"""Public entry point: :func:`prefill_topk`."""

from __future__ import annotations

import logging

import torch

from . import envs
from .backends import run_rows, select_backend
from .platform import platform_for_device
from .problem import validate

log = logging.getLogger("indexer")


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
) -> torch.Tensor:
    """Top-k keys of every query row of a lightning-indexer prefill step.

    ``logits[m, n] = sum_h weights[m, h] * relu(q[m, h] . k[n]) * k_scale[n]`` for
    ``row_starts[m] <= n < row_ends[m]``; the result holds, per row, the indices of the
    ``topk`` largest logits relative to ``row_starts[m]``, in unspecified order, ``-1``
    padded when the row has fewer than ``topk`` keys.

    Args:
        q: float8_e4m3fn (or e4m3fnuz) ``[M, H, D]`` queries (fold any q scale into ``weights``).
        k: Same fp8 dtype, ``[N, D]`` keys of every request of the step, packed.
        k_scale: float32 ``[N]`` (or ``[N, 1]``) per-key scales.
        weights: float32 ``[M, H]`` per-row head weights.
        row_starts: int32 ``[M]``, first key of each row's window.
        row_ends: int32 ``[M]``, one past each row's last key; ``row_starts <= row_ends <= N``.
        topk: Keys kept per row (2048 in DeepSeek-V3.2).
        group: Tensor-parallel process group whose ranks all pass the same inputs;
            ``None`` computes every row here.
        out: Optional int32 ``[M, topk]`` contiguous tensor on the inputs' device, filled
            and returned; untouched if validation fails.
        backend: ``auto`` or a backend name to force (default: ``INDEXER_BACKEND``).
        strategy: Row partition strategy (default: ``INDEXER_TP_SHARD_STRATEGY``).
        reassembly: Exchange mode (default: ``INDEXER_REASSEMBLY``).
        max_logits_mb: Working-set budget in MiB (default: ``INDEXER_MAX_LOGITS_MB``).

    Returns:
        int32 ``[M, topk]`` (``out`` when given).

    Raises:
        TypeError, ValueError: Bad input, before anything runs.
        BackendUnavailableError: The forced backend (or every backend) cannot run.
    """
    problem = validate(q, k, k_scale, weights, row_starts, row_ends, topk, out)
    platform = platform_for_device(problem.device)
    chosen = select_backend(problem, platform, envs.value("BACKEND", platform.key, backend))
    budget = int(envs.value("MAX_LOGITS_MB", platform.key, max_logits_mb) * 2**20)
    # resolve every setting up front so a bad one fails before any kernel runs
    envs.value("TP_SHARD_STRATEGY", platform.key, strategy)
    envs.value("REASSEMBLY", platform.key, reassembly)
    if group is not None:
        raise NotImplementedError("tensor-parallel sharding (group=...) is not wired yet")
    result = out if out is not None else torch.empty(problem.num_rows, topk, dtype=torch.int32, device=problem.device)
    log.debug("prefill_topk M=%d N=%d backend=%s", problem.num_rows, problem.num_keys, chosen.name)
    run_rows(chosen, problem, [(0, problem.num_rows)], result, budget)
    return result


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
