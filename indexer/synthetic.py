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
