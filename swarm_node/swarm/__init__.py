"""The swarm layer: a bytes-level Transport (hivemind DHT or in-memory), node identity, the rollout
exchange and seeded prompt sets.

`dht` and `identity` import hivemind; import them explicitly (`swarm_node.swarm.dht`) so that code
running without a swarm never loads it.
"""

from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.transport import BlobFetch, DropCounter, OwnedValue, Transport

__all__ = ["BlobFetch", "DropCounter", "MemorySwarm", "MemoryTransport", "OwnedValue", "Transport"]
