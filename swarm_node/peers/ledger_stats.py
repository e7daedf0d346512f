"""The peer ledger's arithmetic: what it holds of one peer, and the numbers read from that.

Per peer (identity): groups offered (every group or index record of it this node judged), taken
(became training samples) and dropped by reason; peer samples trained on, those that carried
gradient (a nonzero advantage after the filters) and those the filter dropped; reward, KL (the
configured estimator, per sample) and importance-weight (per-sample mean of rho = pi_old / pi_gen
over its tokens) statistics: count, mean and the median and p90 of a bounded reservoir of
`RESERVOIR` values; its reputation (admission's `Reputation` good and fault counts); and when it
was first and last seen (wall-clock seconds). Across tokenizers: the peer's tokenizer fingerprint
(from its groups: the last one named), and how many of its samples came from another tokenizer
than this node's (re-tokenized, `swarm_node.method.crosstok`) and how many of those carried gradient.

Filtered samples are also counted by the filter condition they met (advantage, KL; a sample may
meet both). `row` flattens one peer's record (its JSON form) into counts, shares, statistic summaries and
reputation; `top_peers` keeps the first K rows and sums the rest into one `OTHER` row. A record's
JSON form is checked field by field when read back (`from_json`). The ledger that records into
these, and its file, are `ledger.py`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from swarm_node.policy.types import SampleStat
from swarm_node.swarm.admission import Reputation
from swarm_node.swarm.tokenizers import tokenizer_label

RESERVOIR = 64  # values kept per statistic and peer (its median and p90 are read from them)
MAX_FINGERPRINT_CHARS = 128  # a longer tokenizer fingerprint is cut (the wire bounds it already)
OTHER = "other"  # the label of every peer outside the top K (prometheus.py)


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
        count, total = as_count(d["count"]), as_number(d["sum"])
        res = [as_number(v) for v in as_list(d["reservoir"])]
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
    filtered_advantage: int = 0  # filtered samples with a non-positive advantage
    filtered_kl: int = 0  # filtered samples whose KL exceeded g (a sample may count in both)
    reward: Stat = field(default_factory=Stat)
    kl: Stat = field(default_factory=Stat)
    is_weight: Stat = field(default_factory=Stat)
    tokenizer: str = ""  # fingerprint named by its last group judged here ("" before any)
    crosstok: int = 0  # samples from another tokenizer than this node's
    crosstok_gradient: int = 0  # of those, samples that carried gradient

    def to_json(self) -> dict[str, Any]:
        return {"first_seen": self.first_seen, "last_seen": self.last_seen, "offered": self.offered,
                "taken": self.taken, "dropped": dict(sorted(self.dropped.items())), "samples": self.samples,
                "gradient": self.gradient, "filtered": self.filtered, "filtered_advantage": self.filtered_advantage,
                "filtered_kl": self.filtered_kl, "reward": self.reward.to_json(),
                "kl": self.kl.to_json(), "is_weight": self.is_weight.to_json(), "tokenizer": self.tokenizer,
                "crosstok": self.crosstok, "crosstok_gradient": self.crosstok_gradient}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PeerRecord:
        dropped = d["dropped"]
        if not isinstance(dropped, dict):
            raise ValueError("dropped is not an object")
        return cls(first_seen=as_number(d["first_seen"]), last_seen=as_number(d["last_seen"]),
                   offered=as_count(d["offered"]), taken=as_count(d["taken"]),
                   dropped={str(k): as_count(v) for k, v in dropped.items()},
                   samples=as_count(d["samples"]), gradient=as_count(d["gradient"]), filtered=as_count(d["filtered"]),
                   filtered_advantage=as_count(d.get("filtered_advantage", 0)),
                   filtered_kl=as_count(d.get("filtered_kl", 0)),
                   reward=Stat.from_json(d["reward"]), kl=Stat.from_json(d["kl"]),
                   is_weight=Stat.from_json(d["is_weight"]), tokenizer=as_fingerprint(d.get("tokenizer", "")),
                   crosstok=as_count(d.get("crosstok", 0)), crosstok_gradient=as_count(d.get("crosstok_gradient", 0)))


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
        "filtered_advantage": rec.get("filtered_advantage", 0), "filtered_kl": rec.get("filtered_kl", 0),
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
    for key in ("offered", "taken", "dropped", "samples", "gradient", "filtered", "filtered_advantage", "filtered_kl",
                "crosstok", "crosstok_gradient"):
        other[key] = sum(r[key] for r in rest)
    for name in ("reward", "kl", "is_weight"):
        count = sum(r[name]["count"] for r in rest)
        mean = sum(r[name]["mean"] * r[name]["count"] for r in rest) / count if count else 0.0
        other[name] = {"count": count, "mean": mean}
    other["reputation"] = {"good": sum(r["reputation"]["good"] for r in rest),
                           "faults": sum(r["reputation"]["faults"] for r in rest)}
    return [*top, other]


def as_number(v: Any) -> float:
    """`v` as a float; ValueError unless it is a finite number (a bool is not one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"expected a finite number, got {v!r}")
    return float(v)


def as_count(v: Any) -> int:
    """`v` as a count; ValueError unless it is a non-negative int."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a count, got {v!r}")
    return v


def as_fingerprint(v: Any) -> str:
    """`v` as a tokenizer fingerprint; ValueError unless a str of at most MAX_FINGERPRINT_CHARS."""
    if not isinstance(v, str) or len(v) > MAX_FINGERPRINT_CHARS:
        raise ValueError(f"expected a tokenizer fingerprint, got {str(v)[:40]!r}")
    return v


def as_list(v: Any) -> list:
    """`v` itself; ValueError unless it is a list."""
    if not isinstance(v, list):
        raise ValueError(f"expected a list, got {type(v).__name__}")
    return v
