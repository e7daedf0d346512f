"""The peer ledger across tokenizers: each peer's tokenizer (from its groups), its samples from
another tokenizer and those of them that carried gradient; kept across restarts, read from ledgers
written before these fields, and shown by status --peers, Prometheus and the dashboard."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest
from rich.console import Console

from swarm_node.peers.ledger import FILE_NAME, MAX_FINGERPRINT_CHARS, PeerLedger, load_rows, top_peers
from swarm_node.policy.types import SampleStat
from swarm_node.observe.ledger_view import render_peer_table
from swarm_node.observe.prometheus import TOKENIZER_GAUGE, PrometheusExporter
from tests.cli_run import _restore_signals, run  # noqa: F401  (fixture)

OWN = "a" * 64
OTHER_TOK = "c0ffee" + "1" * 58
SAME_PEER, OTHER_PEER, QUIET_PEER = "QmSameTokenizerPeer", "QmOtherTokenizerPeer", "QmIndexRecordsOnly"


def _ledger(path=None) -> PeerLedger:
    ledger = PeerLedger(path, own_tokenizer=OWN)
    ledger.record_group(SAME_PEER, None, OWN)
    ledger.record_group(OTHER_PEER, "tokenizer_mismatch", OTHER_TOK)  # before it sent text
    ledger.record_group(OTHER_PEER, None, OTHER_TOK)
    ledger.record_group(QUIET_PEER, "stale")  # an index record names no tokenizer
    ledger.record_samples([
        SampleStat(SAME_PEER, 1.0, 0.1, 1.0, False, True),
        SampleStat(OTHER_PEER, 1.0, 0.2, 1.1, False, True, crosstok=True),
        SampleStat(OTHER_PEER, 0.0, 0.3, 0.9, False, False, crosstok=True),
        SampleStat(OTHER_PEER, 0.0, 0.3, 0.9, True, False, crosstok=True),
    ])
    return ledger


def test_rows_name_each_peers_tokenizer_and_count_cross_tokenizer_samples():
    rows = {r["peer_id"]: r for r in _ledger().rows()}
    same, other, quiet = rows[SAME_PEER], rows[OTHER_PEER], rows[QUIET_PEER]
    assert (same["tokenizer"], same["tokenizer_label"], same["tokenizer_same"]) == (OWN, OWN[:8], True)
    assert (other["tokenizer"], other["tokenizer_label"], other["tokenizer_same"]) == (OTHER_TOK, "c0ffee11", False)
    assert (quiet["tokenizer"], quiet["tokenizer_label"], quiet["tokenizer_same"]) == ("", "-", None)
    assert (same["crosstok"], same["crosstok_gradient"]) == (0, 0)
    assert (other["samples"], other["crosstok"], other["crosstok_gradient"]) == (3, 3, 1)
    assert other["crosstok_gradient_share"] == pytest.approx(1 / 3)
    assert other["dropped_by_reason"] == {"tokenizer_mismatch": 1}
    # Without its own fingerprint a ledger cannot tell same from other.
    unknown = PeerLedger(None)
    unknown.record_group(OTHER_PEER, None, OTHER_TOK)
    assert unknown.rows()[0]["tokenizer_same"] is None


def test_a_peer_that_changes_tokenizer_is_shown_with_its_latest_and_long_claims_are_cut():
    ledger = PeerLedger(None, own_tokenizer=OWN)
    ledger.record_group(OTHER_PEER, None, OTHER_TOK)
    ledger.record_group(OTHER_PEER, None, OWN)
    ledger.record_group(OTHER_PEER, "stale", "")  # no fingerprint: the last one named stays
    assert ledger.rows()[0]["tokenizer_same"] is True
    ledger.record_group(OTHER_PEER, None, "f" * 10_000)
    assert len(ledger.rows()[0]["tokenizer"]) == MAX_FINGERPRINT_CHARS


def test_persisted_and_restored(tmp_path):
    path = tmp_path / FILE_NAME
    ledger = _ledger(path)
    ledger.save()
    doc = json.loads(path.read_text())
    assert doc["tokenizer"] == OWN
    again = PeerLedger.open(path, own_tokenizer=OWN)
    assert again.rows() == ledger.rows() == load_rows(path)
    again.record_samples([SampleStat(OTHER_PEER, 1.0, 0.2, 1.0, False, True, crosstok=True)])
    other = next(r for r in again.rows() if r["peer_id"] == OTHER_PEER)
    assert (other["crosstok"], other["crosstok_gradient"]) == (4, 2)


def test_a_ledger_written_before_the_tokenizer_fields_still_loads(tmp_path):
    path = tmp_path / FILE_NAME
    _ledger(path).save()
    doc = json.loads(path.read_text())
    del doc["tokenizer"]
    for p in doc["peers"]:
        for key in ("tokenizer", "crosstok", "crosstok_gradient"):
            del p[key]
    path.write_text(json.dumps(doc))
    rows = {r["peer_id"]: r for r in load_rows(path)}
    assert rows[OTHER_PEER]["samples"] == 3 and rows[OTHER_PEER]["crosstok"] == 0
    assert rows[OTHER_PEER]["tokenizer"] == "" and rows[OTHER_PEER]["tokenizer_same"] is None
    assert len(PeerLedger.open(path)) == 3  # not taken for damage


@pytest.mark.parametrize("field, value", [("tokenizer", 7), ("tokenizer", "x" * 500), ("crosstok", -1),
                                          ("crosstok_gradient", "2")])
def test_mistyped_tokenizer_fields_are_damage(tmp_path, field, value):
    path = tmp_path / FILE_NAME
    _ledger(path).save()
    doc = json.loads(path.read_text())
    doc["peers"][0][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError):
        load_rows(path)
    assert len(PeerLedger.open(path)) == 0  # the node sets it aside


def test_top_peers_sums_cross_tokenizer_counts_under_other():
    rows = _ledger().rows()
    top = top_peers(rows, 1)
    assert [r["peer_id"] for r in top] == [OTHER_PEER, "other"]
    assert (top[1]["crosstok"], top[1]["crosstok_gradient"], top[1]["samples"]) == (0, 0, 1)


def test_peer_table_shows_tokenizer_and_cross_tokenizer_samples():
    console = Console(record=True, width=200)
    console.print(render_peer_table(_ledger().rows(), now=2e9))
    lines = console.export_text().splitlines()
    header = next(ln for ln in lines if "tokenizer" in ln)
    assert "xtok (grad)" in header
    line = {p: next(ln for ln in lines if p[:14] in ln) for p in (SAME_PEER, OTHER_PEER, QUIET_PEER)}
    assert "c0ffee11 other" in line[OTHER_PEER] and "3 (0.33)" in line[OTHER_PEER]
    assert f"{OWN[:8]} same" in line[SAME_PEER]
    assert "c0ffee11" not in line[QUIET_PEER] and "same" not in line[QUIET_PEER]


def test_status_peers_json_carries_the_tokenizer_fields(capsys, tmp_path):
    node_dir = tmp_path / "node"
    _ledger(node_dir / FILE_NAME).save()
    code, out, err = run(capsys, "status", "--peers", "--node-dir", str(node_dir), "--json")
    assert code == 0, err
    other = next(r for r in json.loads(out) if r["peer_id"] == OTHER_PEER)
    assert (other["tokenizer_label"], other["tokenizer_same"], other["crosstok"], other["crosstok_gradient"]) == \
        ("c0ffee11", False, 3, 1)


def _tokenizer_series(exporter) -> set[tuple[str, str, str]]:
    return {(s.labels["peer"], s.labels["tokenizer"], s.labels["same"])
            for family in exporter.registry.collect() for s in family.samples
            if s.name == "swarm_node_" + TOKENIZER_GAUGE}


def test_prometheus_names_tokenizers_with_one_series_per_shown_peer():
    ledger = _ledger()
    exporter = PrometheusExporter("127.0.0.1:0")  # never started: the registry is read directly
    exporter.update_peers(ledger.rows(), 2)
    assert _tokenizer_series(exporter) == {(OTHER_PEER, "c0ffee11", "false"), (SAME_PEER, OWN[:8], "true")}
    text = generate_latest(exporter.registry).decode()
    assert f'swarm_node_ledger_samples_crosstok{{peer="{OTHER_PEER}"}} 3.0' in text
    assert f'swarm_node_ledger_samples_crosstok_gradient{{peer="{OTHER_PEER}"}} 1.0' in text
    assert 'swarm_node_ledger_samples_crosstok{peer="other"} 0.0' in text
    # The peer switches to this node's tokenizer: its old series goes, the count stays one per peer.
    ledger.record_group(OTHER_PEER, None, OWN)
    exporter.update_peers(ledger.rows(), 2)
    assert _tokenizer_series(exporter) == {(OTHER_PEER, OWN[:8], "true"), (SAME_PEER, OWN[:8], "true")}
    exporter.update_peers(ledger.rows(), 3)  # the peer without a known tokenizer joins the top
    assert (QUIET_PEER, "-", "unknown") in _tokenizer_series(exporter)
