"""Settings as a new user meets them: a bad INDEXER_* value or argument, a misspelt name,
a GPU device on a CPU build of torch."""

from __future__ import annotations

import warnings

import pytest
import torch

import indexer
from indexer import envs
from indexer.synthetic import make_inputs


@pytest.fixture(autouse=True)
def fresh_env_check(monkeypatch):
    # the check remembers the last good environment and the names it warned about
    monkeypatch.setattr(envs, "_checked_env", None)
    monkeypatch.setattr(envs, "_warned_unknown", set())
    for name in [n for n in __import__("os").environ if n.startswith("INDEXER_")]:
        monkeypatch.delenv(name)


def _small():
    return make_inputs([64], [16], heads=2, head_dim=32, seed=3)


def _prefill(**kw):
    inp = _small()
    return indexer.prefill_topk(*inp.args(), 8, **kw)


def _plan(**kw):
    inp = _small()
    return indexer.plan(inp.row_starts, inp.row_ends, num_keys=64, heads=2, head_dim=32, topk=8, **kw)


@pytest.mark.parametrize("name,raw,allowed", [
    ("INDEXER_TOPK", "foo", "torch|triton"),
    ("INDEXER_TRITON_DIRECT_LAUNCH", "perhaps", "1|true|yes|on|0|false|no|off"),
    ("INDEXER_CUDA_TOPK", "foo", "torch|triton"),  # another platform's variant: still a mistake
    ("INDEXER_CHECK_CONSISTENCY", "maybe", "1|true"),
    ("INDEXER_TP_SHARD_STRIPE_ROWS", "0", "an integer >= 1"),
])
@pytest.mark.parametrize("call", [_prefill, _plan])
def test_planning_rejects_any_bad_flag_value(monkeypatch, name, raw, allowed, call):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert name in msg and repr(raw) in msg and allowed in msg, msg


def test_a_good_environment_is_checked_once(monkeypatch):
    monkeypatch.setenv("INDEXER_TOPK", "torch")
    _prefill()
    calls = []
    real = envs.parse_value
    monkeypatch.setattr(envs, "parse_value", lambda *a: calls.append(a) or real(*a))
    envs.check_environment()
    envs.check_environment()
    assert calls == []  # the same INDEXER_* variables: nothing parsed again
    monkeypatch.setenv("INDEXER_TOPK", "triton")
    envs.check_environment()
    assert len(calls) == 1


def test_unknown_name_warns_once_naming_the_closest_flag(monkeypatch):
    monkeypatch.setenv("INDEXER_BACKNED", "torch")
    with pytest.warns(envs.UnknownFlagWarning, match="INDEXER_BACKNED.*did you mean INDEXER_BACKEND"):
        _prefill()
    monkeypatch.setenv("INDEXER_TP_SHARD", "on")  # another environment, same unknown name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _plan()
        _prefill(max_logits_mb=64)
    assert not [w for w in caught if issubclass(w.category, envs.UnknownFlagWarning)]


def test_blank_values_are_unset(monkeypatch):
    monkeypatch.setenv("INDEXER_TOPK", "")
    _prefill()


@pytest.mark.parametrize("kw,arg,allowed", [
    (dict(max_logits_mb=-1), "max_logits_mb", "a finite number > 0 (MiB)"),
    (dict(strategy="bogus"), "strategy", "one of auto|contiguous|remainder0|fold|balanced|striped"),
    (dict(reassembly="smoke"), "reassembly", "one of auto|allgatherv|ring|padded|maxreduce"),
    (dict(backend="cuda-magic"), "backend", "one of auto|deepgemm|aiter|triton|torch"),
    (dict(min_rows_per_rank=-1), "min_rows_per_rank", "an integer >= 0"),
    (dict(tp_shard="perhaps"), "tp_shard", "a boolean"),
])
def test_argument_errors_name_the_argument_and_list_the_values_once(kw, arg, allowed):
    with pytest.raises(ValueError) as info:
        _prefill(**kw)
    msg = str(info.value)
    assert msg.startswith(f"{arg}: bad value {next(iter(kw.values()))!r}"), msg
    assert msg.count(allowed) == 1, msg
    assert msg.count("expected") == 0, msg  # the parser's own wording is not repeated


def test_env_errors_list_the_values_once(monkeypatch):
    monkeypatch.setenv("INDEXER_REASSEMBLY", "bogus")
    with pytest.raises(ValueError) as info:
        envs.resolve("REASSEMBLY", "cpu")
    msg = str(info.value)
    assert msg == "INDEXER_REASSEMBLY: bad value 'bogus'; allowed: one of auto|allgatherv|ring|padded|maxreduce"


def test_check_values_argument_of_plan_is_named():
    with pytest.raises(ValueError, match=r"^check_values: bad value 'loud'"):
        _plan(check_values="loud")


@pytest.mark.skipif(torch.version.cuda is not None or torch.version.hip is not None, reason="needs a CPU build of torch")
def test_available_backends_for_cuda_on_a_cpu_build():
    statuses = indexer.available_backends(device="cuda")
    assert statuses and {s.name for s in statuses} >= {"deepgemm", "triton", "torch"}
    for s in statuses:
        assert not s.available and s.reasons == ("CUDA is not available in this torch build",), s
    from indexer.platform import platform_for_device

    with pytest.raises(ValueError, match="device cuda: CUDA is not available in this torch build"):
        platform_for_device("cuda")


def test_available_backends_for_a_gpu_index_past_the_visible(monkeypatch):
    import indexer.platform as plat

    monkeypatch.setattr(plat.torch.version, "cuda", "13.0")
    monkeypatch.setattr(plat.torch.version, "hip", None)
    monkeypatch.setattr(plat.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(plat.torch.cuda, "is_available", lambda: True)
    statuses = indexer.available_backends(device="cuda:3")
    assert all(not s.available and s.reasons == ("cuda:3 is not a visible GPU (1 visible)",) for s in statuses)
    monkeypatch.setattr(plat.torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(plat.torch.cuda, "is_available", lambda: False)
    statuses = indexer.available_backends(device="cuda")
    assert all("torch sees no GPU" in s.reasons[0] for s in statuses)


def test_cpu_platform_reads_well():
    from indexer.platform import CpuPlatform, CudaPlatform

    assert CpuPlatform(probe="torch").describe() == "cpu [probe: torch]"
    assert CudaPlatform(arch="sm90", device_name="H200", device_count=2, probe="pynvml").describe() == (
        "nvidia sm90 (2 x H200) [probe: pynvml]")
