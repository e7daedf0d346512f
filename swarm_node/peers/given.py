"""What a node's groups gave the swarm: the receipts that name it, read from peers' status records.

Every receiver's status record carries receipts (`receipts.py`): per sender, what it did with that
sender's groups over the record's span. `given_rows` picks, from the swarm's status records, the
receipt naming one peer in each receiver's newest record; `given_totals` adds them up (distinct
receivers, groups taken, samples with gradient, filtered by condition, dropped by reason) and says
how much of the gradient the loudest receiver claims (`top_share`), so one receiver that states
large numbers stands out; `given_metrics` turns the totals into a node's `given_*` metrics.

What this proves: each row is a receiver's statement, signed with its key (the DHT refuses a
status record written under another peer's subkey), within the rules of `protocol.receipt_rules`
(counts tied to each other and to the span, drop reasons from the protocol's list). What it does
not: a receiver can state anything within them about itself, and identities are free: one party
can run many receivers that agree, so neither totals nor agreement are evidence on their own.
What this node has itself seen of a receiver is: `seen_totals` adds up only the receivers whose
groups this node took (they did work that passed its checks), the weight a reader can give a
receiver from its own ledger. Pure functions over records; `given_view.py` prints them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from protocol.receipt_rules import known_reason
from swarm_node import metric_names as m

COUNTS = ("taken", "samples", "gradient", "filtered", "filtered_advantage", "filtered_kl")
MAX_REASON_METRICS = 8  # `given_dropped_<reason>` metrics: the commonest reasons only (receivers name them)


def given_rows(statuses: Iterable[Any], peer_id: str) -> list[dict[str, Any]]:
    """One row per receiver whose newest status record holds a receipt naming `peer_id` (its own
    record aside), most gradient first: the receiver, its model, tokenizer and step, when it wrote
    the record, the span its counts cover, the receipt's counts and its drops by reason."""
    newest: dict[str, Any] = {}
    for st in statuses:
        if st.peer_id != peer_id and (st.peer_id not in newest or st.timestamp > newest[st.peer_id].timestamp):
            newest[st.peer_id] = st
    rows = []
    for receiver, st in newest.items():
        receipt = next((r for r in getattr(st, "receipts", ()) if r.sender == peer_id), None)
        if receipt is None:
            continue
        dropped: Counter[str] = Counter()
        for reason, n in receipt.dropped:  # a name outside the protocol's list says nothing: `other`
            dropped[known_reason(reason)] += n
        rows.append({"receiver": receiver, "model_id": st.model_id, "step": st.step, "timestamp": st.timestamp,
                     "tokenizer_fingerprint": getattr(st, "tokenizer_fingerprint", ""),
                     "span_s": st.receipts_span_s, **{k: getattr(receipt, k) for k in COUNTS},
                     "dropped": sum(dropped.values()), "dropped_by_reason": dict(dropped)})
    return sorted(rows, key=lambda r: (-r["gradient"], -r["taken"], -r["dropped"], r["receiver"]))


def given_totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The rows added up: `receivers` (records naming the peer), `takers` (those that took a group),
    the summed counts, drops by reason (commonest first), the shortest and longest span, and the
    receiver stating the most samples with gradient with its share of them (`top_share`, 0 when none)."""
    rows = list(rows)
    totals: dict[str, Any] = {k: sum(int(r[k]) for r in rows) for k in COUNTS}
    reasons: Counter[str] = Counter()
    for r in rows:
        reasons.update(r["dropped_by_reason"])
    top = max(rows, key=lambda r: (r["gradient"], r["receiver"]), default=None)
    gradient = totals["gradient"]
    return {"receivers": len(rows), "takers": sum(1 for r in rows if r["taken"] > 0), **totals,
            "dropped": sum(reasons.values()),
            "dropped_by_reason": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            "span_s_min": min((r["span_s"] for r in rows), default=0.0),
            "span_s_max": max((r["span_s"] for r in rows), default=0.0),
            "top_receiver": top["receiver"] if top is not None and gradient else None,
            "top_share": top["gradient"] / gradient if top is not None and gradient else 0.0}


def seen_totals(rows: Iterable[Mapping[str, Any]], took_from: Mapping[str, int]) -> dict[str, Any]:
    """`given_totals` over the receivers whose groups this node took (`took_from`: groups this node
    took per peer, from its own ledger): weight 1 for a receiver this node has seen do checked work,
    0 for an identity it knows only from its record."""
    return given_totals(r for r in rows if took_from.get(r["receiver"], 0) > 0)


def given_metrics(totals: Mapping[str, Any], age_s: float) -> dict[str, float]:
    """A node's `given_*` metrics from the totals of the receipts naming it, read `age_s` seconds ago."""
    out = {
        m.GIVEN_RECEIVERS: totals["receivers"], m.GIVEN_TAKERS: totals["takers"],
        m.GIVEN_GROUPS_TAKEN: totals["taken"], m.GIVEN_SAMPLES: totals["samples"],
        m.GIVEN_SAMPLES_GRADIENT: totals["gradient"], m.GIVEN_SAMPLES_FILTERED: totals["filtered"],
        m.GIVEN_FILTERED_ADVANTAGE: totals["filtered_advantage"], m.GIVEN_FILTERED_KL: totals["filtered_kl"],
        m.GIVEN_GROUPS_DROPPED: totals["dropped"], m.GIVEN_TOP_SHARE: totals["top_share"],
        m.GIVEN_SPAN_S: totals["span_s_min"], m.GIVEN_AGE_S: age_s,
    }
    named = [(r, n) for r, n in totals["dropped_by_reason"].items() if m.NAME_RE.match(m.GIVEN_DROPPED_PREFIX + r)]
    for reason, n in named[:MAX_REASON_METRICS]:  # receivers name them: a bounded, well-formed few
        out[m.given_dropped_name(reason)] = n
    return {k: float(v) for k, v in out.items()}
