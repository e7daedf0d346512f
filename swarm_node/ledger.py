"""The peer ledger: what this node has seen of every peer, kept across restarts.

Per peer (identity): groups offered (every group or index record of it this node judged), taken
(became training samples) and dropped by reason; peer samples trained on, those that carried
gradient (a nonzero advantage after the filters) and those the filter dropped; reward, KL (the
configured estimator, per sample) and importance-weight (per-sample mean of rho = pi_old / pi_gen
over its tokens) statistics: count, mean and the median and p90 of a bounded reservoir of
`RESERVOIR` values; its reputation (admission's `Reputation` good and fault counts); and when it
was first and last seen (wall-clock seconds). Across tokenizers: the peer's tokenizer fingerprint
(from its groups: the last one named), and how many of its samples came from another tokenizer
than this node's (re-tokenized, `swarm_node.crosstok`) and how many of those carried gradient.
The ledger keeps this node's own fingerprint too, so its views tell a peer of the same tokenizer
from one of another.

The ledger owns the node's `Reputation`: admission reads it (`reputation`), so trust earned or lost
survives a restart. It lives in `node_dir/peer_ledger.json`, written atomically (`atomic.py`) at
every checkpoint and every `metrics.ledger_every_steps` steps, and holds at most `max_peers` peers,
least recently seen forgotten first (`metrics.ledger_max_peers`). A damaged file (not JSON, wrong
format, values of the wrong type) is renamed aside (`peer_ledger.json.damaged-<time>`) with a
one-line warning and the node starts with an empty ledger: it is a record, never a reason to stop.

Everything a peer sends is untrusted, but none of it reaches the ledger unchecked: it counts what
this node decided (reasons from its own checks) and what its own trainer measured.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from swarm_node.atomic import atomic_write_text
from swarm_node.swarm.admission import Reputation
from swarm_node.swarm.tokenizers import tokenizer_label

log = logging.getLogger(__name__)

FILE_NAME = "peer_ledger.json"
FORMAT = 1
RESERVOIR = 64  # values kept per statistic and peer (its median and p90 are read from them)
MAX_FINGERPRINT_CHARS = 128  # a longer tokenizer fingerprint is cut (the wire bounds it already)
DEFAULT_MAX_PEERS = 256
OTHER = "other"  # the label of every peer outside the top K (prometheus.py)


class SampleStat(NamedTuple):
    """What the trainer measured of one peer sample (`Trainer.peer_sample_stats`).

    kl and is_weight are None for a sample that was not scored (no tokens); crosstok: the sample
    came from another tokenizer (re-tokenized, trained per chunk)."""

    peer: str
    reward: float
    kl: float | None
    is_weight: float | None
    filtered: bool
    gradient: bool
    crosstok: bool = False


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` with linear interpolation (numpy's default); 0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Stat:
    """Count and sum of every value seen, and a uniform reservoir of at most RESERVOIR of them
    (Vitter's algorithm R): the mean is exact, the median and p90 are those of the reservoir."""

    count: int = 0
    total: float = 0.0
    reservoir: list[float] = field(default_factory=list)

    def add(self, value: float, rng: random.Random) -> None:
        if not math.isfinite(value):
            return
        self.count += 1
        self.total += value
        kept = float(f"{value:.6g}")  # 6 digits are plenty for a quantile, and halve the file
        if len(self.reservoir) < RESERVOIR:
            self.reservoir.append(kept)
        else:
            j = rng.randrange(self.count)
            if j < RESERVOIR:
                self.reservoir[j] = kept

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def summary(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "p50": quantile(self.reservoir, 0.5),
                "p90": quantile(self.reservoir, 0.9)}

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "sum": self.total, "reservoir": list(self.reservoir)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Stat:
        count, total, res = _int(d["count"]), _num(d["sum"]), [_num(v) for v in _list(d["reservoir"])]
        if len(res) > min(count, RESERVOIR):
            raise ValueError(f"a reservoir of {len(res)} values for a count of {count}")
        return cls(count, total, res)


@dataclass
class PeerRecord:
    """One peer's line of the ledger (see the module doc)."""

    first_seen: float
    last_seen: float
    offered: int = 0
    taken: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    gradient: int = 0
    filtered: int = 0
    reward: Stat = field(default_factory=Stat)
    kl: Stat = field(default_factory=Stat)
    is_weight: Stat = field(default_factory=Stat)
    tokenizer: str = ""  # fingerprint named by its last group judged here ("" before any)
    crosstok: int = 0  # samples from another tokenizer than this node's
    crosstok_gradient: int = 0  # of those, samples that carried gradient

    def to_json(self) -> dict[str, Any]:
        return {"first_seen": self.first_seen, "last_seen": self.last_seen, "offered": self.offered,
                "taken": self.taken, "dropped": dict(sorted(self.dropped.items())), "samples": self.samples,
                "gradient": self.gradient, "filtered": self.filtered, "reward": self.reward.to_json(),
                "kl": self.kl.to_json(), "is_weight": self.is_weight.to_json(), "tokenizer": self.tokenizer,
                "crosstok": self.crosstok, "crosstok_gradient": self.crosstok_gradient}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeerRecord:
        dropped = d["dropped"]
        if not isinstance(dropped, dict):
            raise ValueError("dropped is not an object")
        return cls(first_seen=_num(d["first_seen"]), last_seen=_num(d["last_seen"]), offered=_int(d["offered"]),
                   taken=_int(d["taken"]), dropped={str(k): _int(v) for k, v in dropped.items()},
                   samples=_int(d["samples"]), gradient=_int(d["gradient"]), filtered=_int(d["filtered"]),
                   reward=Stat.from_json(d["reward"]), kl=Stat.from_json(d["kl"]),
                   is_weight=Stat.from_json(d["is_weight"]), tokenizer=_fingerprint(d.get("tokenizer", "")),
                   crosstok=_int(d.get("crosstok", 0)), crosstok_gradient=_int(d.get("crosstok_gradient", 0)))


class PeerLedger:
    """The ledger of one node. Thread-safe: the gather thread records groups, the step thread
    records samples and saves. `path=None` keeps it in memory only."""

    def __init__(self, path: Path | None = None, max_peers: int = DEFAULT_MAX_PEERS, *,
                 reputation: Reputation | None = None, clock: Callable[[], float] = time.time,
                 seed: int = 0, own_tokenizer: str = "") -> None:
        if max_peers < 1:
            raise ValueError(f"max_peers must be >= 1, got {max_peers}")
        self.path = path
        self.own_tokenizer = own_tokenizer  # this node's fingerprint ("" when unknown)
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

    def record_late_drop(self, peer: str, reason: str) -> None:
        """A group already counted as taken whose samples were dropped later (a non-finite step)."""
        with self._lock:
            rec = self._touch(peer)
            rec.dropped[reason] = rec.dropped.get(reason, 0) + 1

    def record_samples(self, stats: Iterable[SampleStat]) -> None:
        """The trainer's measurements of one step's peer samples."""
        with self._lock:
            for s in stats:
                rec = self._touch(s.peer)
                rec.samples += 1
                rec.gradient += int(bool(s.gradient))
                rec.filtered += int(bool(s.filtered))
                rec.crosstok += int(bool(s.crosstok))
                rec.crosstok_gradient += int(bool(s.crosstok) and bool(s.gradient))
                rec.reward.add(float(s.reward), self._rng)
                if s.kl is not None:
                    rec.kl.add(float(s.kl), self._rng)
                if s.is_weight is not None:
                    rec.is_weight.add(float(s.is_weight), self._rng)

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
        """One flat row per peer, most samples taken first (see `row`)."""
        good, faults = dict(self.reputation.good), dict(self.reputation.faults)
        with self._lock:
            rows = [row(p, r.to_json(), good.get(p, 0.0), faults.get(p, 0.0), self.own_tokenizer)
                    for p, r in self._peers.items()]
        return sort_rows(rows)

    def to_json(self) -> dict[str, Any]:
        good, faults = dict(self.reputation.good), dict(self.reputation.faults)
        with self._lock:
            peers = [{"peer_id": p, **r.to_json(), "reputation": {"good": good.get(p, 0.0), "faults": faults.get(p, 0.0)}}
                     for p, r in self._peers.items()]
        return {"format": FORMAT, "saved_at": self.clock(), "max_peers": self.max_peers,
                "tokenizer": self.own_tokenizer, "peers": peers}

    # ---- persistence -------------------------------------------------------------------------

    def save(self) -> None:
        """Write the ledger atomically (a no-op without a path)."""
        if self.path is not None:
            atomic_write_text(self.path, json.dumps(self.to_json(), allow_nan=False, separators=(",", ":")))

    @classmethod
    def open(cls, path: Path, max_peers: int = DEFAULT_MAX_PEERS, *, clock: Callable[[], float] = time.time,
             reputation: Reputation | None = None, own_tokenizer: str = "") -> PeerLedger:
        """The ledger kept at `path` (empty if there is none, or if it is damaged: see `read_file`)."""
        ledger = cls(path, max_peers, clock=clock, reputation=reputation, own_tokenizer=own_tokenizer)
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
    for p in _list(data["peers"]):
        peer = p["peer_id"]
        if not isinstance(peer, str) or not peer or peer in seen:
            raise ValueError(f"bad or repeated peer id {peer!r}")
        seen.add(peer)
        rep = p["reputation"]
        out.append((peer, PeerRecord.from_json(p), max(0.0, _num(rep["good"])), max(0.0, _num(rep["faults"]))))
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
        own = _fingerprint(data.get("tokenizer", ""))
    except (KeyError, TypeError) as e:
        raise ValueError(f"missing or mistyped field {e}") from e
    return sort_rows([row(p, r.to_json(), good, faults, own) for p, r, good, faults in peers])


def row(peer: str, rec: Mapping[str, Any], good: float, faults: float, own_tokenizer: str = "") -> dict[str, Any]:
    """A flat, JSON-safe row of one peer: counts, shares, statistics, reputation, and its tokenizer
    (`tokenizer_same`: whether it is this node's; None while either is unknown)."""
    samples, tokenizer, crosstok = rec["samples"], rec["tokenizer"], rec["crosstok"]
    rep = Reputation(good={peer: good}, faults={peer: faults})
    stats = {name: Stat(rec[name]["count"], rec[name]["sum"], rec[name]["reservoir"]).summary()
             for name in ("reward", "kl", "is_weight")}
    return {
        "peer_id": peer, "first_seen": rec["first_seen"], "last_seen": rec["last_seen"],
        "offered": rec["offered"], "taken": rec["taken"], "dropped": sum(rec["dropped"].values()),
        "dropped_by_reason": dict(rec["dropped"]), "samples": samples, "gradient": rec["gradient"],
        "filtered": rec["filtered"], "filtered_share": rec["filtered"] / samples if samples else 0.0,
        "gradient_share": rec["gradient"] / samples if samples else 0.0,
        "reward": stats["reward"], "kl": stats["kl"], "is_weight": stats["is_weight"],
        "reputation": {"good": good, "faults": faults, "weight": rep.weight(peer), "excluded": rep.excluded(peer)},
        "tokenizer": tokenizer, "tokenizer_label": tokenizer_label(tokenizer),
        "tokenizer_same": tokenizer == own_tokenizer if tokenizer and own_tokenizer else None,
        "crosstok": crosstok, "crosstok_gradient": rec["crosstok_gradient"],
        "crosstok_gradient_share": rec["crosstok_gradient"] / crosstok if crosstok else 0.0,
    }


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (-r["samples"], -r["taken"], r["peer_id"]))


def top_peers(rows: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The first `k` rows (most samples taken) by peer id plus one `OTHER` row summing the counts
    of the rest (means weighted by count), so a label set built from it has at most k + 1 values."""
    rows = sort_rows(rows)
    top, rest = rows[:k], rows[k:]
    if not rest:
        return top
    other: dict[str, Any] = {"peer_id": OTHER, "peers": len(rest)}
    for key in ("offered", "taken", "dropped", "samples", "gradient", "filtered", "crosstok", "crosstok_gradient"):
        other[key] = sum(r[key] for r in rest)
    for name in ("reward", "kl", "is_weight"):
        count = sum(r[name]["count"] for r in rest)
        mean = sum(r[name]["mean"] * r[name]["count"] for r in rest) / count if count else 0.0
        other[name] = {"count": count, "mean": mean}
    other["reputation"] = {"good": sum(r["reputation"]["good"] for r in rest),
                           "faults": sum(r["reputation"]["faults"] for r in rest)}
    return [*top, other]


def _num(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"expected a finite number, got {v!r}")
    return float(v)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a count, got {v!r}")
    return v


def _fingerprint(v: Any) -> str:
    if not isinstance(v, str) or len(v) > MAX_FINGERPRINT_CHARS:
        raise ValueError(f"expected a tokenizer fingerprint, got {str(v)[:40]!r}")
    return v


def _list(v: Any) -> list:
    if not isinstance(v, list):
        raise ValueError(f"expected a list, got {type(v).__name__}")
    return v
