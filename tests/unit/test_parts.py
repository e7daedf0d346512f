"""The node's seams (swarm_node/node/parts.py): the real parts `build_parts` wires, and the fakes tests put in
their place, have every member their Protocol lists, with signatures that accept the loop's calls."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import pytest

from swarm_node.node import parts as p
from swarm_node.observe.health import NetworkCounters
from swarm_node.policy.types import Generator
from swarm_node.peers.spotcheck import SpotChecker, SpotSession
from swarm_node.swarm.memory import MemorySwarm
from swarm_node.swarm.prompt_keeper import PromptSetKeeper
from swarm_node.tasks.base import RewardFn
from tests.fakes import Clock, hash_reward
from tests.unit.test_membership import FakeTransport
from tests.unit.test_node_loop import make_node


def members(proto: type) -> list[str]:
    """The names a Protocol lists: its methods, properties and annotated attributes."""
    names = {n for n in vars(proto) if not n.startswith("_") or n in ("__contains__", "__call__")}
    names |= set(getattr(proto, "__annotations__", {}))
    return sorted(names)


def mismatches(obj: Any, proto: type) -> list[str]:
    """What `obj` lacks of `proto`: a missing member, or a method whose signature does not take the
    Protocol's parameters by the same names (or has more required ones)."""
    out = []
    for name in members(proto):
        if not hasattr(obj, name):
            out.append(f"{proto.__name__}.{name}: missing")
            continue
        want = inspect.getattr_static(proto, name, None)  # None: an annotated attribute
        if want is None or isinstance(want, property) or not callable(want):
            continue
        wanted = [q for q in inspect.signature(want).parameters.values() if q.name != "self"]
        got = inspect.signature(obj if name == "__call__" else getattr(obj, name)).parameters
        if any(q.kind == q.VAR_KEYWORD for q in got.values()):
            continue
        missing = [q.name for q in wanted if q.name not in got]
        required = [n for n, q in got.items() if q.default is q.empty and q.kind in (q.POSITIONAL_OR_KEYWORD,
                                                                                   q.KEYWORD_ONLY)]
        extra = [n for n in required if n not in {w.name for w in wanted}]
        if missing or extra:
            out.append(f"{proto.__name__}.{name}: missing {missing}, extra required {extra}")
    return out


@pytest.fixture(scope="module")
def node_parts(tmp_path_factory: pytest.TempPathFactory) -> p.NodeParts:
    return make_node(tmp_path_factory.mktemp("parts"), MemorySwarm(), "A").parts


def test_the_checker_catches_a_missing_member_and_a_wrong_signature():
    class Half:
        def record_group(self, peer: str) -> None: ...

        def record_late_drop(self, peer: str, reason: str, when: float) -> None: ...

    found = mismatches(Half(), p.Ledger)
    assert "Ledger.save: missing" in found and "Ledger.record_samples: missing" in found
    assert "Ledger.record_group: missing ['reason', 'tokenizer'], extra required []" in found
    assert "Ledger.record_late_drop: missing [], extra required ['when']" in found


def test_the_real_parts_satisfy_their_protocols(node_parts: p.NodeParts):
    pairs = [(node_parts.policy, p.PolicyView), (node_parts.trainer, p.StepTrainer),
             (node_parts.exchange, p.PeerExchange), (node_parts.ledger, p.Ledger), (node_parts.rejects, p.Rejects),
             (node_parts.generator, Generator)]
    for part, proto in pairs:
        assert part is not None and mismatches(part, proto) == [], proto
        if getattr(proto, "_is_runtime_protocol", False):
            assert isinstance(part, proto)
    exchange = node_parts.exchange
    assert exchange is not None and node_parts.admission is exchange.admission is not None
    assert exchange.transport.health() == {}  # the in-memory transport: no health
    assert mismatches(exchange.transport, NetworkCounters) == []


def test_parts_built_only_when_configured_satisfy_theirs():
    """The spot checker, its sessions and the prompt keeper: checked on their classes' methods."""
    for cls, proto in ((SpotChecker, p.SpotChecks), (SpotSession, p.SpotSession), (PromptSetKeeper, p.PromptKeeper)):
        methods = [n for n in members(proto) if callable(inspect.getattr_static(proto, n, None))]
        assert all(hasattr(cls, n) for n in methods), cls
        assert mismatches(type("Bound", (cls,), {"__init__": lambda self: None})(), proto) == [], cls


def test_the_fakes_satisfy_the_protocols():
    assert mismatches(FakeTransport(), NetworkCounters) == []
    assert mismatches(hash_reward, RewardFn) == [] and hash_reward("x", None) in (0.0, 1.0)

    class DhtTime(Protocol):  # NodeParts.dht_time
        def __call__(self) -> float: ...

    assert mismatches(Clock(5.0), DhtTime) == [] and Clock(5.0)() == 5.0
    assert mismatches(lambda when: 0.0, DhtTime) == ["DhtTime.__call__: missing [], extra required ['when']"]
