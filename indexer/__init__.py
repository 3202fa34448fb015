"""indexer: exact, tensor-parallel-sharded lightning-indexer prefill top-k.

``indexer.plan(...)`` once per forward step, ``plan.run(...)`` every layer (no sync, no
allocation, CUDA-graph capturable); ``indexer.prefill_topk(...)`` both in one call.

``import indexer`` needs only torch; vendor packages (DeepGEMM, AITER, Triton) are imported
lazily inside their backends, and no device context is created at import.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .api import StepInfo, prefill_topk, prefill_topk_with_info, quantize_fp8
from .backends import BackendUnavailableError
from .collective import InconsistentRanksError, ReassemblyError
from .partition import CostModel, RowPlan, plan_rows
from .platform import current_platform
from .step import StepPlan, plan


def available_backends(problem=None, device=None):
    """Every registered backend, whether it can run here, and why not.

    Args:
        problem: Optional validated :class:`indexer.problem.Problem` to check shapes against.
        device: Device whose platform to use (default: the machine's accelerator, else CPU).
            A GPU device that torch cannot use (a CPU build of torch, no GPU visible, an
            index past the visible ones) reports every backend unavailable, with that reason.

    Returns:
        list of :class:`indexer.backends.BackendStatus`.
    """
    from .backends import BackendStatus, backend_statuses
    from .platform import platform_for_device, unusable_device_reason

    if problem is not None:
        platform = platform_for_device(problem.device)
    elif device is not None:
        reason = unusable_device_reason(device)
        if reason is not None:
            from .backends import backend_names
            from .platform import gpu_platform_class

            priority = gpu_platform_class().backend_priority
            names = [n for n in priority if n in backend_names()]
            names += [n for n in backend_names() if n not in names]
            return [BackendStatus(n, False, (reason,), n in priority) for n in names]
        platform = platform_for_device(device)
    else:
        platform = current_platform()
    return backend_statuses(platform, problem)


__all__ = [
    "BackendUnavailableError",
    "InconsistentRanksError",
    "ReassemblyError",
    "CostModel",
    "RowPlan",
    "__version__",
    "StepInfo",
    "StepPlan",
    "available_backends",
    "prefill_topk_with_info",
    "current_platform",
    "plan",
    "plan_rows",
    "prefill_topk",
    "quantize_fp8",
]
