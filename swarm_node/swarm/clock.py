"""How far a node's clock may be off the swarm's, and what a node does about it (pure; no I/O).

Time in the swarm is each machine's own clock ("DHT time" is hivemind's `get_dht_time`, i.e.
`time.time()`); nothing synchronises it. Two rules depend on it:

1. hivemind's bootstrap: a joining DHT pings its initial peers and refuses to start when a peer's
   time differs from its own by more than `HIVEMIND_SKEW_S` (3 s,
   `hivemind.utils.timed_storage.MAX_DHT_TIME_DISCREPANCY_SECONDS`). It applies to client-mode
   peers and observers too.
2. The rollout windows (swarm/binding.py): a group is stamped with its sender's clock and a
   receiver admits windows C - staleness_steps .. C of its own clock. A sender's offset d plus
   the group's age at reading (generation, publishing, the receiver's gather) must stay within
   `staleness_steps x window_seconds` (120 s with the defaults), or the group is `stale` (sender
   behind) or invisible until the receiver's clock reaches its window (sender ahead). Half of
   that span is left to the groups' age: `protocol_limit_s` (60 s with the defaults).

What a node does: it refuses to join when its clock is off by more than a protocol allows, with
one line saying by how much and to synchronise the clock (a node whose groups peers refuse
wastes its own compute and theirs). It does not correct its time from peers: the DHT process's
record expirations, its validators and hivemind's bootstrap check all read the system clock, so
a corrected node clock would disagree with its own DHT. Concretely:

* at start, hivemind's bootstrap check (rule 1) ends a join more than 3 s off its initial peers;
  `start_dht` turns hivemind's `ValidationError` into `ClockSkewError` (this module's line);
* after the DHT is up, the node pings the peers named in the swarm's status records (each answer
  carries the peer's DHT time; offset = peer time - the midpoint of the round trip, median over
  peers) and refuses to go on beyond `protocol_limit_s`, and warns beyond `HIVEMIND_SKEW_S` (new
  nodes bootstrapping through this one would be refused). `swarm-node doctor` runs the same check.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from swarm_node.util.errors import RuntimeFailure

HIVEMIND_SKEW_S = 3.0  # hivemind.utils.timed_storage.MAX_DHT_TIME_DISCREPANCY_SECONDS
SYNC_FIX = ("synchronise this machine's clock (e.g. `sudo timedatectl set-ntp true`, or chronyd/ntpd) "
            "and start again")


class ClockSkewError(RuntimeFailure):
    """This machine's clock is further off the swarm's than the protocol tolerates."""

    def __init__(self, what: str, fix: str | None = SYNC_FIX) -> None:
        super().__init__(what, fix)


def window_tolerance_s(window_seconds: float, staleness_steps: int) -> float:
    """The span a group's sender offset plus its age may take before receivers refuse it."""
    return staleness_steps * window_seconds


def protocol_limit_s(window_seconds: float, staleness_steps: int) -> float:
    """The largest clock offset a node may join with: half the window tolerance (the other half is
    left to a group's age), and never below hivemind's bootstrap limit."""
    return max(HIVEMIND_SKEW_S, window_tolerance_s(window_seconds, staleness_steps) / 2)


@dataclass(frozen=True)
class PingSample:
    """One ping: this node's time when it sent and when the answer came, and the peer's DHT time."""

    peer_id: str
    sent: float
    peer_time: float
    received: float

    @property
    def offset(self) -> float:
        """Peer's clock minus this node's (positive: this node is behind)."""
        return self.peer_time - (self.sent + self.received) / 2

    @property
    def rtt(self) -> float:
        return self.received - self.sent


@dataclass(frozen=True)
class ClockEstimate:
    offset_s: float  # the swarm's clock minus this node's (median over peers); positive: behind
    peers: int
    max_rtt_s: float

    def describe(self) -> str:
        side = "behind" if self.offset_s > 0 else "ahead of"
        return (f"{abs(self.offset_s):.1f} s {side} the swarm (median of {self.peers} peer"
                f"{'s' if self.peers != 1 else ''}, round trips <= {self.max_rtt_s * 1000:.0f} ms)")


def estimate(samples: Sequence[PingSample]) -> ClockEstimate | None:
    """The median offset over peers (one bad peer clock does not move it); None without samples."""
    usable = [s for s in samples if s.rtt >= 0]
    if not usable:
        return None
    return ClockEstimate(offset_s=statistics.median(s.offset for s in usable), peers=len(usable),
                         max_rtt_s=max(s.rtt for s in usable))


def verdict(est: ClockEstimate | None, limit_s: float) -> str:
    """"ok", "warn" (beyond hivemind's 3 s: peers bootstrapping through this node are refused),
    "refuse" (beyond `limit_s`) or "unknown" (no peer answered)."""
    if est is None:
        return "unknown"
    off = abs(est.offset_s)
    if off > limit_s:
        return "refuse"
    return "warn" if off > HIVEMIND_SKEW_S else "ok"


def refusal(est: ClockEstimate, limit_s: float) -> ClockSkewError:
    return ClockSkewError(f"this machine's clock is {est.describe()}; the swarm's rollout windows tolerate "
                          f"{limit_s:.0f} s (swarm.window_seconds x swarm.staleness_steps / 2)")


def bootstrap_refusal(message: str, initial_peers: Sequence[str]) -> ClockSkewError:
    """hivemind's bootstrap refused an initial peer's time (its message names both times)."""
    return ClockSkewError(f"this machine's clock differs from the initial peer's by more than {HIVEMIND_SKEW_S:.0f} s, "
                          f"so the DHT refuses to join ({message.strip()}; initial peers: {', '.join(initial_peers)})")
