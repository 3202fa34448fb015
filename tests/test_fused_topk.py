"""Logits and top-k fused (the logits never written) against the unfused Triton path:
the Triton logits block, then the ragged top-k (Triton's interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from indexer.topk import row_topk  # noqa: E402
from indexer.backends.triton import fused_experimental as F  # noqa: E402
from indexer.backends.triton import kernels as K  # noqa: E402
from indexer.topk.triton import ragged as T  # noqa: E402
from indexer.topk.triton import config as TC  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _small_key_tile(monkeypatch):
    # toy shapes (H=4, D=32): 16-key tiles, so 16 lists a row, of cap / 16 slots
    monkeypatch.setitem(K.FUSED_CONFIGS, (4, 32), K.FusedConfig(4, 16, 4, 2))


def _inputs(lengths, n, heads, dim, seed, positive=False):
    """Causal-like windows ending at ``n`` - offsets, of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    m = len(lengths)
    q = (torch.randn(m, heads, dim, generator=g) * 2).to(FP8)
    k = (torch.randn(n, dim, generator=g) * 2).to(FP8)
    k_scale = torch.rand(n, generator=g) * 0.5 + 0.05
    weights = torch.randn(m, heads, generator=g)
    if positive:
        weights = weights.abs() + 0.1
    lengths = torch.tensor(lengths, dtype=torch.int32)
    ends = n - torch.randint(0, 8, (m,), generator=g, dtype=torch.int32)
    ends = torch.maximum(ends, lengths)
    starts = ends - lengths
    return [t.to(DEVICE) for t in (q, k, k_scale, weights, starts, ends)]


def _unfused(q, k, k_scale, weights, starts, ends, topk):
    logits = K.mqa_logits(q, k, k_scale, weights, starts, ends)
    out = torch.empty(q.shape[0], topk, dtype=torch.int32, device=q.device)
    T.ragged_topk(logits, starts, ends - starts, topk, out)
    # the torch path on the same logits agrees (its tie rule is the Triton kernels')
    ref = torch.empty(q.shape[0], topk, dtype=torch.int32)
    row_topk(logits.cpu(), starts.cpu().long(), (ends - starts).cpu().long(), topk, ref)
    assert torch.equal(out.cpu().sort(1).values, ref.sort(1).values)
    return out.cpu().sort(1).values


def _fused(inputs, topk, **kw):
    m = inputs[0].shape[0]
    buf = torch.full((m, topk + 3), 99999, dtype=torch.int32, device=DEVICE)
    stats = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    redo = F.logits_topk(*inputs, topk, buf[:, :topk], stats=stats, **kw)
    assert (buf[:, topk:].cpu() == 99999).all(), "a write outside out's rows"
    return buf[:, :topk].cpu().sort(1).values, redo, stats.cpu().tolist()


# rows: empty, shorter than k, exactly k, within the candidate slots (every key listed),
# longer (a sampled threshold)
LENGTHS = [0, 5, 16, 40, 200, 256, 300, 450, 600, 611, 700, 640, 900, 1000]


@pytest.mark.parametrize("tile", [128, 512])
def test_fused_selects_the_unfused_set(tile):
    # tile 128: 8 slots a list in the first select launch, longer lists to the second
    inputs = _inputs(LENGTHS, 1020, 4, 32, seed=3)
    got, redo, stats = _fused(inputs, 16, cap=512, tile=tile)
    assert torch.equal(got, _unfused(*inputs, 16))
    assert redo == 0
    assert stats[TC.STAT_SHORT] == 3 and stats[TC.STAT_SAMPLED] == len(LENGTHS) - 3, stats


def test_ties_at_the_kth_key_go_to_the_lowest_columns():
    # every key of a row scores the same where q . k has one value: k rows repeat
    inputs = _inputs(LENGTHS, 1020, 4, 32, seed=5)
    k = inputs[1]
    inputs[1] = k[torch.arange(k.shape[0], device=DEVICE) % 3]
    inputs[2] = torch.full_like(inputs[2], 0.25)
    got, redo, _ = _fused(inputs, 16, cap=512)
    assert torch.equal(got, _unfused(*inputs, 16))
    assert redo == 0


def test_short_lists_are_recomputed_unfused():
    # the sampled keys (every 32nd) score far above the rest: the threshold is one of them,
    # fewer than k keys reach it, and those rows go the unfused way
    inputs = _inputs(LENGTHS, 1020, 4, 32, seed=7, positive=True)
    inputs[2][::F.sample_stride(1020)] *= 100.0
    got, redo, _ = _fused(inputs, 16, cap=512)
    assert torch.equal(got, _unfused(*inputs, 16))
    assert redo >= 5  # the rows longer than cap


def test_overflowing_lists_are_recomputed_unfused():
    # a threshold as deep as the sample goes lets most keys through, more than a list holds
    inputs = _inputs(LENGTHS, 1020, 4, 32, seed=9)
    got, redo, _ = _fused(inputs, 16, cap=128, sigmas=1000.0)
    assert torch.equal(got, _unfused(*inputs, 16))
    assert redo >= 9  # the rows longer than cap


def test_one_overflowing_list_is_recomputed_though_the_row_fits_cap():
    # keys n % 16 == 5 (all in list 5 of the 16, never in the every-32nd-key sample) score
    # far above the rest: list 5 overflows its 16 slots while the row's total fits cap=256.
    # Sent to the select, such a row would take the fallback path, which reads the logits the
    # fused path does not have
    g = torch.Generator().manual_seed(1)
    m, n, topk = 4, 1020, 16
    q = (torch.rand(m, 4, 32, generator=g) + 0.5).to(FP8)
    k = torch.rand(n, 32, generator=g) * 0.1
    k[5::16] += 1.0
    inputs = [q, k.to(FP8), torch.rand(n, generator=g) * 0.5 + 0.05, torch.rand(m, 4, generator=g) + 0.1,
              torch.tensor([0, 10, 20, 3], dtype=torch.int32), torch.tensor([1000, 1020, 1020, 900], dtype=torch.int32)]
    inputs = [t.to(DEVICE) for t in inputs]
    got, redo, stats = _fused(inputs, topk, cap=256)
    assert torch.equal(got, _unfused(*inputs, topk))
    assert redo == 4
    # recomputed rows count on the unfused top-k's paths, not as short
    assert stats[TC.STAT_SHORT] == 0 and sum(stats) == 4, stats


@pytest.mark.skipif(DEVICE == "cpu", reason="GPU sizes")
@pytest.mark.parametrize("n", [9000, 40000])
def test_fused_at_model_shape(n):
    lengths = torch.linspace(0, n - 8, 192).long().tolist()
    inputs = _inputs(lengths, n, 64, 128, seed=11)
    got, redo, stats = _fused(inputs, 2048)
    assert torch.equal(got, _unfused(*inputs, 2048))
    assert redo == 0, stats


@pytest.mark.parametrize("case,match", [
    ("heads", "H=6"), ("topk", "topk"), ("out", "out"), ("starts", "row_starts"), ("cap", "cap"),
    ("sigmas", "sigmas"), ("dtype", "q must have dtype float8"), ("past_n", "row_ends must be <= N"),
    ("crossed", "row_starts must be <= row_ends"), ("head_dim", "head dim D"), ("select_warps", "select_warps"),
    ("sigmas_inf", "sigmas"), ("stats", "stats"),
])
def test_bad_arguments_are_refused_before_any_kernel(case, match):
    # prefill_topk's checks (TypeError for a dtype) and this kernel's own
    q, k, k_scale, w, starts, ends = _inputs([10, 20], 40, 4, 32, seed=1)
    topk, kw = 8, {}
    out = torch.full((2, topk), 7, dtype=torch.int32, device=DEVICE)
    if case == "heads":
        q, w = q[:, :3].repeat(1, 2, 1), w[:, :3].repeat(1, 2)
    elif case == "topk":
        topk = 0
    elif case == "out":
        out = torch.full((2, topk + 1), 7, dtype=torch.int32, device=DEVICE)
    elif case == "starts":
        starts = starts.float()
    elif case == "cap":
        kw = dict(cap=100)
    elif case == "sigmas":
        kw = dict(sigmas=0.0)
    elif case == "dtype":
        q = q.float()
    elif case == "past_n":
        ends = ends.clone()
        ends[1] = 41
    elif case == "crossed":
        starts = starts.clone()
        starts[0] = ends[0] + 1
    elif case == "head_dim":
        q, k = q[:, :, :16].contiguous(), k[:, :16].contiguous()
    elif case == "select_warps":
        kw = dict(select_warps=3)
    elif case == "sigmas_inf":
        kw = dict(sigmas=float("inf"))
    elif case == "stats":
        kw = dict(stats=torch.zeros(8, dtype=torch.int32, device=DEVICE)[::2])
    before = out.clone()
    with pytest.raises((TypeError, ValueError), match=match):
        F.logits_topk(q, k, k_scale, w, starts, ends, topk, out, **kw)
    assert torch.equal(out, before)
