"""Plan once, run per layer: indexer.plan + StepPlan.run against prefill_topk (CPU, gloo)."""

from __future__ import annotations

import os

import pytest
import torch

import indexer
from indexer.backends import get_backend
from indexer.backends.base import Chunk, chunk_bounds, chunk_end, plan_chunks
from indexer.backends.torch import TorchBackend
from indexer.launch import run_ranks
from indexer.problem import LayerInputs, validate
from indexer.synthetic import causal_bounds, make_inputs

from conftest import assert_matches_naive, sets_equal

TOPK = 8
HEADS, DIM = 2, 32


def _bounds():
    # a packed batch: a late chunk of a long request, a whole short request, a first chunk,
    # rows shorter than topk, and empty padding rows at key 0 and at key N
    inp = make_inputs([400, 60, 9, 200], [90, 60, 9, 50], heads=HEADS, head_dim=DIM, seed=0)
    s, e = inp.row_starts.clone(), inp.row_ends.clone()
    n = inp.k.shape[0]
    s[5:8], e[5:8] = 0, 0
    s[-2:], e[-2:] = n, n
    return s, e, n


def _layer(seed, m, n):
    # the tensors of one "layer": other values, same shapes
    gen = torch.Generator().manual_seed(seed)
    q, qs = indexer.quantize_fp8(torch.randn(m, HEADS, DIM, generator=gen))
    k, ks = indexer.quantize_fp8(torch.randn(n, DIM, generator=gen))
    w = torch.randn(m, HEADS, generator=gen) * qs
    return q, k, ks, w


def _plan(s, e, n, **kw):
    return indexer.plan(s, e, num_keys=n, heads=HEADS, head_dim=DIM, topk=TOPK, **kw)


def _backends():
    names = ["torch"]
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            import triton  # noqa: F401

            names.append("triton")
        except ImportError:
            pass
    return names


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("budget", [None, 0.01])
def test_one_plan_many_layers_equals_prefill_topk(backend, budget):
    s, e, n = _bounds()
    m = s.numel()
    plan = _plan(s.long(), e.long(), n, backend=backend, max_logits_mb=budget)  # int64 host bounds
    assert plan.info.backend == backend and plan.info.chunks >= 1
    for seed in range(3):
        q, k, ks, w = _layer(seed, m, n)
        want = indexer.prefill_topk(q, k, ks, w, s, e, TOPK, backend=backend, max_logits_mb=budget)
        got = plan.run(q, k, ks, w)
        assert torch.equal(got, want), seed  # bit for bit: the same plan, the same kernels
        assert (got[5:8] == -1).all() and (got[-2:] == -1).all()


def test_run_into_a_row_strided_view_of_a_wider_buffer():
    s, e, n = _bounds()
    m = s.numel()
    q, k, ks, w = _layer(1, m, n)
    buf = torch.full((m, TOPK + 5), 99, dtype=torch.int32)
    plan = _plan(s, e, n)
    res = plan.run(q, k, ks, w, out=buf[:, :TOPK])
    assert res.data_ptr() == buf.data_ptr()
    assert torch.equal(buf[:, :TOPK], indexer.prefill_topk(q, k, ks, w, s, e, TOPK))
    assert (buf[:, TOPK:] == 99).all()
    out2 = torch.empty(m, TOPK, dtype=torch.int32)
    assert torch.equal(indexer.prefill_topk(q, k, ks, w, s, e, TOPK, out=buf[:, 2 : 2 + TOPK]), buf[:, 2 : 2 + TOPK])
    assert torch.equal(plan.run(q, k, ks, w, out=out2), buf[:, 2 : 2 + TOPK])


def _mismatches(m, n):
    q, k, ks, w = _layer(0, m, n)
    return [
        ("q", TypeError, (q.float(), k, ks, w)),
        ("q", ValueError, (q[:-1], k, ks, w)),
        ("q", ValueError, (q[:, :1], k, ks, w)),
        ("k", TypeError, (q, k.to(torch.float8_e4m3fnuz), ks, w)),
        ("k", ValueError, (q, k[:-1], ks, w)),
        ("k_scale", ValueError, (q, k, ks[:-1], w)),
        ("k_scale", TypeError, (q, k, ks.double(), w)),
        ("weights", ValueError, (q, k, ks, w[:, :1])),
        ("weights", TypeError, (q, k, ks, "w")),
        ("weights", ValueError, (q, k, ks, w.to("meta"))),
    ]


@pytest.mark.parametrize("case", range(10))
def test_run_rejects_tensors_that_do_not_match_the_plan(case):
    s, e, n = _bounds()
    m = s.numel()
    name, err, args = _mismatches(m, n)[case]
    plan = _plan(s, e, n)
    out = torch.full((m, TOPK), 777, dtype=torch.int32)
    with pytest.raises(err, match=name):
        plan.run(*args, out=out)
    assert (out == 777).all()


@pytest.mark.parametrize("out,err", [
    (torch.zeros(12, TOPK, dtype=torch.int64), TypeError),
    (torch.zeros(12, TOPK + 1, dtype=torch.int32), ValueError),
    (torch.zeros(TOPK, 12, dtype=torch.int32).t(), ValueError),
    ("out", TypeError),
])
def test_run_rejects_a_bad_out(out, err):
    inp = make_inputs([40], [12], heads=HEADS, head_dim=DIM)
    plan = _plan(inp.row_starts, inp.row_ends, 40)
    with pytest.raises(err, match="out"):
        plan.run(inp.q, inp.k, inp.k_scale, inp.weights, out=out)


@pytest.mark.parametrize("kw,err,name", [
    (dict(num_keys=10), ValueError, "row_ends"),
    (dict(topk=0), ValueError, "topk"),
    (dict(heads=1.5), TypeError, "heads"),
    (dict(fp8_dtype=torch.float16), TypeError, "fp8_dtype"),
    (dict(backend="magic"), ValueError, "INDEXER_BACKEND"),
    (dict(check_values="sometimes"), ValueError, "INDEXER_CHECK_VALUES"),
])
def test_plan_rejects_bad_arguments(kw, err, name):
    inp = make_inputs([40], [12], heads=HEADS, head_dim=DIM)
    args = dict(num_keys=40, heads=HEADS, head_dim=DIM, topk=TOPK)
    args.update(kw)
    with pytest.raises(err, match=name):
        indexer.plan(inp.row_starts, inp.row_ends, **args)


def test_plan_rejects_bad_bounds():
    s = torch.tensor([0, 5, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="row_starts must be <= row_ends; row 2"):
        _plan(s, torch.tensor([4, 9, 2], dtype=torch.int32), 10)
    with pytest.raises(TypeError, match="row_ends"):
        _plan(s, torch.tensor([4.0, 9, 4]), 10)
    with pytest.raises(ValueError, match="row_ends must have shape"):
        _plan(s, torch.tensor([4, 9], dtype=torch.int32), 10)


def test_stale_scales_past_every_window_are_accepted_and_checked_only_where_read():
    # a shared key workspace: keys past every row's end hold stale bytes (NaN here)
    inp = make_inputs([300], [40], heads=HEADS, head_dim=DIM, seed=4)
    n = 300 + 50
    k = torch.cat((inp.k, inp.k[:50]))
    ks = torch.cat((inp.k_scale, torch.full((50,), float("nan"))))
    want = indexer.prefill_topk(*inp.args(), TOPK)
    got = indexer.prefill_topk(inp.q, k, ks, inp.weights, inp.row_starts, inp.row_ends, TOPK)
    assert torch.equal(got, want)
    plan = _plan(inp.row_starts, inp.row_ends, n, check_values="sync")
    assert torch.equal(plan.run(inp.q, k, ks, inp.weights), want)
    bad = ks.clone()
    bad[100] = float("inf")  # inside the rows' windows
    out = torch.full((40, TOPK), 5, dtype=torch.int32)
    with pytest.raises(ValueError, match="k_scale must be finite"):
        indexer.prefill_topk(inp.q, k, bad, inp.weights, inp.row_starts, inp.row_ends, TOPK, out=out)
    with pytest.raises(ValueError, match="k_scale must be finite"):
        plan.run(inp.q, k, bad, inp.weights, out=out)
    assert (out == 5).all()
    with pytest.raises(RuntimeError, match="k_scale must be finite"):  # a device assert, raised at once on CPU
        _plan(inp.row_starts, inp.row_ends, n, check_values="async").run(inp.q, k, bad, inp.weights)
    # off (a plan's default): no value read
    _plan(inp.row_starts, inp.row_ends, n).run(inp.q, k, bad, inp.weights)


def test_stale_scales_in_a_gap_between_the_windows_are_accepted():
    # two requests whose windows leave keys [150, 200) unread: a shared workspace's stale bytes
    s0, e0, n0 = causal_bounds([150], [30])
    s1, e1, _ = causal_bounds([100], [30])
    starts, ends = torch.cat((s0, s1 + 200)), torch.cat((e0, e1 + 200))
    n = 300
    q, k, ks, w = _layer(5, 60, n)
    plan = _plan(starts, ends, n, check_values="sync")
    assert plan.problem.key_spans == ((0, n0), (200, n))
    want = plan.run(q, k, ks, w)
    stale = ks.clone()
    stale[n0:200] = float("nan")
    assert torch.equal(plan.run(q, k, stale, w), want)
    assert torch.equal(_plan(starts, ends, n, check_values="async").run(q, k, stale, w), want)
    assert torch.equal(indexer.prefill_topk(q, k, stale, w, starts, ends, TOPK), indexer.prefill_topk(
        q, k, ks, w, starts, ends, TOPK))
    for key in (n0 - 1, 200):  # the last key the first request reads, the first of the second
        bad = stale.clone()
        bad[key] = float("nan")
        with pytest.raises(ValueError, match="k_scale must be finite"):
            plan.run(q, k, bad, w)
        with pytest.raises(ValueError, match="k_scale must be finite"):
            indexer.prefill_topk(q, k, bad, w, starts, ends, TOPK)
    # a window refreshed into the gap: the checks then read every key of the planned span
    moved = starts.clone(), ends.clone()
    moved[0][0], moved[1][0] = 160, 170
    plan.update_bounds(*moved)
    bad = ks.clone()
    bad[165] = float("nan")
    with pytest.raises(ValueError, match="k_scale must be finite"):
        plan.run(q, k, bad, w)


def test_key_spans_merge_overlapping_windows_in_any_row_order():
    starts = torch.tensor([50, 0, 10, 90, 70, 5], dtype=torch.int32)
    ends = torch.tensor([60, 20, 15, 100, 71, 5], dtype=torch.int32)  # the last row is empty
    plan = _plan(starts, ends, 120)
    assert plan.problem.key_spans == ((0, 20), (50, 60), (70, 71), (90, 100))
    assert plan.problem.key_range() == (0, 100)


def test_update_bounds_follows_new_windows_inside_the_planned_ones():
    # a size bucket: planned with every row at its widest window, run with shorter ones
    m, n = 64, 500
    wide_s = torch.zeros(m, dtype=torch.int32)
    wide_e = torch.full((m,), n, dtype=torch.int32)
    plan = _plan(wide_s, wide_e, n)
    q, k, ks, w = _layer(3, m, n)
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        s = torch.randint(0, 200, (m,), generator=gen, dtype=torch.int32)
        e = (s + torch.randint(0, 300, (m,), generator=gen, dtype=torch.int32)).clamp_max(n)
        plan.update_bounds(s, e)
        # the same sets (the order inside a row follows the block, here the planned one)
        assert sets_equal(plan.run(q, k, ks, w), indexer.prefill_topk(q, k, ks, w, s, e, TOPK)), seed
    # or copy into the device int32 bounds the plan was made with (it uses them in place)
    plan = _plan(wide_s, wide_e, n)
    wide_s.copy_(s), wide_e.copy_(e)
    plan.update_bounds()
    assert sets_equal(plan.run(q, k, ks, w), indexer.prefill_topk(q, k, ks, w, s, e, TOPK))


def test_update_bounds_refuses_bad_bounds_before_changing_anything():
    m, n = 16, 100
    s = torch.zeros(m, dtype=torch.int32)
    e = torch.full((m,), n, dtype=torch.int32)
    plan = _plan(s, e, n)  # CPU int32 bounds: used in place
    for bad in (dict(row_starts=s + 1, row_ends=torch.zeros(m)), dict(row_starts=s[:-1]),
                dict(row_starts=s + 5, row_ends=e - 99), dict(row_starts=s, row_ends=e + 1)):
        with pytest.raises(ValueError, match="row_"):
            plan.update_bounds(**bad)
        assert (s == 0).all() and (e == n).all() and (plan.chunks[0].lengths == n).all()


def test_update_bounds_checks_one_side_given_alone():
    m, n = 16, 100
    s = torch.arange(m, dtype=torch.int32)
    e = s + 50
    plan = _plan(s.clone(), e.clone(), n)
    row3 = torch.arange(m) == 3
    # against [0, N] (the other side may have been written in place since)
    for bad, match in ((dict(row_ends=torch.where(row3, n + 5, e)), "row_ends must be <= N"),
                       (dict(row_starts=torch.where(row3, -1, s)), "row_starts must be >= 0"),
                       (dict(row_starts=torch.where(row3, n + 1, s)), "row_starts must be <= row_ends"),
                       (dict(row_ends=torch.where(row3, (1 << 32) + e.long(), e.long())), "row_ends must be <= N")):
        with pytest.raises(ValueError, match=match):
            plan.update_bounds(**bad)
        assert torch.equal(plan.problem.row_starts, s) and torch.equal(plan.problem.row_ends, e)
    plan.update_bounds(row_ends=e - 20)
    plan.update_bounds(row_starts=s + 10)
    layer = _layer(6, m, n)
    assert sets_equal(plan.run(*layer), indexer.prefill_topk(*layer, s + 10, e - 20, TOPK))


@pytest.mark.skipif("triton" not in _backends(), reason="needs Triton's interpreter on CPU")
def test_a_window_past_a_compressed_chunk_spoils_only_its_own_row():
    # bounds refreshed past the plan (not checkable on the device without a sync): the
    # logits kernel must not write into the next row of the block
    s, e, n = _bounds()
    plan = _plan(s, e, n, backend="triton")
    (chunk,) = plan.chunks
    assert chunk.compressed
    s2, e2 = s.clone(), e.clone()
    s2[10], e2[10] = 0, chunk.width + 120  # longer than the block
    plan.update_bounds(s2, e2)
    layer = _layer(4, s.numel(), n)
    got = plan.run(*layer)
    want = indexer.prefill_topk(*layer, s2, e2, TOPK, backend="triton")
    others = torch.arange(s.numel()) != 10
    assert sets_equal(got[others], want[others])


def test_a_column_strided_out_is_refused_even_for_one_row():
    inp = make_inputs([40], [1], heads=HEADS, head_dim=DIM)
    plan = _plan(inp.row_starts, inp.row_ends, 40)
    buf = torch.zeros(1, 2 * TOPK, dtype=torch.int32)
    with pytest.raises(ValueError, match="out must have column stride 1"):
        plan.run(inp.q, inp.k, inp.k_scale, inp.weights, out=buf[:, ::2])


@pytest.mark.skipif("triton" not in _backends(), reason="needs Triton's interpreter on CPU")
def test_top_k_scratch_lives_beside_the_logits_workspace(monkeypatch):
    from indexer import workspace

    monkeypatch.setenv("INDEXER_TOPK", "triton")  # the Triton top-k (its scratch), in the interpreter
    workspace.release_workspaces()
    s, e, n = _bounds()
    plan = _plan(s, e, n, backend="triton", max_logits_mb=1.0)
    need = max(c.state["scratch_numel"] for c in plan.chunks if not c.empty)
    # views of the largest chunk's need; the logits workspace keeps its budget's size
    assert plan.workspace.numel() == max(c.num_rows * c.width for c in plan.chunks)
    assert plan.scratch.numel() == need and plan.scratch.dtype == torch.int64
    held = workspace.workspace_bytes()["cpu"]
    assert held == 4 * workspace.workspace_numel(2**20) + 8 * need
    workspace.release_workspaces()


@pytest.mark.cuda
def test_gpu_one_workspace_whether_the_device_is_named_with_its_index_or_not():
    # "cuda" is the current GPU: the same logits workspace and scratch as "cuda:N", not a
    # second block of the budget's size
    from indexer import workspace

    workspace.release_workspaces()
    here = torch.device("cuda", torch.cuda.current_device())
    a = workspace.logits_workspace("cuda", 16, 2**20)
    b = workspace.logits_workspace(here, 16, 2**20)
    assert a.data_ptr() == b.data_ptr() and len(workspace.logits_buffers()) == 1
    assert workspace.scratch_workspace("cuda", 16).data_ptr() == workspace.scratch_workspace(here, 16).data_ptr()
    workspace.release_workspaces()


def test_plan_says_what_it_decided():
    s, e, n = _bounds()
    plan = _plan(s, e, n, max_logits_mb=0.01)
    text = str(plan)
    assert "backend torch" in text and f"{plan.info.chunks} chunk(s)" in text and "no tensor-parallel group" in text
    assert plan.info.chunks == len(plan.chunks) > 3  # one chunk per request at least


class _CompressedTorch(TorchBackend):
    """The torch reference writing compressed blocks (row i's column j: key start_i + j),
    to drive the planner's and top-k's compressed layout on the CPU."""

    name = "torch"

    def compressed_logits(self, problem):
        return True

    def logits(self, problem, inputs, chunk: Chunk):
        if not chunk.compressed:
            return super().logits(problem, inputs, chunk)
        full = Chunk(chunk.rows, chunk.cols, chunk.cols[1] - chunk.cols[0])
        full.workspace = torch.empty(chunk.num_rows, full.width)
        block = super().logits(problem, inputs, full)
        col = torch.arange(chunk.width)
        src = (chunk.starts.long()[:, None] + col).clamp_max(full.width - 1)
        out = torch.gather(block, 1, src)
        return out.masked_fill_(col >= chunk.lengths.long()[:, None], float("-inf"))


def test_compressed_chunks_span_the_requests_of_a_packed_batch():
    inp = make_inputs([120] * 8, [40] * 8, heads=HEADS, head_dim=DIM, seed=6)
    problem, inputs = validate(*inp.args(), TOPK)
    torch_be = get_backend("torch")
    full = plan_chunks(torch_be, problem, [(0, problem.num_rows)], 2**30)
    assert len(full) == 8 and not any(c.compressed for c in full)  # one chunk per request
    comp = plan_chunks(_CompressedTorch(), problem, [(0, problem.num_rows)], 2**30)
    assert len(comp) == 1 and comp[0].compressed and comp[0].width == 120  # the longest window
    # one request: full-width (the same rows either way) is kept
    one = make_inputs([300], [50], heads=HEADS, head_dim=DIM)
    p1, _ = validate(*one.args(), TOPK)
    (c,) = plan_chunks(_CompressedTorch(), p1, [(0, 50)], 2**30)
    assert not c.compressed
    end, lo, hi = chunk_end(_CompressedTorch(), problem, 0, problem.num_rows, 2**30, compressed=True)
    assert (end, lo, hi) == (problem.num_rows, 0, 8 * 120)


@pytest.mark.parametrize("topk_kind", _backends())
def test_compressed_layout_gives_the_same_table(monkeypatch, topk_kind):
    from indexer import backends

    inp = make_inputs([120] * 6 + [30], [40] * 6 + [30], heads=HEADS, head_dim=DIM, seed=8)
    want = indexer.prefill_topk(*inp.args(), TOPK)
    if topk_kind == "triton":
        monkeypatch.setattr(_CompressedTorch, "prepare", lambda self, p, chunks: _prepare_triton(p, chunks))
        monkeypatch.setattr(_CompressedTorch, "bind", lambda self, p, chunks: _bind(chunks))
    backends.register_backend("torch", _CompressedTorch())
    try:
        _, info = indexer.prefill_topk_with_info(*inp.args(), TOPK)
        assert info.compressed_chunks == info.chunks == 1
        got = indexer.prefill_topk(*inp.args(), TOPK)
    finally:
        backends.register_backend("torch", "indexer.backends.torch")
    assert torch.equal(got.sort(1).values, want.sort(1).values)


def _prepare_triton(problem, chunks):
    from indexer.topk import prepare_topk

    prepare_topk(problem, chunks, "triton")


def _bind(chunks):
    from indexer.topk import bind_topk

    bind_topk(chunks)


@pytest.mark.skipif("triton" not in _backends(), reason="needs Triton's interpreter on CPU")
def test_triton_compressed_chunks_select_the_full_width_sets(monkeypatch):
    from indexer.backends.triton import TritonBackend

    s, e, n = _bounds()
    layer = _layer(2, s.numel(), n)
    plan = _plan(s, e, n, backend="triton")
    assert plan.info.compressed_chunks == plan.info.chunks == 1  # the whole packed batch
    got = plan.run(*layer)
    monkeypatch.setattr(TritonBackend, "compressed_logits", lambda self, problem: False)
    full = _plan(s, e, n, backend="triton")
    assert full.info.compressed_chunks == 0 and full.info.chunks == 4
    assert sets_equal(got, full.run(*layer))


def test_layer_inputs_are_a_named_tuple_of_the_four_tensors():
    inp = make_inputs([40], [12], heads=HEADS, head_dim=DIM)
    _, layer = validate(*inp.args(), TOPK)
    assert isinstance(layer, LayerInputs) and layer.q is inp.q and layer.weights is inp.weights


# --- over gloo: one plan per rank, reused across layers, every strategy and reassembly --------

STRATEGIES = ("contiguous", "remainder0", "fold", "balanced", "striped", "auto")
MODES = ("ring", "padded", "maxreduce", "auto")


def _gloo_rank(rank, world):
    import torch.distributed as dist

    os.environ["INDEXER_TP_SHARD_STRIPE_ROWS"] = "16"
    s, e, n = _bounds()
    m = s.numel()
    results = {}
    layers = [_layer(seed, m, n) for seed in range(2)]
    for strategy in STRATEGIES:
        for mode in MODES:
            if mode == "ring" and strategy not in ("remainder0", "fold", "auto"):
                continue
            plan = _plan(s, e, n, group=dist.group.WORLD, strategy=strategy, reassembly=mode, min_rows_per_rank=0)
            tables = []
            for li, layer in enumerate(layers):
                if li == 0:
                    out = plan.run(*layer)
                else:  # a row-strided view: exchanged in the plan's table, then copied
                    buf = torch.full((m, TOPK + 3), -7, dtype=torch.int32)
                    out = plan.run(*layer, out=buf[:, :TOPK])
                    assert (buf[:, TOPK:] == -7).all()
                tables.append(out.clone())
            results[(strategy, mode)] = (tables, plan.info.sharded, plan.info.reassembly)
    return results


@pytest.mark.parametrize("tp", [2, 3])
def test_gloo_plan_reused_across_layers_equals_replicated(tp):
    per_rank = run_ranks(_gloo_rank, tp, timeout=900)
    s, e, n = _bounds()
    want = [indexer.prefill_topk(*_layer(seed, s.numel(), n), s, e, TOPK) for seed in range(2)]
    for key, (tables, sharded, mode) in per_rank[0].items():
        assert sharded, key
        for layer, table in enumerate(tables):
            assert torch.equal(table.sort(1).values, want[layer].sort(1).values), (key, layer)
            for r in range(1, tp):
                assert torch.equal(per_rank[r][key][0][layer], table), (key, layer, r)
    assert len(per_rank[0]) == 6 * 3 + 3


# --- on a GPU: no sync, no allocation, CUDA-graph replay -----------------------------------


def _gpu_backends():
    names = []
    for name in ("deepgemm", "triton"):
        try:
            ok = not get_backend(name).not_supported_reasons(None)
        except Exception:  # noqa: BLE001
            ok = False
        names.append(pytest.param(name, marks=[] if ok else pytest.mark.skip(reason=f"{name} cannot run here")))
    return names


def _gpu_step(backend, seq=(9000, 700, 3000), q=(2000, 700, 300), heads=64):
    inp = make_inputs(list(seq), list(q), heads=heads, head_dim=128, device="cuda", seed=5)
    plan = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=inp.k.shape[0], heads=heads, head_dim=128,
                        topk=512, device="cuda", backend=backend)
    return inp, plan


@pytest.mark.cuda
@pytest.mark.parametrize("backend", _gpu_backends())
def test_gpu_run_makes_no_sync_and_no_allocation(backend):
    inp, plan = _gpu_step(backend)
    out = torch.empty(inp.q.shape[0], 512, dtype=torch.int32, device="cuda")
    layer = (inp.q, inp.k, inp.k_scale, inp.weights)
    plan.run(*layer, out=out)  # warm-up: JIT compiles, first launches
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            plan.run(*layer, out=out)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    # DeepGEMM allocates its logits itself, one block a chunk; nothing else allocates
    assert allocated == (3 * plan.info.chunks if backend == "deepgemm" else 0)
    # the same sets (the Triton top-k's write order inside a row follows the warps' timing)
    want = indexer.prefill_topk(*inp.args(), 512, backend=backend)
    assert torch.equal(out.sort(1).values, want.sort(1).values)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", _gpu_backends())
def test_gpu_graph_replay_equals_eager(backend):
    inp, plan = _gpu_step(backend)
    m = inp.q.shape[0]
    out = torch.empty(m, 512, dtype=torch.int32, device="cuda")
    layer = (inp.q, inp.k, inp.k_scale, inp.weights)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(*layer, out=out)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(*layer, out=out)
    for seed in range(2):
        # a new layer's values in the captured tensors
        other = make_inputs([9000, 700, 3000], [2000, 700, 300], heads=64, head_dim=128, device="cuda", seed=20 + seed)
        for dst, src in zip(layer, (other.q, other.k, other.k_scale, other.weights)):
            dst.copy_(src)
        out.fill_(-5)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.sort(1).values, plan.run(*layer).sort(1).values), seed


@pytest.mark.cuda
def test_gpu_deepgemm_packed_batch_in_compressed_chunks():
    if get_backend("deepgemm").not_supported_reasons(None):
        pytest.skip("deepgemm cannot run here")
    from indexer.backends import deepgemm as dg

    if not get_backend("deepgemm").compressed_logits(None):
        pytest.skip("this DeepGEMM has no max_seqlen_k")
    seq, q = [16384] * 4, [1024] * 4
    inp, plan = _gpu_step("deepgemm", seq, q)
    assert plan.info.compressed_chunks >= 1 and plan.info.chunks < 4
    got = plan.run(inp.q, inp.k, inp.k_scale, inp.weights)
    # full-width chunks of the same DeepGEMM kernel: bit-identical logits, the same sets
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dg.DeepGemmBackend, "compressed_logits", lambda self, problem: False)
        _, full = _gpu_step("deepgemm", seq, q)
        assert full.info.compressed_chunks == 0 and full.info.chunks == 4
        want = full.run(inp.q, inp.k, inp.k_scale, inp.weights)
    assert torch.equal(got.sort(1).values, want.sort(1).values)


def _graph_rank(rank, world):
    import torch.distributed as dist

    inp = make_inputs([20000, 4000], [6000, 4000], heads=64, head_dim=128, device=f"cuda:{rank}", seed=3)
    n = inp.k.shape[0]
    ref = indexer.prefill_topk(*inp.args(), 2048)
    results = []
    # one exchange; waves from a budget that gives every rank several chunks; 3 forced waves
    for kw in (dict(exchange_waves=1), dict(max_logits_mb=256, exchange_waves="auto"), dict(exchange_waves=3)):
        plan = indexer.plan(inp.row_starts.cpu(), inp.row_ends.cpu(), num_keys=n, heads=64, head_dim=128, topk=2048,
                            device=f"cuda:{rank}", group=dist.group.WORLD, min_rows_per_rank=0, **kw)
        out = torch.empty(inp.q.shape[0], 2048, dtype=torch.int32, device=f"cuda:{rank}")
        layer = (inp.q, inp.k, inp.k_scale, inp.weights)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            plan.run(*layer, out=out)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            plan.run(*layer, out=out)
        out.fill_(-5)
        g.replay()
        torch.cuda.synchronize()
        results.append((bool(torch.equal(out.sort(1).values, ref.sort(1).values)), plan.info.sharded,
                        plan.info.reassembly, plan.info.waves))
    return results


@pytest.mark.cuda
@pytest.mark.multi_gpu
def test_gpu_sharded_graph_replay_equals_replicated():
    world = min(torch.cuda.device_count(), 4)
    for results in run_ranks(_graph_rank, world, backend="nccl", timeout=600):
        for same, sharded, mode, waves in results:
            assert sharded and same, (mode, waves)
        assert [waves for *_, waves in results][0] == 1 and results[1][3] > 1 and results[2][3] == 3, results


def test_chunks_start_at_the_key_alignment_their_backend_needs(monkeypatch):
    # DeepGEMM reads k_scale[lo:] through a TMA descriptor (a 16-byte aligned address): its
    # chunks start at multiples of 4 keys, the windows relative to that start
    s, e, n = causal_bounds([101, 99, 300], [30, 99, 70])
    problem = indexer.problem.make_problem(s, e, num_keys=n, heads=HEADS, head_dim=DIM, topk=TOPK)
    deepgemm = get_backend("deepgemm")
    assert deepgemm.key_align == 4
    los = [cols[0] for _, cols, _ in chunk_bounds(deepgemm, problem, [(0, problem.num_rows)], 1 << 16)]
    assert 100 in los and all(lo % 4 == 0 for lo in los), los  # the second request starts at key 101
    # the same rule on the torch backend: every set exact
    monkeypatch.setattr(TorchBackend, "key_align", 4)
    inp = make_inputs([101, 99, 300], [30, 99, 70], heads=HEADS, head_dim=DIM, seed=9)
    plan = _plan(inp.row_starts, inp.row_ends, n, backend="torch", max_logits_mb=0.05)
    assert len(plan.chunks) > 2 and all(c.cols[0] % 4 == 0 for c in plan.chunks), [c.cols for c in plan.chunks]
    assert_matches_naive(plan.run(inp.q, inp.k, inp.k_scale, inp.weights), inp, TOPK)
