"""The logits workspace: one float32 buffer per device, allocated once and reused.

Allocating a fresh ``[rows, N]`` logits tensor per chunk lets the caching allocator pile up
blocks of ever-changing sizes (upstream, that fragmentation killed a 231K-token prefill).
Here each device owns one flat buffer of a fixed size, set by the byte budget
(``INDEXER_MAX_LOGITS_MB``, capped at the 2^31-byte chunk limit), allocated at the first
chunk that needs it and reused by every later chunk, layer and call. It is re-allocated only
if the budget changes (or a single row needs more than the budget allows).

One buffer per device *and stream* (per thread on the CPU), taken when a step is planned:
plans made while different CUDA streams are current never share one. Plans made on one
stream do, so their runs must not overlap (run them on that stream, or order them); calls
from several threads on one stream are not supported (as with any library that keeps a
workspace per stream). The Triton top-k's scratch is kept the same way, beside it
(:func:`scratch_workspace`).
"""

from __future__ import annotations

import logging
import threading

import torch

from .platform import indexed_device

log = logging.getLogger("indexer")

MAX_CHUNK_BYTES = 2**31 - 1
"""Cap on one chunk's float32 logits for backends whose kernels index them with 32-bit
offsets (AITER's failed past 2 GiB upstream): ``Backend.max_chunk_bytes``'s default; also the
most the logits workspace holds."""

_lock = threading.Lock()
_buffers: dict[tuple[torch.device, int], tuple[torch.Tensor, int]] = {}  # -> (buffer, budget bytes)


def _owner(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return threading.get_ident()


def workspace_numel(budget_bytes: int) -> int:
    """Float32 elements of the workspace for a byte budget."""
    return max(1, min(budget_bytes, MAX_CHUNK_BYTES) // 4)


def logits_workspace(device: torch.device, numel: int, budget_bytes: int) -> torch.Tensor:
    """A float32 ``[numel]`` view of the device's workspace (contents undefined).

    Args:
        device: Device of the workspace.
        numel: Elements this chunk needs (at most ``workspace_numel(budget_bytes)`` when the
            backend sizes its chunks honestly).
        budget_bytes: The byte budget the workspace is sized by.
    """
    # ("cuda" and "cuda:0" are one workspace)
    device = indexed_device(device)
    key = (device, _owner(device))
    with _lock:
        held = _buffers.get(key)
        if held is None or held[1] != budget_bytes or held[0].numel() < numel:
            if held is not None:
                log.info("indexer: re-allocating the %s logits workspace (%d MiB held)", device, held[0].numel() * 4 >> 20)
            _buffers.pop(key, None)
            del held  # free the old block before taking the new one
            buf = torch.empty(max(workspace_numel(budget_bytes), numel), dtype=torch.float32, device=device)
            _buffers[key] = (buf, budget_bytes)
        else:
            buf = held[0]
        return buf[:numel]


def scratch_workspace(device: torch.device, numel: int) -> torch.Tensor:
    """An int64 ``[numel]`` view of the device's top-k scratch (contents undefined), kept
    beside the logits workspace, per device and stream like it. It only grows: a larger need
    takes a new block (plans that hold the old one keep it until they are dropped)."""
    # ("cuda" and "cuda:0" are one workspace)
    device = indexed_device(device)
    key = (device, _owner(device))
    with _lock:
        held = _scratch.get(key)
        if held is None or held.numel() < numel:
            _scratch.pop(key, None)
            del held
            held = _scratch[key] = torch.empty(numel, dtype=torch.int64, device=device)
        return held[:numel]


_scratch: dict[tuple[torch.device, int], torch.Tensor] = {}
_release_hooks: list = []


def on_release(fn) -> None:
    """Call ``fn()`` whenever :func:`release_workspaces` runs (for holders of workspace views,
    such as the plans that :func:`indexer.prefill_topk` keeps)."""
    _release_hooks.append(fn)


def logits_buffers() -> list[torch.Tensor]:
    """The logits workspaces held now, one a device and stream (for memory accounting)."""
    with _lock:
        return [b for b, _ in _buffers.values()]


def workspace_bytes() -> dict[str, int]:
    """Bytes held by each device's workspaces (logits and top-k scratch), for ``python -m
    indexer info``."""
    out: dict[str, int] = {}
    with _lock:
        for (d, _), (b, _) in _buffers.items():
            out[str(d)] = out.get(str(d), 0) + b.numel() * 4
        for (d, _), b in _scratch.items():
            out[str(d)] = out.get(str(d), 0) + b.numel() * 8
    return out


def release_workspaces() -> None:
    """Drop every workspace (e.g. before a memory measurement), and the cached plans that
    hold views of them."""
    with _lock:
        _buffers.clear()
        _scratch.clear()
    for fn in _release_hooks:
        fn()
