"""Hosts on one machine: Linux network namespaces on a bridge, a rate-limited uplink, a host behind NAT.

Everything lives inside namespaces this module creates (names `sn<id>-<host>`, a random id per
run), with addresses in 10.213.<k>.0/24: public hosts on 10.213.<k>.0/25 around a bridge in its
own "switch" namespace, and a private LAN 10.213.<k>.128/25 behind a NAT router (iptables
MASQUERADE). Nothing touches the root namespace's interfaces, routes or firewall. `close()`
kills every process left in the namespaces and deletes them (also after a failure).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field


def missing_requirements() -> str | None:
    """Why this machine cannot build the topology, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, iptables)"
    for tool in ("ip", "tc", "iptables"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (tests/multihost/setup.sh installs it)"
    return None


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


@dataclass
class Host:
    name: str  # the namespace
    ip: str
    nat: bool = False


@dataclass
class Topology:
    """Build with `Topology.create(...)`; use `host(name).ip`, `exec_args(name)`; always `close()`."""

    tag: str
    subnet: int
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, public: list[str], natted: list[str], rate_limited: dict[str, str]) -> Topology:
        """`public` hosts on the bridge, `natted` hosts behind one NAT router, `rate_limited`
        {host: rate} shapes that host's uplink with a token bucket (tc tbf)."""
        topo = cls(tag=secrets.token_hex(2), subnet=10 + secrets.randbelow(240))
        try:
            topo._build(public, natted, rate_limited)
        except BaseException:
            topo.close()
            raise
        return topo

    def ns(self, short: str) -> str:
        return f"sn{self.tag}-{short}"

    def _add_ns(self, short: str) -> str:
        name = self.ns(short)
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _build(self, public: list[str], natted: list[str], rate_limited: dict[str, str]) -> None:
        net = f"10.213.{self.subnet}"
        sw = self._add_ns("sw")
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        ports = [(h, f"{net}.{10 + i}") for i, h in enumerate(public)]
        if natted:
            ports.append(("nat", f"{net}.5"))
        for short, ip in ports:
            name = self._add_ns(short)
            sh("ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p-{short}", "netns", sw)
            sh("ip", "-n", sw, "link", "set", f"p-{short}", "master", "br0")
            sh("ip", "-n", sw, "link", "set", f"p-{short}", "up")
            sh("ip", "-n", name, "addr", "add", f"{ip}/25", "dev", "eth0")
            sh("ip", "-n", name, "link", "set", "eth0", "up")
            if short != "nat":
                self.hosts[short] = Host(name, ip)
        if natted:
            router = self.ns("nat")
            sh("ip", "link", "add", "eth1", "netns", router, "type", "veth", "peer", "name", "lan", "netns", sw)
            sh("ip", "-n", sw, "link", "add", "br1", "type", "bridge")
            sh("ip", "-n", sw, "link", "set", "lan", "master", "br1")
            sh("ip", "-n", sw, "link", "set", "lan", "up")
            sh("ip", "-n", sw, "link", "set", "br1", "up")
            sh("ip", "-n", router, "addr", "add", f"{net}.129/25", "dev", "eth1")
            sh("ip", "-n", router, "link", "set", "eth1", "up")
            sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            sh("ip", "netns", "exec", router, "iptables", "-t", "nat", "-A", "POSTROUTING",
               "-s", f"{net}.128/25", "-o", "eth0", "-j", "MASQUERADE")
            for i, short in enumerate(natted):
                name = self._add_ns(short)
                ip = f"{net}.{130 + i}"
                sh("ip", "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p-{short}",
                   "netns", sw)
                sh("ip", "-n", sw, "link", "set", f"p-{short}", "master", "br1")
                sh("ip", "-n", sw, "link", "set", f"p-{short}", "up")
                sh("ip", "-n", name, "addr", "add", f"{ip}/25", "dev", "eth0")
                sh("ip", "-n", name, "link", "set", "eth0", "up")
                sh("ip", "-n", name, "route", "add", "default", "via", f"{net}.129")
                self.hosts[short] = Host(name, ip, nat=True)
        for short, rate in rate_limited.items():
            sh("ip", "netns", "exec", self.hosts[short].name, "tc", "qdisc", "add", "dev", "eth0", "root",
               "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")

    def host(self, short: str) -> Host:
        return self.hosts[short]

    def exec_args(self, short: str) -> list[str]:
        """Prefix that runs a command inside host `short`'s namespace."""
        return ["ip", "netns", "exec", self.hosts[short].name]

    def set_link(self, short: str, up: bool) -> None:
        """Plug or unplug host `short`'s cable (its port on the switch)."""
        sh("ip", "-n", self.ns("sw"), "link", "set", f"p-{short}", "up" if up else "down")

    def pids(self, short: str) -> list[int]:
        out = sh("ip", "netns", "pids", self.ns(short), check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def close(self) -> None:
        for name in reversed(self.namespaces):
            out = sh("ip", "netns", "pids", name, check=False).stdout.split()
            for pid in out:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
        self.namespaces.clear()
