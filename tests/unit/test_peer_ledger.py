"""The peer ledger: its math on known input, its bounds, persistence across restarts, damaged files,
and admission reading the reputation it keeps."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

from swarm_node.peers.ledger import FILE_NAME, RESERVOIR, PeerLedger, Stat, load_rows, quantile, top_peers
from swarm_node.policy.types import SampleStat
from swarm_node.swarm.admission import EXCLUDED, Admission


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _sample(peer, reward, kl, w, filtered=False, gradient=True):
    return SampleStat(peer, reward, kl, w, filtered, gradient)


def test_ledger_math_on_known_input():
    clock = Clock(100.0)
    ledger = PeerLedger(None, clock=clock)
    for reason in (None, None, "stale", "wrong_prompt", "stale"):
        ledger.record_group("A", reason)
    clock.t = 130.0
    ledger.record_samples([
        _sample("A", 1.0, 0.1, 1.0), _sample("A", 0.0, 0.3, 0.5, filtered=True, gradient=False),
        _sample("A", 1.0, 0.2, 1.5), _sample("A", 0.0, None, None, filtered=True, gradient=False),
        _sample("B", 0.5, 2.0, 0.9),
    ])
    ledger.record_late_drop("A", "nonfinite_step")
    rows = {r["peer_id"]: r for r in ledger.rows()}
    a = rows["A"]
    assert (a["offered"], a["taken"], a["dropped"]) == (5, 2, 4)  # the late drop counts, but is no new offer
    assert a["dropped_by_reason"] == {"stale": 2, "wrong_prompt": 1, "nonfinite_step": 1}
    assert (a["samples"], a["gradient"], a["filtered"]) == (4, 2, 2)
    assert a["filtered_share"] == 0.5 and a["gradient_share"] == 0.5
    assert a["reward"] == {"count": 4, "mean": 0.5, "p50": 0.5, "p90": 1.0}
    assert a["kl"]["count"] == 3 and a["kl"]["mean"] == pytest.approx(0.2)
    assert a["kl"]["p50"] == pytest.approx(0.2) and a["kl"]["p90"] == pytest.approx(0.28)  # numpy's linear rule
    assert a["is_weight"]["mean"] == pytest.approx(1.0) and a["is_weight"]["p90"] == pytest.approx(1.4)
    assert (a["first_seen"], a["last_seen"]) == (100.0, 130.0)
    assert rows["B"]["first_seen"] == 130.0 and rows["B"]["offered"] == 0 and rows["B"]["samples"] == 1
    assert [r["peer_id"] for r in ledger.rows()] == ["A", "B"]  # most samples first


def test_quantile_matches_linear_interpolation():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    assert quantile(values, 0.5) == 3.5 and quantile(values, 0.9) == pytest.approx(6.9) and quantile([], 0.9) == 0.0
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 64):
        v = rng.normal(size=n).tolist()
        for q in (0.0, 0.5, 0.9, 1.0):
            assert quantile(v, q) == pytest.approx(float(np.quantile(v, q)))


def test_statistics_stay_bounded_and_the_mean_exact():
    stat, rng = Stat(), random.Random(1)
    for i in range(10_000):
        stat.add(float(i % 100), rng)
    stat.add(float("nan"), rng)  # never counted
    assert stat.count == 10_000 and len(stat.reservoir) == RESERVOIR
    assert stat.mean == pytest.approx(49.5)
    summary = stat.summary()
    assert 25 <= summary["p50"] <= 75 and summary["p90"] >= 70  # a uniform sample of 0..99


def test_lru_bound_forgets_the_least_recently_seen():
    clock = Clock()
    ledger = PeerLedger(None, max_peers=3, clock=clock)
    for i, peer in enumerate(["p0", "p1", "p2"]):
        clock.t = 1000.0 + i
        ledger.record_group(peer, None)
    ledger.record_group("p0", None)  # p0 seen again: p1 is now the oldest
    ledger.record_group("p3", None)
    ledger.record_samples([_sample("p4", 1.0, 0.0, 1.0)])
    assert len(ledger) == 3 and {r["peer_id"] for r in ledger.rows()} == {"p0", "p3", "p4"}


def test_persisted_atomically_and_restored_with_reputation(tmp_path):
    path = tmp_path / FILE_NAME
    ledger = PeerLedger(path, max_peers=8)
    for _ in range(5):
        ledger.record_group("good", None)
        ledger.reputation.record("good", None)
    ledger.record_group("bad", "decode_error")
    ledger.reputation.record("bad", "decode_error")
    ledger.record_samples([_sample("good", 1.0, 0.4, 1.2), _sample("good", 0.0, 0.6, 0.8, gradient=False)])
    ledger.save()
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no temporary file left behind
    before = ledger.rows()
    again = PeerLedger.open(path, max_peers=8)
    assert again.rows() == before
    assert again.reputation.good["good"] == 5.0 and again.reputation.faults["bad"] == 1.0
    assert load_rows(path) == before  # what status --peers and the dashboard read
    # A restored record keeps counting where it stopped.
    again.record_group("good", None)
    assert {r["peer_id"]: r["taken"] for r in again.rows()}["good"] == 6
    smaller = PeerLedger.open(path, max_peers=1)  # a lower bound keeps the most recently seen
    assert [r["peer_id"] for r in smaller.rows()] == ["good"]


@pytest.mark.parametrize("content", [
    b"{not json", b'{"format": 1, "peers": [{"peer_id": "a"', b'{"format": 99, "peers": []}', b"[1, 2]",
    b'{"format": 1, "peers": [{"peer_id": "a"}]}', b"\xff\xfe\x00garbage",
    b'{"format": 1, "peers": [{"peer_id": "a", "first_seen": NaN}]}',
], ids=["bad-json", "truncated", "wrong-format", "not-an-object", "missing-fields", "not-utf8", "nan"])
def test_damaged_file_is_set_aside_and_the_node_starts_empty(tmp_path, caplog, content):
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="swarm_node.peers.ledger"):
        ledger = PeerLedger.open(path)
    assert len(ledger) == 0 and not path.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(FILE_NAME + ".damaged-")]
    assert len(aside) == 1 and aside[0].read_bytes() == content
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "empty ledger" in warnings[0]
    ledger.record_group("a", None)
    ledger.save()
    assert [r["peer_id"] for r in load_rows(path)] == ["a"]


def test_wrong_field_types_are_damage_too(tmp_path):
    path = tmp_path / FILE_NAME
    good = PeerLedger(path)
    good.record_group("a", None)
    good.save()
    doc = json.loads(path.read_text())
    doc["peers"][0]["taken"] = -3
    path.write_text(json.dumps(doc))
    assert len(PeerLedger.open(path)) == 0
    with pytest.raises(FileNotFoundError):
        load_rows(path)  # it was moved aside


def test_admission_reads_the_persisted_reputation(tmp_path):
    path = tmp_path / FILE_NAME
    first = PeerLedger(path)
    admission = Admission(reputation=first.reputation)
    for _ in range(6):
        admission.record("liar", "wrong_prompt")
    for _ in range(4):
        admission.record("friend", None)
    assert admission.peer_reason("liar") == EXCLUDED
    first.record_group("liar", "wrong_prompt")
    first.record_group("friend", None)
    first.save()
    restarted = Admission(reputation=PeerLedger.open(path).reputation)
    assert restarted.peer_reason("liar") == EXCLUDED  # a restart does not reset trust
    assert restarted.reputation.weight("friend") == pytest.approx(1.0)
    assert restarted.reputation.weight("stranger") == pytest.approx(0.25)
    fresh = Admission()
    assert fresh.peer_reason("liar") is None  # what a ledger-less restart would have given


def test_top_peers_keeps_k_labels_and_sums_the_rest():
    ledger = PeerLedger(None)
    for i in range(6):
        ledger.record_samples([_sample(f"p{i}", float(i % 2), 0.1 * i, 1.0)] * (i + 1))
    rows = top_peers(ledger.rows(), 2)
    assert [r["peer_id"] for r in rows] == ["p5", "p4", "other"]
    other = rows[-1]
    assert other["peers"] == 4 and other["samples"] == 1 + 2 + 3 + 4
    assert other["kl"]["mean"] == pytest.approx((0 * 1 + 0.1 * 2 + 0.2 * 3 + 0.3 * 4) / 10)
    assert [r["peer_id"] for r in top_peers(ledger.rows(), 10)][-1] == "p0"  # all fit: no `other`
