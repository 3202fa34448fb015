"""Triton launches without the JIT's per-call dispatch, once it has chosen the kernel.

A ``kernel[grid](*args, **kw)`` call binds every parameter, specializes each argument,
builds a cache key (``str`` of the options included) and only then launches: on an H200's
host 20-42 us per launch for the top-k's kernels (14-41 parameters), more than the launch
itself (docs/topk.md, "Host time"). :class:`Launcher` lets the JIT make the first launch
of each specialization and keeps the compiled kernel it returns; later launches with the
same specialization call that kernel's launcher directly.

The specialization is what Triton's ``specialize_impl`` derives from the arguments (Triton
3.4-3.9): a tensor's dtype and whether its address is a multiple of 16 bytes, an int's width
(int32, int64, uint64), whether it is 1 (then a constant of the kernel) and whether it is a
multiple of 16. :func:`spec_key` keys on exactly these (with the constexprs, typed, and the
knobs the JIT's key holds), so that two launches with one key select one compiled kernel
(``tests/test_triton_launch.py`` checks the key against Triton's own specialization for the
NVIDIA backend). AMD's backend also specializes on
whether a tensor spans under 2 GB (buffer ops): the callers launch directly on NVIDIA only.
Anything else (another argument type, a launch hook set for a profiler, Triton's
interpreter, a launcher that refuses the arguments) takes the JIT's path.

A direct launch passes each pointer as its address (an int, which Triton's launcher takes
as the pointer itself): it skips the launcher's ``data_ptr`` call and driver query a tensor,
and lets a caller pass :class:`At` (a place in a buffer) where it would make a view only for
the launch. The callers check that every tensor is on the launch's device first.
"""

from __future__ import annotations

import functools
import itertools
import os

import torch

try:  # lazy / optional import
    import triton

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # pragma: no cover - depends on environment
    triton = None
    _TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def is_available() -> tuple[bool, str]:
    """Return ``(ok, reason)`` telling whether Triton can be imported."""
    if triton is None:
        return False, f"triton not importable ({_TRITON_IMPORT_ERROR})"
    return True, f"triton {getattr(triton, '__version__', '?')}"


def launch_reasons(device: torch.device | None) -> list:
    """Why Triton kernels cannot launch on ``device`` (empty: they can): Triton missing, or
    CPU tensors without Triton's interpreter or with one that cannot run loops bounded by
    loaded values (:func:`interpreter_reasons`). ``None`` checks the package only."""
    ok, why = is_available()
    reasons = [] if ok else [why]
    if device is not None and device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            reasons.append("CPU tensors need Triton's interpreter (TRITON_INTERPRET=1 before importing triton)")
        elif ok:
            reasons.extend(interpreter_reasons())
    return reasons


@functools.lru_cache(maxsize=None)
def interpreter_reasons() -> tuple:
    """Why Triton's interpreter cannot run the top-k's kernels here (empty: it can).

    The kernels bound loops by values they load (``range(lo, end, STEP)``). The interpreter
    holds such a value as a 1-element numpy array and, up to Triton 3.6, turns it into an
    index with ``int(array)``, which numpy 2.4 refuses; Triton 3.7 squeezes the array first.
    Found by running one such loop in the interpreter (once, cached), not by version numbers.
    Cached: call with ``TRITON_INTERPRET=1`` set before indexer was imported."""
    if type(_loaded_bound_loop).__name__ != "InterpretedFunction":
        # TRITON_INTERPRET=1 was set after these kernels were defined: they are compiled ones
        return ("Triton's interpreter is not active for indexer's kernels: TRITON_INTERPRET=1 was set after they "
                "were defined (set it before importing indexer)",)
    try:
        n = torch.full((1,), 3, dtype=torch.int32)
        _loaded_bound_loop[(1,)](n)
        if int(n[0]) == 6:
            return ()
        got = f"it counted {int(n[0])}, not 3"
    except Exception as exc:  # noqa: BLE001 - any failure of the probe is the reason
        got = f"{type(exc).__name__}: {exc}"[:200]
    import numpy

    return (f"Triton {triton.__version__}'s interpreter cannot run a loop bounded by a loaded value with "
            f"numpy {numpy.__version__} ({got}); Triton >= 3.7 can",)


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _loaded_bound_loop(n_ptr):
        n = tl.load(n_ptr)
        acc = n
        for _ in range(0, n):
            acc += 1
        tl.store(n_ptr, acc)


_INT32 = 1 << 31
_INT64 = 1 << 63


def _int_key(v: int) -> tuple:
    if v == 1:
        return (1,)
    width = 0 if -_INT32 <= v < _INT32 else 1 if -_INT64 <= v < _INT64 else 2
    return (width, v % 16 == 0)


class At:
    """A pointer argument ``offset`` elements into the flat tensor ``tensor``: what
    ``tensor[offset:]`` would pass, without making that view where the launch is direct
    (which needs only its address; a view takes 1-2 us of host time, six of them a call).

    Args:
        tensor: A 1-D tensor with unit stride.
        offset: Elements from its start.
        base: ``tensor.data_ptr()``, when the caller already has it.
    """

    __slots__ = ("tensor", "offset", "address", "_view")

    def __init__(self, tensor: torch.Tensor, offset: int, base: int | None = None):
        self.tensor, self.offset, self._view = tensor, offset, None
        self.address = (tensor.data_ptr() if base is None else base) + offset * tensor.element_size()

    def view(self) -> torch.Tensor:
        """The view itself (made once): what the JIT gets."""
        if self._view is None:
            self._view = self.tensor[self.offset:]
        return self._view


def _one(a) -> tuple | None:
    """``(key, raw)`` of one argument (:func:`_direct_args`), or None for another type."""
    if type(a) is int:
        return _int_key(a), a
    if type(a) is At:
        return (a.tensor.dtype, a.address % 16 == 0), a.address
    if isinstance(a, torch.Tensor):
        address = a.data_ptr()
        return (a.dtype, address % 16 == 0), address
    return None


def _direct_args(args: tuple) -> tuple[tuple | None, list]:
    """``(key, raw)``: :func:`spec_key` and the arguments as a compiled kernel's launcher takes
    them, a pointer as its address (an int: the launcher then neither calls ``data_ptr`` nor
    asks the driver about it; the callers check devices before they launch)."""
    key, raw = [], []
    for a in args:
        one = _one(a)
        if one is None:
            return None, raw
        key.append(one[0])
        raw.append(one[1])
    return tuple(key), raw


def spec_key(args: tuple) -> tuple | None:
    """What Triton specializes a kernel on for these runtime arguments, as a hashable key:
    per tensor (or :class:`At`) its dtype and 16-byte alignment, per int its width class,
    ``== 1`` and ``% 16 == 0``. ``None`` for an argument of any other type (the JIT then
    launches)."""
    return _direct_args(args)[0]


def jit_args(args: tuple) -> tuple:
    """The arguments as the JIT takes them: each :class:`At` as its view."""
    return tuple(a.view() if type(a) is At else a for a in args)


_KW_KEYS: dict[tuple, int] = {}
_kw_ids = itertools.count()


class LaunchKw(dict):
    """A launch's constexprs and options (``kw`` of ``kernel[grid](*args, **kw)``), with
    ``key``: an int standing for its items, given once (equal items, equal keys; a launch
    hashes it instead of every item again)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # typed: 8 and 8.0, True and 1 are different constexprs (and kernels) to Triton
        items = tuple((name, type(value), value) for name, value in self.items())
        self.key = _KW_KEYS.get(items)
        if self.key is None:
            # next() is atomic: two threads may spend two ids on one item set, never one id on two
            self.key = _KW_KEYS.setdefault(items, next(_kw_ids))


def _current_stream(index: int) -> int:
    # the stream Triton's JIT launches on: torch's current one (its raw handle, as Triton's
    # CUDA driver reads it; the public API where that is gone)
    try:
        from torch._C import _cuda_getCurrentRawStream
    except ImportError:
        return torch.cuda.current_stream(index).cuda_stream
    global _current_stream
    _current_stream = _cuda_getCurrentRawStream
    return _cuda_getCurrentRawStream(index)


_MISSING = object()


@functools.cache
def _knobs():
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs


def _jit_state(fn) -> tuple | None:
    """What else Triton's JIT puts in a kernel's cache key or does before a launch: ``None``
    where only the JIT may launch (a launch hook, as a profiler's, must see every launch; a
    pre-run hook; a stage-inspection hook; a global the kernel reads changed since it was
    compiled, which the JIT refuses; no ``triton.knobs``: before Triton 3.4, whose
    launcher takes other arguments), else the knobs the key holds (debug, instrumentation,
    FP sanitizer)."""
    knobs = _knobs()
    if knobs is None or getattr(fn, "pre_run_hooks", None):
        return None
    runtime, compilation = knobs.runtime, knobs.compilation
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        # Triton 3.4+: a HookChain, set when it holds a call (a bare callable: always set)
        if hook is not None and getattr(hook, "calls", True):
            return None
    if getattr(runtime, "add_stages_inspection_hook", None) is not None:
        return None
    for (name, _), (value, scope) in getattr(fn, "used_global_vals", {}).items():
        # identity first: the globals are constexpr objects, and comparing two builds a third
        # (a few microseconds a launch, for a global that is almost always the same object)
        current = scope.get(name, _MISSING)
        if current is not value and current != value:
            return None
    return (runtime.debug, compilation.instrumentation_mode, getattr(compilation, "fpsan_homomorphic_casts", None))


class Launcher:
    """Launches one ``@triton.jit`` function whose runtime parameters all come before its
    constexprs (the top-k kernels' layout).

    Args:
        fn: The ``JITFunction``.
    """

    def __init__(self, fn):
        self.fn = fn
        self._kernels: dict = {}
        self._broken = False
        #: launches made directly / through the JIT (for tests and probes)
        self.direct_launches = 0
        self.jit_launches = 0

    def __call__(self, grid: int, args: tuple, kw: LaunchKw, device_index: int, direct: bool = True) -> None:
        """Launch ``fn[(grid,)](*args, **kw)``.

        Args:
            grid: Programs (a 1-D grid).
            args: The runtime arguments, in parameter order: tensors, :class:`At` and ints.
            kw: The constexprs (every one) and launch options (``num_warps``, ``maxnreg``...).
            device_index: The CUDA device the launch runs on: the current one (the callers
                launch inside :func:`device_guard`).
            direct: Whether a compiled kernel may be launched directly (else always the JIT).
        """
        state = _jit_state(self.fn) if direct and not self._broken else None
        spec = raw = None
        if state is not None:
            spec, raw = _direct_args(args)
        self._launch(grid, args, kw, device_index, state, spec, raw)

    def bind(self, args: tuple, kw: LaunchKw, device_index: int, direct: bool, slots: tuple[int, ...]) -> "Bound":
        """A launch whose arguments are all fixed but those at ``slots`` (converted once,
        here; per call only the ``slots`` ones): ``bound(grid, *values)``."""
        return Bound(self, args, kw, device_index, direct, slots)

    def _launch(self, grid: int, args: tuple, kw: LaunchKw, device_index: int, state, spec, raw) -> None:
        key = None
        if state is not None and spec is not None:
            key = (kw.key, state, device_index, spec)
            hit = self._kernels.get(key)
            if hit is not None:
                kernel, constexprs = hit
                stream = _current_stream(device_index)
                try:
                    kernel.run(grid, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None,
                               *raw, *constexprs)
                except TypeError:
                    # the launcher parses its arguments before it launches: one that takes
                    # others (another Triton) refused them and nothing ran
                    self._broken = True
                else:
                    self.direct_launches += 1
                    return
                key = None
        kernel = self.fn[(grid,)](*jit_args(args), **kw)
        self.jit_launches += 1
        names = self.fn.arg_names[len(args):]
        if key is not None and all(n in kw for n in names) and all(
                hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            self._kernels[key] = (kernel, tuple(kw[n] for n in names))


class Bound:
    """One launch with its arguments bound (:meth:`Launcher.bind`): a call gives the grid and
    the arguments at ``slots`` (the tensors and ints that change between calls, such as the
    logits and their row stride), and only those are converted again; every other argument
    keeps the key and address it had when bound (so it must keep its storage)."""

    __slots__ = ("launcher", "args", "kw", "device_index", "direct", "slots", "spec", "raw")

    def __init__(self, launcher: Launcher, args: tuple, kw: LaunchKw, device_index: int, direct: bool,
                 slots: tuple[int, ...]):
        self.launcher, self.args, self.kw, self.device_index = launcher, tuple(args), kw, device_index
        self.direct, self.slots = direct, tuple(slots)
        spec, raw = _direct_args(self.args)
        self.spec = list(spec) if spec is not None else None
        self.raw = raw

    def __call__(self, grid: int, *values) -> None:
        launcher, slots = self.launcher, self.slots
        args = list(self.args)
        for i, v in zip(slots, values):
            args[i] = v
        state = _jit_state(launcher.fn) if self.direct and not launcher._broken else None
        spec = raw = None
        if state is not None and self.spec is not None:
            spec, raw = list(self.spec), list(self.raw)
            for i, v in zip(slots, values):
                one = _one(v)
                if one is None:
                    spec = None
                    break
                spec[i], raw[i] = one
            spec = tuple(spec) if spec is not None else None
        launcher._launch(grid, tuple(args), self.kw, self.device_index, state, spec, raw)
