"""Observers: `swarm-node status` and `swarm-node dashboard` join the swarm in client mode, train
nothing, and read the nodes' status records.

An observer is one short-lived client-mode DHT peer with a throwaway identity: its key file lives
in a temporary folder only until the DHT has started, so nothing is left behind. Observers that
stay (`status --watch`, `dashboard`) keep self-healing membership on and also re-dial the
addresses the status records publish, so an outage does not leave them blind for good.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich import box
from rich.table import Table
from rich.text import Text

from swarm_node import metric_names as mn
from swarm_node.config import SwarmConfig
from swarm_node.observe.health import alone_warning
from swarm_node.swarm.tokenizers import tokenizer_label, tokenizer_shares
from swarm_node.util.inert import inert


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (through `lifecycle`, so the command exits 130/143)."""
    from swarm_node.util import lifecycle

    stop = threading.Event()
    lifecycle.install_signal_handlers()
    lifecycle.on_stop(lambda _signum: stop.set())
    return stop


def show_node_file(read: Callable[[], Any], render: Callable[[Any], Any], *, as_json: bool, watch: bool,
                   interval: float) -> None:
    """Print what `read()` returns from a node directory: as JSON, as one rich table (`render`), or
    (`watch`) re-read every `interval` seconds and redrawn until Ctrl-C. Shared by the local views
    (`status --peers`, `status --heldout`)."""
    data = read()
    if as_json:
        print(json.dumps(data, indent=1, allow_nan=False))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)  # a pipe or file gets whole lines
    if not watch:
        console.print(render(data))
        return
    stop = stop_on_signals()
    with Live(console=console, refresh_per_second=1) as live:
        while not stop.is_set():
            live.update(render(data))
            stop.wait(interval)
            data = read()


class SwarmStatusSource:
    """Reads live status records from the swarm (the dashboard's StatusSource)."""

    def __init__(self, exchange: Any, timeout: float) -> None:
        self.exchange = exchange
        self.timeout = timeout

    def read(self) -> list[Any]:
        return read_and_remember(self.exchange, self.timeout)


def read_and_remember(exchange: Any, timeout: float) -> list[Any]:
    """Status records of live peers; the addresses each publishes of itself become re-dial candidates."""
    from swarm_node.swarm.membership import own_maddrs

    statuses = list(exchange.read_statuses(timeout=timeout))
    membership = getattr(exchange.transport, "membership", None)
    if membership is not None:
        membership.remember([a for st in statuses for a in own_maddrs(st.peer_id, st.maddrs)])
    return statuses


def connect_observer(initial_peers: Sequence[str], swarm_id: str, node_dir: Path | None = None, *,
                     self_heal: bool = True, timeout: float = 60.0) -> tuple[Any, Any]:
    """A client-mode DHT peer plus an exchange to read status records. Returns (transport, exchange).
    Joining waits at most `timeout` seconds (one attempt): an observer should answer quickly.

    Without `node_dir` the identity is a fresh key in a temporary folder, removed once the DHT is up."""
    from swarm_node.util.lifecycle import start_torch_shm_manager
    from swarm_node.swarm.dht import HivemindTransport
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.identity import load_node_identity

    cfg = SwarmConfig(swarm_id=swarm_id, initial_peers=list(initial_peers), client_mode=True)
    start_torch_shm_manager()  # see its docstring
    scratch = None if node_dir is not None else tempfile.mkdtemp(prefix="swarm-node-observer-")
    try:
        transport = HivemindTransport(
            load_node_identity(Path(node_dir or scratch)), swarm_id, initial_peers=cfg.initial_peers,
            client_mode=True, startup_timeout=timeout, start_attempts=1, self_heal=self_heal)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return transport, RolloutExchange(transport, swarm_id, vocab_size=1)  # reads status records only


def status_rows(statuses: Sequence[Any]) -> list[dict[str, Any]]:
    """One flat row per peer (newest record per peer), sorted by peer id. Its tokenizer: the
    fingerprint its record names, a short label, and how many of the peers whose tokenizer is known
    share it (`tokenizer_peers` of `tokenizer_known`)."""
    latest: dict[str, Any] = {}
    for st in statuses:
        if st.peer_id not in latest or st.timestamp > latest[st.peer_id].timestamp:
            latest[st.peer_id] = st
    shares = tokenizer_shares({p: getattr(st, "tokenizer_fingerprint", "") for p, st in latest.items()})
    rows = []
    for peer_id in sorted(latest):
        st = latest[peer_id]
        m = st.metrics
        rows.append({
            "peer_id": peer_id, "role": st.role, "model_id": st.model_id, "step": st.step,
            "timestamp": st.timestamp, "maddrs": list(st.maddrs),
            "reward": m.get("reward_mean"), "accuracy": m.get("accuracy"),
            "peer_samples_used": m.get("peer_samples_used"), "filtered": m.get("filtered"),
            "tokens_per_s": m.get("tokens_per_s"), "live_peers": m.get("live_peers"),
            "warning": alone_warning(m), "metrics": dict(m), "heldout": heldout_point(m),
            "tokenizer_fingerprint": getattr(st, "tokenizer_fingerprint", ""),
            "tokenizer": tokenizer_label(getattr(st, "tokenizer_fingerprint", "")),
            "tokenizer_peers": shares[peer_id][0], "tokenizer_known": shares[peer_id][1],
        })
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def heldout_point(metrics: dict[str, float]) -> dict[str, float] | None:
    """A status record's latest held-out evaluation: accuracy, lo, hi (95% Wilson), n, step; None without one."""
    if mn.EVAL_ACCURACY not in metrics:
        return None
    names = {"accuracy": mn.EVAL_ACCURACY, "lo": mn.EVAL_LO, "hi": mn.EVAL_HI, "n": mn.EVAL_N, "step": mn.EVAL_STEP}
    return {k: metrics[v] for k, v in names.items() if v in metrics}


def heldout_cell(point: dict[str, float] | None) -> str:
    """'0.23 [0.15,0.35] s20': the latest held-out accuracy, its 95% interval and the step it followed."""
    if point is None:
        return "-"
    interval = f" [{point['lo']:.2f},{point['hi']:.2f}]" if "lo" in point and "hi" in point else ""
    return f"{point['accuracy']:.2f}{interval}" + (f" s{point['step']:.0f}" if "step" in point else "")


def tokenizer_cell(r: dict[str, Any]) -> str:
    """'label n/N': n of the N peers of known tokenizer use this one ('-' when it is unknown)."""
    if not r.get("tokenizer_fingerprint"):
        return "-"
    return f"{r['tokenizer']} {r['tokenizer_peers']}/{r['tokenizer_known']}"


def render_table(rows: Sequence[dict[str, Any]], now: float) -> Table:
    # No outer border (a title glued to a border reads badly in logs); a rule under the header only.
    table = Table(title=f"swarm: {len(rows)} live peers", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("peer", "model", "tokenizer", "step", "reward", "acc", "held-out [95%]", "used", "filt", "tok/s",
                "peers", "age"):
        table.add_column(col, justify="left" if col in ("peer", "model", "tokenizer") else "right")
    warnings = []
    for r in rows:
        cells = [r["peer_id"][:12] + "…", inert(r["model_id"]).rsplit("/", 1)[-1][:24], tokenizer_cell(r),
                 str(r["step"]), _fmt(r["reward"], ".3f"),
                 _fmt(r["accuracy"], ".3f"), heldout_cell(r.get("heldout")), _fmt(r["peer_samples_used"], ".0f"),
                 _fmt(r["filtered"], ".0f"), _fmt(r["tokens_per_s"], ".1f"), _fmt(r.get("live_peers"), ".0f"),
                 f"{now - r['timestamp']:.0f}s"]
        # Peers wrote the ids and names: inert (util.inert), and cells as Text, never read as markup.
        table.add_row(*(Text(inert(c)) for c in cells), style="yellow" if r.get("warning") else None)
        if r.get("warning"):
            warnings.append(inert(f"warning: {r['peer_id'][:12]}… {r['warning']}"))
    if warnings:
        table.caption = Text("\n".join(warnings))
    return table


def connect_light_observer(initial_peers: Sequence[str], swarm_id: str, timeout: float) -> tuple[Any, Any]:
    """A one-shot reader without torch (swarm/light.py): (transport, exchange), as connect_observer."""
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.light import LightObserver

    transport = LightObserver(initial_peers, swarm_id, timeout=timeout)
    return transport, RolloutExchange(transport, swarm_id, vocab_size=1)


def run_status(initial_peers: Sequence[str], swarm_id: str, *, as_json: bool, watch: bool,
               interval: float, timeout: float) -> None:
    """One read through the light reader; `watch` joins as a full, self-healing observer."""
    if watch:
        transport, exchange = connect_observer(initial_peers, swarm_id, self_heal=True, timeout=timeout)
    else:
        transport, exchange = connect_light_observer(initial_peers, swarm_id, timeout)
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
                rows = status_rows(read_and_remember(exchange, timeout))
                live.update(render_table(rows, transport.dht_time()))
                stop.wait(interval)
    finally:
        transport.shutdown()


def run_dashboard(initial_peers: Sequence[str], swarm_id: str, *, host: str, port: int,
                  poll_interval: float = 2.0, ledger_dirs: Sequence[Path] = ()) -> None:
    from swarm_node.observe.dashboard.server import DashboardServer
    from swarm_node.observe.dashboard.sources import HeldoutSource, LedgerSource

    transport, exchange = connect_observer(initial_peers, swarm_id)
    server = DashboardServer(SwarmStatusSource(exchange, timeout=10.0), host=host, port=port,
                             poll_interval_s=poll_interval,
                             ledger_source=LedgerSource(ledger_dirs) if ledger_dirs else None,
                             heldout_source=HeldoutSource(ledger_dirs) if ledger_dirs else None)
    stop = stop_on_signals()
    try:
        server.start()
        print(f"dashboard: {server.url}", flush=True)
        while not stop.wait(1.0):
            server.check()
    finally:
        server.stop()
        transport.shutdown()
