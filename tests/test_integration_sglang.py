"""The SGLang adapter (indexer.integrations.sglang) on extend batches laid out as SGLang's DSA
backend lays them out: requests with cached prefixes gathered into one key buffer, a wider
topk_result with rows past the extend rows; each index transform against a float64
reference of SGLang's semantics, planned over layers, refusals, and over gloo."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import indexer
from indexer.integrations import sglang as isg
from indexer.launch import run_ranks
from indexer.synthetic import Inputs, sglang_extend_batch

from conftest import assert_matches_naive

TOPK = 64
# a request with a cached prefix, one whole prefill, one shorter than topk, one with no rows
BATCH = dict(seq_lens=[500, 300, 40, 90], extend_lens=[200, 300, 40, 0])
PAD_ROWS, PAD_COLS = 3, 5


def _batch(seed=0):
    return sglang_extend_batch(**BATCH, heads=4, head_dim=32, seed=seed)


def _buffer(b):
    return torch.full((b.q_fp8.shape[0] + PAD_ROWS, TOPK + PAD_COLS), -7, dtype=torch.int32)


def _undo(buf, b, transform):
    # SGLang's transform undone: every written index must map back to a position of the row's
    # request; returns the row-relative table
    rows = b.ks.numel()
    sel = buf[:rows, :TOPK].clone()
    valid = sel >= 0
    if transform == "ragged":
        sel = torch.where(valid, sel - b.topk_indices_offset[:, None].to(torch.int32), sel)
    elif transform == "paged":
        where = {}
        for r, row in enumerate(b.page_table_1.tolist()):
            where.update({(r, slot): j for j, slot in enumerate(row) if slot >= 0})
        for i in range(rows):
            r = int(b.token_to_batch_idx[i])
            for c in range(TOPK):
                if valid[i, c]:
                    assert (r, int(sel[i, c])) in where, f"row {i}: slot {int(sel[i, c])} is not request {r}'s"
                    sel[i, c] = where[(r, int(sel[i, c]))]
    return sel


def _assert_table(buf, b, transform, tol=1e-6):
    # the row-relative sets against the float64 reference (conftest: ties at the k-th value to
    # the lowest index, near-ties within tol aside)
    rows = b.ks.numel()
    sel = _undo(buf, b, transform)
    inp = Inputs(b.q_fp8, b.k_fp8, b.k_scale.view(torch.float32).reshape(-1), b.weights.squeeze(-1), b.ks, b.ke)
    assert_matches_naive(sel, inp, TOPK, tol=tol)
    assert (buf[rows:] == -7).all(), "rows past the extend rows untouched"
    assert (buf[:, TOPK:] == -7).all(), "columns past topk untouched"


def _kw(b, transform):
    return dict(transform=transform, topk_indices_offset=b.topk_indices_offset, page_table_1=b.page_table_1,
                token_to_batch_idx=b.token_to_batch_idx)


@pytest.mark.parametrize("topk", [1, 100, 2048, 3000])
def test_index_map_kernel_equals_torch_ops(topk):
    # map_indices_ (Triton's kernel; the interpreter here) against the torch ops it replaces,
    # on a row-strided view of a wider buffer: offsets of both widths (int32 wraparound) and
    # strided, a table lookup (strided row vector); -1 padding kept, the buffer's columns past
    # the view untouched
    from indexer.integrations.index_map import map_indices_, map_indices_reference_
    from indexer.topk.triton import launch_reasons

    reasons = launch_reasons(torch.device("cpu"))
    if reasons:  # (else both sides would be the torch ops)
        pytest.skip("; ".join(reasons))
    g = torch.Generator().manual_seed(topk)
    rows, b, w = 6, 3, 5000
    base = torch.randint(0, w, (rows, topk + 7), generator=g, dtype=torch.int32)
    base[:, 1::3] = -1
    base[2] = -1
    cases = [dict(offsets=torch.randint(0, 1 << 20, (rows,), generator=g, dtype=torch.int32)),
             dict(offsets=torch.tensor([0, 1, (1 << 31) - 10, 5, -3, 1 << 40], dtype=torch.int64)),
             dict(offsets=torch.randint(0, 1 << 20, (rows, 3), generator=g, dtype=torch.int32)[:, 1]),
             dict(table=torch.randint(0, 1 << 30, (b, w), generator=g, dtype=torch.int32),
                  table_rows=torch.tensor([2, 0, 1, 1, 0, 2])),
             dict(table=torch.randint(0, 1 << 30, (b, w), generator=g, dtype=torch.int32),
                  table_rows=torch.tensor([[2, 9], [0, 9], [1, 9], [1, 9], [0, 9], [2, 9]])[:, 0])]
    for kw in cases:
        got, want = base.clone(), base.clone()
        map_indices_(got[:, :topk], **kw)
        map_indices_reference_(want[:, :topk], **kw)
        assert torch.equal(got, want), kw
        assert torch.equal(got[:, topk:], base[:, topk:]) and bool((got[:, :topk][base[:, :topk] < 0] == -1).all())
        assert not torch.equal(got, base)
    table, table_rows = cases[3]["table"], cases[3]["table_rows"]
    with pytest.raises(ValueError, match="offsets, or table"):
        map_indices_(base, offsets=cases[0]["offsets"], table=table, table_rows=table_rows)
    with pytest.raises(ValueError, match="offsets, or table"):
        map_indices_(base, table=table)
    # refused before any kernel, the table untouched: a vector of another length, a 1-D table
    before = base.clone()
    with pytest.raises(ValueError, match="offsets must be"):
        map_indices_(base, offsets=cases[0]["offsets"][:-1])
    with pytest.raises(ValueError, match="table_rows must be"):
        map_indices_(base, table=table, table_rows=table_rows[:-1])
    with pytest.raises(ValueError, match="table must be"):
        map_indices_(base, table=table[0], table_rows=table_rows)
    assert torch.equal(base, before)


@pytest.mark.parametrize("transform", ["ragged", "paged", "relative"])
def test_prefill_topk_equals_sglang_semantics(transform):
    b = _batch()
    buf = _buffer(b)
    out = isg.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke, TOPK, buf, **_kw(b, transform))
    assert out is buf
    _assert_table(buf, b, transform)


@pytest.mark.cuda
@pytest.mark.parametrize("transform", ["ragged", "paged"])
def test_gpu_adapter_equals_the_direct_call(transform):
    # on a GPU (automatic backend, the Triton top-k, the index kernel compiled), one-shot and
    # planned over two layers: SGLang's transform undone gives the direct row-relative table's
    # sets; that table matches the float64 reference of the same batch on the CPU (near-ties
    # within the GPU logits' fp32 error, 1e-4 of the k-th value, aside)
    lens = dict(seq_lens=[3000, 1600, 300, 500], extend_lens=[1000, 1600, 300, 0])
    b = sglang_extend_batch(**lens, heads=8, head_dim=32, device="cuda", seed=4)
    ref = sglang_extend_batch(**lens, heads=8, head_dim=32, seed=4)
    inp = Inputs(b.q_fp8, b.k_fp8, b.k_scale.view(torch.float32).reshape(-1), b.weights.squeeze(-1), b.ks, b.ke)
    direct = indexer.prefill_topk(*inp.args(), TOPK).cpu()
    assert_matches_naive(direct, inp, TOPK, tol=1e-4)
    want = direct.sort(1).values
    buf = _buffer(b).cuda()
    isg.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke, TOPK, buf, **_kw(b, transform))
    assert torch.equal(_undo(buf.cpu(), ref, transform).sort(1).values, want)
    plan = isg.plan_prefill(b.ks, b.ke, num_keys=b.k_fp8.shape[0], heads=8, head_dim=32, topk=TOPK,
                            **_kw(b, transform))
    for _ in range(2):
        planned = _buffer(b).cuda()
        plan.run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, planned)
        assert torch.equal(_undo(planned.cpu(), ref, transform).sort(1).values, want)


@pytest.mark.cuda
def test_gpu_index_map_kernel_equals_torch_ops():
    # the compiled kernel (not the interpreter) against the torch ops, both transforms
    from indexer.integrations.index_map import map_indices_, map_indices_reference_

    g = torch.Generator().manual_seed(5)
    base = torch.randint(0, 20000, (3000, 2048 + 7), generator=g, dtype=torch.int32)
    base[torch.rand(base.shape, generator=g) < 0.1] = -1
    table = torch.randint(0, 1 << 30, (8, 20000), generator=g, dtype=torch.int32)
    for kw in (dict(offsets=torch.randint(0, 1 << 20, (3000,), generator=g)),
               dict(table=table, table_rows=torch.randint(0, 8, (3000,), generator=g))):
        want = base.clone()
        map_indices_reference_(want[:, :2048], **kw)
        got = base.cuda()
        map_indices_(got[:, :2048], **{k: v.cuda() for k, v in kw.items()})
        assert torch.equal(got.cpu(), want)


def test_ragged_offsets_other_than_ks():
    # context parallelism gives offsets of its own: they, not ks, are added
    b = _batch()
    b.topk_indices_offset = b.ks + 1000
    buf = _buffer(b)
    isg.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke, TOPK, buf, **_kw(b, "ragged"))
    _assert_table(buf, b, "ragged")


def test_no_buffer_gives_a_fresh_table():
    b = _batch()
    out = isg.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale.view(torch.float32).reshape(-1), b.weights.squeeze(-1), b.ks,
                           b.ke, TOPK, transform="paged", page_table_1=b.page_table_1,
                           token_to_batch_idx=b.token_to_batch_idx)
    assert out.shape == (b.q_fp8.shape[0], TOPK)
    buf = _buffer(b)
    buf[:out.shape[0], :TOPK] = out
    _assert_table(buf, b, "paged")


def test_plan_over_layers_equals_one_shot():
    b = _batch()
    plan = isg.plan_prefill(b.ks, b.ke, num_keys=b.k_fp8.shape[0], heads=4, head_dim=32, topk=TOPK,
                            **_kw(b, "paged"))
    assert "transform paged" in str(plan)
    for layer in range(2):  # other queries and keys each layer, the same plan
        c = sglang_extend_batch(**BATCH, heads=4, head_dim=32, seed=10 + layer)
        c.page_table_1, c.token_to_batch_idx = b.page_table_1, b.token_to_batch_idx
        buf = _buffer(c)
        plan.run(c.q_fp8, c.k_fp8, c.k_scale, c.weights, buf)
        _assert_table(buf, c, "paged")


@pytest.mark.parametrize("transform", ["ragged", "paged"])
def test_a_plan_keeps_the_bounds_it_was_made_with(transform):
    # SGLang refills its metadata tensors for the next forward step
    b = _batch(seed=3)
    plan = isg.plan_prefill(b.ks, b.ke, num_keys=b.k_fp8.shape[0], heads=4, head_dim=32, topk=TOPK,
                            **_kw(b, transform))
    b.ks.zero_()  # ks is also SGLang's topk_indices_offset
    b.ke.fill_(1)
    b.token_to_batch_idx.zero_()
    b = _batch(seed=3)  # the inputs (and bounds) as planned, for the check
    buf = _buffer(b)
    plan.run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, buf)
    _assert_table(buf, b, transform)


@pytest.mark.parametrize("bad,match", [
    ("transform", "transform must be one of"),
    ("no_table", "needs page_table_1"),
    ("batch_idx", "token_to_batch_idx must be in"),
    ("narrow_table", "page_table_1 has"),
    ("offsets", "topk_indices_offset must be"),
    ("weights", "weights must be float32"),
    ("small_buffer", "topk_result must be int32"),
    ("bounds", "row_ends must be <= N"),
    ("k_scale", "k_scale must be uint8"),
])
def test_bad_input_is_refused_before_any_kernel(bad, match):
    b = _batch()
    kw = _kw(b, "paged" if bad in ("no_table", "batch_idx", "narrow_table") else "ragged")
    args = dict(q_fp8=b.q_fp8, k_fp8=b.k_fp8, k_scale=b.k_scale, weights=b.weights, ks=b.ks, ke=b.ke, topk=TOPK)
    buf = _buffer(b)
    if bad == "transform":
        kw["transform"] = "absolute"
    elif bad == "no_table":
        kw["page_table_1"] = None
    elif bad == "batch_idx":
        kw["token_to_batch_idx"] = b.token_to_batch_idx.clone()
        kw["token_to_batch_idx"][7] = 4
    elif bad == "narrow_table":
        kw["page_table_1"] = b.page_table_1[:, :100]
    elif bad == "offsets":
        kw["topk_indices_offset"] = b.topk_indices_offset[:-1]
    elif bad == "weights":
        args["weights"] = b.weights.half()
    elif bad == "small_buffer":
        buf = buf[:, :TOPK - 1]
    elif bad == "bounds":
        args["ke"] = b.ke.clone()
        args["ke"][-1] = b.k_fp8.shape[0] + 1
    elif bad == "k_scale":
        args["k_scale"] = b.k_scale.view(torch.int32)
    before = buf.clone()
    with pytest.raises(ValueError, match=match):
        isg.prefill_topk(**args, topk_result=buf, **kw)
    assert torch.equal(buf, before)


def _gloo_rank(rank, world):
    import torch.distributed as dist

    b = _batch(seed=3)
    buf = _buffer(b)
    isg.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke, TOPK, buf, group=dist.group.WORLD,
                     min_rows_per_rank=0, **_kw(b, "paged"))
    plan = isg.plan_prefill(b.ks, b.ke, num_keys=b.k_fp8.shape[0], heads=4, head_dim=32, topk=TOPK,
                            group=dist.group.WORLD, min_rows_per_rank=0, **_kw(b, "ragged"))
    planned = _buffer(b)
    plan.run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, planned)
    return buf, planned, plan.plan.info.sharded


@pytest.mark.parametrize("tp", [2, 3])
def test_gloo_every_rank_gets_the_replicated_table(tp):
    per_rank = run_ranks(_gloo_rank, tp, timeout=600)
    b = _batch(seed=3)
    for rank, (buf, planned, sharded) in enumerate(per_rank):
        assert sharded, rank
        _assert_table(buf, b, "paged")
        _assert_table(planned, b, "ragged")
        assert torch.equal(buf, per_rank[0][0]) and torch.equal(planned, per_rank[0][1]), f"rank {rank} differs"


def test_the_example_runs():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "examples", "sglang_prefill.py")], capture_output=True,
                          text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the same sets as SGLang's transform of the reference: yes" in done.stdout


def test_bench_engines_sglang_rows(tmp_path):
    # the benchmark's plumbing on CPU (no timing asserted)
    import json

    out = tmp_path / "engines.json"
    res = subprocess.run([sys.executable, "-m", "indexer", "bench", "engines", "--engine", "sglang", "--device", "cpu",
                          "--repeats", "1", "--rounds", "1", "--cases", "two=300:100+200:200", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["way"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"direct plan + run (relative)", "adapter plan + run, ragged", "adapter plan + run, paged",
                         "direct one-shot (relative)", "adapter one-shot, paged"}
    assert rows["adapter plan + run, paged"]["over_direct_sync"] > 0 and rows["adapter plan + run, paged"]["rows"] == 300
