"""What a node is built from: `NodeParts`, and the Protocols of its parts.

The step loop (`node.py`) and the conversions it calls (`own_rollouts.py` for own groups,
`peer_rollouts.py` for peers') see the node's dependencies only through the types here. Each Protocol
lists what the loop uses of a part and names the implementation `assemble.build_parts` puts there;
tests put real tiny parts or fakes (`tests/fakes.py`) in their place. A part the node can run
without is `None` (training alone: no exchange, ledger, keeper or spot checker).

Light on purpose: no torch, transformers or hivemind at import (their types appear only under
TYPE_CHECKING), and nothing of the loop, so every module of the loop can import it.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from protocol.messages import NodeStatus, RolloutGroup
from swarm_node.config import NodeConfig
from swarm_node.policy.types import Generator, SampleStat, TrainSample
from swarm_node.swarm.admission import Admission
from swarm_node.swarm.tokenizers import TokenizerCensus
from swarm_node.swarm.transport import Transport
from swarm_node.tasks.base import Problem, PromptSet, RewardFn

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@runtime_checkable
class PolicyView(Protocol):
    """What the loop reads of the policy (`policy.models.Policy`): its tokenizer, the model the
    generator syncs from, and what a wire group declares about the weights that made it."""

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def declared_revision(self) -> str: ...

    @property
    def adapter_digest(self) -> str: ...

    @property
    def stop_token_ids(self) -> list[int]: ...


@runtime_checkable
class StepTrainer(Protocol):
    """One optimisation step on own and peer samples (`policy.trainer.Trainer`). After `step`:
    `poisoned`, the peer samples blamed for a non-finite step; `peer_sample_stats`, what it measured
    of each peer sample (the ledger's per-sender statistics)."""

    @property
    def poisoned(self) -> Sequence[TrainSample]: ...

    @property
    def peer_sample_stats(self) -> Sequence[SampleStat]: ...

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]: ...


@runtime_checkable
class PeerExchange(Protocol):
    """Publishing own groups and gathering peers' (`swarm.exchange.RolloutExchange`)."""

    @property
    def transport(self) -> Transport: ...

    @property
    def admission(self) -> Admission | None: ...

    @property
    def tokenizers(self) -> TokenizerCensus: ...

    def publish_groups(self, groups: Sequence[RolloutGroup], window: int) -> float: ...

    def republish(self, current_window: int, staleness_windows: int) -> int: ...

    def fetch_groups(self, current_window: int, staleness_windows: int, max_groups: int, max_per_peer: int,
                     timeout: float, rng: random.Random) -> tuple[list[RolloutGroup], Counter[str]]: ...

    def read_statuses(self, timeout: float, drops: Counter[str] | None = None) -> list[NodeStatus]: ...


@runtime_checkable
class Ledger(Protocol):
    """What the node records of each peer (`ledger.PeerLedger`), and what peers' receipts say of
    this node (`given_metrics`)."""

    def record_group(self, peer: str, reason: str | None, tokenizer: str = "") -> None: ...

    def record_late_drop(self, peer: str, reason: str) -> None: ...

    def record_samples(self, stats: Iterable[SampleStat]) -> None: ...

    def given_metrics(self) -> dict[str, float]: ...

    def save(self) -> None: ...


@runtime_checkable
class Rejects(Protocol):
    """Peer records refused for good, across restarts (`rejects.RejectList`)."""

    def __contains__(self, record_id: object) -> bool: ...

    def add(self, record_id: str, reason: str) -> bool: ...


@runtime_checkable
class PromptKeeper(Protocol):
    """Keeps the seeded prompt set's records alive in its own thread (`swarm.prompt_keeper.PromptSetKeeper`);
    `step_metrics` raises when that thread failed."""

    def step_metrics(self) -> dict[str, float]: ...

    def take_drops(self) -> Counter[str]: ...


class SpotSession(Protocol):
    """One step's logprob spot-checks within its budgets (`spotcheck.SpotSession`)."""

    def check(self, group: RolloutGroup, problem: Problem) -> str | None: ...

    def metrics(self) -> dict[str, float]: ...


@runtime_checkable
class SpotChecks(Protocol):
    """The node's spot-check references and settings (`spotcheck.SpotChecker`)."""

    def session(self, seed: int) -> SpotSession: ...


class CheckpointExtra(TypedDict):
    """What the node saves beside the trainer's state in a checkpoint (`extra.json`)."""

    step: int
    peer_id: str
    drops: dict[str, int]  # cumulative drops of peer data, by reason


MetricsSink = Callable[[dict[str, float]], None]  # a step's metrics: JSONL log, Prometheus, status record
CheckpointSaver = Callable[[CheckpointExtra], None]
# Held-out evaluation at a step (evaluation.heldout.HeldoutEvaluator): its evals.jsonl row (numbers, and the
# held-out set's id and the outcomes as strings), whose numbers go into later steps' metrics.
Evaluator = Callable[[int], Mapping[str, float | int | str]]


@dataclass
class NodeParts:
    """Everything a node uses, built outside the loop (`assemble.build_parts`)."""

    config: NodeConfig
    policy: PolicyView
    generator: Generator
    trainer: StepTrainer
    prompt_set: PromptSet
    reward_fn: RewardFn
    peer_id: str
    exchange: PeerExchange | None = None  # None: train alone
    dht_time: Callable[[], float] = time.time
    sinks: list[MetricsSink] = field(default_factory=list)
    save_checkpoint: CheckpointSaver | None = None
    close_hooks: list[Callable[[], None]] = field(default_factory=list)
    rejects: Rejects | None = None  # peer records refused for good
    ledger: Ledger | None = None  # per-peer counts, statistics, reputation
    evaluate: Evaluator | None = None
    # Prompts by window slot (the binding) rather than by step; None: when exchanging with peers.
    # The lockstep harness sets it for every arm, so isolated and swarm arms share a prompt order.
    window_prompts: bool | None = None
    prompt_keeper: PromptKeeper | None = None  # None: no seeded prompt set to keep alive
    # The set a switch left and the DHT time until which peers' groups on it are still trained on
    # (`prompt_switch`: the handover); None: no switch, one to another answer kind, or horizontal.
    ended_prompt_set: tuple[PromptSet, float] | None = None
    spot_checker: SpotChecks | None = None  # logprob spot-checks of peers' groups; None: none

    @property
    def admission(self) -> Admission | None:
        """The exchange's admission rules (None when training alone or without them)."""
        return self.exchange.admission if self.exchange is not None else None
