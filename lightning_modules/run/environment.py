"""What a result depends on beyond its configuration (docs/reliability.md, "Results say what they
depend on"): another thread count or other vector kernels sum floats in another order."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch


# The CPU flags of native bf16 arithmetic, the one rule for bf16 on a CPU: with neither, bf16 is
# emulated and slower than fp32, and `train.precision=bf16*` is refused (`preflight.check_hardware`)
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")
CPUINFO = "ABLATE_CPUINFO"  # a file read in place of /proc/cpuinfo (the tests' CPU without native bf16)


def _cpuinfo(name: str) -> str | None:
    """The value of the first `name` line of /proc/cpuinfo (Linux; $ABLATE_CPUINFO names another
    file), else None."""
    try:
        with open(os.environ.get(CPUINFO) or "/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name)), None)
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else platform's answer."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_family() -> str | None:
    """The CPU's family and model numbers, which tell apart what a VM names by the brand alone."""
    family, model = _cpuinfo("cpu family"), _cpuinfo("model\t")
    return f"family {family} model {model}" if family and model else None


def cpu_flags() -> list[str]:
    """The vector-instruction families the CPU has (what changes CPU kernels' summation order)."""
    flags = (_cpuinfo("flags") or "").split()
    return sorted(f for f in flags if f in ("avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma"))


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: it has a flag of NATIVE_BF16."""
    return not set(NATIVE_BF16).isdisjoint((_cpuinfo("flags") or "").split())


# Environment variables that choose kernels or thread counts, recorded when set.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR",
                    "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def environment(precision: str, device: torch.device) -> dict[str, Any]:
    """The facts a rerun must match to expect the same numbers."""
    import lightning

    env: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__, "lightning": lightning.__version__,
        "cpu": cpu_model(), "cpu_family": cpu_family(), "cpu_flags": cpu_flags(),
        # the vector kernels ATen dispatches to (ATEN_CPU_CAPABILITY can lower it)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "precision": precision, "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "variables": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ},
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    return env
