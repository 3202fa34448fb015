"""``python -m indexer bench topk``: per-row top-k implementations side by side.

The logits are real indexer logits (the chosen backend's, for the last ``--rows`` rows of a
``--context``-key causal request: a late prefill chunk, every row ~N keys long). On the same
block, in one process, each phase timed with CUDA events after warm-up (median of repeats):

* ``torch.topk``: a bare ``torch.topk(logits, k)``, the baseline upstream uses;
* ``torch path``: what ``INDEXER_TOPK=torch`` runs (topk(k+1) and the lowest-index tie rule);
* ``triton``: our ragged kernel (``INDEXER_TOPK=triton``), with how many rows took the
  sampled path;
* ``flashinfer``: FlashInfer's ``top_k_ragged_transform`` where it imports, with the
  lowest-index tie rule (``tie_break=1``, ours) and with any tie order (``tie_break=0``);
* ``vllm``: vLLM's ``top_k_per_row_prefill`` (the op vLLM's indexer runs after DeepGEMM's
  logits), as registered in the process, from an installed vLLM (``vllm._C``), or from a
  library built from its source and given by ``--vllm-topk-lib``. Its ties at the k-th
  value go to whichever key its atomics reach first, so beside ``same set`` every row gets
  ``same values`` (:func:`same_values`: a valid top-k under any tie order).

``floor`` is the bandwidth floor: bytes of valid logits (sum of row lengths x 4) over the
copy bandwidth measured in the same run (a device-to-device copy, bytes read + written over
its time). ``same`` is the fraction of rows whose set equals the torch path's.

``--dist`` times the top-k instead on logits shaped like a real indexer's beside the
Gaussian (:data:`indexer.synthetic.LOGIT_DISTRIBUTIONS`: ties, ramps, outliers, a recent
stretch raised, a sink, ReLU zeros), every row's window the whole row, for each ``--context``
and each of ``--dist-rows``: torch.topk against the Triton kernel, with the fraction of rows
on each of the kernel's paths and, where long rows are split across programs, the same call
on whole rows side by side.

``--e2e`` adds whole replicated calls (logits + top-k, one rank) of the last ``--rows``
rows of each given N: ``prefill_topk`` with each top-k choice and ``indexer.plan`` +
``StepPlan.run``, each over the backend's logits alone on one ``[M, N]`` block.

``--fused`` adds logits + top-k of the same late chunk three ways, side by side: DeepGEMM's
logits then the Triton top-k (where DeepGEMM runs), Triton's logits then the Triton top-k,
and the two fused (``backends/triton/fused_experimental.py``: the logits never written), with each one's
peak of temporary memory and whether its sets equal the unfused Triton path's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch

from .timing import graph_ms, host_ms, int_list, median_ms, queued_median_ms, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import non_negative_int, positive_int

    p.add_argument("--rows", type=positive_int, default=8192)
    p.add_argument("--context", default="16384,65536,131072,262144", help="comma-separated key counts N")
    p.add_argument("--heads", type=positive_int, default=64)
    p.add_argument("--head-dim", type=positive_int, default=128)
    p.add_argument("--topk", type=positive_int, default=2048)
    p.add_argument("--backend", default=None, help="backend whose logits are used (default: automatic dispatch)")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--e2e", default=None, help="comma-separated N for whole calls (prefill_topk with each top-k choice, plan.run) against the logits alone")
    p.add_argument("--fused", default=None, help="comma-separated N: logits + top-k unfused (DeepGEMM, Triton) "
                                                   "and fused (Triton), side by side")
    from ..synthetic import LOGIT_DISTRIBUTIONS

    p.add_argument("--dist", default=None,
                   help=f"comma-separated logit distributions (or 'all': {','.join(LOGIT_DISTRIBUTIONS)}), "
                        "timed on whole-row windows instead of a late chunk's logits")
    p.add_argument("--dist-rows", default="128,1024,8192", help="comma-separated row counts M of --dist")
    p.add_argument("--dist-fallback", action="store_true",
                   help="--dist also times each point with every row sent to the fallback path (sample_min past "
                        "the row length): the Triton top-k's worst case")
    p.add_argument("--dist-vs", default=None,
                   help="--dist also times the Triton top-k with these TopkConfig changes, side by side with the "
                        "shipped config (timed again after them as a control): changes separated by ';', each "
                        "'field=value[,field=value]', e.g. 'pdl=False;split_stage=True'")
    p.add_argument("--max-gib", type=float, default=64.0,
                   help="--dist skips an M x N whose logits exceed this many GiB")
    p.add_argument("--check-rows", type=non_negative_int, default=64,
                   help="--dist compares this many rows (spread over the block) with the torch path's sets")
    p.add_argument("--vllm-topk-lib", default=None,
                   help="a shared library registering vLLM's torch.ops._C.top_k_per_row_prefill (built from vLLM's "
                        "csrc/sampler.cu), timed beside ours; default: from an installed vLLM, if any")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    p.add_argument("--tune", action="store_true",
                   help="first time the Triton kernel's launch configs on the largest --context, print them, and use "
                        "the fastest for this run's own Triton top-k rows (put it in CONFIGS in "
                        "indexer/topk/triton/config.py to keep it)")
    p.add_argument("--tune-warps", default="4,8", help="filter kernel warps (filter_block = 128 x warps)")
    p.add_argument("--tune-per-sm", default="4,8")
    p.add_argument("--tune-select-warps", default="4,8")
    p.add_argument("--tune-fused", default="0,1", help="select in the filter kernel (1) or in its own launch (0)")
    p.add_argument("--tune-prefetch", default="1,2", help="blocks each filter program has in flight")
    p.add_argument("--tune-tile-write", default="0,1", help="select writes from its register tile (1) or re-reads (0)")
    p.add_argument("--tune-dynamic", default="0", help="filter rows from a shared counter (1) or strided (0)")
    p.add_argument("--tune-filter-maxnreg", default="0,40", help="filter kernel register caps (0: none)")
    p.add_argument("--tune-select-maxnreg", default="0", help="select kernel register caps (0: none)")
    p.add_argument("--tune-presample", default="0,1", help="sample thresholds in a kernel of their own (1) or in the "
                                                           "filter kernel (0)")
    p.add_argument("--tune-ballot-write", default="1", help="select writes by warp ballots (1, NVIDIA) or a scan (0)")
    p.add_argument("--tune-context", type=positive_int, default=None,
                   help="N of the tuning run (default: the largest --context)")


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/ms, counting bytes read and written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    return 2 * nbytes / ms


def _why(exc: BaseException) -> str:
    # an exception as a table cell: its type and the start of its message
    return f"{type(exc).__name__}: {str(exc)[:60]}"


def flashinfer_topk(tie_break: int = 1):
    """FlashInfer's ragged top-k as ``fn(logits, starts_rel, lengths, topk, out)`` (row-relative
    indices like ours), or ``(None, reason)`` where it does not import. ``tie_break=1`` asks
    for the lowest index among ties, our rule; 0 lets ties resolve any way."""
    try:
        from flashinfer import top_k_ragged_transform
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason to skip
        return None, "flashinfer: " + _why(exc)

    def fn(logits, starts_rel, lengths, topk, out):
        rows, n = logits.shape
        x = logits
        if logits.stride(0) != n:
            # its main path needs contiguous rows: widen a row-padded block to its full stride
            x = logits.as_strided((rows, logits.stride(0)), (logits.stride(0), 1))
        starts = starts_rel.to(torch.int32)
        # offsets 0 and row_starts = the window starts: indices come back row-relative
        res = top_k_ragged_transform(x, torch.zeros_like(starts), lengths.to(torch.int32), topk,
                                     tie_break=tie_break, row_starts=starts)
        out.copy_(res)

    return fn, ""


def vllm_topk(lib: str | None = None):
    """vLLM's ``top_k_per_row_prefill`` as ``fn(logits, starts_rel, lengths, topk, out)``
    (row-relative indices, ``-1`` padded, like ours), or ``(None, reason)``.

    Args:
        lib: A shared library that registers ``torch.ops._C.top_k_per_row_prefill`` with
            vLLM's schema ``(logits, rowStarts, rowEnds, indices!, numRows, stride0, stride1,
            topK)``; ``None``: the op as already registered, else from an installed vLLM.
    """
    try:
        if lib:
            torch.ops.load_library(lib)
        elif not hasattr(torch.ops._C, "top_k_per_row_prefill"):
            import vllm._C  # noqa: F401 - registers torch.ops._C
        op = torch.ops._C.top_k_per_row_prefill
    except Exception as exc:  # noqa: BLE001 - any load failure is a reason to skip
        return None, "vllm: " + _why(exc)

    def fn(logits, starts_rel, lengths, topk, out):
        starts = starts_rel.to(torch.int32)
        ends = (starts_rel + lengths).to(torch.int32)
        # it writes row r at indices + r * topk: a row-strided out gets a contiguous buffer
        dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        op(logits, starts, ends, dst, logits.shape[0], logits.stride(0), logits.stride(1), topk)
        if dst is not out:
            out.copy_(dst)

    return fn, ""


def anchor_topks(device: torch.device, vllm_lib: str | None = None) -> tuple[dict, dict]:
    """Other libraries' ragged top-k, to time beside ours: ``(found, missing)``, ``found``
    mapping a label to ``fn(logits, starts_rel, lengths, topk, out)`` and ``missing`` a label
    to why it is left out."""
    if device.type != "cuda":
        return {}, {"flashinfer": "cuda only", "vllm": "cuda only"}
    found, missing = {}, {}
    fi, why = flashinfer_topk(1)
    if fi is None:
        missing["flashinfer"] = why
    else:
        found["flashinfer"] = fi
        found["flashinfer any-tie"] = flashinfer_topk(0)[0]
    vl, why = vllm_topk(vllm_lib)
    if vl is None:
        missing["vllm"] = why
    else:
        found["vllm"] = vl
    return found, missing


def _same(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.sort(1).values == b.sort(1).values).all(1).float().mean().item()


def same_values(logits: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor) -> float:
    """Fraction of rows where ``a`` selects the values ``b`` selects, each key once.

    Two valid top-k sets of a row differ only among keys tied at the k-th value, so equal
    sorted values mean ``a`` is right whatever its tie rule (``b`` being a valid top-k). A
    row of ``a`` fails where it holds an index twice, an index outside its window, or a
    negative index other than the ``-1`` padding (a slot left unwritten). ``-1`` counts as
    ``-inf``; NaNs equal NaNs.

    Args:
        logits: float32 ``[M, W]``.
        starts: int ``[M]``: each row's window start, the column its index 0 reads.
        lengths: int ``[M]``: keys in each row's window.
        a, b: int32 ``[M, k]`` indices relative to ``starts``, ``-1`` padded.
    """
    def values(t):
        v = logits.gather(1, (t.long() + starts.long()[:, None]).clamp(0, logits.shape[1] - 1))
        return torch.where(t >= 0, v, torch.full_like(v, float("-inf"))).sort(1).values  # NaNs sort last

    va, vb = values(a), values(b)
    sa = a.sort(1).values
    twice = ((sa[:, 1:] == sa[:, :-1]) & (sa[:, 1:] >= 0)).any(1)
    outside = ((a < -1) | (a >= lengths.to(a.device)[:, None])).any(1)
    return (((va == vb) | (va.isnan() & vb.isnan())).all(1) & ~twice & ~outside).float().mean().item()


def run(args: argparse.Namespace) -> int:
    from ..topk import row_topk
    from ..backends.triton import kernels as tk

    device = torch.device(args.device)
    bw = copy_bandwidth(device) if device.type == "cuda" else None
    anchors, missing = anchor_topks(device, args.vllm_topk_lib)
    no_triton = tk.launch_reasons(device)
    have_triton = not no_triton
    if no_triton:
        print("Triton top-k rows left out: " + "; ".join(no_triton), flush=True)
    rows = []
    k = args.topk
    tuned = None
    if args.tune and have_triton and device.type == "cuda":
        tuned = _tune(args, device)
    if args.dist:
        rows = distributions(args, device, bw if bw else None, anchors)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(copy_bytes_per_ms=bw, dist=rows), f, indent=1)
        return 0
    for n in int_list(args.context):
        problem, backend, logits = _late_chunk_logits(args, device, n)
        m = logits.shape[0]
        starts = problem.row_starts.to(torch.int64)
        lengths = problem.row_ends.to(torch.int64) - starts
        valid_bytes = int(lengths.sum()) * 4
        floor = valid_bytes / bw if bw else None
        ref = torch.empty(m, k, dtype=torch.int32, device=device)
        row_topk(logits, starts, lengths, k, ref)
        base = dict(N=n, M=m, logits=backend.name, floor_ms=floor)

        def add(method, fn, out, note="", host=False):
            ms = median_ms(fn, device, warmup=1, repeats=args.repeats)
            queued = queued_median_ms(fn, device, warmup=1, repeats=args.repeats)
            host_us = host_ms(fn, device) * 1e3 if host else None
            if out is not None:
                out.fill_(-2)
            fn()
            rows.append(dict(base, method=method, ms=ms, queued_ms=queued, host_us=host_us,
                             same=_same(out, ref) if out is not None else None,
                             same_values=same_values(logits, starts, lengths, out, ref) if out is not None else None,
                             x_floor=ms / floor if floor else None, x_floor_queued=queued / floor if floor else None,
                             note=note))

        vals = torch.empty(m, k, dtype=torch.float32, device=device)
        idx = torch.empty(m, k, dtype=torch.int64, device=device)
        add("torch.topk", lambda: torch.topk(logits, k, dim=1, out=(vals, idx)), None)
        out = torch.empty(m, k, dtype=torch.int32, device=device)
        add("torch path", lambda: row_topk(logits, starts, lengths, k, out), out)
        if have_triton:
            from ..topk.triton import STAT_PLAIN, STAT_SAMPLED, ragged_topk

            stats = torch.zeros(4, dtype=torch.int32, device=device)
            ragged_topk(logits, starts, lengths, k, out, config=tuned, stats=stats)
            sampled, plain = stats[STAT_SAMPLED].item(), stats[STAT_PLAIN].item()
            add("triton" + (" (tuned config)" if tuned else ""),
                lambda: ragged_topk(logits, starts, lengths, k, out, config=tuned), out,
                f"{sampled / m:.1%} rows sampled, {plain} plain", host=True)
            if device.type == "cuda" and torch.version.hip is None:
                # side by side: every launch through Triton's JIT dispatch (the host's share)
                add("triton, JIT launches", lambda: ragged_topk(logits, starts, lengths, k, out, config=tuned,
                                                                 direct_launch=False),
                    out, host=True)
        for label, fn in anchors.items():
            try:
                add(label, lambda fn=fn: fn(logits, starts, lengths, k, out), out)
            except Exception as exc:  # noqa: BLE001 - a failing call is a row, not a crash
                rows.append(dict(base, method=label, note=_why(exc)))
        for label, why in missing.items():
            rows.append(dict(base, method=label, note=why))
        torch_ms = next(r["ms"] for r in rows if r["N"] == n and r["method"] == "torch.topk")
        for r in rows:
            if r["N"] == n and r.get("ms"):
                r["speedup"] = torch_ms / r["ms"]
        logits = None  # free the block before the next context's
        if device.type == "cuda":
            torch.cuda.empty_cache()
    cols = [("N", "keys N", "d"), ("M", "rows M", "d"), ("method", "top-k", "s"), ("ms", "ms", ".3f"),
            ("queued_ms", "queued ms", ".3f"), ("host_us", "host us", ".0f"), ("speedup", "vs torch.topk", ".2f"),
            ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"), ("x_floor_queued", "queued x floor", ".2f"),
            ("same", "same set", ".1%"), ("same_values", "same values", ".1%"), ("note", "note", "s")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bw_text = f", copy bandwidth {bw / 1e9:.2f} TB/s" if bw else ""
    print(f"bench topk: topk={k} H={args.heads} D={args.head_dim} on {device} ({name}){bw_text}, "
          f"median of {args.repeats} (ms: a synchronize around each call; queued ms: calls back to back, the host "
          "launching ahead)")
    print(table(rows, cols))
    e2e = _end_to_end(args, device) if args.e2e else []
    fused = _fused(args, device) if args.fused else []
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(copy_bytes_per_ms=bw, tuned=tuned and dataclasses.asdict(tuned), topk=rows, e2e=e2e,
                           fused=fused), f, indent=1)
    return 0


def config_changes(text: str | None) -> list[tuple[str, dict]]:
    """``--dist-vs``: ``'a=1,b=x;c=None'`` -> ``[('a=1,b=x', {'a': 1, 'b': 'x'}), ('c=None',
    {'c': None})]`` (values read as Python literals, else kept as strings), each checked
    against :class:`~indexer.topk.triton.config.TopkConfig`'s fields.

    Raises:
        SystemExit: an item without ``=`` or a field TopkConfig does not have.
    """
    import ast

    from ..topk.triton.config import TopkConfig

    fields = {f.name for f in dataclasses.fields(TopkConfig)}
    out = []
    for group in filter(None, (g.strip() for g in (text or "").split(";"))):
        changes = {}
        for item in filter(None, (i.strip() for i in group.split(","))):
            name, eq, value = item.partition("=")
            name = name.strip()
            if not eq or name not in fields:
                raise SystemExit(f"--dist-vs: {item!r} is not field=value for a TopkConfig field "
                                 f"({', '.join(sorted(fields))})")
            try:
                changes[name] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                changes[name] = value.strip()
        out.append((group, changes))
    return out


def distributions(args: argparse.Namespace, device: torch.device, bw: float | None, extra: dict | None = None,
                  ) -> list[dict]:
    """``--dist``: torch.topk and the Triton top-k side by side on each distribution, N and M
    (whole-row windows), printed as a table and returned as rows. ``extra``: more top-k
    implementations to time beside them, ``name -> fn(logits, starts, lengths, topk, out)``."""
    from ..synthetic import LOGIT_DISTRIBUTIONS

    names = LOGIT_DISTRIBUTIONS if args.dist == "all" else tuple(args.dist.split(","))
    for name in names:
        if name not in LOGIT_DISTRIBUTIONS:
            raise SystemExit(f"--dist: {name!r} is not one of {', '.join(LOGIT_DISTRIBUTIONS)}")
    from ..topk.triton import config as topk_config

    vs = []  # (label, config) of each --dist-vs change, timed at every point
    for label, changes in config_changes(args.dist_vs):
        # a bad value, or one this device rules out, stops the run before any timing, naming
        # the field
        try:
            changed = dataclasses.replace(topk_config.launch_config(device), **changes)
            for n in int_list(args.context):
                topk_config.plan_launches(device, changed, args.topk, n, 1, False)
        except ValueError as exc:
            raise SystemExit(f"--dist-vs {label}: {exc}") from None
        vs.append((label, changed))
    k = args.topk
    out_rows: list[dict] = []
    cols = [("dist", "logits", "s"), ("N", "keys N", "d"), ("M", "rows M", "d"), ("method", "top-k", "s"),
            ("ms", "ms", ".3f"), ("queued_ms", "queued ms", ".3f"), ("graph_ms", "graph ms", ".3f"),
            ("speedup", "vs torch.topk", ".2f"), ("graph_speedup", "graph vs torch.topk", ".2f"),
            ("floor_ms", "floor ms", ".3f"), ("x_floor", "x floor", ".2f"), ("x_floor_graph", "graph x floor", ".2f"),
            ("over_floor_graph_us", "graph over floor us", ".0f"), ("same", "same set", ".0%"),
            ("same_values", "same values", ".0%"), ("note", "paths", "s")]
    todo = [(name, n, m) for n in int_list(args.context) for m in int_list(args.dist_rows) for name in names
            if m * n * 4 <= args.max_gib * 2**30]
    for i, (name, n, m) in enumerate(todo):
        try:
            _distribution_rows(args, device, bw, extra, vs, name, n, m, out_rows)
        except torch.cuda.OutOfMemoryError:  # a point too large for this GPU is a row, not the end of the run
            out_rows.append(dict(dist=name, N=n, M=m, method="-", note="out of memory"))
        print(f"[{i + 1}/{len(todo)}] {name} N={n} M={m}: "
              + ", ".join(f"{r['method']} {r['ms']:.3f} ms" for r in out_rows if r.get("ms") and
                          (r["dist"], r["N"], r["M"]) == (name, n, m)), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bw_text = f", copy bandwidth {bw / 1e9:.2f} TB/s" if bw else ""
    print(f"bench topk --dist: topk={k}, whole-row windows, on {device} ({name}){bw_text}, median of {args.repeats} "
          f"(ms: a synchronize around each call; queued: back to back; graph: replayed from a CUDA graph, device time "
          f"alone); same set: {args.check_rows} rows checked against the torch path (lowest-index ties); same values: "
          f"the same rows' selected values (any tie order)")
    print(table(out_rows, cols))
    return out_rows


def _distribution_rows(args: argparse.Namespace, device: torch.device, bw: float | None, extra: dict | None,
                       vs: list, name: str, n: int, m: int, out_rows: list[dict]) -> None:
    # one --dist point: its rows appended to out_rows
    from ..topk import row_topk
    from ..topk.triton import ragged
    from ..topk.triton import config as topk_config
    from ..synthetic import logits_like

    k = args.topk
    logits = logits_like(name, m, n, device, seed=n + m)
    starts = torch.zeros(m, dtype=torch.int64, device=device)
    lengths = torch.full((m,), n, dtype=torch.int64, device=device)
    check = torch.unique(torch.linspace(0, m - 1, min(m, args.check_rows), device=device).long())
    ref = torch.empty(check.numel(), k, dtype=torch.int32, device=device)
    row_topk(logits[check], starts[check], lengths[check], k, ref)
    floor = m * n * 4 / bw if bw else None
    base = dict(dist=name, N=n, M=m, floor_ms=floor)
    out = torch.empty(m, k, dtype=torch.int32, device=device)

    def add(method, fn, note="", same=True):
        ms = median_ms(fn, device, warmup=1, repeats=args.repeats)
        queued = queued_median_ms(fn, device, warmup=1, repeats=args.repeats)
        graph = graph_ms(fn, device, args.repeats)
        out.fill_(-2)
        fn()
        r = dict(base, method=method, ms=ms, queued_ms=queued, graph_ms=graph, note=note,
                 same=_same(out[check], ref) if same else None,
                 same_values=(same_values(logits[check], starts[check], lengths[check], out[check], ref)
                              if same else None))
        if floor:
            r.update(x_floor=ms / floor, over_floor_us=(ms - floor) * 1e3)
            if graph is not None:
                r.update(x_floor_graph=graph / floor, over_floor_graph_us=(graph - floor) * 1e3)
        out_rows.append(r)
        return r

    vals = torch.empty(m, k, dtype=torch.float32, device=device)
    idx = torch.empty(m, k, dtype=torch.int64, device=device)
    torch_row = add("torch.topk", lambda: torch.topk(logits, k, dim=1, out=(vals, idx)), same=False)
    stats = torch.zeros(6, dtype=torch.int32, device=device)
    ragged.ragged_topk(logits, starts, lengths, k, out, stats=stats)
    s = stats.tolist()
    slices = topk_config.auto_slices(device, m, n, topk_config.launch_config(device).programs_per_sm)
    row_kernel = ragged.RaggedTopk(device, m, n, starts, lengths, k).plan.row is not None
    note = (f"sampled {s[topk_config.STAT_SAMPLED] / m:.0%}, fallback {s[topk_config.STAT_PLAIN]} "
            f"({s[topk_config.STAT_SPLIT]} split), whole-row {s[topk_config.STAT_WHOLE]}, "
            f"retried {s[topk_config.STAT_RETRIED]}"
            + (f"; {slices} programs a row" if slices > 1 else "") + ("; row kernel" if row_kernel else ""))
    found = [add("triton", lambda: ragged.ragged_topk(logits, starts, lengths, k, out), note)]
    if row_kernel:
        # the same rows through the sample / filter / select launches, side by side
        launches = dataclasses.replace(topk_config.launch_config(device), row_max=0)
        found.append(add("triton, row kernel off", lambda: ragged.ragged_topk(logits, starts, lengths, k, out,
                                                                                  config=launches)))
    from ..topk import cuda as native

    if n <= native.MAX_KEYS and not native.native_reasons(device):
        # the CUDA C++ row top-k on the same rows, side by side
        row_topk_native = native.NativeRowTopk(device, m, n, starts, lengths, k)
        found.append(add("native", lambda: row_topk_native(logits, out)))
    whole = dataclasses.replace(topk_config.launch_config(device), slices=1)
    if slices > 1:
        found.append(add("triton, whole rows", lambda: ragged.ragged_topk(logits, starts, lengths, k, out,
                                                                              config=whole)))
    if s[topk_config.STAT_SPLIT]:
        # the same rows with every fallback row selected by one program, side by side
        unsplit = dataclasses.replace(topk_config.launch_config(device), fallback_split=0)
        found.append(add("triton, fallback unsplit", lambda: ragged.ragged_topk(logits, starts, lengths, k, out,
                                                                                    config=unsplit)))
    for label, changed in vs:
        found.append(add(f"triton, {label}", lambda changed=changed: ragged.ragged_topk(logits, starts, lengths, k, out,
                                                                                       config=changed)))
    if vs:
        found.append(add("triton, again", lambda: ragged.ragged_topk(logits, starts, lengths, k, out), note))
    if args.dist_fallback:
        forced = dataclasses.replace(topk_config.launch_config(device), sample_min=n + 1)
        found.append(add("triton, every row on the fallback", lambda: ragged.ragged_topk(logits, starts, lengths, k,
                                                                                       out, config=forced)))
    for label, fn in (extra or {}).items():
        try:
            found.append(add(label, lambda fn=fn: fn(logits, starts, lengths, k, out)))
        except Exception as exc:  # noqa: BLE001 - a failing call is a row, not a crash
            out_rows.append(dict(base, method=label, note=_why(exc)))
    for r in [torch_row, *found]:
        r["speedup"] = torch_row["ms"] / r["ms"]
        if r.get("graph_ms") and torch_row.get("graph_ms"):
            r["graph_speedup"] = torch_row["graph_ms"] / r["graph_ms"]


def _late_chunk_problem(args: argparse.Namespace, device: torch.device, n: int):
    # the last min(rows, n) rows of one n-key causal request, checked
    from ..problem import validate
    from ..synthetic import make_inputs

    inp = make_inputs([n], [min(args.rows, n)], args.heads, args.head_dim, device, seed=n)
    return validate(*inp.args(), args.topk)


def _late_chunk_logits(args: argparse.Namespace, device: torch.device, n: int):
    # the logits block of that chunk (values outside each row's window unspecified)
    from ..backends import select_backend
    from ..backends.base import single_chunk
    from ..platform import platform_for_device

    problem, inputs = _late_chunk_problem(args, device, n)
    m = problem.num_rows
    backend = select_backend(problem, platform_for_device(device), args.backend or "auto")
    chunk = single_chunk(backend, problem, (0, m), (0, n))
    return problem, backend, backend.logits(problem, inputs, chunk)


def _tune(args: argparse.Namespace, device: torch.device):
    """Time the Triton top-k's launch configs side by side on the largest context and return
    the fastest that selected the torch path's sets (a :class:`TopkConfig`)."""
    from ..topk import row_topk
    from ..topk.triton import ragged
    from ..topk.triton import config as topk_config

    n = args.tune_context or max(int_list(args.context))
    problem, _, logits = _late_chunk_logits(args, device, n)
    m = logits.shape[0]
    starts = problem.row_starts.to(torch.int64)
    lengths = problem.row_ends.to(torch.int64) - starts
    ref = torch.empty(m, args.topk, dtype=torch.int32, device=device)
    row_topk(logits, starts, lengths, args.topk, ref)
    out = torch.empty(m, args.topk, dtype=torch.int32, device=device)
    rows = []
    grid = [dict(filter_block=128 * w, num_warps=w, programs_per_sm=p, select_warps=s, fused=bool(f), prefetch=d,
                 tile_write=bool(tw), filter_maxnreg=fr, select_maxnreg=sr, dynamic=bool(dy),
                 presample=bool(ps), ballot_write=bool(bw))
            for w in int_list(args.tune_warps) for p in int_list(args.tune_per_sm)
            for f in int_list(args.tune_fused) for s in (int_list(args.tune_select_warps) if not f else [w])
            for d in int_list(args.tune_prefetch) for tw in int_list(args.tune_tile_write)
            for fr in (int_list(args.tune_filter_maxnreg) if topk_config.is_nvidia(device) else [0])
            for sr in (int_list(args.tune_select_maxnreg) if topk_config.is_nvidia(device) else [0])
            for dy in int_list(args.tune_dynamic) for ps in int_list(args.tune_presample)
            for bw in (int_list(args.tune_ballot_write) if topk_config.is_nvidia(device) else [0])
            # a filter cap only where a config's would apply (the filter that only streams),
            # so that the config installed is the one measured
            if not (fr and (f or not ps))]
    # the config in use is always a candidate: a grid that misses it cannot install a slower one
    config = topk_config.launch_config(device)
    as_row = dict(config.__dict__, filter_maxnreg=config.streaming_filter_maxnreg or 0,
                  select_maxnreg=config.select_maxnreg or 0, presample=bool(config.presample))
    current = {key: as_row[key] for key in grid[0]} if grid else {}
    if current and current not in grid:
        grid.append(current)

    def to_config(cfg: dict):
        # a grid row's filter cap is the cap of the filter that only streams, as in CONFIGS
        fields = dict(cfg, streaming_filter_maxnreg=cfg["filter_maxnreg"] or None, filter_maxnreg=None,
                      select_maxnreg=cfg["select_maxnreg"] or None)
        return dataclasses.replace(config, **fields)

    for cfg in grid:
        # device time: the host's launch time is the same for every config
        config_i = to_config(cfg)
        ms = queued_median_ms(lambda: ragged.ragged_topk(logits, starts, lengths, args.topk, out, config=config_i),
                              device, warmup=1, repeats=args.repeats)
        rows.append(dict(cfg, ms=ms, same=_same(out, ref)))
    # only a config that selected the torch path's sets can be the best
    rows.sort(key=lambda r: (r["same"] < 1.0, r["ms"]))
    print(f"Triton top-k launch configs, N={n} M={m} topk={args.topk}, median of {args.repeats} (queued timing)")
    print(table(rows, [("num_warps", "filter warps", "d"), ("filter_block", "filter_block", "d"),
                       ("programs_per_sm", "programs/SM", "d"), ("prefetch", "prefetch", "d"),
                       ("fused", "fused", "d"), ("select_warps", "select warps", "d"),
                       ("tile_write", "tile write", "d"), ("filter_maxnreg", "filter regs", "d"),
                       ("select_maxnreg", "select regs", "d"), ("dynamic", "dynamic", "d"),
                       ("presample", "presample", "d"), ("ballot_write", "ballot write", "d"), ("ms", "ms", ".3f"),
                       ("same", "same set", ".1%")]))
    best = to_config({key: value for key, value in rows[0].items() if key not in ("ms", "same")})
    print(f"best for {topk_config._arch(device)}: {best} (used by this run's own Triton top-k rows; prefill_topk keeps "
          "CONFIGS)")
    return best


def _end_to_end(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Whole replicated calls (logits + top-k, one rank), side by side: ``prefill_topk`` with
    each top-k choice, and ``indexer.plan`` once then ``StepPlan.run`` (the default top-k),
    each against the backend's logits alone on the rows' one ``[M, N]`` block."""
    import indexer

    from ..backends.base import single_chunk
    from ..platform import platform_key
    from ..problem import validate
    from ..synthetic import make_inputs

    var = f"INDEXER_{platform_key(device).upper()}_TOPK"
    saved = os.environ.get(var)
    rows = []
    try:
        for n in int_list(args.e2e):
            m = min(args.rows, n)
            inp = make_inputs([n], [m], args.heads, args.head_dim, device, seed=n)
            results = {}
            for choice in ("torch", "triton"):
                os.environ[var] = choice
                call = lambda: indexer.prefill_topk(*inp.args(), args.topk, backend=args.backend)  # noqa: E731
                ms = median_ms(call, device, warmup=1, repeats=args.repeats)
                results[choice] = call()
                rows.append(dict(N=n, M=m, way=f"prefill_topk, {choice} top-k", ms=ms))
            if saved is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = saved
            step = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=n, heads=args.heads,
                                head_dim=args.head_dim, topk=args.topk, device=device, fp8_dtype=inp.q.dtype,
                                backend=args.backend)
            out = torch.empty(m, args.topk, dtype=torch.int32, device=device)
            ms = median_ms(lambda: step.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out), device, warmup=1,
                           repeats=args.repeats)
            results["plan"] = out
            rows.append(dict(N=n, M=m, way=f"plan.run ({len(step.chunks)} chunks)", ms=ms))
            # the plan's backend computing the rows' logits as one block, where it may (else in
            # the plan's chunks, one after another)
            backend = step.backend
            problem, inputs = validate(*inp.args(), args.topk)
            cap, most = backend.max_chunk_bytes(problem), backend.max_chunk_rows
            whole = (cap is None or int(backend.logits_alloc_bytes(torch.tensor(m), torch.tensor(n))) <= cap) and \
                (most is None or m <= most)
            if whole:
                chunks, what = [single_chunk(backend, problem, (0, m), (0, n))], "one block"
            else:
                chunks = [single_chunk(backend, problem, c.rows, c.cols, c.compressed) for c in step.chunks if not c.empty]
                what = f"the plan's {len(chunks)} chunks"

            def logits_alone():
                for c in chunks:
                    backend.logits(problem, inputs, c)

            logits_ms = median_ms(logits_alone, device, warmup=1, repeats=args.repeats)
            rows.append(dict(N=n, M=m, way=f"{backend.name} logits alone, {what}", ms=logits_ms))
            del step, chunks
            same = min(_same(results["torch"], results[way]) for way in ("triton", "plan"))
            base = rows[-4]["ms"]
            for r in rows[-4:]:
                r.update(speedup=base / r["ms"], over_logits=r["ms"] / logits_ms, same=same)
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    print(f"end to end, replicated (logits + top-k), backend {args.backend or 'auto'}:")
    print(table(rows, [("N", "keys N", "d"), ("M", "rows M", "d"), ("way", "way", "s"), ("ms", "ms", ".2f"),
                       ("speedup", "vs torch top-k", ".2f"), ("over_logits", "x logits alone", ".3f"),
                       ("same", "same set", ".1%")]))
    return rows


def _fused(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Logits + top-k of a late chunk: unfused (DeepGEMM's logits where it runs, Triton's)
    and fused, side by side; each with its peak of memory beyond the inputs and output."""
    from ..backends import get_backend
    from ..backends.base import single_chunk
    from ..backends.triton import fused_experimental
    from ..backends.triton import kernels as tk
    from ..topk.triton.ragged import ragged_topk

    cuda = device.type == "cuda"
    rows = []
    for n in int_list(args.fused):
        problem, inputs = _late_chunk_problem(args, device, n)
        m = problem.num_rows
        q, k, k_scale, w = inputs
        starts, ends = problem.row_starts, problem.row_ends
        lengths = ends - starts
        out = torch.empty(m, args.topk, dtype=torch.int32, device=device)
        ways = {}
        dg = get_backend("deepgemm")
        if not dg.not_supported_reasons(problem):
            chunk = single_chunk(dg, problem, (0, m), (0, n))

            def deepgemm(chunk=chunk):
                logits = dg.logits(problem, inputs, chunk)
                ragged_topk(logits, starts, lengths, args.topk, out)
            ways["deepgemm + triton top-k"] = deepgemm
        ways["triton + triton top-k"] = lambda: ragged_topk(tk.mqa_logits(q, k, k_scale, w, starts, ends), starts,
                                                            lengths, args.topk, out)
        ways["fused triton"] = lambda: fused_experimental.logits_topk(q, k, k_scale, w, starts, ends, args.topk, out)
        results, found = {}, {}
        for name, fn in ways.items():
            ms = median_ms(fn, device, warmup=1, repeats=args.repeats)
            if cuda:
                torch.cuda.synchronize(device)
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            fn()
            peak = (torch.cuda.max_memory_allocated(device) - base) if cuda else None
            results[name] = out.clone()
            found[name] = dict(N=n, M=m, method=name, ms=ms, temp_gib=peak / 2**30 if peak is not None else None)
        ref = results["triton + triton top-k"]
        for name, r in found.items():
            r["same"] = _same(results[name], ref)
            r["speedup"] = found["triton + triton top-k"]["ms"] / r["ms"]
            rows.append(r)
        if cuda:
            torch.cuda.empty_cache()
    print(f"logits + top-k of a late chunk, unfused and fused (topk={args.topk}, H={args.heads}, D={args.head_dim}):")
    print(table(rows, [("N", "keys N", "d"), ("M", "rows M", "d"), ("method", "logits + top-k", "s"),
                       ("ms", "ms", ".2f"), ("speedup", "vs triton unfused", ".2f"),
                       ("temp_gib", "temporaries GiB", ".2f"), ("same", "same set as triton unfused", ".2%")]))
    return rows
