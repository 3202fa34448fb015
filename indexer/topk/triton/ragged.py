"""Triton per-row ragged top-k: sampled threshold, a filtering pass, selection on a tile.

For each row it reads only the row's own window ``[start, start + length)`` of a (possibly
row-padded, non-contiguous) float32 logits block and writes the ``k`` row-relative indices
of its largest values, ``-1`` padded, unordered. Every value maps to an order-preserving
32-bit key (NaNs above everything, ``-0.0`` equal to ``0.0``); selection counts keys, it
never sorts. Three or four kernels (docs/topk.md walks through them with measurements):

*Sample* (``presample=True``: the sm90 default, and always for split rows and for rows
longer than the filter's own sample covers; one program per row). Runs of ``piece``
adjacent keys (64 bytes), one run every ``sparse * piece`` keys, spread evenly over the
row (at most ``SAMPLE_MAX`` keys) give a threshold that the row's
k-th key reaches unless the sample is off by ``sigmas`` standard deviations, and at least
a run deeper than the sample's share of the top k (:func:`_run_rank`: where a row's
largest keys are adjacent, a ramp, its first runs hold them all). The threshold is a key
*and a column* (:func:`_sample_cut`): where many sampled keys equal the threshold's (equal
values, a flat row, exact zeros) the filter keeps the keys equal to it only up to a
column, placed as the sample places the rank, so a tie of any size lets about as many keys
through as distinct values would, and the lowest-column ties, which the tie rule selects,
are among them. With a sample larger than the filter's own it also gives the retry's
threshold, twice the sigmas deep.

*Filter* (persistent, each program taking its next row from a shared counter where
``dynamic``). One pass over the row appends every key at or above the threshold (value and
column) to a per-warp list, ``prefetch`` blocks in flight: on NVIDIA a warp places its keys
with a ballot and a popcount (inline PTX; a row's whole blocks go through one PTX step,
compare to store, :func:`_warp_append`), so the pass needs no block-wide scan; elsewhere
(AMD, the CPU interpreter) a per-warp-row ``tl.cumsum`` does the same. If fewer than k keys
pass, the pass runs once more with the retry's threshold. Few long rows (``slices``,
:func:`auto_slices`) are split into slices of whole blocks, a program each, all appending
to the row's one list: each warp takes runs of ``split_run`` slots from the row's atomic
counter and fills them (:func:`_shared_append`), so it waits on the counter only once a
run; slots a run leaves unused are marked empty and counted apart from the keys listed
(``split_stage``: each program stages per-warp lists instead and copies them at the end of
its slice, :func:`_stage_publish`). Such rows retry in a launch of their own that appends
only the keys between the two thresholds.

*Select* (one program per row). The candidates (or the whole row, when it fits the tile)
sit in registers; the k-th key is found by regula falsi on counts (``count(key >= x) >=
k``, :func:`kth_key`), each step one compare per key and one block reduction, between the
threshold and the largest candidate, ending once exactly k keys reach the bound or the
bound is the k-th key itself. Ties at the k-th key go to the lowest columns (a bit search,
:func:`_search`, on the columns of the tied keys), the rule of the torch path, so both
select the same set. The selected indices are written at a scan's positions, or
(``ballot_write=True``, NVIDIA, the sm90 default) at slots a warp ballot and one atomic add
a warp on a per-row counter give. A row whose lists overflow the first tile is queued for a
second launch with a tile as large as the lists (``SECOND_PROGRAMS_PER_SM`` programs per SM
pulling rows from the queue: a launch with an empty queue costs a load a program).
(``fused=True`` runs the first select inside the filter kernel instead, leaving ties at the
k-th key and the fallback path to the second launch; on an H200 it measured slower.)

Rows the sampled path cannot serve (still too few candidates after the retry, or more than
the lists hold: a sample that misses a stretch of large keys) take the fallback path: a radix
select over the whole row by one program, ``radix_bits`` a pass, and an ordered write. Every
path is exact. Triton is imported lazily; :func:`~.launch.is_available` reports whether
it is there.
"""

from __future__ import annotations

import dataclasses

import torch

from ... import envs as _envs
from ...platform import device_guard, indexed_device
from .config import (
    FALLBACK_PROGRAMS_PER_SM, SECOND_PROGRAMS_PER_SM, STAT_RETRIED, STAT_SEEDED, STAT_SPLIT, TopkConfig, _check_stats,
    _index_vector, in_place_vector, is_nvidia, _programs, _sm_count, plan_launches, auto_slices, launch_config,
    l2_prefetch_keys, pdl_supported, row_kernel_fits, seeds_fallback,
)
from .kernels import FALLBACK_LAUNCHER, FILTER_LAUNCHER, ROW_LAUNCHER, SAMPLE_LAUNCHER, SELECT_LAUNCHER, triton
from .launch import At, LaunchKw
from .ptx import SEED_BINS


def _run_selects(device: torch.device, rows: int, selects: tuple, logits, starts, lengths, out, cand32, counts, thr,
                 ctl, wpos, stats, stride_lm: int, sample_min: int, direct: bool = False) -> None:
    # one program per row for the first launch, SECOND_PROGRAMS_PER_SM per SM pulling queued
    # rows for the second; wpos: a zeroed int32 write counter a row (a row is written by one
    # launch only)
    # (no filter histogram: the selects are given the threshold in its place, never read)
    args = (logits, starts, lengths, out, cand32, counts, thr, ctl, wpos, stats, stride_lm, out.stride(0), sample_min,
            thr, thr)
    for first, kw in selects:
        SELECT_LAUNCHER(_select_grid(device, rows, first), args, kw, device.index, direct)


def _select_grid(device: torch.device, rows: int, first: bool) -> int:
    return rows if first else _programs(device, rows, SECOND_PROGRAMS_PER_SM)


def ragged_topk(
    logits: torch.Tensor,
    starts_rel: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    *,
    config: TopkConfig | None = None,
    stats: torch.Tensor | None = None,
    direct_launch: bool | None = None,
) -> None:
    """Per-row top-k of a logits block, reading each row's window only.

    Args:
        logits: float32 ``[R, n]``, column stride 1, any row stride (padded rows welcome);
            values outside a row's window are never read.
        starts_rel: int ``[R]``, column of each row's first key.
        lengths: int ``[R]``, keys in each row's window (``starts_rel + lengths <= n``).
        topk: Keys kept per row.
        out: int32 ``[R, topk]``, column stride 1; gets indices relative to each row's first
            key, unordered, ``-1`` padded.
        config: How to launch and sample (:class:`~.config.TopkConfig`; default
            :func:`~.config.launch_config` of the logits' device). The set does not depend
            on it.
        stats: Optional contiguous int32 ``[4]``, ``[5]`` or ``[6]`` on the logits' device; the
            kernel adds each row to one counter (``STAT_SHORT``, ``STAT_SAMPLED``,
            ``STAT_PLAIN``, ``STAT_WHOLE``), with a fifth entry each retried row to
            ``STAT_RETRIED``, with a sixth each fallback row split across programs to
            ``STAT_SPLIT`` and with a seventh each of those that started from the filter's
            histogram (``fallback_seed``) to ``STAT_SEEDED``.
        direct_launch: On NVIDIA, launch a kernel's compiled variant directly once Triton's
            JIT has chosen it for the arguments' specialization (:mod:`.launch`: less host
            time a call). ``None``: ``INDEXER_TRITON_DIRECT_LAUNCH`` (on by default).

    Raises:
        ValueError: a bad tensor, or a config the device or the call rules out (before any
            kernel runs).
    """
    if triton is None:
        raise RuntimeError("triton is not importable")
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {tuple(logits.shape)} {logits.dtype}")
    rows, n = logits.shape
    # one call: any int layout, converted once (RaggedTopk reads its vectors in place)
    run = RaggedTopk(logits.device, rows, n, _index_vector(starts_rel), _index_vector(lengths), topk, config=config,
                     stats=stats, direct_launch=direct_launch)
    run(logits, out)


class RaggedTopk:
    """:func:`ragged_topk` prepared once for a block shape and its row windows, run many
    times: the config checked, the launches' arguments made and the scratch placed once,
    so a call only checks the two tensors' shapes and launches (no sync, no allocation once
    bound: CUDA-graph capturable).

    Args:
        device: Device of the logits.
        rows, n: Shape ``[rows, n]`` of the logits blocks it will get.
        starts_rel, lengths: contiguous int32 or int64, ``rows`` entries, on ``device`` (read
            by the kernels at every call, so they may be refreshed in place).
        topk: Keys kept per row.
        config, stats, direct_launch: As :func:`ragged_topk`'s.

    Attributes:
        scratch_numel: int64 elements of scratch a call needs (:meth:`bind`).

    Raises:
        ValueError: a bad argument, or a config the device or the call rules out.
    """

    def __init__(self, device: torch.device, rows: int, n: int, starts_rel: torch.Tensor, lengths: torch.Tensor,
                 topk: int, *, config: TopkConfig | None = None, stats: torch.Tensor | None = None,
                 direct_launch: bool | None = None):
        if triton is None:
            raise RuntimeError("triton is not importable")
        device = indexed_device(device)
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if starts_rel.numel() != rows or lengths.numel() != rows:
            raise ValueError(f"starts_rel and lengths need {rows} entries (one a row), got {starts_rel.numel()} "
                             f"and {lengths.numel()}")
        for name, x in (("starts_rel", starts_rel), ("lengths", lengths)):
            if x.device != device or not in_place_vector(x):
                # a copy would not see the caller's refreshes: the vectors are read in place
                raise ValueError(f"{name} must be a contiguous int32 or int64 tensor of {rows} entries on {device} "
                                 f"(read in place at every call), got {x.dtype} {list(x.shape)} strides "
                                 f"{list(x.stride())} on {x.device}")
        _check_stats(stats, device)
        if direct_launch is not None and not isinstance(direct_launch, bool):
            raise ValueError(f"direct_launch must be True, False or None, got {direct_launch!r}")
        if config is None:
            config = launch_config(device)
        elif not isinstance(config, TopkConfig):
            raise ValueError(f"config must be a TopkConfig, got {type(config).__name__}")
        slices = config.slices
        if slices is None:
            # (a fused select needs whole rows)
            slices = 1 if config.fused else auto_slices(device, rows, n, config.programs_per_sm)
        if config.fallback_seed is None:
            config = dataclasses.replace(config, fallback_seed=seeds_fallback(device, config, rows, slices))
        if config.pdl is None:
            # (the flag is read, and so checked, everywhere)
            config = dataclasses.replace(config, pdl=bool(_envs.value("TOPK_PDL")) and pdl_supported(device))
        self.config = config
        self.plan = plan_launches(device, config, topk, n, slices, stats is not None,
                                  stats is not None and stats.numel() > STAT_RETRIED,
                                  stats is not None and stats.numel() > STAT_SPLIT,
                                  stats is not None and stats.numel() > STAT_SEEDED,
                                  row_kernel_fits(config, rows, n, _sm_count(device) if device.type == "cuda" else None))
        if config.filter_l2_prefetch and device.type == "cuda" and self.plan.filter is not None:
            programs = _programs(device, rows * self.plan.filter["SL"], self.plan.programs_per_sm)
            pfk, pfs = l2_prefetch_keys(config, self.plan, rows, n, programs,
                                        torch.cuda.get_device_properties(device).L2_cache_size)
            if pfk:
                # (the first filter launch only: the retry's follows the filter, which streamed)
                self.plan = self.plan._replace(filter=LaunchKw(self.plan.filter, PFK=pfk, PFS=pfs))
        # NVIDIA only: AMD's Triton also specializes on whether a tensor spans under 2 GB
        # (buffer ops), which the direct launches' key does not hold
        # (the flag is read, and so checked, everywhere)
        direct = _envs.value("TRITON_DIRECT_LAUNCH") if direct_launch is None else direct_launch
        self.direct = direct and is_nvidia(device)
        self.device, self.rows, self.n, self.topk = device, rows, n, topk
        self.stats, self.sample_min = stats, config.sample_min
        # int32 or int64 as they come (the kernels load either): no conversion launches
        self.starts, self.lens = starts_rel.reshape(-1), lengths.reshape(-1)  # views
        _, num_warps, cap = self.plan[:3]
        # (split rows: a list counter, a count of keys listed and a slices-done counter a row)
        self.counters = max(num_warps, 3)
        if self.plan.row is not None:
            # the row kernel's only scratch: a write counter a row
            self.scratch_numel = (rows + 1) // 2
        else:
            # (int32 slots past the lists: counters, thresholds, ctl, then a histogram a row)
            self.scratch_numel = rows * cap + (rows * (self.counters + 7 + SEED_BINS) + 7) // 2
            # a split row's programs stage their lists past that: cap slots and a count a
            # warp each (split_stage); without staging the kernel gets a placeholder it never
            # reads (the scratch's start)
            self.at_stage = 0
            if self.plan.filter["STAGE"]:
                self.at_stage = self.scratch_numel
                self.scratch_numel += rows * self.plan.filter["SL"] * (cap + num_warps)
        self.buf = None

    def bind(self, scratch: torch.Tensor) -> None:
        """Place the scratch: an int64 1-D tensor of at least :attr:`scratch_numel` elements
        with unit stride on the device (contents undefined; the kernels zero what they need)."""
        if (scratch.dtype != torch.int64 or scratch.dim() != 1 or scratch.numel() < self.scratch_numel
                or scratch.device != self.device or (scratch.numel() > 1 and scratch.stride(0) != 1)):
            raise ValueError(f"scratch must be int64 [>= {self.scratch_numel}] with unit stride on {self.device}, got "
                             f"{scratch.dtype} {list(scratch.shape)} on {scratch.device}")
        rows, cap = self.rows, self.plan.cap
        # one allocation: the candidate lists (an int64 slot: value bits, column), then int32
        # per-list counts, thresholds, their column cuts, the retry's thresholds and cuts, write
        # counters and ctl: [0] the filter's next row or slice (dynamic), [1] rows queued for the
        # second select launch, [2] its next entry, [3] rows queued for the split fallback,
        # [4] its next item, [5:5 + rows] the first queue, [5 + rows:] the second; then the
        # filter's histogram a row of the keys its lists had no room for. The kernels
        # index rows themselves, so places in the flat buffer do (At: a view only where the JIT
        # launches)
        lists = rows * cap
        self.buf = scratch
        cand32 = self.cand32 = scratch.view(torch.int32)
        base = cand32.data_ptr()
        if self.plan.row is not None:
            self.wpos = At(cand32, 0, base)
            self._bind_launches()
            return
        self.at_wpos = at_wpos = 2 * lists + rows * (self.counters + 4)
        self.counts = At(cand32, 2 * lists, base)
        self.thr = At(cand32, at_wpos - 4 * rows, base)
        self.tcol = At(cand32, at_wpos - 3 * rows, base)
        self.thr2 = At(cand32, at_wpos - 2 * rows, base)
        self.wpos = At(cand32, at_wpos, base)
        self.ctl = At(cand32, at_wpos + rows, base)
        self.at_hist = at_hist = at_wpos + 3 * rows + 6
        self.hist = At(cand32, at_hist, base)
        self.stage = At(scratch, self.at_stage, scratch.data_ptr())
        self._bind_launches()

    def _bind_launches(self) -> None:
        # every argument but the logits, out and their row strides is fixed from here on: the
        # launches convert only those per call (0: placeholders, given at every call)
        rows, device, direct, index = self.rows, self.device, self.direct, self.device.index
        programs_per_sm, _, _, sample_kw, filter_kw, retry_kw, selects, fallback_kw, row_kw = self.plan
        if row_kw is not None:
            stats = self.stats if self.stats is not None else self.lens
            args = (0, self.starts, self.lens, 0, self.wpos, stats, 0, 0)
            self.launches = ((rows, ROW_LAUNCHER.bind(args, row_kw, index, direct, (0, 3, 6, 7)), (0, 1, 2, 3)),)
            return
        starts, lens, cand32, buf = self.starts, self.lens, self.cand32, self.buf
        counts, thr, tcol, thr2, wpos, ctl = self.counts, self.thr, self.tcol, self.thr2, self.wpos, self.ctl
        hist = self.hist
        stats = self.stats if self.stats is not None else lens
        sample_min = self.sample_min
        launches = []
        # (grid, launch, what its slots take: the logits, out, their row strides)
        if sample_kw is not None:
            args = (0, starts, lens, thr, tcol, thr2, counts, wpos, ctl, rows, 0, sample_min, hist)
            launches.append((rows, SAMPLE_LAUNCHER.bind(args, sample_kw, index, direct, (0, 10)), (0, 2)))
        units = _programs(device, rows * filter_kw["SL"], programs_per_sm)
        filter_args = (0, starts, lens, buf, cand32, counts, thr, tcol, thr2, 0, ctl, wpos, stats, rows, 0, 0,
                       sample_min, hist, self.stage)
        for kw in (filter_kw, retry_kw):
            if kw is not None:
                launches.append((units, FILTER_LAUNCHER.bind(filter_args, kw, index, direct, (0, 9, 14, 15)), (0, 1, 2, 3)))
        # a split row's candidates reach down to its retry's threshold, whether it retried or not
        select_args = (0, starts, lens, 0, cand32, counts, thr if retry_kw is None else thr2, ctl, wpos, stats, 0, 0,
                       sample_min, hist, thr)
        for first, kw in selects:
            bound = SELECT_LAUNCHER.bind(select_args, kw, index, direct, (0, 3, 10, 11))
            launches.append((_select_grid(device, rows, first), bound, (0, 1, 2, 3)))
        if fallback_kw is not None:
            # programs enough for every slice of a few rows; an empty queue costs each two loads
            args = (0, starts, lens, 0, cand32, ctl, wpos, stats, rows, 0, 0)
            bound = FALLBACK_LAUNCHER.bind(args, fallback_kw, index, direct, (0, 3, 9, 10))
            grid = _programs(device, rows * fallback_kw["NS"], FALLBACK_PROGRAMS_PER_SM)
            launches.append((grid, bound, (0, 1, 2, 3)))
        self.launches = tuple(launches)

    def __call__(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        """Select into ``out``: int32 ``[rows, topk]`` (column stride 1) from float32
        ``[rows, n]`` logits (column stride 1, any row stride)."""
        rows, topk, device = self.rows, self.topk, self.device
        if tuple(logits.shape) != (rows, self.n) or logits.dtype != torch.float32 or logits.device != device:
            raise ValueError(f"logits must be float32 [{rows}, {self.n}] on {device}, got {logits.dtype} "
                             f"{list(logits.shape)} on {logits.device}")
        if tuple(out.shape) != (rows, topk) or out.dtype != torch.int32 or out.device != device:
            raise ValueError(f"out must be int32 [{rows}, {topk}] on {device}, got {out.dtype} "
                             f"{list(out.shape)} on {out.device}")
        if (self.n > 1 and logits.stride(1) != 1) or (topk > 1 and out.stride(1) != 1):
            raise ValueError("logits and out need column stride 1")
        if rows == 0:
            return
        if self.buf is None:
            self.bind(torch.empty(self.scratch_numel, dtype=torch.int64, device=device))
        # only the write counters and ctl[0:5] need zeros; the sample kernel zeroes them, else
        # one fill does. A filtered row's counts and threshold are written before they are
        # read; the select also loads them for a row of the fallback path (shorter than
        # sample_min, never filtered), whose path is already set by its length: the values
        # read there are never used
        if self.plan.sample is None and self.plan.row is None:
            self.cand32[self.at_wpos: self.at_wpos + rows + 5].zero_()  # wpos and ctl[0:5], adjacent
            if self.plan.filter["HIST"]:
                self.cand32[self.at_hist: self.at_hist + rows * SEED_BINS].zero_()
        values = (logits, out, logits.stride(0), out.stride(0))
        with device_guard(logits):
            for grid, launch, takes in self.launches:
                launch(grid, *(values[i] for i in takes))
