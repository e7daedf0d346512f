"""Helpers every benchmark uses: what machine it ran on, and printing the final JSON line."""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

from swarm_node.machine import machine_info


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
