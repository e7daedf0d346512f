"""The whole node loop with real tiny models, the real trainer, and the in-memory transport."""

from __future__ import annotations


from pathlib import Path

import numpy as np
import pytest
import torch

from protocol import codec, keys
from protocol.messages import IndexEntry, RolloutIndex
from swarm_node import metric_names as m
from swarm_node.node.assemble import build_parts
from swarm_node.config import NodeConfig
from swarm_node.node.loop import Node
from tests.fakes import Clock, hash_reward
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

SWARM = "unit-swarm"




def make_node(tmp_path: Path, swarm: MemorySwarm | None, name: str, *, model: str = "tiny-random:64x1:a",
              extra: list[str] = (), peer_fraction: float = 0.5) -> Node:
    cfg = NodeConfig.load(None, [
        f'node_dir="{tmp_path / name}"', f'model.name="{model}"', f'model.cache_dir="{tmp_path / "cache"}"',
        "model.device=\"cpu\"", "generation.group_size=4", "generation.max_new_tokens=12",
        "train.prompts_per_step=2", "train.learning_rate=1e-2", "train.total_steps=3", "train.micro_batch_size=8",
        f'swarm.swarm_id="{SWARM}"', f"swarm.enabled={'true' if swarm else 'false'}",
        f"swarm.max_peer_fraction={peer_fraction if swarm else 0.0}", "swarm.max_peer_groups_per_step=4",
        "swarm.fetch_timeout_s=2.0", "checkpoint.every_steps=1", "task.levels=[1]", "task.size=50",
        *extra])
    transport = MemoryTransport(swarm, peer_id=name) if swarm is not None else None
    parts, start = build_parts(cfg, transport=transport)
    parts.reward_fn = hash_reward
    return Node(parts, start_step=start)


def params_of(node: Node) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in node.parts.policy.trainable_parameters()}


def test_two_nodes_train_on_each_others_groups(tmp_path):
    swarm = MemorySwarm()
    a, b = make_node(tmp_path, swarm, "A"), make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    before = params_of(b)
    a.run_step()  # A publishes first
    metrics_b = b.run_step()
    metrics_a = a.run_step()
    assert metrics_b["peer_groups"] >= 1 and metrics_b["peer_samples"] == 4 * metrics_b["peer_groups"]
    assert metrics_a["peer_groups"] >= 1
    # B took A's groups of the step just before: their age is that gap, never negative.
    assert 0.0 <= metrics_b["peer_newest_age_s"] < 60.0
    assert metrics_b["samples"] == metrics_b["own_samples"] + metrics_b["peer_samples"]
    # Every name a step writes is a documented constant (its one writer uses it: metric_names.merge).
    undocumented = [k for k in metrics_b if k not in m.METRICS
                    and not k.startswith((m.DROPPED_PREFIX, m.TOTAL_DROPPED_PREFIX))]
    assert not undocumented and metrics_b[m.REWARD_MEAN] == b.history[-1][m.REWARD_MEAN]
    after = params_of(b)
    assert any(not torch.equal(before[k], after[k]) for k in before), "parameters did not move"
    assert all(np.isfinite(v) for v in metrics_b.values())


def test_peer_groups_capped_by_share(tmp_path):
    swarm = MemorySwarm()
    a = make_node(tmp_path, swarm, "A")
    b = make_node(tmp_path, swarm, "B", peer_fraction=0.2)
    a.run_step()
    m = b.run_step()
    # 2 own groups at a 20% peer share allow 0 peer groups: nothing is fetched, so nothing is dropped either
    # (fetching groups only to drop them over the cap was work a flood of peers could inflate).
    assert m["peer_groups"] == 0 and m.get("dropped_over_peer_cap", 0) == 0
    c = make_node(tmp_path, swarm, "C", peer_fraction=0.34)  # 2 own groups: 1 peer group
    m = c.run_step()
    assert m["peer_groups"] == 1 and m.get("dropped_over_peer_cap", 0) == 0


def test_tokenizer_mismatch_is_dropped_with_reason(tmp_path):
    swarm = MemorySwarm()
    other = make_node(tmp_path, swarm, "B", model="tiny-random:64x1:b")
    a = make_node(tmp_path, swarm, "A")
    other.run_step()
    m = a.run_step()
    assert m["peer_groups"] == 0
    assert m["dropped_tokenizer_mismatch"] >= 1


def test_garbage_and_forged_records_are_counted_and_training_continues(tmp_path):
    swarm = MemorySwarm()
    a = make_node(tmp_path, swarm, "A")
    window = keys.window_of(swarm.clock(), a.cfg.swarm.window_seconds)
    index_key = keys.rollout_index_key(SWARM, window)
    exp = swarm.clock() + 60
    swarm.write_raw_owned(index_key, "evil", b"\x00not a message", exp)
    # An index pointing at a chunk that holds random bytes under the right digest.
    junk = b"SN" + bytes(range(200))
    digest = codec.content_digest(junk)
    swarm.write_raw_blob(digest, junk, exp)
    entry = IndexEntry(chunk_digests=(digest,), size=len(junk), prompt_index=0, policy_version=0,
                       created_at=swarm.clock())
    swarm.write_raw_owned(index_key, "evil2", codec.encode(RolloutIndex(sender="evil2", window=window,
                                                                       entries=(entry,))), exp)
    m = a.run_step()
    dropped = {k: v for k, v in m.items() if k.startswith("dropped_")}
    assert sum(dropped.values()) >= 2, dropped
    assert m["peer_samples"] == 0 and m["own_samples"] == 8 and np.isfinite(m["loss"])


def test_isolated_node_and_resume_from_checkpoint(tmp_path):
    node = make_node(tmp_path, None, "solo")
    node.run(max_steps=2)
    assert node.step == 2
    ckpts = sorted((tmp_path / "solo" / "checkpoints").glob("step-*"))
    assert ckpts, "no checkpoint written"
    weights = params_of(node)
    resumed = make_node(tmp_path, None, "solo")
    assert resumed.step == 2
    for k, v in params_of(resumed).items():
        assert torch.equal(v, weights[k])
    resumed.run(max_steps=1)
    assert resumed.step == 3


def test_node_evaluates_held_out_before_the_first_step_and_after_the_last(tmp_path):
    from swarm_node.evaluation.heldout import read_evals

    node = make_node(tmp_path, None, "evaluated", extra=["eval.problems=4", "eval.max_new_tokens=4"])
    node.run()
    rows = read_evals(tmp_path / "evaluated")
    assert [r["step"] for r in rows] == [0, 3]
    assert all(r["n"] == 4 and 0.0 <= r["accuracy"] <= 1.0 for r in rows)
    assert rows[0]["heldout"] == rows[1]["heldout"]
    assert all(0.0 <= m["mixed_groups"] <= 1.0 for m in node.history)
    resumed = make_node(tmp_path, None, "evaluated", extra=["eval.problems=4", "eval.max_new_tokens=4"])
    resumed.run()  # nothing left to train: no new step, no new "before" row
    assert [r["step"] for r in read_evals(tmp_path / "evaluated")] == [0, 3]


def test_stop_before_run_takes_no_step(tmp_path):
    node = make_node(tmp_path, None, "stopper")
    node.stop()
    node.run()
    assert node.step == 0 and node.history == []


def test_horizontal_mode_shares_prompts_and_groups(tmp_path):
    swarm = MemorySwarm(clock=Clock())  # both steps in one window, however slow the machine
    extra = ['swarm.collaboration="horizontal"']
    a, b = make_node(tmp_path, swarm, "A", extra=extra), make_node(tmp_path, swarm, "B", extra=extra)
    window = keys.window_of(swarm.clock(), a.cfg.swarm.window_seconds)
    assert [p.index for p in a._choose_problems(window, 0)] == [p.index for p in b._choose_problems(window, 0)]
    seen: list = []
    original = b.parts.trainer.step
    b.parts.trainer.step = lambda samples: (seen.extend(samples), original(samples))[1]
    a.run_step()
    m = b.run_step()
    assert m["peer_groups"] >= 1
    own_keys = {s.group_key for s in seen if not s.is_peer}
    peer_keys = {s.group_key for s in seen if s.is_peer}
    assert peer_keys and peer_keys <= own_keys  # one advantage group per prompt, over both nodes


@pytest.mark.parametrize("fraction,own,cap,expected", [(0.5, 4, 8, 4), (0.2, 4, 8, 1), (1.0, 4, 3, 3), (0.0, 4, 8, 0)])
def test_peer_group_cap(fraction, own, cap, expected):
    from swarm_node.node.peer_rollouts import peer_group_cap

    assert peer_group_cap(own, fraction, cap) == expected


def test_a_node_on_a_seeded_set_re_stores_it_and_reports_it_in_its_metrics(tmp_path):
    from swarm_node.config import TaskConfig
    from swarm_node.swarm.identity import load_or_create_key
    from swarm_node.swarm.prompts import end_prompt_set, seed_prompt_set
    from swarm_node.tasks import load_prompt_set

    clock = Clock()
    swarm = MemorySwarm(clock)
    operator = load_or_create_key(tmp_path / "operator.key")
    stranger = load_or_create_key(tmp_path / "stranger.key")
    ps = load_prompt_set(TaskConfig(name="arithmetic", size=50))
    seed_prompt_set(MemoryTransport(swarm, "seeder"), SWARM, ps, "arith", operator, ttl_s=300)
    node = make_node(tmp_path, swarm, "A", extra=[
        f'swarm.prompt_set_id="{ps.id}"', f'swarm.prompt_set_owner="{operator.public_key.decode()}"'])
    keeper = node.parts.prompt_keeper
    assert keeper is not None
    keeper.stop()  # driven by hand below, on the test's clock
    keeper.tick()  # first sight: draws the re-store time
    first = node.run_step()
    assert first["prompt_set_restores"] == 0 and first["prompt_set_restored_bytes"] == 0
    end_prompt_set(MemoryTransport(swarm, "mallory"), SWARM, ps.id, stranger, ttl_s=3000)
    clock.t = keeper.due
    keeper.tick()
    m = node.run_step()
    assert m["prompt_set_restores"] == 1 and m["prompt_set_restored_bytes"] > 1000
    assert m["dropped_tombstone_wrong_owner"] == 1 and m["total_dropped_tombstone_wrong_owner"] == 1
    assert node.run_step()["prompt_set_restores"] == 0  # per step
    node._shutdown()


def test_a_node_restarted_in_the_window_of_its_last_step_continues_at_the_next_slot(tmp_path):
    """Killed and restarted within one window, a node answers the window's next slot, not slot 0
    again, whose prompts its receivers already took from it and would refuse as a fault."""
    swarm = MemorySwarm(clock=Clock())  # every step in one window
    extra = ["swarm.max_peer_fraction=1.0"]
    receiver = make_node(tmp_path, swarm, "B", extra=extra)

    def step_of(node: Node) -> set[int]:
        published: list = []
        publish = node.parts.exchange.publish_groups
        node.parts.exchange.publish_groups = lambda groups, window: published.extend(groups) or publish(groups, window)
        node.run_step()
        return {g.prompt.index for g in published}

    before = step_of(make_node(tmp_path, swarm, "R", extra=extra))
    assert receiver.run_step()["peer_groups"] >= 1
    restarted = make_node(tmp_path, swarm, "R", extra=extra)  # the first process was killed: no shutdown
    after = step_of(restarted)
    assert restarted.step == 2 and restarted._slots.slot == 1 and after and not after & before
    m = receiver.run_step()
    assert m["peer_groups"] >= 1 and "dropped_window_slot_overused" not in m, m
    # Without the saved slot (a node directory from before it was kept), the restart repeats slot 0:
    # exactly what receivers refuse.
    (tmp_path / "R" / "slot.json").unlink()
    assert step_of(make_node(tmp_path, swarm, "R", extra=extra)) == before
    assert receiver.run_step().get("dropped_window_slot_overused", 0) >= 1


def test_the_fetch_budget_per_peer_is_a_setting(tmp_path):
    node = make_node(tmp_path, MemorySwarm(), "F", extra=["swarm.max_fetch_bytes_per_peer=3145728"])
    default = make_node(tmp_path, MemorySwarm(), "G")
    assert node.parts.exchange.max_bytes_per_peer == 3 << 20
    assert default.parts.exchange.max_bytes_per_peer == 2 * default.parts.exchange.max_group_bytes
