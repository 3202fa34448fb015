"""Logits and top-k in one pass over the keys: the ``[M, N]`` logits are never written.

The Triton keys-major logits kernel (:mod:`.kernels`) computes
each logits tile in registers; here its epilogue keeps only the keys at or above a per-row
threshold, as candidates (value and column) in per-row lists, the layout :mod:`indexer.topk.triton.ragged`'s
select kernel reads. Three steps:

1. *Sample.* The logits of every ``stride``-th key (``stride`` 32, larger past
   ``32 * SAMPLE_KEYS`` keys: at most :data:`SAMPLE_KEYS` keys a row): :func:`~.kernels.mqa_logits` on ``k[::stride]``,
   a ``[M, N / stride]`` block. Per row, the threshold is the sampled key that the row's
   k-th key reaches unless the sample is off by ``sigmas`` standard deviations (the filter
   kernel's rule, :func:`indexer.topk.triton.ragged._sample_threshold`). Rows of at most ``cap`` keys keep
   every key (threshold ``-inf``).
2. *Logits and filter* (:func:`logits_filter_kernel`): one program a block of rows walks
   its rows' key tiles once; every key ``>= threshold`` goes to one of its row's lists, one
   list per position in the key tile (``cap / BLOCK_N`` slots each), the lists' lengths
   after them (counting on past their slots).
3. *Select*: :mod:`indexer.topk.triton.ragged`'s select kernel on the lists (a first launch with ``tile``
   slots, ``cap`` by default; else a second with ``cap`` for rows whose lists are longer).

Exact: the candidates include every key at or above the k-th, ties included, and their
values come from the tile function of :func:`~.kernels.mqa_logits`'s kernel
(:func:`~.kernels._keys_major_tile`, same launch config), so the set is the one
:func:`indexer.topk.triton.ragged.ragged_topk` (or torch.topk) selects from that kernel's block (equal in every
test, on the CPU interpreter and an H200; the two kernels are compiled separately, so equal
bits rest on the shared function, not on a proof). A row whose lists came out short of
``k`` keys (an unlucky sample) or one of them past its slots is recomputed the unfused way
(its logits, then the ragged top-k). Finding those rows reads a count back to the host, and
the input checks (:func:`indexer.problem.validate`) read the row bounds: the call is not
CUDA-graph capturable.

Memory: ``8 * cap`` bytes a row of candidates (64 KiB at topk 2048) and ``4 * N / stride``
of sampled logits (16 KiB at most), against ``4 * N`` for the logits (512 KiB at 128K).
"""

from __future__ import annotations

import torch

from ...problem import validate
from . import kernels as logits_kernels
from ...topk.triton import ragged
from ...topk.triton import config as topk_config
from ...topk.triton import kernels as topk_kernels

triton, tl = logits_kernels.triton, logits_kernels.tl

#: Most sampled keys a row (the threshold kernel holds a row's sample in registers).
SAMPLE_KEYS = 4096

if triton is not None:

    @triton.jit
    def _threshold_kernel(sample_ptr, starts_ptr, ends_ptr, thr_ptr, stride_sm, stride, K_: tl.constexpr,
                          CAP: tl.constexpr, SP: tl.constexpr, SIGMAS: tl.constexpr, SLACK: tl.constexpr,
                          LOW_BIT: tl.constexpr):
        """``thr[row]``: the key of row ``row``'s threshold, from its sampled logits (row
        ``row`` of ``sample``, ``SP`` columns, a power of two, ``-inf`` outside the window)."""
        row = tl.program_id(0).to(tl.int64)
        start = tl.load(starts_ptr + row)
        end = tl.load(ends_ptr + row)
        length = end - start
        # the sampled keys in the window: columns j * stride with start <= j * stride < end
        s0 = (start + stride - 1) // stride
        s1 = (end + stride - 1) // stride
        j = tl.arange(0, SP)
        m = (j >= s0) & (j < s1)
        sampled = tl.load(sample_ptr + row * stride_sm + j, mask=m, other=0.0)
        skeys = tl.where(m, topk_kernels._skey(sampled), -2147483648)
        s = s1 - s0
        t = topk_kernels._skey(tl.full((), float("-inf"), tl.float32))
        if (length > CAP) & (s > 0):
            t = topk_kernels._sample_threshold(skeys, topk_kernels._sample_rank(K_, s, length, SIGMAS), SLACK, LOW_BIT)
        tl.store(thr_ptr + row, t)

    @triton.jit
    def _store_b32(ptr, value, mask, passthrough):
        """A predicated 4-byte store as inline PTX, in its operands' layout (a tl.store of
        scattered pointers takes a layout of its own, and converting the logits tile to it
        through shared memory every tile cost more than the store). Returns ``passthrough``
        (int32) so that the caller's dataflow orders it."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, $4; }",
            "=r,l,r,r,r", [ptr, value, mask.to(tl.int32), passthrough], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def logits_filter_kernel(
        q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, thr_ptr, cand32_ptr, cnt_ptr,
        M, N,
        stride_qm,
        stride_kn,
        stride_wm,
        H: tl.constexpr,
        D: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAP: tl.constexpr,
        PTX: tl.constexpr,
    ):
        """The logits of ``BLOCK_Q`` rows, tile by tile as :func:`~.kernels.
        mqa_logits_fused_kernel` computes them; each row's keys ``>= thr[row]`` (a key of
        :func:`indexer.topk.triton.ragged._skey`) to its ``BLOCK_N`` lists of ``CAP // BLOCK_N`` slots,
        ``cand32[row]`` (two int32 a slot: the value's bits, then the column from the row's
        start): key ``n`` to list ``n % BLOCK_N``; ``cnt[row, i]`` list ``i``'s length (past
        its slots: it overflowed). One list per position in the key tile, so that every
        slot follows from a counter of the element's own (no scan across the tile, whose
        keys sit in other warps: a per-row scan here cost more than the MMAs)."""
        pid = tl.program_id(0)
        rows = pid * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rmask = rows < M
        starts, ends, lo, hi = logits_kernels._row_windows(starts_ptr, ends_ptr, rows, rmask, N)
        q_t, w = logits_kernels._keys_major_operands(q_ptr, w_ptr, pid, M, stride_qm, stride_wm, H, D, BLOCK_Q)
        tf = topk_kernels._key_float(tl.load(thr_ptr + rows, mask=rmask, other=0))
        WCAP: tl.constexpr = CAP // BLOCK_N
        lane = tl.arange(0, BLOCK_N)
        # the slots as int32 (value bits, then column: two 4-byte stores measured 5% faster
        # than one packed 8-byte store on an H200), addressed from the program's first row by
        # int32 offsets: the logits alone take 255 registers, and a tensor of 64-bit slot
        # pointers held through the loop made the kernel spill
        base = cand32_ptr + pid.to(tl.int64) * (BLOCK_Q * 2 * CAP)
        slot0 = tl.arange(0, BLOCK_Q)[None, :] * (2 * CAP) + lane[:, None] * (2 * WCAP)
        # each element's next slot (its list's length: (off - slot0) / 2), the only tensor
        # the loop carries besides the logits kernel's own
        off = slot0
        lo_t = (lo // BLOCK_N) * BLOCK_N
        hi_t = tl.maximum(((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo_t)
        for n0 in range(lo_t, hi_t, BLOCK_N):
            cols = n0 + lane
            cmask = cols < N
            logit = logits_kernels._keys_major_tile(k_ptr, k_scale_ptr, cols, cmask, stride_kn, q_t, w, H, D, BLOCK_Q,
                                                    BLOCK_N)
            valid = (cols[:, None] >= starts[None, :]) & (cols[:, None] < ends[None, :])
            keep = valid & (~(logit < tf[None, :]))
            fits = keep & (off < slot0 + 2 * WCAP)
            if PTX:  # NVIDIA
                off = _store_b32(base + off, logit.to(tl.int32, bitcast=True), fits, off)
                off = _store_b32(base + off + 1, cols[:, None] - starts[None, :], fits, off)
            else:
                tl.store(base + off, logit.to(tl.int32, bitcast=True), mask=fits)
                tl.store(base + off + 1, cols[:, None] - starts[None, :], mask=fits)
            off += 2 * keep.to(tl.int32)
        tl.store(cnt_ptr + rows.to(tl.int64)[None, :] * BLOCK_N + lane[:, None], (off - slot0) // 2,
                 mask=rmask[None, :])


def sample_stride(n: int) -> int:
    """Every how many keys the threshold's sample takes one: 32, or more past
    ``32 * SAMPLE_KEYS`` keys."""
    return max(topk_config.SPARSE, -(-n // SAMPLE_KEYS))


def logits_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    *,
    cap: int | None = None,
    tile: int | None = None,
    select_warps: int = 8,
    sigmas: float = topk_config.SIGMAS,
    stats: torch.Tensor | None = None,
) -> int:
    """Top-k keys of every row of the indexer logits, without writing the logits.

    Args:
        q: fp8 ``[M, H, D]``, H a power of two up to 128 (the keys-major kernel's), D 32,
            64 or 128.
        k: fp8 ``[N, D]``, q's dtype. k_scale: float32 ``[N]``. weights: float32 ``[M, H]``.
        row_starts, row_ends: int32 ``[M]``, each row's window ``[start, end)`` of keys,
            ``0 <= start <= end <= N``.
        topk: Keys kept per row.
        out: int32 ``[M, topk]``, column stride 1 (rows may be padded); gets indices
            relative to each row's start, unordered, ``-1`` padded (as
            :func:`indexer.topk.triton.ragged.ragged_topk` writes them). The other inputs are checked as
            :func:`indexer.prefill_topk` checks them.
        cap: Candidate slots a row (default ``max(8192, 4 * topk)``, a power of two); also
            bounds the recomputed rows' logits, taken a piece of ``8 * cap * M`` bytes at a
            time.
        tile: Slots of the first select launch (default ``cap``; a power of two, at least
            the key tile of the logits kernel, whose every position has a list): rows with
            a list longer than ``tile`` over the lists go to a second launch.
        select_warps: Warps of the first select launch.
        sigmas: Depth of the sampled threshold, in standard deviations.
        stats: Optional contiguous int32 ``[4]``, :func:`indexer.topk.triton.ragged.ragged_topk`'s path
            counters: ``STAT_SAMPLED`` counts the rows selected from their lists (those that
            kept every key too); a recomputed row counts on the path the unfused top-k took.

    Returns:
        The number of rows recomputed the unfused way (short or overflowing lists).

    Raises:
        TypeError, ValueError: an input :func:`indexer.prefill_topk` would refuse, or a
            shape or option these kernels cannot take (before any kernel runs).
    """
    if triton is None:
        raise RuntimeError("triton is not importable")
    # every check of prefill_topk's (shapes, dtypes, devices, finite scales, row bounds: one
    # device-to-host copy), then this kernel's own
    problem, inputs = validate(q, k, k_scale, weights, row_starts, row_ends, topk)
    m, h, d = q.shape
    n = k.shape[0]
    # (out may have padded rows, unlike prefill_topk's)
    if tuple(out.shape) != (m, topk) or out.dtype != torch.int32 or out.stride(1) != 1 or out.device != q.device:
        raise ValueError(f"out must be int32 [{m}, {topk}] with column stride 1 on {q.device}, got {out.dtype} "
                         f"{list(out.shape)} on {out.device}")
    if not logits_kernels.fused_supported(h):
        raise ValueError(f"q's heads H={h} must be a power of two up to 128")
    if d not in (32, 64, 128):
        raise ValueError(f"head dim D must be 32, 64 or 128, got {d}")
    cap = topk_config.default_cap(topk) if cap is None else cap
    tile = cap if tile is None else tile
    lists = logits_kernels.fused_config(h, d).block_n
    if not (topk_config._pow2(cap) and topk_config._pow2(tile) and topk <= cap and lists <= tile <= cap <= 1 << 20):
        raise ValueError(f"cap and tile must be powers of two with topk <= cap and {lists} (the key tile) <= tile <= "
                         f"cap <= 2**20; got cap={cap}, tile={tile}, topk={topk}")
    if not (isinstance(select_warps, int) and topk_config._pow2(select_warps) and select_warps <= 16):
        raise ValueError(f"select_warps must be a power of two up to 16, got {select_warps!r}")
    if not 0 < sigmas < float("inf"):
        raise ValueError(f"sigmas must be positive and finite, got {sigmas}")
    topk_config._check_stats(stats, q.device)
    if m == 0:
        return 0
    device = q.device
    starts, ends = problem.row_starts.contiguous(), problem.row_ends.contiguous()
    lengths = ends - starts
    q = q.contiguous()
    k = k if k.stride(1) == 1 else k.contiguous()
    weights = weights.contiguous()
    k_scale = inputs.k_scale.contiguous()

    # 1. the sample's logits and the thresholds
    stride = sample_stride(n)
    sample = logits_kernels.mqa_logits(q, k[::stride], k_scale[::stride], weights, (starts + stride - 1) // stride,
                          (ends + stride - 1) // stride)
    thr = torch.empty(m, dtype=torch.int32, device=device)
    cand32 = torch.empty(m, 2 * cap, dtype=torch.int32, device=device)
    # the lists' lengths, the select's write counters, then its ctl: [1] rows queued for its
    # second launch, [2] that launch's next entry, [5:] the queue ([3:5] the split fallback's
    # counters, unused here)
    scratch = torch.zeros(m * (lists + 2) + 5, dtype=torch.int32, device=device)
    counts = scratch[: m * lists].view(m, lists)
    wpos, ctl = scratch[m * lists:].split((m, m + 5))
    cfg = logits_kernels.fused_config(h, d)
    with logits_kernels.device_guard(q):
        _threshold_kernel[(m,)](sample, starts, ends, thr, sample.stride(0), stride, K_=topk, CAP=cap,
                                SP=topk_config._next_pow2(sample.shape[1]), SIGMAS=float(sigmas),
                                SLACK=float(topk_config.SAMPLE_SLACK),
                                LOW_BIT=8, num_warps=8)
        del sample
        # 2. the logits, filtered as they are computed
        logits_filter_kernel[(triton.cdiv(m, cfg.block_q),)](
            q, k, k_scale, weights, starts, ends, thr, cand32, counts, m, n, q.stride(0), k.stride(0),
            weights.stride(0), H=h, D=d, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, CAP=cap,
            PTX=topk_config.is_nvidia(device),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    # rows the lists cannot serve: the only device-to-host read
    bad = (lengths > topk) & ((counts.sum(1) < topk) | (counts.max(1).values > cap // lists))
    redo = bad.nonzero().flatten()
    n_redo = int(redo.numel())
    # 3. the select, on lists only (no row is read whole: those recomputed get length 0 here)
    sel_len = torch.where(bad, 0, lengths) if n_redo else lengths
    stats_arg = stats if stats is not None else sel_len
    # WHOLE=topk: no row is selected on its logits (there are none); BLOCK: the plain
    # path's, never taken here
    common = topk_config.select_constexprs(topk, lists, cap, topk, topk_config.DEFAULT_CONFIG.block,
                                           topk_config.RADIX_BITS, stats is not None)
    with logits_kernels.device_guard(q):
        # logits: a float32 placeholder, never read
        selects = topk_config.select_launches(common, tile, cap, select_warps,
                                     ballot_write=(topk_config.is_nvidia(device)
                                                   and topk_config.launch_config(device).ballot_write))
        ragged._run_selects(device, m, selects, thr.view(torch.float32), starts, sel_len, out, cand32, counts, thr, ctl,
                       wpos, stats_arg, 0, 0)
    del cand32, scratch, counts, ctl, wpos, thr  # free before the fallback's logits
    if n_redo:
        if stats is not None:
            # the select counted them as short (length 0 there); the fallback's select
            # counts each on its own path
            stats[topk_config.STAT_SHORT] -= n_redo
        # the unfused way for those rows, their logits, then the ragged top-k, in pieces of
        # at most the candidate lists' bytes
        per = max(1, (8 * cap * m) // (4 * n))
        for i in range(0, n_redo, per):
            rows = redo[i: i + per]
            logits = logits_kernels.mqa_logits(q[rows], k, k_scale, weights[rows], starts[rows], ends[rows])
            sub = torch.empty(rows.numel(), topk, dtype=torch.int32, device=device)
            ragged.ragged_topk(logits, starts[rows], lengths[rows], topk, sub, stats=stats)
            out[rows] = sub
            del logits
    return n_redo
