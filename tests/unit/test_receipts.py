"""Receipts on the node's side: the ledger's per-sender counts over a span (receipts.py), what the
receipts naming a node add up to (given.py), and where they are shown: the node's given_* metrics,
Prometheus, the ledger views, `status --given`'s rendering, and the report's `gave` column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from protocol import validate as v
from protocol.messages import MAX_RECEIPT_REASONS, MAX_RECEIPTS, NodeStatus, Receipt
from protocol.receipt_rules import DROP_REASONS
from swarm_node import metric_names as m
from swarm_node.peers import receipts as receipts_mod
from swarm_node.util.errors import InputError
from swarm_node.peers.given import given_metrics, given_rows, given_totals
from swarm_node.observe.given_run import gave_by_node, gave_text
from swarm_node.observe.given_view import STATEMENT, given_report, render_given, resolve_peer
from swarm_node.peers.ledger import FILE_NAME, PeerLedger, load_rows
from swarm_node.policy.types import SampleStat
from swarm_node.observe.prometheus import PrometheusExporter
from swarm_node.peers.receipts import BUCKETS, ReceiptBook, bounded_reasons

A, B, C = "QmSenderA", "QmReceiverB", "QmReceiverC"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stat(peer: str, *, gradient=False, filtered=False, adv=False, kl=False) -> SampleStat:
    return SampleStat(peer, 1.0, 0.1, 1.0, filtered, gradient, filtered_advantage=adv, filtered_kl=kl)


def test_book_counts_each_sender_over_the_span_and_forgets_older_buckets() -> None:
    clock = Clock(1200.0)  # span 120 s: 12 buckets of 10 s; the book starts at t = 1200
    book = ReceiptBook(120.0, clock)
    assert book.receipts() == (0.0, ())
    book.group(A, None)
    book.group(A, "stale")
    book.sample(stat(A, gradient=True))
    book.sample(stat(A, filtered=True, adv=True, kl=True))
    clock.t = 1250.0
    book.group(A, None)
    span, (r,) = book.receipts()
    assert span == 50.0  # since the book started, not the full ring
    assert (r.sender, r.taken, r.samples, r.gradient, r.filtered, r.filtered_advantage, r.filtered_kl) == (A, 2, 2, 1, 1, 1, 1)
    assert r.dropped == (("stale", 1),)
    clock.t = 1200.0 + 120.0 + 5.0  # the bucket of t = 1200 has left the ring (the oldest kept starts at 1210)
    span, (r,) = book.receipts()
    assert span == 115.0 and (r.taken, r.samples, r.dropped) == (1, 0, ())
    clock.t = 1250.0 + 120.0  # and now the bucket of t = 1250
    assert book.receipts() == (0.0, ())
    assert book.covered_s() == pytest.approx(120.0 - 10.0)  # the ring: the current bucket and 11 before it
    assert BUCKETS == 12


def test_book_keeps_the_senders_that_gave_most_and_bounds_the_reasons() -> None:
    book = ReceiptBook(600.0, Clock())
    for i in range(MAX_RECEIPTS + 5):  # sender i: i groups taken, plus a drop each
        for _ in range(i):
            book.group(f"Qm{i:03d}", None)
        book.group(f"Qm{i:03d}", "stale")
    for i, reason in enumerate(sorted(DROP_REASONS - {"other", "stale"})[:10]):  # many reasons for the top sender
        for _ in range(i + 1):
            book.group(f"Qm{MAX_RECEIPTS + 4:03d}", reason)
    span, kept = book.receipts(MAX_RECEIPTS)
    assert len(kept) == MAX_RECEIPTS and [r.sender for r in kept[:2]] == [f"Qm{MAX_RECEIPTS + 4:03d}", f"Qm{MAX_RECEIPTS + 3:03d}"]
    assert {r.sender for r in kept} == {f"Qm{i:03d}" for i in range(5, MAX_RECEIPTS + 5)}  # the 5 that gave least left out
    top = kept[0]
    assert len(top.dropped) == MAX_RECEIPT_REASONS and top.dropped[-1][0] == "other"
    assert sum(n for _, n in top.dropped) == 1 + sum(range(1, 11))  # nothing lost: the rest under `other`
    assert [n for _, n in top.dropped[:-1]] == sorted((n for _, n in top.dropped[:-1]), reverse=True)
    assert book.receipts(3)[1] == kept[:3] and book.receipts(0) == (0.0, ())
    status = NodeStatus(peer_id="QmMe", role="trainer", model_id="m", step=1, timestamp=1.0,
                        receipts_span_s=span, receipts=kept)
    assert v.validate_status(status, v.ValidationLimits(vocab_size=1)) == []


def test_reason_names_a_receipt_cannot_carry_go_under_other() -> None:
    from collections import Counter

    assert bounded_reasons(Counter({"stale": 2, "Bad Reason": 3, "other": 1, "zero": 0})) == (("stale", 2), ("other", 4))


def test_book_bounds_the_senders_of_one_bucket(monkeypatch) -> None:
    monkeypatch.setattr(receipts_mod, "MAX_SENDERS_PER_BUCKET", 3)
    book = ReceiptBook(600.0, Clock())
    for i in range(5):
        book.group(f"Qm{i}", None)
    assert len(book.receipts()[1]) == 3 and book.untracked == 2


def test_ledger_receipts_state_what_its_rows_count() -> None:
    clock = Clock()
    ledger = PeerLedger(None, clock=clock, own_peer=B, receipts_span_s=600.0)
    for reason in (None, None, "stale", "wrong_prompt"):
        ledger.record_group(A, reason)
    ledger.record_samples([stat(A, gradient=True), stat(A, filtered=True, adv=True),
                           stat(A, filtered=True, kl=True), stat(A)])
    ledger.record_late_drop(A, "nonfinite_step")
    clock.t += 30.0
    span, (r,) = ledger.receipts(MAX_RECEIPTS)
    row = next(x for x in ledger.rows() if x["peer_id"] == A)
    assert span == 30.0
    assert (r.taken, r.samples, r.gradient, r.filtered, r.filtered_advantage, r.filtered_kl) == (
        row["taken"], row["samples"], row["gradient"], row["filtered"], row["filtered_advantage"], row["filtered_kl"])
    assert dict(r.dropped) == row["dropped_by_reason"] == {"stale": 1, "wrong_prompt": 1, "nonfinite_step": 1}
    assert (r.taken, r.gradient, r.filtered_advantage, r.filtered_kl) == (2, 1, 1, 1)


def _status(peer: str, receipts: list[Receipt], t: float = 100.0, span: float = 600.0) -> NodeStatus:
    return NodeStatus(peer_id=peer, role="trainer", model_id=f"model-of-{peer}", step=3, timestamp=t,
                      receipts_span_s=span if receipts else 0.0, receipts=tuple(receipts))


def _receipt(sender: str, taken: int, samples: int, gradient: int, dropped=()) -> Receipt:
    return Receipt(sender=sender, taken=taken, samples=samples, gradient=gradient, filtered=1 if samples else 0,
                   filtered_advantage=1 if samples else 0, filtered_kl=0, dropped=tuple(dropped))


def test_given_adds_up_the_receipts_naming_a_peer() -> None:
    statuses = [
        _status(B, [_receipt(A, 4, 16, 6, [("stale", 2)]), _receipt(C, 1, 4, 1)], span=300.0),
        _status(C, [_receipt(A, 2, 8, 2, [("stale", 1), ("wrong_prompt", 3)])], t=90.0),
        _status(C, [_receipt(A, 9, 36, 20)], t=50.0),  # an older record of C: the newest one counts
        _status(A, [_receipt(B, 5, 20, 9)]),  # A's own record: what A took, not what it gave
        _status("QmObserver", []),
    ]
    rows = given_rows(statuses, A)
    assert [r["receiver"] for r in rows] == [B, C]
    assert (rows[0]["taken"], rows[0]["samples"], rows[0]["gradient"], rows[0]["span_s"]) == (4, 16, 6, 300.0)
    assert rows[1]["dropped_by_reason"] == {"stale": 1, "wrong_prompt": 3} and rows[1]["model_id"] == f"model-of-{C}"
    t = given_totals(rows)
    assert (t["receivers"], t["takers"], t["taken"], t["samples"], t["gradient"], t["dropped"]) == (2, 2, 6, 24, 8, 6)
    assert t["dropped_by_reason"] == {"stale": 3, "wrong_prompt": 3} and list(t["dropped_by_reason"]) == ["stale", "wrong_prompt"]
    assert (t["top_receiver"], t["top_share"], t["span_s_min"], t["span_s_max"]) == (B, 0.75, 300.0, 600.0)
    metrics = given_metrics(t, age_s=12.0)
    assert metrics[m.GIVEN_SAMPLES_GRADIENT] == 8.0 and metrics[m.GIVEN_TAKERS] == 2.0
    assert metrics[m.GIVEN_AGE_S] == 12.0 and metrics[m.GIVEN_TOP_SHARE] == 0.75
    assert metrics["given_dropped_wrong_prompt"] == 3.0 and metrics["given_dropped_stale"] == 3.0
    assert set(metrics) - {k for k in metrics if k.startswith(m.GIVEN_DROPPED_PREFIX)} <= set(m.METRICS)
    assert given_totals([]) == {**given_totals([]), "receivers": 0, "gradient": 0, "top_receiver": None, "top_share": 0.0}


def test_given_metrics_name_a_bounded_number_of_reasons() -> None:
    rows = [{"receiver": f"Qm{i}", "taken": 0, "samples": 0, "gradient": 0, "filtered": 0, "filtered_advantage": 0,
             "filtered_kl": 0, "span_s": 60.0, "dropped": 1, "dropped_by_reason": {f"reason_{i}": 1}} for i in range(20)]
    named = [k for k in given_metrics(given_totals(rows), 0.0) if k.startswith(m.GIVEN_DROPPED_PREFIX)]
    assert len(named) == 8


def test_the_ledger_shows_what_each_peer_took_of_ours_beside_what_we_took_of_it(tmp_path) -> None:
    clock = Clock()
    ledger = PeerLedger(tmp_path / FILE_NAME, clock=clock, own_peer=A)
    ledger.record_group(B, None)
    assert ledger.given_metrics() == {}  # nothing read yet: no given_* metrics
    ledger.note_receipts([_status(B, [_receipt(A, 4, 16, 6)]), _status(C, [_receipt(A, 1, 4, 0, [("stale", 1)])])])
    clock.t += 5.0
    metrics = ledger.given_metrics()
    assert metrics[m.GIVEN_GROUPS_TAKEN] == 5.0 and metrics[m.GIVEN_AGE_S] == 5.0 and metrics[m.GIVEN_RECEIVERS] == 2.0
    rows = {r["peer_id"]: r for r in ledger.rows()}
    assert rows[B]["taken"] == 1 and rows[B]["given"]["taken"] == 4 and rows[B]["given"]["gradient"] == 6
    assert rows[C]["offered"] == 0 and rows[C]["given"]["dropped_by_reason"] == {"stale": 1}  # a receiver only
    ledger.save()
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved["peer_id"] == A and len(saved["given"]) == 2
    assert {r["peer_id"]: r["given"] for r in load_rows(tmp_path / FILE_NAME)} == {p: r["given"] for p, r in rows.items()}
    saved["given"][0]["taken"] = -1
    (tmp_path / FILE_NAME).write_text(json.dumps(saved))
    with pytest.raises(ValueError):
        load_rows(tmp_path / FILE_NAME)


def test_prometheus_exports_given_metrics_and_keeps_only_the_reasons_reported() -> None:
    exporter = PrometheusExporter("127.0.0.1:0")
    exporter.update({m.GIVEN_SAMPLES_GRADIENT: 7.0, m.GIVEN_RECEIVERS: 2.0, "given_dropped_stale": 3.0,
                     "given_dropped_wrong_prompt": 1.0})
    text = generate_latest(exporter.registry).decode()
    assert "swarm_node_given_samples_gradient 7.0" in text and "swarm_node_given_receivers 2.0" in text
    assert 'swarm_node_given_dropped{reason="stale"} 3.0' in text
    exporter.update({m.GIVEN_SAMPLES_GRADIENT: 9.0, m.GIVEN_RECEIVERS: 2.0, "given_dropped_stale": 4.0})
    text = generate_latest(exporter.registry).decode()
    assert 'swarm_node_given_dropped{reason="stale"} 4.0' in text and "wrong_prompt" not in text
    assert "swarm_node_dropped_total" not in text or "given" not in text.split("swarm_node_dropped_total")[1][:40]


PEER = "12D3KooWQwertyPeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def test_status_given_renders_each_receiver_and_says_what_a_receipt_proves(tmp_path) -> None:
    from rich.console import Console

    report = given_report([_status(B, [_receipt(PEER, 4, 16, 6, [("stale", 2)])]),
                           _status(C, [_receipt(PEER, 1, 4, 2)])], PEER, "peer id")
    assert report["totals"]["gradient"] == 8 and report["statement"] == STATEMENT
    assert json.loads(json.dumps(report))["receivers"][0]["receiver"] == B
    console = Console(width=200, record=True)
    console.print(render_given(report))
    text = " ".join(console.export_text().split())  # the title wraps
    assert "2 receivers" in text and "2 say they took some" in text and B[:14] in text and "stale" in text
    assert "75% of the samples with gradient" in text and "does not prove" in text
    empty = Console(width=200, record=True)
    empty.print(render_given(given_report([], PEER)))
    assert "No receipt names this peer" in empty.export_text()


def test_status_given_takes_a_node_dir_or_a_peer_id(tmp_path) -> None:
    from swarm_node.swarm.identity import load_node_identity

    assert resolve_peer(PEER) == (PEER, "peer id")
    peer = load_node_identity(tmp_path).peer_id
    assert resolve_peer(str(tmp_path)) == (peer, f"node dir {tmp_path}")
    (tmp_path / "new").mkdir()
    with pytest.raises(InputError, match="no identity.key"):
        resolve_peer(str(tmp_path / "new"))
    assert not (tmp_path / "new" / "identity.key").exists()  # never created by a reader
    with pytest.raises(InputError, match="neither a node directory nor a peer id"):
        resolve_peer("not a peer")


def test_report_gave_comes_from_the_receivers_ledgers_else_from_receipts(tmp_path) -> None:
    dirs = {"a": tmp_path / "a", "b": tmp_path / "b", "c": tmp_path / "c"}
    for name, peer in (("a", A), ("b", B)):
        PeerLedger(dirs[name] / FILE_NAME, own_peer=peer).save()
    lb = PeerLedger(dirs["b"] / FILE_NAME, own_peer=B)
    lb.record_group(A, None)
    lb.record_group(A, None)
    lb.record_samples([stat(A, gradient=True), stat(A)])
    lb.save()
    dirs["c"].mkdir()
    runs = {"a": [{}], "b": [{}], "c": [{m.GIVEN_RECEIVERS: 1.0, m.GIVEN_TAKERS: 1.0, m.GIVEN_GROUPS_TAKEN: 3.0,
                                     m.GIVEN_SAMPLES: 12.0, m.GIVEN_SAMPLES_GRADIENT: 5.0}, {"step": 2.0}]}
    gave = gave_by_node(dirs, runs)
    assert gave["a"] == {"source": "ledgers", "receivers": 1, "taken": 2, "samples": 2, "gradient": 1}
    assert gave["b"] == {"source": "ledgers", "receivers": 0, "taken": 0, "samples": 0, "gradient": 0}
    assert gave["c"] == {"source": "receipts", "receivers": 1, "taken": 3, "samples": 12, "gradient": 5}
    assert gave_text(gave["a"]) == "1 samples with gradient (of 2 trained on) at 1 peer (ledgers)"
    assert gave_text(None) == ""
    assert isinstance(Path(dirs["a"]), Path)


def test_nodes_publish_receipts_and_read_the_ones_naming_them(tmp_path) -> None:
    """In-memory swarm, real tiny nodes: B's status record states what B's ledger counts of A's
    groups; A reads it with the status records it reads anyway, and its next step reports it."""
    from swarm_node.swarm.memory import MemorySwarm
    from tests.unit.test_node_loop import make_node

    swarm = MemorySwarm()
    a, b = make_node(tmp_path, swarm, "A"), make_node(tmp_path, swarm, "B", model="tiny-random:96x1:a")
    a.run_step()
    b.run_step()
    statuses = {s.peer_id: s for s in a.parts.exchange.read_statuses(timeout=1.0)}
    (r,) = [x for x in statuses["B"].receipts if x.sender == "A"]
    row = next(x for x in b.parts.ledger.rows() if x["peer_id"] == "A")
    assert r.taken == row["taken"] >= 1 and r.samples == row["samples"] == 4 * r.taken
    assert (r.gradient, r.filtered, r.filtered_advantage, r.filtered_kl) == (
        row["gradient"], row["filtered"], row["filtered_advantage"], row["filtered_kl"])
    assert dict(r.dropped) == row["dropped_by_reason"] and 0 < statuses["B"].receipts_span_s < 600
    metrics = a.run_step()
    assert metrics[m.GIVEN_RECEIVERS] == 1.0 and metrics[m.GIVEN_GROUPS_TAKEN] == r.taken
    assert metrics[m.GIVEN_SAMPLES_GRADIENT] == r.gradient and metrics[m.GIVEN_TOP_SHARE] in (0.0, 1.0)
    assert next(x for x in a.parts.ledger.rows() if x["peer_id"] == "B")["given"]["taken"] == r.taken


def test_a_status_record_with_broken_receipts_is_dropped_and_counted() -> None:
    from collections import Counter

    from protocol import codec, keys
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

    swarm = MemorySwarm()
    liar, reader = MemoryTransport(swarm, peer_id="QmLiar"), MemoryTransport(swarm, peer_id="QmReader")
    ledger = PeerLedger(None, own_peer="QmReader")
    bad = Receipt(sender="QmReader", taken=1, samples=4, gradient=9, filtered=0, filtered_advantage=0, filtered_kl=0)
    record = NodeStatus(peer_id="QmLiar", role="trainer", model_id="m", step=1, timestamp=liar.dht_time(),
                        receipts_span_s=60.0, receipts=(bad,))  # gradient > samples: no receiver can mean it
    shard_key = keys.status_key("s", keys.status_shard(liar.peer_id))
    assert liar.store_owned(shard_key, codec.encode(record), liar.dht_time() + 60)
    exchange = RolloutExchange(reader, "s", vocab_size=1, ledger=ledger)
    drops: Counter[str] = Counter()
    assert exchange.read_statuses(timeout=1.0, drops=drops) == []
    assert drops == {"status_bad_receipt_count": 1} and exchange.drops["status_bad_receipt_count"] == 1
    assert ledger.given_metrics()[m.GIVEN_RECEIVERS] == 0.0  # the reader keeps no word of it
