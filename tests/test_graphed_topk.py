"""A chunk's Triton top-k replayed from CUDA graphs (indexer.topk.graphed): the same sets as
its eager launches, a graph a (logits, table) placement, eager inside a caller's capture."""

from __future__ import annotations

import pytest
import torch

import indexer
from indexer.synthetic import logits_like, make_inputs
from indexer.topk.graphed import MAX_GRAPHS, GraphedTopk
from indexer.topk.choice import topk_graphed

K = 256


def _ragged(rows=300, n=6000, seed=0):
    from indexer.topk.triton.launch import launch_reasons
    from indexer.topk.triton.ragged import RaggedTopk

    why = launch_reasons(torch.device("cuda"))
    if why:
        pytest.skip("; ".join(why))
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, n + 1, (rows,), generator=g)
    lengths[:3] = torch.tensor([n, K, K - 1])
    starts = (torch.rand(rows, generator=g) * (n - lengths + 1).float()).floor().to(torch.int32)
    lengths = lengths.to(torch.int32)
    dev = torch.device("cuda", torch.cuda.current_device())
    run = RaggedTopk(dev, rows, n, starts.to(dev), lengths.to(dev), K)
    return run, dev


def _sets(t):
    return t.sort(1).values


def test_the_flag_never_graphs_off_cuda(monkeypatch):
    monkeypatch.setenv("INDEXER_TOPK_GRAPH", "1")
    assert not topk_graphed(torch.device("cpu"))
    monkeypatch.setenv("INDEXER_TOPK_GRAPH", "sometimes")
    with pytest.raises(ValueError, match="INDEXER_TOPK_GRAPH"):
        indexer.plan(torch.tensor([0]), torch.tensor([8]), num_keys=8, heads=2, head_dim=32, topk=4)


def test_graphs_are_for_nvidia_only(monkeypatch):
    monkeypatch.delenv("INDEXER_TOPK_GRAPH", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert topk_graphed(torch.device("cuda", 0))
    monkeypatch.setattr(torch.version, "hip", "6.4")  # a ROCm build: never captured there
    assert not topk_graphed(torch.device("cuda", 0))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("INDEXER_CUDA_TOPK_GRAPH", "0")
    assert not topk_graphed(torch.device("cuda", 0))


@pytest.mark.cuda
def test_gpu_replay_gives_the_eager_sets_for_new_values():
    run, dev = _ragged()
    graphed = GraphedTopk(run, dev)
    logits = torch.empty(run.rows, run.n, device=dev)
    out = torch.empty(run.rows, K, dtype=torch.int32, device=dev)
    want = torch.empty_like(out)
    for i, dist in enumerate(("gaussian", "few_distinct", "descending", "equal")):
        logits.copy_(logits_like(dist, run.rows, run.n, dev, seed=i))
        out.fill_(-7)
        graphed(logits, out)
        run(logits, want)
        torch.cuda.synchronize()
        assert torch.equal(_sets(out), _sets(want)), dist
    # the first call ran eagerly and captured; every later one replayed
    assert (graphed.captures, graphed.replays, graphed.failed) == (1, 3, "")
    # the same address in another layout is another placement: the eager path checks it
    with pytest.raises(ValueError, match="out must be int32"):
        graphed(logits, out.view(K, run.rows))
    assert graphed.replays == 3


@pytest.mark.cuda
def test_gpu_each_placement_gets_its_graph_up_to_the_limit():
    run, dev = _ragged(rows=64, n=5000, seed=1)
    graphed = GraphedTopk(run, dev)
    wide = torch.empty(run.rows, K + 32, dtype=torch.int32, device=dev)
    outs = [torch.empty(run.rows, K, dtype=torch.int32, device=dev) for _ in range(MAX_GRAPHS)] + [wide[:, :K]]
    logits = logits_like("gaussian", run.rows, run.n, dev, seed=3)
    want = torch.empty(run.rows, K, dtype=torch.int32, device=dev)
    run(logits, want)
    for rounds in range(2):
        for o in outs:
            o.fill_(-7)
            graphed(logits, o)
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(_sets(o), _sets(want))
    # MAX_GRAPHS placements captured; the one past them launched eagerly both times
    assert graphed.captures == MAX_GRAPHS
    assert graphed.replays == MAX_GRAPHS


@pytest.mark.cuda
def test_gpu_inside_a_callers_capture_it_launches_into_the_callers_graph():
    run, dev = _ragged(rows=128, n=4096, seed=2)
    graphed = GraphedTopk(run, dev)
    logits = logits_like("gaussian", run.rows, run.n, dev, seed=4)
    out = torch.empty(run.rows, K, dtype=torch.int32, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graphed(logits, out)  # warm-up: eager, then its own graph
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed(logits, out)
    assert graphed.replays == 0  # recorded into g, not replayed from its own
    logits.copy_(logits_like("ascending", run.rows, run.n, dev, seed=5))
    out.fill_(-7)
    g.replay()
    want = torch.empty_like(out)
    run(logits, want)
    torch.cuda.synchronize()
    assert torch.equal(_sets(out), _sets(want))


@pytest.mark.cuda
@pytest.mark.parametrize("flag", ["1", "0"])
def test_gpu_plan_runs_replay_the_top_k_where_the_flag_is_on(monkeypatch, flag):
    monkeypatch.setenv("INDEXER_TOPK_GRAPH", flag)
    from indexer.backends import get_backend

    if get_backend("triton").not_supported_reasons(None):
        pytest.skip("triton cannot run here")
    # windows of up to 40000 keys: past the native row top-k, the Triton one's chunks
    inp = make_inputs([40000, 9000], [1500, 500], heads=64, head_dim=128, device="cuda", seed=6)
    plan = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=inp.k.shape[0], heads=64, head_dim=128,
                        topk=2048, device="cuda", backend="triton")
    runs = [c.state["topk"] for c in plan.chunks if c.state.get("topk_kind", "").startswith("triton")]
    assert runs, str(plan)
    assert ("graphed" in str(plan)) == (flag == "1")
    layer = (inp.q, inp.k, inp.k_scale, inp.weights)
    # an engine's persistent table: one placement, so the second run replays
    out = torch.empty(inp.q.shape[0], 2048, dtype=torch.int32, device="cuda")
    first = plan.run(*layer, out=out).clone()
    out.fill_(-7)
    again = plan.run(*layer, out=out)
    torch.cuda.synchronize()
    want = indexer.prefill_topk(*inp.args(), 2048, backend="triton")
    assert torch.equal(_sets(first), _sets(want))
    assert torch.equal(_sets(again), _sets(want))
    if flag == "1":
        assert all(r.replays >= 1 and not r.failed for r in runs)
