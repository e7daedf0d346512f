"""The DHT record validators, exercised in-process on hand-built records (no DHT needed)."""

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
from protocol.messages import NodeStatus  # noqa: E402
from swarm_node.swarm.validators import (  # noqa: E402
    CachedRSASignatureValidator,
    OwnedRecordValidator,
    ScheduledKeySchemaValidator,
    SwarmRecordValidator,
    owner_of_subkey,
)
from swarm_node.swarm.transport import MAX_RECORD_BYTES, blob_digest  # noqa: E402

SWARM = "unit-swarm"
ser = DHTProtocol.serializer


@pytest.fixture(scope="module")
def keys_pair() -> tuple[RSAPrivateKey, RSAPrivateKey]:
    return RSAPrivateKey(), RSAPrivateKey()


def _validator(key: RSAPrivateKey) -> CompositeValidator:
    schedule = lambda now: keys.status_keys(SWARM)  # noqa: E731
    return CompositeValidator([CachedRSASignatureValidator(key), SwarmRecordValidator(SWARM),
                               ScheduledKeySchemaValidator(schedule), OwnedRecordValidator(SWARM, schedule)])


def _status(key: RSAPrivateKey, step: int = 1) -> bytes:
    """An encoded NodeStatus of the owner of `key` (what the status key must hold)."""
    peer = owner_of_subkey(RSASignatureValidator(key).local_public_key)
    return codec.encode(NodeStatus(peer_id=peer, role="trainer", model_id="m", step=step, timestamp=1.0))


def _status_key(key: RSAPrivateKey) -> str:
    """The status shard the owner of `key` writes under."""
    return keys.status_key(SWARM, keys.status_shard(owner_of_subkey(RSASignatureValidator(key).local_public_key)))


def _record(key: str, subkey: object, value: object, exp: float | None = None) -> DHTRecord:
    exp = time.time() + 60 if exp is None else exp
    sub = ser.dumps(subkey) if subkey is not None else DHTProtocol.IS_REGULAR_VALUE
    return DHTRecord(DHTID.generate(source=key).to_bytes(), sub, ser.dumps(value), exp)


def _signed(v: CompositeValidator, record: DHTRecord) -> DHTRecord:
    return dataclasses.replace(record, value=v.sign_value(record))


def test_owned_record_signed_by_owner_is_valid(keys_pair) -> None:
    mine, theirs = keys_pair
    v, v_other = _validator(mine), _validator(theirs)
    owner = RSASignatureValidator(mine).local_public_key
    rec = _signed(v, _record(_status_key(mine), owner, _status(mine)))
    assert v.validate(rec) and v_other.validate(rec)  # any peer accepts the owner's record
    tampered = dataclasses.replace(rec, value=rec.value.replace(b"trainer", b"trainex"))
    assert not v_other.validate(tampered)


def test_cannot_write_another_owners_subkey(keys_pair) -> None:
    mine, theirs = keys_pair
    v_mallory = _validator(theirs)
    victim_subkey = RSASignatureValidator(mine).local_public_key
    forged = _record(_status_key(mine), victim_subkey, _status(mine, step=999999))
    # The mallory validator does not sign a subkey it does not own, so the record has no valid signature.
    assert not _validator(mine).validate(_signed(v_mallory, forged))
    # Signing with mallory's own key and pasting the signature on also fails.
    own = _signed(v_mallory, _record(_status_key(mine), RSASignatureValidator(theirs).local_public_key,
                                     _status(mine, step=999999)))
    sig = own.value[len(forged.value):]
    assert not _validator(mine).validate(dataclasses.replace(forged, value=forged.value + sig))


def test_unowned_subkeys_and_bad_values_are_rejected(keys_pair) -> None:
    mine, _ = keys_pair
    v = _validator(mine)
    owner = RSASignatureValidator(mine).local_public_key
    assert not v.validate(_signed(v, _record("swarm-node/x/anything", b"plain-subkey", b"v")))
    assert not v.validate(_signed(v, _record(_status_key(mine), owner, "a string, not bytes")))
    assert not v.validate(_signed(v, _record(_status_key(mine), owner, b"x" * (MAX_RECORD_BYTES + 1))))


def test_schema_rejects_plain_value_under_owned_only_key(keys_pair) -> None:
    mine, _ = keys_pair
    # A content-addressed-looking blob written directly under the status key: no owner, wrong key.
    assert not _validator(mine).validate(_record(_status_key(mine), None, b"not a blob"))


def test_blob_must_sit_under_its_own_hash(keys_pair) -> None:
    mine, _ = keys_pair
    v = _validator(mine)
    data = b"chunk payload"
    good = _record(keys.chunk_key(SWARM, blob_digest(data)), None, data)
    assert v.validate(good)
    poisoned = _record(keys.chunk_key(SWARM, blob_digest(data)), None, b"other payload")
    assert not v.validate(poisoned)
    other_swarm = _record(keys.chunk_key("elsewhere", blob_digest(data)), None, data)
    assert not v.validate(other_swarm)
    assert not v.validate(_record(keys.chunk_key(SWARM, blob_digest(data)), None, [1, 2, 3]))


def test_verdicts_are_cached_per_distinct_record(keys_pair, monkeypatch) -> None:
    from hivemind.utils.crypto import RSAPublicKey

    mine, theirs = keys_pair
    v, reader = _validator(mine), _validator(theirs)
    owner = RSASignatureValidator(mine).local_public_key
    rec = _signed(v, _record(_status_key(mine), owner, _status(mine)))
    calls = []
    real_verify = RSAPublicKey.verify
    monkeypatch.setattr(RSAPublicKey, "verify", lambda self, data, sig: calls.append(1) or real_verify(self, data, sig))
    assert reader.validate(rec) and reader.validate(rec) and reader.validate(rec)
    assert len(calls) == 1  # the same signed record from three replicas: one RSA verification
    # A different value, subkey or expiration is a different record: checked afresh, and rejected.
    tampered = dataclasses.replace(rec, value=rec.value.replace(b"trainer", b"trainex"))
    later = dataclasses.replace(rec, expiration_time=rec.expiration_time + 1)
    assert not reader.validate(tampered) and not reader.validate(tampered)
    assert not reader.validate(later)
    assert len(calls) == 3


def test_schema_verdict_follows_the_schedule(keys_pair) -> None:
    mine, _ = keys_pair
    owned_now = {"on": True}
    schedule = lambda now: keys.status_keys(SWARM) if owned_now["on"] else []  # noqa: E731
    schema = ScheduledKeySchemaValidator(schedule)
    v = CompositeValidator([CachedRSASignatureValidator(mine), SwarmRecordValidator(SWARM), schema])
    owner = RSASignatureValidator(mine).local_public_key
    bad = _signed(v, _record(_status_key(mine), owner, "not bytes"))
    assert not schema.validate(bad)
    assert not schema.validate(bad)  # cached rejection
    owned_now["on"] = False
    schema._refreshed_at = -1.0  # force the once-a-second schedule refresh
    assert schema.validate(bad)  # no longer a scheduled key: the schema has nothing to say
    # ... but an owned record off the schedule is refused by the key-schedule rule.
    off = OwnedRecordValidator(SWARM, schedule)
    assert not off.validate(_signed(v, _record(_status_key(mine), owner, _status(mine))))
