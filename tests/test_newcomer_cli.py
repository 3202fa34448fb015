"""The README's commands as a new user runs them: clean errors, progress, outputs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch


def _run(*args, env=None, timeout=300):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def _assert_one_clean_error(res, command):
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith("usage: ") and lines[-1].startswith(f"python -m indexer {command}: error: "), res.stderr
    assert sum(ln.startswith("python -m indexer") for ln in lines) == 1, res.stderr
    assert "[demo] spawning" not in res.stderr  # nothing was spawned


BAD_DEMO = [
    ["--strategy", "bogus"], ["--reassembly", "smoke"], ["--backend", "bogus"], ["--topk", "0"], ["--tp", "0"],
    ["--rows", "0"], ["--context", "-5"], ["--heads", "0"], ["--head-dim", "x"], ["--repeats", "0"],
    ["--rows", "10", "--context", "5"],
]
if not torch.cuda.is_available():
    BAD_DEMO += [["--backend", "deepgemm"], ["--device", "cuda"]]


@pytest.mark.parametrize("args", BAD_DEMO, ids=lambda a: " ".join(a))
def test_bad_demo_option_is_one_clean_line(args):
    _assert_one_clean_error(_run("demo", *args, timeout=120), "demo")


def test_bad_env_value_stops_the_demo_before_spawning():
    res = _run("demo", env={"INDEXER_TOPK": "foo"}, timeout=120)
    _assert_one_clean_error(res, "demo")
    assert "INDEXER_TOPK: bad value 'foo'; allowed: one of torch|triton" in res.stderr


def test_demo_prints_progress_as_it_goes():
    proc = subprocess.Popen([sys.executable, "-m", "indexer", "demo", "--rows", "64", "--context", "256", "--topk", "16",
                             "--repeats", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        running = proc.poll() is None  # the line came through a pipe before the demo ended: flushed
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first.startswith("[demo] spawning 2 ranks"), first
    assert running
    assert proc.returncode == 0, out + err
    for text in ("[demo] rank 0: process group up", "[demo] warm-up:", "[demo] round 1/2:", "[demo] round 2/2:"):
        assert text in err, err
    assert "EXACT MATCH: 64/64 rows" in out


def test_demo_row_parts_fit_in_its_total():
    res = _run("demo", "--rows", "64", "--context", "256", "--topk", "16", "--repeats", "4", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("rank"))
    for ln in lines[head + 1:head + 3]:
        _, _, _, compute, exchange, total, _ = ln.split()
        assert float(compute) + float(exchange) <= float(total), ln


def test_info_bad_heads_is_one_clean_line():
    _assert_one_clean_error(_run("info", "--heads", "0", timeout=120), "info")


def test_info_platform_line_reads_well():
    res = _run("info", timeout=120)
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("platform:")]
    assert "cpu cpu" not in line, line


def test_calibrate_has_cpu_sized_defaults():
    from indexer.bench import calibrate

    p = argparse.ArgumentParser()
    calibrate.add_arguments(p)
    cpu = calibrate.resolve_defaults(p.parse_args(["--device", "cpu"]))
    assert (cpu.rows, cpu.keys, cpu.heads, cpu.head_dim, cpu.topk) == (128, "256,1024,4096", 4, 64, 64)
    gpu = calibrate.resolve_defaults(argparse.Namespace(device="cuda", rows=None, keys=None, heads=None, head_dim=None,
                                                        topk=None, repeats=None))
    assert (gpu.rows, gpu.keys, gpu.heads, gpu.head_dim, gpu.topk) == (4096, "512,2048,8192,32768", 64, 128, 2048)
    mixed = calibrate.resolve_defaults(p.parse_args(["--device", "cpu", "--rows", "32"]))
    assert mixed.rows == 32 and mixed.heads == 4


def test_calibrate_says_what_it_does_and_prints_each_step(tmp_path):
    res = _run("bench", "calibrate", "--device", "cpu", "--rows", "32", "--keys", "64,512", "--repeats", "1",
               "--dry-run", env={"INDEXER_COST_MODEL_FILE": str(tmp_path / "c.json")}, timeout=300)
    assert res.returncode in (0, 1), res.stdout + res.stderr  # 1: the fit found no per-key cost (noise)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("calibrating on cpu") and "4 chunks of R=32 rows" in lines[0], lines[0]
    assert "H=4 D=64 topk=64, median of 1" in lines[0]
    assert [ln.split(":")[0] for ln in lines[1:5]] == ["[1/4] torch", "[2/4] torch", "[3/4] torch", "[4/4] torch"]
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("args", [["--keys", "64,x"], ["--rows", "0"], ["--device", "gpu"]])
def test_bad_calibrate_option_is_one_clean_line(args):
    _assert_one_clean_error(_run("bench", "calibrate", *args, timeout=120), "bench calibrate")


@pytest.mark.parametrize("command,args", [("kernels", ["--rows", "0"]), ("kernels", ["--heads", "-3"]),
                                          ("step", ["--layers", "0"]), ("topk", ["--check-rows", "-1"]),
                                          ("engines", ["--repeats", "0"]), ("tp", ["--topk", "0"])],
                         ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_bad_bench_count_is_one_clean_line(command, args):
    _assert_one_clean_error(_run("bench", command, *args, timeout=120), f"bench {command}")


def _records(compute, wait, exchange, call_ms, times):
    return dict(config="c", kind="late", keys=8, rows=8, variant="balanced", strategy="balanced", reassembly="padded",
                backend="torch", sharded=True, rank_rows=4, imbalance=1.0, times=times, peak_gib=None, exact=True,
                breakdown=[(call_ms[i], compute[i], wait[i], exchange[i]) for i in range(len(call_ms))])


def test_tp_row_parts_never_exceed_the_total():
    from indexer.bench.tp import summarize

    replicated = dict(_records([50.0] * 3, [0.0] * 3, [0.0] * 3, [51.0] * 3, [60.0, 61.0, 59.0]), variant="replicated",
                      sharded=False)
    # the reported case: the timed calls ran slower than the plain ones (41.63 ms compute,
    # 30.03 ms total), and each rank's largest part sits in a different repeat
    rank0 = _records([41.63, 20.0, 25.0], [0.5, 9.0, 0.1], [1.0, 1.5, 7.0], [43.5, 31.0, 32.5], [30.03, 29.0, 31.0])
    rank1 = _records([22.0, 40.0, 24.0], [8.0, 0.2, 2.0], [6.0, 1.0, 1.2], [36.5, 41.5, 27.5], [28.0, 30.5, 30.0])
    rows = summarize([[replicated, rank0], [replicated, rank1]])
    for r in rows:
        assert r["compute_ms"] + r["wait_ms"] + r["exchange_ms"] <= r["total_ms"] + 1e-9, r
    row = rows[1]
    assert row["total_ms"] == 30.5  # per repeat the slowest rank: 30.03, 30.5, 31.0
    # repeats' slowest calls: 43.5 (rank 0), 41.5 (rank 1), 32.5 (rank 0): the median is rank 1's second
    assert row["breakdown_raw"] == dict(timed_ms=41.5, compute_ms=40.0, wait_ms=0.2, exchange_ms=1.0)
    assert row["compute_ms"] == pytest.approx(40.0 * 30.5 / 41.5)
    assert row["exchange_pct"] == pytest.approx(100 * 1.0 / 41.0)


def test_tp_plot_names_the_extra_to_install(monkeypatch, tmp_path):
    from indexer.bench import tp

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    why = tp.plot_speedup([], tmp_path / "tp_speedup.png", "t")
    assert "matplotlib is not installed" in why and "pip install 'indexer[plot]'" in why


def test_tp_prints_its_folder_and_row_parts_fit(tmp_path):
    out = tmp_path / "tp-out"
    res = _run("bench", "tp", "--tp", "2", "--device", "cpu", "--contexts", "256", "--rows", "64", "--first", "none",
               "--varlen", "none", "--heads", "2", "--head-dim", "32", "--topk", "16", "--repeats", "2", "--warmup", "0",
               "--strategies", "balanced,auto", "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0].startswith("bench tp: ") and f"writing to {out.resolve()}" in res.stdout
    assert f"to {out.resolve()}" in res.stdout.splitlines()[-1]
    rows = json.loads((out / "tp.json").read_text())["rows"]
    for r in rows:
        assert r["compute_ms"] + r["wait_ms"] + r["exchange_ms"] <= r["total_ms"] + 1e-9, r
        raw = r["breakdown_raw"]
        assert raw["compute_ms"] + raw["wait_ms"] + raw["exchange_ms"] <= raw["timed_ms"], raw


def test_bad_tp_strategy_is_one_clean_line():
    _assert_one_clean_error(_run("bench", "tp", "--strategies", "balanced,zigzag", timeout=120), "bench tp")
