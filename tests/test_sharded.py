"""Sharded prefill over real gloo process groups (multi-process, no mocks)."""

from __future__ import annotations

import time

import pytest
import torch

import indexer
from indexer.launch import RankFailed, run_ranks
from indexer.synthetic import make_inputs

from conftest import replicated_tables

STRATEGIES = ("contiguous", "remainder0", "fold", "balanced", "striped", "auto")
MODES = ("ring", "padded", "maxreduce", "auto")
TOPK = 8


def _row_counts(tp):
    return sorted({0, 1, tp - 1, tp, 7 * tp + 3, 203})


def _inputs(m, seed):
    # a varlen batch: a long late chunk and a short whole request, so rows have
    # non-zero starts and windows both shorter and longer than topk
    first = (2 * m) // 3
    return make_inputs([first + 150, m - first], [first, m - first], heads=2, head_dim=32, seed=seed)


def _matrix_rank(rank, world):
    import os

    import torch.distributed as dist

    os.environ["INDEXER_TP_SHARD_STRIPE_ROWS"] = "16"  # several stripes per rank at these sizes
    results = {}
    for m in _row_counts(world):
        inp = _inputs(m, seed=m)
        for strategy in STRATEGIES:
            for mode in MODES:
                if mode == "ring" and strategy not in ("remainder0", "fold", "auto"):
                    continue
                out = torch.full((m, TOPK), 2**30, dtype=torch.int32)  # poison
                res, info = indexer.prefill_topk_with_info(
                    *inp.args(), TOPK, group=dist.group.WORLD, out=out, strategy=strategy,
                    reassembly=mode, min_rows_per_rank=0,
                )
                assert res is out
                results[(m, strategy, mode)] = (out.clone(), info.sharded, info.plan.strategy if info.plan else None, info.reassembly)
    return results


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_sharded_equals_replicated(tp):
    per_rank = run_ranks(_matrix_rank, tp, timeout=900)
    checked = 0
    for key, (out0, sharded, plan_strategy, mode) in per_rank[0].items():
        m, strategy, req_mode = key
        assert sharded or m == 0, f"{key} did not shard"
        if m and req_mode != "auto":
            assert mode == req_mode, key
        if m and req_mode == "auto":
            # gloo cannot do variable-size all_gather: auto is ring for ring plans,
            # maxreduce for striped plans, else padded
            want = {"remainder0": "ring", "fold": "ring", "striped": "maxreduce"}.get(plan_strategy, "padded")
            assert mode == want, key
        if m and strategy != "auto":
            assert plan_strategy == strategy
        for r in range(1, tp):
            assert torch.equal(per_rank[r][key][0], out0), f"rank {r} differs from rank 0 for {key}"
        assert not (out0 == 2**30).any(), f"poisoned entries left for {key}"
        inp = _inputs(m, seed=m)
        want = indexer.prefill_topk(*inp.args(), TOPK)
        assert torch.equal(out0.sort(1).values, want.sort(1).values), f"sharded != replicated for {key}"
        checked += 1
    assert checked >= 6 * 14


def _gate_rank(rank, world, min_rows):
    import torch.distributed as dist

    inp = _inputs(40, seed=3)
    res, info = indexer.prefill_topk_with_info(*inp.args(), TOPK, group=dist.group.WORLD, min_rows_per_rank=min_rows)
    off, info_off = indexer.prefill_topk_with_info(*inp.args(), TOPK, group=dist.group.WORLD, min_rows_per_rank=0, tp_shard=False)
    return res, info.sharded, info.reason, info_off.sharded


def test_gate():
    below = run_ranks(_gate_rank, 2, 21)  # 40 rows < 21 x 2
    at = run_ranks(_gate_rank, 2, 20)  # 40 rows >= 20 x 2
    inp = _inputs(40, seed=3)
    want = indexer.prefill_topk(*inp.args(), TOPK).sort(1).values
    for res, sharded, reason, sharded_off in below:
        assert not sharded and "min_rows_per_rank" in reason
        assert torch.equal(res.sort(1).values, want)
        assert not sharded_off
    for res, sharded, reason, _ in at:
        assert sharded
        assert torch.equal(res.sort(1).values, want)


def _allgatherv_on_gloo(rank, world):
    import torch.distributed as dist

    inp = _inputs(50, seed=1)
    out = torch.full((50, TOPK), 99, dtype=torch.int32)
    try:
        indexer.prefill_topk(*inp.args(), TOPK, group=dist.group.WORLD, out=out, reassembly="allgatherv", min_rows_per_rank=0)
    except indexer.ReassemblyError as exc:
        return str(exc), bool((out == 99).all())
    return None, False


def test_allgatherv_forced_on_gloo_is_a_clear_error():
    for msg, untouched in run_ranks(_allgatherv_on_gloo, 2):
        assert msg is not None and "allgatherv" in msg and "gloo" in msg
        assert untouched


def _ring_forced_on_balanced(rank, world):
    import torch.distributed as dist

    inp = _inputs(50, seed=1)
    try:
        indexer.prefill_topk(*inp.args(), TOPK, group=dist.group.WORLD, strategy="balanced", reassembly="ring", min_rows_per_rank=0)
    except indexer.ReassemblyError as exc:
        return str(exc)
    return None


def test_ring_refuses_plans_it_cannot_exchange():
    for msg in run_ranks(_ring_forced_on_balanced, 2):
        assert msg is not None and "ring" in msg and "balanced" in msg


def _disagree_rank(rank, world, how):
    import os

    import torch.distributed as dist

    os.environ["INDEXER_CHECK_CONSISTENCY"] = "1"
    m = 60 if (how != "rows" or rank == 0) else 64
    inp = _inputs(m, seed=2)
    if how == "bounds" and rank == world - 1:
        inp.row_ends[5] -= 1
    try:
        indexer.prefill_topk(*inp.args(), TOPK, group=dist.group.WORLD, min_rows_per_rank=0)
    except indexer.InconsistentRanksError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("how", ["rows", "bounds"])
def test_consistency_guard_raises_on_every_rank(how):
    t0 = time.monotonic()
    msgs = run_ranks(_disagree_rank, 3, how, timeout=120)
    assert time.monotonic() - t0 < 120
    for msg in msgs:
        assert msg is not None, "a rank returned instead of raising"
        assert ("ranks [1, 2]" if how == "rows" else "ranks [2]") in msg


def _fails(rank, world):
    if rank == 1:
        raise RuntimeError("boom")
    return rank


def test_launcher_reports_rank_failures():
    with pytest.raises(RankFailed, match="boom"):
        run_ranks(_fails, 2, timeout=60)


def _own_cost_file_rank(rank, world, tmpdir):
    import json
    import os

    import torch.distributed as dist

    # every rank reads its own calibration file, and they disagree
    path = os.path.join(tmpdir, f"costs-{rank}.json")
    with open(path, "w") as f:
        json.dump({"torch@cpu": {"per_key": 1000, "per_width": 0, "per_row": 100000 if rank == 0 else 0}}, f)
    os.environ["INDEXER_COST_MODEL_FILE"] = path
    inp = _inputs(200, seed=6)
    out = {}
    for mode in ("maxreduce", "padded"):
        res, info = indexer.prefill_topk_with_info(
            *inp.args(), TOPK, group=dist.group.WORLD, strategy="balanced", reassembly=mode, min_rows_per_rank=0
        )
        out[mode] = (res, info.plan.pieces)
    return out


def test_ranks_with_different_cost_files_still_agree(tmp_path):
    per_rank = run_ranks(_own_cost_file_rank, 2, str(tmp_path), timeout=120)  # a plan mismatch can hang gloo
    inp = _inputs(200, seed=6)
    want = indexer.prefill_topk(*inp.args(), TOPK).sort(1).values
    for mode in ("maxreduce", "padded"):
        assert per_rank[0][mode][1] == per_rank[1][mode][1], "ranks cut different plans"
        for r in range(2):
            assert torch.equal(per_rank[r][mode][0].sort(1).values, want), (mode, r)


def test_fingerprint_hashes_exactly_the_tensor_it_is_given():
    from indexer.collective.guard import fingerprint

    base = torch.arange(10, dtype=torch.int32)
    view = base[2:5]  # contiguous, shares base's storage
    assert fingerprint("x", tensors=(view,)) == fingerprint("x", tensors=(view.clone(),))
    assert fingerprint("x", tensors=(view,)) != fingerprint("x", tensors=(base[3:6],))
    assert fingerprint("x", tensors=(view,)) != fingerprint("x", tensors=(view.to(torch.int64),))
    assert fingerprint("x", tensors=(view,)) != fingerprint("y", tensors=(view,))


def _exchange_rank(rank, world):
    # every mode's in-place exchange on hand-made plans, the allgatherv ones included: gloo
    # cannot gather slices of different sizes, so these plans give every rank equal rows
    # (one piece out of rank order; several pieces a rank) and gloo runs the same code path
    # NCCL does
    import torch.distributed as dist

    from indexer.collective import make_exchange
    from indexer.partition import RowPlan, plan_rows

    m, width = 8 * world, 3
    zeros = lambda n: torch.zeros(n, dtype=torch.int64)  # noqa: E731
    ones = lambda n: torch.ones(n, dtype=torch.int64)  # noqa: E731
    plans = {
        "reversed": RowPlan("contiguous", world, m, tuple(((8 * (world - 1 - r), 8 * (world - r)),) for r in range(world)),
                            (1,) * world),
        "striped": plan_rows(zeros(m), ones(m), world, "striped", stripe_rows=2),
        "remainder0": plan_rows(zeros(m + 1), ones(m + 1), world, "remainder0"),
        "fold": plan_rows(zeros(m), ones(m), world, "fold"),
    }
    results = {}
    for name, plan in plans.items():
        rows = plan.num_rows
        spread = torch.arange(rows * width, dtype=torch.int32).view(rows, width) * 7919
        # windows of up to 65535 keys: indices over all of 16 bits' range (-1, 0..65534); up
        # to 32768 keys: -1, 0..32767
        tables = {65535: spread % 65536 - 1, 32768: spread % 32769 - 1}
        modes = ("allgatherv", "padded", "maxreduce") + (("ring",) if name in ("remainder0", "fold") else ())
        for mode in modes:
            if mode == "allgatherv" and len(set(plan.rows_per_rank)) > 1:
                continue  # gloo cannot gather unequal slices
            for bits, window in ((32, 65535), (16, 65535), (16, 32768)) if mode != "maxreduce" else ((32, 65535),):
                full = tables[window]
                ex = make_exchange(plan, rank, dist.group.WORLD, mode, width, torch.device("cpu"), bits, window)
                out = torch.full((rows, width), 2**30, dtype=torch.int32)
                ex.before(out)
                for a, b in plan.pieces[rank]:
                    out[a:b] = full[a:b]  # this rank's rows, computed in place
                ex(out)
                results[(name, mode, bits, window)] = bool(torch.equal(out, full))
    return results


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_every_exchange_fills_the_table_in_place(tp):
    for results in run_ranks(_exchange_rank, tp, timeout=300):
        assert results and all(results.values()), results
        assert {("reversed", "allgatherv", 16, 65535), ("striped", "allgatherv", 32, 65535), ("fold", "ring", 16, 32768),
                ("striped", "padded", 16, 65535), ("remainder0", "ring", 16, 32768)} <= set(results)


# request 0's rows read 65514..65535 keys (16-bit indices fit, at most 65534: forced only;
# "short": at most 2999, auto narrows them), "wide": up to 65536 (they do not); request 1 is empty
_NARROW = dict(fits=([65535, 0, 900, 40], [22, 0, 60, 30]), wide=([65536, 0, 900, 40], [22, 0, 60, 30]),
               short=([3000, 0, 900, 40], [22, 0, 60, 30]))


def _bits_rank(rank, world):
    import os

    import torch.distributed as dist

    from indexer.collective import ReassemblyError

    os.environ["INDEXER_TP_SHARD_STRIPE_ROWS"] = "8"  # several stripes per rank
    results = {}
    for case, (seq, q) in _NARROW.items():
        inp = make_inputs(seq, q, heads=2, head_dim=16, seed=len(case))
        m = inp.q.shape[0]
        for strategy in STRATEGIES:
            for mode in ("ring", "padded", "maxreduce", "auto"):
                if mode == "ring" and strategy not in ("remainder0", "fold", "auto"):
                    continue
                for bits in ("auto", "16", "32"):
                    plan = dict(strategy=strategy, reassembly=mode, exchange_bits=bits)
                    try:
                        step = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=2,
                                            head_dim=16, topk=TOPK, group=dist.group.WORLD, min_rows_per_rank=0,
                                            **plan)
                    except ReassemblyError as exc:
                        results[(case, strategy, mode, bits)] = ("refused", str(exc))
                        continue
                    out = torch.full((m, TOPK), 2**30, dtype=torch.int32)
                    step.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out)
                    results[(case, strategy, mode, bits)] = (out, step.info.exchange_bits, step.info.reassembly)
    return results


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_16_bit_exchange_equals_replicated_at_every_tp(tp):
    # the plan narrows the exchange exactly where every window fits 16 bits and the mode
    # gathers; every rank's table is the replicated one either way
    per_rank = run_ranks(_bits_rank, tp, timeout=900)
    want = replicated_tables(_NARROW, TOPK)
    narrow = 0
    for key, got in per_rank[0].items():
        case, strategy, mode, bits = key
        if got[0] == "refused":
            assert bits == "16" and (case == "wide" or got[1].count("maxreduce") or mode == "maxreduce"), key
            assert "exchange_bits='16'" in got[1], got[1]
            continue
        out, used, resolved = got
        gathers = resolved != "maxreduce"
        auto = 16 if case == "short" and gathers else 32  # auto narrows windows of <= 32768 keys only
        assert used == {"auto": auto, "16": 16, "32": 32}[bits], key
        narrow += used == 16
        assert torch.equal(out.sort(1).values, want[case]), f"sharded != replicated for {key}"
        for r in range(1, tp):
            assert torch.equal(per_rank[r][key][0], out), f"rank {r} differs for {key}"
    assert narrow >= 10



def _gate_file_rank(rank, world, path):
    import os

    import torch.distributed as dist

    os.environ["INDEXER_COST_MODEL_FILE"] = path
    results = {}
    for name, (seq, q) in dict(small=([300, 60], [40, 30]), large=([1500], [1100])).items():
        inp = make_inputs(seq, q, heads=2, head_dim=32, seed=7)
        for rows in (None, 0):  # the calibrated gate; the row count set (it wins)
            step = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=2, head_dim=32,
                                topk=TOPK, group=dist.group.WORLD, min_rows_per_rank=rows)
            out = step.run(inp.q, inp.k, inp.k_scale, inp.weights)
            results[(name, rows)] = (out, step.info.sharded, step.info.gate, str(step))
    return results


@pytest.mark.parametrize("side", ["shard", "replicate"])
def test_gate_follows_the_calibrated_times(tmp_path, side):
    # a calibration where compute is dear and the exchange cheap shards even 70 rows (the
    # row count, 512 a rank on CPU, would not); one where the exchange is dear keeps 1100
    # rows replicated (the row count would shard them); a set row count wins over both
    import json

    compute = {"per_key": 1000, "per_width": 0, "per_row": 10, "ns_per_key": 50.0 if side == "shard" else 0.01,
               "ns_per_column": 0.0, "us_per_row": 1.0}
    exchange = {"us": 1.0, "gb_per_s": 100.0} if side == "shard" else {"us": 1e6, "gb_per_s": 0.001}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"torch@cpu": compute, "exchange@gloox2": exchange}))
    per_rank = run_ranks(_gate_file_rank, 2, str(path), timeout=600)
    for key, (out, sharded, gate, text) in per_rank[0].items():
        name, rows = key
        if rows == 0:
            assert sharded and gate.startswith("row count"), (key, gate)
        else:
            assert sharded == (side == "shard"), (key, gate)
            assert gate.startswith(f"cost model ({side}") and "replicated" in gate and "sharded" in gate, gate
        for r in range(1, 2):
            assert torch.equal(per_rank[r][key][0], out) and per_rank[r][key][1] == sharded, key
        seq, q = dict(small=([300, 60], [40, 30]), large=([1500], [1100]))[name]
        want = indexer.prefill_topk(*make_inputs(seq, q, heads=2, head_dim=32, seed=7).args(), TOPK)
        assert torch.equal(out.sort(1).values, want.sort(1).values), key


def test_gate_without_calibrated_times_is_the_row_count(tmp_path):
    per_rank = run_ranks(_gate_file_rank, 2, str(tmp_path / "none.json"), timeout=600)
    small, large = per_rank[0][("small", None)], per_rank[0][("large", None)]
    assert not small[1] and large[1]  # 70 rows < 512 x 2 <= 1100 rows
    assert small[2].startswith("row count") and "bench calibrate --exchange --tp 2" in small[2], small[2]
    assert large[2].startswith("row count: M=1100 >= min_rows_per_rank 512 x tp 2"), large[2]
    for _, _, gate, text in (small, large):  # the plan's summary says which rule decided, and why
        assert gate in text, (gate, text)


def _bad_file_rank(rank, world, tmpdir, bad_rank):
    import os

    import torch.distributed as dist

    path = os.path.join(tmpdir, f"costs{rank}.json")
    with open(path, "w") as f:
        f.write("{not json" if rank == bad_rank else "{}")
    os.environ["INDEXER_COST_MODEL_FILE"] = path
    inp = _inputs(40, seed=3)
    try:
        indexer.prefill_topk(*inp.args(), TOPK, group=dist.group.WORLD, min_rows_per_rank=0)
        return None
    except ValueError as exc:
        return str(exc)


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_bad_cost_file_raises_on_every_rank_or_on_none(tmp_path, bad_rank):
    # only rank 0's file is read (its model and times are what the group agrees on): a bad
    # one there raises on every rank, none left waiting in a collective; one elsewhere is unused
    msgs = run_ranks(_bad_file_rank, 2, str(tmp_path), bad_rank, timeout=300)
    if bad_rank == 0:
        assert all(m is not None for m in msgs), msgs
        assert "unreadable" in msgs[0]
    else:
        assert msgs == [None, None]


def _update_rank(rank, world):
    import torch.distributed as dist

    inp = make_inputs([3000, 30000], [40, 30], heads=2, head_dim=16, seed=5)  # windows up to 30000 keys
    step = indexer.plan(inp.row_starts, inp.row_ends, num_keys=inp.k.shape[0], heads=2, head_dim=16, topk=TOPK,
                        group=dist.group.WORLD, min_rows_per_rank=0, strategy="contiguous", reassembly="padded")
    wider = inp.row_starts.clone(), inp.row_ends.clone()
    wider[0][:] = 0
    wider[1][:] = inp.k.shape[0]  # every row's window: all 33000 keys, past the 32768 one copy widens
    try:
        step.update_bounds(*wider)
        return step.info.exchange_bits, None
    except ValueError as exc:
        return step.info.exchange_bits, str(exc)


def test_update_bounds_refuses_windows_a_16_bit_exchange_cannot_carry():
    for bits, msg in run_ranks(_update_rank, 2, timeout=300):
        assert bits == 16 and msg is not None and "16-bit" in msg, msg
