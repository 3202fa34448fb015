"""Torch reference backend against an independent float64 implementation."""

from __future__ import annotations

import pytest
import torch

import indexer
from indexer.synthetic import causal_bounds, make_inputs

from conftest import assert_matches_naive, sets_equal


@pytest.mark.parametrize(
    "seq_lens,query_lens,topk",
    [
        ([300, 50, 9], [120, 50, 4], 16),  # varlen batch, late chunk + whole short requests
        ([200], [200], 64),  # first chunk: early rows shorter than topk
        ([64, 0, 128, 1], [64, 0, 128, 1], 300),  # every row shorter than topk
        ([1000, 700], [37, 23], 100),
    ],
)
def test_matches_naive_reference(seq_lens, query_lens, topk):
    inp = make_inputs(seq_lens, query_lens, heads=4, head_dim=32, seed=sum(seq_lens))
    out = indexer.prefill_topk(*inp.args(), topk, backend="torch")
    assert out.dtype == torch.int32 and out.shape == (sum(query_lens), topk)
    assert_matches_naive(out, inp, topk)


def test_indices_relative_and_padded():
    inp = make_inputs([10, 30], [10, 30], heads=2, head_dim=32, seed=3)
    out = indexer.prefill_topk(*inp.args(), 16)
    lengths = (inp.row_ends - inp.row_starts).tolist()
    for m, n in enumerate(lengths):
        row = out[m].tolist()
        valid = [x for x in row if x >= 0]
        assert len(valid) == min(n, 16)
        assert all(0 <= x < n for x in valid)
        assert row.count(-1) == 16 - min(n, 16)


def test_empty_rows_all_minus_one():
    inp = make_inputs([100], [20], heads=2, head_dim=32)
    inp.row_ends[5:9] = inp.row_starts[5:9]
    out = indexer.prefill_topk(*inp.args(), 8)
    assert (out[5:9] == -1).all()
    assert (out[:5] >= 0).all() and (out[9:] >= 0).all()


def test_zero_rows_and_zero_keys():
    inp = make_inputs([5], [0], heads=2, head_dim=32)
    assert indexer.prefill_topk(*inp.args(), 4).shape == (0, 4)
    q, _ = indexer.quantize_fp8(torch.randn(3, 2, 32))
    k, ks = indexer.quantize_fp8(torch.randn(0, 32))
    z = torch.zeros(3, dtype=torch.int32)
    out = indexer.prefill_topk(q, k, ks, torch.ones(3, 2), z, z, 4)
    assert (out == -1).all()


@pytest.mark.parametrize("budget_mb", [0.001, 0.05, 1.0, 512.0])
def test_chunking_does_not_change_result(budget_mb):
    inp = make_inputs([400, 250], [150, 250], heads=4, head_dim=32, seed=7)
    whole = indexer.prefill_topk(*inp.args(), 32, max_logits_mb=4096.0)
    chunked = indexer.prefill_topk(*inp.args(), 32, max_logits_mb=budget_mb)
    assert torch.equal(whole.sort(1).values, chunked.sort(1).values)


def test_ties_resolve_identically_whatever_the_chunking():
    # constant keys: every logit of a row ties, so only the tie rule decides the set
    starts, ends, n = causal_bounds([300], [100])
    q, _ = indexer.quantize_fp8(torch.randn(100, 2, 32))
    k = torch.ones(n, 32).to(torch.float8_e4m3fn)
    ks = torch.ones(n)
    w = torch.ones(100, 2)
    a = indexer.prefill_topk(q, k, ks, w, starts, ends, 50, max_logits_mb=4096.0)
    b = indexer.prefill_topk(q, k, ks, w, starts, ends, 50, max_logits_mb=0.001)
    assert sets_equal(a, b)


def test_out_is_filled_and_returned():
    inp = make_inputs([120], [40], heads=2, head_dim=32)
    out = torch.full((40, 8), 12345, dtype=torch.int32)
    res = indexer.prefill_topk(*inp.args(), 8, out=out)
    assert res is out
    assert not (out == 12345).any()
    assert sets_equal(out, indexer.prefill_topk(*inp.args(), 8))


def test_e4m3fnuz_inputs():
    inp = make_inputs([200], [60], heads=4, head_dim=32, fp8_dtype=torch.float8_e4m3fnuz, seed=5)
    out = indexer.prefill_topk(*inp.args(), 16)
    assert_matches_naive(out, inp, 16)


def test_k_scale_column_vector_accepted():
    inp = make_inputs([100], [30], heads=2, head_dim=32)
    a = indexer.prefill_topk(*inp.args(), 8)
    b = indexer.prefill_topk(inp.q, inp.k, inp.k_scale[:, None], inp.weights, inp.row_starts, inp.row_ends, 8)
    assert torch.equal(a, b)


def test_quantize_fp8_roundtrip():
    x = torch.randn(7, 3, 64)
    x8, s = indexer.quantize_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and s.shape == (7, 3)
    err = (x8.float() * s[..., None] - x).abs().max() / x.abs().max()
    assert err < 0.07
    with pytest.raises(ValueError, match="dtype"):
        indexer.quantize_fp8(x, torch.float16)


def test_workspace_allocated_once_and_reused():
    from indexer import workspace

    workspace.release_workspaces()
    inp = make_inputs([600, 300], [200, 300], heads=2, head_dim=32, seed=2)
    indexer.prefill_topk(*inp.args(), 16, max_logits_mb=1.0)  # many chunks
    (first,) = workspace.logits_buffers()
    ptr, size = first.data_ptr(), first.numel()
    assert size == workspace.workspace_numel(2**20)
    for seq in ([900], [50, 60, 70]):  # other shapes, other "layers"
        inp = make_inputs(seq, [min(seq[0], 100)] + seq[1:], heads=2, head_dim=32)
        indexer.prefill_topk(*inp.args(), 16, max_logits_mb=1.0)
    (again,) = workspace.logits_buffers()
    assert again.data_ptr() == ptr and again.numel() == size
    workspace.release_workspaces()


def test_chunks_end_at_request_boundaries_and_scan_is_bounded():
    from indexer.backends import get_backend
    from indexer.backends.base import chunk_end
    from indexer.problem import validate

    inp = make_inputs([500, 300, 200], [100, 300, 50], heads=2, head_dim=32)
    p, _ = validate(*inp.args(), 8)
    be = get_backend("torch")
    cuts, start = [], 0
    while start < p.num_rows:
        end, lo, hi = chunk_end(be, p, start, p.num_rows, 2**40, hint=7)  # tiny scan window
        assert all(lo <= int(p.starts_host[m]) and int(p.ends_host[m]) <= hi for m in range(start, end))
        cuts.append(end)
        start = end
    assert cuts == [100, 400, 450]  # one chunk per request, whatever the scan window


def test_a_chunk_passes_2_gib_only_for_backends_indexing_logits_with_64_bit_offsets():
    # the last 1024 rows of a 1M-key request: 4 GiB of float32 logits. Backends whose kernels
    # index them with 32-bit offsets (the torch backend stands for them) cut that at 2 GiB;
    # DeepGEMM (64-bit row offsets, as both top-k paths) takes it whole where the budget allows
    from indexer.backends import get_backend
    from indexer.backends.base import chunk_end
    from indexer.problem import make_problem
    from indexer.workspace import MAX_CHUNK_BYTES

    n, m = 1 << 20, 1024
    ends = torch.arange(n - m + 1, n + 1)
    p = make_problem(torch.zeros(m, dtype=torch.int64), ends, num_keys=n, heads=64, head_dim=128, topk=2048)
    torch_end, lo, hi = chunk_end(get_backend("torch"), p, 0, m, 2**40)
    assert 0 < torch_end < m
    assert get_backend("torch").logits_alloc_bytes(torch.tensor(torch_end), torch.tensor(hi - lo)) <= MAX_CHUNK_BYTES
    assert chunk_end(get_backend("deepgemm"), p, 0, m, 2**40) == (m, 0, n)
    # the budget still applies
    assert chunk_end(get_backend("deepgemm"), p, 0, m, 2**31)[0] < m


def test_a_chunk_cut_by_the_budget_ends_at_a_multiple_of_the_backends_row_quantum():
    # a backend whose logits kernel steps every 16 rows: budget cuts land on multiples of 16
    # (never below one step), request boundaries and the last chunk stay where they are
    from indexer.backends import get_backend
    from indexer.backends.base import chunk_end
    from indexer.problem import validate

    class Stepped(type(get_backend("torch"))):
        def chunk_rows_quantum(self, problem):
            return 16

    inp = make_inputs([4000, 300], [100, 250], heads=2, head_dim=32)
    p, _ = validate(*inp.args(), 8)
    be, plain = Stepped(), get_backend("torch")
    budget = int(be.chunk_bytes(torch.tensor(37), torch.tensor(4000), p))  # 37 rows of the first request
    cuts = {}
    for name, backend in (("stepped", be), ("plain", plain)):
        start, ends = 0, []
        while start < p.num_rows:
            end, _, _ = chunk_end(backend, p, start, p.num_rows, budget)
            ends.append(end)
            start = end
        cuts[name] = ends
    assert cuts["plain"] == [37, 74, 100, 350]
    assert cuts["stepped"] == [32, 64, 100, 350]
    # a budget under one step keeps what fits
    small = int(be.chunk_bytes(torch.tensor(10), torch.tensor(4000), p))
    assert chunk_end(be, p, 0, p.num_rows, small)[0] == 10


def _peak_bytes(fn):
    # the CPU profiler's allocation records, summed in time order: the peak of live bytes
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = sorted((ev.start_ns(), ev.nbytes()) for ev in prof.profiler.kineto_results.events()
                     if ev.name() == "[memory]")
    live = peak = 0
    for _, nbytes in records:
        live += nbytes
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("sync_free,tied", [(True, False), (False, False), (False, True)])
def test_chunk_budgets_cover_the_torch_top_ks_temporaries(sync_free, tied):
    # the torch path's temporaries grow with the block (int64 keys of an eighth of the rows
    # on the sync-free path, the tie fix-up's masks on the CPU's): the budget's per-column
    # bytes cover their measured peak; the Triton top-k's scratch does not grow with the width
    from indexer.problem import make_problem
    from indexer.topk import row_topk, topk_bytes
    from indexer.topk.choice import TORCH_TOPK_COLUMN_BYTES
    from indexer.topk.triton.config import scratch_bytes_per_row

    r, w, k = 64, 1 << 14, 256
    x = torch.randn(r, w, generator=torch.Generator().manual_seed(1))
    if tied:
        x = (x * 4).round() / 4
    starts, lengths = torch.zeros(r, dtype=torch.int64), torch.full((r,), w, dtype=torch.int64)
    out = torch.empty(r, k, dtype=torch.int32)
    peak = _peak_bytes(lambda: row_topk(x, starts, lengths, k, out, sync_free=sync_free))
    p = make_problem(starts, lengths, num_keys=w, heads=1, head_dim=32, topk=k)
    rows, width = torch.tensor(r), torch.tensor(w)
    assert peak <= int(topk_bytes(p, rows, width, "torch"))
    assert int(topk_bytes(p, rows, width, "torch")) == r * (12 * (k + 1) + TORCH_TOPK_COLUMN_BYTES * w)
    assert int(topk_bytes(p, rows, width, "triton")) == r * scratch_bytes_per_row(k)


def test_torch_path_ranks_nans_highest_and_ties_them_to_the_lowest_columns():
    # NaN == NaN is false, so a plain "x > kth" / "x == kth" tie rule loses NaNs: with the
    # k-th value +inf, the NaNs (ranked above it by torch.topk) must stay in; with the k-th
    # value NaN, the lowest-column NaNs are kept
    from indexer.topk import row_topk

    x = torch.arange(40, dtype=torch.float32).repeat(2, 1)
    x[0, ::4] = float("inf")
    x[0, [5, 30]] = float("nan")  # 2 NaNs + 10 infs (the k-th, tied) for k=8
    x[1, ::3] = float("nan")  # 14 NaNs, k=8: the 8 lowest columns
    out = torch.empty(2, 8, dtype=torch.int32)
    row_topk(x, torch.zeros(2, dtype=torch.int64), torch.full((2,), 40, dtype=torch.int64), 8, out)
    assert sorted(out[0].tolist()) == [0, 4, 5, 8, 12, 16, 20, 30]
    assert sorted(out[1].tolist()) == [0, 3, 6, 9, 12, 15, 18, 21]


@pytest.mark.parametrize("seed", range(4))
def test_torch_top_k_sync_free_way_selects_the_same_sets(seed):
    # ties (few distinct values), NaNs, -0.0 against 0.0, windows anywhere, rows shorter
    # than k; outside the windows anything (the sync-free way never reads it)
    from indexer.topk import row_topk

    gen = torch.Generator().manual_seed(seed)
    rows, n, k = 24, 300, 16
    x = torch.randint(-3, 4, (rows, n), generator=gen).float()
    x[x == 0] = -0.0 if seed % 2 else 0.0
    x[:, ::37] = float("nan") if seed < 2 else float("inf")
    starts = torch.randint(0, 150, (rows,), generator=gen)
    lengths = torch.minimum(torch.randint(0, 150, (rows,), generator=gen), n - starts)
    lengths[:3] = torch.tensor([0, 5, k])
    col = torch.arange(n)
    inside = (col >= starts[:, None]) & (col < (starts + lengths)[:, None])
    a = torch.empty(rows, k, dtype=torch.int32)
    b = torch.empty(rows, k, dtype=torch.int32)
    row_topk(x.masked_fill(~inside, float("-inf")), starts, lengths, k, a, sync_free=False)
    row_topk(x.masked_fill(~inside, 1e30), starts, lengths, k, b, sync_free=True)
    assert torch.equal(a.sort(1).values, b.sort(1).values)
