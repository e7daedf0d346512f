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


def _status_run(sizes: Sizes, n: int, every: int, cap_bytes: int = 256 << 10, shards: int = 1,
                read_every: int = 0) -> dict:
    args = argparse.Namespace(groups=1, max_groups=1, max_per_peer=1, staleness=1, replicas=5, peers_per_shard=8,
                              shards_per_read=1, rounds_per_window=1, status_every=every, status_read_every=read_every,
                              status_cap_records=256, status_cap_bytes=cap_bytes, status_shards=shards)
    return Model(n, "sharded", args, sizes, seed=2).run(rounds=4, warmup=4)


def test_status_records_cost_a_store_the_whole_key_and_fill_the_cap(sizes: Sizes) -> None:
    """With every record under one status key (`status_shards=1`, the layout before sharding), a
    status store's traversal hears from the key's replicas, each answering with every record it
    holds: the bytes of a store grow with the records held until the storage cap, and the replicas
    serve every node's stores (the hottest node grows with the swarm); storing every 4th round
    costs about a quarter of storing every round."""
    assert 1500 < sizes.status < 8000  # 32 receipts of distinct senders, 110 metrics, signed subkey

    def run(n: int, every: int, cap_bytes: int = 256 << 10) -> dict:
        return _status_run(sizes, n, every, cap_bytes)

    small, big = run(16, 1), run(48, 1)
    assert small["status_records_held"] == 16 and big["status_records_held"] == 48
    assert big["status_bytes_per_node_round"] > 2 * small["status_bytes_per_node_round"]
    assert big["status_hottest_node_bytes_served_round"] > 2.5 * small["status_hottest_node_bytes_served_round"]
    capped = run(48, 1, cap_bytes=16 * sizes.status)
    assert capped["status_records_held"] == 16  # a key over its cap holds what fits: status shows a part
    assert capped["status_bytes_per_node_round"] < 0.6 * big["status_bytes_per_node_round"]
    quarter = run(48, 4)["status_bytes_per_node_round"] / big["status_bytes_per_node_round"]
    assert 0.15 < quarter < 0.4, quarter
    assert big["total_bytes_per_node_round"] == pytest.approx(
        big["bytes_per_node_round"] + big["status_bytes_per_node_round"], abs=2)


def test_status_shards_cut_what_a_store_hears_about_shards_fold_and_hold_past_one_keys_cap(sizes: Sizes) -> None:
    """With STATUS_SHARDS keys a store hears only its shard's records: the bytes of records the
    stores hear back (a store's bytes less those of a store into an empty key) fall about
    STATUS_SHARDS-fold (less the unevenness of the shards: sum of squared shard sizes), the hottest
    replica serves a fraction of what the one key's did, and records past one key's cap are held
    (every shard has its own cap) and read back."""
    shards, n, roomy = keys.STATUS_SHARDS, 128, 1 << 20
    one, sharded = _status_run(sizes, n, 1, roomy), _status_run(sizes, n, 1, roomy, shards)
    one_empty, sharded_empty = _status_run(sizes, n, 1, 0), _status_run(sizes, n, 1, 0, shards)
    assert one["status_records_held"] == sharded["status_records_held"] == n
    heard_one = one["status_bytes_per_node_round"] - one_empty["status_bytes_per_node_round"]
    heard_sharded = sharded["status_bytes_per_node_round"] - sharded_empty["status_bytes_per_node_round"]
    assert 0.6 * shards < heard_one / heard_sharded < 1.1 * shards, heard_one / heard_sharded
    assert sharded["status_hottest_node_bytes_served_round"] < 0.25 * one["status_hottest_node_bytes_served_round"]
    # Under the real cap (256 KiB: 63 records of this size), one key holds 63 of 128; the shards hold all.
    capped_one, capped = _status_run(sizes, n, 1, read_every=1), _status_run(sizes, n, 1, shards=shards, read_every=1)
    per_key = (256 << 10) // sizes.status
    assert capped_one["status_records_held"] == per_key < n == capped["status_records_held"]
    assert capped["status_payload_bytes_in_per_node_round"] == n * sizes.status  # a read returns every record
    assert capped_one["status_payload_bytes_in_per_node_round"] == per_key * sizes.status
