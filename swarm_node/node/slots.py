"""A node's window slot, kept across restarts (swarm/binding.py, rule 2).

A node's k-th step started in DHT time window w answers slot k of w: the prompts
`window_prompts(peer, w, k, n)`, each of which receivers take once per (peer, w). A node killed and
restarted within the window of its last published step would begin again at slot 0 and answer
prompts it already published groups for; receivers refuse those as `window_slot_overused`, a fault
of the sender, and a few of them exclude an honest node for a while (the soak's kill showed it).

So the slot of a step that publishes is written to `node_dir/slot.json` (atomically, before its
groups go out), and a restarted node continues after it: in the same window at the next slot, in a
later window at slot 0. A missing or unreadable file is a fresh start (slot 0 of the current window:
a new node directory has published nothing).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from swarm_node.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

FILE = "slot.json"


class SlotMemory:
    """The window and slot of this node's last step, read once at start, saved for each published step."""

    def __init__(self, node_dir: Path | None) -> None:
        self.path = None if node_dir is None else Path(node_dir) / FILE
        self.window, self.slot = self._load()

    def _load(self) -> tuple[int, int]:
        if self.path is None or not self.path.exists():
            return -1, -1
        try:
            data = json.loads(self.path.read_text())
            window, slot = int(data["window"]), int(data["slot"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring %s (%s): this node starts at slot 0 of the current window", self.path, e)
            return -1, -1
        return window, slot

    def next(self, window: int) -> int:
        """The slot of a step started in `window`: the one after the last step's there, else 0."""
        self.slot = self.slot + 1 if window == self.window else 0
        self.window = window
        return self.slot

    def save(self) -> None:
        """Persist the current (window, slot); called before a step's groups are published."""
        if self.path is not None:
            atomic_write_text(self.path, json.dumps({"window": self.window, "slot": self.slot}))
