"""The part of a seeded prompt set one node holds and re-stores (swarm/prompt_keeper.py, "Budget").

A node keeps a run of the manifest's chunk list that starts at an offset drawn from its peer id, so
that nodes cover different chunks, as long as the chunks fit the room its budget leaves beside the
manifest. It fetches the chunks once (the transport checks each against its digest) and keeps their
bytes; a chunk that failed is tried again at the next `fill`. The first chunk that does not fit
ends the share there, and the node then holds part of the set (`partial`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from swarm_node.swarm.transport import Transport

__all__ = ["FETCH_BATCH", "ChunkShare", "share_offset"]

FETCH_BATCH = 8  # chunks fetched per request while filling the room


def share_offset(peer_id: str, n_chunks: int) -> int:
    """Where in the chunk list this node's share starts (different nodes, different runs)."""
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") % max(1, n_chunks)


class ChunkShare:
    """This node's share of one manifest's chunks. room: the budget less the manifest's bytes;
    drop: counts a failed fetch by reason (`chunk_<reason>`)."""

    def __init__(self, transport: Transport, digests: Sequence[str], room: int, timeout: float,
                 drop: Callable[[str], None]) -> None:
        start = share_offset(transport.peer_id, len(digests))
        self.digests = [*digests[start:], *digests[:start]]
        self.chunks: dict[str, bytes] = {}  # digest -> verified chunk bytes held
        self.partial = False  # True once the set turned out larger than the room
        self._transport, self._room, self._timeout, self._drop = transport, room, timeout, drop

    def fill(self) -> list[str]:
        """The digests this node keeps alive; fetches whatever of the share is not held yet."""
        room = self._room - sum(map(len, self.chunks.values()))
        missing = [d for d in self.digests if d not in self.chunks]
        for i in range(0, len(missing), FETCH_BATCH):
            batch = missing[i:i + FETCH_BATCH]
            fetched = self._transport.get_blobs(batch, self._timeout)
            for reason in fetched.failed.values():
                self._drop("chunk_" + reason)
            for d in batch:
                data = fetched.found.get(d)
                if data is None:
                    continue  # tried again at the next re-store
                if len(data) > room:  # the room is full: the share ends before this chunk
                    self.digests = self.digests[:self.digests.index(d)]
                    self.partial = True
                    return [s for s in self.digests if s in self.chunks]
                self.chunks[d], room = data, room - len(data)
        return [s for s in self.digests if s in self.chunks]
