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

Hygiene against hostile writers (docs/method.md, hostile peers), all pure functions of the record and DHT
time, so they hold on store and on read alike:

* `SwarmRecordValidator` refuses an expiration beyond now + `max_ttl_s` (a record cannot squat a
  key for days, a ghost peer cannot sit at step 999999 for ever);
* `OwnedRecordValidator` stores owned records only under keys of the swarm's key schedule (the
  `OwnedKeySchedule`, e.g. `index.owned_key_schedule`, is the single source of truth) or under
  the manifest key of the prompt set their value names (a manifest or its tombstone); the value must decode as a bounded
  message of the key's kind (`RolloutIndex` / `NodeStatus`) signed by its own sender.

Caps that need the state of a replica (subkeys and bytes per key, bytes and records per peer,
which records a full key keeps) live in the storage (`storage.CappedStorage`, installed in the DHT
process). Refusals are counted and logged at most once a minute (`RefusalLog`), so a flood shows in
the node's log. The reader's side of the
subkey format: `owner_of_subkey` and `owned_values` (a read of an owned key as {owner: value}).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

import pydantic.v1 as pydantic_v1
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils import get_dht_time

from protocol import codec, keys
from protocol.messages import NodeStatus, PromptSetManifest, PromptSetTombstone, ProtocolError, RolloutIndex
from swarm_node.swarm.identity import owner_id
from swarm_node.swarm.transport import MAX_BLOB_BYTES, MAX_RECORD_BYTES, OwnedValue, blob_digest

logger = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"^\[owner:(.+)\]$", re.DOTALL)
_INDEX_KEY_RE = re.compile(r"/rollouts/(\d+)(?:/(\d+)\.(\d+))?$")
OwnedKeySchedule = Callable[[float], Iterable[str]]
DEFAULT_MAX_TTL_S = 3600.0
MAX_OWNED_INDEX_ENTRIES = 256  # = exchange.MAX_INDEX_ENTRIES (a writer never lists more)


class RefusalLog:
    """Counts refused records by reason and logs a summary at most once per `interval_s`."""

    def __init__(self, what: str, interval_s: float = 60.0) -> None:
        self.what, self.interval_s = what, interval_s
        self.counts: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()
        self._logged_at = float("-inf")

    def add(self, reason: str) -> None:
        self.counts[reason] += 1
        self._pending[reason] += 1
        now = time.monotonic()
        if now - self._logged_at >= self.interval_s:
            summary = ", ".join(f"{k} {v}" for k, v in self._pending.most_common())
            logger.warning("DHT refused %s (since last report): %s", self.what, summary)
            self._pending.clear()
            self._logged_at = now


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
    """hivemind's RSASignatureValidator, verifying each distinct signed record once. A protected
    record without its owner's valid signature (a record written under another peer's subkey: a
    forged status record and its receipts, say) is refused and counted as `bad_signature`."""

    def __init__(self, private_key: RSAPrivateKey | None = None) -> None:
        super().__init__(private_key)
        self._cache = VerdictCache()
        self.refusals = RefusalLog("records without their owner's signature")

    def validate(self, record: DHTRecord) -> bool:
        if b"[owner:" not in record.key and b"[owner:" not in (record.subkey or b""):
            return True  # not a protected record (the base class would find no public key)
        ok = self._cache.verdict(record, super().validate)
        if not ok:
            self.refusals.add("bad_signature")
        return ok


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
    """Owned subkeys only, bounded sizes and lifetimes, and blobs that must hash to their own key.

    A record without a subkey is valid only as `keys.chunk_key(swarm_id, sha256(value))`, so a
    DHT runs one swarm's blobs (other swarms' chunks are refused, not mixed in). No record may
    expire later than `max_ttl_s` after now.
    """

    def __init__(self, swarm_id: str, max_ttl_s: float = DEFAULT_MAX_TTL_S) -> None:
        self.swarm_id = keys.check_name(swarm_id)
        self.max_ttl_s = max_ttl_s
        self.refusals = RefusalLog("records")

    def validate(self, record: DHTRecord) -> bool:
        reason = self._reason(record)
        if reason is not None:
            self.refusals.add(reason)
        return reason is None

    def _reason(self, record: DHTRecord) -> str | None:
        if not record.expiration_time <= get_dht_time() + self.max_ttl_s:
            return "expiration_too_far"
        try:
            value = DHTProtocol.serializer.loads(record.value)
        except Exception as e:  # network boundary: any undecodable peer record is simply invalid
            logger.debug("undecodable record value: %s", e)
            return "undecodable"
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            if not isinstance(value, bytes) or len(value) > MAX_BLOB_BYTES:
                return "bad_blob"
            expected = DHTID.generate(source=keys.chunk_key(self.swarm_id, blob_digest(value))).to_bytes()
            return None if expected == record.key else "blob_not_content_addressed"
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
        except Exception:  # network boundary, as above
            return "undecodable"
        if not (isinstance(subkey, bytes) and _OWNER_RE.match(subkey) is not None):
            return "unowned_subkey"
        if not isinstance(value, bytes) or len(value) > MAX_RECORD_BYTES:
            return "bad_owned_value"
        return None


class OwnedRecordValidator(RecordValidatorBase):
    """Owned records only under the swarm's scheduled keys, holding a bounded message of the key's kind.

    * a status shard: a `NodeStatus` whose `peer_id` is the subkey's owner, in the owner's own
      shard (`keys.status_shard`);
    * any other scheduled key (rollout index windows and their shards, whatever else the schedule
      declares): a `RolloutIndex` from the subkey's owner with at most `MAX_OWNED_INDEX_ENTRIES`
      entries, of the key's own window, in a shard its owner belongs to (`keys.index_shard`);
    * off the schedule: only a `PromptSetManifest` or `PromptSetTombstone` stored under the manifest
      key of the prompt set it names (self-certifying, like chunks; signatures are checked by the
      reader, swarm/prompts.py).

    Everything else with a subkey (another swarm's keys, arbitrary keys) is refused. Records without
    a subkey are left to `SwarmRecordValidator` (chunks under the hash of their bytes).
    """

    def __init__(self, swarm_id: str, schedule: OwnedKeySchedule) -> None:
        self.swarm_id = keys.check_name(swarm_id)
        self._schedule = schedule
        self._status_ids = {key_id(k): shard for shard, k in enumerate(keys.status_keys(swarm_id))}
        self._raw_keys: dict[bytes, str] = {}
        self._refreshed_at = -1.0
        self._cache = VerdictCache()
        self._limits = codec.Limits(max_encoded_bytes=MAX_RECORD_BYTES, max_index_entries=MAX_OWNED_INDEX_ENTRIES)
        self.refusals = RefusalLog("owned records")

    def validate(self, record: DHTRecord) -> bool:
        if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
            return True  # a blob: SwarmRecordValidator's
        now = get_dht_time()
        if now - self._refreshed_at >= 1.0:
            self._raw_keys = {key_id(k): k for k in self._schedule(now)}
            self._refreshed_at = now
        ok = self._cache.verdict(record, self._check)
        if not ok:
            self.refusals.add("off_schedule" if record.key not in self._raw_keys else "bad_owned_record")
        return ok

    def _check(self, record: DHTRecord) -> bool:
        try:
            subkey = DHTProtocol.serializer.loads(record.subkey)
            value = DHTProtocol.serializer.loads(record.value)
        except Exception:  # network boundary: undecodable is invalid
            return False
        owner = owner_of_subkey(subkey) if isinstance(subkey, bytes) else None
        if owner is None or not isinstance(value, bytes):
            return False
        try:
            message = codec.decode(value, self._limits)
        except ProtocolError:
            return False
        raw = self._raw_keys.get(record.key)
        if raw is None:
            return isinstance(message, (PromptSetManifest, PromptSetTombstone)) and record.key == DHTID.generate(
                source=keys.prompt_manifest_key(self.swarm_id, message.prompt_set_id)).to_bytes()
        shard = self._status_ids.get(record.key)
        if shard is not None:  # a status shard: the owner's record, in the owner's own shard
            return (isinstance(message, NodeStatus) and message.peer_id == owner
                    and keys.status_shard(owner) == shard)
        if not isinstance(message, RolloutIndex) or message.sender != owner:
            return False
        index_key = _INDEX_KEY_RE.search(raw)  # a window's index, or one shard of it
        if index_key is None:
            return True
        window, level, shard = index_key.groups()
        return int(window) == message.window and (
            level is None or keys.index_shard(owner, int(level)) == int(shard))  # the owner's own shard

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False


@lru_cache(maxsize=1 << 15)
def node_validators(private_key: RSAPrivateKey, swarm_id: str, max_ttl_s: float,
                    owned_keys: OwnedKeySchedule | None) -> list[RecordValidatorBase]:
    """The validators a node's DHT runs, the signature validator first (its `local_public_key` is
    the subkey the node's owned records are signed under): signed subkeys, the swarm's records and
    expirations, and, given the owned-key schedule, owned records only under scheduled keys."""
    validators: list[RecordValidatorBase] = [CachedRSASignatureValidator(private_key),
                                             SwarmRecordValidator(swarm_id, max_ttl_s)]
    if owned_keys is not None:
        validators += [ScheduledKeySchemaValidator(owned_keys), OwnedRecordValidator(swarm_id, owned_keys)]
    return validators


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


def owned_values(found: Any, now: float) -> dict[str, OwnedValue]:
    """A DHT read of an owned key (hivemind's dictionary value, or None) as {owner: value}: entries
    whose subkey names no owner, whose value is not bytes, or that expired by `now` are left out."""
    if found is None or not isinstance(found.value, dict):
        return {}
    entries: dict[str, OwnedValue] = {}
    for subkey, item in found.value.items():
        owner = owner_of_subkey(subkey) if isinstance(subkey, bytes) else None
        if owner is None or not isinstance(item.value, bytes) or item.expiration_time <= now:
            continue
        entries[owner] = OwnedValue(item.value, float(item.expiration_time))
    return entries
