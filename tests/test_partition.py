"""Row planner: ownership, layouts, balance, determinism."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer.partition import STRATEGIES, CostModel, fold_split, plan_rows


@st.composite
def bounds(draw):
    m = draw(st.integers(0, 300))
    lens = draw(st.lists(st.integers(0, 5000), min_size=m, max_size=m))
    starts = draw(st.lists(st.integers(0, 1000), min_size=m, max_size=m))
    return starts, [s + n for s, n in zip(starts, lens)]


def causal(m, n=None):
    n = n or m
    return [0] * m, list(range(n - m + 1, n + 1))


@settings(max_examples=150, deadline=None)
@given(b=bounds(), tp=st.integers(1, 9), strategy=st.sampled_from(STRATEGIES))
def test_every_row_owned_exactly_once(b, tp, strategy):
    starts, ends = b
    plan = plan_rows(starts, ends, tp, strategy)
    owner = torch.full((len(starts),), -1)
    for r in range(tp):
        for a, e in plan.rank_rows(r):
            assert 0 <= a < e <= len(starts)
            assert (owner[a:e] == -1).all(), "row owned twice"
            owner[a:e] = r
    assert (owner >= 0).all(), "row owned by nobody"
    assert sum(plan.rows_per_rank) == len(starts)
    stripes = -(-len(starts) // 512)
    max_pieces = {"fold": 2, "striped": -(-stripes // tp)}.get(strategy, 1)
    assert all(len(plan.rank_rows(r)) <= max_pieces for r in range(tp))
    # costs add up to the model's total
    total = int(CostModel().row_costs(torch.tensor(starts, dtype=torch.int64), torch.tensor(ends, dtype=torch.int64), max(ends, default=0)).sum())
    assert sum(plan.cost_per_rank) == total


@settings(max_examples=100, deadline=None)
@given(b=bounds(), tp=st.integers(1, 9), strategy=st.sampled_from(STRATEGIES))
def test_deterministic_and_tensor_or_sequence(b, tp, strategy):
    starts, ends = b
    p1 = plan_rows(starts, ends, tp, strategy)
    p2 = plan_rows(torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32), tp, strategy)
    assert p1 == p2
    assert p1.fingerprint() == p2.fingerprint()


@pytest.mark.parametrize("m,tp", [(0, 1), (0, 4), (3, 4), (4, 4), (10, 3), (31, 4), (100, 8)])
def test_remainder0_layout(m, tp):
    plan = plan_rows(*causal(m), tp, "remainder0")
    base, rem = divmod(m, tp)
    expect = [[(0, base + rem)]] + [[(rem + r * base, rem + (r + 1) * base)] for r in range(1, tp)]
    expect = [[x for x in p if x[1] > x[0]] for p in expect]
    assert [plan.rank_rows(r) for r in range(tp)] == expect


@pytest.mark.parametrize("m,tp", [(0, 2), (1, 2), (3, 4), (10, 3), (17, 2), (64, 4), (101, 8)])
def test_fold_layout(m, tp):
    plan = plan_rows(*causal(m), tp, "fold")
    h1 = fold_split(m, tp)
    assert h1 % tp == 0 and h1 <= m // 2
    g1 = h1 // tp
    m2 = m - h1
    second = [(h1 + j * m2 // tp, h1 + (j + 1) * m2 // tp) for j in range(tp)]
    for r in range(tp):
        want = [(r * g1, (r + 1) * g1), second[tp - 1 - r]]
        assert plan.rank_rows(r) == [x for x in want if x[1] > x[0]]


def test_fold_balances_causal_cost():
    starts, ends = causal(4096)
    contiguous = plan_rows(starts, ends, 4, "contiguous")
    fold = plan_rows(starts, ends, 4, "fold")
    assert fold.imbalance < 1.01 < contiguous.imbalance


@settings(max_examples=150, deadline=None)
@given(b=bounds(), tp=st.integers(1, 9))
def test_balanced_imbalance_bounded_by_one_row(b, tp):
    starts, ends = b
    plan = plan_rows(starts, ends, tp, "balanced")
    costs = CostModel().row_costs(torch.tensor(starts, dtype=torch.int64), torch.tensor(ends, dtype=torch.int64), max(ends, default=0))
    total = int(costs.sum())
    biggest = int(costs.max()) if len(starts) else 0
    # each rank within one row's cost of the ideal share
    assert plan.max_cost * tp <= total + tp * biggest


def test_balanced_beats_contiguous_on_causal_rows():
    starts, ends = causal(8192, 65536)
    model = CostModel(per_key=1, per_width=0, per_row=0)
    bal = plan_rows(starts, ends, 4, "balanced", cost_model=model)
    con = plan_rows(starts, ends, 4, "contiguous", cost_model=model)
    assert bal.imbalance < 1.001 and con.imbalance > bal.imbalance


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fewer_rows_than_ranks(strategy):
    plan = plan_rows([0, 0, 0], [1, 2, 3], 8, strategy)
    assert sum(plan.rows_per_rank) == 3
    assert plan.world_size == 8 and len(plan.pieces) == 8


def test_empty_rows_cost_nothing():
    plan = plan_rows([0, 5, 7, 0], [0, 5, 9, 4], 2, "contiguous", cost_model=CostModel(per_key=1, per_width=3, per_row=10))
    assert plan.cost_per_rank == (0, (2 + 3 * 9 + 10) + (4 + 3 * 9 + 10))


def test_rank_index_concatenates_pieces():
    plan = plan_rows(*causal(10), 3, "fold")
    for r in range(3):
        idx = plan.rank_index(r).tolist()
        assert idx == [i for a, b in plan.rank_rows(r) for i in range(a, b)]


@pytest.mark.parametrize(
    "kwargs,err",
    [
        (dict(world_size=0, strategy="contiguous"), ValueError),
        (dict(world_size=2, strategy="nope"), ValueError),
        (dict(world_size=True, strategy="fold"), ValueError),
    ],
)
def test_bad_plan_arguments(kwargs, err):
    with pytest.raises(err):
        plan_rows([0], [1], **kwargs)


def test_mismatched_bounds():
    with pytest.raises(ValueError, match="same length"):
        plan_rows([0, 0], [1], 2, "contiguous")
    with pytest.raises(TypeError, match="integers"):
        plan_rows(torch.zeros(2), torch.ones(2), 2, "contiguous")


@pytest.mark.parametrize("m,tp,stripe", [(0, 2, 4), (10, 3, 4), (1000, 4, 64), (4096, 8, 512)])
def test_striped_layout(m, tp, stripe):
    plan = plan_rows(*causal(m), tp, "striped", stripe_rows=stripe)
    for r in range(tp):
        want = [(a, min(m, a + stripe)) for i, a in enumerate(range(0, m, stripe)) if i % tp == r]
        assert plan.rank_rows(r) == want


def test_striped_balances_causal_cost():
    plan = plan_rows(*causal(8192), 4, "striped", stripe_rows=256)
    # round-robin leaves rank tp-1 the latest stripe of every round: within stripe/M
    assert plan.imbalance < 1.1 < plan_rows(*causal(8192), 4, "contiguous").imbalance


def test_bad_stripe_rows():
    with pytest.raises(ValueError, match="stripe_rows"):
        plan_rows([0], [1], 2, "striped", stripe_rows=0)
