"""Backend registry and dispatch."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

import indexer
from indexer.backends import backend_statuses, choose_backend, select_backend
from indexer.platform import CudaPlatform, Platform
from indexer.problem import validate
from indexer.synthetic import make_inputs

from conftest import assert_matches_naive, sets_equal


def _inp(**kw):
    return make_inputs([400, 90], [100, 90], heads=4, head_dim=32, seed=4, **kw)


def test_auto_on_cpu_is_torch():
    _, info = indexer.prefill_topk_with_info(*_inp().args(), 16)
    assert info.backend == "torch"


def test_forced_backend_that_cannot_run_raises_with_reasons():
    with pytest.raises(indexer.BackendUnavailableError) as err:
        indexer.prefill_topk(*_inp().args(), 16, backend="deepgemm")
    msg = str(err.value)
    assert "deepgemm" in msg and "forced" in msg and "NVIDIA GPU" in msg


def test_forced_by_env(monkeypatch):
    monkeypatch.setenv("INDEXER_BACKEND", "deepgemm")
    with pytest.raises(indexer.BackendUnavailableError, match="deepgemm"):
        indexer.prefill_topk(*_inp().args(), 16)
    monkeypatch.setenv("INDEXER_CPU_BACKEND", "torch")  # the platform-specific value wins
    _, info = indexer.prefill_topk_with_info(*_inp().args(), 16)
    assert info.backend == "torch"


@dataclass(frozen=True)
class _VendorOnly(Platform):
    backend_priority = ("deepgemm", "aiter")


def test_no_backend_fits_lists_every_reason():
    problem, _ = validate(*_inp().args(), 16)
    with pytest.raises(indexer.BackendUnavailableError) as err:
        select_backend(problem, _VendorOnly())
    msg = str(err.value)
    assert "deepgemm:" in msg and "aiter:" in msg


@dataclass(frozen=True)
class _VendorFirst(Platform):
    backend_priority = ("deepgemm", "aiter", "torch")


def test_the_plan_says_why_it_took_its_backend(monkeypatch):
    # auto: the platform's order and every backend skipped before the one taken, with its
    # reasons; forced: by the argument or by the environment variable
    problem, _ = validate(*_inp().args(), 16)
    chosen, why = choose_backend(problem, _VendorFirst())
    assert chosen.name == "torch" and select_backend(problem, _VendorFirst()) is chosen
    assert why.startswith("auto: the first in this platform's order (deepgemm, aiter, torch) that runs it")
    assert "skipped deepgemm: " in why and "; aiter: " in why and "NVIDIA GPU" in why, why
    assert choose_backend(problem, _VendorFirst(), "torch")[1] == "forced"
    assert choose_backend(problem, _VendorFirst(), "torch", "a test")[1] == "forced by a test"
    inp = _inp()
    bounds = dict(num_keys=inp.k.shape[0], heads=4, head_dim=32, topk=16)
    plan = indexer.plan(inp.row_starts, inp.row_ends, **bounds)
    assert plan.info.backend_reason.startswith("auto: the first in this platform's order (torch)")
    assert "backend torch (auto: " in str(plan)
    plan = indexer.plan(inp.row_starts, inp.row_ends, backend="torch", **bounds)
    assert plan.info.backend_reason == "forced by the backend argument"
    assert "backend torch (forced by the backend argument)" in str(plan)
    monkeypatch.setenv("INDEXER_BACKEND", "torch")
    assert indexer.plan(inp.row_starts, inp.row_ends, **bounds).info.backend_reason == "forced by INDEXER_BACKEND"


def test_statuses_cover_every_backend():
    names = [s.name for s in backend_statuses(CudaPlatform(arch="sm90"))]
    assert names[:3] == ["deepgemm", "triton", "torch"]
    assert set(names) == {"deepgemm", "aiter", "triton", "torch"}
    assert [s.name for s in indexer.available_backends(device="cpu")][0] == "torch"  # CPU priority first


def test_broken_backend_module_is_a_reason():
    from indexer import backends

    backends.register_backend("broken", "indexer.no_such_module")
    try:
        st = {s.name: s for s in backend_statuses(CudaPlatform(arch="sm90"))}
        assert not st["broken"].available and "failed to load" in st["broken"].reasons[0]
    finally:
        backends.unregister_backend("broken")
    assert "broken" not in backends.backend_names()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter on CPU")
def test_triton_backend_in_interpreter_matches_reference():
    pytest.importorskip("triton")
    inp = make_inputs([150, 40], [60, 40], heads=3, head_dim=32, seed=9)
    out = indexer.prefill_topk(*inp.args(), 16, backend="triton")
    assert_matches_naive(out, inp, 16, tol=1e-5)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter on CPU")
def test_triton_backend_chunked_equals_whole():
    pytest.importorskip("triton")
    inp = make_inputs([150, 40], [60, 40], heads=2, head_dim=32, seed=3)
    a = indexer.prefill_topk(*inp.args(), 16, backend="triton")
    b = indexer.prefill_topk(*inp.args(), 16, backend="triton", max_logits_mb=0.01)
    assert sets_equal(a, b)


@pytest.mark.parametrize("heads,padded", [(16, 32), (33, 64), (64, 64)])
def test_head_padding_leaves_logits_bit_identical(heads, padded):
    from indexer.backends import get_backend
    from indexer.backends.deepgemm import pad_heads, padded_heads

    assert padded_heads(heads, "sm90") == padded
    assert padded_heads(65, "sm90") is None and padded_heads(8, "sm100") == 8
    inp = make_inputs([300, 120], [100, 120], heads=heads, head_dim=32, seed=heads)
    q_pad, w_pad = pad_heads(inp.q, inp.weights, padded)
    assert q_pad.shape == (220, padded, 32) and w_pad.shape == (220, padded)
    from indexer.backends.base import single_chunk

    ref = get_backend("torch")
    a, ia = validate(*inp.args(), 16)
    b, ib = validate(q_pad, inp.k, inp.k_scale, w_pad, inp.row_starts, inp.row_ends, 16)
    la = ref.logits(a, ia, single_chunk(ref, a, (0, 220), (0, a.num_keys))).clone()
    lb = ref.logits(b, ib, single_chunk(ref, b, (0, 220), (0, a.num_keys))).clone()
    assert torch.equal(la, lb)


def test_padding_is_a_note_not_a_reason():
    from indexer.backends import get_backend

    inp = make_inputs([50], [10], heads=16, head_dim=64)
    dg = get_backend("deepgemm")
    notes = dg.notes(validate(*inp.args(), 8)[0])
    assert notes and "padded to 32" in notes[0]
    res = __import__("subprocess").run(
        [__import__("sys").executable, "-m", "indexer", "info", "--heads", "16", "--head-dim", "64"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0 and "H=16" in res.stdout


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter on CPU")
def test_padding_rows_anywhere_are_all_minus_one_triton():
    pytest.importorskip("triton")
    inp = make_inputs([300, 40], [60, 40], heads=2, head_dim=32, seed=5)
    n = inp.k.shape[0]
    # CUDA-graph style padding: empty rows at key 0 and at key N, between real rows
    inp.row_starts[10:13] = 0
    inp.row_ends[10:13] = 0
    inp.row_starts[70:72] = n
    inp.row_ends[70:72] = n
    out = indexer.prefill_topk(*inp.args(), 16, backend="triton", max_logits_mb=0.02)
    assert (out[10:13] == -1).all() and (out[70:72] == -1).all()
    assert_matches_naive(out, inp, 16, tol=1e-5)
