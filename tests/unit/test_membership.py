"""Self-healing membership (re-dial with backoff), usable addresses, per-step health metrics."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from swarm_node import metric_names as m
from swarm_node.observe.health import ALONE_WARN_STEPS, HealthTracker, alone_warning
from swarm_node.swarm.addresses import CLIENT_MODE_HINT, join_hint, relay_maddrs, usable_maddrs
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport
from swarm_node.swarm.membership import Health, MembershipKeeper, split_peer_maddr
from tests.fakes import Clock

ME, P1, P2, P3 = "QmMe", "QmPeerOne", "QmPeerTwo", "QmPeerThree"


class FakeDialer:
    """Health readings scripted per call; re-dials recorded and answered by `answers`."""

    peer_id = ME

    def __init__(self) -> None:
        self.health = Health(live_peers=1, routing_table_size=1, peers={P1: ["/ip4/10.0.0.1/tcp/1"]})
        self.answers = 0
        self.dials: list[list[tuple[str, list[str]]]] = []

    def read_health(self, timeout: float) -> Health | None:
        return self.health

    def redial(self, peers, timeout: float) -> int:
        self.dials.append(list(peers))
        return self.answers


def keeper(dialer: FakeDialer, clock: Clock, **kw) -> MembershipKeeper:
    kw = {"heal_after_s": 6.0, "backoff_base_s": 2.0, "backoff_max_s": 12.0, **kw}
    return MembershipKeeper(dialer, ["/ip4/10.0.0.9/tcp/9/p2p/" + P3], clock=clock, **kw)


def test_redials_initial_and_last_seen_peers_after_grace_with_doubling_backoff():
    clock, dialer = Clock(100.0), FakeDialer()
    k = keeper(dialer, clock)
    k.tick()  # connected: P1 is remembered with its address
    dialer.health = Health(live_peers=0, routing_table_size=0)
    k.tick()
    clock.t += 5.0
    k.tick()
    assert dialer.dials == []  # alone for 5 s < heal_after_s
    clock.t += 1.5
    k.tick()
    assert dialer.dials == [[(P3, ["/ip4/10.0.0.9/tcp/9"]), (P1, ["/ip4/10.0.0.1/tcp/1"])]]
    # Nobody answers: the waits between tries double from 2 s up to 12 s.
    times = [clock()]
    for _ in range(100):
        clock.t += 0.5
        before = len(dialer.dials)
        k.tick()
        if len(dialer.dials) > before:
            times.append(clock())
    gaps = [round(b - a, 1) for a, b in zip(times, times[1:])]
    assert gaps[:4] == [4.0, 8.0, 12.0, 12.0], gaps
    assert k.stats.redials == len(dialer.dials)


def test_backoff_resets_once_peers_are_back_and_answered_redial_resets_too():
    clock, dialer = Clock(0.0), FakeDialer()
    k = keeper(dialer, clock, heal_after_s=0.0)
    dialer.health = Health(live_peers=0, routing_table_size=0)
    for _ in range(3):
        k.tick()
        clock.t += 20.0
    assert k.stats.redials == 3 and k._backoff == 12.0  # 2 -> 4 -> 8 -> 12 (capped)
    dialer.health = Health(live_peers=2, routing_table_size=2, peers={P1: [], P2: []})
    k.tick()
    assert k.stats.alone_since is None and k._backoff == 2.0
    snap = k.snapshot()
    assert snap["live_peers"] == 2.0 and snap["routing_table_size"] == 2.0 and snap["alone_seconds"] == 0.0
    dialer.health, dialer.answers = Health(live_peers=0, routing_table_size=0), 1
    k.tick()
    assert k._backoff == 2.0 and k.stats.redialed_peers == 1


def test_a_routing_table_without_connections_or_the_reverse_counts_as_alone():
    clock, dialer = Clock(0.0), FakeDialer()
    k = keeper(dialer, clock)
    assert k.lonely(Health(live_peers=3, routing_table_size=0))
    assert k.lonely(Health(live_peers=0, routing_table_size=3))
    assert not k.lonely(Health(live_peers=1, routing_table_size=1))


def test_known_peers_are_bounded_and_remembered_from_status_addresses():
    clock, dialer = Clock(0.0), FakeDialer()
    k = keeper(dialer, clock, max_known=3)
    k.remember([f"/ip4/10.1.0.{i}/tcp/5/p2p/Qm{i}" for i in range(10)] + ["/ip4/10.0.0.1/tcp/1", f"/p2p/{ME}"])
    ids = [p for p, _ in k.candidates()]
    assert ids == [P3, "Qm9", "Qm8", "Qm7"]  # initial first, then most recent; never self


def test_no_candidates_no_dial_and_a_busy_dht_is_skipped():
    clock, dialer = Clock(0.0), FakeDialer()
    k = MembershipKeeper(dialer, [], heal_after_s=0.0, clock=clock)
    dialer.health = Health(live_peers=0, routing_table_size=0)
    k.tick()
    assert dialer.dials == []
    dialer.read_health = lambda timeout: None
    assert k.tick() is None


def test_split_peer_maddr():
    assert split_peer_maddr("/ip4/1.2.3.4/tcp/5/p2p/QmX") == ("QmX", "/ip4/1.2.3.4/tcp/5")
    relay = "/ip4/1.2.3.4/tcp/5/p2p/QmR/p2p-circuit/p2p/QmX"
    assert split_peer_maddr(relay) == ("QmX", "/ip4/1.2.3.4/tcp/5/p2p/QmR/p2p-circuit")
    assert split_peer_maddr("/ip4/1.2.3.4/tcp/5") is None


@pytest.mark.parametrize("visible, announce, client, expected", [
    (["/ip4/127.0.0.1/tcp/1/p2p/Q", "/ip4/10.0.0.2/tcp/1/p2p/Q", "/ip6/::1/tcp/1/p2p/Q"], [], False,
     ["/ip4/10.0.0.2/tcp/1/p2p/Q"]),
    (["/ip4/127.0.0.1/tcp/1/p2p/Q"], [], False, ["/ip4/127.0.0.1/tcp/1/p2p/Q"]),  # loopback-only swarm
    (["/ip4/0.0.0.0/tcp/1/p2p/Q"], [], False, []),
    (["/ip4/10.0.0.2/tcp/1/p2p/Q"], [], True, []),
    (["/ip4/192.168.1.5/tcp/1/p2p/Q", "/ip4/203.0.113.7/tcp/31337/p2p/Q",
      "/ip4/10.9.9.9/tcp/4/p2p/R/p2p-circuit/p2p/Q"], ["/ip4/203.0.113.7/tcp/31337"], False,
     ["/ip4/203.0.113.7/tcp/31337/p2p/Q", "/ip4/10.9.9.9/tcp/4/p2p/R/p2p-circuit/p2p/Q"]),
])
def test_usable_maddrs(visible, announce, client, expected):
    assert usable_maddrs(visible, announce=announce, client_mode=client) == expected


def test_relay_maddrs_go_through_each_dialable_relay():
    relays = ["/ip4/203.0.113.7/tcp/31337/p2p/QmR", "/ip4/127.0.0.1/tcp/1/p2p/QmL", "/ip4/203.0.113.8/tcp/1"]
    assert relay_maddrs(relays, "QmMe") == ["/ip4/203.0.113.7/tcp/31337/p2p/QmR/p2p-circuit/p2p/QmMe"]


def test_join_hint():
    assert join_hint([], client_mode=True) == CLIENT_MODE_HINT
    assert "announce_maddrs" in join_hint([], client_mode=False)
    assert join_hint(["/ip4/10.0.0.2/tcp/1/p2p/Q"], client_mode=False) is None


class FakeTransport:
    def __init__(self) -> None:
        self.traffic: Counter = Counter()
        self.state = {"live_peers": 2.0, "routing_table_size": 3.0, "redials": 0.0}

    def health(self) -> dict[str, float]:
        return dict(self.state)


def test_health_metrics_per_step_with_cumulative_drop_totals_and_traffic_deltas():
    t = FakeTransport()
    h = HealthTracker(t)
    t.traffic.update(bytes_out=1000, bytes_in=300, get_timeouts=1)
    first = h.step_metrics(Counter(stale=2), publish_seconds=0.5, gather_seconds=1.25, peer_groups=1)
    t.traffic.update(bytes_out=10, store_failures=2)
    second = h.step_metrics(Counter(stale=1, decode_error=4), publish_seconds=0.1, gather_seconds=0.0, peer_groups=1)
    assert first[m.BYTES_SENT] == 1000 and first[m.BYTES_RECEIVED] == 300 and first[m.INDEX_READ_FAILURES] == 1
    assert second[m.BYTES_SENT] == 10 and second[m.BYTES_RECEIVED] == 0 and second[m.STORE_FAILURES] == 2
    assert first["dropped_stale"] == 2 and second["dropped_stale"] == 1 and "dropped_decode_error" not in first
    assert second["total_dropped_stale"] == 3 and second["total_dropped_decode_error"] == 4
    assert m.dropped_counts(second) == {"stale": 1.0, "decode_error": 4.0}  # totals are not per-step drops
    assert first[m.PUBLISH_SECONDS] == 0.5 and first[m.GATHER_SECONDS] == 1.25
    assert first[m.LIVE_PEERS] == 2 and first[m.ROUTING_TABLE_SIZE] == 3 and first[m.ALONE_STEPS] == 0


def test_alone_steps_count_and_warn(caplog):
    t = FakeTransport()
    t.state.update(live_peers=0.0, routing_table_size=0.0)
    h = HealthTracker(t)
    with caplog.at_level(logging.WARNING, logger="swarm_node.observe.health"):
        out = [h.step_metrics(Counter(), publish_seconds=0, gather_seconds=0, peer_groups=0) for _ in range(7)]
    assert [o[m.ALONE_STEPS] for o in out] == [1, 2, 3, 4, 5, 6, 7]
    warned = [r.getMessage() for r in caplog.records if "alone for" in r.getMessage()]
    assert len(warned) == 7 // ALONE_WARN_STEPS and warned[0].startswith(f"alone for {ALONE_WARN_STEPS} steps")
    assert alone_warning(out[0]) is None and "alone for 7 steps" in alone_warning(out[-1])
    t.state.update(live_peers=1.0, routing_table_size=1.0)
    assert h.step_metrics(Counter(), publish_seconds=0, gather_seconds=0, peer_groups=0)[m.ALONE_STEPS] == 0


def test_alone_without_transport_health_speaks_of_peer_groups_not_routing():
    h = HealthTracker(MemoryTransport(MemorySwarm()))  # the in-memory transport reports no health
    out = [h.step_metrics(Counter(), publish_seconds=0, gather_seconds=0, peer_groups=0) for _ in range(3)]
    assert alone_warning(out[-1]) == "alone for 3 steps: no peer groups received"
    assert h.step_metrics(Counter(), publish_seconds=0, gather_seconds=0, peer_groups=2)[m.ALONE_STEPS] == 0


def test_a_node_without_transport_has_no_network_fields():
    out = HealthTracker(None).step_metrics(Counter(), publish_seconds=0.0, gather_seconds=0.0, peer_groups=0)
    assert m.LIVE_PEERS not in out and m.ALONE_STEPS not in out and m.BYTES_SENT not in out


def test_status_rows_and_table_carry_the_alone_warning():
    from rich.console import Console

    from protocol.messages import NodeStatus
    from swarm_node.observe.observer import render_table, status_rows

    alone = NodeStatus(peer_id="QmAlone", role="trainer", model_id="m", step=9, timestamp=100.0,
                       metrics={m.ALONE_STEPS: 5.0, m.LIVE_PEERS: 0.0, m.ROUTING_TABLE_SIZE: 0.0})
    fine = NodeStatus(peer_id="QmFine", role="trainer", model_id="m", step=9, timestamp=100.0,
                      metrics={m.ALONE_STEPS: 0.0, m.LIVE_PEERS: 3.0})
    rows = {r["peer_id"]: r for r in status_rows([alone, fine])}
    assert "alone for 5 steps" in rows["QmAlone"]["warning"] and rows["QmFine"]["warning"] is None
    assert rows["QmFine"]["live_peers"] == 3.0
    console = Console(record=True, width=160)
    console.print(render_table(list(rows.values()), now=110.0))
    text = console.export_text()
    assert "warning: QmAlone" in text and "alone for 5 steps" in text and "QmFine" not in text.split("warning:")[1]


def test_a_flood_of_status_records_cannot_fill_an_observers_redial_candidates_with_other_hosts() -> None:
    """`status --watch` and the dashboard remember the addresses status records publish: each record
    only its own (`own_maddrs`), so Sybil records listing other hosts' addresses change nothing."""
    from swarm_node.observe.observer import read_and_remember
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.membership import own_maddrs
    from protocol import codec, keys
    from protocol.messages import NodeStatus

    assert own_maddrs(P1, [f"/ip4/10.0.0.1/tcp/1/p2p/{P1}", f"/ip4/10.0.0.2/tcp/1/p2p/{P2}", "/ip4/1.2.3.4/tcp/1"]) == [
        f"/ip4/10.0.0.1/tcp/1/p2p/{P1}"]
    swarm = MemorySwarm()
    honest = MemoryTransport(swarm, peer_id=P1)
    records = [(honest, (f"/ip4/10.0.0.1/tcp/1/p2p/{P1}",))]
    for i in range(20):  # Sybils pointing the observer at a victim's address, 32 at a time
        records.append((MemoryTransport(swarm, peer_id=f"QmSybil{i}"),
                        tuple(f"/ip4/203.0.113.{j}/tcp/80/p2p/QmVictim{j}" for j in range(32))))
    for t, maddrs in records:
        st = NodeStatus(peer_id=t.peer_id, role="trainer", model_id="m", step=1, timestamp=t.dht_time(), maddrs=maddrs)
        shard_key = keys.status_key("s", keys.status_shard(t.peer_id))
        assert t.store_owned(shard_key, codec.encode(st), t.dht_time() + 60)
    clock, dialer = Clock(0.0), FakeDialer()
    observer = MemoryTransport(swarm, peer_id=ME)
    observer.membership = keeper(dialer, clock, max_known=8)
    read_and_remember(RolloutExchange(observer, "s", vocab_size=1), timeout=1.0)
    candidates = dict(observer.membership.candidates())
    assert not any(p.startswith("QmVictim") for p in candidates) and candidates[P1] == ["/ip4/10.0.0.1/tcp/1"]
