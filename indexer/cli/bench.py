"""``python -m indexer bench``: benchmarks (not tests)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..bench import backends, calibrate, engines, kernels, step, topk, tp

    p = sub.add_parser("bench", help="benchmarks: kernels | topk | step | backends | engines | tp | calibrate (--calibrate is short "
                                     "for 'bench calibrate')")
    p.add_argument("--calibrate", action="store_true", help="same as 'bench calibrate' with its defaults")
    what = p.add_subparsers(dest="what")
    for name, module, help_text in (
        ("kernels", kernels, "each backend's logits and top-k side by side on one device"),
        ("topk", topk, "top-k implementations side by side on real logits, against the bandwidth floor"),
        ("step", step, "a forward step of L layers: plan once + run per layer, against prefill_topk and plain "
                       "DeepGEMM + torch.topk"),
        ("backends", backends, "automatic dispatch against every backend forced, per shape and logits budget "
                               "(time and memory)"),
        ("engines", engines, "an engine adapter (vLLM or SGLang) against the direct plan/run and prefill_topk calls "
                             "it makes"),
        ("tp", tp, "replicated vs every strategy on 1..N ranks over a context-length sweep"),
        ("calibrate", calibrate, "measure this device's per-row cost coefficients for the planner"),
    ):
        sp = what.add_parser(name, help=help_text)
        module.add_arguments(sp)
        sp.set_defaults(func=module.run)

    def dispatch(args: argparse.Namespace) -> int:
        if args.calibrate and args.what is None:
            cal = argparse.ArgumentParser()
            calibrate.add_arguments(cal)
            return calibrate.run(cal.parse_args([]))
        p.error("choose one of: kernels, topk, step, backends, engines, tp, calibrate (or --calibrate)")
        return 2

    p.set_defaults(func=dispatch)
