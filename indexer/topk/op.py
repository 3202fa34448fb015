"""The per-row top-k as one call: :func:`topk_per_row`, on whichever implementation runs here."""

from __future__ import annotations

import torch

from .choice import topk_choice
from .reference import row_topk


def topk_per_row(logits: torch.Tensor, starts_rel: torch.Tensor, lengths: torch.Tensor, k: int,
                 out: torch.Tensor | None = None, *, impl: str | None = None) -> torch.Tensor:
    """The ``k`` largest values of each row's window, as indices relative to the window.

    Args:
        logits: float32 ``[R, n]``, column stride 1 (any row stride); only each row's window
            is read, whatever lies outside it.
        starts_rel: int ``[R]``, the column of each row's first key (``>= 0``).
        lengths: int ``[R]``, keys in each row's window (``>= 0``, ``starts_rel + lengths
            <= n``).
        k: Keys kept per row (``>= 1``).
        out: Optional int32 ``[R, k]`` on the logits' device, column stride 1; filled and
            returned, untouched if a check fails.
        impl: ``"triton"`` or ``"torch"``; ``None``: ``INDEXER_TOPK``'s choice for the
            device (:func:`~.choice.topk_choice`). Both select the same set per row: ties at
            the k-th value go to the lowest index, NaNs rank above every number.

    Returns:
        int32 ``[R, k]``: per row the indices of its ``k`` largest values, unordered, ``-1``
        padded where a row has fewer than ``k`` keys.

    Raises:
        TypeError, ValueError: a bad argument, named, before any kernel runs.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {getattr(logits, 'dtype', type(logits))} "
                         f"{list(getattr(logits, 'shape', []))}")
    rows, n = logits.shape
    if n > 1 and logits.stride(1) != 1:
        raise ValueError("logits needs column stride 1")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    for name, t in (("starts_rel", starts_rel), ("lengths", lengths)):
        if (not isinstance(t, torch.Tensor) or tuple(t.shape) != (rows,) or t.dtype.is_floating_point
                or t.dtype.is_complex or t.dtype == torch.bool or t.device != logits.device):
            raise ValueError(f"{name} must be an int tensor of shape [{rows}] on {logits.device}, got "
                             f"{getattr(t, 'dtype', type(t))} {list(getattr(t, 'shape', []))} "
                             f"on {getattr(t, 'device', '?')}")
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, k)
                            or out.dtype != torch.int32 or out.device != logits.device
                            or (k > 1 and out.stride(1) != 1)):
        raise ValueError(f"out must be int32 [{rows}, {k}] with column stride 1 on {logits.device}, got "
                         f"{getattr(out, 'dtype', type(out))} {list(getattr(out, 'shape', []))}")
    if impl not in (None, "torch", "triton"):
        raise ValueError(f"impl must be None, 'torch' or 'triton', got {impl!r}")
    if rows and logits.device.type == "cpu":
        # the bounds are free to check on the host (a device check would cost a sync)
        s, ln = starts_rel.to(torch.int64), lengths.to(torch.int64)
        if bool((s < 0).any() | (ln < 0).any() | (s + ln > n).any()):
            raise ValueError(f"need 0 <= starts_rel, 0 <= lengths and starts_rel + lengths <= n = {n}")
    impl = topk_choice(logits.device) if impl is None else impl
    result = out if out is not None else torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return result
    if impl == "triton":
        from .triton import ragged_topk

        ragged_topk(logits, starts_rel, lengths, k, result)
    else:
        # the way that never reads outside the windows, on every device
        row_topk(logits, starts_rel, lengths, k, result, sync_free=True)
    return result
