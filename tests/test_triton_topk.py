"""The Triton radix top-k against the torch path (Triton's interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from indexer.backends.topk_torch import row_topk  # noqa: E402
from indexer.backends.triton import _topk as T  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, n, topk, seed, quantize=None, pad=0):
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(rows, n, generator=g)
    if quantize:  # few distinct values: ties everywhere, at the k-th value too
        vals = (vals * quantize).round() / quantize
    vals[:, ::7] *= -1  # negatives and positives both
    block = torch.full((rows, n + pad), float("nan"))  # padding columns are never read
    block[:, :n] = vals
    starts = torch.randint(0, n // 3, (rows,), generator=g)
    lengths = torch.clamp(torch.randint(0, n, (rows,), generator=g), max=n - starts)
    lengths[0], lengths[1] = 0, min(topk, n - int(starts[1]))  # empty row, exactly k
    logits = block.to(DEVICE)[:, :n]
    # outside each window: -inf for the torch path (the Triton path does not read it)
    col = torch.arange(n)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, block[:, :n], float("-inf"))
    return logits, masked, starts, lengths


@pytest.mark.parametrize("rows,n,topk,quantize,block", [
    (9, 300, 16, None, 64),
    (7, 500, 37, 2.0, 128),    # heavy ties, topk not a power of two
    (5, 1000, 64, 0.5, 256),   # almost all values tied
    (6, 200, 200, None, 64),   # rows never longer than k
])
def test_radix_topk_selects_the_torch_set(rows, n, topk, quantize, block):
    logits, masked, starts, lengths = _case(rows, n, topk, seed=rows * n, quantize=quantize, pad=13)
    got = torch.full((rows, topk), 99999, dtype=torch.int32, device=DEVICE)
    T.ragged_topk(logits, starts.to(DEVICE), lengths.to(DEVICE), topk, got, block=block)
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    got = got.cpu()
    assert not (got == 99999).any()
    assert torch.equal(got.sort(1).values, want.sort(1).values)
    assert (got[0] == -1).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter variant")
def test_triton_backend_with_either_topk_selects_the_same_sets(monkeypatch):
    import indexer
    from indexer.synthetic import make_inputs

    inp = make_inputs([400, 90], [150, 90], heads=2, head_dim=32, seed=8)
    inp.row_starts[3:5] = 0  # padding rows
    inp.row_ends[3:5] = 0
    monkeypatch.setenv("INDEXER_TOPK", "torch")
    a = indexer.prefill_topk(*inp.args(), 24, backend="triton", max_logits_mb=0.05)
    monkeypatch.setenv("INDEXER_CPU_TOPK", "triton")
    b = indexer.prefill_topk(*inp.args(), 24, backend="triton", max_logits_mb=0.05)
    assert torch.equal(a.sort(1).values, b.sort(1).values)
    assert (b[3:5] == -1).all()
