"""Shared fixtures and a float64 reference written independently of the library."""

from __future__ import annotations

import pytest
import torch

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


def sets_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Row-wise set equality of two index tables (order inside a row ignored)."""
    return a.shape == b.shape and bool((a.sort(dim=1).values == b.sort(dim=1).values).all())


@pytest.fixture
def small_inputs():
    return make_inputs([300, 50, 9], [120, 50, 4], heads=4, head_dim=32, seed=1)
