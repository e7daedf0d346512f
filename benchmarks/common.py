"""Helpers every benchmark uses: what machine it ran on, and printing the final JSON line."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

from swarm_node.util.machine import machine_info


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


_size: dict[str, bool] = {"quick": False}  # set by parse_args: every JSON line says whether it measured the quick size


def parse_args(parser: argparse.ArgumentParser, quick: dict[str, Any],
               argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line after adding `--quick`: the same measurement at the size in `quick`
    (argument name -> value; tiny models built in code, no hub), which runs in seconds on 2 CPU
    cores and is what the smoke tests run. Options given on the command line still win."""
    parser.add_argument("--quick", action="store_true",
                        help="a small size that runs in seconds (" + " ".join(
                            f"{k}={v}" for k, v in quick.items()) + "); options given still win")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    _size["quick"] = args.quick
    return args


def emit(result: dict[str, Any]) -> None:
    """Print the benchmark's result as one JSON object on the last line of stdout (with `quick`:
    whether it ran at the `--quick` size, and the machine)."""
    result = {**result, "quick": _size["quick"], "machine": machine_info()}
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True))
