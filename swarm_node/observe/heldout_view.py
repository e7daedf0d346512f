"""`swarm-node status --heldout`: a local node's held-out trend, as a table or JSON.

Reads `NODE_DIR/evals.jsonl` (evaluation/heldout.py) without joining the swarm: one line per evaluation
(before step 1, every `eval.every_steps` steps, after the last), each accuracy with its 95% Wilson
interval, and how it compares with the evaluation before training: "improved", "no measurable
change" or "worse" by the paired test of `evaluation.stats` (the same problems, compared one by one).
The live status table (`observe.render_table`) and the dashboard show the latest point of every
node; the dashboard draws the whole trend of the nodes it is given with --node-dir.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from swarm_node.util.errors import InputError
from swarm_node.evaluation.heldout import EVALS_FILE, read_evals, trend_points


def node_trend(node_dir: Path) -> list[dict[str, Any]]:
    """The trend points of the node in `node_dir`; no directory or no evaluation yet is one typed error."""
    if not Path(node_dir).is_dir():
        raise InputError(f"no node directory {node_dir}", "pass the --node-dir of a node on this machine")
    rows = read_evals(Path(node_dir))
    if not rows:
        raise InputError(f"no held-out evaluation in {node_dir} yet ({EVALS_FILE})",
                         "run the node with eval.problems > 0 (`--set eval.every_steps=10` sets 64 problems); "
                         "its first evaluation runs before step 1")
    return trend_points(rows)


def change_cell(change: Mapping[str, Any] | None) -> str:
    """'improved (+0.125, p=0.01)', 'no measurable change (-0.031, p=0.69)'; '-' for the first point."""
    if change is None:
        return "-"
    if change.get("p_value") is not None:
        return f"{change['verdict']} ({change['difference']:+.3f}, p={change['p_value']:.2g})"
    return f"{change['verdict']} ({change['difference']:+.3f})"


def render_trend(points: Sequence[Mapping[str, Any]], title: str) -> Table:
    """One line per evaluation: step, accuracy [95% interval], correct/n, a bar of the accuracy
    (the interval shaded around it), the change from the first evaluation, seconds."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))
    for col in ("step", "held-out [95%]", "correct", "0 ... 1", "vs first", "s"):
        table.add_column(col, justify="left" if col in ("0 ... 1", "vs first") else "right", no_wrap=True)
    for p in points:
        table.add_row(str(p["step"]), f"{p['accuracy']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]",
                      f"{p['correct']}/{p['n']}", interval_bar(p["accuracy"], p["lo"], p["hi"]),
                      change_cell(p["change"]), f"{p['seconds']:.0f}")
    return table


def interval_bar(value: float, lo: float, hi: float, width: int = 20) -> str:
    """A text bar over [0, 1]: '·' outside the interval, '─' inside it, '█' at the accuracy."""
    cells = []
    for i in range(width):
        x = (i + 0.5) / width
        cells.append("·" if x < lo or x > hi else "─")
    cells[min(width - 1, int(value * width))] = "█"
    return "".join(cells)


def run_heldout_status(node_dir: Path, *, as_json: bool, watch: bool = False, interval: float = 5.0) -> None:
    """Print the held-out trend of the node in `node_dir` (JSON: a list of points); `watch`:
    re-read the file every `interval` seconds until Ctrl-C."""
    from swarm_node.observe.observer import show_node_file

    title = f"held-out evaluations (greedy pass@1) of {node_dir}"
    show_node_file(lambda: node_trend(node_dir), lambda pts: render_trend(pts, f"{len(pts)} {title}"),
                   as_json=as_json, watch=watch, interval=interval)
