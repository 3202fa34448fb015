"""``python -m indexer demo``: replicated vs sharded prefill on N ranks, checked exactly.

Spawns ``--tp`` ranks (gloo on CPU by default; NCCL when that many GPUs are present and
``--device cuda``), runs the replicated computation (every rank computes every row, as TP
engines do today) and the sharded one on the same synthetic long-context step, checks that
every rank's sharded table has exactly the replicated top-k set per row, and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from .options import check_environment_or_exit, flag_choices, positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="replicated vs sharded prefill on N spawned ranks, checked exactly")
    p.add_argument("--tp", type=positive_int, default=2, help="ranks to spawn (default 2)")
    p.add_argument("--rows", type=positive_int, default=2048, help="query rows M of the step (default 2048)")
    p.add_argument("--context", type=positive_int, default=8192, help="keys N: the request's context length (default 8192)")
    p.add_argument("--layout", choices=("late", "first"), default="late",
                   help="late: the M rows are the last of the context (a late prefill chunk); first: M = N, one whole first chunk")
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--head-dim", type=positive_int, default=64)
    p.add_argument("--topk", type=positive_int, default=256)
    p.add_argument("--strategy", choices=flag_choices("TP_SHARD_STRATEGY"), default=None,
                   help="row split (default: INDEXER_TP_SHARD_STRATEGY)")
    p.add_argument("--reassembly", choices=flag_choices("REASSEMBLY"), default=None,
                   help="exchange of the ranks' rows (default: INDEXER_REASSEMBLY)")
    p.add_argument("--backend", choices=flag_choices("BACKEND"), default=None,
                   help="force a backend (default: INDEXER_BACKEND, automatic dispatch)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when --tp GPUs are visible, else cpu")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed repeats, median reported (default 3)")
    p.set_defaults(func=run, parser=p)


def _first_error(text: str) -> str:
    """The first rank's error line of a :class:`RankFailed` message, without tracebacks."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else text


def _progress(text: str) -> None:
    """A progress line on stderr, flushed (the table goes to stdout)."""
    print(f"[demo] {text}", file=sys.stderr, flush=True)


def _rank_main(rank: int, world: int, cfg: dict) -> dict:
    import torch.distributed as dist

    import indexer
    from indexer.synthetic import make_inputs

    device = torch.device(f"cuda:{rank}") if cfg["device"] == "cuda" else torch.device("cpu")
    m, n = cfg["rows"], cfg["context"]
    inp = make_inputs([n], [m], cfg["heads"], cfg["head_dim"], device, seed=1234)
    kw = dict(backend=cfg["backend"], strategy=cfg["strategy"], reassembly=cfg["reassembly"], min_rows_per_rank=0)
    group = dist.group.WORLD

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        res = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return res, (time.perf_counter() - t0) * 1e3

    say = _progress if rank == 0 else (lambda _text: None)
    say(f"rank 0: process group up ({world} ranks), inputs made; warm-up round, then {cfg['repeats']} timed")
    replicated_ms, rounds = [], []
    for i in range(cfg["repeats"] + 1):  # first round is warm-up
        ref, t_rep = timed(lambda: indexer.prefill_topk(*inp.args(), cfg["topk"], backend=cfg["backend"]))
        (res, info), t_sh = timed(
            lambda: indexer.prefill_topk_with_info(*inp.args(), cfg["topk"], group=group, timing=True, **kw)
        )
        if i:
            replicated_ms.append(t_rep)
            # compute and exchange were timed inside this very call: never more than its total
            rounds.append((t_sh, info.compute_ms, info.exchange_ms or 0.0))
        what = "warm-up" if i == 0 else f"round {i}/{cfg['repeats']}"
        say(f"{what}: replicated {t_rep:.1f} ms, sharded {t_sh:.1f} ms (rank 0)")
    # the median round (the lower one of an even count) and that round's breakdown
    sharded_ms, compute_ms, exchange_ms = sorted(rounds)[(len(rounds) - 1) // 2]
    exact = (res.sort(dim=1).values == ref.sort(dim=1).values).all(dim=1)
    plan = info.plan
    return {
        "backend": info.backend,
        "device": str(device),
        "collective": dist.get_backend(group),
        "sharded": info.sharded,
        "reason": info.reason,
        "strategy": plan.strategy if plan else None,
        "reassembly": info.reassembly,
        "imbalance": plan.imbalance if plan else 1.0,
        "rows": plan.rows_per_rank[rank] if plan else m,
        "cost": plan.cost_per_rank[rank] if plan else None,
        "replicated_ms": statistics.median(replicated_ms),
        "sharded_ms": sharded_ms,
        "compute_ms": compute_ms,
        "exchange_ms": exchange_ms,
        "exact_rows": int(exact.sum()),
        "result": res.cpu(),
    }


def _check_backend(parser: argparse.ArgumentParser, args: argparse.Namespace, device: str) -> None:
    """A forced backend that cannot run this step on CPU: the parser's error, not the ranks'
    tracebacks. (On GPUs the ranks' own check reports it: asking here would need a CUDA
    context in the parent.)"""
    if device != "cpu" or args.backend in (None, "auto"):
        return
    from indexer.backends import BackendUnavailableError, select_backend
    from indexer.platform import platform_for_device
    from indexer.problem import make_problem

    starts = torch.zeros(args.rows, dtype=torch.int32)
    ends = torch.arange(args.context - args.rows + 1, args.context + 1, dtype=torch.int32)
    problem = make_problem(starts, ends, num_keys=args.context, heads=args.heads, head_dim=args.head_dim,
                           topk=args.topk, device="cpu")
    try:
        select_backend(problem, platform_for_device("cpu"), args.backend)
    except BackendUnavailableError as exc:
        parser.error(f"argument --backend: {exc}")


def run(args: argparse.Namespace) -> int:
    from indexer.launch import RankFailed, run_ranks

    parser = args.parser
    if args.layout == "first":
        args.rows = args.context
    if args.rows > args.context:
        parser.error(f"argument --rows: {args.rows} rows need --context >= {args.rows} keys, got {args.context}")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= args.tp else "cpu"
    if device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < args.tp):
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        parser.error(f"argument --device: cuda needs {args.tp} GPUs (--tp), {visible} visible")
    check_environment_or_exit(parser)
    _check_backend(parser, args, device)
    cfg = {k: getattr(args, k) for k in ("rows", "context", "heads", "head_dim", "topk", "strategy", "reassembly", "backend", "repeats")}
    cfg["device"] = device
    collective = "nccl" if device == "cuda" else "gloo"
    _progress(f"spawning {args.tp} ranks ({collective} on {device}); each times {args.repeats} rounds after a warm-up")
    try:
        results = run_ranks(_rank_main, args.tp, cfg, backend=collective, timeout=3600)
    except RankFailed as exc:
        print(f"indexer demo: {_first_error(str(exc))}", file=sys.stderr)
        return 1

    r0 = results[0]
    identical = all(torch.equal(r["result"], r0["result"]) for r in results)
    exact = all(r["exact_rows"] == args.rows for r in results)
    print(
        f"indexer demo: tp={args.tp} ({r0['collective']}, {device}), backend {r0['backend']}, "
        f"M={args.rows} rows ({args.layout} chunk), N={args.context} keys, H={args.heads} D={args.head_dim} topk={args.topk}"
    )
    if r0["sharded"]:
        print(f"plan: {r0['strategy']}, reassembly {r0['reassembly']}, imbalance {r0['imbalance']:.3f}")
    else:
        print(f"not sharded: {r0['reason']}")
    print(f"{'rank':>4} {'rows':>7} {'cost':>12} {'compute ms':>11} {'reassembly ms':>14} {'total ms':>9} {'replicated ms':>14}")
    for rank, r in enumerate(results):
        cost = "-" if r["cost"] is None else str(r["cost"])
        print(
            f"{rank:>4} {r['rows']:>7} {cost:>12} {r['compute_ms']:>11.2f} {r['exchange_ms']:>14.2f} "
            f"{r['sharded_ms']:>9.2f} {r['replicated_ms']:>14.2f}"
        )
    rep = max(r["replicated_ms"] for r in results)
    sh = max(r["sharded_ms"] for r in results)
    print(
        f"replicated {rep:.2f} ms, sharded {sh:.2f} ms, speedup {rep / sh:.2f}x "
        f"(slowest rank, median of {args.repeats})"
    )
    verdict = "EXACT MATCH" if exact and identical else "MISMATCH"
    print(
        f"{verdict}: {min(r['exact_rows'] for r in results)}/{args.rows} rows equal the replicated top-k set on every rank; "
        f"ranks hold identical tables: {'yes' if identical else 'NO'}"
    )
    return 0 if exact and identical else 1
