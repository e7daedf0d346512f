"""Receipts: what this node did with each sender's groups over a recent span, for its status record.

A node's status record is signed by the node's key (the DHT's owned subkey), so the receipts in it
are the receiver's signed statement of what it did with each sender's groups: groups taken,
samples trained on, samples that carried gradient, samples the filter dropped (and which condition
they met: advantage A <= 0, KL > g) and groups dropped by reason. A sender reads them from every
receiver (`swarm-node status --given`, `given.py`) and learns whether anyone trains on its groups.
What a receipt proves and what it does not: docs/architecture.md, "Receipts".

`ReceiptBook` keeps the counts per sender in a ring of `BUCKETS` time buckets of span_s / BUCKETS
seconds each (the ledger's clock): a record's receipts cover the current bucket and the BUCKETS - 1
before it, and never more than the time since the book started (a restarted node starts a new
span), so the span a record states (`receipts_span_s`) is exact. At most `MAX_SENDERS_PER_BUCKET`
senders are counted per bucket (a flood of identities cannot grow it); later senders of that
bucket are left out of the receipts and counted in `untracked`. The peer ledger (`ledger.py`)
records into it under its lock: the book has none of its own.

`receipts` keeps the senders that gave the most (groups taken, then samples, then groups judged)
up to the record's bound, and per receipt the MAX_RECEIPT_REASONS - 1 commonest drop reasons, the
rest summed under `other` (so is a reason outside the protocol's list, `receipt_rules.DROP_REASONS`);
each receipt is cut down to what `receipt_rules` allows over the record's span (`fit_claims`), so a
sender cannot make this node write a record its readers drop.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.messages import MAX_RECEIPT_REASONS, MAX_RECEIPTS, OTHER_REASON, Receipt
from protocol.receipt_rules import fit_claims, known_reason
from swarm_node.policy.types import SampleStat

BUCKETS = 12
MAX_SENDERS_PER_BUCKET = 1024
DEFAULT_SPAN_S = 3600.0


@dataclass
class Counts:
    """One sender's counts in one bucket (the fields of a `Receipt`)."""

    taken: int = 0
    samples: int = 0
    gradient: int = 0
    filtered: int = 0
    filtered_advantage: int = 0
    filtered_kl: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def add(self, other: Counts) -> None:
        self.taken += other.taken
        self.samples += other.samples
        self.gradient += other.gradient
        self.filtered += other.filtered
        self.filtered_advantage += other.filtered_advantage
        self.filtered_kl += other.filtered_kl
        self.dropped.update(other.dropped)

    def receipt(self, sender: str) -> Receipt:
        return Receipt(sender=sender, taken=self.taken, samples=self.samples, gradient=self.gradient,
                       filtered=self.filtered, filtered_advantage=self.filtered_advantage,
                       filtered_kl=self.filtered_kl, dropped=bounded_reasons(self.dropped))


def bounded_reasons(dropped: Counter[str]) -> tuple[tuple[str, int], ...]:
    """At most MAX_RECEIPT_REASONS (reason, count) pairs, commonest first: the first
    MAX_RECEIPT_REASONS - 1, then the rest summed under `other` (so is a reason outside the
    protocol's list, which a receipt cannot name: `receipt_rules.DROP_REASONS`)."""
    named: Counter[str] = Counter()
    for reason, n in dropped.items():
        if n > 0:
            named[known_reason(reason)] += n
    ranked = sorted(((k, n) for k, n in named.items() if k != OTHER_REASON), key=lambda kn: (-kn[1], kn[0]))
    rest = named[OTHER_REASON]
    if len(ranked) + (rest > 0) > MAX_RECEIPT_REASONS:
        keep = MAX_RECEIPT_REASONS - 1
        rest += sum(n for _, n in ranked[keep:])
        ranked = ranked[:keep]
    return tuple(ranked) + (((OTHER_REASON, rest),) if rest else ())


class ReceiptBook:
    """Per-sender counts over the last `span_s` seconds of `clock` (see the module doc)."""

    def __init__(self, span_s: float = DEFAULT_SPAN_S, clock: Callable[[], float] | None = None) -> None:
        if not (math.isfinite(span_s) and span_s > 0):
            raise ValueError(f"span_s must be a positive number of seconds, got {span_s}")
        self.clock = clock or time.time
        self.span_s = span_s
        self.bucket_s = span_s / BUCKETS
        self.started = self.clock()
        self.untracked = 0  # events of senders beyond MAX_SENDERS_PER_BUCKET in their bucket
        self._buckets: dict[int, dict[str, Counts]] = {}

    def _counts(self, sender: str) -> Counts | None:
        now_bucket = math.floor(self.clock() / self.bucket_s)
        for old in [b for b in self._buckets if b <= now_bucket - BUCKETS]:
            del self._buckets[old]
        bucket = self._buckets.setdefault(now_bucket, {})
        counts = bucket.get(sender)
        if counts is None:
            if len(bucket) >= MAX_SENDERS_PER_BUCKET:
                self.untracked += 1
                return None
            counts = bucket[sender] = Counts()
        return counts

    def group(self, sender: str, reason: str | None) -> None:
        """A group (or index record) of `sender` judged: taken (None) or dropped for `reason`."""
        counts = self._counts(sender)
        if counts is not None:
            if reason is None:
                counts.taken += 1
            else:
                counts.dropped[reason] += 1

    def late_drop(self, sender: str, reason: str) -> None:
        """A taken group whose samples were dropped later (a non-finite step): one more drop."""
        self.group(sender, reason)

    def sample(self, stat: SampleStat) -> None:
        """What the trainer measured of one of the sender's samples."""
        counts = self._counts(stat.peer)
        if counts is not None:
            counts.samples += 1
            counts.gradient += int(bool(stat.gradient))
            counts.filtered += int(bool(stat.filtered))
            counts.filtered_advantage += int(bool(stat.filtered and stat.filtered_advantage))
            counts.filtered_kl += int(bool(stat.filtered and stat.filtered_kl))

    def covered_s(self) -> float:
        """The seconds the current counts cover: the ring's buckets, at most since the book started."""
        now = self.clock()
        oldest = (math.floor(now / self.bucket_s) - BUCKETS + 1) * self.bucket_s
        return max(0.0, now - max(oldest, self.started))

    def totals(self) -> dict[str, Counts]:
        """Per sender, its counts summed over the span."""
        now_bucket = math.floor(self.clock() / self.bucket_s)
        out: dict[str, Counts] = {}
        for b, senders in self._buckets.items():
            if b > now_bucket - BUCKETS:
                for sender, counts in senders.items():
                    out.setdefault(sender, Counts()).add(counts)
        return out

    def receipts(self, max_senders: int = MAX_RECEIPTS) -> tuple[float, tuple[Receipt, ...]]:
        """(span in seconds, receipts) for a status record: the `max_senders` senders (at most
        MAX_RECEIPTS) that gave the most, those with groups taken first."""
        totals = self.totals()
        ranked = sorted(totals.items(), key=lambda kv: (-kv[1].taken, -kv[1].samples,
                                                        -(kv[1].taken + sum(kv[1].dropped.values())), kv[0]))
        span = max(0.001, round(self.covered_s(), 3))  # a stated span is never 0
        kept = tuple(fit_claims(c.receipt(s), span) for s, c in ranked[: max(0, min(max_senders, MAX_RECEIPTS))])
        return (span if kept else 0.0), kept
