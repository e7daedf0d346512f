"""A persisted, bounded list of peer records this node refused for a reason that would recur.

Most bad peer data is refused by checks that give the same answer every time (`protocol.validate`),
so refetching it after a restart costs a decode and is refused again. Two refusals are different:
a group that made a training step non-finite (found only after scoring it) and a group whose
answer ran the verifier into its timeout (found only after spending the timeout). Both would cost
a step again after a restart while the record is still fresh in the DHT, so their record ids
(`rollouts.group_record_id`) are kept here, in `node_dir/rejected_records.json`, written
atomically on every addition and bounded to `capacity` entries (oldest forgotten first: records
expire from the DHT within minutes anyway).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from swarm_node.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

FILE_NAME = "rejected_records.json"
_FORMAT = 1


class RejectList:
    """Record id -> reason, insertion-ordered, at most `capacity` entries. Thread-safe.

    `path=None` keeps the list in memory only (tests, nodes without a directory)."""

    def __init__(self, path: Path | None, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.path = path
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, str] = OrderedDict()
        if path is not None and path.exists():
            self._items.update(_read(path))
            self._trim()

    def __contains__(self, record_id: object) -> bool:
        with self._lock:
            return record_id in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def reason(self, record_id: str) -> str | None:
        with self._lock:
            return self._items.get(record_id)

    def add_many(self, items: Iterable[tuple[str, str]]) -> int:
        """Add (record id, reason) pairs; persist when anything was new. Returns how many were new."""
        with self._lock:
            new = 0
            for record_id, reason in items:
                if record_id not in self._items:
                    new += 1
                self._items[record_id] = reason
                self._items.move_to_end(record_id)
            self._trim()
            if new and self.path is not None:
                payload = {"format": _FORMAT, "records": [[k, v] for k, v in self._items.items()]}
                atomic_write_text(self.path, json.dumps(payload))
            return new

    def add(self, record_id: str, reason: str) -> bool:
        return self.add_many([(record_id, reason)]) == 1

    def _trim(self) -> None:
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


def _read(path: Path) -> list[tuple[str, str]]:
    """Entries of a reject-list file; an unreadable file is reported and ignored (it is a cache of
    refusals: losing it costs at most one more refusal of each record, never a wrong acceptance
    of data that the other checks refuse)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
        return [(str(k), str(v)) for k, v in data["records"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("ignoring unreadable reject list %s (%s); starting empty", path, e)
        return []
