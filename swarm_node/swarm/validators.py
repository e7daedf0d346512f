"""DHT record validators for a swarm-node DHT (they run inside the DHT process).

Together with hivemind's `RSASignatureValidator` they make the DHT *closed*: a record with a
subkey must be owned (`[owner:<RSA public key>]`, signed by that key) and hold bytes of bounded
size; a record without a subkey must be a content-addressed blob stored under
`keys.chunk_key(swarm_id, sha256(value))`; the keys a schedule declares owned-only (index and
status keys) are additionally checked against a pydantic.v1 schema (`SchemaValidator`).

Verdicts are cached (`VerdictCache`): a reader receives the same signed index record from every
replica it asks, on every read, and replicas see each store again on every republish. Checking
the RSA signature and the schema once per distinct record (key, subkey, value, expiration) keeps
the DHT process's CPU for serving requests; both checks are pure functions of the record (the
schema check of the record together with whether its key is scheduled as owned-only).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from functools import lru_cache

import pydantic.v1 as pydantic_v1
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils import get_dht_time

from protocol import keys
from swarm_node.swarm.identity import owner_id
from swarm_node.swarm.transport import MAX_BLOB_BYTES, MAX_RECORD_BYTES, blob_digest

logger = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"^\[owner:(.+)\]$", re.DOTALL)
OwnedKeySchedule = Callable[[float], Iterable[str]]


class VerdictCache:
    """A bounded map from a record (by its fields and a digest of its value) to a validation verdict.

    Emptied when full (records are short-lived, so old verdicts are rarely needed again).
    """

    def __init__(self, max_entries: int = 16384) -> None:
        self.max_entries = max_entries
        self._verdicts: dict[tuple, bool] = {}

    def verdict(self, record: DHTRecord, check: Callable[[DHTRecord], bool]) -> bool:
        """`check(record)`, computed once per distinct (key, subkey, expiration, value)."""
        record_id = (record.key, record.subkey, record.expiration_time,
                     hashlib.blake2b(record.value, digest_size=16).digest())
        known = self._verdicts.get(record_id)
        if known is not None:
            return known
        if len(self._verdicts) >= self.max_entries:
            self._verdicts.clear()
        self._verdicts[record_id] = result = bool(check(record))
        return result


class CachedRSASignatureValidator(RSASignatureValidator):
    """hivemind's RSASignatureValidator, verifying each distinct signed record once."""

    def __init__(self, private_key: RSAPrivateKey | None = None) -> None:
        super().__init__(private_key)
        self._cache = VerdictCache()

    def validate(self, record: DHTRecord) -> bool:
        if b"[owner:" not in record.key and b"[owner:" not in (record.subkey or b""):
            return True  # not a protected record (the base class would find no public key)
        return self._cache.verdict(record, super().validate)


class OwnedBytesSchema(pydantic_v1.BaseModel):
    """Keys declared owned-only hold `{[owner:<key>]: bytes}` with bounded values."""

    owned: dict[BytesWithPublicKey, pydantic_v1.conbytes(strict=True, max_length=MAX_RECORD_BYTES)]  # type: ignore[valid-type]


class ScheduledKeySchemaValidator(SchemaValidator):
    """SchemaValidator whose set of schema-checked keys is a function of DHT time.

    Index keys change every window, so the raw keys are recomputed (at most once a second) from
    `schedule(now)`; records under those keys must match `OwnedBytesSchema`.
    """

    def __init__(self, schedule: OwnedKeySchedule) -> None:
        super().__init__(OwnedBytesSchema, allow_extra_keys=True)
        self._schedule = schedule
        self._refreshed_at = -1.0
        self._cache = VerdictCache()

    def validate(self, record: DHTRecord) -> bool:
        now = get_dht_time()
        if now - self._refreshed_at >= 1.0:
            self._key_id_to_field_name = {key_id(key): "owned" for key in self._schedule(now)}
            self._refreshed_at = now
        if record.key not in self._key_id_to_field_name:
            return True  # not an owned-only key: the schema has nothing to say (allow_extra_keys)
        return self._cache.verdict(record, super().validate)

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False  # keep the schedule semantics separate from other schema validators


class SwarmRecordValidator(RecordValidatorBase):
    """Owned subkeys only, bounded sizes, and blobs that must hash to their own key.

    A record without a subkey is valid only as `keys.chunk_key(swarm_id, sha256(value))`, so a
    DHT runs one swarm's blobs (other swarms' chunks are refused, not mixed in).
    """

    def __init__(self, swarm_id: str) -> None:
        self.swarm_id = keys.check_name(swarm_id)

    def validate(self, record: DHTRecord) -> bool:
        try:
            value = DHTProtocol.serializer.loads(record.value)
        except Exception as e:  # network boundary: any undecodable peer record is simply invalid
            logger.debug("undecodable record value: %s", e)
            return False
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            if not isinstance(value, bytes) or len(value) > MAX_BLOB_BYTES:
                return False
            expected = DHTID.generate(source=keys.chunk_key(self.swarm_id, blob_digest(value))).to_bytes()
            return expected == record.key
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
        except Exception:  # network boundary, as above
            return False
        return (
            isinstance(subkey, bytes)
            and _OWNER_RE.match(subkey) is not None
            and isinstance(value, bytes)
            and len(value) <= MAX_RECORD_BYTES
        )


@lru_cache(maxsize=1 << 15)
def key_id(key: str) -> bytes:
    """The DHT id of a raw key (cached: a schedule lists thousands of index shard keys every second)."""
    return DHTID.generate(source=key).to_bytes()


@lru_cache(maxsize=4096)
def owner_of_subkey(subkey: bytes) -> str | None:
    """The owner id (peer id) named by an `[owner:<public key>]` subkey, or None."""
    match = _OWNER_RE.match(subkey)
    if match is None:
        return None
    try:
        return owner_id(match.group(1))
    except ValueError:
        return None
