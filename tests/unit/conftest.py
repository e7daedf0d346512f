"""Fixtures shared by unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarm_node.tasks.bounded import BoundedRunner
from swarm_node.tasks.rewards import math_verify_runner


@pytest.fixture(scope="module")
def runner() -> Iterator[BoundedRunner]:
    """One math-verify worker shared by a module's reward functions (startup costs seconds)."""
    r = math_verify_runner(10.0)
    r.start()
    yield r
    r.close()
