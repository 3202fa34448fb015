"""Where the deepgemm backend finds DeepGEMM (the package, or the copy vLLM ships) and how it
calls what it finds (CPU: stand-in modules, no kernel runs)."""

from __future__ import annotations

import sys
import types

import pytest

from indexer.backends import deepgemm as dg


@pytest.fixture(autouse=True)
def _fresh_load():
    dg._load.cache_clear()
    yield
    dg._load.cache_clear()


def _recording(calls, with_clean: bool):
    # a stand-in for the logits function, recording how it is called
    if with_clean:
        def fp8_fp4_mqa_logits(q, kv, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
            calls.append(dict(q=q, clean_logits=clean_logits, max_seqlen_k=max_seqlen_k))
            return "logits"
    else:
        def fp8_fp4_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k=0):  # vLLM's copy: no clean_logits
            calls.append(dict(q=q, max_seqlen_k=max_seqlen_k))
            return "logits"
    return fp8_fp4_mqa_logits


def _modules(monkeypatch, top=None, vllm=None):
    monkeypatch.setitem(sys.modules, "deep_gemm", top)  # None: the import fails
    if vllm is None:
        monkeypatch.delitem(sys.modules, "vllm", raising=False)
        return
    pkg, third = types.ModuleType("vllm"), types.ModuleType("vllm.third_party")
    pkg.third_party, third.deep_gemm = third, vllm
    for name, mod in (("vllm", pkg), ("vllm.third_party", third), ("vllm.third_party.deep_gemm", vllm)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_the_package_comes_first_and_runs_without_its_clean_pass(monkeypatch):
    calls = []
    top = types.ModuleType("deep_gemm")
    top.fp8_fp4_mqa_logits = _recording(calls, with_clean=True)
    _modules(monkeypatch, top=top, vllm=types.ModuleType("vllm.third_party.deep_gemm"))
    fn, compressed, found = dg._load()
    assert compressed and found == "deep_gemm.fp8_fp4_mqa_logits, compressed rows"
    assert fn("q", "kv", "w", "ks", "ke", 640) == "logits"
    assert calls == [dict(q=("q", None), clean_logits=False, max_seqlen_k=640)]


def test_vllms_copy_is_used_where_vllm_is_imported_and_called_as_it_takes(monkeypatch):
    calls = []
    vendored = types.ModuleType("vllm.third_party.deep_gemm")
    vendored.fp8_fp4_mqa_logits = _recording(calls, with_clean=False)
    _modules(monkeypatch, top=None, vllm=vendored)
    fn, compressed, found = dg._load()
    assert found == "vllm.third_party.deep_gemm.fp8_fp4_mqa_logits, compressed rows, cleans its logits"
    fn("q", "kv", "w", "ks", "ke", 128)
    assert calls == [dict(q=("q", None), max_seqlen_k=128)]  # no clean_logits keyword it lacks


def test_vllm_is_never_imported_to_look_for_its_copy(monkeypatch):
    _modules(monkeypatch, top=None, vllm=None)
    fn, _, why = dg._load()
    assert fn is None and "vllm.third_party.deep_gemm not tried (vLLM not imported)" in why
    assert "vllm" not in sys.modules


def test_a_pybind_function_states_its_keywords_in_its_docstring(monkeypatch):
    calls = []

    class Builtin:
        # like a pybind11 function: no Python signature, the keywords in the docstring
        __doc__ = "fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits: bool = True) -> Tensor"
        __signature__ = property(lambda self: (_ for _ in ()).throw(ValueError("no signature")))

        def __call__(self, q, kv, weights, ks, ke, **kw):
            calls.append(kw)
            return "logits"

    top = types.ModuleType("deep_gemm")
    top.fp8_mqa_logits = Builtin()
    _modules(monkeypatch, top=top)
    fn, compressed, found = dg._load()
    assert not compressed and found == "deep_gemm.fp8_mqa_logits"
    fn("q", "kv", "w", "ks", "ke", 0)
    assert calls == [dict(clean_logits=False)]
