"""A step's metrics: canonical names and the JSONL log (the Prometheus exporter: prometheus.py).

One training step produces one flat `dict[str, float]`. The names below are the contract between
the node loop (which fills the dict), `metrics.jsonl` (one JSON object per step), Prometheus
(`swarm_node_<name>` gauges), the status record observers read, the dashboard and the report.

Counting conventions (all counts are *per step*, never cumulative):
  - `own_samples`: completions this node generated that entered the step's batch.
  - `peer_samples`: peer completions that entered the step's batch (fetched, validated, under the
    peer-share cap). Filtered ones are included: they still count in their group's mean/std.
  - `peer_samples_used`: peer completions in the batch that were not filtered.
  - `peer_samples_gradient`: peer completions that carried gradient: not filtered and a nonzero
    advantage (in the unfiltered variants a group of equal rewards is used but teaches nothing).
  - `mixed_groups`: fraction of own groups whose rewards are not all equal (GRPO learns only from these).
  - `samples`: the batch size, own_samples + peer_samples.
  - `filtered_<reason>`: samples in the filter scope that meet that condition (non-positive
    advantage; KL > g); a sample may meet both. `filtered` counts the samples the filter rule drops
    (their advantage zeroed): either condition under `objective.filter_rule = "or"`, both under "and".
  - `filtered_fraction`: all filtered samples / samples.
  - `is_weight_*` average every scored token (own ones included); `is_weight_peer_*` and
    `truncated_peer_fraction` peers' tokens only.
  - `kl_*` / `kl_peer_*`: the per-sample KL of the configured estimator over all / peers' samples;
    `kl_peer_k3_gen_*`, `kl_peer_k3_theta_*`: both estimators on peers' samples (swarm_node.kl).
  - `dropped_<reason>`: peer data rejected in this step before training (malformed, stale, wrong
    tokenizer, ...). Reasons are open-ended short identifiers; Prometheus exports them as one
    labelled counter `swarm_node_dropped_total{reason="..."}`. The running totals since the node
    started are `total_dropped_<reason>` (the one exception to the per-step rule, named as such).
  - network health (health.py): `live_peers`, `routing_table_size`, `alone_steps` are the state at
    the end of the step; `bytes_sent`, `bytes_received`, `index_read_failures`, `store_failures`
    count the step's traffic; `publish_seconds`, `gather_seconds` time its network work.
  - `prompt_set_restores`, `prompt_set_restored_bytes`: the seeded prompt set's records this node
    re-stored in the step (swarm/prompt_keeper.py); bad records it found under the set's key are
    `dropped_<reason>` like other peer data (e.g. `dropped_tombstone_bad_signature`).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

STEP = "step"
TIME = "time"
REWARD_MEAN = "reward_mean"
ACCURACY = "accuracy"
OWN_SAMPLES = "own_samples"
PEER_SAMPLES = "peer_samples"
PEER_SAMPLES_USED = "peer_samples_used"
PEER_SAMPLES_GRADIENT = "peer_samples_gradient"
MIXED_GROUPS = "mixed_groups"
FILTERED_NONPOSITIVE_ADVANTAGE = "filtered_nonpositive_advantage"
FILTERED_KL = "filtered_kl"
FILTERED_FRACTION = "filtered_fraction"
KL_MEAN = "kl_mean"
KL_P50 = "kl_p50"
KL_P90 = "kl_p90"
KL_P99 = "kl_p99"
KL_MAX = "kl_max"
KL_PEER_K3_GEN_P50 = "kl_peer_k3_gen_p50"
KL_PEER_K3_GEN_P90 = "kl_peer_k3_gen_p90"
KL_PEER_K3_GEN_MAX = "kl_peer_k3_gen_max"
KL_PEER_K3_THETA_P50 = "kl_peer_k3_theta_p50"
KL_PEER_K3_THETA_P90 = "kl_peer_k3_theta_p90"
KL_PEER_K3_THETA_MAX = "kl_peer_k3_theta_max"
IS_WEIGHT_MEAN = "is_weight_mean"
IS_WEIGHT_MAX = "is_weight_max"
IS_WEIGHT_PEER_MEAN = "is_weight_peer_mean"
IS_WEIGHT_PEER_MAX = "is_weight_peer_max"
TRUNCATED_FRACTION = "truncated_fraction"
TRUNCATED_PEER_FRACTION = "truncated_peer_fraction"
CLIPPED_FRACTION = "clipped_fraction"
ESS = "ess"
CROSSTOK_SAMPLES = "crosstok_samples"
CROSSTOK_TOKENS_PER_CHUNK = "crosstok_tokens_per_chunk"
LOSS = "loss"
GRAD_NORM = "grad_norm"
LR = "lr"
TOKENS_PER_S = "tokens_per_s"
GEN_SECONDS = "gen_seconds"
TRAIN_SECONDS = "train_seconds"
STEP_SECONDS = "step_seconds"
BYTES_PER_TOKEN = "bytes_per_token"
TEXT_GROUPS = "text_groups"
TEXT_WITHHELD = "text_withheld"
BYTES_SENT = "bytes_sent"
BYTES_RECEIVED = "bytes_received"
EVAL_ACCURACY = "eval_accuracy"
LIVE_PEERS = "live_peers"
ROUTING_TABLE_SIZE = "routing_table_size"
ALONE_STEPS = "alone_steps"
PUBLISH_SECONDS = "publish_seconds"
GATHER_SECONDS = "gather_seconds"
INDEX_READ_FAILURES = "index_read_failures"
STORE_FAILURES = "store_failures"
STORED_KEYS = "stored_keys"
ALONE_SECONDS = "alone_seconds"
REDIALS = "redials"
UPTIME_SECONDS = "uptime_seconds"
NONFINITE_DROPPED_SAMPLES = "nonfinite_dropped_samples"
NONFINITE_SENDERS = "nonfinite_senders"
PEER_REWARD_SECONDS = "peer_reward_seconds"
PEER_NEWEST_AGE_S = "peer_newest_age_s"
SPOT_CHECKED = "spot_checked"
SPOT_UNCHECKED = "spot_unchecked"
SPOT_OVER_BUDGET = "spot_over_budget"
SPOT_MISMATCH = "spot_mismatch"
SPOT_SECONDS = "spot_seconds"
SPOT_TOKENS = "spot_tokens"
PROMPT_SET_RESTORES = "prompt_set_restores"
PROMPT_SET_RESTORED_BYTES = "prompt_set_restored_bytes"

DROPPED_PREFIX = "dropped_"
TOTAL_DROPPED_PREFIX = "total_dropped_"
FILTERED_PREFIX = "filtered_"
# The filter reasons the objective reports (each a `filtered_<reason>` count).
FILTER_REASONS: tuple[str, ...] = ("nonpositive_advantage", "kl")

# Canonical name -> help text (Prometheus HELP line and documentation).
METRICS: dict[str, str] = {
    STEP: "Optimizer steps completed by this node.",
    TIME: "Wall-clock time (unix seconds) at the end of the step.",
    REWARD_MEAN: "Mean reward of this node's own completions in the step.",
    ACCURACY: "Fraction of own completions judged correct in the step.",
    OWN_SAMPLES: "Own completions in the step's batch.",
    PEER_SAMPLES: "Peer completions in the step's batch (filtered ones included).",
    PEER_SAMPLES_USED: "Peer completions in the batch that were not filtered.",
    PEER_SAMPLES_GRADIENT: "Peer completions that carried gradient (not filtered, nonzero advantage).",
    MIXED_GROUPS: "Fraction of own groups whose rewards are not all equal.",
    FILTERED_NONPOSITIVE_ADVANTAGE: "Samples in the filter scope with a non-positive advantage (the advantage condition).",
    FILTERED_KL: "Samples in the filter scope whose per-sample KL exceeded g (the KL condition).",
    FILTERED_FRACTION: "Samples the filter rule dropped / samples in the batch.",
    KL_MEAN: "Mean per-sample KL over the batch (objective.kl_estimator, unit: objective.kl_reduction).",
    KL_P50: "Median per-sample KL.",
    KL_P90: "90th percentile of per-sample KL.",
    KL_P99: "99th percentile of per-sample KL.",
    KL_MAX: "Largest per-sample KL.",
    KL_PEER_K3_GEN_P50: "Median per-sample k3_gen KL (of KL(pi_gen || pi_theta)) over peers' samples.",
    KL_PEER_K3_GEN_P90: "90th percentile of the per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_GEN_MAX: "Largest per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_THETA_P50: "Median per-sample k3_theta KL (the authors' code's form) over peers' samples.",
    KL_PEER_K3_THETA_P90: "90th percentile of the per-sample k3_theta KL over peers' samples.",
    KL_PEER_K3_THETA_MAX: "Largest per-sample k3_theta KL over peers' samples.",
    IS_WEIGHT_MEAN: "Mean token importance weight pi_theta_old/pi_gen before truncation (every scored token).",
    IS_WEIGHT_MAX: "Largest token importance weight before truncation (finite: log-ratios are clamped).",
    IS_WEIGHT_PEER_MEAN: "Mean token importance weight before truncation over peers' tokens only.",
    IS_WEIGHT_PEER_MAX: "Largest token importance weight before truncation over peers' tokens.",
    TRUNCATED_FRACTION: "Fraction of tokens whose importance weight was truncated at C.",
    TRUNCATED_PEER_FRACTION: "Fraction of peers' tokens whose importance weight was truncated at C.",
    CLIPPED_FRACTION: "Fraction of tokens where the PPO clip was active.",
    ESS: "Effective sample size of the importance weights, normalised to [0, 1].",
    CROSSTOK_SAMPLES: "Peer samples generated with another tokenizer in the batch, scored per chunk of aligned text.",
    CROSSTOK_TOKENS_PER_CHUNK: "This node's tokens per aligned chunk over cross-tokenizer samples (1: no merging).",
    LOSS: "Objective value of the step.",
    GRAD_NORM: "Gradient norm before clipping.",
    LR: "Learning rate used in the step.",
    TOKENS_PER_S: "Generated tokens per second of generation time.",
    GEN_SECONDS: "Seconds spent generating in the step.",
    TRAIN_SECONDS: "Seconds spent in the optimizer step (forward, backward, update).",
    STEP_SECONDS: "Wall-clock seconds of the whole step.",
    BYTES_PER_TOKEN: "Published bytes per completion token (after compression).",
    TEXT_GROUPS: "Own groups published with completion text for peers of other tokenizers (swarm.send_text).",
    TEXT_WITHHELD: "Own groups published without text although text was due: a completion had no faithful text.",
    BYTES_SENT: "Bytes published to the swarm in the step.",
    BYTES_RECEIVED: "Bytes fetched from the swarm in the step.",
    EVAL_ACCURACY: "Accuracy on the evaluation set, in steps where an evaluation ran.",
    LIVE_PEERS: "Peers with a live connection to this node's DHT at the end of the step.",
    ROUTING_TABLE_SIZE: "Peers in this node's DHT routing table at the end of the step.",
    ALONE_STEPS: "Consecutive steps ending without a live peer (0 when connected).",
    PUBLISH_SECONDS: "Seconds spent publishing own groups (chunks and index) in the step.",
    GATHER_SECONDS: "Seconds the step waited for peers' groups after generation.",
    INDEX_READ_FAILURES: "DHT reads (index keys, status) that timed out in the step.",
    STORE_FAILURES: "Records or chunks no peer accepted in time in the step.",
    # `swarm-node bootstrap` (no steps): its DHT's state every few seconds
    STORED_KEYS: "DHT keys this peer holds for the swarm.",
    ALONE_SECONDS: "Seconds since this peer has had no live peer (0 when connected).",
    REDIALS: "Re-dial rounds run by self-healing membership since start.",
    UPTIME_SECONDS: "Seconds since this bootstrap started.",
    NONFINITE_DROPPED_SAMPLES: "Peer samples dropped from the step because its loss or gradient was non-finite.",
    NONFINITE_SENDERS: "Peers blamed for a non-finite step (their groups stay refused: dropped_rejected_before).",
    PEER_REWARD_SECONDS: "Seconds spent verifying peers' answers (capped by task.peer_reward_budget_s).",
    SPOT_CHECKED: "Peer groups whose logprobs were spot-checked against a reference model (swarm.spot_check).",
    SPOT_UNCHECKED: "Peer groups not spot-checked: this node holds no model equal to the one they declare.",
    SPOT_OVER_BUDGET: "Peer groups not spot-checked: the step's spot-check token or time budget was spent.",
    SPOT_MISMATCH: "Spot-checked peer groups dropped as logprob_mismatch.",
    SPOT_SECONDS: "Seconds spent on logprob spot-checks (capped by swarm.spot_check.budget_s).",
    SPOT_TOKENS: "Tokens the spot-checks' forward passes covered (capped by swarm.spot_check.max_tokens_per_step).",
    PROMPT_SET_RESTORES: "Re-stores of the seeded prompt set's records by this node in the step (prompt_keeper.py).",
    PROMPT_SET_RESTORED_BYTES: "Bytes of the seeded prompt set (chunks, manifest) this node re-stored in the step.",
    PEER_NEWEST_AGE_S: "Seconds from the creation of the newest peer group taken to the end of the step (absent without one).",
}

NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def dropped_name(reason: str) -> str:
    """The metric name counting peer data dropped for `reason` (a short identifier)."""
    if not NAME_RE.match(reason):
        raise ValueError(f"drop reason {reason!r} is not a short identifier")
    return DROPPED_PREFIX + reason


def total_dropped_name(reason: str) -> str:
    """The metric name of the running total of drops for `reason` since the node started."""
    return TOTAL_DROPPED_PREFIX + dropped_name(reason)[len(DROPPED_PREFIX):]


def dropped_counts(metrics: Mapping[str, float]) -> dict[str, float]:
    """`{reason: count}` for every `dropped_<reason>` entry of a step's metrics."""
    return {k[len(DROPPED_PREFIX):]: float(v) for k, v in metrics.items() if k.startswith(DROPPED_PREFIX)}


def filtered_fractions(metrics: Mapping[str, float]) -> dict[str, float]:
    """`{reason: fraction of the batch}` per filter reason; empty when the batch size is unknown or 0."""
    batch = float(metrics.get(OWN_SAMPLES, 0.0)) + float(metrics.get(PEER_SAMPLES, 0.0))
    if batch <= 0:
        return {}
    return {r: float(metrics[FILTERED_PREFIX + r]) / batch for r in FILTER_REASONS if FILTERED_PREFIX + r in metrics}


class JsonlMetricsWriter:
    """Append one JSON object per step to `path`.

    Each record is flushed at once (a crash loses at most the record being written) and fsynced
    at most every `fsync_interval_s` seconds and on close, so logging never dominates a step.
    A partial last line left by a killed process is cut off when the file is reopened, so later
    records never fuse with it.
    """

    def __init__(self, path: Path | str, fsync_interval_s: float = 5.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_partial_tail(self.path)
        self._fsync_interval_s = fsync_interval_s
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")
        self._last_fsync = time.monotonic()
        self._lock = threading.Lock()

    def write(self, metrics: Mapping[str, float]) -> None:
        """Append one step's metrics (non-finite floats are written as JSON NaN/Infinity)."""
        line = json.dumps({str(k): as_number(k, v) for k, v in metrics.items()}, allow_nan=True)
        with self._lock:
            if self._file is None:
                raise ValueError(f"metrics writer for {self.path} is closed")
            self._file.write(line + "\n")
            self._file.flush()
            now = time.monotonic()
            if now - self._last_fsync >= self._fsync_interval_s:
                os.fsync(self._file.fileno())
                self._last_fsync = now

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def __enter__(self) -> JsonlMetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_number(key: Any, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metric {key!r} is not a number: {value!r}") from e
    return value


def _truncate_partial_tail(path: Path) -> None:
    """If `path` ends without a newline (a torn write), cut it back to the last complete line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        block = 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                f.truncate(start + idx + 1)
                return
            pos = start
        f.truncate(0)


def read_metrics_jsonl(path: Path | str) -> list[dict[str, float]]:
    """Read a metrics log. A truncated final line (a killed writer) is ignored; a corrupt line
    anywhere else raises ValueError, since that is not something a crash produces."""
    records: list[dict[str, float]] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # After split, a complete file ends with "" (its trailing newline); anything else is a torn tail.
    complete, tail = lines[:-1], lines[-1]
    for lineno, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: corrupt metrics record: {e}") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: metrics record is not an object")
        records.append(obj)
    if tail.strip():
        try:
            obj = json.loads(tail)
        except json.JSONDecodeError:
            obj = None  # torn final write: drop it
        if isinstance(obj, dict):
            records.append(obj)
    return records


def latest_run(records: list[dict[str, float]]) -> list[dict[str, float]]:
    """The last run of each step: a node resumed from an older checkpoint logs steps it had logged
    before; a step number that does not increase starts a new run, whose rows supersede every
    earlier row of that step or later. Rows without a step are kept in order."""
    kept: list[dict[str, float]] = []
    for row in records:
        step = row.get(STEP)
        if step is not None:
            kept = [r for r in kept if r.get(STEP) is None or float(r[STEP]) < float(step)]
        kept.append(row)
    return kept


def supersede_after(path: Path | str, step: int) -> int:
    """A node resuming at `step`: move the rows of later steps (from a run whose weights were lost)
    to `<name>.superseded.jsonl` next to the log, so the log holds one row per step. Both files are
    rewritten atomically (the superseded file first, so no row is ever lost). Returns rows moved."""
    from swarm_node.atomic import atomic_write_text

    path = Path(path)
    if not path.exists():
        return 0
    _truncate_partial_tail(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    keep, moved = [], []
    for ln in lines:
        try:
            later = float(json.loads(ln).get(STEP, 0)) > step
        except (ValueError, AttributeError):
            later = False  # not ours to judge: keep it where it is
        (moved if later else keep).append(ln)
    if not moved:
        return 0
    old = path.with_name(path.stem + ".superseded" + path.suffix)
    previous = old.read_text(encoding="utf-8") if old.exists() else ""
    atomic_write_text(old, previous + "".join(ln + "\n" for ln in moved))
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))
    return len(moved)
