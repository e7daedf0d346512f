"""Experiments: the paper's comparisons run with the production node code (see docs/results.md).

`run_experiment` is what `swarm-node experiment FILE.toml` calls: it loads the spec (spec.py),
prepares warm models (warmup.py), runs every pair x arm x seed in lockstep (lockstep.py) or as real
processes (swarm_mode.py), resumably (grid.py), and writes summary.md, summary.json and plots
(summary.py). With `--workers N` it first runs N copies of itself on the directory (workers.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def run_experiment(file: Path, *, out: Path | None, quick: bool, mode: str | None, overrides: list[str],
                   verbose: bool, pairs: list[str] | None = None, arms: list[str] | None = None,
                   check: bool = False, seeds: list[int] | None = None, workers: int = 1,
                   allocator: str = "auto") -> int:
    """Run the grid of `file`; returns the exit code. User errors end in one line (traceback with -v).

    `workers` > 1 (0: one per core): that many child processes make the runs (workers.py), then this
    process writes the summary; `allocator`: what the children preload (auto, system or a path)."""
    from swarm_node.experiment.grid import run_grid
    from swarm_node.experiment.spec import ExperimentSpec

    try:
        spec = ExperimentSpec.load(file, overrides)
    except (ValueError, OSError) as e:
        print(f"swarm-node experiment: invalid experiment file {file}: {e}", file=sys.stderr)
        return 2
    if mode not in (None, "lockstep", "swarm"):
        print(f"swarm-node experiment: --mode must be lockstep or swarm, got {mode!r}", file=sys.stderr)
        return 2
    if check:
        return _check(spec, verbose)
    if quick:
        spec = spec.quick()
    out = out or Path("runs") / f"experiment-{spec.experiment.name}{'-quick' if quick else ''}"
    t0 = time.perf_counter()
    if workers != 1:
        code = _workers(file, out, quick=quick, mode=mode, overrides=overrides, verbose=verbose, pairs=pairs,
                        arms=arms, seeds=seeds, workers=workers, allocator=allocator)
        if code != 0:
            return code
    try:
        run_grid(spec, out, mode=mode, pairs=pairs or None, arms=arms or None, seeds=seeds or None,
                 log=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        print(f"swarm-node experiment: interrupted; run the same command again to continue ({out})", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        if verbose:
            raise
        print(f"swarm-node experiment: {e} (rerun with -v for the traceback; finished runs are kept in {out})",
              file=sys.stderr)
        return 1
    print(f"experiment finished in {time.perf_counter() - t0:.0f}s: {out / 'summary.md'}", flush=True)
    return 0


def _workers(file: Path, out: Path, *, quick: bool, mode: str | None, overrides: list[str], verbose: bool,
             pairs: list[str] | None, arms: list[str] | None, seeds: list[int] | None, workers: int,
             allocator: str) -> int:
    """Run the grid in `workers` child processes of this command (workers.py); returns 0 when all of
    them finished, else an exit code (the reason said in one line)."""
    import os

    from swarm_node.experiment.workers import find_allocator, run_workers, worker_count, worker_env
    from swarm_node.util.lifecycle import PARENT_ENV

    try:
        n, lib = worker_count(workers), find_allocator(allocator)
    except ValueError as e:
        print(f"swarm-node experiment: {e}", file=sys.stderr)
        return 2
    args = [sys.executable, "-m", "swarm_node", "experiment", str(file), "--out", str(out)]
    args += ["--quick"] * quick + ["-v"] * verbose + (["--mode", mode] if mode else [])
    for flag, values in (("--pair", pairs), ("--arm", arms), ("--seed", seeds), ("--set", overrides)):
        for v in values or []:
            args += [flag, str(v)]
    env = {**worker_env(os.environ, lib), PARENT_ENV: str(os.getpid())}  # workers stop if this process dies
    print(f"{n} workers on {out}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']} each, allocator "
          f"{lib or 'of the system'}", flush=True)
    try:
        code, failed = run_workers([args] * n, env, log=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        print(f"swarm-node experiment: interrupted; run the same command again to continue ({out})", file=sys.stderr)
        return 130
    if code != 0:
        print(f"swarm-node experiment: worker {failed} stopped with exit code {code} (its last lines above say "
              f"why); the other workers were stopped; finished runs are kept in {out}: fix the cause and run the "
              "same command again to continue", file=sys.stderr)
    return code


def _check(spec, verbose: bool) -> int:
    """`--check`: the pre-check (precheck.py); 0 when every direction survives the filters, else 1."""
    import json

    from swarm_node.experiment.precheck import run_precheck

    t0 = time.perf_counter()
    try:
        rows = run_precheck(spec, log=lambda m: print(m, flush=True))
    except (ValueError, OSError, RuntimeError) as e:
        if verbose:
            raise
        print(f"swarm-node experiment --check: {e} (rerun with -v for the traceback)", file=sys.stderr)
        return 1
    print(json.dumps({"precheck": rows, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    required = [r for r in rows if r["required"]]
    return 0 if required and all(r["survive"] for r in required) else 1
