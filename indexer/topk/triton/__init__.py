"""The Triton per-row top-k (imports Triton lazily; every name here loads without it).

- :mod:`.ragged`: :func:`ragged_topk` and :class:`RaggedTopk` (prepared once, run per layer),
  their kernels and launch configs.
- :mod:`.launch`: whether Triton can launch here, and launches with little host time.
"""

from __future__ import annotations

from .launch import device_guard, is_available, launch_reasons
from .ragged import (
    STAT_DIRECT,
    STAT_PLAIN,
    STAT_RETRIED,
    STAT_SAMPLED,
    STAT_SHORT,
    RaggedTopk,
    launch_config,
    ragged_topk,
    scratch_bytes_per_row,
)

__all__ = [
    "STAT_DIRECT", "STAT_PLAIN", "STAT_RETRIED", "STAT_SAMPLED", "STAT_SHORT", "RaggedTopk", "device_guard",
    "is_available", "launch_config", "launch_reasons", "ragged_topk", "scratch_bytes_per_row",
]
