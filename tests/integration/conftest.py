"""Shared fixtures for tests with real hivemind DHT processes on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture(scope="module")
def dht_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., object]]:
    """`make(swarm_id, node_dir=None, initial_peers=(), **kw) -> HivemindTransport` on loopback.

    Every transport made through it is shut down when the test module ends (DHTs are slow to
    start, so a module reuses them across its tests).
    """
    from swarm_node.swarm.dht import HivemindTransport
    from swarm_node.swarm.index import owned_key_schedule
    from swarm_node.swarm.identity import load_node_identity

    made: list[HivemindTransport] = []

    def make(swarm_id: str, node_dir: Path | None = None, initial_peers=(), **kw) -> HivemindTransport:
        node_dir = node_dir or tmp_path_factory.mktemp("node")
        kw.setdefault("owned_keys", owned_key_schedule(swarm_id, 30.0, 4))
        kw.setdefault("startup_timeout", 30.0)
        t = HivemindTransport(load_node_identity(node_dir), swarm_id, initial_peers=list(initial_peers),
                              host_maddrs=LOOPBACK, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.shutdown()


# A short supervised warm-up (swarm_node.experiment.warmup) turns a tiny random model into one that
# writes arithmetic answers in its format: its completions are valid text that sometimes earns
# reward, so nodes on it train (non-zero reward and gradient) and can send their completions'
# text to peers of another tokenizer. About 8 s per model on one core; cached for the session.
WARM_STEPS = 120


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`warm(base, steps=WARM_STEPS) -> directory` of `base` (a tiny-random spec) after `steps`
    warm-up steps on level-1 addition and subtraction; `model.name` accepts the directory."""
    from swarm_node.experiment.warmup import WarmupSpec, ensure_warm_model

    cache = tmp_path_factory.mktemp("warm")

    def warm(base: str, steps: int = WARM_STEPS) -> Path:
        return ensure_warm_model(WarmupSpec(base=base, levels=(1,), steps=steps), cache, log=lambda m: None)

    return warm
