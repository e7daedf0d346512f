"""Clock skew over real DHTs on loopback. A node's skew is simulated by offsetting the time its DHT
process answers pings and checks bootstrap answers with (hivemind.dht.protocol's `get_dht_time`,
set before the DHT process forks), never by changing the system clock."""

from __future__ import annotations

import time

import pytest

from protocol.messages import NodeStatus
from swarm_node.swarm import clock
from swarm_node.util.errors import describe

SWARM = "itest-clock"


def _skewed(monkeypatch: pytest.MonkeyPatch, offset: float) -> None:
    import hivemind.dht.protocol as dht_protocol

    monkeypatch.setattr(dht_protocol, "get_dht_time", lambda: time.time() + offset)


def test_pings_measure_a_peer_clock_and_the_join_check_refuses(dht_factory, monkeypatch) -> None:
    from swarm_node.swarm.clock_probe import check_join_clock, measure
    from swarm_node.swarm.exchange import RolloutExchange

    me = dht_factory(SWARM)
    with monkeypatch.context() as m:
        _skewed(m, 75.0)  # the other peer's DHT runs 75 s ahead of this node
        ahead = dht_factory(SWARM)
    assert RolloutExchange(ahead, SWARM, vocab_size=1).publish_status(NodeStatus(
        peer_id=ahead.peer_id, role="trainer", model_id="m", step=1, timestamp=ahead.dht_time(),
        maddrs=tuple(ahead.visible_maddrs)))
    initial = [ahead.visible_maddrs[0]]
    est = measure(me, SWARM, initial)
    assert est is not None and est.offset_s == pytest.approx(75.0, abs=2.0)
    with pytest.raises(clock.ClockSkewError) as info:
        check_join_clock(me, SWARM, initial, window_seconds=30.0, staleness_steps=4)
    assert "behind the swarm" in describe(info.value).line() and "set-ntp" in describe(info.value).line()


def test_bootstrap_beyond_hivemind_limit_is_one_clock_line(dht_factory, monkeypatch) -> None:
    first = dht_factory(SWARM)
    with monkeypatch.context() as m:
        _skewed(m, 10.0)
        with pytest.raises(clock.ClockSkewError) as info:
            dht_factory(SWARM, initial_peers=first.visible_maddrs[:1], start_attempts=1, startup_timeout=20.0)
    line = describe(info.value).line()
    assert "differs from the initial peer's by more than 3 s" in line and "timedatectl" in line
