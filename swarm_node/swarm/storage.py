"""A replica's storage with caps on owned records (`CappedStorage`), installed in the DHT process.

Hivemind keeps every record a valid store sends. Caps that need the state of a replica live here,
checked at store time: at most `max_subkeys_per_key` live subkeys and `max_bytes_per_key` bytes
under one key, at most `max_bytes_per_peer` bytes and `max_records_per_peer` records from one owner
over all keys (an identity's records; identities are free, so these bound what one costs a
replica, not what many can). A refused store answers False (the writer sees a failed store) and is
counted by reason (`refusals`, logged at most once a minute).

What a full key does depends on the key (docs/method.md, "What a hostile peer can do"):

* a key of `incumbent_keys` (each of the swarm's status shards, `keys.status_keys`) keeps the
  records it holds: a new owner's record into a full key is refused (`key_full`), and a record
  never evicts another that has been held longer. An owner keeps its standing while its record is
  live (a re-store replaces it in place; a re-store that outgrows the key's bytes evicts the
  records held for less time than it, newest first). So no number of fresh identities can push out
  the status records a replica holds: a Sybil flood fills only the room that is free, and honest
  nodes keep re-storing theirs. The room a flood fills is lost to nodes joining later until the
  flood's records lapse (their owners must keep re-storing them). The caps hold per shard: a flood
  ground into one shard fills only that shard's room (the validators refuse a record outside its
  owner's shard).
* any other key (rollout index windows and shards, prompt-set manifests) makes room for a smaller
  record by evicting larger ones, largest first (`evicted_for_smaller`): an index key lives one
  window, so what matters there is that a flood of large records cannot lock out small honest ones.

Install with `CappedStorage.install(...)` in the DHT process (hivemind's protocol builds its storage
by name: `patches.install_storage`).
"""

from __future__ import annotations

from collections.abc import Iterable

from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils import get_dht_time

from swarm_node.swarm.patches import install_storage
from swarm_node.swarm.validators import RefusalLog

__all__ = ["CappedStorage"]

KEY_FULL = "key_full"
RECORDS_PER_PEER = "records_per_peer"


class CappedStorage(DHTLocalStorage):
    """hivemind's local storage with the caps and eviction rules of the module doc."""

    max_subkeys_per_key = 256
    max_bytes_per_key = 256 << 10
    max_bytes_per_peer = 256 << 10
    max_records_per_peer = 256  # a node: its status record, and an index record (or two) per window its records live
    incumbent_keys: frozenset[bytes] = frozenset()  # DHT ids (bytes) of the keys that keep their records
    refusals = RefusalLog("stores over a storage cap")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._by_owner: dict[bytes, dict[DHTID, tuple[int, float]]] = {}  # subkey -> key -> (bytes, expiration)
        self._since: dict[DHTID, dict[bytes, float]] = {}  # incumbent key -> subkey -> held since (DHT time)

    @classmethod
    def install(cls, max_subkeys_per_key: int, max_bytes_per_key: int, max_bytes_per_peer: int,
                incumbent_keys: Iterable[bytes] = (), max_records_per_peer: int = 256) -> None:
        """Make every DHT protocol created from now on (in this process) use capped storage."""
        cls.max_subkeys_per_key, cls.max_bytes_per_key = max_subkeys_per_key, max_bytes_per_key
        cls.max_bytes_per_peer, cls.max_records_per_peer = max_bytes_per_peer, max_records_per_peer
        cls.incumbent_keys = frozenset(incumbent_keys)
        install_storage(cls)

    def store_subkey(self, key: DHTID, subkey, value: bytes, expiration_time: float) -> bool:
        current = self.get(key)
        records = current.value if current is not None and isinstance(current.value, DictionaryDHTValue) else None
        held = records is not None and subkey in records
        reason = self._over_cap(key, records, subkey, len(value))
        if reason is not None:
            self.refusals.add(reason)
            return False
        stored = super().store_subkey(key, subkey, value, expiration_time)
        if stored:
            now = get_dht_time()
            self._by_owner.setdefault(subkey, {})[key] = (len(value), expiration_time)
            if key.to_bytes() in self.incumbent_keys:
                since = self._since.setdefault(key, {})
                live = self.get(key)
                for gone in [sk for sk in since if live is None or sk not in live.value]:
                    del since[gone]  # lapsed or evicted: a later record of that owner starts anew
                since[subkey] = since[subkey] if held and subkey in since else now
            if len(self._by_owner) > 4 * self.max_subkeys_per_key:  # many identities: forget expired ones
                self._by_owner = {sk: recs for sk, recs in self._by_owner.items()
                                  if any(exp > now for _, exp in recs.values())}
        return stored

    def _over_cap(self, key: DHTID, records: DictionaryDHTValue | None, subkey, size: int) -> str | None:
        if size > self.max_bytes_per_key:
            return "bytes_per_key"
        if records is not None:
            make_room = self._keep_incumbents if key.to_bytes() in self.incumbent_keys else self._evict_larger
            reason = make_room(key, records, subkey, size)
            if reason is not None:
                return reason
        now = get_dht_time()
        held = self._by_owner.get(subkey, {})  # (an owner's records evicted elsewhere still count until they expire)
        for k in [k for k, (_, exp) in held.items() if exp <= now]:
            del held[k]
        if key not in held and len(held) >= self.max_records_per_peer:
            return RECORDS_PER_PEER
        if size + sum(n for k, (n, _) in held.items() if k != key) > self.max_bytes_per_peer:
            return "bytes_per_peer"
        return None

    def _keep_incumbents(self, key: DHTID, records: DictionaryDHTValue, subkey, size: int) -> str | None:
        """A new owner only into free room; an owner's re-store may evict records held for less time."""
        others = [(sk, len(item.value)) for sk, item in records.items() if sk != subkey]
        total = sum(n for _, n in others)
        if subkey not in records:
            return KEY_FULL if len(others) >= self.max_subkeys_per_key or total + size > self.max_bytes_per_key else None
        since = self._since.get(key, {})
        mine = since.get(subkey, float("-inf"))
        younger = sorted(((since.get(sk, float("inf")), sk, n) for sk, n in others if since.get(sk, float("inf")) > mine),
                         key=lambda t: t[0], reverse=True)
        evict = []
        while total + size > self.max_bytes_per_key:
            if not younger:
                return KEY_FULL
            _, sk, n = younger.pop(0)
            evict.append(sk)
            total -= n
        for sk in evict:
            del records[sk]
            self.refusals.add("evicted_for_incumbent")
        return None

    def _evict_larger(self, key: DHTID, records: DictionaryDHTValue, subkey, size: int) -> str | None:
        """Evict records larger than `size` (largest first) until one more of `size` fits under the key."""
        others = sorted(((len(item.value), sk) for sk, item in records.items() if sk != subkey), reverse=True)
        total = sum(n for n, _ in others)
        evict = []
        while others and (len(others) >= self.max_subkeys_per_key or total + size > self.max_bytes_per_key):
            n, sk = others[0]
            if n <= size:
                return "subkeys_per_key" if len(others) >= self.max_subkeys_per_key else "bytes_per_key"
            evict.append(sk)
            others.pop(0)
            total -= n
        for sk in evict:
            del records[sk]
            self.refusals.add("evicted_for_smaller")
        return None
