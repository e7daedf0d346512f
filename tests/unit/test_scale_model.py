"""benchmarks/scale.py: the DHT model places and finds records as hivemind does, and the index
layouts differ the way the model is meant to show."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from benchmarks.scale import BUCKET, Dht, Model, Sizes
from protocol import keys


@pytest.fixture(scope="module")
def sizes() -> Sizes:
    return Sizes.measure(max_entries=8)


def test_records_live_on_the_nearest_nodes_and_lookups_reach_them() -> None:
    dht = Dht(200, np.random.default_rng(0), replicas=5)
    kid = dht.key_id(keys.rollout_index_key("s", 1))
    holders = dht.holders(kid)
    assert len(holders) == 5
    farthest_holder = max(int(dht.ids[h] ^ kid) for h in holders)
    assert sum(int(x ^ kid) <= farthest_holder for x in dht.ids) == 5
    for src in (0, 50, 199):
        latest = [j for j, _ in dht.lookup(src, kid, stop_when_found=False, cache=True)]
        assert holders - {src} <= set(latest)  # a `latest` get hears from every replica
        assert BUCKET <= len(latest) < 60  # the beam (20) plus the path, not the whole swarm
        first = [j for j, _ in dht.lookup(src, kid, stop_when_found=True, cache=False)]
        assert set(first) & holders and len(first) <= len(latest)


def test_sharding_bounds_the_hottest_node_where_one_key_per_window_does_not(sizes: Sizes) -> None:
    args = argparse.Namespace(groups=2, max_groups=4, max_per_peer=2, staleness=2, replicas=5, peers_per_shard=8,
                              shards_per_read=1, rounds_per_window=1)
    old = Model(96, "old", args, sizes, seed=1).run(rounds=1, warmup=2)
    sharded = Model(96, "sharded", args, sizes, seed=1).run(rounds=1, warmup=2)
    assert old["groups_gathered_mean"] == sharded["groups_gathered_mean"] == 4
    assert set(sharded["index_levels"]) <= {"3", "4"}  # 96 peers, 8 per shard: 12 shards' worth
    assert sharded["payload_bytes_in_per_node_round"] < 0.5 * old["payload_bytes_in_per_node_round"]
    assert sharded["hottest_node_bytes_served_round"] < 0.5 * old["hottest_node_bytes_served_round"]
