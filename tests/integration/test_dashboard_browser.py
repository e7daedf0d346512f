"""The dashboard in a real headless Chromium (Debian `chromium` + `chromium-driver`, via selenium).

`check_dashboard_in_browser` is the reusable part: it loads a dashboard URL, waits until every
chart has a line with real points for every expected peer and the peer table lists them all,
checks the browser console is clean, and saves a screenshot. Here it runs against the dashboard
server fed by a synthetic swarm; the local-swarm test reuses it against real nodes.

Screenshots go to $SWARM_NODE_ARTIFACTS (default: <repo>/artifacts/).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from swarm_node.observe.dashboard import DashboardServer, SyntheticStatusSource

pytestmark = pytest.mark.integration

CHART_IDS = ("reward", "accuracy", "filtered", "kl", "isw", "bpt", "rate")
HELDOUT_CHART = "heldout"  # held-out accuracy over steps, with 95% interval bars (evaluations, not every step)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1600")


def artifacts_dir() -> Path:
    d = Path(os.environ.get("SWARM_NODE_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def _chart_state(drv) -> dict[str, dict[str, int]]:
    """{chart id: {peer id: most points on any of its lines}} as drawn in the page."""
    return drv.execute_script("""
        const out = {};
        for (const fig of document.querySelectorAll('figure.chart')) {
          const peers = {};
          for (const pl of fig.querySelectorAll('polyline')) {
            const n = pl.getAttribute('points').trim().split(/\\s+/).length;
            peers[pl.dataset.peer] = Math.max(peers[pl.dataset.peer] || 0, n);
          }
          out[fig.dataset.chart] = peers;
        }
        return out;""")


def _heldout_bars(drv) -> dict[str, list[int]]:
    """{series id: [points of its line, error bars drawn]} in the held-out chart, read at one instant
    (an error bar is three lines: the bar and two caps)."""
    return drv.execute_script("""
        const fig = document.querySelector('figure[data-chart="heldout"]'), out = {};
        for (const pl of fig.querySelectorAll('polyline'))
          out[pl.dataset.peer] = [pl.getAttribute('points').trim().split(/\\s+/).length, 0];
        for (const l of fig.querySelectorAll('line.errbar')) out[l.dataset.peer][1] += 1;
        for (const k in out) out[k][1] /= 3;
        return out;""")


def check_dashboard_in_browser(url: str, peer_ids: list[str], screenshot: Path, min_points: int = 3,
                               timeout_s: float = 60.0, ledger_peers: list[str] = (),
                               charts: tuple[str, ...] = CHART_IDS,
                               table_peers: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Drive Chromium to `url`; return the final chart state once each of `charts` shows every one of
    `peer_ids` (series ids: peers, or the node directories of local nodes in the held-out chart) with
    `min_points` points, the peer table lists `table_peers` (default: `peer_ids`), and the
    peer-ledger table lists `ledger_peers`, in order, when given."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = chromium_paths()
    assert paths is not None, "chromium and chromedriver are required"
    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    profile = tempfile.mkdtemp(prefix="swarm-node-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=paths[1]), options=opts)
    try:
        drv.set_page_load_timeout(30)
        drv.get(url)
        table_peers = list(peer_ids) if table_peers is None else table_peers
        deadline = time.monotonic() + timeout_s
        while True:
            state = _chart_state(drv)
            rows = drv.execute_script(
                "return [...document.querySelectorAll('#peers tbody tr')].map(r => r.dataset.peer);")
            ledger_rows = drv.execute_script(
                "return [...document.querySelectorAll('#ledger-nodes tbody tr')].map(r => r.dataset.peer);")
            ready = (set(charts) <= set(state) and sorted(rows) == sorted(table_peers)
                     and all(state[c].get(p, 0) >= min_points for c in charts for p in peer_ids)
                     and ledger_rows == list(ledger_peers))
            if ready or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        drv.save_screenshot(str(screenshot))
        severe = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
        assert ready, (f"dashboard never showed every peer in every chart: charts={state} table={rows} "
                       f"ledger={ledger_rows}")
        assert not severe, f"browser console errors: {severe}"
        if HELDOUT_CHART in charts:  # every held-out point is drawn with its interval
            bars = _heldout_bars(drv)
            assert all(bars[p][0] == bars[p][1] >= min_points for p in peer_ids), bars
        return state
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(chromium_paths() is None,
                    reason="needs Debian chromium + chromium-driver (apt-get install -y chromium chromium-driver)")
def test_dashboard_draws_every_chart_and_lists_every_peer():
    pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
    src = SyntheticStatusSource(n_peers=3, seed=7)
    with DashboardServer(src, host="127.0.0.1", port=0, poll_interval_s=0.2) as dash:
        peer_ids = [p.peer_id for p in src.read()]
        shot = artifacts_dir() / "dashboard_synthetic.png"
        state = check_dashboard_in_browser(dash.url + "?poll_ms=500", peer_ids, shot,
                                           charts=(*CHART_IDS, HELDOUT_CHART))
        dash.check()
    assert shot.stat().st_size > 10_000
    assert all(len(state[c]) == 3 for c in (*CHART_IDS, HELDOUT_CHART))


@pytest.mark.skipif(chromium_paths() is None,
                    reason="needs Debian chromium + chromium-driver (apt-get install -y chromium chromium-driver)")
def test_dashboard_shows_the_peer_ledger_of_a_local_node(tmp_path):
    pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
    from swarm_node.observe.dashboard import LedgerSource
    from swarm_node.peers.ledger import FILE_NAME, PeerLedger
    from swarm_node.policy.types import SampleStat

    own, other = "a1" * 32, "c2" * 32  # tokenizer fingerprints: the second peer's is another one
    ledger = PeerLedger(tmp_path / "node" / FILE_NAME, own_tokenizer=own)
    for i, peer in enumerate(["12D3KooWLedgerPeerOne", "12D3KooWLedgerPeerTwo"]):
        ledger.record_group(peer, None, [own, other][i])
        ledger.record_group(peer, "stale")
        ledger.record_samples([SampleStat(peer, 1.0, 0.2, 1.0, False, True, crosstok=i == 1)] * (2 - i))
    ledger.save()
    src = SyntheticStatusSource(n_peers=1, seed=3)
    with DashboardServer(src, host="127.0.0.1", port=0, poll_interval_s=0.2,
                         ledger_source=LedgerSource([tmp_path / "node"])) as dash:
        peer_ids = [p.peer_id for p in src.read()]
        shot = artifacts_dir() / "dashboard_ledger.png"
        check_dashboard_in_browser(dash.url + "?poll_ms=500", peer_ids, shot,
                                   ledger_peers=["12D3KooWLedgerPeerOne", "12D3KooWLedgerPeerTwo"])
        dash.check()
