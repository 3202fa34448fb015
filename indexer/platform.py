"""Which accelerator we run on: vendor, architecture, device count.

One class per vendor, each with capability predicates. Detection asks NVML (nvidia-ml-py)
or amdsmi when installed and falls back to what torch knows without initialising its
device runtime, so calling :func:`current_platform` never creates a CUDA/HIP context and
a process can still fork afterwards. Nothing here runs at import time.

Architecture names follow the compilers: ``sm90`` (H100/H200), ``sm100`` (B200), ``gfx942``
(MI300), ``gfx950`` (MI355), ``cpu``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, replace
from typing import ClassVar

import torch


@dataclass(frozen=True)
class Platform:
    """What the library needs to know about the machine.

    Attributes:
        arch: Architecture name (``sm90``, ``gfx950``, ``cpu``; ``unknown`` when no probe
            could tell without creating a device context).
        device_name: Marketing name of device 0 (or of the device asked for).
        device_count: Number of visible devices of this vendor.
        probe: What answered: ``pynvml``, ``amdsmi``, ``torch`` or ``none``.
        notes: Why a better probe was not used (missing package, import error...).
    """

    arch: str = "cpu"
    device_name: str = "cpu"
    device_count: int = 0
    probe: str = "none"
    notes: tuple[str, ...] = ()

    key: ClassVar[str] = "cpu"
    """Platform key, used in per-platform env flags (``INDEXER_<KEY>_*``)."""
    vendor: ClassVar[str] = "cpu"
    backend_priority: ClassVar[tuple[str, ...]] = ("torch",)
    """Backends to try, best first."""

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return self.key == "cpu"

    def has_fp8_fnuz(self) -> bool:
        """Whether the native fp8 format is e4m3fnuz (MI300, gfx942) rather than e4m3fn."""
        return False

    @property
    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz if self.has_fp8_fnuz() else torch.float8_e4m3fn

    def describe(self) -> str:
        """One line: ``cpu [probe: torch]``, ``nvidia sm90 (8 x NVIDIA H200) [probe: pynvml]``."""
        if self.is_cpu():  # vendor and arch are both "cpu": said once
            return f"cpu [probe: {self.probe}]"
        text = f"{self.vendor} {self.arch}"
        if self.device_count:
            text += f" ({self.device_count} x {self.device_name})"
        return text + f" [probe: {self.probe}]"


class CpuPlatform(Platform):
    pass


@dataclass(frozen=True)
class CudaPlatform(Platform):
    key = "cuda"
    vendor = "nvidia"
    backend_priority = ("deepgemm", "triton", "torch")

    def is_cuda(self) -> bool:
        return True

    def is_hopper(self) -> bool:
        return self.arch == "sm90"

    def is_blackwell(self) -> bool:
        return self.arch in ("sm100", "sm103")


@dataclass(frozen=True)
class RocmPlatform(Platform):
    key = "rocm"
    vendor = "amd"
    backend_priority = ("aiter", "triton", "torch")

    def is_rocm(self) -> bool:
        return True

    def has_fp8_fnuz(self) -> bool:
        return self.arch == "gfx942"


def _visible_index(var: str) -> int:
    """Physical index of logical device 0 under *_VISIBLE_DEVICES (0 when unset or a UUID)."""
    first = os.environ.get(var, "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def _probe_nvml() -> CudaPlatform:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            count = min(count, len([v for v in visible.split(",") if v.strip()]))
        if count == 0:
            raise RuntimeError("NVML sees no visible GPU")
        handle = pynvml.nvmlDeviceGetHandleByIndex(_visible_index("CUDA_VISIBLE_DEVICES"))
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode()
    finally:
        pynvml.nvmlShutdown()
    return CudaPlatform(arch=f"sm{major}{minor}", device_name=name, device_count=count, probe="pynvml")


def _probe_amdsmi() -> RocmPlatform:
    # PyPI's amdsmi raises KeyError('libamd_smi.so') at import where ROCm is absent.
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        if not handles:
            raise RuntimeError("amdsmi sees no GPU")
        visible = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("ROCR_VISIBLE_DEVICES")
        count = len(handles) if visible is None else min(len(handles), len(visible.split(",")))
        index = _visible_index("HIP_VISIBLE_DEVICES") if visible else 0
        info = amdsmi.amdsmi_get_gpu_asic_info(handles[index])
        arch = str(info.get("target_graphics_version", "unknown")).split(":")[0]
        name = str(info.get("market_name", "AMD GPU"))
    finally:
        amdsmi.amdsmi_shut_down()
    return RocmPlatform(arch=arch, device_name=name, device_count=count, probe="amdsmi")


def _arch_from_torch(index: int) -> tuple[str, str]:
    """Arch and name of a device through torch; only call where a context may exist."""
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return str(getattr(props, "gcnArchName", "unknown")).split(":")[0], props.name
    return f"sm{props.major}{props.minor}", props.name


def _probe_torch(cls: type[Platform], notes: tuple[str, ...]) -> Platform:
    # device_count() does not create a context; arch does, so it is read only once torch
    # has initialised CUDA for its own reasons.
    try:
        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - torch's own probe broken: no GPU torch can use
        return CpuPlatform(probe="torch", notes=notes + (f"torch.cuda.device_count() failed: {type(exc).__name__}: {exc}",))
    if count == 0:
        return CpuPlatform(probe="torch", notes=notes + ("torch sees no GPU",))
    arch, name = "unknown", "gpu"
    if torch.cuda.is_initialized():
        arch, name = _arch_from_torch(0)
    return cls(arch=arch, device_name=name, device_count=count, probe="torch", notes=notes)


@functools.lru_cache(maxsize=None)
def current_platform() -> Platform:
    """Detect the machine's platform once (cached); never creates a device context."""
    if torch.version.hip:
        cls, probe, what = RocmPlatform, _probe_amdsmi, "amdsmi"
    elif torch.version.cuda:
        cls, probe, what = CudaPlatform, _probe_nvml, "pynvml"
    else:
        return CpuPlatform(probe="torch", notes=("torch is a CPU build",))
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - any probe failure means "ask torch instead"
        note = f"{what} unavailable: {type(exc).__name__}: {exc}"
    return _probe_torch(cls, (note,))


def platform_key(device: torch.device | str) -> str:
    """``cuda``, ``rocm`` or ``cpu`` for the device's tensors, without probing the arch
    (for per-platform env flags on hot paths)."""
    if torch.device(device).type != "cuda":
        return CpuPlatform.key
    return RocmPlatform.key if torch.version.hip else CudaPlatform.key


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with its index: ``"cuda"`` names the current GPU (``cuda:N``), as the
    tensors made there report it, so that it compares equal to their device; other devices
    as given."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


_NO_SWITCH = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    """Launch context for a kernel on ``t``'s device (Triton, DeepGEMM and AITER launch on
    the current one): a switch there and back only where another device is current (4 us of
    host time on an H200's host, for what is almost always no switch)."""
    if not t.is_cuda:
        return _NO_SWITCH
    index = t.get_device()
    return _NO_SWITCH if torch.cuda.current_device() == index else torch.cuda.device(index)


def gpu_platform_class() -> type[Platform]:
    """The GPU platform class of this torch build (:class:`RocmPlatform` on a ROCm build,
    else :class:`CudaPlatform`)."""
    return RocmPlatform if torch.version.hip else CudaPlatform


def unusable_device_reason(device: torch.device | str) -> str | None:
    """Why torch cannot put tensors on ``device`` (a GPU device on a CPU build, no GPU
    visible, an index past the visible GPUs), or ``None`` when it can or it is not a GPU
    device. Creates no device context."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if torch.version.cuda is None and torch.version.hip is None:
        return "CUDA is not available in this torch build"
    count = torch.cuda.device_count()
    if count == 0 or not torch.cuda.is_available():
        return "torch sees no GPU (torch.cuda.is_available() is False)"
    if device.index is not None and device.index >= count:
        return f"{device} is not a visible GPU ({count} visible)"
    return None


def platform_for_device(device: torch.device | str) -> Platform:
    """Platform of the device that holds the tensors (a CPU tensor means the CPU platform).

    For a GPU device the architecture is read from torch for that very device, which is
    safe because tensors already live there.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return CpuPlatform(probe="tensor device")
    reason = unusable_device_reason(device)
    if reason is not None:
        raise ValueError(f"device {device}: {reason}")
    base = current_platform()
    if base.is_cpu():
        base = (RocmPlatform if torch.version.hip else CudaPlatform)(probe="torch")
    index = device.index if device.index is not None else torch.cuda.current_device()
    arch, name = _arch_from_torch(index)
    return replace(base, arch=arch, device_name=name)
