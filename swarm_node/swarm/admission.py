"""Bounded influence at admission: which peers' groups a node takes, and how many (docs/method.md).

Used by `RolloutExchange` while it gathers; every rule holds whatever peers publish:

* **Allow-list** (closed swarms, optional): only groups of listed peer ids are taken (`not_allowed`).
* **Reputation** (`Reputation`): a peer's faults (drops of anything it published that say something
  about its honesty: `verdicts.py`; network weather such as timeouts and missing chunks weighs
  little) and failed checks lower its share; drops that say nothing about its honesty
  (`verdicts.HONEST_REASONS`) do not, but a drop is honest only when all its reasons are;
  enough faults with few accepted groups exclude it (`excluded_peer`) until its faults decay.
* **Slots not taken** (`Reputation.misses`): a group this node fetched (a slot of its gather) and
  then did not take, for any reason but its own budgets, is a miss of its sender, honest or not. A
  peer with more misses than taken groups (both decayed by 0.9 a gather, so the comparison holds
  until one of them changes) is *probed*: all such peers together get at most one group per
  gather, and one whose taken groups outnumber its misses again returns to the others
  (`sampling.PROBE`). So identities whose groups are never taken stop holding slots whatever their
  number, and a peer whose groups were dropped for a while (another prompt set) recovers as its
  groups are taken again (each take counts 1; old misses fade by 0.9 a gather).
* **Fair sampling** (`sampling.fair_sample`): candidates are taken one group per seat per round,
  seats in a weighted lottery order: a peer with a record of taken groups has its own seat, every
  peer without one shares one seat (a crowd of fresh identities holds one identity's place), every
  probed peer shares one seat of one group; each owner at most its quota of `max_per_peer` scaled
  by its weight, and at most the gather's byte budget per sender. The lottery lets newcomers in now
  and then, where a strict order locked out whoever was not taken early.
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
  (about 30 keys, 1.5 s, for a chosen prompt with the defaults) is bounded by fair sampling (all
  fresh identities share one seat beside the peers with a record). Horizontal collaboration:
  every node's prompts of window w are `select_prompts("horizontal", w, n)`, each at most S times
  per sender and window.
* **Replays**: every completion of at least `MIN_FINGERPRINT_TOKENS` tokens is hashed (its token
  bytes); a group at least half of whose hashed completions were already taken from another sender,
  or published by this node, is a replay (`duplicate`), whatever prompt it claims. Only copies of
  improbable completions count (the first copy's logprobs sum to at most -`MIN_REPLAY_NATS`): short
  or likely completions are no evidence, since honest peers of similar models draw them again (two
  nodes warmed from one checkpoint did, in the soak).
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

from protocol.messages import RolloutGroup
from swarm_node.swarm.binding import SLOT_OVERUSED, WRONG_PROMPT, PromptAssignment, WindowQuota
from swarm_node.swarm.sampling import NEWCOMER, OWN, PROBE, C, fair_sample
from swarm_node.swarm.verdicts import (
    HONEST_REASONS,
    NEUTRAL_REASONS,
    WEATHER_REASONS,
    WEATHER_WEIGHT,
    is_fault,
)

__all__ = ["HONEST_REASONS", "SLOT_OVERUSED", "WRONG_PROMPT", "Admission", "PromptAssignment", "Reputation", "fair_sample",
           "is_fault"]

log = logging.getLogger(__name__)

NOT_ALLOWED = "not_allowed"
EXCLUDED = "excluded_peer"
GROUP_SIZE_CHANGED = "group_size_changed"
DUPLICATE = "duplicate"
OVER_TOKEN_BUDGET = "over_token_budget"


@dataclass
class Reputation:
    """Per-peer counts of accepted groups, faults and misses, decayed by `decay` at every `tick()`.

    weight(peer) = trust * cleanliness * usefulness, in (0, 1]: trust = min(1, (1 + good) / (1 +
    trusted_after)) grows with accepted groups (a fresh identity starts at 1 / (1 + trusted_after)),
    cleanliness = (1 + good) / (1 + good + penalty * faults), usefulness = (1 + good) / (1 + good +
    misses). A peer with at least `exclude_faults` faults and a weight under `exclude_below` is
    excluded (until its faults decay). `standing`: PROBE while misses > good, OWN (a seat of its
    own in fair sampling) once good >= trusted_after, else NEWCOMER. Misses are not saved with the
    ledger: a restarted node gives each peer its slots again until they miss.
    """

    decay: float = 0.9
    penalty: float = 2.0
    trusted_after: float = 3.0
    exclude_faults: float = 4.0
    exclude_below: float = 0.2
    good: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    faults: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    misses: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record(self, peer: str, reason: str | None) -> None:
        """An accepted group (reason None) or a drop of something `peer` published."""
        if reason is None:
            self.good[peer] += 1.0
        elif is_fault(reason):
            self.faults[peer] += WEATHER_WEIGHT if reason in WEATHER_REASONS else 1.0

    def record_miss(self, peer: str, reason: str) -> None:
        """A group of `peer` this node fetched and did not take, for `reason` (none of this node's own)."""
        if reason not in NEUTRAL_REASONS:
            self.misses[peer] += WEATHER_WEIGHT if reason in WEATHER_REASONS else 1.0

    def withdraw(self, peer: str) -> None:
        """Undo one accepted group (`record(peer, None)`) of this gather: the node did not train on it."""
        if peer in self.good:
            self.good[peer] = max(0.0, self.good[peer] - 1.0)

    def weight(self, peer: str) -> float:
        good = self.good.get(peer, 0.0)
        trust = min(1.0, (1.0 + good) / (1.0 + self.trusted_after))
        clean = (1.0 + good) / (1.0 + good + self.penalty * self.faults.get(peer, 0.0))
        return trust * clean * (1.0 + good) / (1.0 + good + self.misses.get(peer, 0.0))

    def standing(self, peer: str) -> str:
        """Its seat in fair sampling (`sampling`): PROBE, OWN or NEWCOMER (class doc)."""
        good = self.good.get(peer, 0.0)
        if self.misses.get(peer, 0.0) > good:
            return PROBE
        return OWN if good >= self.trusted_after else NEWCOMER

    def excluded(self, peer: str) -> bool:
        return self.faults.get(peer, 0.0) >= self.exclude_faults and self.weight(peer) < self.exclude_below

    def tick(self) -> None:
        for table in (self.good, self.faults, self.misses):
            for peer in list(table):
                table[peer] *= self.decay
                if table[peer] < 0.01:
                    del table[peer]


# A completion shorter than this is no fingerprint: honest peers with similar models produce the same
# short answer (`\boxed{8}`) again and again, on the same prompt or another, so a match says nothing.
MIN_FINGERPRINT_TOKENS = 16
# Nor is a likely one: a completion whose first copy's logprobs sum above -MIN_REPLAY_NATS, an honest
# sampler of a similar model draws again with probability above exp(-16) (about 1e-7), and peaky
# models (two nodes warmed from one checkpoint, answering the same prompt) do, at any length.
MIN_REPLAY_NATS = 16.0


def completion_digests(group: RolloutGroup) -> list[tuple[bytes, bool]]:
    """(digest, improbable) per completion of at least MIN_FINGERPRINT_TOKENS tokens: the digest of its
    token bytes (not the sender, not the prompt it claims), and whether its declared logprobs make
    it improbable enough (MIN_REPLAY_NATS) that another copy is evidence of a replay. Shorter
    completions are left out of replay detection."""
    return [(hashlib.blake2b(c.token_ids.astype("<u4", copy=False).tobytes(), digest_size=16).digest(),
             -float(c.logprobs.sum(dtype="float64")) >= MIN_REPLAY_NATS)
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
        # completion digest -> (sender, window) of its first copy, for copies improbable to draw twice
        self._completions: dict[bytes, tuple[str, int]] = {}
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

    def entry_reason(self, owner: str, prompt_index: int, created_at: float, group_size: int = 0,
                     hold: bool = True) -> str | None:
        """Why an index entry is not worth fetching: the G it declares (`group_size`, 0: none) is not
        its owner's, its prompt is not assigned to its owner in the window of `created_at`, or the
        owner's quota there is used (binding.py). With `hold`, call once per entry and gather: an
        entry that passes holds a place of that quota until the next gather; without, nothing is
        held and the quota is not checked (an entry dropped for another reason)."""
        declared = self._declared_g.get(owner)
        if group_size and declared is not None and declared[0] != group_size:
            return GROUP_SIZE_CHANGED
        if self.binding is None:
            return None
        if not hold:
            return None if self.binding.assignment.assigned(owner, prompt_index, created_at) else WRONG_PROMPT
        return self.binding.entry_reason(owner, prompt_index, created_at)

    def sample(self, candidates: Sequence[C], max_groups: int, max_per_peer: int, rng: random.Random,
               cost: Callable[[C], float] = lambda _: 0.0, max_cost_per_peer: float = math.inf,
               recency: Callable[[C], float] = lambda _: 0.0) -> list[C]:
        """`sampling.fair_sample` with this node's reputation weights and standings."""
        return fair_sample(candidates, max_groups, max_per_peer, rng, self.reputation.weight,
                           self.reputation.standing, cost, max_cost_per_peer, recency)

    def record(self, owner: str, reason: str | None) -> None:
        """Feed the reputation: an accepted group (None) or a drop attributed to `owner`."""
        self.reputation.record(owner, reason)

    def record_miss(self, owner: str, reason: str) -> None:
        """A group of `owner` this gather fetched and did not take (`Reputation.record_miss`)."""
        self.reputation.record_miss(owner, reason)

    def untake(self, owner: str, reason: str) -> None:
        """A group the exchange took that the node then dropped for `reason` before training on it
        (an unknown prompt, a failed conversion, a budget): the take is withdrawn and the slot it
        held is a miss unless `reason` is this node's own budget."""
        self.reputation.withdraw(owner)
        self.reputation.record_miss(owner, reason)

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
        replayed = sum(1 for d, _ in digests if d in self._completions and self._completions[d][0] != group.sender)
        if digests and 2 * replayed >= len(digests):
            return DUPLICATE
        if group.num_tokens > self._tokens_left:
            return OVER_TOKEN_BUDGET
        self._tokens_left -= group.num_tokens
        if bound:
            self.binding.take(group)
        self._declared_g[group.sender] = (len(group.completions), window)
        for d, improbable in digests:
            if improbable:  # the first copy decides: a replay's forged logprobs cannot unmark it
                self._completions.setdefault(d, (group.sender, window))
        return None

    def remember_own(self, groups: Iterable[RolloutGroup], window: int) -> None:
        """This node's own published completions: a peer replaying them is a `duplicate` too."""
        for group in groups:
            for d, improbable in completion_digests(group):
                if improbable:
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
