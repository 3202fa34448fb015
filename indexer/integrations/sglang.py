"""SGLang: the logits + top-k of the DSA indexer's prefill (extend) path in one call.

SGLang's ``Indexer._get_topk_ragged`` (``python/sglang/srt/layers/attention/dsa/dsa_indexer.py``)
gathers every request's index keys into one buffer (``k_fp8`` ``[N, D]``, ``N`` the sum of
the batch's sequence lengths; scales float32 ``[N]`` viewed from uint8 ``[N, 4]``), computes
DeepGEMM's logits of the extend rows against it (row ``i`` reads ``[ks[i], ke[i])``), chunked
by a memory budget, and writes the top-k of each row into ``topk_result`` (int32 ``[T,
topk]``, ``-1`` padded), transformed (``metadata.topk_transform``):

- ``"ragged"`` (fp8 KV cache with a sparse MLA prefill backend): the key's column in the
  gathered buffer, i.e. the row-relative index plus ``topk_indices_offset[i]`` (``ks[i]``
  outside context parallelism);
- ``"paged"``: the key's slot in the KV cache, ``page_table_1[token_to_batch_idx[i], j]`` for
  the row-relative index ``j``;
- ``"relative"``: the row-relative index itself (``SGLANG_DSA_FUSE_TOPK=0``, before
  ``forward_extend`` adds the offsets).

:func:`prefill_topk` does that with indexer (its plan, its top-k, its TP row split);
:func:`plan_prefill` plans a forward step once (where SGLang's backend builds ``ks``/``ke``
in ``init_forward_metadata``) for :meth:`PrefillPlan.run` in every layer. SGLang is never
imported. ``docs/integrations.md`` shows the patch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import api
from ..problem import check_device
from ..step import StepPlan, plan as make_plan
from .index_map import map_indices_
from .vllm import key_scales

TRANSFORMS = ("ragged", "paged", "relative")
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_INT = (torch.int32, torch.int64)


@dataclass(frozen=True)
class IndexTransform:
    """How row-relative top-k indices become SGLang's (:data:`TRANSFORMS`).

    Attributes:
        kind: ``"ragged"``, ``"paged"`` or ``"relative"``.
        offsets: int ``[M]``, added to each row's indices (``"ragged"``).
        page_table_1: int32 ``[B, W]``, each request's KV slot per position (``"paged"``).
        token_to_batch_idx: int ``[M]``, each row's request in ``page_table_1`` (``"paged"``).
    """

    kind: str
    offsets: torch.Tensor | None = None
    page_table_1: torch.Tensor | None = None
    token_to_batch_idx: torch.Tensor | None = None

    def apply_(self, sel: torch.Tensor) -> None:
        """Rewrite ``sel`` (int32 ``[M, topk]``, row-relative, ``-1`` padded) in place; ``-1``
        stays ``-1``. No host sync; one kernel on a GPU (:func:`~.index_map.map_indices_`)."""
        if self.kind == "ragged":
            map_indices_(sel, offsets=self.offsets)
        elif self.kind == "paged":
            map_indices_(sel, table=self.page_table_1, table_rows=self.token_to_batch_idx)


def make_transform(kind: str, rows: int, row_starts: torch.Tensor, *, topk_indices_offset=None, page_table_1=None,
                   token_to_batch_idx=None, device=None) -> IndexTransform:
    """Check a transform's arguments (shapes, dtypes, devices) and build it.

    Args:
        kind: One of :data:`TRANSFORMS`.
        rows: ``M``, the extend rows.
        row_starts: ``ks``, int ``[M]``: the default ``topk_indices_offset``.
        topk_indices_offset, page_table_1, token_to_batch_idx: As :class:`IndexTransform`.
        device: Where the output lives (default ``row_starts``').

    Raises:
        ValueError: a bad kind, a missing or misshapen tensor, naming it.
    """
    device = check_device(device) if device is not None else row_starts.device
    if kind not in TRANSFORMS:
        raise ValueError(f"transform must be one of {'|'.join(TRANSFORMS)}, got {kind!r}")

    def vector(name, t):
        if t is None:
            raise ValueError(f"transform {kind!r} needs {name} (int [{rows}])")
        if t.dtype not in _INT or t.dim() != 1 or t.numel() != rows or t.device != device:
            raise ValueError(f"{name} must be int32 or int64 [{rows}] on {device}, got {t.dtype} {list(t.shape)} "
                             f"on {t.device}")
        return t

    if kind == "ragged":
        if topk_indices_offset is None:  # the default offsets are ks itself
            return IndexTransform(kind, offsets=vector("ks (topk_indices_offset's default)", row_starts))
        return IndexTransform(kind, offsets=vector("topk_indices_offset", topk_indices_offset))
    if kind == "paged":
        if page_table_1 is None or page_table_1.dim() != 2 or page_table_1.dtype not in _INT or \
                page_table_1.device != device:
            got = None if page_table_1 is None else f"{page_table_1.dtype} {list(page_table_1.shape)} on " \
                                                     f"{page_table_1.device}"
            raise ValueError(f"transform 'paged' needs page_table_1, int32 [B, W] on {device}, got {got}")
        return IndexTransform(kind, page_table_1=page_table_1,
                              token_to_batch_idx=vector("token_to_batch_idx", token_to_batch_idx))
    return IndexTransform(kind)


def _check_paged_values(t: IndexTransform, starts_host: torch.Tensor, ends_host: torch.Tensor) -> None:
    # every position a row can select must have a slot: one copy of the row -> request map
    if t.kind != "paged" or starts_host.numel() == 0:
        return
    b, w = t.page_table_1.shape
    req = t.token_to_batch_idx.cpu()
    bad = torch.nonzero((req < 0) | (req >= b))
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"token_to_batch_idx must be in [0, {b}) (page_table_1's rows); row {i} has {int(req[i])}")
    bad = torch.nonzero(ends_host - starts_host > w)
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"page_table_1 has {w} positions a request; row {i} reads {int(ends_host[i] - starts_host[i])} "
                         "keys")


def _layer_inputs(q_fp8, k_fp8, k_scale, weights, out, rows: int, topk: int):
    # SGLang's tensors as indexer takes them, checked before any kernel
    if q_fp8.dim() != 3 or q_fp8.dtype not in _FP8:
        raise ValueError(f"q_fp8 must be fp8 [T, H, D], got {q_fp8.dtype} {list(q_fp8.shape)}")
    if weights.dim() == 3 and weights.shape[2] == 1:
        weights = weights.squeeze(-1)  # SGLang's [T, H, 1]
    if weights.dim() != 2 or tuple(weights.shape) != tuple(q_fp8.shape[:2]) or weights.dtype != torch.float32:
        raise ValueError(f"weights must be float32 [T, H] or [T, H, 1] with [T, H] = {list(q_fp8.shape[:2])}, got "
                         f"{weights.dtype} {list(weights.shape)}")
    if rows > q_fp8.shape[0]:
        raise ValueError(f"ks has {rows} rows, more than q_fp8's {q_fp8.shape[0]}")
    if out is not None and (out.dim() != 2 or out.dtype != torch.int32 or out.shape[0] < rows or out.shape[1] < topk
                            or out.device != q_fp8.device):
        raise ValueError(f"topk_result must be int32 [>= {rows}, >= {topk}] on {q_fp8.device}, got {out.dtype} "
                         f"{list(out.shape)} on {out.device}")
    return q_fp8[:rows], k_fp8, key_scales(k_scale), weights[:rows]


def prefill_topk(q_fp8: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                 ks: torch.Tensor, ke: torch.Tensor, topk: int, topk_result: torch.Tensor | None = None, *,
                 transform: str = "ragged", topk_indices_offset: torch.Tensor | None = None,
                 page_table_1: torch.Tensor | None = None, token_to_batch_idx: torch.Tensor | None = None,
                 group: object | None = None, max_logits_mb: float | None = None, **options) -> torch.Tensor:
    """The top-k of every extend row, in place of the logits + ``topk_transform`` part of
    SGLang's ``_get_topk_ragged``.

    Args:
        q_fp8: fp8 ``[T, H, D]``; rows ``[0, M)`` are computed (``M = ks.numel()``).
        k_fp8: fp8 ``[N, D]``, every request's keys gathered (``get_index_k_scale_buffer``).
        k_scale: float32 ``[N]`` (SGLang's ``k_scale.view(torch.float32).squeeze(-1)``) or
            its uint8 ``[N, 4]``.
        weights: float32 ``[T, H]`` or SGLang's ``[T, H, 1]`` (q scale, ``H**-0.5`` and
            ``D**-0.5`` folded in).
        ks, ke: int32 ``[M]``, each row's window in ``k_fp8`` (``metadata.get_indexer_kvcache_range()``).
        topk: Keys kept per row (``index_topk``).
        topk_result: int32 ``[>= M, >= topk]`` to write rows ``[0, M)``, columns ``[0, topk)``
            of (others untouched); ``None``: a new ``[T, topk]`` filled with ``-1``.
        transform: ``"ragged"``, ``"paged"`` or ``"relative"`` (module docstring).
        topk_indices_offset: int ``[M]`` for ``"ragged"`` (default ``ks``).
        page_table_1, token_to_batch_idx: For ``"paged"``: int32 ``[B, W]`` and int ``[M]``.
        group: Tensor-parallel process group (the attention-TP group): the ranks split the
            rows and each ends with the whole table (every rank makes the same call).
        max_logits_mb: Working-set budget in MiB.
        **options: More keywords of :func:`indexer.prefill_topk`.

    Returns:
        ``topk_result``.

    Raises:
        ValueError, TypeError: bad input, before any kernel; ``topk_result`` untouched.
    """
    rows = ks.numel()
    t = make_transform(transform, rows, ks, topk_indices_offset=topk_indices_offset, page_table_1=page_table_1,
                       token_to_batch_idx=token_to_batch_idx, device=q_fp8.device)
    q, k, scales, w = _layer_inputs(q_fp8, k_fp8, k_scale, weights, topk_result, rows, topk)
    if t.kind == "paged":
        _check_paged_values(t, ks.cpu(), ke.cpu())
    if topk_result is None:
        topk_result = torch.full((q_fp8.shape[0], topk), -1, dtype=torch.int32, device=q_fp8.device)
    sel = topk_result[:rows, :topk]
    api.prefill_topk(q, k, scales, w, ks, ke, topk, out=sel, group=group, max_logits_mb=max_logits_mb, **options)
    t.apply_(sel)
    return topk_result


class PrefillPlan:
    """A forward step's extend rows planned once (:func:`plan_prefill`), run in every layer.

    Attributes:
        plan: The :class:`indexer.StepPlan` of the rows (``None`` without rows).
        transform: The :class:`IndexTransform` applied to its output.
    """

    def __init__(self, plan: StepPlan | None, transform: IndexTransform, rows: int, topk: int):
        self.plan, self.transform, self.rows, self.topk = plan, transform, rows, topk

    def run(self, q_fp8: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
            topk_result: torch.Tensor) -> torch.Tensor:
        """One layer's top-k into rows ``[0, M)`` of ``topk_result`` (arguments as
        :func:`prefill_topk`'s); no planning, no sync."""
        q, k, scales, w = _layer_inputs(q_fp8, k_fp8, k_scale, weights, topk_result, self.rows, self.topk)
        if self.plan is None:
            return topk_result
        sel = topk_result[:self.rows, :self.topk]
        self.plan.run(q, k, scales, w, out=sel)
        self.transform.apply_(sel)
        return topk_result

    def __str__(self) -> str:
        head = f"SGLang extend: {self.rows} rows, transform {self.transform.kind}"
        return head if self.plan is None else head + "\n  " + str(self.plan).replace("\n", "\n  ")


def plan_prefill(ks: torch.Tensor, ke: torch.Tensor, *, num_keys: int, heads: int, head_dim: int, topk: int,
                 transform: str = "ragged", topk_indices_offset: torch.Tensor | None = None,
                 page_table_1: torch.Tensor | None = None, token_to_batch_idx: torch.Tensor | None = None,
                 group: object | None = None, device: torch.device | str | None = None,
                 fp8_dtype: torch.dtype = torch.float8_e4m3fn, max_logits_mb: float | None = None,
                 **options) -> PrefillPlan:
    """Plan a forward step's extend rows once (after SGLang's backend computes ``ks``/``ke``
    in ``init_forward_metadata``) for :meth:`PrefillPlan.run` in every layer.

    Args:
        ks, ke: int32 ``[M]`` on the host or the device (one copy to the host here); the
            plan keeps copies, so SGLang may refill them.
        num_keys: ``N``, keys in the gathered buffer (the batch's summed sequence lengths).
        heads, head_dim, topk: ``H``, ``D`` and keys kept per row.
        transform, topk_indices_offset, page_table_1, token_to_batch_idx: As
            :func:`prefill_topk`'s, bound into the plan (on ``device``): copies of the
            ``[M]`` vectors; ``page_table_1`` itself, read at every run.
        group, max_logits_mb: As :func:`prefill_topk`'s.
        device: Device of the layers' tensors (default: the bounds').
        fp8_dtype: dtype of ``q_fp8`` and ``k_fp8``.
        **options: More keywords of :func:`indexer.plan`.

    Raises:
        ValueError: bounds, a transform or an option that does not fit.
    """
    device = check_device(device) if device is not None else ks.device
    rows = ks.numel()
    # copies of the [M] vectors: the plan outlives this call, and SGLang refills its metadata
    own = (lambda t: t.clone() if isinstance(t, torch.Tensor) else t)  # noqa: E731 - a bad type is refused below
    t = make_transform(transform, rows, ks.to(device, copy=True), topk_indices_offset=own(topk_indices_offset),
                       page_table_1=page_table_1, token_to_batch_idx=own(token_to_batch_idx), device=device)
    starts, ends = ks.to("cpu", copy=True), ke.to("cpu", copy=True)
    _check_paged_values(t, starts, ends)
    if rows == 0:
        return PrefillPlan(None, t, 0, topk)
    step = make_plan(starts, ends, num_keys=num_keys, heads=heads, head_dim=head_dim, topk=topk, group=group,
                     device=device, fp8_dtype=fp8_dtype, max_logits_mb=max_logits_mb, **options)
    return PrefillPlan(step, t, rows, topk)
