"""Triton per-row ragged top-k: sampled threshold, a filtering pass, selection on a tile.

For each row it reads only the row's own window ``[start, start + length)`` of a (possibly
row-padded, non-contiguous) float32 logits block and writes the ``k`` row-relative indices
of its largest values, ``-1`` padded, unordered. Every value maps to an order-preserving
32-bit key (NaNs above everything, ``-0.0`` equal to ``0.0``); selection counts keys, it
never sorts. Three or four kernels (docs/topk.md walks through them with measurements):

*Sample* (``presample=True``: the sm90 default, and always for split rows and for rows
longer than the filter's own sample covers; one program a row). Runs of ``piece``
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
to the row's one list by an atomic counter (:func:`_shared_append`); such rows retry in a
launch of their own that appends only the keys between the two thresholds.

*Select* (one program per row). The candidates (or the whole row, when it fits the tile)
sit in registers; the k-th key is found by regula falsi on counts (``count(key >= x) >=
k``, :func:`_kth_key`), each step one compare per key and one block reduction, between the
threshold and the largest candidate, ending once exactly k keys reach the bound or the
bound is the k-th key itself. Ties at the k-th key go to the lowest columns (a bit search,
:func:`_search`, on the columns of the tied keys), the rule of the torch path, so both
select the same set. The selected indices are written at a scan's positions, or
(``ballot_write=True``, NVIDIA, the sm90 default) at slots a warp ballot and one atomic add
a warp on a per-row counter give. A row whose lists overflow the first tile is queued for a
second launch with a tile as large as the lists (``SECOND_PROGRAMS_PER_SM`` programs an SM
pulling rows from the queue: a launch with an empty queue costs a load a program).
(``fused=True`` runs the first select inside the filter kernel instead, leaving ties at the
k-th key and the plain road to the second launch; on an H200 it measured slower.)

Rows the sampled road cannot serve (still too few candidates after the retry, or more than
the lists hold: a sample that misses a stretch of large keys) take the plain road: a radix
select over the whole row by one program, ``radix_bits`` a pass, and an ordered write. Every
road is exact. Triton is imported lazily; :func:`~.launch.is_available` reports whether
it is there.
"""

from __future__ import annotations

import functools
import numbers

import torch

from ... import envs as _envs
from .launch import device_guard
from .launch import At, Launcher, LaunchKw

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported by launch.is_available
    triton = None
    tl = None

#: Shape of the sampled road (see the module docstring): runs of ``PIECE`` keys (64 bytes, a
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
#: through the first threshold), whichever road then served them.
STAT_SHORT, STAT_SAMPLED, STAT_PLAIN, STAT_DIRECT, STAT_RETRIED = 0, 1, 2, 3, 4

def _ballot_ranks_ptx(first: int, threshold: int | None = None, cols: int | None = None) -> str:
    """PTX shared by the ballot helpers: from the four flags ``$first .. $first + 3`` (nonzero:
    selected; four registers of each lane), ``q0``-``q3`` each selected element's rank among
    its warp's (lower lanes first, register by register) and ``t`` the warp's count. Declares
    ``q0``-``q3``, ``t`` and the predicates ``p0``-``p3`` (selected) for the code after it.
    With ``threshold``, the four operands from ``$first`` are float32 keys instead, selected
    where not below ``$threshold`` (``~(v < t)``: NaNs too, as the Triton compare). With
    ``cols`` too, a key equal to the threshold is selected only where its column (``$cols
    ..``) is at most ``$(threshold + 8)`` (the column cut of a tied threshold)."""
    if threshold is None:
        sets = "".join(f"setp.ne.s32 p{j}, ${first + j}, 0;\n" for j in range(4))
    else:
        sets = "".join(f"setp.geu.f32 p{j}, ${first + j}, ${threshold};\n" for j in range(4))
    if cols is not None:
        # g: equal to the threshold and past its column cut
        sets += ".reg .pred g0, g1, g2, g3;\n" + "".join(
            f"setp.gt.s32 g{j}, ${cols + j}, ${threshold + 8};\nsetp.eq.and.f32 g{j}, ${first + j}, ${threshold}, "
            f"g{j};\nnot.pred g{j}, g{j};\nand.pred p{j}, p{j}, g{j};\n" for j in range(4))
    votes = "".join(f"vote.sync.ballot.b32 b{j}, p{j}, 0xffffffff;\n" for j in range(4))
    ranks = "".join(f"and.b32 q{j}, b{j}, lt;\npopc.b32 q{j}, q{j};\n" for j in range(4))
    counts = "".join(f"popc.b32 b{j}, b{j};\n" for j in range(4))
    return (".reg .pred p0, p1, p2, p3;\n.reg .b32 b0, b1, b2, b3, lt, q0, q1, q2, q3, t;\n" + sets + votes
            + "mov.u32 lt, %lanemask_lt;\n" + ranks + counts
            + "add.u32 q1, q1, b0;\nadd.u32 t, b0, b1;\nadd.u32 q2, q2, t;\nadd.u32 t, t, b2;\n"
            "add.u32 q3, q3, t;\nadd.u32 t, t, b3;\n")


#: :func:`_warp_ranks`'s PTX: the ranks to ``$0``-``$3``, the warp's count to ``$4``-``$7``.
_WARP_RANKS_PTX = ("{\n" + _ballot_ranks_ptx(8) + "".join(f"mov.u32 ${j}, q{j};\n" for j in range(4))
                   + "".join(f"mov.u32 ${4 + j}, t;\n" for j in range(4)) + "}\n")
#: :func:`_warp_store`'s PTX: one lane takes the warp's slots from the counter ``[$12]``, then
#: each selected element stores its value (``$8``-``$11``) at ``$16 + 4 * slot``.
_WARP_STORE_PTX = ("{\n" + _ballot_ranks_ptx(4)
                   + ".reg .pred pl;\n.reg .b32 base, lane;\n.reg .b64 a;\n"
                   "mov.u32 lane, %laneid;\nsetp.eq.u32 pl, lane, 0;\nsetp.ne.and.u32 pl, t, 0, pl;\n"
                   "mov.u32 base, 0;\n@pl atom.global.add.u32 base, [$12], t;\n"
                   "shfl.sync.idx.b32 base, base, 0, 0x1f, 0xffffffff;\n"
                   + "".join(f"add.u32 q{j}, q{j}, base;\nmul.wide.u32 a, q{j}, 4;\nadd.s64 a, a, $16;\n"
                             f"@p{j} st.global.b32 [a], ${8 + j};\n" for j in range(4))
                   + "".join(f"mov.u32 ${j}, 0;\n" for j in range(4)) + "}\n")


def _warp_append_ptx(cut: bool) -> str:
    """:func:`_warp_append`'s PTX: keys ``$4``-``$7`` not below ``$20`` (and, with ``cut``,
    not equal to it past the column cut ``$28``) go, with their columns ``$8``-``$11``, to
    the warp's list ``$16`` at ``$12`` (its length) plus their rank, while below ``$24`` (its
    room); the new length to ``$0``-``$3``. The outputs are written last: the compiler may
    give an output an input's register (``$1`` was ``$12``'s, so a version writing them one
    by one from ``$12`` stored every list's length wrong)."""
    return ("{\n" + _ballot_ranks_ptx(4, threshold=20, cols=8 if cut else None)
            + ".reg .pred s;\n.reg .b64 a;\n"
            + "".join(f"add.s32 q{j}, q{j}, $12;\nsetp.lt.and.s32 s, q{j}, $24, p{j};\n"
                      f"mad.wide.s32 a, q{j}, 8, $16;\n@s st.global.v2.b32 [a], {{${4 + j}, ${8 + j}}};\n"
                      for j in range(4))
            # (last, after every read of an input: an output may share an input's register)
            + "add.s32 t, t, $12;\n" + "".join(f"mov.u32 ${j}, t;\n" for j in range(4)) + "}\n")


def _shared_append_ptx(cut: bool) -> str:
    """:func:`_shared_append`'s PTX: the selected keys of ``$4``-``$7`` (as
    :func:`_warp_append_ptx`), with their columns ``$8``-``$11``, go to the row's one list
    ``$16`` at slots taken from its counter ``[$12]`` by one atomic add a warp (lane 0's,
    shuffled to the others), while below ``$24``; the counter counts on past the room. The
    outputs are placeholders."""
    return ("{\n" + _ballot_ranks_ptx(4, threshold=20, cols=8 if cut else None)
            + ".reg .pred pl, s;\n.reg .b32 base, lane;\n.reg .b64 a;\n"
            "mov.u32 lane, %laneid;\nsetp.eq.u32 pl, lane, 0;\nsetp.ne.and.u32 pl, t, 0, pl;\n"
            "mov.u32 base, 0;\n@pl atom.global.add.u32 base, [$12], t;\n"
            "shfl.sync.idx.b32 base, base, 0, 0x1f, 0xffffffff;\n"
            + "".join(f"add.s32 q{j}, q{j}, base;\nsetp.lt.and.s32 s, q{j}, $24, p{j};\n"
                      f"mad.wide.s32 a, q{j}, 8, $16;\n@s st.global.v2.b32 [a], {{${4 + j}, ${8 + j}}};\n"
                      for j in range(4))
            + "".join(f"mov.u32 ${j}, 0;\n" for j in range(4)) + "}\n")


if triton is not None:
    # (a jit function reads module globals only as constexprs)
    _WARP_RANKS_ASM = tl.constexpr(_WARP_RANKS_PTX)
    _WARP_STORE_ASM = tl.constexpr(_WARP_STORE_PTX)
    _WARP_APPEND_ASM = tl.constexpr(_warp_append_ptx(False))
    _WARP_APPEND_CUT_ASM = tl.constexpr(_warp_append_ptx(True))
    _SHARED_APPEND_ASM = tl.constexpr(_shared_append_ptx(False))
    _SHARED_APPEND_CUT_ASM = tl.constexpr(_shared_append_ptx(True))
    _BISECT_AFTER = tl.constexpr(SEARCH_BISECT_AFTER)
    _SPAN = tl.constexpr(SEARCH_SPAN)

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
    def _warp_append(v, c, t, tcol, length, lists, room, CUT: tl.constexpr):
        """The filtering pass's step on NVIDIA (inline PTX): each key of ``v`` (float32 bits,
        columns ``c``) not below ``t`` (and, with ``CUT``, not equal to it at a column past
        ``tcol``, a scalar) goes to its warp's list at ``lists`` (int64 slots: value bits low, column
        high), after the ``length`` (each element: its warp's list length) already there,
        while the slot is below ``room``; returns the new length. The compare, ranks, 8-byte
        store and count are one block of PTX: Triton's code for the same unmasked step took
        9 (4 warps) to 13 (8 warps) more SASS instructions a block under a 32-register cap
        (64-bit packing and addressing) and, at 8 warps, spilled in the loop (Triton 3.6,
        sm_90a). Four elements a thread (one rank a register, as :func:`_warp_ranks`)."""
        # (a constexpr string must reach the asm call as it is, not through a local; without
        # the cut, no column operands: under the filter's 32-register cap they would spill)
        if CUT:
            return tl.inline_asm_elementwise(
                _WARP_APPEND_CUT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r",
                [v, c, length, lists, t, room, tcol + tl.zeros(v.shape, tl.int32)], dtype=tl.int32, is_pure=False,
                pack=4)
        else:
            return tl.inline_asm_elementwise(
                _WARP_APPEND_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,l,l,l,l,r,r,r,r,r,r,r,r",
                [v, c, length, lists, t, room], dtype=tl.int32, is_pure=False, pack=4)

    @triton.jit
    def _shared_append(v, c, t, tcol, ctr, lists, room, CUT: tl.constexpr):
        """:func:`_warp_append` into one list a row shared by several programs (a long row
        split into slices): slots from the row's counter ``ctr`` (one atomic add a warp with
        keys to place), in no particular order. NVIDIA only (inline PTX)."""
        if CUT:
            return tl.inline_asm_elementwise(
                _SHARED_APPEND_CUT_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r",
                [v, c, ctr, lists, t, room, tcol + tl.zeros(v.shape, tl.int32)], dtype=tl.int32, is_pure=False,
                pack=4)
        else:
            return tl.inline_asm_elementwise(
                _SHARED_APPEND_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,l,l,l,l,l,l,l,l,r,r,r,r,r,r,r,r",
                [v, c, ctr, lists, t, room], dtype=tl.int32, is_pure=False, pack=4)

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
    def _search(keys, need, lo, hi, stop, LOW_BIT: tl.constexpr):
        """A key ``x`` with at least ``need`` of ``keys`` (int32 [T], empty slots ``-2**31``)
        at or above it, given ``lo <= x <= hi``: bit by bit, most significant first, on the
        keys' unsigned form, one count a bit where ``lo`` and ``hi`` differ. The search ends
        early, its lower bits 0, once at most ``stop`` (>= ``need``) keys are at or above
        ``x``; otherwise ``x`` is the largest such key but for the bits below ``LOW_BIT``,
        left 0. Either way ``x`` is a lower bound of the ``need``-th largest key; with
        ``stop == need`` an early end means exactly ``need`` keys are ``>= x``, the same set
        as the ``need`` largest, so the callers' selection by ``x`` stays exact."""
        lo_u = lo ^ -2147483648
        diff = lo_u ^ (hi ^ -2147483648)
        a = tl.full((), 0, tl.int32)
        one = tl.full((), 1, tl.int32)
        above = tl.full((), 2147483647, tl.int32)  # keys >= a, once a count has told
        b = tl.full((), 31, tl.int32)
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
        return a ^ -2147483648

    @triton.jit
    def _kth_key(keys, need, lo, count_lo, hi, BISECT_AFTER: tl.constexpr, SPAN: tl.constexpr):
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
        exponential floats 11.4 / 10.5 / 9.1 against 13.6 / 14.6 / 17.9."""
        a = lo.to(tl.int64)  # count(keys >= a) = ca >= need
        b = hi.to(tl.int64) + 1  # count(keys >= b) = cb < need
        ca = count_lo
        cb = tl.full((), 0, tl.int32)
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
            a = tl.where(up, p, a)
            ca = tl.where(up, c, ca)
            b = tl.where(up, b, p)
            cb = tl.where(up, cb, c)
            wb = tl.where(up & (side == 1), wb * 0.5, 1.0)
            wa = tl.where(~up & (side == -1), wa * 0.5, 1.0)
            side = tl.where(up, 1, -1)
            steps += 1
        return a.to(tl.int32)

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
    def _sample_cut(skeys, scols, rank, length, spread, SLACK: tl.constexpr, LOW_BIT: tl.constexpr):
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
        ``scols``: the sampled keys' columns (int32, row-relative)."""
        stop = rank + (rank.to(tl.float32) * SLACK).to(tl.int32)
        x = _search(skeys, rank, -2147483648, 2147483647, stop, LOW_BIT)
        tcol = tl.full((), 2147483647, tl.int32)
        if tl.sum((skeys >= x).to(tl.int32), axis=0) > stop:
            # the search ran out of bits: the rank-th key exactly (it lies in x's last
            # LOW_BIT bits), then whether the sample ties there
            x = _search(skeys, rank, x, x | ((1 << LOW_BIT) - 1), rank, 0)
            if tl.sum((skeys >= x).to(tl.int32), axis=0) > rank:
                need = rank - tl.sum((skeys > x).to(tl.int32), axis=0)
                tcol = -_search(tl.where(skeys == x, -scols - 1, -2147483648), need, -length, -1, need, 0) - 1
                tcol = (tcol // spread + 1) * spread - 1
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
    def _kth_largest(ptr, n, need, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, R: tl.constexpr):
        """The plain road's select: key (:func:`_skey`) of the ``need``-th largest of
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
    def _emit(ptr, n, kth, need, obase, BLOCK: tl.constexpr):
        """The plain road's write: the columns of every key of ``ptr[0:n]`` above ``kth``
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
    def _prime_ahead(base, off, length, STEP: tl.constexpr, DEPTH: tl.constexpr):
        # the first DEPTH blocks of a pass, in flight before it starts (the unused ones are
        # placeholders that the loop carries unchanged)
        a1 = tl.load(base + off, mask=off < length, other=float("-inf"))
        a2 = a1
        a3 = a1
        if DEPTH >= 2:
            a2 = tl.load(base + off + STEP, mask=off + STEP < length, other=float("-inf"))
        if DEPTH >= 3:
            a3 = tl.load(base + off + 2 * STEP, mask=off + 2 * STEP < length, other=float("-inf"))
        return a1, a2, a3

    @triton.jit
    def _shift_ahead(base, c, length, a1, a2, a3, STEP: tl.constexpr, DEPTH: tl.constexpr, MASKED: tl.constexpr):
        # the block at c (loaded DEPTH steps ago) and the blocks still in flight, the newest
        # being the load of the block DEPTH steps past c (unmasked where the caller knows it
        # whole: no bound check and no fill value a key)
        nxt = c + DEPTH * STEP
        if MASKED:
            new = tl.load(base + nxt, mask=nxt < length, other=float("-inf"))
        else:
            new = tl.load(base + nxt)
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
    def _filter_block(v, c, hi, tf, tcol, lists, acc, ctr, WCAP: tl.constexpr, BALLOT: tl.constexpr,
                      MASKED: tl.constexpr, SHARED: tl.constexpr, CUT: tl.constexpr):
        """One block of a filtering pass: its keys ``v`` (columns ``c``) at or above ``tf``
        (a threshold key's float; with ``CUT``, those equal to it only at columns up to
        ``tcol``) appended to their list after the ``acc`` already there; returns the new
        ``acc``. ``BALLOT``: 1-D block, ``acc`` each element's warp's list length; else
        ``[W, BW]`` block, ``acc`` the ``[W]`` lengths. ``SHARED``: one list a row at
        ``lists`` for every program of the row, slots from the counter ``ctr`` (``acc``
        unused). Without ``MASKED`` every column is below ``hi``."""
        if BALLOT and not MASKED:
            # (floats travel as their bits: the PTX compares them as f32)
            vb = v.to(tl.int32, bitcast=True)
            tb = (tf + tl.zeros(v.shape, tl.float32)).to(tl.int32, bitcast=True)
            room = tl.full(v.shape, WCAP, tl.int32)
            if SHARED:
                _shared_append(vb, c, tb, tcol, ctr + tl.zeros(v.shape, tl.int32), lists, room, CUT)
                return acc
            else:
                return _warp_append(vb, c, tb, tcol, acc, lists, room, CUT)
        if CUT:
            sel = _at_or_above(v, c, tf, tcol)
        else:
            sel = ~(v < tf)
        if MASKED:
            sel = sel & (c < hi)
        s32 = sel.to(tl.int32)
        if SHARED:
            # slots in the row's list: one atomic add a block, positions by a scan
            if BALLOT:
                pos = tl.cumsum(s32, axis=0) - 1
                tot = tl.sum(s32, axis=0)
            else:
                rs = tl.sum(s32, axis=1)
                pos = (tl.cumsum(rs, axis=0) - rs)[:, None] + tl.cumsum(s32, axis=1) - 1
                tot = tl.sum(rs, axis=0)
            pos += tl.atomic_add(ctr, tot)
        elif BALLOT:
            rank, cnt = _warp_ranks(s32)
            pos = acc + rank
            acc += cnt
        else:
            pos = acc[:, None] + tl.cumsum(s32, axis=1) - 1
            acc += tl.sum(s32, axis=1)
        tl.store(lists + pos, _pack(c, v), mask=sel & (pos < WCAP))
        return acc

    @triton.jit
    def _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, W: tl.constexpr, BW: tl.constexpr, WCAP: tl.constexpr,
                     BALLOT: tl.constexpr, DEPTH: tl.constexpr, SHARED: tl.constexpr, CUT: tl.constexpr):
        """One pass over the columns ``[lo, hi)`` of a row: every key at or above the
        threshold ``(t, tcol)`` (:func:`_sample_cut`; ``tcol`` read only with ``CUT``) into a
        list, value bits in the low word, column in the high one. Per-warp lists (``cand + w
        * WCAP``, lengths to ``cnt_row[0:W]``, counting on past ``WCAP``: then the list
        overflowed; returns their sum) or, ``SHARED``, the row's one list at ``cand`` with
        its counter ``cnt_row`` (returns 0). ``DEPTH`` blocks of ``W * BW`` keys are in
        flight (1-3): each SM needs enough bytes on their way to cover the memory latency.
        The blocks whose loads all fall inside the range go unmasked (no bound checks or
        fill values: fewer instructions and registers a block); the last few take the
        masked loop."""
        STEP: tl.constexpr = W * BW
        tf = _key_float(t)
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
        ahead, ahead2, ahead3 = _prime_ahead(base, lo + off, hi, STEP, DEPTH)
        # blocks before `unmasked_end` are whole and so are those DEPTH past them
        unmasked_end = lo + ((hi - lo) // STEP - DEPTH) * STEP
        for c0 in range(lo, unmasked_end, STEP):
            c = c0 + off
            # the next blocks' loads go out before this block's stores
            v, ahead, ahead2, ahead3 = _shift_ahead(base, c, hi, ahead, ahead2, ahead3, STEP, DEPTH, False)
            acc = _filter_block(v, c, hi, tf, tcol, lists, acc, cnt_row, WCAP, BALLOT, False, SHARED, CUT)
        for c0 in range(tl.maximum(unmasked_end, lo), hi, STEP):
            c = c0 + off
            v, ahead, ahead2, ahead3 = _shift_ahead(base, c, hi, ahead, ahead2, ahead3, STEP, DEPTH, True)
            acc = _filter_block(v, c, hi, tf, tcol, lists, acc, cnt_row, WCAP, BALLOT, True, SHARED, CUT)
        total = tl.full((), 0, tl.int32)
        if not SHARED:
            tl.store(cnt_row + wid, acc)  # all of a warp's elements agree
            # the counts were written by other threads of this program; and every thread has
            # read them before any starts a retry's pass, which rewrites them
            tl.debug_barrier()
            total = tl.sum(tl.load(cnt_row + wr), axis=0)
            tl.debug_barrier()
        return total

    @triton.jit
    def _filter_range(base, lo, hi, cand, cnt_row, t, tcol, W: tl.constexpr, BW: tl.constexpr, WCAP: tl.constexpr,
                      BALLOT: tl.constexpr, DEPTH: tl.constexpr, SHARED: tl.constexpr):
        # the column cut costs instructions a key: only rows whose threshold has one pay them
        if tcol == 2147483647:
            total = _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, W, BW, WCAP, BALLOT, DEPTH, SHARED, False)
        else:
            total = _filter_pass(base, lo, hi, cand, cnt_row, t, tcol, W, BW, WCAP, BALLOT, DEPTH, SHARED, True)
        return total

    @triton.jit
    def _band_pass(base, lo, hi, cand, ctr, t_lo, tc_lo, t_hi, tc_hi, WCAP: tl.constexpr, BLOCK: tl.constexpr):
        """Columns ``[lo, hi)`` of a row: the keys at or above the threshold ``(t_lo, tc_lo)``
        and below ``(t_hi, tc_hi)`` appended to the row's one list ``cand`` (slots from its
        counter ``ctr``, counting on past ``WCAP``). The retry of a split row, rare: plain
        Triton, an atomic add a block with keys to place."""
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
                tl.store(cand + pos, _pack(c, v), mask=sel & (pos < WCAP))

    @triton.jit
    def _filter_kernel(
        logits_ptr, starts_ptr, lengths_ptr, cand_ptr, cand32_ptr, cnt_ptr, thr_ptr, tcol_ptr, thr2_ptr, out_ptr,
        ctl_ptr, wpos_ptr, stats_ptr, rows, stride_lm, stride_om, sample_min,
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
        DIRECT: tl.constexpr,
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
    ):
        """Rows longer than ``DIRECT`` (and at least ``sample_min``): the threshold
        ``(thr[row], tcol[row])`` (:func:`_sample_cut`) and the keys at or above it in lists
        of ``WCAP`` slots (value bits in the low word, column in the high one) within the
        row's ``CAP``. With ``SL == 1`` a program filters a whole row into ``W`` lists, one a
        warp, ``cnt[row, w]`` keys in list ``w`` (it counts on past ``WCAP``: then the list
        overflowed). With ``SL > 1`` a row is ``SL`` slices of whole blocks, each a program's
        (so that a few long rows still keep every SM streaming), all appending to the row's
        one list by the counter ``cnt[row]`` (zeroed by the sample kernel); the thresholds
        then come from the sample kernel and there is no retry here. ``FUSED`` (``SL == 1``):
        the same program then selects the row's top k (:func:`_select_row`, first launch),
        so that one program's counting steps overlap the other programs' streaming on the
        SM. ``DYNAMIC``: a program takes its next row (or slice) from the counter ``ctl[0]``
        (zeroed by the caller), so programs that run end together and programs the SM could
        not hold at once find no work left; otherwise ``pid, pid + nprog, ...``.
        ``PRESAMPLE``: the first threshold comes from :func:`_sample_kernel`, so that no
        program stops streaming for a sample's search; ``SECOND``: so does the rare retry's,
        deeper (at ``thr2``/``thr2 + rows``), where that kernel's sample is larger than this
        one's. A whole row's program retries itself; split rows retry in a
        second launch (``RETRY``, after the first has counted every row): where fewer than
        ``K`` keys passed, each slice appends the keys between the deeper threshold and the
        first (the keys above the first are in the list already)."""
        pid = tl.program_id(0)
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
            if _sampled_row(length, sample_min, DIRECT):
                base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
                cand = cand_ptr + row * CAP
                if SL == 1:
                    sidx, smask, s, spread = _row_sample(length, pp, pj, NP, PIECE, SPARSE)
                    if PRESAMPLE:
                        t = tl.load(thr_ptr + row)
                        tc = tl.load(tcol_ptr + row)
                    else:
                        t, tc = _sample_cut(_sample_keys(base, sidx, smask), sidx,
                                            _run_rank(K, s, length, SIGMAS, PIECE), length, spread, SLACK, LOW_BIT)
                    total = _filter_range(base, 0, length, cand, cnt_ptr + row * W, t, tc, W, BW, WCAP, BALLOT,
                                          DEPTH, False)
                    if total < K:
                        # too few keys passed (rare): once more, twice as many sigmas deep into
                        # the sample (read again, so that it is not held in registers through
                        # the pass)
                        if RETRIES:
                            tl.atomic_add(stats_ptr + 4, 1)
                        if SECOND:
                            t = tl.load(thr2_ptr + row)
                            tc = tl.load(thr2_ptr + rows + row)
                        else:
                            t, tc = _sample_cut(_sample_keys(base, sidx, smask), sidx,
                                                _run_rank(K, s, length, 2 * SIGMAS, 2 * PIECE), length, spread, SLACK,
                                                LOW_BIT)
                        total = _filter_range(base, 0, length, cand, cnt_ptr + row * W, t, tc, W, BW, WCAP, BALLOT,
                                              DEPTH, False)
                    tl.store(thr_ptr + row, t)
                else:
                    # slices of whole blocks, so that only a row's last block is masked
                    per = (length + SL * STEP - 1) // (SL * STEP) * STEP
                    lo = (unit % SL) * per
                    hi = tl.minimum(lo + per, length)
                    # cnt[rows + row]: the row's slices done; the last to finish marks a row
                    # that needs the retry (SL + 1), so that the retry launch decides on the
                    # first pass's count, which its own appends then change
                    done = cnt_ptr + rows + row
                    if RETRY:
                        if (lo < hi) & (tl.load(done) > SL):
                            _band_pass(base, lo, hi, cand, cnt_ptr + row, tl.load(thr2_ptr + row),
                                       tl.load(thr2_ptr + rows + row), tl.load(thr_ptr + row), tl.load(tcol_ptr + row),
                                       WCAP, STEP)
                    else:
                        if lo < hi:
                            _filter_range(base, lo, hi, cand, cnt_ptr + row, tl.load(thr_ptr + row),
                                          tl.load(tcol_ptr + row), W, BW, WCAP, BALLOT, DEPTH, True)
                        if tl.atomic_add(done, 1) == SL - 1:
                            if tl.atomic_add(cnt_ptr + row, 0) < K:
                                tl.store(done, SL + 1)
                                if RETRIES:
                                    tl.atomic_add(stats_ptr + 4, 1)
            if FUSED:
                # one thread stored the threshold; every thread of the select reads it
                tl.debug_barrier()
                _select_row(row, length, logits_ptr, starts_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr,
                            wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min, K, KP, W, WCAP, STW, DIRECT, CH,
                            BLOCK, RADIX_BITS, R, True, False, STATS, WB)
                # the next row's candidates and counts are other slots, but the tile's
                # scratch for reductions is shared: keep the rows apart
                tl.debug_barrier()
            if DYNAMIC:
                unit = tl.atomic_add(ctl_ptr, 1)
            else:
                unit += nprog

    @triton.jit
    def _sampled_row(length, sample_min, DIRECT: tl.constexpr):
        # whether a row is filtered (and so sampled): longer than the select tile that takes
        # it whole, and at least sample_min (shorter ones take the plain road)
        return (length > DIRECT) & (length >= sample_min)

    @triton.jit
    def _row_sample(length, pp, pj, NP: tl.constexpr, PIECE: tl.constexpr, SPARSE: tl.constexpr):
        """A row's sample: runs of ``PIECE`` keys (run ``pp``, key ``pj`` of it), one every
        ``SPARSE * PIECE`` keys and at most ``NP`` of them, spread evenly over its ``length``
        keys (the recent end no denser than the rest). Runs of a few sectors read little
        more than the keys they sample, and many runs leave no stretch of the row unseen (a
        ramp, a run of recent keys scoring high). Returns the sampled columns, their mask
        and count, and the spacing of the runs."""
        runs = tl.minimum(tl.maximum(length // (SPARSE * PIECE), 1), NP)
        spread = length // runs
        plen = tl.minimum(spread, PIECE)
        return pp * spread + pj, (pp < runs) & (pj < plen), runs * plen, spread

    @triton.jit
    def _sample_kernel(
        logits_ptr, starts_ptr, lengths_ptr, thr_ptr, tcol_ptr, thr2_ptr, cnt_ptr, wpos_ptr, ctl_ptr, rows, stride_lm,
        sample_min,
        K: tl.constexpr,
        NP: tl.constexpr,
        PIECE: tl.constexpr,
        SPARSE: tl.constexpr,
        SIGMAS: tl.constexpr,
        SLACK: tl.constexpr,
        LOW_BIT: tl.constexpr,
        DIRECT: tl.constexpr,
        SL: tl.constexpr,
        SECOND: tl.constexpr,
    ):
        """The filter kernel's threshold ``(thr[row], tcol[row])`` of row ``program_id`` (if
        it filters the row), at its sample's rank (:func:`_run_rank`, :func:`_sample_cut`),
        and with ``SECOND`` the retry's, twice as many sigmas deep, at ``(thr2[row],
        thr2[rows + row])`` (a looser search: any key near that rank serves).
        ``NP`` (runs at most) may exceed the filter's, so that long rows get a sample as large
        as ``SPARSE`` asks (up to a tile's worth), or be smaller where no row has more runs
        (:func:`_sample_runs`): the same sample, a smaller tile. It also zeroes the counters
        the later launches start from, the row's write counter ``wpos[row]``, with ``SL > 1``
        its list counter ``cnt[row]`` and slices-done counter ``cnt[rows + row]``, and
        (program 0) ``ctl[0:3]``, so that the call needs no fill launch before it."""
        row = tl.program_id(0).to(tl.int64)
        tl.store(wpos_ptr + row, 0)
        if SL > 1:
            tl.store(cnt_ptr + row, 0)  # the row's list
            tl.store(cnt_ptr + rows + row, 0)  # its slices done
        if row == 0:
            c = tl.arange(0, 4)
            tl.store(ctl_ptr + c, tl.zeros((4,), tl.int32), mask=c < 3)
        length = tl.load(lengths_ptr + row).to(tl.int32)
        if _sampled_row(length, sample_min, DIRECT):
            base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
            si = tl.arange(0, NP * PIECE)
            sidx, smask, s, spread = _row_sample(length, si // PIECE, si % PIECE, NP, PIECE, SPARSE)
            skeys = _sample_keys(base, sidx, smask)
            t, tc = _sample_cut(skeys, sidx, _run_rank(K, s, length, SIGMAS, PIECE), length, spread, SLACK, LOW_BIT)
            tl.store(thr_ptr + row, t)
            tl.store(tcol_ptr + row, tc)
            if SECOND:
                # the retry's, twice as many sigmas deep (a filter program's own sample of a
                # long row is too small to place it well: at 2M keys each of its keys stands
                # for 512), within half its rank and 16 low bits: most searches end early
                t2, tc2 = _sample_cut(skeys, sidx, _run_rank(K, s, length, 2 * SIGMAS, 2 * PIECE), length, spread,
                                      0.5, 16)
                # never above the first: the two searches stop at different slacks, and a split
                # row's select takes this one as the least of its candidates
                above = (t2 > t) | ((t2 == t) & (tc2 < tc))
                tl.store(thr2_ptr + row, tl.where(above, t, t2))
                tl.store(thr2_ptr + rows + row, tl.where(above, tc, tc2))

    @triton.jit
    def _defer(ctl_ptr, row):
        # queue a row for the second select launch: ctl[1] rows queued, at ctl[3:]
        tl.store(ctl_ptr + 3 + tl.atomic_add(ctl_ptr + 1, 1), row.to(tl.int32))

    @triton.jit
    def _select_row(
        row, length, logits_ptr, starts_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr,
        stride_lm, stride_om, sample_min,
        K: tl.constexpr,
        KP: tl.constexpr,
        W: tl.constexpr,
        WCAP: tl.constexpr,
        STW: tl.constexpr,
        DIRECT: tl.constexpr,
        CH: tl.constexpr,
        BLOCK: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        FIRST: tl.constexpr,
        PLAIN: tl.constexpr,
        STATS: tl.constexpr,
        WB: tl.constexpr,
    ):
        """The top k of one row (its candidates filtered already, if it is longer than
        ``DIRECT``) with a tile of ``STW`` slots a list. A first launch (``FIRST``) queues
        (:func:`_defer`) the rows whose lists do not fit the tile, for a later one with a
        tile as large as the lists; without ``PLAIN`` it leaves the plain road's rows and
        rows tied at the k-th key to that launch too (for the fused filter kernel's
        registers)."""
        base = logits_ptr + row * stride_lm + tl.load(starts_ptr + row).to(tl.int64)
        obase = out_ptr + row * stride_om
        CAP: tl.constexpr = W * WCAP
        T: tl.constexpr = W * STW
        idx = tl.arange(0, T)
        if length <= K:
            kk = tl.arange(0, KP)
            tl.store(obase + kk, tl.where(kk < length, kk, -1), mask=kk < K)
            if STATS:
                tl.atomic_add(stats_ptr + 0, 1)
        else:
            direct = length <= DIRECT
            # 0: select on the tile, 1: plain road, 2: a later launch
            road = tl.full((), 0, tl.int32)
            if direct:
                keys = tl.where(idx < length, _skey(tl.load(base + idx, mask=idx < length, other=0.0)), -2147483648)
                lo = tl.min(tl.where(idx < length, keys, 2147483647), axis=0)
                total = length
            else:
                cnt = tl.load(cnt_ptr + row * W + tl.arange(0, W))
                longest = tl.max(cnt, axis=0)
                total = tl.sum(cnt, axis=0)
                road = ((length < sample_min) | (total < K) | (longest > WCAP)).to(tl.int32)
                road = tl.where((road == 0) & (longest > STW), 2, road)
                valid = idx % STW < tl.where(road == 0, tl.load(cnt_ptr + row * W + idx // STW), 0)
                v = tl.load(_slot(cand32_ptr, row, idx, CAP, WCAP, STW), mask=valid, other=0)
                keys = tl.where(valid, _skey(v.to(tl.float32, bitcast=True)), -2147483648)
                lo = tl.load(thr_ptr + row)
            if FIRST:
                if (road == 2) | ((road == 1) & (not PLAIN)):
                    _defer(ctl_ptr, row)
            if road == 0:
                # every key of the tile is at or above lo (the row's least, or the filter's
                # threshold): `total` of them
                kth = _kth_key(keys, K, lo, total, tl.max(keys, axis=0), _BISECT_AFTER, _SPAN)
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
                        if direct:
                            col = idx
                        else:
                            col = tl.load(_slot(cand32_ptr, row, idx, CAP, WCAP, STW) + 1, mask=eq, other=0)
                        colth = -_search(tl.where(eq, -col - 1, -2147483648), need, -length, -1, need, 0) - 1
                        sel = gt | (eq & (col <= colth))
                    if CH >= T:
                        # the write from the tile in registers: one scan (or ballot), and the
                        # columns of the selected slots only
                        if direct:
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
                            if direct:
                                m = i < length
                                key = _skey(tl.load(base + i, mask=m, other=0.0))
                                ci = i
                            else:
                                m = i % STW < tl.load(cnt_ptr + row * W + i // STW)
                                bits, ci = _slot_both(cand32_ptr, row, i, m, CAP, WCAP, STW)
                                key = _skey(bits.to(tl.float32, bitcast=True))
                            take = m & ((key > kth) | ((key == kth) & (ci <= colth)))
                            taken = _write_out(obase, take, ci, wpos_ptr + row, taken, WB)
                    if STATS:
                        tl.atomic_add(stats_ptr + tl.where(direct, 3, 1), 1)
            elif road == 1:
                if PLAIN:
                    kth, need = _kth_largest(base, length, K, BLOCK, RADIX_BITS, R)
                    _emit(base, length, kth, need, obase, BLOCK)
                    if STATS:
                        tl.atomic_add(stats_ptr + 2, 1)

    @triton.jit
    def _select_kernel(
        logits_ptr, starts_ptr, lengths_ptr, out_ptr, cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr,
        stride_lm, stride_om, sample_min,
        K: tl.constexpr,
        KP: tl.constexpr,
        W: tl.constexpr,
        WCAP: tl.constexpr,
        STW: tl.constexpr,
        DIRECT: tl.constexpr,
        CH: tl.constexpr,
        BLOCK: tl.constexpr,
        RADIX_BITS: tl.constexpr,
        R: tl.constexpr,
        FIRST: tl.constexpr,
        STATS: tl.constexpr,
        WB: tl.constexpr,
    ):
        """``FIRST``: one row a program, every row. Otherwise the rows a first launch queued
        (``ctl[1]`` of them at ``ctl[3:]``): program ``p`` takes entry ``p``, then pulls
        more from the counter ``ctl[2]`` (zeroed by the caller); with an empty queue every
        program leaves after one load."""
        pid = tl.program_id(0)
        # two call sites: the first launch as a one-row loop took 31 more registers (ptxas, sm_90a)
        if FIRST:
            _select_row(pid.to(tl.int64), tl.load(lengths_ptr + pid).to(tl.int32), logits_ptr, starts_ptr, out_ptr,
                        cand32_ptr, cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min, K,
                        KP, W, WCAP, STW, DIRECT, CH, BLOCK, RADIX_BITS, R, True, True, STATS, WB)
        else:
            queued = tl.load(ctl_ptr + 1)
            i = pid
            while i < queued:
                row = tl.load(ctl_ptr + 3 + i).to(tl.int64)
                _select_row(row, tl.load(lengths_ptr + row).to(tl.int32), logits_ptr, starts_ptr, out_ptr, cand32_ptr,
                            cnt_ptr, thr_ptr, ctl_ptr, wpos_ptr, stats_ptr, stride_lm, stride_om, sample_min, K, KP, W,
                            WCAP, STW, DIRECT, CH, BLOCK, RADIX_BITS, R, False, True, STATS, WB)
                i = tl.num_programs(0) + tl.atomic_add(ctl_ptr + 2, 1)


    _SAMPLE, _FILTER, _SELECT = Launcher(_sample_kernel), Launcher(_filter_kernel), Launcher(_select_kernel)

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
    with tiles of ``cap`` (and, fused, the plain road's), unless the first tile holds them.
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


def _run_selects(device: torch.device, rows: int, selects: tuple, logits, starts, lengths, out, cand32, counts, thr,
                 ctl, wpos, stats, stride_lm: int, sample_min: int, direct: bool = False) -> None:
    # one program a row for the first launch, SECOND_PROGRAMS_PER_SM an SM pulling queued
    # rows for the second; wpos: a zeroed int32 write counter a row (a row is written by one
    # launch only)
    args = (logits, starts, lengths, out, cand32, counts, thr, ctl, wpos, stats, stride_lm, out.stride(0), sample_min)
    for first, kw in selects:
        _SELECT(_select_grid(device, rows, first), args, kw, device.index, direct)


def _select_grid(device: torch.device, rows: int, first: bool) -> int:
    return rows if first else _programs(device, rows, SECOND_PROGRAMS_PER_SM)


def ragged_topk(
    logits: torch.Tensor,
    starts_rel: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    out: torch.Tensor,
    block: int | None = None,
    *,
    filter_block: int | None = None,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
    select_warps: int | None = None,
    tile: int | None = None,
    ballot: bool | None = None,
    fused: bool | None = None,
    prefetch: int | None = None,
    tile_write: bool | None = None,
    filter_maxnreg: int | None = None,
    select_maxnreg: int | None = None,
    dynamic: bool | None = None,
    presample: bool | None = None,
    ballot_write: bool | None = None,
    radix_bits: int = RADIX_BITS,
    pieces: int | None = None,
    piece: int = PIECE,
    sparse: int = SPARSE,
    sigmas: float = SIGMAS,
    cap: int | None = None,
    sample_min: int = 0,
    sample_low_bit: int = 8,
    sample_slack: float = SAMPLE_SLACK,
    stats: torch.Tensor | None = None,
    direct_launch: bool | None = None,
    slices: int | None = None,
    sample_max: int = SAMPLE_MAX,
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
        block: Keys per step of the plain road's passes (a power of two). This and the
            other launch options left ``None`` come from :func:`launch_config`.
        filter_block: Keys per step of the filtering pass (a power of two, a multiple of
            ``num_warps``); ``128 * num_warps`` lets NVIDIA GPUs use the ballot.
        num_warps: Warps of the filter kernel, also its number of candidate lists.
        programs_per_sm: Filter programs per SM (its grid is persistent).
        select_warps: Warps of the select kernel's first launch.
        tile: Candidate slots of the select kernel's first launch (a power of two,
            ``num_warps`` to ``cap``; default ``2 * topk`` rounded up to a power of two);
            rows up to this long are selected on the row itself.
        ballot: Place candidates with the PTX ballot (default: where it can run).
        fused: Select each row in the filter kernel right after filtering it (with
            ``num_warps`` warps), instead of in a select launch of its own.
        prefetch: Blocks of ``filter_block`` keys each filter program has in flight (1-3).
        tile_write: The first select launch (fused or not) writes the indices from the key
            tile it holds in registers (one scan; more registers) instead of re-reading the
            candidates 1024 at a time. Tiles of at most 1024 slots are always written from
            registers.
        dynamic: Filter programs take rows from a shared counter (an atomic add a row) rather
            than every ``nprog``-th row: no tail of programs holding one row more than others.
        presample: The rows' sample thresholds come from a kernel of their own (one program a
            row) before the filter kernel, which then only streams (a rare retry, too few
            keys through, still searches there).
        ballot_write: The select kernel places the selected indices by warp ballots and one
            atomic add a warp on a per-row counter, instead of a block-wide scan (NVIDIA
            only; write chunks of a multiple of 128 keys a warp, else the scan).
        filter_maxnreg, select_maxnreg: Register cap a thread of the filter kernel, of the
            first select launch (NVIDIA only; fewer registers, more programs an SM, maybe
            spills; with ``fused`` the select runs in the filter kernel, under
            ``filter_maxnreg``). ``0``: no cap, the compiler's choice. ``None``: the launch
            config's (the filter's only where it streams alone: ``presample`` and not
            ``fused``).
        radix_bits: Bits of the key resolved per pass of the plain road (1, 2, 4 or 8).
        pieces, piece, sparse, sigmas: The sample: runs of ``piece`` keys (a power of
            two), one key in ``sparse`` sampled, at most ``pieces`` runs (a power of two) in
            the filter kernel's own sample; its threshold ``sigmas`` standard deviations
            deep.
        sample_max: Keys at most in the sample kernel's sample (a power of two, at least
            ``piece``; that kernel runs with ``presample``).
        cap: Candidate slots a row (default ``max(CAP, 4 * topk)``, a power of two, at
            least ``topk``); ``8 * cap`` bytes a row of scratch.
        sample_min: Rows longer than ``tile`` but shorter than this take the plain road.
        sample_low_bit: Bits of the sample threshold's key left 0 (0-24): fewer counting
            steps for a slightly lower, still safe, threshold.
        sample_slack: The sample threshold's search ends once at most ``rank * (1 +
            sample_slack)`` sampled keys reach it (``rank``: the depth ``sigmas`` sets):
            fewer counting steps, a few more candidates (0 to 64).
        stats: Optional contiguous int32 ``[4]`` or ``[5]`` on the logits' device; the kernel adds
            each row to one counter (``STAT_SHORT``, ``STAT_SAMPLED``, ``STAT_PLAIN``,
            ``STAT_DIRECT``) and, with a fifth entry, each retried row to ``STAT_RETRIED``.
        direct_launch: On NVIDIA, launch a kernel's compiled variant directly once Triton's
            JIT has chosen it for the arguments' specialization (:mod:`.launch`: less host
            time a call). ``None``: ``INDEXER_TRITON_DIRECT_LAUNCH`` (on by default).
        slices: Programs filtering each row (a power of two up to :data:`MAX_SLICES`), for
            few long rows: each program a slice of whole blocks, all appending to the row's
            one list (implies ``presample``, excludes ``fused``). ``None``:
            :func:`auto_slices`.

    Raises:
        ValueError: an option out of range (before any kernel runs).
    """
    if triton is None:
        raise RuntimeError("triton is not importable")
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {tuple(logits.shape)} {logits.dtype}")
    rows, n = logits.shape
    if topk < 1:
        raise ValueError(f"topk must be at least 1, got {topk}")
    options = dict(block=block, filter_block=filter_block, num_warps=num_warps, programs_per_sm=programs_per_sm,
                   select_warps=select_warps, tile=tile, ballot=ballot, fused=fused, prefetch=prefetch,
                   tile_write=tile_write, filter_maxnreg=filter_maxnreg, select_maxnreg=select_maxnreg,
                   dynamic=dynamic, presample=presample, ballot_write=ballot_write, radix_bits=radix_bits,
                   pieces=pieces, piece=piece, sparse=sparse, sigmas=sigmas, cap=cap, sample_low_bit=sample_low_bit,
                   sample_slack=sample_slack, slices=slices, sample_max=sample_max)
    run = RaggedTopk(logits.device, rows, n, starts_rel, lengths, topk, stats=stats, direct_launch=direct_launch,
                     sample_min=sample_min, **options)
    run(logits, out)


class RaggedTopk:
    """:func:`ragged_topk` prepared once for a block shape and its row windows, run many
    times: the options checked, the launches' arguments made and the scratch placed once,
    so a call only checks the two tensors' shapes and launches (no sync, no allocation once
    bound: CUDA-graph capturable).

    Args:
        device: Device of the logits.
        rows, n: Shape ``[rows, n]`` of the logits blocks it will get.
        starts_rel, lengths: int ``[rows]`` on ``device`` (read by the kernels at every
            call, so they may be refreshed in place).
        topk: Keys kept per row.
        stats, direct_launch, sample_min, **options: As :func:`ragged_topk`'s.

    Attributes:
        scratch_numel: int64 elements of scratch a call needs (:meth:`bind`).

    Raises:
        ValueError: an option out of range (before any kernel runs).
    """

    def __init__(self, device: torch.device, rows: int, n: int, starts_rel: torch.Tensor, lengths: torch.Tensor,
                 topk: int, *, stats: torch.Tensor | None = None, direct_launch: bool | None = None,
                 sample_min: int = 0, block: int | None = None, slices: int | None = None, **options):
        if triton is None:
            raise RuntimeError("triton is not importable")
        device = torch.device(device)
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if starts_rel.numel() != rows or lengths.numel() != rows:
            raise ValueError(f"starts_rel and lengths need {rows} entries (one a row), got {starts_rel.numel()} "
                             f"and {lengths.numel()}")
        for name, x in (("starts_rel", starts_rel), ("lengths", lengths)):
            if x.device != device or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
                raise ValueError(f"{name} must be an integer tensor on {device}, got {x.dtype} on {x.device}")
        _check_stats(stats, device)
        if direct_launch is not None and not isinstance(direct_launch, bool):
            raise ValueError(f"direct_launch must be True, False or None, got {direct_launch!r}")
        o = dict(filter_block=None, num_warps=None, programs_per_sm=None, select_warps=None, tile=None, ballot=None,
                 fused=None, prefetch=None, tile_write=None, filter_maxnreg=None, select_maxnreg=None, dynamic=None,
                 presample=None, ballot_write=None, radix_bits=RADIX_BITS, pieces=None, piece=PIECE, sparse=SPARSE,
                 sigmas=SIGMAS, cap=None, sample_low_bit=8, sample_slack=SAMPLE_SLACK, sample_max=SAMPLE_MAX)
        unknown = set(options) - set(o)
        if unknown:
            raise TypeError(f"unknown ragged_topk options: {sorted(unknown)}")
        o.update(options)
        config = launch_config(device)
        cfg = tuple(zip(config.keys(), map(type, config.values()), config.values()))
        if slices is None:
            # (a fused select needs whole rows)
            fused_on = config["fused"] if o["fused"] is None else o["fused"]
            per_sm = config["programs_per_sm"] if o["programs_per_sm"] is None else o["programs_per_sm"]
            slices = 1 if fused_on is True else auto_slices(device, rows, n, per_sm)
        self.plan = _plan(
            device, cfg, topk, n, block, o["filter_block"], o["num_warps"], o["programs_per_sm"], o["select_warps"],
            o["tile"], o["ballot"], o["fused"], o["prefetch"], o["tile_write"], o["filter_maxnreg"],
            o["select_maxnreg"], o["dynamic"], o["presample"], o["ballot_write"], o["radix_bits"], o["pieces"],
            o["piece"], o["sparse"], o["sigmas"], o["cap"], o["sample_low_bit"], o["sample_slack"], stats is not None,
            slices, o["sample_max"], stats is not None and stats.numel() > STAT_RETRIED)
        # NVIDIA only: AMD's Triton also specializes on whether a tensor spans under 2 GB
        # (buffer ops), which the direct launches' key does not hold
        # (the flag is read, and so checked, everywhere)
        direct = _envs.value("TRITON_DIRECT_LAUNCH") if direct_launch is None else direct_launch
        self.direct = direct and _nvidia(device)
        self.device, self.rows, self.n, self.topk = device, rows, n, topk
        self.stats, self.sample_min = stats, sample_min
        # int32 or int64 as they come (the kernels load either): no conversion launches
        self.starts = _index_vector(starts_rel)
        self.lens = _index_vector(lengths)
        _, num_warps, cap = self.plan[:3]
        # (split rows: a list counter and a slices-done counter a row)
        self.counters = max(num_warps, 2)
        self.scratch_numel = rows * cap + (rows * (self.counters + 6) + 4) // 2
        self.buf = None

    def bind(self, scratch: torch.Tensor) -> None:
        """Place the scratch: an int64 1-D tensor of at least :attr:`scratch_numel` elements
        with unit stride on the device (contents undefined; the kernels zero what they need)."""
        if (scratch.dtype != torch.int64 or scratch.dim() != 1 or scratch.numel() < self.scratch_numel
                or scratch.device != self.device or (scratch.numel() > 1 and scratch.stride(0) != 1)):
            raise ValueError(f"scratch must be int64 [>= {self.scratch_numel}] with unit stride on {self.device}, got "
                             f"{scratch.dtype} {list(scratch.shape)} on {scratch.device}")
        rows, cap = self.rows, self.plan[2]
        # one allocation: the candidate lists (an int64 slot: value bits, column), then int32
        # per-list counts, thresholds, their column cuts, the retry's thresholds and cuts, write
        # counters and ctl: [0] the filter's next row or slice (dynamic), [1] rows queued for the
        # second select launch, [2] its next entry, [3:] the queue. The kernels index rows
        # themselves, so places in the flat buffer do (At: a view only where the JIT launches)
        lists = rows * cap
        self.buf = scratch
        cand32 = self.cand32 = scratch.view(torch.int32)
        base = cand32.data_ptr()
        self.at_wpos = at_wpos = 2 * lists + rows * (self.counters + 4)
        self.counts = At(cand32, 2 * lists, base)
        self.thr = At(cand32, at_wpos - 4 * rows, base)
        self.tcol = At(cand32, at_wpos - 3 * rows, base)
        self.thr2 = At(cand32, at_wpos - 2 * rows, base)
        self.wpos = At(cand32, at_wpos, base)
        self.ctl = At(cand32, at_wpos + rows, base)
        self._bind_launches()

    def _bind_launches(self) -> None:
        # every argument but the logits, out and their row strides is fixed from here on: the
        # launches convert only those per call (0: placeholders, given at every call)
        rows, device, direct, index = self.rows, self.device, self.direct, self.device.index
        programs_per_sm, _, _, sample_kw, filter_kw, retry_kw, selects = self.plan
        starts, lens, cand32, buf = self.starts, self.lens, self.cand32, self.buf
        counts, thr, tcol, thr2, wpos, ctl = self.counts, self.thr, self.tcol, self.thr2, self.wpos, self.ctl
        stats = self.stats if self.stats is not None else lens
        sample_min = self.sample_min
        launches = []
        # (grid, launch, what its slots take: the logits, out, their row strides)
        if sample_kw is not None:
            args = (0, starts, lens, thr, tcol, thr2, counts, wpos, ctl, rows, 0, sample_min)
            launches.append((rows, _SAMPLE.bind(args, sample_kw, index, direct, (0, 10)), (0, 2)))
        units = _programs(device, rows * filter_kw["SL"], programs_per_sm)
        filter_args = (0, starts, lens, buf, cand32, counts, thr, tcol, thr2, 0, ctl, wpos, stats, rows, 0, 0,
                       sample_min)
        for kw in (filter_kw, retry_kw):
            if kw is not None:
                launches.append((units, _FILTER.bind(filter_args, kw, index, direct, (0, 9, 14, 15)), (0, 1, 2, 3)))
        # a split row's candidates reach down to its retry's threshold, whether it retried or not
        select_args = (0, starts, lens, 0, cand32, counts, thr if retry_kw is None else thr2, ctl, wpos, stats, 0, 0,
                       sample_min)
        for first, kw in selects:
            launches.append((_select_grid(device, rows, first), _SELECT.bind(select_args, kw, index, direct, (0, 3, 10, 11)), (0, 1, 2, 3)))
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
        # only the write counters and ctl[0:3] need zeros; the sample kernel zeroes them, else
        # one fill does. A filtered row's counts and threshold are written before they are
        # read; the select also loads them for a row of the plain road (shorter than
        # sample_min, never filtered), whose road is already set by its length: the values
        # read there are never used
        if self.plan[3] is None:
            self.cand32[self.at_wpos: self.at_wpos + rows + 3].zero_()  # wpos and ctl[0:3], adjacent
        values = (logits, out, logits.stride(0), out.stride(0))
        with device_guard(logits):
            for grid, launch, takes in self.launches:
                launch(grid, *(values[i] for i in takes))
