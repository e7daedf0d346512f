"""Where the peer ledger is shown: `status --peers` (JSON and table), Prometheus with a bounded
number of peer labels, and the dashboard's /api/ledger and peer-ledger table."""

from __future__ import annotations

import json
import time
import urllib.request

from prometheus_client import generate_latest

from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, LedgerSource
from swarm_node.peers.ledger import FILE_NAME, PeerLedger
from swarm_node.policy.types import SampleStat
from swarm_node.observe.prometheus import PEER_GAUGES, TOKENIZER_GAUGE, PrometheusExporter
from tests.cli_run import _restore_signals, run  # noqa: F401  (fixture)

PEER_A = "12D3KooWAlphaPeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
PEER_B = "12D3KooWBravoPeerBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def _node_dir(tmp_path):
    node_dir = tmp_path / "node"
    ledger = PeerLedger(node_dir / FILE_NAME)
    for reason in (None, None, None, "stale"):
        ledger.record_group(PEER_A, reason)
    ledger.record_samples([SampleStat(PEER_A, 1.0, 0.5, 1.1, False, True),
                           SampleStat(PEER_A, 0.0, 1.5, 0.9, True, False)])
    for _ in range(5):
        ledger.record_group(PEER_B, "wrong_prompt")
        ledger.reputation.record(PEER_B, "wrong_prompt")
    ledger.save()
    return node_dir


def test_status_peers_json(capsys, tmp_path):
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(_node_dir(tmp_path)), "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["peer_id"] for r in rows] == [PEER_A, PEER_B]
    a, b = rows
    assert (a["taken"], a["offered"], a["samples"], a["gradient"], a["filtered"]) == (3, 4, 2, 1, 1)
    assert a["kl"]["mean"] == 1.0 and a["dropped_by_reason"] == {"stale": 1}
    assert b["dropped_by_reason"] == {"wrong_prompt": 5} and b["reputation"]["excluded"] is True


def test_status_peers_table(capsys, tmp_path):
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(_node_dir(tmp_path)))
    assert code == 0, err
    lines = out.splitlines()
    assert "2 peers" in lines[0]
    line_a = next(ln for ln in lines if PEER_A[:14] in ln)
    line_b = next(ln for ln in lines if PEER_B[:14] in ln)
    assert "stale" in line_a and "0.50" in line_a  # top drop; gradient and filtered shares
    assert "wrong_prompt" in line_b and "excluded" in line_b


def test_status_peers_without_a_ledger_is_one_line(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(tmp_path / "empty"))
    assert code == 2 and out == "" and len(err) == 1
    assert "no peer ledger" in err[0] and "--node-dir" in err[0]
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(tmp_path / "nowhere"), "--json")
    assert code == 2 and "no node directory" in json.loads(out)["error"]


def test_status_peers_on_a_damaged_ledger_leaves_the_file(capsys, tmp_path):
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / FILE_NAME).write_text("{torn")
    code, _, err = run(capsys, "status", "--peers", "--node-dir", str(node_dir))
    assert code == 1 and len(err) == 1 and "damaged" in err[0]
    assert (node_dir / FILE_NAME).read_text() == "{torn"  # only its node sets it aside


def _peer_label_values(exporter) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for family in exporter.registry.collect():
        for sample in family.samples:
            if "peer" in sample.labels:
                out.setdefault(sample.name, set()).add(sample.labels["peer"])
    return out


def test_prometheus_exports_the_top_k_peers_and_other():
    ledger = PeerLedger(None)
    for i in range(40):
        ledger.record_samples([SampleStat(f"peer{i:02d}", 1.0, 0.1, 1.0, False, True)] * (i + 1))
    exporter = PrometheusExporter("127.0.0.1:0")  # never started: the registry is read directly
    exporter.update_peers(ledger.rows(), 5)
    labels = _peer_label_values(exporter)
    tokenizer = labels.pop("swarm_node_" + TOKENIZER_GAUGE)
    assert set(labels) == {"swarm_node_" + name for name in PEER_GAUGES}
    expected = {"peer39", "peer38", "peer37", "peer36", "peer35", "other"}
    assert all(v == expected for v in labels.values())
    assert tokenizer == expected - {"other"}  # `other` sums peers of any tokenizer
    text = generate_latest(exporter.registry).decode()
    assert 'swarm_node_ledger_samples{peer="peer39"} 40.0' in text
    assert f'swarm_node_ledger_samples{{peer="other"}} {float(sum(range(1, 36)))}' in text
    # New peers overtake: the exported label set changes but never grows past K + 1.
    for i in range(40, 50):
        ledger.record_samples([SampleStat(f"peer{i:02d}", 1.0, 0.1, 1.0, False, True)] * 100)
    exporter.update_peers(ledger.rows(), 5)
    labels = _peer_label_values(exporter)
    assert len(labels.pop("swarm_node_" + TOKENIZER_GAUGE)) == 5
    assert all(len(v) == 6 and "peer39" not in v and "other" in v for v in labels.values())


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_dashboard_serves_the_ledgers_of_local_nodes(tmp_path):
    node_dir = _node_dir(tmp_path)
    (tmp_path / "fresh").mkdir()
    source = LedgerSource([node_dir, tmp_path / "fresh"])
    with DashboardServer(FakeStatusSource(), port=0, poll_interval_s=60, ledger_source=source) as dash:
        got = _get_json(dash.url + "api/ledger")
        assert got["server_time"] <= time.time()
        with_ledger, fresh = got["nodes"]
        assert with_ledger["node_dir"] == str(node_dir) and with_ledger["error"] is None
        assert [r["peer_id"] for r in with_ledger["peers"]] == [PEER_A, PEER_B]
        assert with_ledger["peers"][0]["taken"] == 3 and with_ledger["total_peers"] == 2
        assert fresh["peers"] == [] and "no peer_ledger.json" in fresh["error"]
        page = urllib.request.urlopen(dash.url, timeout=5).read().decode()
        script = urllib.request.urlopen(dash.url + "static/dashboard.js", timeout=5).read().decode()
        assert 'id="ledger"' in page and "/api/ledger" in script and "drawLedger" in script
    with DashboardServer(FakeStatusSource(), port=0, poll_interval_s=60) as dash:
        assert _get_json(dash.url + "api/ledger")["nodes"] == []  # no --node-dir: the table stays hidden


def test_status_peers_watch_draws_until_ctrl_c(capsys, tmp_path):
    import os
    import signal
    import threading

    node_dir = _node_dir(tmp_path)
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT))  # Ctrl-C after a few redraws
    timer.start()
    try:
        code, out, err = run(capsys, "status", "--peers", "--node-dir", str(node_dir), "--watch", "--interval", "0.5")
    finally:
        timer.cancel()
    assert code == 130, err
    assert PEER_A[:14] in out and "peer ledger of" in out
