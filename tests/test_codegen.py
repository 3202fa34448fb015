"""The Triton kernels compile for AMD Instinct and NVIDIA Hopper GPUs without either.

No AMD GPU has been available to this project, and CI has no GPU at all, so nothing here
runs a kernel: it generates each kernel's code object with Triton's own backends (MI300X:
gfx942, MI355X: gfx950, needing no ROCm install; H100/H200: sm_90a, with the ptxas Triton
ships) for the launch options the library takes there. On AMD it checks that no NVIDIA-only
code (inline PTX) reached the kernel; on NVIDIA that the PTX steps did and that ptxas takes
them. It catches what would fail at the first launch: an NVIDIA-only path taken on AMD, an
operation a backend cannot lower, inline PTX that does not assemble. Each case runs in a
child process: the CPU test session defines the kernels for Triton's interpreter, which
cannot compile them.
"""

from __future__ import annotations

import dataclasses

import os
import re
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")


def _has_backend(name: str) -> bool:
    try:
        from triton.backends import backends
    except Exception:  # noqa: BLE001 - an older Triton layout: no backend registry
        return False
    return name in backends


amd = pytest.mark.skipif(not _has_backend("amd"), reason="this Triton has no AMD backend")
nvidia = pytest.mark.skipif(not _has_backend("nvidia"), reason="this Triton has no NVIDIA backend")

#: Each architecture's fp8 (Triton's names): e4m3fnuz on MI300, e4m3fn (OCP) on MI355.
FP8 = {"gfx942": "fp8e4b8", "gfx950": "fp8e4nv"}
_OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")


def _build(fn, signature: dict, kwargs: dict, target):
    # kwargs as a launch takes them: constexprs and launch options together
    from triton.compiler import ASTSource

    constexprs = {k: v for k, v in kwargs.items() if k not in _OPTIONS}
    options = {k: v for k, v in kwargs.items() if k in _OPTIONS}
    src = ASTSource(fn=fn, signature=dict(signature, **{k: "constexpr" for k in constexprs}), constexprs=constexprs)
    return triton.compile(src, target=target, options=options)


def _nvidia_compile(fn, signature: dict, kwargs: dict, ptx: tuple[str, ...]):
    # sm_90a; every opcode of `ptx` must be in the kernel's PTX (the inline steps were taken)
    from triton.backends.compiler import GPUTarget

    kernel = _build(fn, signature, kwargs, GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], f"{fn.__name__}: no cubin for sm_90a"
    for opcode in ptx:
        assert opcode in kernel.asm["ptx"], f"{fn.__name__} on sm_90a: no {opcode} (the PTX step was not taken)"
    return kernel


def _inline_asm(kernel) -> str:
    """The PTX of a kernel's inline asm blocks (the library's PTX steps), which LLVM's NVPTX
    backend emits between ``// begin inline asm`` and ``// end inline asm``."""
    return "\n".join(re.findall(r"// begin inline asm\n(.*?)// end inline asm", kernel.asm["ptx"], re.S))


def _triton_at_least(major: int, minor: int) -> bool:
    return tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) >= (major, minor)


def _loop_local_stores(kernel) -> list[int] | None:
    """Local-memory stores (register spills) in each innermost loop of an sm_90a kernel
    holding warp votes (the filter's passes), read from its SASS by Triton's cuobjdump;
    ``None`` where this Triton ships none. A loop runs from a backward branch's target to
    the last backward branch there; innermost: no other loop inside."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    ends: dict = {}  # a loop's start -> its last backward branch there
    for i, (a, op) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in where:
            ends[where[int(m.group(1), 16)]] = i
    loops = list(ends.items())
    stores = []
    for lo, hi in loops:
        body = [o for _, o in ins[lo:hi + 1]]
        inner = any(lo <= a2 and b2 <= hi and (a2, b2) != (lo, hi) for a2, b2 in loops)
        if not inner and any("VOTE" in o for o in body):
            stores.append(sum(1 for o in body if re.match(r"(@!?U?P\d+\s+)?STL", o)))
    return stores


def _compile(fn, signature: dict, kwargs: dict, arch: str):
    from triton.backends.compiler import GPUTarget

    kernel = _build(fn, signature, kwargs, GPUTarget("hip", arch, 64))
    assert kernel.asm["hsaco"], f"{fn.__name__}: no code object for {arch}"
    # a PTX asm block would have failed the AMD assembler; its opcodes in the IR mean an
    # NVIDIA-only helper was traced into the AMD path
    for opcode in ("vote.sync", "atom.global", "st.global.b32", "%tid.x"):
        assert opcode not in kernel.asm["llir"], f"{fn.__name__} on {arch}: NVIDIA inline PTX ({opcode})"
    return kernel


_P32, _P64, _I = "*i32", "*i64", "i32"
_SELECT_SIG = dict(logits_ptr="*fp32", starts_ptr=_P64, lengths_ptr=_P64, out_ptr=_P32, cand32_ptr=_P32,
                   cnt_ptr=_P32, thr_ptr=_P32, ctl_ptr=_P32, wpos_ptr=_P32, stats_ptr=_P32, stride_lm=_I,
                   stride_om=_I, sample_min=_I, hist_ptr=_P32, thr1_ptr=_P32)
_FILTER_SIG = dict(logits_ptr="*fp32", starts_ptr=_P64, lengths_ptr=_P64, cand_ptr=_P64, cand32_ptr=_P32,
                   cnt_ptr=_P32, thr_ptr=_P32, tcol_ptr=_P32, thr2_ptr=_P32, out_ptr=_P32, ctl_ptr=_P32,
                   wpos_ptr=_P32, stats_ptr=_P32, rows=_I, stride_lm=_I, stride_om=_I, sample_min=_I, hist_ptr=_P32,
                   stage_ptr=_P64)
_FALLBACK_SIG = dict(logits_ptr="*fp32", starts_ptr=_P64, lengths_ptr=_P64, out_ptr=_P32, cand32_ptr=_P32,
                     ctl_ptr=_P32, wpos_ptr=_P32, stats_ptr=_P32, rows=_I, stride_lm=_I, stride_om=_I)
_ROW_SIG = dict(logits_ptr="*fp32", starts_ptr=_P64, lengths_ptr=_P64, out_ptr=_P32, wpos_ptr=_P32,
                stats_ptr=_P32, stride_lm=_I, stride_om=_I)
_SAMPLE_SIG = dict(logits_ptr="*fp32", starts_ptr=_P64, lengths_ptr=_P64, thr_ptr=_P32, tcol_ptr=_P32,
                   thr2_ptr=_P32, cnt_ptr=_P32, wpos_ptr=_P32, ctl_ptr=_P32, rows=_I, stride_lm=_I, sample_min=_I,
                   hist_ptr=_P32)


def _topk_plan(config, n: int, presample=None, fused=None, slices: int = 1):
    from indexer.topk.triton import config as TC

    # ragged_topk's launches for `config`, topk=2048 over n-key rows (a CPU device stands for
    # the GPU in the plan)
    changes = {key: value for key, value in (("presample", presample), ("fused", fused)) if value is not None}
    return TC.plan_launches(torch.device("cpu"), dataclasses.replace(config, **changes), 2048, n, slices, True)


def _amd_plan(presample: bool, fused: bool, slices: int = 1):
    from indexer.topk.triton import config as TC

    # off NVIDIA (both AMD and the CPU take the default config, no ballot, no register caps),
    # 64K-key rows
    return _topk_plan(TC.DEFAULT_CONFIG, 65536, presample, fused, slices)


def _topk_kernels(arch: str, presample: bool, fused: bool, slices: int) -> None:
    from indexer.topk.triton import config as TC
    from indexer.topk.triton import kernels as TK

    _, _, _, sample_kw, filter_kw, retry_kw, selects, fallback_kw, _ = _amd_plan(presample, fused, slices)
    assert filter_kw["SL"] == slices
    assert not filter_kw["BALLOT"] and not filter_kw["WB"] and "maxnreg" not in filter_kw
    _compile(TK.filter_kernel, _FILTER_SIG, filter_kw, arch)
    if fused:
        # its select's search snapping to keys (select_snap)
        _compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, SNAP=True), arch)
    if not presample and not fused:
        # the filter's own sample with its runs jittered (sample_jitter)
        _compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, JITTER=True), arch)
    if not fused and slices == 1:
        # the blocks dealt to the warps' lists (filter_deal; a split row's one list has none)
        _compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, DEAL=True), arch)
    if retry_kw is not None:
        _compile(TK.filter_kernel, _FILTER_SIG, retry_kw, arch)
    for _, kw in selects:
        assert not kw["WB"]
        _compile(TK.select_kernel, _SELECT_SIG, kw, arch)
    _compile(TK.select_kernel, _SELECT_SIG, dict(selects[0][1], SNAP=True), arch)
    if presample:
        _compile(TK.sample_kernel, _SAMPLE_SIG, sample_kw, arch)
    # 64K-key rows: the split fallback is planned unless the select is fused into the filter
    assert (fallback_kw is None) == fused
    if fallback_kw is not None:
        assert fallback_kw["BUF"] > 0 and not fallback_kw["WB"]
        _compile(TK.fallback_kernel, _FALLBACK_SIG, fallback_kw, arch)
        # without the buffer (fallback_buffer=0), and 3 steps' loads in flight (fallback_prefetch)
        _compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, BUF=0), arch)
        _compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, AHEAD=3), arch)
    if slices == 1 and not fused:
        # the row kernel (row_max): 16K-key blocks, each row whole in registers, in one launch
        row_kw = _topk_plan(dataclasses.replace(TC.DEFAULT_CONFIG, row_max=16384), 16384).row
        assert not row_kw["WB"] and "maxnreg" not in row_kw
        _compile(TK.row_kernel, _ROW_SIG, row_kw, arch)
        # sample_tie_bit in the row kernel's searches and the filter's own sample's
        _compile(TK.row_kernel, _ROW_SIG, dict(row_kw, TIE_BIT=20), arch)
        if not presample:
            _compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, TIE_BIT=20), arch)
    if presample:
        _compile(TK.sample_kernel, _SAMPLE_SIG, dict(sample_kw, TIE_BIT=20), arch)


def _nvidia_topk_kernels(slices: int) -> None:
    from indexer.topk.triton import config as TC
    from indexer.topk.triton import kernels as TK

    # ragged_topk's launches with the sm90 config (a CPU device stands for the GPU in the
    # plan, told it is NVIDIA's: ballots, PTX steps and register caps), 1M-key rows
    TC.is_nvidia = lambda device: True
    _, _, _, sample_kw, filter_kw, retry_kw, selects, fallback_kw, _ = _topk_plan(
        TC.CONFIGS["sm90"], 1 << 20, slices=slices)
    assert filter_kw["BALLOT"] and filter_kw["SL"] == slices
    # the filter's PTX step: warp lists (slices=1) or the row's shared list, slots in runs
    # from its atomic counter
    ptx = ("vote.sync.ballot", "st.global.v2.b32")
    assert not filter_kw["STAGE"] and filter_kw["RUN"] == (TC.SPLIT_RUN if slices > 1 else 0)
    kernel = _nvidia_compile(TK.filter_kernel, _FILTER_SIG, filter_kw,
                             ptx + (("atom.global.add.u32",) if slices > 1 else ()))
    if slices > 1:
        # split_stage: a whole row's warp lists, staged; their pass at the streaming cap
        # spills nothing a step (Triton 3.6 and 3.9)
        staged = _nvidia_compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, STAGE=True, RUN=0), ptx)
        stores = _loop_local_stores(staged)
        assert stores is None or (stores and not any(stores)), stores
    if slices == 1:
        # at its 32-register cap the streaming filter's passes over whole rows spill nothing a
        # step (Triton 3.9 spills 3 words a step in one of the split rows' four passes there).
        # Triton 3.6 spills 1-3 words a step in the retry's four passes (the last four loops;
        # a row retries only where its sample overestimated it) and none in the first pass's
        stores = _loop_local_stores(kernel)
        passes = stores if _triton_at_least(3, 7) or stores is None else stores[:4]
        assert stores is None or (stores and not any(passes)), stores
    if slices == 1:
        # the blocks dealt to the warps' lists (filter_deal; a split row's one list has none)
        _nvidia_compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, DEAL=True), ptx)
        # the filter's own sample (no sample kernel, no register cap) with sample_tie_bit
        own = {key: v for key, v in filter_kw.items() if key != "maxnreg"}
        _nvidia_compile(TK.filter_kernel, _FILTER_SIG, dict(own, PRESAMPLE=False, SECOND=False, TIE_BIT=20), ptx)
    if retry_kw is not None:
        _nvidia_compile(TK.filter_kernel, _FILTER_SIG, retry_kw, ())
    _nvidia_compile(TK.sample_kernel, _SAMPLE_SIG, sample_kw, ())
    _nvidia_compile(TK.sample_kernel, _SAMPLE_SIG, dict(sample_kw, JITTER=True), ())
    _nvidia_compile(TK.sample_kernel, _SAMPLE_SIG, dict(sample_kw, TIE_BIT=20), ())
    for _, kw in selects:
        _nvidia_compile(TK.select_kernel, _SELECT_SIG, kw, ("vote.sync.ballot",) if kw["WB"] else ())
    # the k-th key's search snapping its ends to keys (select_snap)
    _nvidia_compile(TK.select_kernel, _SELECT_SIG, dict(selects[0][1], SNAP=True), ())
    # the split fallback's passes wait on a row's pass counter (an acquiring load or atomic) and
    # release it; on NVIDIA they count digits and place indices by warp ballots
    # (fallback_ballot), or, turned off, by tl.histogram and a scan
    assert fallback_kw["WB"]
    order = (".acquire.", ".release.")
    # (SKIP0: the ballot histogram's branch past a register with no digit to count;
    # ld.global.v4: the passes load a row's aligned view four keys at a time)
    _nvidia_compile(TK.fallback_kernel, _FALLBACK_SIG, fallback_kw,
                    order + ("vote.sync.ballot", "SKIP0", "ld.global.v4"))
    kernel = _nvidia_compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, WB=False), order)
    # (our PTX steps only: Triton 3.6 lowers tl.histogram with warp ballots of its own)
    assert "vote.sync.ballot" not in _inline_asm(kernel) and "SKIP0" not in _inline_asm(kernel)
    _nvidia_compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, BUF=0), order)
    for ahead in (2, 3):
        _nvidia_compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, AHEAD=ahead), order)
    # 1024-key steps: two ballot sets a thread a step
    _nvidia_compile(TK.fallback_kernel, _FALLBACK_SIG, dict(fallback_kw, BLOCK=1024), order)
    # fallback_seed: the filter's step counts the keys its lists have no room for (a reduction
    # to global memory in the PTX step), the sample kernel zeroes the counts, the first select
    # launch reads them
    seeded = _topk_plan(dataclasses.replace(TC.CONFIGS["sm90"], fallback_seed=True), 1 << 20, slices=slices)
    assert seeded[4]["HIST"] and seeded[3]["HIST"] and seeded[6][0][1]["SEED"]
    # (at the seeded cap, 48 registers: at 32 its passes spilled 5-10 words a step)
    assert seeded[4]["maxnreg"] == TC.CONFIGS["sm90"].seeded_filter_maxnreg
    kernel = _nvidia_compile(TK.filter_kernel, _FILTER_SIG, seeded[4], ptx + ("red.global.add.u32",))
    stores = _loop_local_stores(kernel)
    assert stores is None or (stores and not any(stores)), stores
    _nvidia_compile(TK.sample_kernel, _SAMPLE_SIG, seeded[3], ())
    _nvidia_compile(TK.select_kernel, _SELECT_SIG, seeded[6][0][1], ())
    # programmatic dependent launch (pdl, planned only on a GPU that has it): each kernel
    # waits for the launch before it, then lets the next one be placed
    gdc = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")
    launches = ((TK.sample_kernel, _SAMPLE_SIG, sample_kw), (TK.filter_kernel, _FILTER_SIG, filter_kw),
                *((TK.select_kernel, _SELECT_SIG, kw) for _, kw in selects),
                (TK.fallback_kernel, _FALLBACK_SIG, fallback_kw))
    for fn, sig, kw in launches:
        assert kw["PDL"] is False and "launch_pdl" not in kw
        assert not any(op in _nvidia_compile(fn, sig, kw, ()).asm["ptx"] for op in gdc)
        ptx = _nvidia_compile(fn, sig, dict(kw, PDL=True, launch_pdl=True), gdc).asm["ptx"]
        # nothing touches global memory before the wait
        first = min(ptx.find(op) for op in ("ld.global", "st.global", "atom.", "red.") if op in ptx)
        assert ptx.index("griddepcontrol.wait") < first, fn.__name__
    # filter_l2_prefetch: the first unit's keys prefetched into L2 before the wait
    ptx = _nvidia_compile(TK.filter_kernel, _FILTER_SIG, dict(filter_kw, PDL=True, launch_pdl=True, PFK=4096,
                                                              PFS=(1 << 20) // slices), gdc + ("prefetch.global.L2",)).asm["ptx"]
    assert ptx.index("prefetch.global.L2") < ptx.index("griddepcontrol.wait")
    if slices == 1:
        row_kw = _topk_plan(TC.CONFIGS["sm90"], 16384).row
        _nvidia_compile(TK.row_kernel, _ROW_SIG, dict(row_kw, PDL=True, launch_pdl=True), gdc)
    if slices == 1:
        # the row kernel (row_max): 8K-key rows at 8 warps uncapped, 16K-key rows at 16 warps
        # capped at 64 registers; its write by warp ballots, and no spill in the write's loop
        # (Triton 3.6 spills one word a step there at 16K keys: its timings were taken so)
        for n, warps, cap in ((8192, 8, None), (16384, 16, 64)):
            row_kw = _topk_plan(TC.CONFIGS["sm90"], n).row
            assert row_kw["WB"] and row_kw["num_warps"] == warps and row_kw.get("maxnreg") == cap
            kernel = _nvidia_compile(TK.row_kernel, _ROW_SIG, row_kw, ("vote.sync.ballot",))
            stores = _loop_local_stores(kernel)
            if cap is None or _triton_at_least(3, 7):
                assert stores is None or (stores and not any(stores)), stores
        # sample_tie_bit in its two searches
        _nvidia_compile(TK.row_kernel, _ROW_SIG, dict(row_kw, TIE_BIT=20), ("vote.sync.ballot",))


def _logits_kernels(arch: str) -> None:
    # the DeepSeek-V3.2 / GLM-5 indexer shape, H=64 D=128, both logits kernels and the fused
    # logits + top-k filter (its stores are tl.store off NVIDIA)
    from indexer.backends.triton import fused_experimental as F
    from indexer.backends.triton import kernels as K
    from indexer.topk.triton import config as TC

    fp8 = "*" + FP8[arch]
    h, d = 64, 128
    block_m, block_n, warps, stages = K.pick_config(8192, 65536, d)
    common = dict(q_ptr=fp8, k_ptr=fp8, k_scale_ptr="*fp32", w_ptr="*fp32", starts_ptr=_P32, ends_ptr=_P32)
    cfg = K.fused_config(h, d)
    tiles = dict(H=h, D=d, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages)
    for compressed in (False, True):  # full-width rows, and each row's window from column 0
        _compile(K.mqa_logits_kernel, dict(common, out_ptr="*fp32", M=_I, N=_I, H=_I, stride_qm=_I, stride_qh=_I,
                                            stride_kn=_I, stride_wm=_I, stride_om=_I),
                 dict(D=d, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages,
                      COMPRESSED=compressed), arch)
        _compile(K.mqa_logits_fused_kernel, dict(common, out_ptr="*fp32", M=_I, N=_I, stride_qm=_I, stride_kn=_I,
                                                  stride_wm=_I, stride_om=_I), dict(tiles, COMPRESSED=compressed),
                 arch)
    _compile(F.logits_filter_kernel, dict(common, thr_ptr=_P32, cand32_ptr=_P32, cnt_ptr=_P32, M=_I, N=_I,
                                           stride_qm=_I, stride_kn=_I, stride_wm=_I),
             dict(tiles, CAP=TC.default_cap(2048), PTX=False), arch)


def _run_child(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@amd
@pytest.mark.parametrize("arch", sorted(FP8))
@pytest.mark.parametrize("presample,fused,slices", [(False, False, 1), (True, False, 1), (False, True, 1),
                                                    (True, False, 4)])
def test_topk_kernels_compile_for_amd(arch, presample, fused, slices):
    # slices=4: rows split across programs (the shared list and its atomic counter)
    _run_child("topk", arch, str(int(presample)), str(int(fused)), str(slices))


@amd
@pytest.mark.parametrize("arch", sorted(FP8))
def test_logits_kernels_compile_for_amd(arch):
    _run_child("logits", arch)


@nvidia
@pytest.mark.parametrize("slices", [1, 4])
def test_topk_kernels_compile_for_hopper(slices):
    # slices=4: long rows split across programs, appending to one list per row
    _run_child("nvidia-topk", str(slices))


if __name__ == "__main__":
    # the child: compile one case, fail loudly
    if sys.argv[1] == "nvidia-topk":
        _nvidia_topk_kernels(int(sys.argv[2]))
    elif sys.argv[1] == "topk":
        _topk_kernels(sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1", int(sys.argv[5]))
    else:
        _logits_kernels(sys.argv[2])
