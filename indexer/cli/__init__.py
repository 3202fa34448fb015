"""Command line: ``python -m indexer info|demo|bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m indexer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import bench, demo, info

    info.add_parser(sub)
    demo.add_parser(sub)
    bench.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
