"""Clock skew: the limits, the estimate from pings, and the join check over an in-memory swarm
whose node clocks are offset (simulated skew: the system clock is not touched)."""

from __future__ import annotations

import logging

import pytest

from protocol.messages import NodeStatus
from swarm_node.swarm import clock
from swarm_node.util.errors import describe
from swarm_node.swarm.clock_probe import check_join_clock, measure
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

SWARM = "clock-test"


def test_limits_follow_the_window_rule():
    assert clock.window_tolerance_s(30.0, 4) == 120.0
    assert clock.protocol_limit_s(30.0, 4) == 60.0
    assert clock.protocol_limit_s(1.0, 1) == clock.HIVEMIND_SKEW_S  # never below hivemind's bootstrap limit


def test_estimate_is_the_median_of_round_trip_midpoints():
    samples = [clock.PingSample("a", 100.0, 150.0, 100.2),   # peer 49.9 s ahead of us
               clock.PingSample("b", 100.0, 150.1, 100.4),   # 49.9
               clock.PingSample("c", 100.0, 9999.0, 100.1)]  # one wild clock does not move the median
    est = clock.estimate(samples)
    assert est.offset_s == pytest.approx(49.9)
    assert est.peers == 3 and est.max_rtt_s == pytest.approx(0.4)
    assert clock.verdict(est, 60.0) == "warn"
    assert clock.verdict(est, 40.0) == "refuse"
    assert clock.verdict(clock.estimate([clock.PingSample("a", 1.0, 1.5, 2.0)]), 60.0) == "ok"
    assert clock.verdict(None, 60.0) == "unknown" and clock.estimate([]) is None


def _swarm(offsets: list[float]) -> list[MemoryTransport]:
    swarm = MemorySwarm()
    nodes = [MemoryTransport(swarm, f"peer{i}", clock_offset_s=off) for i, off in enumerate(offsets)]
    for t in nodes:
        RolloutExchange(t, SWARM, vocab_size=1).publish_status(NodeStatus(
            peer_id=t.peer_id, role="trainer", model_id="m", step=1, timestamp=t.dht_time(),
            maddrs=(f"/ip4/127.0.0.1/tcp/1/p2p/{t.peer_id}",)))
    return nodes


def test_join_refuses_a_clock_beyond_the_protocol_limit():
    *peers, me = _swarm([0.0, 0.0, 0.0, -90.0])  # this node is 90 s behind
    with pytest.raises(clock.ClockSkewError) as info:
        check_join_clock(me, SWARM, [], window_seconds=30.0, staleness_steps=4)
    line = describe(info.value).line()
    assert "90.0 s behind the swarm (median of 3 peers" in line and "tolerate 60 s" in line
    assert "timedatectl set-ntp true" in line and info.value.exit_code == 1


def test_join_warns_between_hivemind_and_protocol_limits(caplog):
    *peers, me = _swarm([0.0, 0.0, 20.0])  # 20 s ahead
    with caplog.at_level(logging.WARNING):
        est = check_join_clock(me, SWARM, [], window_seconds=30.0, staleness_steps=4)
    assert est.offset_s == pytest.approx(-20.0, abs=0.01)
    assert "20.0 s ahead of the swarm" in caplog.text and "set-ntp" in caplog.text


def test_synchronised_clock_passes_and_no_peer_is_unknown():
    *peers, me = _swarm([0.0, 0.0, 0.5])
    assert abs(check_join_clock(me, SWARM, [], window_seconds=30.0, staleness_steps=4).offset_s) < 1.0
    alone = _swarm([0.0])[0]
    assert measure(alone, SWARM, []) is None
    assert check_join_clock(alone, SWARM, [], window_seconds=30.0, staleness_steps=4) is None


def test_peers_without_an_address_are_not_pinged():
    *peers, me = _swarm([0.0, 0.0, 0.0])
    client = MemoryTransport(peers[0]._swarm, "client-peer", clock_offset_s=500.0)  # client mode: no maddrs
    RolloutExchange(client, SWARM, vocab_size=1).publish_status(NodeStatus(
        peer_id=client.peer_id, role="trainer", model_id="m", step=1, timestamp=client.dht_time()))
    est = measure(me, SWARM, [])
    assert est.peers == 2 and abs(est.offset_s) < 1.0
