"""``python -m indexer info``: versions, platform, backends, effective settings."""

from __future__ import annotations

import argparse
import importlib.metadata as md

import torch

from .options import positive_int

_PACKAGES = (
    ("triton", "triton"),
    ("deep_gemm", "deep-gemm"),
    ("deep_gemm", "sgl-deep-gemm"),
    ("aiter", "amd-aiter"),
    ("pynvml", "nvidia-ml-py"),
    ("amdsmi", "amdsmi"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="versions, detected platform, backends and effective settings")
    p.add_argument("--heads", type=positive_int, default=None, help="also check every backend against a problem with H heads")
    p.add_argument("--head-dim", type=positive_int, default=128, help="D of that problem (default 128)")
    p.add_argument("--topk", type=positive_int, default=2048, help="topk of that problem (default 2048)")
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import indexer
    from indexer import envs
    from indexer.workspace import workspace_bytes, workspace_numel

    platform = indexer.current_platform()
    print(f"indexer {indexer.__version__}")
    print(f"torch {torch.__version__} (cuda {torch.version.cuda}, hip {torch.version.hip})")
    seen = set()
    for module, dist in _PACKAGES:
        v = _version(dist)
        if v is not None or module not in seen:
            if v is not None:
                seen.add(module)
                print(f"{dist} {v}")
    missing = sorted({m for m, _ in _PACKAGES} - seen)
    if missing:
        print("not installed: " + ", ".join(missing))
    print(f"platform: {platform.describe()}")
    for note in platform.notes:
        print(f"  note: {note}")

    problem = None
    if args.heads is not None:
        from indexer.problem import validate
        from indexer.synthetic import make_inputs

        device = "cuda" if torch.cuda.is_available() else "cpu"
        inp = make_inputs([1], [1], args.heads, args.head_dim, device, fp8_dtype=platform.fp8_dtype)
        problem, _ = validate(*inp.args(), args.topk)
        print(f"\nbackends for H={args.heads} D={args.head_dim} topk={args.topk} on {device} (priority order):")
    else:
        print("\nbackends (priority order for this platform):")
    rows = []
    for st in indexer.available_backends(problem):
        rows.append((st.name, "yes" if st.available else "no", "; ".join(st.reasons + st.notes) or "-"))
    print(_table(rows, ("backend", "available", "reasons / notes")))

    print("\nsettings:")
    rows = []
    for flag in envs.flags():
        try:
            r = envs.resolve(flag.name, platform.key)
            rows.append((flag.env_name, r.value, r.source, flag.allowed()))
        except ValueError:
            rows.append((flag.env_name, "INVALID", "env", flag.allowed()))
    print(_table(rows, ("flag", "value", "from", "allowed")))
    problems = envs.validate_environment(platform.key)
    for msg in problems:
        print(f"  warning: {msg}")
    print(_gate_line(platform))
    ws = workspace_bytes()
    try:
        budget = int(envs.value("MAX_LOGITS_MB", platform.key) * 2**20)
        size = f"{workspace_numel(budget) * 4 / 2**20:.0f} MiB per device"
    except ValueError:
        size = "unknown (bad INDEXER_MAX_LOGITS_MB)"
    held = ", ".join(f"{d} {b / 2**20:.0f} MiB" for d, b in ws.items()) or "none in this process yet"
    print(f"\nlogits workspace: {size} (min(INDEXER_MAX_LOGITS_MB, 2 GiB)), allocated once at the first "
          f"chunk of the torch/triton backends and reused; held now: {held}")
    return 0


def _gate_line(platform) -> str:
    """Which rule the sharding gate uses here: the calibrated times it found, or the row count."""
    from indexer import envs
    from indexer.partition import MARGIN
    from indexer.partition.calibration import calibration_path, stored

    r = envs.resolve("TP_SHARD_MIN_ROWS", platform.key)
    if r.is_set:
        return f"\nsharding gate: row count, {r.value} rows per rank (set by {r.source[4:]})"
    try:
        entries = stored()
    except ValueError as exc:
        return f"\nsharding gate: row count, {r.value} rows per rank ({exc})"
    timed = sorted(k for k, v in entries.items() if "@" in k and not k.startswith("exchange@") and "ns_per_key" in v)
    links = sorted(k for k in entries if k.startswith("exchange@"))
    if timed and links:
        return (f"\nsharding gate: calibrated times where a plan's backend and group match ({', '.join(timed)}; "
                f"{', '.join(links)} in {calibration_path()}): shard when predicted sharded (slowest rank + "
                f"exchange) < {1 - MARGIN:.2f} x replicated; otherwise the row count, {r.value} rows per rank")
    missing = "no calibrated compute times ('bench calibrate')" if not timed else \
        "no calibrated exchange ('bench calibrate --exchange --tp N')"
    return f"\nsharding gate: row count, {r.value} rows per rank ({missing} in {calibration_path()})"
