"""Env flags and platform detection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from indexer import envs


def test_every_flag_documented_and_prefixed():
    for flag in envs.flags():
        assert flag.env_name.startswith("INDEXER_")
        assert len(flag.doc) > 20
        envs.resolve(flag.name, "cpu")  # defaults parse


def test_precedence(monkeypatch):
    monkeypatch.delenv("INDEXER_TP_SHARD_MIN_ROWS", raising=False)
    monkeypatch.delenv("INDEXER_CUDA_TP_SHARD_MIN_ROWS", raising=False)
    assert envs.resolve("TP_SHARD_MIN_ROWS", "cuda").value == 16384
    assert envs.resolve("TP_SHARD_MIN_ROWS", "rocm").value == 512
    monkeypatch.setenv("INDEXER_TP_SHARD_MIN_ROWS", "100")
    r = envs.resolve("TP_SHARD_MIN_ROWS", "cuda")
    assert (r.value, r.source) == (100, "env INDEXER_TP_SHARD_MIN_ROWS")
    monkeypatch.setenv("INDEXER_CUDA_TP_SHARD_MIN_ROWS", "7")
    assert envs.resolve("TP_SHARD_MIN_ROWS", "cuda").value == 7
    assert envs.resolve("TP_SHARD_MIN_ROWS", "rocm").value == 100
    r = envs.resolve("TP_SHARD_MIN_ROWS", "cuda", override=3)
    assert (r.value, r.source) == (3, "argument")


@pytest.mark.parametrize(
    "name,raw",
    [("TP_SHARD", "maybe"), ("TP_SHARD_STRATEGY", "zigzag"), ("TP_SHARD_MIN_ROWS", "-1"), ("MAX_LOGITS_MB", "0"),
     ("MAX_LOGITS_MB", "inf"), ("MAX_LOGITS_MB", "1e400"), ("TP_SHARD_STRIPE_ROWS", "0"), ("TOPK", "heap"), ("REASSEMBLY", "")]
)
def test_bad_values_list_allowed(monkeypatch, name, raw):
    flag = envs.get_flag(name)
    monkeypatch.setenv(flag.env_name, raw)
    if raw == "":  # empty means unset
        assert envs.resolve(name).source == "default"
        return
    with pytest.raises(ValueError) as info:
        envs.resolve(name, "cpu")
    assert flag.env_name in str(info.value) and "allowed" in str(info.value)


def test_bool_parsing(monkeypatch):
    for raw, want in [("1", True), ("off", False), ("TRUE", True), ("no", False)]:
        monkeypatch.setenv("INDEXER_TP_SHARD", raw)
        assert envs.value("TP_SHARD") is want


def test_validate_environment_reports_typos(monkeypatch):
    monkeypatch.setenv("INDEXER_TP_SHRAD", "1")
    monkeypatch.setenv("INDEXER_ROCM_REASSEMBLY", "bogus")
    problems = envs.validate_environment()
    assert any("INDEXER_TP_SHRAD" in p for p in problems)
    assert any("INDEXER_ROCM_REASSEMBLY" in p for p in problems)


def test_import_needs_only_torch_and_creates_no_context():
    code = (
        "import sys, torch\n"
        "with_torch = set(sys.modules)  # a CUDA build of torch imports pynvml itself\n"
        "import indexer\n"
        "bad = [m for m in ('deep_gemm', 'aiter', 'triton', 'pynvml', 'amdsmi') if m in sys.modules and m not in with_torch]\n"
        "assert not bad, ('imported by import indexer', bad)\n"
        "from indexer.platform import current_platform\n"
        "p = current_platform()\n"
        "# the probe may use NVML or amdsmi (that is what they are for), never a vendor kernel package\n"
        "bad = [m for m in ('deep_gemm', 'aiter', 'triton') if m in sys.modules]\n"
        "assert not bad, ('imported by the platform probe', bad)\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(p.key, p.arch)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] in ("cpu", "cuda", "rocm")


def test_broken_probe_falls_back(monkeypatch):
    import indexer.platform as plat

    monkeypatch.setattr(plat.torch.version, "cuda", "13.0")
    monkeypatch.setattr(plat.torch.version, "hip", None)

    def broken():
        raise KeyError("libnvidia-ml.so")

    monkeypatch.setattr(plat, "_probe_nvml", broken)
    monkeypatch.setattr(plat.torch.cuda, "device_count", lambda: 0)
    plat.current_platform.cache_clear()
    try:
        p = plat.current_platform()
        assert p.is_cpu()
        assert any("pynvml unavailable" in n for n in p.notes)
    finally:
        plat.current_platform.cache_clear()


def test_platform_classes():
    from indexer.platform import CudaPlatform, RocmPlatform

    assert RocmPlatform(arch="gfx942").has_fp8_fnuz()
    assert not RocmPlatform(arch="gfx950").has_fp8_fnuz()
    assert CudaPlatform(arch="sm90").is_hopper()
    assert CudaPlatform().backend_priority[0] == "deepgemm"
    assert RocmPlatform().backend_priority[0] == "aiter"


def test_indexed_device_names_the_current_gpu(monkeypatch):
    # "cuda" is the current GPU with its index (tensors made there report cuda:N, and a
    # device without the index compares unequal to theirs); an indexed or CPU device stays
    import torch

    from indexer.platform import indexed_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert indexed_device("cuda") == torch.device("cuda", 3)
    assert indexed_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert indexed_device("cuda:1") == torch.device("cuda", 1)
    assert indexed_device("cpu") == torch.device("cpu")
