"""Slow nodes (docs/architecture.md, "Slow nodes"): a node whose step outlasts the freshness bound
(swarm.staleness_steps x swarm.window_seconds) generates its step's prompts in sub-batches and
publishes each as soon as it is complete while peers still read it; a group complete too late is
counted, not published, and the log says what to change; a step that fits is one generate call."""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import pytest

from protocol import keys
from swarm_node import metric_names as m
from swarm_node.config import NodeConfig
from swarm_node.node.assemble import build_parts
from swarm_node.node.loop import Node
from swarm_node.node.own_rollouts import sub_batch_size
from swarm_node.node.peer_rollouts import render_prompts
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from tests.fakes import Clock, hash_reward

SWARM = "slow-swarm"
WS = 30.0  # swarm.window_seconds; with swarm.staleness_steps = 4, groups are read for B = 120 s
BOUND = 4 * WS
T0 = 3_000_000.0  # the start of window 100000
G = 2


def _node(tmp_path, swarm: MemorySwarm, name: str, window_s: float = WS, transport=None) -> Node:
    cfg = NodeConfig.load(None, [
        f'node_dir="{tmp_path / name}"', 'model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp_path / "cache"}"',
        'model.device="cpu"', f"generation.group_size={G}", "generation.max_new_tokens=6", "train.prompts_per_step=4",
        "train.micro_batch_size=8", "train.total_steps=1000", f'swarm.swarm_id="{SWARM}"', "checkpoint.every_steps=1000",
        "task.levels=[1]", "task.size=50", "swarm.max_peer_fraction=1.0", "swarm.max_peer_groups_per_step=64",
        "swarm.max_groups_per_peer=64", "swarm.fetch_timeout_s=2.0", "metrics.jsonl=false",
        f"swarm.window_seconds={window_s}", "swarm.staleness_steps=4"])
    parts, start = build_parts(cfg, transport=transport or MemoryTransport(swarm, peer_id=name))
    parts.reward_fn = hash_reward
    return Node(parts, start_step=start)


class Timed:
    """The node's generator, taking `seconds_per_group` of DHT time per prompt; records each call's
    prompts, each publish (DHT time, window, groups) and the own samples its trainer got."""

    def __init__(self, node: Node, clock: Clock, seconds_per_group: float) -> None:
        self.calls: list[list[list[int]]] = []
        self.published: list[tuple[float, int, list]] = []
        self.trained: list[list] = []
        self.after_publish = lambda: None
        generate, publish, train = node.parts.generator.generate, node.parts.exchange.publish_groups, node.parts.trainer.step

        def timed(prompt_ids, n):
            self.calls.append([list(p) for p in prompt_ids])
            out = generate(prompt_ids, n)
            clock.t += seconds_per_group * len(prompt_ids)
            return out

        def publish_groups(groups, window):
            self.published.append((clock.t, window, list(groups)))
            out = publish(groups, window)
            self.after_publish()
            return out

        def step(samples):
            self.trained.append([s for s in samples if not s.is_peer])
            return train(samples)

        node.parts.generator.generate, node.parts.exchange.publish_groups = timed, publish_groups
        node.parts.trainer.step = step


def _taken_by(receiver: Node) -> dict[str, set[str]]:
    """The peer groups (by group key) a receiver's trainer took, per sender."""
    taken: dict[str, set[str]] = defaultdict(set)
    train = receiver.parts.trainer.step

    def step(samples):
        for s in samples:
            if s.is_peer:
                taken[s.source].add(s.group_key)
        return train(samples)

    receiver.parts.trainer.step = step
    return taken


@pytest.mark.parametrize("n,per_group,expected", [
    (4, None, 4),     # nothing measured yet: one call
    (4, 0.0, 4),
    (4, 30.0, 4),     # 4 x 30 s = B: the whole step fits
    (4, 31.0, 1),     # it does not: sub-batches of at most B / 2 = 60 s
    (8, 20.0, 3),
    (8, 200.0, 1),    # not even one group fits: at least one prompt
])
def test_sub_batches_fit_half_the_bound_unless_the_whole_step_fits(n, per_group, expected):
    assert sub_batch_size(n, per_group, BOUND) == expected


def test_a_slow_node_publishes_each_sub_batch_while_fresh_and_peers_take_it(tmp_path):
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    slow, receiver = _node(tmp_path, swarm, "L"), _node(tmp_path, swarm, "R")
    timed = Timed(slow, clock, 50.0)  # 4 prompts take 200 s > B = 120 s; one takes 50 s
    taken = _taken_by(receiver)

    first = slow.run_step()  # nothing measured yet: one call, complete 200 s after the start
    assert [len(c) for c in timed.calls] == [4] and timed.published == []
    assert first[m.OWN_GROUPS_PUBLISHED] == 0 and first[m.OWN_GROUPS_UNPUBLISHED_STALE] == 4

    timed.calls.clear()
    receiver_steps: list[dict[str, float]] = []
    timed.after_publish = lambda: receiver_steps.append(receiver.run_step())  # a peer's step right then
    started_at = clock.t
    window = keys.window_of(started_at, WS)
    problems = slow._choose_problems(window, 0)
    second = slow.run_step()
    # Sub-batches of floor(60 / 50) = 1 prompt while one more can be complete in time (the groups of
    # this window are read until window + 5 begins, 129 s after the start), then the rest in one call.
    assert [len(c) for c in timed.calls] == [1, 1, 2]
    assert [ids for call in timed.calls for ids in call] == render_prompts(slow.parts, problems)  # the step's order
    assert second[m.OWN_GROUPS_PUBLISHED] == 2 and second[m.OWN_GROUPS_UNPUBLISHED_STALE] == 2
    assert [t - started_at for t, _, _ in timed.published] == [50.0, 100.0]
    for _, published_window, groups in timed.published:  # each as soon as complete, stamped with the step's start
        assert published_window == window and len(groups) == 1
        assert all(g.created_at == started_at and g.policy_version == 1 for g in groups)
    assert [g.prompt.index for _, _, gs in timed.published for g in gs] == [p.index for p in problems[:2]]

    # The peer took both, each in the step it ran when the group appeared, and dropped nothing.
    assert [s[m.PEER_GROUPS] for s in receiver_steps] == [1, 1]
    assert taken["L"] == {f"L:1:{p.index}" for p in problems[:2]}
    assert {k: v for k, v in receiver._drops.items() if v} == {}

    # The slow node trained on all four of its groups, in the order one call gives, and its step's
    # accuracy and mixed fraction are over all of them.
    own = timed.trained[-1]
    assert [tuple(s.prompt_ids) for s in own] == [tuple(p) for p in render_prompts(slow.parts, problems) for _ in range(G)]
    rewards = np.array([s.reward for s in own]).reshape(4, G)
    assert second[m.ACCURACY] == pytest.approx(float(np.mean(rewards >= 1.0)))
    assert second[m.MIXED_GROUPS] == pytest.approx(float(np.mean([len(set(r)) > 1 for r in rewards])))
    slow._shutdown()
    receiver._shutdown()


def test_a_node_whose_one_group_outlasts_the_bound_publishes_nothing_and_says_what_to_change(tmp_path, caplog):
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    slow, receiver = _node(tmp_path, swarm, "L"), _node(tmp_path, swarm, "R")
    timed = Timed(slow, clock, 150.0)  # one group takes 150 s > B = 120 s
    taken = _taken_by(receiver)
    with caplog.at_level(logging.WARNING, logger="swarm_node.node.loop"):
        steps = [slow.run_step(), slow.run_step()]
    # No group can be complete in time: each step is one call, counted, never published.
    assert [len(c) for c in timed.calls] == [4, 4] and timed.published == []
    assert [s[m.OWN_GROUPS_UNPUBLISHED_STALE] for s in steps] == [4, 4]
    assert [s[m.OWN_GROUPS_PUBLISHED] for s in steps] == [0, 0]
    assert all(s[m.OWN_SAMPLES] == 4 * G for s in steps)  # still trained on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "not published" in r.getMessage()]
    assert len(warnings) == 1, warnings  # at most one warning every STALE_WARNING_EVERY_S
    line = warnings[0]
    assert "one group takes about 150 s" in line and "at most 120 s" in line
    assert "generation.max_new_tokens" in line and "generation.group_size" in line
    assert "swarm.window_seconds" in line and "swarm.staleness_steps" in line
    receiver.run_step()
    assert taken["L"] == set()
    slow._shutdown()
    receiver._shutdown()


def test_a_fast_node_generates_all_its_prompts_in_one_call_per_step(tmp_path, caplog):
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    fast = _node(tmp_path, swarm, "F")
    timed = Timed(fast, clock, 25.0)  # a step of 4 prompts takes 100 s <= B = 120 s
    with caplog.at_level(logging.WARNING, logger="swarm_node.node.loop"):
        for _ in range(3):
            window = keys.window_of(clock.t, WS)
            problems = fast._choose_problems(window, 0)
            metrics = fast.run_step()
            assert timed.calls[-1] == render_prompts(fast.parts, problems)  # all the step's prompts
            assert metrics[m.OWN_GROUPS_PUBLISHED] == 4 and metrics[m.OWN_GROUPS_UNPUBLISHED_STALE] == 0
    assert len(timed.calls) == 3 and [len(gs) for _, _, gs in timed.published] == [4, 4, 4]
    assert "not published" not in caplog.text
    fast._shutdown()


class _TimingOut(MemoryTransport):
    """Index reads that time out on every key for the first `misses` reads (a loaded swarm)."""

    def __init__(self, swarm: MemorySwarm, peer_id: str, misses: int) -> None:
        super().__init__(swarm, peer_id)
        self.misses, self.reads = misses, 0

    def get_all_many_late(self, keys_, timeout):
        self.reads += 1
        if self.reads <= self.misses:
            return {k: {} for k in keys_}, set(keys_)
        return super().get_all_many_late(keys_, timeout)


def test_a_long_step_gathers_again_while_it_generates(tmp_path):
    """Found by the soak: nodes with 3-6 minute steps gathered once a step, and on a loaded swarm
    that one gather's index reads all timed out in most steps, so they took no peer group. A gather
    that took nothing is tried again every half window while the step still generates."""
    import time as wall

    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    window_s = 0.4  # half a window: 0.2 s of real time between gathers
    sender = _node(tmp_path, swarm, "S", window_s)
    sender.run_step()  # its groups are in the index
    slow = _node(tmp_path, swarm, "L", window_s, transport=_TimingOut(swarm, "L", misses=4))
    generate = slow.parts.generator.generate

    def long_generation(prompt_ids, n):  # about 2 s of real time: room for several gathers
        wall.sleep(2.0)
        return generate(prompt_ids, n)

    slow.parts.generator.generate = long_generation
    metrics = slow.run_step()
    assert slow.parts.exchange.transport.reads >= 3  # gathered again after reads timed out
    assert metrics[m.PEER_GROUPS] > 0


def test_a_gather_that_took_groups_is_not_repeated(tmp_path):
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    sender = _node(tmp_path, swarm, "S", 0.4)
    sender.run_step()
    node = _node(tmp_path, swarm, "N", 0.4, transport=_TimingOut(swarm, "N", misses=0))
    metrics = node.run_step()
    assert metrics[m.PEER_GROUPS] > 0 and node.parts.exchange.transport.reads == 1
