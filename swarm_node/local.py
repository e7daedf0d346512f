"""`swarm-node local`: a bootstrap DHT and N node processes on this machine, a live table, a summary.

The bootstrap DHT runs in this process; each node is a `swarm-node join` subprocess with its own
node directory under the run directory (config, log, metrics, checkpoints). The live table reads
each node's metrics.jsonl, so it shows exactly what the nodes logged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarm_node.atomic import atomic_write_text
from swarm_node.config import NodeConfig, apply_override

# Small enough that two nodes sharing two CPU cores finish a few steps in minutes; rewards are mixed
# at these arithmetic levels for the embedded SmolLM2-135M (see tasks/arithmetic.py).
LOCAL_DEFAULTS: list[str] = [
    "generation.group_size=6",
    "generation.max_new_tokens=96",
    "train.prompts_per_step=2",
    "train.micro_batch_size=6",
    "train.learning_rate=1e-5",
    "swarm.window_seconds=60.0",  # a step takes about a minute here: peers' groups stay fresh for minutes
    "swarm.fetch_timeout_s=5.0",
    "swarm.max_peer_fraction=0.5",
    "swarm.max_peer_groups_per_step=2",
    "swarm.max_groups_per_peer=2",
    "checkpoint.keep=1",
]
DEFAULT_NODES: list[dict[str, Any]] = [
    {"name": "full", "set": []},
    {"name": "lora", "set": ["model.lora.enabled=true", "train.learning_rate=1e-4"]},
]
SHUTDOWN_GRACE_S = 120.0


@dataclass
class NodeProc:
    name: str
    node_dir: Path
    proc: subprocess.Popen
    model: str
    lora: bool


def plan_nodes(nodes: int, config: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Shared config dict and the per-node list (`name`, `set` overrides) from the TOML or defaults."""
    shared: dict[str, Any] = {}
    for item in LOCAL_DEFAULTS:
        apply_override(shared, item)
    per_node = [dict(n) for n in DEFAULT_NODES]
    if config is not None:
        with open(config, "rb") as f:
            data = tomllib.load(f)
        nodes = int(data.pop("nodes", nodes))
        per_node = data.pop("node", per_node)
        _deep_update(shared, data)
    while len(per_node) < nodes:
        per_node.append({"name": f"node{len(per_node)}", "set": []})
    return shared, per_node[:nodes]


def _deep_update(base: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def _node_config(shared: dict[str, Any], node: dict[str, Any], index: int, run_dir: Path, steps: int,
                 bootstrap: list[str], overrides: list[str]) -> NodeConfig:
    data = json.loads(json.dumps(shared))
    for item in [*node.get("set", []), *overrides]:
        apply_override(data, item)
    data["node_dir"] = str(run_dir / f"node{index}-{node['name']}")
    data.setdefault("train", {})["total_steps"] = steps
    data.setdefault("train", {}).setdefault("seed", index)
    swarm = data.setdefault("swarm", {})
    swarm["initial_peers"] = bootstrap
    swarm["host_maddrs"] = ["/ip4/127.0.0.1/tcp/0"]
    data.setdefault("checkpoint", {}).setdefault("every_steps", steps)
    return NodeConfig.model_validate(data)


def _start_node(cfg: NodeConfig, name: str) -> NodeProc:
    node_dir = Path(cfg.node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    config_path = node_dir / "node.toml"
    atomic_write_text(config_path, cfg.dump_toml())
    log = open(node_dir / "node.log", "ab")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen([sys.executable, "-m", "swarm_node.cli", "join", "--config", str(config_path)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    return NodeProc(name, node_dir, proc, cfg.model.name, cfg.model.lora.enabled)


def _last_metrics(node_dir: Path) -> dict[str, float]:
    from swarm_node.metrics import read_metrics_jsonl

    path = node_dir / "metrics.jsonl"
    rows = read_metrics_jsonl(path) if path.exists() else []
    return rows[-1] if rows else {}


def status_table(procs: list[NodeProc], steps: int, title: str | None = None) -> Table:
    table = Table(title=title or f"swarm-node local: {len(procs)} nodes, {steps} steps each")
    for col in ("node", "model", "step", "reward", "acc", "own", "peer", "peer used", "filtered adv/kl",
                "dropped", "tok/s", "state"):
        table.add_column(col, justify="right" if col not in ("node", "model", "state") else "left")
    for p in procs:
        m = _last_metrics(p.node_dir)
        rc = p.proc.poll()
        state = "running" if rc is None else ("done" if rc == 0 else f"exit {rc}")
        dropped = sum(v for k, v in m.items() if k.startswith("total_dropped_"))
        table.add_row(
            p.name, f"{p.model}{' +LoRA' if p.lora else ''}", f"{int(m.get('step', 0))}",
            f"{m.get('reward_mean', 0):.2f}", f"{m.get('accuracy', 0):.2f}", f"{int(m.get('own_samples', 0))}",
            f"{int(m.get('peer_samples', 0))}", f"{int(m.get('peer_samples_used', 0))}",
            f"{int(m.get('filtered_nonpositive_advantage', 0))}/{int(m.get('filtered_kl', 0))}",
            f"{int(dropped)}", f"{m.get('tokens_per_s', 0):.0f}", state)
    return table


def _stop_all(procs: list[NodeProc]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGINT)  # nodes finish the step, checkpoint and leave
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    for p in procs:
        try:
            p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


def run_local(*, nodes: int, steps: int, config: Path | None, run_dir: Path | None, overrides: list[str]) -> int:
    from swarm_node.assemble import start_transport
    from swarm_node.config import SwarmConfig
    from swarm_node.observe import stop_on_signals

    console = Console()
    run_dir = Path(run_dir or Path("runs") / time.strftime("local-%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    shared, per_node = plan_nodes(nodes, config)
    # Validate every node's config before starting anything, so a typo costs nothing.
    probe = [_node_config(shared, n, i, run_dir, steps, [], overrides) for i, n in enumerate(per_node)]
    swarm_id = probe[0].swarm.swarm_id

    t0 = time.monotonic()
    bootstrap = start_transport(SwarmConfig(swarm_id=swarm_id, host_maddrs=["/ip4/127.0.0.1/tcp/0"]),
                                run_dir / "bootstrap")
    procs: list[NodeProc] = []
    interrupted = False
    try:
        maddrs = [str(m) for m in bootstrap.visible_maddrs]
        console.print(f"bootstrap DHT: {maddrs[0] if maddrs else '?'}  run dir: {run_dir}")
        for i, node in enumerate(per_node):
            cfg = _node_config(shared, node, i, run_dir, steps, maddrs, overrides)
            procs.append(_start_node(cfg, node["name"]))
        stop = stop_on_signals()  # Ctrl-C or SIGTERM: stop the nodes cleanly
        with Live(status_table(procs, steps), console=console, refresh_per_second=1) as live:
            while any(p.proc.poll() is None for p in procs) and not stop.wait(2.0):
                live.update(status_table(procs, steps))
            if stop.is_set():
                interrupted = True
                console.print("stopping nodes (each finishes its step and checkpoints)...")
                _stop_all(procs)
            live.update(status_table(procs, steps))
    finally:
        _stop_all(procs)
        bootstrap.shutdown()
    return _summarise(console, procs, run_dir, time.monotonic() - t0, interrupted)


def _summarise(console: Console, procs: list[NodeProc], run_dir: Path, seconds: float, interrupted: bool) -> int:
    from swarm_node.report import write_report

    failed = [p for p in procs if p.proc.returncode != 0]
    console.print(status_table(procs, 0, title="swarm-node local: final state of every node"))
    report = write_report(run_dir)
    console.print(f"wall time {seconds:.0f}s; logs: {run_dir}/*/node.log; metrics: {run_dir}/*/metrics.jsonl")
    console.print(f"report and plots: {report}")
    for p in failed:
        console.print(f"[red]node {p.name} exited with {p.proc.returncode}; see {p.node_dir / 'node.log'}[/red]")
    if interrupted:
        return 130
    return 1 if failed else 0
