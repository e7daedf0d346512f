"""The web dashboard: a poller that keeps per-peer metric history, and a small HTTP server.

    GET /              the page (static/index.html; it polls the API and draws SVG curves)
    GET /static/NAME   the page's script and stylesheet
    GET /api/peers     latest record per peer: {"peers": [...], "server_time", "last_error", "reads"}
    GET /api/history   per-peer series: {"series": {peer_id: {"model_id", "points": [{step, t, ...}],
                       "evals": [{step, accuracy, lo, hi, n}]}}}: `evals`, one point per held-out
                       evaluation its records carried (eval_step, eval_accuracy, its 95% interval)
    GET /api/heldout   held-out trends of local node dirs: {"nodes": [{"node_dir", "points", "error"}]}
    GET /api/ledger    peer ledgers of local node dirs: {"nodes": [{"node_dir", "peers": [row], "error"}]}
    GET /healthz       "ok"

Stdlib only (ThreadingHTTPServer): the dashboard adds no server dependency. The status source is
read in one background thread; HTTP handlers only copy the kept state under a lock. Every string a
peer wrote (model ids, tokenizer fingerprints, metric keys; in the ledgers, tokenizers and what
receivers named) is made inert (`util.inert`) before it is kept or served; the page sets text,
never HTML.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from swarm_node import metric_names as m
from swarm_node.observe.dashboard.sources import HeldoutSource, LedgerSource, StatusLike, StatusSource
from swarm_node.observe.health import alone_warning
from swarm_node.swarm.tokenizers import tokenizer_label, tokenizer_shares
from swarm_node.util.inert import inert

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
STEPS_PER_MIN = "steps_per_min"  # derived: step rate between consecutive records of a peer


def _clean(value: Any) -> float | None:
    """A JSON-safe number: browsers reject NaN/Infinity."""
    v = float(value)
    return v if math.isfinite(v) else None


class SwarmHistory:
    """Latest record and a bounded series of points per peer, fed by successive reads."""

    def __init__(self, history: int = 2000) -> None:
        if history < 2:
            raise ValueError("history must keep at least 2 points per peer")
        self._history = history
        self._lock = threading.Lock()
        self._latest: dict[str, dict[str, Any]] = {}
        self._series: dict[str, deque[dict[str, Any]]] = {}
        self._evals: dict[str, dict[int, dict[str, float]]] = {}  # peer -> eval step -> held-out point

    def ingest(self, statuses: list[StatusLike], now: float) -> None:
        """Record one read. A peer's point is added only when its (step, timestamp) changed."""
        with self._lock:
            present = set()
            for st in statuses:
                present.add(st.peer_id)
                self._ingest_one(st, now)
            for pid, rec in self._latest.items():
                rec["present"] = pid in present

    def _ingest_one(self, st: StatusLike, now: float) -> None:
        metrics = {inert(k): _clean(v) for k, v in dict(st.metrics).items()}  # keys: the peer's words
        series = self._series.setdefault(st.peer_id, deque(maxlen=self._history))
        prev = series[-1] if series else None
        if prev is None or (prev["step"], prev["t"]) != (int(st.step), float(st.timestamp)):
            point: dict[str, Any] = {"step": int(st.step), "t": float(st.timestamp), **metrics}
            point.update(_derived(dict(st.metrics), prev, int(st.step), float(st.timestamp)))
            series.append(point)
        self._ingest_eval(st.peer_id, dict(st.metrics))
        self._latest[st.peer_id] = {
            "peer_id": st.peer_id,
            "model_id": inert(st.model_id),
            "role": getattr(st, "role", "trainer"),
            "step": int(st.step),
            "timestamp": float(st.timestamp),
            "metrics": metrics,
            "tokenizer_fingerprint": inert(getattr(st, "tokenizer_fingerprint", "")),
            "tokenizer": inert(tokenizer_label(str(getattr(st, "tokenizer_fingerprint", "")))),
            "warning": alone_warning(dict(st.metrics)),
            "last_seen": now,
            "present": True,
        }

    def _ingest_eval(self, peer_id: str, metrics: Mapping[str, float]) -> None:
        """Keep the record's latest held-out evaluation, once per evaluated step (the newest `history`)."""
        if not {m.EVAL_ACCURACY, m.EVAL_STEP, m.EVAL_LO, m.EVAL_HI} <= metrics.keys():
            return
        evals = self._evals.setdefault(peer_id, {})
        evals[int(metrics[m.EVAL_STEP])] = {
            "step": int(metrics[m.EVAL_STEP]), "accuracy": _clean(metrics[m.EVAL_ACCURACY]),
            "lo": _clean(metrics[m.EVAL_LO]), "hi": _clean(metrics[m.EVAL_HI]),
            "n": _clean(metrics.get(m.EVAL_N, math.nan))}
        while len(evals) > self._history:
            del evals[min(evals)]

    def peers(self) -> list[dict[str, Any]]:
        """The latest record of every peer seen; `tokenizer_peers` of the `tokenizer_known` peers
        present whose tokenizer is known share its tokenizer."""
        with self._lock:
            rows = [dict(v) for _, v in sorted(self._latest.items())]
        shares = tokenizer_shares({r["peer_id"]: r["tokenizer_fingerprint"] for r in rows if r["present"]})
        for r in rows:
            r["tokenizer_peers"], r["tokenizer_known"] = shares.get(r["peer_id"], (0, 0))
        return rows

    def series(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {pid: {"model_id": self._latest[pid]["model_id"], "points": list(pts),
                          "evals": [v for _, v in sorted(self._evals.get(pid, {}).items())]}
                    for pid, pts in sorted(self._series.items())}


def _derived(metrics: Mapping[str, float], prev: dict[str, Any] | None, step: int, t: float) -> dict[str, float | None]:
    """Per-reason filtered fractions and the step rate since the previous point."""
    out: dict[str, float | None] = {f"filtered_fraction_{r}": _clean(v) for r, v in m.filtered_fractions(metrics).items()}
    if prev is not None and t > prev["t"] and step > prev["step"]:
        out[STEPS_PER_MIN] = 60.0 * (step - prev["step"]) / (t - prev["t"])
    return out


class DashboardServer:
    """Poll `status_source` every `poll_interval_s` and serve the page and API on host:port.

    Reading the source is the network boundary: a failed read is logged, reported as
    `last_error` in /api/peers, and retried at the next poll; everything else propagates.
    `ledger_source`: the peer ledgers of local nodes shown in the peer-ledger table (none: hidden);
    `heldout_source`: the held-out trends of local nodes drawn in the held-out chart.
    """

    def __init__(self, status_source: StatusSource, host: str = "127.0.0.1", port: int = 8080,
                 history: int = 2000, poll_interval_s: float = 2.0,
                 ledger_source: LedgerSource | None = None, heldout_source: HeldoutSource | None = None) -> None:
        if poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive")
        self.source = status_source
        self.ledger_source = ledger_source
        self.heldout_source = heldout_source
        self.history = SwarmHistory(history)
        self.poll_interval_s = poll_interval_s
        self.last_error: str | None = None
        self.reads = 0
        self._host, self._requested_port = host, port
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._failure: BaseException | None = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("dashboard is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}/"

    def poll_once(self) -> None:
        """Read the source once and fold the records into the history."""
        try:
            statuses = list(self.source.read())
        except Exception as e:  # network boundary: a flaky swarm must not kill the dashboard
            self.last_error = f"{type(e).__name__}: {e}"
            logger.warning("dashboard: reading swarm status failed: %s", self.last_error)
            return
        self.reads += 1
        self.last_error = None
        self.history.ingest(statuses, time.time())

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError("dashboard already started")
        self._stop.clear()
        self._httpd = ThreadingHTTPServer((self._host, self._requested_port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                             name="dashboard-http", daemon=True),
            threading.Thread(target=self._poll_loop, name="dashboard-poll", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _poll_loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.poll_once()
                self._stop.wait(self.poll_interval_s)
        except BaseException as e:  # resurfaced by check() in the caller's loop
            self._failure = e
            raise

    def check(self) -> None:
        """Raise in the caller's thread if the poller died (a bug, not a network error)."""
        if self._failure is not None:
            raise RuntimeError("dashboard poller failed") from self._failure

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling and serving. Returns within about `timeout_s` plus one source read."""
        if self._httpd is None:
            return
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._httpd, self._threads = None, []

    def __enter__(self) -> DashboardServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api_peers(self) -> dict[str, Any]:
        return {"peers": self.history.peers(), "server_time": time.time(),
                "last_error": self.last_error, "reads": self.reads}

    def api_history(self) -> dict[str, Any]:
        return {"series": self.history.series()}

    def api_heldout(self) -> dict[str, Any]:
        return {"nodes": self.heldout_source.read() if self.heldout_source is not None else []}

    def api_ledger(self) -> dict[str, Any]:
        nodes = self.ledger_source.read() if self.ledger_source is not None else []
        return {"nodes": inert_strings(nodes), "server_time": time.time()}


def inert_strings(obj: Any) -> Any:
    """`obj` (JSON-like) with every string in it, keys included, made inert (`util.inert`)."""
    if isinstance(obj, str):
        return inert(obj)
    if isinstance(obj, dict):
        return {inert(k) if isinstance(k, str) else k: inert_strings(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [inert_strings(v) for v in obj]
    return obj


def _make_handler(dash: DashboardServer) -> type[BaseHTTPRequestHandler]:
    static_files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()}

    class Handler(BaseHTTPRequestHandler):
        server_version = "swarm-node-dashboard"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlsplit(self.path).path
            if path in ("/", "/index.html"):
                self._file(static_files["index.html"])
            elif path.startswith("/static/") and path[len("/static/"):] in static_files:
                self._file(static_files[path[len("/static/"):]])
            elif path == "/api/peers":
                self._json(dash.api_peers())
            elif path == "/api/history":
                self._json(dash.api_history())
            elif path == "/api/ledger":
                self._json(dash.api_ledger())
            elif path == "/api/heldout":
                self._json(dash.api_heldout())
            elif path == "/healthz":
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

        def _file(self, p: Path) -> None:
            self._send(HTTPStatus.OK, p.read_bytes(), _CONTENT_TYPES.get(p.suffix, "application/octet-stream"))

        def _json(self, obj: Any) -> None:
            body = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
            self._send(HTTPStatus.OK, body, "application/json")

        def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.debug("dashboard http: " + format, *args)

    return Handler
