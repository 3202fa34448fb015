"""The step plans :func:`indexer.prefill_topk` made recently, reused by calls that match.

An engine that keeps the one-shot call makes it once per layer with the same row bounds for
every layer of a step. Planning costs milliseconds on the host (the chunk table, the index
tensors, the top-k launches), so each call looks here first: a call with the same row bounds
(compared element by element on the host), shapes, fp8 dtype, device, CUDA stream, group,
keyword settings, ``INDEXER_*`` environment and registered backends as a recent one runs that call's plan. A plan
gives the same table whichever call made it, so reuse changes the time only. The cache holds
the :data:`SIZE` plans used last, several of one shape where their bounds differ (the chunk
groups of one step); a cached plan keeps copies of its bounds, so a caller may overwrite its
bound tensors once a call has returned.

Not reused: calls on a group with ``INDEXER_CHECK_CONSISTENCY`` on (the check is a
collective that every rank must make at every call, whether its own plan was cached or not).
:func:`indexer.workspace.release_workspaces` empties the cache, since cached plans hold views
of the workspaces.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Callable

import torch

from . import envs
from .backends import is_registered_instance, registry_key
from .problem import Problem
from .workspace import _owner, on_release

SIZE = 4
"""Plans kept (least recently used dropped first): a few distinct steps in flight."""

_lock = threading.Lock()
# entry number -> (key, plan), least recently used first; one key (shapes and settings) may
# have several entries, one per distinct row bounds (its plan's problem holds them)
_plans: OrderedDict[int, tuple[tuple, object]] = OrderedDict()
_numbers = itertools.count()


def _key(problem: Problem, group: object | None, options: tuple) -> tuple:
    return (problem.shape_key(), problem.fp8_dtype, problem.device, _owner(problem.device), id(group), options,
            envs.environment(), registry_key())


def cached_plan(problem: Problem, group: object | None, options: dict, make: Callable[[], object],
                reuse: bool = True) -> object:
    """The plan of a recent call that matches ``problem`` (its host bounds element by
    element), ``group`` and ``options`` (keyword settings), else ``make()``'s, kept for
    later calls.

    Args:
        problem: The call's validated problem (host bounds in ``starts_host``/``ends_host``).
        group: The call's process group or ``None``.
        options: The call's keyword settings (hashable values).
        make: Builds the plan on a miss (a :class:`indexer.StepPlan` of ``problem``, with
            bounds of its own: :meth:`indexer.problem.Problem.owning_bounds`).
        reuse: ``False`` plans afresh and keeps nothing.
    """
    if not reuse:
        return make()
    key = _key(problem, group, tuple(sorted(options.items())))
    with _lock:
        hit = _find(key, problem)
    if hit is not None:
        return hit
    plan = make()
    with _lock:
        # another thread may have made the same plan meanwhile: keep one entry
        hit = _find(key, problem)
        if hit is not None:
            return hit
        _plans[next(_numbers)] = (key, plan)
        while len(_plans) > SIZE:
            _plans.popitem(last=False)
    return plan


def _find(key: tuple, problem: Problem) -> object | None:
    # (under _lock) the matching plan, made most recently used, or None
    for number, (k, plan) in reversed(_plans.items()):
        if (k == key and torch.equal(plan.problem.starts_host, problem.starts_host)
                and torch.equal(plan.problem.ends_host, problem.ends_host) and is_registered_instance(plan.backend)):
            _plans.move_to_end(number)
            return plan
    return None


def clear() -> None:
    """Forget every cached plan."""
    with _lock:
        _plans.clear()


def cached_count() -> int:
    """Plans held now."""
    with _lock:
        return len(_plans)


on_release(clear)
