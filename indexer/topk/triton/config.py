"""The Triton top-k's constants, per-architecture launch configs and launch planning.

:func:`plan_launches` turns :func:`~.ragged.ragged_topk`'s options and a block shape into its
launches' arguments, once per distinct shape (cached). Nothing here needs Triton.
"""

from __future__ import annotations

import functools
import numbers
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, NamedTuple

import torch

from ...platform import _arch_from_torch
from .launch import LaunchKw
from .ptx import SEED_BINS

#: Shape of the sampled path (see the module docstring): runs of ``PIECE`` keys (64 bytes, a
#: few sectors), one run every ``SPARSE * PIECE`` keys, so one key in ``SPARSE`` sampled; at
#: most ``PIECES`` runs in the filter kernel's own sample (it sits in registers during its
#: search, and there sets the register count) and ``SAMPLE_MAX`` keys in the sample
#: kernel's, which runs before the filter and so may hold more: long rows keep one key in
#: ``SPARSE`` up to 512K keys. The threshold is ``SIGMAS`` standard deviations deep.
PIECES, PIECE, SPARSE, SIGMAS = 256, 16, 32, 4.0
SAMPLE_MAX = 16384
#: The sample kernel's density past the filter's own sample: one key in 64 (4096 keys at 256K,
#: 8192 at 512K, 16384 at 1M), where one in 32 slowed 256K-512K-key rows by searching a
#: sample twice as large.
SAMPLE_SPARSE = 64
#: The sample threshold's search may end this fraction above its rank (``sample_slack``).
SAMPLE_SLACK = 1 / 32
#: Candidate slots per row (``max(CAP, 4 * topk)``, a power of two): ``8 * cap`` bytes.
CAP = 8192
RADIX_BITS = 4
#: The select's regula falsi (:func:`kth_key`) halves its bracket after this many counts,
#: and while the bracket spans more than ``SEARCH_SPAN`` keys (two binades of float32).
SEARCH_BISECT_AFTER, SEARCH_SPAN = 16, 1 << 24
#: Programs an SM of the second select launch, each pulling queued rows (lists longer than
#: the first launch's tile) until none is left: two overlap one's memory waits with the
#: other's counting (H200, 256K keys, 1609 queued rows of 8192: 164 -> 110 us; four: the
#: same as two; docs/history/topk-kernel.md).
SECOND_PROGRAMS_PER_SM = 2
#: Split rows (``slices``): at most this many programs a row, each filtering at least
#: ``SLICE_MIN`` keys of it.
MAX_SLICES, SLICE_MIN = 64, 16384
#: Slots a filter warp takes from a split row's list counter at a time (``split_run``): 8
#: was the fastest run that slowed no measured shape (H100, 65K-2M keys, 4-64 slices a row);
#: longer runs left enough empty slots to push rows past the first select tile
#: (docs/benchmarks.md, "Split rows: list slots in runs").
SPLIT_RUN = 8
#: Counters of :func:`ragged_topk`'s ``stats``: rows listed whole (at most k keys), rows
#: selected from sampled candidates, rows that took the plain radix select, rows selected
#: on the row itself (longer than k, within the select tile); these four count each row
#: once. With a fifth entry, rows filtered a second time (the retry, fewer than k keys
#: through the first threshold), whichever path then served them.
STAT_SHORT, STAT_SAMPLED, STAT_PLAIN, STAT_WHOLE, STAT_RETRIED = 0, 1, 2, 3, 4
#: With a sixth entry, the rows of ``STAT_PLAIN`` that were split across programs; with a
#: seventh, those of them that started from the filter's histogram (``fallback_seed``).
STAT_SPLIT, STAT_SEEDED = 5, 6
#: Fallback rows of at least ``FALLBACK_SPLIT`` keys are split into slices of
#: ``FALLBACK_SLICE`` keys, a work item each, in a launch of their own
#: (``fallback_kernel``); shorter ones are selected by one program in the select launch.
#: ``FALLBACK_PROGRAMS_PER_SM`` programs an SM take the items.
FALLBACK_SPLIT, FALLBACK_SLICE, FALLBACK_PROGRAMS_PER_SM = 32768, 16384, 8
#: Whole rows of at least ``RETRY_SPLIT`` keys too few of whose keys pass the first
#: threshold take the split fallback instead of a second pass by their filter program
#: (``retry_split``): measured faster from 64K keys on (one such row among 1024: 0.86x the
#: time at 64K, 0.66x at 2M, docs/benchmarks.md), so from the split fallback's own bound.
RETRY_SPLIT = FALLBACK_SPLIT
#: Keys a step of the split fallback's passes (at 512 the kernel takes 64 registers a
#: thread and 8 programs fit an SM; at 2048 it took 96: docs/topk.md); int32 slots of a
#: row's state before its per-slice counts (seven 32-bin digit histograms; the count of keys
#: in its buffer, the pass that fills it, the bits found, their mask, the keys still
#: needed, the passes ready, the greatest and least key a pass saw and the items done); slots
#: budgeted a slice: twice its key count and 32 slots (its greatest and least counted key),
#: room for the counts' padding to a power of two.
FALLBACK_BLOCK, FALLBACK_STATE, FALLBACK_SLICE_SLOTS = 512, 7 * 32 + 9, 2 * (1 + 32)
#: Warps of a split fallback program; its ballots take four keys a thread, so steps of a
#: multiple of ``FALLBACK_BALLOT_KEYS`` keys (``fallback_ballot``).
FALLBACK_WARPS = 4
FALLBACK_BALLOT_KEYS = 4 * 32 * FALLBACK_WARPS
#: Steps of ``fallback_block`` keys whose loads a split fallback program has in flight
#: ahead of the one it counts (``fallback_prefetch``).
FALLBACK_PREFETCH = 1
#: Keys at most in a split fallback row's buffer (``fallback_buffer``): once the digits found
#: leave at most this many keys that could still be the k-th, one pass moves them to the
#: buffer (and writes the keys above them), and one program finishes the row from there, the
#: buffer in its registers (4096 keys took the kernel to 168 registers a thread).
FALLBACK_BUFFER = 1024


def _int(x) -> bool:
    # an integer (numpy's included), not a bool
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class TopkConfig:
    """How the Triton top-k launches and samples; any config selects the same set per row.

    Made once, never changed: take :func:`launch_config`'s for a device and change fields
    with :func:`dataclasses.replace`. A field that cannot be valid on any device raises
    ``ValueError`` naming it when the config is made; what depends on the device or the call
    (``ballot`` and register caps off NVIDIA, ``cap`` below ``topk``) when it is planned.

    Attributes:
        num_warps: Warps of the filter kernel, also its number of candidate lists a row.
        filter_block: Keys per step of the filtering pass (a power of two, a multiple of
            ``num_warps``); ``128 * num_warps`` lets NVIDIA GPUs use the ballot.
        programs_per_sm: Filter programs per SM (its grid is persistent).
        select_warps: Warps of the select kernel's first launch.
        block: Keys per step of the fallback path's passes (a power of two).
        fused: Select each row in the filter kernel right after filtering it.
        prefetch: Blocks of ``filter_block`` keys each filter program has in flight (1-3).
        tile_write: The first select writes the indices from the key tile in registers
            (one scan; more registers) instead of re-reading the candidates 1024 at a time.
        dynamic: Filter programs take rows from a shared counter rather than every
            ``nprog``-th row.
        presample: The thresholds come from a sample kernel of their own before the filter,
            which then only streams. ``None``: only where rows outgrow the filter's own
            sample (``pieces`` runs).
        ballot_write: The select places the indices by warp ballots and one atomic add per
            warp on a per-row counter instead of a block-wide scan (NVIDIA only).
        streaming_filter_maxnreg: Register cap of a filter that only streams (``presample``
            and not ``fused``): an architecture's tuned value; ``None``: no cap.
        filter_maxnreg: Register cap of the filter whatever it does (NVIDIA only; ``0``: no
            cap). ``None``: ``streaming_filter_maxnreg`` where it applies.
        select_maxnreg: Register cap of the first select launch (NVIDIA only; ``0`` or
            ``None``: no cap).
        fallback_maxnreg: Register cap of the split fallback's launch (NVIDIA only; ``0`` or
            ``None``: no cap).
        tile: Candidate slots of the first select launch (a power of two, ``num_warps`` to
            ``cap``); rows up to this long are selected on the row itself. ``None``: ``2 *
            topk`` rounded up to a power of two.
        ballot: Place candidates with the PTX ballot. ``None``: where it can run.
        cap: Candidate slots per row (``8 * cap`` bytes of scratch). ``None``: ``max(CAP, 4 *
            topk)`` as a power of two.
        slices: Programs filtering each row (a power of two up to :data:`MAX_SLICES`), for
            few long rows (implies ``presample``, excludes ``fused``). ``None``:
            :func:`auto_slices`.
        split_run: Slots of a split row's one list that a filter warp takes from the row's
            counter at a time (0 or a power of two up to 128): a warp places its keys in its
            run and waits on the counter's atomic add only when they do not fit what is left
            (a new run: the keys left over or ``split_run`` slots, whichever is more). Slots
            a warp leaves unused in its last run are marked empty and skipped by the select
            (at most ``split_run - 1`` a warp, out of ``cap``; runs are shortened where a
            row's warps could leave more than ``cap - 2 * topk``: :func:`split_run_for`).
            ``0``: one atomic add a warp for each block with keys to place, no empty slots.
            Used only without ``split_stage``.
        split_tile: Slots of the first select launch where rows are split (``slices > 1``):
            a power of two, ``num_warps`` to ``cap``, in place of ``tile``; that launch takes
            ``max(select_warps, min(16, split_tile // 512))`` warps, and in such a call rows
            of up to ``split_tile`` keys are selected on the row itself, as ``tile`` sets for
            whole rows. ``None``: ``tile``, as whole rows. With ``cap`` the row's whole list
            is one tile, so no row goes to the second select launch however many slots its
            runs leave empty.
        split_stage: A split row's filter programs list their keys as a whole row's do,
            one list a warp in scratch of their own (``8 * cap`` bytes a program), and copy
            them to the row's list at the end of the slice, at slots taken by one atomic add
            a program: no atomic while they stream, no empty slots (``split_run`` unused).
            Off: on an H100 it took 0.80-0.93x the time of runs of 8 on Gaussian, sink and
            stripes rows at 64K-128K keys, but 1.03-1.22x where a row's candidates sit in one
            slice (ramps, ties cut by column) or at 2M keys (docs/benchmarks.md, "Split rows:
            staged lists").
        radix_bits: Bits of the key resolved per pass of the fallback path (1, 2, 4 or 8).
        pieces, piece, sparse, sigmas: The sample: runs of ``piece`` keys, one key in
            ``sparse`` sampled, at most ``pieces`` runs in the filter kernel's own sample, its
            threshold ``sigmas`` standard deviations deep.
        sample_max: Keys at most in the sample kernel's sample (a power of two, at least
            ``piece``).
        sample_sparse: Past the filter's own sample (``pieces`` runs), the sample kernel's
            holds at most one key in ``sample_sparse`` (at least ``sparse``).
        sample_low_bit: Bits of the sample threshold's key left 0 (0-24): fewer counting
            steps for a slightly lower, still safe, threshold.
        sample_slack: The threshold's search ends once at most ``rank * (1 + sample_slack)``
            sampled keys reach it (0 to 64).
        sample_min: Rows longer than ``tile`` but shorter than this take the fallback path
            (for tests).
        sample_jitter: Place each of the sample's runs at a pseudo-random multiple of 8 keys
            within its window instead of at the window's start, so that a structure with the
            runs' period (large keys every 512 columns) is sampled in proportion.
        filter_deal: Deal each filter block's groups of keys (a warp's share of the block) to
            the warps' candidate lists in a pseudo-random order per block, so that keys large
            at one offset of every block (a periodic structure) spread over every list
            instead of overflowing one (whole rows; a split row has one list).
        retry_split: Whole rows (not split across filter programs) of at least this many
            keys through whose first threshold fewer than ``topk`` keys pass skip the filter
            program's second pass with the deeper threshold and take the split fallback,
            whose passes are spread over many programs, where that launch is planned (rows
            of at least ``fallback_split``); ``0``: they always retry.
        fallback_split: Rows of at least this many keys that take the fallback path are
            split into slices of ``fallback_slice`` keys, a program each, in a launch of their
            own that is planned only for blocks at least this wide; ``0``: never (every
            fallback row is selected by one program).
        fallback_slice: Keys a program of a split fallback row (a power of two, at least
            256).
        fallback_block: Keys a step of the split fallback's passes (a power of two, 128 to
            65536; clamped to a slice).
        fallback_buffer: Keys at most that a split fallback row moves to a buffer once its
            digits leave no more than that many candidates for the k-th key, so that its
            remaining digit passes are not run (a power of two up to 4096, or ``0``: never).
            Smaller where the row's scratch left after its state holds fewer.
        fallback_prefetch: Steps of ``fallback_block`` keys whose loads each split fallback
            program keeps in flight ahead of the one it counts (1-3).
        fallback_ballot: The split fallback counts each digit by warp ballots into
            registers, gathered once a slice (instead of ``tl.histogram``, which adds every
            key to a shared-memory bin by an atomic, between barriers), and places indices and
            buffered keys by warp ballots (NVIDIA only; ``fallback_block`` and
            ``fallback_slice`` multiples of 512). ``None``: where it can run.
        fallback_items: Items (runs of a pass over adjacent slices of a row) a split fallback
            program takes a pass at least: its items merge 2, 4, ... slices where the rows
            queued leave that many (each item costs atomics and a wait; 8 in the sm90
            config). ``0``: one slice an item.
        fallback_seed: A row whose candidate lists overflowed (more keys passed the threshold
            than they hold: large keys where the sample did not read, or all in one warp's
            list) starts the split fallback from what the filter saw: the keys the lists had
            no room for are counted into a histogram of the row's key range above the
            threshold (:data:`~.ptx.SEED_BINS` bins of 1/32 of a binade), the select adds the
            listed keys, and the bin holding the k-th key gives its top ``32 -``
            :data:`~.ptx.SEED_SHIFT` bits: the fallback's first pass moves that bin to the
            buffer where it fits, else counts the next digit below them, instead of starting
            from the top digit. ``None``: :func:`seeds_fallback` decides from the launch (on
            NVIDIA where every filter program stays resident at ``seeded_filter_maxnreg``).
        row_max: Blocks of more than ``tile`` and at most this many keys (a power of two up
            to 65536, or ``0``: never) are selected by one launch of one program a row that
            holds the whole row in registers (``row_kernel``): no sample, filter or select
            launch and no candidate lists; its sample brackets the k-th key and the counts
            run on the row itself. Whole rows only (``slices`` 1, not ``fused``).
        row_warps: Warps of that launch for rows of ``row_max`` keys (a power of two);
            shorter rows take proportionally fewer, so a thread holds the same number of
            keys, but at least ``min(4, row_warps)``.
        row_maxnreg: Register cap of that launch where it runs ``row_warps`` warps (NVIDIA
            only; ``0`` or ``None``: no cap); the launches of shorter rows run uncapped.
        row_keys_per_sm: The row kernel runs only where the call's rows times their padded
            length are at most this many keys an SM (:func:`row_kernel_fits`): one program
            a row pays off while the rows are few, and the sample / filter / select launches
            are faster once many rows queue on each SM. ``None``: no limit.
        row_sigmas: Standard deviations on either side of its sample's share of the top k
            that its two bracketing keys lie (a miss costs counts, not the result).
        seeded_filter_maxnreg: Register cap of a streaming filter that also counts the keys
            its lists have no room for (``fallback_seed``; NVIDIA only; in place of
            ``streaming_filter_maxnreg``, where that applies; ``0``: no cap). ``None``:
            ``streaming_filter_maxnreg``. The counting's operand and branch need more
            registers than the streaming cap leaves (H200, Triton 3.6: at 32 the loop spilled
            5-10 words a step and the top-k took 1.55-1.73x its time on rows that never
            overflow; at 48 nothing, docs/topk.md).
        pdl: Launch every kernel with programmatic dependent launch: a launch's programs
            may be placed on the SMs while the launch before it still runs, and wait there
            (``griddepcontrol.wait``) until it has finished, so the GPU does not idle
            between the call's launches. ``None``: where :func:`pdl_supported` (in
            :class:`~.ragged.RaggedTopk`, also as ``INDEXER_TOPK_PDL`` says).
        filter_l2_prefetch: Fraction of the GPU's L2 cache the filter's programs fill before
            their wait, each with the first keys of the row slice it takes if slices go out in
            program order (``prefetch.global.L2``), so that DRAM streams the rows while the
            sample kernel runs (it reads little). Applies only where the filter launches with
            ``pdl`` after the sample kernel (NVIDIA); elsewhere, and at ``0``, nothing is
            prefetched. Not yet measured with ``pdl`` on: off.
        sample_tie_bit: The searches over a sample (the sample kernel's, the filter's own,
            the row kernel's two bracketing keys) pause below this bit of the key; where more
            of the sample's keys than the search's slack allows and than twice the rank are
            still at or above it, the least of them is tried as the rank-th key (two
            reductions), which settles a rank among many equal keys without counting the
            remaining bits; the keys found are the same (0, or ``sample_low_bit + 1`` to 31;
            ``0``: off). 20 in the sm90 config (measured there: docs/benchmarks.md); off
            elsewhere.
        select_snap: The select's search for the k-th key among a row's candidates moves an
            end of its bracket to the nearest key wherever a count finds no key between the
            probe and that end (one more reduction), instead of narrowing a gap a few keys a
            count: candidates of few distinct values (ties at the threshold, outliers) settle
            in a few counts (the select launches' and, with ``fused``, the filter's). The same
            key contract, the same selected sets. Off: measured mixed on an H100 (tied rows
            faster, the others slower; docs/benchmarks.md).
        sample_warps: Warps of the sample kernel (a power of two up to 16). ``None``: 32 of
            its keys a thread, 16 where rows are split (``slices > 1``), within 1-16 warps.
    """

    num_warps: int = 4
    filter_block: int = 512
    programs_per_sm: int = 8
    select_warps: int = 4
    block: int = 512
    fused: bool = False
    prefetch: int = 1
    tile_write: bool = False
    dynamic: bool = False
    presample: bool | None = None
    ballot_write: bool = False
    streaming_filter_maxnreg: int | None = None
    filter_maxnreg: int | None = None
    select_maxnreg: int | None = None
    fallback_maxnreg: int | None = None
    tile: int | None = None
    ballot: bool | None = None
    cap: int | None = None
    slices: int | None = None
    split_run: int = SPLIT_RUN
    split_stage: bool = False
    split_tile: int | None = None
    radix_bits: int = RADIX_BITS
    pieces: int = PIECES
    piece: int = PIECE
    sparse: int = SPARSE
    sigmas: float = SIGMAS
    sample_max: int = SAMPLE_MAX
    sample_sparse: int = SAMPLE_SPARSE
    sample_low_bit: int = 8
    sample_slack: float = SAMPLE_SLACK
    sample_min: int = 0
    sample_jitter: bool = False
    filter_deal: bool = False
    retry_split: int = RETRY_SPLIT
    fallback_split: int = FALLBACK_SPLIT
    fallback_slice: int = FALLBACK_SLICE
    fallback_block: int = FALLBACK_BLOCK
    fallback_buffer: int = FALLBACK_BUFFER
    fallback_prefetch: int = FALLBACK_PREFETCH
    fallback_ballot: bool | None = None
    fallback_items: int = 0
    fallback_seed: bool | None = None
    seeded_filter_maxnreg: int | None = None
    row_max: int = 0
    row_warps: int = 8
    row_maxnreg: int | None = None
    row_sigmas: float = 2.0
    row_keys_per_sm: int | None = None
    pdl: bool | None = None
    sample_warps: int | None = None
    filter_l2_prefetch: float = 0.0
    sample_tie_bit: int = 0
    select_snap: bool = False

    def __post_init__(self) -> None:
        for name in ("fused", "tile_write", "dynamic", "ballot_write", "sample_jitter", "filter_deal", "select_snap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("presample", "ballot", "fallback_ballot", "fallback_seed", "pdl"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or None, got {value!r}")
        for name in ("num_warps", "filter_block", "select_warps", "block", "pieces", "piece", "sample_max",
                     "row_warps"):
            value = getattr(self, name)
            if not (_int(value) and _pow2(value)):
                raise ValueError(f"{name} must be a power of two, got {value!r}")
        for name in ("tile", "cap"):
            value = getattr(self, name)
            if value is not None and not (_int(value) and _pow2(value)):
                raise ValueError(f"{name} must be None or a power of two, got {value!r}")
        for name in ("sparse", "programs_per_sm"):
            value = getattr(self, name)
            if not (_int(value) and value >= 1):
                raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
        # (a Triton tile: the row's keys, a thread's share of them held in registers)
        if not (_int(self.row_max) and (self.row_max == 0 or _pow2(self.row_max)) and self.row_max <= 1 << 16):
            raise ValueError(f"row_max must be 0 or a power of two of at most 65536, got {self.row_max!r}")
        if not (isinstance(self.row_sigmas, numbers.Real) and self.row_sigmas > 0):
            raise ValueError(f"row_sigmas must be positive, got {self.row_sigmas!r}")
        if not (isinstance(self.filter_l2_prefetch, numbers.Real) and 0 <= self.filter_l2_prefetch <= 1):
            raise ValueError(f"filter_l2_prefetch must be in [0, 1], got {self.filter_l2_prefetch!r}")
        if self.sample_warps is not None and not (_int(self.sample_warps) and _pow2(self.sample_warps)
                                                  and self.sample_warps <= 16):
            raise ValueError(f"sample_warps must be None or a power of two of at most 16, got {self.sample_warps!r}")
        if self.row_keys_per_sm is not None and not (_int(self.row_keys_per_sm) and self.row_keys_per_sm >= 1):
            raise ValueError(f"row_keys_per_sm must be None or an int of at least 1, got {self.row_keys_per_sm!r}")
        if not (_int(self.sample_min) and self.sample_min >= 0):
            raise ValueError(f"sample_min must be an int >= 0, got {self.sample_min!r}")
        if not (_int(self.retry_split) and self.retry_split >= 0):
            raise ValueError(f"retry_split must be an int >= 0, got {self.retry_split!r}")
        if not (_int(self.fallback_split) and self.fallback_split >= 0):
            raise ValueError(f"fallback_split must be an int >= 0, got {self.fallback_split!r}")
        if not (_int(self.fallback_slice) and _pow2(self.fallback_slice) and self.fallback_slice >= 256):
            raise ValueError(f"fallback_slice must be a power of two of at least 256, got {self.fallback_slice!r}")
        # (at least a thread's worth for each of the launch's 128 threads)
        if not (_int(self.fallback_block) and _pow2(self.fallback_block) and 128 <= self.fallback_block <= 1 << 16):
            raise ValueError(f"fallback_block must be a power of two from 128 to 65536, got {self.fallback_block!r}")
        # (the program finishing a row holds the buffer in registers)
        if not (_int(self.fallback_buffer) and (self.fallback_buffer == 0 or _pow2(self.fallback_buffer))
                and self.fallback_buffer <= 4096):
            raise ValueError(f"fallback_buffer must be 0 or a power of two of at most 4096, got "
                             f"{self.fallback_buffer!r}")
        if not (_int(self.fallback_prefetch) and self.fallback_prefetch in (1, 2, 3)):
            raise ValueError(f"fallback_prefetch must be 1, 2 or 3, got {self.fallback_prefetch!r}")
        if not (_int(self.fallback_items) and self.fallback_items >= 0):
            raise ValueError(f"fallback_items must be an int >= 0, got {self.fallback_items!r}")
        if self.slices is not None and not (_int(self.slices) and _pow2(self.slices) and self.slices <= MAX_SLICES):
            raise ValueError(f"slices must be None or a power of two in 1-{MAX_SLICES}, got {self.slices!r}")
        if not (_int(self.split_run) and (self.split_run == 0 or _pow2(self.split_run)) and self.split_run <= 128):
            raise ValueError(f"split_run must be 0 or a power of two of at most 128, got {self.split_run!r}")
        if self.split_tile is not None and not (_int(self.split_tile) and _pow2(self.split_tile)):
            raise ValueError(f"split_tile must be None or a power of two, got {self.split_tile!r}")
        if not isinstance(self.split_stage, bool):
            raise ValueError(f"split_stage must be True or False, got {self.split_stage!r}")
        if self.fused and self.slices is not None and self.slices > 1:
            raise ValueError("fused=True needs slices=1 (a split row's select cannot run in one filter program)")
        if self.radix_bits not in (1, 2, 4, 8) or not _int(self.radix_bits):
            raise ValueError(f"radix_bits must be 1, 2, 4 or 8, got {self.radix_bits!r}")
        for name in ("streaming_filter_maxnreg", "seeded_filter_maxnreg", "filter_maxnreg", "select_maxnreg",
                     "fallback_maxnreg", "row_maxnreg"):
            value = getattr(self, name)
            if value is not None and not (_int(value) and (value == 0 or 24 <= value <= 255)):
                raise ValueError(f"{name} must be None, 0 (no cap) or an int in 24-255; got {value!r}")
        if not (_int(self.prefetch) and self.prefetch in (1, 2, 3)):
            raise ValueError(f"prefetch must be 1, 2 or 3, got {self.prefetch!r}")
        if not (_int(self.sample_low_bit) and 0 <= self.sample_low_bit <= 24):
            raise ValueError(f"sample_low_bit must be an int in [0, 24], got {self.sample_low_bit!r}")
        if not (_int(self.sample_tie_bit) and (self.sample_tie_bit == 0
                                                or self.sample_low_bit < self.sample_tie_bit <= 31)):
            raise ValueError(f"sample_tie_bit must be 0 or an int in [sample_low_bit + 1, 31] "
                             f"(sample_low_bit={self.sample_low_bit}), got {self.sample_tie_bit!r}")
        # (at most 64: the search's stop, rank * (1 + slack), must fit an int32 for samples
        # of up to 2**20 keys)
        if not (isinstance(self.sample_slack, numbers.Real) and 0 <= self.sample_slack <= 64):
            raise ValueError(f"sample_slack must be in [0, 64], got {self.sample_slack!r}")
        if not (isinstance(self.sigmas, numbers.Real) and self.sigmas > 0):
            raise ValueError(f"sigmas must be positive, got {self.sigmas!r}")
        if not (_int(self.sample_sparse) and self.sample_sparse >= self.sparse):
            raise ValueError(f"sample_sparse must be an int of at least sparse={self.sparse}, got {self.sample_sparse!r}")
        if self.sample_max < self.piece:
            raise ValueError(f"sample_max={self.sample_max} must be at least piece={self.piece}")
        # Triton tiles hold at most 2**20 elements
        for name, value in (("pieces * piece", self.pieces * self.piece), ("filter_block", self.filter_block),
                            ("block", self.block), ("sample_max", self.sample_max)):
            if value > 1 << 20:
                raise ValueError(f"{name} must be at most 2**20, got {value}")
        if self.num_warps > self.filter_block:
            raise ValueError(f"need num_warps <= filter_block; got num_warps={self.num_warps}, "
                             f"filter_block={self.filter_block}")


#: Launch config off the architectures of :data:`CONFIGS` (and on the CPU).
DEFAULT_CONFIG = TopkConfig()
#: Launch config per GPU architecture (``sm90``, ``gfx942``...). Unlike the logits kernel's
#: configs these may differ by chunk: the selected set does not depend on them.
CONFIGS: Mapping[str, TopkConfig] = MappingProxyType({
    # H200, M=8192 late chunk, N=64K-256K, topk=2048 (docs/history/topk-kernel.md)
    # (the filter's cap applies to a filter that only streams: presample and not fused; at 32
    # registers the SM holds 64 warps of it and the PTX filter step's loops keep out of the
    # spills; at 8 warps Triton's step spilled there and ran 17-27% slower. 4 warps and 16
    # programs per SM beat 8 and 8 by 3% at 64K-256K. select_maxnreg caps the first select
    # launch: at 80 registers more of its programs fit an SM, 201 -> 184 us at 64K and 128K;
    # 72-104 within 1% of it at 256K. fallback_maxnreg: the split fallback's 8 programs an SM
    # fit at 64 registers (uncapped it takes 76 with its ballots, 70 without, and the ballots
    # then lost to tl.histogram's passes by up to 1.40x; capped they take 0.80-0.98x their
    # time); 48 or 40 registers with 10 or 12 programs an SM spill and ran 1-9% slower.
    # fallback_items=8: with many rows queued, items of merged slices took 0.88-0.95x the
    # time, and 0.99-1.01x where few rows are (32K-key slices instead: 1.08x there),
    # docs/topk.md)
    # seeded_filter_maxnreg=48: the filter counting its lists' left-out keys (fallback_seed)
    # spilled in its loop at 32 and 40 registers (the top-k 1.55-1.73x and 1.09-1.22x the time
    # on rows that never overflow) and not at 48; at 48 (ten programs an SM) the top-k kept
    # 0.98-1.01x the unseeded time where the launch's programs all fit the SMs (1024 rows) and
    # took 1.01-1.14x where they queue (4096-8192 rows of 16K-256K keys; H200, Triton 3.6):
    # hence the resident rule of seeds_fallback
    # row_max=16384 with row_keys_per_sm=16384 (H100, Triton 3.6, topk=2048, the ten logit
    # distributions of indexer.synthetic, device time of CUDA-graph replays): the row kernel
    # took 0.63-0.98x the launches' time on 128 rows of 8K keys, 0.62-1.02x on 256 rows of 8K
    # and 0.68-0.87x on 128 rows of 16K keys; on 256 rows of 16K keys (32K keys an SM) it
    # ranged 0.75-1.24x (recency lost) and on more rows it lost (timed in loops: 512 rows of
    # 16K keys 0.74-1.07x, 8192 rows 1.5-2.0x). 16 warps capped at 64 registers (two programs
    # an SM) beat 16 uncapped by 1.2x on 256 rows of 16K keys; 8 warps uncapped (what
    # row_warps gives 8K-key rows) took 0.81-0.94x the time of 8 capped at 128 or 16 capped
    # at 64 on 384-768 rows of 8K keys (docs/topk.md)
    # sample_tie_bit=20 (H100, Triton 3.6, the ten distributions, launched without PDL): rows
    # of ties 4-14% less time at 16K-1M keys (few_distinct at 16K: unchanged), ramps and
    # recency up to 3% more on split rows, Gaussian rows within 2%; the row kernel's searches
    # (few rows of at most 16K keys) take it too, not measured there (docs/benchmarks.md,
    # "The searches' tie check")
    "sm90": TopkConfig(num_warps=4, filter_block=512, programs_per_sm=16, select_warps=4, prefetch=2, dynamic=True,
                       presample=True, ballot_write=True, streaming_filter_maxnreg=32, select_maxnreg=80,
                       fallback_maxnreg=64, fallback_items=8, seeded_filter_maxnreg=48,
                       row_max=16384, row_warps=16, row_maxnreg=64, row_keys_per_sm=16384, sample_tie_bit=20),
})


@functools.lru_cache(maxsize=None)
def _arch(device: torch.device) -> str:
    return _arch_from_torch(device.index if device.index is not None else torch.cuda.current_device())[0]


def launch_config(device: torch.device) -> TopkConfig:
    """The config :func:`~.ragged.ragged_topk` uses on ``device`` by default (CPU: the
    default one)."""
    if device.type != "cuda":
        return DEFAULT_CONFIG
    return CONFIGS.get(_arch(device), DEFAULT_CONFIG)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def default_cap(topk: int) -> int:

    """Candidate slots a row: ``max(CAP, 4 * topk)``, a power of two."""
    return _next_pow2(max(CAP, 4 * topk))


def scratch_bytes_per_row(topk: int) -> int:
    """Bytes of :func:`ragged_topk`'s temporaries a row at the default capacity: the
    candidate lists (value and column a slot), the per-list counts (16 lists at most), the
    thresholds and column cuts (the first and the retry's), a write counter, two queue
    entries and the histogram of the keys the lists had no room for."""
    return 8 * default_cap(topk) + 4 * 16 + 28 + 4 * SEED_BINS


def auto_slices(device: torch.device, rows: int, n: int, programs_per_sm: int) -> int:
    """Programs a row for :func:`ragged_topk` on ``device`` when ``slices`` is not given: 1,
    or on a GPU where ``rows`` rows are too few to fill it (fewer than half of
    ``programs_per_sm`` programs an SM) the power of two that brings the programs near that
    half, at most :data:`MAX_SLICES` and slices of at least :data:`SLICE_MIN` of the ``n``
    keys."""
    if device.type != "cuda" or rows < 1 or not (_int(programs_per_sm) and programs_per_sm >= 1):
        return 1
    want = min(_sm_count(device) * programs_per_sm // 2 // rows, n // SLICE_MIN, MAX_SLICES)
    return 1 << (want.bit_length() - 1) if want >= 2 else 1


def _seeded_cap(config: TopkConfig, streaming: bool) -> int | None:
    # the register cap a seeded filter runs at in place of the streaming one (0: none), or
    # None where the seeded cap does not apply: a cap of the filter's own, no streaming cap,
    # a filter that does more than stream (`streaming`: it presamples and is not fused)
    if (config.seeded_filter_maxnreg is None or config.filter_maxnreg is not None
            or not config.streaming_filter_maxnreg or not streaming):
        return None
    return config.seeded_filter_maxnreg


#: 32-bit registers of an SM's register file (NVIDIA sm_80 to sm_100).
REGISTERS_PER_SM = 65536


def seeds_fallback(device: torch.device, config: TopkConfig, rows: int, slices: int) -> bool:
    """Whether :func:`ragged_topk`'s overflowing rows start the split fallback from the
    filter's counts (``config.fallback_seed``) for ``rows`` rows of ``slices`` programs each.

    ``None`` (the default) decides from the launch: on NVIDIA, where the seeded filter runs at
    ``seeded_filter_maxnreg`` (a streaming filter, ``presample=True`` and not ``fused``, with a
    ``streaming_filter_maxnreg`` and no ``filter_maxnreg`` of its own), on where the filter's
    ``rows * slices`` programs all fit the SMs at once at that cap (an H200 at 48 registers:
    ten 4-warp programs an SM, 1,320 programs); off where more queue, because there the cap's
    lower occupancy slows every row's pass (up to 1.14x at 4096-8192 rows, docs/topk.md).
    Off elsewhere (not measured), and with a seeded cap of 0 (none)."""
    seed = config.fallback_seed
    if seed is not None:
        return seed
    cap = _seeded_cap(config, config.presample is True and not config.fused)
    if not (is_nvidia(device) and cap):
        return False
    per_sm = min(config.programs_per_sm, REGISTERS_PER_SM // (cap * 32 * config.num_warps))
    return rows * slices <= _sm_count(device) * per_sm


def split_stage_bytes(device: torch.device, topk: int, rows: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """Bytes of the lists that split rows' filter programs stage (``split_stage``) in chunks
    of ``rows`` rows of ``width`` keys (int64 tensors), with ``device``'s launch config: where
    :func:`auto_slices` splits a chunk's rows (at most a quarter of the filter's programs,
    at least two slices of keys), its rows times slices stay within half the programs, each
    staging ``cap`` slots and a count a warp; 0 where rows are not split."""
    c = launch_config(device)
    if device.type != "cuda" or not c.split_stage or not c.programs_per_sm:
        return torch.zeros_like(rows)
    half = _sm_count(device) * c.programs_per_sm // 2
    cap = default_cap(topk) if c.cap is None else c.cap
    split = (rows >= 1) & (rows <= half // 2) & (width >= 2 * SLICE_MIN)
    return torch.where(split, half * (cap + c.num_warps) * 8, 0)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(device: torch.device, rows: int, per_sm: int) -> int:
    if device.type == "cuda":
        return max(1, min(rows, _sm_count(device) * per_sm))
    return max(1, min(rows, 4))  # Triton's interpreter runs programs one by one


def in_place_vector(x: torch.Tensor) -> bool:
    """Whether the kernels can read ``x`` (a row vector) in place: int32 or int64, contiguous
    (or one entry)."""
    return x.dtype in (torch.int32, torch.int64) and (x.is_contiguous() or x.numel() <= 1)


def _index_vector(x):
    # an integer tensor the kernels cannot read in place as a contiguous int32 copy; anything
    # else as it is (read in place, or refused by RaggedTopk's checks)
    if (not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype.is_complex
            or x.dtype == torch.bool or in_place_vector(x)):
        return x
    return x.reshape(-1).to(torch.int32).contiguous()


def is_nvidia(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None


@functools.lru_cache(maxsize=None)
def _triton_pdl() -> bool:
    # the CUDA backend takes a launch_pdl option (Triton 3.3+) and the language has
    # griddepcontrol
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda
    except Exception:  # noqa: BLE001 - no Triton or no CUDA backend: no PDL
        return False
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return "launch_pdl" in fields and hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


#: CUDA driver from which CUDA graphs keep programmatic launch edges (CUDA 12.3)
PDL_MIN_DRIVER = 12030


#: the CUDA driver library, by platform (its ``cuDriverGetVersion`` needs no ``cuInit``)
_LIBCUDA = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")


@functools.lru_cache(maxsize=None)
def _driver_version() -> int:
    """The CUDA version the installed driver supports, as ``1000 * major + 10 * minor``
    (12030 for CUDA 12.3), asked of the driver library itself: torch has no public call for
    it, and this one creates no CUDA context. 0 where there is no driver."""
    import ctypes

    for name in _LIBCUDA:
        version = ctypes.c_int(0)
        try:
            if ctypes.CDLL(name).cuDriverGetVersion(ctypes.byref(version)) == 0:
                return int(version.value)
        except Exception:  # noqa: BLE001 - no such library, not the driver's, or its call failed
            continue
    return 0


def pdl_supported(device: torch.device) -> bool:
    """Whether the top-k's kernels can be launched on ``device`` with programmatic dependent
    launch (``TopkConfig.pdl``): an NVIDIA GPU of compute capability 9.0 or later (Hopper's
    ``griddepcontrol``), a driver of CUDA 12.3 or later (:data:`PDL_MIN_DRIVER`: graphs
    captured from such launches keep their programmatic edges) and a Triton whose CUDA
    launcher takes ``launch_pdl``."""
    if device.type != "cuda" or not is_nvidia(device):
        return False
    arch = _arch(device)
    return (arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= 90
            and _driver_version() >= PDL_MIN_DRIVER and _triton_pdl())


def _with_pdl(kw: LaunchKw | None, pdl: bool) -> LaunchKw | None:
    # every launch of a call carries the same PDL constexpr (so that a direct launch finds
    # every constexpr in its keywords) and, where on, the launcher option
    if kw is None:
        return None
    return LaunchKw(kw, PDL=pdl, **(dict(launch_pdl=True) if pdl else {}))


def l2_prefetch_keys(config: TopkConfig, plan: "LaunchPlan", rows: int, n: int, programs: int,
                     l2_bytes: int) -> tuple[int, int]:
    """``(PFK, PFS)`` of the filter's launch for ``rows`` rows of ``n`` keys on ``programs``
    filter programs and an L2 cache of ``l2_bytes``: keys each program that has a unit
    prefetches into L2 before its wait (a power of two, at least a 128-byte line a thread;
    ``0``: none) and the keys between two slices' first keys (``n // slices``, so that every
    prefetched address is inside the block: ``slices * PFS <= n``), for
    ``config.filter_l2_prefetch`` of the cache. ``(0, 0)`` unless the filter launches with
    PDL behind the sample kernel."""
    kw = plan.filter
    if not config.filter_l2_prefetch or kw is None or not kw["PDL"] or plan.sample is None:
        return 0, 0
    slices = kw["SL"]
    pfs = n // slices
    keys = min(pfs, int(config.filter_l2_prefetch * l2_bytes) // (4 * max(1, min(programs, rows * slices))))
    if keys < 32 * 32 * kw["num_warps"]:
        return 0, 0
    return 1 << (keys.bit_length() - 1), pfs


def _ballot_ok(device: torch.device, num_warps: int, filter_block: int) -> bool:
    # the PTX ballot needs NVIDIA and four keys a thread in the filtering pass
    return is_nvidia(device) and filter_block == num_warps * 128


def _write_chunk(slots: int, warps: int, tile_write: bool, ballot_write: bool) -> tuple[int, bool]:
    """A select's write over tiles of ``slots`` with ``warps`` warps: its chunk (the whole
    tile with ``tile_write``, else at most 1024 slots re-read at a time) and whether it takes
    the ballot (which needs four registers of each lane a chunk: a multiple of 128 slots a
    warp)."""
    chunk = slots if tile_write else min(1024, slots)
    return chunk, ballot_write and chunk % (128 * warps) == 0


def row_warps(config: TopkConfig, whole: int) -> int:
    """Warps of the row kernel for rows padded to ``whole`` keys: ``row_warps`` at ``row_max``
    keys, proportionally fewer below (the same keys a thread), at least ``min(4, row_warps)``."""
    return max(min(4, config.row_warps), config.row_warps * whole // max(config.row_max, 1))


def row_kernel_fits(config: TopkConfig, rows: int, n: int, sms: int | None) -> bool:
    """Whether ``rows`` rows of at most ``n`` keys are few enough for the row kernel on a GPU
    of ``sms`` SMs: ``rows * next_pow2(n) <= row_keys_per_sm * sms`` (always where
    ``row_keys_per_sm`` or ``sms`` is ``None``, as off a GPU)."""
    if config.row_keys_per_sm is None or sms is None:
        return True
    return rows * _next_pow2(n) <= config.row_keys_per_sm * sms


class LaunchPlan(NamedTuple):
    """:func:`plan_launches`'s answer: a call's launches and their keywords (``None`` or empty
    where a launch is not planned)."""

    programs_per_sm: int
    num_warps: int
    cap: int
    sample: LaunchKw | None
    filter: LaunchKw | None
    retry: LaunchKw | None
    selects: tuple
    fallback: LaunchKw | None
    row: LaunchKw | None


@functools.lru_cache(maxsize=256)
def plan_launches(device: torch.device, config: TopkConfig, topk: int, n: int, slices: int, has_stats: bool,
          count_retries: bool = False, count_split: bool = False, count_seeded: bool = False,
          row_fits: bool = True) -> LaunchPlan:
    """``config`` on ``device`` for rows of at most ``n`` keys and ``slices`` programs a row,
    checked against the device and the call and turned into the launches' arguments, once
    per distinct call shape (a frozen config is its own cache key): the sample kernel's
    keywords or None, the filter kernel's, the split rows' retry launch's or None, ``((first,
    select kernel keywords), ...)``, the split fallback's or None, and the row kernel's or
    None; with the row kernel (``row_max``, and ``row_fits``: the call's rows within
    ``row_keys_per_sm``, :func:`row_kernel_fits`) it is the call's only launch, and the others
    are ``None`` or empty.

    Raises:
        ValueError: a field the device or the call rules out, named.
    """
    c = config
    num_warps, filter_block, piece = c.num_warps, c.filter_block, c.piece
    presample, fused = c.presample, c.fused
    if c.pdl and not pdl_supported(device):
        raise ValueError(f"pdl=True needs an NVIDIA GPU of compute capability 9.0+ and a Triton with launch_pdl, "
                         f"got {device}")
    pdl = pdl_supported(device) if c.pdl is None else c.pdl
    if slices > 1:
        # a split row's programs share one threshold, from the sample kernel, and no program
        # sees the whole row to select it
        if fused:
            raise ValueError("fused=True needs slices=1 (a split row's select cannot run in one filter program)")
        presample = True
    filter_maxnreg = c.filter_maxnreg
    # (before an automatic presample is resolved: its filter keeps no tuned cap)
    streaming = bool(presample) and not fused
    if filter_maxnreg is None:
        # the tuned cap is for the filter that only streams: the sample's search (presample
        # off) or the select (fused) under it spill in their loops
        filter_maxnreg = c.streaming_filter_maxnreg if streaming else None
    cap = default_cap(topk) if c.cap is None else c.cap
    tile = min(max(_next_pow2(2 * topk), num_warps), cap) if c.tile is None else c.tile
    select_warps = c.select_warps
    if slices > 1 and c.split_tile is not None:
        tile = c.split_tile
        select_warps = max(select_warps, min(16, tile // 512))
    for name, value in (("filter_maxnreg", filter_maxnreg), ("select_maxnreg", c.select_maxnreg),
                        ("fallback_maxnreg", c.fallback_maxnreg), ("row_maxnreg", c.row_maxnreg)):
        if value and not is_nvidia(device):
            raise ValueError(f"{name} must be None, 0 (no cap) or, on an NVIDIA GPU, an int in 24-255; got {value!r} "
                             f"on {device}")
    if cap < topk:
        raise ValueError(f"cap={cap} must be at least topk={topk}")
    if cap > 1 << 20:
        # Triton tiles hold at most 2**20 elements (the second select launch's is `cap`)
        raise ValueError(f"cap must be at most 2**20, got {cap} (topk={topk})")
    # column offsets are int32: a row and the steps read past its end must stay below 2**31
    if n + (c.prefetch + 1) * max(filter_block, c.block, tile) >= 1 << 31:
        raise ValueError(f"logits rows of {n} keys are too long for int32 column offsets")
    if c.split_tile is not None and not (num_warps <= c.split_tile <= cap):
        raise ValueError(f"split_tile must be in num_warps..cap; got split_tile={c.split_tile}, "
                         f"num_warps={num_warps}, cap={cap}")
    if not (num_warps <= tile <= cap):
        raise ValueError(f"need num_warps <= tile <= cap; got num_warps={num_warps}, tile={tile}, cap={cap}")
    if c.ballot and not _ballot_ok(device, num_warps, filter_block):
        raise ValueError(f"ballot=True needs an NVIDIA GPU and filter_block == 128 * num_warps, got {device}, "
                         f"filter_block={filter_block}, num_warps={num_warps}")
    if c.ballot_write and not is_nvidia(device):
        raise ValueError(f"ballot_write=True needs an NVIDIA GPU, got {device}")
    fallback_ballot_ok = is_nvidia(device) and min(c.fallback_block, c.fallback_slice) % FALLBACK_BALLOT_KEYS == 0
    if c.fallback_ballot and not fallback_ballot_ok:
        raise ValueError(f"fallback_ballot=True needs an NVIDIA GPU and fallback_block and fallback_slice "
                         f"multiples of {FALLBACK_BALLOT_KEYS}, got {device}, fallback_block={c.fallback_block}, "
                         f"fallback_slice={c.fallback_slice}")
    fallback_ballot = fallback_ballot_ok if c.fallback_ballot is None else c.fallback_ballot
    ballot = _ballot_ok(device, num_warps, filter_block) if c.ballot is None else c.ballot
    # the sample kernel's runs: enough for one key in `sparse` of the longest row, up to sample_max
    runs = sample_runs(n, piece, c.sparse, c.sample_max, c.pieces, c.sample_sparse)
    if row_fits and c.row_max and tile < n <= c.row_max and slices == 1 and not fused:
        # one launch, the whole row in registers: no sample, filter, select or fallback launch
        whole = _next_pow2(n)
        warps = row_warps(c, whole)
        # its write re-reads the row in chunks of four keys a thread (the ballot's unit)
        chunk = min(whole, max(1024, 128 * warps))
        capped = c.row_maxnreg and warps == c.row_warps
        row_kw = LaunchKw(K=topk, KP=_next_pow2(topk), T=whole, NP=runs, PIECE=piece, SPARSE=c.sparse,
                          SIGMAS=float(c.row_sigmas), SLACK=float(c.sample_slack), CH=chunk,
                          WB=bool(c.ballot_write) and chunk % (128 * warps) == 0, STATS=has_stats,
                          TIE_BIT=c.sample_tie_bit,
                          num_warps=warps, **(dict(maxnreg=c.row_maxnreg) if capped else {}))
        return LaunchPlan(c.programs_per_sm, num_warps, cap, None, None, None, (), None, _with_pdl(row_kw, pdl))
    if presample is None:
        # the sample kernel's larger sample for rows longer than the filter's own serves
        presample = not fused and runs > c.pieces
    # a split row's programs append to one list a row; a whole row's, one list per warp
    lists = 1 if slices > 1 else num_warps
    common = select_constexprs(topk, lists, cap, tile, c.block, c.radix_bits, has_stats)
    fused_ch, fused_wb = _write_chunk(tile, num_warps, c.tile_write, fused and c.ballot_write)
    fallback_kw = (fallback_launch(topk, cap, n, c.fallback_split, c.fallback_slice, count_split, c.fallback_buffer,
                                   c.fallback_block, c.fallback_prefetch, fallback_ballot, c.fallback_maxnreg,
                                   c.fallback_items)
                   if not fused else None)
    # overflowing rows start the split fallback from the filter's histogram of the keys left out
    # (None, not resolved by seeds_fallback for a launch, counts as off here)
    seed = bool(c.fallback_seed) and fallback_kw is not None
    # the streaming filter's cap replaced for the counting (it stands where a streaming cap,
    # checked for NVIDIA above, does)
    seeded_cap = _seeded_cap(c, streaming) if seed else None
    if seeded_cap is not None:
        filter_maxnreg = seeded_cap
    # whole rows too few of whose keys pass go to the split fallback from retry_split keys on
    retry_from = max(c.retry_split, c.fallback_split) if fallback_kw is not None and c.retry_split else 0
    # where the sample kernel runs it also gives the retry's threshold, for the rows that can
    # retry: split rows (no filter program sees the whole row to search one) and whole rows
    # shorter than retry_from (longer ones take the split fallback instead); the filter then
    # only loads it (a filter that searches its own sample for a retry carries that search
    # under its register cap: 4-5% slower at 256K-1M keys on an H200)
    second = bool(presample)
    filter_kw = LaunchKw(
        BW=filter_block // num_warps, NP=c.pieces, PIECE=piece, SPARSE=c.sparse, SIGMAS=float(c.sigmas),
        SLACK=float(c.sample_slack), LOW_BIT=c.sample_low_bit, BALLOT=bool(ballot), DEPTH=c.prefetch,
        DYNAMIC=bool(c.dynamic), FUSED=bool(fused), STW=tile // num_warps, CH=fused_ch, PRESAMPLE=presample,
        WB=fused_wb, num_warps=num_warps, **dict(common, W=num_warps), CAP=cap, SL=slices, RETRY=False,
        SECOND=second, RETRIES=bool(count_retries), JITTER=c.sample_jitter, DEAL=c.filter_deal, RETRY_FROM=retry_from,
        HIST=seed, RUN=split_run_for(c.split_run, slices, num_warps, cap, topk) if slices > 1 and not c.split_stage
        else 0, STAGE=slices > 1 and c.split_stage,
        PFK=0, PFS=0, TIE_BIT=c.sample_tie_bit, SNAP=c.select_snap,
        **(dict(maxnreg=filter_maxnreg) if filter_maxnreg else {}))
    sample_kw = None
    if presample:
        sample_warps = c.sample_warps
        if sample_warps is None:
            # 32 keys a thread (16 at SAMPLE_MAX's 16 warps); split rows are few, a sample
            # program or so an SM, so their chain of block reductions is cut by more threads:
            # 16 keys a thread
            sample_warps = max(1, min(16, runs * piece // (512 if slices > 1 else 1024)))
        sample_kw = LaunchKw(K=topk, NP=runs, PIECE=piece, SPARSE=c.sparse, SIGMAS=float(c.sigmas),
                             SLACK=float(c.sample_slack), LOW_BIT=c.sample_low_bit, WHOLE=tile, SL=slices,
                             SECOND=second, RETRY_FROM=retry_from, JITTER=c.sample_jitter, HIST=seed,
                             TIE_BIT=c.sample_tie_bit, num_warps=sample_warps)
    # split rows retry in a launch of their own (rows strided over its programs)
    retry_kw = LaunchKw(filter_kw, RETRY=True, DYNAMIC=False) if slices > 1 else None
    selects = select_launches(common, tile, cap, select_warps, fused, c.tile_write, c.select_maxnreg,
                               c.ballot_write, c.fallback_split if fallback_kw is not None else 0,
                               fallback_kw["BUF"] if seed else None, bool(count_seeded), slices > 1, c.select_snap)
    return LaunchPlan(c.programs_per_sm, num_warps, cap, _with_pdl(sample_kw, pdl), _with_pdl(filter_kw, pdl),
                      _with_pdl(retry_kw, pdl), tuple((first, _with_pdl(kw, pdl)) for first, kw in selects),
                      _with_pdl(fallback_kw, pdl), None)


def fallback_launch(topk: int, cap: int, n: int, split: int, slice_keys: int, count: bool = False,
                    buffer: int = FALLBACK_BUFFER, block: int = FALLBACK_BLOCK,
                    prefetch: int = FALLBACK_PREFETCH, ballot: bool = False,
                    maxnreg: int | None = None, items: int = 0) -> LaunchKw | None:
    """Keywords of the split fallback's launch for rows of at most ``n`` keys, or ``None``
    where none is planned: ``split`` is 0 or above ``n``. Its per-row state (seven 32-bin digit
    histograms, nine slots of counts, bits found and key bounds, a key count and a key range
    a slice, in 32 slots) lives in a fallback row's ``2 * cap`` int32 candidate slots, so slices
    grow past ``slice_keys`` where a row would need more of them than fit; a ``cap`` too small
    for one slice's state, or rows within two slices of 2**31 keys (int32 column offsets), rule
    the launch out. The slots left after the state hold the row's buffer (from slot ``BOFF``,
    :func:`fallback_buffer_slot`): ``BUF`` keys with their columns, at most ``buffer`` (a power of
    two; 0 where fewer than 16 fit). Its passes step ``block`` keys at a time (at most a slice),
    with the loads of the next ``prefetch`` steps in flight. ``ballot`` (NVIDIA, ``block`` a
    multiple of :data:`FALLBACK_BALLOT_KEYS`): digits counted and indices placed by warp
    ballots. ``maxnreg``: its register cap (NVIDIA). ``count``: it adds each row to
    ``stats[STAT_SPLIT]``. ``items``: an item's adjacent slices merge while every program keeps
    at least that many items a pass (``0``: never)."""
    room = (2 * cap - FALLBACK_STATE) // FALLBACK_SLICE_SLOTS
    if split == 0 or n < split or room < 1:
        return None
    slice_keys = max(slice_keys, _next_pow2(-(-n // room)))
    slices = -(-n // slice_keys)
    if n + (prefetch + 1) * slice_keys >= 1 << 31:
        # its int32 column offsets (a slice's end, the blocks loaded ahead) would wrap
        return None
    nsp = _next_pow2(slices)
    boff = fallback_buffer_slot(nsp, slices)
    # int64 slots left past the state, from the first even int32 slot
    free = (2 * cap - boff) // 2
    buf = min(buffer, 1 << (free.bit_length() - 1)) if buffer and free > 0 else 0
    block = min(block, slice_keys)
    return LaunchKw(K=topk, REGION=2 * cap, SLICE=slice_keys, BLOCK=block, NS=slices, NSP=nsp,
                    BUF=buf if buf >= 16 else 0, BOFF=boff, COUNT=bool(count),
                    AHEAD=prefetch, WB=bool(ballot) and block % FALLBACK_BALLOT_KEYS == 0, ITEMS=items,
                    num_warps=FALLBACK_WARPS,
                    **(dict(maxnreg=maxnreg) if maxnreg else {}))


def fallback_buffer_slot(nsp: int, slices: int) -> int:
    """The int32 slot of a split fallback row's region where its buffer starts: past its
    state, ``nsp`` key counts and a 32-bin histogram for each of ``slices`` slices, rounded up to
    an even slot (the buffer holds int64s)."""
    return (FALLBACK_STATE + nsp + 32 * slices + 1) // 2 * 2


def sample_runs(n: int, piece: int, sparse: int, sample_max: int, pieces: int = 1, sample_sparse: int = 1) -> int:
    """The sample kernel's ``NP`` for rows of at most ``n`` keys: runs enough for one key in
    ``sparse`` of the longest (:func:`_row_sample`), a power of two, at most ``sample_max``
    keys, and at most one key in ``sample_sparse`` of it where that leaves at least ``pieces``
    runs: shorter rows take the same sample from a smaller tile."""
    thin = max(pieces, _next_pow2(max(1, n // (sample_sparse * piece))))
    return max(1, min(sample_max // piece, _next_pow2(max(1, n // (sparse * piece))), thin))


def _check_stats(stats: torch.Tensor | None, device: torch.device) -> None:
    """Refuse a ``stats`` argument the kernels cannot count into: it must be None or a
    contiguous int32 tensor of at least 4 entries on ``device`` (the kernels add at fixed
    offsets from its start, past a strided view's elements; a fifth counts retried rows)."""
    if stats is not None and (stats.numel() < 4 or stats.dtype != torch.int32 or stats.device != device
                              or not stats.is_contiguous()):
        raise ValueError(f"stats must be a contiguous int32 tensor of at least 4 entries on {device}, got "
                         f"{stats.dtype} {list(stats.shape)} on {stats.device}")


def split_run_for(split_run: int, slices: int, num_warps: int, cap: int, topk: int) -> int:
    """The run of list slots a split row's filter warp takes (``RUN``): ``split_run``, halved
    while the empty slots its runs can leave a row, ``slices * num_warps * (run - 1)``, would
    pass the room its list keeps beyond ``2 * topk`` keys (``cap - 2 * topk``): longer runs
    than that fill the list with holes and send rows to the fallback (2M keys in 64 slices
    with runs of 32: 1.9x the time, docs/benchmarks.md). ``0`` stays ``0``."""
    room = max(cap - 2 * topk, 0)
    run = split_run
    while run > 1 and slices * num_warps * (run - 1) > room:
        run //= 2
    return run


def select_constexprs(topk: int, lists: int, cap: int, whole: int, block: int, radix_bits: int, stats: bool) -> dict:
    """Constexprs the filter and select kernels share: ``lists`` candidate lists of ``cap //
    lists`` slots a row, rows up to ``whole`` keys selected on the row itself (whole); launched
    without programmatic dependent launch unless a plan says otherwise."""
    return dict(K=topk, KP=_next_pow2(topk), W=lists, WCAP=cap // lists, WHOLE=whole, BLOCK=block,
                RADIX_BITS=radix_bits, R=1 << radix_bits, STATS=stats, PDL=False)


def select_launches(common: dict, tile: int, cap: int, select_warps: int, fused: bool = False,
                     tile_write: bool = False, select_maxnreg: int | None = None, ballot_write: bool = False,
                     fallback_split: int = 0, seed_buffer: int | None = None, count_seeded: bool = False,
                     split: bool = False, snap: bool = False) -> tuple:
    """The select kernel's launches as ``((first, keywords), ...)``: the first (unless fused
    into the filter) with tiles of ``tile`` slots; then the rows whose lists did not fit,
    with tiles of ``cap`` (and, fused, the fallback path's), unless the first tile holds them.
    ``ballot_write`` (NVIDIA): each launch whose write chunks allow it places the indices by
    warp ballots and a per-row counter instead of a scan. ``fallback_split > 0``: the first
    launch queues the fallback rows of at least that many keys for the split fallback's
    launch (:func:`fallback_launch`) instead of selecting them; with ``seed_buffer`` (its
    buffer's keys), those whose lists overflowed start from the filter's histogram
    (``fallback_seed``; ``count_seeded``: counted in ``stats[STAT_SEEDED]``). ``split``: the
    rows were split across filter programs (one list a row with empty slots, its count apart).
    ``snap``: the k-th key's search moves an end to the nearest key where a count finds none
    between (``select_snap``)."""
    lists = common["W"]
    selects = []
    for first, slots in ((True, tile), (False, cap)):
        if (first and fused) or (not first and slots == tile and not fused):
            continue
        warps = select_warps if first else max(select_warps, min(16, slots // 1024))
        ch, wb = _write_chunk(slots, warps, tile_write and first, ballot_write)
        selects.append((first, LaunchKw(
            STW=slots // lists, CH=ch, FIRST=first, num_warps=warps, WB=wb, PSPLIT=fallback_split if first else 0,
            SEED=first and seed_buffer is not None, SBUF=seed_buffer or 0, SEEDSTAT=first and count_seeded,
            SPLIT=split, SNAP=snap, **common, **(dict(maxnreg=select_maxnreg) if first and select_maxnreg else {}))))
    return tuple(selects)
