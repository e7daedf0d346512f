"""Observers: `swarm-node status` and `swarm-node dashboard` join the swarm in client mode, train
nothing, and read the nodes' status records."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from swarm_node.config import SwarmConfig


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (through `lifecycle`, so the command exits 130/143)."""
    from swarm_node import lifecycle

    stop = threading.Event()
    lifecycle.install_signal_handlers()
    lifecycle.on_stop(lambda _signum: stop.set())
    return stop


class SwarmStatusSource:
    """Reads live status records from the swarm (the dashboard's StatusSource)."""

    def __init__(self, exchange: Any, timeout: float) -> None:
        self.exchange = exchange
        self.timeout = timeout

    def read(self) -> list[Any]:
        return list(self.exchange.read_statuses(timeout=self.timeout))


def connect_observer(initial_peers: Sequence[str], swarm_id: str, node_dir: Path | None = None,
                     timeout: float = 60.0) -> tuple[Any, Any]:
    """A client-mode DHT peer plus an exchange to read status records. Returns (transport, exchange).
    Joining waits at most `timeout` seconds (one attempt): an observer should answer quickly."""
    from swarm_node.assemble import start_transport
    from swarm_node.swarm.exchange import RolloutExchange

    node_dir = node_dir or Path(tempfile.mkdtemp(prefix="swarm-node-observer-"))
    cfg = SwarmConfig(swarm_id=swarm_id, initial_peers=list(initial_peers), client_mode=True,
                      startup_timeout_s=timeout, start_attempts=1)
    transport = start_transport(cfg, node_dir)
    return transport, RolloutExchange(transport, swarm_id, vocab_size=1)  # reads status records only


def status_rows(statuses: Sequence[Any]) -> list[dict[str, Any]]:
    """One flat row per peer (newest record per peer), sorted by peer id."""
    latest: dict[str, Any] = {}
    for st in statuses:
        if st.peer_id not in latest or st.timestamp > latest[st.peer_id].timestamp:
            latest[st.peer_id] = st
    rows = []
    for peer_id in sorted(latest):
        st = latest[peer_id]
        m = st.metrics
        rows.append({
            "peer_id": peer_id, "role": st.role, "model_id": st.model_id, "step": st.step,
            "timestamp": st.timestamp, "maddrs": list(st.maddrs),
            "reward": m.get("reward_mean"), "accuracy": m.get("accuracy"),
            "peer_samples_used": m.get("peer_samples_used"), "filtered": m.get("filtered"),
            "tokens_per_s": m.get("tokens_per_s"), "metrics": dict(m),
        })
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_table(rows: Sequence[dict[str, Any]], now: float) -> Table:
    table = Table(title=f"swarm: {len(rows)} live peers")
    for col in ("peer", "model", "step", "reward", "acc", "peer used", "filtered", "tok/s", "age"):
        table.add_column(col, justify="left" if col in ("peer", "model") else "right")
    for r in rows:
        table.add_row(r["peer_id"][:12] + "…", r["model_id"], str(r["step"]), _fmt(r["reward"], ".3f"),
                      _fmt(r["accuracy"], ".3f"), _fmt(r["peer_samples_used"], ".0f"),
                      _fmt(r["filtered"], ".0f"), _fmt(r["tokens_per_s"], ".1f"), f"{now - r['timestamp']:.0f}s")
    return table


def run_status(initial_peers: Sequence[str], swarm_id: str, *, as_json: bool, watch: bool,
               interval: float, timeout: float) -> None:
    transport, exchange = connect_observer(initial_peers, swarm_id, timeout=timeout)
    console = Console()
    try:
        if as_json and not watch:
            print(json.dumps(status_rows(exchange.read_statuses(timeout=timeout)), indent=1))
            return
        if not watch:
            console.print(render_table(status_rows(exchange.read_statuses(timeout=timeout)), transport.dht_time()))
            return
        stop = stop_on_signals()
        with Live(console=console, refresh_per_second=1) as live:
            while not stop.is_set():
                rows = status_rows(exchange.read_statuses(timeout=timeout))
                live.update(render_table(rows, transport.dht_time()))
                stop.wait(interval)
    finally:
        transport.shutdown()


def run_dashboard(initial_peers: Sequence[str], swarm_id: str, *, host: str, port: int,
                  poll_interval: float = 2.0) -> None:
    from swarm_node.dashboard.server import DashboardServer

    transport, exchange = connect_observer(initial_peers, swarm_id)
    server = DashboardServer(SwarmStatusSource(exchange, timeout=10.0), host=host, port=port,
                             poll_interval_s=poll_interval)
    stop = stop_on_signals()
    try:
        server.start()
        print(f"dashboard: {server.url}", flush=True)
        while not stop.wait(1.0):
            server.check()
    finally:
        server.stop()
        transport.shutdown()
