"""Swarm execution: the same arm as real node processes over the hivemind DHT (`swarm-node local`).

The nodes' production configs are written as a `swarm-node local` file (the first node's config as
the shared sections, every other node's differences as its `set` overrides); each node checkpoints
every `eval.every` steps and keeps them all, and the held-out evaluation reads those checkpoints
after the run, so it measures exactly the weights the running nodes had at those steps.

Real processes run unsynchronised: in a horizontal arm a node trains on the parts of a shared group
that have arrived when its gather ends (lockstep waits for every part; see lockstep.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_text
from swarm_node.config import NodeConfig
from swarm_node.config.toml_text import to_toml, toml_value
from swarm_node.experiment.lockstep import eval_steps

PER_PROCESS = ("node_dir",)  # `swarm-node local` fills these in itself
PER_PROCESS_SWARM = ("initial_peers", "host_maddrs")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def local_file(configs: list[tuple[str, NodeConfig]], every: int, steps: int) -> str:
    """A `swarm-node local --config` file running exactly these node configs."""
    dumps = []
    for _, cfg in configs:
        d = cfg.model_dump(mode="json", exclude_none=True)
        for k in PER_PROCESS:
            d.pop(k, None)
        for k in PER_PROCESS_SWARM:
            d["swarm"].pop(k, None)
        d["checkpoint"]["every_steps"] = every
        d["checkpoint"]["keep"] = steps // every + 2
        dumps.append(d)
    shared = dumps[0]
    flat_shared = _flatten(shared)
    lines = [f"nodes = {len(configs)}", "", to_toml(shared)]
    for (name, _), d in zip(configs, dumps, strict=True):
        diff = [f"{k}={toml_value(v)}" for k, v in _flatten(d).items() if flat_shared.get(k) != v]
        lines += ["[[node]]", f"name = {toml_value(name)}", f"set = {toml_value(diff)}", ""]
    return "\n".join(lines)


def run_swarm(configs: list[tuple[str, NodeConfig]], *, steps: int, evaluate: Callable[[str, Any, int], dict],
              eval_every: int, run_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one arm x seed as real processes, then evaluate the checkpoints; writes evals.jsonl."""
    from swarm_node.policy.checkpoint import checkpoint_name, load_weights
    from swarm_node.policy.models import load_policy

    path = run_dir / "local.toml"
    atomic_write_text(path, local_file(configs, eval_every, steps))
    swarm_dir = run_dir / "swarm"
    cmd = [sys.executable, "-m", "swarm_node", "local", "--nodes", str(len(configs)), "--steps", str(steps),
           "--config", str(path), "--run-dir", str(swarm_dir)]
    with open(run_dir / "local.log", "ab") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"`swarm-node local` exited with {rc}; see {run_dir / 'local.log'}")
    rows = []
    for i, (name, cfg) in enumerate(configs):
        node_dir = swarm_dir / f"node{i}-{name}"
        policy = load_policy(cfg.model, seed=cfg.train.seed)
        for step in eval_steps(steps, eval_every):
            if step > 0:
                load_weights(node_dir / "checkpoints" / checkpoint_name(step), policy)
            rows.append({"node": name, "step": step, **evaluate(name, policy, step)})
        log(f"  {name}: held-out " + " ".join(f"{r['step']}:{r['accuracy']:.3f}" for r in rows if r["node"] == name))
        # the node's metrics log, where the summary looks for it
        (run_dir / name).mkdir(exist_ok=True)
        src = node_dir / "metrics.jsonl"
        if src.exists():
            atomic_write_text(run_dir / name / "metrics.jsonl", src.read_text())
    atomic_write_text(run_dir / "evals.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return {"evals": rows}
