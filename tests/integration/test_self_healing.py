"""Real DHTs on loopback: a peer that vanishes and comes back (same identity, same address, no
initial peers, so it dials nobody) is re-joined by a node with self-healing membership and not
by one without it; `swarm-node bootstrap` survives nothing of itself after kill -9, keeps its
peer id across restarts, serves /metrics; `swarm-node status` leaves nothing in the temp folder."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from swarm_node.swarm.dht import HivemindTransport
from swarm_node.swarm.identity import load_node_identity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SWARM = "itest-heal"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until(pred, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        time.sleep(0.5)
    return None


def start(node_dir: Path, port: int = 0, peers=(), self_heal: bool = True) -> HivemindTransport:
    return HivemindTransport(load_node_identity(node_dir), SWARM, initial_peers=list(peers),
                             host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"], startup_timeout=30, self_heal=self_heal)


def test_a_returning_peer_is_redialled_only_with_self_healing(tmp_path):
    # Two separate two-peer DHTs, so the nodes under test know nobody but their own peer b.
    ports = {"healing": free_port(), "plain": free_port()}
    made: list[HivemindTransport] = []
    try:
        bs = {k: start(tmp_path / f"b-{k}", p) for k, p in ports.items()}
        made += bs.values()
        nodes = {k: start(tmp_path / k, peers=bs[k].usable_maddrs, self_heal=(k == "healing")) for k in ports}
        made += nodes.values()
        for k, node in nodes.items():
            assert wait_until(lambda n=node: (h := n.read_health()) is not None and h.live_peers >= 1, 20), k
            bs[k].shutdown()
        for k, node in nodes.items():
            assert wait_until(lambda n=node: (h := n.read_health()) is not None and h.live_peers == 0, 30), k
        bs = {k: start(tmp_path / f"b-{k}", p) for k, p in ports.items()}  # same identity and address, no peers
        made += bs.values()
        took = wait_until(lambda: nodes["healing"].peer_id in (bs["healing"].read_health() or b_none()).peers, 40)
        assert took is not None, "the self-healing node did not re-dial the returning peer"
        health = nodes["healing"].read_health()
        assert health.live_peers >= 1 and health.routing_table_size >= 1
        assert nodes["healing"].health()["redials"] >= 1
        # The same wait without self-healing: nobody dials, the two stay apart.
        assert nodes["plain"].peer_id not in bs["plain"].read_health().peers
        assert nodes["plain"].read_health().live_peers == 0
    finally:
        for t in made:
            t.shutdown()


def b_none():
    from swarm_node.swarm.membership import Health

    return Health(live_peers=0, routing_table_size=0)


def child_pids(pid: int) -> set[int]:
    """All descendants of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_bootstrap(node_dir: Path, port: int, metrics_port: int, log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "swarm_node", "bootstrap", "--node-dir", str(node_dir), "--swarm-id", SWARM,
             "--host-maddr", f"/ip4/127.0.0.1/tcp/{port}", "--metrics-addr", f"127.0.0.1:{metrics_port}"],
            stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_bootstrap_kill9_leaves_nothing_and_restarts_as_same_peer_and_status_leaves_no_litter(tmp_path):
    port, metrics_port, log = free_port(), free_port(), tmp_path / "boot.log"
    proc = run_bootstrap(tmp_path / "boot", port, metrics_port, log)
    try:
        assert wait_until(lambda: "join through" in log.read_text(), 90) is not None, log.read_text()
        first_id = re.findall(r"peer id (\S+)", log.read_text())[0]
        addrs = re.findall(r"join through (/\S+)", log.read_text())
        assert addrs == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{first_id}"]  # loopback-only: loopback is the way in
        assert (tmp_path / "boot" / "identity.key").stat().st_mode & 0o777 == 0o600
        body = ""
        for _ in range(30):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            except OSError:
                body = ""
            if "swarm_node_routing_table_size" in body:
                break
            time.sleep(1)
        assert "swarm_node_routing_table_size" in body and "swarm_node_uptime_seconds" in body

        # status: one short-lived client; its throwaway key folder is gone when it exits.
        scratch = tmp_path / "tmp"
        scratch.mkdir()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "swarm_node", "status", "--json", "--swarm-id", SWARM,
                              "-p", addrs[0]], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "TMPDIR": str(scratch)})
        print(f"status took {time.monotonic() - t0:.1f}s")
        assert out.returncode == 0 and out.stdout.strip().startswith("["), out.stderr[-2000:]
        assert not list(scratch.glob("swarm-node-observer-*"))

        children = child_pids(proc.pid)
        assert children, "the bootstrap runs its DHT in a child process"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone = wait_until(lambda: not any(alive(p) for p in children) and port_is_free(port), 30)
        assert gone is not None, f"left behind: {[p for p in children if alive(p)]}, port free: {port_is_free(port)}"

        proc = run_bootstrap(tmp_path / "boot", port, metrics_port, log)
        assert wait_until(lambda: len(re.findall(r"peer id (\S+)", log.read_text())) == 2, 90) is not None
        assert re.findall(r"peer id (\S+)", log.read_text())[1] == first_id

        # kill -9 of the bootstrap and its DHT process at once: the kernel takes the p2p daemon too.
        children = child_pids(proc.pid)
        daemons = {p for p in children if comm(p) == "p2pd"}
        assert daemons
        for pid in [proc.pid, *(children - daemons)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)
        assert wait_until(lambda: not any(alive(p) for p in daemons) and port_is_free(port), 30) is not None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
