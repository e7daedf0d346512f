"""The sharded rollout index: keys, the level rule, read plans, and a growing swarm in memory."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from protocol import codec, keys
from protocol.messages import IndexEntry, ProtocolError, RolloutIndex
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.index import ShardedIndex, ShardRead, level_for, owned_key_schedule
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.synthetic import synthetic_group
from tests.fakes import Clock

SWARM = "unit"
WINDOW_S = 30.0
T0 = 3_000_000.0
W0 = int(T0 // WINDOW_S)


def test_shard_keys_extend_the_unsharded_key() -> None:
    assert keys.rollout_index_key(SWARM, 7) == keys.rollout_index_key(SWARM, 7, 0, 0) == "swarm-node/unit/rollouts/7"
    assert keys.rollout_index_key(SWARM, 7, 3, 5) == "swarm-node/unit/rollouts/7/3.5"
    for level, shard in [(0, 1), (3, 8), (-1, 0), (keys.MAX_SHARD_LEVEL + 1, 0), (2, -1), (True, 0), (1, 0.5)]:
        with pytest.raises(ProtocolError):
            keys.rollout_index_key(SWARM, 7, level, shard)
    listed = keys.window_index_keys(SWARM, 7, max_level=3)
    assert len(listed) == len(set(listed)) == 15


def test_shards_of_a_level_split_the_shards_of_the_level_below() -> None:
    peers = [f"peer-{i}" for i in range(2000)]
    for level in range(1, 8):
        for p in peers[:200]:
            assert keys.index_shard(p, level) % 2 ** (level - 1) == keys.index_shard(p, level - 1)
    sizes = Counter(keys.index_shard(p, 4) for p in peers)  # 16 shards of ~125
    assert len(sizes) == 16 and min(sizes.values()) > 80 and max(sizes.values()) < 170


def test_level_rule_and_its_hysteresis() -> None:
    assert [level_for(n, 16) for n in (0, 1, 16, 17, 64, 65, 1000)] == [0, 0, 0, 1, 2, 3, 6]
    assert level_for(2**20, 16) == keys.MAX_SHARD_LEVEL
    # From level 3 (8 shards): stays for 32..128 peers, moves up above 128, down below 32.
    assert [level_for(n, 16, 3) for n in (32, 128, 129, 31, 7)] == [3, 3, 4, 2, 0]
    assert level_for(float("nan"), 16, 3) == 3


def test_read_plan_is_bounded_and_probes_the_nearer_neighbouring_level() -> None:
    index = ShardedIndex(SWARM, "me", peers_per_shard=16, shards_per_read=2)
    rng = random.Random(0)
    windows = range(W0 - 4, W0 + 1)
    first = index.read_plan(windows, rng)  # no estimate yet: every level of the newest complete window
    assert {r.level for r in first if r.window == W0 - 1} == set(range(keys.MAX_SHARD_LEVEL + 1))
    index.level, index.estimated_peers = 6, 1000.0  # above half of 16 * 64: probe level 7
    plan = index.read_plan(windows, rng)
    by_window = Counter((r.window, r.level) for r in plan)
    assert all(by_window[(w, 6)] == 2 for w in windows)
    assert by_window[(W0, 7)] == by_window[(W0 - 1, 7)] == 1 and by_window[(W0 - 2, 7)] == 0
    assert len(plan) == 5 * 2 + 2
    for r in plan:
        assert r.key == keys.rollout_index_key(SWARM, r.window, r.level, r.shard)
    index.estimated_peers = 400.0  # below half: probe level 5
    assert {r.level for r in index.read_plan(windows, rng)} == {5, 6}
    index.level, index.estimated_peers = 0, 5.0  # a small swarm: one key per window, nothing below
    assert [r.key for r in index.read_plan(windows, rng)] == [keys.rollout_index_key(SWARM, w) for w in windows]


def test_estimate_counts_each_level_at_its_share() -> None:
    index = ShardedIndex(SWARM, "me", peers_per_shard=16)
    index.level, index.estimated_peers = 4, 200.0
    reads = [ShardRead("k3", W0, 3, 0), ShardRead("k4a", W0, 4, 0), ShardRead("k4b", W0, 4, 1),
             ShardRead("k5", W0, 5, 0), ShardRead("k4c", W0 + 1, 4, 2)]
    owners = dict(zip(reads, [6, 10, 14, 1, 2]))  # the newest window (W0 + 1) is left out: still filling
    assert index.observe(owners) == pytest.approx(6 * 8 + 12 * 16 + 1 * 32)
    assert index.estimated_peers == pytest.approx(200 + 0.5 * 72)
    assert index.level == 4
    assert index.observe({ShardRead("k", W0, 4, 0): 0}) == 0 and index.estimated_peers == pytest.approx(236)


def _exchange(swarm: MemorySwarm, peer: str, **kw) -> RolloutExchange:
    return RolloutExchange(MemoryTransport(swarm, peer), SWARM, vocab_size=49_152, max_new_tokens=64,
                           window_seconds=WINDOW_S, **kw)


def _group(sender: str, index: int, t: float):
    return synthetic_group(np.random.default_rng(index), swarm_id=SWARM, sender=sender, created_at=t,
                           prompt_index=index, policy_version=0, group_size=2, tokens=8)


def _rounds(exchanges: list[RolloutExchange], clock: Clock, rounds: int) -> list[dict]:
    """Each round (one window): everyone publishes one group, then everyone gathers."""
    stats = []
    for r in range(rounds):
        window = int(clock.t // WINDOW_S)
        for i, ex in enumerate(exchanges):
            ex.publish_groups([_group(ex.transport.peer_id, (window - W0) * 1000 + i, clock.t)], window)
        for i, ex in enumerate(exchanges):
            before = Counter(ex.transport.traffic)
            got, drops = ex.fetch_groups(window, 2, max_groups=4, max_per_peer=1, timeout=5.0,
                                         rng=random.Random(r * 1000 + i))
            after = ex.transport.traffic
            stats.append({"round": r, "groups": len(got), "drops": sum(drops.values()),
                          "keys": after["records_fetched"] - before["records_fetched"],
                          "bytes_in": after["bytes_in"] - before["bytes_in"] - sum(len(codec.encode(g)) for g in got)})
        clock.t += WINDOW_S
    return stats


def test_a_growing_swarm_agrees_on_a_level_and_reads_a_bounded_index() -> None:
    clock = Clock(T0)
    swarm = MemorySwarm(clock=clock)
    shape = {"index_peers_per_shard": 8, "index_shards_per_read": 2}
    small = [_exchange(swarm, f"p{i}", **shape) for i in range(6)]
    stats = _rounds(small, clock, 3)
    assert {ex.index.level for ex in small} == {0}  # six peers: the unsharded single key per window
    small_index_bytes = max(s["bytes_in"] for s in stats if s["round"] == 2)
    assert all(s["groups"] == 4 and s["drops"] == 0 for s in stats if s["round"] > 0)

    big = small + [_exchange(swarm, f"q{i}", **shape) for i in range(170)]
    stats = _rounds(big, clock, 5)
    levels = Counter(ex.index.level for ex in big)
    assert levels.most_common(1)[0][0] == level_for(176, 8) == 5
    assert set(levels) <= {4, 5, 6}, levels
    last = [s for s in stats if s["round"] == 4]
    assert all(s["groups"] == 4 and s["drops"] == 0 for s in last)
    assert max(s["keys"] for s in last) <= 3 * 2 + 2  # 3 windows x 2 shards + a probe in 2 windows
    # Index bytes read per gather: bounded by the shard size, not the swarm (176 vs 6 peers).
    assert max(s["bytes_in"] for s in last) < 8 * small_index_bytes
    unsharded = sum(len(v.value) for w in (W0 + 6, W0 + 7) for v in swarm.get_owned(
        keys.rollout_index_key(SWARM, w)).values())
    assert unsharded == 0  # nobody still writes the level-0 key at this size


def test_a_record_in_a_shard_its_owner_does_not_belong_in_is_dropped_once() -> None:
    clock = Clock(T0)
    swarm = MemorySwarm(clock=clock)
    reader = _exchange(swarm, "reader")
    reader.index.level, reader.index.estimated_peers = 1, 20.0
    owner = next(p for p in (f"m{i}" for i in range(100)) if keys.index_shard(p, 1) == 1)
    group = _group(owner, 0, T0)
    data = codec.encode(group)
    digest = codec.content_digest(data)
    swarm.put_blob(digest, data, T0 + 300)
    index = RolloutIndex(sender=owner, window=W0, entries=(IndexEntry(
        chunk_digests=(digest,), size=len(data), prompt_index=0, policy_version=0, created_at=T0),))
    for shard in (0, 1):  # the wrong shard and its own one
        swarm.write_raw_owned(keys.rollout_index_key(SWARM, W0, 1, shard), owner, codec.encode(index), T0 + 300)
    drops = Counter()
    for seed in range(3):  # level 1 has two shards: each gather reads both
        got, d = reader.fetch_groups(W0, 0, 8, 8, 5.0, random.Random(seed))
        drops.update(d)
    assert drops == {"index_mismatch": 1}
    assert reader.drops["index_mismatch"] == 1


def test_an_owner_that_changed_level_in_a_window_is_taken_once_without_drops() -> None:
    clock = Clock(T0)
    swarm = MemorySwarm(clock=clock)
    writer, reader = _exchange(swarm, "w"), _exchange(swarm, "r")
    writer.publish_groups([_group("w", 0, T0)], W0)
    writer.index.level = 1  # a later publish in the same window keeps the window's key
    writer.publish_groups([_group("w", 1, T0)], W0)
    assert writer.index.write_key(W0) == keys.rollout_index_key(SWARM, W0)
    assert writer.index.write_key(W0 + 1) == keys.rollout_index_key(SWARM, W0 + 1, 1, keys.index_shard("w", 1))
    # The same record under both levels (as after a restart at another level): one copy is taken.
    record = swarm.get_owned(keys.rollout_index_key(SWARM, W0))["w"]
    swarm.write_raw_owned(writer.index.write_key(W0 + 1).replace(str(W0 + 1), str(W0), 1), "w", record.value,
                          record.expiration_time)
    reader.index.level, reader.index.estimated_peers = 1, 3.0  # reads both shards of level 1 and level 0
    got, drops = reader.fetch_groups(W0, 0, 8, 8, 5.0, random.Random(0))
    assert sorted(g.prompt.index for g in got) == [0, 1] and drops.as_dict() == {}


def test_owned_key_schedule_lists_every_shard_of_the_windows_read() -> None:
    schedule = owned_key_schedule(SWARM, WINDOW_S, staleness_windows=2)
    listed = set(schedule(T0))
    for w in range(W0 - 2, W0 + 2):
        assert keys.rollout_index_key(SWARM, w) in listed
        assert keys.rollout_index_key(SWARM, w, keys.MAX_SHARD_LEVEL, 2**keys.MAX_SHARD_LEVEL - 1) in listed
    assert keys.rollout_index_key(SWARM, W0 + 10, 1, 0) not in listed


def test_identities_that_only_write_records_do_not_move_the_swarm_up_a_level() -> None:
    """A Sybil flood of the index key: 64 identities whose well-formed records list only entries the
    reader refuses before fetching (oversized, one byte over the cap). Counted as peers they would make two honest nodes
    shard their index and read each other's shard only some of the time; they are not counted, and
    the honest peer still counts in later gathers, when its entries were seen before."""
    clock = Clock(T0)
    swarm = MemorySwarm(clock=clock)
    honest = [_exchange(swarm, "a", index_peers_per_shard=8), _exchange(swarm, "b", index_peers_per_shard=8)]
    for r in range(4):
        window = int(clock.t // WINDOW_S)
        for k in range(64):
            sybil = f"sybil{k}"
            entries = tuple(IndexEntry(chunk_digests=(codec.content_digest(f"{sybil}:{window}:{j}".encode()),),
                                       size=(8 << 20) + 1, prompt_index=j, policy_version=j, created_at=clock.t)
                            for j in range(4))
            swarm.write_raw_owned(keys.rollout_index_key(SWARM, window), sybil,
                                  codec.encode(RolloutIndex(sender=sybil, window=window, entries=entries)), clock.t + 300)
        for i, ex in enumerate(honest):
            ex.publish_groups([_group(ex.transport.peer_id, 10 * r + i, clock.t)], window)
        for i, ex in enumerate(honest):
            got, drops = ex.fetch_groups(window, 2, max_groups=4, max_per_peer=2, timeout=5.0,
                                         rng=random.Random(10 * r + i))
            assert [g.sender for g in got] == ["b" if i == 0 else "a"]  # the other honest node's group, every round
            assert drops.as_dict() == {"oversized": 256}  # each sybil record of the window, once
            assert ex.index.level == 0 and ex.index.estimated_peers <= 2.0, (r, ex.index.estimated_peers)
        clock.t += WINDOW_S
