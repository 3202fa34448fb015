"""The command line runs as a user would run it."""

from __future__ import annotations

import subprocess
import sys

import pytest


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


def test_bench_backends_budgets_never_change_a_backends_sets(tmp_path):
    import json

    out = tmp_path / "backends.json"
    res = _run("bench", "backends", "--shapes", "first@256,2x300:40", "--budgets", "512,0.05", "--heads", "4",
               "--head-dim", "32", "--topk", "16", "--rounds", "1", "--device", "cpu", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["shape"], r["budget_mb"]) for r in rows] == [
        ("first@256", 512), ("first@256", 512), ("first@256", 0.05), ("first@256", 0.05),
        ("2x300:40", 512), ("2x300:40", 512), ("2x300:40", 0.05), ("2x300:40", 0.05)]
    assert [r["way"] for r in rows[:2]] == ["auto (torch)", "torch"]
    assert all(r["same"] is True and r["ms"] > 0 and "error" not in r for r in rows)
    chunks = {(r["shape"], r["budget_mb"]): r["chunks"] for r in rows}
    # a 0.05 MiB budget holds about 50 rows of 256 float32 logits: the step is cut into many
    # chunks, and their tables still equal the one-chunk tables (same above)
    assert chunks[("first@256", 512)] == 1 and chunks[("first@256", 0.05)] >= 4
    assert chunks[("2x300:40", 0.05)] > chunks[("2x300:40", 512)]
    assert "x best" in res.stdout and "temp MiB" in res.stdout


def test_bench_backends_refuses_a_bad_shape():
    from indexer.bench.backends import parse_shape

    assert parse_shape("first@64") == ("first@64", [64], [64])
    assert parse_shape("16@64") == ("16@64", [64], [16])
    assert parse_shape("3x64:8") == ("3x64:8", [64, 64, 64], [8, 8, 8])
    for bad in ("64", "x@64", "65@64", "2x64:0", "0@64"):
        with pytest.raises(ValueError, match="shape"):
            parse_shape(bad)
    res = _run("bench", "backends", "--shapes", "8@4,first@4", "--device", "cpu")
    assert res.returncode == 2 and "shape '8@4'" in res.stderr


def test_bench_topk_dist_fallback_times_every_row_on_the_fallback(tmp_path, cpu_interpreter):
    # Triton's interpreter on CPU: `--dist-fallback` adds a row whose calls send every row to the
    # fallback path, and its sets are the torch path's
    import json

    out = tmp_path / "dist.json"
    res = _run("bench", "topk", "--device", "cpu", "--dist", "gaussian,stripes", "--context", "600",
               "--dist-rows", "3", "--topk", "16", "--repeats", "1", "--check-rows", "3", "--dist-fallback",
               "--json", str(out), env={"TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [r for r in json.loads(out.read_text())["dist"] if r["method"] == "triton, every row on the fallback"]
    assert [r["dist"] for r in rows] == ["gaussian", "stripes"], rows
    assert all(r["same"] == 1.0 and r["ms"] > 0 for r in rows), rows


def test_bench_topk_dist_vs_times_each_config_change_beside_the_shipped_config(tmp_path, cpu_interpreter):
    # `--dist-vs`: a row per change (and the shipped config again, as a control), every one
    # checked against the torch path's sets
    import json

    out = tmp_path / "dist.json"
    res = _run("bench", "topk", "--device", "cpu", "--dist", "equal", "--context", "600", "--dist-rows", "3",
               "--topk", "16", "--repeats", "1", "--check-rows", "3", "--dist-vs", "sigmas=3.0;prefetch=1,slices=2",
               "--json", str(out), env={"TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    methods = [r["method"] for r in json.loads(out.read_text())["dist"]]
    assert methods[-3:] == ["triton, sigmas=3.0", "triton, prefetch=1,slices=2", "triton, again"], methods
    assert all(r["same"] == 1.0 for r in json.loads(out.read_text())["dist"] if r["method"] != "torch.topk")


@pytest.mark.parametrize("vs,named", [("sigmas", "'sigmas'"), ("no_such_field=1", "no_such_field"),
                                       ("prefetch=7", "prefetch must be 1, 2 or 3"), ("pdl=True", "pdl=True needs")])
def test_bench_topk_dist_vs_refuses_a_bad_change_before_timing(vs, named):
    res = _run("bench", "topk", "--device", "cpu", "--dist", "equal", "--context", "600", "--dist-rows", "3",
               "--dist-vs", vs)
    assert res.returncode != 0 and named in res.stderr, res.stderr
