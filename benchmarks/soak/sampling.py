"""What the soak samples while it runs: each process tree's memory and p2p daemon I/O (from /proc),
and each node's peer ledger (who took whose groups)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def jsonl(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _io(pid: int) -> int:
    try:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, ValueError, KeyError):
        return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def sample_processes(path: Path, pids: Mapping[str, int], frozen: set[str]) -> None:
    """One row per process tree: RSS of the tree and of its main process, the p2p daemons' read+write
    bytes (their socket traffic, each network byte counted about twice: socket and unix socket)."""
    now = time.time()
    for name, pid in pids.items():
        tree = _tree(pid)
        daemons = [q for q in tree if _comm(q) == "p2pd"]
        jsonl(path, {"time": now, "name": name, "pid": pid, "loadavg_1min": os.getloadavg()[0],
                     "rss_kib": sum(_rss_kib(q) for q in tree),
                     "rss_main_kib": _rss_kib(pid), "daemon_io": sum(_io(q) for q in daemons),
                     "daemons": len(daemons), "frozen": name in frozen})


def ledger_rows(node_dir: Path) -> list[dict[str, Any]] | None:
    """The peer rows of a node's ledger file (None when it is missing or being replaced)."""
    try:
        data = json.loads((node_dir / "peer_ledger.json").read_text())
    except (OSError, ValueError):
        return None
    return [r for r in data.get("peers", []) if isinstance(r, dict) and "peer_id" in r]


def sample_ledgers(path: Path, node_dirs: Mapping[str, Path]) -> None:
    """One row per node whose peer ledger exists: groups taken per sender, and faults per sender."""
    now = time.time()
    for name, node_dir in node_dirs.items():
        rows = ledger_rows(node_dir)
        if rows is None:
            continue
        jsonl(path, {"time": now, "node": name, "taken": {r["peer_id"]: r.get("taken", 0) for r in rows},
                     "faults": {r["peer_id"]: r["reputation"]["faults"] for r in rows
                                if r.get("reputation", {}).get("faults", 0) > 0}})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return rows


def metrics_rows(node_dir: Path) -> list[dict[str, Any]]:
    """A node's metrics rows (rows of steps re-run after a restart are moved aside by the node)."""
    return read_jsonl(node_dir / "metrics.jsonl")
