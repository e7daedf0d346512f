"""Fair sampling: which of the peers' candidate groups a gather fetches (docs/method.md, hostile peers).

Candidates are grouped by owner, and owners into **seats** by their standing
(`admission.Reputation.standing`):

* `OWN`: a peer with a record of taken groups has a seat of its own;
* `NEWCOMER`: every peer without such a record shares one seat, so a crowd of fresh identities,
  however large, holds one identity's place while peers with a record want the slots;
* `PROBE`: every peer whose fetched groups were more often left untaken than taken (its groups are
  dropped, for faults or for honest reasons alike) shares one seat of quota 1: together such peers
  get at most one group per gather, whatever their number.

**Order: a weighted lottery.** Seat s draws log(u_s) / w_s (u uniform in (0, 1], w_s its weight:
its identity's reputation weight, or its heaviest member's for a shared seat), highest first
(Efraimidis-Spirakis: a weighted random order). A heavier seat comes first more often, but no seat
is locked behind others for good: the newcomer seat (weight 1/4) beats one trusted seat (weight 1)
one time in five, so honest newcomers are taken now and then, earn a record and a seat of their
own, where a strict order by weight left a sender not taken early behind the trusted ones for ever
(docs/results/soak.md, finding 4).

**Rounds.** Round r (r < max_per_peer) gives one group to each seat, in order, whose quota allows:
an own seat max(1, round(max_per_peer x w)), the newcomer seat the same at its weight, the probe
seat 1; a shared seat gives its groups to its members in turn (fewest taken first, then lottery
order), each within its own quota. Slots left when the seats are done go to newcomers one by one
(leftovers, each within its own quota): a swarm of newcomers only (a fresh swarm) is served as
before; probed peers get nothing beyond their seat's one group.

**Newest first.** Of one owner's candidates (a peer publishes in every window, and its groups of
the last `swarm.staleness_steps` windows are all candidates) a gather takes those of the newest
window first. Measured in docs/results/staleness.md: F-TIS's gain on a peer's group falls with
its age in the receiver's steps (lags 0 to 16), so of two groups of one peer the newer is worth
more; an older one is taken when the newer are taken already or over budget.

**Bytes.** An owner's chosen candidates cost at most `max_cost_per_peer` in all (`cost` of a
candidate: the most its fetch can download), so no identity makes a receiver download more than
that per gather; a candidate over what is left of its owner's budget is skipped.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

OWN, NEWCOMER, PROBE = "own", "newcomer", "probe"


class _HasOwner(Protocol):
    owner: str


C = TypeVar("C", bound=_HasOwner)


def lottery_key(rng: random.Random, weight: float) -> float:
    """A weighted lottery draw: ordering by it (highest first) is a weighted random order."""
    return math.log(1.0 - rng.random()) / max(weight, 1e-9)


def quota(max_per_peer: int, weight: float) -> int:
    """Groups an identity of reputation weight `weight` gets per gather, at most."""
    return max(1, min(max_per_peer, round(max_per_peer * weight)))


@dataclass
class _Seat:
    members: list[str]  # in lottery order
    quota: int
    key: float
    given: int = 0


class _Picker:
    """The gather's choice so far: groups per owner, bytes per owner, the slots left."""

    def __init__(self, by_owner: dict[str, list[C]], quotas: dict[str, int], cost: Callable[[C], float],
                 max_cost: float, max_groups: int) -> None:
        self.by_owner, self.quotas, self.cost, self.max_cost = by_owner, quotas, cost, max_cost
        self.max_groups = max_groups
        self.taken: dict[str, int] = defaultdict(int)
        self.spent: dict[str, float] = defaultdict(float)
        self.chosen: list[C] = []

    @property
    def full(self) -> bool:
        return len(self.chosen) >= self.max_groups

    def take_from(self, members: Sequence[str]) -> bool:
        """One group of the member that has had the fewest (ties: in order) and can still give one."""
        for owner in sorted(members, key=lambda o: self.taken[o]):
            if self.full:
                return False
            if self.taken[owner] >= self.quotas[owner]:
                continue
            left = self.by_owner[owner]
            while left:
                c = left.pop()
                if self.spent[owner] + self.cost(c) <= self.max_cost:
                    self.spent[owner] += self.cost(c)
                    self.taken[owner] += 1
                    self.chosen.append(c)
                    return True
        return False


def fair_sample(candidates: Sequence[C], max_groups: int, max_per_peer: int, rng: random.Random,
                weight: Callable[[str], float] = lambda _: 1.0, standing: Callable[[str], str] = lambda _: OWN,
                cost: Callable[[C], float] = lambda _: 0.0, max_cost_per_peer: float = math.inf,
                recency: Callable[[C], float] = lambda _: 0.0) -> list[C]:
    """At most `max_groups` candidates, at most `max_per_peer` of an owner (fewer by its weight),
    by seats, lottery and rounds (module doc). `weight` in (0, 1]; `standing` one of OWN,
    NEWCOMER, PROBE. Of one owner's candidates the most recent (`recency`: the exchange passes the
    window) go first, in random order among equals. Deterministic given `rng`."""
    by_owner: dict[str, list[C]] = defaultdict(list)
    for c in candidates:
        by_owner[c.owner].append(c)
    owners = sorted(by_owner)
    for o in owners:
        rng.shuffle(by_owner[o])
        by_owner[o].sort(key=recency)  # stable: shuffled among equals; _Picker pops from the end, newest first
    weights = {o: weight(o) for o in owners}
    keys = {o: lottery_key(rng, weights[o]) for o in owners}
    quotas = {o: quota(max_per_peer, weights[o]) for o in owners}
    seats: list[_Seat] = []
    shared: dict[str, list[str]] = {NEWCOMER: [], PROBE: []}
    for o in sorted(owners, key=lambda o: -keys[o]):
        kind = standing(o)
        if kind == OWN:
            seats.append(_Seat([o], quotas[o], keys[o]))
        else:
            shared[kind].append(o)
    for kind, members in shared.items():
        if members:
            heaviest = max(weights[o] for o in members)
            seat_quota = 1 if kind == PROBE else quota(max_per_peer, heaviest)
            seats.append(_Seat(members, seat_quota, lottery_key(rng, heaviest)))
    seats.sort(key=lambda s: -s.key)
    picker = _Picker(by_owner, quotas, cost, max_cost_per_peer, max_groups)
    for _ in range(max_per_peer):
        for seat in seats:
            if seat.given < seat.quota and picker.take_from(seat.members):
                seat.given += 1
    for _ in range(max_per_peer):  # leftovers: newcomers one by one
        for o in shared[NEWCOMER]:
            picker.take_from([o])
    return picker.chosen
