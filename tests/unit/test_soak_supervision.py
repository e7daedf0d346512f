"""The soak's harness starts a training node that exited by itself again, as its supervisor would."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from benchmarks.soak import run as soak_run
from benchmarks.soak.plan import quick_plan


def test_a_node_that_exits_by_itself_is_started_again_once(tmp_path, monkeypatch):
    plan = quick_plan()
    soak = soak_run.Soak(plan, tmp_path, log=lambda *_: None)
    soak.exited, soak._supervise_at = set(), {}
    soak._next_sample = soak._next_ledger = float("inf")
    monkeypatch.setattr(soak_run, "SUPERVISOR_DELAY_S", 0.5)
    node = plan.nodes[0]
    running: list[subprocess.Popen] = []

    def start_node(n, why="start"):  # the real one spawns `swarm-node join`: a process that stays up
        running.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        soak.procs[n.name] = soak_run.Proc(n.name, running[-1], tmp_path / "node.log", n.role, time.time())
        soak.event(why, node=n.name)

    monkeypatch.setattr(soak, "start_node", start_node)
    (tmp_path / "node.log").write_text("swarm-node: error: could not join the swarm: ...\n")
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    failed.wait()
    soak.procs[node.name] = soak_run.Proc(node.name, failed, tmp_path / "node.log", node.role, time.time())
    try:
        soak.wait(4.0)
    finally:
        for p in running:
            p.kill()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["exited", "supervised_restart"]
    assert events[0]["exit_code"] == 1 and "could not join" in events[0]["last_line"]
    assert events[1]["time"] - events[0]["time"] >= 0.5 and len(running) == 1
