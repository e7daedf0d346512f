"""Helpers every benchmark uses: what machine it ran on, and printing the final JSON line."""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from typing import Any


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def emit(result: dict[str, Any]) -> None:
    """Print the benchmark's result as one JSON object on the last line of stdout."""
    result = {**result, "machine": machine_info()}
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True))
