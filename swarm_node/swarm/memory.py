"""An in-process Transport with the DHT's semantics, for unit tests of everything above the network.

Several `MemoryTransport`s attach to one `MemorySwarm` (the shared store). Semantics mirror
HivemindTransport: a node writes only its own subkey (owner id = its peer id), a later store
replaces the owner's previous value only if it expires later (hivemind keeps the newest
expiration), expired records vanish, blobs are content-addressed and hash-checked on fetch,
the same size limits apply.

Test hooks on `MemorySwarm` let a test play a misbehaving peer: `forge_owned` writes under
someone else's owner id (rejected, as the signature validator would), `write_raw_owned` writes
arbitrary bytes as a given owner (what a peer with its own valid key can always do),
`corrupt_blob` swaps a blob's bytes, and `unreachable` holds digests whose fetch times out.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from swarm_node.swarm.transport import (
    BAD_DIGEST,
    FETCH_TIMEOUT,
    MISSING,
    BlobFetch,
    DropCounter,
    OwnedValue,
    Transport,
    check_blob,
    check_blob_put,
    check_owned_value,
    is_digest,
)


class MemorySwarm:
    """The shared store. `clock` returns DHT time; pass a settable one to test expiry."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._owned: dict[str, dict[str, OwnedValue]] = {}
        self._blobs: dict[str, tuple[bytes, float]] = {}
        self.unreachable: set[str] = set()
        self.members: dict[str, Any] = {}  # peer id -> MemoryTransport (pings)
        self.rejected_forgeries = 0

    # -- used by MemoryTransport ------------------------------------------------------------
    def store_owned(self, key: str, owner: str, value: bytes, expiration_time: float) -> bool:
        with self._lock:
            entries = self._owned.setdefault(key, {})
            old = entries.get(owner)
            if old is not None and old.expiration_time > expiration_time and old.expiration_time > self.clock():
                return False  # hivemind keeps the record that expires later
            entries[owner] = OwnedValue(value, expiration_time)
            return True

    def get_owned(self, key: str) -> dict[str, OwnedValue]:
        now = self.clock()
        with self._lock:
            entries = self._owned.get(key, {})
            return {o: v for o, v in entries.items() if v.expiration_time > now}

    def put_blob(self, digest: str, data: bytes, expiration_time: float) -> None:
        with self._lock:
            old = self._blobs.get(digest)
            if old is None or old[1] < expiration_time:
                self._blobs[digest] = (data, expiration_time)

    def get_blob(self, digest: str) -> bytes | None:
        with self._lock:
            item = self._blobs.get(digest)
        if item is None or item[1] <= self.clock():
            return None
        return item[0]

    # -- hooks for tests that play a misbehaving peer --------------------------------------
    def forge_owned(self, key: str, claimed_owner: str, value: bytes, expiration_time: float, *, signer: str) -> bool:
        """Try to write `claimed_owner`'s subkey with `signer`'s key: rejected unless they match."""
        if claimed_owner != signer:
            self.rejected_forgeries += 1
            return False
        return self.store_owned(key, claimed_owner, value, expiration_time)

    def write_raw_owned(self, key: str, owner: str, value: bytes, expiration_time: float) -> None:
        """Write arbitrary bytes (no size check) as `owner`: a peer with a valid key can do that."""
        with self._lock:
            self._owned.setdefault(key, {})[owner] = OwnedValue(value, expiration_time)

    def write_raw_blob(self, digest: str, data: bytes, expiration_time: float) -> None:
        """Store `data` under `digest` without checking (poisoned or oversized blobs)."""
        with self._lock:
            self._blobs[digest] = (data, expiration_time)

    def corrupt_blob(self, digest: str) -> None:
        with self._lock:
            data, exp = self._blobs[digest]
            self._blobs[digest] = (bytes([data[0] ^ 0xFF]) + data[1:] if data else b"x", exp)

    def blob_count(self) -> int:
        with self._lock:
            return len(self._blobs)


class MemoryTransport(Transport):
    """A node's view of a MemorySwarm. `peer_id` defaults to a fresh random-looking id."""

    def __init__(self, swarm: MemorySwarm, peer_id: str | None = None, clock_offset_s: float = 0.0) -> None:
        self._swarm = swarm
        self.clock_offset_s = clock_offset_s  # this node's clock minus the swarm's (simulated skew)
        swarm.members[self._peer_id_or(peer_id)] = self
        self._peer_id = self._peer_id_or(peer_id)
        self.drops = DropCounter()
        self.traffic = Counter()
        self._closed = False

    def _peer_id_or(self, peer_id: str | None) -> str:
        if getattr(self, "_peer_id", None) is None:
            self._peer_id = peer_id or "mem-" + hashlib.sha256(
                str(id(self)).encode() + str(time.time_ns()).encode()).hexdigest()[:16]
        return self._peer_id

    @property
    def peer_id(self) -> str:
        return self._peer_id

    @property
    def public_key(self) -> bytes:
        return f"memory-key:{self._peer_id}".encode()

    def dht_time(self) -> float:
        return self._swarm.clock() + self.clock_offset_s

    def ping_clocks(self, peers: Sequence[tuple[str, Sequence[str]]], timeout: float) -> list[tuple[str, float, float, float]]:
        out = []
        for peer_id, _addrs in peers:
            other = self._swarm.members.get(peer_id)
            if other is None or other is self or other._closed or peer_id in self._swarm.unreachable:
                continue
            sent = self.dht_time()
            out.append((peer_id, sent, other.dht_time(), self.dht_time()))
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("transport is shut down")

    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        self._check_open()
        check_owned_value(value, expiration_time, self.dht_time())
        self.traffic["bytes_out"] += len(value)
        self.traffic["records_stored"] += 1
        return self._swarm.store_owned(key, self._peer_id, value, expiration_time)

    def get_all_many(self, keys: Sequence[str], timeout: float) -> dict[str, dict[str, OwnedValue]]:
        self._check_open()
        out = {key: self._swarm.get_owned(key) for key in keys}
        self.traffic["bytes_in"] += sum(len(v.value) for entries in out.values() for v in entries.values())
        self.traffic["records_fetched"] += len(keys)
        return out

    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        self._check_open()
        digest = check_blob_put(data, expiration_time, self.dht_time())
        self._swarm.put_blob(digest, data, expiration_time)
        self.traffic["bytes_out"] += len(data)
        self.traffic["blobs_stored"] += 1
        return digest

    def get_blobs(self, digests: Sequence[str], timeout: float) -> BlobFetch:
        self._check_open()
        result = BlobFetch()
        for digest in dict.fromkeys(digests):
            if not is_digest(digest):
                result.failed[digest] = BAD_DIGEST
            elif digest in self._swarm.unreachable:
                result.failed[digest] = FETCH_TIMEOUT
            if digest in result.failed:
                continue
            data = self._swarm.get_blob(digest)
            if data is None:
                result.failed[digest] = MISSING
                continue
            self.traffic["bytes_in"] += len(data)
            self.traffic["blobs_fetched"] += 1
            reason = check_blob(digest, data)
            if reason is None:
                result.found[digest] = data
            else:
                result.failed[digest] = reason
                self.drops.add(reason)
        return result

    def shutdown(self) -> None:
        self._closed = True
