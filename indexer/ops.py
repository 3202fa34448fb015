"""The indexer as ``torch.library`` custom ops, so that ``torch.compile`` (an engine's compiled
model) traces around it instead of into it.

Importing this module registers two ops, each writing into an ``out`` it is given (the way
engines register their own indexer ops, with the output buffer mutated):

- ``torch.ops.indexer.prefill_topk(q, k, k_scale, weights, row_starts, row_ends, topk, out)``:
  :func:`indexer.prefill_topk` on one device (no process group: an op's arguments are tensors
  and numbers).
- ``torch.ops.indexer.plan_run(handle, q, k, k_scale, weights, out)``: ``run`` of a plan
  registered with :func:`register_plan` (a plan may be sharded over a group: the group is the
  plan's).

Both have fake implementations (they only write ``out``), so tracing needs no device work.
"""

from __future__ import annotations

import itertools
import threading

import torch

from .api import prefill_topk as _prefill_topk
from .step import StepPlan

_lock = threading.Lock()
_plans: dict[int, StepPlan] = {}
_handles = itertools.count(1)


def register_plan(plan: StepPlan) -> int:
    """A handle for ``plan`` that ``torch.ops.indexer.plan_run`` takes (an int, as an op's
    arguments must be tensors and numbers). The plan is kept until :func:`unregister_plan`."""
    if not isinstance(plan, StepPlan):
        raise TypeError(f"plan must be an indexer.StepPlan, got {type(plan).__name__}")
    with _lock:
        handle = next(_handles)
        _plans[handle] = plan
    return handle


def unregister_plan(handle: int) -> None:
    """Forget the plan behind ``handle`` (a no-op for an unknown handle)."""
    with _lock:
        _plans.pop(handle, None)


def _plan(handle: int) -> StepPlan:
    with _lock:
        plan = _plans.get(handle)
    if plan is None:
        raise ValueError(f"handle must be one register_plan returned and not unregistered, got {handle}")
    return plan


@torch.library.custom_op("indexer::prefill_topk", mutates_args=("out",))
def prefill_topk_op(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                    row_starts: torch.Tensor, row_ends: torch.Tensor, topk: int, out: torch.Tensor) -> None:
    """:func:`indexer.prefill_topk` into ``out`` (int32 ``[M, topk]``), replicated."""
    _prefill_topk(q, k, k_scale, weights, row_starts, row_ends, topk, out=out)


@prefill_topk_op.register_fake
def _(q, k, k_scale, weights, row_starts, row_ends, topk, out) -> None:
    return None


@torch.library.custom_op("indexer::plan_run", mutates_args=("out",))
def plan_run_op(handle: int, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                out: torch.Tensor) -> None:
    """``run`` of the plan behind ``handle`` (:func:`register_plan`) into ``out``."""
    _plan(handle).run(q, k, k_scale, weights, out=out)


@plan_run_op.register_fake
def _(handle, q, k, k_scale, weights, out) -> None:
    return None
