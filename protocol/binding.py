"""The prompt binding's assignment: which problems of a prompt set a peer answers (a protocol rule).

`select_prompts` is a pure function of (salt, peer id, counter) built on sha256, so every node can
recompute any peer's choice and the result is the same on every platform and Python version;
different peers get (almost surely) different prompts. A node in a swarm takes its prompts with
`window_prompts`: the counter is the DHT time window its step starts in (`keys.window_of`), never a
number the peer picks; a node training alone counts its steps.

The rule (docs/architecture.md, "Prompt binding"): sender P's k-th step started in window w answers
`window_prompts(P, w, k, n)`; a receiver admits P's group of window w only on a prompt among the first
n S entries of `select_prompts(P, w, ...)` (S: slots per window), and in horizontal collaboration
every sender answers `select_prompts("horizontal", w, n)`. The receiver's side (windows read,
quotas) is `swarm_node.swarm.binding`.
"""

from __future__ import annotations

import hashlib
import json


class _HashStream:
    """Uniform integers from sha256 in counter mode: portable and reproducible."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.counter = 0

    def below(self, bound: int) -> int:
        """Uniform in [0, bound) by rejection sampling on 64-bit draws (no modulo bias)."""
        limit = (1 << 64) - (1 << 64) % bound
        while True:
            digest = hashlib.sha256(self.key + self.counter.to_bytes(8, "little")).digest()
            self.counter += 1
            value = int.from_bytes(digest[:8], "little")
            if value < limit:
                return value % bound


def _partial_shuffle(stream: _HashStream, k: int, size: int) -> list[int]:
    """First k entries of a Fisher-Yates shuffle of range(size), in O(k) memory (sparse swaps)."""
    swapped: dict[int, int] = {}
    out = []
    for i in range(k):
        j = i + stream.below(size - i)
        out.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return out


def select_prompts(peer_id: str, step: int, n: int, set_size: int, salt: str = "") -> list[int]:
    """The `n` problem indices peer `peer_id` works on at `step`: distinct when n <= set_size
    (otherwise whole permutations of the set follow each other), all in [0, set_size).

    `salt` separates swarms or prompt sets (e.g. the prompt set id), so a peer's sequence differs
    between them."""
    if set_size < 1:
        raise ValueError(f"set_size must be >= 1, got {set_size}")
    if n < 0 or step < 0:
        raise ValueError(f"n and step must be >= 0, got n={n}, step={step}")
    out: list[int] = []
    round_no = 0
    while len(out) < n:
        key = json.dumps(["select-prompts", salt, peer_id, step, round_no]).encode()  # unambiguous fields
        take = min(n - len(out), set_size)
        out.extend(_partial_shuffle(_HashStream(hashlib.sha256(key).digest()), take, set_size))
        round_no += 1
    return out


def window_prompts(peer_id: str, window: int, slot: int, n: int, set_size: int, salt: str = "") -> list[int]:
    """The `n` prompts of the `slot`-th step (0, 1, ...) that peer `peer_id` starts in DHT time
    window `window`: entries [slot * n, (slot + 1) * n) of `select_prompts(peer_id, window, ...)`.

    The protocol's prompt binding (`swarm_node.swarm.binding`): a receiver accepts a peer's group
    in window w only on a prompt among the first `n * slots_per_window` of that sequence, which no
    field the peer chooses can change. `select_prompts` is prefix-consistent (a longer request
    extends a shorter one), so slot k's prompts never change with how many slots follow."""
    if slot < 0:
        raise ValueError(f"slot must be >= 0, got {slot}")
    return select_prompts(peer_id, window, n * (slot + 1), set_size, salt=salt)[n * slot:]
