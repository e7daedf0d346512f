"""`swarm-node status` against a peer nobody answers, as a user runs it: a real process, 20 times.
Each run prints one line (what is wrong and what to do) and exits 1; nothing follows at interpreter
exit (the light DHT client's event loop, p2p daemon and threads are shut down before it)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RUNS = 20
NOBODY = "/ip4/127.0.0.1/tcp/9/p2p/QmNnooDu7bfjPFoTZYxMNLWUQJyrVwtbZg5gBMjTezGAJN"  # nothing listens on port 9


def status_once(_: int) -> tuple[int, list[str]]:
    """(exit code, every line on stdout and stderr) of one `swarm-node status` run."""
    res = subprocess.run([sys.executable, "-m", "swarm_node", "status", "-p", NOBODY, "--timeout", "2"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return res.returncode, (res.stdout + res.stderr).splitlines()


def test_status_against_an_unreachable_peer_prints_one_line_every_time():
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        runs = list(pool.map(status_once, range(RUNS)))
    extra = [lines for _, lines in runs if len(lines) != 1]
    assert not extra, f"{len(extra)} of {RUNS} runs printed more than one line, e.g.:\n" + "\n".join(extra[0])
    assert [code for code, _ in runs] == [1] * RUNS
    for _, [line] in runs:
        assert line.startswith("swarm-node: error: could not join the swarm: could not reach any initial peer")
        assert NOBODY in line and "check that a node is running at the --initial-peer address" in line
