"""A chunk's top-k launches replayed from a CUDA graph: one graph launch a call.

The Triton top-k of a chunk is three to six kernel launches whose arguments, once the plan
has bound them, change only with the logits' and the table's addresses and row strides.
Together they took 56-99 us of an H200 host's time a chunk, about half of a layer's run
(docs/benchmarks.md, "A forward step"). :class:`GraphedTopk` captures those launches into a
CUDA graph at the first call for a given (logits, out) placement and replays the graph on
later calls with the same one.

What a graph binds: the logits' and the table's addresses, shapes, strides and dtypes (the
key: a replay runs no check), and the plan's own tensors (row bounds, read in place, so
``update_bounds`` is seen; scratch). A call with another placement launches eagerly and
captures a graph for it, up to :data:`MAX_GRAPHS` placements; past them it launches
eagerly. Inside a caller's own capture it always launches eagerly (the caller's graph
records the kernels).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import torch

log = logging.getLogger("indexer")

#: placements (the logits' and the table's addresses and layouts) a chunk keeps a graph for: the
#: logits of a chunk land at one address layer after layer where the same allocations
#: repeat (DeepGEMM allocates its own), a few where they alternate
MAX_GRAPHS = 4

_streams: dict[int, "torch.cuda.Stream"] = {}
# one capture at a time in the process: the captures share a stream a device, and a stream
# can hold one capture
_capture_lock = threading.Lock()


def _capture_stream(index: int) -> "torch.cuda.Stream":
    # a capture needs a stream of its own (not the legacy default one); one a device suffices
    s = _streams.get(index)
    if s is None:
        s = _streams[index] = torch.cuda.Stream(device=index)
    return s


def _release(index: int, pool) -> None:
    # a capture that failed to begin or to end leaves its private pool registered with the
    # caching allocator (capture_end unregisters it only after a capture that ended): undo it
    for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            try:
                fn(index, pool)
            except Exception:  # noqa: BLE001 - already released, or another torch: nothing left to undo
                pass


class GraphedTopk:
    """``run(logits, out)`` replayed from a CUDA graph for each placement it has seen.

    Args:
        run: A chunk's top-k, called as ``run(logits, out)`` (float32 ``[R, n]`` logits,
            int32 ``[R, topk]`` table, both on ``device``): it launches work on the current
            stream that depends only on the two tensors' addresses and row strides and on
            state it holds, and it neither allocates nor synchronizes once it has run once.
        device: The CUDA device it runs on.

    Attributes:
        captures: Graphs captured so far.
        replays: Calls served by a replay.
        failed: Why a capture failed (then every call launches eagerly), or ``""``.
    """

    def __init__(self, run: Callable[[torch.Tensor, torch.Tensor], None], device: torch.device):
        self.run, self.device = run, device
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.captures = self.replays = 0
        self.failed = ""

    def __getattr__(self, name):
        # the wrapped top-k's attributes (scratch_numel, bind, plan...) stay reachable
        if name == "run":
            raise AttributeError(name)
        return getattr(self.run, name)

    def bind(self, scratch: torch.Tensor) -> None:
        """Rebind the wrapped top-k's scratch (``run.bind``); graphs captured on the old one
        are dropped."""
        self._graphs.clear()
        self.run.bind(scratch)

    def __call__(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        """Fill ``out`` from ``logits`` as ``run`` does, on the current stream."""
        # the placement and the layout: a replay runs no check, so a tensor of another shape,
        # dtype or stride at the same address must miss (and take the eager, checked path)
        key = (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype,
               out.data_ptr(), out.shape, out.stride(), out.dtype)
        graph = self._graphs.get(key)
        capturing = torch.cuda.is_current_stream_capturing()
        if graph is not None and not capturing:
            graph.replay()
            self.replays += 1
            return
        # eager first: it checks the tensors, and the first call compiles and binds
        self.run(logits, out)
        if capturing or self.failed or len(self._graphs) >= MAX_GRAPHS:
            return
        self._capture(key, logits, out)

    def _capture(self, key: tuple, logits: torch.Tensor, out: torch.Tensor) -> None:
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        ended = False
        try:
            with _capture_lock, torch.cuda.stream(_capture_stream(index)):
                # thread_local: another thread's CUDA calls meanwhile do not break this capture
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    self.run(logits, out)
                finally:
                    graph.capture_end()
                    ended = True
        except Exception as exc:  # noqa: BLE001 - any failure leaves the eager launches, which ran
            if not ended:
                _release(index, pool)
            self.failed = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("indexer: the top-k's launches could not be captured in a CUDA graph (%s); "
                        "launching them eagerly", self.failed)
            return
        self._graphs[key] = graph
        self.captures += 1
