"""Contract tests of the AITER wrapper against a stand-in AITER (no AMD GPU here).

The stand-in implements AITER's documented signatures and index conventions with plain
torch, so argument passing, index localisation and the e4m3fnuz path are exercised on the
CPU. The real kernels run in the AMD CI job.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest
import torch

import indexer
from indexer.backends import get_backend, run_rows
from indexer.backends import aiter as aiter_backend
from indexer.problem import validate
from indexer.synthetic import make_inputs

from conftest import assert_matches_naive


def _stand_in_logits(calls):
    def fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True):
        calls.append(("logits", Q.dtype, tuple(Q.shape), tuple(KV.shape)))
        assert Q.is_contiguous() and KV.is_contiguous() and weights.is_contiguous()
        assert cu_starts.dtype == torch.int32 and cu_ends.dtype == torch.int32
        m, n = Q.shape[0], KV.shape[0]
        dots = torch.einsum("mhd,nd->mhn", Q.double(), KV.double()) * kv_scales.double()
        logits = (dots.clamp_min(0) * weights.double()[:, :, None]).sum(1)
        col = torch.arange(n)
        valid = (col[None] >= cu_starts.long()[:, None]) & (col[None] < cu_ends.long()[:, None])
        # AITER pads rows to a multiple of 256 columns and returns a non-contiguous view
        padded = torch.empty(m, (n + 255) // 256 * 256 + 256, dtype=torch.float32)
        padded[:, :n] = logits.masked_fill(~valid, float("-inf")).float()
        return padded[:, :n]

    return fp8_mqa_logits


def _stand_in_topk(calls, absolute, with_k):
    def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, *rest, k=2048, stable=False):
        values, (num_rows, stride0, stride1) = (rest[0], rest[1:]) if len(rest) == 4 else (None, rest)
        calls.append(("topk", num_rows, stride0, k))
        assert logits.dtype == torch.float32 and indices.dtype == torch.int32
        assert indices.shape == (num_rows, k)
        # read rows through stride0 exactly as the kernel does (row pointer = base + r * stride0);
        # write row r at r * k from indices' start, whatever its strides, as the kernel does
        rows = torch.as_strided(logits, (num_rows, logits.shape[1]), (stride0, 1), logits.storage_offset())
        indices = torch.as_strided(indices, (num_rows, k), (k, 1), indices.storage_offset())
        for r in range(num_rows):
            s, e = int(rowStarts[r]), int(rowEnds[r])
            n = e - s
            base = s if absolute else 0
            if n <= k:
                idx = torch.arange(k)
                indices[r] = torch.where(idx < n, idx + base, -1)
            else:
                indices[r] = torch.topk(rows[r, s:e], k).indices + base

    if with_k:
        return top_k_per_row_prefill

    def fixed_k(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1):
        return top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1, k=2048)

    return fixed_k


@pytest.fixture(params=["current", "first-release"])
def stand_in_aiter(request, monkeypatch):
    """Stand-in `aiter` package. current: absolute indices, `values` and `k` arguments,
    logits at aiter.ops.triton.attention; first-release: relative indices, k fixed at 2048,
    logits at aiter.ops.triton."""
    current = request.param == "current"
    calls = []
    mods = {name: types.ModuleType(name) for name in ("aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.topk")}
    logits_mod = "aiter.ops.triton.attention.fp8_mqa_logits" if current else "aiter.ops.triton.fp8_mqa_logits"
    mods[logits_mod] = types.ModuleType(logits_mod)
    mods[logits_mod].fp8_mqa_logits = _stand_in_logits(calls)
    topk = _stand_in_topk(calls, absolute=current, with_k=current)
    if not current:
        mods["aiter.ops.topk"].top_k_per_row_prefill = topk
    else:
        def top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k=2048, stable=False):
            return topk(logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k=k)

        mods["aiter.ops.topk"].top_k_per_row_prefill = top_k_per_row_prefill
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    aiter_backend._load.cache_clear()
    aiter_backend._topk_is_absolute.cache_clear()
    yield types.SimpleNamespace(calls=calls, current=current)
    aiter_backend._load.cache_clear()
    aiter_backend._topk_is_absolute.cache_clear()


def test_stand_in_is_loaded(stand_in_aiter):
    api = aiter_backend._load()
    assert api.error == "" and api.logits is not None and api.topk is not None
    assert api.topk_has_k == stand_in_aiter.current


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fnuz, torch.float8_e4m3fn])
def test_results_match_reference_through_the_wrapper(stand_in_aiter, fp8):
    topk = 2048 if not stand_in_aiter.current else 40
    # rows longer and shorter than topk, non-zero starts (packed requests)
    inp = make_inputs([2600, 300], [90, 300], heads=4, head_dim=32, fp8_dtype=fp8, seed=11)
    inp.row_starts[40:43] = 0  # padding rows, away from the chunk's keys
    inp.row_ends[40:43] = 0
    problem, inputs = validate(*inp.args(), topk)
    backend = get_backend("aiter")
    assert backend.problem_reasons(problem, fp8, aiter_backend._load()) == []
    out = torch.full((problem.num_rows, topk), 7777, dtype=torch.int32)
    run_rows(backend, problem, inputs, [(0, problem.num_rows)], out, budget_bytes=2**20)  # several chunks
    assert not (out == 7777).any()
    assert (out[40:43] == -1).all()
    assert_matches_naive(out, inp, topk)
    kinds = {c[0] for c in stand_in_aiter.calls}
    assert kinds == {"logits", "topk"}
    assert all(c[1] == fp8 for c in stand_in_aiter.calls if c[0] == "logits")
    # the padded row stride reached the top-k
    assert any(c[0] == "topk" and c[2] % 256 == 0 and c[2] > 0 for c in stand_in_aiter.calls)


def test_problem_reasons(stand_in_aiter):
    api = aiter_backend._load()
    backend = get_backend("aiter")
    inp = make_inputs([300], [20], heads=4, head_dim=32, fp8_dtype=torch.float8_e4m3fn)
    p, _ = validate(*inp.args(), 64)
    reasons = backend.problem_reasons(p, torch.float8_e4m3fnuz, api)
    assert any("float8_e4m3fnuz" in r for r in reasons)
    assert any("fixed at k=2048" in r for r in reasons) != stand_in_aiter.current
    inp = make_inputs([300], [20], heads=3, head_dim=32)
    assert any("power-of-two" in r for r in backend.problem_reasons(validate(*inp.args(), 2048)[0], torch.float8_e4m3fn, api))


def test_not_on_a_cpu_tensor(stand_in_aiter):
    inp = make_inputs([300], [20], heads=4, head_dim=32)
    reasons = get_backend("aiter").not_supported_reasons(validate(*inp.args(), 2048)[0])
    assert any("AMD GPU" in r for r in reasons)
    with pytest.raises(indexer.BackendUnavailableError, match="aiter"):
        indexer.prefill_topk(*inp.args(), 2048, backend="aiter")


def test_broken_vendor_packages_are_reasons_not_crashes(tmp_path):
    # what PyPI's packages do on a machine without ROCm
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text("raise KeyError('libamd_smi.so')\n")
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("raise RuntimeError('ROCm version file not found')\n")
    (tmp_path / "deep_gemm").mkdir()
    (tmp_path / "deep_gemm" / "__init__.py").write_text("raise OSError('undefined symbol: _ZN3c10')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    res = subprocess.run([sys.executable, "-m", "indexer", "info"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "ROCm version file not found" in res.stdout
    assert "undefined symbol" in res.stdout
    code = textwrap.dedent(
        """
        import torch
        torch.version.hip = "6.4"   # pretend to be a ROCm build so the amdsmi probe runs
        torch.version.cuda = None
        import indexer
        p = indexer.current_platform()
        print(p.key, "|".join(p.notes))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "amdsmi unavailable: KeyError" in res.stdout


def test_chunks_never_exceed_aiter_row_regime(stand_in_aiter):
    from indexer.backends.base import chunk_end

    inp = make_inputs([5000], [3000], heads=4, head_dim=32, seed=2)
    p, _ = validate(*inp.args(), 64)
    start, sizes = 0, []
    while start < p.num_rows:
        end, _, _ = chunk_end(get_backend("aiter"), p, start, p.num_rows, 2**40)
        sizes.append(end - start)
        start = end
    assert max(sizes) == 1024 and sum(sizes) == 3000


def test_a_row_strided_out_reaches_aiters_top_k_as_a_contiguous_table(stand_in_aiter, monkeypatch):
    # AITER's top-k writes row i at i * k: a view like buf[:, :k] must go through a
    # contiguous table and a copy, or rows land in the wrong places
    if not stand_in_aiter.current:
        pytest.skip("the current AITER (with k) only")
    monkeypatch.setattr(aiter_backend.AiterBackend, "not_supported_reasons", lambda self, problem: [])
    inp = make_inputs([300, 120], [60, 120], heads=4, head_dim=32, seed=2)
    topk = 40
    buf = torch.full((180, topk + 7), 555, dtype=torch.int32)
    got = indexer.prefill_topk(*inp.args(), topk, backend="aiter", out=buf[:, :topk])
    assert got.data_ptr() == buf.data_ptr() and (buf[:, topk:] == 555).all()
    assert_matches_naive(buf[:, :topk], inp, topk)
