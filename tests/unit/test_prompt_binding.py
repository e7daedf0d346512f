"""The prompt binding (swarm/binding.py, issue 21): prompts tied to DHT time windows, not to any field a
sender chooses; honest nodes at very different step rates, slow and paused ones, still pass."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec, keys
from protocol.messages import IndexEntry, RolloutIndex, SamplingParams
from swarm_node.node.assemble import build_parts
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node
from swarm_node.swarm.admission import Admission
from swarm_node.swarm.binding import SLOT_OVERUSED, WRONG_PROMPT, PromptAssignment
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.synthetic import synthetic_group
from protocol.binding import select_prompts, window_prompts
from tests.fakes import Clock, hash_reward

WS = 30.0
T0 = 3_000_000.0  # the start of window 100000
SALT = "bind-swarm"


# ---- the rule -------------------------------------------------------------------------------------


def test_slots_partition_the_windows_sequence() -> None:
    n, slots = 4, 16
    whole = select_prompts("peer", 7, n * slots, 10_000, salt=SALT)
    assert [i for k in range(slots) for i in window_prompts("peer", 7, k, n, 10_000, salt=SALT)] == whole
    assert window_prompts("peer", 7, 0, n, 10_000, salt=SALT) == select_prompts("peer", 7, n, 10_000, salt=SALT)
    assert window_prompts("peer", 8, 0, n, 10_000, salt=SALT) != whole[:n]  # another window, other prompts
    with pytest.raises(ValueError):
        window_prompts("peer", 7, -1, n, 10)


def _synthetic(sender: str, index: int, *, t: float = T0, version: int = 0, seed: int = 0, temperature: float = 1.0,
               model_id: str = "synthetic/model"):
    g = synthetic_group(np.random.default_rng(seed), swarm_id=SALT, sender=sender, created_at=t, prompt_index=index,
                        policy_version=version, group_size=2, tokens=8)
    return dataclasses.replace(g, model_id=model_id,
                               sampling=SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=8))


def _assignment(set_size: int = 10_000, n: int = 4, slots: int = 16) -> PromptAssignment:
    return PromptAssignment(prompt_set_id="synthetic-0", set_size=set_size, prompts_per_step=n, salt=SALT,
                            window_seconds=WS, slots_per_window=slots)


@settings(max_examples=200, deadline=None)
@given(sender=st.text(min_size=1, max_size=12), window=st.integers(0, 10**8), index=st.integers(0, 99),
       offset=st.floats(0, WS, exclude_max=True), version=st.integers(0, 2**40), temperature=st.floats(0.25, 2.0),
       model_id=st.text(max_size=8), seed=st.integers(0, 1000))
def test_assignment_depends_on_sender_and_window_only(sender, window, index, offset, version, temperature,
                                                      model_id, seed) -> None:
    prompts = _assignment(set_size=100, n=2, slots=4)  # 8 of 100 prompts a window: both outcomes occur
    t = window * WS + offset
    if keys.window_of(t, WS) != window:
        return  # float rounding put t in the next window
    expected = None if index in select_prompts(sender, window, 8, 100, salt=SALT) else WRONG_PROMPT
    group = _synthetic(sender, index, t=t, version=version, seed=seed, temperature=temperature, model_id=model_id)
    assert Admission(prompts=prompts).group_reason(group, window) == expected
    assert Admission(prompts=prompts).entry_reason(sender, index, t) == expected


def test_ground_versions_buy_nothing() -> None:
    """The attack of issue 21: grind `policy_version` until the old rule (select_prompts(sender, version))
    assigns a chosen easy prompt. Under the window rule every such group is refused."""
    prompts = _assignment()  # the default set: 10,000 problems, 4 prompts a step
    window = keys.window_of(T0, WS)
    for k in range(5):
        sender = f"attacker-{k}"
        target = next(i for i in range(10_000) if not prompts.assigned(sender, i, T0))  # an "easy" prompt
        ground = []
        for v in range(20_000):
            if target in select_prompts(sender, v, 4, 10_000, salt=SALT):
                ground.append(v)  # a version under which the old rule assigned the target
                if len(ground) == 3:
                    break
        assert ground, "the old rule can be ground"
        adm = Admission(prompts=prompts)
        assert [adm.group_reason(_synthetic(sender, target, version=v, seed=v), window) for v in ground] \
            == [WRONG_PROMPT] * len(ground)


def test_a_sender_gets_n_times_s_groups_a_window() -> None:
    prompts = _assignment(set_size=50, n=2, slots=4)
    adm = Admission(prompts=prompts)
    mine = select_prompts("p", keys.window_of(T0, WS), 8, 50, salt=SALT)
    reasons = [adm.group_reason(_synthetic("p", i, t=T0 + k, version=k, seed=k), 0) for k, i in enumerate(mine)]
    assert reasons == [None] * 8
    again = [adm.group_reason(_synthetic("p", i, t=T0 + 20, version=100 + k, seed=100 + k), 0)
             for k, i in enumerate(mine)]
    assert again == [SLOT_OVERUSED] * 8


def test_a_small_set_repeats_prompts_as_often_as_assigned() -> None:
    prompts = _assignment(set_size=3, n=2, slots=4)  # 8 draws from 3 problems: whole permutations repeat
    seq = select_prompts("p", keys.window_of(T0, WS), 8, 3, salt=SALT)
    adm = Admission(prompts=prompts)
    taken = sum(adm.group_reason(_synthetic("p", i, version=k, seed=k), 0) is None
                for k, i in enumerate(seq + seq))
    assert taken == 8


# ---- the exchange's part: the window of created_at is the group's index window ---------------------


def _exchange(swarm: MemorySwarm, peer: str, prompts: PromptAssignment | None = None, **kw) -> RolloutExchange:
    admission = Admission(prompts=prompts) if prompts is not None else None
    return RolloutExchange(MemoryTransport(swarm, peer), SALT, vocab_size=49_152, max_new_tokens=256,
                           window_seconds=WS, admission=admission, **kw)


def _publish_raw(swarm: MemorySwarm, owner: str, group, *, window: int, entry_created_at: float | None = None) -> None:
    data = codec.encode(group)
    digest = codec.content_digest(data)
    swarm.write_raw_blob(digest, data, T0 + 300)
    entry = IndexEntry(chunk_digests=(digest,), size=len(data), prompt_index=group.prompt.index,
                       policy_version=group.policy_version,
                       created_at=group.created_at if entry_created_at is None else entry_created_at)
    index = RolloutIndex(sender=owner, window=window, entries=(entry,))
    swarm.write_raw_owned(keys.rollout_index_key(SALT, window), owner, codec.encode(index), T0 + 300)


def _gather(ex: RolloutExchange, t: float = T0) -> tuple[list, dict]:
    got, drops = ex.fetch_groups(keys.window_of(t, WS), 4, 64, 64, 5.0, random.Random(0))
    return got, drops.as_dict()


def test_entries_must_sit_in_the_index_of_their_window() -> None:
    swarm = MemorySwarm(clock=Clock(T0 + 40))
    w = keys.window_of(T0 + 40, WS)
    early = _synthetic("a", 0, t=T0)  # created in window w - 1, listed under window w
    _publish_raw(swarm, "a", early, window=w)
    claimed = _synthetic("b", 1, t=T0 + 35)  # the entry claims another time than the group carries
    _publish_raw(swarm, "b", claimed, window=w, entry_created_at=T0 + 36)
    got, drops = _gather(_exchange(swarm, "h"), T0 + 40)
    assert got == [] and drops == {"index_mismatch": 2}


def test_created_at_outside_the_tolerance_is_a_lie_not_stale() -> None:
    """A group older than the tolerance listed in a fresh index (its entry claiming a fresh time) is
    an `index_mismatch`, a fault: consistency is checked before age, so `stale`, an honest drop, is
    left to a consistent record that is merely late. One listed consistently, in its own old window,
    is never read: nothing fetched, nothing dropped."""
    swarm = MemorySwarm(clock=Clock(T0))
    w = keys.window_of(T0, WS)
    old = _synthetic("a", 0, t=T0 - 5 * WS)  # older than staleness (4 windows), listed in a fresh index
    _publish_raw(swarm, "a", old, window=w, entry_created_at=T0)
    late = _synthetic("b", 1, t=T0 - 5 * WS)
    _publish_raw(swarm, "b", late, window=w - 5)
    ex = _exchange(swarm, "h")
    got, drops = _gather(ex)
    assert got == [] and drops == {"index_mismatch": 1}
    assert ex.transport.traffic["blobs_fetched"] == 1  # a's chunk; b's is not read


def test_declared_temperature_outside_the_supported_range_is_dropped() -> None:
    swarm = MemorySwarm(clock=Clock(T0))
    w = keys.window_of(T0, WS)
    for k, temperature in enumerate((0.1, 1.0, 3.0)):
        _publish_raw(swarm, f"p{k}", _synthetic(f"p{k}", k, temperature=temperature), window=w)
    got, drops = _gather(_exchange(swarm, "h"))
    assert [g.sampling.temperature for g in got] == [1.0] and drops == {"unsupported_temperature": 2}
    got, drops = _gather(_exchange(swarm, "h2", temperature_range=(0.05, 4.0)))  # a node that supports them
    assert len(got) == 3 and drops == {}


# ---- honest nodes: different step rates, slow steps, pauses -----------------------------------------


def _node(tmp_path, swarm: MemorySwarm, name: str, extra: list[str] = ()) -> Node:
    cfg = NodeConfig.load(None, [
        f'node_dir="{tmp_path / name}"', 'model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp_path / "cache"}"',
        'model.device="cpu"', "generation.group_size=2", "generation.max_new_tokens=6", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "train.total_steps=1000", f'swarm.swarm_id="{SALT}"', "checkpoint.every_steps=1000",
        "task.levels=[1]", "task.size=50", "swarm.max_peer_fraction=1.0", "swarm.max_peer_groups_per_step=64",
        "swarm.max_groups_per_peer=64", "swarm.fetch_timeout_s=2.0", "metrics.jsonl=false", *extra])
    parts, start = build_parts(cfg, transport=MemoryTransport(swarm, peer_id=name))
    parts.reward_fn = hash_reward
    return Node(parts, start_step=start)


class Observed:
    """Which groups a node published (by group key) and which peer groups its trainer took."""

    def __init__(self, nodes: list[Node]) -> None:
        self.published: dict[str, set[str]] = defaultdict(set)
        self.taken: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for node in nodes:
            self._hook(node)

    def _hook(self, node: Node) -> None:
        name, exchange, trainer = node.parts.peer_id, node.parts.exchange, node.parts.trainer
        publish, step = exchange.publish_groups, trainer.step

        def publish_groups(groups, window):
            self.published[name] |= {f"{g.sender}:{g.policy_version}:{g.prompt.index}" for g in groups}
            return publish(groups, window)

        def train(samples):
            for s in samples:
                if s.is_peer:
                    self.taken[name][s.source].add(s.group_key)
            return step(samples)

        exchange.publish_groups, trainer.step = publish_groups, train


def _drops(*nodes: Node) -> dict[str, float]:
    return {k: v for n in nodes for k, v in n._drops.items() if v}


def test_nodes_at_1x_and_5x_step_rates_take_every_group_of_each_other(tmp_path) -> None:
    clock = Clock(T0)
    swarm = MemorySwarm(clock=clock)
    # S = 3: the fast node's 4th and 5th steps of each window train unpublished.
    extra = ["swarm.slots_per_window=3"]
    a, b, fast = (_node(tmp_path, swarm, name, extra) for name in ("A", "B", "F"))
    seen = Observed([a, b, fast])
    for w in range(3):
        for j in range(5):  # F steps every 6 s, A and B every 30 s
            clock.t = T0 + w * WS + j * 6 + 1
            fast.run_step()
            if j in (1, 3):
                (a if j == 1 else b).run_step()
    before_last = {k: set(v) for k, v in seen.published.items()}
    assert len(before_last["F"]) == 3 * 3 * 2 and len(before_last["A"]) == 3 * 2  # 3 slots x 3 windows x 2 prompts
    for k, node in enumerate((a, b, fast)):  # one more step each, in the next window: gathers the rest
        clock.t = T0 + 3 * WS + k + 1
        node.run_step()
    for receiver in ("A", "B", "F"):
        for sender in ("A", "B", "F"):
            if sender != receiver:
                assert seen.taken[receiver][sender] >= before_last[sender], (receiver, sender)
    assert _drops(a, b, fast) == {}


def _slow_generation(node: Node, clock: Clock, seconds: float) -> None:
    generate = node.parts.generator.generate

    def slow(prompt_ids, n):
        out = generate(prompt_ids, n)
        clock.t += seconds  # the step outlasts its window
        return out

    node.parts.generator.generate = slow


def test_a_step_spanning_windows_is_taken(tmp_path) -> None:
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    slow, receiver = _node(tmp_path, swarm, "L"), _node(tmp_path, swarm, "R")
    seen = Observed([slow, receiver])
    _slow_generation(slow, clock, 2.5 * WS)
    slow.run_step()               # starts in window 0, publishes in window 2, stamped with window 0
    receiver.run_step()
    slow.run_step()               # window 2 to 5
    receiver.run_step()
    assert len(seen.published["L"]) == 4 and seen.taken["R"]["L"] == seen.published["L"]
    assert seen.taken["L"]["R"]
    assert _drops(slow, receiver) == {}


def test_paused_nodes_pass_and_a_step_older_than_peers_read_is_not_published(tmp_path, caplog) -> None:
    clock = Clock(T0 + 1)
    swarm = MemorySwarm(clock=clock)
    paused, receiver = _node(tmp_path, swarm, "P"), _node(tmp_path, swarm, "R")
    seen = Observed([paused, receiver])
    paused.run_step()
    clock.t += 10 * WS            # paused between steps for 10 windows
    receiver.run_step()           # P's first groups are older than any window read: nothing counted
    paused.run_step()             # slot 0 of the window it resumed in
    receiver.run_step()
    assert len(seen.taken["R"]["P"]) == 2 and seen.taken["R"]["P"] < seen.published["P"]
    # Paused in the middle of a step (here for 5 windows): its groups would be stale, so not published.
    _slow_generation(paused, clock, 5 * WS)
    with caplog.at_level(logging.WARNING):
        paused.run_step()
    assert len(seen.published["P"]) == 4 and "not published" in caplog.text
    receiver.run_step()
    assert _drops(paused, receiver) == {}
