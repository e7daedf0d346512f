"""Measure this node's clock against the swarm's: ping the peers its status records name (and the
initial peers); each ping answer carries the peer's DHT time (clock.py has the rule and the math)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from protocol.validate import ValidationLimits
from swarm_node.swarm import clock
from swarm_node.swarm.statuses import read_statuses
from swarm_node.swarm.transport import DropCounter, Transport

log = logging.getLogger(__name__)
MAX_PEERS = 16  # pings per measurement: a median over this many is plenty


def probe_targets(transport: Transport, swarm_id: str, initial_peers: Sequence[str],
                  timeout: float) -> list[tuple[str, list[str]]]:
    """(peer id, multiaddrs) of the peers with a status record, then the initial peers; not this node."""
    targets: dict[str, list[str]] = {}
    for st in read_statuses(transport, swarm_id, ValidationLimits(vocab_size=1), DropCounter(), timeout):
        if st.peer_id != transport.peer_id and st.maddrs:  # no address: a client-mode peer, which answers no ping
            targets.setdefault(st.peer_id, list(st.maddrs))
    for addr in initial_peers:
        peer_id = addr.rsplit("/p2p/", 1)[-1]
        if peer_id != transport.peer_id:
            targets.setdefault(peer_id, [addr.rsplit("/p2p/", 1)[0]])
    return list(targets.items())[:MAX_PEERS]


PING_TIMEOUT_S = 3.0  # a peer slower than this to answer a ping is left out (its answer would be vague)


def measure(transport: Transport, swarm_id: str, initial_peers: Sequence[str],
            timeout: float = 10.0) -> clock.ClockEstimate | None:
    """The swarm's clock minus this node's (median over the peers that answered); None if none did.
    `timeout` bounds the status read; the pings take at most PING_TIMEOUT_S more."""
    targets = probe_targets(transport, swarm_id, initial_peers, timeout)
    pings = transport.ping_clocks(targets, min(timeout, PING_TIMEOUT_S)) if targets else []
    samples = [clock.PingSample(*row) for row in pings]
    return clock.estimate(samples)


def check_join_clock(transport: Transport, swarm_id: str, initial_peers: Sequence[str], window_seconds: float,
                     staleness_steps: int, timeout: float = 10.0) -> clock.ClockEstimate | None:
    """At join: raise ClockSkewError beyond the protocol's limit, warn beyond hivemind's 3 s."""
    est = measure(transport, swarm_id, initial_peers, timeout)
    limit = clock.protocol_limit_s(window_seconds, staleness_steps)
    v = clock.verdict(est, limit)
    if v == "refuse":
        raise clock.refusal(est, limit)
    if v == "warn":
        log.warning("this machine's clock is %s: within the rollout windows' %.0f s, but nodes bootstrapping "
                    "through this one are refused beyond %.0f s; %s", est.describe(), limit, clock.HIVEMIND_SKEW_S,
                    clock.SYNC_FIX)
    elif v == "ok":
        log.info("clock: %s", est.describe())
    return est
