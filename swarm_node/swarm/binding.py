"""Prompt binding: the prompts a peer's group may answer, tied to DHT time, not to anything the
peer chooses (docs/method.md: where a node's samples come from, what a hostile peer can do).

The rule, part of the protocol (the swarm agrees on `swarm.window_seconds`, n =
`swarm.peer_prompts_per_step` (default `train.prompts_per_step`) and S = `swarm.slots_per_window`):

1. A group's window is w = `keys.window_of(created_at, window_seconds)`, where `created_at` is the
   DHT time its sender's step *started* (when it chose the step's prompts), and the group is listed
   in the sender's index record of window w (a group listed under another window's index is an
   `index_mismatch`).
2. Sender P's k-th step started in window w (k = 0, 1, 2, ...; its *slot*) answers
   `window_prompts(P, w, k, n)`: entries [k n, (k + 1) n) of `select_prompts(P, w, ...)`. Steps with
   k >= S train on their prompts but publish nothing.
3. A receiver whose own DHT time lies in window C admits the group only if
   C - staleness_steps <= w <= C (the *tolerance*: older windows are not read, or the group is
   `stale`), its prompt is one of A(P, w) = the first n S entries of `select_prompts(P, w, ...)`
   (else `wrong_prompt`), and it has taken fewer groups of (P, w, prompt) than the prompt appears in
   A(P, w) (once, unless the prompt set is smaller than n S) (else `window_slot_overused`).
4. Horizontal collaboration: A(w) = `select_prompts("horizontal", w, n)` for every sender (all
   nodes answer the same prompts in a window), each prompt at most S times per sender and window.

A(P, w) depends on the sender's identity and the window only: its policy version, model, sampling
and bytes do not enter it, so grinding any of them changes nothing. What a sender does control is
bounded: `created_at` only chooses among the staleness_steps + 1 windows of the tolerance, each
window's quota counted once (counts are kept longer than a window is read); within a window it
gets at most n S groups, on prompts the hash drew, and can at most leave out the ones it does not
like (a choice among n S uniform draws, where the old step-number rule let it pick any prompt
after ~2,500 tries). A new identity gets a new A, so identity grinding remains; fresh identities
share one seat in fair sampling beside the peers with a record (`sampling.fair_sample`).

Honest nodes at any step rate pass: a fast node uses slots 0..S-1 of each window (at most S
published steps per window; the rest train unpublished), a slow one uses slot 0 of the window its
step started in and stamps that start time, so a step may span windows as long as it ends within
the tolerance (with the defaults, 30 s windows and staleness 4: 120-150 s); a paused node starts
at slot 0 of the window it resumes in. A node restarted within the window of its last published
step continues at the next slot (`node/slots.py` keeps the slot in its node directory): starting
again at slot 0 would repeat prompts whose groups receivers refuse as `window_slot_overused`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from protocol import keys
from protocol.messages import ProtocolError, RolloutGroup
from protocol.binding import select_prompts

WRONG_PROMPT = "wrong_prompt"
SLOT_OVERUSED = "window_slot_overused"
HORIZONTAL = "horizontal"  # the one "sender" of horizontal collaboration's shared prompts


@dataclass(frozen=True)
class PromptAssignment:
    """The binding's parameters: a prompt set of `set_size` problems, n = `prompts_per_step` prompts a
    step, `slots_per_window` published steps per window, windows of `window_seconds`, salted like
    the node (`salt`: the swarm id)."""

    prompt_set_id: str
    set_size: int
    prompts_per_step: int
    salt: str
    horizontal: bool = False
    window_seconds: float = 30.0
    slots_per_window: int = 16

    @property
    def n(self) -> int:
        return min(self.prompts_per_step, self.set_size)

    def quota(self, sender: str, index: int, created_at: float) -> tuple[int, int]:
        """(window of `created_at`, how many groups of `sender` on prompt `index` that window admits);
        a quota of 0: the prompt is not assigned (or `created_at` is no DHT time)."""
        try:
            window = keys.window_of(created_at, self.window_seconds)
        except ProtocolError:
            return -1, 0
        if self.horizontal:
            counts = _counts(HORIZONTAL, window, self.n, self.set_size, self.salt)
            return window, self.slots_per_window * counts.get(index, 0)
        return window, _counts(sender, window, self.n * self.slots_per_window, self.set_size, self.salt).get(index, 0)

    def assigned(self, sender: str, index: int, created_at: float) -> bool:
        return self.quota(sender, index, created_at)[1] > 0


@lru_cache(maxsize=4096)
def _counts(who: str, window: int, k: int, set_size: int, salt: str) -> Mapping[int, int]:
    return MappingProxyType(Counter(select_prompts(who, window, k, set_size, salt=salt)))


class WindowQuota:
    """A receiver's side of the rule: groups taken per (sender, window, prompt), and candidates listed
    in the current gather, against `PromptAssignment.quota`. State is pruned with the windows read."""

    def __init__(self, assignment: PromptAssignment) -> None:
        self.assignment = assignment
        self._taken: dict[tuple[str, int, int], int] = {}
        self._listed: Counter[tuple[str, int, int]] = Counter()

    def begin_gather(self) -> None:
        self._listed.clear()

    def entry_reason(self, owner: str, index: int, created_at: float) -> str | None:
        """Why an index entry is not a candidate; a candidate holds a place of its quota in this gather."""
        window, quota = self.assignment.quota(owner, index, created_at)
        if quota == 0:
            return WRONG_PROMPT
        key = (owner, window, index)
        if self._taken.get(key, 0) + self._listed[key] >= quota:
            return SLOT_OVERUSED
        self._listed[key] += 1
        return None

    def group_reason(self, group: RolloutGroup) -> str | None:
        window, quota = self.assignment.quota(group.sender, group.prompt.index, group.created_at)
        if quota == 0:
            return WRONG_PROMPT
        if self._taken.get((group.sender, window, group.prompt.index), 0) >= quota:
            return SLOT_OVERUSED
        return None

    def take(self, group: RolloutGroup) -> None:
        """Count an admitted group against its sender's quota (call after `group_reason` said None)."""
        window, _ = self.assignment.quota(group.sender, group.prompt.index, group.created_at)
        key = (group.sender, window, group.prompt.index)
        self._taken[key] = self._taken.get(key, 0) + 1

    def forget_before(self, oldest_window: int) -> None:
        for key in [k for k in self._taken if k[1] < oldest_window]:
            del self._taken[key]
