"""Triton per-row ragged top-k: sampled threshold, one filtering pass, radix select.

For each row it reads only the row's own window ``[start, start + length)`` of a (possibly
row-padded, non-contiguous) float32 logits block and writes the ``k`` row-relative indices
of its largest values, ``-1`` padded, unordered. Every value is mapped to an
order-preserving 32-bit key, and selection is a radix select over ``RADIX_BITS``-bit digits
(most significant first), never a sort. 4-bit digits by default: in Triton a 16-bin
``tl.histogram`` pass costs about a sixth of a 512-bin one (measured on an H200), which
more than pays for twice the passes.

A plain radix select reads the row nine times (eight histograms and the write). At the
lengths that matter (64K-1M keys, 256 KiB-4 MiB a row) those reads cannot stay in cache, so
long rows take a shorter road that reads the row about once:

1. *Sample*: pieces of ``PIECE`` contiguous keys spread evenly over the row, one per
   ``PIECE * SPARSE`` keys or a little more (1/64 of the row). A
   radix select on the sample finds the key ``t`` with ``r`` sample keys at or above it;
   ``r`` is the sample's expected share of the top k plus four standard deviations, so
   that fewer than k keys of the row reach ``t`` only when the sample is badly unlucky.
2. *Filter*: one pass over the row copies every key ``>= t`` (value and column, in column
   order) into a per-program scratch of ``CAP`` slots.
3. *Select*: if at least ``k`` and at most ``CAP`` keys passed, the row's top k are all
   among them (the k-th largest key is ``>= t``), so the radix select and the write run on
   the few thousand candidates. Otherwise (an unlucky sample, or a huge tie at ``t``) the
   row falls back to the plain radix select. Both roads are exact.

Ties at the k-th value go to the lowest column, the rule of the torch path, so both select
the same set from the same logits. Programs are persistent (a few per SM, each looping over
rows), so the scratch is sized by the grid, not by the number of rows. Triton is imported
lazily; :func:`is_available` in ``_kernels`` reports whether it is there.
"""

from __future__ import annotations

import functools

import torch

from ._kernels import device_guard

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported by _kernels.is_available
    triton = None
    tl = None

#: Default shape of the road for long rows (see the module docstring). ``CAP`` bounds the
#: scratch: ``programs * CAP * 8`` bytes.
PIECE, SPARSE, CAP = 256, 64, 8192
RADIX_BITS = 4
NUM_WARPS = 4
PROGRAMS_PER_SM = 8
#: Counters of :func:`ragged_topk`'s ``stats``: rows listed whole (at most k keys), rows
#: selected from sampled candidates, rows that took the plain radix select.
STAT_SHORT, STAT_SAMPLED, STAT_PLAIN = 0, 1, 2

if triton is not None:

    @triton.jit
    def _skey(v):
        # float32 -> int32 whose signed order is the floats' order; -0.0 gets +0.0's key,
        # since the two compare equal (and the torch path ties them). All 32-bit: 64-bit
        # integer ops cost two instructions each in the streaming pass.
        bits = v.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -2147483648, 0, bits)
        # every NaN above everything, as torch.topk ranks them (a negative NaN would sort low)
        bits = tl.where(v != v, 0x7FFFFFFF, bits)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _kth_largest(ptr, n, limit, need, BLOCK: tl.constexpr, PIECE: tl.constexpr, stride,
                     RADIX_BITS: tl.constexpr, R: tl.constexpr):
        """Key (:func:`_skey`) of the ``need``-th largest of the values at ``ptr + col(i)``,
        ``i < n`` and ``col(i) < limit``, where ``col(i) = (i // PIECE) * stride + i % PIECE``
        (contiguous when ``stride == PIECE``); and how many keys equal to it are among the
        ``need``. Radix select, ``RADIX_BITS`` a pass, most significant digit first, on the
        key's unsigned form (sign bit flipped); ``R = 2 ** RADIX_BITS`` bins."""
        bins = tl.arange(0, 2 * R)
        prefix = tl.full((), 0, tl.int32)
        prefix_mask = tl.full((), 0, tl.int32)
        digit_mask = tl.full((), R - 1, tl.int32)
        for p in tl.static_range(32 // RADIX_BITS):
            shift = 32 - RADIX_BITS * (p + 1)
            hist = tl.zeros((2 * R,), dtype=tl.int32)
            for c0 in range(0, n, BLOCK):
                i = c0 + tl.arange(0, BLOCK)
                col = (i // PIECE) * stride + i % PIECE
                m = (i < n) & (col < limit)
                u = _skey(tl.load(ptr + col, mask=m, other=0.0)) ^ -2147483648
                match = m & ((u & prefix_mask) == prefix)
                # bins R..2R-1 collect what does not match (cheaper than the histogram's mask)
                hist += tl.histogram(tl.where(match, (u >> shift) & digit_mask, R), 2 * R)
            hist = tl.where(bins < R, hist, 0)
            # suffix[d] = keys whose digit is >= d; the wanted key sits in the largest bin
            # whose suffix still reaches `need`
            suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            b = tl.max(tl.where((bins < R) & (suffix >= need), bins, -1), axis=0)
            need -= tl.sum(tl.where(bins > b, hist, 0), axis=0)
            prefix = prefix | (b << shift)
            prefix_mask = prefix_mask | (digit_mask << shift)
        return prefix ^ -2147483648, need

    @triton.jit
    def _emit(vals_ptr, cols_ptr, n, kth, need, obase, BLOCK: tl.constexpr, HAS_COLS: tl.constexpr):
        """Write the columns of every key above ``kth`` and of the first ``need`` keys equal
        to it (in storage order, which is column order) to ``obase[0:k]``."""
        taken = tl.full((), 0, tl.int32)
        eq_seen = tl.full((), 0, tl.int32)
        for c0 in range(0, n, BLOCK):
            i = c0 + tl.arange(0, BLOCK)
            m = i < n
            key = _skey(tl.load(vals_ptr + i, mask=m, other=0.0))
            eq = (m & (key == kth)).to(tl.int32)
            sel = (m & (key > kth)) | ((eq_seen + tl.cumsum(eq, axis=0) <= need) & (eq > 0))
            pos = taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            if HAS_COLS:
                col = tl.load(cols_ptr + i, mask=sel, other=0)
            else:
                col = i
            tl.store(obase + pos, col, mask=sel)
            taken += tl.sum(sel.to(tl.int32), axis=0)
            eq_seen += tl.sum(eq, axis=0)

    @triton.jit
    def _ragged_topk_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr, scratch_v_ptr, scratch_c_ptr, stats_ptr,
        rows, stride_lm, stride_om, sample_min,
        K: tl.constexpr,
        KP: tl.constexpr,
        BLOCK: tl.constexpr,
        FBLOCK: tl.constexpr,
        PIECE: tl.constexpr,
        PSTRIDE: tl.constexpr,
        CAP: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        PREFETCH: tl.constexpr,
        STATS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        sv = scratch_v_ptr + pid.to(tl.int64) * CAP
        sc = scratch_c_ptr + pid.to(tl.int64) * CAP
        for row32 in range(pid, rows, nprog):
            row = row32 + tl.zeros((), tl.int64)  # 64-bit offsets (an int under the interpreter)
            start = tl.load(starts_ptr + row).to(tl.int64)
            length = tl.load(lengths_ptr + row)
            base = logits_ptr + row * stride_lm + start
            obase = out_ptr + row * stride_om
            if length <= K:
                kk = tl.arange(0, KP)
                tl.store(obase + kk, tl.where(kk < length, kk, -1), mask=kk < K)
                if STATS:
                    tl.atomic_add(stats_ptr + 0, 1)
            else:
                plain = 1
                if length >= sample_min:
                    # pieces spread evenly over the whole row (one per `spread` keys, at least
                    # PSTRIDE apart), so no stretch of it, the recent end included, is
                    # sampled more densely than another
                    npieces = tl.maximum(length // PSTRIDE, 1)
                    spread = length // npieces
                    s = npieces * tl.minimum(PIECE, spread)
                    # the sample should hold mu of the row's top k; asking for mu plus four
                    # standard deviations makes too few candidates a rare event
                    mu = K * s.to(tl.float32) / length.to(tl.float32)
                    r = (mu + 4.0 * tl.sqrt(mu) + 1.0).to(tl.int32)
                    r = tl.minimum(r, s)
                    t, _unused = _kth_largest(base, npieces * PIECE, length, r, BLOCK, PIECE, spread, RADIX_BITS, R)
                    cnt = tl.full((), 0, tl.int32)
                    ahead = tl.load(base + tl.arange(0, FBLOCK), mask=tl.arange(0, FBLOCK) < length, other=0.0)
                    for c0 in range(0, length, FBLOCK):
                        cols = c0 + tl.arange(0, FBLOCK)
                        m = cols < length
                        v = ahead
                        if PREFETCH:
                            # issue the next block's load before this block's scan, whose
                            # cross-warp steps would otherwise expose the load's latency
                            ahead = tl.load(base + cols + FBLOCK, mask=cols + FBLOCK < length, other=0.0)
                        else:
                            v = tl.load(base + cols, mask=m, other=0.0)
                        sel = m & (_skey(v) >= t)
                        pos = cnt + tl.cumsum(sel.to(tl.int32), axis=0) - 1
                        ok = sel & (pos < CAP)
                        tl.store(sv + pos, v, mask=ok)
                        tl.store(sc + pos, cols, mask=ok)
                        cnt += tl.sum(sel.to(tl.int32), axis=0)
                    # the scratch was written by other threads of this program
                    tl.debug_barrier()
                    if (cnt >= K) & (cnt <= CAP):
                        kth, need = _kth_largest(sv, cnt, cnt, K, BLOCK, BLOCK, BLOCK, RADIX_BITS, R)
                        _emit(sv, sc, cnt, kth, need, obase, BLOCK, True)
                        plain = 0
                    # the next row overwrites the scratch
                    tl.debug_barrier()
                if plain != 0:
                    kth, need = _kth_largest(base, length, length, K, BLOCK, BLOCK, BLOCK, RADIX_BITS, R)
                    _emit(base, base, length, kth, need, obase, BLOCK, False)
                if STATS:
                    tl.atomic_add(stats_ptr + 2 - (1 - plain), 1)


#: Launch config per GPU architecture (``sm90``, ``gfx942``...), from ``python -m indexer bench
#: topk --tune``; architectures not listed take :data:`DEFAULT_CONFIG`. Unlike the logits
#: kernel's configs these may differ by chunk: the selected set does not depend on them.
DEFAULT_CONFIG = dict(block=512, filter_block=512, num_warps=NUM_WARPS, programs_per_sm=PROGRAMS_PER_SM)
TOPK_CONFIGS: dict[str, dict] = {
    # H200, M=8192 late chunk, N=256K, topk=2048 (docs/benchmarks.md)
    "sm90": dict(block=512, filter_block=1024, num_warps=4, programs_per_sm=16),
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
    """Candidate slots of a program's scratch: ``max(CAP, 4 * topk)``, a power of two."""
    return _next_pow2(max(CAP, 4 * topk))


def scratch_bytes_per_program(topk: int) -> int:
    """Bytes of one program's candidate scratch (value and column per slot) at the default
    capacity; the grid has at most one program per row."""
    return 8 * default_cap(topk)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _programs(device: torch.device, rows: int, per_sm: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(rows, sms * per_sm))
    return max(1, min(rows, 4))  # Triton's interpreter runs programs one by one


def ragged_topk(
    logits: torch.Tensor,
    starts_rel: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    block: int | None = None,
    *,
    filter_block: int | None = None,
    prefetch: bool = True,
    radix_bits: int = RADIX_BITS,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
    piece: int = PIECE,
    sparse: int = SPARSE,
    cap: int | None = None,
    sample_min: int | None = None,
    stats: torch.Tensor | None = None,
) -> None:
    """Per-row top-k of a logits block, reading each row's window only.

    Args:
        logits: float32 ``[R, n]``, column stride 1, any row stride (padded rows welcome);
            values outside a row's window are never read.
        starts_rel: int ``[R]``, column of each row's first key.
        lengths: int ``[R]``, keys in each row's window (``starts_rel + lengths <= n``).
        topk: Keys kept per row.
        out: int32 ``[R, topk]`` contiguous rows; gets indices relative to each row's first
            key, unordered, ``-1`` padded.
        block: Keys per step of the histogram and write passes (a power of two). This and
            the other launch options left ``None`` come from :func:`launch_config`.
        filter_block: Keys per step of the filtering pass (a power of two).
        prefetch: Load the filtering pass's next block before scanning the current one.
        radix_bits: Bits of the key resolved per histogram pass (1, 2, 4 or 8): fewer bins
            make a pass cheaper in Triton than fewer passes do.
        num_warps, programs_per_sm: Launch shape (the grid is persistent).
        piece, sparse, cap: The long-row road: sampled pieces of ``piece`` keys, one piece
            in every ``sparse``; at most ``cap`` candidates (default ``max(CAP, 4 * topk)``
            rounded up to a power of two; ``cap >= topk``).
        sample_min: Rows shorter than this take the plain radix select (default
            ``4 * topk``: below it the sample saves little).
        stats: Optional int32 ``[3]`` on the logits' device; the kernel adds each row to
            one counter (``STAT_SHORT``, ``STAT_SAMPLED``, ``STAT_PLAIN``).
    """
    if triton is None:
        raise RuntimeError("triton is not importable")
    rows = logits.shape[0]
    if rows == 0:
        return
    if logits.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("logits and out need column stride 1")
    if cap is None:
        cap = default_cap(topk)
    if cap < topk:
        raise ValueError(f"cap={cap} must be at least topk={topk}")
    device = logits.device
    cfg = launch_config(device)
    block = cfg["block"] if block is None else block
    filter_block = cfg["filter_block"] if filter_block is None else filter_block
    num_warps = cfg["num_warps"] if num_warps is None else num_warps
    programs_per_sm = cfg["programs_per_sm"] if programs_per_sm is None else programs_per_sm
    starts = starts_rel.to(torch.int32).contiguous()
    lens = lengths.to(torch.int32).contiguous()
    if radix_bits not in (1, 2, 4, 8):
        raise ValueError(f"radix_bits must be 1, 2, 4 or 8, got {radix_bits}")
    for name, value in (("block", block), ("filter_block", filter_block), ("cap", cap)):
        if not _pow2(value):
            raise ValueError(f"{name} must be a power of two, got {value}")
    for name, value in (("piece", piece), ("sparse", sparse), ("num_warps", num_warps), ("programs_per_sm", programs_per_sm)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    programs = _programs(device, rows, programs_per_sm)
    scratch_v = torch.empty(programs, cap, dtype=torch.float32, device=device)
    scratch_c = torch.empty(programs, cap, dtype=torch.int32, device=device)
    with device_guard(logits):
        _ragged_topk_kernel[(programs,)](
            logits, starts, lens, out, scratch_v, scratch_c, stats if stats is not None else lens,
            rows, logits.stride(0), out.stride(0), 4 * topk if sample_min is None else sample_min,
            K=topk, KP=_next_pow2(topk), BLOCK=block, FBLOCK=filter_block, PIECE=piece, PSTRIDE=piece * sparse,
            CAP=cap, RADIX_BITS=radix_bits, R=1 << radix_bits, PREFETCH=prefetch, STATS=stats is not None, num_warps=num_warps,
        )
