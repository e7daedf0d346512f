"""Web dashboard: live per-node curves and a peer table, served from the swarm's status records."""

from swarm_node.observe.dashboard.server import DashboardServer, SwarmHistory
from swarm_node.observe.dashboard.sources import (
    FakeStatusSource,
    HeldoutSource,
    LedgerSource,
    Status,
    StatusLike,
    StatusSource,
    SyntheticStatusSource,
)

__all__ = ["DashboardServer", "FakeStatusSource", "HeldoutSource", "LedgerSource", "Status", "StatusLike",
           "StatusSource", "SwarmHistory", "SyntheticStatusSource"]
