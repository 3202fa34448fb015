"""``python -m indexer bench tp``: replicated vs sharded prefill over a sweep, on 1..N ranks.

Spawns one process per rank (NCCL on GPUs, gloo on CPU) and, for each configuration (late
prefill chunks over a context-length sweep, whole first chunks, a varlen batch of several
requests, a below-gate step and an optional very large step), times the replicated
computation and every strategy side by side in the same processes:

- total: per call, ranks start together (barrier) and the call is timed with CUDA events
  on every rank; a repeat's time is the slowest rank's; the median over repeats is reported.
- breakdown: calls with ``timing=True`` (one warm-up, then as many repeats), each timed on
  the host clock, give the split of a call into compute, wait for the slowest rank and
  reassembly (the reassembly alone: ranks meet at a barrier before it is timed), all three
  from one call on one rank (the slowest rank of the median repeat). The row's compute /
  exchange ms are its total cut in those proportions, so they never add up to more than the
  total; the measured ms are under ``breakdown_raw`` in ``tp.json``.
- exact: every rank's sharded table has, per row, the same set as its replicated one.
- peak: ``torch.cuda.max_memory_allocated`` over the call, per rank, max reported.

Writes ``tp.json``, ``tp.csv`` and ``tp_speedup.png`` (matplotlib: ``pip install
'indexer[plot]'``) to ``--out`` and prints that folder.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .timing import table

VARIANTS = ("contiguous", "remainder0", "fold", "balanced", "striped", "auto")


def _strategy_list(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    bad = [x for x in names if x not in VARIANTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(VARIANTS)}, got {text!r}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import non_negative_int, positive_int

    p.add_argument("--tp", type=positive_int, default=None, help="ranks (default: visible GPUs, else 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--contexts", default=None, help="late-chunk key counts N (GPU default 16K..1M)")
    p.add_argument("--rows", type=positive_int, default=None, help="rows of each late chunk (GPU default 8192)")
    p.add_argument("--first", default=None, help="whole first chunks, M = N (GPU default 16384,32768; 'none' skips)")
    p.add_argument("--varlen", default=None, help="REQxKEYS:ROWS batch of requests (GPU default 4x32768:4096)")
    p.add_argument("--big", default=None, help="ROWSxKEYS very large step, replicated vs auto only (GPU default 65536x1048576; 'none' skips)")
    p.add_argument("--strategies", type=_strategy_list, default=list(VARIANTS),
                   help="comma-separated variants to time (default: all of " + ",".join(VARIANTS) + ")")
    p.add_argument("--sweep", default=None,
                   help="ROWS@KEYS, comma-separated lists: for every M in ROWS and N in KEYS, replicated, sharded "
                        "(auto, forced) and what the gate chooses (M <= N: the last M rows of one request; M > N: "
                        "M/N whole requests of N keys); GPU default 1024,...,65536@16384,131072; CPU none")
    p.add_argument("--heads", type=positive_int, default=None)
    p.add_argument("--head-dim", type=positive_int, default=None)
    p.add_argument("--topk", type=positive_int, default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--warmup", type=non_negative_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--out", default="bench-out", help="folder for tp.json, tp.csv, tp_speedup.png")


_GPU_DEFAULTS = dict(contexts="16384,32768,65536,131072,262144,524288,1048576", rows=8192, first="16384,32768",
                     varlen="4x32768:4096", big="65536x1048576", heads=64, head_dim=128, topk=2048, gate="4096x32768",
                     sweep="1024,2048,4096,8192,16384,32768,65536@16384,131072")
_CPU_DEFAULTS = dict(contexts="1024,2048,4096", rows=512, first="1024", varlen="3x1024:256", big="none",
                     heads=4, head_dim=64, topk=256, gate="256x2048", sweep="none")


def _configs(cfg: dict) -> list[dict]:
    def sizes(text: str) -> list[int]:
        return [] if text == "none" else [int(x) for x in text.split(",") if x]

    out = []
    for n in sizes(cfg["contexts"]):
        out.append(dict(name=f"late M={min(cfg['rows'], n)} N={n}", kind="late", keys=n, seq=[n], q=[min(cfg["rows"], n)]))
    for n in sizes(cfg["first"]):
        out.append(dict(name=f"first M=N={n}", kind="first", keys=n, seq=[n], q=[n]))
    if cfg["varlen"] and cfg["varlen"] != "none":
        reqs, rest = cfg["varlen"].split("x")
        keys, rows = (int(x) for x in rest.split(":"))
        out.append(dict(name=f"varlen {reqs}x{keys} keys, {rows} rows each", kind="varlen", keys=int(reqs) * keys,
                        seq=[keys] * int(reqs), q=[rows] * int(reqs)))
    rows, keys = (int(x) for x in cfg["gate"].split("x"))
    out.append(dict(name=f"below gate M={rows} N={keys}", kind="gate", keys=keys, seq=[keys], q=[rows]))
    if cfg["sweep"] and cfg["sweep"] != "none":
        rows_text, keys_text = cfg["sweep"].split("@")
        for n in sizes(keys_text):
            for m in sizes(rows_text):
                seq, q = ([n], [m]) if m <= n else ([n] * -(-m // n), [n] * -(-m // n))
                out.append(dict(name=f"sweep M={sum(q)} N={n}", kind="sweep", keys=n, seq=seq, q=q))
    if cfg["big"] and cfg["big"] != "none":
        rows, keys = (int(x) for x in cfg["big"].split("x"))
        out.append(dict(name=f"big M={rows} N={keys}", kind="big", keys=keys, seq=[keys], q=[rows]))
    return out


def _rank_main(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch.distributed as dist

    import indexer
    from indexer.synthetic import make_inputs
    from indexer.workspace import release_workspaces

    cuda = cfg["device"] == "cuda"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    group = dist.group.WORLD
    configs = _configs(cfg)
    bar = _progress(len(configs), rank)
    records = []

    def timed(fn):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            res = fn()
            end.record()
            end.synchronize()
            return res, start.elapsed_time(end), torch.cuda.max_memory_allocated(device) / 2**30
        t0 = time.perf_counter()
        res = fn()
        return res, (time.perf_counter() - t0) * 1e3, None

    def timed_host(fn):
        """The call's wall time on the host clock, device-synchronised: the clock its
        ``timing=True`` breakdown is taken with, so the breakdown fits inside it."""
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        res = fn()
        if cuda:
            torch.cuda.synchronize(device)
        return res, (time.perf_counter() - t0) * 1e3

    for c in configs:
        release_workspaces()
        if cuda:
            torch.cuda.empty_cache()
        inp = make_inputs(c["seq"], c["q"], cfg["heads"], cfg["head_dim"], device, seed=c["keys"])
        args, topk = inp.args(), cfg["topk"]
        reps = 1 if c["kind"] == "big" else cfg["repeats"]
        warm = 1 if c["kind"] == "big" else cfg["warmup"]
        variants = ["replicated"]
        if c["kind"] == "gate":
            variants.append("gated")
        elif c["kind"] == "sweep":
            variants += ["auto", "gated"]
        elif c["kind"] == "big":
            variants.append("auto")
        else:
            variants += cfg["strategies"]
        ref = None
        for v in variants:
            if v == "replicated":
                call = lambda: indexer.prefill_topk(*args, topk, backend=cfg["backend"])  # noqa: E731
            elif v == "gated":  # the group is passed, the default gate keeps it replicated
                call = lambda: indexer.prefill_topk(*args, topk, group=group, backend=cfg["backend"])  # noqa: E731
            else:
                call = lambda v=v: indexer.prefill_topk(*args, topk, group=group, backend=cfg["backend"], strategy=v, min_rows_per_rank=0)  # noqa: E731
            times, peak = [], 0.0
            for i in range(warm + reps):
                res, ms, mem = timed(call)
                if i >= warm:
                    times.append(ms)
                    peak = max(peak, mem or 0.0)
            if v == "replicated":
                ref = res
            exact = bool((res.sort(dim=1).values == ref.sort(dim=1).values).all())
            del res
            kw = dict(group=group, strategy=v, min_rows_per_rank=0) if v not in ("replicated", "gated") else {}
            if v == "gated":
                kw = dict(group=group)
            breakdown = []  # per repeat: (call ms, compute ms, wait ms, exchange ms) of one timed call
            for i in range(1 + reps):  # one warm-up: the timed path syncs where the plain one does not
                (_, info), ms = timed_host(lambda: indexer.prefill_topk_with_info(  # noqa: B023
                    *args, topk, backend=cfg["backend"], timing=True, **kw))
                if i >= 1:
                    breakdown.append((ms, info.compute_ms or 0.0, info.wait_ms or 0.0, info.exchange_ms or 0.0))
            plan = info.plan
            records.append(dict(
                config=c["name"], kind=c["kind"], keys=c["keys"], rows=sum(c["q"]), variant=v, rank=rank,
                times=times, peak_gib=peak if cuda else None, exact=exact, backend=info.backend,
                strategy=plan.strategy if plan else None, reassembly=info.reassembly,
                rank_rows=plan.rows_per_rank[rank] if plan else sum(c["q"]),
                imbalance=plan.imbalance if plan else None,
                breakdown=breakdown, sharded=info.sharded, gate=info.gate,
            ))
            if cuda:  # no cached blocks carried from one variant into the next
                torch.cuda.empty_cache()
        inp = args = ref = None  # free the step before the next config
        bar(c["name"])
    return records


def _progress(total: int, rank: int):
    if rank != 0:
        return lambda _name: None
    try:
        from tqdm import tqdm

        pbar = tqdm(total=total, file=sys.stderr, desc="bench tp")

        def step(name):
            pbar.set_postfix_str(name)
            pbar.update(1)

        return step
    except ImportError:
        done = [0]

        def step(name):
            done[0] += 1
            print(f"[{done[0]}/{total}] {name}", file=sys.stderr, flush=True)

        return step


def breakdown_of(recs: list[dict], total_ms: float) -> dict:
    """One row's compute / wait / exchange split of its ``total_ms``.

    The split is measured on the ranks' ``timing=True`` repeats: per repeat the slowest
    rank's call; of those, the median repeat (the lower of an even count); from that one call
    on that one rank its compute, wait and exchange times and the call's own time, all on the
    same host clock (``raw``). The row reports the total cut in those proportions, so
    ``compute_ms + wait_ms + exchange_ms <= total_ms`` always. Parts taken from other calls
    than the total, or on another clock (the total is timed with CUDA events, the breakdown
    with the host clock and syncs), or each part's maximum over ranks taken separately, can
    add up to more than the total: a row once showed 41.63 ms compute in a 30.03 ms total.
    """
    per_repeat = [max(calls) for calls in zip(*(r["breakdown"] for r in recs))]  # slowest rank's call
    timed, compute, wait, exchange = sorted(per_repeat)[(len(per_repeat) - 1) // 2]
    scale = total_ms / timed if timed > 0 else 0.0
    return dict(compute_ms=compute * scale, wait_ms=wait * scale, exchange_ms=exchange * scale,
                breakdown_raw=dict(timed_ms=timed, compute_ms=compute, wait_ms=wait, exchange_ms=exchange))


def summarize(per_rank: list[list[dict]]) -> list[dict]:
    """Merge per-rank records: a repeat's time is the slowest rank's, then the median; the
    breakdown as :func:`breakdown_of` takes it."""
    rows = []
    for i, rec in enumerate(per_rank[0]):
        recs = [r[i] for r in per_rank]
        totals = [max(ts) for ts in zip(*(r["times"] for r in recs))]
        rows.append(dict(
            config=rec["config"], kind=rec["kind"], keys=rec["keys"], rows=rec["rows"], variant=rec["variant"],
            strategy=rec["strategy"], reassembly=rec["reassembly"], backend=rec["backend"], sharded=rec["sharded"],
            rows_per_rank="/".join(str(r["rank_rows"]) for r in recs), imbalance=rec["imbalance"],
            gate=rec.get("gate", ""),  # records of runs before the calibrated gate have none
            **breakdown_of(recs, statistics.median(totals)),
            rank_times_ms=[r["times"] for r in recs],
            total_ms=statistics.median(totals), exact=all(r["exact"] for r in recs),
            peak_gib=max((r["peak_gib"] or 0.0) for r in recs) if rec["peak_gib"] is not None else None,
        ))
    base = {}
    for r in rows:
        if r["variant"] == "replicated":
            base[r["config"]] = r["total_ms"]
        r["speedup"] = base[r["config"]] / r["total_ms"]
        r["exchange_pct"] = 100.0 * r["exchange_ms"] / (r["compute_ms"] + r["exchange_ms"]) if r["sharded"] else None
    return rows


PLOT_EXTRA = "pip install 'indexer[plot]'"
"""How to get matplotlib for the plot (pyproject's ``plot`` extra)."""


def _plot(path: Path, title: str, xlabel: str, draw) -> str | None:
    """A speedup-over-replicated plot on a log2 x axis, ``draw(ax)`` adding the data; ``None``
    when written, else why not (with what to install)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no {path.name}: matplotlib is not installed ({PLOT_EXTRA}, or pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw(ax)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup over replicated")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def plot_speedup(rows: list[dict], path: Path, title: str) -> str | None:
    """Writes the speedup plot of the late chunks against N; ``None`` when done, else why not."""
    late = [r for r in rows if r["kind"] == "late" and r["variant"] != "replicated"]

    def draw(ax):
        for v in sorted({r["variant"] for r in late}):
            pts = sorted((r["keys"], r["speedup"]) for r in late if r["variant"] == v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)

    return _plot(path, title, "context length N (keys)", draw)


def plot_sweep(rows: list[dict], path: Path, title: str) -> str | None:
    """Writes the M-sweep plot (sharded speedup against M per N, the gate's choice marked);
    ``None`` when done, else why not."""
    sweep = [r for r in rows if r["kind"] == "sweep"]

    def draw(ax):
        for n in sorted({r["keys"] for r in sweep}):
            pts = sorted((r["rows"], r["speedup"]) for r in sweep if r["keys"] == n and r["variant"] == "auto")
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"sharded, N={n}")[0]
            chose = sorted((r["rows"], r["speedup"]) for r in sweep if r["keys"] == n and r["variant"] == "gated")
            ax.scatter([p[0] for p in chose], [p[1] for p in chose], marker="x", color=line.get_color(),
                       label=f"the gate's choice, N={n}")
        ax.axhline(1.0, color="grey", lw=0.8)

    return _plot(path, title, "rows M", draw)


def run(args: argparse.Namespace) -> int:
    from ..launch import run_ranks

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else "cpu"
    tp = args.tp or (torch.cuda.device_count() if device == "cuda" else 2)
    if device == "cuda" and torch.cuda.device_count() < tp:
        raise SystemExit(f"--tp {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible")
    defaults = _GPU_DEFAULTS if device == "cuda" else _CPU_DEFAULTS
    cfg = {k: (getattr(args, k, None) if getattr(args, k, None) is not None else v) for k, v in defaults.items()}
    cfg.update(device=device, strategies=list(args.strategies), backend=args.backend, warmup=args.warmup, repeats=args.repeats)
    out = Path(args.out).resolve()
    n_configs = len(_configs(cfg))
    print(f"bench tp: {n_configs} configs x (replicated + {len(cfg['strategies'])} variants) on {tp} ranks "
          f"({'nccl' if device == 'cuda' else 'gloo'} on {device}), warm-up {args.warmup}, median of {args.repeats}; "
          f"writing to {out}", flush=True)
    per_rank = run_ranks(_rank_main, tp, cfg, backend="nccl" if device == "cuda" else "gloo", timeout=7200)
    rows = summarize(per_rank)

    out.mkdir(parents=True, exist_ok=True)
    meta = dict(tp=tp, device=device, torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                heads=cfg["heads"], head_dim=cfg["head_dim"], topk=cfg["topk"], repeats=args.repeats, warmup=args.warmup)
    with open(out / "tp.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    with open(out / "tp.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k not in ("rank_times_ms", "breakdown_raw")],
                           extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    title = f"indexer TP={tp} on {meta['gpu']} ({rows[0]['backend']}), H={cfg['heads']} D={cfg['head_dim']} topk={cfg['topk']}"
    no_plot = plot_speedup(rows, out / "tp_speedup.png", title)
    has_sweep = any(r["kind"] == "sweep" for r in rows)
    no_sweep_plot = plot_sweep(rows, out / "tp_sweep.png", title) if has_sweep else "no sweep"
    print(title)
    cols = [("config", "config", "s"), ("variant", "variant", "s"), ("strategy", "plan", "s"), ("reassembly", "exchange", "s"),
            ("rows_per_rank", "rows/rank", "s"), ("imbalance", "imbal.", ".3f"), ("compute_ms", "compute ms", ".2f"),
            ("wait_ms", "wait ms", ".2f"), ("exchange_ms", "exch. ms", ".2f"), ("total_ms", "total ms", ".2f"), ("speedup", "speedup", ".2f"),
            ("peak_gib", "peak GiB", ".1f"), ("exact", "exact", "")]
    print(table(rows, cols))
    if has_sweep:
        print("\nthe gate over the M sweep (gated: the call with the default gate; its rule and predictions):")
        print(table([dict(r, chose="sharded" if r["sharded"] else "replicated") for r in rows
                     if r["kind"] == "sweep" and r["variant"] == "gated"],
                    [("config", "config", "s"), ("chose", "gate chose", "s"), ("speedup", "speedup", ".2f"),
                     ("gate", "rule", "s")]))
    written = ["tp.json", "tp.csv"] + ([] if no_plot else ["tp_speedup.png"]) + ([] if no_sweep_plot else
                                                                                 ["tp_sweep.png"])
    print(f"wrote {', '.join(written)} to {out}" + (f"; {no_plot}" if no_plot else ""))
    return 0 if all(r["exact"] for r in rows) else 1
