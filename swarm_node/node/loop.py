"""The node's step loop and its supervised lifecycle. No math and no wire details live here:
the objective is in `objective.py` (via the trainer), the wire format in `protocol/`, the
conversion between the two in `own_rollouts.py` (own groups) and `peer_rollouts.py` (peers'), and every
external dependency arrives built, in `NodeParts` (`parts.py`: a Protocol for each), so a unit test
can run the whole loop with fakes.

One step: choose prompts -> generate groups -> publish -> gather peers' groups (started in the
background at the beginning of the step, so the network overlaps generation) -> train on own plus
peer samples -> push weights to the generator -> status record, metrics -> checkpoint on schedule.

Prompts (`_choose_problems`): a node exchanging with peers follows the protocol's prompt binding
(`swarm.binding`): its k-th step started in DHT time window w answers slot k of w
(`protocol.binding.window_prompts`), its groups carry the step's start time as `created_at` and are
published only for k < `swarm.slots_per_window`; a node training alone takes its prompts by step.

Slow nodes (docs/architecture.md, "Slow nodes"): a group reaches peers only if published within
about B = staleness_steps x window_seconds of its step's start. A node exchanging with peers whose
step's n prompts take longer than B at its measured time per group (`own_rollouts.Pacing`, a moving
average over past steps) generates them in sub-batches of at most B / 2 (at least one prompt) and
publishes each sub-batch's groups as soon as they are complete, while fresh; otherwise, as a node
training alone, in one call. Prompts, `created_at` and window stay the step's, so receivers change
nothing; groups complete too late are trained on, counted (`own_groups_unpublished_stale`) and not
published, with a warning (at most every `STALE_WARNING_EVERY_S`) that names what to change.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from protocol.binding import select_prompts, window_prompts
from swarm_node import metric_names as m
from swarm_node.evaluation import heldout
from swarm_node.node import own_rollouts
from swarm_node.node import peer_rollouts
from swarm_node.observe.health import HealthTracker
from swarm_node.node.parts import NodeParts, PeerExchange
from swarm_node.node.slots import SlotMemory
from swarm_node.tasks.base import Problem

log = logging.getLogger(__name__)

# The gather of a step's peer groups, running beside generation (`Node.start_gather`).
Gathering = Future[tuple[peer_rollouts.PeerBatch, Counter[str]]]

# Slow nodes (module docstring): the least time between two warnings about own groups gone stale.
STALE_WARNING_EVERY_S = 600.0


@dataclass
class StepRollout:
    """The first half of a step (`Node.generate_step`): this node's own groups, scored and published."""

    window: int
    problems: list[Problem]
    own: own_rollouts.OwnBatch
    started: float  # perf_counter at the start of the step
    gen_seconds: float
    publish_seconds: float
    bytes_per_token: float
    published: int = 0  # own groups published
    unpublished_stale: int = 0  # own groups complete only after peers stop reading them: not published


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
        self._slots = SlotMemory(self.cfg.node_dir)  # the window of the last step and its slot there
        sw = self.cfg.swarm
        self._pacing = own_rollouts.Pacing(sw.staleness_steps, sw.window_seconds)  # "Slow nodes"
        self._stale_warned_at: float | None = None  # time.monotonic() of the last warning about stale own groups
        self._generated = threading.Event()  # the current step's generation has ended (start_gather)
        self._eval_end: int | None = None  # the last step of the current run(): evaluated after it
        # the latest held-out evaluation (a resumed node: its last row up to the step it resumed at)
        self._eval_metrics = (heldout.latest_metrics(self.cfg.node_dir, start_step)
                              if parts.evaluate is not None else {})
        self.history: list[dict[str, float]] = []

    # ---- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the current step and shut down (signal handlers call this)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_steps: int | None = None) -> None:
        """Run up to `max_steps` more steps (default: until train.total_steps). With a held-out
        evaluator: before step 1, then after every eval.every_steps-th step and after the last
        (`_heldout_metrics`); a stopped node leaves without evaluating."""
        end = self.cfg.train.total_steps if max_steps is None else self.step + max_steps
        self._eval_end = end
        try:
            if self.parts.evaluate is not None and self.step == 0 < end:
                self._evaluate(0)  # before any training (a resumed node has its step-0 row already)
            while self.step < end and not self._stop.is_set():
                self.run_step()
        finally:
            self._shutdown()

    def _evaluate(self, step: int) -> None:
        evaluate = self.parts.evaluate
        if evaluate is not None:
            self._eval_metrics = heldout.eval_metrics(evaluate(step))

    def _heldout_metrics(self) -> dict[str, float]:
        """The latest held-out evaluation as step metrics, evaluating first when one is due after
        this step (heldout.due); its time is not part of the step's step_seconds."""
        if (self.parts.evaluate is not None and not self._stop.is_set()
                and heldout.due(self.step, self.cfg.eval.period, self._eval_end)):
            self._evaluate(self.step)
        return self._eval_metrics

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
        gathering = self.start_gather(peer_rollouts.window_of(started_at, self.cfg.swarm.window_seconds))
        return self.train_step(self.generate_step(started_at), gathering)

    def generate_step(self, started_at: float | None = None) -> StepRollout:
        """The first half of a step: choose prompts, generate own groups, score and publish them; a
        slow node in sub-batches, each published as soon as it is complete (module docstring).

        `run_step` runs both halves; lockstep horizontal runs this half on every node of an arm
        before any node gathers (`experiment.lockstep`), so peers' parts of a shared group arrive."""
        cfg, parts = self.cfg, self.parts
        t0 = time.perf_counter()
        if started_at is None:
            started_at = parts.dht_time()  # the groups' created_at: when this step chose its prompts
        window = peer_rollouts.window_of(started_at, cfg.swarm.window_seconds)
        slot = self._slots.next(window)
        problems = self._choose_problems(window, slot)
        prompt_ids = peer_rollouts.render_prompts(parts, problems)
        publishing = parts.exchange is not None and slot < cfg.swarm.slots_per_window
        if publishing:
            self._slots.save()  # before any group goes out: a restart in this window continues after it
        batches: list[own_rollouts.OwnBatch] = []
        pub, gen_seconds, start, n = own_rollouts.Published(), 0.0, 0, len(problems)
        t_dht = parts.dht_time()
        while start < n:
            end = self._pacing.sub_batch_end(start, n, window, parts.dht_time()) if publishing else n
            t_gen = time.perf_counter()
            completions = parts.generator.generate(prompt_ids[start:end], cfg.generation.group_size)
            gen_seconds += time.perf_counter() - t_gen
            own = own_rollouts.own_samples(parts, problems[start:end], prompt_ids[start:end], completions,
                                           self.step, window)
            if publishing:
                self._publish_fresh(problems[start:end], completions, own, window, started_at, pub)
            batches.append(own)
            start = end
        elapsed = parts.dht_time() - t_dht
        if n:
            self._pacing.remember(elapsed / n)
        if pub.stale:
            self._warn_stale(pub.stale, n, elapsed)
        if parts.exchange is not None:
            t_rep = time.perf_counter()
            self._republish_if_due(parts.exchange, window)
            pub.seconds += time.perf_counter() - t_rep
        return StepRollout(window, problems, own_rollouts.concat(batches), t0, gen_seconds, pub.seconds,
                           pub.bytes_per_token, pub.groups, pub.stale)

    def train_step(self, rollout: StepRollout, gathering: Gathering | None) -> dict[str, float]:
        """The second half of a step: wait for peers' groups (`start_gather`), train, log, checkpoint."""
        cfg, parts, own = self.cfg, self.parts, rollout.own
        t_gather = time.perf_counter()
        peer, step_drops = self._finish_gather(gathering, own, rollout.problems)
        gather_seconds = time.perf_counter() - t_gather
        samples = own.samples + peer.samples

        t_train = time.perf_counter()
        train_metrics = parts.trainer.step(samples)
        step_drops.update(peer_rollouts.remember_poisoned(parts, parts.trainer.poisoned))
        keeper_metrics: dict[str, float] = {}
        if parts.prompt_keeper is not None:  # raises here if the keeper's thread failed
            keeper_metrics = parts.prompt_keeper.step_metrics()
            step_drops.update(parts.prompt_keeper.take_drops())
        if parts.ledger is not None:
            parts.ledger.record_samples(parts.trainer.peer_sample_stats)
        self._drops.update(step_drops)
        train_seconds = time.perf_counter() - t_train
        parts.generator.sync_weights(parts.policy.model)
        self.step += 1

        now = parts.dht_time()
        given = parts.ledger.given_metrics() if parts.ledger is not None else {}  # receipts naming this node
        metrics = m.merge(train_metrics, self._node_metrics(rollout, peer, train_seconds, now), peer.spot_metrics,
                          keeper_metrics, given,
                          self.health.step_metrics(step_drops, publish_seconds=rollout.publish_seconds,
                                                   gather_seconds=gather_seconds, peer_groups=peer.groups))
        metrics = m.merge(metrics, self._heldout_metrics())
        self.history.append(metrics)
        for sink in parts.sinks:
            sink(metrics)
        if self.step % cfg.checkpoint.every_steps == 0:
            self.checkpoint()
        elif self.step % cfg.metrics.ledger_every_steps == 0:
            self.save_ledger()
        log.info("step %d reward %.3f acc %.3f own %d peer %d loss %.4f (%.1fs)", self.step,
                 own.reward_mean, own.accuracy, len(own.samples), len(peer.samples),
                 metrics.get(m.LOSS, 0.0), metrics[m.STEP_SECONDS])
        return metrics

    def _node_metrics(self, rollout: StepRollout, peer: peer_rollouts.PeerBatch, train_seconds: float,
                      now: float) -> dict[str, float]:
        """What the loop itself measures of a step (the trainer reports the batch it trained on:
        own_samples, peer_samples, reward_mean, ...; the gather its spot-checks; health the network)."""
        own, gen_seconds = rollout.own, rollout.gen_seconds
        n_tokens = sum(len(s.completion_ids) for s in own.samples)
        return {
            m.STEP: float(self.step),
            m.TIME: now,
            m.ACCURACY: own.accuracy,
            m.MIXED_GROUPS: own.mixed_fraction,
            m.PEER_GROUPS: float(peer.groups),
            m.TOKENS_PER_S: n_tokens / gen_seconds if gen_seconds > 0 else 0.0,
            m.GEN_SECONDS: gen_seconds,
            m.TRAIN_SECONDS: train_seconds,
            m.STEP_SECONDS: time.perf_counter() - rollout.started,
            m.BYTES_PER_TOKEN: float(rollout.bytes_per_token or 0.0),
            m.TEXT_GROUPS: float(own.text_groups),
            m.TEXT_WITHHELD: float(own.text_withheld),
            m.OWN_GROUPS_PUBLISHED: float(rollout.published),
            m.OWN_GROUPS_UNPUBLISHED_STALE: float(rollout.unpublished_stale),
            m.PEER_REWARD_SECONDS: peer.verify_seconds,
            **({m.PEER_NEWEST_AGE_S: now - peer.newest_created_at} if peer.newest_created_at is not None else {}),
        }

    def _republish_if_due(self, exchange: PeerExchange, window: int) -> None:
        """Records expire after record_ttl_s: re-store the ones peers may still fetch."""
        if time.monotonic() - self._last_republish >= self.cfg.swarm.record_ttl_s / 3:
            exchange.republish(window, self.cfg.swarm.staleness_steps)
            self._last_republish = time.monotonic()

    def _choose_problems(self, window: int, slot: int) -> list[Problem]:
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

    def _publish_fresh(self, problems: list[Problem], completions: list, own: own_rollouts.OwnBatch, window: int,
                       started_at: float, pub: own_rollouts.Published) -> None:
        """Publish a sub-batch's groups, just complete, if peers still read them (else count them stale)."""
        exchange = self.parts.exchange
        assert exchange is not None
        if not self._publishable(window):
            pub.stale += len(problems)
            return
        t_pub = time.perf_counter()
        groups = own_rollouts.to_wire_groups(self.parts, problems, completions, own, self.step, started_at)
        tokens = sum(g.num_tokens for g in groups)
        pub.bytes += exchange.publish_groups(groups, window) * tokens
        pub.tokens += tokens
        pub.groups += len(groups)
        pub.seconds += time.perf_counter() - t_pub

    def _publishable(self, window: int) -> bool:
        """Whether own groups of `window` complete now go out: a slot peers accept (< swarm.slots_per_window),
        and not already older than peers read (a step that outlasted the freshness bound, or a pause)."""
        sw = self.cfg.swarm
        if self._slots.slot >= sw.slots_per_window:
            return False
        return peer_rollouts.window_of(self.parts.dht_time(), sw.window_seconds) - window <= sw.staleness_steps

    def _warn_stale(self, stale: int, n: int, elapsed: float) -> None:
        """Say, at most every STALE_WARNING_EVERY_S, that own groups went stale unpublished and what to change."""
        now = time.monotonic()
        if self._stale_warned_at is None or now - self._stale_warned_at >= STALE_WARNING_EVERY_S:
            self._stale_warned_at = now
            log.warning("%s", own_rollouts.stale_advice(self.cfg.swarm, stale, n, elapsed))

    def start_gather(self, window: int) -> Gathering | None:
        """Fetch peers' groups of `window` (and the staleness windows before it) in the background."""
        cfg, exchange = self.cfg, self.parts.exchange
        if exchange is None or cfg.swarm.max_peer_groups_per_step == 0 or cfg.swarm.max_peer_fraction == 0:
            return None
        own_groups = min(cfg.train.prompts_per_step, len(self.parts.prompt_set))
        self._generated = threading.Event()  # set by _finish_gather: no more gathers after this one
        return self._pool.submit(peer_rollouts.gather_while_generating, self.parts, window, own_groups,
                                 self._rng.getrandbits(64), self.step, self._generated)

    def _finish_gather(self, gathering: Gathering | None, own: own_rollouts.OwnBatch,
                       problems: list) -> tuple[peer_rollouts.PeerBatch, Counter[str]]:
        if gathering is None:
            return peer_rollouts.PeerBatch(), Counter()
        self._generated.set()
        wait = self.cfg.swarm.fetch_timeout_s + self.cfg.task.peer_reward_budget_s + 5.0
        try:
            return gathering.result(timeout=wait)
        except FutureTimeout:
            gathering.cancel()
            return peer_rollouts.PeerBatch(), Counter({"gather_timeout": 1})
