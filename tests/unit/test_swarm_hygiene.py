"""DHT hygiene rules (docs/method.md, hostile peers), one test per rule, on hand-built records (no DHT needed):
bounded expirations, owned records only under the swarm's key schedule and decoding as the key's kind
of message, and the storage caps on subkeys and bytes per key and per peer."""

from __future__ import annotations

import dataclasses
import time

import pytest

pytest.importorskip("hivemind")

from hivemind.dht.crypto import RSASignatureValidator  # noqa: E402
from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import CompositeValidator, DHTRecord  # noqa: E402
from hivemind.utils.crypto import RSAPrivateKey  # noqa: E402

from protocol import codec, keys  # noqa: E402
from protocol.messages import IndexEntry, NodeStatus, PromptSetManifest, PromptSetTombstone, RolloutIndex  # noqa: E402
from swarm_node.swarm.index import owned_key_schedule  # noqa: E402
from swarm_node.swarm.storage import CappedStorage  # noqa: E402
from swarm_node.swarm.validators import (  # noqa: E402
    CachedRSASignatureValidator,
    OwnedRecordValidator,
    SwarmRecordValidator,
    owner_of_subkey,
)

SWARM = "hygiene-swarm"
WINDOW_S = 30.0
ser = DHTProtocol.serializer


@pytest.fixture(scope="module")
def key() -> RSAPrivateKey:
    return RSAPrivateKey()


def _validator(k: RSAPrivateKey, max_ttl_s: float = 3600.0) -> CompositeValidator:
    schedule = owned_key_schedule(SWARM, WINDOW_S, 4)
    return CompositeValidator([CachedRSASignatureValidator(k), SwarmRecordValidator(SWARM, max_ttl_s),
                               OwnedRecordValidator(SWARM, schedule)])


def _owned(v: CompositeValidator, k: RSAPrivateKey, key: str, value: bytes, ttl: float = 60.0) -> DHTRecord:
    subkey = RSASignatureValidator(k).local_public_key
    record = DHTRecord(DHTID.generate(source=key).to_bytes(), ser.dumps(subkey), ser.dumps(value), time.time() + ttl)
    return dataclasses.replace(record, value=v.sign_value(record))


def _peer(k: RSAPrivateKey) -> str:
    return owner_of_subkey(RSASignatureValidator(k).local_public_key)


def _status_key(k: RSAPrivateKey) -> str:
    """The status shard the owner of `k` writes under."""
    return keys.status_key(SWARM, keys.status_shard(_peer(k)))


def _status(peer: str, step: int = 3) -> bytes:
    return codec.encode(NodeStatus(peer_id=peer, role="trainer", model_id="m", step=step, timestamp=time.time()))


def _index(peer: str, window: int, n: int = 1) -> bytes:
    entries = tuple(IndexEntry(chunk_digests=("ab" * 32,), size=100, prompt_index=i, policy_version=1,
                               created_at=window * WINDOW_S) for i in range(n))
    return codec.encode(RolloutIndex(sender=peer, window=window, entries=entries))


def _window() -> int:
    return keys.window_of(time.time(), WINDOW_S)


def test_expiration_beyond_the_bound_is_refused(key) -> None:
    v = _validator(key, max_ttl_s=600.0)
    assert v.validate(_owned(v, key, _status_key(key), _status(_peer(key)), ttl=300))
    # The ghost peer of the issue: a status record 1e8 s ahead.
    assert not v.validate(_owned(v, key, _status_key(key), _status(_peer(key), 999999), ttl=1e8))
    data = b"chunk"
    blob = DHTRecord(DHTID.generate(source=keys.chunk_key(SWARM, codec.content_digest(data))).to_bytes(),
                     DHTProtocol.IS_REGULAR_VALUE, ser.dumps(data), time.time() + 1e8)
    assert not v.validate(blob)
    assert v.validate(dataclasses.replace(blob, expiration_time=time.time() + 60))


def test_owned_records_only_under_the_swarms_scheduled_keys(key) -> None:
    v = _validator(key)
    w = _window()
    assert v.validate(_owned(v, key, keys.rollout_index_key(SWARM, w), _index(_peer(key), w)))
    # Another swarm's index key, an arbitrary key, a window far outside the schedule.
    assert not v.validate(_owned(v, key, keys.rollout_index_key("other-swarm", w), _index(_peer(key), w)))
    assert not v.validate(_owned(v, key, "anything/at/all", _status(_peer(key))))
    assert not v.validate(_owned(v, key, keys.rollout_index_key(SWARM, w + 1000), _index(_peer(key), w + 1000)))
    # A chunk key is not an owned key either (a subkey there could shadow the chunk).
    chunk = keys.chunk_key(SWARM, "cd" * 32)
    assert not v.validate(_owned(v, key, chunk, _status(_peer(key))))


def test_owned_records_must_decode_as_the_keys_message(key) -> None:
    v = _validator(key)
    me, w = _peer(key), _window()
    other = _peer(RSAPrivateKey())
    status, index = _status_key(key), keys.rollout_index_key(SWARM, w)
    assert v.validate(_owned(v, key, status, _status(me)))
    assert not v.validate(_owned(v, key, status, b"\x93garbage"))
    assert not v.validate(_owned(v, key, status, _index(me, w)))          # an index under the status key
    assert not v.validate(_owned(v, key, status, _status(other)))         # someone else's status
    assert not v.validate(_owned(v, key, index, _status(me)))             # a status under an index key
    wrong = keys.status_key(SWARM, (keys.status_shard(me) + 1) % keys.STATUS_SHARDS)
    assert not v.validate(_owned(v, key, wrong, _status(me)))             # its status under another shard
    unsharded = f"{keys.PREFIX}/{SWARM}/status"
    assert not v.validate(_owned(v, key, unsharded, _status(me)))         # the unsharded key of old releases
    assert not v.validate(_owned(v, key, index, _index(other, w)))        # another sender's index
    assert not v.validate(_owned(v, key, index, _index(me, w - 1)))       # the index of another window
    assert not v.validate(_owned(v, key, index, _index(me, w, n=300)))    # more entries than any writer lists
    assert v.validate(_owned(v, key, index, _index(me, w, n=200)))


def test_a_manifest_is_stored_only_under_its_own_key(key) -> None:
    v = _validator(key)
    manifest = codec.encode(PromptSetManifest(
        prompt_set_id="arith-0123", name="n", answer_kind="number", num_problems=3, chunk_digests=("ef" * 32,),
        owner_public_key=b"k" * 40, created_at=time.time()))
    assert v.validate(_owned(v, key, keys.prompt_manifest_key(SWARM, "arith-0123"), manifest))
    assert not v.validate(_owned(v, key, keys.prompt_manifest_key(SWARM, "another-set"), manifest))
    assert not v.validate(_owned(v, key, keys.prompt_manifest_key("other-swarm", "arith-0123"), manifest))
    # A tombstone ending the set goes under the same key, and only there.
    tombstone = codec.encode(PromptSetTombstone(prompt_set_id="arith-0123", owner_public_key=b"k" * 40,
                                                ended_at=time.time(), signature=b"s"))
    assert v.validate(_owned(v, key, keys.prompt_manifest_key(SWARM, "arith-0123"), tombstone))
    assert not v.validate(_owned(v, key, keys.prompt_manifest_key(SWARM, "another-set"), tombstone))
    assert not v.validate(_owned(v, key, _status_key(key), tombstone))


def test_refusals_are_counted_by_reason(key) -> None:
    swarm_v = SwarmRecordValidator(SWARM, 60.0)
    v = CompositeValidator([CachedRSASignatureValidator(key), swarm_v])
    assert not v.validate(_owned(v, key, _status_key(key), _status(_peer(key)), ttl=1e6))
    assert swarm_v.refusals.counts["expiration_too_far"] == 1


@pytest.fixture()
def storage() -> CappedStorage:
    saved = (CappedStorage.max_subkeys_per_key, CappedStorage.max_bytes_per_key, CappedStorage.max_bytes_per_peer)
    CappedStorage.max_subkeys_per_key, CappedStorage.max_bytes_per_key, CappedStorage.max_bytes_per_peer = 3, 1000, 700
    yield CappedStorage()
    CappedStorage.max_subkeys_per_key, CappedStorage.max_bytes_per_key, CappedStorage.max_bytes_per_peer = saved


def _k(name: str) -> DHTID:
    return DHTID.generate(source=name)


def test_storage_caps_subkeys_per_key(storage) -> None:
    exp = time.time() + 60
    for i in range(3):
        assert storage.store_subkey(_k("a"), f"[owner:{i}]".encode(), b"x" * 10, exp)
    assert not storage.store_subkey(_k("a"), b"[owner:3]", b"x" * 10, exp)  # a fourth peer under the key
    assert storage.store_subkey(_k("a"), b"[owner:1]", b"y" * 10, exp + 1)   # an existing peer may replace its own
    assert storage.store_subkey(_k("b"), b"[owner:3]", b"x" * 10, exp)       # other keys are unaffected
    assert storage.refusals.counts["subkeys_per_key"] >= 1


def test_storage_caps_bytes_per_key_and_per_peer(storage) -> None:
    exp = time.time() + 60
    assert storage.store_subkey(_k("a"), b"[owner:1]", b"x" * 600, exp)
    assert not storage.store_subkey(_k("a"), b"[owner:2]", b"x" * 600, exp)  # 1200 > 1000 bytes under one key
    assert storage.store_subkey(_k("a"), b"[owner:2]", b"x" * 300, exp)
    assert not storage.store_subkey(_k("b"), b"[owner:1]", b"x" * 200, exp)  # owner 1 would hold 800 > 700
    assert storage.store_subkey(_k("a"), b"[owner:1]", b"x" * 650, exp + 1)  # replacing its own record fits
    assert storage.store_subkey(_k("b"), b"[owner:3]", b"x" * 700, exp)
    # An owner's expired records stop counting.
    assert storage.store_subkey(_k("c"), b"[owner:4]", b"x" * 700, time.time() + 0.2)
    time.sleep(0.3)
    assert storage.store_subkey(_k("d"), b"[owner:4]", b"x" * 700, exp)


def test_a_full_key_makes_room_for_a_smaller_record_not_a_larger_one(storage) -> None:
    exp = time.time() + 60
    assert storage.store_subkey(_k("a"), b"[owner:flood1]", b"x" * 450, exp)
    assert storage.store_subkey(_k("a"), b"[owner:flood2]", b"x" * 450, exp)
    # Full (900 of 1000 bytes): a small honest record evicts the largest flood record to fit ...
    assert storage.store_subkey(_k("a"), b"[owner:honest]", b"h" * 200, exp)
    held = dict(storage.get(_k("a")).value.items())
    assert b"[owner:honest]" in held and len(held) == 2
    # ... and a large record cannot push the small ones out.
    assert not storage.store_subkey(_k("a"), b"[owner:flood3]", b"x" * 500, exp)
    assert b"[owner:honest]" in dict(storage.get(_k("a")).value.items())
    assert storage.refusals.counts["evicted_for_smaller"] >= 1


def test_an_index_shard_holds_only_records_of_its_own_peers(key) -> None:
    v = _validator(key)
    me, w = _peer(key), _window()
    mine = keys.index_shard(me, 3)
    assert v.validate(_owned(v, key, keys.rollout_index_key(SWARM, w, 3, mine), _index(me, w)))
    other = (mine + 1) % 8
    assert not v.validate(_owned(v, key, keys.rollout_index_key(SWARM, w, 3, other), _index(me, w)))
    assert not v.validate(_owned(v, key, keys.rollout_index_key(SWARM, w, 3, mine), _index(me, w - 1)))
