"""indexer.topk.topk_per_row: the per-row top-k as one public call, on every implementation."""

from __future__ import annotations

import os

import pytest
import torch

from indexer.topk import topk_per_row

IMPLS = ["torch"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available() else [])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rows(seed):
    # windows of every kind: empty, shorter than k, longer, at the block's edges; ties; and
    # values outside every window that would win if they were read
    gen = torch.Generator().manual_seed(seed)
    rows, n, k = 9, 300, 16
    logits = torch.round(torch.randn(rows, n, generator=gen) * 4) / 4  # many ties
    starts = torch.tensor([0, 10, 50, 0, 290, 100, 7, 0, 150])
    lengths = torch.tensor([0, 5, 16, 300, 10, 200, 17, 40, 150])
    col = torch.arange(n)
    outside = (col < starts[:, None]) | (col >= (starts + lengths)[:, None])
    logits[outside] = 1e9
    return logits, starts, lengths, k


def _want(logits, starts, lengths, k):
    # lowest index among ties at the k-th value, sets per row (written here, independently)
    res = []
    for r in range(logits.shape[0]):
        s, ln = int(starts[r]), int(lengths[r])
        vals = logits[r, s:s + ln].tolist()
        order = sorted(range(ln), key=lambda j: (-vals[j], j))
        res.append(set(order[:k]))
    return res


@pytest.mark.parametrize("impl", IMPLS + [None])
def test_every_implementation_selects_the_lowest_index_top_k_of_each_window(impl):
    logits, starts, lengths, k = _rows(0)
    got = topk_per_row(logits.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), k, impl=impl).cpu()
    for r, want in enumerate(_want(logits, starts, lengths, k)):
        row = got[r].tolist()
        picked = [x for x in row if x >= 0]
        assert set(picked) == want and len(picked) == len(want), f"row {r}"
        assert all(x == -1 for x in row[len(picked):]), f"row {r}: -1 padding comes last"


@pytest.mark.parametrize("bad,match", [
    (dict(logits=torch.zeros(3, 10, dtype=torch.float64)), "logits"),
    (dict(k=0), "k"),
    (dict(starts_rel=torch.zeros(2, dtype=torch.int32)), "starts_rel"),
    (dict(lengths=torch.zeros(3)), "lengths"),
    (dict(out=torch.full((3, 4), 7, dtype=torch.int64)), "out"),
    (dict(impl="cuda"), "impl"),
    (dict(lengths=torch.tensor([5, 5, 11])), "starts_rel \\+ lengths"),
])
def test_bad_arguments_are_named_and_out_is_untouched(bad, match):
    kw = dict(logits=torch.zeros(3, 10), starts_rel=torch.zeros(3, dtype=torch.int32),
              lengths=torch.full((3,), 5, dtype=torch.int32), k=4, out=torch.full((3, 4), 7, dtype=torch.int32))
    kw.update(bad)
    out = kw["out"]
    with pytest.raises(ValueError, match=match):
        topk_per_row(kw["logits"], kw["starts_rel"], kw["lengths"], kw["k"], kw["out"], impl=kw.get("impl"))
    assert (out == 7).all()
