"""`swarm-node bootstrap`: a DHT-only peer that other nodes join through. No model, no training.

* Persistent identity: the key in `<node_dir>/identity.key` or `--identity FILE` (created once,
  0600, written atomically; the libp2p key format, so a key made by `hivemind-dht` or
  deploy/bootstrap_identity.py works), so the peer id, and with it the multiaddr nodes are
  given, survives restarts.
* Supervised children: the DHT process shuts down (and stops its p2p daemon) when this process
  dies, even by kill -9, and the daemon is killed by the kernel if the DHT process dies; if the
  DHT process exits on its own, this process exits non-zero with one line saying so, so a service
  manager restarts the whole tree rather than leaving a half.
* Prints the multiaddrs others can use (addresses.py: announce addresses when given, never
  loopback), and serves /metrics (live peers, routing table size, stored keys, re-dials, uptime).
* Relaying: it declares itself publicly reachable, so libp2p serves as a circuit relay for nodes
  behind NAT that set `swarm.use_auto_relay` (addresses.py).
* Self-healing membership (membership.py), like every node: after an outage it re-dials the
  peers it last saw, so a bootstrap cut off for a while rejoins the swarm by itself.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from swarm_node.config import NodeConfig

log = logging.getLogger(__name__)

HEALTH_EVERY_S = 5.0


class BootstrapExit(RuntimeError):
    """The bootstrap cannot go on; the message says why and what to do."""


def print_addresses(transport: Any) -> None:
    from swarm_node.swarm.addresses import join_hint

    usable = transport.usable_maddrs
    print("swarm-node bootstrap: peer id", transport.peer_id, flush=True)
    for maddr in usable:
        print("swarm-node bootstrap: join through", maddr, flush=True)
    hint = join_hint(usable, client_mode=False)
    if hint:
        print("swarm-node bootstrap:", hint, flush=True)


def health_metrics(transport: Any, started: float) -> dict[str, float]:
    out = {k: float(v) for k, v in transport.health().items()}
    out["uptime_seconds"] = time.monotonic() - started
    return out


def run_bootstrap(cfg: NodeConfig, identity_file: Path | None = None, stop: threading.Event | None = None) -> None:
    """Serve as a bootstrap peer until SIGINT/SIGTERM (or `stop` is set). The identity is
    `identity_file` (created if missing) or `<node_dir>/identity.key`. Raises BootstrapExit when the
    DHT cannot start or its process dies under it."""
    from swarm_node.observe.prometheus import PrometheusExporter
    from swarm_node.swarm.dht import HivemindTransport, SwarmConnectError
    from swarm_node.swarm.identity import IDENTITY_FILENAME, load_or_create_key

    path = Path(identity_file) if identity_file is not None else Path(cfg.node_dir) / IDENTITY_FILENAME
    swarm = cfg.swarm.model_copy(update={"client_mode": False})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # declared public: it offers relaying to nodes behind NAT (swarm.use_auto_relay) at once
        transport = HivemindTransport.from_config(swarm, load_or_create_key(path), reachability="public")
    except (SwarmConnectError, ValueError, OSError) as e:
        raise BootstrapExit(f"{e} (check --initial-peer, --host-maddr and the identity file {path})") from e
    exporter = None
    started = time.monotonic()
    try:
        if stop is None:
            stop = threading.Event()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, lambda *_: stop.set())
        print_addresses(transport)
        if cfg.metrics.prometheus_addr:
            exporter = PrometheusExporter(cfg.metrics.prometheus_addr)
            exporter.start()
            print(f"swarm-node bootstrap: metrics on http://{exporter.host}:{exporter.port}/metrics", flush=True)
        while not stop.wait(HEALTH_EVERY_S):
            if not transport.is_alive:
                raise BootstrapExit(f"the DHT process exited (exit code {transport.exit_code}); "
                                    "restart swarm-node bootstrap")
            if exporter is not None:
                exporter.update(health_metrics(transport, started))
    finally:
        if exporter is not None:
            exporter.stop()
        transport.shutdown()
