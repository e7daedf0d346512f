"""The sharded rollout index on real DHTs: nodes find their level, store under shard keys (which the
DHT's validators accept) and read each other's groups from the shards."""

from __future__ import annotations

import random

import numpy as np
import pytest

from protocol import keys

pytestmark = [pytest.mark.integration]

SWARM = "itest-shards"


@pytest.mark.timeout(180)
def test_four_dhts_move_to_shards_and_still_exchange(dht_factory) -> None:
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.synthetic import synthetic_group

    first = dht_factory(SWARM)
    transports = [first] + [dht_factory(SWARM, initial_peers=first.visible_maddrs) for _ in range(3)]
    # One peer per shard: four peers need level 2 (four shards); each gather reads all four.
    exchanges = [RolloutExchange(t, SWARM, vocab_size=49_152, max_new_tokens=256, index_peers_per_shard=1,
                                 index_shards_per_read=4) for t in transports]
    now = first.dht_time()
    window = keys.window_of(now, 30.0)
    rng = np.random.default_rng(0)

    def publish(round_idx: int, w: int) -> None:
        created_at = now + (w - window) * 30.0  # a group is listed in the index of its own window
        for ex in exchanges:
            ex.publish_groups([synthetic_group(rng, swarm_id=SWARM, sender=ex.transport.peer_id, created_at=created_at,
                                               prompt_index=10 * round_idx + i) for i in range(2)], w)

    publish(0, window)  # no estimate yet: level 0, the one key of the window
    for ex in exchanges:
        got, drops = ex.fetch_groups(window, 2, max_groups=6, max_per_peer=2, timeout=20, rng=random.Random(0))
        assert drops.as_dict() == {} and len(got) == 6
        assert ex.index.level == 2 and ex.index.estimated_peers == pytest.approx(4)

    publish(1, window + 1)  # the next window: under each node's shard of level 2
    for ex in exchanges:
        shard_key = keys.rollout_index_key(SWARM, window + 1, 2, keys.index_shard(ex.transport.peer_id, 2))
        assert ex.index.write_key(window + 1) == shard_key
    for ex in exchanges:
        got, drops = ex.fetch_groups(window + 1, 2, max_groups=6, max_per_peer=2, timeout=20, rng=random.Random(1))
        assert drops.as_dict() == {}
        assert {g.sender for g in got} == {t.peer_id for t in transports} - {ex.transport.peer_id}
        assert {g.prompt.index for g in got} == {10, 11}  # the new groups, found in the shards
    stored = first.get_all(exchanges[1].index.write_key(window + 1), timeout=10)
    assert transports[1].peer_id in stored
