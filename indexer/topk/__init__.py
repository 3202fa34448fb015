"""The per-row top-k op, shared by every logits backend.

For each row of a float32 logits block it keeps the ``k`` largest values of the row's window
(``[start, start + length)`` of the block's columns) and writes their indices relative to the
window's start, unordered, ``-1`` padded, ties at the k-th value going to the lowest index.

- :func:`topk_per_row` (:mod:`.op`): the op itself, on the implementation chosen for the
  device (or the one asked for).
- :mod:`.reference`: :func:`row_topk`, torch.topk with that tie rule (every device).
- :mod:`.triton`: the Triton kernel (:func:`~.triton.ragged_topk`), whose time does not
  depend on the values (docs/topk.md).
- :mod:`.choice`: which one a plan's chunks run (``INDEXER_TOPK``), prepared at plan time.
"""

from __future__ import annotations

from .choice import bind_topk, prepare_topk, topk_bytes, topk_choice, topk_row_bytes
from .op import topk_per_row
from .reference import row_topk

__all__ = ["bind_topk", "prepare_topk", "row_topk", "topk_bytes", "topk_choice", "topk_per_row", "topk_row_bytes"]
