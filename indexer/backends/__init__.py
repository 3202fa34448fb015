"""Backend registry and the one dispatch point.

Backends are registered by name with the module that defines them; a module is imported
only when its backend is first asked for, and vendor packages only inside the backend's
methods. Dispatch walks the platform's priority list and takes the first backend that
reports no reason against the problem; when none fits, one error lists every backend with
its reasons. A backend the user forces (argument or ``INDEXER_BACKEND``) that cannot run
raises; it never falls back silently.

Each backend lives in a module named as it is registered: ``deepgemm/``, ``aiter/``,
``triton/`` and ``torch.py`` (no module-level ``import torch`` may appear in this file: the
submodule ``torch`` would take the name once imported).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..platform import Platform
from ..problem import Problem
from .base import Backend, run_rows

__all__ = [
    "Backend",
    "BackendStatus",
    "BackendUnavailableError",
    "backend_names",
    "choose_backend",
    "backend_statuses",
    "get_backend",
    "register_backend",
    "unregister_backend",
    "run_rows",
    "select_backend",
]

_MODULES: dict[str, str] = {
    "deepgemm": "indexer.backends.deepgemm",
    "aiter": "indexer.backends.aiter",
    "triton": "indexer.backends.triton",
    "torch": "indexer.backends.torch",
}
_INSTANCES: dict[str, Backend] = {}


class BackendUnavailableError(RuntimeError):
    """No backend (or not the forced one) can run the problem; the message says why."""


def register_backend(name: str, module: str | Backend) -> None:
    """Register ``module`` (the path of a module that defines ``BACKEND``, imported on first
    use) or a :class:`Backend` instance under ``name``, replacing what was there."""
    if isinstance(module, Backend):
        _MODULES[name] = type(module).__module__
        _INSTANCES[name] = module
    else:
        _MODULES[name] = module
        _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget the backend registered as ``name`` (a no-op for a name not registered)."""
    _MODULES.pop(name, None)
    _INSTANCES.pop(name, None)


def registry_key() -> tuple:
    """The registry's names and modules: changes whenever a backend is registered under a new
    module (for caches of plans made with these backends; an instance registered in place of
    another: :func:`is_registered_instance`)."""
    return tuple(_MODULES.items())


def is_registered_instance(backend: Backend) -> bool:
    """Whether ``backend`` is still the object its name gives (an instance replaced since,
    as tests do, makes plans holding the old one stale)."""
    return _INSTANCES.get(backend.name) is backend


def backend_names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get_backend(name: str) -> Backend:
    """The backend registered as ``name`` (its module imported on first use)."""
    if name not in _MODULES:
        raise BackendUnavailableError(f"backend {name!r} is not registered; registered: {', '.join(_MODULES)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = importlib.import_module(_MODULES[name]).BACKEND
    return _INSTANCES[name]


@dataclass(frozen=True)
class BackendStatus:
    """One row of :func:`indexer.available_backends`."""

    name: str
    available: bool
    reasons: tuple[str, ...]
    in_priority: bool
    notes: tuple[str, ...] = ()


def _reasons(name: str, problem: Problem | None) -> list[str]:
    try:
        return get_backend(name).not_supported_reasons(problem)
    except Exception as exc:  # noqa: BLE001 - a broken backend module is a reason, not a crash
        return [f"backend failed to load: {type(exc).__name__}: {exc}"]


def backend_statuses(platform: Platform, problem: Problem | None = None) -> list[BackendStatus]:
    """Every registered backend with its reasons, priority-list backends first."""
    order = [n for n in platform.backend_priority if n in _MODULES]
    order += [n for n in _MODULES if n not in order]
    out = []
    for name in order:
        reasons = _reasons(name, problem)
        if name not in platform.backend_priority:
            reasons = reasons or [f"not in the {platform.vendor} priority list (can be forced)"]
        notes = tuple(get_backend(name).notes(problem)) if problem is not None and not reasons else ()
        out.append(BackendStatus(name, not reasons, tuple(reasons), name in platform.backend_priority, notes))
    return out


def select_backend(problem: Problem, platform: Platform, requested: str = "auto") -> Backend:
    """Pick the backend that runs ``problem`` (:func:`choose_backend` without its reason).

    Args:
        problem: The validated step.
        platform: Platform of the tensors' device.
        requested: ``auto`` or a backend name (forced).

    Raises:
        BackendUnavailableError: The forced backend cannot run (with its reasons), or no
            backend can (with every backend's reasons).
    """
    return choose_backend(problem, platform, requested)[0]


def choose_backend(problem: Problem, platform: Platform, requested: str = "auto",
                   forced_by: str | None = None) -> tuple[Backend, str]:
    """Pick the backend that runs ``problem``, and say why: ``(backend, reason)``.

    ``auto`` takes the first backend of the platform's priority list with no reasons; the
    reason then names the list and every backend skipped before it with its reasons. A
    forced backend's reason is ``"forced"``, or ``"forced by <forced_by>"`` where the caller
    says what forced it (an argument, a variable).

    Raises:
        BackendUnavailableError: As :func:`select_backend`.
    """
    if requested != "auto":
        if requested not in _MODULES:
            raise BackendUnavailableError(
                f"backend {requested!r} was forced but is not available in this build; registered: {', '.join(_MODULES)}"
            )
        reasons = _reasons(requested, problem)
        if reasons:
            raise BackendUnavailableError(f"backend {requested!r} was forced but cannot run: " + "; ".join(reasons))
        return get_backend(requested), "forced" + (f" by {forced_by}" if forced_by else "")
    lines = []
    for name in platform.backend_priority:
        if name not in _MODULES:
            lines.append(f"  {name}: not registered in this build")
            continue
        reasons = _reasons(name, problem)
        if not reasons:
            order = ", ".join(platform.backend_priority)
            why = f"auto: the first in this platform's order ({order}) that runs it"
            if lines:
                why += "; skipped " + "; ".join(line.strip() for line in lines)
            return get_backend(name), why
        lines.append(f"  {name}: " + "; ".join(reasons))
    raise BackendUnavailableError(f"no backend can run this problem on {platform.describe()}:\n" + "\n".join(lines))
