"""A running node follows its operator to the successor of its ended prompt set (node/prompt_switch.py):
real tiny models and trainer, the in-memory swarm on a hand-moved clock, the keeper driven by hand."""

from __future__ import annotations

import logging

import pytest

from swarm_node.config import TaskConfig
from swarm_node.node.loop import Node
from swarm_node.swarm.identity import load_or_create_key
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.prompts import FollowedSet, end_prompt_set, seed_prompt_set
from swarm_node.tasks import load_prompt_set
from swarm_node.tasks.base import Problem, PromptSet, content_id
from tests.fakes import Clock
from tests.unit.test_node_loop import SWARM, make_node

TTL = 30.0  # swarm.record_ttl_s: the keeper's watch reads come every TTL / 3


@pytest.fixture
def swarm_on_a_set(tmp_path):
    """(swarm, clock, operator, old set, its successor): both seeded; the successor's assignment of
    prompts differs from the old one's (another size), so a peer's old-set index entries mostly fail it."""
    clock = Clock()
    swarm = MemorySwarm(clock)
    operator = load_or_create_key(tmp_path / "operator.key")
    old = load_prompt_set(TaskConfig(name="arithmetic", size=50))
    new = load_prompt_set(TaskConfig(name="arithmetic", size=1000, seed=1))
    for ps in (old, new):
        seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "arith", operator, ttl_s=20 * TTL)
    return swarm, clock, operator, old, new


def _node(tmp_path, swarm, name: str, prompt_set_id: str, owner: bytes | None) -> Node:
    extra = [f'swarm.prompt_set_id="{prompt_set_id}"', f"swarm.record_ttl_s={TTL}", "swarm.staleness_steps=4"]
    if owner is not None:
        extra.append(f'swarm.prompt_set_owner="{owner.decode()}"')
    node = make_node(tmp_path, swarm, name, extra=extra)
    if node.parts.prompt_keeper is not None:
        node.parts.prompt_keeper.stop()  # driven by hand below, on the test's clock
    return node


def test_a_running_node_switches_to_the_successor_between_two_steps(tmp_path, swarm_on_a_set, caplog) -> None:
    swarm, clock, operator, old, new = swarm_on_a_set
    node = _node(tmp_path, swarm, "N", old.id, operator.public_key)
    peer = _node(tmp_path, swarm, "P", old.id, None)  # without the operator key: it stays on the ended set
    keeper = node.parts.prompt_keeper
    assert keeper is not None and keeper.follow and keeper.on_successor is not None
    keeper.tick()  # first sight
    published: list = []
    publish = node.parts.exchange.publish_groups
    node.parts.exchange.publish_groups = lambda groups, window: published.extend(groups) or publish(groups, window)

    end_prompt_set(MemoryTransport(swarm, "op"), SWARM, old.id, operator, successor=new.id, ttl_s=3000)
    clock.t += keeper.watch_interval_s + 1  # the next watch read sees the end...
    keeper.tick()
    keeper.tick()  # ...and the next tick loads the successor, in the keeper's thread
    assert keeper.successor is not None and node.parts.prompt_set == old
    peer.run_step()
    with caplog.at_level(logging.INFO, logger="swarm_node.node.prompt_switch"):
        switching = node.run_step()  # this step is still the old set's; the switch comes after it
    assert switching["prompt_set_switches"] == 1 and switching["peer_groups"] >= 1
    assert published and {g.prompt.prompt_set_id for g in published} == {old.id}
    assert node.parts.prompt_set == new and keeper.prompt_set_id == new.id
    assert node.parts.admission.binding.assignment.prompt_set_id == new.id
    assert [r.getMessage() for r in caplog.records if r.name == "swarm_node.node.prompt_switch"] == [
        f"switched to prompt set {new.id} (1000 problems), the successor of {old.id}, which its operator ended"]

    published.clear()
    peer.run_step()  # the peer is still on the old set
    after = node.run_step()
    assert after["prompt_set_switches"] == 0
    # The next step's prompts are the successor's: every group published names it, on its problems.
    assert published and all(g.prompt.prompt_set_id == new.id for g in published)
    assert all(new.problems[g.prompt.index].sha256 == g.prompt.sha256 for g in published)
    # During the handover the peer's groups on the ended set are trained on (their problems are as good
    # as they were), with no fault of the peer.
    assert after["peer_groups"] >= 1 and "dropped_unknown_prompt" not in after
    assert "dropped_wrong_prompt" not in after
    assert node.parts.admission.reputation.faults.get("P", 0.0) == 0.0
    # Once every node had the time to see the end, an entry assigned on the ended set only is refused.
    clock.t += TTL + 1
    binding = node.parts.admission.binding
    entry = next(i for i in range(len(old)) if not new_assigned(binding, "P", i, clock.t))
    assert binding.entry_reason("P", entry, clock.t) == "wrong_prompt"
    peer.run_step()
    late = node.run_step()  # the peer never switched: after the handover nothing of it is taken
    assert late["peer_groups"] == 0 and late.get("dropped_wrong_prompt", 0) + late.get("dropped_unknown_prompt", 0) >= 1
    node._shutdown()
    peer._shutdown()


def new_assigned(binding, sender: str, index: int, created_at: float) -> bool:
    return binding.current.assignment.assigned(sender, index, created_at)


def test_a_successor_of_another_answer_kind_gets_its_reward_and_a_too_long_one_is_refused(
        tmp_path, swarm_on_a_set) -> None:
    from swarm_node.node.assemble import prompt_assignment
    from swarm_node.node.prompt_switch import switch_prompt_set
    from swarm_node.util.errors import InputError

    swarm, _, operator, old, _ = swarm_on_a_set
    node = _node(tmp_path, swarm, "N", old.id, operator.public_key)
    parts = node.parts
    problems = tuple(Problem(index=i, question=f"Simplify $\\frac{{{i}}}{{2}}$.", answer=f"\\frac{{{i}}}{{2}}")
                     for i in range(8))
    math = PromptSet(id=content_id("math500", problems), answer_kind="math", problems=problems)
    long = PromptSet(id="arithmetic-long", answer_kind="number",
                     problems=(Problem(index=0, question="What is 1 + 1? " * 2000, answer="2"),))
    with pytest.raises(InputError):
        switch_prompt_set(parts, FollowedSet(long, (old.id,)), prompt_assignment(parts.config, long))
    assert parts.prompt_set == old  # a refused successor changes nothing
    before = parts.reward_fn
    switch_prompt_set(parts, FollowedSet(math, (old.id,)), prompt_assignment(parts.config, math))
    assert parts.prompt_set == math and parts.reward_fn is not before
    assert parts.reward_fn.answer_kind == "math" and parts.reward_fn.close in parts.close_hooks
    node._shutdown()
