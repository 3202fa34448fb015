"""``python -m indexer demo``: compute an indexer prefill step and check it against a naive reference."""

from __future__ import annotations

import argparse
import time

import torch


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a synthetic long-context prefill step and check it exactly")
    p.add_argument("--rows", type=int, default=1024, help="query rows M (default 1024)")
    p.add_argument("--context", type=int, default=4096, help="keys N of the request (default 4096)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--topk", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import indexer
    from indexer.synthetic import make_inputs

    inp = make_inputs([args.context], [args.rows], args.heads, args.head_dim, args.device)
    t0 = time.perf_counter()
    out = indexer.prefill_topk(*inp.args(), args.topk)
    ms = (time.perf_counter() - t0) * 1e3
    # independent check: dense float64 logits and torch.topk on the valid window
    q = inp.q.double()
    kk = inp.k.double()
    ok = 0
    for m in range(0, args.rows, max(1, args.rows // 16)):
        s, e = int(inp.row_starts[m]), int(inp.row_ends[m])
        logit = (torch.relu(torch.einsum("hd,nd->hn", q[m], kk[s:e])) * inp.weights[m].double()[:, None]).sum(0)
        logit = logit * inp.k_scale[s:e].double()
        want = set(torch.topk(logit, min(args.topk, e - s)).indices.tolist())
        got = set(x for x in out[m].tolist() if x >= 0)
        ok += want == got
    checked = len(range(0, args.rows, max(1, args.rows // 16)))
    print(f"{'rows':>6} {'keys':>7} {'H':>3} {'D':>4} {'topk':>5} {'backend':>8} {'ms':>9} {'rows checked':>13}")
    print(f"{args.rows:>6} {args.context:>7} {args.heads:>3} {args.head_dim:>4} {args.topk:>5} {'auto':>8} {ms:>9.1f} {f'{ok}/{checked} exact':>13}")
    return 0 if ok == checked else 1
