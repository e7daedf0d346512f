"""What machine a result was made on, and the part of it that decides its floating-point arithmetic.

A grid run is deterministic on one machine: the same commit, seed and settings give the same held-out
accuracies to the digit. On another machine they may not: the CPU's kernels (its vector instruction
set and the BLAS path it selects) or a package version can change the last bits of a sum, and one
sampled token that falls on the other side changes the rest of the run. Runs of two machines are then
two samples of the same experiment, not copies. `fingerprint` is what a run records (`done.json`) so a
summary can say which machines made its runs (measured in docs/results.md: a run of the long-budget
grid on another machine kept seed 0's trajectory and changed seed 6's)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

# The fields of machine_info that can change a run's numbers (the others describe its speed).
FINGERPRINT_KEYS = ("cpu", "cpu_capability", "cuda", "torch", "transformers")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."); platform.processor() else."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Python, platform, CPU (model, count, the vector instruction set torch's kernels use), memory,
    and the torch and transformers versions; fields that cannot be read are left out."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info["torch_threads"] = torch.get_num_threads()
    transformers = _version("transformers")
    if transformers is not None:
        info["transformers"] = transformers
    return info


def fingerprint(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fields of `info` (this machine's when None) that can change a run's numbers."""
    info = machine_info() if info is None else info
    return {k: info[k] for k in FINGERPRINT_KEYS if k in info}


def describe(fp: dict[str, Any]) -> str:
    """One line for a fingerprint: "AMD EPYC (AVX2), torch 2.13.0+cpu, transformers 5.19.0"."""
    if not fp:
        return "not recorded"
    cpu = fp.get("cpu", "unknown CPU") + (f" ({fp['cpu_capability']})" if fp.get("cpu_capability") else "")
    parts = [cpu] + ([f"GPU {fp['cuda']}"] if fp.get("cuda") else [])
    parts += [f"{k} {fp[k]}" for k in ("torch", "transformers") if fp.get(k)]
    return ", ".join(parts)
