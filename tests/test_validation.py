"""Every bad input raises the documented error before anything runs, and leaves out untouched."""

from __future__ import annotations

import re

import pytest
import torch

import indexer
from indexer.synthetic import make_inputs

M, N, H, D, TOPK = 12, 40, 2, 32, 8


def good():
    inp = make_inputs([N], [M], heads=H, head_dim=D)
    return dict(q=inp.q, k=inp.k, k_scale=inp.k_scale, weights=inp.weights, row_starts=inp.row_starts, row_ends=inp.row_ends, topk=TOPK)


def _with(**changes):
    args = good()
    for key, fn in changes.items():
        args[key] = fn(args[key]) if callable(fn) else fn
    return args


CASES = [
    ("q", TypeError, dict(q=lambda t: t.float())),
    ("q", TypeError, dict(q=[1, 2])),
    ("k", TypeError, dict(k=lambda t: t.to(torch.float8_e4m3fnuz))),
    ("k_scale", TypeError, dict(k_scale=lambda t: t.double())),
    ("weights", TypeError, dict(weights=lambda t: t.half())),
    ("row_starts", TypeError, dict(row_starts=lambda t: t.long())),
    ("row_ends", TypeError, dict(row_ends=lambda t: t.float())),
    ("topk", TypeError, dict(topk=8.0)),
    ("topk", TypeError, dict(topk=True)),
    ("topk", ValueError, dict(topk=0)),
    ("q", ValueError, dict(q=lambda t: t[:, 0])),
    ("k", ValueError, dict(k=lambda t: t[:, :16])),
    ("k", ValueError, dict(k=lambda t: t[None])),
    ("k_scale", ValueError, dict(k_scale=lambda t: t[:-1])),
    ("weights", ValueError, dict(weights=lambda t: t[:, :1])),
    ("weights", ValueError, dict(weights=lambda t: t[:-1])),
    ("row_starts", ValueError, dict(row_starts=lambda t: t[:-1])),
    ("row_ends", ValueError, dict(row_ends=lambda t: t[:, None])),
    ("row_starts", ValueError, dict(row_starts=lambda t: t - 1)),
    ("row_ends", ValueError, dict(row_ends=lambda t: t + 1)),
    ("row_starts", ValueError, dict(row_starts=lambda t: torch.full_like(t, 30), row_ends=lambda t: torch.full_like(t, 20))),
]


@pytest.mark.parametrize("name,err,changes", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_names_argument_and_leaves_out_alone(name, err, changes):
    args = _with(**changes)
    out = torch.full((M, TOPK), 777, dtype=torch.int32)
    with pytest.raises(err, match=name):
        indexer.prefill_topk(**args, out=out)
    assert (out == 777).all()


@pytest.mark.parametrize(
    "out,err",
    [
        (torch.zeros(M, TOPK, dtype=torch.int64), TypeError),
        (torch.zeros(M, TOPK + 1, dtype=torch.int32), ValueError),
        (torch.zeros(TOPK, M, dtype=torch.int32).t(), ValueError),
        (torch.zeros(M, TOPK, dtype=torch.int32, device="meta"), ValueError),
        ("not a tensor", TypeError),
    ],
)
def test_bad_out(out, err):
    with pytest.raises(err, match="out"):
        indexer.prefill_topk(**good(), out=out)


def test_mixed_devices():
    args = good()
    args["weights"] = args["weights"].to("meta")
    with pytest.raises(ValueError, match="weights"):
        indexer.prefill_topk(**args)


@pytest.mark.parametrize(
    "kwargs,flag",
    [(dict(backend="cuda-magic"), "INDEXER_BACKEND"), (dict(strategy="zigzag"), "INDEXER_TP_SHARD_STRATEGY"), (dict(reassembly="smoke"), "INDEXER_REASSEMBLY")],
)
def test_bad_settings_name_the_flag(kwargs, flag):
    out = torch.full((M, TOPK), 5, dtype=torch.int32)
    with pytest.raises(ValueError, match=flag):
        indexer.prefill_topk(**good(), out=out, **kwargs)
    assert (out == 5).all()


def test_bad_env_value(monkeypatch):
    monkeypatch.setenv("INDEXER_MAX_LOGITS_MB", "lots")
    with pytest.raises(ValueError, match="INDEXER_MAX_LOGITS_MB"):
        indexer.prefill_topk(**good())


@pytest.mark.parametrize("name", ["k_scale", "weights"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_scales_rejected(name, bad):
    args = good()
    args[name] = args[name].clone()
    args[name].view(-1)[3] = bad
    out = torch.full((M, TOPK), 5, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        indexer.prefill_topk(**args, out=out)
    assert (out == 5).all()


def test_overflowing_logits_stay_inside_each_window():
    # finite but huge scales: float32 logits saturate; selected keys stay inside the window
    inp = make_inputs([400], [60], heads=2, head_dim=32, seed=3)
    w = torch.full_like(inp.weights, -1e30)
    ks = torch.full_like(inp.k_scale, 1e30)
    out = indexer.prefill_topk(inp.q, inp.k, ks, w, inp.row_starts, inp.row_ends, 40)
    lengths = (inp.row_ends - inp.row_starts).tolist()
    for m, n in enumerate(lengths):
        valid = [x for x in out[m].tolist() if x != -1]
        assert all(0 <= x < n for x in valid), m
        assert len(valid) == min(40, n)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:999", "not a device"])
def test_a_device_this_torch_cannot_use_is_a_value_error_naming_it(device):
    if torch.cuda.is_available() and device in ("cuda", "cuda:0"):
        pytest.skip("needs a torch that sees no GPU")
    starts, ends = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([5, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="device .*" + re.escape(repr(device))):
        indexer.plan(starts, ends, num_keys=8, heads=2, head_dim=32, topk=4, device=device)


@pytest.mark.parametrize("device", ["cuda:2", "cuda:999", "cuda:255", "cuda:256"])
def test_a_gpu_index_past_the_gpus_is_a_value_error_naming_it(device, monkeypatch):
    # torch keeps a device index in 8 bits ("cuda:999" is cuda:-25, "cuda:255" the current GPU,
    # "cuda:256" cuda:0): the index the caller wrote is the one checked, on a host that sees
    # two GPUs (the count is all the check reads; it raises before any CUDA call)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    starts, ends = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([5, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"device is " + re.escape(repr(device)) + r" but this torch sees 2 GPU"):
        indexer.plan(starts, ends, num_keys=8, heads=2, head_dim=32, topk=4, device=device)
