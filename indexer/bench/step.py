"""``python -m indexer bench step``: a forward step of L layers, as an engine queues it.

Each layer is some other device work (a ``[M, G] x [G, G]`` matmul, standing in for the
rest of the layer) followed by the indexer, in three ways, side by side in one process:

- ``plan + run``: :func:`indexer.plan` once for the step, then ``plan.run`` every layer.
- ``prefill_topk``: one :func:`indexer.prefill_topk` call a layer (plans every call).
- ``deepgemm + torch.topk`` (where DeepGEMM runs): the plain composition, DeepGEMM's
  ``fp8_mqa_logits`` (full width, cleaned) and ``torch.topk`` on it.

Per way and configuration:

- ``host us``: the host's time of one indexer call with the device kept busy (median of 20
  calls, each timed alone).
- ``kernels ms``: the sum of the device time of one layer's kernels (matmul included),
  from the profiler, over the L layers queued back to back.
- ``idle %``: in that same profiled run, the share of the span from the first kernel's start
  to the last one's end in which no kernel ran (launch gaps, the device waiting for the host).
- ``queued ms``: one layer's wall time with the L layers queued back to back, one sync at
  the end (what a forward step sees), not profiled.
- ``graph ms``: the same L layers replayed from one CUDA graph (where the way can be
  captured: not ``prefill_topk``, which syncs).
- ``sync ms``: one indexer call alone, synchronized around it.
- ``plan ms``: the plan's own time (once a step).
- ``waves`` (with ``--tp``): the waves the plan's exchange goes in (``INDEXER_EXCHANGE_WAVES``).

With ``--tp N`` the ranks run in processes of their own (NCCL on GPUs, gloo on CPU), each
planning the same step with the group; every rank's numbers are kept (``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ..platform import indexed_device
from .timing import capture, host_ms, int_list, median_ms, table

WAYS = ("plan + run", "prefill_topk", "deepgemm + torch.topk")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import non_negative_int, positive_int

    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--context", default=None, help="keys N of one late-chunk request, comma-separated "
                   "(GPU default 16384,65536,131072; CPU 2048)")
    p.add_argument("--rows", type=positive_int, default=None, help="rows M of each late chunk (GPU default 8192; CPU 256)")
    p.add_argument("--batch", default=None, help="a packed batch REQxKEYS:ROWS, e.g. 8x16384:1024 (GPU default; "
                   "CPU 4x512:64; 'none' skips)")
    p.add_argument("--layers", type=positive_int, default=None, help="layers a step (default 61; CPU 4)")
    p.add_argument("--gemm", type=non_negative_int, default=None, help="G of the [M, G] x [G, G] matmul before each indexer call "
                   "(default 4096; CPU 64; 0: none)")
    p.add_argument("--heads", type=positive_int, default=None)
    p.add_argument("--head-dim", type=positive_int, default=None)
    p.add_argument("--topk", type=positive_int, default=None)
    p.add_argument("--backend", default=None, help="indexer backend (default auto)")
    p.add_argument("--tp", type=positive_int, default=1, help="ranks (processes; NCCL on GPUs, gloo on CPU)")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--json", default=None, help="write the rows here")


_GPU = dict(context="16384,65536,131072", rows=8192, batch="8x16384:1024", layers=61, gemm=4096, heads=64,
            head_dim=128, topk=2048)
_CPU = dict(context="2048", rows=256, batch="4x512:64", layers=4, gemm=64, heads=4, head_dim=64, topk=256)


def _settings(args: argparse.Namespace) -> dict:
    base = _GPU if args.device.startswith("cuda") else _CPU
    cfg = {key: (getattr(args, key) if getattr(args, key, None) is not None else value) for key, value in base.items()}
    cfg.update(device=args.device, backend=args.backend or "auto", repeats=args.repeats)
    return cfg


def _configs(cfg: dict) -> list[dict]:
    out = [dict(name=f"M={min(cfg['rows'], n)} N={n}", seq=[n], q=[min(cfg["rows"], n)])
           for n in int_list(str(cfg["context"]))]
    if cfg["batch"] and cfg["batch"] != "none":
        reqs, rest = cfg["batch"].split("x")
        keys, rows = (int(x) for x in rest.split(":"))
        out.append(dict(name=f"batch {reqs}x{keys} keys, {rows} rows each", seq=[keys] * int(reqs),
                        q=[rows] * int(reqs)))
    return out


def _profiled_layers(layer, layers: int, device: torch.device) -> tuple[float | None, float | None]:
    """``(kernels ms a layer, idle share)`` of ``layers`` layers queued back to back under
    the profiler: the kernels' summed device time, and the part of the span (first kernel's
    start to last one's end) in which none ran."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    layer()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(layers):
            layer()
        torch.cuda.synchronize(device)
    ops = [e.time_range for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not ops:
        return None, None
    busy = sum(r.end - r.start for r in ops)
    span = max(r.end for r in ops) - min(r.start for r in ops)
    return busy / layers / 1e3, 1 - busy / span if span else 0.0


def _graph_layers_ms(layer, layers: int, device: torch.device, repeats: int) -> float | None:
    """One layer's time with ``layers`` layers replayed from one CUDA graph."""
    if device.type != "cuda":
        return None
    graph = capture(_layers(layer, layers), device)
    ms = median_ms(graph.replay, device, warmup=1, repeats=repeats) / layers
    del graph
    return ms


def _queued_layers_ms(layer, layers: int, device: torch.device, repeats: int) -> float:
    """One layer's wall time with ``layers`` layers queued back to back, one sync at the end."""
    return median_ms(_layers(layer, layers), device, warmup=1, repeats=repeats) / layers


def _layers(layer, layers: int):
    def step():
        for _ in range(layers):
            layer()

    return step


def _plain_deepgemm(inp, topk: int):
    """The plain composition, or None where DeepGEMM cannot run."""
    from ..backends import get_backend

    if get_backend("deepgemm").not_supported_reasons(None) or inp.q.device.type != "cuda" or inp.q.shape[1] not in (32, 64):
        return None
    import deep_gemm

    fn = getattr(deep_gemm, "fp8_mqa_logits", None)
    if fn is None:
        return None
    kv = (inp.k, inp.k_scale)

    def call():
        logits = fn(inp.q, kv, inp.weights, inp.row_starts, inp.row_ends, clean_logits=True)
        return torch.topk(logits, min(topk, logits.shape[1]), dim=1).indices

    return call


def _rank_main(rank: int, world: int, cfg: dict) -> list[dict]:
    import indexer
    from indexer.synthetic import make_inputs

    cuda = cfg["device"].startswith("cuda")
    device = torch.device("cpu")
    if cuda:
        # a rank process uses GPU `rank`; one process, the device asked for
        device = torch.device("cuda", rank) if world > 1 else indexed_device(cfg["device"])
        torch.cuda.set_device(device)
    group = None
    if world > 1:
        import torch.distributed as dist

        group = dist.group.WORLD
    topk, layers, reps = cfg["topk"], cfg["layers"], cfg["repeats"]
    records = []
    configs = _configs(cfg)
    for ci, c in enumerate(configs):
        inp = make_inputs(c["seq"], c["q"], cfg["heads"], cfg["head_dim"], device, seed=sum(c["seq"]))
        m, n = inp.q.shape[0], inp.k.shape[0]
        x = w = None
        if cfg["gemm"]:
            dtype = torch.bfloat16 if cuda else torch.float32
            x = torch.randn(m, cfg["gemm"], device=device, dtype=dtype)
            w = torch.randn(cfg["gemm"], cfg["gemm"], device=device, dtype=dtype)
        other = (lambda: torch.mm(x, w)) if x is not None else (lambda: None)
        out = torch.empty(m, topk, dtype=torch.int32, device=device)
        kw = dict(group=group, backend=cfg["backend"])
        if world > 1:
            kw["min_rows_per_rank"] = 0
        t0 = time.perf_counter()
        step = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=n, heads=cfg["heads"],
                            head_dim=cfg["head_dim"], topk=topk, device=device, fp8_dtype=inp.q.dtype, **kw)
        plan_ms = (time.perf_counter() - t0) * 1e3
        layer_args = (inp.q, inp.k, inp.k_scale, inp.weights)
        calls = {
            "plan + run": lambda: step.run(*layer_args, out=out),
            "prefill_topk": lambda: indexer.prefill_topk(*inp.args(), topk, out=out, **kw),
        }
        plain = _plain_deepgemm(inp, topk) if world == 1 else None
        if plain is not None:
            calls["deepgemm + torch.topk"] = plain
        ref = None
        for way, call in calls.items():
            if rank == 0:
                print(f"[{ci + 1}/{len(configs)}] {c['name']}: {way}", file=sys.stderr, flush=True)
            call()
            res = out.clone() if way != "deepgemm + torch.topk" else None
            if ref is None:
                ref = res

            def layer(call=call):
                other()
                call()

            kernels_ms, idle = _profiled_layers(layer, layers, device)
            records.append(dict(
                config=c["name"], way=way, rank=rank, world=world, M=m, N=n, layers=layers,
                backend=step.info.backend, chunks=step.info.chunks, compressed=step.info.compressed_chunks,
                waves=step.info.waves,
                plan_ms=plan_ms if way == "plan + run" else None,
                # (prefill_topk waits for the device: its host time alone is not measurable so)
                host_us=host_ms(call, device) * 1e3 if way != "prefill_topk" else None,
                kernels_ms=kernels_ms, idle_pct=None if idle is None else 100 * idle,
                queued_ms=_queued_layers_ms(layer, layers, device, reps),
                graph_ms=_graph_layers_ms(layer, layers, device, reps) if way != "prefill_topk" else None,
                sync_ms=median_ms(call, device, warmup=1, repeats=max(reps, 3)),
                same=None if res is None else bool(torch.equal(res.sort(1).values, ref.sort(1).values)),
            ))
        inp = x = w = step = None
        if cuda:
            torch.cuda.empty_cache()
    return records


def run(args: argparse.Namespace) -> int:
    cfg = _settings(args)
    if args.tp > 1:
        from ..launch import run_ranks

        per_rank = run_ranks(_rank_main, args.tp, cfg, backend="nccl" if cfg["device"].startswith("cuda") else "gloo",
                             timeout=3600)
        rows = [r for rank_rows in per_rank for r in rank_rows]
    else:
        rows = _rank_main(0, 1, cfg)
    plain = {r["config"]: r for r in rows if r["way"] == "deepgemm + torch.topk"}
    for r in rows:
        p = plain.get(r["config"])
        r["vs_plain_sync"] = p["sync_ms"] / r["sync_ms"] if p else None
        r["queued_over_kernels"] = r["queued_ms"] / r["kernels_ms"] if r["kernels_ms"] else None
    print(f"bench step: {cfg['layers']} layers, each a {cfg['gemm']}-wide matmul then the indexer "
          f"(H={cfg['heads']} D={cfg['head_dim']} topk={cfg['topk']}, tp={args.tp}) on {cfg['device']}; ms per layer, "
          f"median of {cfg['repeats']}")
    cols = [("config", "config", "s"), ("way", "way", "s"), ("rank", "rank", "d"), ("backend", "backend", "s"),
            ("chunks", "chunks", "d")] + ([("waves", "waves", "d")] if args.tp > 1 else []) + [
            ("host_us", "host us", ".0f"), ("kernels_ms", "kernels ms", ".3f"),
            ("idle_pct", "idle %", ".2f"), ("queued_ms", "queued ms", ".3f"),
            ("queued_over_kernels", "queued/kernels", ".3f"), ("graph_ms", "graph ms", ".3f"),
            ("sync_ms", "sync ms", ".3f"), ("vs_plain_sync", "plain/this (sync)", ".2f"),
            ("plan_ms", "plan ms", ".2f"), ("same", "same sets", "")]
    print(table([dict(r, same="-" if r["same"] is None else ("yes" if r["same"] else "NO")) for r in rows],
                [c if c[0] != "same" else ("same", "same sets", "s") for c in cols]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["same"] is not False for r in rows) else 1

