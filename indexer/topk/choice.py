"""Which top-k a chunk runs, prepared at plan time: the Triton kernel, the native row
kernel or the torch reference.

``INDEXER_TOPK`` picks the family (per platform: ``triton`` where Triton can launch on
NVIDIA, ``torch`` elsewhere); within ``triton``, chunks of short rows take the native CUDA
C++ row kernel (``INDEXER_NATIVE_TOPK_MAX_KEYS``). :func:`prepare_topk` makes each chunk's
callable once, and :func:`bind_topk` gives the Triton ones their scratch in the plan's
workspace.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..problem import Problem
from .reference import row_topk


def topk_choice(device: torch.device) -> str:
    """The top-k that the GPU backends run on ``device``: ``INDEXER_TOPK``'s value.

    Where the value is only the platform's default (``triton`` on NVIDIA) and Triton cannot
    run, it is ``torch``; a ``triton`` that was asked for explicitly and cannot run raises.

    Raises:
        ValueError: ``INDEXER_TOPK`` (or its platform variant) says ``triton`` and Triton
            cannot run on ``device``.
    """
    from .. import envs
    from ..platform import platform_key
    from .triton import launch as tk  # imports triton lazily, never raises

    res = envs.resolve("TOPK", platform_key(device))
    if res.value != "triton":
        return res.value
    reasons = tk.launch_reasons(device)
    if not reasons:
        return "triton"
    if res.source.startswith("default"):
        return "torch"
    raise ValueError(f"{res.source} asks for the Triton top-k, but {'; '.join(reasons)}; set it to 'torch' or install triton")


#: Peak bytes the torch top-k path's temporaries take a logit, measured with the CPU profiler
#: (``row_topk`` on ``[64, 2**18]`` float32): 4.9 on the sync-free path (int64 keys of value and
#: column for an eighth of the rows at a time, the GPUs' path), 0.25 on the CPU's path with no
#: ties and 5.9 with every row tied at its k-th value.
TORCH_TOPK_COLUMN_BYTES = 6


def topk_row_bytes(problem: Problem, choice: str | None = None) -> int:
    """Bytes per row of the chosen top-k's temporaries that do not grow with the row's width:
    torch.topk's k+1 values and indices, or the Triton kernel's candidate lists."""
    if (topk_choice(problem.device) if choice is None else choice) == "triton":
        from .triton.config import scratch_bytes_per_row

        return scratch_bytes_per_row(problem.topk)
    return 12 * (problem.topk + 1)


def topk_bytes(problem: Problem, rows: torch.Tensor, width: torch.Tensor, choice: str | None = None) -> torch.Tensor:
    """Bytes of the chosen top-k's temporaries for chunks of ``rows`` rows and ``width``
    columns (int64 tensors), for chunk budgets: :func:`topk_row_bytes` a row; for the torch
    path :data:`TORCH_TOPK_COLUMN_BYTES` a column of every row, for the Triton kernel the
    lists its split rows stage (:func:`~.triton.config.split_stage_bytes`)."""
    choice = topk_choice(problem.device) if choice is None else choice
    if choice == "triton":
        from .triton.config import split_stage_bytes

        return rows * topk_row_bytes(problem, choice) + split_stage_bytes(problem.device, problem.topk, rows, width)
    return rows * (topk_row_bytes(problem, choice) + TORCH_TOPK_COLUMN_BYTES * width)


def native_max_keys(device: torch.device) -> tuple[int, str]:
    """``(keys, why)``: chunks whose rows span at most ``keys`` keys take the native row
    top-k on ``device`` (``INDEXER_NATIVE_TOPK_MAX_KEYS``); ``0`` with ``why`` where the
    platform's default asks for it and it cannot run (no nvcc, not NVIDIA).

    Raises:
        ValueError: The flag was set explicitly and the kernel cannot run, or it is over
            :data:`indexer.topk.cuda.MAX_KEYS`.
    """
    from .. import envs
    from ..platform import platform_key
    from . import cuda as native

    res = envs.resolve("NATIVE_TOPK_MAX_KEYS", platform_key(device))
    if res.value == 0:
        return 0, ""
    explicit = not res.source.startswith("default")
    if res.value > native.MAX_KEYS and explicit:
        raise ValueError(f"{res.source}={res.value}: the native row top-k takes rows of at most {native.MAX_KEYS} keys")
    reasons = native.native_reasons(device)
    if reasons and explicit:
        raise ValueError(f"{res.source} asks for the native row top-k, but {'; '.join(reasons)}; set it to 0")
    if reasons:
        return 0, "native row top-k off: " + "; ".join(reasons)
    return min(res.value, native.MAX_KEYS), ""


def _native_fits(device: torch.device, rows: int, n: int) -> bool:
    from .cuda import native_fits
    from .triton.config import _sm_count

    return native_fits(rows, n, _sm_count(device))


def prepare_topk(problem: Problem, chunks: Sequence, choice: str | None = None) -> None:
    """Plan time: each chunk's top-k (``chunk.state["topk"]``, called as ``(logits, out)``),
    torch.topk or, where the choice (:func:`topk_choice`; ``choice`` overrides) is
    ``triton``, the native row kernel for chunks no wider than :func:`native_max_keys` whose
    rows fit its budget (:func:`indexer.topk.cuda.native_fits`) and the Triton kernel for the
    rest; on NVIDIA a Triton chunk's launches are replayed from CUDA graphs
    (:class:`~indexer.topk.graphed.GraphedTopk`, ``INDEXER_TOPK_GRAPH``).
    ``state["topk_kind"]`` names it (``torch``, ``triton``, ``triton (graphed)``,
    ``native``) and ``state["topk_note"]`` says why a native kernel that was asked for by
    default is not used. Triton's chunks ask for their scratch (``state["scratch_numel"]``),
    bound by :func:`bind_topk` once the plan's workspace holds it."""
    choice = topk_choice(problem.device) if choice is None else choice
    native, why = native_max_keys(problem.device) if choice == "triton" else (0, "")
    graphed = choice == "triton" and topk_graphed(problem.device)
    for c in chunks:
        if c.empty:
            continue
        if choice == "triton" and 0 < native and c.width <= native and _native_fits(problem.device, c.num_rows,
                                                                                      c.width):
            from .cuda import NativeRowTopk

            run, kind = NativeRowTopk(problem.device, c.num_rows, c.width, c.block_starts, c.lengths,
                                      problem.topk), "native"
        elif choice == "triton":
            from .triton.ragged import RaggedTopk

            run, kind = RaggedTopk(problem.device, c.num_rows, c.width, c.block_starts, c.lengths,
                                   problem.topk), "triton"
            c.state["scratch_numel"] = run.scratch_numel
            if why:
                c.state["topk_note"] = why
            if graphed:
                from .graphed import GraphedTopk

                run, kind = GraphedTopk(run, problem.device), "triton (graphed)"
        else:
            run, kind = _TorchTopk(c, problem.topk), "torch"
        c.state["topk"] = run
        c.state["topk_kind"] = kind


def topk_graphed(device: torch.device) -> bool:
    """Whether a plan's Triton top-k chunks replay their launches from CUDA graphs on
    ``device`` (``INDEXER_TOPK_GRAPH``; NVIDIA only, the platform it was tested on:
    :mod:`indexer.topk.graphed`)."""
    from .. import envs
    from ..platform import platform_key
    from .triton.config import is_nvidia

    # the flag is read (and so checked) on every platform
    return bool(envs.resolve("TOPK_GRAPH", platform_key(device)).value) and is_nvidia(device)


def bind_topk(chunks: Sequence) -> None:
    """Give each Triton top-k its scratch in the plan's workspace."""
    for c in chunks:
        run = c.state.get("topk")
        if run is not None and hasattr(run, "bind"):
            run.bind(c.state["scratch"])


class _TorchTopk:
    def __init__(self, chunk, topk: int):
        self.chunk, self.topk = chunk, topk

    def __call__(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        c = self.chunk
        # a compressed block has no -inf around the windows: the way that never reads there.
        # Off the CPU the host's lengths are not used: a CUDA graph would freeze the choice
        # they make (no row long enough to select) past a later update_bounds
        host = c.lengths_host if logits.device.type == "cpu" else None
        row_topk(logits, c.block_starts, c.lengths, self.topk, out, host, sync_free=c.compressed or None)
