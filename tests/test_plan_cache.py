"""prefill_topk reuses the plan of a recent matching call, and only of a matching one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import indexer
from indexer import plan_cache
from indexer.synthetic import make_inputs
from indexer.workspace import release_workspaces

from conftest import assert_matches_naive, sets_equal

TOPK = 8


@pytest.fixture(autouse=True)
def _empty_cache():
    plan_cache.clear()
    yield
    plan_cache.clear()


def _inputs(seed=0):
    return make_inputs([300, 50, 9], [120, 50, 4], heads=4, head_dim=32, seed=seed)


def _calls_planning(monkeypatch):
    # counts the plans made (the cache must not change how many rows any of them computes)
    made = []
    real = indexer.api.StepPlan

    def counting(*a, **kw):
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(indexer.api, "StepPlan", counting)
    return made


def test_same_bounds_plan_once_and_give_each_layers_answer(monkeypatch):
    made = _calls_planning(monkeypatch)
    base = _inputs(0)
    for seed in range(3):
        # other values (another layer), same bounds
        inp = _inputs(seed)
        assert torch.equal(inp.row_starts, base.row_starts) and torch.equal(inp.row_ends, base.row_ends)
        out = indexer.prefill_topk(*inp.args(), TOPK, backend="torch")
        assert_matches_naive(out, inp, TOPK)
    assert len(made) == 1
    assert plan_cache.cached_count() == 1


def test_one_bound_changed_plans_again(monkeypatch):
    made = _calls_planning(monkeypatch)
    inp = _inputs(0)
    indexer.prefill_topk(*inp.args(), TOPK, backend="torch")
    ends = inp.row_ends.clone()
    ends[-1] -= 1  # one row one key shorter: the old plan's windows would be wrong
    out = indexer.prefill_topk(inp.q, inp.k, inp.k_scale, inp.weights, inp.row_starts, ends, TOPK, backend="torch")
    assert len(made) == 2
    changed = dataclasses.replace(inp, row_ends=ends)
    assert_matches_naive(out, changed, TOPK)
    # and the same sets as a plan made for these bounds alone
    fresh = indexer.plan(inp.row_starts, ends, num_keys=inp.k.shape[0], heads=4, head_dim=32, topk=TOPK,
                         backend="torch").run(inp.q, inp.k, inp.k_scale, inp.weights)
    assert sets_equal(out, fresh)


@pytest.mark.parametrize("change", ["keyword", "env", "topk", "backend"])
def test_other_settings_plan_again(monkeypatch, change):
    made = _calls_planning(monkeypatch)
    inp = _inputs(0)
    first = indexer.prefill_topk_with_info(*inp.args(), TOPK, backend="torch")[1]
    kw, topk = dict(backend="torch"), TOPK
    if change == "keyword":
        kw["max_logits_mb"] = 0.01
    elif change == "env":
        monkeypatch.setenv("INDEXER_MAX_LOGITS_MB", "0.01")
    elif change == "topk":
        topk = TOPK - 1
    else:
        kw["backend"] = "auto"
    out, info = indexer.prefill_topk_with_info(*inp.args(), topk, **kw)
    assert len(made) == 2
    assert_matches_naive(out, inp, topk)
    if change in ("keyword", "env"):
        # the small budget cuts the rows into more chunks: the new setting took effect
        assert info.chunks > first.chunks


def test_info_is_each_calls_own():
    inp = _inputs(0)
    _, a = indexer.prefill_topk_with_info(*inp.args(), TOPK, backend="torch", timing=True)
    _, b = indexer.prefill_topk_with_info(*inp.args(), TOPK, backend="torch", timing=True)
    assert a is not b and a.compute_ms is not None and b.compute_ms is not None


def test_kept_plans_are_bounded_and_released(monkeypatch):
    made = _calls_planning(monkeypatch)
    inp = _inputs(0)
    for t in range(plan_cache.SIZE + 2):
        indexer.prefill_topk(*inp.args(), TOPK + t, backend="torch")
    assert plan_cache.cached_count() == plan_cache.SIZE
    # the oldest was dropped: planned again
    indexer.prefill_topk(*inp.args(), TOPK, backend="torch")
    assert len(made) == plan_cache.SIZE + 3
    release_workspaces()
    assert plan_cache.cached_count() == 0


def test_a_refused_call_keeps_nothing():
    inp = _inputs(0)
    bad = inp.k_scale.clone()
    bad[int(inp.row_starts[0])] = float("nan")
    with pytest.raises(ValueError, match="k_scale"):
        indexer.prefill_topk(inp.q, inp.k, bad, inp.weights, inp.row_starts, inp.row_ends, TOPK, backend="torch")
    assert plan_cache.cached_count() == 0


def test_a_cached_plan_keeps_its_own_bounds_when_the_callers_tensors_are_overwritten():
    # int32 bounds on the inputs' device are what a plan would use in place; the caller
    # refills them (the next step's metadata), then calls again with the first bounds
    inp = _inputs(0)
    starts, ends = inp.row_starts.clone(), inp.row_ends.clone()
    first = indexer.prefill_topk(inp.q, inp.k, inp.k_scale, inp.weights, starts, ends, TOPK, backend="torch")
    starts.zero_()
    ends.fill_(1)
    again = indexer.prefill_topk(*inp.args(), TOPK, backend="torch")
    assert plan_cache.cached_count() == 1  # the first call's plan, reused
    assert torch.equal(again, first)
    assert_matches_naive(again, inp, TOPK)


def test_steps_of_one_shape_with_other_bounds_keep_a_plan_each(monkeypatch):
    # two chunk groups of equal shape alternating over the layers of a step
    made = _calls_planning(monkeypatch)
    a = _inputs(0)
    b = dataclasses.replace(a, row_starts=a.row_starts.flip(0).contiguous(), row_ends=a.row_ends.flip(0).contiguous())
    for _ in range(3):
        for inp in (a, b):
            assert_matches_naive(indexer.prefill_topk(*inp.args(), TOPK, backend="torch"), inp, TOPK)
    assert len(made) == 2
    assert plan_cache.cached_count() == 2
