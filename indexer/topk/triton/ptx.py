"""Inline PTX of the Triton top-k's warp-level steps (NVIDIA only): a warp's ballot ranks,
its stores at slots taken by one atomic add, and the filter's whole compare-to-store step.

The strings are built here, once, in plain Python; :mod:`.kernels` hands them to
``tl.inline_asm_elementwise`` as constexprs.
"""

from __future__ import annotations

#: The filter's histogram of the keys its lists had no room for (``fallback_seed``): bins of
#: ``2**SEED_SHIFT`` keys (1/32 of a binade) from the threshold's, ``SEED_BINS`` of them (four
#: binades; the keys past them in the last bin).
SEED_SHIFT, SEED_BINS = 18, 128


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
def _take_slots_ptx(ctr: int) -> str:
    """PTX after :func:`_ballot_ranks_ptx`: lane 0 takes the warp's ``t`` slots from the
    counter at ``$ctr`` with one atomic add, and every lane gets the first as ``base`` by a
    shuffle. Declares ``pl``, ``base``, ``lane`` and the address ``a`` for the code after it."""
    return (".reg .pred pl;\n.reg .b32 base, lane;\n.reg .b64 a;\n"
            "mov.u32 lane, %laneid;\nsetp.eq.u32 pl, lane, 0;\nsetp.ne.and.u32 pl, t, 0, pl;\n"
            f"mov.u32 base, 0;\n@pl atom.global.add.u32 base, [${ctr}], t;\n"
            "shfl.sync.idx.b32 base, base, 0, 0x1f, 0xffffffff;\n")


def _warp_store_ptx(ctr: int, dst: int, words: tuple[int, ...]) -> str:
    """PTX storing, for every selected element (flags ``$4``-``$7`` nonzero), its words at
    ``$dst + size * slot``, slots from the counter ``[$ctr]`` (:func:`_take_slots_ptx`): one
    word (``$w + j`` for register ``j``, ``words = (w,)``) or two (``words = (lo, hi)``, one
    little-endian int64, ``lo`` at the lower address). The outputs are placeholders."""
    size = 4 * len(words)
    op = "st.global.b32" if len(words) == 1 else "st.global.v2.b32"
    value = ((lambda j: f"${words[0] + j}") if len(words) == 1
             else (lambda j: "{" + ", ".join(f"${w + j}" for w in words) + "}"))
    return ("{\n" + _ballot_ranks_ptx(4) + _take_slots_ptx(ctr)
            + "".join(f"add.u32 q{j}, q{j}, base;\nmul.wide.u32 a, q{j}, {size};\nadd.s64 a, a, ${dst};\n"
                      f"@p{j} {op} [a], {value(j)};\n" for j in range(4))
            + "".join(f"mov.u32 ${j}, 0;\n" for j in range(4)) + "}\n")


#: :func:`_warp_store`'s PTX: each selected element's value (``$8``-``$11``) at ``$16 + 4 *
#: slot``, slots from the counter ``[$12]``.
_WARP_STORE_PTX = _warp_store_ptx(12, 16, (8,))
#: :func:`_warp_pair_store`'s PTX: each selected element's two words, ``$12 + j`` low and ``$8
#: + j`` high (one int64), at ``$20 + 8 * slot``, slots from the counter ``[$16]``.
_WARP_PAIR_STORE_PTX = _warp_store_ptx(16, 20, (12, 8))


def _ukey_block_ptx(src: str, dst: str) -> str:
    """PTX: ``dst`` = the unsigned form of the order-preserving key of the float32 in ``src``
    (as ``_skey``: ``-0.0`` as ``0.0``, every NaN above +inf), shifted right by
    :data:`SEED_SHIFT`. Uses ``m`` and ``z`` (declared by the caller)."""
    return (f"setp.eq.s32 z, {src}, 0x80000000;\nselp.b32 {dst}, 0, {src}, z;\n"
            f"testp.notanumber.f32 z, {src};\nselp.b32 {dst}, 0x7FFFFFFF, {dst}, z;\n"
            f"shr.s32 m, {dst}, 31;\nand.b32 m, m, 0x7FFFFFFF;\nxor.b32 {dst}, {dst}, m;\n"
            f"xor.b32 {dst}, {dst}, 0x80000000;\nshr.u32 {dst}, {dst}, {SEED_SHIFT};\n")


def _overflow_ptx(slot0: str, threshold: int, hist: int) -> str:
    """PTX after an append's stores: where the warp's slots ran past the room ``$24`` (its
    last slot is ``t - 1`` past ``slot0``; a warp-uniform branch, so an append that fits
    pays two instructions), each selected key of ``$4``-``$7`` left out of the list (slot
    ``q{j}`` at or past the room) adds 1 to its bin of the row's histogram at ``$hist``:
    ``(u >> SEED_SHIFT) - (ut >> SEED_SHIFT)`` clamped to ``0 .. SEED_BINS - 1``, ``u`` and
    ``ut`` the unsigned keys of the key and of the threshold ``$threshold``. The split
    fallback starts from that histogram (``fallback_seed``)."""
    body = "".join(
        f"setp.ge.and.s32 s, q{j}, $24, p{j};\n@!s bra NO{j};\n" + _ukey_block_ptx(f"${4 + j}", "k")
        + f"sub.s32 k, k, o;\nmax.s32 k, k, 0;\nmin.s32 k, k, {SEED_BINS - 1};\n"
        f"mul.wide.s32 a, k, 4;\nadd.s64 a, a, ${hist};\nred.global.add.u32 [a], 1;\nNO{j}:\n"
        for j in range(4))
    return (".reg .b32 k, m, o, e;\n.reg .pred z;\n"
            f"add.s32 e, {slot0}, t;\nsetp.gt.s32 s, e, $24;\n@!s bra.uni FIT;\n"
            + _ukey_block_ptx(f"${threshold}", "o") + body + "FIT:\n")


def _warp_append_ptx(cut: bool, hist: bool = False) -> str:
    """:func:`_warp_append`'s PTX: keys ``$4``-``$7`` not below ``$20`` (and, with ``cut``,
    not equal to it past the column cut ``$28``) go, with their columns ``$8``-``$11``, to
    the warp's list ``$16`` at ``$12`` (its length) plus their rank, while below ``$24`` (its
    room); the new length to ``$0``-``$3``. With ``hist``, the keys past the room go to the
    row's histogram at the last operand (:func:`_overflow_ptx`). The outputs are written
    last: the compiler may give an output an input's register (``$1`` was ``$12``'s, so a
    version writing them one by one from ``$12`` stored every list's length wrong)."""
    over = _overflow_ptx("$12", 20, 32 if cut else 28) if hist else ""
    return ("{\n" + _ballot_ranks_ptx(4, threshold=20, cols=8 if cut else None)
            + ".reg .pred s;\n.reg .b64 a;\n"
            + "".join(f"add.s32 q{j}, q{j}, $12;\nsetp.lt.and.s32 s, q{j}, $24, p{j};\n"
                      f"mad.wide.s32 a, q{j}, 8, $16;\n@s st.global.v2.b32 [a], {{${4 + j}, ${8 + j}}};\n"
                      for j in range(4))
            + over
            # (last, after every read of an input: an output may share an input's register)
            + "add.s32 t, t, $12;\n" + "".join(f"mov.u32 ${j}, t;\n" for j in range(4)) + "}\n")


#: A split row's list slot that a warp reserved and left empty: value bits of -inf, column
#: -1. The select and the fallback seed skip slots whose column is negative.
HOLE_BITS, HOLE_COLUMN = -8388608, -1


def _shared_append_ptx(cut: bool, hist: bool = False) -> str:
    """:func:`_shared_append`'s PTX: the selected keys of ``$4``-``$7`` (as
    :func:`_warp_append_ptx`), with their columns ``$8``-``$11``, go to the row's one list
    ``$16`` while below ``$24`` (its room), at slots of the warp's run: ``[pos, end)`` of the
    list, taken from its counter ``[$12]`` by one atomic add (lane 0's, shuffled to the other
    lanes) only when the block's keys do not fit what is left of it. A new run is the keys
    that do not fit or ``run`` slots (the operand after the state), whichever is more, so a
    warp waits on an atomic's return about once every ``run`` keys it lists rather than once a
    block; its first keys fill the old run's rest. The warp's state comes in four registers
    of a lane (``$28``-``$31``, with ``cut`` ``$32``-``$35``: ``pos``, ``end``, keys listed,
    unused) and goes out in ``$0``-``$3``; :data:`_SHARED_CLOSE_PTX` marks the slots left
    in the last run. The counter counts on past the room. With ``hist``, the keys past the
    room go to the row's histogram at the last operand (:func:`_overflow_ptx`)."""
    st = 32 if cut else 28
    over = _overflow_ptx("s0", 20, st + 8) if hist else ""
    return ("{\n" + _ballot_ranks_ptx(4, threshold=20, cols=8 if cut else None)
            + ".reg .pred s, pn, pl, po;\n.reg .b32 pos, end, got, rem, need, r, nb, x, s0, lane;\n.reg .b64 a;\n"
            f"mov.u32 pos, ${st};\nmov.u32 end, ${st + 1};\nadd.u32 got, ${st + 2}, t;\n"
            "sub.s32 rem, end, pos;\nsub.s32 need, t, rem;\nsetp.gt.s32 pn, need, 0;\n@!pn bra.uni KEEP;\n"
            f"max.s32 r, need, ${st + 4};\nmov.u32 lane, %laneid;\nsetp.eq.u32 pl, lane, 0;\nmov.u32 nb, 0;\n"
            "@pl atom.global.add.u32 nb, [$12], r;\nshfl.sync.idx.b32 nb, nb, 0, 0x1f, 0xffffffff;\n"
            # ranks below rem fill the old run's rest, the others start the new run (at nb)
            + "".join(f"setp.lt.s32 po, q{j}, rem;\nsub.s32 x, nb, rem;\nselp.b32 x, pos, x, po;\n"
                      f"add.s32 q{j}, q{j}, x;\n" for j in range(4))
            + "add.s32 end, nb, r;\nadd.s32 pos, nb, need;\nbra.uni PLACED;\nKEEP:\n"
            + "".join(f"add.s32 q{j}, q{j}, pos;\n" for j in range(4))
            + "add.s32 pos, pos, t;\nPLACED:\n"
            # (the last slot taken is pos - 1: the overflow test's s0 + t)
            + "sub.s32 s0, pos, t;\n"
            + "".join(f"setp.lt.and.s32 s, q{j}, $24, p{j};\nmad.wide.s32 a, q{j}, 8, $16;\n"
                      f"@s st.global.v2.b32 [a], {{${4 + j}, ${8 + j}}};\n" for j in range(4))
            + over
            # (last, after every read of an input: an output may share an input's register)
            + "mov.u32 $0, pos;\nmov.u32 $1, end;\nmov.u32 $2, got;\nmov.u32 $3, 0;\n}\n")


#: :func:`_shared_close`'s PTX: the warp's state ``$4``-``$7`` (:func:`_shared_append_ptx`),
#: the row's list counter ``$8`` (the count of keys listed is the next word), its list
#: ``$12`` and room ``$16``. The slots ``[pos, end)`` below the room get :data:`HOLE_BITS`
#: and :data:`HOLE_COLUMN` (four a lane: a run is at most 128 slots), and lane 0 adds the
#: warp's keys listed to the count. The outputs are placeholders.
_SHARED_CLOSE_PTX = (
    "{\n.reg .pred p;\n.reg .b32 lane, s, hv, hc;\n.reg .b64 a;\nmov.u32 lane, %laneid;\n"
    f"mov.b32 hv, {HOLE_BITS};\nmov.b32 hc, {HOLE_COLUMN};\n"
    + "".join(f"add.u32 s, $4, lane;\nadd.u32 s, s, {32 * i};\nsetp.lt.s32 p, s, $5;\n"
              f"setp.lt.and.s32 p, s, $16, p;\nmad.wide.s32 a, s, 8, $12;\n"
              "@p st.global.v2.b32 [a], {hv, hc};\n" for i in range(4))
    + "setp.eq.u32 p, lane, 0;\nsetp.ne.and.u32 p, $6, 0, p;\n@p red.global.add.u32 [$8+4], $6;\n"
    + "".join(f"mov.u32 ${j}, 0;\n" for j in range(4)) + "}\n")


def _warp_histogram_ptx() -> str:
    """:func:`_warp_histogram`'s PTX: from the four digits ``$4``-``$7`` of each lane (0-31;
    negative: not counted), the number of its warp's counted digits equal to the lane's own
    index, added to ``$8`` into ``$0`` (``$1``-``$3`` are 0). Five ballots a register, one a
    bit of the digit; lane ``l`` keeps the lanes whose bits all equal ``l``'s (a ballot taken
    as it is where ``l`` has the bit, inverted where not). A register with no counted digit in
    the warp skips its ballots (a uniform branch: the ballot is the same in every lane)."""
    flips = "".join(f"and.b32 t, l, {1 << i};\nsetp.eq.u32 p, t, 0;\nselp.b32 f{i}, -1, 0, p;\n" for i in range(5))
    regs = ""
    for j in range(4):
        regs += (f"setp.ge.s32 p, ${4 + j}, 0;\nvote.sync.ballot.b32 v, p, 0xffffffff;\n"
                 f"setp.eq.u32 p, v, 0;\n@p bra.uni SKIP{j};\n")
        for i in range(5):
            regs += (f"and.b32 t, ${4 + j}, {1 << i};\nsetp.ne.u32 p, t, 0;\nvote.sync.ballot.b32 b, p, 0xffffffff;\n"
                     f"xor.b32 b, b, f{i};\nand.b32 v, v, b;\n")
        regs += f"popc.b32 t, v;\nadd.u32 c, c, t;\nSKIP{j}:\n"
    return ("{\n.reg .pred p;\n.reg .b32 l, t, v, b, c, f0, f1, f2, f3, f4;\nmov.u32 l, %laneid;\n" + flips
            + "mov.u32 c, 0;\n" + regs
            # (last, after every read of an input: an output may share an input's register)
            + "add.u32 $0, $8, c;\nmov.u32 $1, 0;\nmov.u32 $2, 0;\nmov.u32 $3, 0;\n}\n")


