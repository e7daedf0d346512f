"""A node follows its operator from an ended prompt set to its successor, over real hivemind DHTs on
loopback: at start (a config naming an ended set, a chain of ends) and while running (the keeper
sees the tombstone; the node switches between two steps). Only the operator key's tombstone counts."""

from __future__ import annotations

import logging
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SWARM = "successors"


def _sets(n: int, size: int = 20) -> list:
    from swarm_node.config import TaskConfig
    from swarm_node.tasks import load_prompt_set

    return [load_prompt_set(TaskConfig(name="arithmetic", size=size, seed=seed)) for seed in range(n)]


def _config(tmp_path, name: str, prompt_set_id: str, owner: bytes, *extra: str):
    from swarm_node.config import NodeConfig

    return NodeConfig.load(None, [
        f'node_dir="{tmp_path / name}"', 'model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp_path / "cache"}"',
        'model.device="cpu"', "generation.group_size=4", "generation.max_new_tokens=8", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "checkpoint.every_steps=100", f'swarm.swarm_id="{SWARM}"',
        f'swarm.prompt_set_id="{prompt_set_id}"', f'swarm.prompt_set_owner="{owner.decode()}"',
        "swarm.fetch_timeout_s=5.0", *extra])


def _close(parts) -> None:
    for hook in reversed(parts.close_hooks):
        hook()


def test_a_node_starting_on_an_ended_set_follows_its_successors(dht_factory, tmp_path, caplog) -> None:
    from swarm_node.node.assemble import build_parts
    from swarm_node.swarm.identity import load_or_create_key
    from swarm_node.swarm.prompts import end_prompt_set, seed_prompt_set

    operator = load_or_create_key(tmp_path / "operator.key")
    stranger = load_or_create_key(tmp_path / "stranger.key")
    boot = dht_factory(SWARM)
    node = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
    a, b, c, d = _sets(4)
    for ps in (a, b, c):
        seed_prompt_set(boot, SWARM, ps, "arith", operator, ttl_s=600, timeout=10)
    seed_prompt_set(node, SWARM, d, "arith", operator, ttl_s=600, timeout=10)  # its own subkey: boot ends it below
    end_prompt_set(boot, SWARM, a.id, operator, successor=b.id, ttl_s=600, timeout=10)
    end_prompt_set(boot, SWARM, b.id, operator, successor=c.id, ttl_s=600, timeout=10)
    end_prompt_set(boot, SWARM, d.id, stranger, successor=c.id, ttl_s=600, timeout=10)  # not the operator's

    cfg = _config(tmp_path, "restarted", a.id, operator.public_key)
    with caplog.at_level(logging.INFO, logger="swarm_node.node.assemble"):
        parts, _ = build_parts(cfg, transport=node)
    try:
        assert parts.prompt_set == c
        assert parts.prompt_keeper is not None and parts.prompt_keeper.prompt_set_id == c.id  # keeps c alive
        assert parts.admission.binding.assignment.prompt_set_id == c.id
        assert parts.config.swarm.prompt_set_id == c.id
        assert f'prompt_set_id = "{c.id}"' in (tmp_path / "restarted" / "config.resolved.toml").read_text()
        lines = [r.getMessage() for r in caplog.records if "following its successor" in r.getMessage()]
        assert lines == [f"prompt set {a.id} was ended by its operator: following its successor {c.id} "
                         f"({a.id} -> {b.id} -> {c.id})"]
    finally:
        _close(parts)
    # A stranger's tombstone names a successor too, but the node stays on the operator's set.
    from swarm_node.swarm.prompts import load_followed

    followed = load_followed(node, SWARM, d.id, operator.public_key, timeout=10)
    assert followed.prompt_set == d and followed.ended == ()


def test_a_running_node_switches_once_the_operator_ends_its_set(dht_factory, tmp_path) -> None:
    from swarm_node.node.assemble import build_parts
    from swarm_node.node.loop import Node
    from swarm_node.swarm.identity import load_or_create_key
    from swarm_node.swarm.prompts import end_prompt_set, seed_prompt_set

    operator = load_or_create_key(tmp_path / "operator.key")
    boot = dht_factory(SWARM)
    transport = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
    old, new = _sets(2)
    for ps in (old, new):
        seed_prompt_set(boot, SWARM, ps, "arith", operator, ttl_s=600, timeout=10)
    ttl = 6.0  # the keeper's watch reads come every ttl / 3, its ticks every ttl / 30
    parts, start = build_parts(_config(tmp_path, "running", old.id, operator.public_key,
                                       f"swarm.record_ttl_s={ttl}", "train.total_steps=1000",
                                       "swarm.slots_per_window=1024"),  # every step publishes, however fast
                               transport=transport)
    node = Node(parts, start_step=start)
    published: list = []
    publish = parts.exchange.publish_groups
    parts.exchange.publish_groups = lambda groups, window: published.extend(groups) or publish(groups, window)
    try:
        assert node.run_step()["prompt_set_switches"] == 0 and parts.prompt_set == old
        end_prompt_set(boot, SWARM, old.id, operator, successor=new.id, ttl_s=600, timeout=10)
        deadline, switched = time.monotonic() + 120, None
        while switched is None and time.monotonic() < deadline:
            published.clear()
            metrics = node.run_step()
            switched = metrics if metrics["prompt_set_switches"] == 1 else None
        assert switched is not None, "the node never switched"
        assert published and {g.prompt.prompt_set_id for g in published} == {old.id}  # that step was the old set's
        assert parts.prompt_set == new and parts.prompt_keeper.prompt_set_id == new.id
        published.clear()
        after = node.run_step()
        assert after["prompt_set_switches"] == 0
        assert published and all(g.prompt.prompt_set_id == new.id for g in published)
        assert all(new.problems[g.prompt.index].sha256 == g.prompt.sha256 for g in published)
    finally:
        node.stop()
        node._shutdown()


def test_a_running_seeder_stops_once_its_set_is_ended(dht_factory, tmp_path) -> None:
    """Found by the soak: the operator's `swarm-node seed` kept re-seeding after `end-prompt-set`; a
    re-seed is a newer manifest, which the tombstone does not end, so nodes restarting later loaded
    the ended set. The seeder's loop now stops at the tombstone and stores nothing more."""
    from swarm_node.ops.prompt_sets import keep_seeding
    from swarm_node.swarm.identity import load_or_create_key
    from swarm_node.swarm.prompts import PromptSetEnded, end_prompt_set, load_prompt_set, seed_prompt_set

    operator = load_or_create_key(tmp_path / "operator.key")
    boot = dht_factory(SWARM)
    seeder = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
    reader = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
    a, b = _sets(2, size=10)
    manifest = seed_prompt_set(seeder, SWARM, a, "arith", operator, ttl_s=600, timeout=10)
    assert keep_seeding(seeder, SWARM, a, manifest, operator, 600) is None  # not ended: re-seeded
    end_prompt_set(boot, SWARM, a.id, operator, successor=b.id, ttl_s=600, timeout=10)
    time.sleep(1.0)  # the next re-seed is later than the end
    ended = keep_seeding(seeder, SWARM, a, manifest, operator, 600)
    assert ended is not None and ended.successor == b.id
    with pytest.raises(PromptSetEnded):
        load_prompt_set(reader, SWARM, a.id, operator.public_key, timeout=10)
