"""Processes stopped at any moment: `swarm-node train` and `swarm-node local` as real processes with
tiny models. Each case asserts the exit code, the one line the user sees, and that no state was lost
(the last step trained is the step checkpointed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import FULL_AND_LORA, jsonl_rows, tiny_toml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMALLER = dict(generation={"group_size": 2, "max_new_tokens": 4}, train={"prompts_per_step": 1},
               checkpoint={"every_steps": 1000})


def tiny_node(cache: Path) -> str:
    return tiny_toml(cache, **SMALLER)


def tiny_local(cache: Path) -> str:
    return tiny_toml(cache, **SMALLER, swarm={"swarm_id": "itest-run-for-real", "fetch_timeout_s": 2.0,
                                              "window_seconds": 10.0}) + FULL_AND_LORA


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "swarm_node", *args]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def metric_steps(node_dir: Path) -> list[int]:
    return [int(r["step"]) for r in jsonl_rows(node_dir / "metrics.jsonl") if "step" in r]


def checkpoint_step(node_dir: Path) -> int | None:
    latest = node_dir / "checkpoints" / "latest"
    if not latest.exists():
        return None
    return json.loads((node_dir / "checkpoints" / latest.read_text().strip() / "meta.json").read_text())["step"]


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def test_second_process_is_refused_and_sigterm_checkpoints(tmp_path, cache):
    cfg = tmp_path / "node.toml"
    cfg.write_text(tiny_node(cache))
    node, log = tmp_path / "node", tmp_path / "a.log"
    with open(log, "wb") as f:
        a = subprocess.Popen(cli("train", "-c", str(cfg), "--steps", "100000", "--node-dir", str(node)),
                             stdout=f, stderr=subprocess.STDOUT, env=env())
    try:
        wait_until(lambda: len(metric_steps(node)) >= 2, 180, "two steps", [a], log)
        b = subprocess.run(cli("train", "-c", str(cfg), "--steps", "3", "--node-dir", str(node)),
                           capture_output=True, text=True, env=env(), timeout=120)
        assert b.returncode == 1
        assert f"is in use by process {a.pid}" in last_line(b.stderr) and "--node-dir" in last_line(b.stderr)
        assert a.poll() is None  # the first node trains on
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=60) == 143
    finally:
        if a.poll() is None:
            a.kill()
    assert last_line(log.read_text()) == "swarm-node: stopped by SIGTERM"
    done = metric_steps(node)
    assert done == list(range(1, len(done) + 1))  # one row per step: the refused process wrote nothing
    assert checkpoint_step(node) == done[-1]  # the last step trained is saved


def test_ctrl_c_during_startup_exits_130_at_once(tmp_path, cache):
    cfg = tmp_path / "node.toml"
    cfg.write_text(tiny_node(cache))
    p = subprocess.Popen(cli("train", "-c", str(cfg), "--steps", "100000", "--node-dir", str(tmp_path / "n")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    deadline = time.monotonic() + 60
    while not handles_sigterm(p.pid) and time.monotonic() < deadline:  # swarm_node imported: still importing
        time.sleep(0.05)  # the rest, long before the first step
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and time.monotonic() - t0 < 15
    assert last_line(err) == "swarm-node: stopped by SIGINT" and "Traceback" not in err
    assert not (tmp_path / "n" / "checkpoints").exists()


def handles_sigterm(pid: int) -> bool:
    """Whether the process has installed a SIGTERM handler (the signal is in /proc's SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def start_local(tmp_path: Path, cache: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    cfg = tmp_path / "local.toml"
    cfg.write_text(tiny_local(cache))
    run_dir, out = tmp_path / "run", tmp_path / "local.out"
    with open(out, "wb") as f:  # stdout is a file: plain lines, no live table
        p = subprocess.Popen(cli("local", "-c", str(cfg), "--steps", "100000", "--run-dir", str(run_dir),
                                 "--stop-timeout", "60", *extra), stdout=f, stderr=subprocess.STDOUT, env=env())
    return p, run_dir, out


def node_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("node*") if p.is_dir())


@pytest.mark.slow  # ~1.5 min; the default run has local + Ctrl-C in test_local_swarm.py
def test_local_forwards_sigterm_and_every_node_checkpoints(tmp_path, cache):
    p, run_dir, out = start_local(tmp_path, cache)
    try:
        wait_until(lambda: len(node_dirs(run_dir)) == 2 and all(len(metric_steps(d)) >= 2 for d in node_dirs(run_dir)),
                   240, "two steps on both nodes", [p], out)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143
    finally:
        if p.poll() is None:
            p.kill()
    text = out.read_text()
    assert "\r" not in text and "\x1b[" not in text
    assert re.search(r"^full step 1/100000 reward \d\.\d{3} acc", text, re.M)
    assert re.search(r"^lora step 2/100000 reward", text, re.M)
    for d in node_dirs(run_dir):
        done = metric_steps(d)
        assert checkpoint_step(d) == done[-1], d  # each node saved its last step
        log = (d / "node.log").read_text()
        assert "\r" not in log  # no progress bars in a log file
        assert last_line(log) == "swarm-node: stopped by SIGTERM"
    assert (run_dir / "report" / "summary.md").exists()


@pytest.mark.slow
def test_local_killed_with_9_leaves_no_node_training(tmp_path, cache):
    p, run_dir, out = start_local(tmp_path, cache)
    wait_until(lambda: len(node_dirs(run_dir)) == 2 and all(len(metric_steps(d)) >= 2 for d in node_dirs(run_dir)),
               240, "two steps on both nodes", [p], out)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 60
    for d in node_dirs(run_dir):  # each node notices, finishes its step, checkpoints and leaves
        while time.monotonic() < deadline and "swarm-node: stopped by SIGTERM" not in (d / "node.log").read_text():
            time.sleep(0.5)
        assert last_line((d / "node.log").read_text()) == "swarm-node: stopped by SIGTERM", d
        assert checkpoint_step(d) == metric_steps(d)[-1]


@pytest.mark.slow
def test_local_shows_the_real_error_of_a_failed_node(tmp_path, cache):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # both nodes want the same metrics port: the second to start cannot bind it
    p, run_dir, out = start_local(tmp_path, cache, "-s", f'metrics.prometheus_addr="127.0.0.1:{port}"')
    assert p.wait(timeout=240) == 1
    text = out.read_text()
    line = last_line(text)
    assert line.startswith("swarm-node: error: node ") and f"cannot serve metrics on 127.0.0.1:{port}" in line
    assert "Traceback" not in text
