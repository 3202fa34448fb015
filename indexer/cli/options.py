"""Argument types shared by the command line: a bad option is argparse's one-line error
(usage + message, exit code 2) in the parent process, before anything is spawned."""

from __future__ import annotations

import argparse


def int_at_least(low: int):
    """argparse ``type``: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)
"""argparse ``type``: an integer >= 1."""

non_negative_int = int_at_least(0)
"""argparse ``type``: an integer >= 0."""


def flag_choices(name: str) -> tuple[str, ...]:
    """The values an ``INDEXER_*`` choice flag allows (``TP_SHARD_STRATEGY`` ->
    ``auto, contiguous, ...``), for argparse ``choices``."""
    from .. import envs

    choices = envs.get_flag(name).choices
    assert choices is not None, name
    return choices


def check_environment_or_exit(parser: argparse.ArgumentParser) -> None:
    """A bad ``INDEXER_*`` value as the parser's one-line error (exit code 2)."""
    from .. import envs

    try:
        envs.check_environment()
    except ValueError as exc:
        parser.error(str(exc))
