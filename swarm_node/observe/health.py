"""A node's network health in every step's metrics (and so in its status record and /metrics).

Per step (names in metric_names.py): live peers and routing table size (what the membership keeper last
saw), publish and gather seconds, bytes sent and received, failed index reads and failed stores,
`dropped_<reason>` for the step and `total_dropped_<reason>` since the node started, and
`alone_steps`: consecutive steps without a live peer. When a node has been alone for
`ALONE_WARN_STEPS` steps it logs a warning (again every `ALONE_WARN_STEPS` steps while it lasts);
`status` and the dashboard show the same warning from the status record (`alone_warning`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Protocol

from swarm_node import metric_names as m

log = logging.getLogger(__name__)

ALONE_WARN_STEPS = 3
_TRAFFIC = {m.BYTES_SENT: "bytes_out", m.BYTES_RECEIVED: "bytes_in", m.INDEX_READ_FAILURES: "get_timeouts",
            m.STORE_FAILURES: "store_failures"}


def alone_warning(metrics: Mapping[str, float], warn_steps: int = ALONE_WARN_STEPS) -> str | None:
    """The warning line for a node whose metrics say it has been alone for `warn_steps` steps or more."""
    alone = metrics.get(m.ALONE_STEPS)
    if alone is None or alone < warn_steps:
        return None
    if m.ROUTING_TABLE_SIZE not in metrics:  # a transport without health (the in-memory one)
        return f"alone for {int(alone)} steps: no peer groups received"
    return (f"alone for {int(alone)} steps: no live peer (routing table "
            f"{int(metrics[m.ROUTING_TABLE_SIZE])}); check the network, or swarm.initial_peers "
            "if it never had one")


class NetworkCounters(Protocol):
    """What the tracker reads of a transport (`swarm.transport.Transport`): its traffic counters and
    its health (empty when it cannot tell, as the in-memory one)."""

    traffic: Counter[str]

    def health(self) -> dict[str, float]: ...


class HealthTracker:
    """Turns the transport's counters into per-step health metrics. `transport` may be None (a node
    training alone by config) or report no health (the in-memory one): those fields are then left out."""

    def __init__(self, transport: NetworkCounters | None, warn_steps: int = ALONE_WARN_STEPS) -> None:
        self.transport = transport
        self.warn_steps = warn_steps
        self.alone_steps = 0
        self.total_drops: Counter[str] = Counter()
        self._traffic_seen: dict[str, float] = {}

    def step_metrics(self, step_drops: Mapping[str, int], *, publish_seconds: float,
                     gather_seconds: float, peer_groups: int) -> dict[str, float]:
        self.total_drops.update(step_drops)
        out: dict[str, float] = {m.PUBLISH_SECONDS: publish_seconds, m.GATHER_SECONDS: gather_seconds}
        out.update({m.dropped_name(r): float(n) for r, n in step_drops.items()})
        out.update({m.total_dropped_name(r): float(n) for r, n in self.total_drops.items()})
        if self.transport is None:
            return out
        for name, key in _TRAFFIC.items():
            now = float(self.transport.traffic.get(key, 0))
            out[name] = now - self._traffic_seen.get(key, 0.0)
            self._traffic_seen[key] = now
        health = self.transport.health()
        out.update({k: float(v) for k, v in health.items() if k in (m.LIVE_PEERS, m.ROUTING_TABLE_SIZE)})
        live = health.get(m.LIVE_PEERS)
        alone = (live == 0) if live is not None else peer_groups == 0
        self.alone_steps = self.alone_steps + 1 if alone else 0
        out[m.ALONE_STEPS] = float(self.alone_steps)
        warning = alone_warning(out, self.warn_steps)
        if warning and self.alone_steps % self.warn_steps == 0:
            log.warning(warning)
        return out
