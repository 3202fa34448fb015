"""Synthetic indexer inputs for demos, benchmarks and tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import quantize_fp8


@dataclass
class Inputs:
    """Arguments of :func:`indexer.prefill_topk` (all on one device)."""

    q: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    weights: torch.Tensor
    row_starts: torch.Tensor
    row_ends: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k, self.k_scale, self.weights, self.row_starts, self.row_ends)


def causal_bounds(seq_lens: list[int], query_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Row windows of a batch of causal requests packed in one key buffer.

    Request ``i`` has ``seq_lens[i]`` keys of which the last ``query_lens[i]`` are this
    step's query rows (a chunked-prefill step); row ``j`` of it sees keys
    ``[offset_i, offset_i + seq_lens[i] - query_lens[i] + j + 1)``.

    Returns:
        ``(row_starts, row_ends, N)``: int32 ``[sum(query_lens)]`` each, and total keys.
    """
    starts, ends = [], []
    offset = 0
    for s, qlen in zip(seq_lens, query_lens):
        if not 0 <= qlen <= s:
            raise ValueError(f"query_lens must be in [0, seq_len], got {qlen} for seq_len {s}")
        first = s - qlen
        starts.append(torch.full((qlen,), offset, dtype=torch.int32))
        ends.append(torch.arange(offset + first + 1, offset + s + 1, dtype=torch.int32))
        offset += s
    if not starts:
        return torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32), 0
    return torch.cat(starts), torch.cat(ends), offset


def make_inputs(
    seq_lens: list[int],
    query_lens: list[int],
    heads: int = 64,
    head_dim: int = 128,
    device: torch.device | str = "cpu",
    seed: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
) -> Inputs:
    """Random fp8 inputs for a batch of causal requests (see :func:`causal_bounds`)."""
    gen = torch.Generator().manual_seed(seed)
    starts, ends, n = causal_bounds(seq_lens, query_lens)
    m = starts.numel()
    q, q_scale = quantize_fp8(torch.randn(m, heads, head_dim, generator=gen), fp8_dtype)
    k, k_scale = quantize_fp8(torch.randn(n, head_dim, generator=gen), fp8_dtype)
    weights = torch.randn(m, heads, generator=gen) * q_scale
    dev = torch.device(device)
    return Inputs(q.to(dev), k.to(dev), k_scale.to(dev), weights.to(dev), starts.to(dev), ends.to(dev))


def make_needle_inputs(
    seq_lens: list[int],
    query_lens: list[int],
    heads: int = 8,
    head_dim: int = 64,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[Inputs, list[list[int]]]:
    """A packed batch where every request hides needle keys that all its queries rank first.

    Each request gets two needles visible to all of its query rows: its very first key and
    the last key its earliest query row sees (the end of the shortest history). Queries
    share a direction ``u`` and the needles point along it, so ``q . k`` is largest there
    for every head; weights are positive.

    Returns:
        ``(inputs, needles)``: ``needles[i]`` holds request ``i``'s needle keys (absolute).
    """
    gen = torch.Generator().manual_seed(seed)
    starts, ends, n = causal_bounds(seq_lens, query_lens)
    m = starts.numel()
    u = torch.randn(head_dim, generator=gen)
    u = u / u.norm()
    q = torch.randn(m, heads, head_dim, generator=gen) + 3.0 * u
    k = torch.randn(n, head_dim, generator=gen)
    needles, offset = [], 0
    for s, qlen in zip(seq_lens, query_lens):
        mine = sorted({offset, offset + s - qlen} if qlen and s else set())
        for j in mine:
            k[j] = 12.0 * u
        needles.append(mine)
        offset += s
    q8, q_scale = quantize_fp8(q)
    k8, k_scale = quantize_fp8(k)
    weights = (torch.rand(m, heads, generator=gen) + 0.1) * q_scale
    dev = torch.device(device)
    return Inputs(q8.to(dev), k8.to(dev), k_scale.to(dev), weights.to(dev), starts.to(dev), ends.to(dev)), needles


#: Shapes of logits a real indexer produces beside the i.i.d. Gaussian, for the top-k's
#: benchmarks and tests (:func:`logits_like`).
LOGIT_DISTRIBUTIONS = ("gaussian", "equal", "few_distinct", "ascending", "descending", "outliers", "recency", "sink",
                       "relu_zeros")


def logits_like(name: str, rows: int, n: int, device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """A float32 ``[rows, n]`` block of logits shaped like ``name``, one of
    :data:`LOGIT_DISTRIBUTIONS`:

    * ``gaussian``: i.i.d. standard normal;
    * ``equal``: every key 1.0 (a zero or padded stretch: one tie across the row);
    * ``few_distinct``: integers 0-7 (quantized scores: ties at every value);
    * ``ascending`` / ``descending``: a ramp rising toward the latest key or the first;
    * ``outliers``: flat 0.0 with 64 keys of 5-6 at random columns (fewer than a top-k);
    * ``recency``: normal, the last ``min(4096, n // 4)`` keys raised by 3 (a local window);
    * ``sink``: normal, key 0 at 100 (an attention sink);
    * ``relu_zeros``: ``relu(x - 2.5)`` of a normal ``x``: 0.6% of the keys positive, the
      rest exact zeros (a ReLU-weighted sum over heads that no head lights up).

    Rows differ (drawn from one generator on ``device``, seeded by ``seed``).

    Raises:
        ValueError: an unknown ``name`` (the message lists the known ones).
    """
    if name not in LOGIT_DISTRIBUTIONS:
        raise ValueError(f"name must be one of {', '.join(LOGIT_DISTRIBUTIONS)}; got {name!r}")
    dev = torch.device(device)
    gen = torch.Generator(dev).manual_seed(seed)
    if name == "equal":
        return torch.ones(rows, n, device=dev)
    if name == "few_distinct":
        # (drawn as float32: an int64 block first would take twice the logits' memory)
        return torch.randint(0, 8, (rows, n), generator=gen, device=dev, dtype=torch.float32)
    if name in ("ascending", "descending"):
        ramp = torch.arange(n, device=dev, dtype=torch.float32) / max(n, 1)
        return (ramp if name == "ascending" else 1.0 - ramp).expand(rows, n).contiguous()
    if name == "outliers":
        x = torch.zeros(rows, n, device=dev)
        cols = torch.randint(0, n, (rows, 64), generator=gen, device=dev)
        x.scatter_(1, cols, 5.0 + torch.rand(rows, 64, generator=gen, device=dev))
        return x
    x = torch.randn(rows, n, generator=gen, device=dev)
    if name == "recency":
        x[:, n - min(4096, n // 4):] += 3.0
    elif name == "sink":
        x[:, 0] = 100.0
    elif name == "relu_zeros":
        x = (x - 2.5).clamp_min_(0.0)
    return x
