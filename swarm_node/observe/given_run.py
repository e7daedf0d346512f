"""What each node of a run directory gave the others, for `report` and `local`'s summary.

Two sources, the better first:

* `ledgers`: the receivers' own peer ledgers, when the run directory holds them (`swarm-node local`
  runs every node under one directory): each other node's ledger row for this node's peer id
  counts exactly what it took of this node's groups, trained on and found gradient in, since its
  ledger began. This is what those nodes' receipts state, without waiting for a read of them.
* `receipts`: otherwise the node's last `given_*` metrics (`given.py`), its latest read of the
  receipts that name it in peers' status records, over their span.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swarm_node import metric_names as m
from swarm_node.peers.ledger import FILE_NAME, load_rows, own_peer_id


def _ledger(node_dir: Path) -> tuple[str, list[dict[str, Any]]] | None:
    path = Path(node_dir) / FILE_NAME
    try:
        peer = own_peer_id(path)
        return (peer, load_rows(path)) if peer else None
    except (OSError, ValueError):  # no ledger (a node that took nothing), or one its node is writing
        return None


def gave_from_ledgers(node_dirs: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
    """Per node name, what the other nodes' ledgers say they took of its groups: `receivers` (nodes
    that took at least one group), `taken`, `samples`, `gradient`; nodes without a readable ledger
    naming their peer id are left out."""
    ledgers = {name: found for name, d in node_dirs.items() if (found := _ledger(d)) is not None}
    out = {}
    for name, (peer, _) in ledgers.items():
        rows = [r for other, (_, rs) in ledgers.items() if other != name for r in rs if r["peer_id"] == peer]
        out[name] = {"source": "ledgers", "receivers": sum(1 for r in rows if r["taken"] > 0),
                     "taken": sum(r["taken"] for r in rows), "samples": sum(r["samples"] for r in rows),
                     "gradient": sum(r["gradient"] for r in rows)}
    return out


def gave_from_metrics(records: Sequence[Mapping[str, float]]) -> dict[str, Any] | None:
    """The node's last read of the receipts naming it (its latest `given_*` metrics), None without one."""
    last = next((r for r in reversed(records) if m.GIVEN_RECEIVERS in r), None)
    if last is None:
        return None
    return {"source": "receipts", "receivers": int(last[m.GIVEN_TAKERS]), "taken": int(last[m.GIVEN_GROUPS_TAKEN]),
            "samples": int(last[m.GIVEN_SAMPLES]), "gradient": int(last[m.GIVEN_SAMPLES_GRADIENT])}


def gave_by_node(node_dirs: Mapping[str, Path], runs: Mapping[str, Sequence[Mapping[str, float]]]
                 ) -> dict[str, dict[str, Any] | None]:
    """Per node name: from the receivers' ledgers when the run holds them, else from its receipts."""
    ledgers = gave_from_ledgers(node_dirs) if len(node_dirs) > 1 else {}
    return {name: ledgers.get(name) or gave_from_metrics(records) for name, records in runs.items()}


def gave_text(gave: Mapping[str, Any] | None) -> str:
    """'N samples with gradient (of S) at K peers': what a node's groups gave ('' when unknown)."""
    if not gave:
        return ""
    return (f"{gave['gradient']} samples with gradient (of {gave['samples']} trained on) at "
            f"{gave['receivers']} peer{'s' if gave['receivers'] != 1 else ''} ({gave['source']})")
