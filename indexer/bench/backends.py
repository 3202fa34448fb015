"""``python -m indexer bench backends``: automatic dispatch against every backend forced, per
shape, and what each logits budget costs in time and memory.

For every shape and budget, one step plan per way (``auto`` and each backend that can run the
shape), each then timed with ``plan.run`` in interleaved rounds (every way once a round, so
drift hits all of them alike), synchronized around each call, median over the rounds:

- ``ms``: median synchronized time of one ``run``; ``x best``: over the fastest way of the
  shape at that budget (auto's line says how much it loses to the best forced backend).
- ``temp MiB``: device memory the plan and its runs hold at their peak beyond the inputs and
  ``out`` (the logits workspace, the top-k scratch, what a vendor kernel allocates itself).
- ``chunks``: row chunks of the plan (a smaller budget, more chunks).
- ``same``: the run's table has the same sets as the first table of the same backend (auto
  and the backend it picked, and every budget: how a step is cut into chunks never changes a
  backend's result). Backends are not compared with each other: their logits kernels sum in
  different orders, so keys whose logits differ in the last bits can trade places at the
  k-th value. The exit status is 1 where a table differs.

Shapes: ``ROWS@KEYS`` is the last ROWS rows of one causal request of KEYS keys (a late
chunk); ``first@KEYS`` is a whole request from its first key (KEYS rows, causal from 0);
``REQxKEYS:ROWS`` a packed batch of REQ requests of KEYS keys, ROWS late rows each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from .timing import median_ms, table

_GPU_SHAPES = "first@16384,first@32768,1024@16384,8192@16384,8192@65536,8192@131072,8x16384:1024"
_CPU_SHAPES = "first@1024,64@2048,4x512:64"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import positive_int

    p.add_argument("--shapes", default=None,
                   help=f"comma-separated ROWS@KEYS | first@KEYS | REQxKEYS:ROWS (GPU default {_GPU_SHAPES}; "
                        f"CPU {_CPU_SHAPES})")
    p.add_argument("--budgets", default=None,
                   help="comma-separated logits budgets in MiB (default: INDEXER_MAX_LOGITS_MB's value)")
    p.add_argument("--backends", default=None,
                   help="comma-separated backends to force beside auto (default: every backend of the platform's "
                        "priority list that can run the shape; off the CPU not torch)")
    p.add_argument("--heads", type=positive_int, default=64)
    p.add_argument("--head-dim", type=positive_int, default=128)
    p.add_argument("--topk", type=positive_int, default=2048)
    p.add_argument("--rounds", type=positive_int, default=5, help="interleaved timing rounds (median)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="write the rows as JSON here")


def parse_shape(text: str) -> tuple[str, list[int], list[int]]:
    """``(name, seq_lens, query_lens)`` of one shape given as ``ROWS@KEYS``, ``first@KEYS`` or
    ``REQxKEYS:ROWS``.

    Raises:
        ValueError: ``text`` is none of these, or a count is not a positive integer, or a
            request has more rows than keys.
    """
    text = text.strip()
    try:
        if "@" in text:
            rows, keys = text.split("@")
            n = int(keys)
            m = n if rows == "first" else int(rows)
            seq, q = [n], [m]
        elif "x" in text and ":" in text:
            req, rest = text.split("x")
            keys, rows = rest.split(":")
            seq, q = [int(keys)] * int(req), [int(rows)] * int(req)
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"shape {text!r}: expected ROWS@KEYS, first@KEYS or REQxKEYS:ROWS") from None
    if not seq or min(seq + q) < 1 or any(r > s for r, s in zip(q, seq)):
        raise ValueError(f"shape {text!r}: counts must be positive, rows at most keys")
    return text, seq, q


def _ways(args: argparse.Namespace, platform, problem) -> list[str]:
    from ..backends import backend_statuses

    if args.backends:
        return ["auto"] + [b.strip() for b in args.backends.split(",") if b.strip()]
    # the torch backend is the last resort off the CPU (a full-width torch.topk): never the
    # fastest there, and minutes at long contexts
    return ["auto"] + [s.name for s in backend_statuses(platform, problem)
                       if s.available and s.in_priority and (s.name != "torch" or platform.is_cpu())]


def _make_way(way: str, inp, budget: float, args: argparse.Namespace, device: torch.device) -> dict:
    """Plan one way and run it twice (warm-up); with the peak device memory it added beyond
    ``out``, measured from an empty workspace."""
    import indexer
    from ..workspace import release_workspaces

    m, n = inp.q.shape[0], inp.k.shape[0]
    row = dict(shape=None, M=m, N=n, budget_mb=budget, way=way)
    cuda = device.type == "cuda"
    release_workspaces()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    out = torch.empty(m, args.topk, dtype=torch.int32, device=device)
    try:
        step = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=n, heads=args.heads,
                            head_dim=args.head_dim, topk=args.topk, device=device, fp8_dtype=inp.q.dtype,
                            backend=way, max_logits_mb=budget)
        for _ in range(2):
            step.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out)
        if cuda:
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - a way that cannot run is a row, not a crash
        row["error"] = f"{type(exc).__name__}: {exc}"
        return dict(row=row)
    temp = (torch.cuda.max_memory_allocated(device) - base) / 2**20 - out.numel() * 4 / 2**20 if cuda else None
    row.update(way=way if way != "auto" else f"auto ({step.info.backend})", backend=step.info.backend,
               chunks=step.info.chunks, temp_mib=temp)
    return dict(row=row, step=step, out=out)


def _timed_run(way: dict, inp, device: torch.device) -> float:
    """One synchronized ``run``, in ms (CUDA events on a GPU)."""
    step, out = way["step"], way["out"]
    return median_ms(lambda: step.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out), device, warmup=0, repeats=1)


def run(args: argparse.Namespace) -> int:
    import indexer
    from .. import envs
    from ..platform import indexed_device, platform_for_device, platform_key
    from ..problem import make_problem
    from ..synthetic import make_inputs
    from ..workspace import release_workspaces

    device = indexed_device(args.device)
    cuda = device.type == "cuda"
    platform = platform_for_device(device)
    try:
        shapes = [parse_shape(s) for s in (args.shapes or (_GPU_SHAPES if cuda else _CPU_SHAPES)).split(",")]
        budgets = [float(b) for b in args.budgets.split(",")] if args.budgets else [envs.value("MAX_LOGITS_MB", platform_key(device))]
    except ValueError as exc:
        print(f"bench backends: {exc}", file=sys.stderr)
        return 2
    records = []
    for si, (name, seq, q) in enumerate(shapes):
        inp = make_inputs(seq, q, args.heads, args.head_dim, device, seed=sum(seq))
        m, n = inp.q.shape[0], inp.k.shape[0]
        starts, ends = inp.row_starts.cpu(), inp.row_ends.cpu()
        problem = make_problem(starts, ends, num_keys=n, heads=args.heads, head_dim=args.head_dim, topk=args.topk,
                               fp8_dtype=inp.q.dtype, device=device)
        ways = _ways(args, platform, problem)
        first: dict[str, torch.Tensor] = {}  # backend -> its sorted table at the first budget
        for budget in budgets:
            print(f"[{si + 1}/{len(shapes)}] {name} (M={m}, N={n}), budget {budget:g} MiB: {', '.join(ways)}",
                  file=sys.stderr, flush=True)
            made = [_make_way(way, inp, budget, args, device) for way in ways]
            for w in made:
                w["row"]["shape"] = name
            live = [w for w in made if "error" not in w]
            times: list[list[float]] = [[] for _ in live]
            for _ in range(args.rounds):
                for i, w in enumerate(live):
                    times[i].append(_timed_run(w, inp, device))
            best = min((statistics.median(t) for t in times), default=None)
            for w, t in zip(live, times):
                r = w["row"]
                r["ms"] = statistics.median(t)
                r["x_best"] = r["ms"] / best
                got = w["out"].sort(1).values
                ref = first.setdefault(r["backend"], got)
                r["same"] = bool(torch.equal(got, ref))
            for w in made:
                r = w["row"]
                records.append(r)
                print("  " + (f"{r['way']}: {r['error']}" if "error" in r else
                              f"{r['way']}: {r['chunks']} chunks, {r['ms']:.3f} ms, {r['x_best']:.3f}x best, "
                              f"same sets {r['same']}" +
                              (f", temp {r['temp_mib']:.0f} MiB" if r["temp_mib"] is not None else "")),
                      file=sys.stderr, flush=True)
            made = live = None
        inp = first = None
        release_workspaces()
        if cuda:
            torch.cuda.empty_cache()
    cols = [("shape", "shape", "s"), ("budget_mb", "budget MiB", "g"), ("way", "way", "s"), ("chunks", "chunks", "d"),
            ("ms", "ms", ".3f"), ("x_best", "x best", ".3f"), ("temp_mib", "temp MiB", ".0f"), ("same", "same", "")]
    print(table([r for r in records if "error" not in r], cols))
    for r in records:
        if "error" in r:
            print(f"{r['shape']} @ {r['budget_mb']:g} MiB, {r['way']}: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=platform.describe(), torch=torch.__version__, rows=records), f, indent=1)
    return 0 if all(r.get("same", True) for r in records) else 1
