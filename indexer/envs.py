"""Every ``INDEXER_*`` environment flag, declared once.

Each flag has a type, a default (optionally one per platform), the allowed values and a
docstring. Flags that tune behaviour per vendor can also be set per platform:
``INDEXER_CUDA_TP_SHARD_MIN_ROWS`` wins over ``INDEXER_TP_SHARD_MIN_ROWS`` on NVIDIA, and
likewise ``INDEXER_ROCM_*`` and ``INDEXER_CPU_*``. Explicit function arguments win over both.

Values are read at call time, not at import time, so a test or an engine can change the
environment between calls. A bad value raises :class:`ValueError` naming the variable, the
value and the allowed values (a bad function argument: naming the argument). Planning
(:class:`indexer.StepPlan`, behind ``indexer.plan`` and ``prefill_topk``) first checks every
``INDEXER_*`` variable (:func:`check_environment`): a bad value of any flag, or of any
platform's variant, raises there; an unknown ``INDEXER_*`` name warns once per process.
"""

from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

PLATFORM_KEYS = ("cuda", "rocm", "cpu")
"""Platform keys used in per-platform flag names (``INDEXER_<KEY>_<NAME>``)."""

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")


def _parse_positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _parse_int_at_least_one(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _parse_waves(text: str) -> str | int:
    low = text.strip().lower()
    if low == "auto":
        return low
    value = int(low)
    if value < 1:
        raise ValueError("expected auto or an integer >= 1")
    return value


def _parse_positive_float(text: str) -> float:
    value = float(text.strip())
    if not 0 < value < float("inf"):
        raise ValueError("expected a finite number > 0")
    return value


@dataclass(frozen=True)
class Flag:
    """One environment flag.

    Attributes:
        name: Name without the ``INDEXER_`` prefix, e.g. ``"TP_SHARD"``.
        parse: Turns the raw string into the typed value; raises ``ValueError`` when bad.
        default: Value when unset.
        doc: One-paragraph description shown by ``python -m indexer info``.
        choices: Allowed values for string flags (compared lower-cased), else ``None``.
        per_platform: Whether ``INDEXER_<PLATFORM>_<NAME>`` overrides are honoured.
        platform_defaults: Defaults that differ per platform key.
        type_name: Human name of the type for messages.
        rule: What a value must be, for messages (``"an integer >= 0"``); empty: from
            ``choices`` or ``type_name``.
        argument: Name of the function argument that overrides the flag (``strategy`` for
            ``TP_SHARD_STRATEGY``); empty: the name lower-cased (``max_logits_mb``).
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    per_platform: bool = False
    platform_defaults: dict[str, Any] = field(default_factory=dict)
    type_name: str = "str"
    rule: str = ""
    argument: str = ""

    @property
    def env_name(self) -> str:
        return f"INDEXER_{self.name}"

    @property
    def argument_name(self) -> str:
        """The keyword argument that overrides this flag (``max_logits_mb``)."""
        return self.argument or self.name.lower()

    def platform_env_name(self, platform_key: str) -> str:
        return f"INDEXER_{platform_key.upper()}_{self.name}"

    def allowed(self) -> str:
        """The allowed values, once (``one of auto|ring``, ``an integer >= 0``)."""
        if self.rule:
            return self.rule
        if self.choices is not None:
            return "one of " + "|".join(self.choices)
        if self.type_name == "bool":
            return "a boolean (" + "|".join(_TRUE + _FALSE) + ")"
        return self.type_name


def _choice(*choices: str) -> Callable[[str], str]:
    """A parser accepting ``choices`` (lower-cased); the flag's ``choices`` are taken from it."""
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in choices:
            raise ValueError(f"expected one of {'|'.join(choices)}")
        return low

    parse.choices = choices
    return parse


_FLAGS: dict[str, Flag] = {}


def cache_dir() -> Path:
    """Where the library keeps the files it writes for later processes (calibrations, built
    kernels): ``$XDG_CACHE_HOME/indexer``, ``XDG_CACHE_HOME`` defaulting to ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "indexer"


def _declare(flag: Flag) -> Flag:
    if flag.choices is None and getattr(flag.parse, "choices", None):
        flag = replace(flag, choices=flag.parse.choices)
    _FLAGS[flag.name] = flag
    return flag


BACKEND = _declare(
    Flag(
        "BACKEND",
        _choice("auto", "deepgemm", "aiter", "triton", "torch"),
        "auto",
        "Backend for logits and top-k. 'auto' takes the first backend of the platform's "
        "priority list that supports the problem; any other value forces that backend and "
        "raises if it cannot run (never a silent fallback).",
        per_platform=True,
        argument="backend",
    )
)
TOPK = _declare(
    Flag(
        "TOPK",
        _choice("torch", "triton"),
        "torch",
        "Top-k kernel of the deepgemm and triton backends (and aiter where AITER has none): "
        "'torch' (torch.topk, lowest-index ties) or 'triton' (our sampled-threshold kernel that "
        "reads each row's window only; same tie rule, same sets). 'triton' by default on "
        "NVIDIA, falling back to 'torch' where Triton cannot run; 'torch' elsewhere (the Triton "
        "top-k has not been timed on AMD GPUs). The torch backend always uses "
        "torch.topk: it is the reference.",
        per_platform=True,
        platform_defaults={"cuda": "triton"},
    )
)
NATIVE_TOPK_MAX_KEYS = _declare(
    Flag(
        "NATIVE_TOPK_MAX_KEYS",
        _parse_positive_int,
        0,
        "Where the top-k is 'triton', chunks whose rows span at most this many keys, and few "
        "enough rows of them (indexer.topk.cuda.ROWS_PER_SM x SMs for the block that holds "
        "them), take the native top-k instead: a CUDA C++ kernel, one thread block a row, "
        "compiled with nvcc at the first plan that uses it and cached in "
        "$XDG_CACHE_HOME/indexer/native. 0: never. "
        "32768 (the kernel's limit, indexer.topk.cuda.MAX_KEYS) by default on NVIDIA; off "
        "elsewhere. Where the default asks for it and it cannot build (no nvcc), plans keep "
        "the Triton top-k and say why; a value set explicitly raises instead.",
        per_platform=True,
        platform_defaults={"cuda": 32768},
        type_name="int",
        rule="an integer >= 0",
    )
)
MAX_LOGITS_MB = _declare(
    Flag(
        "MAX_LOGITS_MB",
        _parse_positive_float,
        4096.0,
        "Byte budget (MiB) of the logits workspace. Rows are processed in chunks so that "
        "the float32 logits of one chunk (and the backend's temporaries) stay under it, "
        "whatever the context length.",
        per_platform=True,
        platform_defaults={"cpu": 512.0},
        type_name="float (MiB)",
        rule="a finite number > 0 (MiB)",
    )
)
TP_SHARD = _declare(
    Flag(
        "TP_SHARD",
        _parse_bool,
        True,
        "Split the query rows across the tensor-parallel group (on) or compute every row "
        "on every rank (off, the replicated behaviour).",
        per_platform=True,
        type_name="bool",
        argument="tp_shard",
    )
)
TP_SHARD_STRATEGY = _declare(
    Flag(
        "TP_SHARD_STRATEGY",
        _choice("auto", "contiguous", "remainder0", "fold", "balanced", "striped"),
        "auto",
        "Row partition strategy. 'auto' picks the plan with the lowest predicted "
        "max-rank cost among those the chosen reassembly supports.",
        per_platform=True,
        argument="strategy",
    )
)
TP_SHARD_MIN_ROWS = _declare(
    Flag(
        "TP_SHARD_MIN_ROWS",
        _parse_positive_int,
        512,
        "Shard only when rows >= this many rows per rank times the TP size; below it "
        "every rank computes all rows (a split of small work loses to its exchange). The "
        "gate where no calibrated times are stored ('bench calibrate', 'bench calibrate "
        "--exchange'); once set (here or by argument) it wins over them.",
        per_platform=True,
        platform_defaults={"cuda": 16384, "rocm": 512, "cpu": 512},
        type_name="int",
        rule="an integer >= 0",
        argument="min_rows_per_rank",
    )
)
TP_SHARD_STRIPE_ROWS = _declare(
    Flag(
        "TP_SHARD_STRIPE_ROWS",
        _parse_int_at_least_one,
        512,
        "Rows per stripe of the 'striped' strategy (stripes dealt round-robin to ranks).",
        per_platform=True,
        type_name="int",
        rule="an integer >= 1",
    )
)
REASSEMBLY = _declare(
    Flag(
        "REASSEMBLY",
        _choice("auto", "allgatherv", "ring", "padded", "maxreduce"),
        "auto",
        "How ranks exchange their top-k rows. 'auto' probes the process group once "
        "(backend, variable-size all-gather support) and picks the best that works.",
        per_platform=True,
        argument="reassembly",
    )
)
EXCHANGE_BITS = _declare(
    Flag(
        "EXCHANGE_BITS",
        _choice("auto", "16", "32"),
        "auto",
        "Width of the top-k indices the ranks exchange. 'auto': 16 bits where every row's "
        "window holds at most 32768 keys (widened back by one copy) and the reassembly "
        "gathers (not maxreduce), else 32; '16': 16 bits up to 65535 keys a window (the "
        "indices and the -1 padding still fit; widening takes a mask pass more), raising "
        "beyond or with maxreduce; '32' always. The output is int32 either way.",
        per_platform=True,
        argument="exchange_bits",
    )
)
EXCHANGE_WAVES = _declare(
    Flag(
        "EXCHANGE_WAVES",
        _parse_waves,
        "auto",
        "Waves of a sharded step's exchange: each rank's rows are computed in this many "
        "waves and each wave's rows are exchanged while the next wave computes, so only the "
        "last wave's exchange waits. 'auto': as many waves as the rank with the fewest chunks "
        "has chunks (waves never add chunks; one chunk each: no overlap); an integer k cuts "
        "every rank's rows into k waves of about equal rows (chunks within each); 1: one "
        "exchange after all rows. Only gathering reassemblies (allgatherv, padded) are cut; "
        "ring and maxreduce exchange once.",
        per_platform=True,
        type_name="auto|int",
        rule="auto or an integer >= 1",
        argument="exchange_waves",
    )
)
COST_MODEL_FILE = _declare(
    Flag(
        "COST_MODEL_FILE",
        str,
        "",
        "JSON file of calibrated per-backend cost models (written by 'python -m indexer "
        "bench calibrate', read by the planner). Empty: $XDG_CACHE_HOME/indexer/cost_model.json (XDG_CACHE_HOME defaulting to ~/.cache).",
        type_name="path",
        rule="a file path",
    )
)
CHECK_CONSISTENCY = _declare(
    Flag(
        "CHECK_CONSISTENCY",
        _parse_bool,
        False,
        "Before any collective, all-gather a fingerprint of the step (shapes, dtype, backend, "
        "row bounds, sharding settings) and raise naming the disagreeing ranks instead of "
        "hanging or returning garbage. Costs one small collective and a sync per call.",
        type_name="bool",
    )
)
CHECK_VALUES = _declare(
    Flag(
        "CHECK_VALUES",
        _choice("off", "async", "sync"),
        "off",
        "Value checks of a step plan's runs: that k_scale (over the keys some row reads) and "
        "weights are finite. 'off': none; 'async': a device-side assert (no host sync; a failure "
        "surfaces at the next synchronization); 'sync': a host check raising ValueError (one "
        "sync a run). prefill_topk always checks, as 'sync'.",
        per_platform=True,
        argument="check_values",
    )
)

TOPK_GRAPH = _declare(
    Flag(
        "TOPK_GRAPH",
        _parse_bool,
        True,
        "NVIDIA: a plan's Triton top-k chunks capture their three to six launches in a CUDA "
        "graph at the first run with given logits and table addresses, and replay it on "
        "later runs with the same ones: one graph launch instead of several, less host time "
        "a layer (docs/topk.md). Off: every run launches each kernel.",
        per_platform=True,
        type_name="bool",
    )
)

TOPK_PDL = _declare(
    Flag(
        "TOPK_PDL",
        _parse_bool,
        True,
        "NVIDIA compute capability 9.0+ (with a CUDA 12.3+ driver and Triton 3.3+): the Triton "
        "top-k's launches use programmatic dependent launch, each placed on the SMs while the "
        "one before it finishes and waiting there for it (docs/topk.md). Off: plain launches. "
        "A TopkConfig with pdl set is not overridden.",
        type_name="bool",
    )
)

TRITON_DIRECT_LAUNCH = _declare(
    Flag(
        "TRITON_DIRECT_LAUNCH",
        _parse_bool,
        True,
        "NVIDIA: the Triton top-k launches a kernel's compiled variant directly once Triton's "
        "JIT has chosen it for the arguments' specialization (dtypes, 16-byte alignment, int "
        "classes) instead of going through the JIT's dispatch every launch (less host time a "
        "call: docs/topk.md). Off: every launch through the JIT. Launch hooks (profilers), "
        "AMD and Triton's interpreter always take the JIT.",
        type_name="bool",
    )
)


def flags() -> tuple[Flag, ...]:
    """All declared flags, in declaration order."""
    return tuple(_FLAGS.values())


def get_flag(name: str) -> Flag:
    """The flag called ``name`` (with or without the ``INDEXER_`` prefix)."""
    key = name.removeprefix("INDEXER_")
    try:
        return _FLAGS[key]
    except KeyError:
        raise KeyError(f"unknown indexer flag {name!r}; known: {', '.join(_FLAGS)}") from None


@dataclass(frozen=True)
class Resolved:
    """A flag's effective value and where it came from."""

    flag: Flag
    value: Any
    source: str

    @property
    def is_set(self) -> bool:
        """Whether a caller chose the value (an argument or an ``INDEXER_*`` variable), not a default."""
        return self.source == "argument" or self.source.startswith("env")


def resolve(name: str, platform_key: str | None = None, override: Any = None) -> Resolved:
    """Effective value of a flag.

    Precedence: ``override`` (a function argument, when not ``None``), then
    ``INDEXER_<PLATFORM>_<NAME>``, then ``INDEXER_<NAME>``, then the platform default, then
    the default.

    Args:
        name: Flag name, with or without the ``INDEXER_`` prefix.
        platform_key: ``"cuda"``, ``"rocm"``, ``"cpu"`` or ``None``.
        override: Value given explicitly by the caller; validated like the env value.

    Raises:
        ValueError: When a value is not allowed; the message names the flag and lists the
            allowed values.
    """
    flag = get_flag(name)
    if override is not None:
        return Resolved(flag, parse_value(flag, override, None), "argument")
    env_name, raw = _set_env(flag, platform_key)
    if env_name is not None:
        return Resolved(flag, parse_value(flag, raw, env_name), f"env {env_name}")
    if platform_key in flag.platform_defaults:
        return Resolved(flag, flag.platform_defaults[platform_key], f"default ({platform_key})")
    return Resolved(flag, flag.default, "default")


def _set_env(flag: Flag, platform_key: str | None) -> tuple[str | None, str | None]:
    """``(variable, raw value)`` of the first of the flag's variables that is set (not blank),
    platform variant first; ``(None, None)`` when none is."""
    names = (flag.platform_env_name(platform_key), flag.env_name) if flag.per_platform and platform_key is not None else (
        flag.env_name,)
    for env_name in names:
        raw = os.environ.get(env_name)
        if raw is not None and raw.strip() != "":
            return env_name, raw
    return None, None


def value(name: str, platform_key: str | None = None, override: Any = None) -> Any:
    """Shorthand for ``resolve(...).value``, without building the record (hot paths read
    their flags on every call)."""
    if override is not None:
        return resolve(name, platform_key, override).value
    flag = get_flag(name)
    env_name, raw = _set_env(flag, platform_key)
    if env_name is not None:
        return parse_value(flag, raw, env_name)
    return flag.platform_defaults.get(platform_key, flag.default)


def parse_value(flag: Flag, raw: Any, where: str | None) -> Any:
    """``raw`` parsed for ``flag``. ``where``: the variable it was read from, or ``None`` for a
    function argument (the message then names the argument, e.g. ``max_logits_mb``)."""
    given = raw
    if not isinstance(raw, str):
        if flag.type_name == "bool" and isinstance(raw, bool):
            return raw
        raw = str(raw)
    try:
        return flag.parse(raw)
    except ValueError:
        if where is None:
            raise ValueError(
                f"{flag.argument_name}: bad value {given!r}; allowed: {flag.allowed()}; "
                f"this argument overrides {flag.env_name}"
            ) from None
        raise ValueError(f"{where}: bad value {raw!r}; allowed: {flag.allowed()}") from None


def environment() -> tuple[tuple[str, str], ...]:
    """The ``INDEXER_*`` variables set now, as sorted ``(name, value)`` pairs (what a plan
    depends on: :mod:`indexer.plan_cache` keys on it)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("INDEXER_")))


def _environment_problems(items: tuple[tuple[str, str], ...]) -> tuple[list[str], list[str]]:
    """``(a message per bad value, the unknown names)`` of ``items`` (:func:`environment`'s)."""
    bad, unknown = [], []
    for env_name, raw in items:
        flag = _flag_of(env_name)
        if flag is None:
            unknown.append(env_name)
        elif raw.strip() != "":
            try:
                parse_value(flag, raw, env_name)
            except ValueError as exc:
                bad.append(str(exc))
    return bad, unknown


def validate_environment(platform_key: str | None = None) -> list[str]:
    """Parse every set flag and return one message per bad value or unknown ``INDEXER_*``
    name (empty when all good). Every platform's variants are checked, whatever
    ``platform_key`` is."""
    bad, unknown = _environment_problems(environment())
    return bad + [_unknown_message(n) for n in unknown]


class UnknownFlagWarning(UserWarning):
    """An ``INDEXER_*`` environment variable that no flag declares (a typo?)."""


_checked_env: tuple[tuple[str, str], ...] | None = None
_warned_unknown: set[str] = set()


def check_environment() -> None:
    """Check every ``INDEXER_*`` variable of the environment; planning calls it first.

    A bad value of a declared flag (or of its per-platform variant, for any platform)
    raises; an unknown ``INDEXER_*`` name warns (:class:`UnknownFlagWarning`, naming the
    closest declared flag), once per name per process. An environment that passed is
    remembered, so a call with the same ``INDEXER_*`` variables costs one scan of
    ``os.environ``.

    Raises:
        ValueError: Naming each bad variable, its value and the allowed values.
    """
    global _checked_env
    items = environment()
    if items == _checked_env:
        return
    bad, unknown = _environment_problems(items)
    for env_name in unknown:
        if env_name not in _warned_unknown:
            _warned_unknown.add(env_name)
            warnings.warn(_unknown_message(env_name), UnknownFlagWarning, stacklevel=3)
    if bad:
        raise ValueError("; ".join(bad))
    _checked_env = items


def known_env_names() -> tuple[str, ...]:
    """Every declared variable name, per-platform variants included."""
    names = []
    for flag in flags():
        names.append(flag.env_name)
        if flag.per_platform:
            names.extend(flag.platform_env_name(k) for k in PLATFORM_KEYS)
    return tuple(names)


def closest_env_name(env_name: str) -> str | None:
    """The declared variable name closest to ``env_name`` (``difflib``), or ``None``."""
    match = difflib.get_close_matches(env_name, known_env_names(), n=1, cutoff=0.6)
    return match[0] if match else None


def _unknown_message(env_name: str) -> str:
    close = closest_env_name(env_name)
    hint = f"; did you mean {close}?" if close else ""
    return f"{env_name}: unknown indexer flag (typo?){hint} It is ignored; every flag: python -m indexer info"


def _flag_of(env_name: str) -> Flag | None:
    """The flag that ``env_name`` sets (plainly or as a per-platform variant), or ``None``."""
    rest = env_name.removeprefix("INDEXER_")
    flag = _FLAGS.get(rest)
    if flag is not None:
        return flag
    for key in PLATFORM_KEYS:
        prefix = key.upper() + "_"
        if rest.startswith(prefix):
            flag = _FLAGS.get(rest[len(prefix):])
            if flag is not None and flag.per_platform:
                return flag
    return None


def _is_known_env_name(env_name: str) -> bool:
    return env_name.startswith("INDEXER_") and _flag_of(env_name) is not None
