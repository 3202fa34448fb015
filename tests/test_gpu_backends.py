"""Vendor backends on real GPUs against the torch reference (skipped without the hardware)."""

from __future__ import annotations

import pytest
import torch

import indexer
from indexer.backends import get_backend
from indexer.backends.base import single_chunk
from indexer.problem import validate
from indexer.synthetic import make_inputs

LOGITS_RTOL = 2e-3


def _problem(inp, topk):
    return validate(*inp.args(), topk)


def _logits(name, problem, inputs, compressed=False):
    # one chunk of every row over every key
    backend = get_backend(name)
    chunk = single_chunk(backend, problem, (0, problem.num_rows), (0, problem.num_keys), compressed)
    return backend.logits(problem, inputs, chunk)


def _reference_logits(problem, inputs):
    return _logits("torch", problem, inputs)


def _have(name):
    reasons = get_backend(name).not_supported_reasons(None)
    return not reasons, "; ".join(reasons)


def _inputs(heads, seed, seqs=(3000, 700, 900)):
    # varlen: a late chunk of a long request, a whole short request, a first chunk
    return make_inputs(list(seqs), [600, seqs[1], 300], heads=heads, head_dim=128, device="cuda", seed=seed)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["deepgemm", "triton"])
@pytest.mark.parametrize("heads", [32, 64])
def test_logits_match_reference(name, heads):
    ok, why = _have(name)
    if not ok:
        pytest.skip(why)
    inp = _inputs(heads, seed=heads)
    problem, inputs = _problem(inp, 64)
    want = _reference_logits(problem, inputs)
    got = _logits(name, problem, inputs)
    valid = torch.isfinite(want)
    # only the windows are specified (DeepGEMM runs without its -inf pass)
    assert torch.isfinite(got[valid]).all()
    if name == "triton":
        assert (got[~valid] == float("-inf")).all()
    err = (got[valid] - want[valid]).abs().max() / want[valid].abs().max()
    assert err < LOGITS_RTOL, f"{name}: relative error {err:.2e}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["deepgemm", "triton"])
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("seqs", [(3000, 700, 900), (3001, 699, 901)], ids=["aligned", "odd_offsets"])
def test_topk_sets_match_reference(name, heads, seqs):
    # odd offsets: the second request starts at key 3001: DeepGEMM's key scales must
    # still reach it 16-byte aligned (its TMA descriptor)
    ok, why = _have(name)
    if not ok:
        pytest.skip(why)
    inp = _inputs(heads, seed=100 + heads, seqs=seqs)
    topk = 256
    got = indexer.prefill_topk(*inp.args(), topk, backend=name)
    want = indexer.prefill_topk(*inp.args(), topk, backend="torch")
    logits = _reference_logits(*_problem(inp, topk))
    starts = inp.row_starts.long()
    mismatched = 0
    for m in torch.nonzero((got.sort(1).values != want.sort(1).values).any(1)).flatten().tolist():
        mismatched += 1
        row = logits[m, starts[m]:inp.row_ends[m]]
        kth = row.topk(topk).values[-1]
        diff = set(got[m].tolist()) ^ set(want[m].tolist())
        # a differing key must be a near-tie of the k-th value (fp32 accumulation order)
        assert all(abs(float(row[x]) - float(kth)) <= LOGITS_RTOL * float(row.abs().max()) for x in diff if x >= 0), m
    assert mismatched <= got.shape[0] // 10, f"{mismatched} rows differ"


@pytest.mark.cuda
def test_auto_dispatch_picks_deepgemm_on_hopper():
    ok, why = _have("deepgemm")
    if not ok:
        pytest.skip(why)
    inp = _inputs(64, seed=1)
    _, info = indexer.prefill_topk_with_info(*inp.args(), 64)
    assert info.backend == "deepgemm"


def _nccl_rank(rank, world, name, heads):
    import os

    import torch.distributed as dist

    inp = make_inputs([5000, 1200], [2000, 1200], heads=heads, head_dim=128, device=f"cuda:{rank}", seed=7)
    ref = indexer.prefill_topk(*inp.args(), 512, backend=name)
    out = {}
    for strategy in ("contiguous", "remainder0", "fold", "balanced", "striped", "auto"):
        for mode in ("allgatherv", "ring", "padded", "maxreduce", "auto"):
            if mode == "ring" and strategy not in ("remainder0", "fold"):
                continue
            res, info = indexer.prefill_topk_with_info(
                *inp.args(), 512, group=dist.group.WORLD, backend=name, strategy=strategy, reassembly=mode, min_rows_per_rank=0
            )
            out[(strategy, mode)] = (bool((res.sort(1).values == ref.sort(1).values).all()), info.reassembly, res.cpu())
    for strategy in ("balanced", "fold", "striped"):
        for mode in ("allgatherv", "padded"):
            # in waves: forced, and from a budget that gives every rank several chunks
            for waves, budget in (("3", None), ("auto", 4)):
                os.environ["INDEXER_EXCHANGE_WAVES"] = waves  # (the plan cache keys on INDEXER_*)
                res, info = indexer.prefill_topk_with_info(
                    *inp.args(), 512, group=dist.group.WORLD, backend=name, strategy=strategy, reassembly=mode,
                    min_rows_per_rank=0, max_logits_mb=budget)
                del os.environ["INDEXER_EXCHANGE_WAVES"]
                assert info.waves > 1, (strategy, mode, waves, info.reason)
                out[(strategy, mode, waves)] = (bool((res.sort(1).values == ref.sort(1).values).all()),
                                                info.reassembly, res.cpu())
    return out


@pytest.mark.cuda
@pytest.mark.multi_gpu
@pytest.mark.parametrize("name,heads", [("deepgemm", 64), ("deepgemm", 48), ("triton", 64), ("triton", 48), ("torch", 64)])
def test_nccl_sharded_equals_replicated(name, heads):
    ok, why = _have(name)
    if not ok:
        pytest.skip(why)
    from indexer.launch import run_ranks

    world = min(torch.cuda.device_count(), 4)
    results = run_ranks(_nccl_rank, world, name, heads, backend="nccl", timeout=600)
    for key, (exact, mode, res) in results[0].items():
        assert exact, f"{name} {key}: sharded != replicated"
        if key[1] == "auto":
            assert mode == "allgatherv"
        for r in range(1, world):
            assert torch.equal(results[r][key][2], res)


@pytest.mark.cuda
@pytest.mark.parametrize("heads", [16, 48])
def test_deepgemm_head_padding_matches_reference(heads):
    ok, why = _have("deepgemm")
    if not ok:
        pytest.skip(why)
    inp = _inputs(heads, seed=heads)
    problem, inputs = _problem(inp, 64)
    assert get_backend("deepgemm").notes(problem)
    want = _reference_logits(problem, inputs)
    got = _logits("deepgemm", problem, inputs)
    valid = torch.isfinite(want)
    assert torch.isfinite(got[valid]).all()
    err = (got[valid] - want[valid]).abs().max() / want[valid].abs().max()
    assert err < LOGITS_RTOL
    _, info = indexer.prefill_topk_with_info(*inp.args(), 64)
    assert info.backend == "deepgemm" and info.notes


def _needle_rank(rank, world):
    import torch.distributed as dist

    from indexer.synthetic import make_needle_inputs

    inp, needles = make_needle_inputs([70000, 9000, 30000], [6000, 9000, 2000], heads=64, head_dim=128, device=f"cuda:{rank}", seed=3)
    ref = indexer.prefill_topk(*inp.args(), 2048)
    out = {}
    for strategy in ("contiguous", "remainder0", "fold", "balanced", "striped", "auto"):
        res = indexer.prefill_topk(*inp.args(), 2048, group=dist.group.WORLD, strategy=strategy, min_rows_per_rank=0)
        out[strategy] = bool((res.sort(1).values == ref.sort(1).values).all())
    starts = inp.row_starts.cpu()
    found, row = True, 0
    for req, qlen in enumerate([6000, 9000, 2000]):
        for m in range(row, row + qlen):
            got = set(ref[m].tolist())
            found &= all((j - int(starts[m])) in got for j in needles[req])
        row += qlen
    return out, found


@pytest.mark.cuda
@pytest.mark.multi_gpu
def test_needles_on_gpus_sharded_equal_replicated():
    from indexer.launch import run_ranks

    world = min(torch.cuda.device_count(), 4)
    for exact, found in run_ranks(_needle_rank, world, backend="nccl", timeout=600):
        assert found, "a row lost a needle key"
        assert all(exact.values()), exact


@pytest.mark.cuda
def test_radix_topk_equals_torch_topk_on_deepgemm_logits():
    ok, why = _have("deepgemm")
    if not ok:
        pytest.skip(why)
    from indexer.topk import row_topk
    from indexer.topk.triton.ragged import ragged_topk

    inp = make_inputs([70000], [4096], heads=64, head_dim=128, device="cuda", seed=4)
    problem, inputs = _problem(inp, 2048)
    m = problem.num_rows
    logits = _logits("deepgemm", problem, inputs)  # padded rows, nothing written outside the windows
    starts = inp.row_starts.long()
    lengths = inp.row_ends.long() - starts
    a = torch.empty(m, 2048, dtype=torch.int32, device="cuda")
    b = torch.empty_like(a)
    row_topk(logits, starts, lengths, 2048, a)
    ragged_topk(logits, starts, lengths, 2048, b)
    assert torch.equal(a.sort(1).values, b.sort(1).values)
