"""The node's step loop and its supervised lifecycle. No math and no wire details live here:
the objective is in `objective.py` (via the trainer), the wire format in `protocol/`, the
conversion between the two in `own_rollouts.py` (own groups) and `rollouts.py` (peers'), and every
external dependency arrives built, in `NodeParts`, so a unit test can run the whole loop with fakes.

One step: choose prompts -> generate groups -> publish -> gather peers' groups (started in the
background at the beginning of the step, so the network overlaps generation) -> train on own plus
peer samples -> push weights to the generator -> status record, metrics -> checkpoint on schedule.

Prompts (`_choose_problems`): a node exchanging with peers follows the protocol's prompt binding
(`swarm.binding`): its k-th step started in DHT time window w answers slot k of w
(`tasks.window_prompts`), its groups carry the step's start time as `created_at` and are
published only for k < `swarm.slots_per_window`; a node training alone takes its prompts by step.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from swarm_node import own_rollouts, rollouts
from swarm_node.config import NodeConfig
from swarm_node.health import HealthTracker
from swarm_node.policy.types import Generator
from swarm_node.tasks import select_prompts, window_prompts
from swarm_node.tasks.base import PromptSet, RewardFn

log = logging.getLogger(__name__)


@dataclass
class NodeParts:
    """Everything a node uses, built outside the loop (see `assemble.build_parts`)."""

    config: NodeConfig
    policy: Any  # swarm_node.policy.models.Policy
    generator: Generator
    trainer: Any  # swarm_node.policy.trainer.Trainer
    prompt_set: PromptSet
    reward_fn: RewardFn
    peer_id: str
    exchange: Any | None = None  # swarm_node.swarm.exchange.RolloutExchange; None: train alone
    dht_time: Callable[[], float] = time.time
    sinks: list[Callable[[dict[str, float]], None]] = field(default_factory=list)
    save_checkpoint: Callable[[dict[str, Any]], None] | None = None
    close_hooks: list[Callable[[], None]] = field(default_factory=list)
    rejects: Any | None = None  # swarm_node.rejects.RejectList: peer records refused for good
    ledger: Any | None = None  # swarm_node.ledger.PeerLedger: per-peer counts, statistics, reputation
    evaluate: Callable[[int], Any] | None = None  # held-out evaluation at a step (heldout_eval.py)
    # Prompts by window slot (the binding) rather than by step; None: when exchanging with peers.
    # The lockstep harness sets it for every arm, so isolated and swarm arms share a prompt order.
    window_prompts: bool | None = None
    # Keeps the seeded prompt set's records alive (swarm/prompt_keeper.py, its own thread); None: none.
    prompt_keeper: Any | None = None
    # Logprob spot-checks of peers' groups (swarm_node/spotcheck.py); None: none.
    spot_checker: Any | None = None


@dataclass
class StepRollout:
    """The first half of a step (`Node.generate_step`): this node's own groups, scored and published."""

    window: int
    problems: list
    own: own_rollouts.OwnBatch
    started: float  # perf_counter at the start of the step
    gen_seconds: float
    publish_seconds: float
    bytes_per_token: float


class Node:
    """Runs steps until `total_steps` or `stop()`; `run()` always checkpoints and closes parts."""

    def __init__(self, parts: NodeParts, start_step: int = 0) -> None:
        self.parts = parts
        self.cfg = parts.config
        self.step = start_step
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gather")
        self._rng = random.Random(f"{parts.peer_id}:{self.cfg.train.seed}")
        self._drops: Counter[str] = Counter()  # cumulative drops of peer data, by reason
        self.health = HealthTracker(parts.exchange.transport if parts.exchange is not None else None)
        self._last_checkpoint_step = start_step
        self._last_republish = time.monotonic()
        self._slot_window, self._slot = -1, -1  # the window of the last step and its slot there
        self._warned_stale = False
        self.history: list[dict[str, float]] = []

    # ---- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the current step and shut down (signal handlers call this)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_steps: int | None = None) -> None:
        """Run up to `max_steps` more steps (default: until train.total_steps)."""
        end = self.cfg.train.total_steps if max_steps is None else self.step + max_steps
        evaluate = self.parts.evaluate
        try:
            start = self.step
            if evaluate is not None and start == 0 and start < end:
                evaluate(0)  # before any training (a resumed node has its step-0 row already)
            while self.step < end and not self._stop.is_set():
                self.run_step()
            if evaluate is not None and self.step > start and self.step >= end and not self._stop.is_set():
                evaluate(self.step)  # after the last step; a stopped node leaves without it
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            if self.step > self._last_checkpoint_step:
                self.checkpoint()
        finally:
            for hook in reversed(self.parts.close_hooks):
                hook()

    def checkpoint(self) -> None:
        self.save_ledger()
        if self.parts.save_checkpoint is not None:
            self.parts.save_checkpoint({"step": self.step, "peer_id": self.parts.peer_id,
                                        "drops": dict(self._drops)})
            self._last_checkpoint_step = self.step

    def save_ledger(self) -> None:
        if self.parts.ledger is not None:
            self.parts.ledger.save()

    # ---- one step --------------------------------------------------------------------------

    def run_step(self) -> dict[str, float]:
        """One step; the gather of peers' groups starts first, so the network overlaps generation."""
        started_at = self.parts.dht_time()  # the groups' created_at: when this step chose its prompts
        gathering = self.start_gather(rollouts.window_of(started_at, self.cfg.swarm.window_seconds))
        return self.train_step(self.generate_step(started_at), gathering)

    def generate_step(self, started_at: float | None = None) -> StepRollout:
        """The first half of a step: choose prompts, generate own groups, score and publish them.

        `run_step` runs both halves; lockstep horizontal runs this half on every node of an arm
        before any node gathers (`experiment.lockstep`), so peers' parts of a shared group arrive."""
        cfg, parts = self.cfg, self.parts
        t0 = time.perf_counter()
        if started_at is None:
            started_at = parts.dht_time()  # the groups' created_at: when this step chose its prompts
        window = rollouts.window_of(started_at, cfg.swarm.window_seconds)
        self._slot = self._slot + 1 if window == self._slot_window else 0
        self._slot_window = window
        problems = self._choose_problems(window, self._slot)
        prompt_ids = rollouts.render_prompts(parts, problems)
        t_gen = time.perf_counter()
        completions = parts.generator.generate(prompt_ids, cfg.generation.group_size)
        gen_seconds = time.perf_counter() - t_gen
        own = own_rollouts.own_samples(parts, problems, prompt_ids, completions, self.step, window)
        bytes_per_token = 0.0
        t_pub = time.perf_counter()
        if parts.exchange is not None:
            if self._publishable(window):
                groups = own_rollouts.to_wire_groups(parts, problems, completions, own, self.step, started_at)
                bytes_per_token = parts.exchange.publish_groups(groups, window)
            self._republish_if_due(window)
        return StepRollout(window, problems, own, t0, gen_seconds, time.perf_counter() - t_pub, bytes_per_token)

    def train_step(self, rollout: StepRollout, gathering: Future | None) -> dict[str, float]:
        """The second half of a step: wait for peers' groups (`start_gather`), train, log, checkpoint."""
        cfg, parts, own = self.cfg, self.parts, rollout.own
        t_gather = time.perf_counter()
        peer, step_drops = self._finish_gather(gathering, own, rollout.problems)
        gather_seconds = time.perf_counter() - t_gather
        samples = own.samples + peer.samples

        t_train = time.perf_counter()
        train_metrics = parts.trainer.step(samples)
        step_drops.update(rollouts.remember_poisoned(parts, getattr(parts.trainer, "poisoned", ())))
        keeper_metrics: dict[str, float] = {}
        if parts.prompt_keeper is not None:  # raises here if the keeper's thread failed
            keeper_metrics = parts.prompt_keeper.step_metrics()
            step_drops.update(parts.prompt_keeper.take_drops())
        if parts.ledger is not None:
            parts.ledger.record_samples(getattr(parts.trainer, "peer_sample_stats", ()))
        self._drops.update(step_drops)
        train_seconds = time.perf_counter() - t_train
        parts.generator.sync_weights(parts.policy.model)
        self.step += 1

        n_tokens = sum(len(s.completion_ids) for s in own.samples)
        now = parts.dht_time()
        gen_seconds = rollout.gen_seconds
        metrics: dict[str, float] = {
            **{k: float(v) for k, v in train_metrics.items()},
            "step": float(self.step),
            "time": now,
            "reward_mean": own.reward_mean,
            "accuracy": own.accuracy,
            "mixed_groups": own.mixed_fraction,
            "own_samples": float(len(own.samples)),
            "peer_samples": float(len(peer.samples)),
            "peer_groups": float(peer.groups),
            "tokens_per_s": n_tokens / gen_seconds if gen_seconds > 0 else 0.0,
            "gen_seconds": gen_seconds,
            "train_seconds": train_seconds,
            "step_seconds": time.perf_counter() - rollout.started,
            "bytes_per_token": float(rollout.bytes_per_token or 0.0),
            "text_groups": float(own.text_groups),
            "text_withheld": float(own.text_withheld),
            "peer_reward_seconds": peer.verify_seconds,
            **peer.spot_metrics,
            **({"peer_newest_age_s": now - peer.newest_created_at} if peer.newest_created_at is not None else {}),
            **keeper_metrics,
            **self.health.step_metrics(step_drops, publish_seconds=rollout.publish_seconds,
                                       gather_seconds=gather_seconds, peer_groups=peer.groups),
        }
        self.history.append(metrics)
        for sink in parts.sinks:
            sink(metrics)
        if self.step % cfg.checkpoint.every_steps == 0:
            self.checkpoint()
        elif self.step % cfg.metrics.ledger_every_steps == 0:
            self.save_ledger()
        log.info("step %d reward %.3f acc %.3f own %d peer %d loss %.4f (%.1fs)", self.step,
                 own.reward_mean, own.accuracy, len(own.samples), len(peer.samples),
                 metrics.get("loss", 0.0), metrics["step_seconds"])
        return metrics

    def _republish_if_due(self, window: int) -> None:
        """Records expire after record_ttl_s: re-store the ones peers may still fetch."""
        if time.monotonic() - self._last_republish >= self.cfg.swarm.record_ttl_s / 3:
            self.parts.exchange.republish(window, self.cfg.swarm.staleness_steps)
            self._last_republish = time.monotonic()

    def _choose_problems(self, window: int, slot: int) -> list:
        cfg, ps = self.cfg, self.parts.prompt_set
        n = min(cfg.train.prompts_per_step, len(ps))
        by_window = self.parts.window_prompts
        if by_window is None:
            by_window = self.parts.exchange is not None
        if cfg.swarm.collaboration == "horizontal":
            # Every node answers the same prompts in a window; groups are unions across nodes.
            indices = select_prompts("horizontal", window, n, len(ps), salt=cfg.swarm.swarm_id)
        elif by_window:
            indices = window_prompts(self.parts.peer_id, window, slot, n, len(ps), salt=cfg.swarm.swarm_id)
        else:
            indices = select_prompts(self.parts.peer_id, self.step, n, len(ps), salt=cfg.swarm.swarm_id)
        return [ps.problems[i] for i in indices]

    def _publishable(self, window: int) -> bool:
        """Whether this step's groups go out: a slot peers accept (< swarm.slots_per_window), and not
        already older than peers read (a step that outlasted the staleness bound, or a pause)."""
        sw = self.cfg.swarm
        if self._slot >= sw.slots_per_window:
            return False
        age = rollouts.window_of(self.parts.dht_time(), sw.window_seconds) - window
        if age > sw.staleness_steps:
            if not self._warned_stale:
                log.warning("this step took %d windows (swarm.window_seconds=%g): peers drop groups older than "
                            "swarm.staleness_steps=%d windows, so they are not published (raise both swarm-wide "
                            "for slower steps)", age, sw.window_seconds, sw.staleness_steps)
                self._warned_stale = True
            return False
        return True

    def start_gather(self, window: int) -> Future | None:
        """Fetch peers' groups of `window` (and the staleness windows before it) in the background."""
        cfg, exchange = self.cfg, self.parts.exchange
        if exchange is None or cfg.swarm.max_peer_groups_per_step == 0 or cfg.swarm.max_peer_fraction == 0:
            return None
        own_groups = min(cfg.train.prompts_per_step, len(self.parts.prompt_set))
        return self._pool.submit(rollouts.gather_peer_samples, self.parts, window, own_groups,
                                 self._rng.getrandbits(64), self.step)

    def _finish_gather(self, gathering: Future | None, own: own_rollouts.OwnBatch,
                       problems: list) -> tuple[rollouts.PeerBatch, Counter[str]]:
        if gathering is None:
            return rollouts.PeerBatch(), Counter()
        wait = self.cfg.swarm.fetch_timeout_s + self.cfg.task.peer_reward_budget_s + 5.0
        try:
            return gathering.result(timeout=wait)
        except FutureTimeout:
            gathering.cancel()
            return rollouts.PeerBatch(), Counter({"gather_timeout": 1})
