"""What a receipt may claim (protocol/receipt_rules.py): counts tied to each other and to the span,
receipts only from trainers, drop reasons from the protocol's list; readers drop a record that
breaks a rule (counted), a writer cuts its own receipts to fit, and `status --given` says that
identities are free and weighs receivers by what the node has itself taken from them."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections import Counter

import pytest

from protocol import codec, keys
from protocol import receipt_rules as rules
from protocol import validate as v
from protocol.messages import MAX_RECEIPT_COUNT, NodeStatus, Receipt
from swarm_node import metric_names as m
from swarm_node.observe.given_view import STATEMENT, given_report, render_given
from swarm_node.peers.given import given_rows
from swarm_node.peers.ledger import PeerLedger
from swarm_node.peers.receipts import ReceiptBook
from swarm_node.swarm.exchange import RolloutExchange
from swarm_node.swarm.memory import MemorySwarm, MemoryTransport

READER, LIAR = "QmReader", "QmLiar"


def receipt(**changes) -> Receipt:
    base = Receipt(sender=READER, taken=2, samples=8, gradient=3, filtered=4, filtered_advantage=4, filtered_kl=1,
                   dropped=(("stale", 1),))
    return dataclasses.replace(base, **changes)


def record(*receipts: Receipt, span: float = 600.0, role: str = "trainer", peer: str = LIAR, t: float = 0.0,
           model: str = "m") -> NodeStatus:
    return NodeStatus(peer_id=peer, role=role, model_id=model, step=1, timestamp=t, receipts_span_s=span,
                      receipts=receipts)


def read_through_the_dht(*records: NodeStatus) -> tuple[list[NodeStatus], Counter[str], PeerLedger]:
    """Each record stored under its own peer's subkey of an in-memory swarm, read by READER's exchange."""
    swarm = MemorySwarm()
    reader = MemoryTransport(swarm, peer_id=READER)
    for st in records:
        writer = MemoryTransport(swarm, peer_id=st.peer_id)
        st = dataclasses.replace(st, timestamp=writer.dht_time())
        shard_key = keys.status_key("s", keys.status_shard(writer.peer_id))
        assert writer.store_owned(shard_key, codec.encode(st), writer.dht_time() + 60)
    ledger = PeerLedger(None, own_peer=READER)
    exchange = RolloutExchange(reader, "s", vocab_size=1, ledger=ledger)
    drops: Counter[str] = Counter()
    return exchange.read_statuses(timeout=1.0, drops=drops), drops, ledger


@pytest.mark.parametrize(("st", "reason"), [
    (record(receipt()), None),
    (record(), None),  # no receipts: nothing to claim, whatever the role
    (record(receipt(), role="observer"), rules.RECEIPTS_NOT_TRAINER),
    # 2^32 samples with gradient over 1 ms (the finding): within validate's bounds, but no node judges
    # 2^32 groups in a millisecond
    (record(receipt(taken=MAX_RECEIPT_COUNT, samples=MAX_RECEIPT_COUNT, gradient=MAX_RECEIPT_COUNT, filtered=0,
                    filtered_advantage=0, filtered_kl=0), span=0.001), rules.RECEIPT_OVER_RATE),
    (record(receipt(taken=rules.max_groups(600.0) + 1, samples=0, gradient=0, filtered=0, filtered_advantage=0,
                    filtered_kl=0)), rules.RECEIPT_OVER_RATE),
    (record(receipt(taken=0, samples=0, gradient=0, filtered=0, filtered_advantage=0, filtered_kl=0,
                    dropped=(("stale", rules.max_groups(600.0) + 1),))), rules.RECEIPT_OVER_RATE),  # drops count too
    (record(receipt(taken=1, samples=rules.MAX_GROUP_SIZE + 1, gradient=0)), rules.RECEIPT_SAMPLES_OVER_GROUPS),
    (record(receipt(taken=0, samples=1, gradient=0, filtered=0, filtered_advantage=0, filtered_kl=0)),
     rules.RECEIPT_SAMPLES_OVER_GROUPS),  # samples from no group taken
])
def test_readers_drop_and_count_a_record_whose_receipts_claim_too_much(st: NodeStatus, reason: str | None) -> None:
    assert v.validate_status(st, v.ValidationLimits(vocab_size=1)) == []  # the wire's bounds alone let it pass
    assert rules.claim_reasons(st) == ([] if reason is None else [reason])
    statuses, drops, ledger = read_through_the_dht(st)
    if reason is None:
        assert [s.peer_id for s in statuses] == [LIAR] and drops == Counter()
    else:
        assert statuses == [] and drops == {f"status_{reason}": 1}
        assert ledger.given_metrics()[m.GIVEN_GROUPS_TAKEN] == 0.0  # the reader keeps no word of it


def test_the_bounds_at_their_edge() -> None:
    span = 120.0
    at = rules.max_groups(span)
    assert at == rules.RECEIPT_BURST_GROUPS + int(rules.MAX_RECEIPT_GROUPS_PER_S * span)
    edge = receipt(taken=at - 5, samples=(at - 5) * rules.MAX_GROUP_SIZE, gradient=0, dropped=(("stale", 5),))
    assert rules.claim_reasons(record(edge, span=span)) == []
    assert rules.claim_reasons(record(dataclasses.replace(edge, dropped=(("stale", 6),)), span=span)) == [
        rules.RECEIPT_OVER_RATE]


def test_a_reason_outside_the_list_is_read_as_other_never_shown_by_name() -> None:
    st = record(receipt(dropped=(("sender_is_a_cheat", 3), ("stale", 1), ("other", 2))))
    statuses, drops, ledger = read_through_the_dht(st)
    assert drops == Counter() and len(statuses) == 1  # the record stays: only the unknown name goes
    (row,) = given_rows(statuses, READER)
    assert row["dropped_by_reason"] == {"other": 5, "stale": 1} and row["dropped"] == 6
    assert "sender_is_a_cheat" not in str(ledger.rows())


def test_every_reason_the_node_drops_peer_data_for_is_on_the_list() -> None:
    """The reason constants of the modules that drop peer data (groups, index records, chunks):
    each is one a receipt may name."""
    modules = ["swarm_node.swarm.exchange", "swarm_node.swarm.statuses", "swarm_node.swarm.transport",
               "swarm_node.swarm.binding", "swarm_node.swarm.admission", "swarm_node.swarm.gather_book",
               "swarm_node.node.peer_rollouts", "swarm_node.peers.crosstok_receive", "swarm_node.peers.spotcheck",
               "swarm_node.tasks.verify"]
    # not drop reasons: a sender's name (binding), spot-check outcomes, the tiers of fair sampling
    not_reasons = {"horizontal", "checked", "unchecked", "over_budget", "own", "newcomer", "probe"}
    found = set(v.GROUP_REASONS)
    for name in modules:
        module = importlib.import_module(name)
        found |= {val for key, val in vars(module).items()
                  if key.isupper() and isinstance(val, str) and re.fullmatch(r"[a-z0-9_]{1,40}", val)}
    missing = found - not_reasons - rules.DROP_REASONS
    assert not missing, f"add these drop reasons to protocol.receipt_rules.DROP_REASONS: {sorted(missing)}"


def test_a_node_never_writes_a_receipt_its_readers_drop() -> None:
    """A sender that gets counted more drops than the rate allows (one payload listed many times, say)
    cannot make its receiver's record unreadable: the writer cuts its receipts to the rules."""
    book = ReceiptBook(600.0, clock=lambda: 1000.0)  # span: 0.001 s (the book has just started)
    for _ in range(rules.RECEIPT_BURST_GROUPS + 500):
        book.group(LIAR, "duplicate")
    book.group(LIAR, None)
    span, (r,) = book.receipts()
    st = record(r, span=span, peer=READER)
    assert v.validate_status(st, v.ValidationLimits(vocab_size=1)) == [] and rules.claim_reasons(st) == []
    assert r.taken == 1 and r.dropped == (("duplicate", rules.RECEIPT_BURST_GROUPS - 1),)


def test_fit_claims_scales_samples_down_with_their_groups() -> None:
    big = receipt(taken=1, samples=1000, gradient=500, filtered=400, filtered_advantage=300, filtered_kl=100)
    fit = rules.fit_claims(big, 600.0)
    assert fit.samples == rules.MAX_GROUP_SIZE and fit.gradient + fit.filtered <= fit.samples
    assert (fit.gradient, fit.filtered, fit.filtered_advantage, fit.filtered_kl) == (128, 102, 76, 25)
    assert rules.fit_claims(receipt(), 600.0) == receipt()  # an honest receipt is left alone


def test_status_given_says_identities_are_free_and_weighs_receivers_by_what_this_node_took() -> None:
    honest, sybils = "QmHonest", [f"QmSybil{i}" for i in range(3)]
    statuses = [record(receipt(taken=2, samples=8, gradient=3), peer=honest, t=1.0)]
    statuses += [record(receipt(taken=50, samples=400, gradient=300, filtered=0, filtered_advantage=0, filtered_kl=0),
                        peer=s, t=1.0) for s in sybils]
    report = given_report(statuses, READER, "node dir x", took_from={honest: 7, "QmElse": 3})
    assert report["totals"]["gradient"] == 903 and report["seen"]["gradient"] == 3  # the claims vs the seen
    assert report["seen"]["receivers"] == 1 and {r["receiver"]: r["took_here"] for r in report["receivers"]} == {
        honest: 7, **{s: 0 for s in sybils}}
    assert "identities are free" in STATEMENT and "claims" in STATEMENT
    assert "worth more" not in STATEMENT  # agreeing receivers are what Sybils fake
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(render_given(report))
    text = " ".join(console.export_text().split())
    assert "took here" in text and "seen here" in text and "identities are free" in text
    assert "This node took groups from 1 of these 4 receivers (seen here): they state 3 of the 903" in text
    unseen = given_report(statuses, READER, "peer id")  # a peer id alone: no ledger of its own to weigh by
    assert unseen["seen"] is None and all(r["took_here"] is None for r in unseen["receivers"])
