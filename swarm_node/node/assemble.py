"""Build a node's parts from its config and run it under supervision.

This is the one place that knows every concrete implementation (hivemind transport, HF/vLLM
generators, task loaders, metric sinks); the loop (`loop.py`) sees only `NodeParts` (`parts.py`).
The commands that are not a node (`eval`, `seed`, `end-prompt-set`) live in `swarm_node/ops/`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from swarm_node.util.atomic import atomic_write_text
from swarm_node.config import NodeConfig, SwarmConfig
from swarm_node.node.loop import Node
from swarm_node.node.parts import CheckpointExtra, NodeParts

log = logging.getLogger(__name__)


def start_transport(swarm: SwarmConfig, node_dir: Path) -> Any:
    """Start this node's DHT process with the identity kept in `node_dir` (created on first use)."""
    from swarm_node.util.lifecycle import start_torch_shm_manager
    from swarm_node.swarm.dht import HivemindTransport
    from swarm_node.swarm.identity import load_node_identity

    start_torch_shm_manager()  # before hivemind's first shared tensor: see its docstring
    return HivemindTransport.from_config(swarm, load_node_identity(node_dir))


def build_parts(cfg: NodeConfig, transport: Any | None = None, prompt_set: Any | None = None) -> tuple[NodeParts, int]:
    """Load everything the node needs; returns the parts and the step to start from. On failure
    (or a signal) whatever was started is closed again. `prompt_set`: already loaded (preflight)."""
    close_hooks: list = []
    try:
        return _build_parts(cfg, transport, prompt_set, close_hooks)
    except BaseException:
        for hook in reversed(close_hooks):
            try:
                hook()
            except Exception:  # noqa: BLE001  (the original error is the one to report)
                log.debug("close hook failed after a failed start", exc_info=True)
        raise


def _build_parts(cfg: NodeConfig, transport: Any | None, prompt_set: Any | None,
                 close_hooks: list) -> tuple[NodeParts, int]:
    from swarm_node.observe.metrics import JsonlMetricsWriter, supersede_after
    from swarm_node.policy.checkpoint import load_latest_checkpoint, save_checkpoint
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.trainer import Trainer
    from swarm_node.policy.vllm_engine import node_demand
    from swarm_node.observe.prometheus import PrometheusExporter
    from swarm_node.tasks import load_prompt_set, make_reward_fn
    from swarm_node.tasks.prompt_lengths import check_prompt_lengths

    node_dir = Path(cfg.node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    if cfg.swarm.prompt_set_id is None and prompt_set is None:
        prompt_set = load_prompt_set(cfg.task)  # before the model: a bad data file costs nothing

    if cfg.swarm.enabled and transport is None:
        peers = cfg.swarm.initial_peers
        log.info("starting the DHT%s (up to %.0fs x %d attempts)", f" and joining via {', '.join(peers)}" if peers
                 else " (no --initial-peer: this node starts a new swarm)", cfg.swarm.startup_timeout_s,
                 cfg.swarm.start_attempts)
        transport = start_transport(cfg.swarm, node_dir)
        close_hooks.append(transport.shutdown)
    if transport is not None and cfg.swarm.initial_peers:  # before the model loads: a wrong clock costs seconds
        from swarm_node.swarm.clock_probe import check_join_clock

        s = cfg.swarm
        check_join_clock(transport, s.swarm_id, s.initial_peers, s.window_seconds, s.staleness_steps,
                         timeout=min(10.0, s.fetch_timeout_s))
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    trainer = Trainer(policy, cfg.train, cfg.objective, temperature=cfg.generation.temperature)
    restored = load_latest_checkpoint(node_dir, trainer)
    start_step = restored[0] if restored else 0
    if restored and cfg.metrics.jsonl:
        moved = supersede_after(node_dir / "metrics.jsonl", start_step)
        if moved:
            log.info("resumed at step %d: %d metrics rows of later steps moved to metrics.superseded.jsonl",
                     start_step, moved)
    keeper = None
    if cfg.swarm.prompt_set_id is not None:
        if transport is None:
            raise ValueError("swarm.prompt_set_id needs the swarm (swarm.enabled=true)")
        prompt_set, cfg = load_seeded_set(cfg, transport)
        keeper = start_prompt_keeper(cfg.swarm, transport)
        if keeper is not None:
            close_hooks.append(keeper.stop)
    longest = check_prompt_lengths(policy.tokenizer, prompt_set.problems, prompt_set.id,
                                   cfg.generation.max_prompt_tokens, cfg.task.system_prompt, cfg.task.worked_example)
    log.info("prompts of %s: at most %d tokens (generation.max_prompt_tokens=%d)", prompt_set.id, longest,
             cfg.generation.max_prompt_tokens)
    generator = make_generator(policy, cfg.generation, seed=cfg.train.seed + start_step, demand=node_demand(cfg))
    close_hooks.append(generator.close)
    if start_step:
        generator.sync_weights(policy.model)
    reward_fn = make_reward_fn(cfg.task, prompt_set.answer_kind)
    close_hooks.append(reward_fn.close)  # its time-bounded worker process

    sinks: list = []
    if cfg.metrics.jsonl:
        writer = JsonlMetricsWriter(node_dir / "metrics.jsonl")
        sinks.append(writer.write)
        close_hooks.append(writer.close)
    if cfg.metrics.prometheus_addr:
        exporter = PrometheusExporter(cfg.metrics.prometheus_addr)
        try:
            exporter.start()
        except OSError as e:  # taken between the preflight check and now
            from swarm_node.util.errors import InputError

            raise InputError(f"cannot serve metrics on {cfg.metrics.prometheus_addr} (metrics.prometheus_addr): "
                             f"{e.strerror or e}", "stop the process using that port or choose another") from e
        sinks.append(exporter.update)
        close_hooks.append(exporter.stop)

    exchange = None
    ledger = None
    peer_id = "local"
    dht_time = None
    if transport is not None:
        from swarm_node.peers.ledger import FILE_NAME as LEDGER_FILE
        from swarm_node.peers.ledger import PeerLedger
        from swarm_node.swarm.exchange import RolloutExchange

        ledger = PeerLedger.open(node_dir / LEDGER_FILE, cfg.metrics.ledger_max_peers, own_tokenizer=policy.fingerprint,
                                 own_peer=transport.peer_id, receipts_span_s=cfg.metrics.receipts_span_s)

        min_g, max_g = peer_group_bounds(cfg)
        exchange = RolloutExchange(transport, cfg.swarm.swarm_id, vocab_size=len(policy.tokenizer),
                                   max_new_tokens=cfg.generation.max_new_tokens,
                                   min_group_size=min_g, max_group_size=max_g,
                                   record_ttl_s=cfg.swarm.record_ttl_s,
                                   window_seconds=cfg.swarm.window_seconds,
                                   tokenizer_fingerprint=policy.fingerprint,
                                   cross_tokenizer=cfg.swarm.cross_tokenizer,
                                   index_peers_per_shard=cfg.swarm.index_peers_per_shard,
                                   index_shards_per_read=cfg.swarm.index_shards_per_read,
                                   temperature_range=(cfg.swarm.min_peer_temperature, cfg.swarm.max_peer_temperature),
                                   max_bytes_per_peer=cfg.swarm.max_fetch_bytes_per_peer,
                                   admission=build_admission(cfg, prompt_set, ledger.reputation), ledger=ledger)
        peer_id = transport.peer_id
        dht_time = transport.dht_time
        status_sink = StatusSink(exchange, transport, cfg, policy, ledger)
        sinks.append(status_sink)
        close_hooks.append(status_sink.flush)  # runs before the transport's shutdown (hooks run in reverse)
        if cfg.metrics.prometheus_addr:
            sinks.append(lambda _metrics: exporter.update_peers(ledger.rows(), cfg.metrics.prometheus_top_peers))

    def save(extra: CheckpointExtra) -> None:
        save_checkpoint(node_dir, trainer, cfg, dict(extra))

    from swarm_node.peers.rejects import FILE_NAME, RejectList

    parts = NodeParts(config=cfg, policy=policy, generator=generator, trainer=trainer,
                      prompt_set=prompt_set, reward_fn=reward_fn, peer_id=peer_id, exchange=exchange,
                      sinks=sinks, save_checkpoint=save, close_hooks=close_hooks,
                      rejects=RejectList(node_dir / FILE_NAME), prompt_keeper=keeper,
                      ledger=ledger)
    if exchange is not None:
        from swarm_node.peers.spotcheck import build_spot_checker

        parts.spot_checker = build_spot_checker(cfg, policy, render_with(cfg))
    if dht_time is not None:
        parts.dht_time = dht_time
    if keeper is not None and keeper.follow:
        from swarm_node.node.prompt_switch import switch_prompt_set

        keeper.on_successor = lambda followed: switch_prompt_set(parts, followed,
                                                                 prompt_assignment(cfg, followed.prompt_set))
    if cfg.eval.problems:
        from swarm_node.evaluation.heldout import HeldoutEvaluator

        evaluator = HeldoutEvaluator(cfg, policy, generator, prompt_set)
        close_hooks.append(evaluator.close)
        parts.evaluate = evaluator
    # Written once the node has started, so a failed start leaves the previous one in place.
    atomic_write_text(node_dir / "config.resolved.toml", cfg.dump_toml())
    return parts, start_step


def render_with(cfg: NodeConfig) -> Any:
    """(tokenizer, problem) -> prompt ids under this node's task template, thread-safe: how a logprob
    spot-check (swarm_node/peers/spotcheck.py) renders a prompt with a reference model's tokenizer."""
    from swarm_node.node.peer_rollouts import TOKENIZER_LOCK
    from swarm_node.tasks import render_prompt

    def render(tokenizer: Any, problem: Any) -> list[int]:
        with TOKENIZER_LOCK:
            return render_prompt(tokenizer, problem.question, cfg.task.system_prompt, cfg.task.worked_example)

    return render


def load_seeded_set(cfg: NodeConfig, transport: Any) -> tuple[Any, NodeConfig]:
    """The seeded prompt set `swarm.prompt_set_id` names, or, when its operator ended it, the successor
    its tombstone names (with `swarm.prompt_set_owner` set: swarm/prompts.py, `load_followed`); and
    the config with the id of the set loaded (so config.resolved.toml and checkpoints name it)."""
    from swarm_node.swarm.prompts import load_followed

    s = cfg.swarm
    followed = load_followed(transport, s.swarm_id, s.prompt_set_id, s.prompt_set_owner, timeout=s.fetch_timeout_s)
    if not followed.ended:
        return followed.prompt_set, cfg
    log.info("%s", followed.message())
    swarm = s.model_copy(update={"prompt_set_id": followed.prompt_set.id})
    return followed.prompt_set, cfg.model_copy(update={"swarm": swarm})


def start_prompt_keeper(swarm: SwarmConfig, transport: Any) -> Any | None:
    """The thread that keeps the node's seeded prompt set alive and, with the operator key set, follows
    its successor when the operator ends it (None when there is nothing to do: budget 0, no key)."""
    from swarm_node.swarm.prompt_keeper import PromptSetKeeper

    follow = swarm.prompt_set_owner is not None
    if swarm.prompt_set_id is None or (swarm.prompt_set_restore_budget_bytes == 0 and not follow):
        return None
    # Following nodes look for the end every window, so they switch within about one window of each
    # other: until a node switches, it blames a switched peer's entries as `wrong_prompt` (prompt_switch.py).
    keeper = PromptSetKeeper(transport, swarm.swarm_id, swarm.prompt_set_id, swarm.prompt_set_owner,
                             ttl_s=swarm.record_ttl_s, budget_bytes=swarm.prompt_set_restore_budget_bytes,
                             timeout=swarm.fetch_timeout_s, follow=follow,
                             watch_interval_s=min(swarm.record_ttl_s / 3.0, swarm.window_seconds))
    keeper.start()
    return keeper


def peer_group_bounds(cfg: NodeConfig) -> tuple[int, int]:
    """(smallest, largest) peer group size taken: the local G unless configured."""
    g = cfg.generation.group_size
    return cfg.swarm.min_peer_group_size or g, cfg.swarm.max_peer_group_size or g


def build_admission(cfg: NodeConfig, prompt_set: Any, reputation: Any | None = None) -> Any:
    """The node's admission rules (swarm/admission.py) from its config and prompt set; `reputation`:
    the peer ledger's, so trust survives a restart (a fresh one if None)."""
    from swarm_node.swarm.admission import Admission
    from swarm_node.swarm.allowlist import load_allow_list

    s = cfg.swarm
    allowed = list(s.allowed_peers)
    if s.allowed_peers_file is not None:
        allowed += load_allow_list(s.allowed_peers_file, s.swarm_id, s.prompt_set_owner)
    tokens = s.max_peer_tokens_per_step or (
        s.max_peer_groups_per_step * peer_group_bounds(cfg)[1] * cfg.generation.max_new_tokens)
    return Admission(allowed_peers=allowed or None, prompts=prompt_assignment(cfg, prompt_set),
                     max_tokens_per_gather=tokens, reputation=reputation)


def prompt_assignment(cfg: NodeConfig, prompt_set: Any) -> Any:
    """The prompt binding over `prompt_set` (swarm/binding.py) with the node's swarm-wide settings."""
    from swarm_node.swarm.admission import PromptAssignment

    s = cfg.swarm
    return PromptAssignment(prompt_set_id=prompt_set.id, set_size=len(prompt_set),
                            prompts_per_step=s.peer_prompts_per_step or cfg.train.prompts_per_step,
                            salt=s.swarm_id, horizontal=s.collaboration == "horizontal",
                            window_seconds=s.window_seconds, slots_per_window=s.slots_per_window)


class StatusSink:
    """Publishes the node's status record from a step's metrics: at most every
    `metrics.status_every_steps` steps and `metrics.status_min_interval_s` seconds (a failed store
    is tried again at the next step). `flush` (a close hook) publishes the last step's metrics when
    they were held back, so the record a stopped node leaves says what it did to the end."""

    def __init__(self, exchange: Any, transport: Any, cfg: NodeConfig, policy: Any, ledger: Any,
                 clock: Any = time.monotonic) -> None:
        self.exchange, self.transport, self.cfg, self.policy, self.ledger = exchange, transport, cfg, policy, ledger
        self.clock = clock
        self.last = -math.inf  # clock time of the last record published
        self.pending: dict[str, float] | None = None  # the newest metrics not published

    def __call__(self, metrics: dict[str, float]) -> None:
        m = self.cfg.metrics
        step = int(metrics.get("step", 0))
        if step % m.status_every_steps or self.clock() - self.last < m.status_min_interval_s:
            self.pending = metrics
            return
        self.publish(metrics)

    def flush(self) -> None:
        if self.pending is None:
            return
        try:
            self.publish(self.pending)
        except Exception as e:  # the last record is best effort: shutting down goes on
            log.warning("could not publish the last status record: %s", e)

    def publish(self, metrics: dict[str, float]) -> bool:
        from protocol.messages import NodeStatus

        span, receipts = self.ledger.receipts(self.cfg.metrics.receipts_max_senders)  # each sender's groups
        t = self.transport
        ok = self.exchange.publish_status(NodeStatus(
            peer_id=t.peer_id, role="trainer", model_id=self.policy.model_id, step=int(metrics.get("step", 0)),
            timestamp=t.dht_time(), maddrs=tuple(usable_maddrs(t)), metrics=status_metrics(metrics),
            tokenizer_fingerprint=self.policy.fingerprint, receipts_span_s=span, receipts=receipts))
        if ok:
            self.last, self.pending = self.clock(), None
        else:
            self.pending = metrics
        return ok


def usable_maddrs(transport: Any) -> list[str]:
    """Addresses others can join through (HivemindTransport.usable_maddrs; fakes list theirs as is)."""
    if hasattr(transport, "usable_maddrs"):
        return list(transport.usable_maddrs)
    return list(transport.visible_maddrs)


def status_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The part of a step's metrics a status record carries: finite values under short keys, bounded
    in number (peers drop a status record that breaks protocol.validate's limits)."""
    from protocol.validate import ValidationLimits

    limits = ValidationLimits(vocab_size=1)
    kept = {k: float(v) for k, v in sorted(metrics.items())
            if math.isfinite(v) and len(k) <= limits.max_metric_key_len}
    return dict(list(kept.items())[: limits.max_metrics])


def run_node(cfg: NodeConfig) -> None:
    """Run a node until its step budget or SIGINT/SIGTERM; always checkpoints and leaves cleanly.

    Before anything heavy: the config's paths, addresses, data and checkpoints are checked
    (`preflight`) and the node directory is locked against a second process."""
    from swarm_node.util import lifecycle
    from swarm_node.node import preflight

    prompt_set = preflight.check_node(cfg)
    preflight.fit_memory(cfg, prompt_set)  # before the model loads: micro-batch and checkpointing, or refuse
    lock = lifecycle.NodeDirLock(Path(cfg.node_dir)).acquire()
    try:
        parts, start_step = build_parts(cfg, prompt_set=prompt_set)
        node = Node(parts, start_step=start_step)
        if parts.exchange is not None:
            from swarm_node.swarm.addresses import join_hint

            transport = parts.exchange.transport
            maddrs = usable_maddrs(transport)
            print("swarm-node: peer id", parts.peer_id, flush=True)
            for m in maddrs:
                print("swarm-node: join through", m, flush=True)
            hint = join_hint(maddrs, client_mode=getattr(transport, "client_mode", False))
            if hint:
                print("swarm-node:", hint, flush=True)
        if start_step:
            log.info("resumed from checkpoint at step %d", start_step)

        def on_signal(signum: int) -> None:
            if node.stopping:
                log.info("signal %d: already stopping; the current step ends, then checkpoint", signum)
                return
            log.info("signal %d: finishing the current step, then checkpoint and leave", signum)
            node.stop()

        lifecycle.on_stop(on_signal)
        if lifecycle.received_signal() is not None:  # arrived during startup and was swallowed
            node.stop()
        node.run()
    finally:
        lifecycle.on_stop(None)
        lock.release()
