"""Shared fixtures and a float64 reference written independently of the library."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when a kernel is defined: it must be set before any test imports
    # indexer's Triton kernels, so CPU runs execute them in Triton's interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from indexer.synthetic import make_inputs


def naive_topk_sets(q, k, k_scale, weights, row_starts, row_ends, topk):
    """Per-row top-k sets, one row at a time in float64 (independent of indexer's code).

    Returns:
        list of (set of selected row-relative indices, kth value, sorted logits) per row.
    """
    q, k = q.double().cpu(), k.double().cpu()
    k_scale, weights = k_scale.double().cpu().reshape(-1), weights.double().cpu()
    res = []
    for m in range(q.shape[0]):
        s, e = int(row_starts[m]), int(row_ends[m])
        if e <= s:
            res.append((set(), None, None))
            continue
        dots = q[m] @ k[s:e].T  # [H, n]
        logit = (dots.clamp_min(0) * weights[m][:, None]).sum(0) * k_scale[s:e]
        kk = min(topk, e - s)
        vals, idx = torch.sort(logit, descending=True)
        res.append((set(idx[:kk].tolist()), float(vals[kk - 1]), logit))
    return res


def assert_matches_naive(out, inp, topk, tol=1e-6):
    """Every row's selected set equals the naive one, or differs only within near-ties."""
    ref = naive_topk_sets(*inp.args(), topk)
    out = out.cpu()
    for m, (want, kth, logit) in enumerate(ref):
        row = out[m].tolist()
        got = [x for x in row if x >= 0]
        assert all(x == -1 for x in row[len(got):]), f"row {m}: -1 padding must come last: {row}"
        assert len(set(got)) == len(got), f"row {m}: duplicate indices"
        if want == set(got):
            continue
        assert len(got) == len(want), f"row {m}: {len(got)} selected, want {len(want)}"
        # only acceptable difference: near-ties at the k-th value
        scale = max(1.0, abs(kth))
        for x in set(got) ^ want:
            assert abs(float(logit[x]) - kth) <= tol * scale, f"row {m}: key {x} is not a near-tie of the k-th value"


def replicated_tables(cases: dict, topk: int, heads: int = 2, head_dim: int = 16) -> dict:
    """Per case ``name: (seq_lens, query_lens)``, the replicated table of
    ``make_inputs(seq_lens, query_lens, heads, head_dim, seed=len(name))``, rows sorted (to
    compare sets)."""
    import indexer

    want = {}
    for case, (seq, q) in cases.items():
        inp = make_inputs(seq, q, heads=heads, head_dim=head_dim, seed=len(case))
        want[case] = indexer.prefill_topk(*inp.args(), topk).sort(1).values
    return want


def sets_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Row-wise set equality of two index tables (order inside a row ignored)."""
    return a.shape == b.shape and bool((a.sort(dim=1).values == b.sort(dim=1).values).all())


@pytest.fixture(scope="session")
def cpu_interpreter():
    """Skips a test that runs Triton's interpreter in a subprocess (``TRITON_INTERPRET=1``,
    ``--device cpu``) where that interpreter cannot run the top-k's kernels, with the
    library's own reason (on a GPU host the in-process Triton is compiled, so ask a child)."""
    import subprocess
    import sys

    code = ("import torch\nfrom indexer.topk.triton import launch_reasons\n"
            "print('; '.join(launch_reasons(torch.device('cpu'))))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    if res.stdout.strip():
        pytest.skip(res.stdout.strip())


@pytest.fixture
def small_inputs():
    return make_inputs([300, 50, 9], [120, 50, 4], heads=4, head_dim=32, seed=1)


def _hardware_skips() -> dict[str, str | None]:
    """Marker -> skip reason (None when the hardware is there)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nvidia = n > 0 and torch.version.cuda is not None and torch.version.hip is None
    amd = n > 0 and torch.version.hip is not None
    return {
        "cuda": None if nvidia else "needs an NVIDIA GPU (torch sees none)",
        "rocm": None if amd else "needs an AMD GPU with a ROCm build of torch",
        "multi_gpu": None if n >= 2 else f"needs >= 2 GPUs, {n} visible",
    }


def pytest_collection_modifyitems(config, items):
    skips = _hardware_skips()
    # GPU CI runners set PYTEST_REQUIRE_HARDWARE=cuda,multi_gpu so missing hardware fails
    # the job instead of skipping it
    required = [m for m in os.environ.get("PYTEST_REQUIRE_HARDWARE", "").split(",") if m]
    missing = [f"{m}: {skips[m]}" for m in required if skips.get(m)]
    if missing:
        raise pytest.UsageError("required hardware missing: " + "; ".join(missing))
    for item in items:
        for marker, reason in skips.items():
            if reason and item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))
