"""The command line runs as a user would run it."""

from __future__ import annotations

import subprocess
import sys


def _run(*args, env=None):
    import os

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, timeout=600, env=full_env)


def test_info():
    res = _run("info", env={"INDEXER_TP_SHARD_MIN_ROWS": "77"})
    assert res.returncode == 0, res.stderr
    assert "indexer 0." in res.stdout
    assert "platform:" in res.stdout
    assert "torch" in res.stdout and "INDEXER_TP_SHARD_MIN_ROWS" in res.stdout
    assert "env INDEXER_TP_SHARD_MIN_ROWS" in res.stdout


def test_info_survives_bad_env():
    res = _run("info", env={"INDEXER_REASSEMBLY": "bogus"})
    assert res.returncode == 0, res.stderr
    assert "INVALID" in res.stdout and "warning" in res.stdout
