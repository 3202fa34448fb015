"""Timing helpers: device events after warm-up, median of repeats."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5) -> float:
    """Median wall time of ``fn`` in milliseconds.

    CUDA: timed with CUDA events around each call (after ``warmup`` untimed calls). CPU:
    ``time.perf_counter``.
    """
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def queued_median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5) -> float:
    """Median device time of ``fn`` in milliseconds: the calls queued back to back, a CUDA
    event between each two and one synchronize at the end, so that the host launches the next
    call while the device runs this one (Triton's ``do_bench`` times this way; a host slower
    than the device still shows). :func:`median_ms` synchronizes around each call, so its
    times include the host's time to launch. CPU: :func:`median_ms`."""
    if device.type != "cuda":
        return median_ms(fn, device, warmup, repeats)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    events[0].record()
    for event in events[1:]:
        fn()
        event.record()
    torch.cuda.synchronize(device)
    return statistics.median(a.elapsed_time(b) for a, b in zip(events, events[1:]))


def capture(fn: Callable[[], object], device: torch.device) -> "torch.cuda.CUDAGraph":
    """``fn`` captured in a CUDA graph, after one warm-up call on a side stream (as
    ``torch.cuda.graph``'s documentation does: first calls compile and allocate)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_ms(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float | None:
    """Median device time of ``fn`` replayed from a CUDA graph (no host work in it), or None
    off CUDA or where ``fn`` cannot be captured."""
    if device.type != "cuda":
        return None
    try:
        g = capture(fn, device)
    except RuntimeError:
        return None
    return queued_median_ms(g.replay, device, warmup=1, repeats=repeats)


def host_ms(fn: Callable[[], object], device: torch.device, warmup: int = 2, calls: int = 20) -> float:
    """The host's time for one call of ``fn`` in milliseconds: the median of ``calls`` calls,
    each timed alone. CUDA: a sleep kernel is queued first, so that the device is busy and
    no launch waits on it: the time to validate, allocate and launch alone (the first call
    after a synchronization takes several times longer on the hosts measured; the median
    leaves it out). CPU: :func:`median_ms`."""
    if device.type != "cuda":
        return median_ms(fn, device, warmup, calls)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    torch.cuda._sleep(1 << 30)  # about half a second of device time, far longer than the calls' host time
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize(device)
    return statistics.median(times) * 1e3


def int_list(text: str) -> list[int]:
    """``"16384,65536"`` -> ``[16384, 65536]`` (a comma-separated CLI option)."""
    return [int(x) for x in text.split(",")]


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Fixed-width text table; ``columns`` are (key, header, format spec)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else format(r[k], f)) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(columns))) for c in cells)
