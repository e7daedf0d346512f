"""Reading the JSONL logs a node appends to (`metrics.jsonl`, `evals.jsonl`) while it may still write them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm_node.metric_names import STEP


def read_rows(node_dir: Path, file: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The rows of a node's JSONL log `file` while the node may still write it (a torn or
    unreadable line is skipped; no file: none yet)."""
    path = Path(node_dir) / file
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line while the node writes
        if isinstance(row, dict):
            rows.append(row)
    return rows


def latest_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last run of each step: a node resumed from an older checkpoint logs steps it had logged
    before; a step number that does not increase starts a new run, whose rows supersede every
    earlier row of that step or later. Rows without a step are kept in order."""
    kept: list[dict[str, Any]] = []
    for row in records:
        step = row.get(STEP)
        if step is not None:
            kept = [r for r in kept if r.get(STEP) is None or float(r[STEP]) < float(step)]
        kept.append(row)
    return kept
