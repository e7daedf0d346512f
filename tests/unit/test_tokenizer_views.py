"""What observers show of a swarm's tokenizers: `swarm-node status` and the dashboard's peer table
name each peer's tokenizer by a short label of its fingerprint and how many peers share it."""

from __future__ import annotations

import json
import time
import urllib.request

from rich.console import Console

from protocol.messages import NodeStatus
from swarm_node.observe.dashboard import DashboardServer, FakeStatusSource, Status
from swarm_node.observe.observer import render_table, status_rows
from swarm_node.swarm.tokenizers import tokenizer_label, tokenizer_shares

BYTES, BPE = "b7e5" + "0" * 60, "c0de" + "1" * 60


def test_labels_and_shares():
    assert tokenizer_label(BYTES) == "b7e50000" and tokenizer_label("") == "-"
    shares = tokenizer_shares({"p1": BYTES, "p2": BYTES, "p3": BPE, "observer": ""})
    assert shares == {"p1": (2, 3), "p2": (2, 3), "p3": (1, 3), "observer": (0, 3)}


def _record(peer: str, fingerprint: str, t: float = 100.0, role: str = "trainer") -> NodeStatus:
    return NodeStatus(peer_id=peer, role=role, model_id="tiny", step=3, timestamp=t, metrics={"reward_mean": 0.5},
                      tokenizer_fingerprint=fingerprint)


def test_status_rows_and_table_name_each_peers_tokenizer():
    records = [_record("QmBytesOne", BYTES), _record("QmBytesTwo", BYTES), _record("QmBpe", BPE, t=90.0),
               _record("QmBpe", BYTES, t=80.0),  # an older record of the same peer: not counted
               _record("QmObserver", "", role="observer")]
    rows = {r["peer_id"]: r for r in status_rows(records)}
    assert (rows["QmBpe"]["tokenizer_fingerprint"], rows["QmBpe"]["tokenizer"]) == (BPE, "c0de1111")
    assert (rows["QmBpe"]["tokenizer_peers"], rows["QmBpe"]["tokenizer_known"]) == (1, 3)
    assert (rows["QmBytesOne"]["tokenizer_peers"], rows["QmBytesOne"]["tokenizer_known"]) == (2, 3)
    assert rows["QmObserver"]["tokenizer"] == "-"
    assert json.loads(json.dumps(list(rows.values())))  # status --json stays plain JSON
    console = Console(record=True, width=200)
    console.print(render_table(list(rows.values()), now=110.0))
    lines = console.export_text().splitlines()
    assert "tokenizer" in lines[1]
    line = {p: next(ln for ln in lines if p[:12] in ln) for p in rows}
    assert "c0de1111 1/3" in line["QmBpe"] and "b7e50000 2/3" in line["QmBytesTwo"]
    assert "1/3" not in line["QmObserver"] and "2/3" not in line["QmObserver"]


def test_dashboard_peers_carry_the_tokenizer_and_its_share():
    source = FakeStatusSource([Status("peerA", "m", 1, 100.0, tokenizer_fingerprint=BYTES),
                               Status("peerB", "m", 1, 100.0, tokenizer_fingerprint=BYTES),
                               Status("peerC", "m", 1, 100.0, tokenizer_fingerprint=BPE)])
    with DashboardServer(source, port=0, poll_interval_s=0.05) as dash:
        deadline = time.monotonic() + 5
        while dash.reads == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        with urllib.request.urlopen(dash.url + "api/peers", timeout=5) as r:
            peers = {p["peer_id"]: p for p in json.loads(r.read())["peers"]}
        assert (peers["peerC"]["tokenizer"], peers["peerC"]["tokenizer_peers"], peers["peerC"]["tokenizer_known"]) \
            == ("c0de1111", 1, 3)
        assert (peers["peerA"]["tokenizer_fingerprint"], peers["peerA"]["tokenizer_peers"]) == (BYTES, 2)
        # peerB leaves: shares count the peers present
        source.set([Status("peerA", "m", 2, 101.0, tokenizer_fingerprint=BYTES),
                    Status("peerC", "m", 2, 101.0, tokenizer_fingerprint=BPE)])
        reads = dash.reads
        while dash.reads <= reads + 1 and time.monotonic() < deadline + 5:
            time.sleep(0.02)
        with urllib.request.urlopen(dash.url + "api/peers", timeout=5) as r:
            peers = {p["peer_id"]: p for p in json.loads(r.read())["peers"]}
        assert peers["peerB"]["present"] is False and peers["peerB"]["tokenizer_peers"] == 0
        assert (peers["peerA"]["tokenizer_peers"], peers["peerA"]["tokenizer_known"]) == (1, 2)
        script = urllib.request.urlopen(dash.url + "static/dashboard.js", timeout=5).read().decode()
        assert "tokenizerCell" in script and "ledgerTokenizer" in script
