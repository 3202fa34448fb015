"""The Triton top-k's constants, per-architecture launch configs and launch planning.

:func:`_plan` turns :func:`~.ragged.ragged_topk`'s options and a block shape into its
launches' arguments, once per distinct shape (cached). Nothing here needs Triton.
"""

from __future__ import annotations

import functools
import numbers

import torch

from .launch import LaunchKw

#: Shape of the sampled path (see the module docstring): runs of ``PIECE`` keys (64 bytes, a
#: few sectors), one run every ``SPARSE * PIECE`` keys, so one key in ``SPARSE`` sampled; at
#: most ``PIECES`` runs in the filter kernel's own sample (it sits in registers during its
#: search, and there sets the register count) and ``SAMPLE_MAX`` keys in the sample
#: kernel's, which runs before the filter and so may hold more: long rows keep one key in
#: ``SPARSE`` up to 512K keys. The threshold is ``SIGMAS`` standard deviations deep.
PIECES, PIECE, SPARSE, SIGMAS = 256, 16, 32, 4.0
SAMPLE_MAX = 16384
#: The sample threshold's search may end this fraction above its rank (``sample_slack``).
SAMPLE_SLACK = 1 / 32
#: Candidate slots per row (``max(CAP, 4 * topk)``, a power of two): ``8 * cap`` bytes.
CAP = 8192
RADIX_BITS = 4
#: The select's regula falsi (:func:`_kth_key`) halves its bracket after this many counts,
#: and while the bracket spans more than ``SEARCH_SPAN`` keys (two binades of float32).
SEARCH_BISECT_AFTER, SEARCH_SPAN = 16, 1 << 24
#: Programs an SM of the second select launch, each pulling queued rows (lists longer than
#: the first launch's tile) until none is left: two overlap one's memory waits with the
#: other's counting (H200, 256K keys, 1609 queued rows of 8192: 164 -> 110 us; four: the
#: same as two; docs/benchmarks.md).
SECOND_PROGRAMS_PER_SM = 2
#: Split rows (``slices``): at most this many programs a row, each filtering at least
#: ``SLICE_MIN`` keys of it.
MAX_SLICES, SLICE_MIN = 64, 16384
#: Counters of :func:`ragged_topk`'s ``stats``: rows listed whole (at most k keys), rows
#: selected from sampled candidates, rows that took the plain radix select, rows selected
#: on the row itself (longer than k, within the select tile); these four count each row
#: once. With a fifth entry, rows filtered a second time (the retry, fewer than k keys
#: through the first threshold), whichever path then served them.
STAT_SHORT, STAT_SAMPLED, STAT_PLAIN, STAT_DIRECT, STAT_RETRIED = 0, 1, 2, 3, 4


#: Launch config per GPU architecture (``sm90``, ``gfx942``...); architectures not listed
#: take :data:`DEFAULT_CONFIG`. Unlike the logits kernel's configs these may differ by chunk:
#: the selected set does not depend on them.
DEFAULT_CONFIG = dict(num_warps=4, filter_block=512, programs_per_sm=8, select_warps=4, block=512, fused=False,
                      prefetch=1, tile_write=False, filter_maxnreg=None, select_maxnreg=None, dynamic=False,
                      presample=False, ballot_write=False)
TOPK_CONFIGS: dict[str, dict] = {
    # H200, M=8192 late chunk, N=64K-256K, topk=2048 (docs/benchmarks.md)
    # (filter_maxnreg applies to the filter that only streams: presample and not fused; at 32
    # registers the SM holds 64 warps of it and the PTX filter step's loops keep out of the
    # spills; at 8 warps Triton's step spilled there and ran 17-27% slower. 4 warps and 16
    # programs an SM beat 8 and 8 by 3% at 64K-256K. select_maxnreg caps
    # the first select launch: at 80 registers more of its programs fit an SM, 201 -> 184 us
    # at 64K and 128K; 72-104 within 1% of it at 256K)
    "sm90": dict(num_warps=4, filter_block=512, programs_per_sm=16, select_warps=4, prefetch=2, dynamic=True,
                 presample=True, ballot_write=True, filter_maxnreg=32, select_maxnreg=80),
}


@functools.lru_cache(maxsize=None)
def _arch(device: torch.device) -> str:
    props = torch.cuda.get_device_properties(device)
    arch = getattr(props, "gcnArchName", "") or ""
    return arch.split(":")[0] if arch.startswith("gfx") else f"sm{props.major}{props.minor}"


def launch_config(device: torch.device) -> dict:
    """The launch config :func:`ragged_topk` uses on ``device`` (CPU: the default)."""
    if device.type != "cuda":
        return dict(DEFAULT_CONFIG)
    return dict(DEFAULT_CONFIG, **TOPK_CONFIGS.get(_arch(device), {}))


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def default_cap(topk: int) -> int:
    """Candidate slots a row: ``max(CAP, 4 * topk)``, a power of two."""
    return _next_pow2(max(CAP, 4 * topk))


def scratch_bytes_per_row(topk: int) -> int:
    """Bytes of :func:`ragged_topk`'s temporaries a row at the default capacity: the
    candidate lists (value and column a slot), the per-list counts (16 lists at most), the
    thresholds and column cuts (the first and the retry's), a write counter and a queue entry."""
    return 8 * default_cap(topk) + 4 * 16 + 24


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


def _int(x) -> bool:
    # an integer (numpy's included), not a bool
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(device: torch.device, rows: int, per_sm: int) -> int:
    if device.type == "cuda":
        return max(1, min(rows, _sm_count(device) * per_sm))
    return max(1, min(rows, 4))  # Triton's interpreter runs programs one by one


def _index_vector(x: torch.Tensor) -> torch.Tensor:
    # int32 or int64 with unit stride as it is; anything else as contiguous int32
    if x.dtype in (torch.int32, torch.int64) and x.dim() == 1 and x.stride(0) == 1:
        return x
    return x.reshape(-1).to(torch.int32).contiguous()


def _nvidia(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None


def _ballot_ok(device: torch.device, num_warps: int, filter_block: int) -> bool:
    # the PTX ballot needs NVIDIA and four keys a thread in the filtering pass
    return _nvidia(device) and filter_block == num_warps * 128


def _write_chunk(slots: int, warps: int, tile_write: bool, ballot_write: bool) -> tuple[int, bool]:
    """A select's write over tiles of ``slots`` with ``warps`` warps: its chunk (the whole
    tile with ``tile_write``, else at most 1024 slots re-read at a time) and whether it takes
    the ballot (which needs four registers of each lane a chunk: a multiple of 128 slots a
    warp)."""
    chunk = slots if tile_write else min(1024, slots)
    return chunk, ballot_write and chunk % (128 * warps) == 0


# typed: 2 and 2.0, 1 and True are different keys (a float or bool option must still be refused)
@functools.lru_cache(maxsize=256, typed=True)
def _plan(device: torch.device, cfg: tuple, topk: int, n: int, block, filter_block, num_warps, programs_per_sm,
          select_warps, tile, ballot, fused, prefetch, tile_write, filter_maxnreg, select_maxnreg, dynamic,
          presample, ballot_write, radix_bits, pieces, piece, sparse, sigmas, cap, sample_low_bit, sample_slack,
          has_stats, slices=1, sample_max=SAMPLE_MAX, count_retries=False) -> tuple:
    """:func:`ragged_topk`'s options (``cfg``: :func:`launch_config`'s items as (key, type,
    value), so that a config value of 2.0 or True is not taken for 2 or 1) checked and
    turned into its launches' arguments, once per distinct call shape: ``(programs_per_sm,
    num_warps, cap, sample kernel keywords or None, filter kernel keywords, the split rows'
    retry launch's keywords or None, ((first, select kernel keywords), ...))``.

    Raises:
        ValueError: an option out of range, named.
    """
    cfg = {key: value for key, _, value in cfg}
    block = cfg["block"] if block is None else block
    filter_block = cfg["filter_block"] if filter_block is None else filter_block
    num_warps = cfg["num_warps"] if num_warps is None else num_warps
    programs_per_sm = cfg["programs_per_sm"] if programs_per_sm is None else programs_per_sm
    select_warps = cfg["select_warps"] if select_warps is None else select_warps
    fused = cfg["fused"] if fused is None else fused
    prefetch = cfg["prefetch"] if prefetch is None else prefetch
    tile_write = cfg["tile_write"] if tile_write is None else tile_write
    select_maxnreg = cfg["select_maxnreg"] if select_maxnreg is None else select_maxnreg
    dynamic = cfg["dynamic"] if dynamic is None else dynamic
    presample_given = presample is not None
    presample = cfg["presample"] if presample is None else presample
    ballot_write = cfg["ballot_write"] if ballot_write is None else ballot_write
    if not (_int(slices) and _pow2(slices) and slices <= MAX_SLICES):
        raise ValueError(f"slices must be a power of two in 1-{MAX_SLICES}, got {slices!r}")
    if slices > 1:
        # a split row's programs share one threshold, from the sample kernel, and no program
        # sees the whole row to select it
        if fused:
            raise ValueError("fused=True needs slices=1 (a split row's select cannot run in one filter program)")
        presample = True
    if filter_maxnreg is None:
        # a config's cap is tuned for the filter that only streams: the sample's search
        # (presample off) or the select (fused) under it spill in their loops
        filter_maxnreg = cfg["filter_maxnreg"] if presample and not fused else None
    cap = default_cap(topk) if cap is None else cap
    tile = min(max(_next_pow2(2 * topk), num_warps), cap) if tile is None else tile
    pieces = PIECES if pieces is None else pieces
    if radix_bits not in (1, 2, 4, 8):
        raise ValueError(f"radix_bits must be 1, 2, 4 or 8, got {radix_bits}")
    for name, value in (("block", block), ("filter_block", filter_block), ("num_warps", num_warps),
                        ("select_warps", select_warps), ("cap", cap), ("tile", tile), ("pieces", pieces),
                        ("piece", piece), ("sample_max", sample_max)):
        if not _pow2(value):
            raise ValueError(f"{name} must be a power of two, got {value}")
    for name, value in (("sparse", sparse), ("programs_per_sm", programs_per_sm)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for name, value in (("filter_maxnreg", filter_maxnreg), ("select_maxnreg", select_maxnreg)):
        if value is not None and not (_int(value) and (value == 0 or (_nvidia(device) and 24 <= value <= 255))):
            raise ValueError(f"{name} must be None, 0 (no cap) or, on an NVIDIA GPU, an int in 24-255; got {value!r} "
                             f"on {device}")
    if not (_int(prefetch) and prefetch in (1, 2, 3)):
        raise ValueError(f"prefetch must be 1, 2 or 3, got {prefetch!r}")
    if not 0 <= sample_low_bit <= 24:
        raise ValueError(f"sample_low_bit must be in [0, 24], got {sample_low_bit}")
    # (at most 64: the search's stop, rank * (1 + slack), must fit an int32 for samples
    # of up to 2**20 keys)
    if not 0 <= sample_slack <= 64:
        raise ValueError(f"sample_slack must be in [0, 64], got {sample_slack}")
    if not sigmas > 0:
        raise ValueError(f"sigmas must be positive, got {sigmas}")
    if cap < topk:
        raise ValueError(f"cap={cap} must be at least topk={topk}")
    # Triton tiles hold at most 2**20 elements (the second select launch's is `cap`)
    if sample_max < piece:
        raise ValueError(f"sample_max={sample_max} must be at least piece={piece}")
    for name, value in (("cap", cap), ("pieces * piece", pieces * piece), ("filter_block", filter_block),
                        ("block", block), ("sample_max", sample_max)):
        if value > 1 << 20:
            raise ValueError(f"{name} must be at most 2**20, got {value} (topk={topk})")
    # column offsets are int32: a row and the steps read past its end must stay below 2**31
    if n + (prefetch + 1) * max(filter_block, block, tile) >= 1 << 31:
        raise ValueError(f"logits rows of {n} keys are too long for int32 column offsets")
    if not (num_warps <= min(filter_block, tile) and tile <= cap):
        raise ValueError(f"need num_warps <= filter_block, num_warps <= tile <= cap; got num_warps={num_warps}, "
                         f"filter_block={filter_block}, tile={tile}, cap={cap}")
    if ballot and not _ballot_ok(device, num_warps, filter_block):
        raise ValueError(f"ballot=True needs an NVIDIA GPU and filter_block == 128 * num_warps, got {device}, "
                         f"filter_block={filter_block}, num_warps={num_warps}")
    for name, value in (("presample", presample), ("ballot_write", ballot_write)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True, False or None, got {value!r}")
    if ballot_write and not _nvidia(device):
        raise ValueError(f"ballot_write=True needs an NVIDIA GPU, got {device}")
    ballot = _ballot_ok(device, num_warps, filter_block) if ballot is None else ballot
    # the sample kernel's runs: enough for one key in `sparse` of the longest row, up to sample_max
    runs = _sample_runs(n, piece, sparse, sample_max)
    if not (presample_given or presample or fused) and runs > pieces:
        # rows longer than the filter's own sample serves: the sample kernel's larger one,
        # whatever the config (its threshold and the retry's)
        presample = True
    # the retry's threshold from the sample kernel where its sample is the larger (split
    # rows have no filter program that sees the whole row to search one)
    second = presample and (slices > 1 or runs > pieces)
    # a split row's programs append to one list a row; a whole row's, one list a warp
    lists = 1 if slices > 1 else num_warps
    common = _select_common(topk, lists, cap, tile, block, radix_bits, has_stats)
    fused_ch, fused_wb = _write_chunk(tile, num_warps, tile_write, fused and ballot_write)
    filter_kw = LaunchKw(
        BW=filter_block // num_warps, NP=pieces, PIECE=piece, SPARSE=sparse, SIGMAS=float(sigmas),
        SLACK=float(sample_slack), LOW_BIT=sample_low_bit, BALLOT=bool(ballot), DEPTH=prefetch,
        DYNAMIC=bool(dynamic), FUSED=bool(fused), STW=tile // num_warps, CH=fused_ch, PRESAMPLE=presample,
        WB=fused_wb, num_warps=num_warps, **dict(common, W=num_warps), CAP=cap, SL=slices, RETRY=False,
        SECOND=second, RETRIES=bool(count_retries), **(dict(maxnreg=filter_maxnreg) if filter_maxnreg else {}))
    sample_kw = None
    if presample:
        # up to 16 warps, 32 keys a thread at SAMPLE_MAX
        sample_kw = LaunchKw(K=topk, NP=runs, PIECE=piece, SPARSE=sparse, SIGMAS=float(sigmas),
                             SLACK=float(sample_slack), LOW_BIT=sample_low_bit, DIRECT=tile, SL=slices, SECOND=second,
                             num_warps=max(1, min(16, runs * piece // 1024)))
    # split rows retry in a launch of their own (rows strided over its programs)
    retry_kw = LaunchKw(filter_kw, RETRY=True, DYNAMIC=False) if slices > 1 else None
    selects = _select_launches(common, tile, cap, select_warps, fused, tile_write, select_maxnreg, ballot_write)
    return programs_per_sm, num_warps, cap, sample_kw, filter_kw, retry_kw, selects


def _sample_runs(n: int, piece: int, sparse: int, sample_max: int) -> int:
    """The sample kernel's ``NP`` for rows of at most ``n`` keys: runs enough for one key in
    ``sparse`` of the longest (:func:`_row_sample`), a power of two, at most ``sample_max``
    keys: shorter rows take the same sample from a smaller tile."""
    return max(1, min(sample_max // piece, _next_pow2(max(1, n // (sparse * piece)))))


def _check_stats(stats: torch.Tensor | None, device: torch.device) -> None:
    """Refuse a ``stats`` argument the kernels cannot count into: it must be None or a
    contiguous int32 tensor of at least 4 entries on ``device`` (the kernels add at fixed
    offsets from its start, past a strided view's elements; a fifth counts retried rows)."""
    if stats is not None and (stats.numel() < 4 or stats.dtype != torch.int32 or stats.device != device
                              or not stats.is_contiguous()):
        raise ValueError(f"stats must be a contiguous int32 tensor of at least 4 entries on {device}, got "
                         f"{stats.dtype} {list(stats.shape)} on {stats.device}")


def _select_common(topk: int, lists: int, cap: int, direct: int, block: int, radix_bits: int, stats: bool) -> dict:
    """Constexprs the filter and select kernels share: ``lists`` candidate lists of ``cap //
    lists`` slots a row, rows up to ``direct`` keys selected on the row itself."""
    return dict(K=topk, KP=_next_pow2(topk), W=lists, WCAP=cap // lists, DIRECT=direct, BLOCK=block,
                RADIX_BITS=radix_bits, R=1 << radix_bits, STATS=stats)


def _select_launches(common: dict, tile: int, cap: int, select_warps: int, fused: bool = False,
                     tile_write: bool = False, select_maxnreg: int | None = None, ballot_write: bool = False) -> tuple:
    """The select kernel's launches as ``((first, keywords), ...)``: the first (unless fused
    into the filter) with tiles of ``tile`` slots; then the rows whose lists did not fit,
    with tiles of ``cap`` (and, fused, the fallback path's), unless the first tile holds them.
    ``ballot_write`` (NVIDIA): each launch whose write chunks allow it places the indices by
    warp ballots and a per-row counter instead of a scan."""
    lists = common["W"]
    selects = []
    for first, slots in ((True, tile), (False, cap)):
        if (first and fused) or (not first and slots == tile and not fused):
            continue
        warps = select_warps if first else max(select_warps, min(16, slots // 1024))
        ch, wb = _write_chunk(slots, warps, tile_write and first, ballot_write)
        selects.append((first, LaunchKw(
            STW=slots // lists, CH=ch, FIRST=first, num_warps=warps, WB=wb,
            **common, **(dict(maxnreg=select_maxnreg) if first and select_maxnreg else {}))))
    return tuple(selects)
