"""The Triton per-row top-k (imports Triton lazily; every name here loads without it).

- :mod:`.ragged`: :func:`ragged_topk` and :class:`RaggedTopk` (prepared once, run per layer).
- :mod:`.config`: constants, launch configs per GPU architecture, launch planning.
- :mod:`.kernels`: the jit functions and kernels; :mod:`.ptx`: their inline PTX.
- :mod:`.launch`: whether Triton can launch here, and launches with little host time.
"""

from __future__ import annotations

from .config import (
    STAT_WHOLE,
    STAT_PLAIN,
    STAT_RETRIED,
    STAT_SAMPLED,
    STAT_SHORT,
    STAT_SEEDED,
    STAT_SPLIT,
    TopkConfig,
    launch_config,
    scratch_bytes_per_row,
    seeds_fallback,
)
from .launch import is_available, launch_reasons
from .ragged import RaggedTopk, ragged_topk

__all__ = [
    "STAT_WHOLE", "STAT_PLAIN", "STAT_RETRIED", "STAT_SAMPLED", "STAT_SEEDED", "STAT_SHORT", "STAT_SPLIT",
    "RaggedTopk", "TopkConfig",
    "is_available", "launch_config", "launch_reasons", "ragged_topk", "scratch_bytes_per_row", "seeds_fallback",
]
