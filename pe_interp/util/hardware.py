"""What the hardware can do fast: whether bfloat16 autocast pays on this device.

On a CPU, bf16 matmuls are fast only with native bf16 instructions (AVX512-BF16 or AMX-BF16);
without them oneDNN emulates bf16 and a bf16 matmul runs many times *slower* than fp32 (measured
on this project's AVX2-only machine: a 2048x256x1024 matmul took 861 ms in bf16 against 16 ms in
fp32). So ``TrainConfig.amp`` autocasts on a CPU only when :func:`cpu_has_bf16` says the CPU has
them, and on CUDA only when the GPU supports bf16.

``PE_INTERP_CPU_BF16=1`` (or ``0``) overrides the CPU detection, for tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
ENV_OVERRIDE = "PE_INTERP_CPU_BF16"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty where that is not readable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_bf16() -> bool:
    """True when the CPU executes bf16 matmuls natively (so bf16 autocast is faster than fp32).

    ``PE_INTERP_CPU_BF16=1`` forces True; on a CPU that only emulates bf16 that makes bf16 runs
    many times slower than fp32, which is said once per process (a warning)."""
    native = any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)
    forced = os.environ.get(ENV_OVERRIDE)
    if forced == "1" and not native:
        _warn_emulated()
    if forced in ("0", "1"):
        return forced == "1"
    return native


@functools.lru_cache(maxsize=1)
def _warn_emulated() -> None:
    import warnings

    warnings.warn(
        f"{ENV_OVERRIDE}=1 forces bf16 on a CPU without native bf16 ({', '.join(BF16_CPU_FLAGS)} missing): "
        "bf16 is emulated there and runs many times slower than fp32",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    """What a measurement ran on: CPU model, native bf16 or not, cores, torch threads and version."""
    return {
        "cpu": cpu_model(),
        "cpu_bf16": cpu_has_bf16(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


# The CPU features that select PyTorch's, MKL's and oneDNN's kernels (and so their rounding).
NUMERICS_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def numerics(
    device: torch.device | str, amp: bool, attn_route: str | None = None
) -> dict[str, object]:
    """What a run's weights depend on besides its configs and seed (issue 54): the compute dtype,
    torch's intra-op threads (a reduction split over 2 threads rounds unlike one on 1), the torch
    version, the CPU (its model, torch's kernel level and the flags that pick kernels) or GPU, and
    under CPU bf16 the attention route ``attn_route`` (the caller's
    :func:`pe_interp.models.hooked.attn_routes.policy`). The same values, seed and configs give the
    same weights, however busy the machine is."""
    device = torch.device(device)
    bf16 = amp and bf16_autocast_pays(device)
    out: dict[str, object] = {
        "dtype": "bfloat16" if bf16 else "float32",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": [flag for flag in NUMERICS_FLAGS if flag in cpu_flags()],
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    elif bf16:
        out["attn_route"] = attn_route
    return out


def bf16_autocast_pays(device: torch.device | str) -> bool:
    """Whether bf16 autocast should be used on ``device`` when a config asks for it."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_bf16()
    return False


def autocast(device: torch.device | str, amp: bool):
    """``torch.autocast`` in bf16 when ``amp`` and the device runs bf16 fast; otherwise a no-op
    context (fp32). Master weights, the loss and the optimizer stay fp32 either way."""
    device = torch.device(device)
    if amp and bf16_autocast_pays(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type if device.type in ("cpu", "cuda") else "cpu", enabled=False)


def available_memory() -> int | None:
    """Bytes of memory this process may still take: ``MemAvailable`` of ``/proc/meminfo`` (else
    ``os.sysconf``'s available pages), bounded by a cgroup v2 limit; None when neither is known."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    if not found:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):
        group = Path("/sys/fs/cgroup")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((group / "memory.current").read_text()))
    return min(found) if found else None


__all__ = [
    "BF16_CPU_FLAGS",
    "ENV_OVERRIDE",
    "NUMERICS_FLAGS",
    "autocast",
    "available_memory",
    "bf16_autocast_pays",
    "cpu_flags",
    "cpu_has_bf16",
    "cpu_model",
    "machine",
    "numerics",
]
