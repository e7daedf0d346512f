"""Self-healing membership: a node that has been without live peers for a while re-dials the peers it
knows, with backoff, until it has them again.

hivemind uses its initial peers only at start and does not refresh its routing table, and a peer
that fails one request is dropped from the table. After an outage longer than a few requests (a
link down for a minute, a laptop asleep) both sides have forgotten each other and nobody dials:
the node trains alone for good. `MembershipKeeper` runs beside the DHT (a daemon thread in the
node's process) and every `check_interval_s`:

1. reads the DHT's health (routing table size, peers with a live connection, their addresses) and
   remembers every peer it sees (at most `max_known` most recent: the last-seen peers);
2. when fewer than `min_peers` are live, or the routing table holds fewer, for `heal_after_s`,
   re-dials the initial peers, the last-seen peers and addresses learnt elsewhere (`remember`,
   e.g. from status records), then waits `backoff` before the next try: `backoff_base_s`,
   doubling per failed try up to `backoff_max_s`, back to the base once the node has peers.

With the defaults (check every 3 s, heal after 6 s, backoff at most 12 s) a node is re-joined
within about 15 s of the link coming back, whatever the outage's length: well inside a window.
The keeper is also what `status` / `dashboard` observers and `swarm-node bootstrap` run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarm_node import metric_names as m
from swarm_node.swarm.periodic import PeriodicThread

log = logging.getLogger(__name__)


@dataclass
class Health:
    """One reading of the DHT's membership (see dht_process.health_in_dht)."""

    live_peers: int
    routing_table_size: int
    peers: dict[str, list[str]] = field(default_factory=dict)  # peer id -> multiaddrs (may be empty)
    stored_keys: int = 0  # DHT keys this peer holds for the swarm
    collected_calls: int = 0  # DHT calls lost in the DHT process so far (dht_process._drop_collected_calls)


class Dialer(Protocol):
    """What the keeper needs from a transport (HivemindTransport implements it)."""

    peer_id: str

    def read_health(self, timeout: float) -> Health | None: ...

    def redial(self, peers: Sequence[tuple[str, list[str]]], timeout: float) -> int: ...


def split_peer_maddr(maddr: str) -> tuple[str, str] | None:
    """'/ip4/../tcp/../p2p/<id>' -> (id, '/ip4/../tcp/..'); None without a /p2p/ part. A relay
    circuit ('.../p2p/<relay>/p2p-circuit/p2p/<id>') keeps everything before the last /p2p/."""
    head, sep, peer = str(maddr).rpartition("/p2p/")
    if not sep or not peer or "/" in peer:
        return None
    return peer, head


def own_maddrs(peer_id: str, maddrs: Sequence[str], limit: int = 8) -> list[str]:
    """The addresses of a peer's status record that lead to that peer (`.../p2p/<peer_id>`), at most
    `limit`: a record vouches for its own addresses only, so a flood of records cannot fill a
    keeper's re-dial candidates with other hosts' addresses (or make it dial them)."""
    own = [m for m in maddrs if (split := split_peer_maddr(m)) is not None and split[0] == peer_id]
    return own[:limit]


@dataclass
class KeeperStats:
    redials: int = 0  # re-dial rounds run
    redialed_peers: int = 0  # peers that answered a re-dial
    alone_since: float | None = None  # monotonic time since which the node has had too few peers
    last: Health | None = None


class MembershipKeeper(PeriodicThread):
    """See module doc. `tick()` is one check (tests drive it with a fake dialer and clock)."""

    thread_name = "membership"

    def __init__(self, dialer: Dialer, initial_peers: Sequence[str] = (), *, min_peers: int = 1,
                 check_interval_s: float = 3.0, heal_after_s: float = 6.0, backoff_base_s: float = 2.0,
                 backoff_max_s: float = 12.0, dial_timeout_s: float = 10.0, max_known: int = 64,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dialer = dialer
        self.min_peers = min_peers
        self.check_interval_s = check_interval_s
        self.heal_after_s = heal_after_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.dial_timeout_s = dial_timeout_s
        self.max_known = max_known
        self.clock = clock
        self.stats = KeeperStats()
        self._initial: dict[str, list[str]] = {}
        for maddr in initial_peers:
            self._add(self._initial, maddr)
        self._known: OrderedDict[str, list[str]] = OrderedDict()
        self._backoff = backoff_base_s
        self._next_try = 0.0
        self._lock = threading.Lock()
        self._init_thread()

    # ---- what the keeper knows ------------------------------------------------------------

    @staticmethod
    def _add(book: dict[str, list[str]], maddr: str) -> None:
        split = split_peer_maddr(maddr)
        if split is not None:
            addrs = book.setdefault(split[0], [])
            if split[1] and split[1] not in addrs:
                addrs.append(split[1])

    def remember(self, maddrs: Sequence[str]) -> None:
        """Addresses learnt elsewhere (status records, a peer's announcement): re-dial candidates."""
        with self._lock:
            for maddr in maddrs:
                split = split_peer_maddr(maddr)
                if split is None or split[0] == self.dialer.peer_id:
                    continue
                self._see(split[0], [split[1]] if split[1] else [])

    def _see(self, peer: str, addrs: list[str]) -> None:
        known = self._known.pop(peer, [])
        self._known[peer] = list(dict.fromkeys([*addrs, *known]))[:8]
        while len(self._known) > self.max_known:
            self._known.popitem(last=False)

    def candidates(self) -> list[tuple[str, list[str]]]:
        """Initial peers first, then last-seen peers, most recent first; one entry per peer id."""
        with self._lock:
            out = {p: list(a) for p, a in self._initial.items()}
            for peer in reversed(self._known):
                out.setdefault(peer, [])
                out[peer] = list(dict.fromkeys([*out[peer], *self._known[peer]]))
        out.pop(self.dialer.peer_id, None)
        return list(out.items())

    # ---- one check ------------------------------------------------------------------------

    def lonely(self, health: Health) -> bool:
        return health.live_peers < self.min_peers or health.routing_table_size < self.min_peers

    def tick(self) -> Health | None:
        health = self.dialer.read_health(timeout=min(5.0, self.check_interval_s + 2.0))
        if health is None:  # the DHT process was too busy to answer: try again next tick
            return None
        now = self.clock()
        with self._lock:
            self.stats.last = health
            for peer, addrs in health.peers.items():
                if peer != self.dialer.peer_id:
                    self._see(peer, addrs)
        if not self.lonely(health):
            if self.stats.alone_since is not None:
                log.info("swarm membership: %d live peers, routing table %d (was alone)",
                         health.live_peers, health.routing_table_size)
            self.stats.alone_since, self._backoff, self._next_try = None, self.backoff_base_s, 0.0
            return health
        if self.stats.alone_since is None:
            self.stats.alone_since = now
        if now - self.stats.alone_since < self.heal_after_s or now < self._next_try:
            return health
        candidates = self.candidates()
        if not candidates:
            return health
        answered = self.dialer.redial(candidates, timeout=self.dial_timeout_s)
        self.stats.redials += 1
        self.stats.redialed_peers += answered
        log.log(logging.INFO if answered else logging.DEBUG, "re-dialled %d known peers: %d answered",
                len(candidates), answered)
        self._backoff = self.backoff_base_s if answered else min(self._backoff * 2, self.backoff_max_s)
        self._next_try = self.clock() + self._backoff
        return health

    def snapshot(self) -> dict[str, Any]:
        """Health numbers for a step's metrics (what the last check saw)."""
        last = self.stats.last
        out = {m.ALONE_SECONDS: 0.0 if self.stats.alone_since is None else self.clock() - self.stats.alone_since,
               m.REDIALS: float(self.stats.redials)}
        if last is not None:
            out.update({m.LIVE_PEERS: float(last.live_peers), m.ROUTING_TABLE_SIZE: float(last.routing_table_size),
                        m.STORED_KEYS: float(last.stored_keys), m.DHT_CALLS_COLLECTED: float(last.collected_calls)})
        return out
