"""``python -m indexer bench calibrate``: measure a backend's per-row cost coefficients.

Times whole chunks (logits + top-k, as the driver runs them) of R rows that each score L
keys inside a logits block W columns wide, for a grid of (L, W), and fits

    time / R = a * L + b * W + c

by least squares. In the chunked driver a causal row's block is about as wide as its own
window, so for the planner a row costs ``(a + b) * keys + c``; it needs only ratios, so the
stored integer model is ``per_key = 1000, per_width = 0, per_row = round(1000 c / (a + b))``.
"""

from __future__ import annotations

import argparse

import torch

from .timing import int_list, median_ms, table


_GPU_DEFAULTS = dict(rows=4096, keys="512,2048,8192,32768", heads=64, head_dim=128, topk=2048, repeats=5)
# a CPU runs the GPU grid for minutes: a smaller one, still wide enough in keys for the per-key
# cost to stand out of timing noise (a few seconds on 2 cores)
_CPU_DEFAULTS = dict(rows=128, keys="256,1024,4096", heads=4, head_dim=64, topk=64, repeats=3)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import positive_int

    def gpu_cpu(key: str) -> str:
        return f"(default {_GPU_DEFAULTS[key]} on a GPU, {_CPU_DEFAULTS[key]} on CPU)"

    p.add_argument("--backend", default="auto", help="backend to calibrate (default: the one dispatch picks)")
    p.add_argument("--rows", type=positive_int, default=None, help="rows R per timed chunk " + gpu_cpu("rows"))
    p.add_argument("--keys", type=_key_list, default=None, help="keys per row L " + gpu_cpu("keys"))
    p.add_argument("--heads", type=positive_int, default=None, help=gpu_cpu("heads"))
    p.add_argument("--head-dim", type=positive_int, default=None, help=gpu_cpu("head_dim"))
    p.add_argument("--topk", type=positive_int, default=None, help=gpu_cpu("topk"))
    p.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU)")
    p.add_argument("--repeats", type=positive_int, default=None, help=gpu_cpu("repeats"))
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not store")
    p.add_argument("--exchange", action="store_true",
                   help="calibrate the exchange of --tp ranks instead (NCCL on GPUs, gloo on CPU): the sharding "
                        "gate then predicts sharded against replicated times from both fits")
    p.add_argument("--tp", type=positive_int, default=2, help="ranks of --exchange (default 2)")


def _device(text: str) -> str:
    from ..platform import unusable_device_reason

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    reason = unusable_device_reason(device)
    if reason is not None:
        raise argparse.ArgumentTypeError(f"{text}: {reason}")
    return text


def _key_list(text: str) -> str:
    try:
        keys = int_list(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}") from None
    if not keys or min(keys) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return text


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Options left unset take the GPU or the CPU defaults, by ``--device``."""
    defaults = _CPU_DEFAULTS if torch.device(args.device).type == "cpu" else _GPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def _problem(rows: int, keys: int, width: int, heads: int, head_dim: int, topk: int, device: torch.device, fp8):
    from ..api import quantize_fp8
    from ..problem import validate

    gen = torch.Generator().manual_seed(keys * 7 + width)
    q, qs = quantize_fp8(torch.randn(rows, heads, head_dim, generator=gen), fp8)
    k, ks = quantize_fp8(torch.randn(width, head_dim, generator=gen), fp8)
    w = torch.randn(rows, heads, generator=gen) * qs
    # the first half of the rows at the start of the block, the second half at its end:
    # every row scores `keys` keys, the chunk spans `width` columns, and neighbouring rows
    # (which kernels tile together) share a window, as causal rows do
    starts = torch.where(torch.arange(rows) < rows // 2, 0, width - keys).to(torch.int32)
    ends = starts + keys
    args = [t.to(device) for t in (q, k, ks, w, starts, ends)]
    return validate(*args, topk)


def fit(samples: list[tuple[int, int, float]]):
    """Least-squares ``ms_per_row = a*L + b*W + c`` over ``(L, W, ms_per_row)`` samples."""
    a_mat = torch.tensor([[l_, w_, 1.0] for l_, w_, _ in samples], dtype=torch.float64)
    y = torch.tensor([[t] for _, _, t in samples], dtype=torch.float64)
    coef = torch.linalg.lstsq(a_mat, y).solution.flatten().tolist()
    return [max(0.0, c) for c in coef]


_EXCHANGE_ROWS = dict(cuda=(1024, 8192, 32768, 65536), cpu=(1024, 8192, 32768))


def _exchange_rank(rank: int, world: int, device: str, topk: int, repeats: int) -> list[list[float]]:
    """Milliseconds of this group's exchange of int32 ``[M, topk]`` tables: one list per
    size of ``_EXCHANGE_ROWS``, one time per round.

    Each round times every size once, so a slow spell of the machine (other processes on a
    small CI host) lands on all sizes alike instead of on whichever size ran during it.
    """
    import time

    import torch.distributed as dist

    from ..collective import choose_mode, make_exchange, probe_group
    from ..partition import plan_rows

    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
    group = dist.group.WORLD
    caps = probe_group(group, dev)
    setups = []
    for m in _EXCHANGE_ROWS["cuda" if dev.type == "cuda" else "cpu"]:
        plan = plan_rows(torch.zeros(m, dtype=torch.int64), torch.ones(m, dtype=torch.int64), world, "balanced")
        ex = make_exchange(plan, rank, group, choose_mode("auto", caps, plan.strategy), topk, dev)
        setups.append((ex, torch.zeros(m, topk, dtype=torch.int32, device=dev)))
    times: list[list[float]] = [[] for _ in setups]
    for i in range(repeats + 1):
        for (ex, out), t in zip(setups, times):
            dist.barrier(group=group)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            ex.before(out)
            ex(out)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i:  # the first round is a warm-up
                t.append((time.perf_counter() - t0) * 1e3)
    return times


def exchange_fit(nbytes: list[int], per_rank: list[list[list[float]]]) -> tuple[list[float], float, float]:
    """Fit ``ms = fixed + per_byte * bytes`` to exchange times measured on every rank.

    A round's time is its slowest rank's (the exchange ends when the last rank has its
    table); each size keeps its fastest round, since machine noise only ever adds time.

    Args:
        nbytes: Table size in bytes, one per measured size.
        per_rank: ``per_rank[r][s][i]``: rank r's milliseconds at size s in round i.

    Returns:
        ``(ms, fixed_ms, per_byte_ms)``: the time kept per size and the least-squares line.

    Raises:
        ValueError: The ranks' lists differ in shape, or do not hold one list per size.
    """
    shapes = {tuple(len(t) for t in rank) for rank in per_rank}
    if len(shapes) != 1 or len(next(iter(shapes))) != len(nbytes) or 0 in next(iter(shapes)):
        raise ValueError(f"per_rank must hold {len(nbytes)} sizes of the same number (>= 1) of rounds on every "
                         f"rank, got rounds per size {sorted(shapes)}")
    ms = [min(max(rank[s][i] for rank in per_rank) for i in range(len(per_rank[0][s]))) for s in range(len(nbytes))]
    x = torch.tensor([[float(b), 1.0] for b in nbytes], dtype=torch.float64)
    y = torch.tensor([[t] for t in ms], dtype=torch.float64)
    per_byte_ms, fixed_ms = torch.linalg.lstsq(x, y).solution.flatten().tolist()
    return ms, fixed_ms, per_byte_ms


# a fit with no positive per-byte time means noise hid the size dependence: measure again
# with more rounds, at most this many times
_EXCHANGE_ATTEMPTS = 3


def run_exchange(args: argparse.Namespace) -> int:
    """``--exchange``: time the exchange at a few table sizes on ``--tp`` ranks and store
    ``us + bytes / bandwidth`` (see :func:`exchange_fit`)."""
    from ..launch import run_ranks
    from ..partition.calibration import save_exchange_calibration

    device = torch.device(args.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    sizes = _EXCHANGE_ROWS["cuda" if device.type == "cuda" else "cpu"]
    nbytes = [m * args.topk * 4 for m in sizes]
    repeats = args.repeats
    for attempt in range(1, _EXCHANGE_ATTEMPTS + 1):
        print(f"calibrating the exchange of {args.tp} {backend} ranks on {device.type}: int32 [M, {args.topk}] "
              f"tables, fastest of {repeats} rounds", flush=True)
        per_rank = run_ranks(_exchange_rank, args.tp, device.type, args.topk, repeats, backend=backend, timeout=1800)
        ms, fixed_ms, per_byte_ms = exchange_fit(nbytes, per_rank)
        rows = [dict(M=m, MB=b / 2**20, ms=t, fit_ms=fixed_ms + per_byte_ms * b) for m, b, t in zip(sizes, nbytes, ms)]
        print(table(rows, [("M", "rows M", "d"), ("MB", "table MB", ".1f"), ("ms", "exchange ms", ".3f"),
                           ("fit_ms", "fit ms", ".3f")]))
        if per_byte_ms > 0:
            break
        if attempt == _EXCHANGE_ATTEMPTS:
            print(f"fit failed {attempt} times: no positive per-byte time; nothing stored")
            return 1
        repeats *= 2
        print("fit failed: no positive per-byte time; measuring again with more rounds", flush=True)
    us, gb_per_s = max(0.0, fixed_ms * 1e3), 1e-6 / per_byte_ms
    print(f"fit: {us:.1f} us + bytes / {gb_per_s:.2f} GB/s")
    if not args.dry_run:
        print(f"stored in {save_exchange_calibration(backend, args.tp, us, gb_per_s)}")
    return 0


def run(args: argparse.Namespace) -> int:
    from ..backends import select_backend
    from ..backends.base import plan_chunks, prepare_chunks, run_chunks
    from ..partition import CostModel
    from ..partition.calibration import save_calibration
    from ..platform import platform_for_device

    args = resolve_defaults(args)
    if args.exchange:
        return run_exchange(args)
    device = torch.device(args.device)
    platform = platform_for_device(device)
    rows_out, samples = [], []
    backend = None
    grid = [(keys, width) for keys in int_list(args.keys) for width in (keys + 1, 4 * keys)]
    print(f"calibrating on {platform.describe()}: {len(grid)} chunks of R={args.rows} rows (keys L={args.keys}, "
          f"each at widths L+1 and 4L), H={args.heads} D={args.head_dim} topk={args.topk}, median of {args.repeats}",
          flush=True)
    for i, (keys, width) in enumerate(grid, 1):
        problem, inputs = _problem(args.rows, keys, width, args.heads, args.head_dim, args.topk, device, platform.fp8_dtype)
        if backend is None:
            backend = select_backend(problem, platform, args.backend) if args.backend != "auto" else select_backend(problem, platform)
        out = torch.empty(args.rows, args.topk, dtype=torch.int32, device=device)
        chunks = plan_chunks(backend, problem, [(0, args.rows)], 2**40)
        prepare_chunks(backend, problem, chunks, 2**40)
        ms = median_ms(lambda: run_chunks(backend, problem, inputs, chunks, out), device, warmup=1,
                       repeats=args.repeats)
        samples.append((keys, width, ms / args.rows))
        rows_out.append(dict(L=keys, W=width, ms=ms, us_row=1e3 * ms / args.rows))
        print(f"[{i}/{len(grid)}] {backend.name}: L={keys} W={width}: {ms:.3f} ms a chunk", flush=True)
    a, b, c = fit(samples)
    for r in rows_out:
        r["fit_us_row"] = 1e3 * (a * r["L"] + b * r["W"] + c)
    print(f"calibrating {backend.name} on {platform.describe()}: R={args.rows} rows per chunk, H={args.heads} D={args.head_dim} topk={args.topk}")
    print(table(rows_out, [("L", "keys L", "d"), ("W", "width W", "d"), ("ms", "chunk ms", ".3f"), ("us_row", "us/row", ".3f"), ("fit_us_row", "fit us/row", ".3f")]))
    if a + b <= 0:
        print("fit failed: no positive per-key cost; nothing stored")
        return 1
    model = CostModel(per_key=1000, per_width=0, per_row=round(1000 * c / (a + b)))
    print(f"fit: {a * 1e6:.4f} ns/key + {b * 1e6:.4f} ns/column + {c * 1e3:.3f} us/row -> {model}")
    if not args.dry_run:
        path = save_calibration(backend.name, platform.arch, model, {"ns_per_key": a * 1e6, "ns_per_column": b * 1e6, "us_per_row": c * 1e3})
        print(f"stored in {path}")
    return 0
