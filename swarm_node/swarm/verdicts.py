"""What a drop says about its sender, and the one verdict on a record that broke several rules.

A receiver checks a peer's record (an index entry before the fetch, a group after it) against every
rule and keeps every reason it fails, never only the first: a reason found early cannot mask one
found later. Each reason says one of four things:

* **a fault** of the sender (every reason not listed below): it lowers the sender's reputation
  share, and enough faults exclude it (`admission.Reputation`);
* **network weather** (`WEATHER_REASONS`: a chunk that timed out or went missing): a fault weighed
  at `WEATHER_WEIGHT`;
* **this node's own rule or budget** (`NEUTRAL_REASONS`): nothing about the sender;
* **honest** (`HONEST_REASONS`): what an honest sender cannot help. `tokenizer_mismatch`: a group
  of another tokenizer without text (its sender has no faithful text, or has not yet seen this
  node's tokenizer: `swarm.send_text`). `stale`: a record whose time agrees with the index it is
  listed in, and with its entry, but lies before the windows this node reads: consistent and merely
  late. A record whose time contradicts its index or its entry is an `index_mismatch` (a fault):
  the exchange checks consistency before age, so a liar cannot reach `stale`.

**The rule.** A drop is honest only when every one of its reasons is honest (or this node's own);
one fault among them makes the whole drop a fault. The drop counters count the record under every
reason it has (`dropped_<reason>`); the ledger, the receipts and the reputation count it once,
under its verdict reason (`verdict_reason`: its first fault, else its first reason).
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.validate import TOKENIZER_MISMATCH

STALE = "stale"

WEATHER_REASONS = frozenset({"fetch_timeout", "missing"})
WEATHER_WEIGHT = 0.25
NEUTRAL_REASONS = frozenset({"over_token_budget", "over_peer_cap", "not_allowed", "excluded_peer", "verify_budget"})
HONEST_REASONS = frozenset({TOKENIZER_MISMATCH, STALE})


def is_fault(reason: str | None) -> bool:
    """Whether a drop for `reason` counts against its sender's reputation."""
    return reason is not None and reason not in NEUTRAL_REASONS and reason not in HONEST_REASONS


def verdict_reason(reasons: Sequence[str]) -> str:
    """The one reason a drop with `reasons` (at least one) is recorded under: its first fault, else its
    first reason. So a record is an honest drop only when none of its reasons is a fault."""
    if not reasons:
        raise ValueError("a drop has at least one reason")
    return next((r for r in reasons if is_fault(r)), reasons[0])
