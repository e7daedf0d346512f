"""The soak's chaos events, as a part of `run.Soak`: SIGKILL and restart, SIGSTOP and SIGCONT, a
cable unplugged and plugged back (network namespaces), and the operator ending a prompt set with a
successor. Each is logged in events.jsonl with its time."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from benchmarks.soak.plan import SWARM_ID, NodePlan
from benchmarks.soak.sampling import ledger_rows

PY = sys.executable


class Chaos:
    """Mixed into `Soak`, whose processes, plan, event log and `wait` these act on."""

    procs: dict[str, Any]
    plan: Any
    interrupted: bool

    def checkpoints(self, name: str) -> list[str]:
        ck = self.node_dir(name) / "checkpoints"
        return sorted(p.name for p in ck.iterdir()) if ck.is_dir() else []

    def last_step(self, name: str) -> int:
        from benchmarks.soak.sampling import metrics_rows

        rows = metrics_rows(self.node_dir(name))
        return int(rows[-1]["step"]) if rows else 0

    def kill_restart(self, name: str, wait_for_checkpoint_s: float = 90.0) -> None:
        """SIGKILL and restart; the kill waits (up to `wait_for_checkpoint_s`) for the node's first
        checkpoint, so that a node slow to start under load still proves its resume."""
        p = self.procs[name]
        deadline = time.time() + wait_for_checkpoint_s
        while not self.checkpoints(name) and time.time() < deadline and not self.interrupted:
            self.wait(1.0)  # sampling goes on
        before = self.checkpoints(name)
        step = self.last_step(name)
        p.proc.send_signal(signal.SIGKILL)  # the node process alone: its DHT and daemon die by design
        p.proc.wait(30)
        rows = ledger_rows(self.node_dir(name)) or []  # what the restarted process loads: its receipts' base
        ledger = {r["peer_id"]: r.get("taken", 0) for r in rows}
        self.event("kill", node=name, last_step=step, checkpoints=before, ledger_taken=ledger)
        time.sleep(3.0)
        self.start_node(self.node(name), why="restart")

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.plan.nodes if n.name == name)

    def freeze(self, name: str, seconds: float) -> None:
        pgid = os.getpgid(self.procs[name].proc.pid)
        os.killpg(pgid, signal.SIGSTOP)
        self.frozen.add(name)
        self.event("freeze", node=name, seconds=seconds)
        self.wait(seconds)
        os.killpg(pgid, signal.SIGCONT)
        self.frozen.discard(name)
        self.event("thaw", node=name)

    def cut(self, seconds: float) -> None:
        name = next((n.name for n in self.plan.nodes if n.role == "cut"), None)
        if self.topo is None or name is None:
            self.event("cut_skipped", why=self.skipped.get("cut", "no node of role cut"))
            return
        self.topo.set_link("cut", False)
        self.event("cut", node=name, seconds=seconds)
        self.wait(seconds)
        self.topo.set_link("cut", True)
        self.event("reconnect", node=name)

    def switch_prompt_set(self) -> None:
        old = self.prompt_sets[0]
        new = self.seed("soak-b", task_seed=1)
        log = self.run_dir / "operator" / "end.log"
        p = self._spawn([PY, "-m", "swarm_node", "end-prompt-set", old, "--successor", new, "--swarm-id", SWARM_ID,
                         "--key-file", str(self.operator_key), "--node-dir", str(log.parent),
                         "--initial-peer", self.bootstrap[0]], log)
        rc = p.wait(180)
        self.event("end_prompt_set", old=old, successor=new, exit_code=rc)

