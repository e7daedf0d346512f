"""Several grid processes on one machine: `swarm-node experiment FILE --workers N`.

The parent starts N copies of the same command on one output directory as child processes (grid.py
shares the runs and warm-ups between them by lock files), waits for all of them, and then writes the
summary of the whole grid itself. Each child gets one thread (`OMP_NUM_THREADS=1` unless the caller
set it: small models gain nothing from more threads per process, and N processes on N cores do not
compete for them) and, where the system has it, tcmalloc preloaded (`--allocator auto`): the
sandboxes' tiny models spend their time in many small tensor operations, and with glibc's allocator
a part of it goes to returning large blocks to the kernel and mapping them again. The same runs gave
identical results with either allocator; docs/results.md has the timings.

Each child's lines are relayed with a `[worker k]` prefix. A child that fails stops the others
(SIGTERM: a worker stops as on Ctrl-C, keeping its finished runs; SIGINT would not do, since a
process started in the background of a script ignores it) and the parent returns the child's exit
code; Ctrl-C stops them all the same way. Running the same command again continues the grid.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swarm_node.util.lifecycle import stop_processes

# Shared-library names of tcmalloc (Debian/Ubuntu: libtcmalloc-minimal4; Fedora: gperftools-libs),
# looked for in LIB_DIRS in this order.
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
STOP_GRACE_S = 30.0  # after SIGTERM, how long a child may take to stop before it is killed


def find_allocator(choice: str, dirs: Sequence[str | Path] = LIB_DIRS) -> Path | None:
    """The shared library to preload in the workers: None for `system`; for `auto` the first tcmalloc
    found in `dirs` (None when there is none); otherwise `choice` is the library's path."""
    if choice == "system":
        return None
    if choice == "auto":
        for d in dirs:
            for name in TCMALLOC_NAMES:
                if (Path(d) / name).is_file():
                    return Path(d) / name
        return None
    path = Path(choice).expanduser()
    if not path.is_file():
        raise ValueError(f"--allocator {choice}: no such file; give auto, system or the path of an allocator's "
                         "shared library (for example libtcmalloc_minimal.so.4)")
    return path


def worker_env(base: Mapping[str, str], allocator: Path | None) -> dict[str, str]:
    """The children's environment: `base` with one thread each (unless set) and `allocator` preloaded
    ahead of anything `base` already preloads."""
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", "1")
    if allocator is not None:
        env["LD_PRELOAD"] = f"{allocator}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(allocator)
        env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))  # no report per large block
    return env


def worker_count(requested: int) -> int:
    """`--workers`: 0 means one per CPU core this process may use."""
    if requested < 0:
        raise ValueError(f"--workers must be >= 0 (0: one per CPU core), got {requested}")
    if requested == 0:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return requested


def _relay(k: int, stream, log: Callable[[str], None]) -> None:
    for line in stream:
        log(f"[worker {k}] {line.rstrip()}")


def run_workers(commands: Sequence[Sequence[str]], env: Mapping[str, str], log: Callable[[str], None],
                poll_s: float = 0.2) -> tuple[int, int | None]:
    """Run `commands` side by side, relaying their output; returns (0, None) when every one exits 0,
    else (the first failing exit code, its worker number, 1-based) after stopping the others.
    KeyboardInterrupt stops them all and propagates."""
    procs: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    try:
        for k, cmd in enumerate(commands, 1):
            # a session of its own: a Ctrl-C reaches the parent only, which stops the children (stop_processes)
            p = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1, start_new_session=True)
            procs.append(p)
            relays.append(threading.Thread(target=_relay, args=(k, p.stdout, log), daemon=True))
            relays[-1].start()
        while True:
            codes = [p.poll() for p in procs]
            failed = next((k for k, c in enumerate(codes, 1) if c not in (None, 0)), None)
            if failed is not None:
                return int(codes[failed - 1]), failed  # the others are stopped below
            if all(c == 0 for c in codes):
                return 0, None
            time.sleep(poll_s)
    finally:
        stop_processes(procs, STOP_GRACE_S)
        for t in relays:
            t.join(timeout=5.0)
