"""Durable prompt sets over real hivemind DHTs on loopback: a seeder publishes a set with a short TTL
and leaves; a node that uses the set keeps re-storing it; a node joining several TTLs later loads it
from the re-stored records; after the operator's tombstone nobody re-stores it and it lapses."""

from __future__ import annotations

import time

import pytest

from protocol import keys

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SWARM = "durable"
TTL = 6.0  # seconds: every record of the test lapses this long after its last store


def _wait_for(condition, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


@pytest.mark.timeout(180)
def test_a_set_outlives_its_seeder_until_its_operator_ends_it(dht_factory, tmp_path) -> None:
    from swarm_node.swarm.identity import load_or_create_key
    from swarm_node.swarm.prompt_keeper import PromptSetKeeper
    from swarm_node.swarm.prompts import PromptSetError, end_prompt_set, load_prompt_set, read_records, seed_prompt_set
    from swarm_node.tasks.base import Problem, PromptSet, content_id

    problems = tuple(Problem(index=i, question=f"What is {i} * 7?", answer=str(7 * i)) for i in range(300))
    ps = PromptSet(id=content_id("arithmetic", problems), answer_kind="number", problems=problems)
    operator = load_or_create_key(tmp_path / "operator.key")
    boot = dht_factory(SWARM)
    seeder = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
    node = dht_factory(SWARM, initial_peers=boot.visible_maddrs)

    manifest = seed_prompt_set(seeder, SWARM, ps, "times-seven", operator, ttl_s=TTL, timeout=10)
    seeded_at = time.monotonic()
    seeder.shutdown()  # the operator goes home
    assert load_prompt_set(node, SWARM, ps.id, operator.public_key, timeout=10) == ps
    keeper = PromptSetKeeper(node, SWARM, ps.id, operator.public_key, ttl_s=TTL, budget_bytes=1 << 20, timeout=5.0)
    keeper.start()
    try:
        time.sleep(max(0.0, seeded_at + 3 * TTL - time.monotonic()))  # three lifetimes of the seeder's records
        assert keeper.restores >= 2, (keeper.restores, keeper.drops)

        late = dht_factory(SWARM, initial_peers=boot.visible_maddrs)
        assert load_prompt_set(late, SWARM, ps.id, operator.public_key, timeout=10) == ps

        end_prompt_set(late, SWARM, ps.id, operator, ttl_s=10 * TTL, timeout=10)
        assert _wait_for(lambda: keeper.ended is not None, TTL + 5.0), "the keeper never saw the tombstone"
        restores = keeper.restores
        time.sleep(TTL + 2.0)  # every record stored before the tombstone lapses
        assert keeper.restores == restores  # nobody re-stored the set
        gone = late.get_blobs(list(manifest.chunk_digests), timeout=5)
        assert not gone.found and set(gone.failed.values()) == {"missing"}
        records = read_records(late.get_all(keys.prompt_manifest_key(SWARM, ps.id), 5), ps.id, operator.public_key)
        assert records.manifests == [] and records.tombstones  # only the tombstone is left
        with pytest.raises(PromptSetError, match="ended by its operator"):
            load_prompt_set(late, SWARM, ps.id, operator.public_key, timeout=5)
    finally:
        keeper.stop()
