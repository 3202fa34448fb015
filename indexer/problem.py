"""Input validation: every argument checked, with a message naming it, before any kernel runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
"""fp8 formats accepted for ``q`` and ``k`` (e4m3fnuz is MI300's native format)."""


@dataclass(frozen=True)
class Problem:
    """A validated indexer prefill step.

    Attributes:
        q: fp8 ``[M, H, D]`` queries.
        k: fp8 ``[N, D]`` keys (same dtype as ``q``).
        k_scale: float32 ``[N]`` per-key dequantisation scales.
        weights: float32 ``[M, H]`` per-row head weights.
        row_starts: int32 ``[M]`` on the tensors' device.
        row_ends: int32 ``[M]`` on the tensors' device.
        starts_host: int64 ``[M]`` copy of ``row_starts`` on the CPU (for planning).
        ends_host: int64 ``[M]`` copy of ``row_ends`` on the CPU.
        topk: Number of keys kept per row.
    """

    q: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    weights: torch.Tensor
    row_starts: torch.Tensor
    row_ends: torch.Tensor
    starts_host: torch.Tensor
    ends_host: torch.Tensor
    topk: int

    @property
    def num_rows(self) -> int:
        return self.q.shape[0]

    @property
    def num_keys(self) -> int:
        return self.k.shape[0]

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self.q.dtype

    def shape_key(self) -> tuple[int, int, int, int, int]:
        """``(M, N, H, D, topk)``, what all ranks must agree on."""
        return (self.num_rows, self.num_keys, self.num_heads, self.head_dim, self.topk)


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


def validate(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    topk: int,
    out: torch.Tensor | None = None,
) -> Problem:
    """Check every input of :func:`indexer.prefill_topk` and return a :class:`Problem`.

    Nothing is written anywhere; ``out`` is only inspected.

    Raises:
        TypeError: An argument is not a tensor, or has the wrong dtype; ``topk`` not an int.
        ValueError: Wrong rank or shape, mismatched devices, bad row bounds, ``topk < 1``,
            or a non-contiguous ``out``.
    """
    q, k, k_scale, weights = (_tensor(x, n) for x, n in ((q, "q"), (k, "k"), (k_scale, "k_scale"), (weights, "weights")))
    row_starts, row_ends = _tensor(row_starts, "row_starts"), _tensor(row_ends, "row_ends")
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")

    _dtype(q, "q", FP8_DTYPES)
    if k.dtype != q.dtype:
        raise TypeError(f"k must have the same fp8 dtype as q ({q.dtype}), got {k.dtype}")
    _dtype(k_scale, "k_scale", (torch.float32,))
    _dtype(weights, "weights", (torch.float32,))
    _dtype(row_starts, "row_starts", (torch.int32,))
    _dtype(row_ends, "row_ends", (torch.int32,))

    if q.dim() != 3:
        raise ValueError(f"q must be 3-D [M, H, D], got shape {list(q.shape)}")
    m, h, d = q.shape
    if h < 1 or d < 1:
        raise ValueError(f"q must have H >= 1 heads and D >= 1, got shape {list(q.shape)}")
    if k.dim() != 2:
        raise ValueError(f"k must be 2-D [N, D], got shape {list(k.shape)}")
    n = k.shape[0]
    if k.shape[1] != d:
        raise ValueError(f"k must have shape [N, D] with D = {d} (from q), got {list(k.shape)}")
    if k_scale.dim() == 2 and k_scale.shape[1] == 1:
        k_scale = k_scale.reshape(-1)
    _shape(k_scale, "k_scale", (n,), "[N]")
    _shape(weights, "weights", (m, h), "[M, H]")
    _shape(row_starts, "row_starts", (m,), "[M]")
    _shape(row_ends, "row_ends", (m,), "[M]")

    device = q.device
    for name, t in (("k", k), ("k_scale", k_scale), ("weights", weights), ("row_starts", row_starts), ("row_ends", row_ends)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}: all inputs must be on one device")

    if out is not None:
        _tensor(out, "out")
        _dtype(out, "out", (torch.int32,))
        _shape(out, "out", (m, topk), "[M, topk]")
        if out.device != device:
            raise ValueError(f"out is on {out.device} but the inputs are on {device}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")

    # NaN or inf scales would make logits that no top-k can rank (ties at -inf would reach
    # outside the row's window); fp8 q/k carry no inf, and their NaN codes are the caller's
    for name, t in (("k_scale", k_scale), ("weights", weights)):
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite (no NaN or inf)")

    # One small device-to-host copy (one sync): the planner needs the bounds on the host anyway.
    bounds = torch.stack((row_starts, row_ends)).to("cpu", torch.int64) if m else torch.zeros(2, 0, dtype=torch.int64)
    starts_host, ends_host = bounds[0], bounds[1]
    if m:
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
    return Problem(q, k, k_scale, weights, row_starts, row_ends, starts_host, ends_host, topk)
