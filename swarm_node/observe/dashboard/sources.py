"""Where the dashboard's status records come from.

The dashboard reads any `StatusSource`: an object whose `read()` returns the swarm's current
status records. In production that is the swarm exchange (NodeStatus records from the DHT); in
tests it is `FakeStatusSource` (fixed records) or `SyntheticStatusSource` (a fake swarm that
advances one step per read, with plausible curves).

The peer table comes from a `LedgerSource`: the peer ledgers (`swarm_node.peers.ledger`) of node
directories on the dashboard's machine, read from their files at each request; the held-out chart
also draws the whole trend of those nodes from a `HeldoutSource` (their `evals.jsonl`).
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from swarm_node import metric_names as m
from swarm_node.peers.ledger import FILE_NAME as LEDGER_FILE
from swarm_node.peers.ledger import load_rows


@runtime_checkable
class StatusLike(Protocol):
    """What the dashboard needs of a status record (protocol.messages.NodeStatus satisfies it)."""

    peer_id: str
    model_id: str
    step: int
    timestamp: float
    metrics: Mapping[str, float]


class StatusSource(Protocol):
    def read(self) -> Sequence[StatusLike]:
        """The latest status record of every reachable peer (may raise on network errors)."""
        ...


@dataclass(frozen=True)
class Status:
    """A plain status record, shaped like protocol.messages.NodeStatus's observer-facing fields."""

    peer_id: str
    model_id: str
    step: int
    timestamp: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    role: str = "trainer"
    tokenizer_fingerprint: str = ""


class FakeStatusSource:
    """Returns whatever records were last `set()`; counts reads; can be told to fail."""

    def __init__(self, statuses: Sequence[StatusLike] = ()) -> None:
        self._lock = threading.Lock()
        self._statuses = list(statuses)
        self.reads = 0
        self.error: Exception | None = None

    def set(self, statuses: Sequence[StatusLike]) -> None:
        with self._lock:
            self._statuses = list(statuses)

    def read(self) -> list[StatusLike]:
        with self._lock:
            self.reads += 1
            if self.error is not None:
                raise self.error
            return list(self._statuses)


class LedgerSource:
    """The peer ledgers of local node directories: per directory its rows (`ledger.row`), most
    samples first, at most `max_rows` of them, or an `error` line when the file is missing or
    damaged (a reader never moves a node's file; the node sets a damaged one aside itself)."""

    def __init__(self, node_dirs: Sequence[Path | str], max_rows: int = 100) -> None:
        self.node_dirs = [Path(d) for d in node_dirs]
        self.max_rows = max_rows

    def read(self) -> list[dict[str, Any]]:
        out = []
        for d in self.node_dirs:
            node: dict[str, Any] = {"node_dir": str(d), "peers": [], "error": None}
            try:
                rows = load_rows(d / LEDGER_FILE)
                node["peers"], node["total_peers"] = rows[: self.max_rows], len(rows)
            except FileNotFoundError:
                node["error"] = f"no {LEDGER_FILE} yet (written at checkpoints)"
            except (OSError, UnicodeDecodeError, ValueError) as e:  # a file another process writes
                node["error"] = f"unreadable {LEDGER_FILE}: {e}"
            out.append(node)
        return out


class HeldoutSource:
    """The held-out trends of local node directories (`evaluation.heldout.trend_points`: every evaluation
    with its 95% interval), read from their `evals.jsonl` at each request; an `error` line for a
    node that has not evaluated yet."""

    def __init__(self, node_dirs: Sequence[Path | str]) -> None:
        self.node_dirs = [Path(d) for d in node_dirs]

    def read(self) -> list[dict[str, Any]]:
        from swarm_node.evaluation.heldout import EVALS_FILE, read_evals, trend_points

        out = []
        for d in self.node_dirs:
            rows = read_evals(d)
            out.append({"node_dir": str(d), "points": trend_points(rows),
                        "error": None if rows else f"no held-out evaluation yet ({EVALS_FILE})"})
        return out


class SyntheticStatusSource:
    """A fake swarm of `n_peers` nodes; every `read()` advances each node by one step.

    Curves are deterministic given `seed`: reward and accuracy rise towards a per-node ceiling,
    KL and filtering settle, drops happen now and then, and a held-out evaluation of 64 problems
    runs every EVAL_EVERY steps. Used by the browser test and demos.
    """

    EVAL_EVERY = 3
    MODELS = ("smollm2-135m", "smollm2-135m+lora", "tiny-random:128x2", "Qwen/Qwen2.5-1.5B")
    # a made-up fingerprint per model's tokenizer: the two SmolLM2 peers share one
    TOKENIZERS = tuple(hashlib.sha256(t.encode()).hexdigest() for t in ("smollm2", "smollm2", "tiny", "qwen2.5"))

    def __init__(self, n_peers: int = 2, seed: int = 0, start_time: float = 1.7e9, step_seconds: float = 12.0) -> None:
        self._rng = random.Random(seed)
        self._peers = [f"12D3KooWFakePeer{i:04d}" for i in range(n_peers)]
        self._step = 0
        self._t0 = start_time
        self._dt = step_seconds
        self._lock = threading.Lock()

    def read(self) -> list[Status]:
        with self._lock:
            self._step += 1
            return [self._status(i, pid) for i, pid in enumerate(self._peers)]

    def _status(self, i: int, peer_id: str) -> Status:
        s, r = self._step, self._rng
        ceiling = 0.5 + 0.15 * i
        progress = 1.0 - math.exp(-s / 15.0)
        reward = ceiling * progress + r.uniform(-0.05, 0.05)
        own, peer_used = 32.0, float(min(16, 4 * s))
        f_adv, f_kl = float(r.randint(4, 12)), float(r.randint(0, 3))
        kl_mean = 5.0 + 20.0 * math.exp(-s / 10.0) + r.uniform(0, 2)
        metrics = {
            m.STEP: float(s), m.TIME: self._t0 + s * self._dt,
            m.REWARD_MEAN: reward, m.ACCURACY: max(0.0, min(1.0, reward)),
            m.OWN_SAMPLES: own, m.PEER_SAMPLES: peer_used + 4, m.PEER_SAMPLES_USED: peer_used,
            m.FILTERED_NONPOSITIVE_ADVANTAGE: f_adv, m.FILTERED_KL: f_kl,
            m.FILTERED_FRACTION: (f_adv + f_kl) / (own + peer_used),
            m.KL_MEAN: kl_mean, m.KL_P50: 0.8 * kl_mean, m.KL_P90: 1.8 * kl_mean,
            m.KL_P99: 2.5 * kl_mean, m.KL_MAX: 3.0 * kl_mean,
            m.IS_WEIGHT_MEAN: 1.0 + r.uniform(-0.05, 0.1), m.IS_WEIGHT_MAX: 2.0 + r.uniform(0, 3),
            m.TOKENS_PER_S: 60.0 + 10 * i + r.uniform(-5, 5), m.STEP_SECONDS: self._dt,
            m.BYTES_PER_TOKEN: 4.5 + r.uniform(-0.3, 0.3), m.LOSS: r.uniform(-0.1, 0.1),
            m.dropped_name("stale"): float(r.random() < 0.2),
            **self._heldout(s - s % self.EVAL_EVERY, ceiling),
        }
        return Status(peer_id=peer_id, model_id=self.MODELS[i % len(self.MODELS)], step=s,
                      timestamp=self._t0 + s * self._dt, metrics=metrics,
                      tokenizer_fingerprint=self.TOKENIZERS[i % len(self.TOKENIZERS)])

    @staticmethod
    def _heldout(step: int, ceiling: float, n: int = 64) -> dict[str, float]:
        """The metrics of the latest held-out evaluation (after `step`), its accuracy rising with training."""
        from swarm_node.evaluation.stats import wilson

        correct = round(n * 0.8 * ceiling * (1.0 - math.exp(-(step + 3) / 15.0)))
        lo, hi = wilson(correct, n)
        return {m.EVAL_ACCURACY: correct / n, m.EVAL_STEP: float(step), m.EVAL_LO: lo, m.EVAL_HI: hi,
                m.EVAL_N: float(n), m.EVAL_SECONDS: 20.0}
