"""The checks of `swarm-node doctor` against the swarm (doctor.py runs them). They share one DHT
peer (`SwarmProbe`, started the way `join` starts the node's, with a throwaway identity)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from swarm_node.swarm import clock
from swarm_node.node import preflight
from swarm_node.config import NodeConfig
from swarm_node.ops.doctor.checks import FAIL, PASS, SKIP, WARN, Result, failed_result, check_ports
from swarm_node.util.errors import SwarmNodeError


def _host_port(addr: str) -> tuple[str, int] | None:
    parts = addr.split("/")
    try:
        for proto in ("ip4", "ip6", "dns", "dns4", "dns6"):
            if proto in parts and "tcp" in parts:
                return parts[parts.index(proto) + 1], int(parts[parts.index("tcp") + 1])
    except (IndexError, ValueError):
        return None
    return None


def dial(addr: str, timeout: float) -> tuple[float | None, str]:
    """Seconds a TCP connection to the peer's address took (None if it failed) and why it failed."""
    hp = _host_port(addr)
    if hp is None:
        return None, "no TCP address in it (only /ip4|ip6|dns/.../tcp/... can be dialled directly)"
    t0 = time.perf_counter()
    try:
        with socket.create_connection(hp, timeout=timeout):
            return time.perf_counter() - t0, ""
    except OSError as e:
        return None, e.strerror or str(e) or type(e).__name__


def check_initial_peers(cfg: NodeConfig, timeout: float = 5.0) -> Result:
    peers = cfg.swarm.initial_peers
    if not peers:
        return Result(SKIP, "none given: join would start a new swarm")
    try:
        preflight.check_initial_peers(peers)
    except SwarmNodeError as e:
        return failed_result(e)
    found, bad = [], []
    for addr in peers:
        seconds, why = dial(addr, timeout)
        (found if seconds is not None else bad).append(f"{addr} ({seconds * 1000:.0f} ms)" if seconds is not None
                                                        else f"{addr}: {why}")
    if not found:
        return Result(FAIL, "unreachable: " + "; ".join(bad),
                      "check the address (copy it from the node's 'join through' line), that the node is running, "
                      "and that no firewall blocks its TCP port")
    if bad:
        return Result(WARN, f"reachable: {'; '.join(found)}; unreachable: {'; '.join(bad)}",
                      "drop or fix the unreachable addresses")
    return Result(PASS, "dialled " + "; ".join(found))


class SwarmProbe:
    """One DHT peer for the swarm checks, started like the node's (mode, relays, ports) with a
    throwaway identity; when the configured port is taken (a node already runs here) it listens on
    a free port."""

    def __init__(self, cfg: NodeConfig, timeout: float) -> None:
        self.cfg = cfg
        self.timeout = timeout
        self.transport: Any = None
        self.error: Result | None = None
        self.nat_refused = False
        self.start_s = 0.0

    def start(self) -> Result:
        from swarm_node.node.assemble import start_transport

        s = self.cfg.swarm
        overrides = {"startup_timeout_s": self.timeout, "start_attempts": 1}
        if check_ports(self.cfg).status == FAIL:
            overrides["host_maddrs"] = ["/ip4/0.0.0.0/tcp/0"]
        swarm = s.model_copy(update=overrides)
        # A throwaway identity: a node running from the same node directory keeps its own.
        self._scratch = tempfile.mkdtemp(prefix="swarm-node-doctor-")
        t0 = time.perf_counter()
        try:
            self.transport = start_transport(swarm, Path(self._scratch))
        except Exception as e:  # noqa: BLE001  (every start failure is a result to show)
            self.nat_refused = "can't access this node" in str(e)
            if self.nat_refused and not s.client_mode:  # go on as a client to run the other checks
                try:
                    self.transport = start_transport(swarm.model_copy(update={"client_mode": True}),
                                                     Path(self._scratch))
                except Exception:  # noqa: BLE001
                    self.transport = None
            self.error = failed_result(e)
            return self.error
        self.start_s = time.perf_counter() - t0
        return Result(PASS, f"joined in {self.start_s:.1f} s ({'client' if s.client_mode else 'full'} DHT peer)")

    def shutdown(self) -> None:
        if self.transport is not None:
            self.transport.shutdown()
        if getattr(self, "_scratch", None):
            shutil.rmtree(self._scratch, ignore_errors=True)


def read_routes(path: str = "/proc/net/route") -> list[tuple[int, int, int]]:
    """IPv4 routes as (destination, mask, gateway), each the address's bytes read little-endian
    (the kernel prints them so in hex); [] if unreadable."""
    out = []
    try:
        for line in Path(path).read_text().splitlines()[1:]:
            f = line.split()
            out.append((int(f[1], 16), int(f[7], 16), int(f[2], 16)))
    except (OSError, ValueError, IndexError):
        return []
    return out


def source_ip(peer_ip: str) -> str | None:
    """The local address this host uses to reach `peer_ip` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer_ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def nat_guess(local_ip: str, peer_ip: str, routes: list[tuple[int, int, int]]) -> tuple[str, str]:
    """(verdict, why): "public" (this host's address is public), "lan" (the peer is on a directly
    connected network), "nat" (a private address routed through a gateway: behind NAT, most likely)
    or "unknown". A heuristic: hivemind's bootstrap ping-back reuses the connection this host
    opened, so it cannot tell a NAT apart, and libp2p's AutoNAT verdict is not exposed."""
    local, peer = ipaddress.ip_address(local_ip), ipaddress.ip_address(peer_ip)
    if peer.is_loopback or local == peer:
        return "lan", f"the initial peer {peer_ip} is this host (test from another machine too)"
    if local.is_global:
        return "public", f"this host's address {local_ip} is public"
    peer_n = int.from_bytes(peer.packed, "little")  # /proc/net/route's byte order
    matching = [(bin(mask).count("1"), gw) for dest, mask, gw in routes if peer_n & mask == dest]
    if not matching:
        return "unknown", f"no route to {peer_ip} found"
    _, gateway = max(matching)
    if gateway == 0:
        return "lan", f"{peer_ip} is on a network this host is directly on ({local_ip})"
    return "nat", f"this host reaches {peer_ip} through a gateway from the private address {local_ip}"


def check_reachability(probe: SwarmProbe) -> Result:
    s = probe.cfg.swarm
    fix_nat = ("set swarm.client_mode = true (outgoing connections only), or swarm.use_auto_relay = true with a "
               "`swarm-node bootstrap` at a public address as initial peer, or forward the TCP port and set "
               "swarm.announce_maddrs")
    if s.client_mode:
        return Result(PASS, "client mode: no incoming connections needed (peers cannot join through this node)")
    if probe.nat_refused:
        return Result(FAIL, "the initial peers could not dial back to this host (behind NAT or a firewall); "
                            "hivemind refuses a full DHT peer it cannot reach", fix_nat)
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    from swarm_node.swarm.addresses import is_local_only, is_relay_circuit

    usable = probe.transport.usable_maddrs
    if any(is_relay_circuit(a) for a in usable):
        return Result(PASS, "reachable through a relay: " + ", ".join(usable))
    if not s.initial_peers:
        public = [a for a in usable if not is_local_only(a)]
        return Result(WARN, "not tested (no initial peer to compare with); addresses: " + (", ".join(public) or "none"),
                      "run doctor with -p <a peer> to test the path to the swarm")
    if s.announce_maddrs:
        return Result(PASS, "announces " + ", ".join(s.announce_maddrs) + " (make sure that port is forwarded here)")
    hp = _host_port(s.initial_peers[0])
    local = source_ip(hp[0]) if hp else None
    if local is None:
        return Result(SKIP, "no route to the initial peer's IP address")
    verdict, why = nat_guess(local, hp[0], read_routes())
    if verdict == "nat":
        return Result(WARN, f"probably behind NAT: {why}; peers cannot open connections to this node", fix_nat)
    return Result(PASS, f"{why}: peers can connect to this node unless a firewall blocks its port")


def check_relay(probe: SwarmProbe) -> Result:
    s = probe.cfg.swarm
    if not s.use_auto_relay or s.client_mode:
        return Result(SKIP, "swarm.use_auto_relay is off" + (" (client mode needs none)" if s.client_mode else ""))
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    from swarm_node.swarm.addresses import is_relay_circuit

    circuits = [a for a in probe.transport.usable_maddrs if is_relay_circuit(a)]
    if circuits:
        return Result(PASS, "relay circuits through the initial peers: " + ", ".join(circuits))
    return Result(WARN, "no relay circuit listed: the initial peers must run `swarm-node bootstrap` at a public address",
                  "use a public bootstrap as initial peer; libp2p reserves a slot ~3 minutes after start")


def check_round_trip(probe: SwarmProbe) -> Result:
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start")
    t = probe.transport
    data = b"swarm-node doctor " + os.urandom(16)
    t0 = time.perf_counter()
    digest = t.put_blob(data, t.dht_time() + 60.0, timeout=probe.timeout)
    stored = time.perf_counter() - t0
    got = t.get_blobs([digest], timeout=probe.timeout)
    total = time.perf_counter() - t0
    if got.found.get(digest) != data:
        return Result(FAIL, f"stored a record but could not read it back ({got.failed.get(digest, 'missing')})",
                      "the swarm's DHT peers do not answer: check that nodes run and are reachable (status -p ...)")
    return Result(PASS, f"stored and read back in {total * 1000:.0f} ms (store {stored * 1000:.0f} ms)")


def check_clock(probe: SwarmProbe) -> Result:
    if probe.transport is None:
        return Result(SKIP, "the DHT did not start" if probe.error is None else probe.error.detail)
    from swarm_node.swarm.clock_probe import measure

    s = probe.cfg.swarm
    est = measure(probe.transport, s.swarm_id, s.initial_peers, timeout=probe.timeout)
    limit = clock.protocol_limit_s(s.window_seconds, s.staleness_steps)
    v = clock.verdict(est, limit)
    rule = f"limits: {clock.HIVEMIND_SKEW_S:.0f} s for hivemind's bootstrap, {limit:.0f} s for the rollout windows"
    if v == "unknown":
        return Result(SKIP, f"no peer answered a ping ({rule})")
    if v == "refuse":
        return Result(FAIL, f"{est.describe()}; {rule}", clock.SYNC_FIX)
    if v == "warn":
        return Result(WARN, f"{est.describe()}; {rule}", clock.SYNC_FIX)
    return Result(PASS, f"{est.describe()}; {rule}")
