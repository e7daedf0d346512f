"""`swarm-node status --peers`: the peer ledger of a local node directory, as a table or JSON.

Reads `NODE_DIR/peer_ledger.json` (`ledger.py`) without joining the swarm and without changing
the file (a damaged one is reported, not moved: only its node sets it aside). The dashboard shows
the same rows (`dashboard.sources.LedgerSource`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from swarm_node.util.errors import InputError, RuntimeFailure
from swarm_node.util.inert import inert
from swarm_node.peers.ledger import FILE_NAME, load_rows


def ledger_rows(node_dir: Path) -> list[dict[str, Any]]:
    """The ledger rows of the node in `node_dir`; a missing or damaged ledger is one typed error."""
    path = Path(node_dir) / FILE_NAME
    if not Path(node_dir).is_dir():
        raise InputError(f"no node directory {node_dir}", "pass the --node-dir of a node on this machine")
    try:
        return load_rows(path)
    except FileNotFoundError:
        raise InputError(f"no peer ledger in {node_dir} ({FILE_NAME})",
                         "pass the --node-dir of a node that has exchanged with peers (the ledger is written "
                         "at checkpoints and every metrics.ledger_every_steps steps)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RuntimeFailure(f"the peer ledger {path} is damaged ({e})",
                             "its node sets it aside and starts a new one at its next start") from e


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _pair(stat: dict[str, Any], spec: str) -> str:
    return f"{stat['mean']:{spec}} / {stat['p90']:{spec}}" if stat["count"] else "-"


def tokenizer_cell(r: dict[str, Any]) -> str:
    """A peer's tokenizer label and whether it is this node's: 'label same', 'label other' ('-': unknown)."""
    if not r.get("tokenizer"):
        return "-"
    same = r.get("tokenizer_same")
    return r["tokenizer_label"] if same is None else f"{r['tokenizer_label']} {'same' if same else 'other'}"


def given_cell(r: dict[str, Any]) -> str:
    """What the peer's receipt says it did with this node's groups: 'groups taken (samples with
    gradient)', '-' without a receipt (`status --given` shows them in full)."""
    g = r.get("given")
    return f"{g['taken']} ({g['gradient']})" if g else "-"


def crosstok_cell(r: dict[str, Any]) -> str:
    """Samples from another tokenizer and the share of them that carried gradient ('0' when none)."""
    return f"{r['crosstok']} ({r['crosstok_gradient_share']:.2f})" if r.get("crosstok") else "0"


def render_peer_table(rows: Sequence[dict[str, Any]], now: float, title: str = "") -> Table:
    """One line per peer: groups taken / offered, drops (top reason), its tokenizer (same as this
    node's or other), samples trained on, the shares that carried gradient and were filtered, what
    its receipt says it took of this node's groups (groups, and samples with gradient there),
    samples from another tokenizer (and their share with gradient), KL and IS weight (mean / p90),
    mean reward, reputation weight (or `excluded`), and when it was last seen."""
    table = Table(title=Text(inert(title or f"peer ledger: {len(rows)} peers")), title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("peer", "taken/offered", "dropped (top)", "tokenizer", "samples", "grad", "filt", "ours there (grad)",
                "xtok (grad)", "kl mean/p90", "w mean/p90", "reward", "rep", "seen"):
        table.add_column(col, justify="left" if col in ("peer", "dropped (top)", "tokenizer") else "right", no_wrap=True)
    for r in rows:
        reasons = r["dropped_by_reason"]
        top = max(reasons, key=lambda k: (reasons[k], k)) if reasons else None
        samples, rep = r["samples"], r["reputation"]
        cells = [
            r["peer_id"][:14] + ("…" if len(r["peer_id"]) > 14 else ""), f"{r['taken']}/{r['offered']}",
            f"{r['dropped']} ({top})" if top else str(r["dropped"]), tokenizer_cell(r), str(samples),
            _fmt(r["gradient_share"] if samples else None, ".2f"), _fmt(r["filtered_share"] if samples else None, ".2f"),
            given_cell(r), crosstok_cell(r),
            _pair(r["kl"], ".3g"), _pair(r["is_weight"], ".3f"),
            _fmt(r["reward"]["mean"] if r["reward"]["count"] else None, ".3f"),
            "excluded" if rep["excluded"] else f"{rep['weight']:.2f}", f"{max(0.0, now - r['last_seen']):.0f}s ago"]
        # Peers named their tokenizers (and receivers their drop reasons): inert, never read as markup.
        table.add_row(*(Text(inert(c)) for c in cells), style="red" if rep["excluded"] else None)
    return table


def run_peers_status(node_dir: Path, *, as_json: bool, watch: bool = False, interval: float = 5.0) -> None:
    """Print the ledger of the node in `node_dir` (JSON: a list of rows, most samples first);
    `watch`: re-read the file every `interval` seconds and redraw the table until Ctrl-C."""
    from swarm_node.observe.observer import show_node_file

    show_node_file(lambda: ledger_rows(node_dir),
                   lambda rows: render_peer_table(rows, time.time(), f"peer ledger of {node_dir}: {len(rows)} peers"),
                   as_json=as_json, watch=watch, interval=interval)
