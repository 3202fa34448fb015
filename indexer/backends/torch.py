"""The reference backend: plain torch, runs everywhere (CPU included).

Each q.k dot product is computed in float64, where it is exact: fp8 e4m3 values carry 4
significant bits, so every product and partial sum of D <= 2^16 terms fits in float64's 53
bits whatever the summation order. The head sum and scaling are elementwise in a fixed
order. A row's logits are therefore bit-identical whatever chunk or block shape they are
computed in, which is what lets sharded and replicated runs agree exactly, ties included.
"""

from __future__ import annotations

import torch

from ..partition import CostModel
from ..problem import LayerInputs, Problem
from .base import Backend, Chunk
from ..topk import prepare_topk, topk_bytes

_F32_MAX = torch.finfo(torch.float32).max
_COL_BLOCK = 1024
"""Key columns per inner step; bounds the float64 temporaries to ``R x 1024`` (cache-sized: larger blocks ran slower on CPU)."""


class TorchBackend(Backend):
    """Chunked torch reference: float64-exact dots, torch.topk with lowest-index ties."""

    name = "torch"
    # blocks span the chunk's window union, so columns ~ keys for causal rows; per-row
    # constant from 'bench calibrate' on a 2-core CPU (~320 keys)
    cost_model = CostModel(per_key=1, per_width=0, per_row=300)

    def not_supported_reasons(self, problem: Problem | None) -> list[str]:
        return []

    def chunk_bytes(self, rows: torch.Tensor, width: torch.Tensor, problem: Problem) -> torch.Tensor:
        cb = width.clamp_max(_COL_BLOCK)
        # float32 logits + bool masks, float64 accumulator + head dot, the top-k's temporaries
        return rows * (6 * width + 16 * cb) + topk_bytes(problem, rows, width, "torch") + cb * problem.head_dim * 8

    def prepare(self, problem: Problem, chunks) -> None:
        prepare_topk(problem, chunks, "torch")

    def logits(self, problem: Problem, inputs: LayerInputs, chunk: Chunk) -> torch.Tensor:
        out = chunk.workspace
        a, b = chunk.rows
        lo, hi = chunk.cols
        q = inputs.q[a:b].to(torch.float64)
        w = inputs.weights[a:b].to(torch.float64)
        for c0 in range(lo, hi, _COL_BLOCK):
            c1 = min(hi, c0 + _COL_BLOCK)
            kt = inputs.k[c0:c1].to(torch.float64).t()
            acc = torch.zeros(b - a, c1 - c0, dtype=torch.float64, device=out.device)
            for h in range(problem.num_heads):
                s = q[:, h, :] @ kt
                acc.add_(s.clamp_(min=0).mul_(w[:, h : h + 1]))
            acc.mul_(inputs.k_scale[c0:c1].to(torch.float64))
            # saturate instead of overflowing to +-inf in float32: inside a window every
            # logit stays finite, below nothing but the -inf outside it
            out[:, c0 - lo : c1 - lo].copy_(acc.clamp_(-_F32_MAX, _F32_MAX))
        col = torch.arange(lo, hi, device=out.device)
        starts = problem.row_starts[a:b, None]
        ends = problem.row_ends[a:b, None]
        out.masked_fill_((col[None, :] < starts) | (col[None, :] >= ends), float("-inf"))
        return out

    def topk(self, problem: Problem, chunk: Chunk, logits: torch.Tensor, out: torch.Tensor) -> None:
        chunk.state["topk"](logits, out)


BACKEND = TorchBackend()
