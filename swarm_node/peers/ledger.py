"""The peer ledger: what this node has seen of every peer, kept across restarts.

What it holds per peer (counts, drops by reason, reward / KL / importance-weight statistics,
reputation, tokenizer, first and last seen) and the arithmetic read from it (rows, shares, the top
K) are `ledger_stats.py`; here are the thread-safe ledger that records into it and its file. The
ledger keeps this node's own fingerprint too, so its views tell a peer of the same tokenizer from
one of another.

The ledger owns the node's `Reputation`: admission reads it (`reputation`), so trust earned or lost
survives a restart. It also keeps the same counts per sender over a recent span (`receipts.py`,
`ledger.recent`: the receipts of the node's status record), and what peers' receipts say of this
node (`note_receipts`, `given.py`): its rows show, beside what this node took from each peer, what
that peer says it took from this node (`given`), and the file holds both. The status records of the
peers this node took groups from are kept (`statuses.StatusKeeper`) until they could have lapsed
(`KEEP_STATUS_S` after they were written): a read that misses one (a lost replica, a timeout, a
flood) does not make their receipts vanish; records of identities it never took from are only what
the read returns. It lives in
`node_dir/peer_ledger.json`, written atomically (`atomic.py`) at
every checkpoint and every `metrics.ledger_every_steps` steps, and holds at most `max_peers` peers,
least recently seen forgotten first (`metrics.ledger_max_peers`). A damaged file (not JSON, wrong
format, values of the wrong type) is renamed aside (`peer_ledger.json.damaged-<time>`) with a
one-line warning and the node starts with an empty ledger: it is a record, never a reason to stop.

Everything a peer sends is untrusted, but none of it reaches the ledger's counts unchecked: they
count what this node decided (reasons from its own checks) and what its own trainer measured. Peers'
receipts (checked by `protocol.validate`) are kept apart, as their statements, and never change
those counts or any peer's reputation.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from protocol.messages import Receipt
from swarm_node.util.atomic import atomic_write_text
from swarm_node.peers.given import COUNTS as GIVEN_COUNTS
from swarm_node.peers.given import given_metrics, given_rows, given_totals
from swarm_node.peers.ledger_stats import (  # noqa: F401  (OTHER, RESERVOIR, Stat, quantile, top_peers: re-exported)
    MAX_FINGERPRINT_CHARS,
    OTHER,
    RESERVOIR,
    PeerRecord,
    Stat,
    as_count,
    as_fingerprint,
    as_list,
    as_number,
    quantile,
    row,
    sort_rows,
    top_peers,
)
from swarm_node.policy.types import SampleStat
from swarm_node.peers.receipts import DEFAULT_SPAN_S, ReceiptBook
from swarm_node.swarm.admission import Reputation
from swarm_node.swarm.statuses import StatusKeeper

log = logging.getLogger(__name__)

FILE_NAME = "peer_ledger.json"
FORMAT = 1
DEFAULT_MAX_PEERS = 256
KEEP_STATUS_S = 3600.0  # a kept status record lapses this long after it was written (= swarm.max_record_ttl_s's default)


class PeerLedger:
    """The ledger of one node. Thread-safe: the gather thread records groups, the step thread
    records samples and saves. `path=None` keeps it in memory only."""

    def __init__(self, path: Path | None = None, max_peers: int = DEFAULT_MAX_PEERS, *,
                 reputation: Reputation | None = None, clock: Callable[[], float] = time.time,
                 seed: int = 0, own_tokenizer: str = "", own_peer: str = "",
                 receipts_span_s: float = DEFAULT_SPAN_S) -> None:
        if max_peers < 1:
            raise ValueError(f"max_peers must be >= 1, got {max_peers}")
        self.path = path
        self.own_tokenizer = own_tokenizer  # this node's fingerprint ("" when unknown)
        self.own_peer = own_peer  # this node's peer id: the sender named by receipts about it
        self.recent = ReceiptBook(receipts_span_s, clock)  # counts over the receipts span
        self._given: list[dict[str, Any]] = []  # peers' receipts naming this node (given.given_rows)
        self._statuses = StatusKeeper(self._took_from)  # records of the peers this node took groups from
        self._given_at: float | None = None
        self.max_peers = max_peers
        self.reputation = reputation or Reputation()
        self.clock = clock
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._peers: OrderedDict[str, PeerRecord] = OrderedDict()  # least recently seen first

    # ---- recording ---------------------------------------------------------------------------

    def record_group(self, peer: str, reason: str | None, tokenizer: str = "") -> None:
        """A group (or index record) of `peer` judged by this node: taken (None) or dropped;
        `tokenizer`: the fingerprint the group names (none for an index record)."""
        with self._lock:
            rec = self._touch(peer)
            rec.offered += 1
            if tokenizer:
                rec.tokenizer = tokenizer[:MAX_FINGERPRINT_CHARS]
            if reason is None:
                rec.taken += 1
            else:
                rec.dropped[reason] = rec.dropped.get(reason, 0) + 1
            self.recent.group(peer, reason)

    def record_late_drop(self, peer: str, reason: str) -> None:
        """A group already counted as taken whose samples were dropped later (a non-finite step)."""
        with self._lock:
            rec = self._touch(peer)
            rec.dropped[reason] = rec.dropped.get(reason, 0) + 1
            self.recent.late_drop(peer, reason)

    def record_samples(self, stats: Iterable[SampleStat]) -> None:
        """The trainer's measurements of one step's peer samples."""
        with self._lock:
            for s in stats:
                rec = self._touch(s.peer)
                rec.samples += 1
                rec.gradient += int(bool(s.gradient))
                rec.filtered += int(bool(s.filtered))
                rec.filtered_advantage += int(bool(s.filtered and s.filtered_advantage))
                rec.filtered_kl += int(bool(s.filtered and s.filtered_kl))
                rec.crosstok += int(bool(s.crosstok))
                rec.crosstok_gradient += int(bool(s.crosstok) and bool(s.gradient))
                rec.reward.add(float(s.reward), self._rng)
                if s.kl is not None:
                    rec.kl.add(float(s.kl), self._rng)
                if s.is_weight is not None:
                    rec.is_weight.add(float(s.is_weight), self._rng)
                self.recent.sample(s)

    def receipts(self, max_senders: int) -> tuple[float, tuple[Receipt, ...]]:
        """(span in seconds, receipts) for this node's status record (`receipts.ReceiptBook.receipts`)."""
        with self._lock:
            return self.recent.receipts(max_senders)

    def note_receipts(self, statuses: Iterable[Any]) -> None:
        """Keep what the receipts in peers' status records (already checked) say of this node, with
        the kept records of the peers it took groups from that this read missed."""
        with self._lock:
            read = {s.peer_id: (s, s.timestamp + KEEP_STATUS_S) for s in statuses}
            statuses = self._statuses.merge(read, self.clock())
        rows = given_rows(statuses, self.own_peer) if self.own_peer else []
        with self._lock:
            self._given, self._given_at = rows, self.clock()

    def _took_from(self) -> set[str]:
        """Peers this node took at least one group from (called under the lock)."""
        return {peer for peer, rec in self._peers.items() if rec.taken > 0}

    def given_metrics(self) -> dict[str, float]:
        """This node's `given_*` metrics from the receipts last noted ({} before the first read)."""
        with self._lock:
            if self._given_at is None:
                return {}
            return given_metrics(given_totals(self._given), max(0.0, self.clock() - self._given_at))

    def _touch(self, peer: str) -> PeerRecord:
        now = self.clock()
        rec = self._peers.get(peer)
        if rec is None:
            rec = self._peers[peer] = PeerRecord(first_seen=now, last_seen=now)
            while len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            rec.last_seen = now
            self._peers.move_to_end(peer)
        return rec

    # ---- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._peers)

    def __contains__(self, peer: object) -> bool:
        with self._lock:
            return peer in self._peers

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per peer, most samples taken first (see `row`), with what the peer's receipt
        says of this node (`given`: None without one; a receiver this ledger has not seen gets a row)."""
        good, faults = dict(self.reputation.good), dict(self.reputation.faults)
        with self._lock:
            rows = [row(p, r.to_json(), good.get(p, 0.0), faults.get(p, 0.0), self.own_tokenizer)
                    for p, r in self._peers.items()]
            given = list(self._given)
        return join_given(sort_rows(rows), given, self.own_tokenizer)

    def to_json(self) -> dict[str, Any]:
        good, faults = dict(self.reputation.good), dict(self.reputation.faults)
        with self._lock:
            peers = [{"peer_id": p, **r.to_json(), "reputation": {"good": good.get(p, 0.0), "faults": faults.get(p, 0.0)}}
                     for p, r in self._peers.items()]
            given, given_at = list(self._given), self._given_at
        return {"format": FORMAT, "saved_at": self.clock(), "max_peers": self.max_peers,
                "tokenizer": self.own_tokenizer, "peer_id": self.own_peer, "peers": peers,
                "given": given, "given_at": given_at}

    # ---- persistence -------------------------------------------------------------------------

    def save(self) -> None:
        """Write the ledger atomically (a no-op without a path)."""
        if self.path is not None:
            atomic_write_text(self.path, json.dumps(self.to_json(), allow_nan=False, separators=(",", ":")))

    @classmethod
    def open(cls, path: Path, max_peers: int = DEFAULT_MAX_PEERS, *, clock: Callable[[], float] = time.time,
             reputation: Reputation | None = None, own_tokenizer: str = "", own_peer: str = "",
             receipts_span_s: float = DEFAULT_SPAN_S) -> PeerLedger:
        """The ledger kept at `path` (empty if there is none, or if it is damaged: see `read_file`).
        The receipts' span starts anew (their counts are not kept in the file)."""
        ledger = cls(path, max_peers, clock=clock, reputation=reputation, own_tokenizer=own_tokenizer,
                     own_peer=own_peer, receipts_span_s=receipts_span_s)
        data = read_file(path)
        if data is not None:
            for peer, rec, good, faults in data[-max_peers:]:
                ledger._peers[peer] = rec
                if good > 0:
                    ledger.reputation.good[peer] = good
                if faults > 0:
                    ledger.reputation.faults[peer] = faults
        return ledger


def parse(data: Any) -> list[tuple[str, PeerRecord, float, float]]:
    """(peer, record, good, faults) per peer of a ledger document, oldest first. Raises ValueError,
    KeyError or TypeError on anything but a well-formed ledger of this format."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
    out, seen = [], set()
    for p in as_list(data["peers"]):
        peer = p["peer_id"]
        if not isinstance(peer, str) or not peer or peer in seen:
            raise ValueError(f"bad or repeated peer id {peer!r}")
        seen.add(peer)
        rep = p["reputation"]
        good, faults = max(0.0, as_number(rep["good"])), max(0.0, as_number(rep["faults"]))
        out.append((peer, PeerRecord.from_json(p), good, faults))
    return out


def read_file(path: Path) -> list[tuple[str, PeerRecord, float, float]] | None:
    """The ledger at `path` (None if there is none). A damaged file is renamed aside with a
    one-line warning, and None returned: the node starts with an empty ledger."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        return _set_aside(path, f"unreadable: {e}")
    try:
        return parse(json.loads(text))
    except (ValueError, KeyError, TypeError) as e:
        what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        return _set_aside(path, what.splitlines()[0][:200] if what else type(e).__name__)


def _set_aside(path: Path, why: str) -> None:
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        path.replace(aside)
        where = f"moved to {aside.name}"
    except OSError as e:
        where = f"could not be moved aside ({e.strerror or e}); it will be overwritten"
    log.warning("peer ledger %s is damaged (%s): %s; starting with an empty ledger", path, why, where)
    return None


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows (`row`) of the ledger file at `path`, for readers outside the node (status, dashboard).
    Raises FileNotFoundError when there is none and ValueError when it is damaged (a reader never
    moves a node's file)."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        peers = parse(data)
        own = as_fingerprint(data.get("tokenizer", ""))
        given = [_given_row(g) for g in as_list(data.get("given", []))]
    except (KeyError, TypeError) as e:
        raise ValueError(f"missing or mistyped field {e}") from e
    return join_given(sort_rows([row(p, r.to_json(), good, faults, own) for p, r, good, faults in peers]), given, own)


def own_peer_id(path: Path) -> str:
    """The peer id of the node whose ledger file is at `path` ("" when the file does not name it)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    peer = data.get("peer_id", "") if isinstance(data, dict) else ""
    return peer if isinstance(peer, str) else ""


def join_given(rows: list[dict[str, Any]], given: list[dict[str, Any]], own_tokenizer: str) -> list[dict[str, Any]]:
    """`rows` with each peer's `given` (what its receipt says of this node, None without one); a
    receiver without a row of its own gets an empty one, after the others."""
    by_receiver = {g["receiver"]: g for g in given}
    out = [{**r, "given": by_receiver.pop(r["peer_id"], None)} for r in rows]
    for receiver, g in sorted(by_receiver.items()):
        empty = PeerRecord(first_seen=g["timestamp"], last_seen=g["timestamp"]).to_json()
        out.append({**row(receiver, empty, 0.0, 0.0, own_tokenizer), "given": g})
    return out


def _given_row(g: Any) -> dict[str, Any]:
    """One `given` row of a ledger file, checked (TypeError, KeyError or ValueError otherwise)."""
    if not (isinstance(g, dict) and isinstance(g.get("receiver"), str) and isinstance(g.get("dropped_by_reason"), dict)):
        raise TypeError("a given row is not an object with a receiver and its drops")
    for k in (*GIVEN_COUNTS, "dropped"):
        as_count(g[k])
    as_number(g["timestamp"])
    as_number(g["span_s"])
    return g
