"""``python -m indexer bench``: benchmarks (not tests)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..bench import kernels

    p = sub.add_parser("bench", help="benchmarks: 'kernels' times each backend's logits and top-k")
    what = p.add_subparsers(dest="what", required=True)
    k = what.add_parser("kernels", help="each backend's logits and top-k side by side on one device")
    kernels.add_arguments(k)
    k.set_defaults(func=kernels.run)
