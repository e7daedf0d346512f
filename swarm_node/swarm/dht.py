"""HivemindTransport: the Transport over a hivemind DHT that runs in its own process.

* The process itself (dht_process.py): `PipeFixedDHT` (hivemind's DHT with the large-message pipe
  fix, a parent-death watchdog and lazy peer-id encoding), its start with retries (`start_dht`)
  and the coroutines it runs.
* Validators (validators.py): signed owned subkeys, schema, blobs under the hash of their bytes,
  expirations at most `max_ttl_s` ahead, owned records only under scheduled keys as the key's kind
  of message; the replica's storage (storage.py) caps keys and peers and keeps each status shard's
  records against newcomers.
* Batched calls: each transport call runs one coroutine inside the DHT process (`get_many` /
  `store_many`, one traversal per batch) rather than one pipe round trip per key.
* Every wait has a deadline: the coroutine bounds itself, the caller's wait has a timeout and
  cancels the future after it; nothing spins.
* Self-healing membership (membership.py) re-dials known peers with backoff after an outage;
  `usable_maddrs` are the addresses others can join through (addresses.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from functools import partial
from typing import Any

from hivemind.utils import get_dht_time

from protocol import keys
from swarm_node.config import SwarmConfig
from swarm_node.swarm.addresses import relay_maddrs, usable_maddrs
from swarm_node.swarm.dht_process import (
    PipeFixedDHT,
    SwarmConnectError,
    check_initial_peers,
    get_many_in_dht,
    health_in_dht,
    ping_clocks_in_dht,
    redial_in_dht,
    refusals_in_dht,
    start_dht,
    store_many_in_dht,
)
from swarm_node.swarm.identity import NodeIdentity
from swarm_node.swarm.index import owned_key_schedule
from swarm_node.swarm.membership import Health, MembershipKeeper
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
from swarm_node.swarm.validators import DEFAULT_MAX_TTL_S, OwnedKeySchedule, key_id, node_validators, owned_values

__all__ = ["HivemindTransport", "PipeFixedDHT", "SwarmConnectError", "check_initial_peers"]


class HivemindTransport(Transport):
    """Transport over a hivemind DHT process. Construct it, use it, `shutdown()` it.

    identity: the node's key (libp2p identity and record signer). swarm_id: namespaces chunk keys.
    owned_keys: raw keys that must hold owned bytes at a given DHT time (index.owned_key_schedule).
    reachability: "public" for a peer at a public address that offers relaying to peers behind
    NAT (`swarm-node bootstrap`); a peer with use_auto_relay (and not client_mode) is "private".
    Startup waits at most `startup_timeout` per attempt, `start_attempts` attempts, then raises
    SwarmConnectError. num_replicas: peers that store each record (hivemind's default 5);
    cache_nearest: 0 stops hivemind re-storing every fetched value on one more peer.
    max_ttl_s: records expiring later than now + this are refused. storage_caps: (subkeys per key,
    bytes per key, bytes per peer) this replica stores at most (None: uncapped;
    each status shard keeps its records).
    """

    def __init__(
        self,
        identity: NodeIdentity,
        swarm_id: str,
        *,
        initial_peers: Sequence[str] = (),
        host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
        announce_maddrs: Sequence[str] = (),
        client_mode: bool = False,
        use_relay: bool = True,
        use_auto_relay: bool = False,
        owned_keys: OwnedKeySchedule | None = None,
        startup_timeout: float = 60.0,
        start_attempts: int = 2,
        wait_timeout: float = 3.0,
        num_replicas: int = 5,
        cache_nearest: int = 0,
        check_identity_free: bool | None = None,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        storage_caps: tuple[int, int, int] | None = (256, 256 << 10, 256 << 10),
        self_heal: bool = True,
        reachability: str | None = None,
    ) -> None:
        self.identity = identity
        self.swarm_id = keys.check_name(swarm_id)
        self.drops = DropCounter()
        self.traffic: Counter = Counter()
        self._initial_peers = check_initial_peers(initial_peers)
        self.client_mode = client_mode
        self.relayed = use_auto_relay and not client_mode
        self._announce = [str(a) for a in announce_maddrs]
        self._send_lock = threading.Lock()  # the DHT's command pipe is not safe for concurrent senders
        self._usable: list[str] = []
        self._maddrs_at: float | None = None
        validators = node_validators(identity.private_key, swarm_id, max_ttl_s, owned_keys)
        self._subkey = validators[0].local_public_key
        kwargs = dict(
            initial_peers=self._initial_peers,
            record_validators=validators,
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) or None,
            client_mode=client_mode,
            use_relay=use_relay,
            use_auto_relay=use_auto_relay,
            # Relaying (addresses.py): libp2p relays only for a peer it believes public; a peer
            # asking for relays is private and reserves a slot at its initial peers.
            force_reachability=reachability or ("private" if self.relayed else None),
            trusted_relays=self._initial_peers if self.relayed else None,
            identity_path=str(identity.path),
            # A key created just now cannot be in use elsewhere: skip the daemon's slow check.
            check_if_identity_free=not identity.created if check_identity_free is None else check_identity_free,
            wait_timeout=wait_timeout,
            num_replicas=num_replicas,
            cache_nearest=cache_nearest,
            # A node reads each chunk once and needs fresh indexes: a local cache would only serve
            # stale indexes and trigger background refresh traffic.
            cache_locally=False,
            cache_on_store=False,
            startup_timeout=startup_timeout,
        )
        caps = None if storage_caps is None else (*storage_caps, [key_id(k) for k in keys.status_keys(swarm_id)])
        self._dht = start_dht(kwargs, startup_timeout, start_attempts, caps)
        self._closed = False
        self.membership = MembershipKeeper(self, self._initial_peers)
        if self_heal:
            self.membership.start()

    @classmethod
    def from_config(cls, cfg: SwarmConfig, identity: NodeIdentity, **overrides: Any) -> HivemindTransport:
        """A transport for a node configured by `cfg` (the `[swarm]` section); `overrides` are
        further keyword arguments (e.g. reachability)."""
        return cls(
            identity,
            cfg.swarm_id,
            initial_peers=cfg.initial_peers,
            host_maddrs=cfg.host_maddrs,
            announce_maddrs=cfg.announce_maddrs,
            client_mode=cfg.client_mode,
            use_relay=cfg.use_relay,
            use_auto_relay=cfg.use_auto_relay,
            owned_keys=owned_key_schedule(cfg.swarm_id, cfg.window_seconds, cfg.staleness_steps),
            startup_timeout=cfg.startup_timeout_s,
            start_attempts=cfg.start_attempts,
            max_ttl_s=cfg.max_record_ttl_s,
            storage_caps=(cfg.max_subkeys_per_key, cfg.max_bytes_per_key, cfg.max_bytes_per_peer),
            **overrides,
        )

    # -- identity --------------------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    @property
    def visible_maddrs(self) -> list[str]:
        """Every address the p2p daemon reports (loopback and private ones included)."""
        with self._send_lock:
            # latest=True: ask the daemon now (relay addresses appear after start)
            fut = self._dht.run_coroutine(partial(PipeFixedDHT._get_visible_maddrs, latest=True), return_future=True)
        return [str(m) for m in fut.result(timeout=30)]

    @property
    def usable_maddrs(self) -> list[str]:
        """The addresses others can join this node through (see addresses.py); [] in client mode.
        Asked afresh at most every 30 s; the last answer stands in when the DHT is too busy."""
        if self.client_mode:
            return []
        if self._maddrs_at is None or time.monotonic() - self._maddrs_at > 30.0:
            try:
                visible = self.visible_maddrs
            except FutureTimeoutError:
                if self._maddrs_at is None:
                    raise
            else:
                relays = relay_maddrs(self._initial_peers, self.peer_id) if self.relayed else []
                self._usable = usable_maddrs([*visible, *relays], announce=self._announce)
                self._maddrs_at = time.monotonic()
        return list(self._usable)

    # -- membership ------------------------------------------------------------------------
    def read_health(self, timeout: float = 5.0) -> Health | None:
        """Ask the DHT process for its routing table and live connections; None if it is busy."""
        self._check_open()
        out = self._call(health_in_dht, timeout)
        if out is None:
            return None
        return Health(live_peers=int(out["live_peers"]), routing_table_size=int(out["routing_table_size"]),
                      peers=dict(out["peers"]), stored_keys=int(out["stored_keys"]),
                      collected_calls=int(out.get("collected_calls", 0)))

    def health(self) -> dict[str, float]:
        return self.membership.snapshot()  # what the keeper last saw: no DHT call

    def redial(self, peers: Sequence[tuple[str, list[str]]], timeout: float) -> int:
        """Connect to and ping each (peer id, multiaddrs); returns how many answered."""
        self._check_open()
        return int(self._call(partial(redial_in_dht, peers=[(p, list(a)) for p, a in peers], timeout=timeout),
                              timeout) or 0)

    def dht_time(self) -> float:
        return get_dht_time()

    def ping_clocks(self, peers: Sequence[tuple[str, Sequence[str]]], timeout: float) -> list[tuple[str, float, float, float]]:
        """Ping each (peer id, multiaddrs) from the DHT process; see Transport.ping_clocks."""
        self._check_open()
        return list(self._call(partial(ping_clocks_in_dht, peers=[(p, list(a)) for p, a in peers], timeout=timeout),
                               timeout) or [])

    # -- batched DHT calls (run inside the DHT process; one traversal per batch) ------------
    def _call(self, coro: Any, timeout: float) -> Any:
        """Run `coro` in the DHT process; None if it does not answer within `timeout` (+ slack)."""
        with self._send_lock:
            fut = self._dht.run_coroutine(coro, return_future=True)
        try:
            return fut.result(timeout=timeout + 2.0)
        except FutureTimeoutError:
            fut.cancel()
            if not self._dht.is_alive():  # our own background process failed: surface it, do not retry
                raise SwarmConnectError(f"the DHT process exited (exit code {self._dht.exitcode})") from None
            return None

    def _get_many(self, keys: list[str], latest: bool, timeout: float) -> tuple[dict[str, Any], set[str]]:
        """(found, late): found maps key -> ValueWithExpiration or None (absent); late keys timed out."""
        if not keys:
            return {}, set()
        found = self._call(partial(get_many_in_dht, keys=keys, latest=latest, timeout=timeout), timeout) or {}
        return found, set(keys) - set(found)

    def _store_many(self, keys: list[str], values: list[bytes], subkeys: list[bytes | None], expiration: float,
                    timeout: float) -> dict[str, bool]:
        """key -> accepted. A store hivemind reports as rejected is read back once to tell a real
        rejection from its last-replica-wins status (a replica that already held the record, e.g. a
        restarted peer reached under its old node id, answers False)."""
        deadline = time.monotonic() + timeout
        result = self._call(partial(store_many_in_dht, keys=keys, values=values, expiration=expiration,
                                    subkeys=subkeys, timeout=timeout), timeout) or {}
        ok = {k: bool(result.get((k, sk) if sk is not None else k)) for k, sk in zip(keys, subkeys)}
        unsure = [k for k in keys if not ok[k]]
        if unsure and result:
            found, _late = self._get_many(unsure, True, max(0.5, deadline - time.monotonic()))
            wanted = dict(zip(keys, subkeys))
            for k in unsure:
                item = found.get(k)
                if item is not None and wanted[k] is not None:
                    item = item.value.get(wanted[k]) if isinstance(item.value, dict) else None
                ok[k] = item is not None and item.expiration_time >= expiration
        self.traffic["store_failures"] += sum(not v for v in ok.values())
        return ok

    # -- owned records ---------------------------------------------------------------------
    def store_owned(self, key: str, value: bytes, expiration_time: float, timeout: float = 10.0) -> bool:
        self._check_open()
        check_owned_value(value, expiration_time, self.dht_time())
        self.traffic["bytes_out"] += len(value)
        self.traffic["records_stored"] += 1
        return self._store_many([key], [value], [self._subkey], expiration_time, timeout)[key]

    def get_all_many(self, keys: Sequence[str], timeout: float) -> dict[str, dict[str, OwnedValue]]:
        return self.get_all_many_late(keys, timeout)[0]

    def get_all_many_late(self, keys: Sequence[str], timeout: float
                          ) -> tuple[dict[str, dict[str, OwnedValue]], set[str]]:
        self._check_open()
        keys = list(dict.fromkeys(keys))
        found, late = self._get_many(keys, True, timeout)
        self.traffic["get_timeouts"] += len(late)
        now = self.dht_time()
        out: dict[str, dict[str, OwnedValue]] = {}
        for key in keys:
            out[key] = owned_values(found.get(key), now)
            self.traffic["bytes_in"] += sum(len(v.value) for v in out[key].values())
            self.traffic["records_fetched"] += 1
        return out, late

    # -- blobs -----------------------------------------------------------------------------
    def put_blob(self, data: bytes, expiration_time: float, timeout: float = 10.0) -> str:
        return self.put_blobs([data], expiration_time, timeout)[0]

    def put_blobs(self, blobs: Sequence[bytes], expiration_time: float, timeout: float = 10.0) -> list[str]:
        """Store several blobs in one batch under one deadline; returns their digests in order.

        A blob no peer accepted in time is counted in `traffic["store_failures"]` (peers that
        later miss it count a `missing` drop); this is network weather, not an error.
        """
        digests, _ = self._put(blobs, None, expiration_time, timeout)
        return digests

    def put_blobs_and_owned(self, blobs: Sequence[bytes], key: str, value: bytes, expiration_time: float,
                            timeout: float = 10.0) -> bool:
        """Blobs and one owned record in a single store batch: one traversal, one deadline."""
        _, owned_ok = self._put(blobs, (key, value), expiration_time, timeout)
        return bool(owned_ok)

    def _put(self, blobs: Sequence[bytes], owned: tuple[str, bytes] | None, expiration_time: float,
             timeout: float) -> tuple[list[str], bool | None]:
        self._check_open()
        now = self.dht_time()
        digests = [check_blob_put(data, expiration_time, now) for data in blobs]
        unique = dict(zip(digests, blobs))
        batch_keys = [keys.chunk_key(self.swarm_id, d) for d in unique]
        values, subkeys = list(unique.values()), [None] * len(unique)
        if owned is not None:
            check_owned_value(owned[1], expiration_time, now)
            batch_keys.append(owned[0])
            values.append(owned[1])
            subkeys.append(self._subkey)
            self.traffic["bytes_out"] += len(owned[1])
            self.traffic["records_stored"] += 1
        ok = self._store_many(batch_keys, values, subkeys, expiration_time, timeout) if batch_keys else {}
        self.traffic["bytes_out"] += sum(len(b) for b in unique.values())
        self.traffic["blobs_stored"] += len(unique)
        return digests, (ok[owned[0]] if owned is not None else None)

    def get_blobs(self, digests: Sequence[str], timeout: float) -> BlobFetch:
        self._check_open()
        out = BlobFetch()
        digests = list(dict.fromkeys(digests))
        for d in [d for d in digests if not is_digest(d)]:
            out.failed[d] = BAD_DIGEST
        by_key = {keys.chunk_key(self.swarm_id, d): d for d in digests if d not in out.failed}
        found, late = self._get_many(list(by_key), False, timeout)
        for key, d in by_key.items():
            if key in late:
                out.failed[d] = FETCH_TIMEOUT
                continue
            item = found.get(key)
            if item is None:
                out.failed[d] = MISSING
                continue
            data = item.value
            self.traffic["bytes_in"] += len(data) if isinstance(data, bytes) else 0
            self.traffic["blobs_fetched"] += 1
            reason = check_blob(d, data)
            if reason is None:
                out.found[d] = data
            else:
                out.failed[d] = reason
                self.drops.add(reason)
        return out

    def dht_refusals(self, timeout: float = 5.0) -> dict[str, int]:
        """Records this node's DHT process refused so far (store and read), by reason."""
        self._check_open()
        return self._call(refusals_in_dht, timeout) or {}

    # -- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("transport is shut down")

    @property
    def is_alive(self) -> bool:
        return not self._closed and self._dht.is_alive()

    @property
    def exit_code(self) -> int | None:
        """The DHT process's exit code once it has ended (None while it runs)."""
        return self._dht.exitcode

    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.membership.stop()
        with self._send_lock:
            self._dht.shutdown()
