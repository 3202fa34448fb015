"""Portable Triton backend: our own row-blocked fp8 logits kernels; top-k as ``INDEXER_TOPK`` says.

Runs wherever Triton compiles fp8 ``tl.dot``: NVIDIA sm89+ (Ada, Hopper, Blackwell) and AMD
CDNA3+ (gfx942, gfx950). On a CPU tensor it runs only under Triton's interpreter
(``TRITON_INTERPRET=1``), which the tests use; automatic dispatch never picks it there.
"""

from __future__ import annotations

import torch

from ...partition import CostModel
from ...platform import platform_for_device
from ...problem import LayerInputs, Problem
from ..base import Backend, Chunk
from ...topk import bind_topk, prepare_topk, topk_bytes

_HEAD_DIMS = (32, 64, 128)
_AMD_FP8_ARCHS = ("gfx942", "gfx950")


def _kmod():
    from . import kernels as k  # imports triton lazily, never raises

    return k


class TritonBackend(Backend):
    name = "triton"
    cost_model = CostModel(per_key=1, per_width=0, per_row=3000)

    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        reasons = _kmod().launch_reasons(problem.device if problem is not None else None)
        if problem is None:
            return reasons
        device = problem.device  # on CPU, launch_reasons checked the interpreter
        if device.type == "cuda":
            plat = platform_for_device(device)
            if plat.is_rocm() and plat.arch not in _AMD_FP8_ARCHS:
                reasons.append(f"fp8 tl.dot needs gfx942/gfx950, this GPU is {plat.arch}")
            if plat.is_cuda() and plat.arch[2:].isdigit() and int(plat.arch[2:]) < 89:
                reasons.append(f"fp8 tl.dot needs sm89 or newer, this GPU is {plat.arch}")
        elif device.type != "cpu":
            reasons.append(f"unsupported device type {device.type!r}")
        if problem.head_dim not in _HEAD_DIMS:
            reasons.append(f"head dim D={problem.head_dim} not in {_HEAD_DIMS}")
        return reasons

    def compressed_logits(self, problem: Problem) -> bool:
        return True

    def prepare(self, problem: Problem, chunks) -> None:
        prepare_topk(problem, chunks)

    def bind(self, problem: Problem, chunks) -> None:
        bind_topk(chunks)
        for c in chunks:
            if not c.empty:
                # the logits launch bound to the chunk's workspace block and index tensors
                c.state["logits"] = _kmod().LogitsLaunch(
                    c.num_rows, problem.num_heads, problem.head_dim, c.cols[1] - c.cols[0], c.starts, c.ends,
                    c.workspace, c.width if c.compressed else None)

    def logits(self, problem: Problem, inputs: LayerInputs, chunk: Chunk) -> torch.Tensor:
        a, b = chunk.rows
        lo, hi = chunk.cols
        return chunk.state["logits"](inputs.q[a:b], inputs.k[lo:hi], inputs.k_scale[lo:hi], inputs.weights[a:b])

    def chunk_bytes(self, rows: torch.Tensor, width: torch.Tensor, problem: Problem) -> torch.Tensor:
        # the float32 logits and the top-k's temporaries
        return rows * width * 4 + topk_bytes(problem, rows, width)

    def topk(self, problem: Problem, chunk: Chunk, logits: torch.Tensor, out: torch.Tensor) -> None:
        chunk.state["topk"](logits, out)


BACKEND = TritonBackend()
