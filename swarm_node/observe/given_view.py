"""`swarm-node status --given NODE_DIR|PEER_ID`: what a node's groups gave the swarm, from the
receipts in peers' status records (`given.py`), as a table or JSON.

Reads the swarm's status records once (the light reader, as `status` does), keeps each
receiver's receipt naming the peer and adds them up. The output says plainly what a receipt
proves (the receiver's signed statement) and what it does not (a receiver can misstate its own
use, and identities are free, so totals and agreement are claims), and lists each receiver, so one
receiver stating large numbers is visible. Given a node directory, it also reads that node's own
ledger: each receiver's `took here` (groups this node took from it) and the totals of the
receivers it took groups from (`seen`), the ones whose work it has itself checked. Every string a
peer wrote is shown inert (`util.inert`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rich.text import Text

from swarm_node.util.errors import InputError
from swarm_node.util.inert import inert
from swarm_node.peers.given import given_rows, given_totals, seen_totals

STATEMENT = ("Each row is that receiver's own statement, signed with its key: the DHT refuses a status record "
             "written under another peer's key, and readers refuse counts a node could not have reached in its "
             "span. It does not prove the receiver told the truth about itself (it can state more or less than "
             "it used), and identities are free: one party can run any number of receivers that state any "
             "totals and agree with each other, so these totals are claims. Only receivers whose groups this "
             "node has itself taken (took here > 0) have done work it checked; weigh the others as unknown.")
_PEER_ID = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,128}")  # base58 libp2p peer ids


def took_from_ledger(node_dir: Path) -> dict[str, int] | None:
    """Groups the node in `node_dir` took from each peer (its own ledger), None without a readable one."""
    from swarm_node.peers.ledger import FILE_NAME, load_rows

    try:
        return {r["peer_id"]: int(r["taken"]) for r in load_rows(Path(node_dir) / FILE_NAME)}
    except (OSError, ValueError):  # no ledger yet, or one its node is writing: nothing seen here
        return None


def resolve_peer(target: str) -> tuple[str, str]:
    """(peer id, what it came from) for a node directory (its identity key: never created here) or
    a peer id; anything else is one InputError."""
    path = Path(target)
    if path.is_dir():
        from swarm_node.swarm.identity import IDENTITY_FILENAME, load_or_create_key

        key = path / IDENTITY_FILENAME
        if not key.is_file():
            raise InputError(f"no {IDENTITY_FILENAME} in {path}: not the directory of a node that has started",
                             "pass the node directory of a node that has joined the swarm, or its peer id")
        return load_or_create_key(key).peer_id, f"node dir {path}"
    if _PEER_ID.fullmatch(target):
        return target, "peer id"
    raise InputError(f"--given {target!r} is neither a node directory nor a peer id",
                     "pass a node directory on this machine (its identity.key) or a peer id (12D3Koo... / Qm...)")


def given_report(statuses: Sequence[Any], peer_id: str, source: str = "",
                 took_from: dict[str, int] | None = None) -> dict[str, Any]:
    """The JSON document of `status --given`: the peer, each receiver's receipt, their totals and
    what a receipt proves. `records_read`: the valid status records the read found. With
    `took_from` (the peer's own ledger: groups it took per peer), each row's `took_here` and the
    totals of the receivers it took groups from (`seen`); without, both are None."""
    rows = given_rows(statuses, peer_id)
    for r in rows:
        r["took_here"] = None if took_from is None else took_from.get(r["receiver"], 0)
    return {"peer_id": peer_id, "source": source, "records_read": len(statuses), "receivers": rows,
            "totals": given_totals(rows), "seen": None if took_from is None else seen_totals(rows, took_from),
            "statement": STATEMENT}


def _short(peer: str) -> str:
    return peer[:14] + ("…" if len(peer) > 14 else "")


def _top_reason(reasons: dict[str, int]) -> str:
    return max(reasons, key=lambda k: (reasons[k], k)) if reasons else ""


def render_given(report: dict[str, Any]) -> Table:
    """One line per receiver (most gradient first), a total line; the caption says what it proves."""
    t = report["totals"]
    span = (f"{t['span_s_min']:.0f} s" if t["span_s_min"] == t["span_s_max"]
            else f"{t['span_s_min']:.0f}-{t['span_s_max']:.0f} s")
    title = (f"what {_short(report['peer_id'])} gave ({report['source'] or 'peer id'}): {t['receivers']} receivers "
             f"say they hold a receipt for its groups, {t['takers']} say they took some, over the last {span} "
             "(each receiver's span)")
    table = Table(title=Text(inert(title)), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))
    seen = report.get("seen")
    cols = ["receiver", "model", "span", *(["took here"] if seen is not None else []), "taken", "samples", "gradient",
            "filtered (adv/kl)", "dropped (top)"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("receiver", "model", "dropped (top)") else "right", no_wrap=True)

    def cells(name: str, model: str, span_s: str, took: str, r: dict[str, Any]) -> list[Text]:
        top = _top_reason(r["dropped_by_reason"])
        out = [name, model, span_s, *([took] if seen is not None else []), str(r["taken"]), str(r["samples"]),
               str(r["gradient"]), f"{r['filtered']} ({r['filtered_advantage']}/{r['filtered_kl']})",
               f"{r['dropped']} ({top})" if top else str(r["dropped"])]
        return [Text(inert(c)) for c in out]  # peers wrote the names: inert, and never read as markup

    for r in report["receivers"]:
        table.add_row(*cells(_short(r["receiver"]), inert(r["model_id"]).rsplit("/", 1)[-1][:20],
                             f"{r['span_s']:.0f}s", str(r.get("took_here")), r))
    if report["receivers"]:
        table.add_row(*cells("total", "", "", "", t), style="bold")
        if seen is not None:
            table.add_row(*cells("seen here", "", "", "", seen), style="bold")
    lines = []
    if t["top_receiver"]:
        lines.append(f"{_short(t['top_receiver'])} states {t['top_share']:.0%} of the samples with gradient.")
    if seen is not None and report["receivers"]:
        lines.append(f"This node took groups from {seen['receivers']} of these {t['receivers']} receivers (seen here): "
                     f"they state {seen['gradient']} of the {t['gradient']} samples with gradient.")
    if not report["receivers"]:
        lines.append(f"No receipt names this peer in the {report['records_read']} status records read "
                     "(no peer judged its groups within its span, or it is outside their receipts' bound).")
    table.caption = Text("\n".join(inert(line) for line in [*lines, report["statement"]]))
    table.caption_justify = "left"
    return table


def run_given_status(initial_peers: Sequence[str], swarm_id: str, target: str, *, as_json: bool,
                     timeout: float) -> None:
    """Read the swarm's status records once (light reader) and print what `target` gave."""
    from swarm_node.observe.observer import connect_light_observer

    peer_id, source = resolve_peer(target)
    took_from = took_from_ledger(Path(target)) if Path(target).is_dir() else None
    transport, exchange = connect_light_observer(initial_peers, swarm_id, timeout)
    try:
        report = given_report(exchange.read_statuses(timeout=timeout), peer_id, source, took_from)
    finally:
        transport.shutdown()
    if as_json:
        print(json.dumps(report, indent=1, allow_nan=False))
        return
    Console(width=None if sys.stdout.isatty() else 160).print(render_given(report))
