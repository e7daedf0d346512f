"""RolloutExchange over the in-memory transport: round trip, caps, and every drop reason."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from protocol import codec, keys
from protocol.messages import Completion, IndexEntry, NodeStatus, RolloutIndex
from swarm_node.swarm.exchange import CHUNK_BYTES, RolloutExchange
from swarm_node.swarm.index import owned_key_schedule
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.synthetic import synthetic_group
from tests.fakes import Clock

SWARM = "unit"
WINDOW_S = 30.0
T0 = 3_000_000.0  # DHT time at the start of window 100000


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def swarm(clock: Clock) -> MemorySwarm:
    return MemorySwarm(clock=clock)


def _exchange(swarm: MemorySwarm, peer: str, **kw) -> RolloutExchange:
    return RolloutExchange(MemoryTransport(swarm, peer), SWARM, vocab_size=49_152, max_new_tokens=256,
                           window_seconds=WINDOW_S, **kw)


def _group(sender: str, index: int = 0, *, t: float = T0, policy: int = 0, tokens: int = 32, seed: int = 0):
    return synthetic_group(np.random.default_rng(seed + 1000 * index), swarm_id=SWARM, sender=sender,
                           created_at=t, prompt_index=index, policy_version=policy, group_size=4, tokens=tokens)


def _window(t: float = T0) -> int:
    return keys.window_of(t, WINDOW_S)


def _fetch(ex: RolloutExchange, max_groups: int = 64, max_per_peer: int = 64, seed: int = 0):
    return ex.fetch_groups(_window(), staleness_windows=2, max_groups=max_groups, max_per_peer=max_per_peer,
                           timeout=5.0, rng=random.Random(seed))


def test_round_trip_returns_identical_groups(swarm: MemorySwarm) -> None:
    a, b = _exchange(swarm, "A"), _exchange(swarm, "B")
    sent = [_group("A", i) for i in range(3)]
    bytes_per_token = a.publish_groups(sent, _window())
    assert 0 < bytes_per_token < 8  # compressed below the raw 8 bytes/token
    got, drops = _fetch(b)
    assert sorted(got, key=lambda g: g.prompt.index) == sent
    assert drops.as_dict() == {}
    again, drops = _fetch(b)
    assert again == [] and drops.as_dict() == {}  # already taken: not returned twice, not a drop
    own, _ = _fetch(a)
    assert own == []  # exclude_self


def test_index_accumulates_within_a_window(swarm: MemorySwarm) -> None:
    a, b = _exchange(swarm, "A"), _exchange(swarm, "B")
    a.publish_groups([_group("A", 0)], _window())
    a.publish_groups([_group("A", 1)], _window())
    index = codec.decode(swarm.get_owned(keys.rollout_index_key(SWARM, _window()))["A"].value)
    assert [e.prompt_index for e in index.entries] == [0, 1]
    got, _ = _fetch(b)
    assert {g.prompt.index for g in got} == {0, 1}


def test_large_group_is_split_into_chunks(swarm: MemorySwarm) -> None:
    a = _exchange(swarm, "A")
    b = RolloutExchange(MemoryTransport(swarm, "B"), SWARM, vocab_size=49_152, max_new_tokens=1024,
                        window_seconds=WINDOW_S)
    big = synthetic_group(np.random.default_rng(0), swarm_id=SWARM, sender="A", created_at=T0,
                          group_size=128, tokens=1024)
    a.publish_groups([big], _window())
    index = codec.decode(swarm.get_owned(keys.rollout_index_key(SWARM, _window()))["A"].value)
    assert len(index.entries[0].chunk_digests) >= 2 and index.entries[0].size > CHUNK_BYTES
    got, drops = _fetch(b)
    assert got == [big] and drops.as_dict() == {}


def test_caps_bound_work_per_step(swarm: MemorySwarm) -> None:
    peers = [f"P{i}" for i in range(6)]
    for p in peers:
        _exchange(swarm, p).publish_groups([_group(p, i) for i in range(5)], _window())
    me = _exchange(swarm, "me")
    seen: set[tuple[str, int]] = set()
    for step in range(3):
        got, drops = _fetch(me, max_groups=7, max_per_peer=2, seed=step)
        assert len(got) == 7 and drops.as_dict() == {}
        per_peer = {p: sum(g.sender == p for g in got) for p in peers}
        assert max(per_peer.values()) <= 2
        keys_now = {(g.sender, g.prompt.index) for g in got}
        assert not keys_now & seen  # never the same group twice
        seen |= keys_now
    got, _ = _fetch(me, max_groups=100, max_per_peer=100)
    assert len(got) == 30 - 21  # the rest, then nothing
    assert me.transport.traffic["blobs_fetched"] == 30


def test_a_peers_newest_groups_are_taken_first(swarm: MemorySwarm, clock: Clock) -> None:
    """A peer publishes 4 groups in each of 3 windows; a receiver allowed 2 of it per gather takes
    those of the newest window, then the next newest (docs/results/staleness.md: F-TIS's gain on a
    group falls with its age)."""
    a, me = _exchange(swarm, "A"), _exchange(swarm, "me")
    for k in range(3):
        t = T0 + k * WINDOW_S
        clock.t = t
        a.publish_groups([_group("A", 10 * k + i, t=t) for i in range(4)], _window(t))
    for seed in range(3):
        taken = []
        for gather in range(6):
            got, _ = me.fetch_groups(_window(clock.t), 2, 8, 2, 5.0, random.Random(100 * seed + gather))
            taken.append(sorted(g.prompt.index // 10 for g in got))
        assert taken == [[2, 2], [2, 2], [1, 1], [1, 1], [0, 0], [0, 0]]
        me = _exchange(swarm, f"me{seed}")  # a fresh receiver, another draw


def test_stale_windows_are_not_read(swarm: MemorySwarm, clock: Clock) -> None:
    a, b = _exchange(swarm, "A"), _exchange(swarm, "B")
    a.publish_groups([_group("A", 0)], _window())
    clock.t += 4 * WINDOW_S
    got, drops = b.fetch_groups(_window(clock.t), 2, 8, 8, 5.0, random.Random(0))
    assert got == [] and drops.as_dict() == {}
    assert b.transport.traffic["blobs_fetched"] == 0


def test_records_expire_and_republish_extends_them(swarm: MemorySwarm, clock: Clock) -> None:
    a = RolloutExchange(MemoryTransport(swarm, "A"), SWARM, vocab_size=49_152, record_ttl_s=60,
                        window_seconds=WINDOW_S)
    b = _exchange(swarm, "B")
    a.publish_groups([_group("A", 0)], _window())
    clock.t += 50
    assert a.republish(_window(clock.t), staleness_windows=4) == 1
    clock.t += 50  # past the first expiration, within the republished one
    got, _ = b.fetch_groups(_window(clock.t), 4, 8, 8, 5.0, random.Random(0))
    assert len(got) == 1
    clock.t += 61
    assert swarm.get_owned(keys.rollout_index_key(SWARM, _window(T0))) == {}
    assert a.republish(_window(clock.t), staleness_windows=1) == 0  # window no longer matters


# ---- a misbehaving peer: every bad record is counted under its reason --------------------


def _publish_raw(swarm: MemorySwarm, owner: str, payloads: list[bytes], *, sender: str | None = None,
                 entry_overrides: dict | None = None, t: float = T0, window: int | None = None) -> list[str]:
    """Publish raw group bytes with an index as `owner` would (a peer with a valid key can do this)."""
    entries, digests = [], []
    for i, data in enumerate(payloads):
        d = codec.content_digest(data)
        swarm.write_raw_blob(d, data, t + 300)
        fields = dict(chunk_digests=(d,), size=len(data), prompt_index=i, policy_version=0, created_at=t)
        fields.update(entry_overrides or {})
        entries.append(IndexEntry(**fields))
        digests.append(d)
    window = _window(t) if window is None else window
    index = RolloutIndex(sender=sender or owner, window=window, entries=tuple(entries))
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, window), owner, codec.encode(index), t + 300)
    return digests


def _bad_completion(group, **changes):
    c = group.completions[0]
    return dataclasses.replace(group, completions=(dataclasses.replace(c, **changes),) + group.completions[1:])


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("garbage", "decode_error"),
        ("wrong_version", "bad_version"),
        ("positive_logprob", "logprob_positive"),
        ("nan_logprob", "logprob_nonfinite"),
        ("out_of_vocab", "token_out_of_vocab"),
        ("wrong_sender", "sender_mismatch"),
        ("wrong_swarm", "wrong_swarm"),
        ("older_than_its_entry", "index_mismatch"),  # a time its index contradicts: a lie, never `stale`
        ("status_not_group", "wrong_type"),
        ("too_long", "too_many_tokens"),
    ],
)
def test_bad_groups_are_dropped_by_reason(swarm: MemorySwarm, case: str, reason: str) -> None:
    g = _group("M", 0)
    lp = g.completions[0].logprobs.copy()
    ids = g.completions[0].token_ids.copy()
    payload = {
        "garbage": lambda: b"\x00garbage" * 10,
        "wrong_version": lambda: codec.encode(g)[:2] + bytes([99]) + codec.encode(g)[3:],
        "positive_logprob": lambda: codec.encode(_bad_completion(g, logprobs=np.abs(lp) + 0.5)),
        "nan_logprob": lambda: codec.encode(_bad_completion(g, logprobs=np.where(np.arange(len(lp)) == 3, np.nan, lp))),
        "out_of_vocab": lambda: codec.encode(_bad_completion(g, token_ids=ids + 60_000)),
        "wrong_sender": lambda: codec.encode(dataclasses.replace(g, sender="honest-peer")),
        "wrong_swarm": lambda: codec.encode(dataclasses.replace(g, swarm_id="other")),
        "older_than_its_entry": lambda: codec.encode(dataclasses.replace(g, created_at=T0 - 10 * WINDOW_S)),
        "status_not_group": lambda: codec.encode(NodeStatus(peer_id="M", role="trainer", model_id="m", step=1,
                                                            timestamp=T0)),
        "too_long": lambda: codec.encode(dataclasses.replace(
            g, completions=(Completion(token_ids=np.zeros(300, dtype=np.uint32), logprobs=-np.ones(300), finish_reason="length",
                                       claimed_reward=0.0),))),
    }[case]()
    _publish_raw(swarm, "M", [payload])
    honest = _exchange(swarm, "H")
    got, drops = _fetch(honest)
    assert got == [] and drops.as_dict() == {reason: 1}
    assert honest.drops[reason] == 1


def test_index_level_drops(swarm: MemorySwarm) -> None:
    honest = _exchange(swarm, "H")
    good = codec.encode(_group("X", 0))
    # an index that is not a message, an index claiming another sender, an oversized entry,
    # a duplicate listing, a digest nobody stored, a chunk that times out, a corrupted chunk
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, _window()), "junk", b"not an index", T0 + 300)
    _publish_raw(swarm, "liar", [good], sender="someone-else")
    _publish_raw(swarm, "X", [good], entry_overrides={"size": 64 << 20})
    d = _publish_raw(swarm, "Y", [codec.encode(_group("Y", 0))])[0]
    idx = RolloutIndex(sender="Y", window=_window(), entries=(
        IndexEntry(chunk_digests=(d,), size=len(good), prompt_index=0, policy_version=0, created_at=T0),) * 2)
    swarm.write_raw_owned(keys.rollout_index_key(SWARM, _window()), "Y", codec.encode(idx), T0 + 300)
    _publish_raw(swarm, "Z", [b"never stored"])
    swarm.write_raw_blob(codec.content_digest(b"never stored"), b"", 0.0)  # expired: missing
    slow = _publish_raw(swarm, "S", [codec.encode(_group("S", 0))])[0]
    swarm.unreachable.add(slow)
    bad = _publish_raw(swarm, "C", [codec.encode(_group("C", 0))])[0]
    swarm.corrupt_blob(bad)
    got, drops = _fetch(honest)
    assert drops.as_dict() == {"decode_error": 1, "sender_mismatch": 1, "oversized": 1, "duplicate": 1,
                               "fetch_timeout": 1, "hash_mismatch": 1}
    assert [g.sender for g in got] == ["Y"]  # the first listing of Y's group is fine
    swarm.unreachable.clear()
    got, drops = _fetch(honest)
    assert [g.sender for g in got] == ["S"]  # a timed-out group is tried again
    assert drops.as_dict() == {"missing": 1}  # a missing chunk gets a second try, then counts
    got, drops = _fetch(honest)
    assert got == [] and drops.as_dict() == {}  # every bad record was counted once


def test_chunk_missing_at_first_is_fetched_later(swarm: MemorySwarm) -> None:
    """A reader that sees an index before its chunk (stored in the same batch) gets it next time."""
    honest = _exchange(swarm, "H")
    data = codec.encode(_group("L", 0))
    digest = _publish_raw(swarm, "L", [data])[0]
    swarm.write_raw_blob(digest, b"", 0.0)  # not (yet) stored anywhere
    got, drops = _fetch(honest)
    assert got == [] and drops.as_dict() == {}
    swarm.write_raw_blob(digest, data, T0 + 300)  # the chunk store lands
    got, drops = _fetch(honest)
    assert [g.sender for g in got] == ["L"] and drops.as_dict() == {}


def test_reencoded_duplicate_is_dropped(swarm: MemorySwarm) -> None:
    honest = _exchange(swarm, "H")
    g = _group("D", 0)
    same_again = _bad_completion(g, claimed_reward=0.123)  # other bytes, same (sender, prompt, policy)
    _publish_raw(swarm, "D", [codec.encode(g), codec.encode(same_again)], entry_overrides={"prompt_index": 0})
    got, drops = _fetch(honest)
    assert len(got) == 1 and drops.as_dict() == {"duplicate": 1}


def test_index_claims_must_match_the_group(swarm: MemorySwarm) -> None:
    honest = _exchange(swarm, "H")
    _publish_raw(swarm, "M", [codec.encode(_group("M", 0))], entry_overrides={"prompt_index": 7})
    got, drops = _fetch(honest)
    assert got == [] and drops.as_dict() == {"index_mismatch": 1}


def test_group_filter_hook_counts_its_reason(swarm: MemorySwarm) -> None:
    _exchange(swarm, "A").publish_groups([_group("A", 0), _group("A", 1)], _window())
    honest = _exchange(swarm, "H", group_filter=lambda g: "unknown_prompt" if g.prompt.index == 1 else None)
    got, drops = _fetch(honest)
    assert [g.prompt.index for g in got] == [0] and drops.as_dict() == {"unknown_prompt": 1}


def test_status_round_trip_and_owner_check(swarm: MemorySwarm) -> None:
    a, b = _exchange(swarm, "A"), _exchange(swarm, "B")
    status = NodeStatus(peer_id="A", role="trainer", model_id="m", step=3, timestamp=T0, metrics={"reward": 0.5})
    assert a.publish_status(status)
    forged = NodeStatus(peer_id="A", role="trainer", model_id="evil", step=9, timestamp=T0)
    assert swarm.get_owned(keys.status_key(SWARM, keys.status_shard("A"))).keys() == {"A"}  # its own shard
    swarm.write_raw_owned(keys.status_key(SWARM, keys.status_shard("M")), "M", codec.encode(forged), T0 + 300)
    swarm.write_raw_owned(keys.status_key(SWARM, keys.status_shard("N")), "N", b"junk", T0 + 300)
    assert b.read_statuses(timeout=1) == [status]
    assert b.drops.as_dict() == {"status_sender_mismatch": 1, "status_decode_error": 1}


def test_a_status_record_under_another_peers_shard_is_dropped(swarm: MemorySwarm) -> None:
    """A valid record of its own owner, stored under a shard the owner does not belong in (a Sybil
    piling into one shard), is dropped with its reason; the owner's record in its shard is read."""
    own = NodeStatus(peer_id="W", role="trainer", model_id="m", step=1, timestamp=T0)
    elsewhere = dataclasses.replace(own, step=2)
    other_shard = (keys.status_shard("W") + 1) % keys.STATUS_SHARDS
    swarm.write_raw_owned(keys.status_key(SWARM, other_shard), "W", codec.encode(elsewhere), T0 + 300)
    reader = _exchange(swarm, "R")
    assert reader.read_statuses(timeout=1) == []
    assert reader.drops.as_dict() == {"status_wrong_shard": 1}
    assert _exchange(swarm, "W").publish_status(own)
    assert reader.read_statuses(timeout=1) == [own]
    assert reader.drops.as_dict() == {"status_wrong_shard": 2}


class _CountingTransport(MemoryTransport):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.batches: list[int] = []

    def get_all_many(self, keys_, timeout):  # type: ignore[override]
        self.batches.append(len(keys_))
        return super().get_all_many(keys_, timeout)


def test_status_records_of_many_peers_spread_over_the_shards_and_are_all_read_in_one_batch(swarm: MemorySwarm) -> None:
    """300 peers' records (more than one key of a replica holds: ~63 typical records in 256 KiB)
    land in their owners' shards, no shard holding more than a fraction of them, and one read
    returns every one of them from a single concurrent batch of all shards."""
    peers = [f"peer-{i:03d}" for i in range(300)]
    for p in peers:
        assert _exchange(swarm, p).publish_status(NodeStatus(peer_id=p, role="trainer", model_id="m", step=1,
                                                             timestamp=T0))
    held = [len(swarm.get_owned(k)) for k in keys.status_keys(SWARM)]
    assert sum(held) == 300 and max(held) < 3 * 300 // keys.STATUS_SHARDS
    reader = RolloutExchange(_CountingTransport(swarm, "reader"), SWARM, vocab_size=100)
    assert [s.peer_id for s in reader.read_statuses(timeout=1)] == peers
    assert reader.transport.batches == [keys.STATUS_SHARDS] and not reader.drops


def test_owned_key_schedule_covers_read_windows() -> None:
    schedule = owned_key_schedule(SWARM, WINDOW_S, staleness_windows=2)
    listed = set(schedule(T0))
    assert set(keys.status_keys(SWARM)) <= listed
    for w in range(_window() - 2, _window() + 2):
        assert keys.rollout_index_key(SWARM, w) in listed


class _ColdTransport(MemoryTransport):
    """A transport whose first index read times out on every key (a DHT client that has not
    talked to the key's holders for minutes, on a loaded swarm), then answers."""

    def __init__(self, swarm: MemorySwarm, peer_id: str) -> None:
        super().__init__(swarm, peer_id)
        self.reads: list[list[str]] = []

    def get_all_many_late(self, keys_, timeout):
        self.reads.append(sorted(keys_))
        if len(self.reads) == 1:
            return {k: {} for k in keys_}, set(keys_)
        return super().get_all_many_late(keys_, timeout)


def test_index_keys_that_timed_out_are_read_once_more(swarm: MemorySwarm) -> None:
    """Found by the soak: a node gathering once a slow step had every index key time out and took
    no peer group in an hour. The keys that timed out are read again within the gather's time."""
    a = _exchange(swarm, "A")
    sent = [_group("A", i) for i in range(3)]
    a.publish_groups(sent, _window())
    cold = _ColdTransport(swarm, "B")
    b = RolloutExchange(cold, SWARM, vocab_size=49_152, max_new_tokens=256, window_seconds=WINDOW_S)
    got, drops = _fetch(b)
    assert sorted(got, key=lambda g: g.prompt.index) == sent and drops.as_dict() == {}
    assert len(cold.reads) == 2 and cold.reads[1] == cold.reads[0]  # the late keys, once more
