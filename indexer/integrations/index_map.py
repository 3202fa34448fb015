"""Row-relative top-k indices rewritten in place into an engine's own index space.

The top-k returns, per row, indices relative to the row's first key, ``-1`` padded. SGLang
wants them as positions in its gathered key buffer (a per-row offset added) or as KV slots
(each request's page table looked up). :func:`map_indices_` does either in one pass over the
table: on a GPU one Triton kernel (read each index, add or look up, write it back), elsewhere
the same with torch ops (four to five passes; the reference the kernel is tested against).
"""

from __future__ import annotations

import torch

from ..platform import device_guard
from ..topk.triton.launch import launch_reasons

try:  # lazy / optional import
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on environment
    triton = None

__all__ = ["map_indices_", "map_indices_reference_"]


def map_indices_reference_(sel: torch.Tensor, offsets: torch.Tensor | None = None,
                           table: torch.Tensor | None = None, table_rows: torch.Tensor | None = None) -> None:
    """:func:`map_indices_` with torch ops (any device)."""
    if sel.shape[0] == 0:
        return
    valid = sel >= 0
    if offsets is not None:
        sel.add_(offsets[:, None].to(torch.int32))
    else:
        sel.copy_(table[table_rows[:, None], sel.clamp(min=0)])
    sel.masked_fill_(~valid, -1)


def map_indices_(sel: torch.Tensor, offsets: torch.Tensor | None = None, table: torch.Tensor | None = None,
                 table_rows: torch.Tensor | None = None) -> None:
    """Rewrite row-relative indices in place; ``-1`` stays ``-1``. No host sync.

    Exactly one of ``offsets`` or (``table``, ``table_rows``) is given. The caller has checked
    the values: ``table_rows`` in ``[0, B)`` and every index a row holds below ``W`` (SGLang's
    adapter does, at plan time); they are not read here (no sync).

    Args:
        sel: int32 ``[M, topk]`` (any strides): row-relative indices, ``-1`` padded.
        offsets: int32/int64 ``[M]`` on ``sel``'s device: ``sel[i, j] += offsets[i]`` (int32
            arithmetic).
        table: int ``[B, W]`` on ``sel``'s device: ``sel[i, j] = table[table_rows[i], sel[i, j]]``.
        table_rows: int32/int64 ``[M]`` on ``sel``'s device: each row's row of ``table``.

    Triton's kernel runs where it can launch on ``sel``'s device (a GPU, or the CPU under
    Triton's interpreter) for an int32 ``sel`` and ``table`` of column stride 1; otherwise
    :func:`map_indices_reference_`.

    Raises:
        ValueError: not exactly one mapping, or a vector of another length or device.
    """
    if (offsets is None) == (table is None) or (table is not None and table_rows is None):
        raise ValueError("map_indices_ takes offsets, or table with table_rows")
    rows, topk = sel.shape
    for name, v in (("offsets", offsets), ("table_rows", table_rows)):
        if v is not None and (v.dim() != 1 or v.numel() != rows or v.device != sel.device):
            raise ValueError(f"{name} must be [{rows}] (one entry a row of sel) on {sel.device}, got "
                             f"{list(v.shape)} on {v.device}")
    if table is not None and (table.dim() != 2 or table.device != sel.device):
        raise ValueError(f"table must be [B, W] on {sel.device}, got {list(table.shape)} on {table.device}")
    if rows == 0 or topk == 0:
        return
    if (triton is None or launch_reasons(sel.device) or sel.dtype != torch.int32 or sel.stride(1) != 1
            or (table is not None and (table.dtype != torch.int32 or table.stride(1) != 1))):
        map_indices_reference_(sel, offsets, table, table_rows)
        return
    block = min(triton.next_power_of_2(topk), 2048)
    grid = (rows, triton.cdiv(topk, block))
    with device_guard(sel):
        # (the kernel reads the vectors with unit stride: a strided one is copied, [M])
        if offsets is not None:
            offsets = offsets.contiguous()
            _map_kernel[grid](sel, sel.stride(0), offsets, sel, 0, offsets, topk, LOOKUP=False, BLOCK=block,
                              num_warps=4)
        else:
            table_rows = table_rows.contiguous()
            _map_kernel[grid](sel, sel.stride(0), table_rows, table, table.stride(0), table_rows, topk, LOOKUP=True,
                              BLOCK=block, num_warps=4)


if triton is not None:

    @triton.jit
    def _map_kernel(sel_ptr, stride_sm, off_ptr, table_ptr, stride_tb, rows_ptr, topk, LOOKUP: tl.constexpr,
                    BLOCK: tl.constexpr):
        # one program a row's block of BLOCK indices
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < topk
        ptr = sel_ptr + row.to(tl.int64) * stride_sm + cols
        s = tl.load(ptr, mask=inside, other=-1)
        valid = s >= 0
        if LOOKUP:
            r = tl.load(rows_ptr + row).to(tl.int64)
            v = tl.load(table_ptr + r * stride_tb + s, mask=inside & valid, other=-1)
        else:
            v = s + tl.load(off_ptr + row).to(tl.int32)
        tl.store(ptr, tl.where(valid, v, -1), mask=inside)
