"""The Prometheus exporter: a node's (or bootstrap's) latest metrics on `http://<addr>/metrics`.

Metric names and their help texts are metric_names.py's contract; this module only serves them. The
per-peer gauges of the peer ledger (`PEER_GAUGES`, labelled `peer`) are defined here: the top K
peers by samples taken (`metrics.prometheus_top_peers`) by id, the rest summed under `other`, so
a swarm of any size adds at most K + 1 label values per gauge. `ledger_peer_tokenizer` (value 1)
names each of the top K peers' tokenizer by its short label and whether it is this node's
(`same`: true, false or unknown): one series per shown peer, the old one removed when it changes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from swarm_node.peers.ledger import OTHER, top_peers
from swarm_node.metric_names import (
    DROPPED_PREFIX,
    GIVEN_DROPPED_PREFIX,
    METRICS,
    NAME_RE,
    TOTAL_DROPPED_PREFIX,
)
from swarm_node.observe.metrics import as_number
from swarm_node.util.inert import inert

# name (after the prefix; `ledger_`, apart from the step metrics) -> (value of a ledger row, help text);
# counts are since the ledger began (it survives restarts), so these are gauges
PEER_GAUGES: dict[str, tuple[Any, str]] = {
    "ledger_groups_offered": (lambda r: r["offered"], "Groups (and index records) of a peer this node judged."),
    "ledger_groups_taken": (lambda r: r["taken"], "Groups of a peer that became training samples."),
    "ledger_groups_dropped": (lambda r: r["dropped"], "Groups (and index records) of a peer dropped, any reason."),
    "ledger_samples": (lambda r: r["samples"], "Samples of a peer trained on (filtered ones included)."),
    "ledger_samples_gradient": (lambda r: r["gradient"], "Samples of a peer that carried gradient."),
    "ledger_samples_filtered": (lambda r: r["filtered"], "Samples of a peer the filter dropped."),
    "ledger_samples_crosstok": (lambda r: r["crosstok"], "Samples of a peer from another tokenizer (re-tokenized here)."),
    "ledger_samples_crosstok_gradient": (lambda r: r["crosstok_gradient"],
                                         "Samples of a peer from another tokenizer that carried gradient."),
    "ledger_kl_mean": (lambda r: r["kl"]["mean"], "Mean per-sample KL of a peer's samples (configured estimator)."),
    "ledger_is_weight_mean": (lambda r: r["is_weight"]["mean"], "Mean importance weight pi_old/pi_gen of a peer's samples."),
    "ledger_reward_mean": (lambda r: r["reward"]["mean"], "Mean reward (recomputed here) of a peer's samples."),
    "ledger_reputation_good": (lambda r: r["reputation"]["good"], "Decayed count of a peer's accepted groups."),
    "ledger_reputation_faults": (lambda r: r["reputation"]["faults"], "Decayed count of a peer's faults."),
}
TOKENIZER_GAUGE = "ledger_peer_tokenizer"
TOKENIZER_HELP = "A peer's tokenizer (1): fingerprint label, and whether it is this node's (same)."


def _tokenizer_labels(r: Mapping[str, Any]) -> tuple[str, str, str]:
    same = r.get("tokenizer_same")
    # a peer named its tokenizer: the label is inert (util.inert) for whoever prints the exposition
    return inert(r["peer_id"]), inert(r.get("tokenizer_label", "-")), "unknown" if same is None else str(bool(same)).lower()


class PrometheusExporter:
    """Serve a node's latest step metrics on `http://<addr>/metrics`.

    Every documented metric becomes a gauge `swarm_node_<name>` the first time it is set (so
    metrics a node never reports do not show as zeros); undocumented names are exported the same
    way. `dropped_<reason>` values are per-step counts added to the counter
    `swarm_node_dropped_total{reason="<reason>"}`, which is the running total, so the
    `total_dropped_<reason>` entries are not exported again. `given_dropped_<reason>` values (what
    peers' receipts say they dropped of this node's groups, `given.py`) set the gauge
    `swarm_node_given_dropped{reason="<reason>"}`; a reason absent from the latest metrics is
    removed, so its label values stay the few the node reports. Each exporter has its own
    registry, so several can run in one process (tests, `swarm-node local`).
    """

    PREFIX = "swarm_node_"

    def __init__(self, addr: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.host, self.requested_port = parse_addr(addr)
        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges: dict[str, Any] = {}
        self._dropped = Counter(
            self.PREFIX + "dropped",
            "Peer data dropped before training, by reason (malformed, stale, wrong tokenizer, ...).",
            ["reason"],
            registry=self.registry,
        )
        self._given_dropped = Gauge(
            self.PREFIX + "given_dropped",
            "Groups of this node that peers' receipts say they dropped, by reason (latest read).",
            ["reason"],
            registry=self.registry,
        )
        self._given_reasons: set[str] = set()
        self._peer_gauges: dict[str, Any] = {}
        self._peer_labels: set[str] = set()
        self._tokenizer_labels: set[tuple[str, str, str]] = set()  # (peer, tokenizer, same) shown
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (useful when the address asked for port 0)."""
        if self._server is None:
            raise RuntimeError("exporter is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        from prometheus_client import start_http_server

        if self._server is not None:
            raise RuntimeError("exporter already started")
        self._server, self._thread = start_http_server(self.requested_port, addr=self.host, registry=self.registry)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving; returns within about `timeout_s`."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._server, self._thread = None, None

    def update(self, metrics: Mapping[str, float]) -> None:
        """Publish one step's metrics."""
        from prometheus_client import Gauge

        with self._lock:
            given = {name[len(GIVEN_DROPPED_PREFIX):]: float(as_number(name, value))
                     for name, value in metrics.items() if name.startswith(GIVEN_DROPPED_PREFIX)}
            if given or any(name.startswith("given_") for name in metrics):  # the latest read of receipts
                for gone in self._given_reasons - set(given):
                    self._given_dropped.remove(gone)
                for reason, v in given.items():
                    self._given_dropped.labels(reason=reason).set(v)
                self._given_reasons = set(given)
            for name, value in metrics.items():
                v = float(as_number(name, value))
                if name.startswith(GIVEN_DROPPED_PREFIX):
                    continue
                if name.startswith(DROPPED_PREFIX):
                    reason = name[len(DROPPED_PREFIX):]
                    if not (math.isfinite(v) and v >= 0):
                        raise ValueError(f"{name} is a per-step count, finite and >= 0; got {v}")
                    self._dropped.labels(reason=reason).inc(v)
                    continue
                if name.startswith(TOTAL_DROPPED_PREFIX):  # the counter above already is the total
                    continue
                gauge = self._gauges.get(name)
                if gauge is None:
                    if not NAME_RE.match(name):
                        raise ValueError(f"metric name {name!r} is not a valid identifier")
                    help_text = METRICS.get(name, f"{name} (undocumented metric).")
                    gauge = Gauge(self.PREFIX + name, help_text, registry=self.registry)
                    self._gauges[name] = gauge
                gauge.set(v)

    def update_peers(self, rows: list[dict[str, Any]], top_k: int) -> None:
        """Publish the peer ledger's rows (`ledger.PeerLedger.rows`): the `top_k` peers with the
        most samples taken by id, the rest under `other`; label values of peers that left the top
        are removed, so the exported series stay bounded."""
        from prometheus_client import Gauge

        shown = top_peers(rows, top_k)
        labels = {r["peer_id"] for r in shown}
        with self._lock:
            if not self._peer_gauges:
                self._peer_gauges = {name: Gauge(self.PREFIX + name, help_text, ["peer"], registry=self.registry)
                                     for name, (_, help_text) in PEER_GAUGES.items()}
                self._tokenizer_gauge = Gauge(self.PREFIX + TOKENIZER_GAUGE, TOKENIZER_HELP,
                                              ["peer", "tokenizer", "same"], registry=self.registry)
            for gone in self._peer_labels - labels:
                for gauge in self._peer_gauges.values():
                    gauge.remove(gone)
            for r in shown:
                for name, (value, _) in PEER_GAUGES.items():
                    self._peer_gauges[name].labels(peer=r["peer_id"]).set(float(value(r)))
            self._peer_labels = labels
            tokenizers = {_tokenizer_labels(r) for r in shown if r["peer_id"] != OTHER}
            for gone in self._tokenizer_labels - tokenizers:
                self._tokenizer_gauge.remove(*gone)
            for t in tokenizers:
                self._tokenizer_gauge.labels(*t).set(1.0)
            self._tokenizer_labels = tokenizers

    def __enter__(self) -> PrometheusExporter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_addr(addr: str) -> tuple[str, int]:
    """'host:port' (IPv6 as '[::1]:9400') -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port {p} out of range in {addr!r}")
    return host, p
