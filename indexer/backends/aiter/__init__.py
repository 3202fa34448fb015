"""AITER backend (AMD gfx950 / MI355, gfx942 / MI300): AITER's logits and prefill top-k.

- Logits: ``fp8_mqa_logits(Q, KV, kv_scales, weights, cu_starts, cu_ends)`` from
  ``aiter.ops.triton.attention.fp8_mqa_logits`` (older AITER: ``aiter.ops.triton.fp8_mqa_logits``).
  Returns float32 ``[M, N]`` (rows may be padded), ``-inf`` outside ``[start, end)``.
- Top-k: ``aiter.ops.topk.top_k_per_row_prefill(logits, starts, ends, indices, [values,]
  num_rows, stride0, stride1[, k])``. Current AITER writes *column-absolute* indices
  (``i + row_start``) and ``-1`` padding; its first release wrote row-relative ones. Which
  convention the installed AITER uses is probed once on a tiny input, then indices are
  localised to ``row_starts``. Versions without a ``k`` argument are fixed at k=2048.
- fp8: e4m3fnuz on gfx942 (MI300's native format), e4m3fn on gfx950.

``aiter`` is imported on first use only: PyPI's amd-aiter raises ``RuntimeError('ROCm version
file not found')`` at import where ROCm is absent, which becomes a reason here.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass

import torch

from ...partition import CostModel
from ...platform import current_platform, device_guard, platform_for_device
from ...problem import LayerInputs, Problem
from ..base import Backend, Chunk
from ...topk import bind_topk, prepare_topk, topk_bytes

LOGITS_MODULES = ("aiter.ops.triton.attention.fp8_mqa_logits", "aiter.ops.triton.fp8_mqa_logits")
TOPK_MODULE = "aiter.ops.topk"
_ARCHS = ("gfx942", "gfx950")
_FIXED_K = 2048


@dataclass(frozen=True)
class _Aiter:
    logits: object | None
    topk: object | None
    topk_has_k: bool
    topk_has_values: bool
    error: str


@functools.lru_cache(maxsize=1)
def _load() -> _Aiter:
    try:
        importlib.import_module("aiter")
    except Exception as exc:  # noqa: BLE001 - import failures are reasons
        kind = "not installed" if isinstance(exc, ModuleNotFoundError) else f"import failed ({type(exc).__name__}: {exc})"
        return _Aiter(None, None, False, False, f"aiter (amd-aiter) {kind}")
    logits = None
    for name in LOGITS_MODULES:
        try:
            logits = importlib.import_module(name).fp8_mqa_logits
            break
        except (ImportError, AttributeError):
            continue
    topk, has_k, has_values = None, False, False
    try:
        topk = importlib.import_module(TOPK_MODULE).top_k_per_row_prefill
        params = inspect.signature(topk).parameters
        has_k, has_values = "k" in params, "values" in params
    except (ImportError, AttributeError, TypeError, ValueError):
        topk = None
    error = "" if logits is not None else f"aiter has no fp8_mqa_logits in {' or '.join(LOGITS_MODULES)}"
    return _Aiter(logits, topk, has_k, has_values, error)


def _call_topk(api: _Aiter, logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, out: torch.Tensor, k: int) -> None:
    rows = logits.shape[0]
    args = [logits, starts, ends, out] + ([None] if api.topk_has_values else []) + [rows, logits.stride(0), logits.stride(1)]
    if api.topk_has_k:
        api.topk(*args, k=k)
    else:
        api.topk(*args)


@functools.lru_cache(maxsize=None)
def _topk_is_absolute(device: torch.device) -> bool:
    """Whether the installed top_k_per_row_prefill writes column-absolute indices.

    One row of 4096 columns whose window [3000, 4096) is shorter than k: every key is
    listed, so absolute indices start at 3000 and relative ones at 0.
    """
    api = _load()
    logits = torch.linspace(-1.0, 1.0, 4096, device=device)[None, :]  # deterministic, no RNG draw
    out = torch.full((1, _FIXED_K), -1, dtype=torch.int32, device=device)
    starts = torch.tensor([3000], dtype=torch.int32, device=device)
    ends = torch.tensor([4096], dtype=torch.int32, device=device)
    _call_topk(api, logits, starts, ends, out, _FIXED_K)
    valid = out[out >= 0]
    return bool(valid.numel()) and int(valid.min()) >= 3000


class AiterBackend(Backend):
    name = "aiter"
    cost_model = CostModel(per_key=1, per_width=0, per_row=3000)
    uses_workspace = False  # AITER allocates its own logits
    # AITER's Triton logits kernel picks its MMA width from the row count (16-wide up to
    # 1024 rows, 32-wide above, read in its source): one regime for every chunk keeps a
    # row's bits the same whichever rank and chunk compute it
    max_chunk_rows = 1024
    # AITER's top_k_per_row_prefill writes row i at i * k, whatever out's row stride
    strided_out = False

    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        api = _load()
        reasons = [api.error] if api.error else []
        plat = current_platform() if problem is None else None
        if problem is not None:
            if problem.device.type != "cuda" or not torch.version.hip:
                return reasons + [f"needs an AMD GPU (ROCm torch), tensors are on {problem.device.type}"]
            plat = platform_for_device(problem.device)
        if not plat.is_rocm():
            return reasons + [f"needs an AMD GPU (gfx942/gfx950), platform is {plat.vendor} {plat.arch}"]
        if plat.arch not in _ARCHS and plat.arch != "unknown":
            reasons.append(f"needs gfx942 or gfx950, this GPU is {plat.arch}")
        if problem is not None:
            reasons += self.problem_reasons(problem, plat.fp8_dtype, api)
        return reasons

    @staticmethod
    def problem_reasons(problem: Problem, fp8_dtype: torch.dtype, api: _Aiter) -> list[str]:
        """Shape and dtype reasons, separate from the device ones so contract tests can
        exercise them with a stand-in AITER on the CPU."""
        reasons = []
        if problem.fp8_dtype != fp8_dtype:
            reasons.append(f"needs {fp8_dtype} q/k on this GPU, got {problem.fp8_dtype}")
        h, d = problem.num_heads, problem.head_dim
        if h & (h - 1) or d & (d - 1):
            reasons.append(f"AITER's kernel needs power-of-two H and D, got H={h} D={d}")
        if api.topk is not None and not api.topk_has_k and problem.topk != _FIXED_K:
            reasons.append(f"this AITER's top_k_per_row_prefill is fixed at k={_FIXED_K}, topk={problem.topk}")
        return reasons

    def chunk_bytes(self, rows: torch.Tensor, width: torch.Tensor, problem: Problem) -> torch.Tensor:
        # AITER's padded float32 rows, the top-k's output (ours where AITER has none)
        return self.logits_alloc_bytes(rows, width) + torch.maximum(rows * 8 * problem.topk,
                                                                   topk_bytes(problem, rows, width))

    def logits_alloc_bytes(self, rows: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
        return rows * ((width + 255) // 256 * 256) * 4  # AITER pads rows to 256 columns

    def prepare(self, problem: Problem, chunks) -> None:
        api = _load()
        if api.topk is None:  # older AITER without a prefill top-k
            prepare_topk(problem, chunks)
        elif problem.device.type == "cuda" and any(not c.empty for c in chunks):
            _topk_is_absolute(problem.device)  # probed here, at plan time, not mid-run

    def bind(self, problem: Problem, chunks) -> None:
        bind_topk(chunks)

    def logits(self, problem: Problem, inputs: LayerInputs, chunk: Chunk) -> torch.Tensor:
        api = _load()
        if api.logits is None:
            raise RuntimeError(api.error)
        a, b = chunk.rows
        lo, hi = chunk.cols
        q = inputs.q[a:b].contiguous()
        with device_guard(q):  # a Triton launch: on the current device
            return api.logits(q, inputs.k[lo:hi].contiguous(), inputs.k_scale[lo:hi].contiguous(),
                              inputs.weights[a:b].contiguous(), chunk.starts, chunk.ends)

    def topk(self, problem: Problem, chunk: Chunk, logits: torch.Tensor, out: torch.Tensor) -> None:
        run = chunk.state.get("topk")
        if run is not None:
            run(logits, out)
            return
        api = _load()
        _call_topk(api, logits, chunk.starts, chunk.ends, out, problem.topk)
        if _topk_is_absolute(logits.device):
            out.sub_(torch.where(out >= 0, chunk.starts[:, None], 0))


BACKEND = AiterBackend()
