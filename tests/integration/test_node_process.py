"""`swarm-node join` processes on loopback: kill -9 one mid-run, the other keeps training; the killed
node restarts from its node directory as the same peer and continues its step counter, with the
peer ledger (counts and reputation) of its last checkpoint; SIGTERM makes a node checkpoint and
leave within a bound (exit 143)."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from swarm_node.node.assemble import start_transport
from swarm_node.config import SwarmConfig
from swarm_node.peers.ledger import FILE_NAME as LEDGER_FILE
from swarm_node.peers.ledger import load_rows
from tests.procs import jsonl_rows, start_join, tiny_toml, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
SWARM = "itest-proc"


def write_config(path: Path, node_dir: Path, cache: Path, peers: list[str], seed: int) -> Path:
    path.write_text(tiny_toml(cache, node_dir=node_dir, train={"total_steps": 1000, "seed": seed},
                              swarm={"swarm_id": SWARM, "initial_peers": peers, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                                     "fetch_timeout_s": 3.0, "window_seconds": 10.0},
                              checkpoint={"every_steps": 3}))
    return path




def steps(node_dir: Path) -> list[int]:
    return steps_in(node_dir / "metrics.jsonl")


def steps_in(path: Path) -> list[int]:
    return [int(r["step"]) for r in jsonl_rows(path) if "step" in r]


def peer_id_in(log: Path) -> list[str]:
    return re.findall(r"peer id (\S+)", log.read_text(errors="replace"))


def ledger(node_dir: Path) -> dict[str, dict]:
    """The node's written peer ledger by peer id ({} before its first write)."""
    path = node_dir / LEDGER_FILE
    return {r["peer_id"]: r for r in load_rows(path)} if path.exists() else {}


def test_kill_and_resume_as_same_peer(tmp_path):
    bootstrap = start_transport(SwarmConfig(swarm_id=SWARM, host_maddrs=["/ip4/127.0.0.1/tcp/0"]), tmp_path / "boot")
    procs: list[subprocess.Popen] = []
    try:
        peers = list(bootstrap.visible_maddrs)
        dirs = [tmp_path / "n0", tmp_path / "n1"]
        logs = [tmp_path / "n0.log", tmp_path / "n1.log"]
        cfgs = [write_config(tmp_path / f"n{i}.toml", d, tmp_path / "cache", peers, i) for i, d in enumerate(dirs)]
        procs = [start_join(c, log) for c, log in zip(cfgs, logs)]
        wait_until(lambda: all(len(steps(d)) >= 4 for d in dirs), 240, "both nodes to take 4 steps", procs)
        # The victim's written ledger must already hold the other peer (it is written with each
        # checkpoint): the node that starts first can reach its first checkpoints before the other
        # has published anything.
        other = peer_id_in(logs[1])[0]
        wait_until(lambda: ledger(dirs[0]).get(other, {}).get("offered", 0) >= 1, 240,
                   "the victim's ledger to record the other's groups", procs)

        victim = procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        survivor_steps = len(steps(dirs[1]))
        wait_until(lambda: len(steps(dirs[1])) >= survivor_steps + 2, 120, "the survivor to keep training", [procs[1]])

        latest = (dirs[0] / "checkpoints" / "latest").read_text().strip()
        checkpoint_step = int(latest.split("-")[-1])
        assert checkpoint_step >= 3
        before_restart = steps(dirs[0])
        # The ledger written with the last checkpoint (or later, every metrics.ledger_every_steps).
        saved = ledger(dirs[0])
        assert other in saved and saved[other]["offered"] >= 1, saved
        procs[0] = start_join(cfgs[0], logs[0])
        wait_until(lambda: len(steps(dirs[0])) > len(before_restart), 120, "the restarted node to step", procs)
        ids = peer_id_in(logs[0])
        assert len(ids) == 2 and ids[0] == ids[1], ids
        # continued from the last checkpoint: the rows of the steps lost with the kill moved aside
        # (metrics.superseded.jsonl), then the new run's rows from checkpoint_step + 1 on
        resumed = steps(dirs[0])
        assert resumed[: checkpoint_step + 1] == list(range(1, checkpoint_step + 2))
        assert steps_in(dirs[0] / "metrics.superseded.jsonl") == before_restart[checkpoint_step:]

        # SIGTERM: finish the step, checkpoint, leave the DHT, exit 143 (128 + SIGTERM) within a bound.
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=90) == 143
        final = int((dirs[1] / "checkpoints" / "latest").read_text().strip().split("-")[-1])
        assert final == steps(dirs[1])[-1]
        # The restarted node went on counting from the saved ledger (its shutdown wrote it again).
        after = ledger(dirs[0])[other]
        assert after["first_seen"] == saved[other]["first_seen"]
        assert after["offered"] >= saved[other]["offered"] and after["taken"] >= saved[other]["taken"]
        assert after["reputation"]["good"] + after["reputation"]["faults"] > 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        bootstrap.shutdown()
