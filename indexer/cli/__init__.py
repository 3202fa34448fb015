"""Command line: ``python -m indexer info|demo|bench``."""

from __future__ import annotations

import argparse
import os
import sys


def shadowing_message() -> str | None:
    """Why ``import indexer`` did not give the package, or ``None`` when it did.

    Run from the folder that holds a clone named ``indexer/``, Python can take that folder
    for an (empty) namespace package ``indexer`` ahead of the installed package: every
    attribute is then missing. Said in one line instead of an ``AttributeError``.
    """
    mod = sys.modules.get("indexer")
    if mod is None or getattr(mod, "__file__", None) is not None:
        return None
    where = [str(p) for p in getattr(mod, "__path__", [])]
    folder = where[0] if where else os.path.join(os.getcwd(), "indexer")
    return (
        f"indexer: the folder {folder} shadows the indexer package (Python imports it as an empty "
        f"namespace package); run from the repository root (cd {folder}) or any folder without an "
        "'indexer' subfolder, or reinstall with 'pip install -e .' from the repository root"
    )


def main(argv: list[str] | None = None) -> int:
    message = shadowing_message()
    if message is not None:
        print(message, file=sys.stderr)
        return 2
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
