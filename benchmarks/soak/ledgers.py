"""What the soak's ledgers say: the share of taken groups each sender got (fairness), who was
excluded and why, and whether `status --given` agrees with the receivers' own ledgers."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.soak.plan import SoakPlan
from benchmarks.soak.sampling import metrics_rows, read_jsonl


def gini(values: list[float]) -> float:
    xs = sorted(values)
    n, total = len(xs), sum(xs)
    if n == 0 or total == 0:
        return 0.0
    return sum((2 * i - n + 1) * x for i, x in enumerate(xs)) / (n * total)


def fairness(ledgers: list[dict[str, Any]], ids: dict[str, str], light: set[str]) -> dict[str, Any]:
    """Each sender's share of all groups taken (the receivers' last ledger reads), light and
    training peers apart; every known peer counts, taken or not."""
    final: dict[str, dict[str, int]] = {}
    for snap in ledgers:
        final[snap["node"]] = snap["taken"]
    taken: dict[str, int] = defaultdict(int)
    for receiver in final.values():
        for sender, n in receiver.items():
            taken[sender] += n
    out = {}
    for label, senders in (("light", light), ("training", set(ids))):
        counts = [taken.get(s, 0) for s in senders]
        total = sum(counts)
        if not counts or total == 0:
            out[label] = {"senders": len(counts), "taken": total}
            continue
        mean = total / len(counts)
        out[label] = {"senders": len(counts), "taken": total, "never_taken": sum(c == 0 for c in counts),
                      "max_over_mean": round(max(counts) / mean, 2), "gini": round(gini(counts), 3),
                      "shares": sorted((round(c / total, 4) for c in counts), reverse=True)}
    out["by_training_sender"] = {ids[s]: taken.get(s, 0) for s in ids}
    return out


def exclusions(run_dir: Path, plan: SoakPlan, ids: dict[str, str], light: set[str]) -> dict[str, Any]:
    """Peers any node's ledger marks excluded, and excluded_peer drops, by honest peer."""
    found, faults = [], []
    for n in plan.nodes:
        try:
            data = json.loads((run_dir / n.name / "peer_ledger.json").read_text())
        except (OSError, ValueError):
            continue
        for row in data.get("peers", []):
            peer = row.get("peer_id")
            if peer not in ids and peer not in light:
                continue
            if row.get("dropped", {}).get("excluded_peer", 0):
                found.append({"receiver": n.name, "peer": ids.get(peer, "light:" + peer[-6:]),
                              "excluded_drops": row["dropped"]["excluded_peer"]})
            if row.get("reputation", {}).get("faults", 0) > 0:
                faults.append({"receiver": n.name, "peer": ids.get(peer, "light:" + peer[-6:]),
                               "faults": row["reputation"]["faults"],
                               "dropped": row.get("dropped", {})})
    drops = 0
    for n in plan.nodes:
        rows = metrics_rows(run_dir / n.name)
        drops += int(rows[-1].get("total_dropped_excluded_peer", 0)) if rows else 0
    return {"excluded": found, "excluded_peer_drops": drops, "faults_against_honest": faults}


def given_agreement(run_dir: Path, ids: dict[str, str], events: list[dict[str, Any]],
                    ledgers: list[dict[str, Any]]) -> dict[str, Any]:
    """For each (sender, receiver) pair that `status --given` shows after the nodes stopped: whether
    the receipt's `taken` equals what the receiver's ledger counted over the receipt's span.

    A receipt's span starts at the receiver's (re)start when that is within the ring's span: then
    the ledger's count over it is its final count less its count when that process started (the
    file it loaded: the last ledger read before the start), and the comparison is exact. When the
    ring rolled over, the span starts at a bucket edge between two reads of the ledger (one every
    15 s, none before a process first writes its file): the count at that edge lies between the
    read before it (or the count the process started with) and the read after it. When the two
    are equal the comparison is exact again; otherwise the receipt agrees when it lies within the
    bounds they give (`within_sampling`), and only one outside them is a mismatch."""
    name_to_id = {v: k for k, v in ids.items()}
    finals: dict[str, dict[str, int]] = {}
    for name in name_to_id:
        try:
            rows = json.loads((run_dir / name / "peer_ledger.json").read_text()).get("peers", [])
            finals[name_to_id[name]] = {r["peer_id"]: r.get("taken", 0) for r in rows if "peer_id" in r}
        except (OSError, ValueError):
            pass
    starts = defaultdict(list)
    loaded: dict[tuple[str, float], dict[str, int]] = {}  # (node, restart time) -> the ledger it loaded
    kill_ledger: dict[str, dict[str, int]] = {}
    for e in events:
        if e["kind"] == "kill" and "ledger_taken" in e:
            kill_ledger[e["node"]] = e["ledger_taken"]
        if e["kind"] in ("start", "restart", "supervised_restart", "late_join"):
            starts[e["node"]].append(e["time"])
            if e["kind"] == "restart" and e["node"] in kill_ledger:
                loaded[(e["node"], e["time"])] = kill_ledger.pop(e["node"])
            elif e["kind"] in ("start", "late_join"):
                loaded[(e["node"], e["time"])] = {}  # an empty directory: nothing taken yet

    def ledger_at(node: str, t: float, sender: str) -> int:
        before = [s for s in ledgers if s["node"] == node and s["time"] <= t]
        return before[-1]["taken"].get(sender, 0) if before else 0

    def base_bounds(node: str, started: float, began: float, sender: str, final: int) -> tuple[int, int]:
        """(low, high) of the receiver's count of `sender` at `began`, from the reads around it."""
        reads = [s for s in ledgers if s["node"] == node and s["time"] >= started]
        before = [s["taken"].get(sender, 0) for s in reads if s["time"] <= began]
        after = [s["taken"].get(sender, 0) for s in reads if s["time"] >= began]
        if before:
            low = before[-1]
        elif (node, started) in loaded:
            low = loaded[(node, started)].get(sender, 0)
        else:  # a supervised restart: the file it loaded was not read
            low = ledger_at(node, started, sender)
        return low, (after[0] if after else final)

    pairs, agree, exact_pairs, within, mismatches = 0, 0, 0, 0, []
    for row in read_jsonl(run_dir / "given.jsonl"):
        sender = name_to_id.get(row["node"])
        for rec in (row["given"].get("receivers", []) if isinstance(row["given"], dict) else []):
            receiver = rec.get("receiver")
            if receiver not in finals or sender is None:
                continue  # a light peer's receipts: it keeps no ledger
            name = ids[receiver]
            final = finals[receiver].get(sender, 0)
            began = rec["timestamp"] - rec["span_s"]
            started = max((t for t in starts[name] if t <= rec["timestamp"]), default=0.0)
            exact = began <= started + 60  # the book started with the process (it starts a few s after)
            if exact and (name, started) in loaded:  # the file the process loaded
                low = high = loaded[(name, started)].get(sender, 0)
            elif exact:
                low = high = ledger_at(name, started, sender)
            else:
                low, high = base_bounds(name, started, began, sender, final)
                exact = low == high
            pairs += 1
            exact_pairs += exact
            taken = rec.get("taken")
            if exact and taken == final - low:
                agree += 1
            elif not exact and taken is not None and final - high <= taken <= final - low:
                agree += 1
                within += 1
            else:
                mismatches.append({"sender": row["node"], "receiver": name, "receipt_taken": taken,
                                   "ledger_taken_in_span": final - low if exact else [final - high, final - low],
                                   "exact": exact})
    return {"pairs": pairs, "agree": agree, "exact": exact_pairs, "within_sampling": within,
            "mismatches": mismatches[:20]}
