"""Dashboard server: the API returns the fake source's data; history, errors and shutdown."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from swarm_node import metric_names as m
from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, Status, SwarmHistory, SyntheticStatusSource


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.headers.get("Content-Type"), r.read()


def _status(peer, step, t, **metrics):
    return Status(peer_id=peer, model_id=f"model-{peer}", step=step, timestamp=t, metrics=metrics)


def test_api_returns_the_fake_sources_data():
    src = FakeStatusSource([
        _status("peerA", 3, 100.0, reward_mean=0.5, accuracy=0.25, kl_mean=float("nan")),
        _status("peerB", 7, 101.0, reward_mean=0.75, own_samples=8, peer_samples=8, filtered_kl=4),
    ])
    with DashboardServer(src, host="127.0.0.1", port=0, poll_interval_s=60) as dash:
        deadline = time.monotonic() + 5
        while dash.reads == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        _, ctype, body = _get(dash.url + "api/peers")
        assert ctype == "application/json"
        peers = json.loads(body)  # strict JSON: NaN became null
        assert [p["peer_id"] for p in peers["peers"]] == ["peerA", "peerB"]
        a, b = peers["peers"]
        assert (a["model_id"], a["step"], a["metrics"]["reward_mean"], a["metrics"]["kl_mean"]) == ("model-peerA", 3, 0.5, None)
        assert (b["step"], b["metrics"]["reward_mean"], b["present"]) == (7, 0.75, True)
        assert peers["last_error"] is None
        hist = json.loads(_get(dash.url + "api/history")[2])["series"]
        assert hist["peerB"]["points"] == [{"step": 7, "t": 101.0, "reward_mean": 0.75, "own_samples": 8.0,
                                            "peer_samples": 8.0, "filtered_kl": 4.0,
                                            "filtered_fraction_kl": 0.25}]


def test_page_and_static_files_are_served_and_unknown_paths_404():
    with DashboardServer(FakeStatusSource(), port=0, poll_interval_s=60) as dash:
        status, ctype, body = _get(dash.url)
        assert status == 200 and ctype.startswith("text/html")
        html = body.decode()
        for asset in ("/static/chart.js", "/static/dashboard.js", "/static/style.css"):
            assert asset in html
            assert _get(dash.url.rstrip("/") + asset)[0] == 200
        assert "cdn" not in html.lower() and "https://" not in html
        for bad in ("nope", "static/../server.py", "api/peers/x"):
            with pytest.raises(urllib.error.HTTPError) as e:
                _get(dash.url + bad)
            assert e.value.code == 404


def test_history_appends_only_new_steps_and_derives_step_rate():
    h = SwarmHistory(history=3)
    h.ingest([_status("p", 1, 0.0, reward_mean=0.1)], now=1.0)
    h.ingest([_status("p", 1, 0.0, reward_mean=0.1)], now=2.0)  # same record again: no new point
    h.ingest([_status("p", 3, 30.0, reward_mean=0.3)], now=3.0)
    pts = h.series()["p"]["points"]
    assert [p["step"] for p in pts] == [1, 3]
    assert pts[1]["steps_per_min"] == pytest.approx(4.0)  # 2 steps in 30 s
    for s in range(4, 8):
        h.ingest([_status("p", s, 10.0 * s)], now=float(s))
    assert [p["step"] for p in h.series()["p"]["points"]] == [5, 6, 7]  # bounded
    h.ingest([_status("q", 1, 1.0)], now=9.0)
    present = {p["peer_id"]: p["present"] for p in h.peers()}
    assert present == {"p": False, "q": True}


def test_source_errors_are_reported_and_polling_recovers():
    src = FakeStatusSource([_status("p", 1, 1.0)])
    dash = DashboardServer(src, port=0, poll_interval_s=60)
    src.error = ConnectionError("dht unreachable")
    dash.poll_once()
    assert dash.api_peers()["last_error"] == "ConnectionError: dht unreachable"
    src.error = None
    dash.poll_once()
    assert dash.api_peers()["last_error"] is None and dash.reads == 1
    dash.check()


def test_poller_runs_in_background_and_stop_is_bounded():
    src = SyntheticStatusSource(n_peers=3, seed=1)
    dash = DashboardServer(src, port=0, poll_interval_s=0.05)
    dash.start()
    deadline = time.monotonic() + 10
    while dash.reads < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    series = dash.api_history()["series"]
    assert len(series) == 3 and all(len(s["points"]) >= 5 for s in series.values())
    t0 = time.monotonic()
    dash.stop(timeout_s=2)
    assert time.monotonic() - t0 < 3
    reads = dash.reads
    time.sleep(0.2)
    assert dash.reads == reads  # stopped for real


def test_synthetic_source_has_every_charted_metric():
    (st,) = SyntheticStatusSource(n_peers=1).read()
    for name in (m.REWARD_MEAN, m.ACCURACY, m.KL_MEAN, m.KL_P90, m.IS_WEIGHT_MEAN, m.IS_WEIGHT_MAX,
                 m.BYTES_PER_TOKEN, m.FILTERED_KL, m.FILTERED_NONPOSITIVE_ADVANTAGE, m.TOKENS_PER_S):
        assert name in st.metrics
