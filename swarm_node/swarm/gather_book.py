"""The books of a node's gathers: which peer records were seen, taken and dropped, and where each counts.

`RolloutExchange.fetch_groups` (exchange.py) judges peers' index records, index entries and groups;
a `GatherBook` remembers the verdicts across gathers and counts each one:
* index entries taken, or rejected and counted (`seen_digests`), groups taken (`seen_groups`, by
  sender, prompt and policy version) and bad index records (`bad_indexes`) are not judged again;
  every table keeps the window an item was seen in, and `forget_before` forgets the windows no
  longer read, so the memory stays bounded;
* an entry whose chunks time out is tried again later; one whose chunks are missing gets one more
  try (chunks and index are stored in one batch, so a reader can see the index first) and then
  counts as `missing` (`fetch_failed`);
* a drop is counted under every reason it has in the gather's `DropCounter`, and once, under its
  verdict reason (`verdicts.verdict_reason`: its first fault, else its first reason), in the
  `Admission`'s reputation (unless it is this node's own rule, no verdict on the peer's data) and
  in the `ledger` (`ledger.PeerLedger`); a group that was fetched (it held a slot of the gather)
  and dropped is also a miss of its sender (`Reputation.record_miss`); a taken group feeds the
  reputation too (`take`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protocol.messages import RolloutGroup
from swarm_node.swarm.admission import Admission
from swarm_node.swarm.transport import FETCH_TIMEOUT, MISSING, DropCounter
from swarm_node.swarm.verdicts import verdict_reason


class GatherBook:
    """What earlier gathers saw, by window, and the counting of each drop and take."""

    def __init__(self, admission: Admission | None, ledger: Any | None) -> None:
        self.admission = admission
        self.ledger = ledger
        self.seen_digests: dict[tuple[str, ...], int] = {}  # taken or rejected entries -> window
        self.seen_groups: dict[tuple[str, int, int], int] = {}  # (sender, prompt, policy) -> window
        self.bad_indexes: dict[tuple[str, str], int] = {}  # (owner, digest of record) -> window
        self.missing_once: dict[tuple[str, ...], int] = {}  # entries whose chunks were missing once
        # (owner, window) whose index listed an admissible entry: the owners the swarm-size estimate counts
        self.vouched: dict[tuple[str, int], int] = {}

    def drop(self, drops: DropCounter, reasons: str | Sequence[str], owner: str, verdict: bool = True,
             tokenizer: str = "", fetched: bool = False) -> None:
        """A record of `owner` dropped for `reasons` (one or several): each counted in `drops`, the
        verdict reason in the reputation (`verdict`: a judgement of the peer's data) and the ledger;
        `fetched`: it held a slot of this gather, a miss of its sender."""
        reasons = (reasons,) if isinstance(reasons, str) else tuple(reasons)
        for reason in reasons:
            drops.add(reason)
        reason = verdict_reason(reasons)
        if verdict and self.admission is not None:
            self.admission.record(owner, reason)
            if fetched:
                self.admission.record_miss(owner, reason)
        if self.ledger is not None:
            self.ledger.record_group(owner, reason, tokenizer)

    def reject_index(self, drops: DropCounter, reason: str, owner: str, record_id: tuple[str, str],
                     window: int) -> None:
        """A bad index record: counted when first seen, then skipped while its window is read."""
        if record_id not in self.bad_indexes:
            self.drop(drops, reason, owner)
            self.bad_indexes[record_id] = window

    def reject_entry(self, drops: DropCounter, reasons: Sequence[str], owner: str, digests: tuple[str, ...],
                     window: int, tokenizer: str = "") -> None:
        """An index entry refused before its chunks were fetched: counted once, not judged again."""
        self.drop(drops, reasons, owner, tokenizer=tokenizer)
        self.seen_digests[digests] = window

    def fetch_failed(self, drops: DropCounter, reason: str, owner: str, digests: tuple[str, ...],
                     window: int) -> None:
        """An entry whose chunks did not all arrive (`reason`: the first failure among them)."""
        if reason == MISSING and digests not in self.missing_once:
            # Chunks and index are stored together, and replicas lag: a chunk missing at
            # the first attempt may be there next time. Counted if it is missing again.
            self.missing_once[digests] = window
            del self.seen_digests[digests]
            return
        if reason == FETCH_TIMEOUT:
            del self.seen_digests[digests]  # may be fetched again next time
        self.drop(drops, reason, owner, fetched=True)

    def take(self, group: RolloutGroup, owner: str, window: int) -> None:
        """A group taken: the same (sender, prompt, policy version) is a duplicate from now on."""
        self.seen_groups[(group.sender, group.prompt.index, group.policy_version)] = window
        if self.admission is not None:
            self.admission.record(owner, None)

    def vouch(self, owner: str, window: int) -> None:
        """`owner`'s index of `window` listed an entry that passed the checks before fetching."""
        self.vouched[(owner, window)] = window

    def forget_before(self, oldest_window: int) -> None:
        """Bound the duplicate memory: entries of windows no longer read can be forgotten."""
        for table in (self.seen_digests, self.seen_groups, self.bad_indexes, self.missing_once, self.vouched):
            for k in [k for k, w in table.items() if w < oldest_window]:
                del table[k]
        if self.admission is not None:
            self.admission.forget_before(oldest_window)
