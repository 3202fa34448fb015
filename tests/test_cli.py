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


def test_demo_two_ranks_exact():
    res = _run("demo", "--tp", "2", "--rows", "300", "--context", "1200", "--topk", "64", "--repeats", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "EXACT MATCH: 300/300 rows" in res.stdout
    assert "identical tables: yes" in res.stdout
    assert "speedup" in res.stdout


def test_demo_first_chunk_forced_strategy():
    res = _run("demo", "--tp", "3", "--layout", "first", "--context", "400", "--topk", "32", "--repeats", "1", "--strategy", "balanced", "--reassembly", "padded")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "plan: balanced, reassembly padded" in res.stdout
    assert "EXACT MATCH: 400/400 rows" in res.stdout


def test_bench_topk_fused_rows_select_the_unfused_sets(tmp_path, cpu_interpreter):
    # Triton's interpreter on CPU: the fused and unfused rows of `bench topk --fused`
    import json

    out = tmp_path / "fused.json"
    res = _run("bench", "topk", "--device", "cpu", "--context", "700", "--rows", "12", "--fused", "700", "--heads",
               "4", "--head-dim", "32", "--topk", "16", "--repeats", "1", "--json", str(out),
               env={"TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr
    rows = {r["method"]: r for r in json.loads(out.read_text())["fused"]}
    assert set(rows) == {"triton + triton top-k", "fused triton"}, rows  # no DeepGEMM on CPU
    assert rows["fused triton"]["same"] == 1.0 and rows["fused triton"]["ms"] > 0
