"""The Triton radix top-k against the torch path (Triton's interpreter on CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from indexer.topk import row_topk  # noqa: E402
from indexer.topk.triton import ragged as T  # noqa: E402
from indexer.topk.triton import config as TC  # noqa: E402
from indexer.topk.triton import kernels as TK  # noqa: E402
from indexer.synthetic import LOGIT_DISTRIBUTIONS, logits_like  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cfg(**kw):
    # the device's launch config with the fields in `kw` changed; the row kernel off unless
    # `kw` asks (the tests' rows are short and few enough for it, and most name other paths)
    return dataclasses.replace(TC.launch_config(torch.device(DEVICE)), **dict(dict(row_max=0), **kw))


def _case(rows, n, topk, seed, quantize=None, pad=0, min_length=0):
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(rows, n, generator=g)
    if quantize:  # few distinct values: ties everywhere, at the k-th value too
        vals = (vals * quantize).round() / quantize
    vals[:, ::7] *= -1  # negatives and positives both
    block = torch.full((rows, n + pad), float("nan"))  # padding columns are never read
    block[:, :n] = vals
    starts = torch.randint(0, n // 3, (rows,), generator=g)
    lengths = torch.clamp(torch.randint(0, n, (rows,), generator=g), max=n - starts)
    lengths = torch.clamp(lengths, min=min_length).minimum(n - starts)
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
    T.ragged_topk(logits, starts.to(DEVICE), lengths.to(DEVICE), topk, got, config=_cfg(block=block))
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    got = got.cpu()
    assert not (got == 99999).any()
    assert torch.equal(got.sort(1).values, want.sort(1).values)
    assert (got[0] == -1).all()


# The sampled path at toy sizes: runs of at most 8 keys, one key in 4 sampled by the filter and
# by the sample kernel alike (these tests' rows are built around where those runs read; a
# thinner sample kernel is tested on its own); rows longer than the select tile (2 * topk by
# default) take it.
SMALL_SAMPLE = dict(piece=8, sparse=4, sample_sparse=4)


def _check(logits, masked, starts, lengths, topk, **kw):
    rows = logits.shape[0]
    # out is a view with 5 guard columns a row: a write past a row's k slots lands in them
    buf = torch.full((rows, topk + 5), 99999, dtype=torch.int32, device=DEVICE)
    got = buf[:, :topk]
    stats = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    T.ragged_topk(logits, starts.to(DEVICE), lengths.to(DEVICE), topk, got, stats=stats, config=_cfg(**kw))
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    got = got.cpu()
    assert (buf[:, topk:].cpu() == 99999).all(), "a write outside out's rows"
    assert torch.equal(got.sort(1).values, want.sort(1).values)
    stats = stats.cpu().tolist()
    assert sum(stats) == rows
    assert stats[TC.STAT_SHORT] == int((lengths <= topk).sum())
    return stats


@pytest.mark.parametrize("quantize,radix_bits", [(None, 4), (4.0, 4), (None, 8), (4.0, 2), (None, 1)])
def test_sampled_path_selects_the_torch_set(quantize, radix_bits):
    logits, masked, starts, lengths = _case(12, 900, 24, seed=5, quantize=quantize, pad=3, min_length=400)
    stats = _check(logits, masked, starts, lengths, 24, cap=256, radix_bits=radix_bits, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 8, stats  # the path was really taken


@pytest.mark.parametrize("path", ["plain", "sampled", "direct"])
def test_special_values_order_like_floats(path):
    # signed zeros tie, infinities, the extremes of float32, subnormals, both signs
    tiny = torch.finfo(torch.float32).tiny
    big = torch.finfo(torch.float32).max
    special = torch.tensor([0.0, -0.0, float("-inf"), float("inf"), big, -big, tiny / 4, -tiny / 4, 1.0, -1.0])
    g = torch.Generator().manual_seed(3)
    vals = special[torch.randint(0, special.numel(), (4, 640), generator=g)]
    starts = torch.tensor([0, 5, 17, 0])
    lengths = torch.tensor([640, 600, 623, 100])
    col = torch.arange(640)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, vals, float("-inf"))
    kw = dict(sampled=dict(SMALL_SAMPLE, tile=64), plain=dict(tile=64, sample_min=1 << 30), direct=dict(tile=1024))[path]
    stats = _check(vals.to(DEVICE), masked, starts, lengths, 40, cap=1024, **kw)
    counter = dict(sampled=TC.STAT_SAMPLED, plain=TC.STAT_PLAIN, direct=TC.STAT_WHOLE)[path]
    assert stats[counter] == 4, stats


def _one_row_args(topk):
    # starts, lengths, topk, out for a one-row, 10-key block, all on the test's device (a
    # bad option must be what is refused, not a stray CPU tensor)
    return (torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.full((1,), 10, device=DEVICE), topk,
            torch.empty(1, topk, dtype=torch.int32, device=DEVICE))


def test_bad_radix_bits_is_refused():
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match="radix_bits"):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(radix_bits=3))


def _unlucky_rows():
    # 3 rows of 512 keys whose every large value sits in a run the sample reads (pieces=16
    # with SMALL_SAMPLE): the sample's r-th largest is one of them and exactly r keys of the row
    # reach it. Returns logits, starts, lengths
    n = 512
    col = torch.arange(n)
    vals = torch.rand(3, n) - 10.0
    vals[:, (col // 8) % 4 == 0] += 20.0
    return vals, torch.zeros(3, dtype=torch.int64), torch.full((3,), n, dtype=torch.int64)


@pytest.mark.parametrize("topk,path", [(16, TC.STAT_SAMPLED), (100, TC.STAT_PLAIN)])
def test_unlucky_sample_retries_then_falls_back_to_the_plain_select(topk, path):
    # r keys reach the sample's threshold, fewer than k. The filter retries with the
    # sample's 2r-th largest: enough for k=16 (the sampled path serves the row), still too
    # few for k=100 (the plain select must), the scratch being large enough for both
    vals, starts, lengths = _unlucky_rows()
    stats = _check(vals.to(DEVICE), vals, starts, lengths, topk, cap=4096, pieces=16, **SMALL_SAMPLE)
    assert stats[path] == 3, stats


def test_recent_keys_scoring_high_keep_the_sampled_path():
    # causal rows whose last 32 keys all score high (a local-attention pattern), at lengths
    # just past a multiple of the sample stride (128 here). Pieces laid at fixed multiples of
    # the stride sampled that tail densely, the threshold landed inside the high stretch,
    # fewer than k keys passed it and the 1310-key row fell back to the plain select; pieces
    # spread evenly over the row keep every row on the sampled path
    topk = 16
    lengths = torch.tensor([1310, 1300, 1290, 1410])
    n = int(lengths.max())
    g = torch.Generator().manual_seed(11)
    vals = torch.rand(len(lengths), n, generator=g)
    col = torch.arange(n)
    recent = (col[None] >= lengths[:, None] - 32) & (col[None] < lengths[:, None])
    vals = vals + 2.0 * recent
    starts = torch.zeros(len(lengths), dtype=torch.int64)
    masked = torch.where(col[None] < lengths[:, None], vals, float("-inf"))
    stats = _check(vals.to(DEVICE), masked, starts, lengths, topk, cap=1024, piece=32, sparse=4)
    assert stats[TC.STAT_SAMPLED] == len(lengths), stats


def test_nans_rank_above_everything_like_torch_topk():
    vals = torch.randn(2, 300)
    nan = torch.tensor(float("nan"))
    neg_nan = -nan  # sign bit set: must not sort below the numbers
    vals[0, [3, 77]] = nan
    vals[1, [5, 200]] = neg_nan
    starts = torch.zeros(2, dtype=torch.int64)
    lengths = torch.full((2,), 300, dtype=torch.int64)
    got = torch.empty(2, 10, dtype=torch.int32, device=DEVICE)
    T.ragged_topk(vals.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), 10, got, config=_cfg(sample_min=1 << 30))
    got = got.cpu()
    assert {3, 77} <= set(got[0].tolist()) and {5, 200} <= set(got[1].tolist())


@pytest.mark.parametrize("kw,match", [(dict(block=100), "block"), (dict(filter_block=0), "filter_block"),
                                      (dict(sparse=0), "sparse"), (dict(piece=0), "piece"), (dict(cap=3000), "cap"),
                                      (dict(tile=48), "tile"), (dict(tile=8192, cap=4096), "tile"),
                                      (dict(select_warps=3), "select_warps"), (dict(pieces=6), "pieces"),
                                      (dict(sigmas=0), "sigmas"), (dict(ballot=True, filter_block=64), "ballot"),
                                      (dict(sample_low_bit=25), "sample_low_bit"),
                                      (dict(prefetch=4), "prefetch"), (dict(prefetch=2.0), "prefetch"),
                                      (dict(prefetch=True), "prefetch"), (dict(sample_slack=-0.5), "sample_slack"),
                                      (dict(sample_slack=float("inf")), "sample_slack"),
                                      (dict(sample_slack=float("nan")), "sample_slack"),
                                      (dict(slices=3), "slices"), (dict(slices=0), "slices"),
                                      (dict(slices=128), "slices"), (dict(slices=2.0), "slices"),
                                      (dict(slices=2, fused=True), "fused"), (dict(sample_max=4), "sample_max"),
                                      (dict(sample_max=3000), "sample_max"),
                                      (dict(sample_sparse=16), "sample_sparse"),
                                      (dict(sample_sparse=64.0), "sample_sparse"),
                                      (dict(fallback_ballot=True, fallback_block=256), "fallback_ballot")])
def test_bad_launch_options_are_refused(kw, match):
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(**kw))


def _unseen(n, lo, count):
    # `count` columns from `lo` on that SMALL_SAMPLE's sample never reads (its runs: keys 0-7
    # of every 32, for rows of 32 * 256 keys or fewer)
    col = torch.arange(n)
    return col[(col >= lo) & (col % 32 >= 8)][:count]


def _hidden_large_keys(n, lo, count, seed):
    # two whole rows of n normal keys with `count` large ones from `lo` on where SMALL_SAMPLE's
    # sample does not look (_unseen): logits, starts, lengths
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(2, n, generator=g)
    vals[:, _unseen(n, lo, count)] = 5.0 + torch.rand(count, generator=g)
    return vals, torch.zeros(2, dtype=torch.int64), torch.full((2,), n, dtype=torch.int64)


@pytest.mark.parametrize("slices", [1, 4])
def test_candidate_overflow_falls_back_to_the_plain_select(slices):
    # 100 large keys where the sample does not look: the threshold lets all of them and more
    # through, more than the scratch holds; the row must not lose keys (slices: the shared
    # list's counter overflows instead of a warp's)
    topk = 16
    vals, starts, lengths = _hidden_large_keys(700, 100, 100, seed=8)
    stats = _check(vals.to(DEVICE), vals, starts, lengths, topk, cap=64, slices=slices, **SMALL_SAMPLE)
    assert stats[TC.STAT_PLAIN] == 2, stats


@pytest.mark.parametrize("values", ["normal", "few", "mostly_-inf"])
@pytest.mark.parametrize("split_run", [None, 0, 8, 128])
def test_split_rows_take_slots_in_runs_and_mark_the_unused_ones(split_run, values):
    # a split row's programs (warps, on NVIDIA) take slots of the row's one list in runs; the
    # slots a run leaves unused are marked empty (column -1), counted apart from the keys
    # listed, and skipped by the select: the torch set, every other slot a key of the row.
    # mostly_-inf: the k-th key is -inf, tied, as an empty slot's value (the lowest columns
    # win the tie, and an empty slot's must not). split_run None: split_stage, each program's
    # lists staged and copied in one run of its own, no empty slot
    rows, n, topk, slices = 4, 6000, 24, 4
    how = dict(split_stage=True) if split_run is None else dict(split_stage=False, split_run=split_run)
    logits, masked, starts, lengths = _case(rows, n, topk, seed=31, quantize=2.0 if values == "few" else None,
                                            min_length=5000)
    if values == "mostly_-inf":
        keep = torch.zeros(n, dtype=torch.bool)
        keep[torch.randperm(n, generator=torch.Generator().manual_seed(4))[:topk // 2]] = True
        logits = torch.where(keep.to(logits.device), logits, float("-inf"))
        masked = torch.where(keep, masked, float("-inf"))
    dev = torch.device(DEVICE)
    run = T.RaggedTopk(dev, rows, n, starts.to(dev), lengths.to(dev), topk,
                       config=_cfg(cap=4096, slices=slices, **how, **SMALL_SAMPLE))
    got = torch.empty(rows, topk, dtype=torch.int32, device=dev)
    run(logits, got)
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)
    counts = run.cand32[run.counts.offset:].cpu()
    lists = run.buf[:rows * 4096].view(rows, 4096).cpu()
    holes = []
    for r in range(2, rows):  # rows 0 and 1 are at most k keys long
        taken, listed = int(counts[2 * r]), int(counts[2 * r + 1])
        # (room for every warp's unused run: 16 warps x 127 slots on NVIDIA)
        assert topk <= listed <= taken <= 4096, (r, taken, listed)
        slot = lists[r, :taken]
        col, bits = slot >> 32, (slot & 0xFFFFFFFF).to(torch.int32)
        empty = col == -1
        holes.append(int(empty.sum()))
        assert holes[-1] == taken - listed
        # every other slot a distinct column of the row's window with its value
        col = col[~empty]
        assert col.unique().numel() == listed and (col >= 0).all() and (col < int(lengths[r])).all()
        value = logits[r].cpu()[int(starts[r]) + col]
        assert torch.equal(bits[~empty].view(torch.float32), value)
    if not split_run:
        assert holes == [0] * (rows - 2)
    else:
        # at most a run's rest for each warp of each slice (and each program's masked steps)
        bound = slices * (run.config.num_warps + 1) * (split_run - 1)
        assert all(h <= bound for h in holes) and (split_run < 128 or sum(holes) > 0), holes


@pytest.mark.parametrize("values", ["normal", "few"])
def test_split_rows_select_from_one_tile_of_their_whole_list(values):
    # split_tile=cap: a split row's first select reads its whole list (long runs' empty
    # slots included) in one tile, so there is no second select launch; the torch set
    rows, n, topk, slices, cap = 4, 6000, 24, 4, 4096
    logits, masked, starts, lengths = _case(rows, n, topk, seed=32, quantize=2.0 if values == "few" else None,
                                            min_length=5000)
    dev = torch.device(DEVICE)
    run = T.RaggedTopk(dev, rows, n, starts.to(dev), lengths.to(dev), topk,
                       config=_cfg(cap=cap, slices=slices, split_run=128, split_tile=cap, **SMALL_SAMPLE))
    assert [kw["STW"] for _, kw in run.plan.selects] == [cap]
    got = torch.empty(rows, topk, dtype=torch.int32, device=dev)
    run(logits, got)
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)


def test_split_tile_replaces_the_first_select_tile_of_split_rows_only(monkeypatch):
    # (plans only: a CPU device stands for an NVIDIA GPU)
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    cpu = torch.device("cpu")
    sm90 = TC.CONFIGS["sm90"]
    for slices, want_tile, want_warps in ((1, 4096, sm90.select_warps), (8, 8192, 16)):
        plan = TC.plan_launches(cpu, dataclasses.replace(sm90, split_tile=8192), 2048, 1 << 17, slices, False)
        first = [kw for is_first, kw in plan.selects if is_first]
        assert first[0]["STW"] * first[0]["W"] == want_tile and first[0]["num_warps"] == want_warps, first[0]
        # one launch where the first tile is the whole list
        assert len(plan.selects) == (1 if want_tile == plan.cap else 2)
    with pytest.raises(ValueError, match="split_tile"):
        TC.TopkConfig(split_tile=3000)
    # one past the list, or below a slot a warp: refused by name, whole rows or split
    for bad, slices in ((16384, 8), (16384, 1), (2, 8)):
        with pytest.raises(ValueError, match="split_tile must be in num_warps..cap"):
            TC.plan_launches(cpu, dataclasses.replace(sm90, split_tile=bad), 2048, 1 << 17, slices, False)


def test_split_runs_are_shortened_where_their_empty_slots_would_pass_the_lists_room(monkeypatch):
    # slices x warps x (run - 1) empty slots at most, within cap - 2 * topk
    for slices in (2, 8, 16, 32, 64):
        for split_run in (0, 1, 8, 32, 128):
            for cap, topk in ((8192, 2048), (4096, 24), (64, 16), (2048, 2048)):
                run = TC.split_run_for(split_run, slices, 4, cap, topk)
                assert (run == 0) == (split_run == 0) and run <= split_run
                assert run <= 1 or slices * 4 * (run - 1) <= cap - 2 * topk
                # and the longest such run: twice as long would not fit
                assert run in (0, split_run) or slices * 4 * (2 * run - 1) > cap - 2 * topk
    assert [TC.split_run_for(32, s, 4, 8192, 2048) for s in (8, 16, 32, 64)] == [32, 32, 32, 16]
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    plan = TC.plan_launches(torch.device("cpu"), dataclasses.replace(TC.CONFIGS["sm90"], split_run=32), 2048, 1 << 21,
                            64, False)
    assert plan.filter["RUN"] == 16


def test_a_split_rows_staged_list_that_overflows_sends_the_row_to_the_fallback():
    # split_stage: a slice's warp stages at most cap / num_warps keys (16 here). 32 large
    # keys, rising with the column, at the row's first 32 columns (one warp's, whether a
    # warp's columns in a block are a run of 128 or strided by 32) and k above that room: at
    # least k keys pass, all in one warp's staged list, which overflows while the row's list
    # has room for every key that passed. The row must still leave the sampled path (the
    # staged keys past the room, its largest, were never listed), with the same set
    n, topk = 2048, 17
    warps = TC.launch_config(torch.device(DEVICE)).num_warps
    vals = torch.randn(2, n, generator=torch.Generator().manual_seed(12))
    vals[:, :32] = 5.0 + torch.arange(32, dtype=torch.float32) / 32
    starts, lengths = torch.zeros(2, dtype=torch.int64), torch.full((2,), n, dtype=torch.int64)
    kw = dict(cap=16 * warps, slices=4, split_stage=True, **SMALL_SAMPLE)
    assert _check(vals.to(DEVICE), vals, starts, lengths, topk, **kw)[TC.STAT_PLAIN] == 2


@pytest.mark.parametrize("tie_bit", [0, 20])
@pytest.mark.parametrize("n", [3000, 6000, 20000])
def test_a_tied_threshold_is_cut_at_the_end_of_the_sample_run_holding_its_rank(n, tie_bit):
    # every key equal: the threshold is that key and the column cut ends the sample run
    # (run j in columns [j * spread, (j + 1) * spread)) that holds the rank-th sampled key,
    # the rank from the sample's size as _run_rank gives it
    import numpy as np

    topk, rows = 24, 2
    dev = torch.device(DEVICE)
    run = T.RaggedTopk(dev, rows, n, torch.zeros(rows, dtype=torch.int64, device=dev),
                       torch.full((rows,), n, dtype=torch.int64, device=dev), topk,
                       config=_cfg(presample=True, cap=4096, sample_tie_bit=tie_bit, **SMALL_SAMPLE))
    out = torch.empty(rows, topk, dtype=torch.int32, device=dev)
    run(torch.full((rows, n), 0.5, device=dev), out)
    assert torch.equal(out.sort(1).values.cpu(), torch.arange(topk, dtype=torch.int32).expand(rows, topk))
    kw = run.plan.sample
    runs = min(max(n // (kw["SPARSE"] * kw["PIECE"]), 1), kw["NP"])
    spread, plen = n // runs, min(n // runs, kw["PIECE"])
    mu = np.float32(topk) * np.float32(runs * plen) / np.float32(n)
    rank = min(int(max(mu + np.float32(kw["SIGMAS"]) * np.sqrt(mu), mu + np.float32(kw["PIECE"])) + np.float32(1)),
               runs * plen)
    want = ((rank - 1) // plen + 1) * spread - 1
    tcol = run.cand32[run.tcol.offset: run.tcol.offset + rows].cpu()
    assert tcol.tolist() == [want] * rows, (tcol.tolist(), want, rank, spread, plen)


@pytest.mark.parametrize("slices", [1, 4])
def test_a_tie_larger_than_the_scratch_keeps_the_sampled_path(slices):
    # a tie at the threshold with ten times the scratch's keys (zeros, and 5 larger keys):
    # the threshold's column cut lets about as many of the tied keys through as distinct
    # values would, the lowest columns among them, and the select takes the lowest
    n, topk = 700, 16
    vals = torch.zeros(2, n)
    vals[:, 100:105] = 1.0
    vals[0, 650] = 2.0
    starts = torch.zeros(2, dtype=torch.int64)
    lengths = torch.full((2,), n, dtype=torch.int64)
    # (blocks of 128 keys, 32 a warp: the tied keys that pass span several warps' columns)
    stats = _check(vals.to(DEVICE), vals, starts, lengths, topk, cap=256, filter_block=128, slices=slices,
                   **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] == 2, stats


# sample and scratch sized for rows of 20K keys (runs of 8 keys every 32, at most 128 of
# them; 2048 candidate slots for topk=200): k spans a few filter blocks, as 2048 does at the
# default 512-key block (a tie cut by column passes the lowest columns, whose blocks are
# shared among the warps' lists)
DIST_SAMPLE = dict(piece=8, sparse=4, pieces=128, sample_max=1024, cap=2048)


def _ragged_rows(dist, seed, n=20000):
    """Four rows of ``dist`` logits, ``n`` keys wide, with whole, shifted, shortened and
    short windows: ``(logits, masked, starts, lengths)``, ``masked`` holding ``-inf`` outside
    each window (the torch path's CPU input)."""
    logits = logits_like(dist, 4, n, seed=seed)
    starts = torch.tensor([0, 1, 350, 1000])
    lengths = torch.tensor([n, n - 1, n - 700, 15000])
    col = torch.arange(n)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    return logits, torch.where(inside, logits, float("-inf")), starts, lengths


@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
@pytest.mark.parametrize("kw", [dict(), dict(presample=True), dict(slices=4), dict(slices=2, dynamic=True),
                                dict(sample_jitter=True), dict(sample_jitter=True, slices=4),
                                dict(sample_jitter=True, filter_deal=True)])
def test_every_distribution_selects_the_torch_set_in_one_filtering_pass(dist, kw):
    # ties (all equal, few distinct values, flat with outliers, ReLU zeros), ramps both ways,
    # a raised recent stretch, a sink at key 0: every row selects the torch set (lowest-index
    # ties) on the sampled path, whole rows and rows split across programs
    rows, topk = 4, 200
    logits, masked, starts, lengths = _ragged_rows(dist, seed=7)
    stats = _check(logits.to(DEVICE), masked, starts, lengths, topk, **dict(DIST_SAMPLE, **kw))
    assert stats[TC.STAT_SAMPLED] == rows, stats


@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
@pytest.mark.parametrize("presample,slices", [(True, 1), (True, 4), (False, 1)])
def test_the_sample_tie_bit_leaves_every_threshold_as_the_full_search_gives_it(dist, presample, slices):
    # the search over the sample (the sample kernel's, or the filter's own) stopped at a bit
    # and the least key above it tried as the rank-th key: the first and (sample kernel) the
    # retry's thresholds and column cuts, bit for bit, are the full search's (so the filter
    # passes the same keys), and the sets are the torch path's
    logits, masked, starts, lengths = _ragged_rows(dist, seed=7)
    dev = torch.device(DEVICE)
    found = []
    for tie_bit in (0, 12, 20, 31):
        kw = dict(DIST_SAMPLE, presample=presample, slices=slices, sample_tie_bit=tie_bit)
        stats = _check(logits.to(DEVICE), masked, starts, lengths, 200, **kw)
        assert stats[TC.STAT_SAMPLED] == 4, (tie_bit, stats)
        run = T.RaggedTopk(dev, 4, logits.shape[1], starts.to(dev), lengths.to(dev), 200, config=_cfg(**kw))
        run(logits.to(DEVICE), torch.empty(4, 200, dtype=torch.int32, device=dev))
        c = run.cand32
        # (the filter stores its own sample's threshold, not its column; the keys each list
        # took stand for the column)
        cut = (run.tcol, 4) if presample else (run.counts, 4 * run.counters)
        found.append([c[v.offset: v.offset + n].cpu()
                      for v, n in ((run.thr, 4), cut) + (((run.thr2, 8),) if presample else ())])
    for tie_bit, got in zip((12, 20, 31), found[1:]):
        for name, a, b in zip(("thr", "tcol or counts", "thr2"), found[0], got):
            assert torch.equal(a, b), (tie_bit, name, a, b)


@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
@pytest.mark.parametrize("slices,fused", [(1, False), (4, False), (1, True)])
def test_the_select_snap_selects_the_same_sets(dist, slices, fused):
    # the k-th key's search with its ends moved to the nearest keys: the torch path's sets, and
    # each row the one without (the selection depends on the key's contract only; the order of
    # a row's indices is not fixed where warp ballots place them)
    logits, masked, starts, lengths = _ragged_rows(dist, seed=9)
    dev = torch.device(DEVICE)
    tables = []
    for snap in (False, True):
        kw = dict(DIST_SAMPLE, slices=slices, fused=fused, select_snap=snap)
        _check(logits.to(DEVICE), masked, starts, lengths, 200, **kw)
        out = torch.empty(4, 200, dtype=torch.int32, device=dev)
        T.ragged_topk(logits.to(DEVICE), starts.to(dev), lengths.to(dev), 200, out, config=_cfg(**kw))
        tables.append(out.cpu().sort(dim=1).values)
    assert torch.equal(tables[0], tables[1])


def test_the_sample_tie_bit_is_checked_against_the_low_bit():
    with pytest.raises(ValueError, match="sample_tie_bit"):
        TC.TopkConfig(sample_tie_bit=8)  # not above sample_low_bit (8)
    with pytest.raises(ValueError, match="sample_tie_bit"):
        TC.TopkConfig(sample_tie_bit=32)
    assert TC.TopkConfig(sample_low_bit=4, sample_tie_bit=8).sample_tie_bit == 8
    with pytest.raises(ValueError, match="select_snap"):
        TC.TopkConfig(select_snap=1)


# the row kernel at toy sizes: rows of up to 2048 keys in registers, its sample runs of 8
# keys, one key in 4 (so that a 64-key top k leaves the sample a share to rank)
ROW_SAMPLE = dict(row_max=2048, piece=8, sparse=4, sample_sparse=4)


@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
@pytest.mark.parametrize("kw", [dict(), dict(row_sigmas=0.25), dict(row_warps=2), dict(sample_tie_bit=20)])
def test_row_kernel_selects_the_torch_set_on_every_distribution(dist, kw):
    # one launch, each row whole in registers: ties (equal, few distinct, zeros, a flat row
    # with outliers), ramps, a raised stretch, a sink; shifted, shortened and short windows;
    # a bracket a quarter sigma wide misses often and must still give the torch set
    rows, n, topk = 6, 1500, 64
    logits = logits_like(dist, rows, n, seed=11)
    starts = torch.tensor([0, 1, 350, 0, 7, 100])
    lengths = torch.tensor([n, n - 1, n - 700, 300, topk, 40])
    col = torch.arange(n)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, logits, float("-inf"))
    stats = _check(logits.to(DEVICE), masked, starts, lengths, topk, **dict(ROW_SAMPLE, **kw))
    assert stats[TC.STAT_WHOLE] == 4 and stats[TC.STAT_SHORT] == 2, stats


@pytest.mark.parametrize("quantize", [None, 2.0, 0.25])
def test_row_kernel_on_ragged_windows_with_ties_at_the_kth_key(quantize):
    # random windows, an empty row, a row of exactly k keys, values quantized to few levels
    logits, masked, starts, lengths = _case(9, 1200, 37, seed=21, quantize=quantize, pad=5)
    stats = _check(logits, masked, starts, lengths, 37, **ROW_SAMPLE)
    assert stats[TC.STAT_WHOLE] == int((lengths > 37).sum()), stats


def test_row_kernel_orders_special_values_like_floats():
    # signed zeros tie, infinities, NaNs above every number, subnormals, both signs
    tiny = torch.finfo(torch.float32).tiny
    big = torch.finfo(torch.float32).max
    special = torch.tensor([0.0, -0.0, float("-inf"), float("inf"), big, -big, tiny / 4, -tiny / 4, 1.0, -1.0,
                            float("nan")])
    g = torch.Generator().manual_seed(5)
    vals = special[torch.randint(0, special.numel(), (3, 900), generator=g)]
    starts = torch.tensor([0, 5, 17])
    lengths = torch.tensor([900, 800, 600])
    col = torch.arange(900)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, vals, float("-inf"))
    stats = _check(vals.to(DEVICE), masked, starts, lengths, 50, **ROW_SAMPLE)
    assert stats[TC.STAT_WHOLE] == 3, stats


def test_row_kernel_is_the_only_launch_and_needs_no_candidate_scratch():
    dev = torch.device(DEVICE)
    starts = torch.zeros(8, dtype=torch.int32, device=dev)
    lengths = torch.full((8,), 1500, dtype=torch.int32, device=dev)
    run = T.RaggedTopk(dev, 8, 1500, starts, lengths, 64, config=_cfg(**ROW_SAMPLE))
    assert run.scratch_numel == 4  # a write counter a row, int32
    run.bind(torch.empty(4, dtype=torch.int64, device=dev))
    assert len(run.launches) == 1 and run.plan.row is not None
    # blocks wider than row_max, or split rows, keep the sample / filter / select launches
    wide = T.RaggedTopk(dev, 8, 4000, starts, lengths, 64, config=_cfg(**ROW_SAMPLE))
    split = T.RaggedTopk(dev, 8, 1500, starts, lengths, 64, config=_cfg(slices=2, **ROW_SAMPLE))
    for other in (wide, split):
        assert other.plan.row is None and other.scratch_numel > 8 * 64


@pytest.mark.cuda
@pytest.mark.parametrize("dist", ["gaussian", "equal", "ascending", "stripes"])
def test_the_shipped_config_selects_few_short_rows_by_the_row_kernel(dist):
    # the device's own launch config (sm90: 16K-key rows at 16 warps capped at 64 registers,
    # 8K-key rows at 8 warps) on the model's top-k; causal lengths ending at n keys
    dev = torch.device("cuda")
    config = TC.launch_config(dev)
    rows, topk = 96, 2048
    for n in (8192, 16384):
        if config.row_max < n:
            pytest.skip(f"this device's config has no row kernel for {n}-key rows")
        logits = logits_like(dist, rows, n, seed=n)
        starts = torch.zeros(rows, dtype=torch.int64)
        lengths = torch.arange(n - rows + 1, n + 1)
        lengths[:2] = torch.tensor([topk, 100])
        col = torch.arange(n)
        masked = torch.where(col[None] < lengths[:, None], logits, float("-inf"))
        run = T.RaggedTopk(dev, rows, n, starts.to(dev), lengths.to(dev), topk, config=config)
        assert run.plan.row is not None and run.plan.filter is None and run.plan.sample is None
        got = torch.full((rows, topk), 7, dtype=torch.int32, device=dev)
        run(logits.to(dev), got)
        want = torch.empty(rows, topk, dtype=torch.int32)
        row_topk(masked, starts, lengths, topk, want)
        assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)


def test_the_row_kernel_runs_where_the_rows_are_few_with_the_keys_a_thread_of_row_warps(monkeypatch):
    sm90 = TC.CONFIGS["sm90"]
    assert (sm90.row_max, sm90.row_warps, sm90.row_keys_per_sm) == (16384, 16, 16384)
    # 132 SMs (an H100 or H200) take 132 * 16384 keys: 132 rows of 16K keys, 264 of 8K
    assert TC.row_kernel_fits(sm90, 132, 16384, 132) and not TC.row_kernel_fits(sm90, 133, 16384, 132)
    assert TC.row_kernel_fits(sm90, 264, 5000, 132) and not TC.row_kernel_fits(sm90, 265, 5000, 132)
    assert TC.row_kernel_fits(sm90, 1 << 20, 16384, None)
    assert TC.row_kernel_fits(dataclasses.replace(sm90, row_keys_per_sm=None), 1 << 20, 16384, 132)
    assert [TC.row_warps(sm90, whole) for whole in (4096, 8192, 16384)] == [4, 8, 16]
    assert [TC.row_warps(_cfg(row_max=2048, row_warps=2), whole) for whole in (1024, 2048)] == [2, 2]
    # the register cap applies at row_warps warps only; a call past the budget plans the launches
    # (a CPU device stands for an NVIDIA GPU in the plan: register caps)
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    config = _cfg(row_max=4096, row_warps=8, row_maxnreg=64)
    short, full = (TC.plan_launches(torch.device("cpu"), config, 256, n, 1, False).row for n in (1500, 4000))
    assert (short["num_warps"], full["num_warps"]) == (4, 8)
    assert "maxnreg" not in short and full["maxnreg"] == 64
    over = TC.plan_launches(torch.device("cpu"), config, 256, 4000, 1, False, row_fits=False)
    assert over.row is None and over.filter is not None


@pytest.mark.parametrize("field,bad", [("row_max", 3000), ("row_max", 1 << 17), ("row_max", -1), ("row_max", 2.0),
                                       ("row_warps", 3), ("row_sigmas", 0), ("row_sigmas", "2"),
                                       ("row_keys_per_sm", 0), ("row_keys_per_sm", 1.5)])
def test_a_bad_row_kernel_field_is_refused(field, bad):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TC.DEFAULT_CONFIG, **{field: bad})


@pytest.mark.parametrize("dist", ["equal", "descending", "outliers"])
def test_ties_and_ramps_keep_the_sampled_path_at_the_default_sample(dist):
    # the default sample (runs of 16 keys every 512) and scratch on rows of 40K keys
    rows, n, topk = 2, 40000, 64
    logits = logits_like(dist, rows, n, seed=3)
    starts = torch.zeros(rows, dtype=torch.int64)
    lengths = torch.full((rows,), n, dtype=torch.int64)
    stats = _check(logits.to(DEVICE), logits, starts, lengths, topk, slices=1)
    assert stats[TC.STAT_SAMPLED] == rows, stats


@pytest.mark.parametrize("slices", [2, 4, 8])
@pytest.mark.parametrize("quantize", [None, 4.0])
def test_split_rows_select_the_torch_set(slices, quantize):
    # ragged windows, empty and short rows (slices of no block at all), ties at the k-th key
    logits, masked, starts, lengths = _case(10, 3000, 24, seed=slices, quantize=quantize, pad=3)
    stats = _check(logits, masked, starts, lengths, 24, cap=512, slices=slices, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 5, stats


@pytest.mark.parametrize("slices", [2, 4])
@pytest.mark.parametrize("topk,path", [(16, TC.STAT_SAMPLED), (100, TC.STAT_PLAIN)])
def test_split_rows_retry_in_a_second_launch(slices, topk, path):
    # every large key of 2048-key rows sits in a run the sample reads, so exactly r keys reach
    # the first threshold, fewer than k: the retry launch appends the keys down to the deeper
    # threshold, enough for k=16 (the sampled path serves the rows), still too few for k=100
    n = 2048
    col = torch.arange(n)
    vals = torch.rand(3, n) - 10.0
    vals[:, (col // 8) % 4 == 0] += 20.0
    starts = torch.zeros(3, dtype=torch.int64)
    lengths = torch.full((3,), n, dtype=torch.int64)
    stats = _check(vals.to(DEVICE), vals, starts, lengths, topk, cap=4096, slices=slices, **SMALL_SAMPLE)
    assert stats[path] == 3, stats


def _short_rows():
    # six rows of 2048 keys; the first three have large keys only where SMALL_SAMPLE's runs
    # read (keys 0-7 of every 32), so fewer than k=16 keys reach their first threshold
    n = 2048
    col = torch.arange(n)
    g = torch.Generator().manual_seed(12)
    vals = torch.randn(6, n, generator=g)
    vals[:3] = torch.rand(3, n, generator=g) - 10.0
    vals[:3, (col // 8) % 4 == 0] += 20.0
    return vals, torch.zeros(6, dtype=torch.int64), torch.full((6,), n, dtype=torch.int64)


@pytest.mark.parametrize("kw", [dict(), dict(presample=True), dict(slices=2), dict(slices=4)])
def test_retried_rows_are_counted_with_a_fifth_stats_entry(kw):
    # the unlucky rows retry (exactly r keys reach the first threshold, fewer than k=16);
    # the other rows of the block do not; four entries count no retries
    vals, starts, lengths = _short_rows()
    out = torch.empty(6, 16, dtype=torch.int32, device=DEVICE)
    for entries, retried in ((5, 3), (4, None)):
        stats = torch.zeros(entries, dtype=torch.int32, device=DEVICE)
        T.ragged_topk(vals.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), 16, out, stats=stats, config=_cfg(cap=4096, **dict(SMALL_SAMPLE, **kw)))
        stats = stats.cpu().tolist()
        assert sum(stats[:4]) == 6 and stats[TC.STAT_SAMPLED] == 6, stats
        if retried is not None:
            assert stats[TC.STAT_RETRIED] == retried, stats
    want = torch.empty(6, 16, dtype=torch.int32)
    row_topk(vals, starts, lengths, 16, want)
    assert torch.equal(out.cpu().sort(1).values, want.sort(1).values)


@pytest.mark.parametrize("presample", [None, True])
@pytest.mark.parametrize("retry_split", [0, 1024, 4096])
def test_long_whole_rows_short_of_k_keys_take_the_split_fallback_instead_of_a_retry(retry_split, presample):
    # as above, the first three rows keep fewer than k=16 keys through the first threshold.
    # Rows of 2048 keys, split fallback from 1024: with retry_split 1024 they skip the
    # filter program's second pass and are selected by the split fallback; with 0 (never) or
    # 4096 (longer rows only) they retry and keep the sampled path. The same set every way.
    # With presample the retry's threshold comes from the sample kernel, which searches it
    # only for the rows that can retry (none with 1024)
    vals, starts, lengths = _short_rows()
    out = torch.empty(6, 16, dtype=torch.int32, device=DEVICE)
    stats = torch.zeros(6, dtype=torch.int32, device=DEVICE)
    cfg = _cfg(cap=4096, slices=1, retry_split=retry_split, fallback_split=1024, fallback_slice=512,
               presample=presample, **SMALL_SAMPLE)
    T.ragged_topk(vals.to(DEVICE), starts.to(DEVICE), lengths.to(DEVICE), 16, out, stats=stats, config=cfg)
    stats = stats.cpu().tolist()
    skip = retry_split == 1024
    assert stats[TC.STAT_RETRIED] == (0 if skip else 3), stats
    assert stats[TC.STAT_PLAIN] == stats[TC.STAT_SPLIT] == (3 if skip else 0), stats
    assert stats[TC.STAT_SAMPLED] == (3 if skip else 6), stats
    want = torch.empty(6, 16, dtype=torch.int32)
    row_topk(vals, starts, lengths, 16, want)
    assert torch.equal(out.cpu().sort(1).values, want.sort(1).values)


@pytest.mark.parametrize("slack", [1 / 32, 4.0])
def test_split_rows_whose_first_search_stops_early(slack):
    # a wide sample slack stops the first threshold's search early, below where the retry's
    # (looser) search ends: the retry's must still be at or below it, since a split row's
    # select takes it as the least of its candidates (review finding: rows came back short,
    # counted as sampled)
    n = 2048
    col = torch.arange(n)
    g = torch.Generator().manual_seed(4)
    vals = torch.rand(3, n, generator=g) - 10.0
    vals[:, (col // 8) % 4 == 0] += 20.0
    starts = torch.zeros(3, dtype=torch.int64)
    lengths = torch.full((3,), n, dtype=torch.int64)
    _check(vals.to(DEVICE), vals, starts, lengths, 100, cap=4096, slices=2, sample_slack=slack, **SMALL_SAMPLE)


def test_fused_select_keeps_whole_rows_where_rows_would_be_split(monkeypatch):
    # few long rows on a GPU would be split (auto_slices > 1); a fused select asked for takes
    # whole rows instead of refusing the call
    monkeypatch.setattr(T, "auto_slices", lambda *args: 4)
    logits, masked, starts, lengths = _case(4, 3000, 24, seed=9, pad=3, min_length=1000)
    _check(logits, masked, starts, lengths, 24, cap=512, fused=True, **SMALL_SAMPLE)
    with pytest.raises(ValueError, match="fused"):
        _check(logits, masked, starts, lengths, 24, cap=512, fused=True, slices=4, **SMALL_SAMPLE)


def _default_plan(topk, n, presample=None, slices=1, **fields):
    # _plan for the default config (the CPU's, and AMD's) on a CPU device
    config = dataclasses.replace(TC.DEFAULT_CONFIG, presample=presample, **fields)
    return TC.plan_launches(torch.device("cpu"), config, topk, n, slices, False)


def test_split_rows_take_their_threshold_from_the_sample_kernel():
    # slices > 1 runs the sample kernel whatever presample says, and refuses the fused select
    _, _, _, sample_kw, filter_kw, retry_kw, selects, _, _ = _default_plan(64, 100000, presample=False, slices=4)
    assert sample_kw is not None and filter_kw["SL"] == 4 and filter_kw["PRESAMPLE"]
    assert retry_kw["RETRY"] and not filter_kw["RETRY"]
    assert all(kw["W"] == 1 for _, kw in selects)  # one list per row
    _, _, _, sample_kw, filter_kw, retry_kw, _, _, _ = _default_plan(64, 100000, presample=False)
    assert sample_kw is None and retry_kw is None and filter_kw["SL"] == 1


def test_rows_past_the_filters_sample_take_the_sample_kernel():
    # a config without presample (the default off NVIDIA) still runs the sample kernel for
    # rows longer than the filter's own sample covers at one key in 32 (256 runs of 16 keys:
    # 128K keys); asked for explicitly, off stays off
    assert not TC.DEFAULT_CONFIG.presample
    _, _, _, sample_kw, filter_kw, _, _, _, _ = _default_plan(2048, 1 << 20)
    assert sample_kw is not None and filter_kw["PRESAMPLE"]
    # the sample kernel also gives the retry's threshold, for rows shorter than RETRY_FROM
    # (longer whole rows take the split fallback instead); the filter only loads it
    assert filter_kw["SECOND"] and sample_kw["SECOND"]
    assert sample_kw["RETRY_FROM"] == filter_kw["RETRY_FROM"] == TC.RETRY_SPLIT
    _, _, _, sample_kw, filter_kw, _, _, _, _ = _default_plan(2048, 1 << 20, retry_split=0)
    assert sample_kw["RETRY_FROM"] == filter_kw["RETRY_FROM"] == 0 and filter_kw["SECOND"]
    assert _default_plan(2048, 1 << 17, presample=True)[4]["SECOND"]
    assert not _default_plan(2048, 1 << 17, presample=False)[4]["SECOND"]
    assert _default_plan(2048, 1 << 17)[3] is None
    assert _default_plan(2048, 1 << 20, presample=False)[3] is None


def test_auto_slices_split_only_few_long_rows_on_a_gpu():
    assert TC.auto_slices(torch.device("cpu"), 1, 1 << 21, 16) == 1
    if DEVICE == "cuda":
        dev = torch.device(DEVICE)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        assert TC.auto_slices(dev, 1, 1 << 21, 16) == TC.MAX_SLICES
        assert TC.auto_slices(dev, sms * 8, 1 << 21, 16) == 1
        assert TC.auto_slices(dev, 1, 2 * TC.SLICE_MIN, 16) == 2
        assert TC.auto_slices(dev, 1, TC.SLICE_MIN, 16) == 1


def test_sampled_path_with_odd_blocks():
    logits, masked, starts, lengths = _case(6, 700, 20, seed=9, pad=5, min_length=300)
    stats = _check(logits, masked, starts, lengths, 20, cap=128, block=128, filter_block=64, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 3, stats


@pytest.mark.parametrize("kw", [dict(), dict(fused=True), dict(tile=16), dict(programs_per_sm=1, prefetch=2)])
def test_dynamic_rows_select_the_same_sets(kw):
    # filter programs take rows from a shared counter: every row served once, by any program.
    # On a GPU, 300 rows and (with programs_per_sm=1) one program an SM: programs take 2-3
    # rows each, concurrently; on the interpreter the first program takes them all
    rows = 300 if DEVICE == "cuda" else 40
    logits, masked, starts, lengths = _case(rows, 900, 24, seed=41, quantize=4.0, pad=3, min_length=100)
    stats = _check(logits, masked, starts, lengths, 24, cap=1024, dynamic=True, **dict(SMALL_SAMPLE, **kw))
    assert stats[TC.STAT_SAMPLED] >= rows * 3 // 4, stats


def test_second_launch_serves_the_two_rows_queued_among_many():
    # two rows whose lists overflow the first tile (400 keys tied at the top: 100 a list
    # against 64 slots), rows 3 and 140; every other row fits the tile. The queue holds them
    # in whatever order the first launch's programs got there; a launch that served queue
    # entries by row number, or skipped the queue's tail, would leave one unwritten
    rows, n, topk = 150, 900, 24
    g = torch.Generator().manual_seed(43)
    vals = torch.randn(rows, n, generator=g)
    starts = torch.zeros(rows, dtype=torch.int64)
    lengths = torch.randint(100, n + 1, (rows,), generator=g)
    for r in (3, 140):
        lengths[r] = n
        vals[r, :400] = 10.0
    masked = torch.where(torch.arange(n)[None] < lengths[:, None], vals, float("-inf"))
    stats = _check(vals.to(DEVICE), masked, starts, lengths, topk, cap=1024, tile=256, num_warps=4, **SMALL_SAMPLE)
    assert stats[TC.STAT_PLAIN] == 0 and stats[TC.STAT_SAMPLED] >= 100, stats


def test_direct_rows_with_the_chunked_write():
    # rows up to a 2048-slot tile are selected on the row itself and written back 1024 keys
    # at a time (the write re-reads the row); ties at the k-th key included
    logits, masked, starts, lengths = _case(10, 2500, 24, seed=45, quantize=4.0, pad=3, min_length=1100)
    for r in range(10):  # the key just past each window is the largest: it must not be read
        end = int(starts[r] + lengths[r])
        if end < 2500:
            logits[r, end] = 1e30
    stats = _check(logits, masked, starts, lengths, 24, tile=2048, tile_write=False)
    assert stats[TC.STAT_WHOLE] >= 3, stats


@pytest.mark.parametrize("prefetch", [2, 3])
def test_prefetch_on_rows_many_blocks_long(prefetch):
    # rows of 4500-6000 keys: with the default filter block (1024 keys on an NVIDIA GPU, the
    # ballot path; 512 on the interpreter) the blocks loaded inside the pass's loop are the
    # ones consumed
    logits, masked, starts, lengths = _case(6, 6000, 64, seed=47, pad=3, min_length=4500)
    stats = _check(logits, masked, starts, lengths, 64, prefetch=prefetch)
    assert stats[TC.STAT_SAMPLED] + stats[TC.STAT_PLAIN] >= 4, stats


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_rows_of_whole_blocks_and_lists_overflowing_mid_row(prefetch):
    # lengths at and around whole multiples of the filter block: rows no longer than the
    # blocks in flight (every load masked) and rows whose pass runs the unmasked loop (on
    # NVIDIA the PTX step) and then the masked tail; the last two rows' lists overflow inside
    # the unmasked loop (300 large keys where the sample does not look), keep counting, and
    # take the fallback path
    fb = TC.launch_config(torch.device(DEVICE)).filter_block
    whole = fb * (prefetch + 1)
    lens = [whole - 1, whole, whole + 1, 5 * fb - 1, 5 * fb, 5 * fb + 1, 5 * fb + 1, 5 * fb]
    n = 5 * fb + 1
    g = torch.Generator().manual_seed(53)
    vals = torch.randn(len(lens), n, generator=g)
    vals[-2:, _unseen(n, fb, 300)] = 10.0 + torch.rand(300, generator=g)
    starts = torch.zeros(len(lens), dtype=torch.int64)
    lengths = torch.tensor(lens, dtype=torch.int64)
    masked = torch.where(torch.arange(n)[None] < lengths[:, None], vals, float("-inf"))
    for r, length in enumerate(lens):  # the keys past each window are the largest: never taken
        vals[r, length:] = 1e30
    stats = _check(vals.to(DEVICE), masked, starts, lengths, 16, cap=256, prefetch=prefetch, **SMALL_SAMPLE)
    assert stats[TC.STAT_PLAIN] >= 2 and stats[TC.STAT_SAMPLED] >= 1, stats


def test_lopsided_lists_take_the_second_launch():
    # each row's large keys sit in the columns one warp of the filter reads (a different
    # warp a row), so nearly all of its 48-112 candidates land in one list (the CPU
    # interpreter's filter: warp w reads columns [128w, 128w + 128) of each 512): more than a
    # list's share of the 128-slot first tile (32), fewer than the tile, so the row waits
    # for the second launch (tile of the whole lists) although the first tile could hold
    # its candidates. A few balanced rows ride along
    rows, n, topk = 10, 2000, 16
    g = torch.Generator().manual_seed(61)
    vals = torch.randn(rows, n, generator=g)
    col = torch.arange(n)
    for r in range(6):
        vals[r, ((col % 512) // 128) == (r % 4)] += 4.0
    starts = torch.zeros(rows, dtype=torch.int64)
    lengths = torch.full((rows,), n, dtype=torch.int64)
    lengths[1], lengths[7] = 1500, 1900
    masked = torch.where(col[None] < lengths[:, None], vals, float("-inf"))
    stats = _check(vals.to(DEVICE), masked, starts, lengths, topk, cap=512, tile=128, num_warps=4,
                   filter_block=512, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] == rows, stats


def test_second_launch_pulls_queued_rows_past_its_programs():
    # A first tile of 16 slots (4 a list) cannot hold any sampled row's >= 24 candidates, so
    # every such row is queued; every 7th row is at most k long and never queued. The second
    # launch has one program an SM (4 on the interpreter): with more rows queued than
    # programs, the later ones are pulled from the queue's counter
    rows = 400 if DEVICE == "cuda" else 150
    logits, masked, starts, lengths = _case(rows, 900, 24, seed=31, pad=2, min_length=30)
    lengths[5::7] = torch.minimum(lengths[5::7], torch.tensor(20))
    masked = torch.where(torch.arange(900)[None] < (starts + lengths)[:, None], masked, float("-inf"))
    stats = _check(logits, masked, starts, lengths, 24, cap=512, tile=16, num_warps=4, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= rows * 2 // 3 and stats[TC.STAT_SHORT] >= rows // 7, stats
    assert stats[TC.STAT_PLAIN] == 0, stats
    programs = torch.cuda.get_device_properties(DEVICE).multi_processor_count if DEVICE == "cuda" else 4
    assert stats[TC.STAT_SAMPLED] > programs


@pytest.mark.skipif(DEVICE == "cpu", reason="register caps are an NVIDIA launch option")
def test_register_caps_select_the_same_sets():
    logits, masked, starts, lengths = _case(12, 900, 24, seed=33, quantize=4.0, pad=3, min_length=300)
    stats = _check(logits, masked, starts, lengths, 24, cap=256, filter_maxnreg=32, select_maxnreg=64, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 8, stats


@pytest.mark.skipif(DEVICE != "cpu", reason="on NVIDIA GPUs the register caps are accepted")
@pytest.mark.parametrize("name", ["filter_maxnreg", "select_maxnreg", "fallback_maxnreg"])
def test_register_caps_are_refused_off_nvidia(name):
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match=name):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(**{name: 64}))


@pytest.mark.skipif(DEVICE != "cpu", reason="on NVIDIA GPUs the ballot write is accepted")
def test_ballot_write_is_refused_off_nvidia():
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match="ballot_write"):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(ballot_write=True))


@pytest.mark.parametrize("name", ["presample", "ballot_write", "fallback_ballot"])
def test_non_bool_switches_are_refused(name):
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match=name):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(**{name: 1}))


@pytest.mark.parametrize("prefetch,filter_block", [(2, 64), (3, 64), (2, None), (3, None)])
def test_deeper_prefetch_selects_the_torch_set(prefetch, filter_block):
    # rows of 100-700 keys: the blocks in flight run past the row's end on every row, and
    # some rows are shorter than the prefetch window itself (default filter_block: the
    # ballot path on NVIDIA GPUs)
    logits, masked, starts, lengths = _case(8, 700, 20, seed=21, pad=5, min_length=100)
    block = {} if filter_block is None else dict(filter_block=filter_block)
    stats = _check(logits, masked, starts, lengths, 20, cap=128, prefetch=prefetch, **block, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 4, stats


def test_lists_longer_than_the_tile_take_the_second_launch():
    # a first tile of 4 slots a list: nearly every row's lists overflow it and the second
    # launch (lists of cap / num_warps slots) must serve them, the rest stay served
    logits, masked, starts, lengths = _case(8, 900, 24, seed=12, pad=2, min_length=200)
    stats = _check(logits, masked, starts, lengths, 24, cap=512, tile=16, num_warps=4, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 5 and stats[TC.STAT_PLAIN] == 0, stats


def test_nan_and_infinity_ties_at_the_kth_key_go_to_the_lowest_columns():
    # more NaNs than k (the k-th key is NaN), and k cutting through +inf after the NaNs
    vals = torch.randn(3, 400)
    vals[0, ::9] = float("nan")
    vals[1, ::5] = float("inf")
    vals[1, 3::97] = float("nan")
    vals[2, 1::3] = -float("nan")
    starts = torch.zeros(3, dtype=torch.int64)
    lengths = torch.full((3,), 400, dtype=torch.int64)
    for kw in (dict(SMALL_SAMPLE, tile=32), dict(tile=1024), dict(tile=32, sample_min=1 << 30)):
        _check(vals.to(DEVICE), vals, starts, lengths, 30, cap=1024, **kw)


def test_cap_below_topk_is_refused():
    logits = torch.zeros(1, 10, device=DEVICE)
    with pytest.raises(ValueError, match="cap"):
        T.ragged_topk(logits, *_one_row_args(8), config=_cfg(cap=4))


def test_topk_choice_default_falls_back_explicit_raises(monkeypatch):
    from indexer import envs
    from indexer.topk import topk_choice

    cpu = torch.device("cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # Triton cannot run on CPU tensors now
    monkeypatch.setitem(envs.TOPK.platform_defaults, "cpu", "triton")
    assert topk_choice(cpu) == "torch"  # only the default asked for it
    monkeypatch.setenv("INDEXER_CPU_TOPK", "triton")
    with pytest.raises(ValueError, match="INDEXER_CPU_TOPK"):
        topk_choice(cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if torch.cuda.is_available():
        # on a GPU host the kernels were defined for the GPU (TRITON_INTERPRET unset at
        # import): the interpreter cannot take them now, and the explicit flag says so
        with pytest.raises(ValueError, match="before importing indexer"):
            topk_choice(cpu)
    else:
        assert topk_choice(cpu) == "triton"


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


@pytest.mark.parametrize("kw", [dict(), dict(tile=16), dict(tile=64, sample_min=1 << 30), dict(tile=1024)])
def test_fused_select_selects_the_same_sets(kw):
    # the select done by the filter kernel's own programs: every path, the second launch too
    logits, masked, starts, lengths = _case(10, 900, 24, seed=21, quantize=4.0, pad=3, min_length=100)
    stats = _check(logits, masked, starts, lengths, 24, cap=1024, fused=True, **dict(SMALL_SAMPLE, **kw))
    path = TC.STAT_PLAIN if "sample_min" in kw else TC.STAT_WHOLE if kw.get("tile") == 1024 else TC.STAT_SAMPLED
    assert stats[path] >= 7, stats


@pytest.mark.parametrize("kw", [dict(), dict(tile=16), dict(tile=1024), dict(fused=True), dict(quantize=None)])
def test_tile_write_selects_the_same_sets(kw):
    # the write from the key tile in registers: ties at the k-th key (quantized values) on
    # the sampled path, the second launch (tile=16), the direct path, fused, distinct values
    kw = dict(kw)
    quantize = kw.pop("quantize", 4.0)
    logits, masked, starts, lengths = _case(10, 900, 24, seed=23, quantize=quantize, pad=3, min_length=100)
    stats = _check(logits, masked, starts, lengths, 24, cap=1024, tile_write=True, **dict(SMALL_SAMPLE, **kw))
    path = TC.STAT_WHOLE if kw.get("tile") == 1024 else TC.STAT_SAMPLED
    assert stats[path] >= 7, stats
    if quantize:  # the tie rule was needed: rows where the k-th value's ties do not all fit
        top = masked.sort(1, descending=True).values
        kth = top[:, 23:24]
        assert int((((top > kth).sum(1) + (top == kth).sum(1) > 24) & (lengths > 24)).sum()) >= 5


@pytest.mark.parametrize("kw", [dict(), dict(dynamic=True), dict(fused=True), dict(tile=16), dict(quantize=None)])
def test_presampled_thresholds_select_the_same_sets(kw):
    # the thresholds from the sample kernel, the filter kernel streaming only: ties at the
    # k-th key, rows shared by a counter, the select in the filter kernel, the second launch
    kw = dict(kw)
    quantize = kw.pop("quantize", 4.0)
    logits, masked, starts, lengths = _case(10, 900, 24, seed=29, quantize=quantize, pad=3, min_length=100)
    stats = _check(logits, masked, starts, lengths, 24, cap=1024, presample=True, **dict(SMALL_SAMPLE, **kw))
    assert stats[TC.STAT_SAMPLED] >= 7, stats


@pytest.mark.parametrize("pieces", [16, 8])
@pytest.mark.parametrize("topk,path", [(16, TC.STAT_SAMPLED), (100, TC.STAT_PLAIN)])
def test_presampled_second_threshold_serves_an_unlucky_sample(topk, path, pieces):
    # the sample kernel's threshold lets r < k keys through; the filter's retry (twice the
    # sigmas) enough for k=16 only. pieces=8: the filter's own sample is half the sample
    # kernel's, which then gives the retry's threshold too
    vals, starts, lengths = _unlucky_rows()
    stats = _check(vals.to(DEVICE), vals, starts, lengths, topk, cap=4096, pieces=pieces, presample=True,
                   **SMALL_SAMPLE)
    assert stats[path] == 3, stats


@pytest.mark.parametrize("piece,pieces", [(8, 32), (4, 256)])
def test_presampled_thresholds_take_the_filters_paths(piece, pieces):
    # lists of 32 slots a row (cap 128, 4 lists): the rank-r threshold's keys mostly fit
    # them, the retry's or a wrong threshold's would not, so a presampled threshold other
    # than the filter's own sends rows to another path. Both samples are one run every 4 *
    # piece keys (no row has more runs than either holds); pieces=256 makes the sample
    # kernel's tile smaller than the filter's (sample_runs: 64 runs for n=900)
    logits, masked, starts, lengths = _case(12, 900, 24, seed=7, pad=3, min_length=600)
    kw = dict(cap=128, filter_block=64, piece=piece, pieces=pieces, sparse=4)
    assert 900 // (4 * piece) <= min(pieces, TC.sample_runs(900, piece, 4, TC.SAMPLE_MAX))
    want = _check(logits, masked, starts, lengths, 24, presample=False, **kw)
    got = _check(logits, masked, starts, lengths, 24, presample=True, **kw)
    assert got == want and want[TC.STAT_SAMPLED] >= 8, (got, want)


def test_the_sample_kernels_sample_thins_past_the_filters_own():
    # default shape (runs of 16 keys, one key in 32, the filter's own 256 runs): the sample
    # kernel's keeps one key in 64 past the filter's own, up to SAMPLE_MAX keys
    def keys(n, **kw):
        c = dataclasses.replace(TC.DEFAULT_CONFIG, **kw)
        return TC.sample_runs(n, c.piece, c.sparse, c.sample_max, c.pieces, c.sample_sparse) * c.piece
    assert [keys(1 << e) for e in range(16, 22)] == [2048, 4096, 4096, 8192, 16384, 16384]
    # at one key in 32 (sample_sparse == sparse) it holds one key in 32 up to SAMPLE_MAX
    assert [keys(1 << e, sample_sparse=32) for e in range(16, 22)] == [2048, 4096, 8192, 16384, 16384, 16384]
    assert TC.SAMPLE_SPARSE == TC.DEFAULT_CONFIG.sample_sparse == 64


@pytest.mark.parametrize("dist", ["gaussian", "equal", "few_distinct", "descending", "recency", "relu_zeros"])
def test_a_thinned_sample_selects_the_torch_set(dist):
    # the sample kernel's runs thinned to one key in 64 past the filter's own 16 runs: 64 runs
    # of 8 keys where one key in 4 would take 128 (sample_max); ragged rows, ties, ramps
    topk = 200
    kw = dict(DIST_SAMPLE, pieces=16, sample_sparse=64, presample=True)
    c = dataclasses.replace(TC.DEFAULT_CONFIG, **kw)
    assert TC.sample_runs(20000, c.piece, c.sparse, c.sample_max, c.pieces, c.sample_sparse) == 64
    logits, masked, starts, lengths = _ragged_rows(dist, seed=11)
    _check_all_stats(logits.to(DEVICE), masked, starts, lengths, topk, **kw)


@pytest.mark.parametrize("slices", [1, 2])
def test_sample_kernel_tile_holds_the_filters_sample(slices):
    # the sample kernel's tile sized for the longest row (sample_runs) against one four
    # times larger, n not a power of two, rows of every length up to n: the same thresholds
    # and column cuts (tied rows among them)
    n, piece, sparse = 1000, 8, 4
    runs = TC.sample_runs(n, piece, sparse, 1 << 12)
    assert runs * piece * sparse >= n and runs < (1 << 12) // piece
    lens = torch.arange(1, n + 1, 7, dtype=torch.int64)
    logits = torch.randn(len(lens), n)
    logits[::3] = (logits[::3] * 2).round()  # few distinct values: ties at the threshold
    logits = logits.to(DEVICE)
    starts = ((n - lens) // 2).to(DEVICE)
    got = []
    for np_ in (runs, 4 * runs):
        t = torch.zeros(len(lens), dtype=torch.int32, device=DEVICE)
        tcol = torch.zeros(len(lens), dtype=torch.int32, device=DEVICE)
        # the counters it zeroes for the later launches, garbage before (ctl[5:] are the
        # queues, written before they are read, and must be left alone; cnt only for split rows)
        # (split rows: list counter and keys listed a row, then slices done)
        cnt = torch.full((3 * len(lens),), 9, dtype=torch.int32, device=DEVICE)
        wpos = torch.full((len(lens),), 77, dtype=torch.int32, device=DEVICE)
        ctl = torch.full((8,), -5, dtype=torch.int32, device=DEVICE)
        thr2 = torch.zeros(2 * len(lens), dtype=torch.int32, device=DEVICE)
        # fallback_seed's histograms, one a row: zeroed for every filtered row, garbage before
        hist = torch.full((len(lens), TC.SEED_BINS), 3, dtype=torch.int32, device=DEVICE)
        TK.sample_kernel[(len(lens),)](logits, starts, lens.to(DEVICE), t, tcol, thr2, cnt, wpos, ctl, len(lens),
                                       logits.stride(0), 0, hist, K=8, SECOND=True, NP=np_, PIECE=piece,
                                       SPARSE=sparse, SIGMAS=4.0, SLACK=1 / 32, LOW_BIT=8, WHOLE=8, SL=slices,
                                       HIST=True, num_warps=1)
        got.append((t, tcol, thr2))
        # the retry's threshold is deeper: at or below the first
        sampled = lens.to(DEVICE) > 8
        assert (hist[sampled] == 0).all() and (hist[~sampled] == 3).all()
        assert (thr2[:len(lens)][sampled] <= t[sampled]).all()
        assert not wpos.any()
        assert (cnt == (0 if slices > 1 else 9)).all()
        assert ctl.tolist() == [0, 0, 0, 0, 0, -5, -5, -5]
    assert all(torch.equal(a, b) for a, b in zip(*got))
    sampled = lens.to(DEVICE) > 8
    assert (got[0][0][sampled] != 0).any()  # thresholds were written
    assert (got[0][1][sampled] != 2**31 - 1).any()  # and some rows' cuts


def test_a_configs_filter_register_cap_applies_to_the_streaming_filter_only():
    # the config's cap is tuned for the filter that only streams; 0 means no cap. On the CPU a
    # cap is refused, which shows where it would apply
    logits, masked, starts, lengths = _case(4, 300, 8, seed=3, pad=1, min_length=50)
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="filter_maxnreg"):
            T.ragged_topk(logits, starts.to(DEVICE), lengths.to(DEVICE), 8,
                          torch.empty(4, 8, dtype=torch.int32, device=DEVICE),
                          config=_cfg(presample=True, streaming_filter_maxnreg=40))
    for kw in (dict(presample=False), dict(presample=True, fused=True), dict(presample=True, filter_maxnreg=0)):
        _check(logits, masked, starts, lengths, 8, streaming_filter_maxnreg=40, **kw)


def test_ballot_write_takes_every_launch_whose_chunks_allow_it():
    # four registers a lane: chunks of a multiple of 128 keys a warp (the first launch's 512
    # keys at 4 warps, the second's 1024 at 8); a 256-slot first tile keeps the scan
    common = TC.select_constexprs(256, 8, 8192, 512, 512, 4, True)
    assert [kw["WB"] for _, kw in TC.select_launches(common, 512, 8192, 4, ballot_write=True)] == [True, True]
    assert [kw["WB"] for _, kw in TC.select_launches(common, 256, 8192, 4, ballot_write=True)] == [False, True]
    assert [kw["WB"] for _, kw in TC.select_launches(common, 512, 8192, 4)] == [False, False]


@pytest.mark.skipif(DEVICE == "cpu", reason="the ballot write is NVIDIA inline PTX")
@pytest.mark.parametrize("kw", [dict(), dict(tile_write=True), dict(tile=256), dict(tile=2048),
                                dict(tile=1024, fused=True), dict(quantize=None), dict(presample=True)])
def test_ballot_write_selects_the_same_sets(kw):
    # indices placed by warp ballots and a per-row counter: ties at the k-th key (quantized
    # values), the tile write, the second launch (a 256-slot first tile: every sampled row
    # overflows it), rows selected on themselves (tile=2048), the select in the filter kernel
    kw = dict(kw)
    quantize = kw.pop("quantize", 4.0)
    rows = 64
    logits, masked, starts, lengths = _case(rows, 6000, 256, seed=53, quantize=quantize, pad=3, min_length=1200)
    stats = _check(logits, masked, starts, lengths, 256, ballot_write=True, **kw)
    # (lengths 1200-6000: about a sixth of the rows fit the 2048-slot tile)
    direct = kw.get("tile") == 2048
    assert stats[TC.STAT_WHOLE if direct else TC.STAT_SAMPLED] >= (rows // 8 if direct else rows // 2), stats


@pytest.mark.parametrize("fused", [False, True])
def test_nans_in_the_sample_do_not_open_the_filter_to_every_key(fused):
    # a run of NaNs where the sample reads (the row's first columns), fewer than k: the
    # sample's threshold is a NaN key; as a float it compared true for every key, the
    # lists looked full and the select wrote the NaNs alone (review finding)
    g = torch.Generator().manual_seed(0)
    vals = torch.randn(2, 4096, generator=g)
    vals[0, :5] = float("nan")
    vals[1, 1000:1003] = float("nan")
    starts = torch.zeros(2, dtype=torch.int64)
    lengths = torch.full((2,), 4096, dtype=torch.int64)
    stats = _check(vals.to(DEVICE), vals, starts, lengths, 16, fused=fused)
    assert stats[TC.STAT_SAMPLED] == 2, stats


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_small_topk_runs_with_the_default_launch_options(topk):
    logits, masked, starts, lengths = _case(6, 300, topk, seed=topk, pad=1)
    _check(logits, masked, starts, lengths, topk)


@pytest.mark.parametrize("case,match", [("topk", "topk"), ("out_shape", "out"), ("out_dtype", "out"),
                                        ("logits_dtype", "logits"), ("lengths", "lengths"), ("stats", "stats"),
                                        ("stats_strided", "stats"), ("starts_dtype", "starts_rel"),
                                        ("lengths_device", "lengths")])
def test_bad_arguments_are_refused_before_any_kernel(case, match):
    logits = torch.randn(3, 40, device=DEVICE)
    starts = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    lengths = torch.full((3,), 40, dtype=torch.int64, device=DEVICE)
    out = torch.full((3, 8), 7, dtype=torch.int32, device=DEVICE)
    kw = dict(logits=logits, starts_rel=starts, lengths=lengths, topk=8, out=out)
    if case == "topk":
        kw.update(topk=0, out=out[:, :0])
    elif case == "out_shape":
        kw.update(out=torch.full((3, 4), 7, dtype=torch.int32, device=DEVICE))
    elif case == "out_dtype":
        kw.update(out=torch.full((3, 8), 7, dtype=torch.int64, device=DEVICE))
    elif case == "logits_dtype":
        kw.update(logits=logits.double())
    elif case == "lengths":
        kw.update(lengths=lengths[:2])
    elif case == "starts_dtype":
        kw.update(starts_rel=starts.float())
    elif case == "lengths_device":
        # on the CPU: a device the logits are not on (meta); on a GPU: the CPU
        kw.update(lengths=lengths.to("meta" if DEVICE == "cpu" else "cpu"))
    elif case == "stats_strided":  # the kernel would add to the entries between
        kw.update(stats=torch.zeros(8, dtype=torch.int32, device=DEVICE)[::2])
    else:
        kw.update(stats=torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=match):
        T.ragged_topk(**kw)
    assert (kw["out"] == 7).all()  # left untouched


@pytest.mark.parametrize("form", ["int32", "int64", "strided"])
def test_starts_and_lengths_of_either_width_or_strided(form):
    # int32 and int64 are loaded as they come; a strided view is copied to int32 first
    logits, masked, starts, lengths = _case(8, 900, 24, seed=51, pad=3, min_length=100)
    if form == "int32":
        starts, lengths = starts.int(), lengths.int()
    elif form == "strided":
        starts = torch.stack([starts, starts], 1)[:, 0]
        lengths = torch.stack([lengths, lengths], 1)[:, 1]
        assert starts.stride(0) == 2 and lengths.stride(0) == 2
    stats = _check(logits, masked, starts, lengths, 24, cap=256, **SMALL_SAMPLE)
    assert stats[TC.STAT_SAMPLED] >= 5, stats


def test_a_changed_config_reaches_a_call_shape_seen_before():
    # the checked launches are cached per call shape and config: a config changed with
    # dataclasses.replace after a call is planned afresh (and refused here, on the CPU)
    logits, masked, starts, lengths = _case(4, 300, 8, seed=53, pad=1)
    _check(logits, masked, starts, lengths, 8)
    _check(logits, masked, starts, lengths, 8, prefetch=3)
    with pytest.raises(ValueError, match="tile"):
        _check(logits, masked, starts, lengths, 8, tile=2 * TC.default_cap(8))


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TC.DEFAULT_CONFIG.prefetch = 2
    with pytest.raises(TypeError):
        TC.CONFIGS["sm90"] = TC.DEFAULT_CONFIG


@pytest.mark.parametrize("field,bad", [("prefetch", 2.0), ("num_warps", True), ("slices", 2.0), ("fused", 1),
                                       ("fallback_buffer", 1000), ("fallback_buffer", -16), ("fallback_buffer", 8192),
                                       ("fallback_block", 64), ("fallback_block", 512.0), ("retry_split", -1),
                                       ("retry_split", 2.0), ("filter_deal", 1), ("sample_jitter", None),
                                       ("fallback_prefetch", 0), ("fallback_prefetch", 4)])
def test_a_config_with_a_value_of_the_wrong_type_cannot_be_made(field, bad):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TC.DEFAULT_CONFIG, **{field: bad})


@pytest.mark.parametrize("bad", [2.0, True])
def test_a_float_or_bool_option_is_refused_after_its_int_twin_ran(bad):
    # the per-call-shape cache must not take 2.0 or True for 2 or 1: such a config cannot
    # be made
    logits, masked, starts, lengths = _case(4, 300, 8, seed=55, pad=1)
    good = 1 if bad is True else 2
    _check(logits, masked, starts, lengths, 8, prefetch=good)
    with pytest.raises(ValueError, match="prefetch"):
        _check(logits, masked, starts, lengths, 8, prefetch=bad)


@triton.jit
def _kth_key_probe(keys_ptr, out_ptr, n, need, below, TILE: tl.constexpr, BISECT_AFTER: tl.constexpr,
                   SPAN: tl.constexpr, SNAP: tl.constexpr = False):
    # lo: the least key, or `below` keys under it (as the filter's threshold may be)
    i = tl.arange(0, TILE)
    keys = tl.load(keys_ptr + i, mask=i < n, other=-2147483648)
    lo = tl.maximum(tl.min(tl.where(i < n, keys, 2147483647), axis=0).to(tl.int64) - below, -2147483648)
    tl.store(out_ptr, TK.kth_key(keys, need, lo.to(tl.int32), n, tl.max(keys, axis=0), BISECT_AFTER, SPAN, SNAP))


def _host_skey(v):
    # the kernels' _skey of float32 values, on the host
    i32 = torch.iinfo(torch.int32)
    bits = v.view(torch.int32).clone()
    bits[bits == i32.min] = 0
    bits[v != v] = i32.max
    return bits ^ ((bits >> 31) & i32.max)


def _key_cases():
    g = torch.Generator().manual_seed(5)
    i32 = torch.iinfo(torch.int32)
    skey = _host_skey

    yield "full int range", torch.randint(i32.min + 1, i32.max, (200,), generator=g, dtype=torch.int32)
    yield "normal floats", skey(torch.randn(256, generator=g))
    exp = torch.empty(256).exponential_(generator=g)
    exp[:3] = torch.tensor([float("inf"), float("nan"), 1e30])  # far outliers above the rest
    yield "exponential with outliers", skey(exp)
    yield "one value", torch.full((100,), 12345, dtype=torch.int32)
    yield "few values", skey(torch.randint(0, 4, (256,), generator=g).float())
    yield "both extremes", torch.tensor([i32.min + 1] * 50 + [i32.max] * 50 + [0] * 50, dtype=torch.int32)
    clusters = torch.cat([torch.randn(128, generator=g) * 1e-6, 1e6 + torch.randn(128, generator=g) * 1e-3])
    yield "two far clusters", skey(clusters)
    yield "one key", torch.tensor([-7], dtype=torch.int32)
    yield "three keys", torch.tensor([i32.min + 1, 5, i32.max], dtype=torch.int32)
    yield "steps with gaps", (torch.arange(256) // 16 * (1 << 20)).to(torch.int32)
    yield "two values far apart", torch.where(torch.rand(256, generator=g) < 0.3, 1 << 30, -(1 << 30)).to(torch.int32)
    yield "ties at the largest key", torch.where(torch.arange(256) % 3 == 0, i32.max, torch.arange(256)).to(torch.int32)


@pytest.mark.parametrize("bisect_after,span", [
    (0, TC.SEARCH_SPAN), (1, TC.SEARCH_SPAN), (TC.SEARCH_BISECT_AFTER, 0), (TC.SEARCH_BISECT_AFTER, TC.SEARCH_SPAN),
    (TC.SEARCH_BISECT_AFTER, 1 << 40)])
@pytest.mark.parametrize("snap", [False, True])
def test_select_search_meets_the_bit_searchs_contract(bisect_after, span, snap):
    # kth_key's x: at least `need` keys >= x, and exactly `need` of them unless x is the
    # need-th largest key itself (the select's gt/eq split relies on it), on shapes that slow
    # regula falsi down (outliers, clusters, ties), from a lower bound at or below the least
    # key, with the bisection taking over early, always, or only after the count limit
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for name, keys in _key_cases():
        n = keys.numel()
        ordered = keys.sort(descending=True).values
        for need in sorted(x for x in {1, 2, n // 3, n // 2, n - 1, n} if 1 <= x <= n):
            for below in (0, 1000):
                _kth_key_probe[(1,)](keys.to(DEVICE), out, n, need, below, TILE=256, BISECT_AFTER=bisect_after,
                                     SPAN=span, SNAP=snap)
                x = int(out.item())
                above = int((keys >= x).sum())
                assert above >= need and (above == need or x == int(ordered[need - 1])), (name, need, below, x, above)



@triton.jit
def _search_tie_probe(keys_ptr, out_ptr, n, need, lo, stop, TILE: tl.constexpr, LOW_BIT: tl.constexpr,
                      TIE_BIT: tl.constexpr):
    i = tl.arange(0, TILE)
    keys = tl.load(keys_ptr + i, mask=i < n, other=-2147483648)
    x, exact = TK._search_tie(keys, need, lo, 2147483647, stop, LOW_BIT, TIE_BIT)
    tl.store(out_ptr, x)
    tl.store(out_ptr + 1, exact)
    tl.store(out_ptr + 2, TK._search(keys, need, lo, 2147483647, stop, LOW_BIT))


@pytest.mark.parametrize("low_bit,tie_bit", [(0, 12), (0, 20), (8, 20), (8, 31), (16, 24)])
def test_the_tie_search_finds_the_bit_searchs_key_and_flags_only_the_exact_rank(low_bit, tie_bit):
    # _search_tie's key is _search's, but for a tie it found, which is the need-th largest key
    # whole (with LOW_BIT 0, _search's too); ties are found where many keys equal the rank's.
    # From the whole range, and from a lower bound `lo` at a key with at least `need` keys at
    # or above it (as the row kernel's second search starts from its first's key)
    out = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    found_tie = 0
    cases = list(_key_cases())
    # lo's leading bits shared with the whole range's top above TIE_BIT, the first stage no count
    cases.append(("a bound among large keys", _host_skey(torch.tensor([3.0, 3.5, 4.0]))))
    for name, keys in cases:
        n = keys.numel()
        ordered = keys.sort(descending=True).values
        for need in sorted(x for x in {1, 2, n // 3, n // 2, n - 1, n} if 1 <= x <= n):
            for lo in {-2147483648, int(ordered[min(n - 1, need + n // 4)]), int(ordered[need - 1])}:
                for stop in (need, need + need // 32 + 1, 2 * need, need + 1):
                    _search_tie_probe[(1,)](keys.to(DEVICE), out, n, need, lo, stop, TILE=256, LOW_BIT=low_bit,
                                            TIE_BIT=tie_bit)
                    x, exact, full = (int(v) for v in out.cpu())
                    if exact:
                        found_tie += 1
                        # (more than stop keys at or above it: a rank the slack cannot end early)
                        assert x == int(ordered[need - 1]) and int((keys >= x).sum()) > stop, (name, need)
                        # _search's key: the same, or below LOW_BIT the same key with those bits 0
                        assert x == full or (low_bit and full == x & -(1 << low_bit)), (name, need, lo, stop, x, full)
                    else:
                        assert x == full, (name, need, lo, stop, x, full)
    # ("one value", "few values", "two values far apart", ties at the largest key)
    assert found_tie >= 8, found_tie


# the fallback path at toy sizes: every row longer than the 64-slot tile takes it; those of at
# least 300 keys are split into slices of 256 keys (a program each), the shorter ones are
# selected by one program in the select launch
SPLIT_FALLBACK = dict(tile=64, sample_min=1 << 30, fallback_split=300, fallback_slice=256, cap=4096)


def _check_all_stats(logits, masked, starts, lengths, topk, **kw):
    # _check with every stats entry (the path counters, rows retried, split, seeded)
    rows = logits.shape[0]
    got = torch.full((rows, topk), 99999, dtype=torch.int32, device=DEVICE)
    stats = torch.zeros(TC.STAT_SEEDED + 1, dtype=torch.int32, device=DEVICE)
    T.ragged_topk(logits, starts.to(DEVICE), lengths.to(DEVICE), topk, got, stats=stats, config=_cfg(**kw))
    want = torch.empty(rows, topk, dtype=torch.int32)
    row_topk(masked, starts, lengths, topk, want)
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)
    stats = stats.cpu().tolist()
    assert sum(stats[:4]) == rows
    return stats


def _check_split(logits, masked, starts, lengths, topk, **kw):
    # returns (the four path counters, rows split)
    stats = _check_all_stats(logits, masked, starts, lengths, topk, **kw)
    return stats[:4], stats[TC.STAT_SPLIT]


# the split fallback's buffer: none (every digit pass, then the two write passes), 16 keys (a
# row moves to it after a few digits, or never where its k-th key is tied more often) and the
# default (most rows of these tests fit it after their first digit)
BUFFERS = [0, 16, TC.FALLBACK_BUFFER]


# the split fallback's passes over slices of several steps, 1 to 3 steps' loads in flight;
# 512-key steps, where NVIDIA GPUs count digits and place indices by warp ballots
# (fallback_ballot), and the same turned off
STEPS = [dict(), dict(fallback_slice=512, fallback_block=128, fallback_prefetch=1),
         dict(fallback_slice=512, fallback_block=128, fallback_prefetch=2),
         dict(fallback_slice=512, fallback_block=128, fallback_prefetch=3),
         dict(fallback_slice=1024, fallback_block=512),
         dict(fallback_slice=1024, fallback_block=512, fallback_ballot=False)]


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("quantize", [None, 4.0, 0.25])
def test_split_fallback_selects_the_torch_set(quantize, buffer, steps):
    # ragged windows, an empty row and one of exactly k keys; rows below and above the split
    # length; ties at the k-th key spanning slices (quantize 0.25: almost every key tied)
    topk = 40
    logits, masked, starts, lengths = _case(10, 1500, topk, seed=11, quantize=quantize, pad=3, min_length=100)
    paths, split = _check_split(logits, masked, starts, lengths, topk, **dict(SPLIT_FALLBACK, **steps),
                                fallback_buffer=buffer)
    assert paths[TC.STAT_PLAIN] == int((lengths > topk).sum()), paths
    assert split == int((lengths >= 300).sum()) and split >= 5, (split, lengths)


@pytest.mark.parametrize("steps", [STEPS[0], STEPS[3], STEPS[4]])
@pytest.mark.parametrize("buffer", BUFFERS)
@pytest.mark.parametrize("dist", LOGIT_DISTRIBUTIONS)
def test_split_fallback_selects_the_torch_set_on_every_distribution(dist, buffer, steps):
    # ties across the whole row (equal, few distinct, flat with outliers, ReLU zeros), ramps,
    # NaN-free extremes: digit histograms of one bin, k-th keys tied across every slice
    rows, n, topk = 3, 2000, 64
    logits = logits_like(dist, rows, n, seed=5)
    starts = torch.tensor([0, 7, 300])
    lengths = torch.tensor([n, n - 7, 1200])
    col = torch.arange(n)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, logits, float("-inf"))
    paths, split = _check_split(logits.to(DEVICE), masked, starts, lengths, topk, **dict(SPLIT_FALLBACK, **steps),
                                fallback_buffer=buffer)
    assert split == rows, (paths, split)


@pytest.mark.parametrize("items", [1, 2])
@pytest.mark.parametrize("buffer", [0, TC.FALLBACK_BUFFER])
def test_split_fallback_merges_slices_into_items(buffer, items):
    # 3 rows of 8 slices and 4 programs: items of 4 slices (items=1) or 2 (items=2), every
    # distribution, ties at the k-th key spanning the merged slices
    rows, n, topk = 3, 2000, 64
    for dist in LOGIT_DISTRIBUTIONS:
        logits = logits_like(dist, rows, n, seed=6)
        starts = torch.tensor([0, 5, 301])
        lengths = torch.tensor([n, n - 5, 1400])
        col = torch.arange(n)
        inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
        masked = torch.where(inside, logits, float("-inf"))
        paths, split = _check_split(logits.to(DEVICE), masked, starts, lengths, topk, **SPLIT_FALLBACK,
                                    fallback_buffer=buffer, fallback_items=items)
        assert split == rows, (dist, paths, split)


@pytest.mark.parametrize("steps", [STEPS[0], STEPS[4]])
@pytest.mark.parametrize("buffer", BUFFERS)
def test_split_fallback_orders_special_values_like_floats(buffer, steps):
    # NaNs above everything, signed zeros tied, infinities and subnormals, both signs
    tiny = torch.finfo(torch.float32).tiny
    special = torch.tensor([0.0, -0.0, float("-inf"), float("inf"), float("nan"), 3e38, -3e38, tiny / 4, -tiny / 4,
                            1.0, -1.0])
    g = torch.Generator().manual_seed(4)
    vals = special[torch.randint(0, special.numel(), (3, 1100), generator=g)]
    starts = torch.tensor([0, 9, 100])
    lengths = torch.tensor([1100, 1000, 700])
    col = torch.arange(1100)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    masked = torch.where(inside, vals, float("-inf"))
    paths, split = _check_split(vals.to(DEVICE), masked, starts, lengths, 200, **dict(SPLIT_FALLBACK, **steps),
                                fallback_buffer=buffer)
    assert split == 3, (paths, split)


@pytest.mark.parametrize("items", [0, 1, 3])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("steps", [STEPS[0], STEPS[1], STEPS[4]])
def test_split_fallback_reads_rows_at_every_alignment(steps, tied, items):
    # the passes load a row by 16-byte runs from the run holding its first key: rows starting
    # at each of the four positions of a run (a view whose data starts one float past a
    # 16-byte boundary, rows 1023 keys apart), the keys around each window (read with its
    # first and last runs, never counted) larger than every key inside, and rows as long as
    # the block, whose last run ends up to three keys past the slices' span (1024 keys)
    width, rows, topk = 1023, 8, 100
    g = torch.Generator().manual_seed(5)
    big = torch.full((rows * width + 8,), 1e30)
    vals = big[1:1 + rows * width].view(rows, width)
    inner = torch.randn(rows, width, generator=g)
    if tied:
        inner = (inner * 2).round() / 2  # ties at the k-th key across slices
    starts = torch.tensor([0, 2, 0, 4, 1, 0, 2, 3])
    lengths = torch.tensor([width - 3, width - 6, width, width - 9, width - 2, width - 4, width - 2, width - 3])
    col = torch.arange(width)
    inside = (col[None] >= starts[:, None]) & (col[None] < (starts + lengths)[:, None])
    vals[inside] = inner[inside]
    if DEVICE != "cpu":
        big = big.to(DEVICE)
        vals = big[1:1 + rows * width].view(rows, width)
    first = (vals.data_ptr() // 4 + torch.arange(rows) * width + starts) % 4
    # (items: slices merged into items where enough rows are queued, 4 programs here)
    cfg = dict(SPLIT_FALLBACK, **steps, fallback_items=items)
    span = -(-width // cfg["fallback_slice"]) * cfg["fallback_slice"]
    assert set(first.tolist()) == {0, 1, 2, 3} and bool((lengths + first > span).any()), (first, span)
    masked = torch.where(inside, vals.cpu(), float("-inf"))
    paths, split = _check_split(vals, masked, starts, lengths, topk, **cfg)
    assert split == rows, (paths, split)


@pytest.mark.parametrize("buffer", [0, 64])
@pytest.mark.parametrize("slices", [1, 4])
def test_overflowing_rows_take_the_split_fallback(slices, buffer):
    # 6144 large keys where the sample does not look overflow the lists (4 of 1024 slots, or
    # a split row's one of 4096): the rows leave the sampled path for the split fallback,
    # which must not lose keys
    topk = 16
    vals, starts, lengths = _hidden_large_keys(8192, 0, 6144, seed=9)
    paths, split = _check_split(vals.to(DEVICE), vals, starts, lengths, topk, cap=4096, slices=slices,
                                fallback_split=1024, fallback_slice=512, fallback_buffer=buffer, **SMALL_SAMPLE)
    assert paths[TC.STAT_PLAIN] == 2 and split == 2, (paths, split)


def _check_seeded(logits, masked, starts, lengths, topk, **kw):
    # returns (rows split, rows of them seeded by the filter)
    stats = _check_all_stats(logits, masked, starts, lengths, topk, **kw)
    return stats[TC.STAT_SPLIT], stats[TC.STAT_SEEDED]


@pytest.mark.parametrize("steps", [STEPS[0], STEPS[4]])
@pytest.mark.parametrize("buffer", [0, 64, TC.FALLBACK_BUFFER])
@pytest.mark.parametrize("large", ["spread", "tied", "few"])
@pytest.mark.parametrize("slices", [1, 4])
def test_overflowing_rows_start_the_split_fallback_from_the_filters_histogram(slices, large, buffer, steps):
    # 6144 large keys where the sample does not look overflow the lists; the filter counts
    # the ones left out into its histogram and the select the listed ones, so the split
    # fallback starts from the bin holding the k-th key: into the buffer where the bin fits
    # (spread values 5-6, 1/32 of a binade a bin: about 770 keys), else the next digit below
    # it; all of them tied (5.0), or 4 distinct values, end as tied rows do. The same sets
    # with the histogram off
    topk = 16
    g = torch.Generator().manual_seed(21)
    vals, starts, lengths = _hidden_large_keys(8192, 0, 6144, seed=9)
    hidden = _unseen(8192, 0, 6144)
    if large == "tied":
        vals[:, hidden] = 5.0
    elif large == "few":
        vals[:, hidden] = 5.0 + torch.randint(0, 4, (6144,), generator=g).float() / 4
    kw = dict(cap=4096, slices=slices, fallback_split=1024, fallback_buffer=buffer, **SMALL_SAMPLE, **steps)
    assert _check_seeded(vals.to(DEVICE), vals, starts, lengths, topk, fallback_seed=True, **kw) == (2, 2)
    assert _check_seeded(vals.to(DEVICE), vals, starts, lengths, topk, fallback_seed=False, **kw) == (2, 0)


def test_rows_whose_kth_key_is_in_the_thresholds_block_start_the_fallback_unseeded():
    # the sampled keys (keys 0-7 of every 32 under SMALL_SAMPLE) hold 64 of 5.09 and -1.0
    # elsewhere, so the threshold is 5.09 (low bits cleared); the 6144 keys of 5.1 where the
    # sample does not look overflow the lists but share the threshold's block of keys (1/32
    # of a binade), which the threshold cuts: the histogram gives no bits, and the rows take
    # the whole split fallback (the same set)
    topk = 16
    n = 8192
    col = torch.arange(n)
    vals = torch.full((2, n), -1.0)
    vals[:, col[col % 32 < 8][:64]] = 5.09
    vals[:, _unseen(n, 0, 6144)] = 5.1
    starts, lengths = torch.zeros(2, dtype=torch.int64), torch.full((2,), n, dtype=torch.int64)
    kw = dict(cap=4096, slices=1, fallback_split=1024, fallback_buffer=64, fallback_seed=True, **SMALL_SAMPLE)
    assert _check_seeded(vals.to(DEVICE), vals, starts, lengths, topk, **kw) == (2, 0)


def test_a_narrow_scratch_keeps_fallback_rows_in_the_select_launch():
    # 2 * cap int32 slots cannot hold the split fallback's histograms: no launch is planned and
    # the select launch serves the rows (the same set)
    logits, masked, starts, lengths = _case(4, 800, 16, seed=2, min_length=400)
    paths, split = _check_split(logits, masked, starts, lengths, 16, **dict(SPLIT_FALLBACK, cap=64))
    assert paths[TC.STAT_PLAIN] == int((lengths > 16).sum()) and split == 0, (paths, split)


def _periodic_rows(n, period, lo, hi, seed):
    # three normal rows of n keys with the keys at offsets [lo, hi) of every `period` raised
    # by 10 (whole-row windows)
    col = torch.arange(n)
    vals = torch.randn(3, n, generator=torch.Generator().manual_seed(seed))
    vals[:, (col % period >= lo) & (col % period < hi)] += 10.0
    return vals, torch.zeros(3, dtype=torch.int64), torch.full((3,), n, dtype=torch.int64)


@pytest.mark.parametrize("slices", [1, 4])
def test_jittered_runs_sample_a_structure_with_their_period(slices):
    # SMALL_SAMPLE's runs read keys 0-7 of every 32 (rows of 2048 keys); large keys at 16-23 of
    # every 32 are never sampled, so the threshold lets all 512 through and the lists (64
    # slots a warp, or a split row's 256) overflow into the fallback path. Runs jittered within
    # their windows see them in proportion: the rows keep the sampled path. Same sets both ways
    topk = 16
    vals, starts, lengths = _periodic_rows(2048, 32, 16, 24, seed=12)
    kw = dict(SMALL_SAMPLE, cap=256, slices=slices, fallback_split=0)
    assert _check(vals.to(DEVICE), vals, starts, lengths, topk, **kw)[TC.STAT_PLAIN] == 3
    assert _check(vals.to(DEVICE), vals, starts, lengths, topk, sample_jitter=True, **kw)[TC.STAT_SAMPLED] == 3


def test_dealt_blocks_spread_a_periodic_structure_over_every_warps_list():
    # large keys at columns 264-271 of every 512-key filter block: one warp's share of the
    # block in either layout (a 2-D block's third row of 128; under the ballot, the 32-key
    # group 256-287 of warp 0), and never sampled (SMALL_SAMPLE's runs read keys 0-7 of every
    # 32), so all 64 of a row pass with the threshold's keys and overflow that warp's 64 slots
    # into the fallback path. Dealt, each list takes about a quarter: the sampled path. Same
    # sets both ways
    topk = 48
    vals, starts, lengths = _periodic_rows(4096, 512, 264, 272, seed=3)
    kw = dict(SMALL_SAMPLE, cap=256, num_warps=4, filter_block=512, slices=1, fallback_split=0)
    assert _check(vals.to(DEVICE), vals, starts, lengths, topk, **kw)[TC.STAT_PLAIN] == 3
    assert _check(vals.to(DEVICE), vals, starts, lengths, topk, filter_deal=True, **kw)[TC.STAT_SAMPLED] == 3


@pytest.mark.parametrize("steps", [STEPS[0], STEPS[4]])
@pytest.mark.parametrize("top", [16, 17])
def test_split_fallback_buffer_takes_a_bin_of_exactly_its_size(top, steps):
    # `top` keys in [2, 3) over slices of a row whose other keys lie in (-2, 2): the k-th
    # key's first digit (sign and top exponent bits) leaves exactly `top` candidates. A
    # 16-key buffer takes 16 of them after that digit; 17 go on to the next digits (a buffer
    # filled one past its end would lose the largest, in the last column)
    n, topk = 2000, 8
    g = torch.Generator().manual_seed(top)
    vals = (torch.randn(2, n, generator=g) * 0.3).clamp(-1.9, 1.9)
    cols = 50 + 110 * torch.arange(top)
    vals[:, cols] = 2.0 + 0.01 * torch.arange(top, dtype=torch.float32)
    starts = torch.zeros(2, dtype=torch.int64)
    lengths = torch.full((2,), n, dtype=torch.int64)
    paths, split = _check_split(vals.to(DEVICE), vals, starts, lengths, topk, **dict(SPLIT_FALLBACK, **steps),
                                fallback_buffer=16)
    assert split == 2, (paths, split)


def test_split_fallback_ballots_are_planned_where_they_can_run(monkeypatch):
    # fallback_ballot=None takes the ballots on NVIDIA with steps and slices of a multiple of
    # 512 keys (four a thread), and not elsewhere; True where they cannot run is refused
    # naming the field; False keeps tl.histogram (a CPU device stands for the GPU in the plan)
    plan = TC.plan_launches.__wrapped__
    cpu = torch.device("cpu")
    base = dataclasses.replace(TC.DEFAULT_CONFIG, fallback_split=32768)
    assert not plan(cpu, base, 2048, 1 << 20, 1, False).fallback["WB"]
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    assert plan(cpu, base, 2048, 1 << 20, 1, False).fallback["WB"]
    assert not plan(cpu, dataclasses.replace(base, fallback_ballot=False), 2048, 1 << 20, 1, False).fallback["WB"]
    for narrow in (dict(fallback_block=256), dict(fallback_slice=256, fallback_block=256)):
        assert not plan(cpu, dataclasses.replace(base, **narrow), 2048, 1 << 20, 1, False).fallback["WB"]
        with pytest.raises(ValueError, match="fallback_ballot"):
            plan(cpu, dataclasses.replace(base, fallback_ballot=True, **narrow), 2048, 1 << 20, 1, False)
    # the register cap reaches the launch
    assert plan(cpu, dataclasses.replace(base, fallback_maxnreg=64), 2048, 1 << 20, 1, False).fallback["maxnreg"] == 64


def test_the_filters_counts_start_the_fallback_by_default_where_every_filter_program_fits(monkeypatch):
    # fallback_seed=None: on NVIDIA with the sm90 config, on while the filter's rows * slices
    # programs all fit the SMs at its seeded register cap (48: ten 4-warp programs an SM, so
    # 1,320 on 132 SMs), off past that and off the GPU; True/False as given. The seeded
    # filter takes the seeded cap unless a filter cap is set (a CPU device stands for the GPU)
    cpu = torch.device("cpu")
    sm90 = TC.CONFIGS["sm90"]
    assert sm90.fallback_seed is None and sm90.seeded_filter_maxnreg == 48
    assert not TC.seeds_fallback(cpu, sm90, 1024, 1)
    assert TC.seeds_fallback(cpu, dataclasses.replace(sm90, fallback_seed=True), 8192, 1)
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    monkeypatch.setattr(TC, "_sm_count", lambda device: 132)
    assert TC.seeds_fallback(cpu, sm90, 1320, 1) and TC.seeds_fallback(cpu, sm90, 128, 8)
    assert not TC.seeds_fallback(cpu, sm90, 1321, 1) and not TC.seeds_fallback(cpu, sm90, 8192, 1)
    assert not TC.seeds_fallback(cpu, sm90, 200, 8)
    assert not TC.seeds_fallback(cpu, dataclasses.replace(sm90, fallback_seed=False), 16, 1)
    # no seeded cap (None or 0), a cap of the filter's own or no streaming cap (then the seeded
    # one would not apply), a filter that does more than stream, a select in the filter: off
    for other in (dict(seeded_filter_maxnreg=None), dict(seeded_filter_maxnreg=0), dict(filter_maxnreg=32),
                  dict(streaming_filter_maxnreg=None), dict(presample=None), dict(presample=False),
                  dict(fused=True, presample=False)):
        assert not TC.seeds_fallback(cpu, dataclasses.replace(sm90, **other), 16, 1), other
    # a lower cap fits more programs an SM (64 at 32 registers, capped by programs_per_sm)
    assert TC.seeds_fallback(cpu, dataclasses.replace(sm90, seeded_filter_maxnreg=32), 132 * 16, 1)
    plan = TC.plan_launches.__wrapped__
    for seed, cap, want in ((True, None, 48), (False, None, 32), (True, 40, 40), (None, None, 32)):
        config = dataclasses.replace(sm90, fallback_seed=seed, filter_maxnreg=cap)
        filter_kw = plan(cpu, config, 2048, 1 << 17, 1, False)[4]
        assert filter_kw["maxnreg"] == want and filter_kw["HIST"] == bool(seed), (seed, cap, filter_kw)
    # RaggedTopk keeps the resolved value (off the GPU: off); anything but a bool or None is refused
    monkeypatch.undo()
    lengths = torch.full((4,), 100, dtype=torch.int64)
    run = T.RaggedTopk(cpu, 4, 100, torch.zeros(4, dtype=torch.int64), lengths, 16)
    assert run.config.fallback_seed is False and not run.plan[4]["HIST"]
    with pytest.raises(ValueError, match="fallback_seed"):
        TC.TopkConfig(fallback_seed=1)


def test_the_budget_holds_the_lists_split_rows_stage(monkeypatch):
    # split_stage: each (row, slice) program stages cap slots and a count a warp past the
    # scratch's other parts; the chunk budget's bound (split_stage_bytes) holds them wherever
    # auto_slices splits rows on an sm90 GPU of 132 SMs with it on, and is 0 where it does not
    # or with it off (the default)
    cpu = torch.device("cpu")
    for stage in (False, True):
        cfg = dataclasses.replace(TC.DEFAULT_CONFIG, cap=4096, slices=4, split_stage=stage)
        run = T.RaggedTopk(cpu, 3, 6000, torch.zeros(3, dtype=torch.int64), torch.full((3,), 6000), 24, config=cfg)
        if not stage:
            plain = run.scratch_numel
    assert run.scratch_numel - plain == 3 * 4 * (4096 + cfg.num_warps)
    monkeypatch.setattr(TC, "_sm_count", lambda device: 132)
    monkeypatch.setattr(TC, "_arch", lambda device: "sm90")
    gpu = torch.device("cuda", 0)
    sm90 = TC.CONFIGS["sm90"]
    assert TC.launch_config(gpu) is sm90 and not sm90.split_stage
    # off by default: nothing staged
    assert int(TC.split_stage_bytes(gpu, 2048, torch.tensor([16]), torch.tensor([1 << 21]))) == 0
    sm90 = dataclasses.replace(sm90, split_stage=True)
    monkeypatch.setattr(TC, "launch_config", lambda device: sm90)
    cap = TC.default_cap(2048)
    for rows in (1, 16, 128, 264, 265, 1024):
        for n in (16384, 32767, 32768, 1 << 17, 1 << 21):
            got = int(TC.split_stage_bytes(gpu, 2048, torch.tensor([rows]), torch.tensor([n])))
            slices = TC.auto_slices(gpu, rows, n, sm90.programs_per_sm)
            staged = rows * slices * (cap + sm90.num_warps) * 8 if slices > 1 else 0
            assert staged <= got and (got == 0) == (slices == 1), (rows, n, slices, got)


def test_split_fallback_plans_only_what_its_scratch_and_offsets_hold():
    # no launch: turned off, blocks narrower than the split length, a cap too small for one
    # slice's state, rows whose slice ends would wrap int32; else its state and buffer fit
    # 2 * cap slots
    assert TC.fallback_launch(2048, 8192, 1 << 20, 0, 16384) is None
    assert TC.fallback_launch(2048, 8192, 30000, 32768, 16384) is None
    assert TC.fallback_launch(16, 64, 1 << 20, 32768, 16384) is None
    assert TC.fallback_launch(2048, 8192, (1 << 31) - 8192, 32768, 16384) is None
    for cap, n in ((8192, 1 << 21), (8192, 1 << 28), (256, 1 << 20), (1 << 20, 1 << 30)):
        kw = TC.fallback_launch(2048, cap, n, 32768, 16384)
        assert kw["NS"] * kw["SLICE"] >= n and kw["NSP"] >= kw["NS"]
        # the buffer's int64s start on an even slot past the state and end inside the region
        assert kw["BOFF"] % 2 == 0 and kw["BOFF"] >= TC.FALLBACK_STATE + kw["NSP"] + 32 * kw["NS"], (cap, n, kw)
        assert kw["BOFF"] + 2 * kw["BUF"] <= 2 * cap, (cap, n, kw)
        assert kw["BUF"] == 0 or (kw["BUF"] & (kw["BUF"] - 1) == 0 and 16 <= kw["BUF"] <= TC.FALLBACK_BUFFER)
    # the whole buffer where it fits; less where the slices' state leaves less; none if asked
    assert TC.fallback_launch(2048, 8192, 1 << 20, 32768, 16384)["BUF"] == TC.FALLBACK_BUFFER
    assert TC.fallback_launch(2048, 8192, 1 << 21, 32768, 16384)["BUF"] == TC.FALLBACK_BUFFER
    assert TC.fallback_launch(2048, 256, 1 << 20, 32768, 16384)["BUF"] == 64
    assert TC.fallback_launch(2048, 8192, 1 << 20, 32768, 16384, buffer=0)["BUF"] == 0


def test_ragged_topk_object_takes_a_device_named_without_its_index():
    # RaggedTopk("cuda", ...) with the bounds on the current GPU (cuda:N): the device is the
    # bounds' device, and the object selects the torch path's sets
    name = "cuda" if DEVICE == "cuda" else "cpu"
    logits, masked, starts, lengths = _case(6, 700, 24, seed=5, min_length=100)
    starts, lengths = starts.to(DEVICE), lengths.to(DEVICE)
    run = T.RaggedTopk(name, 6, 700, starts, lengths, 24, config=_cfg(cap=256, **SMALL_SAMPLE))
    assert run.device == starts.device
    got = torch.empty(6, 24, dtype=torch.int32, device=DEVICE)
    run(logits, got)
    want = torch.empty(6, 24, dtype=torch.int32)
    row_topk(masked, starts.cpu(), lengths.cpu(), 24, want)
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)


def test_ragged_topk_object_reads_its_row_vectors_in_place_and_refuses_what_it_would_copy():
    logits, masked, starts, lengths = _case(6, 700, 24, seed=6, min_length=100)
    starts, lengths, logits = starts.to(DEVICE), lengths.to(DEVICE), logits.to(DEVICE)
    config = _cfg(cap=256, **SMALL_SAMPLE)
    # a copy would not see a refresh: a strided view and an int16 vector are refused, named
    for name, bad in (("starts_rel", torch.stack((starts, starts), 1)[:, 0]), ("lengths", lengths.to(torch.int16))):
        args = {"starts_rel": starts, "lengths": lengths, name: bad}
        with pytest.raises(ValueError, match=f"{name} must be a contiguous int32 or int64"):
            T.RaggedTopk(DEVICE, 6, 700, args["starts_rel"], args["lengths"], 24, config=config)
    # what can be read in place is taken: a contiguous [rows, 1] column, a one-entry view
    T.RaggedTopk(DEVICE, 6, 700, starts[:, None], lengths, 24, config=config)
    T.RaggedTopk(DEVICE, 1, 700, starts[:2:2], lengths[:1], 24, config=config)
    # the one-shot call converts them
    got = torch.empty(6, 24, dtype=torch.int32, device=DEVICE)
    T.ragged_topk(logits, torch.stack((starts, starts), 1)[:, 0], lengths.to(torch.int16), 24, got, config=config)
    want = torch.empty(6, 24, dtype=torch.int32)
    row_topk(masked, starts.cpu(), lengths.cpu(), 24, want)
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)
    # the object follows windows refreshed in place
    run = T.RaggedTopk(DEVICE, 6, 700, starts, lengths, 24, config=config)
    lengths.copy_((lengths - 50).clamp(min=0))
    run(logits, got)
    row_topk(masked, starts.cpu(), lengths.cpu(), 24, want, sync_free=True)  # reads only the new windows
    assert torch.equal(got.cpu().sort(1).values, want.sort(1).values)


def test_launches_wait_for_the_one_before_only_where_the_device_has_programmatic_dependent_launch():
    # a CPU (or AMD) device plans no PDL and refuses pdl=True before any kernel runs, naming it
    cpu = torch.device("cpu")
    plan = TC.plan_launches(cpu, TC.DEFAULT_CONFIG, 256, 40000, 4, False)
    kws = [plan.sample, plan.filter, plan.retry, plan.fallback, *(kw for _, kw in plan.selects)]
    assert all(kw["PDL"] is False and "launch_pdl" not in kw for kw in kws)
    assert not TC.pdl_supported(cpu)
    with pytest.raises(ValueError, match="pdl=True"):
        TC.plan_launches(cpu, dataclasses.replace(TC.DEFAULT_CONFIG, pdl=True), 256, 40000, 4, False)
    logits = torch.randn(2, 600)
    out = torch.full((2, 16), 7, dtype=torch.int32)
    with pytest.raises(ValueError, match="pdl=True"):
        T.ragged_topk(logits, torch.zeros(2, dtype=torch.int64), torch.full((2,), 600), 16, out,
                      config=dataclasses.replace(TC.DEFAULT_CONFIG, pdl=True))
    assert (out == 7).all()


@pytest.mark.parametrize("field,bad", [("pdl", 1), ("pdl", "yes"), ("sample_warps", 3),
                                       ("sample_warps", 32), ("sample_warps", 0)])
def test_a_bad_launch_field_is_refused(field, bad):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TC.DEFAULT_CONFIG, **{field: bad})


def test_the_sample_kernel_gives_split_rows_more_threads():
    # 32 sampled keys a thread for whole rows, 16 for split rows (few rows: the search's chain
    # of reductions is their sample's time), at most 16 warps; a given sample_warps stands
    cpu = torch.device("cpu")
    config = dataclasses.replace(TC.DEFAULT_CONFIG, presample=True)
    warps = {(n, sl): TC.plan_launches(cpu, config, 2048, n, sl, False).sample["num_warps"]
             for n, sl in ((65536, 1), (65536, 4), (131072, 1), (131072, 8), (1 << 20, 8))}
    assert warps == {(65536, 1): 2, (65536, 4): 4, (131072, 1): 4, (131072, 8): 8, (1 << 20, 8): 16}
    fixed = dataclasses.replace(config, sample_warps=2)
    assert TC.plan_launches(cpu, fixed, 2048, 131072, 8, False).sample["num_warps"] == 2


@pytest.mark.cuda
@pytest.mark.parametrize("dist", ["gaussian", "equal", "few_distinct", "stripes"])
def test_programmatic_dependent_launch_selects_the_same_table_eagerly_and_from_a_graph(dist):
    # where the GPU has PDL the shipped config launches with it: every way (PDL on and off,
    # on with the filter's L2 prefetch; whole rows and split rows; eagerly and replayed from a
    # CUDA graph) writes the torch path's sets, also for a call queued right behind another
    # (whose scratch it reuses)
    dev = torch.device("cuda")
    if not TC.pdl_supported(dev):
        pytest.skip("this GPU or Triton has no programmatic dependent launch")
    for rows, n in ((64, 65536), (600, 20000)):
        first = logits_like("ascending", rows, n, seed=1).to(dev)
        logits = logits_like(dist, rows, n, seed=rows).to(dev)
        starts = torch.zeros(rows, dtype=torch.int64, device=dev)
        lengths = torch.arange(n - rows + 1, n + 1, device=dev)
        want = torch.empty(rows, 2048, dtype=torch.int32, device=dev)
        row_topk(logits, starts, lengths, 2048, want)
        want = want.sort(1).values
        shipped = T.RaggedTopk(dev, rows, n, starts, lengths, 2048)
        assert shipped.plan.filter["PDL"] is True and shipped.plan.filter["launch_pdl"]
        off = T.RaggedTopk(dev, rows, n, starts, lengths, 2048,
                           config=dataclasses.replace(TC.launch_config(dev), pdl=False))
        assert off.plan.filter["PDL"] is False and "launch_pdl" not in off.plan.filter
        warm = T.RaggedTopk(dev, rows, n, starts, lengths, 2048,
                            config=dataclasses.replace(TC.launch_config(dev), filter_l2_prefetch=0.5))
        assert warm.plan.filter["PFK"] > 0 and warm.plan.filter["PFS"] * warm.plan.filter["SL"] <= n
        ways = [shipped, off, warm]
        for run in ways:
            got = torch.full((rows, 2048), 7, dtype=torch.int32, device=dev)
            earlier = torch.empty_like(got)
            run(first, earlier)
            run(logits, got)
            assert torch.equal(got.sort(1).values, want)
            x = first.clone()
            got.fill_(7)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(x, got)
            graph.replay()
            x.copy_(logits)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(got.sort(1).values, want)


def test_the_l2_prefetch_stays_inside_the_block_and_the_budget():
    # keys a filter program prefetches before its wait: a power of two within its share of
    # the L2 fraction, at least a line a thread, never past its slice's room (slices * PFS <=
    # n); nothing without PDL behind the sample kernel
    cpu = torch.device("cpu")
    base = dataclasses.replace(TC.DEFAULT_CONFIG, presample=True, filter_l2_prefetch=0.5)
    plan = TC.plan_launches(cpu, base, 2048, 131072, 8, False)
    assert plan.filter["PFK"] == 0 and plan.filter["PDL"] is False
    assert TC.l2_prefetch_keys(base, plan, 128, 131072, 1024, 50 << 20) == (0, 0)
    with_pdl = plan._replace(filter=TC.LaunchKw(plan.filter, PDL=True))
    # 25 MiB over 1024 programs: 6400 keys, so 4096; slices of 16384 keys
    assert TC.l2_prefetch_keys(base, with_pdl, 128, 131072, 1024, 50 << 20) == (4096, 16384)
    # a whole L2 over fewer programs: capped by the slice
    full = dataclasses.replace(base, filter_l2_prefetch=1.0)
    assert TC.l2_prefetch_keys(full, with_pdl, 16, 131072, 128, 50 << 20) == (16384, 16384)
    # under a line a thread: none
    assert TC.l2_prefetch_keys(base, with_pdl, 8192, 131072, 2112, 8 << 20) == (0, 0)
    for rows, n, programs, l2 in ((128, 131072, 1024, 50 << 20), (7, 100003, 56, 60 << 20), (3, 40000, 24, 1 << 30)):
        pfk, pfs = TC.l2_prefetch_keys(full, with_pdl, rows, n, programs, l2)
        assert pfk & (pfk - 1) == 0 and pfk <= pfs and 8 * pfs <= n
        assert pfk * 4 * min(programs, rows * 8) <= l2
    assert TC.l2_prefetch_keys(dataclasses.replace(base, filter_l2_prefetch=0.0), with_pdl, 128, 131072, 1024,
                               50 << 20) == (0, 0)
    assert TC.l2_prefetch_keys(base, with_pdl._replace(sample=None), 128, 131072, 1024, 50 << 20) == (0, 0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", None])
def test_a_bad_l2_prefetch_fraction_is_refused(bad):
    with pytest.raises(ValueError, match="filter_l2_prefetch"):
        dataclasses.replace(TC.DEFAULT_CONFIG, filter_l2_prefetch=bad)


@pytest.mark.parametrize("flag,want", [("0", False), ("1", True), (None, True)])
def test_indexer_topk_pdl_turns_the_launches_pdl_off_where_the_device_has_it(monkeypatch, flag, want):
    # a CPU device told it has PDL (the plan only): the flag decides an unset config.pdl; a
    # config that sets pdl is not overridden
    monkeypatch.setattr(TC, "pdl_supported", lambda device: True)
    monkeypatch.setattr(T, "pdl_supported", lambda device: True)
    if flag is None:
        monkeypatch.delenv("INDEXER_TOPK_PDL", raising=False)
    else:
        monkeypatch.setenv("INDEXER_TOPK_PDL", flag)
    starts, lengths = torch.zeros(4, dtype=torch.int64), torch.full((4,), 40000)
    run = T.RaggedTopk(torch.device("cpu"), 4, 40000, starts, lengths, 256,
                       config=dataclasses.replace(TC.DEFAULT_CONFIG, presample=True))
    assert run.config.pdl is want and run.plan.filter["PDL"] is want and ("launch_pdl" in run.plan.filter) is want
    fixed = T.RaggedTopk(torch.device("cpu"), 4, 40000, starts, lengths, 256,
                         config=dataclasses.replace(TC.DEFAULT_CONFIG, presample=True, pdl=False))
    assert fixed.config.pdl is False and fixed.plan.sample["PDL"] is False


def test_the_driver_version_is_asked_of_the_driver_library(monkeypatch, request):
    # cuDriverGetVersion through ctypes (torch has no call for it): its answer where the
    # library loads and answers, 0 where it fails or no library loads
    import ctypes

    request.addfinalizer(TC._driver_version.cache_clear)  # no fake version left cached

    class Lib:
        def __init__(self, rc, version):
            self.rc, self.version = rc, version

        def cuDriverGetVersion(self, ref):
            ref._obj.value = self.version
            return self.rc

    def loader(libs):
        def load(name):
            if name not in libs:
                raise OSError(name)
            return libs[name]
        return load

    class NoSymbol:
        pass

    class Raises:
        def cuDriverGetVersion(self, ref):
            raise ctypes.ArgumentError("bad argument")

    first, last = TC._LIBCUDA[0], TC._LIBCUDA[-1]
    cases = [({first: Lib(0, 12080)}, 12080), ({first: Lib(100, 12080)}, 0), ({first: NoSymbol()}, 0),
             ({first: Raises()}, 0), ({}, 0)]
    if last != first:
        # the next library name answers where the first is missing, not the driver's or fails
        cases += [({last: Lib(0, 13000)}, 13000), ({first: Lib(100, 12080), last: Lib(0, 13000)}, 13000),
                  ({first: NoSymbol(), last: Lib(0, 13000)}, 13000)]
    for libs, want in cases:
        monkeypatch.setattr(ctypes, "CDLL", loader(libs))
        TC._driver_version.cache_clear()
        assert TC._driver_version() == want, (libs, want)


def test_pdl_needs_a_driver_whose_graphs_keep_programmatic_edges(monkeypatch):
    # an sm90 GPU with Triton's launch_pdl, on drivers before and from CUDA 12.3
    monkeypatch.setattr(TC, "is_nvidia", lambda device: True)
    monkeypatch.setattr(TC, "_arch", lambda device: "sm90")
    monkeypatch.setattr(TC, "_triton_pdl", lambda: True)
    cuda = torch.device("cuda", 0)
    for driver, want in ((12020, False), (TC.PDL_MIN_DRIVER, True), (13000, True), (0, False)):
        monkeypatch.setattr(TC, "_driver_version", lambda driver=driver: driver)
        assert TC.pdl_supported(cuda) is want
    monkeypatch.setattr(TC, "_arch", lambda device: "sm89")
    assert TC.pdl_supported(cuda) is False
