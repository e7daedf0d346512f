"""The bytes-level seam between a node and the swarm: owned subkeys, content-addressed blobs, DHT time.

Two kinds of record, both expiring at an absolute DHT time:

* **Owned records**: under a shared key (e.g. the rollout index of one window), each peer writes
  only its own subkey. In the hivemind implementation the subkey is `[owner:<RSA public key>]` and
  the value is signed; peers reject records whose signature does not match the key. `get_all`
  returns `{owner_id: OwnedValue}` with only such valid entries, where `owner_id` is the libp2p
  peer id of the signing key (see `identity.owner_id`): a node's peer id *is* its owner id.
* **Blobs**: immutable payloads under a key derived from the SHA-256 of their bytes
  (`protocol.keys.chunk_key(swarm_id, digest)`); every fetch re-hashes, so a peer cannot
  substitute content.

Size policy: callers split payloads. A blob holds at most `MAX_BLOB_BYTES` (1 MiB, half of
hivemind's 2 MiB unary message limit, leaving room for framing and signatures); `put_blob` raises
ValueError above that because a too-large payload is the caller's bug. An owned record holds at
most `MAX_RECORD_BYTES` (64 KiB): index and status records are small by design.

Everything a *peer* sends is untrusted: fetch failures, oversized or mismatching blobs are
reported as reasons (see `BlobFetch`, `DropCounter`), never raised.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

MAX_BLOB_BYTES = 1 << 20
MAX_RECORD_BYTES = 64 << 10

# Reasons a blob fetch can fail with (also the DropCounter keys the transport produces).
FETCH_TIMEOUT = "fetch_timeout"
HASH_MISMATCH = "hash_mismatch"
OVERSIZED = "oversized"
MISSING = "missing"
BAD_DIGEST = "bad_digest"


class SwarmConnectError(RuntimeError):
    """The DHT could not start or join the swarm (bootstrap peers silent, daemon failed)."""


class DropCounter(Counter):
    """Counts of dropped peer data by reason (`reason -> count`). Merge with `+=` or `update`."""

    def add(self, reason: str, n: int = 1) -> None:
        self[reason] += n

    def as_dict(self) -> dict[str, int]:
        """Plain, sorted dict for status records and logs (zero counts left out)."""
        return {k: int(v) for k, v in sorted(self.items()) if v}


class OwnedValue(NamedTuple):
    """One peer's value under a shared key, with its absolute DHT expiration time."""

    value: bytes
    expiration_time: float


@dataclass
class BlobFetch:
    """Result of fetching several blobs: bytes for those found intact, a reason for the rest."""

    found: dict[str, bytes] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def drops(self) -> DropCounter:
        return DropCounter(self.failed.values())


def blob_digest(data: bytes) -> str:
    """Content address of a blob: SHA-256, lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def is_digest(text: object) -> bool:
    """A content digest: 64 lowercase hex characters."""
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def check_blob(digest: str, data: object) -> str | None:
    """None if `data` is a blob of at most MAX_BLOB_BYTES whose hash is `digest`, else the reason."""
    if not isinstance(data, bytes):
        return HASH_MISMATCH
    if len(data) > MAX_BLOB_BYTES:
        return OVERSIZED
    if blob_digest(data) != digest:
        return HASH_MISMATCH
    return None


class Transport(ABC):
    """What a node needs from the swarm. Implementations: HivemindTransport (dht.py), MemoryTransport.

    Every method that touches the network takes a timeout (seconds) and returns within about it.
    """

    #: Hash mismatches, oversized blobs and similar transport-level drops seen so far.
    drops: DropCounter
    #: Payload bytes this node handed to / received from the swarm: `bytes_out`, `bytes_in`
    #: (values only, before DHT framing, replication and signatures), plus call counts.
    traffic: Counter

    @property
    @abstractmethod
    def peer_id(self) -> str:
        """This node's peer id; also the owner id of the records it stores."""

    @property
    @abstractmethod
    def public_key(self) -> bytes:
        """The public key that signs this node's owned records (OpenSSH form)."""

    @property
    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other peers can use as `initial_peers` (empty for in-memory transports)."""
        return []

    def health(self) -> dict[str, float]:
        """Network health for a step's metrics (`live_peers`, `routing_table_size`, ...: names in
        metric_names.py); empty for a transport that cannot tell (the in-memory one)."""
        return {}

    @abstractmethod
    def dht_time(self) -> float:
        """Current DHT time (seconds); every expiration is an absolute value on this clock."""

    @abstractmethod
    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        """Store `value` under `key` in this node's own subkey, replacing its previous value.

        Returns False if no peer accepted it in time. Raises ValueError if `value` is larger than
        MAX_RECORD_BYTES or `expiration_time` is not in the future (caller bugs).
        """

    @abstractmethod
    def get_all_many(self, keys: Sequence[str], timeout: float) -> dict[str, dict[str, OwnedValue]]:
        """For each key, `{owner_id: OwnedValue}` of its valid, unexpired owned subkeys (may be empty).

        All keys are looked up concurrently within one `timeout`; a key not found in time maps to {}.
        """

    def get_all(self, key: str, timeout: float) -> dict[str, OwnedValue]:
        return self.get_all_many([key], timeout)[key]

    def get_all_many_late(self, keys: Sequence[str], timeout: float
                          ) -> tuple[dict[str, dict[str, OwnedValue]], set[str]]:
        """`get_all_many`, and the keys that did not answer within `timeout` (their {} means
        "unknown", not "empty"). Transports that cannot time out report none."""
        return self.get_all_many(keys, timeout), set()

    @abstractmethod
    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        """Store an immutable blob; returns its digest. Raises ValueError above MAX_BLOB_BYTES.

        Storing the same bytes again only extends the expiration (that is how blobs are republished).
        """

    def put_blobs(self, blobs: Sequence[bytes], expiration_time: float, timeout: float = 10.0) -> list[str]:
        """Store several blobs (implementations batch them under one deadline); digests in order."""
        return [self.put_blob(b, expiration_time, timeout) for b in blobs]

    def put_blobs_and_owned(self, blobs: Sequence[bytes], key: str, value: bytes, expiration_time: float,
                            timeout: float = 10.0) -> bool:
        """Store `blobs`, then `value` in this node's subkey of `key` (e.g. chunks, then the index
        that lists them); returns what `store_owned` returns. Implementations may do both in one
        batch (one DHT traversal) under one deadline."""
        self.put_blobs(blobs, expiration_time, timeout)
        return self.store_owned(key, value, expiration_time, timeout)

    @abstractmethod
    def get_blobs(self, digests: Sequence[str], timeout: float) -> BlobFetch:
        """Fetch several blobs concurrently under one deadline; each is hash-checked.

        Failures carry a reason: `fetch_timeout`, `missing`, `hash_mismatch`, `oversized`,
        `bad_digest` (not 64 lowercase hex characters).
        Mismatching and oversized blobs are also counted in `self.drops`.
        """

    def get_blob(self, digest: str, timeout: float) -> bytes | None:
        """One blob, or None (missing, late, or not matching its digest)."""
        return self.get_blobs([digest], timeout).found.get(digest)

    def ping_clocks(self, peers: Sequence[tuple[str, Sequence[str]]], timeout: float) -> list[tuple[str, float, float, float]]:
        """Ping each (peer id, multiaddrs); per answer (peer id, sent, peer's DHT time, received),
        the two local times in this transport's `dht_time` (clock.PingSample). [] where unsupported."""
        return []

    @abstractmethod
    def shutdown(self) -> None:
        """Leave the swarm; bounded in time. Safe to call twice."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def check_owned_value(value: bytes, expiration_time: float, now: float) -> None:
    """Shared argument checks of `store_owned` (raise ValueError on a caller bug)."""
    if not isinstance(value, bytes):
        raise TypeError(f"owned values are bytes, got {type(value).__name__}")
    if len(value) > MAX_RECORD_BYTES:
        raise ValueError(f"owned record of {len(value)} bytes exceeds MAX_RECORD_BYTES={MAX_RECORD_BYTES}")
    if expiration_time <= now:
        raise ValueError(f"expiration_time {expiration_time:.3f} is not after DHT time {now:.3f}")


def check_blob_put(data: bytes, expiration_time: float, now: float) -> str:
    """Shared argument checks of `put_blob`; returns the digest."""
    if not isinstance(data, bytes):
        raise TypeError(f"blobs are bytes, got {type(data).__name__}")
    if len(data) > MAX_BLOB_BYTES:
        raise ValueError(f"blob of {len(data)} bytes exceeds MAX_BLOB_BYTES={MAX_BLOB_BYTES}: split it")
    if expiration_time <= now:
        raise ValueError(f"expiration_time {expiration_time:.3f} is not after DHT time {now:.3f}")
    return blob_digest(data)


def merge_drops(counters: Iterable[Mapping[str, int]]) -> DropCounter:
    total = DropCounter()
    for c in counters:
        total.update(c)
    return total
