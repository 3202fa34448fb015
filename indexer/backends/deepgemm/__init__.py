"""DeepGEMM backend (NVIDIA sm90 / sm100): ``deep_gemm.fp8_mqa_logits`` + the Triton or torch top-k.

Facts this wrapper relies on (DeepGEMM 2.x, measured on an H200): q must be a contiguous
fp8 e4m3fn ``[M, H, D]`` with H in {32, 64} on sm90 (8..64 on sm100) and D in {32, 64, 128}
(other head counts up to 64 are padded here with zero-weight heads, which changes nothing);
weights float32 and contiguous (the sm90 kernel assumes a row stride of H); ks/ke int32
contiguous on the GPU; the output is a non-contiguous ``[M, N]`` view (row stride padded to
``N + 256`` rounded up), or with ``max_seqlen_k=L`` (where the installed DeepGEMM has it)
compressed ``[M, L]`` rows, row i's column j being key ``ks[i] + j``; called with
``clean_logits=False`` (required when compressed), so only each row's window is written. The first
call of each (H, D) variant JIT-compiles with nvcc (cached in ``DG_JIT_CACHE_DIR``).

``deep_gemm`` is imported on first use, never at ``import indexer``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys

import torch

from ...partition import CostModel
from ...platform import current_platform, device_guard, platform_for_device
from ...problem import LayerInputs, Problem
from ..base import Backend, Chunk
from ...topk import bind_topk, prepare_topk, topk_bytes

_ARCH_HEADS = {"sm90": (32, 64), "sm100": (8, 16, 32, 64), "sm103": (8, 16, 32, 64)}


def padded_heads(heads: int, arch: str) -> int | None:
    """The head count DeepGEMM runs ``heads`` with on ``arch``: the smallest supported count
    >= ``heads`` (extra heads get zero weight), or ``None`` when there is none."""
    fits = [h for h in _ARCH_HEADS.get(arch, ()) if h >= heads]
    return min(fits) if fits else None


def pad_heads(q: torch.Tensor, weights: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad ``q [R, H, D]`` and ``weights [R, H]`` to ``heads`` heads with zero-weight heads.

    A zero weight times relu(dot) >= 0 adds exactly 0 to every logit, so the result is
    unchanged (bit for bit in any kernel that sums the heads in order).
    """
    rows, h, d = q.shape
    if h == heads:
        return q, weights
    q_pad = torch.zeros(rows, heads, d, dtype=q.dtype, device=q.device)
    q_pad[:, :h] = q
    w_pad = torch.zeros(rows, heads, dtype=weights.dtype, device=weights.device)
    w_pad[:, :h] = weights
    return q_pad, w_pad
_HEAD_DIMS = (32, 64, 128)
_INSTALL_HINT = "install DeepGEMM built for your torch (docs/install.md, 'DeepGEMM (NVIDIA)')"


#: Where DeepGEMM is looked for, in order: the package itself, then the copy vLLM ships (only
#: where vLLM is already imported: the engine's own process; importing vLLM here would be
#: slow and have side effects).
SOURCES = ("deep_gemm", "vllm.third_party.deep_gemm")


def _import_deep_gemm() -> tuple[object | None, str, str]:
    """``(module, its name, "")`` for the first of :data:`SOURCES` that imports, else
    ``(None, "", why not)``."""
    why = []
    for name in SOURCES:
        if name.startswith("vllm.") and "vllm" not in sys.modules:
            why.append(f"{name} not tried (vLLM not imported)")
            continue
        try:
            return importlib.import_module(name), name, ""
        except Exception as exc:  # noqa: BLE001 - any import failure is a reason, not a crash
            kind = "not installed" if isinstance(exc, ModuleNotFoundError) else \
                f"import failed ({type(exc).__name__}: {exc})"
            why.append(f"{name} {kind}")
    return None, "", "; ".join(why)


def _keywords(fn) -> set[str]:
    """The keyword names ``fn`` takes: from its signature, or (pybind11 functions) from the
    signature its docstring states."""
    try:
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return set(params)
    except (TypeError, ValueError):
        pass
    doc = getattr(fn, "__doc__", "") or ""
    return {word for word in ("clean_logits", "max_seqlen_k") if word in doc}


@functools.lru_cache(maxsize=1)
def _load() -> tuple[object | None, bool, str]:
    """``(logits function, whether it writes compressed rows, what was found)`` or ``(None,
    False, why not)``; imports DeepGEMM once. The function is called as ``fn(q, kv, weights,
    ks, ke, max_seqlen_k)``: 0 for full-width rows, else compressed rows of that many
    columns."""
    deep_gemm, source, why = _import_deep_gemm()
    if deep_gemm is None:
        return None, False, f"DeepGEMM: {why}; {_INSTALL_HINT}"
    for name, pair in (("fp8_fp4_mqa_logits", True), ("fp8_mqa_logits", False)):
        fn = getattr(deep_gemm, name, None)
        if fn is None:
            continue
        keywords = _keywords(fn)
        compressed = "max_seqlen_k" in keywords
        # clean_logits=False where the function takes it: every top-k here reads each row's
        # window only, so the pass that writes -inf around the windows is not needed (a copy
        # without the keyword, as vLLM's, cleans: the same windows, one pass more)
        clean = dict(clean_logits=False) if "clean_logits" in keywords else {}

        def logits(q, kv, weights, ks, ke, max_seqlen_k, fn=fn, pair=pair, compressed=compressed, clean=clean):
            extra = dict(max_seqlen_k=max_seqlen_k) if compressed else {}
            return fn((q, None) if pair else q, kv, weights, ks, ke, **clean, **extra)

        found = f"{source}.{name}" + (", compressed rows" if compressed else "") + \
            ("" if clean else ", cleans its logits")
        return logits, compressed, found
    return None, False, (f"{source} {getattr(deep_gemm, '__version__', '?')} has neither fp8_mqa_logits nor "
                         "fp8_fp4_mqa_logits")


def _align(x: torch.Tensor, to: int) -> torch.Tensor:
    return (x + to - 1) // to * to


class DeepGemmBackend(Backend):
    name = "deepgemm"
    # The driver narrows each chunk's logits to the union of its rows' windows, so a causal
    # row's top-k reads about as many columns as it has keys: cost is per key plus a per-row
    # constant. Fit on an H200 (bench calibrate): 0.016 ns/key (logits) + 0.026 ns/column
    # (clean + top-k) + 126 ns/row, i.e. per_row ~ 3000 keys.
    cost_model = CostModel(per_key=1, per_width=0, per_row=3000)
    uses_workspace = False  # DeepGEMM allocates its own (padded) output
    # its kernels load the key scales (float32) through a TMA descriptor, whose global
    # address must be 16-byte aligned: chunks start at multiples of 4 keys
    key_align = 4

    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        reasons = []
        fn, _, why = _load()
        if fn is None:
            reasons.append(why)
        if problem is None:
            plat = current_platform()
        elif problem.device.type != "cuda":
            return reasons + [f"needs an NVIDIA GPU, tensors are on {problem.device.type}"]
        else:
            plat = platform_for_device(problem.device)
        if not plat.is_cuda():
            return reasons + [f"needs an NVIDIA GPU (sm90/sm100), platform is {plat.vendor} {plat.arch}"]
        heads = _ARCH_HEADS.get(plat.arch)
        if heads is None and plat.arch != "unknown":
            reasons.append(f"needs sm90 or sm100, this GPU is {plat.arch}")
        if problem is None:
            return reasons
        if problem.fp8_dtype != torch.float8_e4m3fn:
            reasons.append(f"needs float8_e4m3fn q/k, got {problem.fp8_dtype}")
        if heads is not None and padded_heads(problem.num_heads, plat.arch) is None:
            reasons.append(f"H={problem.num_heads} heads: more than the {max(heads)} DeepGEMM runs on {plat.arch}")
        if problem.head_dim not in _HEAD_DIMS:
            reasons.append(f"head dim D={problem.head_dim} not in {_HEAD_DIMS}")
        return reasons

    def notes(self, problem: Problem) -> list[str]:
        arch = platform_for_device(problem.device).arch if problem.device.type == "cuda" else "sm90"
        hp = padded_heads(problem.num_heads, arch)
        notes = []
        if hp is not None and hp != problem.num_heads:
            notes.append(f"H={problem.num_heads} padded to {hp} heads with zero weights (DeepGEMM on {arch} runs "
                         f"{_ARCH_HEADS[arch]})")
        fn, _, found = _load()
        if fn is not None:
            notes.append(f"logits by {found}")
        return notes

    def max_chunk_bytes(self, problem: Problem) -> int | None:
        # DeepGEMM's logits kernels (sm90, sm100) and its clean pass index the block with
        # 64-bit row offsets, as do both top-k paths (the Triton kernel's row offsets, torch):
        # a chunk may pass 2 GiB (1M keys x 1024 rows: 2 chunks at the default budget, not 3)
        return None

    def chunk_rows_quantum(self, problem: Problem) -> int:
        # sm90's kernel gives each of DeepGEMM's SMs (deep_gemm.get_num_sms()) one block of
        # 128 / heads rows at a time: its time steps up at every multiple of (rows a block) x
        # (SMs) rows. Measured on an H200 at 1M keys a row: 341 rows took 8.34 ms, 264 took
        # 3.87 (docs/benchmarks.md). sm100 schedules by its own metadata: no step assumed
        arch = platform_for_device(problem.device).arch
        hp = padded_heads(problem.num_heads, arch)
        if arch != "sm90" or hp is None or problem.device.type != "cuda":
            return 1
        deep_gemm, _, _ = _import_deep_gemm()
        sms = getattr(deep_gemm, "get_num_sms", None)
        sms = sms() if sms is not None else torch.cuda.get_device_properties(problem.device).multi_processor_count
        return max(1, 128 // hp) * sms

    def chunk_bytes(self, rows: torch.Tensor, width: torch.Tensor, problem: Problem) -> torch.Tensor:
        # DeepGEMM's padded float32 rows, the top-k's temporaries
        return rows * _align(width + 256, 256) * 4 + topk_bytes(problem, rows, width)

    def logits_alloc_bytes(self, rows: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
        # rows padded to N + 256 rounded to 256 columns, row count to the q block (<= 16)
        return _align(rows, 16) * _align(width + 256, 256) * 4

    def compressed_logits(self, problem: Problem) -> bool:
        return _load()[1]

    def prepare(self, problem: Problem, chunks) -> None:
        arch = platform_for_device(problem.device).arch
        hp = padded_heads(problem.num_heads, arch)
        pad = hp is not None and hp != problem.num_heads
        if pad:
            # zero-weight heads, shared by the plan's chunks (run one after another)
            most = max((c.num_rows for c in chunks), default=0)
            q_pad = torch.zeros(most, hp, problem.head_dim, dtype=problem.fp8_dtype, device=problem.device)
            w_pad = torch.zeros(most, hp, dtype=torch.float32, device=problem.device)
            for c in chunks:
                c.state["pad"] = (q_pad[: c.num_rows], w_pad[: c.num_rows])
        prepare_topk(problem, chunks)

    def bind(self, problem: Problem, chunks) -> None:
        bind_topk(chunks)

    def logits(self, problem: Problem, inputs: LayerInputs, chunk: Chunk) -> torch.Tensor:
        fn, _, why = _load()
        if fn is None:
            raise RuntimeError(why)
        a, b = chunk.rows
        lo, hi = chunk.cols
        scales = inputs.k_scale[lo:hi].contiguous()
        if scales.data_ptr() % 16:
            # its kernels read the scales through a TMA descriptor (16-byte aligned address):
            # chunks start at multiples of key_align, so only a misaligned k_scale lands here
            scales = scales.clone()
        kv = (inputs.k[lo:hi].contiguous(), scales)
        q, w = inputs.q[a:b].contiguous(), inputs.weights[a:b].contiguous()
        pad = chunk.state.get("pad")
        if pad is not None:
            q_pad, w_pad = pad
            h = problem.num_heads
            q_pad[:, :h].copy_(q)
            w_pad[:, :h].copy_(w)
            q, w = q_pad, w_pad
        with device_guard(q):  # DeepGEMM launches on the current device
            return fn(q, kv, w, chunk.starts, chunk.ends, chunk.width if chunk.compressed else 0)

    def topk(self, problem: Problem, chunk: Chunk, logits: torch.Tensor, out: torch.Tensor) -> None:
        chunk.state["topk"](logits, out)


BACKEND = DeepGemmBackend()
