"""`swarm-node experiment --workers`: the allocator found, the children's environment, and a failing
child stopping the others (real processes). The grid shared by two workers is tested in
test_experiment_grid.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_node.experiment.workers import find_allocator, run_workers, worker_count, worker_env


def test_auto_finds_tcmalloc_in_the_library_dirs_and_system_preloads_nothing(tmp_path):
    empty, libs = tmp_path / "empty", tmp_path / "libs"
    empty.mkdir()
    libs.mkdir()
    assert find_allocator("auto", [empty]) is None
    (libs / "libtcmalloc.so.4").write_bytes(b"")
    assert find_allocator("auto", [empty, libs]) == libs / "libtcmalloc.so.4"
    (libs / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_allocator("auto", [empty, libs]) == libs / "libtcmalloc_minimal.so.4"  # the minimal one first
    assert find_allocator("system", [libs]) is None
    assert find_allocator(str(libs / "libtcmalloc.so.4")) == libs / "libtcmalloc.so.4"
    with pytest.raises(ValueError, match=r"--allocator .*nope\.so: no such file; give auto, system or the path"):
        find_allocator(str(tmp_path / "nope.so"))


def test_worker_env_one_thread_unless_set_and_allocator_preloaded_first():
    env = worker_env({"PATH": "/bin"}, None)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    env = worker_env({"OMP_NUM_THREADS": "4", "LD_PRELOAD": "/lib/other.so"}, Path("/lib/tc.so"))
    assert env["OMP_NUM_THREADS"] == "4" and env["LD_PRELOAD"] == "/lib/tc.so:/lib/other.so"


def test_worker_count():
    assert worker_count(3) == 3
    assert worker_count(0) >= 1
    with pytest.raises(ValueError, match="--workers must be >= 0"):
        worker_count(-1)


def test_a_failing_worker_stops_the_others_and_its_code_is_returned():
    # SIGINT ignored, as in a process a script starts in the background: the stop must not rely on it
    sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "print('up', flush=True); time.sleep(120)"]
    failing = [sys.executable, "-c", "import sys, time; time.sleep(0.5); print('bad input'); sys.exit(3)"]
    lines: list[str] = []
    t0 = time.monotonic()
    assert run_workers([sleeper, failing], {}, lines.append) == (3, 2)
    assert time.monotonic() - t0 < 20  # the sleeper was stopped, not waited for
    assert "[worker 2] bad input" in lines and "[worker 1] up" in lines
    assert run_workers([[sys.executable, "-c", "print('ok')"]] * 2, {}, lines.append) == (0, None)


def test_a_bad_allocator_is_one_line_and_exit_2(tmp_path):
    from tests.unit.test_experiment_grid import SPEC

    path = tmp_path / "exp.toml"
    path.write_text(SPEC.format(cache=tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "swarm_node", "experiment", str(path), "--out", str(tmp_path / "o"),
                           "--workers", "2", "--allocator", str(tmp_path / "missing.so")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"swarm-node experiment: --allocator {tmp_path / 'missing.so'}: no such file; give auto, system or the path "
        "of an allocator's shared library (for example libtcmalloc_minimal.so.4)"]
    assert not (tmp_path / "o" / "runs").exists()  # nothing started


def test_the_parent_watch_is_not_inherited_by_a_workers_own_children(monkeypatch):
    """A worker watches the `--workers` parent (SWARM_NODE_PARENT_PID); the `swarm-node local` it
    starts in swarm mode must not inherit that pid, or it would find itself orphaned and stop."""
    from swarm_node.util.lifecycle import PARENT_ENV, watch_parent_from_env

    monkeypatch.setenv(PARENT_ENV, str(os.getppid()))
    assert watch_parent_from_env() is not None  # a daemon thread, watching a parent that outlives the test
    assert PARENT_ENV not in os.environ
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({PARENT_ENV!r}))"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "None"
