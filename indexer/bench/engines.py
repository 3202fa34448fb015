"""``python -m indexer bench engines``: an engine adapter against the direct calls it makes.

Steps are laid out as vLLM's indexer metadata builder lays them out
(:func:`indexer.synthetic.vllm_prefill_step`: packed requests in one gathering of the key
workspace, a long request cut into sub-chunks that reuse it, decode rows first). Each is
filled into vLLM's ``topk_indices_buffer`` these ways, side by side in one process:

- ``adapter plan + run``: :func:`indexer.integrations.vllm.plan_prefill` once, then
  ``PrefillPlan.run`` per layer.
- ``direct plan + run``: what the adapter does, written out by hand: one :func:`indexer.plan`
  per gathering (its chunks' bounds concatenated), ``plan.run`` on its rows per layer.
- ``adapter one-shot``: :func:`indexer.integrations.vllm.prefill_topk` per layer.
- ``direct one-shot``: one :func:`indexer.prefill_topk` per gathering per layer.
- ``indexer per chunk``: one :func:`indexer.prefill_topk` per vLLM chunk (sub-chunks not
  merged), as vLLM's own loop would call it.
- ``deepgemm + torch.topk per chunk`` (where DeepGEMM runs): vLLM's loop with its logits
  (``fp8_mqa_logits``, full width) and ``torch.topk`` for its top-k.

With ``--engine sglang`` each case's requests are one SGLang extend batch
(:func:`indexer.synthetic.sglang_extend_batch`), and the ways are the adapter's plan + run
with the ``ragged`` and ``paged`` index transforms and its one-shot ``paged`` call, against
``indexer.plan``'s run and ``indexer.prefill_topk`` (row-relative, no transform).

Every way's sets are compared with the first's. Times are one layer's, in milliseconds:
``sync`` synchronized around each call, ``queued`` the calls queued back to back; each the
median of ``--rounds`` rounds (every way once a round, in turn) of medians of ``--repeats``
calls. The workspace is gathered once, before timing (each step here is one gathering).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from .timing import median_ms, queued_median_ms, table

_GPU = dict(heads=64, head_dim=128, topk=2048, max_logits_mb=512,
            cases="packed=8x16384:1024,long=65536:8192/2048,mixed=128+40960:4096+16384:2048+8192:2048/2048")
_CPU = dict(heads=4, head_dim=32, topk=64, max_logits_mb=8,
            cases="packed=4x512:128,long=2048:512/128,mixed=8+1024:256+512:128/128")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli.options import positive_int

    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                   help="whose adapter and layout (sglang: the requests of each case as one extend batch)")
    p.add_argument("--cases", default=None,
                   help="comma-separated NAME=SPEC; SPEC is REQxKEYS:ROWS (packed requests) or "
                        "[DECODE+]KEYS:ROWS+KEYS:ROWS... with /SUB (sub-chunks of SUB rows); "
                        f"GPU default {_GPU['cases']}; CPU {_CPU['cases']}")
    p.add_argument("--heads", type=positive_int, default=None)
    p.add_argument("--head-dim", type=positive_int, default=None)
    p.add_argument("--topk", type=positive_int, default=None)
    p.add_argument("--max-logits-mb", type=float, default=None, help="the engine's logits budget (GPU default 512, "
                   "vLLM's VLLM_SPARSE_INDEXER_MAX_LOGITS_MB)")
    p.add_argument("--backend", default=None, help="indexer backend (default auto)")
    p.add_argument("--repeats", type=positive_int, default=5, help="calls a measurement (median)")
    p.add_argument("--rounds", type=positive_int, default=3, help="every way measured once a round, in turn; the median "
                   "of the rounds is shown")
    p.add_argument("--json", default=None, help="write the rows here")


def parse_case(spec: str) -> dict:
    """``"8x16384:1024"`` or ``"128+40960:4096+8192:2048/2048"`` -> ``dict(seq_lens,
    query_lens, decode_rows, subchunk_rows)``.

    Raises:
        ValueError: a spec of neither form.
    """
    try:
        body, _, sub = spec.partition("/")
        parts = body.split("+")
        decode = 0
        if ":" not in parts[0]:
            decode = int(parts.pop(0))
        seq, rows = [], []
        for part in parts:
            count, _, req = part.rpartition("x")
            keys, q = (int(x) for x in req.split(":"))
            seq += [keys] * int(count or 1)
            rows += [q] * int(count or 1)
        return dict(seq_lens=seq, query_lens=rows, decode_rows=decode, subchunk_rows=int(sub) if sub else None)
    except ValueError:
        raise ValueError(f"--cases: {spec!r} is not REQxKEYS:ROWS or [DECODE+]KEYS:ROWS+...[/SUB]") from None


def _time_in_rounds(name: str, rows: list[dict], calls: list, cfg: dict, device: torch.device) -> None:
    """``sync_ms`` and ``queued_ms`` of each row's call: rounds of every call in turn, so that
    no way is timed only just after another (the first calls after a switch can be slower)
    and drift hits every way alike; the median of the rounds."""
    times = [([], []) for _ in rows]
    for r in range(cfg["rounds"]):
        print(f"  {name}: round {r + 1}/{cfg['rounds']}", file=sys.stderr, flush=True)
        for (sync, queued), call in zip(times, calls):
            sync.append(median_ms(call, device, warmup=3, repeats=cfg["repeats"]))
            queued.append(queued_median_ms(call, device, warmup=3, repeats=cfg["repeats"]))
    for row, (sync, queued) in zip(rows, times):
        row["sync_ms"], row["queued_ms"] = statistics.median(sync), statistics.median(queued)


def _direct_groups(step, topk: int):
    """Each gathering's rows and bounds, as a caller without the adapter would collect them."""
    from ..integrations.vllm import merge_subchunks

    return [(slice(g.token_start, g.token_end), g.cu_seqlen_ks, g.cu_seqlen_ke, g.num_keys)
            for g in merge_subchunks(step) if g.token_end > g.token_start]


def _plain_per_chunk(step, q, k_quant, scales, weights, buffer, topk):
    """vLLM's loop with DeepGEMM's full-width logits and torch.topk, or None where DeepGEMM
    cannot run."""
    from ..backends import get_backend

    if q.device.type != "cuda" or get_backend("deepgemm").not_supported_reasons(None):
        return None
    import deep_gemm

    fn = getattr(deep_gemm, "fp8_mqa_logits", None)
    if fn is None:
        return None
    chunks = [(slice(c.token_start, c.token_end), c.cu_seqlen_ks, c.cu_seqlen_ke, c.max_local_total_seq_lens)
              for c in step.chunks]

    def call():
        for rows, ks, ke, n in chunks:
            logits = fn(q[rows], (k_quant[:n], scales[:n]), weights[rows], ks, ke, clean_logits=True)
            idx = torch.topk(logits, min(topk, n), dim=1).indices
            buffer[rows, :idx.shape[1]] = (idx - ks[:, None]).to(torch.int32)

    return call


def _case_rows(name: str, spec: dict, cfg: dict, device: torch.device) -> list[dict]:
    import indexer
    from ..integrations import vllm as adapter
    from ..synthetic import vllm_prefill_step

    topk, mb = cfg["topk"], cfg["max_logits_mb"]
    step = vllm_prefill_step(spec["seq_lens"], spec["query_lens"], decode_rows=spec["decode_rows"],
                             heads=cfg["heads"], head_dim=cfg["head_dim"], chunk_keys=sum(spec["seq_lens"]),
                             subchunk_rows=spec["subchunk_rows"])
    gatherings = {c.requests for c in step.chunks}
    if len(gatherings) != 1:
        raise ValueError(f"case {name}: {len(gatherings)} gatherings; the bench times steps of one")
    for c in step.chunks:  # vLLM's metadata builder leaves the bounds on the device
        c.cu_seqlen_ks, c.cu_seqlen_ke = c.cu_seqlen_ks.to(device), c.cu_seqlen_ke.to(device)
    q, weights = step.q.to(device), step.weights.to(device)
    k_quant, k_scale = step.workspace(device)
    step.gather(step.chunks[0], k_quant, k_scale)
    scales = adapter.key_scales(k_scale)
    kw = dict(backend=cfg["backend"])
    buffer = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=device)
    groups = _direct_groups(step, topk)

    planned = adapter.plan_prefill(step, heads=cfg["heads"], head_dim=cfg["head_dim"], topk=topk, device=device,
                                   fp8_dtype=q.dtype, max_logits_mb=mb, **kw)
    direct = [(rows, indexer.plan(ks, ke, num_keys=n, heads=cfg["heads"], head_dim=cfg["head_dim"],
                                  topk=topk, device=device, fp8_dtype=q.dtype, max_logits_mb=mb, **kw), n)
              for rows, ks, ke, n in groups]
    chunks = [(slice(c.token_start, c.token_end), c.cu_seqlen_ks, c.cu_seqlen_ke, c.max_local_total_seq_lens)
              for c in step.chunks]

    def direct_run():
        for rows, plan, n in direct:
            plan.run(q[rows], k_quant[:n], scales[:n], weights[rows], out=buffer[rows, :topk])

    def direct_one_shot():
        for rows, ks, ke, n in groups:
            indexer.prefill_topk(q[rows], k_quant[:n], scales[:n], weights[rows], ks, ke, topk,
                                 out=buffer[rows, :topk], max_logits_mb=mb, **kw)

    def per_chunk():
        for rows, ks, ke, n in chunks:
            indexer.prefill_topk(q[rows], k_quant[:n], scales[:n], weights[rows], ks, ke, topk,
                                 out=buffer[rows, :topk], max_logits_mb=mb, **kw)

    ways = {
        "adapter plan + run": lambda: planned.run(q, k_quant, k_scale, weights, buffer),
        "direct plan + run": direct_run,
        "adapter one-shot": lambda: adapter.prefill_topk(step, q, k_quant, k_scale, weights, buffer, topk,
                                                         max_logits_mb=mb, **kw),
        "direct one-shot": direct_one_shot,
        "indexer per chunk": per_chunk,
    }
    plain = _plain_per_chunk(step, q, k_quant, scales, weights, buffer, topk)
    if plain is not None:
        ways["deepgemm + torch.topk per chunk"] = plain
    first = groups[0][0].start if groups else 0
    rows_out, ref = [], None
    for way, call in ways.items():
        buffer.fill_(-1)
        call()
        got = buffer[first:].sort(1).values
        if ref is None:
            ref = got.clone()
        rows_out.append(dict(case=name, way=way, rows=q.shape[0] - first, keys=step.workspace_keys,
                             chunks=len(step.chunks), groups=len(groups), backend=direct[0][1].info.backend,
                             same=bool(torch.equal(got, ref))))
    _time_in_rounds(name, rows_out, list(ways.values()), cfg, device)
    by_way = {r["way"]: r for r in rows_out}
    for r in rows_out:
        twin = {"adapter plan + run": "direct plan + run", "adapter one-shot": "direct one-shot"}.get(r["way"])
        if twin:
            r["over_direct_sync"] = r["sync_ms"] / by_way[twin]["sync_ms"]
            r["over_direct_queued"] = r["queued_ms"] / by_way[twin]["queued_ms"]
    return rows_out


def _sglang_rows(name: str, spec: dict, cfg: dict, device: torch.device) -> list[dict]:
    """An SGLang extend batch (the spec's requests, decode rows and sub-chunks ignored):
    the adapter with each index transform against the direct plan/run and prefill_topk."""
    import indexer
    from ..integrations import sglang as adapter
    from ..synthetic import sglang_extend_batch

    topk, mb = cfg["topk"], cfg["max_logits_mb"]
    b = sglang_extend_batch(spec["seq_lens"], spec["query_lens"], heads=cfg["heads"], head_dim=cfg["head_dim"],
                            device=device)
    rows, n = b.ks.numel(), b.k_fp8.shape[0]
    kw = dict(backend=cfg["backend"])
    table = dict(topk_indices_offset=b.topk_indices_offset, page_table_1=b.page_table_1,
                 token_to_batch_idx=b.token_to_batch_idx)
    buffer = torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    scales, weights = b.k_scale.view(torch.float32).reshape(-1), b.weights.squeeze(-1)
    plans = {t: adapter.plan_prefill(b.ks, b.ke, num_keys=n, heads=cfg["heads"], head_dim=cfg["head_dim"], topk=topk,
                                     transform=t, device=device, fp8_dtype=b.q_fp8.dtype, max_logits_mb=mb, **table,
                                     **kw) for t in ("ragged", "paged")}
    direct = indexer.plan(b.ks, b.ke, num_keys=n, heads=cfg["heads"], head_dim=cfg["head_dim"], topk=topk,
                          device=device, fp8_dtype=b.q_fp8.dtype, max_logits_mb=mb, **kw)
    ways = {
        "direct plan + run (relative)": lambda: direct.run(b.q_fp8, b.k_fp8, scales, weights, out=buffer),
        "adapter plan + run, ragged": lambda: plans["ragged"].run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, buffer),
        "adapter plan + run, paged": lambda: plans["paged"].run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, buffer),
        "direct one-shot (relative)": lambda: indexer.prefill_topk(b.q_fp8, b.k_fp8, scales, weights, b.ks, b.ke,
                                                                   topk, out=buffer, max_logits_mb=mb, **kw),
        "adapter one-shot, paged": lambda: adapter.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke,
                                                                topk, buffer, transform="paged", max_logits_mb=mb,
                                                                **table, **kw),
    }
    out = []
    for way, call in ways.items():
        out.append(dict(case=name, way=way, rows=rows, keys=n, chunks=None, groups=1, backend=direct.info.backend,
                        same=None))
    _time_in_rounds(name, out, list(ways.values()), cfg, device)
    for row in out:
        base = out[3] if "one-shot" in row["way"] else out[0]
        if row is not base:
            row["over_direct_sync"] = row["sync_ms"] / base["sync_ms"]
            row["over_direct_queued"] = row["queued_ms"] / base["queued_ms"]
    return out


def run(args: argparse.Namespace) -> int:
    base = _GPU if args.device.startswith("cuda") else _CPU
    cfg = {k: (getattr(args, k) if getattr(args, k, None) is not None else v) for k, v in base.items()}
    cfg.update(backend=args.backend or "auto", repeats=args.repeats, rounds=args.rounds)
    cases = []
    for item in cfg["cases"].split(","):
        name, sep, spec = item.partition("=")
        if not sep:
            raise SystemExit(f"--cases: {item!r} needs NAME=SPEC")
        cases.append((name, parse_case(spec)))
    device = torch.device(args.device)
    rows = []
    for name, spec in cases:
        rows += (_sglang_rows if args.engine == "sglang" else _case_rows)(name, spec, cfg, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"bench engines: {args.engine}-shaped steps (H={cfg['heads']} D={cfg['head_dim']} topk={cfg['topk']}, "
          f"logits budget {cfg['max_logits_mb']} MiB) on {device}; ms a layer, median of {cfg['rounds']} rounds of "
          f"medians of {cfg['repeats']}")
    print(table([dict(r, same="-" if r["same"] is None else ("yes" if r["same"] else "NO")) for r in rows],
                [("case", "case", "s"), ("way", "way", "s"), ("rows", "rows", "d"), ("keys", "keys", "d"),
                 ("chunks", "chunks", "d"), ("groups", "groups", "d"), ("backend", "backend", "s"),
                 ("sync_ms", "sync ms", ".3f"), ("queued_ms", "queued ms", ".3f"),
                 ("over_direct_sync", "adapter/direct sync", ".3f"),
                 ("over_direct_queued", "adapter/direct queued", ".3f"), ("same", "same sets", "s")]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["same"] is not False for r in rows) else 1
