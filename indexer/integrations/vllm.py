"""vLLM: the prefill part of ``sparse_attn_indexer`` in one call.

vLLM's indexer (``vllm/model_executor/layers/sparse_attn_indexer.py``) walks the prefill
chunks of a step: for each chunk it gathers the keys of the chunk's requests into a shared
workspace (``k_quant_full`` fp8 ``[T_ws, D]``, ``k_scale_full`` uint8 ``[T_ws, 4]``: each row a
float32's bytes), computes the chunk's logits with DeepGEMM and writes the top-k of each row,
relative to the row's ``cu_seqlen_ks``, into ``topk_indices_buffer[token_start:token_end,
:topk]`` (``-1`` padded). A request too long for the logits budget is cut into sub-chunks of
rows that reuse the gathered keys (``skip_kv_gather``).

:func:`prefill_topk` replaces that loop (gather callback, logits and top-k) with one call;
:func:`plan_prefill` plans a step once for the engine to run it in every layer. Both give
indexer whole requests: sub-chunks that share gathered keys are merged into one call
(:func:`merge_subchunks`), so the library's own memory chunking, gate and tensor-parallel
row split see all of a request's rows. Chunk objects are read by attribute (``token_start``,
``token_end``, ``cu_seqlen_ks``, ``cu_seqlen_ke``, and where present ``skip_kv_gather``,
``max_local_total_seq_lens``, ``local_total_seq_lens``); vLLM is never imported.
``docs/integrations.md`` shows the patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .. import api
from ..problem import check_bounds
from ..step import StepPlan, plan as make_plan

#: ``gather(chunk, k_quant, k_scale)``: fill the key workspace slices for ``chunk``'s
#: requests (vLLM: ``ops.cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale,
#: chunk.block_table, chunk.local_cu_seq_lens)``), given the raw workspace slices.
Gather = Callable[[object, torch.Tensor, torch.Tensor], object]

_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
#: The keywords of :func:`indexer.prefill_topk` that :func:`prefill_topk` passes through.
_ONE_SHOT_OPTIONS = frozenset({"backend", "strategy", "reassembly", "tp_shard", "min_rows_per_rank"})


@dataclass(frozen=True)
class ChunkGroup:
    """Consecutive prefill chunks that read one gathering of the key workspace.

    Attributes:
        token_start, token_end: The group's rows ``[token_start, token_end)`` of the step.
        cu_seqlen_ks, cu_seqlen_ke: int ``[token_end - token_start]``, each row's window in
            the workspace (the members' bounds, concatenated).
        num_keys: Workspace keys the group reads (``max_local_total_seq_lens``), or ``None``
            where the chunks do not say (then the whole workspace).
        chunks: The members, in order; the first one's gather fills the workspace.
    """

    token_start: int
    token_end: int
    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    num_keys: int | None
    chunks: tuple

    @property
    def has_keys(self) -> bool:
        """Whether any member gathers keys here (``local_total_seq_lens``; a rank of a
        context-parallel group can hold none of a chunk's keys)."""
        return any(getattr(c, "local_total_seq_lens", 1) > 0 for c in self.chunks)

    @property
    def gathers(self) -> bool:
        """Whether the group's first chunk gathers keys (vLLM skips that for a chunk that
        reuses the previous gathering, and for one without keys)."""
        first = self.chunks[0]
        return not getattr(first, "skip_kv_gather", False) and getattr(first, "local_total_seq_lens", 1) > 0


def _chunks_of(prefill) -> Sequence:
    return prefill.chunks if hasattr(prefill, "chunks") else prefill


def merge_subchunks(prefill) -> list[ChunkGroup]:
    """Group a step's prefill chunks by the key gathering they read.

    A chunk with ``skip_kv_gather`` set whose rows follow the previous chunk's reuses that
    chunk's gathered keys (vLLM's sub-chunks of one long request): it joins its group. Rows
    and bounds are concatenated as they are; the selected sets do not change.

    Args:
        prefill: vLLM's prefill metadata (an object with ``chunks``) or a sequence of chunks.

    Returns:
        The groups, in row order.

    Raises:
        ValueError: a chunk without the attributes read, or rows out of order.
    """
    groups: list[list] = []
    for i, chunk in enumerate(_chunks_of(prefill)):
        for name in ("token_start", "token_end", "cu_seqlen_ks", "cu_seqlen_ke"):
            if not hasattr(chunk, name):
                raise ValueError(f"prefill chunk {i} has no {name!r} (a vLLM prefill chunk has token_start, "
                                 "token_end, cu_seqlen_ks and cu_seqlen_ke)")
        start, end = int(chunk.token_start), int(chunk.token_end)
        if end < start or chunk.cu_seqlen_ks.numel() != end - start or chunk.cu_seqlen_ke.numel() != end - start:
            raise ValueError(f"prefill chunk {i}: rows [{start}, {end}) need {end - start} entries in cu_seqlen_ks "
                             f"and cu_seqlen_ke, got {chunk.cu_seqlen_ks.numel()} and {chunk.cu_seqlen_ke.numel()}")
        if groups and start < int(groups[-1][-1].token_end):
            raise ValueError(f"prefill chunk {i} starts at row {start}, before the previous chunk ends "
                             f"({int(groups[-1][-1].token_end)}): chunks must come in row order")
        if groups and getattr(chunk, "skip_kv_gather", False) and start == int(groups[-1][-1].token_end):
            groups[-1].append(chunk)
        else:
            groups.append([chunk])
    out = []
    for members in groups:
        sizes = [getattr(c, "max_local_total_seq_lens", None) for c in members]
        num_keys = None if any(s is None for s in sizes) else max(int(s) for s in sizes)
        cat = (lambda ts: ts[0] if len(ts) == 1 else torch.cat(ts))  # noqa: E731 - one chunk: no copy
        out.append(ChunkGroup(int(members[0].token_start), int(members[-1].token_end),
                              cat([c.cu_seqlen_ks.reshape(-1) for c in members]),
                              cat([c.cu_seqlen_ke.reshape(-1) for c in members]), num_keys, tuple(members)))
    return out


def key_scales(k_scale: torch.Tensor) -> torch.Tensor:
    """vLLM's gathered key scales as indexer's float32 ``[N]`` (a view: no copy).

    Args:
        k_scale: The FP8 workspace's uint8 ``[N, 4]`` (each row a float32's bytes, as
            vLLM passes ``k_scale.view(torch.float32).squeeze(-1)`` to DeepGEMM), or float32
            ``[N]`` / ``[N, 1]``.

    Raises:
        ValueError: another layout; int32 (UE8M0 exponents packed four to a key, one scale
            per 32 dimensions) and the MXFP4 cache's scales carry several scales per key,
            which indexer's one scale per key cannot express.
    """
    if k_scale.dtype == torch.uint8 and k_scale.dim() == 2 and k_scale.shape[1] == 4:
        if k_scale.stride(1) != 1 or (k_scale.shape[0] > 1 and k_scale.stride(0) % 4):
            raise ValueError(f"k_scale: uint8 [N, 4] rows must be whole float32s (strides {k_scale.stride()})")
        return k_scale.view(torch.float32).squeeze(-1)
    if k_scale.dtype == torch.float32 and (k_scale.dim() == 1 or (k_scale.dim() == 2 and k_scale.shape[1] == 1)):
        return k_scale.reshape(-1)
    raise ValueError(f"k_scale must be uint8 [N, 4] (float32 bytes) or float32 [N] / [N, 1], one scale per key; got "
                     f"{k_scale.dtype} {list(k_scale.shape)} (packed UE8M0 or MXFP4 block scales have several scales "
                     "per key, which indexer does not take)")


def _check(groups: list[ChunkGroup], q, k_quant, k_scale, weights, buffer, topk: int) -> torch.Tensor:
    # every argument against the groups, before the gather or any kernel runs
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    if q.dim() != 3 or q.dtype not in _FP8:
        raise ValueError(f"q must be fp8 [T, H, D], got {q.dtype} {list(q.shape)}")
    if weights.dim() != 2 or tuple(weights.shape) != tuple(q.shape[:2]) or weights.dtype != torch.float32:
        raise ValueError(f"weights must be float32 [T, H] = {list(q.shape[:2])}, got {weights.dtype} "
                         f"{list(weights.shape)}")
    if k_quant.dim() != 2 or k_quant.dtype != q.dtype or k_quant.shape[1] != q.shape[2]:
        raise ValueError(f"k_quant must be {q.dtype} [N, {q.shape[2]}], got {k_quant.dtype} {list(k_quant.shape)}")
    for name, x in (("weights", weights), ("k_quant", k_quant), ("k_scale", k_scale)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    scales = key_scales(k_scale)
    if scales.shape[0] != k_quant.shape[0]:
        raise ValueError(f"k_scale needs {k_quant.shape[0]} keys (one a k_quant row), got {scales.shape[0]}")
    rows = max((g.token_end for g in groups), default=0)
    if rows > q.shape[0]:
        raise ValueError(f"the prefill chunks reach row {rows}, past q's {q.shape[0]} rows")
    if (buffer.dim() != 2 or buffer.dtype != torch.int32 or buffer.shape[0] < rows or buffer.shape[1] < topk
            or buffer.device != q.device):
        raise ValueError(f"topk_indices_buffer must be int32 [>= {rows}, >= {topk}] on {q.device}, got "
                         f"{buffer.dtype} {list(buffer.shape)} on {buffer.device}")
    for g in groups:
        if g.num_keys is not None and g.num_keys > k_quant.shape[0]:
            raise ValueError(f"rows [{g.token_start}, {g.token_end}) read {g.num_keys} workspace keys, past "
                             f"k_quant's {k_quant.shape[0]}")
    return scales


def _run(groups: list[ChunkGroup], q, k_quant, k_scale, weights, buffer, topk: int, gather: Gather | None,
         call: Callable) -> torch.Tensor:
    scales = _check(groups, q, k_quant, k_scale, weights, buffer, topk)
    for i, g in enumerate(groups):
        n = k_quant.shape[0] if g.num_keys is None else g.num_keys
        if gather is not None and g.gathers:
            gather(g.chunks[0], k_quant[:n], k_scale[:n])
        out = buffer[g.token_start:g.token_end, :topk]
        if n == 0 or not g.has_keys or g.token_end == g.token_start:
            out.fill_(-1)  # no keys: every row empty (as vLLM's loop writes them)
            continue
        rows = slice(g.token_start, g.token_end)
        call(i, g, q[rows], k_quant[:n], scales[:n], weights[rows], out)
    return buffer


def prefill_topk(prefill, q: torch.Tensor, k_quant: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                 topk_indices_buffer: torch.Tensor, topk: int, *, gather: Gather | None = None,
                 group: object | None = None, max_logits_mb: float | None = None, **options) -> torch.Tensor:
    """The top-k of every prefill row of a step, in place of vLLM's prefill chunk loop.

    Each group of chunks (:func:`merge_subchunks`) is gathered by ``gather`` (where its
    first chunk gathers) and computed by :func:`indexer.prefill_topk`, which keeps the plans
    of recent calls: the same bounds in the next layer plan nothing again.

    Args:
        prefill: vLLM's prefill metadata (``attn_metadata.prefill``, with ``chunks``) or a
            sequence of its chunks.
        q: fp8 ``[T, H, D]``, the step's indexer queries (``q_quant``), decode rows included.
        k_quant: fp8 ``[T_ws, D]``, the key workspace (``k_quant_full``).
        k_scale: Its scales, uint8 ``[T_ws, 4]`` (``k_scale_full``) or float32 ``[T_ws]``
            (:func:`key_scales`).
        weights: float32 ``[T, H]`` (the q scale, ``D**-0.5`` and ``H**-0.5`` folded in).
        topk_indices_buffer: int32 ``[>= T, >= topk]``; rows of the prefill chunks get, per
            row, the indices of its ``topk`` largest logits relative to its
            ``cu_seqlen_ks``, ``-1`` padded, in columns ``[0, topk)``. Other rows and columns
            are not written.
        topk: Keys kept per row (vLLM's ``topk_tokens``).
        gather: Fills the workspace for a group (:data:`Gather`); ``None`` when it is filled.
        group: Tensor-parallel process group: the ranks split the rows and each ends with
            the whole table (every rank must make the same call).
        max_logits_mb: Working-set budget in MiB (pass vLLM's
            ``VLLM_SPARSE_INDEXER_MAX_LOGITS_MB``, which its memory profiling reserves).
        **options: More keywords of :func:`indexer.prefill_topk` (``backend``, ``strategy``,
            ``reassembly``, ``tp_shard``, ``min_rows_per_rank``).

    Returns:
        ``topk_indices_buffer``.

    Raises:
        ValueError: a chunk, tensor or option that does not fit, before any gather or
            kernel; the buffer is then untouched. Non-finite key scales where a group's rows
            read them: checked once that group's keys are gathered, so the rows of the
            groups before it are already written (the message names the group's rows).
    """
    unknown = sorted(set(options) - _ONE_SHOT_OPTIONS)
    if unknown:
        raise ValueError(f"prefill_topk got unknown option(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(sorted(_ONE_SHOT_OPTIONS))} besides gather, group and max_logits_mb")
    groups = merge_subchunks(prefill)
    # every group's windows before the first gather or kernel (a later group's bad bounds
    # would otherwise surface after earlier groups had written their rows), in one copy
    host = torch.cat([b.reshape(-1).to(torch.int64) for g in groups for b in (g.cu_seqlen_ks, g.cu_seqlen_ke)]
                     ).cpu() if groups else None
    at = 0
    for g in groups:
        n = k_quant.shape[0] if g.num_keys is None else g.num_keys
        m = g.token_end - g.token_start
        starts, ends, at = host[at:at + m], host[at + m:at + 2 * m], at + 2 * m
        try:
            check_bounds(starts, ends, n)
        except ValueError as exc:
            raise ValueError(f"rows [{g.token_start}, {g.token_end}) (their cu_seqlen_ks / cu_seqlen_ke as row_starts / "
                             f"row_ends, N the workspace keys they read): {exc}") from None

    def call(i, g, q_rows, k_rows, scales, w_rows, out):
        try:
            api.prefill_topk(q_rows, k_rows, scales, w_rows, g.cu_seqlen_ks, g.cu_seqlen_ke, topk, group=group,
                             out=out, max_logits_mb=max_logits_mb, **options)
        except ValueError as exc:  # the gathered scales' check: say which group's rows
            if type(exc) is not ValueError:  # a subclass (ReassemblyError) keeps its type
                raise
            raise ValueError(f"rows [{g.token_start}, {g.token_end}): {exc}") from None

    return _run(groups, q, k_quant, k_scale, weights, topk_indices_buffer, topk, gather, call)


class PrefillPlan:
    """A step's prefill planned once (:func:`plan_prefill`), run in every layer.

    Attributes:
        groups: The step's chunk groups (:func:`merge_subchunks`).
        plans: One :class:`indexer.StepPlan` a group (``None`` for a group without keys).
    """

    def __init__(self, groups: list[ChunkGroup], plans: list[StepPlan | None], topk: int):
        self.groups, self.plans, self.topk = groups, plans, topk

    def run(self, q: torch.Tensor, k_quant: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
            topk_indices_buffer: torch.Tensor, *, gather: Gather | None = None) -> torch.Tensor:
        """One layer's prefill top-k into ``topk_indices_buffer`` (arguments as
        :func:`prefill_topk`'s); no planning, no sync."""

        def call(i, g, q_rows, k_rows, scales, w_rows, out):
            self.plans[i].run(q_rows, k_rows, scales, w_rows, out=out)

        return _run(self.groups, q, k_quant, k_scale, weights, topk_indices_buffer, self.topk, gather, call)

    def __str__(self) -> str:
        lines = [f"vLLM prefill: {len(self.groups)} group(s) of chunks"]
        for g, p in zip(self.groups, self.plans):
            lines.append(f"rows [{g.token_start}, {g.token_end}) from {len(g.chunks)} chunk(s):")
            lines.append("  no keys" if p is None else "  " + str(p).replace("\n", "\n  "))
        return "\n".join(lines)


def plan_prefill(prefill, *, heads: int, head_dim: int, topk: int, group: object | None = None,
                 device: torch.device | str | None = None, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                 max_logits_mb: float | None = None, **options) -> PrefillPlan:
    """Plan a step's prefill once (in the engine's metadata builder, say) for
    :meth:`PrefillPlan.run` in every layer.

    Args:
        prefill: vLLM's prefill metadata or a sequence of its chunks; the chunks' bounds are
            read here (device bounds: one copy to the host per group) and bound into the
            plans, so a run reads the bounds as they were now.
        heads, head_dim: ``H`` and ``D`` of the indexer's queries.
        topk: Keys kept per row.
        group, max_logits_mb: As :func:`prefill_topk`'s.
        device: Device of the layers' tensors (default: the bounds').
        fp8_dtype: dtype of ``q`` and ``k_quant``.
        **options: More keywords of :func:`indexer.plan`.

    Returns:
        A :class:`PrefillPlan`.

    Raises:
        ValueError: a chunk that does not fit, or a group whose keys are unknown (a chunk
            without ``max_local_total_seq_lens``: a plan needs the key count).
    """
    groups = merge_subchunks(prefill)
    plans: list[StepPlan | None] = []
    for g in groups:
        if g.num_keys is None:
            raise ValueError(f"rows [{g.token_start}, {g.token_end}): their chunks have no max_local_total_seq_lens, "
                             "the key count a plan needs (prefill_topk reads it from k_quant instead)")
        if g.num_keys == 0 or not g.has_keys or g.token_end == g.token_start:
            plans.append(None)
            continue
        # copies: a group of one chunk holds the chunk's own tensors, which indexer.plan would
        # use in place, and the metadata's owner may refill them before a later step's run
        plans.append(make_plan(g.cu_seqlen_ks.clone(), g.cu_seqlen_ke.clone(), num_keys=g.num_keys, heads=heads, head_dim=head_dim,
                               topk=topk, group=group, device=device, fp8_dtype=fp8_dtype,
                               max_logits_mb=max_logits_mb, **options))
    return PrefillPlan(groups, plans, topk)
