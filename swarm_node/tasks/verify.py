"""Peers' rewards under a time budget that does not depend on what peers publish.

A node recomputes the reward of every peer completion it trains on (docs/method.md). The
answers are untrusted text: pre-screening (`swarm_node.tasks.answers.prescreen`) refuses what is
known to be slow, and `PeerVerifier` bounds the rest:

- per gather (one step): at most `step_budget_s` of reward computation in all;
- per peer: at most `peer_budget_s` of it for one sender's groups;
- per call: the verifier's own bound, lowered to what is left of both budgets;
- a group in which one answer runs the verifier into its timeout is dropped whole
  (`verifier_timeout`): its other rewards would be relative to a reward we could not compute.
  When the call had its full bound (not one cut short by a nearly spent budget) the group is
  `blamed`, so the caller can refuse the record for good (`swarm_node.peers.rejects`);
- a group that finds the budget spent is dropped whole (`verify_budget`), never half-scored.

Time is charged as measured, so the budget can be overrun by at most one call's bound; from then
on the gather's later groups are dropped. The peers' worker is launched when the first gather
begins (`CorrectnessReward.start_peer_worker`), so its first startup overlaps the fetch, and the
verifier waits for it to be ready (`ready_peer_worker`) before it starts a peer's clock: neither
that startup nor a fresh worker's after a timeout is charged to a peer (on a loaded machine the
first startup alone took over a peer's 1 s and dropped its groups). The uncharged time stays
bounded: a fresh worker follows only a timed-out call, and each timed-out call spends its whole
bound, so a gather has at most about step_budget_s / peer_budget_s + 1 of them.

`PeerVerifier.group_rewards` is the one entry point; the exchange side may call it on any thread
(one verifier per gather; it is not shared between threads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm_node.tasks.base import Problem

VERIFIER_TIMEOUT = "verifier_timeout"
VERIFY_BUDGET = "verify_budget"


@dataclass(frozen=True)
class GroupVerdict:
    """Rewards of a group's completions, or why the group is dropped (`rewards` is None)."""

    rewards: list[float] | None
    reason: str | None = None
    blamed: bool = False  # the drop would recur on every retry: refuse the record for good
    seconds: float = 0.0


@dataclass
class PeerVerifier:
    """Scores peers' groups within `step_budget_s` per gather and `peer_budget_s` per sender.

    `reward_fn` is a `CorrectnessReward` (bounded, peer worker) or any `(text, problem) -> float`
    (tests; no per-call bound is possible then, only the accounting)."""

    reward_fn: Any
    step_budget_s: float
    peer_budget_s: float
    clock: Callable[[], float] = time.monotonic
    spent: float = 0.0
    spent_by_peer: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step_budget_s <= 0 or self.peer_budget_s <= 0:
            raise ValueError("verification budgets must be > 0")

    def left(self, sender: str) -> float:
        """Seconds of verification left for `sender` in this gather."""
        return min(self.step_budget_s - self.spent, self.peer_budget_s - self.spent_by_peer.get(sender, 0.0))

    def charge(self, sender: str, seconds: float) -> None:
        """Count other peer work of `sender` (re-tokenizing its texts) in both budgets."""
        self.spent += seconds
        self.spent_by_peer[sender] = self.spent_by_peer.get(sender, 0.0) + seconds

    def group_rewards(self, texts: Sequence[str], problem: Problem, sender: str) -> GroupVerdict:
        """Rewards of one peer group's completion texts, or the reason it is dropped whole."""
        score = getattr(self.reward_fn, "score", None)
        ready = getattr(self.reward_fn, "ready_peer_worker", None)  # its startup is ours, not the peer's
        timeout_s = getattr(self.reward_fn, "timeout_s", None)
        full_bound = self.peer_budget_s if timeout_s is None else min(float(timeout_s), self.peer_budget_s)
        rewards: list[float] = []
        seconds = 0.0
        for text in texts:
            left = self.left(sender)
            if left <= 0:
                return GroupVerdict(None, VERIFY_BUDGET, seconds=seconds)
            if ready is not None:
                ready()
            start = self.clock()
            if score is None:
                value, timed_out = float(self.reward_fn(text, problem)), False
            else:
                result = score(text, problem, peer=True, timeout_s=min(left, full_bound))
                value, timed_out = float(result.reward), result.method == "timeout"
            took = max(0.0, self.clock() - start)
            seconds += took
            self.spent += took
            self.spent_by_peer[sender] = self.spent_by_peer.get(sender, 0.0) + took
            if timed_out:
                full = left >= full_bound
                return GroupVerdict(None, VERIFIER_TIMEOUT if full else VERIFY_BUDGET, blamed=full, seconds=seconds)
            rewards.append(value)
        return GroupVerdict(rewards, seconds=seconds)
