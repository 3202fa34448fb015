"""The Triton top-k's kernels: sample, filter, select, split fallback (docs/topk.md walks through them).

Every jit function and the four kernels' launchers live here, defined only where Triton
imports (``SAMPLE_LAUNCHER``, ``FILTER_LAUNCHER``, ``SELECT_LAUNCHER``, ``FALLBACK_LAUNCHER``;
:mod:`.ragged` launches them).
"""

from __future__ import annotations

from .config import FALLBACK_STATE, SEARCH_BISECT_AFTER, SEARCH_SPAN
from .launch import Launcher
from .ptx import (HOLE_BITS, HOLE_COLUMN, SEED_BINS, SEED_SHIFT, _SHARED_CLOSE_PTX, _WARP_PAIR_STORE_PTX,
                  _WARP_RANKS_PTX, _WARP_STORE_PTX, _shared_append_ptx, _warp_append_ptx, _warp_histogram_ptx)

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported by launch.is_available
    triton = None
    tl = None
try:
    # griddepcontrol (programmatic dependent launch): NVIDIA, Triton 3.3+
    from triton.language.extra import cuda as _gdc
except Exception:  # noqa: BLE001 - config.pdl_supported then says no
    _gdc = None

if triton is not None:
    # (a jit function reads module globals only as constexprs)
    _WARP_RANKS_ASM = tl.constexpr(_WARP_RANKS_PTX)
    _WARP_STORE_ASM = tl.constexpr(_WARP_STORE_PTX)
    _WARP_PAIR_STORE_ASM = tl.constexpr(_WARP_PAIR_STORE_PTX)
    _WARP_APPEND_ASM = tl.constexpr(_warp_append_ptx(False))
    _WARP_APPEND_CUT_ASM = tl.constexpr(_warp_append_ptx(True))
    _SHARED_APPEND_ASM = tl.constexpr(_shared_append_ptx(False))
    _SHARED_APPEND_CUT_ASM = tl.constexpr(_shared_append_ptx(True))
    _WARP_APPEND_HIST_ASM = tl.constexpr(_warp_append_ptx(False, True))
    _WARP_APPEND_CUT_HIST_ASM = tl.constexpr(_warp_append_ptx(True, True))
    _SHARED_APPEND_HIST_ASM = tl.constexpr(_shared_append_ptx(False, True))
    _SHARED_APPEND_CUT_HIST_ASM = tl.constexpr(_shared_append_ptx(True, True))
    _SHARED_CLOSE_ASM = tl.constexpr(_SHARED_CLOSE_PTX)
    # a reserved slot of a split row's list left empty (ptx.HOLE_BITS, HOLE_COLUMN), as one int64
    _HOLE = tl.constexpr((HOLE_COLUMN << 32) | (HOLE_BITS & 0xFFFFFFFF))
    # its value's key (_skey of a negative float: its bits with the low 31 flipped)
    _HOLE_KEY = tl.constexpr(HOLE_BITS ^ 0x7FFFFFFF)
    _SEED_SHIFT = tl.constexpr(SEED_SHIFT)
    _SEED_BINS = tl.constexpr(SEED_BINS)
    # a key's block (its unsigned form's top 32 - SEED_SHIFT bits) and their mask on a key
    _SEED_BLOCKS = tl.constexpr((1 << (32 - SEED_SHIFT)) - 1)
    _SEED_PMASK = tl.constexpr(-(1 << SEED_SHIFT))
    _WARP_HISTOGRAM_ASM = tl.constexpr(_warp_histogram_ptx())
    _BISECT_AFTER = tl.constexpr(SEARCH_BISECT_AFTER)
    _SPAN = tl.constexpr(SEARCH_SPAN)
    # a queued fallback row's slots, zeroed when it is queued: its seven 32-bin digit
    # histograms; its buffer's key count; the pass that fills the buffer; the bits of the
    # k-th key found so far, their mask and the keys still needed among those matching them;
    # its passes ready to start; the greatest and least key matching the bits found before the
    # pass running (set apart from zero when queued and after each pass); its items done. Then
    # a key count a slice, a slice's greatest and least counted key (in 32 slots a slice) and
    # the buffer (int64s, from the next even slot)
    _FB_BUFN = tl.constexpr(7 * 32)
    _FB_FILLED = tl.constexpr(7 * 32 + 1)
    _FB_PREFIX = tl.constexpr(7 * 32 + 2)
    _FB_PMASK = tl.constexpr(7 * 32 + 3)
    _FB_NEED = tl.constexpr(7 * 32 + 4)
    _FB_READY = tl.constexpr(7 * 32 + 5)
    _FB_KMAX = tl.constexpr(7 * 32 + 6)
    _FB_KMIN = tl.constexpr(7 * 32 + 7)
    _FB_DONE = tl.constexpr(FALLBACK_STATE - 1)
    _FB_ZEROED = tl.constexpr(FALLBACK_STATE)
    _FB_ZERO_TILE = tl.constexpr(1 << (FALLBACK_STATE - 1).bit_length())

    @triton.jit
    def _skey(v):
        # float32 -> int32 whose signed order is the floats' order; -0.0 gets +0.0's key,
        # since the two compare equal (and the torch path ties them). All 32-bit: 64-bit
        # integer ops cost two instructions each.
        bits = v.to(tl.int32, bitcast=True)
        bits = tl.where(bits == -2147483648, 0, bits)
        # every NaN above everything, as torch.topk ranks them (a negative NaN would sort low)
        bits = tl.where(v != v, 0x7FFFFFFF, bits)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _key_float(t):
        # the float whose key is t (_skey is its own inverse on the bits it produces); for a
        # threshold key, `not (v < float)` keeps exactly the keys >= t, NaNs included
        bits = t ^ ((t >> 31) & 0x7FFFFFFF)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _warp_ranks(sel32):
        """Per element: its rank among the selected (nonzero) elements of its warp, and the
        warp's count of them. NVIDIA only (inline PTX); four elements a thread, so every
        lane holds exactly four of the block's."""
        return tl.inline_asm_elementwise(
            _WARP_RANKS_ASM,
            "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r",
            [sel32],
            dtype=(tl.int32, tl.int32),
            is_pure=True,
            pack=4,
        )

    @triton.jit
    def _warp_id(x):
        # the hardware warp of each element's thread (lists are per warp, whatever the layout).
        # Not a function of x alone: Triton may recompute it in another layout where a
        # tensor is converted (it did, is_pure or not, for the count store of a vectorized
        # pass, which then stored each list's count under another warp's index), so every
        # use must stay in the layout of the pass's loop
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; mov.u32 t, %tid.x; shr.u32 $0, t, 5; }", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)

    @triton.jit
    def _warp_store(sel32, value, ctr, dst):
        """``dst[slot] = value`` for every selected (nonzero ``sel32``) element, each at a slot
        of its own taken from the counter ``*ctr`` (int32; ``ctr`` and ``dst`` one address for
        every element). NVIDIA only (inline PTX). Each warp ranks its selected elements, four
        registers of each lane at a time, with a ballot, and one lane takes the warp's total
        from the counter with one atomic add: no scan across the block (a ``tl.cumsum`` of an
        index tile shuffled every element through 5 warp steps and a barrier). Slots come in
        no particular order. The store is inside the asm: returned slots were recomputed by
        Triton in another layout (the asm run twice, the counter advanced twice), so the
        asm's result is a placeholder nobody converts."""
        return tl.inline_asm_elementwise(
            _WARP_STORE_ASM,
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l",
            [sel32, value, ctr, dst],
            dtype=tl.int32,
            is_pure=False,
            pack=4,
        )

    @triton.jit
    def _warp_pair_store(sel32, hi, lo, ctr, dst):
        """:func:`_warp_store` of two words an element: ``dst[slot] = (hi << 32) | lo`` as one
        int64 (``dst`` an int64 address, ``hi`` and ``lo`` int32) for every selected element,
        slots from the counter ``*ctr``. NVIDIA only (inline PTX); four elements a thread."""
        return tl.inline_asm_elementwise(
            _WARP_PAIR_STORE_ASM,
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l",
            [sel32, hi, lo, ctr, dst],
            dtype=tl.int32,
            is_pure=False,
            pack=4,
        )

    @triton.jit
    def _warp_append(v, c, t, tcol, length, lists, room, hist, CUT: tl.constexpr, HIST: tl.constexpr):
        """The filtering pass's step on NVIDIA (inline PTX): each key of ``v`` (float32 bits,
        columns ``c``) not below ``t`` (and, with ``CUT``, not equal to it at a column past
        ``tcol``, a scalar) goes to its warp's list at ``lists`` (int64 slots: value bits low, column
        high), after the ``length`` (each element: its warp's list length) already there,
        while the slot is below ``room``; returns the new length. With ``HIST``, a key past the
        room adds 1 to its bin of the row's histogram ``hist`` (:func:`_seed_bin`). The compare,
        ranks, 8-byte store and count are one block of PTX: Triton's code for the same unmasked
        step took 9 (4 warps) to 13 (8 warps) more SASS instructions a block under a 32-register
        cap (64-bit packing and addressing) and, at 8 warps, spilled in the loop (Triton 3.6,
        sm_90a). Four elements a thread (one rank a register, as :func:`_warp_ranks`)."""
        # (a constexpr string must reach the asm call as it is, not through a local; without
        # the cut, no column operands: under the filter's 32-register cap they would spill)
        if HIST:
            if CUT:
                return tl.inline_asm_elementwise(
                    _WARP_APPEND_CUT_HIST_ASM,
                    "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l",
                    [v, c, length, lists, t, room, tcol + tl.zeros(v.shape, tl.int32), hist], dtype=tl.int32,
                    is_pure=False, pack=4)
            else:
                return tl.inline_asm_elementwise(
                    _WARP_APPEND_HIST_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r,l,l,l,l",
                    [v, c, length, lists, t, room, hist], dtype=tl.int32, is_pure=False, pack=4)
        elif CUT:
            return tl.inline_asm_elementwise(
                _WARP_APPEND_CUT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r",
                [v, c, length, lists, t, room, tcol + tl.zeros(v.shape, tl.int32)], dtype=tl.int32, is_pure=False,
                pack=4)
        else:
            return tl.inline_asm_elementwise(
                _WARP_APPEND_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r",
                [v, c, length, lists, t, room], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _shared_append(v, c, t, tcol, ctr, lists, room, hist, state, run, CUT: tl.constexpr, HIST: tl.constexpr):
        """:func:`_warp_append` into one list a row shared by several programs (a long row
        split into slices), in no particular order: slots of the warp's run of the list, a new
        run (at least ``run`` slots) taken from the row's counter ``ctr`` by one atomic add
        when a block's keys do not fit what is left (:func:`~.ptx._shared_append_ptx`).
        ``state`` (each thread's four elements: the run's next slot and end, the warp's keys
        listed, unused; zeros at first) comes back updated; :func:`_shared_close` ends it.
        NVIDIA only (inline PTX)."""
        rn = run + tl.zeros(v.shape, tl.int32)
        if HIST:
            if CUT:
                return tl.inline_asm_elementwise(
                    _SHARED_APPEND_CUT_HIST_ASM,
                    "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l",
                    [v, c, ctr, lists, t, room, tcol + tl.zeros(v.shape, tl.int32), state, rn, hist],
                    dtype=tl.int32, is_pure=False, pack=4)
            else:
                return tl.inline_asm_elementwise(
                    _SHARED_APPEND_HIST_ASM,
                    "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l",
                    [v, c, ctr, lists, t, room, state, rn, hist], dtype=tl.int32, is_pure=False, pack=4)
        elif CUT:
            return tl.inline_asm_elementwise(
                _SHARED_APPEND_CUT_ASM,
                "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
                [v, c, ctr, lists, t, room, tcol + tl.zeros(v.shape, tl.int32), state, rn], dtype=tl.int32,
                is_pure=False, pack=4)
        else:
            return tl.inline_asm_elementwise(
                _SHARED_APPEND_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
                [v, c, ctr, lists, t, room, state, rn], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _shared_close(state, ctr, lists, room):
        """The end of a warp's runs (:func:`_shared_append`): the slots left in its last run
        marked empty (column -1) and its keys listed added to the row's count at ``ctr + 1``.
        NVIDIA only (inline PTX)."""
        tl.inline_asm_elementwise(_SHARED_CLOSE_ASM, "=r,=r,=r,=r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r",
                                  [state, ctr, lists, room], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _take_run(ctr, pos, end, tot, RUN: tl.constexpr):
        """Slots for ``tot`` keys of a block in a program's run ``[pos, end)`` of a split row's
        list (the plain Triton form of :func:`_shared_append`'s, one run a program): where
        they do not fit, a new run of ``max(RUN, keys left over)`` slots from the row's
        counter ``ctr``, the first keys filling the old run's rest. Returns ``(rem, low,
        high, pos, end)``: the key of block rank ``q`` goes to slot ``q + (low if q < rem
        else high)``; the run's new next slot and end."""
        rem = end - pos
        need = tot - rem
        low = pos
        high = pos
        if need > 0:
            r = tl.maximum(need, RUN)
            nb = tl.atomic_add(ctr, r)
            high = nb - rem
            pos = nb + need
            end = nb + r
        else:
            pos = pos + tot
        return rem, low, high, pos, end

    @triton.jit
    def _close_run(cand, ctr, pos, end, got, room, RUN: tl.constexpr):
        # a program's run ended (_take_run): its slots left marked empty, its keys listed
        # added to the row's count at ctr + 1
        if RUN > 0:
            s = pos + tl.arange(0, RUN)
            tl.store(cand + s, tl.full((RUN,), _HOLE, tl.int64), mask=(s < end) & (s < room))
        if got > 0:
            tl.atomic_add(ctr + 1, got)

    @triton.jit
    def _key_block(key):
        # the block of SEED_SHIFT-bit low bits a signed key (_skey) lies in, on its unsigned
        # form: 0 .. 2**(32 - SEED_SHIFT) - 1
        return ((key ^ -2147483648) >> _SEED_SHIFT) & _SEED_BLOCKS

    @triton.jit
    def _seed_bin(v, origin):
        # the bin of the filter's histogram (fallback_seed) of float32 keys v: their key's
        # block less the threshold's block `origin`, clamped to 0 .. SEED_BINS - 1 (as the
        # PTX step's, ptx._overflow_ptx)
        return tl.minimum(tl.maximum(_key_block(_skey(v)) - origin, 0), _SEED_BINS - 1)

    @triton.jit
    def _count_left_out(hist, v, origin, left_out):
        # the keys v a list has no room for (mask `left_out`), each 1 to its bin of the row's
        # histogram (fallback_seed)
        tl.atomic_add(hist + _seed_bin(v, origin), 1, mask=left_out, sem="relaxed")

    @triton.jit
    def _zero_bins(hist):
        # a row's histogram of the keys its lists have no room for, emptied
        tl.store(hist + tl.arange(0, _SEED_BINS), tl.zeros((_SEED_BINS,), tl.int32))

    @triton.jit
    def _write_short(obase, length, stats_ptr, K: tl.constexpr, KP: tl.constexpr, STATS: tl.constexpr):
        # a row of at most K keys: every column of it, then -1 (counted in stats[0])
        kk = tl.arange(0, KP)
        tl.store(obase + kk, tl.where(kk < length, kk, -1), mask=kk < K)
        if STATS:
            tl.atomic_add(stats_ptr + 0, 1)

    @triton.jit
    def _write_out(obase, sel, value, wpos_ptr, taken, WB: tl.constexpr):
        """``value`` of the selected elements of a chunk to ``obase``, after the ``taken``
        written before it: by warp ballots (:func:`_warp_store`, slots from the row's counter
        ``*wpos_ptr``) where ``WB``, else at a scan's positions. Returns the new ``taken``
        (unchanged with ``WB``: the counter carries it)."""
        if WB:
            zero = tl.zeros(sel.shape, tl.int32)
            _warp_store(sel.to(tl.int32), value, wpos_ptr + zero, obase + zero)
            new_taken = taken
        else:
            tl.store(obase + taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1, value, mask=sel)
            new_taken = taken + tl.sum(sel.to(tl.int32), axis=0)
        return new_taken

    @triton.jit
    def _search_bits(keys, need, lo_u, diff, stop, a, above, b, LOW_BIT: tl.constexpr):
        # the bit search's loop from bit b down to LOW_BIT (or until at most stop keys are at
        # or above a), its state: a (unsigned form) and above, the count of keys at or above
        # a once one has been taken (2**31 - 1 before)
        one = tl.full((), 1, tl.int32)
        # most rows settle well before the last bit: the gap below the need-th key is wide
        while (b >= LOW_BIT) & (above > stop):
            bit = one << b
            if (diff >> b) == 0:  # lo and hi agree from here up
                a = a | (lo_u & bit)
            else:
                cand = a | bit
                c = tl.sum((keys >= (cand ^ -2147483648)).to(tl.int32), axis=0)
                if c >= need:
                    a = cand
                    above = c
            b -= 1
        return a, above

    @triton.jit
    def _search(keys, need, lo, hi, stop, LOW_BIT: tl.constexpr):
        """A key ``x`` with at least ``need`` of ``keys`` (int32 [T], empty slots ``-2**31``)
        at or above it, given ``lo <= x <= hi``: bit by bit, most significant first, on the
        keys' unsigned form, one count a bit where ``lo`` and ``hi`` differ. The search ends
        early, its lower bits 0, once at most ``stop`` (>= ``need``) keys are at or above
        ``x``; otherwise ``x`` is the largest such key but for the bits below ``LOW_BIT``,
        left 0. Either way ``x`` is a lower bound of the ``need``-th largest key; with
        ``stop == need`` an early end means exactly ``need`` keys are ``>= x``, the same set
        as the ``need`` largest, so the callers' selection by ``x`` stays exact."""
        x, _ = _search_tie(keys, need, lo, hi, stop, LOW_BIT, 0)
        return x

    @triton.jit
    def _search_tie(keys, need, lo, hi, stop, LOW_BIT: tl.constexpr, TIE_BIT: tl.constexpr):
        """:func:`_search`'s key, and whether it is exactly the ``need``-th largest key. With
        ``TIE_BIT`` above ``LOW_BIT`` the search pauses below bit ``TIE_BIT``; where a count
        says more than ``max(stop, 2 * need)`` keys are still at or above it (far more than a
        bin that narrow holds unless its keys are equal), the least of them is tried as the
        ``need``-th key (it is where fewer than ``need`` keys lie above it): a rank among many
        equal keys in two reductions instead of a count for each remaining bit, which no
        count narrows. Otherwise the search resumes where it paused, in the same state. The
        key is :func:`_search`'s, except that a tie found is the tied key whole, where
        :func:`_search` leaves its bits below ``LOW_BIT`` 0 (with ``LOW_BIT`` 0, the same)."""
        lo_u = lo ^ -2147483648
        diff = lo_u ^ (hi ^ -2147483648)
        # down to TIE_BIT, where the search pauses, or to LOW_BIT, where it ends
        a, above = _search_bits(keys, need, lo_u, diff, stop, tl.full((), 0, tl.int32),
                                tl.full((), 2147483647, tl.int32), tl.full((), 31, tl.int32),
                                TIE_BIT if TIE_BIT > LOW_BIT else LOW_BIT)
        exact = tl.full((), 0, tl.int32)
        if TIE_BIT > LOW_BIT:
            if above > stop:
                # (only after a count: before one, lo's leading bits are copied, not counted)
                if (above > 2 * need) & (above < 2147483647):
                    x = a ^ -2147483648
                    v = tl.min(tl.where(keys >= x, keys, 2147483647), axis=0)
                    if tl.sum((keys > v).to(tl.int32), axis=0) < need:
                        # v is the need-th key (as many keys are at or above it as at x)
                        a = v ^ -2147483648
                        exact = tl.full((), 1, tl.int32)
                if exact == 0:
                    a, _ = _search_bits(keys, need, lo_u, diff, stop, a, above, tl.full((), TIE_BIT - 1, tl.int32),
                                        LOW_BIT)
        return a ^ -2147483648, exact

    @triton.jit
    def kth_key(keys, need, lo, count_lo, hi, BISECT_AFTER: tl.constexpr, SPAN: tl.constexpr,
                SNAP: tl.constexpr = False):
        """The select's search: a key ``x`` with at least ``need`` of ``keys`` (int32 [T],
        empty slots ``-2**31``) at or above it and either exactly ``need`` of them or ``x``
        the ``need``-th largest key (the contract of :func:`_search` with ``stop == need``),
        given ``count_lo >= need`` keys at or above ``lo`` and none above ``hi``. Regula
        falsi on the count with the Illinois rule (the end kept twice in a row has its
        weight halved), in int64 so that ``hi + 1`` fits. It halves the bracket instead
        while it spans more than ``SPAN`` keys (a key is a float's order-preserving bits, so
        wide brackets cross binades, where counts are far from linear in the key: a row's
        whole range of values) and after ``BISECT_AFTER`` counts (so at most
        ``BISECT_AFTER + 33`` counts). CPU simulation, k=2048, mean counts a row against the
        bit search's: sampled candidates of H200-shaped logits 7.3-8.0 against 14.3; whole
        rows of 3000-4096 such keys 13.2-13.3 against 17.3-17.5; 4096 normal, uniform or
        exponential floats 11.4 / 10.5 / 9.1 against 13.6 / 14.6 / 17.9. ``SNAP``: as
        :func:`kth_between`'s (an end moved to the nearest key where a count finds none
        between; the same contract)."""
        a, _, _ = kth_between(keys, need, lo, count_lo, hi.to(tl.int64) + 1, tl.full((), 0, tl.int32), BISECT_AFTER,
                              SPAN, SNAP)
        return a

    @triton.jit
    def kth_between(keys, need, lo, count_lo, b, count_b, BISECT_AFTER: tl.constexpr, SPAN: tl.constexpr,
                    SNAP: tl.constexpr = False):
        """:func:`kth_key` from a bracket ``[lo, b)`` whose both ends' counts are known:
        ``count_lo >= need`` keys at or above ``lo``, ``count_b < need`` at or above ``b``
        (int64, so that ``2**31`` fits). Returns ``(x, count(keys >= x), count(keys >= x +
        1))``; the last is exact only where the bracket ended one key wide (where the first
        is not ``need``: ``x`` is then the ``need``-th largest key, tied). With ``SNAP``, a
        count that finds no key between the probe and the end it replaces (keys of few
        distinct values, where the bracket would otherwise shrink a few keys a count) moves
        that end to the nearest key instead, by one reduction."""
        a = lo.to(tl.int64)  # count(keys >= a) = ca >= need
        b = b.to(tl.int64)  # count(keys >= b) = cb < need
        ca = count_lo
        cb = count_b
        wa = tl.full((), 1.0, tl.float32)
        wb = tl.full((), 1.0, tl.float32)
        side = tl.full((), 0, tl.int32)
        steps = tl.full((), 0, tl.int32)
        while (ca != need) & (b - a > 1):
            fa = (ca - need).to(tl.float32) * wa
            fb = (cb - need).to(tl.float32) * wb
            span = b - a
            p = a + (span.to(tl.float32) * tl.math.fdiv(fa, fa - fb)).to(tl.int64)
            p = tl.where((steps >= BISECT_AFTER) | (span > SPAN), a + span // 2, p)
            p = tl.minimum(tl.maximum(p, a + 1), b - 1)
            c = tl.sum((keys >= p.to(tl.int32)).to(tl.int32), axis=0)
            up = c >= need
            if SNAP:
                if c == ca:
                    # no key in [a, p): the least key at or above p has the same count
                    p = tl.min(tl.where(keys >= p.to(tl.int32), keys, 2147483647), axis=0).to(tl.int64)
                elif c == cb:
                    # no key in [p, b): one past the largest key below p has the same count
                    p = tl.max(tl.where(keys < p.to(tl.int32), keys, -2147483648), axis=0).to(tl.int64) + 1
            a = tl.where(up, p, a)
            ca = tl.where(up, c, ca)
            b = tl.where(up, b, p)
            cb = tl.where(up, cb, c)
            wb = tl.where(up & (side == 1), wb * 0.5, 1.0)
            wa = tl.where(~up & (side == -1), wa * 0.5, 1.0)
            side = tl.where(up, 1, -1)
            steps += 1
        return a.to(tl.int32), ca, cb

    @triton.jit
    def _sample_keys(base, sidx, smask):
        # the sampled keys, empty slots -2**31
        return tl.where(smask, _skey(tl.load(base + sidx, mask=smask, other=0.0)), -2147483648)

    @triton.jit
    def _sample_rank(K, s, length, SIGMAS: tl.constexpr):
        """The rank ``r`` into a sample of ``s`` of a row's ``length`` keys (> 0) whose key
        the row's ``K``-th key reaches: the sample holds ``mu`` of the row's top ``K`` on
        average, and ``r`` is ``SIGMAS`` standard deviations deeper (at most ``s``)."""
        mu = K * s.to(tl.float32) / length.to(tl.float32)
        return tl.minimum((mu + SIGMAS * tl.sqrt(mu) + 1.0).to(tl.int32), s)

    @triton.jit
    def _run_rank(K, s, length, SIGMAS: tl.constexpr, RUN: tl.constexpr):
        """:func:`_sample_rank` for a sample of runs of ``RUN`` adjacent keys, and at least
        ``RUN`` deeper than ``mu``: where a row's largest keys are adjacent (a ramp), the
        sample's largest sit in its first runs, which stand for ``spread`` keys each but hold
        only ``RUN``; the extra run keeps ``K`` of the row's keys above the threshold (with
        ``K`` small against the sample's runs, ``SIGMAS`` alone did not)."""
        mu = K * s.to(tl.float32) / length.to(tl.float32)
        r = tl.maximum(mu + SIGMAS * tl.sqrt(mu), mu + RUN) + 1.0
        return tl.minimum(r.to(tl.int32), s)

    @triton.jit
    def _sample_threshold(skeys, rank, SLACK: tl.constexpr, LOW_BIT: tl.constexpr):
        """Key the ``rank``-th largest of the sampled keys ``skeys`` reaches, with at most
        ``rank * (1 + SLACK)`` of them at or above it (a lower bound, see :func:`_search`),
        at most +inf's: a threshold among the NaNs' keys would compare as NaN in the
        filtering pass and let every key through, while +inf's key admits the same keys a
        NaN threshold means."""
        stop = rank + (rank.to(tl.float32) * SLACK).to(tl.int32)
        return tl.minimum(_search(skeys, rank, -2147483648, 2147483647, stop, LOW_BIT), 0x7F800000)

    @triton.jit
    def _sample_cut(skeys, rank, length, spread, SLACK: tl.constexpr, LOW_BIT: tl.constexpr, NP: tl.constexpr,
                    PIECE: tl.constexpr, TIE_BIT: tl.constexpr = 0):
        """The filter's threshold from a sample: ``(t, tcol)``, a key and a column, as the
        composite key ``(value, -column)`` of the ``rank``-th largest sampled key, so that
        the filter keeps the keys above ``t`` and the keys equal to it at columns up to
        ``tcol``. Where the sample's keys are distinct near that rank, ``t`` is
        :func:`_sample_threshold`'s and ``tcol`` is ``2**31 - 1`` (every column). Where many
        sampled keys equal the ``rank``-th largest (ties: equal values, a flat row, zeros),
        ``t`` is that key exactly and ``tcol`` the last column before the sample's next run
        after its ``need``-th lowest tied key (``need``: the rank left after the keys above
        ``t``): the sample's runs are spread over the row, one every ``spread`` columns, so
        at least as many of the row's keys pass as for distinct values (a run's keys are
        adjacent: without the rounding a tie dense in the row passed up to a run's spacing
        fewer), and since ties go to the lowest columns the ``k`` selected stay among them.
        ``skeys`` is :func:`_row_sample`'s tile: ``NP`` runs of ``PIECE`` slots, run ``j``
        in the row's columns ``[j * spread, (j + 1) * spread)``.
        ``TIE_BIT``: :func:`_search_tie`'s; a tie it finds skips the exact search below
        ``LOW_BIT``."""
        stop = rank + (rank.to(tl.float32) * SLACK).to(tl.int32)
        x, exact = _search_tie(skeys, rank, -2147483648, 2147483647, stop, LOW_BIT, TIE_BIT)
        tcol = tl.full((), 2147483647, tl.int32)
        # a tie found is the rank-th key with more than max(stop, 2 * rank) keys at or above
        # it: both counts below are known then
        over = exact
        if exact == 0:
            over = (tl.sum((skeys >= x).to(tl.int32), axis=0) > stop).to(tl.int32)
        if over != 0:
            # the search ran out of bits: the rank-th key exactly (it lies in x's last
            # LOW_BIT bits), then whether the sample ties there
            ties = exact
            if exact == 0:
                x = _search(skeys, rank, x, x | ((1 << LOW_BIT) - 1), rank, 0)
                ties = (tl.sum((skeys >= x).to(tl.int32), axis=0) > rank).to(tl.int32)
            if ties != 0:
                need = rank - tl.sum((skeys > x).to(tl.int32), axis=0)
                # run j of the sample lies in columns [j * spread, (j + 1) * spread): the cut
                # ends the run that holds the need-th tied key, found from the runs' tie
                # counts in column order
                tied = tl.reshape((skeys == x).to(tl.int32), (NP, PIECE))
                upto = tl.cumsum(tl.sum(tied, axis=1), axis=0)
                run = tl.min(tl.where(upto >= need, tl.arange(0, NP), NP), axis=0)
                tcol = (run + 1) * spread - 1
        if x > 0x7F800000:
            # among the NaNs' keys: +inf's, every column (see _sample_threshold)
            x = tl.full((), 0x7F800000, tl.int32)
            tcol = tl.full((), 2147483647, tl.int32)
        return x, tcol

    @triton.jit
    def _pack(col, v):
        # a candidate as one int64: the value's bits in the low word, its column in the high
        return (col.to(tl.int64) << 32) | (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)

    @triton.jit
    def _slot(cand32_ptr, row, i, CAP: tl.constexpr, WCAP: tl.constexpr, STW: tl.constexpr):
        # int32 address of the low word of tile slot i: list i // STW, entry i % STW
        return cand32_ptr + 2 * (row * CAP + (i // STW) * WCAP + i % STW)

    @triton.jit
    def _slot_both(cand32_ptr, row, i, mask, CAP: tl.constexpr, WCAP: tl.constexpr, STW: tl.constexpr):
        # tile slot i's value bits and column, one 8-byte load (two 4-byte ones cost a second
        # address and load a slot)
        x = tl.load(cand32_ptr.to(tl.pointer_type(tl.int64)) + (row * CAP + (i // STW) * WCAP + i % STW),
                    mask=mask, other=0)
        return x.to(tl.int32), (x >> 32).to(tl.int32)

    @triton.jit
    def _top_bin(hist, bins, need):
        """The bin of a digit histogram ``hist`` (over ``bins``) that holds the ``need``-th
        largest key: the largest bin whose keys and those above it still reach ``need``; and
        how many keys of that bin are still needed."""
        suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        b = tl.max(tl.where(suffix >= need, bins, -1), axis=0)
        return b, need - tl.sum(tl.where(bins > b, hist, 0), axis=0)

    @triton.jit
    def _kth_largest(ptr, n, need, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, R: tl.constexpr):
        """The fallback path's select: key (:func:`_skey`) of the ``need``-th largest of
        ``ptr[0:n]``, and how many keys equal to it are among the ``need``. Radix select,
        ``RADIX_BITS`` a pass, most significant digit first, on the key's unsigned form (sign
        bit flipped); ``R = 2 ** RADIX_BITS`` bins."""
        bins = tl.arange(0, 2 * R)
        prefix = tl.full((), 0, tl.int32)
        prefix_mask = tl.full((), 0, tl.int32)
        digit_mask = tl.full((), R - 1, tl.int32)
        for p in tl.static_range(32 // RADIX_BITS):
            shift = 32 - RADIX_BITS * (p + 1)
            hist = tl.zeros((2 * R,), dtype=tl.int32)
            for c0 in range(0, n, BLOCK):
                i = c0 + tl.arange(0, BLOCK)
                m = i < n
                u = _skey(tl.load(ptr + i, mask=m, other=0.0)) ^ -2147483648
                match = m & ((u & prefix_mask) == prefix)
                # bins R..2R-1 collect what does not match (cheaper than the histogram's mask)
                hist += tl.histogram(tl.where(match, (u >> shift) & digit_mask, R), 2 * R)
            # (the bins past R, zeroed, never reach `need`, which stays at least 1)
            b, need = _top_bin(tl.where(bins < R, hist, 0), bins, need)
            prefix = prefix | (b << shift)
            prefix_mask = prefix_mask | (digit_mask << shift)
        return prefix ^ -2147483648, need

    @triton.jit
    def _emit(ptr, n, kth, need, obase, BLOCK: tl.constexpr):
        """The fallback path's write: the columns of every key of ``ptr[0:n]`` above ``kth``
        and of the first ``need`` keys equal to it (lowest columns) to ``obase[0:k]``."""
        taken = tl.full((), 0, tl.int32)
        eq_seen = tl.full((), 0, tl.int32)
        for c0 in range(0, n, BLOCK):
            i = c0 + tl.arange(0, BLOCK)
            m = i < n
            key = _skey(tl.load(ptr + i, mask=m, other=0.0))
            eq = (m & (key == kth)).to(tl.int32)
            sel = (m & (key > kth)) | ((eq_seen + tl.cumsum(eq, axis=0) <= need) & (eq > 0))
            pos = taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            tl.store(obase + pos, i, mask=sel)
            taken += tl.sum(sel.to(tl.int32), axis=0)
            eq_seen += tl.sum(eq, axis=0)

    @triton.jit
    def _block_cols(c0, off, STEP: tl.constexpr, GROUP: tl.constexpr, W: tl.constexpr, DEAL: tl.constexpr):
        """Columns of the filter block at ``c0``: ``c0 + off``, or with ``DEAL`` its ``W`` groups
        of ``GROUP`` keys (each a warp's: 32 keys of every 128 under the ballot's layout, a row
        of the 2-D block otherwise) dealt to the warps in a pseudo-random order per block (a
        multiplicative hash of the block's index), so that keys that are large at one offset
        of every block (a periodic structure) spread over every warp's list instead of
        filling one."""
        if DEAL:
            d = (((c0 // STEP) * -1640531535) >> 16) & (W - 1)
            return c0 + (off ^ (d * GROUP))
        else:
            return c0 + off

    @triton.jit
    def _block_load(base, c0, off, length, STEP: tl.constexpr, GROUP: tl.constexpr, W: tl.constexpr,
                    DEAL: tl.constexpr, VEC: tl.constexpr):
        # the block at c0, keys at or past `length` -inf; with VEC (`base` 16-byte aligned, c0 a
        # multiple of 4) by runs of 4 keys, one vector load each: a run is read whole where
        # its first key is below `length`, so the caller masks the keys past it
        c = _block_cols(c0, off, STEP, GROUP, W, DEAL)
        if VEC:
            return tl.load(base + c, mask=c0 + (off // 4) * 4 < length, other=float("-inf"))
        else:
            return tl.load(base + c, mask=c < length, other=float("-inf"))

    @triton.jit
    def _prime_ahead(base, lo, off, length, STEP: tl.constexpr, DEPTH: tl.constexpr, GROUP: tl.constexpr,
                     W: tl.constexpr, DEAL: tl.constexpr, VEC: tl.constexpr = False):
        # the first DEPTH blocks of a pass, in flight before it starts (the unused ones are
        # placeholders that the loop carries unchanged)
        a1 = _block_load(base, lo, off, length, STEP, GROUP, W, DEAL, VEC)
        a2 = a1
        a3 = a1
        if DEPTH >= 2:
            a2 = _block_load(base, lo + STEP, off, length, STEP, GROUP, W, DEAL, VEC)
        if DEPTH >= 3:
            a3 = _block_load(base, lo + 2 * STEP, off, length, STEP, GROUP, W, DEAL, VEC)
        return a1, a2, a3

    @triton.jit
    def _shift_ahead(base, c0, off, length, a1, a2, a3, STEP: tl.constexpr, DEPTH: tl.constexpr,
                     MASKED: tl.constexpr, GROUP: tl.constexpr, W: tl.constexpr, DEAL: tl.constexpr,
                     VEC: tl.constexpr = False):
        # the block at c0 (loaded DEPTH steps ago) and the blocks still in flight, the newest
        # being the load of the block DEPTH steps past c0 (unmasked where the caller knows it
        # whole: no bound check and no fill value a key)
        if MASKED:
            new = _block_load(base, c0 + DEPTH * STEP, off, length, STEP, GROUP, W, DEAL, VEC)
        else:
            new = tl.load(base + _block_cols(c0 + DEPTH * STEP, off, STEP, GROUP, W, DEAL))
        if DEPTH == 1:
            return a1, new, a2, a3
        elif DEPTH == 2:
            return a1, a2, new, a3
        else:
            return a1, a2, a3, new

    @triton.jit
    def _at_or_above(v, c, tf, tcol):
        # whether keys v (columns c) reach the threshold (tf, tcol) of _sample_cut (NaNs do)
        return ~(v < tf) & ~((v == tf) & (c > tcol))

    @triton.jit
    def _filter_block(v, c, hi, tf, tcol, lists, acc, ctr, hist, origin, rpos, rend, got, WCAP: tl.constexpr,
                      BALLOT: tl.constexpr, MASKED: tl.constexpr, SHARED: tl.constexpr, CUT: tl.constexpr,
                      HIST: tl.constexpr, RUN: tl.constexpr):
        """One block of a filtering pass: its keys ``v`` (columns ``c``) at or above ``tf``
        (a threshold key's float; with ``CUT``, those equal to it only at columns up to
        ``tcol``) appended to their list after the ``acc`` already there; returns the new
        ``(acc, rpos, rend, got)``. ``BALLOT``: 1-D block, ``acc`` each element's warp's
        list length; else ``[W, BW]`` block, ``acc`` the ``[W]`` lengths. ``SHARED``: one
        list a row at ``lists`` for every program of the row, slots from its counter ``ctr``
        in runs of at least ``RUN``: with ``BALLOT`` and not ``MASKED`` a run a warp, its
        state in ``acc`` (:func:`_shared_append`); otherwise a run a program, ``[rpos,
        rend)``, and ``got`` keys listed (:func:`_take_run`). Without ``MASKED`` every column
        is below ``hi``. ``HIST``: a key with no room left in its list adds 1 to its bin of
        the row's histogram ``hist`` (:func:`_seed_bin` from the threshold's key block
        ``origin``), so that the split fallback can start from the bits it gives
        (``fallback_seed``)."""
        if BALLOT and not MASKED:
            # (floats travel as their bits: the PTX compares them as f32)
            vb = v.to(tl.int32, bitcast=True)
            tb = (tf + tl.zeros(v.shape, tl.float32)).to(tl.int32, bitcast=True)
            room = tl.full(v.shape, WCAP, tl.int32)
            hp = hist + tl.zeros(v.shape, tl.int32)
            if SHARED:
                acc = _shared_append(vb, c, tb, tcol, ctr + tl.zeros(v.shape, tl.int32), lists, room, hp, acc, RUN,
                                     CUT, HIST)
                return acc, rpos, rend, got
            else:
                return _warp_append(vb, c, tb, tcol, acc, lists, room, hp, CUT, HIST), rpos, rend, got
        if CUT:
            sel = _at_or_above(v, c, tf, tcol)
        else:
            sel = ~(v < tf)
        if MASKED:
            sel = sel & (c < hi)
        s32 = sel.to(tl.int32)
        if SHARED:
            # slots in the row's list: ranks by a scan, a run's slots (an atomic add only
            # when they run out)
            if BALLOT:
                pos = tl.cumsum(s32, axis=0) - 1
                tot = tl.sum(s32, axis=0)
            else:
                rs = tl.sum(s32, axis=1)
                pos = (tl.cumsum(rs, axis=0) - rs)[:, None] + tl.cumsum(s32, axis=1) - 1
                tot = tl.sum(rs, axis=0)
            rem, low, high, rpos, rend = _take_run(ctr, rpos, rend, tot, RUN)
            pos += tl.where(pos < rem, low, high)
            got += tot
            if HIST:
                # (a uniform test: only a block whose slots run past the room counts keys)
                if rpos > WCAP:
                    _count_left_out(hist, v, origin, sel & (pos >= WCAP))
        elif BALLOT:
            rank, cnt = _warp_ranks(s32)
            pos = acc + rank
            acc += cnt
            if HIST:
                # (only the masked steps at a row's end come here on NVIDIA)
                _count_left_out(hist, v, origin, sel & (pos >= WCAP))
        else:
            pos = acc[:, None] + tl.cumsum(s32, axis=1) - 1
            acc += tl.sum(s32, axis=1)
            if HIST:
                if tl.max(acc, axis=0) > WCAP:
                    _count_left_out(hist, v, origin, sel & (pos >= WCAP))
        tl.store(lists + pos, _pack(c, v), mask=sel & (pos < WCAP))
        return acc, rpos, rend, got

    @triton.jit
    def _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, hist, W: tl.constexpr, BW: tl.constexpr,
                     WCAP: tl.constexpr, BALLOT: tl.constexpr, DEPTH: tl.constexpr, SHARED: tl.constexpr,
                     CUT: tl.constexpr, DEAL: tl.constexpr, HIST: tl.constexpr, RUN: tl.constexpr):
        """One pass over the columns ``[lo, hi)`` of a row: every key at or above the
        threshold ``(t, tcol)`` (:func:`_sample_cut`; ``tcol`` read only with ``CUT``) into a
        list, value bits in the low word, column in the high one. Per-warp lists (``cand + w
        * WCAP``, lengths to ``cnt_row[0:W]``, counting on past ``WCAP``: then the list
        overflowed; returns their sum) or, ``SHARED``, the row's one list at ``cand``: its
        slots taken from the counter ``cnt_row[0]`` in runs of at least ``RUN`` (it counts
        on past ``WCAP``: then the list overflowed; a run's slots left unused are marked
        empty, column -1), the keys listed added to ``cnt_row[1]`` (returns 0). ``DEPTH``
        blocks of ``W * BW`` keys are in flight (1-3): each SM needs enough bytes on their
        way to cover the memory latency.
        The blocks whose loads all fall inside the range go unmasked (no bound checks or
        fill values: fewer instructions and registers a block); the last few take the
        masked loop. ``DEAL``: the per-warp lists take each block's keys dealt
        (:func:`_block_cols`). ``HIST``: the keys with no room left go to the row's histogram
        ``hist`` (:func:`_filter_block`)."""
        STEP: tl.constexpr = W * BW
        tf = _key_float(t)
        origin = _key_block(t)
        wr = tl.arange(0, W)
        if BALLOT:
            off = tl.arange(0, STEP)
            acc = tl.zeros((STEP,), tl.int32)  # each element: its warp's list length
            if SHARED:
                lists = cand + tl.zeros((STEP,), tl.int32)
            else:
                wid = _warp_id(off)
                lists = cand + wid * WCAP
        else:
            off = wr[:, None] * BW + tl.arange(0, BW)[None, :]
            acc = tl.zeros((W,), tl.int32)
            wid = wr
            if SHARED:
                lists = cand
            else:
                lists = cand + wr[:, None] * WCAP
        # (one list a row has nothing to deal)
        DEALT: tl.constexpr = DEAL and not SHARED
        GROUP: tl.constexpr = 32 if BALLOT else BW
        ahead, ahead2, ahead3 = _prime_ahead(base, lo, off, hi, STEP, DEPTH, GROUP, W, DEALT)
        # blocks before `unmasked_end` are whole and so are those DEPTH past them
        unmasked_end = lo + ((hi - lo) // STEP - DEPTH) * STEP
        # a split row's run of slots a program (the plain steps'): next slot, end, keys listed
        rpos = tl.full((), 0, tl.int32)
        rend = tl.full((), 0, tl.int32)
        got = tl.full((), 0, tl.int32)
        for c0 in range(lo, unmasked_end, STEP):
            c = _block_cols(c0, off, STEP, GROUP, W, DEALT)
            # the next blocks' loads go out before this block's stores
            v, ahead, ahead2, ahead3 = _shift_ahead(base, c0, off, hi, ahead, ahead2, ahead3, STEP, DEPTH, False,
                                                    GROUP, W, DEALT)
            acc, rpos, rend, got = _filter_block(v, c, hi, tf, tcol, lists, acc, cnt_row, hist, origin, rpos, rend,
                                                 got, WCAP, BALLOT, False, SHARED, CUT, HIST, RUN)
        if SHARED and BALLOT:
            # the warps' runs (acc) end here; the masked blocks take a run of the program's
            _shared_close(acc, cnt_row + tl.zeros((STEP,), tl.int32), lists, tl.full((STEP,), WCAP, tl.int32))
        for c0 in range(tl.maximum(unmasked_end, lo), hi, STEP):
            c = _block_cols(c0, off, STEP, GROUP, W, DEALT)
            v, ahead, ahead2, ahead3 = _shift_ahead(base, c0, off, hi, ahead, ahead2, ahead3, STEP, DEPTH, True,
                                                    GROUP, W, DEALT)
            acc, rpos, rend, got = _filter_block(v, c, hi, tf, tcol, lists, acc, cnt_row, hist, origin, rpos, rend,
                                                 got, WCAP, BALLOT, True, SHARED, CUT, HIST, RUN)
        total = tl.full((), 0, tl.int32)
        if SHARED:
            _close_run(cand, cnt_row, rpos, rend, got, WCAP, RUN)
        else:
            tl.store(cnt_row + wid, acc)  # all of a warp's elements agree
            # the counts were written by other threads of this program; and every thread has
            # read them before any starts a retry's pass, which rewrites them
            tl.debug_barrier()
            total = tl.sum(tl.load(cnt_row + wr), axis=0)
            tl.debug_barrier()
        return total

    @triton.jit
    def _filter_range(base, lo, hi, cand, cnt_row, t, tcol, hist, W: tl.constexpr, BW: tl.constexpr,
                      WCAP: tl.constexpr, BALLOT: tl.constexpr, DEPTH: tl.constexpr, SHARED: tl.constexpr,
                      DEAL: tl.constexpr, HIST: tl.constexpr, RUN: tl.constexpr = 0):
        # the column cut costs instructions a key: only rows whose threshold has one pay them
        if tcol == 2147483647:
            total = _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, hist, W, BW, WCAP, BALLOT, DEPTH, SHARED, False,
                                 DEAL, HIST, RUN)
        else:
            total = _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, hist, W, BW, WCAP, BALLOT, DEPTH, SHARED, True,
                                 DEAL, HIST, RUN)
        return total

    @triton.jit
    def _band_pass(base, lo, hi, cand, ctr, t_lo, tc_lo, t_hi, tc_hi, hist, WCAP: tl.constexpr, BLOCK: tl.constexpr,
                   HIST: tl.constexpr):
        """Columns ``[lo, hi)`` of a row: the keys at or above the threshold ``(t_lo, tc_lo)``
        and below ``(t_hi, tc_hi)`` appended to the row's one list ``cand`` (slots from its
        counter ``ctr``, counting on past ``WCAP``; the keys listed added to ``ctr + 1``;
        with ``HIST`` the keys past it to the row's histogram ``hist`` in bins from
        ``t_hi``'s, as the first pass's: all in the first bin). The retry of a split row,
        rare: plain Triton, an atomic add a block with keys to place, and no runs."""
        origin = _key_block(t_hi)
        tf_lo = _key_float(t_lo)
        tf_hi = _key_float(t_hi)
        for c0 in range(lo, hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            m = c < hi
            v = tl.load(base + c, mask=m, other=float("-inf"))
            sel = m & _at_or_above(v, c, tf_lo, tc_lo) & ~_at_or_above(v, c, tf_hi, tc_hi)
            s32 = sel.to(tl.int32)
            tot = tl.sum(s32, axis=0)
            if tot > 0:
                pos = tl.atomic_add(ctr, tot) + tl.cumsum(s32, axis=0) - 1
                tl.atomic_add(ctr + 1, tot)
                tl.store(cand + pos, _pack(c, v), mask=sel & (pos < WCAP))
                if HIST:
                    _count_left_out(hist, v, origin, sel & (pos >= WCAP))

    @triton.jit
    def _stage_publish(stage, scnt, cand, ctr, hist, t, W: tl.constexpr, BW: tl.constexpr, SWCAP: tl.constexpr,
                       ROOM: tl.constexpr, HIST: tl.constexpr):
        """A split row's slice, filtered into ``W`` staged lists of ``SWCAP`` slots at
        ``stage`` (keys a list passed at ``scnt[w]``, counting on past ``SWCAP``), appended
        to the row's one list ``cand`` of ``ROOM`` slots: one atomic add on its counter
        ``ctr`` takes the slots, ``ctr + 1`` counts the keys. A staged list that overflowed
        makes the row's list overflow too (its counter pushed past ``ROOM``), and this slice
        marks the slots it leaves empty below ``ROOM`` (value -inf, column -1), so that every
        slot under the room holds a key or an empty mark. With ``HIST`` the keys past the
        room go to the row's histogram ``hist`` (bins from ``t``'s key block), as the staged
        lists' overflow did."""
        wr = tl.arange(0, W)
        passed = tl.load(scnt + wr)
        kept = tl.minimum(passed, SWCAP)
        keys = tl.sum(passed, axis=0)
        slots = tl.sum(kept, axis=0)
        over = tl.max(passed, axis=0) > SWCAP
        if keys > 0:
            at = tl.atomic_add(ctr, slots + tl.where(over, ROOM + 1, 0))
            tl.atomic_add(ctr + 1, keys)
            before = tl.cumsum(kept, axis=0) - kept
            origin = _key_block(t)
            for j0 in range(0, tl.max(kept, axis=0), BW):
                j = j0 + tl.arange(0, BW)
                m = j[None, :] < kept[:, None]
                x = tl.load(stage + wr[:, None] * SWCAP + j[None, :], mask=m, other=0)
                pos = at + before[:, None] + j[None, :]
                tl.store(cand + pos, x, mask=m & (pos < ROOM))
                if HIST:
                    if at + slots > ROOM:
                        _count_left_out(hist, x.to(tl.int32).to(tl.float32, bitcast=True), origin, m & (pos >= ROOM))
            if over:
                # (rare) this slice's slots end the list: the rest of the room is marked empty
                for e0 in range(at + slots, ROOM, BW * W):
                    e = e0 + tl.arange(0, BW * W)
                    tl.store(cand + e, tl.full((BW * W,), _HOLE, tl.int64), mask=e < ROOM)

    @triton.jit
    def _prefetch_first_unit(logits_ptr, pid, rows, stride_lm, SL: tl.constexpr, PFK: tl.constexpr,
                             PFS: tl.constexpr):
        # the first PFK keys of the unit this program takes if units go out in program order
        # (row pid // SL, slice pid % SL at PFS keys a slice), pulled into L2 while the launch
        # before still runs: a hint (no value is read, so it may run before the wait), every
        # address inside the block's first SL * PFS <= n columns (the plan's bound)
        if pid < rows * SL:
            base = logits_ptr + (pid // SL).to(tl.int64) * stride_lm + (pid % SL) * PFS
            lines = tl.arange(0, PFK // 32) * 32
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [base + lines],
                                      dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _await_previous(PDL: tl.constexpr):
        # programmatic dependent launch: the grid may be resident while the launch before it
        # still runs, so nothing is read or written before that launch has finished and its
        # writes are visible; then the launch after this one may be placed at once (its
        # programs wait the same way)
        if PDL:
            _gdc.gdc_wait()
            _gdc.gdc_launch_dependents()

    @triton.jit
    def filter_kernel(
        logits_ptr, starts_ptr, lengths_ptr, cand_ptr, cand32_ptr, cnt_ptr, thr_ptr, tcol_ptr, thr2_ptr, out_ptr,
        ctl_ptr, wpos_ptr, stats_ptr, rows, stride_lm, stride_om, sample_min, hist_ptr, stage_ptr,
        K: tl.constexpr,
        W: tl.constexpr,
        BW: tl.constexpr,
        WCAP: tl.constexpr,
        CAP: tl.constexpr,
        SL: tl.constexpr,
        NP: tl.constexpr,
        PIECE: tl.constexpr,
        SPARSE: tl.constexpr,
        SIGMAS: tl.constexpr,
        SLACK: tl.constexpr,
        LOW_BIT: tl.constexpr,
        WHOLE: tl.constexpr,
        BALLOT: tl.constexpr,
        DEPTH: tl.constexpr,
        DYNAMIC: tl.constexpr,
        FUSED: tl.constexpr,
        KP: tl.constexpr,
        STW: tl.constexpr,
        CH: tl.constexpr,
        BLOCK: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        STATS: tl.constexpr,
        PRESAMPLE: tl.constexpr,
        WB: tl.constexpr,
        RETRY: tl.constexpr,
        SECOND: tl.constexpr,
        RETRIES: tl.constexpr,
        JITTER: tl.constexpr = False,
        DEAL: tl.constexpr = False,
        RETRY_FROM: tl.constexpr = 0,
        HIST: tl.constexpr = False,
        RUN: tl.constexpr = 0,
        STAGE: tl.constexpr = False,
        PDL: tl.constexpr = False,
        PFK: tl.constexpr = 0,
        PFS: tl.constexpr = 0,
        TIE_BIT: tl.constexpr = 0,
        SNAP: tl.constexpr = False,
    ):
        """Rows longer than ``WHOLE`` (and at least ``sample_min``): the threshold
        ``(thr[row], tcol[row])`` (:func:`_sample_cut`) and the keys at or above it in lists
        of ``WCAP`` slots (value bits in the low word, column in the high one) within the
        row's ``CAP``. With ``SL == 1`` a program filters a whole row into ``W`` lists, one a
        warp, ``cnt[row, w]`` keys in list ``w`` (it counts on past ``WCAP``: then the list
        overflowed). With ``SL > 1`` a row is ``SL`` slices of whole blocks, each a program's
        (so that a few long rows still keep every SM streaming), all appending to the row's
        one list: slots from the counter ``cnt[2 * row]`` in runs of at least ``RUN`` a warp
        (:func:`_shared_append`; slots a run leaves unused are marked empty), the keys
        listed counted in ``cnt[2 * row + 1]`` (both zeroed by the sample kernel); the
        thresholds then come from the sample kernel and there is no retry here. ``FUSED`` (``SL == 1``):
        the same program then selects the row's top k (:func:`_select_row`, first launch),
        so that one program's counting steps overlap the other programs' streaming on the
        SM. ``DYNAMIC``: a program takes its next row (or slice) from the counter ``ctl[0]``
        (zeroed by the caller), so programs that run end together and programs the SM could
        not hold at once find no work left; otherwise ``pid, pid + nprog, ...``.
        ``PRESAMPLE``: the first threshold comes from :func:`sample_kernel`, so that no
        program stops streaming for a sample's search; ``SECOND``: so does the rare retry's,
        deeper (at ``thr2``/``thr2 + rows``; a search of this program's own sample for it,
        under the streaming filter's register cap, slowed every row). A whole row's program retries itself; split rows retry in a
        second launch (``RETRY``, after the first has counted every row): where fewer than
        ``K`` keys passed, each slice appends the keys between the deeper threshold and the
        first (the keys above the first are in the list already); with ``RETRY_FROM``, a
        whole row of at least that many keys does not retry (the select then queues it for
        the split fallback). ``DEAL``: a whole row's
        blocks are dealt to the warps' lists (:func:`_block_cols`). ``HIST``: the keys a row's
        lists have no room for go to its histogram at ``hist[row * SEED_BINS:]`` (zeroed by the
        caller; :func:`_filter_block`), from which the split fallback starts
        (``fallback_seed``, :func:`_fallback_seed`). ``PFK`` (> 0: NVIDIA, launched with
        ``PDL`` behind the sample kernel): before its wait each program prefetches into L2
        ``PFK`` keys of the unit it would take in program order (:func:`_prefetch_first_unit`),
        so that the rows stream from DRAM while the sample kernel, which reads little, runs."""
        pid = tl.program_id(0)
        if PFK > 0:
            _prefetch_first_unit(logits_ptr, pid, rows, stride_lm, SL, PFK, PFS)
        _await_previous(PDL)
        nprog = tl.num_programs(0)
        STEP: tl.constexpr = W * BW
        si = tl.arange(0, NP * PIECE)
        pp = si // PIECE
        pj = si % PIECE
        units = rows * SL
        if DYNAMIC:
            unit = tl.atomic_add(ctl_ptr, 1)
        else:
            unit = pid
        while unit < units:
            row32 = unit // SL
            row = row32 + tl.zeros((), tl.int64)  # 64-bit offsets (an int under the interpreter)
            length = tl.load(lengths_ptr + row).to(tl.int32)
            if _sampled_row(length, sample_min, WHOLE):
                base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
                cand = cand_ptr + row * CAP
                hist = hist_ptr + row * _SEED_BINS
                if SL == 1:
                    sidx, smask, s, spread = _row_sample(length, pp, pj, NP, PIECE, SPARSE, JITTER)
                    if PRESAMPLE:
                        t = tl.load(thr_ptr + row)
                        tc = tl.load(tcol_ptr + row)
                    else:
                        t, tc = _sample_cut(_sample_keys(base, sidx, smask),
                                            _run_rank(K, s, length, SIGMAS, PIECE), length, spread, SLACK, LOW_BIT,
                                            NP, PIECE, TIE_BIT)
                    total = _filter_range(base, 0, length, cand, cnt_ptr + row * W, t, tc, hist, W, BW, WCAP, BALLOT,
                                          DEPTH, False, DEAL, HIST)
                    # too few keys passed (rare): once more, twice as many sigmas deep into
                    # the sample (read again, so that it is not held in registers through the
                    # pass); a row of at least RETRY_FROM keys goes to the split fallback
                    # instead, whose passes are spread over many programs (this one's pass
                    # over a long row holds up the launch)
                    if (total < K) & ((RETRY_FROM == 0) | (length < RETRY_FROM)):
                        if RETRIES:
                            tl.atomic_add(stats_ptr + 4, 1)
                        if SECOND:
                            t = tl.load(thr2_ptr + row)
                            tc = tl.load(thr2_ptr + rows + row)
                        else:
                            t, tc = _sample_cut(_sample_keys(base, sidx, smask),
                                                _run_rank(K, s, length, 2 * SIGMAS, 2 * PIECE), length, spread, SLACK,
                                                LOW_BIT, NP, PIECE, TIE_BIT)
                        if HIST:
                            # a list that overflowed with fewer than K keys in all (more lists
                            # than K / WCAP) counted keys from the first threshold's bins
                            _zero_bins(hist)
                            tl.debug_barrier()
                        total = _filter_range(base, 0, length, cand, cnt_ptr + row * W, t, tc, hist, W, BW, WCAP,
                                              BALLOT, DEPTH, False, DEAL, HIST)
                    tl.store(thr_ptr + row, t)
                else:
                    # slices of whole blocks, so that only a row's last block is masked
                    per = (length + SL * STEP - 1) // (SL * STEP) * STEP
                    lo = (unit % SL) * per
                    hi = tl.minimum(lo + per, length)
                    # cnt[2 * rows + row]: the row's slices done; the last to finish marks a
                    # row that needs the retry (SL + 1), so that the retry launch decides on
                    # the first pass's count, which its own appends then change
                    done = cnt_ptr + 2 * rows + row
                    ctr = cnt_ptr + 2 * row
                    if RETRY:
                        if (lo < hi) & (tl.load(done) > SL):
                            _band_pass(base, lo, hi, cand, ctr, tl.load(thr2_ptr + row), tl.load(thr2_ptr + rows + row),
                                       tl.load(thr_ptr + row), tl.load(tcol_ptr + row), hist, WCAP, STEP, HIST)
                    else:
                        if lo < hi:
                            t = tl.load(thr_ptr + row)
                            if STAGE:
                                # the slice's keys in lists of its own, one a warp as a whole
                                # row's (no atomic while it streams), then copied to the row's
                                # list at slots taken by one atomic add
                                stage = stage_ptr + unit * (CAP + W)
                                scnt = (stage + CAP).to(tl.pointer_type(tl.int32))
                                _filter_range(base, lo, hi, stage, scnt, t, tl.load(tcol_ptr + row), hist, W, BW,
                                              CAP // W, BALLOT, DEPTH, False, False, HIST)
                                _stage_publish(stage, scnt, cand, ctr, hist, t, W, BW, CAP // W, WCAP, HIST)
                            else:
                                _filter_range(base, lo, hi, cand, ctr, t, tl.load(tcol_ptr + row), hist, W, BW, WCAP,
                                              BALLOT, DEPTH, True, False, HIST, RUN)
                        # every warp's count of keys listed before the slice counts as done
                        tl.debug_barrier()
                        if tl.atomic_add(done, 1) == SL - 1:
                            if tl.atomic_add(ctr + 1, 0) < K:
                                tl.store(done, SL + 1)
                                if RETRIES:
                                    tl.atomic_add(stats_ptr + 4, 1)
            if FUSED:
                # one thread stored the threshold; every thread of the select reads it
                tl.debug_barrier()
                _select_row(row, length, logits_ptr, starts_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr,
                            wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min, hist_ptr, thr_ptr, K, KP, W, WCAP,
                            STW, WHOLE, CH, BLOCK, RADIX_BITS, R, True, False, STATS, WB, 0, SNAP=SNAP)
                # the next row's candidates and counts are other slots, but the tile's
                # scratch for reductions is shared: keep the rows apart
                tl.debug_barrier()
            if DYNAMIC:
                unit = tl.atomic_add(ctl_ptr, 1)
            else:
                unit += nprog

    @triton.jit
    def _sampled_row(length, sample_min, WHOLE: tl.constexpr):
        # whether a row is filtered (and so sampled): longer than the select tile that takes
        # it whole, and at least sample_min (shorter ones take the fallback path)
        return (length > WHOLE) & (length >= sample_min)

    @triton.jit
    def _row_sample(length, pp, pj, NP: tl.constexpr, PIECE: tl.constexpr, SPARSE: tl.constexpr,
                    JITTER: tl.constexpr):
        """A row's sample: runs of ``PIECE`` keys (run ``pp``, key ``pj`` of it), one every
        ``SPARSE * PIECE`` keys and at most ``NP`` of them, spread evenly over its ``length``
        keys (the recent end no denser than the rest). Runs of a few sectors read little
        more than the keys they sample, and many runs leave no stretch of the row unseen (a
        ramp, a run of recent keys scoring high). Run ``j`` lies in the window of ``spread``
        keys from ``j * spread``: at its start, or with ``JITTER`` at a multiple of 8 keys
        within it taken from a golden-ratio sequence over the runs (runs at one fixed stride
        miss every large key of a structure with the same period). Returns the sampled
        columns, their mask and count, and the spacing of the runs."""
        runs = tl.minimum(tl.maximum(length // (SPARSE * PIECE), 1), NP)
        spread = length // runs
        plen = tl.minimum(spread, PIECE)
        col = pp * spread + pj
        if JITTER:
            # (pp * 40503 may wrap: its low 16 bits still step by the golden ratio of 2**16)
            h = ((pp * 40503) & 0xFFFF).to(tl.int64)
            col += ((h * ((spread - plen) // 8 + 1)) >> 16).to(tl.int32) * 8
        return col, (pp < runs) & (pj < plen), runs * plen, spread

    @triton.jit
    def sample_kernel(
        logits_ptr, starts_ptr, lengths_ptr, thr_ptr, tcol_ptr, thr2_ptr, cnt_ptr, wpos_ptr, ctl_ptr, rows, stride_lm,
        sample_min, hist_ptr,
        K: tl.constexpr,
        NP: tl.constexpr,
        PIECE: tl.constexpr,
        SPARSE: tl.constexpr,
        SIGMAS: tl.constexpr,
        SLACK: tl.constexpr,
        LOW_BIT: tl.constexpr,
        WHOLE: tl.constexpr,
        SL: tl.constexpr,
        SECOND: tl.constexpr,
        RETRY_FROM: tl.constexpr = 0,
        JITTER: tl.constexpr = False,
        HIST: tl.constexpr = False,
        PDL: tl.constexpr = False,
        TIE_BIT: tl.constexpr = 0,
    ):
        """The filter kernel's threshold ``(thr[row], tcol[row])`` of row ``program_id`` (if
        it filters the row), at its sample's rank (:func:`_run_rank`, :func:`_sample_cut`),
        and with ``SECOND`` the retry's, twice as many sigmas deep, at ``(thr2[row],
        thr2[rows + row])`` (a looser search: any key near that rank serves), for the rows
        that can retry: split rows (``SL > 1``) and whole rows shorter than ``RETRY_FROM``
        (0: every row; longer ones take the split fallback instead, and their ``thr2`` is left
        unwritten).
        ``NP`` (runs at most) may exceed the filter's, so that long rows get a sample as large
        as ``SPARSE`` asks (up to a tile's worth), or be smaller where no row has more runs
        (:func:`sample_runs`): the same sample, a smaller tile. It also zeroes the counters
        the later launches start from, the row's write counter ``wpos[row]``, with ``SL > 1``
        its list counter and count ``cnt[2 * row:2 * row + 2]`` and slices-done counter
        ``cnt[2 * rows + row]``, and
        (program 0) ``ctl[0:5]``, and with ``HIST`` a filtered row's histogram of the keys its
        lists will have no room for (``hist[row * SEED_BINS:]``), so that the call needs no
        fill launch before it."""
        _await_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        tl.store(wpos_ptr + row, 0)
        if SL > 1:
            tl.store(cnt_ptr + 2 * row, 0)  # the row's list counter
            tl.store(cnt_ptr + 2 * row + 1, 0)  # its keys listed
            tl.store(cnt_ptr + 2 * rows + row, 0)  # its slices done
        if row == 0:
            c = tl.arange(0, 8)
            tl.store(ctl_ptr + c, tl.zeros((8,), tl.int32), mask=c < 5)
        length = tl.load(lengths_ptr + row).to(tl.int32)
        if _sampled_row(length, sample_min, WHOLE):
            if HIST:
                _zero_bins(hist_ptr + row * _SEED_BINS)
            base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
            si = tl.arange(0, NP * PIECE)
            sidx, smask, s, spread = _row_sample(length, si // PIECE, si % PIECE, NP, PIECE, SPARSE, JITTER)
            skeys = _sample_keys(base, sidx, smask)
            t, tc = _sample_cut(skeys, _run_rank(K, s, length, SIGMAS, PIECE), length, spread, SLACK, LOW_BIT,
                                NP, PIECE, TIE_BIT)
            tl.store(thr_ptr + row, t)
            tl.store(tcol_ptr + row, tc)
            # the retry's, twice as many sigmas deep (a filter program's own sample of a long
            # row is too small to place it well: at 2M keys each of its keys stands for 512),
            # within half its rank and 16 low bits (most searches end early); only for rows that
            # can retry: split rows, whole rows shorter than RETRY_FROM (0: every row)
            if SECOND:
                if (length < RETRY_FROM) | (RETRY_FROM == 0) | (SL > 1):
                    t2, tc2 = _sample_cut(skeys, _run_rank(K, s, length, 2 * SIGMAS, 2 * PIECE), length, spread,
                                          0.5, 16, NP, PIECE, TIE_BIT)
                    # never above the first: the two searches stop at different slacks, and a split
                    # row's select takes this one as the least of its candidates
                    above = (t2 > t) | ((t2 == t) & (tc2 < tc))
                    tl.store(thr2_ptr + row, tl.where(above, t, t2))
                    tl.store(thr2_ptr + rows + row, tl.where(above, tc, tc2))

    @triton.jit
    def _defer(ctl_ptr, row):
        # queue a row for the second select launch: ctl[1] rows queued, at ctl[5:]
        tl.store(ctl_ptr + 5 + tl.atomic_add(ctl_ptr + 1, 1), row.to(tl.int32))

    @triton.jit
    def _queue_fallback(row, cand32_ptr, ctl_ptr, prefix, pmask, need, filled, REGION: tl.constexpr):
        # queue a row for fallback_kernel (ctl[3] rows queued, at ctl[5 + rows:]) and set its
        # state, kept in the row's candidate slots (a fallback row's lists are never read
        # again): zero digit histograms and counts, the bits of the k-th key known (`prefix`
        # under `pmask`), the keys still needed among the keys matching them, and the pass
        # filling the buffer + 1 (0: none yet)
        rows = tl.num_programs(0)
        tl.store(ctl_ptr + 5 + rows + tl.atomic_add(ctl_ptr + 3, 1), row.to(tl.int32))
        z = tl.arange(0, _FB_ZERO_TILE)
        # (the key bounds start apart: the first pass's atomics bring them together)
        init = tl.where(z == _FB_KMAX, -2147483648, tl.where(z == _FB_KMIN, 2147483647, 0))
        init = tl.where(z == _FB_PREFIX, prefix, tl.where(z == _FB_PMASK, pmask, init))
        init = tl.where(z == _FB_NEED, need, tl.where(z == _FB_FILLED, filled, init))
        tl.store(cand32_ptr + row * REGION + z, init, mask=z < _FB_ZEROED)

    @triton.jit
    def _fallback_seed(row, cand32_ptr, cnt_ptr, hist_ptr, t1, K: tl.constexpr, W: tl.constexpr, WCAP: tl.constexpr,
                       SBUF: tl.constexpr, SPLIT: tl.constexpr = False):
        """Where a filtered row's lists overflowed, the bits of its k-th key that the filter's
        histogram gives (``fallback_seed``): the keys its lists had no room for were counted
        there (``hist_ptr[row * SEED_BINS:]``, bins of :func:`_seed_bin` from the threshold
        ``t1``'s key block), the listed ones are counted here, and the highest bin whose keys
        and those above reach ``K`` holds the k-th key. A bin past the first (whose block the
        threshold cuts) and before the last (which holds every key past it) is a block of keys
        sharing their top ``32 - SEED_SHIFT`` bits, all of which passed: returns ``(prefix,
        pmask, need, filled, seeded)`` for :func:`_queue_fallback`, ``filled`` 1 (the first
        pass fills the buffer) where the bin holds at most ``SBUF`` keys; otherwise nothing
        known (the first digit from the top). ``SPLIT``: a split row's one list, its slots
        taken at ``cnt[2 * row]``, empty ones (column -1) among them."""
        CAP: tl.constexpr = W * WCAP
        SC: tl.constexpr = 512
        bins = tl.arange(0, _SEED_BINS)
        origin = _key_block(t1)
        h = tl.load(hist_ptr + row * _SEED_BINS + bins, volatile=True)
        for c0 in range(0, CAP, SC):
            i = c0 + tl.arange(0, SC)
            if SPLIT:
                ok = (i < CAP) & (i < tl.load(cnt_ptr + 2 * row))
                v, col = _slot_both(cand32_ptr, row, i, ok, CAP, WCAP, WCAP)
                ok = ok & (col >= 0)
            else:
                listed = tl.minimum(tl.load(cnt_ptr + row * W + i // WCAP, mask=i < CAP, other=0), WCAP)
                ok = (i < CAP) & (i % WCAP < listed)
                v = tl.load(cand32_ptr + 2 * (row * CAP + i), mask=ok, other=0)
            h += tl.histogram(_seed_bin(v.to(tl.float32, bitcast=True), origin), _SEED_BINS, mask=ok)
        # keys in the bins from each bin up
        reach = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
        b = tl.max(tl.where(reach >= K, bins, -1), axis=0)
        inbin = tl.sum(tl.where(bins == b, h, 0), axis=0)
        above = tl.sum(tl.where(bins > b, h, 0), axis=0)
        seeded = (b > 0) & (b < _SEED_BINS - 1)
        prefix = tl.where(seeded, (origin + b) << _SEED_SHIFT, 0)
        pmask = tl.where(seeded, _SEED_PMASK, 0)
        need = tl.where(seeded, K - above, K)
        filled = tl.where(seeded & (inbin <= SBUF), 1, 0)
        # every thread's loads of the lists before the state is stored over them
        tl.debug_barrier()
        return prefix, pmask, need, filled, seeded

    @triton.jit
    def _lead_zeros(x):
        # leading zero bits of int32 x's 32 (0-32), by halving
        y = x.to(tl.int64) & 0xFFFFFFFF
        n = tl.full((), 0, tl.int32)
        for h in tl.static_range(5):
            # the top 16, 8, 4, 2, 1 bits left zero: count them and shift them out
            top = (y >> (32 - (16 >> h))) == 0
            n += tl.where(top, 16 >> h, 0)
            y = tl.where(top, (y << (16 >> h)) & 0xFFFFFFFF, y)
        return tl.where(x == 0, 32, n)

    @triton.jit
    def _prefix_keys(prefix, pmask):
        # the least and greatest signed key (_skey) whose unsigned form has the bits `prefix`
        # under `pmask`
        return prefix ^ -2147483648, (prefix | ~pmask) ^ -2147483648

    @triton.jit
    def _digit_place(pmask):
        # the next digit of a key's unsigned form below the bits `pmask` fixes (its top
        # bits): five bits, or the last ones (shift, mask)
        free = 32 - _lead_zeros(~pmask)
        width = tl.minimum(free, 5)
        return free - width, (1 << width) - 1

    @triton.jit
    def _fallback_next(reg, p, BUF: tl.constexpr):
        """Run once a fallback row's pass ``p`` is done, by the program of its last item: after
        a digit pass (``p < 7``, the buffer not chosen, bits left to find), the next digit of
        the row's k-th largest key (on the key's unsigned form: sign bit flipped; five bits
        below those found, or the last ones) from the row's 32-bin histogram of it at
        ``reg[32 * p:]``, added to the bits found so far (``reg[_FB_PREFIX]``, their mask
        ``reg[_FB_PMASK]``), the keys still needed among those matching them
        (``reg[_FB_NEED]``). The keys matching them
        lie in that bin and between the greatest and least key the pass counted
        (``reg[_FB_KMAX]``, ``reg[_FB_KMIN]``): every bit those two bounds share is found too,
        so that a digit can fix more than its own bits (a Gaussian row's keys in the top bin
        of the first digit, sign and top exponent bits, share their exponent's next bits) and
        a row whose keys there are all one key has all 32 (it is the k-th: the digit passes
        left do nothing, and a row tied at its k-th key reads its keys three times, not
        nine). With ``BUF``, where bits are left and the bin holds at most ``BUF`` keys, pass
        ``p + 1`` is to move them to the buffer (``reg[_FB_FILLED]`` holds that pass + 1; a row
        queued with bits known from the filter may start there, :func:`_fallback_seed`). The histogram and
        bounds were added to by other programs' atomics: they are read past the L1 cache.
        Returns the pass to run next: ``p + 1``; 7 where every bit is found before the last
        digit pass (the digit passes between do nothing); 9 (none) once the row is finished
        from the buffer."""
        filled = tl.load(reg + _FB_FILLED, volatile=True)
        pmask = tl.load(reg + _FB_PMASK, volatile=True)
        # (past the pass finishing from the buffer, `filled`: none left)
        nxt = tl.where((filled > 0) & (p >= filled), 9, p + 1)
        if (p < 7) & (filled == 0) & (pmask != -1):
            bins = tl.arange(0, 32)
            hist = tl.load(reg + 32 * p + bins, volatile=True)
            need = tl.load(reg + _FB_NEED, volatile=True)
            b, rest = _top_bin(hist, bins, need)
            shift, dmask = _digit_place(pmask)
            prefix = tl.load(reg + _FB_PREFIX, volatile=True) | (b << shift)
            pmask = pmask | (dmask << shift)
            kmax = tl.load(reg + _FB_KMAX, volatile=True)
            kmin = tl.load(reg + _FB_KMIN, volatile=True)
            # every thread's loads of the state before any store to it (each branch below
            # is then taken by every thread alike)
            tl.debug_barrier()
            tl.store(reg + _FB_KMAX, -2147483648)
            tl.store(reg + _FB_KMIN, 2147483647)
            inbin = tl.sum(tl.where(bins == b, hist, 0), axis=0)
            # the bin's keys lie in [lo, hi] (signed keys; the bin holds at least one): the
            # bits of a key's unsigned form above the highest where lo and hi differ are fixed
            least, most = _prefix_keys(prefix, pmask)
            lo = tl.maximum(least, kmin)
            hi = tl.minimum(most, kmax)
            free = (32 - _lead_zeros(lo ^ hi)).to(tl.int64)
            pmask = (~((tl.full((), 1, tl.int64) << free) - 1)).to(tl.int32)
            prefix = (lo ^ -2147483648) & pmask
            # (never taken without a buffer)
            if (pmask != -1) & (inbin <= BUF):
                tl.store(reg + _FB_FILLED, p + 2)
            tl.store(reg + _FB_PREFIX, prefix)
            tl.store(reg + _FB_PMASK, pmask)
            tl.store(reg + _FB_NEED, rest)
            nxt = tl.where(pmask == -1, 7, nxt)
        return nxt

    @triton.jit
    def _fallback_in_row(i, length):
        # 0 <= i < length in one unsigned compare
        return i.to(tl.uint32, bitcast=True) < length.to(tl.uint32)

    @triton.jit
    def _fallback_step(base, c0, off, hi, mis, length, a1, a2, a3, BLOCK: tl.constexpr, AHEAD: tl.constexpr):
        """One step of a fallback pass over a row's aligned view: ``base`` is the 16-byte
        boundary at or before the row's first key, which is key ``mis`` (0-3) of the view, so
        that a thread loads its keys four at a time, one vector load each (a row starts at any
        key: loads from the row's own first key took four scalar loads, each with its own
        address and bound check). A pass walks keys ``[lo, hi)`` of the view (a slice; the
        last ends at ``length + mis``). Returns the view's keys at ``c0`` (``BLOCK``, float32),
        their columns in the row, whether they are the row's (the view's first ``mis`` keys
        and those past the row's end, read with the 16 bytes holding a row key, are not),
        and the loads kept in flight (:func:`_shift_ahead`)."""
        v, a1, a2, a3 = _shift_ahead(base, c0, off, hi, a1, a2, a3, BLOCK, AHEAD, True, BLOCK, 1, False, True)
        i = c0 - mis + off
        return v, i, _fallback_in_row(i, length), a1, a2, a3

    @triton.jit
    def _fallback_fill(base, obase, lo, hi, mis, length, reg, wpos_ptr, buf, prefix, pmask, BLOCK: tl.constexpr,
                       BUF: tl.constexpr, AHEAD: tl.constexpr, WB: tl.constexpr):
        """Keys ``[lo, hi)`` (of the aligned view, :func:`_fallback_step`) of a fallback row
        whose digits found leave at most ``BUF`` keys
        matching ``prefix`` (under ``pmask``): the keys above those to the row's indices, the
        keys matching it to the buffer ``buf`` (int64: the key high, its column reversed low,
        ordered as the row's selection orders them; :func:`_fallback_finish`), slots from its
        count ``reg[_FB_BUFN]``: by warp ballots with ``WB``, else at a scan's positions."""
        # the matching keys are one range of signed keys (the unsigned form's top bits fixed)
        least, most = _prefix_keys(prefix, pmask)
        off = tl.arange(0, BLOCK)
        a1, a2, a3 = _prime_ahead(base, lo, off, hi, BLOCK, AHEAD, BLOCK, 1, False, True)
        for c0 in range(lo, hi, BLOCK):
            v, i, m, a1, a2, a3 = _fallback_step(base, c0, off, hi, mis, length, a1, a2, a3, BLOCK, AHEAD)
            key = _skey(v)
            _append_out(obase, wpos_ptr, m & (key > most), i, WB)
            inside = (m & (key >= least) & (key <= most)).to(tl.int32)
            if WB:
                zero = tl.zeros(inside.shape, tl.int32)
                _warp_pair_store(inside, key, 2147483647 - i, reg + _FB_BUFN + zero, buf + zero)
            else:
                n = tl.sum(inside, axis=0)
                if n > 0:
                    at = tl.atomic_add(reg + _FB_BUFN, n) + tl.cumsum(inside, axis=0) - 1
                    tl.store(buf + at, (key.to(tl.int64) << 32) | (2147483647 - i).to(tl.int64), mask=inside > 0)

    @triton.jit
    def _fallback_finish(obase, reg, wpos_ptr, buf, prefix, pmask, need, BUF: tl.constexpr):
        """The ``need`` largest of a fallback row's buffered keys (``reg[_FB_BUFN]`` of them at
        ``buf``), ties by lowest column, to the row's indices: each key and column is one int64,
        key high and column reversed low (:func:`_fallback_fill`), so that the keys are
        distinct and ordered as the row's selection orders them; the ``need``-th largest found
        by bisection between the least and the greatest the digits allow."""
        i = tl.arange(0, BUF)
        m = i < tl.load(reg + _FB_BUFN, volatile=True)
        both = tl.load(buf + i, mask=m, other=-9223372036854775807 - 1, volatile=True)
        col = 2147483647 - both.to(tl.int32)
        least, most = _prefix_keys(prefix, pmask)
        lo = least.to(tl.int64) << 32
        hi = (most.to(tl.int64) << 32) | 2147483647
        while lo < hi:
            mid = lo + ((hi - lo + 1) >> 1)
            if tl.sum((both >= mid).to(tl.int32), axis=0) >= need:
                lo = mid
            else:
                hi = mid - 1
        _append_out(obase, wpos_ptr, m & (both >= lo), col, False)

    @triton.jit
    def _append_out(obase, wpos_ptr, sel, col, WB: tl.constexpr):
        # the selected columns of a block after the row's indices so far: slots from the
        # row's write counter (other slices of the row write at the same time); with WB by
        # warp ballots, one atomic add a warp (no reduction across the block, no barrier)
        if WB:
            zero = tl.zeros(sel.shape, tl.int32)
            _warp_store(sel.to(tl.int32), col, wpos_ptr + zero, obase + zero)
        else:
            n = tl.sum(sel.to(tl.int32), axis=0)
            if n > 0:
                at = tl.atomic_add(wpos_ptr, n)
                tl.store(obase + at + tl.cumsum(sel.to(tl.int32), axis=0) - 1, col, mask=sel)

    @triton.jit
    def _warp_histogram(digit, acc):
        """``acc`` plus, in each lane, how many of its warp's ``digit`` (0-31; negative: not
        counted) equal the lane's index: a warp's 32-bin histogram spread over its lanes,
        summed in registers across a pass's steps (each lane then adds its count to the row's).
        NVIDIA only (inline PTX); four elements a thread (one ballot set a register), so
        every lane holds exactly four of the block's. Triton's ``tl.histogram`` (sm_90a,
        Triton 3.9) instead adds every key to a shared-memory bin by an atomic, between
        barriers at each call."""
        return tl.inline_asm_elementwise(_WARP_HISTOGRAM_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [digit, acc],
                                         dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _lane_ids(x):
        """Each element's lane in its warp, in ``x``'s layout (:func:`_warp_histogram`'s counts
        are read in the layout they were taken in: the TTGIR for sm_90a converts neither
        between them)."""
        return tl.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _fallback_item(base, obase, lo, hi, mis, length, reg, wpos_ptr, s, p, BLOCK: tl.constexpr,
                       NS: tl.constexpr, NSP: tl.constexpr, BUF: tl.constexpr, BOFF: tl.constexpr,
                       AHEAD: tl.constexpr, WB: tl.constexpr):
        """Pass ``p`` of a fallback row of ``length`` keys over keys ``[lo, hi)`` of its aligned
        view ``base`` (slice ``s``; the row's first key is the view's key ``mis``,
        :func:`_fallback_step`), with the bits of the k-th key found before it
        (:func:`_fallback_next`): ``p < 7`` adds the slice's histogram of the next digit
        (among keys matching the bits found) to the row's, and the greatest and least of those
        keys to the row's (``reg[_FB_KMAX]``, ``reg[_FB_KMIN]``) and to the slice's own two
        slots at ``reg[_FB_ZEROED + NSP + 32 * s:]`` (a later pass whose bits that range misses
        skips the slice), unless every bit is found; ``p == 7`` writes the keys above the
        k-th and counts the slice's keys equal to it; ``p == 8`` writes the ties the slices
        before left to take, lowest columns first. With ``BUF``, once the digits leave at most
        ``BUF`` keys that could be the k-th, that pass moves them to the row's buffer instead
        (:func:`_fallback_fill`), the next selects from it (:func:`_fallback_finish`, slice 0)
        and the passes after do nothing. Indices go to slots from the row's write counter (by
        warp ballots with ``WB``, NVIDIA, which also counts the digits by ballots in
        registers: :func:`_warp_histogram`). Every load of what another item wrote is
        volatile: that item may have run on another SM, whose writes a line left in this SM's
        L1 cache would hide."""
        buf = (reg + BOFF).to(tl.pointer_type(tl.int64))
        prefix = tl.load(reg + _FB_PREFIX, volatile=True)
        pmask = tl.load(reg + _FB_PMASK, volatile=True)
        filled = tl.full((), 0, tl.int32)
        if BUF > 0:
            filled = tl.load(reg + _FB_FILLED, volatile=True)
        if (filled > 0) & (p >= filled - 1):
            if BUF > 0:
                if p == filled - 1:
                    _fallback_fill(base, obase, lo, hi, mis, length, reg, wpos_ptr, buf, prefix, pmask, BLOCK, BUF,
                                   AHEAD, WB)
                elif (p == filled) & (s == 0):
                    # the row finished from the buffer, once; the passes after do nothing
                    _fallback_finish(obase, reg, wpos_ptr, buf, prefix, pmask, tl.load(reg + _FB_NEED, volatile=True),
                                     BUF)
        elif p < 7:
            # 5-bit digits: the histogram's time grows with its bins (512 or 4096 bins measured
            # slower than seven passes of 32, docs/topk.md)
            shift, dmask = _digit_place(pmask)
            own = reg + _FB_ZEROED + NSP + 32 * s
            # the keys matching the bits found: one range of signed keys. The slice holds some
            # only where the range meets its greatest and least key the pass before counted
            # (a slice that counted none stored an empty range)
            least, most = _prefix_keys(prefix, pmask)
            mine = pmask != -1
            if p > 0:
                mine = mine & (tl.load(own, volatile=True) >= least) & (tl.load(own + 1, volatile=True) <= most)
            smax = tl.full((), -2147483648, tl.int32)
            smin = tl.full((), 2147483647, tl.int32)
            if mine:
                hist = tl.zeros((32,), tl.int32)
                off = tl.arange(0, BLOCK)
                acc = tl.zeros((BLOCK,), tl.int32)
                kmax = tl.full((BLOCK,), -2147483648, tl.int32)
                kmin = tl.full((BLOCK,), 2147483647, tl.int32)
                # the next AHEAD blocks' loads in flight while this one is counted
                a1, a2, a3 = _prime_ahead(base, lo, off, hi, BLOCK, AHEAD, BLOCK, 1, False, True)
                for c0 in range(lo, hi, BLOCK):
                    v, i, m, a1, a2, a3 = _fallback_step(base, c0, off, hi, mis, length, a1, a2, a3, BLOCK, AHEAD)
                    key = _skey(v)
                    u = key ^ -2147483648
                    counted = m & ((u & pmask) == prefix)
                    if WB:
                        acc = _warp_histogram(tl.where(counted, (u >> shift) & dmask, -1), acc)
                    else:
                        hist += tl.histogram((u >> shift) & dmask, 32, mask=counted)
                    kmax = tl.maximum(kmax, tl.where(counted, key, -2147483648))
                    kmin = tl.minimum(kmin, tl.where(counted, key, 2147483647))
                if WB:
                    # each lane holds its warp's count of the bin of its index: added to the
                    # row's as it is (a reduction across the block a bin cost 32 of them)
                    tl.atomic_add(reg + 32 * p + _lane_ids(acc), acc, mask=acc > 0, sem="relaxed")
                else:
                    tl.atomic_add(reg + 32 * p + tl.arange(0, 32), hist, mask=hist > 0, sem="relaxed")
                smax = tl.max(kmax, axis=0)
                smin = tl.min(kmin, axis=0)
                tl.atomic_max(reg + _FB_KMAX, smax, sem="relaxed")
                tl.atomic_min(reg + _FB_KMIN, smin, sem="relaxed")
            tl.store(own, smax)
            tl.store(own + 1, smin)
        else:
            # every bit of the k-th key (seven digits fix at least 32 bits)
            kth = prefix ^ -2147483648
            if p == 7:
                eq = tl.zeros((BLOCK,), tl.int32)
                off = tl.arange(0, BLOCK)
                a1, a2, a3 = _prime_ahead(base, lo, off, hi, BLOCK, AHEAD, BLOCK, 1, False, True)
                for c0 in range(lo, hi, BLOCK):
                    v, i, m, a1, a2, a3 = _fallback_step(base, c0, off, hi, mis, length, a1, a2, a3, BLOCK, AHEAD)
                    key = _skey(v)
                    _append_out(obase, wpos_ptr, m & (key > kth), i, WB)
                    eq += (m & (key == kth)).to(tl.int32)
                tl.store(reg + _FB_ZEROED + s, tl.sum(eq, axis=0))
            else:
                need = tl.load(reg + _FB_NEED, volatile=True)
                sl = tl.arange(0, NSP)
                before = tl.sum(tl.load(reg + _FB_ZEROED + sl, mask=sl < s, other=0, volatile=True), axis=0)
                c0 = tl.where(tl.load(reg + _FB_ZEROED + s, volatile=True) > 0, lo, hi)  # a slice without ties skips
                while (c0 < hi) & (before < need):
                    i = c0 - mis + tl.arange(0, BLOCK)
                    m = _fallback_in_row(i, length)
                    eq = (m & (_skey(tl.load(base + mis + i, mask=m, other=0.0)) == kth)).to(tl.int32)
                    _append_out(obase, wpos_ptr, (eq > 0) & (before + tl.cumsum(eq, axis=0) <= need), i, False)
                    before += tl.sum(eq, axis=0)
                    c0 += BLOCK

    @triton.jit
    def fallback_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr, cand32_ptr, ctl_ptr, wpos_ptr, stats_ptr, rows, stride_lm,
        stride_om,
        K: tl.constexpr,
        REGION: tl.constexpr,
        SLICE: tl.constexpr,
        BLOCK: tl.constexpr,
        NS: tl.constexpr,
        NSP: tl.constexpr,
        COUNT: tl.constexpr,
        BUF: tl.constexpr,
        BOFF: tl.constexpr,
        AHEAD: tl.constexpr = 1,
        WB: tl.constexpr = False,
        ITEMS: tl.constexpr = 0,
        PDL: tl.constexpr = False,
    ):
        """The fallback path of the rows the first select launch queued (``ctl[3]`` of them
        at ``ctl[5 + rows:]``), each split into ``NS`` slices of ``SLICE`` keys: a radix
        select of up to seven digit passes (5 bits each below the bits found, which a pass can
        extend past its own digit: :func:`_fallback_next`), then a pass writing the keys
        above the k-th key and one writing its ties, lowest columns first; with ``BUF``, a row
        whose digits leave at most ``BUF`` candidates for the k-th key moves them to a buffer
        (int64s from int32 slot ``BOFF`` of its region) and is finished from it, its later
        passes doing nothing (:func:`_fallback_item`).
        Every program takes the next (pass, row, slice) item from the counter ``ctl[4]``,
        passes in order, and waits until the row's pass is ready (``reg[_FB_READY]``, ``REGION``
        int32 slots a row from ``cand32``): the program finishing the row's last item of the
        pass before (its count of items done, ``reg[_FB_DONE]``) finds the next digit
        (:func:`_fallback_next`) and then marks it so. Items are taken in that order, so an
        awaited item is always held by a running program: a program never waits on one that
        has not started, and the grid need not fit the GPU at once. ``AHEAD``: steps of ``BLOCK``
        keys whose loads a pass keeps in flight. ``WB`` (NVIDIA; ``BLOCK`` a multiple of 512):
        the digits counted and the indices placed by warp ballots. An empty queue costs a
        program a load and an atomic. ``COUNT``: each row adds 1 to ``stats[5]``. ``ITEMS``
        (``> 0``): an item takes ``g`` adjacent slices (a power of two), as many as keep at
        least ``ITEMS`` items a program a pass for the rows queued (each item costs waits and
        atomics: many rows take fewer, longer items; a few rows keep the slices short, so
        that every program has work)."""
        _await_previous(PDL)
        queued = tl.load(ctl_ptr + 3)
        g = tl.full((), 1, tl.int32)
        if ITEMS > 0:
            enough = ITEMS * tl.num_programs(0)
            while (g < NS) & (queued * ((NS + 2 * g - 1) // (2 * g)) >= enough):
                g *= 2
        ns = (NS + g - 1) // g
        per_pass = queued * ns
        item = tl.atomic_add(ctl_ptr + 4, 1)
        while item < 9 * per_pass:
            p = item // per_pass
            q = (item % per_pass) // ns
            s = item % ns
            row = tl.load(ctl_ptr + 5 + rows + q).to(tl.int64)
            reg = cand32_ptr + row * REGION
            ready = tl.atomic_add(reg + _FB_READY, 0, sem="acquire")
            while ready < p:
                ready = tl.atomic_add(reg + _FB_READY, 0, sem="acquire")
            # a row past this pass already has nothing for it to do (_fallback_next), nor does
            # any later item wait on its count
            if ready == p:
                length = tl.load(lengths_ptr + row).to(tl.int32)
                if COUNT:
                    if (p == 0) & (s == 0):
                        tl.atomic_add(stats_ptr + 5, 1)
                base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
                # the row's aligned view (_fallback_step): its first key is key `mis` of the
                # view, whose slices of SLICE keys the items take, the last to the row's end
                mis = ((base.to(tl.int64) >> 2) & 3).to(tl.int32)
                lo = (s * g) * SLICE
                end = length + mis
                if lo < end:
                    hi = tl.where((s == ns - 1) | (end - lo <= g * SLICE), end, lo + g * SLICE)
                    _fallback_item(tl.multiple_of(base - mis, 16), out_ptr + row * stride_om, lo, hi, mis, length,
                                   reg, wpos_ptr + row, s, p, BLOCK, NS, NSP, BUF, BOFF, AHEAD, WB)
                # every thread's writes of this item before its count; the row's last item of
                # the pass (its count acquiring every other item's) finds the next digit once
                # for all of the next pass's items, then releases them: pass p + 1, or past
                # the passes with nothing to do (their items skip, counted here for them)
                tl.debug_barrier()
                if tl.atomic_add(reg + _FB_DONE, 1, sem="acq_rel") == (p + 1) * ns - 1:
                    nxt = _fallback_next(reg, p, BUF)
                    if (nxt == 7) & (p < 6):
                        tl.atomic_add(reg + _FB_DONE, (6 - p) * ns, sem="relaxed")
                    tl.debug_barrier()
                    tl.atomic_add(reg + _FB_READY, nxt - p, sem="release")
            item = tl.atomic_add(ctl_ptr + 4, 1)

    @triton.jit
    def _select_row(
        row, length, logits_ptr, starts_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr,
        stride_lm, stride_om, sample_min, hist_ptr, thr1_ptr,
        K: tl.constexpr,
        KP: tl.constexpr,
        W: tl.constexpr,
        WCAP: tl.constexpr,
        STW: tl.constexpr,
        WHOLE: tl.constexpr,
        CH: tl.constexpr,
        BLOCK: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        FIRST: tl.constexpr,
        PLAIN: tl.constexpr,
        STATS: tl.constexpr,
        WB: tl.constexpr,
        PSPLIT: tl.constexpr,
        SEED: tl.constexpr = False,
        SBUF: tl.constexpr = 0,
        SEEDSTAT: tl.constexpr = False,
        SPLIT: tl.constexpr = False,
        SNAP: tl.constexpr = False,
    ):
        """The top k of one row (its candidates filtered already, if it is longer than
        ``WHOLE``) with a tile of ``STW`` slots a list. A first launch (``FIRST``) queues
        (:func:`_defer`) the rows whose lists do not fit the tile, for a later one with a
        tile as large as the lists; without ``PLAIN`` it leaves the fallback path's rows and
        rows tied at the k-th key to that launch too (for the fused filter kernel's
        registers). ``PSPLIT > 0`` (a first launch of one program a row only): fallback rows of
        at least ``PSPLIT`` keys are queued for :func:`fallback_kernel` instead; with ``SEED``,
        those whose lists overflowed start from the filter's histogram (:func:`_fallback_seed`,
        the first threshold at ``thr1``, a buffer of ``SBUF`` keys; ``SEEDSTAT``: counted in
        ``stats[6]``). ``SPLIT``: the rows were split across filter programs (``W`` 1): the
        list's slots taken at ``cnt[2 * row]``, empty ones (column -1) among them, and its
        keys at ``cnt[2 * row + 1]``."""
        base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
        obase = out_ptr + row * stride_om
        CAP: tl.constexpr = W * WCAP
        T: tl.constexpr = W * STW
        idx = tl.arange(0, T)
        if length <= K:
            _write_short(obase, length, stats_ptr, K, KP, STATS)
        else:
            whole = length <= WHOLE
            # 0: select on the tile, 1: fallback path, 2: a later launch
            path = tl.full((), 0, tl.int32)
            longest = tl.full((), 0, tl.int32)
            if whole:
                keys = tl.where(idx < length, _skey(tl.load(base + idx, mask=idx < length, other=0.0)), -2147483648)
                lo = tl.min(tl.where(idx < length, keys, 2147483647), axis=0)
                total = length
            else:
                lo = tl.load(thr_ptr + row)
                if SPLIT:
                    longest = tl.load(cnt_ptr + 2 * row)
                    total = tl.load(cnt_ptr + 2 * row + 1)
                else:
                    cnt = tl.load(cnt_ptr + row * W + tl.arange(0, W))
                    longest = tl.max(cnt, axis=0)
                    total = tl.sum(cnt, axis=0)
                path = ((length < sample_min) | (total < K) | (longest > WCAP)).to(tl.int32)
                if SPLIT:
                    # an empty slot's key (-inf's) lies below every listed key unless the
                    # threshold is that low (a row of fewer than about k keys above -inf):
                    # such a row takes the fallback path, which reads the row itself, so the
                    # tile's counts and writes below never meet an empty slot
                    path = tl.where(lo <= _HOLE_KEY, 1, path)
                path = tl.where((path == 0) & (longest > STW), 2, path)
                if SPLIT:
                    valid = idx < tl.where(path == 0, longest, 0)
                else:
                    valid = idx % STW < tl.where(path == 0, tl.load(cnt_ptr + row * W + idx // STW), 0)
                v = tl.load(_slot(cand32_ptr, row, idx, CAP, WCAP, STW), mask=valid, other=0)
                keys = tl.where(valid, _skey(v.to(tl.float32, bitcast=True)), -2147483648)
            if FIRST:
                if (path == 2) | ((path == 1) & (not PLAIN)):
                    _defer(ctl_ptr, row)
            if path == 0:
                # every key of the tile is at or above lo (the row's least, or the filter's
                # threshold): `total` of them
                kth = kth_key(keys, K, lo, total, tl.max(keys, axis=0), _BISECT_AFTER, _SPAN, SNAP)
                gt = keys > kth
                eq = keys == kth
                need = K - tl.sum(gt.to(tl.int32), axis=0)
                ties = tl.sum(eq.to(tl.int32), axis=0)
                tied = ties > need
                go = True
                if not PLAIN:
                    # ties at the k-th key (rare) wait for the later launch too: the column
                    # search's registers would count against the fused filter kernel
                    go = ties <= need
                    if tied:
                        _defer(ctl_ptr, row)
                if go:
                    colth = tl.full((), 2147483647, tl.int32)
                    sel = gt | eq
                    if tied:
                        # ties at the k-th key: the `need` lowest columns, found by the same
                        # search on -column - 1
                        if whole:
                            col = idx
                        else:
                            col = tl.load(_slot(cand32_ptr, row, idx, CAP, WCAP, STW) + 1, mask=eq, other=0)
                        colth = -_search(tl.where(eq, -col - 1, -2147483648), need, -length, -1, need, 0) - 1
                        sel = gt | (eq & (col <= colth))
                    if CH >= T:
                        # the write from the tile in registers: one scan (or ballot), and the
                        # columns of the selected slots only
                        if whole:
                            ci = idx
                        else:
                            ci = tl.load(_slot(cand32_ptr, row, idx, CAP, WCAP, STW) + 1, mask=sel, other=0)
                        _write_out(obase, sel, ci, wpos_ptr + row, 0, WB)
                    else:
                        # the write re-reads the candidates a chunk at a time, so that the key
                        # tile is the only large value held in registers (more rows in flight per SM)
                        taken = tl.full((), 0, tl.int32)
                        for c0 in range(0, T, CH):
                            i = c0 + tl.arange(0, CH)
                            if whole:
                                m = i < length
                                key = _skey(tl.load(base + i, mask=m, other=0.0))
                                ci = i
                            else:
                                if SPLIT:
                                    m = i < tl.load(cnt_ptr + 2 * row)
                                else:
                                    m = i % STW < tl.load(cnt_ptr + row * W + i // STW)
                                bits, ci = _slot_both(cand32_ptr, row, i, m, CAP, WCAP, STW)
                                key = _skey(bits.to(tl.float32, bitcast=True))
                            take = m & ((key > kth) | ((key == kth) & (ci <= colth)))
                            taken = _write_out(obase, take, ci, wpos_ptr + row, taken, WB)
                    if STATS:
                        tl.atomic_add(stats_ptr + tl.where(whole, 3, 1), 1)
            elif path == 1:
                if PLAIN:
                    split = False
                    if PSPLIT > 0:
                        split = length >= PSPLIT
                    if split:
                        prefix = tl.full((), 0, tl.int32)
                        pmask = tl.full((), 0, tl.int32)
                        need = tl.full((), K, tl.int32)
                        filled = tl.full((), 0, tl.int32)
                        if SEED:
                            if (length >= sample_min) & (longest > WCAP):
                                prefix, pmask, need, filled, seeded = _fallback_seed(
                                    row, cand32_ptr, cnt_ptr, hist_ptr, tl.load(thr1_ptr + row), K, W, WCAP, SBUF,
                                    SPLIT)
                                if SEEDSTAT:
                                    tl.atomic_add(stats_ptr + 6, seeded.to(tl.int32))
                        _queue_fallback(row, cand32_ptr, ctl_ptr, prefix, pmask, need, filled, 2 * CAP)
                    else:
                        kth, need = _kth_largest(base, length, K, BLOCK, RADIX_BITS, R)
                        _emit(base, length, kth, need, obase, BLOCK)
                    if STATS:
                        tl.atomic_add(stats_ptr + 2, 1)

    @triton.jit
    def select_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr,
        stride_lm, stride_om, sample_min, hist_ptr, thr1_ptr,
        K: tl.constexpr,
        KP: tl.constexpr,
        W: tl.constexpr,
        WCAP: tl.constexpr,
        STW: tl.constexpr,
        WHOLE: tl.constexpr,
        CH: tl.constexpr,
        BLOCK: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        FIRST: tl.constexpr,
        STATS: tl.constexpr,
        WB: tl.constexpr,
        PSPLIT: tl.constexpr,
        SEED: tl.constexpr = False,
        SBUF: tl.constexpr = 0,
        SEEDSTAT: tl.constexpr = False,
        SPLIT: tl.constexpr = False,
        PDL: tl.constexpr = False,
        SNAP: tl.constexpr = False,
    ):
        """``FIRST``: one row a program, every row. Otherwise the rows a first launch queued
        (``ctl[1]`` of them at ``ctl[5:]``): program ``p`` takes entry ``p``, then pulls
        more from the counter ``ctl[2]`` (zeroed by the caller); with an empty queue every
        program leaves after one load. ``SPLIT``: the rows were split across filter programs
        (:func:`_select_row`)."""
        _await_previous(PDL)
        pid = tl.program_id(0)
        # two call sites: the first launch as a one-row loop took 31 more registers (ptxas, sm_90a)
        if FIRST:
            _select_row(pid.to(tl.int64), tl.load(lengths_ptr + pid).to(tl.int32), logits_ptr, starts_ptr, out_ptr,
                        cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min,
                        hist_ptr, thr1_ptr, K, KP, W, WCAP, STW, WHOLE, CH, BLOCK, RADIX_BITS, R, True, True, STATS, WB,
                        PSPLIT, SEED, SBUF, SEEDSTAT, SPLIT, SNAP)
        else:
            queued = tl.load(ctl_ptr + 1)
            i = pid
            while i < queued:
                row = tl.load(ctl_ptr + 5 + i).to(tl.int64)
                _select_row(row, tl.load(lengths_ptr + row).to(tl.int32), logits_ptr, starts_ptr, out_ptr, cand32_ptr,
                            cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min, hist_ptr,
                            thr1_ptr, K, KP, W, WCAP, STW, WHOLE, CH, BLOCK, RADIX_BITS, R, False, True, STATS, WB, 0,
                            False, 0, False, SPLIT, SNAP)
                i = tl.num_programs(0) + tl.atomic_add(ctl_ptr + 2, 1)


    @triton.jit
    def row_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr, wpos_ptr, stats_ptr, stride_lm, stride_om,
        K: tl.constexpr,
        KP: tl.constexpr,
        T: tl.constexpr,
        NP: tl.constexpr,
        PIECE: tl.constexpr,
        SPARSE: tl.constexpr,
        SIGMAS: tl.constexpr,
        SLACK: tl.constexpr,
        CH: tl.constexpr,
        WB: tl.constexpr,
        STATS: tl.constexpr,
        PDL: tl.constexpr = False,
        TIE_BIT: tl.constexpr = 0,
    ):
        """The top k of row ``program_id`` (at most ``T`` keys) in one program, with no
        scratch but the row's write counter ``wpos[row]`` (zeroed here). The row's keys are
        loaded once into registers. A sample of the row (runs of ``PIECE`` keys, one key in
        ``SPARSE``, at most ``NP`` runs, as the sample kernel's) gives two keys, ``SIGMAS``
        standard deviations (and at least a run) deeper and shallower than the sample's share
        of the top k (the deep one's search ends once at most ``(1 + SLACK)`` times its rank
        reach it); both are counted on the whole row, and :func:`kth_between` searches the
        bracket they make. An end the counts refute is replaced by the row's least or largest
        key, so a sample that misses costs counts, never the result; where the shallow key
        already has k keys at or above it, one more count tells whether it is the k-th key
        itself (a tie: equal values, a flat row, zeros). Ties at the k-th key go to the lowest
        columns (a scan of the tied keys); the indices are written by warp ballots (``WB``)
        or at a scan's positions. Counted in ``stats[3]`` (rows selected whole)."""
        _await_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        length = tl.load(lengths_ptr + row).to(tl.int32)
        obase = out_ptr + row * stride_om
        if length <= K:
            _write_short(obase, length, stats_ptr, K, KP, STATS)
        else:
            if WB:
                # the ballot write's slot counter; the reductions below put barriers between
                # this store and the write's atomics
                tl.store(wpos_ptr + row, 0)
            base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
            idx = tl.arange(0, T)
            inside = idx < length
            # the row's loads first: the sample's search runs while they are in flight
            v = tl.load(base + idx, mask=inside, other=0.0)
            keys = tl.where(inside, _skey(v), -2147483648)
            si = tl.arange(0, NP * PIECE)
            sidx, smask, s, spread = _row_sample(length, si // PIECE, si % PIECE, NP, PIECE, SPARSE, False)
            skeys = _sample_keys(base, sidx, smask)
            mu = K * s.to(tl.float32) / length.to(tl.float32)
            deep = _run_rank(K, s, length, SIGMAS, PIECE)
            shallow = tl.maximum((mu - tl.maximum(SIGMAS * tl.sqrt(mu), PIECE)).to(tl.int32), 1)
            stop = (SLACK * deep.to(tl.float32)).to(tl.int32)
            x_lo, _ = _search_tie(skeys, deep, -2147483648, 2147483647, deep + stop, 0, TIE_BIT)
            # (the shallow rank's key is at or above the deep one's, so x_lo bounds it below)
            x_hi, _ = _search_tie(skeys, shallow, x_lo, 2147483647, shallow, 0, TIE_BIT)
            c_lo = tl.sum((keys >= x_lo).to(tl.int32), axis=0)
            c_hi = tl.sum((keys >= x_hi).to(tl.int32), axis=0)
            # the bracket [a, b): count(a) >= K > count(b); empty slots (-2**31) lie below
            # every key, so all T slots are at or above it
            a = tl.where(c_lo >= K, x_lo, -2147483648)
            ca = tl.where(c_lo >= K, c_lo, T)
            b = x_hi.to(tl.int64)
            cb = c_hi
            if c_hi >= K:
                # the k-th key is at or above the sample's shallow key: that key itself where
                # the keys above it are too few (a tie there: equal keys, a flat row, zeros)
                c_next = tl.sum((keys > x_hi).to(tl.int32), axis=0)
                a = x_hi
                ca = c_hi
                b = x_hi.to(tl.int64) + 1
                cb = c_next
                if c_next >= K:
                    a = x_hi + 1
                    ca = c_next
                    b = tl.max(keys, axis=0).to(tl.int64) + 1
                    cb = tl.full((), 0, tl.int32)
            kth, at_kth, above_kth = kth_between(keys, K, a, ca, b, cb, _BISECT_AFTER, _SPAN, True)
            # the write re-reads the row (from cache) a chunk at a time: the key tile and its
            # columns held to the end took a program's registers past two programs an SM
            need = tl.where(at_kth == K, T, K - above_kth)  # tied keys taken, lowest columns first
            tied = tl.full((), 0, tl.int32)
            taken = tl.full((), 0, tl.int32)
            for c0 in range(0, T, CH):
                i = c0 + tl.arange(0, CH)
                m = i < length
                key = tl.where(m, _skey(tl.load(base + i, mask=m, other=0.0)), -2147483648)
                eq = key == kth
                take = (key > kth) | (eq & (tied + tl.cumsum(eq.to(tl.int32), axis=0) <= need))
                tied += tl.sum(eq.to(tl.int32), axis=0)
                taken = _write_out(obase, take, i, wpos_ptr + row, taken, WB)
            if STATS:
                tl.atomic_add(stats_ptr + 3, 1)


    SAMPLE_LAUNCHER = Launcher(sample_kernel)
    ROW_LAUNCHER = Launcher(row_kernel)
    FILTER_LAUNCHER = Launcher(filter_kernel)
    SELECT_LAUNCHER = Launcher(select_kernel)
    FALLBACK_LAUNCHER = Launcher(fallback_kernel)
else:
    SAMPLE_LAUNCHER = FILTER_LAUNCHER = SELECT_LAUNCHER = FALLBACK_LAUNCHER = ROW_LAUNCHER = None
