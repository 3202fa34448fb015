"""The logits workspace: one float32 buffer per device, reused across chunks and calls.

Allocating a fresh ``[rows, N]`` logits tensor per chunk lets the caching allocator pile up
blocks of ever-changing sizes (upstream, that fragmentation killed a 231K-token prefill).
Here each device owns one flat buffer that only ever grows, and it never grows past the
largest chunk the byte budget allows.
"""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_buffers: dict[torch.device, torch.Tensor] = {}


def logits_workspace(device: torch.device, numel: int) -> torch.Tensor:
    """A float32 ``[numel]`` view of the device's workspace (contents undefined).

    Args:
        device: Device of the workspace.
        numel: Elements needed; the buffer grows to this size if it is smaller.
    """
    device = torch.device(device)
    with _lock:
        buf = _buffers.get(device)
        if buf is None or buf.numel() < numel:
            _buffers.pop(device, None)
            del buf  # free the old block before taking the larger one
            buf = torch.empty(numel, dtype=torch.float32, device=device)
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
