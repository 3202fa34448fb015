"""Calibrated per-backend cost models, stored as a small JSON file.

``python -m indexer bench calibrate`` times a backend on the current device and writes its
coefficients under the key ``"<backend>@<arch>"``; :func:`cost_model_for` returns them to the
planner (``auto`` and ``balanced``), falling back to the backend's built-in default. Ranks
may read different files: :func:`indexer.collective.agreed_cost_model` makes the whole group
use rank 0's model.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from .. import envs
from .cost import CostModel
from .gate import TimeModel


def calibration_path() -> Path:
    """Where calibrations live: ``INDEXER_COST_MODEL_FILE`` or ``~/.cache/indexer/cost_model.json``."""
    value = envs.value("COST_MODEL_FILE")
    if value:
        return Path(value)
    return envs.cache_dir() / "cost_model.json"


def _read(path: Path) -> dict:
    # the planner asks on every call: re-read only when the file changes
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return {}
    return _read_file(str(path), mtime)


@functools.lru_cache(maxsize=8)
def _read_file(path: str, mtime_ns: int) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"cost model file {path} is unreadable ({exc}); fix or delete it, or point INDEXER_COST_MODEL_FILE elsewhere") from None
    return data if isinstance(data, dict) else {}


def stored() -> dict:
    """Every entry of the calibration file (``{}`` where there is none).

    Raises:
        ValueError: the file is unreadable.
    """
    return dict(_read(calibration_path()))


def load_calibration(backend: str, arch: str) -> CostModel | None:
    """The calibrated model of ``backend`` on ``arch``, or ``None`` when none is stored."""
    path = calibration_path()
    entry = _read(path).get(f"{backend}@{arch}")
    if not entry:
        return None
    try:
        values = {k: entry[k] for k in ("per_key", "per_width", "per_row")}
        return CostModel(**values)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"cost model file {path}: entry '{backend}@{arch}' needs integer per_key, per_width and per_row >= 0 "
            f"({type(exc).__name__}: {exc}); fix or delete it (INDEXER_COST_MODEL_FILE)"
        ) from None


def cost_model_for(backend: object, arch: str) -> tuple[CostModel, str]:
    """``(model, source)``: the calibration for ``backend`` on ``arch`` if stored, else its default."""
    name = getattr(backend, "name")
    model = load_calibration(name, arch)
    if model is not None:
        return model, f"calibrated ({calibration_path()})"
    return getattr(backend, "cost_model"), "built-in default"


def save_calibration(backend: str, arch: str, model: CostModel, extra: dict | None = None) -> Path:
    """Store ``model`` for ``backend`` on ``arch`` (other entries kept)."""
    entry = {"per_key": model.per_key, "per_width": model.per_width, "per_row": model.per_row, **(extra or {})}
    return _store(f"{backend}@{arch}", entry)


def _store(key: str, entry: dict) -> Path:
    # one entry replaced, the others kept; written whole and renamed into place
    path = calibration_path()
    data = dict(_read(path))
    data[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    tmp.replace(path)
    return path


def exchange_key(group_backend: str, world: int) -> str:
    """The file's key of a group's exchange calibration: ``exchange@<backend>x<world>``."""
    return f"exchange@{group_backend}x{world}"


def save_exchange_calibration(group_backend: str, world: int, us: float, gb_per_s: float,
                              extra: dict | None = None) -> Path:
    """Store the exchange fit of a ``world``-rank ``group_backend`` group (other entries kept)."""
    return _store(exchange_key(group_backend, world), {"us": us, "gb_per_s": gb_per_s, **(extra or {})})


def load_time_model(backend: str, arch: str, group_backend: str, world: int) -> tuple[TimeModel | None, str]:
    """``(model, why)``: the calibrated times the sharding gate needs, or ``None`` and what
    is missing (then the gate is the row count)."""
    path = calibration_path()
    data = _read(path)
    compute, exchange = data.get(f"{backend}@{arch}") or {}, data.get(exchange_key(group_backend, world)) or {}
    missing = []
    if "ns_per_key" not in compute or "us_per_row" not in compute:
        missing.append(f"no calibrated times for {backend}@{arch} ('bench calibrate')")
    if "us" not in exchange or "gb_per_s" not in exchange:
        missing.append(f"no {exchange_key(group_backend, world)} ('bench calibrate --exchange --tp {world}')")
    if missing:
        return None, f"{'; '.join(missing)} in {path}"
    try:
        model = TimeModel(float(compute["ns_per_key"]) + float(compute.get("ns_per_column", 0.0)),
                          float(compute["us_per_row"]), float(exchange["us"]), float(exchange["gb_per_s"]))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cost model file {path}: bad times for {backend}@{arch} or "
                         f"{exchange_key(group_backend, world)} ({exc}); fix or delete it") from None
    values = (model.ns_per_key, model.us_per_row, model.exchange_us, model.exchange_gb_per_s)
    if not all(math.isfinite(v) for v in values) or model.exchange_gb_per_s <= 0 or min(values) < 0:
        raise ValueError(f"cost model file {path}: times must be finite and >= 0, gb_per_s > 0 ({model})")
    return model, f"calibrated ({path})"
