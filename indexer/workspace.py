"""The logits workspace: one float32 buffer per device, allocated once and reused.

Allocating a fresh ``[rows, N]`` logits tensor per chunk lets the caching allocator pile up
blocks of ever-changing sizes (upstream, that fragmentation killed a 231K-token prefill).
Here each device owns one flat buffer of a fixed size, set by the byte budget
(``INDEXER_MAX_LOGITS_MB``, capped at the 2^31-byte chunk limit), allocated at the first
chunk that needs it and reused by every later chunk, layer and call. It is re-allocated only
if the budget changes.
"""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger("indexer")

MAX_CHUNK_BYTES = 2**31 - 1
"""Cap on one chunk's float32 logits: kernels index them with 32-bit offsets (AITER's
failed past 2 GiB upstream)."""

_lock = threading.Lock()
_buffers: dict[torch.device, torch.Tensor] = {}


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
    device = torch.device(device)
    size = max(workspace_numel(budget_bytes), numel)
    with _lock:
        buf = _buffers.get(device)
        if buf is None or buf.numel() != size:
            if buf is not None:
                log.info("indexer: re-allocating the %s logits workspace: %d -> %d MiB", device, buf.numel() * 4 >> 20, size * 4 >> 20)
            _buffers.pop(device, None)
            del buf  # free the old block before taking the new one
            buf = torch.empty(size, dtype=torch.float32, device=device)
            _buffers[device] = buf
        return buf[:numel]


def workspace_bytes() -> dict[str, int]:
    """Bytes held by each device's workspace, for ``python -m indexer info``."""
    with _lock:
        return {str(d): b.numel() * 4 for d, b in _buffers.items()}


def release_workspaces() -> None:
    """Drop every workspace (e.g. before a memory measurement)."""
    with _lock:
        _buffers.clear()
