"""Input validation, split the way an engine calls: the step's shape and row bounds once
(:func:`make_problem`, at plan time), each layer's tensors in O(1) host checks
(:func:`check_inputs`). Every argument is checked with a message naming it, before any
kernel runs, and nothing the caller passed is written.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .platform import indexed_device

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
"""fp8 formats accepted for ``q`` and ``k`` (e4m3fnuz is MI300's native format)."""

CHECK_MODES = ("off", "async", "sync")
"""Value checks of ``k_scale`` and ``weights`` (:func:`check_values`)."""


@dataclass(frozen=True)
class Problem:
    """The shape and row bounds of one prefill step: what every layer of the step shares.

    Attributes:
        num_rows: Query rows ``M``.
        num_keys: Keys ``N`` of the step's packed key buffer.
        num_heads: Query heads ``H``.
        head_dim: Head dimension ``D``.
        topk: Keys kept per row.
        fp8_dtype: dtype of ``q`` and ``k``.
        device: Device of the tensors.
        row_starts: int32 ``[M]`` on ``device``, first key of each row's window.
        row_ends: int32 ``[M]`` on ``device``, one past each row's last key.
        starts_host: int64 ``[M]`` copy of ``row_starts`` on the CPU (for planning).
        ends_host: int64 ``[M]`` copy of ``row_ends`` on the CPU.
    """

    num_rows: int
    num_keys: int
    num_heads: int
    head_dim: int
    topk: int
    fp8_dtype: torch.dtype
    device: torch.device
    row_starts: torch.Tensor
    row_ends: torch.Tensor
    starts_host: torch.Tensor
    ends_host: torch.Tensor

    def shape_key(self) -> tuple[int, int, int, int, int]:
        """``(M, N, H, D, topk)``, what all ranks must agree on."""
        return (self.num_rows, self.num_keys, self.num_heads, self.head_dim, self.topk)

    def key_range(self) -> tuple[int, int]:
        """``[lo, hi)``: the least start and the largest end of the non-empty rows, the span
        of :meth:`key_spans` (``(0, 0)`` when every row is empty)."""
        spans = self.key_spans
        return (spans[0][0], spans[-1][1]) if spans else (0, 0)

    @functools.cached_property
    def key_spans(self) -> tuple[tuple[int, int], ...]:
        """The keys some row reads: the union of the non-empty rows' windows as disjoint
        ``(lo, hi)`` spans in key order (one span where the windows leave no gap, as the rows
        of causal requests packed end to end do). Computed once, from the host bounds."""
        # numpy on the host copies (no copy to make): 3x faster than torch's CPU ops here
        starts, ends = self.starts_host.numpy(), self.ends_host.numpy()
        nonempty = ends > starts
        if not nonempty.all():
            starts, ends = starts[nonempty], ends[nonempty]
        if not starts.size:
            return ()
        if starts.size > 1 and (starts[1:] < starts[:-1]).any():
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        # a gap before row i: it starts past every earlier row's end
        cuts = (np.flatnonzero(starts[1:] > reach[:-1]) + 1).tolist()
        firsts = [0, *cuts]
        lasts = [c - 1 for c in cuts] + [starts.size - 1]
        return tuple((int(starts[a]), int(reach[b])) for a, b in zip(firsts, lasts))

    @functools.cached_property
    def read_keys(self) -> torch.Tensor | None:
        """bool ``[hi - lo]`` on ``device`` over :meth:`key_range`: whether a row reads each
        key, where the rows' windows leave gaps in it; ``None`` where they do not (made at the
        first use, then kept)."""
        spans = self.key_spans
        if len(spans) < 2:
            return None
        lo, hi = spans[0][0], spans[-1][1]
        mask = torch.zeros(hi - lo, dtype=torch.bool)
        for a, b in spans:
            mask[a - lo : b - lo] = True
        if self.device.type == "cuda":
            mask = mask.pin_memory()  # so the copy does not wait for the device
        return mask.to(self.device, non_blocking=True)

    def owning_bounds(self) -> "Problem":
        """This problem with device bounds of its own: :func:`make_problem` uses device int32
        bounds in place (so that :meth:`indexer.StepPlan.update_bounds` sees them), which a
        plan kept for other calls (the plan cache) must not, since their owner may overwrite
        them."""
        return dataclasses.replace(self, row_starts=self.row_starts.clone(), row_ends=self.row_ends.clone())


class LayerInputs(NamedTuple):
    """One layer's indexer tensors (checked against a :class:`Problem` by :func:`check_inputs`).

    Attributes:
        q: fp8 ``[M, H, D]`` queries.
        k: fp8 ``[N, D]`` keys (same dtype as ``q``).
        k_scale: float32 ``[N]`` per-key scales.
        weights: float32 ``[M, H]`` per-row head weights.
    """

    q: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    weights: torch.Tensor


def _tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _dtype(t: torch.Tensor, name: str, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"{name} must have dtype {names}, got {str(t.dtype).removeprefix('torch.')}")


def _shape(t: torch.Tensor, name: str, expected: tuple, what: str) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape {what} = {list(expected)}, got {list(t.shape)}")


def _int(x: object, name: str, least: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < least:
        raise ValueError(f"{name} must be >= {least}, got {x}")
    return x


def _host_bounds(row_starts: torch.Tensor, row_ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 CPU copies of the bounds: free for host tensors, one copy (a sync) for device ones."""
    if row_starts.device.type == "cpu" and row_ends.device.type == "cpu":
        # copies even of int64 tensors: the plan keeps these, the caller may overwrite its own
        return row_starts.to(torch.int64, copy=True), row_ends.to(torch.int64, copy=True)
    if row_starts.numel() == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    both = torch.stack((row_starts.to(torch.int64), row_ends.to(row_starts.device, torch.int64))).cpu()
    return both[0], both[1]


def _device_bounds(t: torch.Tensor, host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """int32 contiguous ``[M]`` on ``device``: ``t`` itself where it already is one, else a
    copy (from the host through pinned memory, so the copy does not wait for the device)."""
    if t.device == device and t.dtype == torch.int32 and t.is_contiguous():
        return t
    if t.device == device:
        return t.to(torch.int32).contiguous()
    src = host.to(torch.int32)
    if device.type == "cuda":
        src = src.pin_memory()
    return src.to(device, non_blocking=True)


def check_bounds(starts_host: torch.Tensor, ends_host: torch.Tensor, n: int) -> None:
    """Raise naming the first bad row: ``0 <= row_starts <= row_ends <= N``."""
    if not starts_host.numel():
        return
    bad = torch.nonzero(starts_host < 0)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"row_starts must be >= 0; row {i} has row_starts = {int(starts_host[i])}")
    bad = torch.nonzero(ends_host > n)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"row_ends must be <= N = {n} (keys in k); row {i} has row_ends = {int(ends_host[i])}")
    bad = torch.nonzero(starts_host > ends_host)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"row_starts must be <= row_ends; row {i} has row_starts = {int(starts_host[i])} "
            f"> row_ends = {int(ends_host[i])}"
        )


def check_device(device: object) -> torch.device:
    """A ``device`` argument as a torch device with its index (``"cuda"``: the current GPU's
    ``cuda:N``).

    Raises:
        ValueError: not a device name, or a GPU this torch cannot use, naming the argument.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must name a torch device (such as 'cuda:0' or 'cpu'), got {device!r}") from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ValueError(f"device is {device!r} but this torch ({torch.__version__}) sees no CUDA or ROCm GPU")
        # torch keeps a device index in 8 bits: "cuda:999" becomes cuda:-25, "cuda:255" the
        # current GPU and "cuda:256" cuda:0, so the index is read from the argument itself
        index = _written_index(device, dev)
        if index is not None and not 0 <= index < count:
            raise ValueError(f"device is {device!r} but this torch sees {count} GPU(s) (cuda:0-cuda:{count - 1})")
    return indexed_device(dev)


def _written_index(device: object, dev: torch.device) -> int | None:
    # the GPU index the caller wrote: "type:N" or an int as given, else the device's own
    if isinstance(device, str) and ":" in device:
        return int(device.rsplit(":", 1)[1])  # digits: torch.device parsed it
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    return dev.index


def make_problem(
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    *,
    num_keys: int,
    heads: int,
    head_dim: int,
    topk: int,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    device: torch.device | str | None = None,
) -> Problem:
    """Check a step's shape and row bounds and return its :class:`Problem`.

    Args:
        row_starts: int ``[M]`` (int32 or int64) on the host or the device.
        row_ends: int ``[M]``, same length; ``0 <= row_starts <= row_ends <= num_keys``.
        num_keys: ``N``, keys in the step's packed key buffer.
        heads, head_dim: ``H`` and ``D`` of ``q``.
        topk: Keys kept per row.
        fp8_dtype: dtype of ``q`` and ``k``.
        device: Device the layers' tensors live on (default: the bounds' device).

    Host bounds cost no device sync (device copies go through pinned memory); device
    bounds cost one copy to the host.

    Raises:
        TypeError, ValueError: A bad argument, named.
    """
    row_starts, row_ends = _tensor(row_starts, "row_starts"), _tensor(row_ends, "row_ends")
    topk = _int(topk, "topk", 1)
    num_keys = _int(num_keys, "num_keys", 0)
    heads = _int(heads, "heads", 1)
    head_dim = _int(head_dim, "head_dim", 1)
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got {fp8_dtype}")
    for name, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must have dtype int32 or int64, got {str(t.dtype).removeprefix('torch.')}")
        if t.dim() != 1:
            raise ValueError(f"{name} must have shape [M], got {list(t.shape)}")
    if row_ends.numel() != row_starts.numel():
        raise ValueError(f"row_ends must have shape [M] = [{row_starts.numel()}] (from row_starts), got "
                         f"{list(row_ends.shape)}")
    device = check_device(device) if device is not None else row_starts.device
    for name, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        if t.device.type != "cpu" and t.device != device:
            raise ValueError(f"{name} is on {t.device}: give the bounds on the host or on {device}")
    starts_host, ends_host = _host_bounds(row_starts, row_ends)
    check_bounds(starts_host, ends_host, num_keys)
    return Problem(
        row_starts.numel(), num_keys, heads, head_dim, topk, fp8_dtype, device,
        _device_bounds(row_starts, starts_host, device), _device_bounds(row_ends, ends_host, device),
        starts_host, ends_host,
    )


def check_out(problem: Problem, out: object) -> torch.Tensor:
    """``out`` as :func:`check_inputs` accepts it: int32 ``[M, topk]`` on the device, column
    stride 1 and any row stride of at least ``topk`` (a view like ``buf[:, :topk]``)."""
    out = _tensor(out, "out")
    _dtype(out, "out", (torch.int32,))
    _shape(out, "out", (problem.num_rows, problem.topk), "[M, topk]")
    if out.device != problem.device:
        raise ValueError(f"out is on {out.device} but the inputs are on {problem.device}")
    if (problem.topk > 1 and out.stride(1) != 1) or (problem.num_rows > 1 and out.stride(0) < problem.topk):
        raise ValueError(f"out must have column stride 1 and row stride >= topk, got strides {list(out.stride())}")
    return out


def check_inputs(problem: Problem, q: object, k: object, k_scale: object, weights: object) -> LayerInputs:
    """One layer's tensors against the step: types, dtypes, shapes and devices, O(1) host
    work (no device sync, no value read).

    Raises:
        TypeError: An argument is not a tensor, or has the wrong dtype.
        ValueError: Wrong shape, or a tensor on another device.
    """
    q, k, k_scale, weights = (_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (k_scale, "k_scale"), (weights, "weights")))
    if q.dtype != problem.fp8_dtype:
        _dtype(q, "q", FP8_DTYPES)
        raise TypeError(f"q must have the plan's dtype {problem.fp8_dtype}, got {q.dtype}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have the same fp8 dtype as q ({q.dtype}), got {k.dtype}")
    _dtype(k_scale, "k_scale", (torch.float32,))
    _dtype(weights, "weights", (torch.float32,))
    m, n, h, d = problem.num_rows, problem.num_keys, problem.num_heads, problem.head_dim
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [M, H, D], got shape {list(q.shape)}")
    _shape(q, "q", (m, h, d), "[M, H, D]")
    if k.dim() != 2:
        raise ValueError(f"k must be 2-D [N, D], got shape {list(k.shape)}")
    _shape(k, "k", (n, d), "[N, D]")
    if k_scale.dim() == 2 and k_scale.shape[1] == 1:
        k_scale = k_scale.reshape(-1)
    _shape(k_scale, "k_scale", (n,), "[N]")
    _shape(weights, "weights", (m, h), "[M, H]")
    device = problem.device
    for name, t in (("q", q), ("k", k), ("k_scale", k_scale), ("weights", weights)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the step is planned on {device}: all inputs must be on one device")
    return LayerInputs(q, k, k_scale, weights)


def check_values(problem: Problem, inputs: LayerInputs, mode: str, gaps: bool = True) -> None:
    """``k_scale`` and ``weights`` finite (NaN or inf scales make logits that no top-k can
    rank), where a row can read them: ``k_scale`` at the keys of :attr:`Problem.key_spans`
    only, so stale bytes outside every window (a shared key workspace) never raise.

    Args:
        mode: ``off``; ``async``, a device-side assert (no sync; a failure surfaces at the
            next synchronization as a device assert); ``sync``, a host check (one sync)
            raising ValueError.
        gaps: Skip the gaps between the windows; ``False`` checks every key of
            :meth:`Problem.key_range` (windows refreshed since planning may lie anywhere
            in it).
    """
    if mode == "off":
        return
    lo, hi = problem.key_range()
    read = problem.read_keys if gaps else None
    for name, t in (("k_scale", inputs.k_scale[lo:hi]), ("weights", inputs.weights)):
        if not t.numel():
            continue
        finite = torch.isfinite(t)
        if name == "k_scale" and read is not None:
            # keys in the gaps between the rows' windows are read by no row
            finite = finite | ~read
        ok = finite.all()
        if mode == "async":
            torch._assert_async(ok, f"{name} must be finite (no NaN or inf)")
        elif not bool(ok):
            raise ValueError(f"{name} must be finite (no NaN or inf)")


def validate(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    topk: int,
    out: torch.Tensor | None = None,
    check: str = "sync",
) -> tuple[Problem, LayerInputs]:
    """Check every input of :func:`indexer.prefill_topk`: the step's :class:`Problem` and
    the layer's tensors. Nothing is written anywhere; ``out`` is only inspected.

    Args:
        check: Value checks of ``k_scale`` and ``weights`` (:func:`check_values`).

    Raises:
        TypeError: An argument is not a tensor, or has the wrong dtype; ``topk`` not an int.
        ValueError: Wrong rank or shape, mismatched devices, bad row bounds, ``topk < 1``,
            a bad ``out``, or non-finite scales where a row reads them.
    """
    q, k, k_scale, weights = (_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (k_scale, "k_scale"), (weights, "weights")))
    row_starts, row_ends = _tensor(row_starts, "row_starts"), _tensor(row_ends, "row_ends")
    _int(topk, "topk", 1)
    # q's dtype and shape give the step's; check_inputs then checks the other tensors against them
    _dtype(q, "q", FP8_DTYPES)
    _dtype(row_starts, "row_starts", (torch.int32,))
    _dtype(row_ends, "row_ends", (torch.int32,))
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [M, H, D], got shape {list(q.shape)}")
    m, h, d = q.shape
    if h < 1 or d < 1:
        raise ValueError(f"q must have H >= 1 heads and D >= 1, got shape {list(q.shape)}")
    if k.dim() != 2:
        raise ValueError(f"k must be 2-D [N, D], got shape {list(k.shape)}")
    _shape(row_starts, "row_starts", (m,), "[M]")
    _shape(row_ends, "row_ends", (m,), "[M]")
    device = q.device
    for name, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}: all inputs must be on one device")
    # the layer's checks first (shapes and devices are O(1)); the bounds cost a copy
    skeleton = Problem(m, k.shape[0], h, d, topk, q.dtype, device, row_starts, row_ends,
                       torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    inputs = check_inputs(skeleton, q, k, k_scale, weights)
    if out is not None:
        check_out(skeleton, out)
    problem = make_problem(row_starts, row_ends, num_keys=k.shape[0], heads=h, head_dim=d, topk=topk,
                           fp8_dtype=q.dtype, device=device)
    check_values(problem, inputs, check)
    return problem, inputs
