"""Runs the soak's swarm: processes, the chaos schedule, and what is sampled while it runs.

Everything is a real process: `swarm-node bootstrap`, `swarm-node seed` (the operator),
`swarm-node join` per training node, `benchmarks.soak.light_peers` per group of light peers,
`swarm-node status` and `swarm-node end-prompt-set` when the schedule says. As root, every process
runs inside network namespaces this run creates (`benchmarks.netns`: a "core" host for all but one
node, a "cut" host whose cable the schedule unplugs); otherwise everything listens on loopback and
the cut is skipped with its reason. The run directory gets:

    events.jsonl     every chaos event and process start, with wall time
    samples.jsonl    every SAMPLE_S: each process tree's RSS and its p2p daemon's socket I/O
    ledgers.jsonl    every LEDGER_S: each node's peer ledger (taken per sender)
    status.jsonl     each `swarm-node status` read: wall time and the records it showed
    given.jsonl      at the end: `status --given` for each training node
    <node>/          each node's directory (config, node.log, metrics.jsonl, checkpoints, ledger)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.soak.plan import (GROUP_SIZE, MAX_GROUPS_PER_PEER, MAX_NEW_TOKENS, PROMPTS_PER_STEP, SHARED,
                                  STALENESS, SWARM_ID, SYSTEM_PROMPT, WINDOW_S, NodePlan, SoakPlan)
from benchmarks.soak.chaos import Chaos
from benchmarks.soak.sampling import jsonl as _jsonl
from benchmarks.soak.sampling import sample_ledgers, sample_processes

SAMPLE_S = 10.0
# A node that exits by itself (one that could not join the start-up storm) is started again after
# this, as its supervisor would: deploy/compose.yaml runs nodes with `restart: unless-stopped`.
SUPERVISOR_DELAY_S = 10.0
LEDGER_S = 15.0
PY = sys.executable


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    log: Path
    role: str
    started: float


class Soak(Chaos):
    def __init__(self, plan: SoakPlan, run_dir: Path, log=print) -> None:
        self.plan, self.run_dir, self.log = plan, run_dir, log
        self.t0 = time.time()
        self.procs: dict[str, Proc] = {}
        self.aux: list[subprocess.Popen] = []  # bootstrap, seeders, light peers
        self.topo = None
        self.skipped: dict[str, str] = {}
        self.frozen: set[str] = set()
        self.interrupted = False  # set by `interrupt` (SIGINT/SIGTERM): the run ends early, cleanly
        self.host = "127.0.0.1"
        self.cut_host = "127.0.0.1"
        self.warm: dict[str, Path] = {}
        self.bootstrap: list[str] = []
        self.prompt_sets: list[str] = []
        self.operator_key = run_dir / "operator.key"
        run_dir.mkdir(parents=True, exist_ok=True)

    # ---- set-up ------------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        row = {"time": time.time(), "minute": round((time.time() - self.t0) / 60, 2), "kind": kind, **fields}
        _jsonl(self.run_dir / "events.jsonl", row)
        self.log(f"[{row['minute']:6.2f} min] {kind} {json.dumps(fields)}")

    def network(self) -> None:
        from benchmarks.netns import Topology, missing_requirements

        why = missing_requirements()
        if why is not None:
            self.skipped["cut"] = f"network cut skipped: {why}; every process listens on loopback"
            return
        self.topo = Topology.create(public=["core", "cut"], natted=[], rate_limited={})
        self.host, self.cut_host = self.topo.host("core").ip, self.topo.host("cut").ip
        self.event("network", core=self.host, cut=self.cut_host, namespaces=self.topo.namespaces)

    def prefix(self, role: str) -> list[str]:
        if self.topo is None:
            return []
        return self.topo.exec_args("cut" if role == "cut" else "core")

    def warm_models(self) -> None:
        from swarm_node.experiment.warmup import WarmupSpec, ensure_warm_model

        cache = self.run_dir.parent / "soak-warm-cache"
        for base in sorted({n.warm for n in self.plan.nodes if n.warm}):
            t = time.time()
            spec = WarmupSpec(base=base, levels=(1,), steps=self.plan.warm_steps, system_prompt=SYSTEM_PROMPT)
            self.warm[base] = ensure_warm_model(spec, cache, log=lambda *_: None)
            self.event("warm_model", base=base, path=str(self.warm[base]), seconds=round(time.time() - t, 1))

    def _spawn(self, args: list[str], log: Path, role: str = "core", nice: int = 0,
               env: dict[str, str] | None = None) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        full = [*self.prefix(role), *(["nice", "-n", str(nice)] if nice else []), *args]
        with open(log, "ab") as f:
            return subprocess.Popen(full, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
                                         "HF_HUB_DISABLE_PROGRESS_BARS": "1", **(env or {})})

    @staticmethod
    def _wait_line(log: Path, pattern: str, timeout: float, proc: subprocess.Popen) -> re.Match:
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
            if m:
                return m
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"no line matching {pattern!r} in {log} within {timeout:.0f}s:\n{tail}")

    def start_bootstrap(self) -> None:
        log = self.run_dir / "bootstrap" / "bootstrap.log"
        p = self._spawn([PY, "-m", "swarm_node", "bootstrap", "--node-dir", str(self.run_dir / "bootstrap"),
                         "--swarm-id", SWARM_ID, "--host-maddr", f"/ip4/{self.host}/tcp/0"], log)
        self.aux.append(p)
        m = self._wait_line(log, r"join through (\S+)", 120, p)
        self.bootstrap = [m.group(1)]
        self.event("bootstrap", maddr=self.bootstrap[0], pid=p.pid)

    def seed(self, name: str, task_seed: int) -> str:
        log = self.run_dir / f"seeder-{name}" / "seed.log"
        args = [PY, "-m", "swarm_node", "seed", "--task", "arithmetic", "--name", name, "--swarm-id", SWARM_ID,
                "--key-file", str(self.operator_key), "--node-dir", str(log.parent), "--hold", "0",
                "--initial-peer", self.bootstrap[0]]
        if task_seed:
            args += ["--task-seed", str(task_seed)]
        p = self._spawn(args, log)
        self.aux.append(p)
        set_id = self._wait_line(log, r"prompt set id:\s+(\S+)", 180, p).group(1)
        self.write_prompt_file(set_id, task_seed)
        self.prompt_sets.append(set_id)
        self.event("seed", name=name, prompt_set_id=set_id, pid=p.pid)
        return set_id

    def write_prompt_file(self, set_id: str, task_seed: int) -> None:
        """The problems the light peers answer: (sha256 of the question, answer) by index."""
        from swarm_node.config import TaskConfig
        from swarm_node.tasks import load_prompt_set

        ps = load_prompt_set(TaskConfig(name="arithmetic", seed=task_seed))
        if ps.id != set_id:
            raise RuntimeError(f"the seeded set {set_id} is not the arithmetic set of seed {task_seed} ({ps.id})")
        data = {"id": ps.id, "problems": [[p.sha256, p.answer] for p in ps.problems]}
        tmp = self.run_dir / "prompt_set.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.run_dir / "prompt_set.json")

    # ---- nodes -------------------------------------------------------------------------------

    def node_dir(self, name: str) -> Path:
        return self.run_dir / name

    def write_config(self, node: NodePlan) -> Path:
        from swarm_node.config import NodeConfig
        from swarm_node.config.toml_text import apply_override
        from swarm_node.swarm.identity import load_or_create_key, public_key_text
        from swarm_node.util.atomic import atomic_write_text

        data: dict[str, Any] = {}
        for item in [*SHARED, *node.set]:
            apply_override(data, item)
        if node.warm:
            data.setdefault("model", {})["name"] = str(self.warm[node.warm])
        host = self.cut_host if node.role == "cut" else self.host
        swarm = data.setdefault("swarm", {})
        swarm.update(initial_peers=self.bootstrap, host_maddrs=[f"/ip4/{host}/tcp/0"],
                     prompt_set_id=self.prompt_sets[0], prompt_set_owner=public_key_text(load_or_create_key(self.operator_key)))
        data["node_dir"] = str(self.node_dir(node.name))
        cfg = NodeConfig.model_validate(data)
        path = self.node_dir(node.name) / "node.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, cfg.dump_toml())
        return path

    def start_node(self, node: NodePlan, why: str = "start") -> None:
        config = self.node_dir(node.name) / "node.toml"
        if not config.exists():
            config = self.write_config(node)
        log = self.node_dir(node.name) / "node.log"
        p = self._spawn([PY, "-m", "swarm_node", "join", "--config", str(config)], log, role=node.role, nice=node.nice)
        self.procs[node.name] = Proc(node.name, p, log, node.role, time.time())
        self.event(why, node=node.name, pid=p.pid, role=node.role)

    def start_light(self) -> None:
        from swarm_node.policy import tiny
        from swarm_node.policy.models import tokenizer_fingerprint

        tok = tiny.build_tiny_tokenizer("a")
        char_ids = {chr(c): tok.encode(chr(c), add_special_tokens=False) for c in range(32, 127)}
        if any(len(ids) != 1 for ids in char_ids.values()):
            raise RuntimeError("the tiny tokenizer a does not give each printable ASCII character one token")
        stop_at = self.t0 + self.plan.minutes * 60 + 600  # the harness stops them first
        for k in range(self.plan.light_processes):
            spec = {
                "count": self.plan.light_per_process, "swarm_id": SWARM_ID, "initial_peers": self.bootstrap,
                "host": self.host, "window_seconds": WINDOW_S, "staleness": STALENESS,
                "storage_caps": [256, 256 << 10, 256 << 10], "fingerprint": tokenizer_fingerprint(tok),
                "char_ids": {c: ids[0] for c, ids in char_ids.items()}, "eos_id": tok.eos_token_id,
                "vocab_size": len(tok), "max_new_tokens": MAX_NEW_TOKENS, "group_size": GROUP_SIZE,
                "prompts_per_step": PROMPTS_PER_STEP, "max_groups": 4, "max_per_peer": MAX_GROUPS_PER_PEER,
                "fetch_timeout": 10.0, "record_ttl_s": 300.0, "seed": k, "stop_at": stop_at,
                "prompt_file": str(self.run_dir / "prompt_set.json"),
                "out": str(self.run_dir / "light" / f"light-{k}.jsonl"),
                "key_dir": str(self.run_dir / "light" / f"keys-{k}"),
            }
            path = self.run_dir / "light" / f"spec-{k}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(spec))
            log = self.run_dir / "light" / f"light-{k}.log"
            p = self._spawn([PY, "-m", "benchmarks.soak.light_peers", str(path)], log)
            self.aux.append(p)
            self.procs[f"light-{k}"] = Proc(f"light-{k}", p, log, "light", time.time())
        for k in range(self.plan.light_processes):
            m = self._wait_line(self.run_dir / "light" / f"light-{k}.log", r"light peers up: (\d+) \(torch imported: (\w+)\)",
                                300, self.procs[f"light-{k}"].proc)
            self.event("light_peers", process=k, peers=int(m.group(1)), torch_imported=m.group(2) == "True")

    def read_status(self, label: str, repeats: int = 3) -> None:
        for _ in range(repeats):
            t = time.perf_counter()
            out = subprocess.run([*self.prefix("core"), PY, "-m", "swarm_node", "status", "-p", self.bootstrap[0],
                                  "--swarm-id", SWARM_ID, "--json"], capture_output=True, text=True, timeout=120)
            seconds = time.perf_counter() - t
            try:
                data = json.loads(out.stdout)  # a list of rows, or {"error": ...}
            except ValueError:
                data = {"error": (out.stdout + out.stderr)[-500:]}
            ids = sorted(r.get("peer_id", "") for r in data) if isinstance(data, list) else []
            _jsonl(self.run_dir / "status.jsonl", {"time": time.time(), "label": label, "seconds": seconds,
                                                   "loadavg_1min": os.getloadavg()[0],
                                                   "exit_code": out.returncode, "records": len(ids), "peer_ids": ids,
                                                   "live_processes": self.live_counts(), "error": data.get("error") if isinstance(data, dict) else None})
            self.event("status", label=label, seconds=round(seconds, 2), records=len(ids), exit_code=out.returncode)

    def live_counts(self) -> dict[str, int]:
        return {"nodes": sum(p.role != "light" and p.proc.poll() is None for p in self.procs.values()),
                "light_peers": self.plan.light_per_process * sum(p.role == "light" and p.proc.poll() is None
                                                                 for p in self.procs.values())}

    # ---- sampling ----------------------------------------------------------------------------

    def sample(self) -> None:
        sample_processes(self.run_dir / "samples.jsonl", {n: p.proc.pid for n, p in self.procs.items()
                                                          if p.proc.poll() is None}, self.frozen)

    def sample_ledgers(self) -> None:
        sample_ledgers(self.run_dir / "ledgers.jsonl", {n.name: self.node_dir(n.name) for n in self.plan.nodes})

    def wait(self, seconds: float) -> None:
        """Sleep `seconds` while sampling (a node that exits by itself is logged); returns early once
        the run is asked to stop (`interrupt`)."""
        end = time.time() + seconds
        while time.time() < end and not self.interrupted:
            if time.time() >= self._next_sample:
                self.sample()
                self._next_sample = time.time() + SAMPLE_S
            if time.time() >= self._next_ledger:
                self.sample_ledgers()
                self._next_ledger = time.time() + LEDGER_S
            for name, p in list(self.procs.items()):
                if p.role != "light" and p.proc.poll() is not None and name not in self.exited:
                    self.exited.add(name)
                    tail = p.log.read_text(errors="replace").strip().splitlines()[-1:] if p.log.exists() else []
                    self.event("exited", node=name, exit_code=p.proc.returncode, last_line=tail[0][-300:] if tail else "")
                    self._supervise_at[name] = time.time() + SUPERVISOR_DELAY_S
            for name, at in list(self._supervise_at.items()):
                if time.time() >= at:  # as deploy/compose.yaml's `restart: unless-stopped` would
                    del self._supervise_at[name]
                    self.exited.discard(name)
                    self.start_node(self.node(name), why="supervised_restart")
            time.sleep(min(1.0, max(0.0, end - time.time())))

    # ---- the run -----------------------------------------------------------------------------

    def run(self) -> None:
        self._next_sample = self._next_ledger = 0.0
        self.exited: set[str] = set()
        self._supervise_at: dict[str, float] = {}  # exited node -> when its supervisor starts it again
        plan = self.plan
        self.network()
        self.warm_models()
        self.t0 = time.time()  # minutes count from here: the swarm's start
        self.start_bootstrap()
        self.seed("soak-a", task_seed=0)
        self.start_light()
        for n in plan.nodes:
            if n.role != "late":
                self.start_node(n)
        self.event("swarm_started", peers=plan.peers, training_nodes=len(plan.nodes), light_peers=plan.light_peers)
        for minute, kind, arg in plan.events:
            self.wait(self.t0 + minute * 60 - time.time())
            if self.interrupted:
                break
            if kind == "kill":
                self.exited.discard(arg)
                self._supervise_at.pop(arg, None)  # the kill's own restart starts it
                self.kill_restart(arg)
            elif kind == "freeze":
                name, _, windows = arg.partition(":")
                self.freeze(name, float(windows or 2.5) * WINDOW_S)
            elif kind == "cut":
                self.cut(float(arg) * 60)
            elif kind == "late_join":
                self.start_node(next(n for n in plan.nodes if n.role == "late"), why="late_join")
            elif kind == "prompt_set_switch":
                try:
                    self.switch_prompt_set()
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # the run goes on; the report shows it
                    self.event("prompt_set_switch_failed", error=str(e)[-300:])
            elif kind == "status":
                self.read_status("full_count")
        self.wait(self.t0 + plan.minutes * 60 - time.time())
        self.event("stopping")

    def interrupt(self, *_: object) -> None:
        """Signal handler: end the run at the next check; `stop` then runs as at the planned end."""
        if not self.interrupted:
            self.interrupted = True
            self.event("interrupted")

    def stop(self) -> None:
        """SIGTERM the nodes (they finish the step and checkpoint), read `status --given` for each,
        then stop the light peers, seeders and bootstrap; the namespaces go last."""
        from swarm_node.util.lifecycle import stop_processes

        try:
            nodes = [p for p in self.procs.values() if p.role != "light" and p.proc.poll() is None]
            for name in list(self.frozen):
                os.killpg(os.getpgid(self.procs[name].proc.pid), signal.SIGCONT)
            killed = stop_processes([p.proc for p in nodes], 180.0)
            self.event("nodes_stopped", killed=[nodes[i].name for i in killed])
            self.sample_ledgers()
            if self.bootstrap:
                self.read_given()
        finally:
            aux = [p.proc for p in self.procs.values() if p.role == "light"] + self.aux
            stop_processes([p for p in aux if p.poll() is None], 30.0)
            if self.topo is not None:
                self.topo.close()
            self.event("stopped")

    def read_given(self) -> None:
        for n in self.plan.nodes:
            if not (self.node_dir(n.name) / "identity.key").exists():
                continue
            out = subprocess.run([*self.prefix("core"), PY, "-m", "swarm_node", "status", "-p", self.bootstrap[0],
                                  "--swarm-id", SWARM_ID, "--given", str(self.node_dir(n.name)), "--json"],
                                 capture_output=True, text=True, timeout=120)
            try:
                data = json.loads(out.stdout)
            except ValueError:
                data = {"error": (out.stdout + out.stderr)[-500:]}
            _jsonl(self.run_dir / "given.jsonl", {"time": time.time(), "node": n.name, "given": data})
