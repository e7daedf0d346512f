"""Which tokenizers a swarm holds, as far as this node can tell: the fingerprints in peers' status
records (`NodeStatus.tokenizer_fingerprint`) and in the groups it fetched, each remembered for a
while after it was last seen. `swarm.send_text = "auto"` sends completion text (`wants_text`) while
another tokenizer than this node's is among them, and from its first step until it has read any
peer's fingerprint at all (a status record or a group of another node): a node that starts together
with peers of another tokenizer sends text before their records are read, so that its first groups
can be taken too. A node that then sees only its own tokenizer stops sending text.

A fingerprint is a peer's claim: a peer can make this node send text (about 2 bytes a token more)
by announcing another one, nothing else. Memory is bounded (`MAX_FINGERPRINTS`, oldest forgotten).

Observers (`swarm-node status`, the dashboard, the peer ledger's views) show a fingerprint by its
short label (`tokenizer_label`) and how many peers share it (`tokenizer_shares`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

MAX_FINGERPRINTS = 64


class TokenizerCensus:
    """Fingerprints seen, each forgotten `ttl_s` (DHT seconds) after it was last seen. Thread-safe:
    the gather thread notes, the step thread asks."""

    def __init__(self, own: str, ttl_s: float) -> None:
        self.own = own
        self.ttl_s = ttl_s
        self._seen: dict[str, float] = {}  # fingerprint -> DHT time last seen
        self._statuses_read_at: float | None = None
        self._peer_seen = False  # a fingerprint of another node was noted (ever)
        self._lock = threading.Lock()

    def note(self, fingerprint: str, now: float, *, from_peer: bool = True) -> None:
        """`fingerprint` seen at DHT time `now`; `from_peer` False for this node's own status record."""
        if not fingerprint:
            return  # observers and version-1 status records name none
        with self._lock:
            self._peer_seen = self._peer_seen or from_peer
            self._seen.pop(fingerprint, None)
            self._seen[fingerprint] = now
            while len(self._seen) > MAX_FINGERPRINTS:
                del self._seen[next(iter(self._seen))]  # the least recently seen

    def others(self, now: float) -> list[str]:
        """Fingerprints other than this node's seen within `ttl_s`, most recent last."""
        with self._lock:
            for fp in [fp for fp, t in self._seen.items() if now - t > self.ttl_s]:
                del self._seen[fp]
            return [fp for fp in self._seen if fp != self.own]

    def wants_text(self, now: float) -> bool:
        """`swarm.send_text = "auto"`: another tokenizer was seen within `ttl_s`, or no peer's
        fingerprint was seen yet."""
        others = self.others(now)
        with self._lock:
            return bool(others) or not self._peer_seen

    def statuses_due(self, now: float) -> bool:
        """True (and marks the read) when status records were last read over ttl_s / 3 ago."""
        with self._lock:
            if self._statuses_read_at is not None and now - self._statuses_read_at < self.ttl_s / 3:
                return False
            self._statuses_read_at = now
            return True


LABEL_CHARS = 8  # a fingerprint's label: its first hex digits, enough to tell a swarm's tokenizers apart


def tokenizer_label(fingerprint: str) -> str:
    """A short label of a tokenizer fingerprint for tables ("-" when none is known)."""
    return fingerprint[:LABEL_CHARS] if fingerprint else "-"


def tokenizer_shares(fingerprints: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """Per peer (peer -> fingerprint, "" when unknown): (peers on its tokenizer, peers whose
    tokenizer is known); (0, known) for a peer of unknown tokenizer."""
    counts = Counter(fp for fp in fingerprints.values() if fp)
    known = sum(counts.values())
    return {peer: (counts[fp] if fp else 0, known) for peer, fp in fingerprints.items()}
