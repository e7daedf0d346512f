"""`swarm-node local`: a bootstrap DHT and N node processes on this machine, a live table, a summary.

The bootstrap DHT runs in this process; each node is a `swarm-node join` subprocess with its own
node directory under the run directory (config, log, metrics, checkpoints). The live table reads
each node's metrics.jsonl, so it shows exactly what the nodes logged; when stdout is not a
terminal it is replaced by one plain line per node and step.

Before anything starts, every node's config is validated and checked (`preflight`: model name,
data, paths), so a typo costs a second. A node that fails stops the run, and its own error line
is shown. Ctrl-C or SIGTERM is forwarded to the nodes, which finish their step and checkpoint;
after `stop_timeout` seconds the ones still running are killed. Nodes watch this process
(SWARM_NODE_PARENT_PID): killed with -9, it leaves no node training on. Precedence of settings:
command-line options, then the --config file, then the defaults below.
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

from swarm_node.util import lifecycle
from swarm_node.util.atomic import atomic_write_text
from swarm_node.config import NodeConfig, SwarmConfig
from swarm_node.config.toml_text import apply_override
from swarm_node.util.errors import ConfigError, describe, one_line
from swarm_node.observe.local_view import LiveView

# Small enough that two nodes sharing two CPU cores run a dozen steps in minutes. With the task's
# worked example the embedded SmolLM2-135M answers level-1 arithmetic in about 25 tokens and most of
# its groups have mixed rewards (docs/results.md, "The embedded default earns reward").
LOCAL_DEFAULTS: list[str] = [
    "generation.group_size=6",
    "generation.max_new_tokens=32",
    "eval.batch_size=32",
    "train.prompts_per_step=2",
    "train.micro_batch_size=6",
    "train.learning_rate=1e-5",
    "swarm.window_seconds=60.0",  # a step takes about a minute here: peers' groups stay fresh for minutes
    "swarm.fetch_timeout_s=5.0",
    "swarm.max_peer_fraction=0.5",
    "swarm.max_peer_groups_per_step=2",
    "swarm.max_groups_per_peer=2",
    "checkpoint.keep=1",
    # a local swarm's status shards hold a few records, so a store costs little: status at every step,
    # and the dashboard follows each one (a real swarm: at most every 30 s, config help)
    "metrics.status_min_interval_s=0",
]
DEFAULT_NODES: list[dict[str, Any]] = [
    {"name": "full", "set": []},
    {"name": "lora", "set": ["model.lora.enabled=true", "train.learning_rate=1e-4"]},
]
SHUTDOWN_GRACE_S = 120.0
POLL_S = 2.0


@dataclass
class NodeProc:
    name: str
    node_dir: Path
    proc: subprocess.Popen
    model: str
    lora: bool


def plan_nodes(nodes: int | None, config: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Shared config dict and the per-node list (`name`, `set` overrides) from the TOML or defaults.
    `nodes` (the --nodes option) beats the file's `nodes`, which beats the default node list."""
    shared: dict[str, Any] = {}
    for item in LOCAL_DEFAULTS:
        apply_override(shared, item)
    per_node = [dict(n) for n in DEFAULT_NODES]
    count = len(per_node)
    if config is not None:
        data = _read_toml(config)
        count = int(data.pop("nodes", count))
        per_node = data.pop("node", per_node)
        if not isinstance(per_node, list) or not all(isinstance(n, dict) for n in per_node):
            raise ConfigError(f"{config}: [[node]] entries must be tables with `name` and `set`",
                              'write e.g. [[node]] name = "lora" set = ["model.lora.enabled=true"]')
        _deep_update(shared, data)
    count = nodes if nodes is not None else count
    while len(per_node) < count:
        per_node.append({"name": f"node{len(per_node)}", "set": []})
    return shared, per_node[:count]


def _read_toml(config: Path) -> dict[str, Any]:
    try:
        with open(config, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {config}: {e.strerror or e}", "check the --config path") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{config} is not valid TOML: {one_line(str(e))}", "fix the file's syntax") from e


def _deep_update(base: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v


def node_config(shared: dict[str, Any], node: dict[str, Any], index: int, run_dir: Path, steps: int,
                 bootstrap: list[str], overrides: list[str], eval_problems: int = 0) -> NodeConfig:
    name = node.get("name", f"node{index}")
    try:
        data = json.loads(json.dumps(shared))
        for item in [*node.get("set", []), *overrides]:
            apply_override(data, item)
        if data.get("task", {}).get("name", "arithmetic") == "arithmetic":  # the one built-in held-out set
            data.setdefault("eval", {})["problems"] = eval_problems
        data["node_dir"] = str(run_dir / f"node{index}-{name}")
        data.setdefault("train", {})["total_steps"] = steps
        data.setdefault("train", {}).setdefault("seed", index)
        swarm = data.setdefault("swarm", {})
        swarm["initial_peers"] = bootstrap
        swarm["host_maddrs"] = ["/ip4/127.0.0.1/tcp/0"]
        data.setdefault("checkpoint", {}).setdefault("every_steps", steps)
        return NodeConfig.model_validate(data)
    except ValueError as e:  # pydantic's ValidationError and malformed overrides
        typed = describe(e)
        what = typed.what if typed is not None else f"invalid configuration: {one_line(str(e))}"
        raise ConfigError(f"node {name}: {what}", "fix the --config file or the --set override") from e


# The swarm settings every replica must share: they decide which index keys a replica accepts
# (`swarm.index.owned_key_schedule`), so a replica with other values refuses honest records.
SCHEDULE_FIELDS = ("swarm_id", "window_seconds", "staleness_steps")


def bootstrap_swarm_config(configs: list[NodeConfig]) -> SwarmConfig:
    """The bootstrap replica's swarm settings: the nodes' own (so it stores exactly the keys they
    write), listening on loopback, with no initial peers. The nodes must agree on SCHEDULE_FIELDS."""
    first = configs[0].swarm
    for cfg in configs[1:]:
        differ = [f for f in SCHEDULE_FIELDS if getattr(cfg.swarm, f) != getattr(first, f)]
        if differ:
            raise ConfigError(f"nodes disagree on swarm.{differ[0]} ({getattr(first, differ[0])!r} vs "
                              f"{getattr(cfg.swarm, differ[0])!r}): their DHT replicas would refuse each other's "
                              "records", f"set swarm.{differ[0]} once for all nodes, not per node")
    return first.model_copy(update={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "initial_peers": [],
                                    "announce_maddrs": []})


def _preflight(configs: list[NodeConfig], run_dir: Path) -> None:
    """What each node would check at its start, checked once here before anything starts."""
    from swarm_node.node import preflight

    preflight.check_node_dir(run_dir)
    checked_data: set[str] = set()
    for cfg in configs:
        preflight.check_model_name(cfg.model.name)
        key = cfg.task.model_dump_json()
        if cfg.swarm.prompt_set_id is None and key not in checked_data:
            preflight.check_task_data(cfg)
            checked_data.add(key)
        preflight.check_node_dir(Path(cfg.node_dir))
        preflight.check_checkpoint_model(Path(cfg.node_dir), cfg)


def _start_node(cfg: NodeConfig, name: str) -> NodeProc:
    node_dir = Path(cfg.node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    config_path = node_dir / "node.toml"
    atomic_write_text(config_path, cfg.dump_toml())
    log = open(node_dir / "node.log", "ab")  # noqa: SIM115  (handed to the child)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           lifecycle.PARENT_ENV: str(os.getpid()), "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "swarm_node", "join", "--config", str(config_path)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    return NodeProc(name, node_dir, proc, cfg.model.name, cfg.model.lora.enabled)


def stop_nodes(procs: list[NodeProc], timeout_s: float = SHUTDOWN_GRACE_S) -> list[str]:
    """SIGTERM to every running node (it finishes its step, checkpoints and leaves), wait up to
    `timeout_s` in all, then SIGKILL the rest. Returns the names of the nodes that had to be killed."""
    return [procs[i].name for i in lifecycle.stop_processes([p.proc for p in procs], timeout_s)]


def run_local(*, nodes: int | None, steps: int, config: Path | None, run_dir: Path | None, overrides: list[str],
              stop_timeout: float = SHUTDOWN_GRACE_S, eval_problems: int = 0) -> int:
    from swarm_node.node.assemble import start_transport

    console = Console()
    run_dir = Path(run_dir or Path("runs") / time.strftime("local-%Y%m%d-%H%M%S"))
    shared, per_node = plan_nodes(nodes, config)
    # Validate and check every node's config before starting anything, so a typo costs nothing.
    probe = [node_config(shared, n, i, run_dir, steps, [], overrides, eval_problems) for i, n in enumerate(per_node)]
    _preflight(probe, run_dir)

    t0 = time.monotonic()
    procs: list[NodeProc] = []
    stop_signal: list[int] = []
    bootstrap = start_transport(bootstrap_swarm_config(probe), run_dir / "bootstrap")
    view = LiveView(console, steps)
    try:
        maddrs = [str(m) for m in bootstrap.visible_maddrs]
        console.print(f"bootstrap DHT: {maddrs[0] if maddrs else '?'}  run dir: {run_dir}", soft_wrap=True)
        for i, node in enumerate(per_node):
            cfg = node_config(shared, node, i, run_dir, steps, maddrs, overrides, eval_problems)
            procs.append(_start_node(cfg, node["name"]))
        lifecycle.on_stop(stop_signal.append)  # Ctrl-C or SIGTERM: stop the nodes cleanly
        failed = _watch(procs, view, stop_signal)
        if stop_signal or failed:
            reason = "a node failed" if failed and not stop_signal else "stopping"
            console.print(f"{reason}: each node finishes its step and checkpoints (up to {stop_timeout:.0f}s)...")
            killed = stop_nodes(procs, stop_timeout)
            if killed:
                console.print(f"killed after {stop_timeout:.0f}s: {', '.join(killed)}")
    finally:
        lifecycle.on_stop(None)
        stop_nodes(procs, stop_timeout)  # after an exception: still never leave a node behind
        view.close(procs)
        bootstrap.shutdown()
    return _summarise(console, procs, run_dir, time.monotonic() - t0, stop_signal)


def _watch(procs: list[NodeProc], view: LiveView, stop_signal: list[int]) -> NodeProc | None:
    """Show progress until every node is done, a signal arrives, or a node fails (returned)."""
    while not stop_signal:
        view.update(procs)
        failed = next((p for p in procs if p.proc.poll() not in (None, 0)), None)
        if failed is not None or all(p.proc.poll() is not None for p in procs):
            return failed
        deadline = time.monotonic() + POLL_S
        while not stop_signal and time.monotonic() < deadline:
            time.sleep(0.1)
    return None


def _summarise(console: Console, procs: list[NodeProc], run_dir: Path, seconds: float, stop_signal: list[int]) -> int:
    from swarm_node.node.preflight import last_error_line
    from swarm_node.observe.report import console_lines, find_metrics_files, read_summary, write_report

    stopped = {0, lifecycle.exit_code_for(signal.SIGINT), lifecycle.exit_code_for(signal.SIGTERM)}
    failed = [p for p in procs if p.proc.returncode not in stopped]  # stopped cleanly is not a failure
    console.print(f"wall time {seconds:.0f}s; logs: {run_dir}/*/node.log; metrics: {run_dir}/*/metrics.jsonl",
                  soft_wrap=True)
    if find_metrics_files(run_dir):
        summary = write_report(run_dir)
        for line in console_lines(read_summary(summary.parent)):
            console.print(line, soft_wrap=True, highlight=False)
        console.print(f"report and plots: {summary} (numbers: {summary.parent / 'summary.json'})", soft_wrap=True)
    else:
        console.print("no node finished a step: no report", soft_wrap=True)
    for p in failed:
        print(f"swarm-node: error: node {p.name} exited with {p.proc.returncode}: "
              f"{last_error_line(p.node_dir / 'node.log')}; full log: {p.node_dir / 'node.log'}",
              file=sys.stderr, flush=True)
    if stop_signal:
        return lifecycle.exit_code_for(stop_signal[0])
    return 1 if failed else 0
