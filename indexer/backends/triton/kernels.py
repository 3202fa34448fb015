"""Triton kernel for the "lightning indexer" logits of sparse-attention LLMs.

    logits[m, n] = sum_h weights[m, h] * relu(q[m, h, :] . k[n, :]) * k_scale[n]
                   for row_starts[m] <= n < row_ends[m], -inf otherwise.

q / k are fp8 (``float8_e4m3fn``, or ``float8_e4m3fnuz`` on AMD); the dot is
fp8 x fp8 -> fp32.  Triton is imported lazily: importing this module never
fails when Triton is missing; use :func:`is_available` to check.

Two kernels. Power-of-two H runs a fused kernel: one program owns ``BLOCK_Q`` query
rows and all H heads of each, walks the key tiles of the union ``[lo, hi)`` of its rows'
(non-empty) windows, and per tile computes one MMA of the K tile against the
``BLOCK_Q * H`` (row, head) query vectors, applies relu and the weights, sums the heads,
scales by ``k_scale`` and masks each row to its window with ``-inf``; tiles outside the
union are only filled with ``-inf``. Keys sit on the MMA's M dimension (as DeepGEMM lays
it out), so the head sum stays mostly inside a thread's registers. Other H run
the per-head kernel: a 2-D grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))`` whose program
loops over the heads doing ``tl.dot(q[:, h, :], k_tile^T)``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

try:  # lazy / optional import
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported by is_available
    triton = None
    tl = None

from ...platform import device_guard
from ...topk.triton.launch import is_available, launch_reasons  # noqa: F401 - used here and re-exported

__all__ = ["LogitsLaunch", "is_available", "mqa_logits"]

_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz")
    if hasattr(torch, name)
)


if triton is not None:

    @triton.jit
    def _row_windows(starts_ptr, ends_ptr, rows, rmask, N):
        """The rows' windows and ``[lo, hi)``, the union of the non-empty ones."""
        starts = tl.load(starts_ptr + rows, mask=rmask, other=0)
        ends = tl.load(ends_ptr + rows, mask=rmask, other=0)
        nonempty = rmask & (starts < ends)
        lo = tl.min(tl.where(nonempty, starts, N), axis=0)
        hi = tl.max(tl.where(nonempty, ends, 0), axis=0)
        return starts, ends, lo, hi

    @triton.jit
    def mqa_logits_kernel(
        q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, out_ptr,
        M, N, H,
        stride_qm, stride_qh,
        stride_kn,
        stride_wm,
        stride_om,
        D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        COMPRESSED: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        m_mask = offs_m < M
        n_mask = offs_n < N

        starts, ends, lo, hi = _row_windows(starts_ptr, ends_ptr, offs_m, m_mask, N)

        offs_m64 = offs_m.to(tl.int64)
        out_ptrs = out_ptr + offs_m64[:, None] * stride_om + offs_n[None, :]
        store_mask = m_mask[:, None] & n_mask[None, :]
        tile_lo = pid_n * BLOCK_N

        if (tile_lo >= hi) | (tile_lo + BLOCK_N <= lo):
            # Key tile outside every window of this block: just fill -inf (compressed rows
            # hold their windows only: nothing to write)
            if not COMPRESSED:
                neg = tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32)
                tl.store(out_ptrs, neg, mask=store_mask)
        else:
            # K tile [BLOCK_N, D], loaded once and reused by all heads.
            k_ptrs = (k_ptr + offs_n.to(tl.int64)[:, None] * stride_kn
                      + offs_d[None, :])
            k_tile = tl.load(k_ptrs, mask=n_mask[:, None], other=0.0)
            k_t = tl.trans(k_tile)  # [D, BLOCK_N]

            q_ptrs = (q_ptr + offs_m64[:, None] * stride_qm
                      + offs_d[None, :])
            w_ptrs = w_ptr + offs_m64 * stride_wm

            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for h in range(H):
                q_h = tl.load(q_ptrs + h * stride_qh, mask=m_mask[:, None],
                              other=0.0)
                w_h = tl.load(w_ptrs + h, mask=m_mask, other=0.0)
                s = tl.dot(q_h, k_t, out_dtype=tl.float32)
                s = tl.maximum(s, 0.0)
                acc += s * w_h[:, None]

            k_scale = tl.load(k_scale_ptr + offs_n, mask=n_mask, other=0.0)
            acc = acc * k_scale[None, :]

            valid = ((offs_n[None, :] >= starts[:, None])
                     & (offs_n[None, :] < ends[:, None]))
            if COMPRESSED:
                # row m's column j is key starts[m] + j
                tl.store(out_ptr + offs_m64[:, None] * stride_om + (offs_n[None, :] - starts[:, None]), acc,
                         mask=store_mask & valid)
            else:
                acc = tl.where(valid, acc, float("-inf"))
                tl.store(out_ptrs, acc, mask=store_mask)


    @triton.jit
    def _keys_major_operands(q_ptr, w_ptr, pid, M, stride_qm, stride_wm, H: tl.constexpr, D: tl.constexpr,
                             BLOCK_Q: tl.constexpr):
        """Program ``pid``'s query operand, fp8 ``[D, BLOCK_Q * H]`` ((row, head) pairs on the
        MMA's N dimension), and the matching weights, float32 ``[BLOCK_Q * H]`` (0 past M)."""
        qh = tl.arange(0, BLOCK_Q * H)
        q_row = (pid * BLOCK_Q + qh // H).to(tl.int64)
        q_head = qh % H
        qmask = q_row < M
        offs_d = tl.arange(0, D)
        q_t = tl.load(q_ptr + q_row[None, :] * stride_qm + q_head[None, :] * D + offs_d[:, None],
                      mask=qmask[None, :], other=0.0)
        w = tl.load(w_ptr + q_row * stride_wm + q_head, mask=qmask, other=0.0)
        return q_t, w

    @triton.jit
    def _keys_major_tile(k_ptr, k_scale_ptr, cols, cmask, stride_kn, q_t, w, H: tl.constexpr, D: tl.constexpr,
                         BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr):
        """Logits float32 ``[BLOCK_N, BLOCK_Q]`` of keys ``cols`` (``[BLOCK_N]``, ``cmask``
        the ones below N) against the program's rows: one MMA of the K tile against all
        ``BLOCK_Q * H`` (row, head) pairs, relu, weights, the head sum, the keys' scales.
        Every kernel that needs the logits computes them here, so that they agree to the bit."""
        k_tile = tl.load(k_ptr + cols.to(tl.int64)[:, None] * stride_kn + tl.arange(0, D)[None, :],
                         mask=cmask[:, None], other=0.0)
        sc = tl.dot(k_tile, q_t, out_dtype=tl.float32)  # [BLOCK_N, BLOCK_Q * H]
        sc = tl.maximum(sc, 0.0) * w[None, :]
        logit = tl.sum(tl.reshape(sc, (BLOCK_N, BLOCK_Q, H)), axis=2)
        scale = tl.load(k_scale_ptr + cols, mask=cmask, other=0.0)
        return logit * scale[:, None]

    @triton.jit
    def mqa_logits_fused_kernel(
        q_ptr, k_ptr, k_scale_ptr, w_ptr, starts_ptr, ends_ptr, out_ptr,
        M, N,
        stride_qm,
        stride_kn,
        stride_wm,
        stride_om,
        H: tl.constexpr,
        D: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
        COMPRESSED: tl.constexpr,
    ):
        # One program owns BLOCK_Q query rows, all H heads of each. Keys go on the MMA's M
        # dimension and the BLOCK_Q * H (row, head) pairs on N, as DeepGEMM lays it out: the
        # sum over heads then runs along the accumulator's N dimension, which a thread holds
        # mostly in its own registers (with the pairs on M it crossed warps through shared
        # memory, and the kernel ran at a third of the speed). The q operand stays loaded
        # for the whole walk, and each K tile serves BLOCK_Q * H dot products. The key walk
        # is split in three loops so the one that computes has no branch inside (Triton
        # software-pipelines its K loads) and the -inf fill outside the rows' window union
        # costs no MMA.
        pid = tl.program_id(0)
        rows = pid * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rmask = rows < M
        starts, ends, lo, hi = _row_windows(starts_ptr, ends_ptr, rows, rmask, N)

        q_t, w = _keys_major_operands(q_ptr, w_ptr, pid, M, stride_qm, stride_wm, H, D, BLOCK_Q)

        rows64 = rows.to(tl.int64)
        lo_t = (lo // BLOCK_N) * BLOCK_N
        hi_t = tl.maximum(((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo_t)
        neg = tl.full((BLOCK_N, BLOCK_Q), float("-inf"), tl.float32)
        if not COMPRESSED:
            for n0 in range(0, lo_t, BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                tl.store(out_ptr + rows64[None, :] * stride_om + cols[:, None], neg,
                         mask=rmask[None, :] & (cols < N)[:, None])
        for n0 in range(lo_t, hi_t, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            logit = _keys_major_tile(k_ptr, k_scale_ptr, cols, cmask, stride_kn, q_t, w, H, D, BLOCK_Q, BLOCK_N)
            valid = (cols[:, None] >= starts[None, :]) & (cols[:, None] < ends[None, :])
            if COMPRESSED:
                # row m's column j is key starts[m] + j: the window only
                tl.store(out_ptr + rows64[None, :] * stride_om + (cols[:, None] - starts[None, :]), logit,
                         mask=rmask[None, :] & valid)
            else:
                tl.store(out_ptr + rows64[None, :] * stride_om + cols[:, None],
                         tl.where(valid, logit, float("-inf")), mask=rmask[None, :] & cmask[:, None])
        if not COMPRESSED:
            for n0 in range(hi_t, N, BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                tl.store(out_ptr + rows64[None, :] * stride_om + cols[:, None], neg,
                         mask=rmask[None, :] & (cols < N)[:, None])


    from ...topk.triton.launch import Launcher as _Launcher

    _FUSED = _Launcher(mqa_logits_fused_kernel)


class FusedConfig(NamedTuple):
    """Launch config of the fused kernel.

    Attributes:
        block_q: Query rows per program (``block_q * H`` (row, head) pairs in one MMA operand).
        block_n: Keys per tile.
        num_warps, num_stages: Triton launch options.
    """

    block_q: int
    block_n: int
    num_warps: int
    num_stages: int


# Fused-kernel launch configs, one per (H, D), never per chunk: the head sum's reduction
# order follows the tile layout, so a config picked per chunk shape (or by a per-process
# autotune that timing noise can sway) could give a row different bits on different ranks
# and break sharded == replicated. Entries come from ``bench kernels --tune-triton``.
FUSED_CONFIGS: dict[tuple[int, int], FusedConfig] = {
    # H200, DeepSeek-V3.2 / GLM-5 indexer shape (see docs/benchmarks.md)
    (64, 128): FusedConfig(block_q=4, block_n=64, num_warps=4, num_stages=3),
}


def fused_config(heads: int, head_dim: int) -> FusedConfig:
    """The fused kernel's config for ``(heads, head_dim)``: the table's, else the default
    (``128 / H`` rows a program, 128-key tiles)."""
    cfg = FUSED_CONFIGS.get((heads, head_dim))
    return cfg if cfg is not None else FusedConfig(_FUSED_ROWS // heads, 128, 8, 2)


_FUSED_ROWS = 128  # default BLOCK_Q * H: (row, head) pairs in one MMA operand


def fused_supported(heads: int) -> bool:
    """Whether the fused kernel runs ``heads`` (a power of two, at most 128)."""
    return 0 < heads <= _FUSED_ROWS and heads & (heads - 1) == 0


def pick_config(M: int, N: int, D: int) -> Tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the per-head kernel.

    A function of D only, never of the chunk's M or N: a smaller tile can lower to another
    MMA instruction (mma.sync rather than wgmma below 64 rows) that may round differently,
    and a rank's last chunk is often small, so a per-chunk choice could give a row other
    bits on another rank. Short chunks pay for masked rows instead.
    """
    return 64, 128, 8 if D >= 128 else 4, 2


def mqa_logits(q: torch.Tensor,
               k: torch.Tensor,
               k_scale: torch.Tensor,
               weights: torch.Tensor,
               row_starts: torch.Tensor,
               row_ends: torch.Tensor,
               out: Optional[torch.Tensor] = None,
               force_per_head: bool = False,
               compressed: Optional[int] = None) -> torch.Tensor:
    """Indexer logits ``[M, N]`` (float32, ``-inf`` outside each row window).

    q: fp8 [M, H, D]; k: fp8 [N, D] (same dtype); k_scale: float32 [N];
    weights: float32 [M, H]; row_starts / row_ends: int32 [M] with
    ``0 <= start <= end <= N``.  ``out`` may be a float32 [M, N] view whose
    rows are strided (row stride >= N) but whose columns are contiguous.

    ``compressed=W`` (at least every row's window length) writes ``[M, W]`` instead: row
    m's column j is key ``row_starts[m] + j``, only the window written (the rest of a row
    left as it was). The window's values are the same bits either way.

    H a power of two (<= 128) runs the fused kernel (all heads of 128/H rows in one
    MMA operand); other H, or ``force_per_head``, the per-head loop kernel.
    """
    ok, why = is_available()
    if not ok:
        raise RuntimeError(why)
    if q.dim() != 3 or k.dim() != 2:
        raise ValueError(f"expected q [M,H,D] and k [N,D], got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    M, H, D = q.shape
    N = k.shape[0]
    if k.shape[1] != D:
        raise ValueError(f"head dim mismatch: q D={D}, k D={k.shape[1]}")
    if q.dtype != k.dtype or q.dtype not in _FP8_DTYPES:
        raise TypeError(f"q/k must share an fp8 e4m3 dtype, got {q.dtype}/{k.dtype}")
    if D not in (32, 64, 128):
        raise ValueError(f"D must be 32, 64 or 128, got {D}")
    if tuple(weights.shape) != (M, H):
        raise ValueError(f"weights must be [M, H]={M, H}, got {tuple(weights.shape)}")
    if tuple(k_scale.shape) != (N,):
        raise ValueError(f"k_scale must be [N]={N}, got {tuple(k_scale.shape)}")
    if tuple(row_starts.shape) != (M,) or tuple(row_ends.shape) != (M,):
        raise ValueError("row_starts / row_ends must be [M]")

    width = N if compressed is None else int(compressed)
    if out is None:
        out = torch.empty((M, width), dtype=torch.float32, device=q.device)
    else:
        if out.dtype != torch.float32 or tuple(out.shape) != (M, width):
            raise ValueError(f"out must be float32 [M, {'N' if compressed is None else 'W'}]={M, width}, got "
                             f"{out.dtype} {tuple(out.shape)}")
        if width > 0 and M > 0 and (out.stride(1) != 1 or out.stride(0) < width):
            raise ValueError("out needs column stride 1 and row stride >= its width")
    if M == 0 or N == 0 or width == 0:
        return out

    if q.stride(2) != 1:
        q = q.contiguous()
    if k.stride(1) != 1:
        k = k.contiguous()
    weights = weights.to(torch.float32)
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    k_scale = k_scale.to(torch.float32).contiguous()
    row_starts = row_starts.to(torch.int32).contiguous()
    row_ends = row_ends.to(torch.int32).contiguous()

    if fused_supported(H) and not force_per_head:
        q3 = q.contiguous()
        cfg = fused_config(H, D)
        with device_guard(q):
            mqa_logits_fused_kernel[(triton.cdiv(M, cfg.block_q),)](
                q3, k, k_scale, weights, row_starts, row_ends, out,
                M, N, q3.stride(0), k.stride(0), weights.stride(0), out.stride(0),
                H=H, D=D, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, COMPRESSED=compressed is not None,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )
        return out

    block_m, block_n, num_warps, num_stages = pick_config(M, N, D)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))

    with device_guard(q):
        mqa_logits_kernel[grid](
            q, k, k_scale, weights, row_starts, row_ends, out,
            M, N, H,
            q.stride(0), q.stride(1),
            k.stride(0),
            weights.stride(0),
            out.stride(0),
            D=D, BLOCK_M=block_m, BLOCK_N=block_n, COMPRESSED=compressed is not None,
            num_warps=num_warps, num_stages=num_stages,
        )
    return out


class LogitsLaunch:
    """:func:`mqa_logits` into one fixed ``out`` block, prepared once (a step plan's chunk):
    the fused kernel's launch bound (:meth:`indexer.topk.triton.launch.Launcher.bind`) with everything but the
    four input tensors, which a call gives. Inputs not laid out as bound (another row stride,
    non-contiguous heads) and head counts the fused kernel does not run take
    :func:`mqa_logits` itself.

    Args:
        rows, heads, head_dim: ``M``, ``H``, ``D`` of the calls' ``q``.
        keys: ``N`` of their ``k``.
        row_starts, row_ends: int32 ``[M]`` on the device (read at every call).
        out: float32 ``[M, width]`` block the calls fill.
        compressed: ``width`` for compressed rows (:func:`mqa_logits`), else None.
    """

    def __init__(self, rows: int, heads: int, head_dim: int, keys: int, row_starts: torch.Tensor,
                 row_ends: torch.Tensor, out: torch.Tensor, compressed: Optional[int] = None):
        self.shape = (rows, heads, head_dim, keys)
        self.row_starts, self.row_ends, self.out, self.compressed = row_starts, row_ends, out, compressed
        self.bound = None
        ok, _ = is_available()
        if (ok and fused_supported(heads) and rows and keys and out.stride(1) == 1 and row_starts.dtype == torch.int32
                and row_ends.dtype == torch.int32 and row_starts.is_contiguous() and row_ends.is_contiguous()):
            from ...topk.triton.launch import LaunchKw

            cfg = fused_config(heads, head_dim)
            self.grid = triton.cdiv(rows, cfg.block_q)
            kw = LaunchKw(H=heads, D=head_dim, BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n,
                          COMPRESSED=compressed is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            args = (0, 0, 0, 0, row_starts, row_ends, out, rows, keys, heads * head_dim, head_dim, heads,
                    out.stride(0))
            direct = out.is_cuda and torch.version.hip is None
            self.bound = _FUSED.bind(args, kw, out.get_device() if out.is_cuda else 0, direct, (0, 1, 2, 3))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        m, h, d, n = self.shape
        if (self.bound is not None and q.stride() == (h * d, d, 1) and k.stride() == (d, 1)
                and weights.stride() == (h, 1) and k_scale.stride() == (1,)):
            with device_guard(q):
                self.bound(self.grid, q, k, k_scale, weights)
            return self.out
        return mqa_logits(q, k, k_scale, weights, self.row_starts, self.row_ends, out=self.out,
                          compressed=self.compressed)
