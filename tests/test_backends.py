"""Backend registry and dispatch."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

import indexer
from indexer.backends import backend_statuses, select_backend
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
    problem = validate(*_inp().args(), 16)
    with pytest.raises(indexer.BackendUnavailableError) as err:
        select_backend(problem, _VendorOnly())
    msg = str(err.value)
    assert "deepgemm:" in msg and "aiter:" in msg


def test_statuses_cover_every_backend():
    names = [s.name for s in backend_statuses(CudaPlatform(arch="sm90"))]
    assert names[:3] == ["deepgemm", "triton", "torch"]
    assert set(names) == {"deepgemm", "aiter", "triton", "torch"}
    assert [s.name for s in indexer.available_backends()][0] == "torch"  # CPU priority first


def test_broken_backend_module_is_a_reason(monkeypatch):
    from indexer import backends

    monkeypatch.setitem(backends._MODULES, "broken", "indexer.no_such_module")
    backends._INSTANCES.pop("broken", None)
    st = {s.name: s for s in backend_statuses(CudaPlatform(arch="sm90"))}
    assert not st["broken"].available and "failed to load" in st["broken"].reasons[0]


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
