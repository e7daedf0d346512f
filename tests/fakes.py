"""Small fakes shared by tests, each satisfying the Protocol of the part it stands for
(`tests/unit/test_parts.py` checks them)."""

from __future__ import annotations

import hashlib


def hash_reward(completion_text: str, problem: object) -> float:
    """A deterministic reward with mixed values for random tiny models: one hash bit of the text
    (a `tasks.base.RewardFn`)."""
    return float(hashlib.sha256(completion_text.encode()).digest()[0] % 2 == 0)


class Clock:
    """A settable DHT clock for the in-memory swarm: tests move `t` by hand."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
