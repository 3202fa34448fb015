"""The vLLM adapter (indexer.integrations.vllm) on steps laid out as vLLM's metadata builder
lays them out: packed chunks, sub-chunks of a long request, decode rows ahead, a stale key
workspace, a wider output buffer; against a float64 reference of vLLM's semantics, and over
gloo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import indexer
from indexer.integrations import vllm as iv
from indexer.launch import run_ranks
from indexer.synthetic import Inputs, vllm_prefill_step

from conftest import assert_matches_naive

TOPK = 64
# request 0 and 1 packed in one gathering; request 2 cut into sub-chunks of 256 rows that reuse
# its gathering (with request 3, which has no query rows)
STEP = dict(seq_lens=[300, 200, 700, 40], query_lens=[100, 200, 600, 0], decode_rows=5, chunk_keys=800,
            subchunk_rows=256)
PAD_ROWS, PAD_COLS = 3, 5


def _step(seed=0):
    return vllm_prefill_step(**STEP, seed=seed)


def _buffer(step):
    # vLLM's buffer: every row of the step (and padding), wider than topk, prefilled by the
    # engine; the adapter writes only the prefill rows' first topk columns
    return torch.full((step.q.shape[0] + PAD_ROWS, TOPK + PAD_COLS), -7, dtype=torch.int32)


def _reference(step, chunk):
    # vLLM's semantics for one chunk, in float64, from the chunk's own gathering (conftest)
    keys = torch.cat([step.keys[r] for r in chunk.requests])
    scales = torch.cat([step.scales[r] for r in chunk.requests])
    rows = slice(chunk.token_start, chunk.token_end)
    return Inputs(step.q[rows], keys, scales, step.weights[rows], chunk.cu_seqlen_ks, chunk.cu_seqlen_ke)


def _assert_step(step, buf):
    for chunk in step.chunks:
        assert_matches_naive(buf[chunk.token_start:chunk.token_end, :TOPK], _reference(step, chunk), TOPK)
    first = step.chunks[0].token_start
    assert (buf[:first] == -7).all(), "decode rows are not the adapter's"
    assert (buf[step.chunks[-1].token_end:] == -7).all(), "padding rows untouched"
    assert (buf[:, TOPK:] == -7).all(), "columns past topk untouched"


def test_merge_subchunks_groups_by_gathering():
    step = _step()
    groups = iv.merge_subchunks(step.chunks)
    # the packed chunk alone; the long request's sub-chunks merged into one group
    assert [(g.token_start, g.token_end, len(g.chunks)) for g in groups] == [(5, 305, 1), (305, 905, 3)]
    assert groups[1].gathers and all(c.skip_kv_gather for c in groups[1].chunks[1:])
    assert torch.equal(groups[1].cu_seqlen_ke, torch.cat([c.cu_seqlen_ke for c in step.chunks[1:]]))
    assert groups[1].num_keys == 740


def test_prefill_topk_equals_vllm_semantics_with_stale_workspace():
    step = _step()
    k_quant, k_scale = step.workspace(stale=True)  # NaN bytes everywhere no gathering writes
    buf = _buffer(step)
    gathered = []

    def gather(chunk, kq, ks):
        gathered.append(chunk.requests)
        step.gather(chunk, kq, ks)

    out = iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, buf, TOPK, gather=gather)
    assert out is buf
    assert gathered == [(0, 1), (2, 3)]  # once a gathering, sub-chunks reuse it
    _assert_step(step, buf)


def test_merged_call_equals_one_call_a_chunk():
    # what vLLM's loop computes chunk by chunk, through indexer.prefill_topk directly
    step = _step(seed=1)
    k_quant, k_scale = step.workspace()
    buf = _buffer(step)
    iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, buf, TOPK, gather=step.gather)
    for chunk in step.chunks:
        step.gather(chunk, k_quant, k_scale)
        rows = slice(chunk.token_start, chunk.token_end)
        want = indexer.prefill_topk(step.q[rows], k_quant[:chunk.max_local_total_seq_lens],
                                    iv.key_scales(k_scale[:chunk.max_local_total_seq_lens]), step.weights[rows],
                                    chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, TOPK)
        assert torch.equal(buf[rows, :TOPK].sort(1).values, want.sort(1).values)


def test_a_group_without_keys_here_gets_empty_rows():
    # a chunk none of whose keys this rank holds (local_total_seq_lens 0): -1 rows, no gather,
    # whatever the workspace holds
    step = _step(seed=5)
    for chunk in step.chunks[1:]:
        chunk.local_total_seq_lens = 0
    k_quant, k_scale = step.workspace()
    buf = _buffer(step)
    gathered = []
    iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, buf, TOPK,
                    gather=lambda c, kq, ks: (gathered.append(c.requests), step.gather(c, kq, ks)))
    assert gathered == [(0, 1)]
    assert (buf[step.chunks[1].token_start:step.chunks[-1].token_end, :TOPK] == -1).all()
    assert_matches_naive(buf[step.chunks[0].token_start:step.chunks[0].token_end, :TOPK],
                         _reference(step, step.chunks[0]), TOPK)


def test_plan_once_run_every_layer_equals_the_one_shot_call():
    step = _step(seed=2)
    plan = iv.plan_prefill(step, heads=step.q.shape[1], head_dim=step.q.shape[2], topk=TOPK)
    assert "2 group(s)" in str(plan)
    k_quant, k_scale = step.workspace()
    for layer in range(2):  # other queries and weights each layer, the same bounds
        g = torch.Generator().manual_seed(layer)
        q = indexer.quantize_fp8(torch.randn(step.q.shape, generator=g))[0]
        w = torch.randn(step.weights.shape, generator=g)
        buf, want = _buffer(step), _buffer(step)
        plan.run(q, k_quant, k_scale, w, buf, gather=step.gather)
        iv.prefill_topk(step, q, k_quant, k_scale, w, want, TOPK, gather=step.gather)
        assert torch.equal(buf.sort(1).values, want.sort(1).values), layer


def test_a_plan_reads_the_bounds_as_they_were_when_it_was_made():
    # the metadata's owner refills its chunks' bound tensors for the next step (here with
    # windows one key long); a plan made before keeps computing the planned step
    step = _step(seed=6)
    plan = iv.plan_prefill(step, heads=step.q.shape[1], head_dim=step.q.shape[2], topk=TOPK)
    k_quant, k_scale = step.workspace()
    want = _buffer(step)
    plan.run(step.q, k_quant, k_scale, step.weights, want, gather=step.gather)
    for chunk in step.chunks:
        chunk.cu_seqlen_ke.copy_(chunk.cu_seqlen_ks + 1)
    buf = _buffer(step)
    plan.run(step.q, k_quant, k_scale, step.weights, buf, gather=step.gather)
    assert torch.equal(buf, want)


def test_non_finite_gathered_scales_name_the_rows_of_their_group():
    # the scales exist only once a group is gathered: the groups before it are written
    step = _step(seed=7)
    k_quant, k_scale = step.workspace()
    buf = _buffer(step)
    second = step.chunks[1]

    def gather(chunk, kq, ks):
        step.gather(chunk, kq, ks)
        if chunk is second:
            ks.view(torch.float32)[3] = float("nan")  # a key the group's rows read

    with pytest.raises(ValueError, match=r"rows \[305, 905\): k_scale must be finite"):
        iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, buf, TOPK, gather=gather)
    first = step.chunks[0]
    assert_matches_naive(buf[first.token_start:first.token_end, :TOPK], _reference(step, first), TOPK)
    assert (buf[second.token_start:] == -7).all()


def test_key_scales_take_vllms_layouts_and_refuse_block_scales():
    scales = torch.rand(6) + 0.5
    as_bytes = scales.view(torch.uint8).reshape(6, 4)
    assert torch.equal(iv.key_scales(as_bytes), scales)
    assert iv.key_scales(as_bytes).data_ptr() == as_bytes.data_ptr()  # a view, no copy
    assert torch.equal(iv.key_scales(scales[:, None]), scales)
    with pytest.raises(ValueError, match="k_scale.*several scales per key"):
        iv.key_scales(torch.zeros(6, dtype=torch.int32))  # UE8M0 exponents packed four to a key
    with pytest.raises(ValueError, match="k_scale"):
        iv.key_scales(torch.zeros(6, 2, dtype=torch.uint8))


@pytest.mark.parametrize("bad,match", [
    ("buffer_dtype", "topk_indices_buffer"), ("buffer_narrow", "topk_indices_buffer"), ("q_rows", "past q"),
    ("weights", "weights"), ("k_scale", "k_scale"), ("topk", "topk"), ("late_bounds", "cu_seqlen_ks"),
    ("chunk", "token_end"), ("order", "row order"), ("option", "unknown option")])
def test_bad_arguments_are_refused_before_any_gather_or_write(bad, match):
    step = _step(seed=3)
    k_quant, k_scale = step.workspace()
    buf = _buffer(step)
    args = dict(prefill=step.chunks, q=step.q, k_quant=k_quant, k_scale=k_scale, weights=step.weights,
                topk_indices_buffer=buf, topk=TOPK)
    if bad == "buffer_dtype":
        args["topk_indices_buffer"] = buf.long()
    elif bad == "buffer_narrow":
        args["topk_indices_buffer"] = buf[:, :TOPK - 1]
    elif bad == "q_rows":
        args["q"], args["weights"] = step.q[:100], step.weights[:100]
    elif bad == "weights":
        args["weights"] = step.weights.double()
    elif bad == "k_scale":
        args["k_scale"] = k_scale.view(torch.int32)
    elif bad == "topk":
        args["topk"] = 0
    elif bad == "late_bounds":  # the last group's windows reach past its keys
        last = step.chunks[-1]
        args["prefill"] = step.chunks[:-1] + [type(last)(**dict(vars(last), cu_seqlen_ke=last.cu_seqlen_ke + 10**6))]
    elif bad == "chunk":
        args["prefill"] = [object()]
    elif bad == "order":
        args["prefill"] = step.chunks[::-1]
    elif bad == "option":
        args["stratgy"] = "fold"
    gathered = []
    before = buf.clone()
    with pytest.raises(ValueError, match=match):
        iv.prefill_topk(**args, gather=lambda *a: gathered.append(a))
    assert not gathered and torch.equal(buf, before)


def _gloo_rank(rank, world):
    import torch.distributed as dist

    step = _step(seed=4)
    k_quant, k_scale = step.workspace()
    buf = _buffer(step)
    # min_rows_per_rank=0: shard these small groups (the default gate keeps them replicated)
    iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, buf, TOPK, gather=step.gather,
                    group=dist.group.WORLD, min_rows_per_rank=0)
    plan = iv.plan_prefill(step, heads=step.q.shape[1], head_dim=step.q.shape[2], topk=TOPK,
                           group=dist.group.WORLD, min_rows_per_rank=0)
    planned = _buffer(step)
    plan.run(step.q, k_quant, k_scale, step.weights, planned, gather=step.gather)
    return buf, planned, [p.info.sharded for p in plan.plans]


def _refused_reassembly_rank(rank, world):
    import torch.distributed as dist

    from indexer.collective.reassemble import ReassemblyError

    step = _step(seed=4)
    k_quant, k_scale = step.workspace()
    try:  # allgatherv needs NCCL: refused on gloo, with its own type
        iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, _buffer(step), TOPK, gather=step.gather,
                        group=dist.group.WORLD, min_rows_per_rank=0, reassembly="allgatherv")
    except ReassemblyError as exc:
        return type(exc).__name__, str(exc)
    return None


def test_a_refused_reassembly_keeps_its_error_type():
    for got in run_ranks(_refused_reassembly_rank, 2, timeout=600):
        assert got is not None and got[0] == "ReassemblyError" and "allgatherv" in got[1], got


@pytest.mark.parametrize("tp", [2, 3])
def test_gloo_every_rank_gets_the_replicated_table(tp):
    per_rank = run_ranks(_gloo_rank, tp, timeout=600)
    step = _step(seed=4)
    k_quant, k_scale = step.workspace()
    want = _buffer(step)
    iv.prefill_topk(step, step.q, k_quant, k_scale, step.weights, want, TOPK, gather=step.gather)
    _assert_step(step, want)
    for rank, (buf, planned, sharded) in enumerate(per_rank):
        assert all(sharded), rank
        assert torch.equal(buf.sort(1).values, want.sort(1).values), rank
        assert torch.equal(planned.sort(1).values, want.sort(1).values), rank
        assert torch.equal(buf, per_rank[0][0]) and torch.equal(planned, per_rank[0][1]), f"rank {rank} differs"


def test_the_example_runs():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "examples", "vllm_prefill.py")], capture_output=True,
                          text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the same sets as chunk by chunk: yes" in done.stdout


def test_bench_engines_runs_every_way_with_equal_sets(tmp_path):
    # the benchmark's plumbing on CPU (no timing asserted): every way fills the buffer with
    # the adapter's sets, and the adapter rows carry their ratio to the direct calls
    out = tmp_path / "engines.json"
    res = subprocess.run([sys.executable, "-m", "indexer", "bench", "engines", "--device", "cpu", "--repeats", "1",
                          "--rounds", "1", "--cases", "packed=3x256:64,long=8+1024:200/64", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())
    ways = {"adapter plan + run", "direct plan + run", "adapter one-shot", "direct one-shot", "indexer per chunk"}
    for case in ("packed", "long"):
        got = {r["way"]: r for r in rows if r["case"] == case}
        assert set(got) == ways and all(r["same"] for r in got.values())
        assert got["adapter plan + run"]["over_direct_sync"] > 0
    assert {r["chunks"] for r in rows if r["case"] == "long"} == {4}  # 200 rows in sub-chunks of 64
