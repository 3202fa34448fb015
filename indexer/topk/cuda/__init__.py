"""A CUDA C++ top-k for short rows: one thread block a row, compiled at first use.

The kernel (``row_topk.cu`` beside this file) holds a row's window in registers and finds
its k-th largest key by a radix select with shared-memory histograms, in one launch and one
read of the logits. It needs ``nvcc`` (the CUDA toolkit) where it first runs; the library
built from it is cached on disk (``$XDG_CACHE_HOME/indexer/native``, keyed by the source, the
GPU architecture and the compiler), so later processes load it without compiling.

Nothing here imports or compiles at ``import indexer``: :func:`native_reasons` answers
whether the kernel can run (and builds it the first time it is asked with a device).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("row_topk.cu")

#: (threads, keys a thread) compiled into the library, in the order :func:`shape_for` tries
#: them; a shape holds windows of up to ``threads * keys`` keys. 16K-key rows take 512
#: threads of 32 keys (two blocks an SM) rather than 1024 of 16 (one block an SM, its
#: registers full), which is compiled for ``shape=`` and measured slower (docs/topk.md).
SHAPES = ((256, 16), (512, 16), (512, 32), (1024, 24), (1024, 32), (1024, 16))

#: the longest window the kernel takes
MAX_KEYS = max(threads * slots for threads, slots in SHAPES)


def shape_for(n: int) -> tuple[int, int]:
    """The smallest compiled ``(threads, keys a thread)`` whose block holds windows of ``n`` keys.

    Raises:
        ValueError: ``n`` is over :data:`MAX_KEYS`.
    """
    for threads, slots in SHAPES:
        if threads * slots >= n:
            return threads, slots
    raise ValueError(f"windows of {n} keys: the native row top-k takes at most {MAX_KEYS}")


#: rows an SM a chunk may give the native kernel, per block shape (:func:`shape_for`): where
#: more rows queue on every SM, the Triton top-k's sample / filter / select launches, which
#: stream, are as fast or faster (each block waits on its own row's passes). From the
#: measurements in docs/benchmarks.md ("The native row top-k"), with margin for the H200,
#: whose bandwidth favours the Triton launches more than the H100's.
ROWS_PER_SM = {(256, 16): 16, (512, 16): 32, (512, 32): 8, (1024, 24): 2, (1024, 32): 2, (1024, 16): 4}


def native_fits(rows: int, n: int, sms: int) -> bool:
    """Whether a chunk of ``rows`` rows of at most ``n`` keys is the native kernel's on a GPU
    of ``sms`` SMs: ``n <= MAX_KEYS`` and ``rows <= ROWS_PER_SM[shape_for(n)] * sms``."""
    return n <= MAX_KEYS and rows <= ROWS_PER_SM[shape_for(n)] * sms


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _library(arch: str) -> tuple[object | None, str]:
    """``(launch function, "")`` for ``arch`` (``"90"``), or ``(None, why not)``."""
    nvcc = _nvcc()
    if nvcc is None:
        return None, "nvcc not found (set CUDA_HOME or put the CUDA toolkit's bin on PATH)"
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{nvcc} --version failed: {exc}"
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + arch.encode() + version.encode()).hexdigest()[:16]
    from ... import envs

    target = envs.cache_dir() / "native" / f"row_topk_sm{arch}_{digest}.so"
    with _lock:
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            # built beside the target and renamed: another process never loads a half-written file
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
            cmd = [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17",
                   f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", tmp, str(_SOURCE)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.SubprocessError) as exc:
                os.unlink(tmp)
                return None, f"compiling {_SOURCE.name} failed: {exc}"
            if done.returncode != 0:
                os.unlink(tmp)
                return None, f"compiling {_SOURCE.name} failed: {(done.stderr or done.stdout).strip()[-600:]}"
            os.replace(tmp, target)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"loading {target} failed: {exc}"
    fn = lib.indexer_row_topk_launch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    return fn, ""


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}"


def native_reasons(device: torch.device) -> list[str]:
    """Why the native row top-k cannot run on ``device`` (empty: it can). Builds the kernel
    the first time it is asked for a GPU's architecture (seconds; cached on disk)."""
    if device.type != "cuda":
        return [f"needs an NVIDIA GPU, not {device.type}"]
    if torch.version.cuda is None:
        return ["this torch is not built for CUDA (a ROCm build: the kernel is CUDA C++)"]
    fn, why = _library(_arch(device))
    return [] if fn is not None else [why]


class NativeRowTopk:
    """The native row top-k of one block of rows, bound once: ``run(logits, out)``.

    Args:
        device: The CUDA device.
        rows: Rows of the block (R).
        n: Its columns; every window fits in them (at most :data:`MAX_KEYS`).
        starts_rel: int32 or int64 ``[R]`` on ``device``, contiguous: each row's first column.
            Read in place at every call (a refresh by ``copy_`` is seen).
        lengths: The same layout: keys in each row's window.
        topk: Keys kept a row.
        shape: ``(threads, keys a thread)``, one of :data:`SHAPES` holding ``n`` keys
            (default :func:`shape_for`).

    Raises:
        ValueError: A vector of another layout, ``n`` too wide, or a shape that cannot hold it.
        RuntimeError: The kernel cannot run on ``device`` (:func:`native_reasons`).
    """

    def __init__(self, device: torch.device, rows: int, n: int, starts_rel: torch.Tensor, lengths: torch.Tensor,
                 topk: int, shape: tuple[int, int] | None = None):
        from ...platform import indexed_device

        device = indexed_device(device)
        why = native_reasons(device)
        if why:
            raise RuntimeError("the native row top-k cannot run: " + "; ".join(why))
        for name, v in (("starts_rel", starts_rel), ("lengths", lengths)):
            if v.dtype not in (torch.int32, torch.int64) or v.device != device or v.numel() != rows or (
                    rows > 1 and v.stride(-1) != 1):
                raise ValueError(f"{name} must be a contiguous int32/int64 [{rows}] tensor on {device}, got "
                                 f"{v.dtype} {tuple(v.shape)} on {v.device}")
        if starts_rel.dtype != lengths.dtype:
            raise ValueError(f"starts_rel and lengths must share a dtype, got {starts_rel.dtype} and {lengths.dtype}")
        if shape is None:
            shape = shape_for(n)
        elif tuple(shape) not in SHAPES or shape[0] * shape[1] < n:
            raise ValueError(f"shape {shape}: not one of {SHAPES} that holds {n} keys")
        self.threads, self.slots = shape
        self.device, self.rows, self.n, self.topk = device, rows, n, topk
        self.starts_rel, self.lengths = starts_rel, lengths
        self._fn = _library(_arch(device))[0]
        self._index_bytes = starts_rel.element_size()
        self._starts, self._lengths = starts_rel.data_ptr(), lengths.data_ptr()
        from torch._C import _cuda_getCurrentRawStream

        self._stream = _cuda_getCurrentRawStream

    def __call__(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        """Fill ``out`` (int32 ``[R, topk]``, column stride 1) with each row's top-k columns,
        relative to its window's start, ``-1`` padded; ``logits`` float32 ``[R, n]``, column
        stride 1, on the device. Launches on the current stream."""
        rc = self._fn(self.threads, self.slots, self._index_bytes, self.rows, logits.data_ptr(), logits.stride(0),
                      self._starts, self._lengths, out.data_ptr(), out.stride(0), self.topk,
                      self._stream(self.device.index))
        if rc != 0:
            raise RuntimeError(f"the native row top-k did not launch (error {rc})")
