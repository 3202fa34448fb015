"""A sharded step's exchange in waves: each wave's rows exchanged while the next computes."""

from __future__ import annotations

import pytest
import torch

import indexer
from indexer.launch import run_ranks
from indexer.partition import RowPlan, chunk_cuts, even_cuts, plan_rows, split_rows, wave_plans
from indexer.synthetic import make_inputs

from conftest import replicated_tables

TOPK = 16


def test_split_rows_cuts_a_ranks_rows_in_order():
    assert split_rows([(0, 4), (10, 12)], [3, 5]) == [[(0, 3)], [(3, 4), (10, 11)], [(11, 12)]]
    assert split_rows([(0, 4), (10, 12)], [0, 6]) == [[], [(0, 4), (10, 12)], []]
    assert split_rows([(5, 9)], []) == [[(5, 9)]]
    assert split_rows([], [0]) == [[], []]
    for bad in ([3, 2], [7], [-1]):
        with pytest.raises(ValueError, match="cuts"):
            split_rows([(0, 4), (10, 12)], bad)


def test_even_and_chunk_cuts():
    assert even_cuts(10, 4) == [2, 5, 7]
    assert even_cuts(3, 1) == []
    with pytest.raises(ValueError, match="waves"):
        even_cuts(3, 0)
    chunks = [(0, 3), (3, 7), (7, 8), (20, 25)]  # 3, 4, 1, 5 rows
    assert chunk_cuts(chunks, 1) == []
    assert chunk_cuts(chunks, 2) == [7]  # chunks 0-1 | 2-3
    assert chunk_cuts(chunks, 3) == [3, 7]  # chunk 0 | 1 | 2-3 (wave w from chunk 4 * w // 3)
    assert chunk_cuts(chunks, 4) == [3, 7, 8]
    with pytest.raises(ValueError, match="waves"):
        chunk_cuts(chunks, 5)


def test_wave_plans_keep_every_ranks_rows():
    plan = plan_rows(torch.zeros(10, dtype=torch.int64), torch.ones(10, dtype=torch.int64), 2, "fold")
    groups = [split_rows(plan.pieces[r], even_cuts(plan.rows_per_rank[r], 2)) for r in range(2)]
    waves = wave_plans(plan, groups)
    assert len(waves) == 2 and all(w.num_rows == 10 and w.world_size == 2 for w in waves)
    for r in range(2):
        rows = sorted(i for w in waves for a, b in w.pieces[r] for i in range(a, b))
        assert rows == sorted(i for a, b in plan.pieces[r] for i in range(a, b))
    with pytest.raises(ValueError, match="same number of waves"):
        wave_plans(plan, [groups[0], groups[1][:1]])
    with pytest.raises(ValueError, match="rank 1"):
        wave_plans(plan, [groups[0], [groups[1][0], [(0, 1)]]])


def _wave_exchange_rank(rank, world):
    # hand-made plans whose ranks hold equal rows in every wave (gloo cannot gather slices of
    # different sizes, so allgatherv runs here the code path NCCL runs); a wave's rows are
    # written only after the previous wave's exchange started, as a step computes them
    import torch.distributed as dist

    from indexer.collective import ReassemblyError, make_exchange

    m, width, n_waves = 12 * world, 3, 3
    zeros = lambda n: torch.zeros(n, dtype=torch.int64)  # noqa: E731
    ones = lambda n: torch.ones(n, dtype=torch.int64)  # noqa: E731
    plans = {
        "reversed": RowPlan("contiguous", world, m, tuple(((12 * (world - 1 - r), 12 * (world - r)),)
                                                           for r in range(world)), (1,) * world),
        "striped": plan_rows(zeros(m), ones(m), world, "striped", stripe_rows=2),
        "fold": plan_rows(zeros(m), ones(m), world, "fold"),
        "uneven": plan_rows(zeros(m + 1), ones(m + 1), world, "remainder0"),
    }
    results = {}
    for name, plan in plans.items():
        rows = plan.num_rows
        spread = torch.arange(rows * width, dtype=torch.int32).view(rows, width) * 7919
        tables = {65535: spread % 65536 - 1, 32768: spread % 32769 - 1}
        groups = [split_rows(plan.pieces[r], even_cuts(plan.rows_per_rank[r], n_waves)) for r in range(world)]
        waves = wave_plans(plan, groups)
        for mode in ("allgatherv", "padded"):
            if mode == "allgatherv" and any(len(set(w.rows_per_rank)) > 1 for w in waves):
                continue  # gloo cannot gather unequal slices
            for bits, window in ((32, 65535), (16, 65535), (16, 32768)):
                full = tables[window]
                ex = make_exchange(plan, rank, dist.group.WORLD, mode, width, torch.device("cpu"), bits, window, waves)
                out = torch.full((rows, width), 2**30, dtype=torch.int32)
                ex.before(out)
                for w, wave in enumerate(waves):
                    for a, b in wave.pieces[rank]:
                        out[a:b] = full[a:b]
                    ex.start(out, w)
                ex.finish(out)
                results[(name, mode, bits, window)] = (ex.num_waves, bool(torch.equal(out, full)))
        for mode in ("ring", "maxreduce"):
            try:
                make_exchange(plan, rank, dist.group.WORLD, mode, width, torch.device("cpu"), 32, 65535, waves)
                results[(name, mode)] = "made"
            except ReassemblyError as exc:
                results[(name, mode)] = str(exc)
    return results


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_wave_exchanges_fill_the_table(tp):
    for results in run_ranks(_wave_exchange_rank, tp, timeout=300):
        filled = {k: v for k, v in results.items() if len(k) == 4}
        assert filled and all(v == (3, True) for v in filled.values()), filled
        assert {("reversed", "allgatherv", 16, 32768), ("striped", "allgatherv", 32, 65535),
                ("uneven", "padded", 16, 65535)} <= set(filled)
        refused = {k: v for k, v in results.items() if len(k) == 2}
        assert refused and all("waves" in v for v in refused.values()), refused


# request 0's rows read up to 65535 keys ("fits": 16-bit indices fit, forced only) or 3000
# ("short": auto narrows them); request 1 is empty; a 1 MiB budget cuts each rank's rows into
# several chunks
_CASES = dict(fits=([65535, 0, 900, 40], [22, 0, 60, 30]), short=([3000, 0, 900, 40], [22, 0, 60, 30]))
_BUDGET_MB = 1.0


def _waves_rank(rank, world):
    import os

    import torch.distributed as dist

    os.environ["INDEXER_TP_SHARD_STRIPE_ROWS"] = "8"
    results = {}
    for case, (seq, q) in _CASES.items():
        inp = make_inputs(seq, q, heads=2, head_dim=16, seed=len(case))
        m = inp.q.shape[0]
        for strategy in ("contiguous", "remainder0", "fold", "balanced", "striped"):
            for mode in ("padded", "auto"):
                for waves in ("auto", 3):  # (1: the single exchange of test_sharded)
                    for bits in ("auto", "16") if case == "fits" else ("auto",):
                        if bits == "16" and mode == "auto" and strategy == "striped":
                            continue  # auto reassembles striped plans by maxreduce: no 16 bits (test_sharded)
                        step = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=2,
                                            head_dim=16, topk=TOPK, group=dist.group.WORLD, min_rows_per_rank=0,
                                            strategy=strategy, reassembly=mode, exchange_bits=bits,
                                            exchange_waves=waves, max_logits_mb=_BUDGET_MB)
                        out = torch.full((m, TOPK), 2**30, dtype=torch.int32)
                        step.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out)
                        again = step.run(inp.q, inp.k, inp.k_scale, inp.weights)  # the plan reused
                        info = step.info
                        results[(case, strategy, mode, waves, bits)] = (
                            out, bool(torch.equal(again, out)), info.waves, info.reassembly, info.exchange_bits,
                            info.chunks, str(step), min(info.plan.rows_per_rank))
    return results


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_sharded_in_waves_equals_replicated(tp):
    per_rank = run_ranks(_waves_rank, tp, timeout=900)
    want = replicated_tables(_CASES, TOPK)
    in_waves = set()
    for key, (out, rerun, waves, mode, bits, chunks, text, fewest_rows) in per_rank[0].items():
        case, strategy, _, asked, _ = key
        assert torch.equal(out.sort(1).values, want[case]), f"sharded != replicated for {key}"
        assert rerun, key
        for r in range(1, tp):
            assert torch.equal(per_rank[r][key][0], out), f"rank {r} differs for {key}"
        assert f"{waves} wave(s)" in text, text
        if mode in ("ring", "maxreduce"):
            assert waves == 1, key
        elif asked == 3:  # at most as many as the smallest rank has rows
            assert waves == min(3, fewest_rows), key
        else:  # auto: as many as the rank with the fewest chunks has (at most 8)
            fewest = min(per_rank[r][key][5] for r in range(tp))
            assert waves == min(8, fewest), (key, waves, fewest)
        if waves > 1:
            in_waves.add((case, mode, bits, asked))
    # waves ran with both widths of the exchange and both ways of asking for them
    assert {("fits", "padded", 16, "auto"), ("fits", "padded", 32, 3), ("short", "padded", 16, "auto")} <= in_waves, \
        in_waves


def _cuda_waves_rank(rank, world):
    # two gloo ranks sharing one GPU (NCCL wants a GPU a rank): each wave's exchange of CUDA
    # tensors is issued while the next wave's kernels are queued
    import torch.distributed as dist

    inp = make_inputs([20000, 4000], [6000, 4000], heads=64, head_dim=128, device="cuda:0", seed=3)
    bounds = (inp.row_starts.cpu(), inp.row_ends.cpu())
    layer = (inp.q, inp.k, inp.k_scale, inp.weights)
    ref = indexer.plan(*bounds, num_keys=inp.k.shape[0], heads=64, head_dim=128, topk=2048, device="cuda:0").run(*layer)
    results = []
    for kw in (dict(exchange_waves="auto", max_logits_mb=64), dict(exchange_waves=3, exchange_bits="32")):
        step = indexer.plan(*bounds, num_keys=inp.k.shape[0], heads=64, head_dim=128, topk=2048, device="cuda:0",
                            group=dist.group.WORLD, min_rows_per_rank=0, reassembly="padded", **kw)
        out = torch.full((inp.q.shape[0], 2048), -5, dtype=torch.int32, device="cuda:0")
        step.run(*layer, out=out)
        torch.cuda.synchronize()
        results.append((step.info.waves, bool(torch.equal(out.sort(1).values, ref.sort(1).values))))
    return results


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_waves_with_cuda_tensors_over_gloo():
    for results in run_ranks(_cuda_waves_rank, 2, timeout=600):
        (auto, auto_same), (forced, forced_same) = results
        assert auto > 1 and forced == 3 and auto_same and forced_same, results
