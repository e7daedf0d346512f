"""Bounded influence at admission: which peers' groups a node takes, and how many (docs/method.md).

Used by `RolloutExchange` while it gathers; every rule holds whatever peers publish:

* **Allow-list** (closed swarms, optional): only groups of listed peer ids are taken (`not_allowed`).
* **Reputation** (`Reputation`): a peer's drops (anything it published that was refused, weighted
  lightly for network weather such as timeouts and missing chunks) and failed checks lower its
  share, except drops that say nothing about its honesty (`HONEST_REASONS`: another tokenizer
  without text, a group that arrived after this node's window); enough faults with few accepted
  groups exclude it (`excluded_peer`) until its faults decay.
* **Fair sampling** (`fair_sample`): candidates are taken one group per identity per round, the
  identities ordered by reputation weight (random among equals), each up to its quota of
  `max_per_peer` scaled by its weight; so a peer listing many groups gets no more than one listing
  few, and a crowd of fresh identities is served after peers with a record of accepted groups.
* **Declared G** (`check_group`): a sender's group size is fixed by its first accepted group (the
  bounds, the local G unless configured, are `protocol.validate`'s `min/max_group_size`);
  a group of another size is dropped (`group_size_changed`).
* **Prompt binding** (`binding.py`, the protocol rule in full there): a group's prompts are tied
  to the DHT time window w of its `created_at` (the time its sender's step started), which this
  node accepts only within its own window C: C - staleness_steps <= w <= C. Sender P's k-th step of
  window w answers entries [k n, (k + 1) n) of `select_prompts(P, w, ...)`; a group is admitted
  only on a prompt among the first n S of them (n prompts a step, S = `slots_per_window` published
  steps per window; `wrong_prompt`), at most as often as listed there per (P, w) (once, for sets
  larger than n S; `window_slot_overused`). Nothing else the sender picks (policy version, model,
  sampling) enters the assignment, so grinding it buys nothing; a sender gets at most n S groups
  per window, on prompts a hash drew. A new identity gets a new assignment: identity grinding
  (about 30 keys, 1.5 s, for a chosen prompt with the defaults) is bounded by fair sampling (a
  fresh identity gets one group per gather, after peers with a record). Horizontal collaboration:
  every node's prompts of window w are `select_prompts("horizontal", w, n)`, each at most S times
  per sender and window.
* **Replays**: every completion of at least `MIN_FINGERPRINT_TOKENS` tokens is hashed (its token
  bytes); a group at least half of whose hashed completions were already taken from another sender,
  or published by this node, is a replay (`duplicate`), whatever prompt it claims. Shorter
  completions are no evidence: honest peers give the same short answer all the time.
* **Token budget**: peer tokens accepted per gather are capped (`over_token_budget`), so the scoring
  work per step has a fixed bound.
* **Logprob spot-checks** (`swarm_node/peers/spotcheck.py`, applied in `rollouts.peer_samples` after these
  rules): a group declares the exact weights that generated it (model id, revision with "+trained"
  once they moved, LoRA adapter digest); when this node holds them (a `swarm.spot_check.reference_models`
  entry, or its own model while untrained) it recomputes K random logprobs at the group's declared
  temperature, within a per-step token and time budget, and a median exp(|delta|) - 1 above the
  tolerance drops the group as `logprob_mismatch`, recorded here as a fault of the sender. A group of
  a model this node does not hold is not checked (`spot_unchecked`): its forged logprobs can move a
  token's weight min(pi_theta / pi_gen, C) anywhere in [0, C] and no further, and the KL filter drops
  the grossest forgeries (floor values), so it weighs at most C times an honest group.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from protocol.messages import RolloutGroup
from protocol.validate import TOKENIZER_MISMATCH
from swarm_node.swarm.binding import SLOT_OVERUSED, WRONG_PROMPT, PromptAssignment, WindowQuota

__all__ = ["SLOT_OVERUSED", "WRONG_PROMPT", "Admission", "PromptAssignment", "Reputation", "fair_sample"]

log = logging.getLogger(__name__)

NOT_ALLOWED = "not_allowed"
EXCLUDED = "excluded_peer"
GROUP_SIZE_CHANGED = "group_size_changed"
DUPLICATE = "duplicate"
OVER_TOKEN_BUDGET = "over_token_budget"

# Drops that can be network weather rather than a fault of the peer count for little.
WEATHER_REASONS = frozenset({"fetch_timeout", "missing"})
WEATHER_WEIGHT = 0.25
# Drops that say nothing about the peer (this node's own budget or state).
NEUTRAL_REASONS = frozenset({OVER_TOKEN_BUDGET, "over_peer_cap", NOT_ALLOWED, EXCLUDED})
# Drops that say nothing about the sender's honesty: a group of another tokenizer without text (its
# sender cannot make faithful text, or has not yet seen this node's tokenizer: swarm.send_text), and
# a group that arrived after this node's window for it (`stale`: a slow sender, or a late reader).
# Counted as drops by reason (ledger, receipts), never as faults.
HONEST_REASONS = frozenset({TOKENIZER_MISMATCH, "stale"})


def is_fault(reason: str | None) -> bool:
    """Whether a drop for `reason` counts against its sender's reputation."""
    return reason is not None and reason not in NEUTRAL_REASONS and reason not in HONEST_REASONS


class _HasOwner(Protocol):
    owner: str


C = TypeVar("C", bound=_HasOwner)


@dataclass
class Reputation:
    """Per-peer counts of accepted groups and faults, decayed by `decay` at every `tick()`.

    weight(peer) = trust * cleanliness, in (0, 1]: trust = min(1, (1 + good) / (1 + trusted_after))
    grows with accepted groups (a fresh identity starts at 1 / (1 + trusted_after)), cleanliness =
    (1 + good) / (1 + good + penalty * faults). A peer with at least `exclude_faults` faults and a
    weight under `exclude_below` is excluded (until its faults decay).
    """

    decay: float = 0.9
    penalty: float = 2.0
    trusted_after: float = 3.0
    exclude_faults: float = 4.0
    exclude_below: float = 0.2
    good: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    faults: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record(self, peer: str, reason: str | None) -> None:
        """An accepted group (reason None) or a drop of something `peer` published."""
        if reason is None:
            self.good[peer] += 1.0
        elif is_fault(reason):
            self.faults[peer] += WEATHER_WEIGHT if reason in WEATHER_REASONS else 1.0

    def weight(self, peer: str) -> float:
        good = self.good.get(peer, 0.0)
        trust = min(1.0, (1.0 + good) / (1.0 + self.trusted_after))
        return trust * (1.0 + good) / (1.0 + good + self.penalty * self.faults.get(peer, 0.0))

    def excluded(self, peer: str) -> bool:
        return self.faults.get(peer, 0.0) >= self.exclude_faults and self.weight(peer) < self.exclude_below

    def tick(self) -> None:
        for table in (self.good, self.faults):
            for peer in list(table):
                table[peer] *= self.decay
                if table[peer] < 0.01:
                    del table[peer]


def fair_sample(candidates: Sequence[C], max_groups: int, max_per_peer: int, rng: random.Random,
                weight: Callable[[str], float] = lambda _: 1.0) -> list[C]:
    """At most `max_groups` candidates: one per identity per round, identities by weight (in (0, 1],
    rounded to tenths: higher first, random among equals), each at most max(1, round(max_per_peer *
    weight)) in all."""
    by_owner: dict[str, list[C]] = defaultdict(list)
    for c in candidates:
        by_owner[c.owner].append(c)
    order_key = {o: (-round(weight(o), 1), rng.random()) for o in by_owner}
    owners = sorted(by_owner, key=order_key.__getitem__)
    quota = {o: max(1, min(max_per_peer, round(max_per_peer * weight(o)))) for o in owners}
    for o in owners:
        rng.shuffle(by_owner[o])
    chosen: list[C] = []
    for rnd in range(max_per_peer):
        for o in owners:
            if len(chosen) >= max_groups:
                return chosen
            if rnd < quota[o] and rnd < len(by_owner[o]):
                chosen.append(by_owner[o][rnd])
    return chosen


# A completion shorter than this is no fingerprint: honest peers with similar models produce the same
# short answer (`\boxed{8}`) again and again, on the same prompt or another, so a match says nothing.
MIN_FINGERPRINT_TOKENS = 16


def completion_digests(group: RolloutGroup) -> list[bytes]:
    """One digest per completion of at least MIN_FINGERPRINT_TOKENS tokens: its token bytes (not the
    sender, not the prompt it claims). Shorter completions are left out of replay detection."""
    return [hashlib.blake2b(c.token_ids.astype("<u4", copy=False).tobytes(), digest_size=16).digest()
            for c in group.completions if len(c.token_ids) >= MIN_FINGERPRINT_TOKENS]


class Admission:
    """The admission rules of one node (see the module doc); state is bounded by the windows read.

    `allowed_peers`: None for an open swarm. `prompts`: None skips the prompt-assignment rule.
    `max_tokens_per_gather`: None for no token budget.
    """

    def __init__(self, *, allowed_peers: Iterable[str] | None = None, prompts: PromptAssignment | None = None,
                 max_tokens_per_gather: int | None = None, reputation: Reputation | None = None) -> None:
        self.allowed_peers = frozenset(allowed_peers) if allowed_peers is not None else None
        self.prompts = prompts
        self.binding = WindowQuota(prompts) if prompts is not None else None
        self.max_tokens_per_gather = max_tokens_per_gather
        self.reputation = reputation or Reputation()
        self._declared_g: dict[str, tuple[int, int]] = {}  # sender -> (G, window last seen)
        self._completions: dict[bytes, tuple[str, int]] = {}  # completion digest -> (sender, window)
        self._tokens_left = math.inf

    # ---- per gather ------------------------------------------------------------------------

    def begin_gather(self) -> None:
        self.reputation.tick()
        if self.binding is not None:
            self.binding.begin_gather()
        self._tokens_left = math.inf if self.max_tokens_per_gather is None else self.max_tokens_per_gather

    def peer_reason(self, owner: str) -> str | None:
        """Why nothing of `owner` is taken at all (None: its candidates may be sampled)."""
        if self.allowed_peers is not None and owner not in self.allowed_peers:
            return NOT_ALLOWED
        if self.reputation.excluded(owner):
            return EXCLUDED
        return None

    def entry_reason(self, owner: str, prompt_index: int, created_at: float) -> str | None:
        """Why an index entry is not worth fetching: its prompt is not assigned to its owner in the
        window of `created_at`, or the owner's quota there is used (binding.py). Call once per entry
        and gather: an entry that passes holds a place of that quota until the next gather."""
        return self.binding.entry_reason(owner, prompt_index, created_at) if self.binding is not None else None

    def sample(self, candidates: Sequence[C], max_groups: int, max_per_peer: int, rng: random.Random) -> list[C]:
        return fair_sample(candidates, max_groups, max_per_peer, rng, self.reputation.weight)

    def record(self, owner: str, reason: str | None) -> None:
        """Feed the reputation: an accepted group (None) or a drop attributed to `owner`."""
        self.reputation.record(owner, reason)

    def charge_tokens(self, n: int) -> bool:
        """Charge `n` more tokens of this gather's budget (another tokenizer's group re-tokenized
        into more tokens than it was admitted with); False, charging nothing, when they do not fit."""
        if n > self._tokens_left:
            return False
        self._tokens_left -= n
        return True

    # ---- per group -------------------------------------------------------------------------

    def group_reason(self, group: RolloutGroup, window: int) -> str | None:
        """Why a structurally valid group is refused (None: admit it and charge its tokens)."""
        bound = self.binding is not None and group.prompt.prompt_set_id == self.binding.assignment.prompt_set_id
        if bound:
            refused = self.binding.group_reason(group)
            if refused is not None:
                return refused
        declared = self._declared_g.get(group.sender)
        if declared is not None and declared[0] != len(group.completions):
            return GROUP_SIZE_CHANGED
        digests = completion_digests(group)
        replayed = sum(1 for d in digests if d in self._completions and self._completions[d][0] != group.sender)
        if digests and 2 * replayed >= len(digests):
            return DUPLICATE
        if group.num_tokens > self._tokens_left:
            return OVER_TOKEN_BUDGET
        self._tokens_left -= group.num_tokens
        if bound:
            self.binding.take(group)
        self._declared_g[group.sender] = (len(group.completions), window)
        for d in digests:
            self._completions.setdefault(d, (group.sender, window))
        return None

    def remember_own(self, groups: Iterable[RolloutGroup], window: int) -> None:
        """This node's own published completions: a peer replaying them is a `duplicate` too."""
        for group in groups:
            for d in completion_digests(group):
                self._completions.setdefault(d, (group.sender, window))

    def forget_before(self, oldest_window: int) -> None:
        """Drop memory of windows no longer read (a sender's G is kept while it publishes)."""
        for table in (self._completions, self._declared_g):
            for k in [k for k, (_, w) in table.items() if w < oldest_window - 8]:
                del table[k]
        if self.binding is not None:
            self.binding.forget_before(oldest_window - 8)


class DegradedExchangeLog:
    """Warns (at most once per `interval_s`) when a gather drops far more than it takes."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._logged_at = float("-inf")
        self.warnings = 0

    def check(self, taken: int, drops: Counter[str]) -> None:
        dropped = sum(drops.values())
        now = time.monotonic()
        if dropped >= max(8, 4 * taken) and now - self._logged_at >= self.interval_s:
            top = ", ".join(f"{k} {v}" for k, v in drops.most_common(4))
            log.warning("peer exchange degraded: took %d groups, dropped %d (%s)", taken, dropped, top)
            self._logged_at = now
            self.warnings += 1
