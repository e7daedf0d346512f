"""Lockstep execution: every node of an arm in one process, taking turns over the in-memory transport.

Each round, every node (in the pair's order) runs one production `Node.run_step`: the same prompt
choice, generation, publishing, gathering, validation, re-scoring, objective and optimizer as a node
in a real swarm; only the transport is the in-memory one and DHT time is a round counter, so a run is
deterministic for its seed. With `peer_lag = k`, what a node stores in round r becomes visible to its
peers from round r + k on (k = 0: at once, so a node sees the groups of the nodes before it in this
round and of the nodes after it from the previous round, as in an asynchronous swarm).

Horizontal collaboration (every node answers parts of the same prompts' groups, docs/method.md)
runs each round in two phases instead: every node generates and publishes its parts
(`Node.generate_step`), then every node gathers and trains (`Node.train_step`), so each node's
groups of the round are the union of all nodes' parts, on the same prompts. It needs `peer_lag = 0`.

Held-out evaluation (greedy pass@1) runs at step 0, every `eval.every` steps and at the last step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from swarm_node.util.atomic import atomic_write_text
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

if TYPE_CHECKING:
    from swarm_node.node.loop import Node
    from swarm_node.node.parts import NodeParts

T0 = 1_700_000_000.0  # lockstep DHT time origin (a plausible wall-clock time)


class RoundClock:
    """DHT time of lockstep: round r lies in window r; each turn is a millisecond later."""

    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self.round = 0
        self.turn = 0

    def __call__(self) -> float:
        return T0 + self.round * self.window_seconds + 1.0 + 0.001 * self.turn


@dataclass
class Delivery:
    """Writes held back until `round + lag`: the staleness a real swarm has, made deterministic."""

    swarm: MemorySwarm
    lag: int
    pending: list[tuple[int, str, tuple]] = field(default_factory=list)

    def release(self, current_round: int) -> None:
        due = [p for p in self.pending if p[0] + self.lag <= current_round]
        self.pending = [p for p in self.pending if p[0] + self.lag > current_round]
        for _, kind, args in due:
            if kind == "owned":
                self.swarm.store_owned(*args)
            else:
                self.swarm.put_blob(*args)


class LaggedTransport(MemoryTransport):
    """A MemoryTransport whose writes reach the shared store through a `Delivery` (lag > 0)."""

    def __init__(self, swarm: MemorySwarm, peer_id: str, delivery: Delivery, clock: RoundClock) -> None:
        super().__init__(swarm, peer_id)
        self._delivery = delivery
        self._clock = clock

    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        if self._delivery.lag == 0:
            return super().store_owned(key, value, expiration_time, timeout)
        self._delivery.pending.append((self._clock.round, "owned", (key, self.peer_id, value, expiration_time)))
        return True

    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        if self._delivery.lag == 0:
            return super().put_blob(data, expiration_time, timeout)
        from swarm_node.swarm.transport import check_blob_put

        digest = check_blob_put(data, expiration_time, self.dht_time())
        self._delivery.pending.append((self._clock.round, "blob", (digest, data, expiration_time)))
        return digest


@dataclass
class LockstepNode:
    name: str
    node: Node
    parts: NodeParts


def build_nodes(configs: list[tuple[str, Any]], peer_lag: int) -> tuple[list[LockstepNode], RoundClock, Delivery | None]:
    """Production parts for each (name, NodeConfig); swarm-enabled configs share one MemorySwarm."""
    from swarm_node.node.assemble import build_parts
    from swarm_node.node.loop import Node

    window = configs[0][1].swarm.window_seconds
    clock = RoundClock(window)
    swarm = MemorySwarm(clock=clock)
    delivery = Delivery(swarm, peer_lag)
    nodes = []
    for name, cfg in configs:
        if (Path(cfg.node_dir) / "checkpoints").exists():
            raise ValueError(f"{cfg.node_dir} holds checkpoints: a lockstep run starts from a clean directory")
        transport = LaggedTransport(swarm, name, delivery, clock) if cfg.swarm.enabled else None
        parts, _ = build_parts(cfg, transport=transport)
        parts.peer_id = name  # the same prompt sequence whether the node trains alone or in the swarm:
        parts.dht_time = clock
        parts.window_prompts = True  # slot 0 of round r's window, the swarm's prompt binding, in every arm
        parts.save_checkpoint = None  # the grid keeps evaluations, not weights
        nodes.append(LockstepNode(name, Node(parts), parts))
    return nodes, clock, delivery


def close_nodes(nodes: list[LockstepNode]) -> None:
    """The node's own bounded shutdown (gather pool, generator, reward worker, metrics log)."""
    for n in nodes:
        n.node._shutdown()


def is_horizontal(configs: list[tuple[str, Any]]) -> bool:
    """Whether the arm's nodes collaborate horizontally (every swarm-enabled node says so)."""
    swarm = [cfg.swarm for _, cfg in configs if cfg.swarm.enabled]
    return bool(swarm) and all(s.collaboration == "horizontal" for s in swarm)


def _horizontal_round(nodes: list[LockstepNode], clock: RoundClock) -> None:
    """One round of horizontal collaboration: every node publishes its parts, then every node trains."""
    rollouts = []
    for turn, n in enumerate(nodes):
        clock.turn = turn
        rollouts.append(n.node.generate_step())
    for turn, (n, rollout) in enumerate(zip(nodes, rollouts, strict=True)):
        clock.turn = len(nodes) + turn
        n.node.train_step(rollout, n.node.start_gather(rollout.window))


def eval_steps(steps: int, every: int) -> list[int]:
    return sorted({0, steps, *range(every, steps + 1, every)})


def run_lockstep(configs: list[tuple[str, Any]], *, steps: int, peer_lag: int, seed: int,
                 evaluate: Callable[[str, Any, int], dict], eval_every: int, run_dir: Path,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one arm x seed; writes evals.jsonl in `run_dir` and returns {node: [eval rows]}.

    `evaluate(node_name, policy, step)` returns at least {"accuracy": float}."""
    horizontal = is_horizontal(configs)
    if horizontal and peer_lag:
        raise ValueError(f"horizontal collaboration needs peer_lag = 0 (got {peer_lag}): the parts of a shared "
                         "group must reach every node in the round they are generated")
    torch.manual_seed(seed)
    nodes, clock, delivery = build_nodes(configs, peer_lag)
    evals_path = run_dir / "evals.jsonl"
    rows: list[dict] = []
    when = eval_steps(steps, eval_every)
    t0 = time.perf_counter()
    try:
        if 0 in when:
            rows += [{"node": n.name, "step": 0, **evaluate(n.name, n.parts.policy, 0)} for n in nodes]
        for r in range(steps):
            clock.round, clock.turn = r, 0
            delivery.release(r)
            if horizontal:
                _horizontal_round(nodes, clock)
            else:
                for turn, n in enumerate(nodes):
                    clock.turn = turn
                    n.node.run_step()
            if r + 1 in when:
                rows += [{"node": n.name, "step": r + 1, **evaluate(n.name, n.parts.policy, r + 1)} for n in nodes]
                accs = " ".join(f"{row['node']}={row['accuracy']:.3f}" for row in rows[-len(nodes):])
                log(f"  step {r + 1}/{steps}: held-out {accs} ({time.perf_counter() - t0:.0f}s)")
    finally:
        close_nodes(nodes)
    atomic_write_text(evals_path, "".join(json.dumps(row) + "\n" for row in rows))
    return {"evals": rows, "seconds": time.perf_counter() - t0}
