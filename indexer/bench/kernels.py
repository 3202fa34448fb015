"""``python -m indexer bench kernels``: each backend's logits and top-k, side by side.

Each backend's top-k is the one it runs in ``prefill_topk`` (``INDEXER_TOPK`` for the GPU
backends); ``bench topk`` compares the top-k implementations themselves.

One causal request; the ``--rows`` query rows are the last rows of a ``--context``-key
history (a late prefill chunk). Every backend runs the same inputs in one process; each
phase is timed with CUDA events after warm-up (median of repeats). Effective TFLOP/s counts
``2 * H * D`` per valid (row, key) pair. Correctness is checked against the torch
reference's top-k sets on a sample of rows.
"""

from __future__ import annotations

import argparse
import json

import torch

from .timing import int_list, median_ms, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import positive_int

    p.add_argument("--rows", type=positive_int, default=8192)
    p.add_argument("--context", default="16384,65536,131072", help="comma-separated key counts N")
    p.add_argument("--heads", type=positive_int, default=64)
    p.add_argument("--head-dim", type=positive_int, default=128)
    p.add_argument("--topk", type=positive_int, default=2048)
    p.add_argument("--backends", default=None, help="comma-separated (default: the platform's priority list)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    p.add_argument("--tune-triton", action="store_true",
                   help="time fused Triton configs for this H, D on the largest --context, side by side with "
                        "DeepGEMM, and print the best (configs are a fixed table per (H, D), not a per-process "
                        "autotune: see backends/triton/kernels.py)")
    p.add_argument("--tune-pairs", default="128,256", help="(row, head) pairs per program to try")
    p.add_argument("--tune-block-n", default="64,128")
    p.add_argument("--tune-warps", default="4,8")
    p.add_argument("--tune-stages", default="2,3")


def tune_triton(args: argparse.Namespace) -> int:
    """Time each fused Triton config (rows a program, BLOCK_N, warps, stages)
    for this H, D, side by side, against DeepGEMM where it runs."""
    from ..backends.triton import kernels as tk
    from ..synthetic import make_inputs

    device = torch.device(args.device)
    n = max(int_list(args.context))
    m = min(args.rows, n)
    h, d = args.heads, args.head_dim
    if not tk.fused_supported(h):
        print(f"H={h} runs the per-head kernel, which has no config table to tune (the fused one needs a power of two <= 128)")
        return 2
    inp = make_inputs([n], [m], h, d, device, seed=n)
    out = torch.empty(m, n, dtype=torch.float32, device=device)
    key = (h, d)
    saved = tk.FUSED_CONFIGS.get(key)
    rows = []
    configs = []
    for pairs in int_list(args.tune_pairs):
        if pairs < h:
            continue
        for block_n in int_list(args.tune_block_n):
            for warps in int_list(args.tune_warps):
                for stages in int_list(args.tune_stages):
                    configs.append(tk.FusedConfig(pairs // h, block_n, warps, stages))
    try:
        for cfg in configs:
            tk.FUSED_CONFIGS[key] = cfg
            row = dict(cfg._asdict(), ms=None, note="")
            try:
                row["ms"] = median_ms(lambda: tk.mqa_logits(*inp.args(), out=out), device, warmup=1, repeats=args.repeats)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a row too
                row["note"] = f"{type(exc).__name__}: {str(exc)[:50]}"
            rows.append(row)
    finally:
        if saved is None:
            tk.FUSED_CONFIGS.pop(key, None)
        else:
            tk.FUSED_CONFIGS[key] = saved
    ref_ms = _deepgemm_ms(inp, m, n, args, device)
    for r in rows:
        r["vs_dg"] = ref_ms / r["ms"] if ref_ms and r["ms"] else None
    rows.sort(key=lambda r: float("inf") if r["ms"] is None else r["ms"])
    if rows[0]["ms"] is None:
        print("no config ran:\n" + "\n".join(f"  {r}" for r in rows))
        return 1
    dg = f", DeepGEMM {ref_ms:.3f} ms" if ref_ms else ""
    print(f"fused Triton logits configs, H={h} D={d} M={m} N={n} on {device}, median of {args.repeats}{dg}")
    print(table(rows, [("block_q", "rows", "d"), ("block_n", "BLOCK_N", "d"),
                       ("num_warps", "warps", "d"), ("num_stages", "stages", "d"), ("ms", "ms", ".3f"),
                       ("vs_dg", "DeepGEMM/this", ".2f"), ("note", "note", "s")]))
    best = tk.FusedConfig(**{f: rows[0][f] for f in tk.FusedConfig._fields})
    print(f"best: FUSED_CONFIGS[({h}, {d})] = {best!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(deepgemm_ms=ref_ms, configs=rows), f, indent=1)
    return 0


def _deepgemm_ms(inp, m: int, n: int, args: argparse.Namespace, device: torch.device) -> float | None:
    """DeepGEMM's logits time on the same inputs, or None where it cannot run."""
    from ..backends import get_backend
    from ..backends.base import single_chunk
    from ..problem import validate

    problem, inputs = validate(*inp.args(), args.topk)
    backend = get_backend("deepgemm")
    if backend.not_supported_reasons(problem):
        return None
    try:
        chunk = single_chunk(backend, problem, (0, m), (0, n))
        return median_ms(lambda: backend.logits(problem, inputs, chunk), device, warmup=1, repeats=args.repeats)
    except Exception as exc:  # noqa: BLE001 - the Triton rows above still stand
        print(f"DeepGEMM did not run: {type(exc).__name__}: {exc}")
        return None


def run(args: argparse.Namespace) -> int:
    if args.tune_triton:
        return tune_triton(args)
    from ..backends import get_backend
    from ..backends.base import single_chunk
    from ..platform import platform_for_device
    from ..problem import validate
    from ..synthetic import make_inputs

    device = torch.device(args.device)
    rows = []
    for n in int_list(args.context):
        m = min(args.rows, n)
        inp = make_inputs([n], [m], args.heads, args.head_dim, device, seed=n)
        problem, inputs = validate(*inp.args(), args.topk)
        pairs = int((problem.ends_host - problem.starts_host).sum())
        flops = 2.0 * args.heads * args.head_dim * pairs
        ref_idx = None
        names = args.backends.split(",") if args.backends else list(platform_for_device(device).backend_priority)
        for name in names:
            backend = get_backend(name)
            reasons = backend.not_supported_reasons(problem)
            if reasons:
                rows.append(dict(N=n, M=m, backend=name, note="; ".join(reasons)[:60]))
                continue
            chunk = single_chunk(backend, problem, (0, m), (0, n))
            out = torch.empty(m, args.topk, dtype=torch.int32, device=device)
            reps = args.repeats if name != "torch" else min(args.repeats, 2)
            logits = backend.logits(problem, inputs, chunk)
            t_logits = median_ms(lambda: backend.logits(problem, inputs, chunk), device, warmup=1, repeats=reps)
            t_topk = median_ms(lambda: backend.topk(problem, chunk, logits, out), device, warmup=1, repeats=reps)
            backend.topk(problem, chunk, logits, out)
            sample = torch.arange(0, m, max(1, m // 64), device=device)
            if ref_idx is None:
                ref_idx, ref_rows = _reference_sample(problem, inputs, sample, args.topk)
            same, valid = _agreement(out[sample], ref_idx, ref_rows, args.topk)
            rows.append(dict(
                N=n, M=m, backend=name, logits_ms=t_logits, topk_ms=t_topk, total_ms=t_logits + t_topk,
                tflops=flops / t_logits / 1e9, exact=same, valid=valid, note="",
            ))
            logits = chunk = None  # free the block before the next backend
            if device.type == "cuda":
                torch.cuda.empty_cache()
    cols = [("N", "keys N", "d"), ("M", "rows M", "d"), ("backend", "backend", "s"), ("logits_ms", "logits ms", ".2f"),
            ("topk_ms", "topk ms", ".2f"), ("total_ms", "total ms", ".2f"), ("tflops", "logits TFLOP/s", ".0f"),
            ("exact", "same set", ".0%"), ("valid", "valid top-k", ".0%"),
            ("note", "note", "s")]
    print(f"bench kernels: H={args.heads} D={args.head_dim} topk={args.topk} on {device} "
          f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), median of {args.repeats}")
    print(table(rows, cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _agreement(got: torch.Tensor, ref_idx: torch.Tensor, ref_rows: list, topk: int, rtol: float = 2e-3) -> tuple[float, float]:
    """Fraction of sampled rows whose set equals the reference's, and fraction that are a
    valid top-k: every selected key's reference logit within ``rtol`` (of the row's largest
    magnitude) of the reference k-th value, so only near-ties differ."""
    same = (got.sort(1).values == ref_idx).all(1)
    valid = 0
    for i, row in enumerate(ref_rows):
        idx = got[i][got[i] >= 0].long()
        kth = row.topk(min(topk, row.numel())).values[-1]
        valid += bool((row[idx] >= kth - rtol * row.abs().max()).all()) and idx.numel() == min(topk, row.numel())
    return same.float().mean().item(), valid / max(1, len(ref_rows))


def _reference_sample(problem, inputs, sample, topk):
    """Top-k sets (sorted) and float64-exact logits of the sampled rows, by the torch reference."""
    from ..backends import get_backend
    from ..backends.base import single_chunk

    ref = get_backend("torch")
    out, rows = [], []
    for m in sample.tolist():
        lo, hi = int(problem.starts_host[m]), int(problem.ends_host[m])
        chunk = single_chunk(ref, problem, (m, m + 1), (lo, max(hi, lo + 1)))
        block = ref.logits(problem, inputs, chunk)
        res = torch.empty(1, topk, dtype=torch.int32, device=problem.device)
        ref.topk(problem, chunk, block, res)
        out.append(res)
        rows.append(block[0, : hi - lo].clone())
    return torch.cat(out).sort(1).values, rows
