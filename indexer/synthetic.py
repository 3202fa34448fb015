"""Synthetic indexer inputs for demos, benchmarks and tests."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

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
                       "relu_zeros", "stripes")


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
      rest exact zeros (a ReLU-weighted sum over heads that no head lights up);
    * ``stripes``: normal, keys 256-263 of every 512 raised by 10 (a periodic structure,
      1/64 of the keys, all between the runs the Triton top-k's sample reads: from 128K keys
      on, more large keys than its candidate lists hold, so rows take its fallback path).

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
    elif name == "stripes":
        col = torch.arange(n, device=dev) % 512
        x[:, (col >= 256) & (col < 264)] += 10.0
    return x


@dataclass
class VllmPrefillStep:
    """One step's indexer inputs laid out as vLLM's metadata builder lays them out
    (:func:`vllm_prefill_step`).

    Attributes:
        q: fp8 ``[T, H, D]``, decode rows first, then each request's prefill rows.
        weights: float32 ``[T, H]``.
        chunks: The prefill chunks, each with ``token_start``, ``token_end``,
            ``cu_seqlen_ks``, ``cu_seqlen_ke`` (int32, the rows' windows in the key
            workspace), ``skip_kv_gather``, ``local_total_seq_lens``,
            ``max_local_total_seq_lens`` and ``requests`` (the request indices it gathers).
        keys, scales: Per request, its fp8 ``[seq_len, D]`` keys and float32 ``[seq_len]``
            scales (the KV cache the gather reads).
        workspace_keys: Rows the key workspace needs (the largest gathering).
    """

    q: torch.Tensor
    weights: torch.Tensor
    chunks: list
    keys: list
    scales: list
    workspace_keys: int

    def gather(self, chunk, k_quant: torch.Tensor, k_scale: torch.Tensor) -> None:
        """Fill the workspace with ``chunk``'s requests' keys, packed, as vLLM's
        ``cp_gather_indexer_k_quant_cache`` does: ``k_quant`` fp8 ``[>= n, D]``, ``k_scale``
        uint8 ``[>= n, 4]`` (each row a float32's bytes)."""
        at = 0
        for r in chunk.requests:
            n = self.keys[r].shape[0]
            k_quant[at:at + n] = self.keys[r].to(k_quant.device)
            k_scale[at:at + n] = self.scales[r].to(k_scale.device).view(torch.uint8).reshape(n, 4)
            at += n

    def workspace(self, device: torch.device | str = "cpu", stale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """An empty key workspace (fp8 ``[workspace_keys, D]``, uint8 ``[workspace_keys, 4]``),
        with ``stale`` every byte a NaN (a shared workspace holds old bytes past what a
        gathering writes)."""
        d = self.q.shape[2]
        fill = 0x7F if stale else 0  # 0x7F: NaN in e4m3fn; 0x7F7F7F7F: a NaN float32 too
        k_quant = torch.full((self.workspace_keys, d), fill, dtype=torch.uint8, device=device).view(self.q.dtype)
        k_scale = torch.full((self.workspace_keys, 4), fill, dtype=torch.uint8, device=device)
        return k_quant, k_scale


def vllm_prefill_step(seq_lens: list[int], query_lens: list[int], *, decode_rows: int = 0, heads: int = 8,
                      head_dim: int = 32, chunk_keys: int | None = None, subchunk_rows: int | None = None,
                      seed: int = 0) -> VllmPrefillStep:
    """A prefill step chunked the way vLLM's indexer metadata builder chunks it.

    Requests are packed into one chunk while their keys fit ``chunk_keys`` (each gathering
    restarts the workspace at 0); a request with more than ``subchunk_rows`` query rows is
    cut into sub-chunks of that many rows that reuse its gathering (``skip_kv_gather``), as
    vLLM cuts a request whose logits exceed its budget. Row ``j`` of a request with ``s``
    keys and ``l`` query rows at workspace offset ``o`` reads keys ``[o, o + s - l + j + 1)``.
    ``decode_rows`` rows come first and belong to no chunk.

    Raises:
        ValueError: lengths that do not fit (a query longer than its request, a request
            longer than ``chunk_keys``).
    """
    if len(seq_lens) != len(query_lens):
        raise ValueError(f"seq_lens and query_lens need one entry a request, got {len(seq_lens)} and "
                         f"{len(query_lens)}")
    gen = torch.Generator().manual_seed(seed)
    total = decode_rows + sum(query_lens)
    q, q_scale = quantize_fp8(torch.randn(total, heads, head_dim, generator=gen))
    weights = (torch.randn(total, heads, generator=gen) * q_scale * head_dim ** -0.5 * heads ** -0.5).float()
    keys, scales = [], []
    for s in seq_lens:
        k, ks = quantize_fp8(torch.randn(s, head_dim, generator=gen))
        keys.append(k)
        scales.append(ks)
    cap = chunk_keys or max(seq_lens, default=0)
    chunks: list = []
    packed: list[int] = []

    def close(reqs: list[int]) -> None:
        # one gathering of `reqs`, cut into sub-chunks where a request's rows exceed subchunk_rows
        if not reqs:
            return
        # the gathering's row windows, as one packed batch of these requests
        starts, ends, at = causal_bounds([seq_lens[r] for r in reqs], [query_lens[r] for r in reqs])
        row = decode_rows + sum(query_lens[:reqs[0]])
        pieces, first = [], True
        for r in reqs:
            l = query_lens[r]
            step = subchunk_rows if subchunk_rows and l > subchunk_rows else max(l, 1)
            for j0 in range(0, l, step):  # (a request without query rows has no rows here)
                pieces.append(min(l, j0 + step) - j0)
        if not pieces:
            return
        # a chunk of whole requests when none is cut, else one chunk a piece
        cut = len(pieces) > sum(1 for r in reqs if query_lens[r])
        sizes = pieces if cut else [sum(pieces)]
        done = 0
        for rows in sizes:
            chunks.append(SimpleNamespace(token_start=row, token_end=row + rows,
                                          cu_seqlen_ks=starts[done:done + rows], cu_seqlen_ke=ends[done:done + rows],
                                          skip_kv_gather=not first, local_total_seq_lens=at,
                                          max_local_total_seq_lens=at, requests=tuple(reqs)))
            done += rows
            row += rows
            first = False

    for r, s in enumerate(seq_lens):
        if not 0 <= query_lens[r] <= s:
            raise ValueError(f"query_lens[{r}]={query_lens[r]} must be in [0, seq_lens[{r}]={s}]")
        if s > cap:
            raise ValueError(f"seq_lens[{r}]={s} does not fit chunk_keys={cap}")
        if sum(seq_lens[i] for i in packed) + s > cap:
            close(packed)
            packed = []
        packed.append(r)
    close(packed)
    return VllmPrefillStep(q, weights, chunks, keys, scales, max((c.max_local_total_seq_lens for c in chunks),
                                                                  default=0))


def sglang_extend_batch(seq_lens: list[int], extend_lens: list[int], *, heads: int = 8, head_dim: int = 32,
                        slots: int | None = None, device: torch.device | str = "cpu", seed: int = 0) -> SimpleNamespace:
    """An extend batch laid out as SGLang's DSA backend lays it out for ``_get_topk_ragged``.

    Request ``i`` has ``seq_lens[i]`` keys (its cached prefix and this extend) of which the
    last ``extend_lens[i]`` are query rows. Its keys are gathered into one buffer after those
    of the requests before it; row ``j`` reads ``[o_i, o_i + prefix_i + j + 1)`` (SGLang's
    ``_cal_indexer_k_start_end``).

    Returns:
        A namespace with ``q_fp8`` fp8 ``[T, H, D]``; ``weights`` float32 ``[T, H, 1]``;
        ``k_fp8`` fp8 ``[N, D]``; ``k_scale`` uint8 ``[N, 4]`` (each row a float32's
        bytes); ``ks``, ``ke`` int32 ``[T]``; ``topk_indices_offset`` (``ks``);
        ``token_to_batch_idx`` int32 ``[T]``; ``page_table_1`` int32 ``[B, max(seq_lens)]``,
        each request's KV slots (distinct, shuffled, out of ``slots``), ``-1`` past its
        length; all on ``device``.
    """
    gen = torch.Generator().manual_seed(seed)
    total = sum(extend_lens)
    q, q_scale = quantize_fp8(torch.randn(total, heads, head_dim, generator=gen))
    weights = (torch.randn(total, heads, generator=gen) * q_scale * head_dim ** -0.5 * heads ** -0.5).float()
    n = sum(seq_lens)
    k, k_scale = quantize_fp8(torch.randn(n, head_dim, generator=gen))
    ks, ke, _ = causal_bounds(seq_lens, extend_lens)
    width = max(seq_lens, default=0)
    slots = max(slots or 2 * n, n)
    perm = torch.randperm(slots, generator=gen)[:n].to(torch.int32)
    table = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    at = 0
    for i, s in enumerate(seq_lens):
        table[i, :s] = perm[at:at + s]
        at += s
    req = torch.repeat_interleave(torch.arange(len(seq_lens), dtype=torch.int32), torch.tensor(extend_lens))
    return SimpleNamespace(q_fp8=q.to(device), weights=weights.unsqueeze(-1).to(device), k_fp8=k.to(device),
                           k_scale=k_scale.view(torch.uint8).reshape(n, 4).to(device), ks=ks.to(device),
                           ke=ke.to(device), topk_indices_offset=ks.to(device), token_to_batch_idx=req.to(device),
                           page_table_1=table.to(device))
