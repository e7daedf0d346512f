"""A step's metrics by name: every name a step writes, as a constant with its help text (`METRICS`).

One training step produces one flat `dict[str, float]`. The names below are the contract between
its writers (the node loop, the trainer and the objective's statistics, the peer gather and its
spot-checks, network health, the prompt keeper: each name has one writer), `metrics.jsonl` (one
JSON object per step: `metrics.py`), Prometheus (`swarm_node_<name>` gauges), the status record
observers read, the dashboard and the report. Writers use the constants, never the strings. A leaf:
standard library only.

Counting conventions (all counts are *per step*, never cumulative):
  - `own_samples`: completions this node generated that entered the step's batch.
  - `peer_samples`: peer completions that entered the step's batch (fetched, validated, under the
    peer-share cap). Filtered ones are included: they still count in their group's mean/std. The
    trainer counts them: after a non-finite step they are 0 (`nonfinite_dropped_samples`).
  - `peer_samples_used`: peer completions in the batch that were not filtered.
  - `peer_samples_gradient`: peer completions that carried gradient: not filtered and a nonzero
    advantage (with `objective.filter = "off"` a group of equal rewards is used but teaches nothing).
  - `mixed_groups`: fraction of own groups whose rewards are not all equal (GRPO learns only from these).
  - `samples`: the batch size, own_samples + peer_samples.
  - `filtered_<reason>`: samples in the filter scope that meet that condition (non-positive
    advantage; KL > g); a sample may meet both. `filtered` counts the samples the filter rule drops
    (their advantage zeroed): either condition under `objective.filter_rule = "or"`, both under "and".
  - `filtered_fraction`: all filtered samples / samples.
  - `is_weight_*` average every scored token (own ones included); `is_weight_peer_*` and
    `truncated_peer_fraction` peers' tokens only.
  - `kl_*` / `kl_peer_*`: the per-sample KL of the configured estimator over all / peers' samples;
    `kl_peer_k3_gen_*`, `kl_peer_k3_theta_*`: both estimators on peers' samples (swarm_node.method.kl).
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
  - `given_*`: the receipts naming this node in peers' status records (given.py), as of its latest
    read of them (every few windows): state, repeated in every step until the next read;
    `given_dropped_<reason>` for the commonest reasons receivers name (at most 8).
  - `eval_*`: the node's latest held-out evaluation (evaluation/heldout.py), in every step from the one
    it followed until the next: state, like `live_peers`, not a count; `eval_step` says which
    step it measured (0: before training), `eval_lo`/`eval_hi` its 95% Wilson interval.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

STEP = "step"
TIME = "time"
REWARD_MEAN = "reward_mean"
ACCURACY = "accuracy"
OWN_SAMPLES = "own_samples"
PEER_SAMPLES = "peer_samples"
PEER_SAMPLES_USED = "peer_samples_used"
PEER_SAMPLES_GRADIENT = "peer_samples_gradient"
MIXED_GROUPS = "mixed_groups"
PEER_GROUPS = "peer_groups"
SAMPLES = "samples"
REWARD_MEAN_ALL = "reward_mean_all"
COMPLETION_TOKENS = "completion_tokens"
LONGEST_PROMPT = "longest_prompt_tokens"
LONGEST_COMPLETION = "longest_completion_tokens"
TOKENS = "tokens"
ACTIVE_TOKENS = "active_tokens"
PEER_TOKENS = "peer_tokens"
FILTERED = "filtered"
FILTERED_NONPOSITIVE_ADVANTAGE = "filtered_nonpositive_advantage"
FILTERED_KL = "filtered_kl"
FILTERED_FRACTION = "filtered_fraction"
FILTERED_NONPOSITIVE_ADVANTAGE_FRACTION = "filtered_nonpositive_advantage_fraction"
FILTERED_KL_FRACTION = "filtered_kl_fraction"
KL_MEAN = "kl_mean"
KL_P50 = "kl_p50"
KL_P90 = "kl_p90"
KL_P99 = "kl_p99"
KL_MAX = "kl_max"
KL_PEER_MEAN = "kl_peer_mean"
KL_PEER_P50 = "kl_peer_p50"
KL_PEER_P90 = "kl_peer_p90"
KL_PEER_P99 = "kl_peer_p99"
KL_PEER_MAX = "kl_peer_max"
KL_PEER_K3_GEN_MEAN = "kl_peer_k3_gen_mean"
KL_PEER_K3_GEN_P50 = "kl_peer_k3_gen_p50"
KL_PEER_K3_GEN_P90 = "kl_peer_k3_gen_p90"
KL_PEER_K3_GEN_P99 = "kl_peer_k3_gen_p99"
KL_PEER_K3_GEN_MAX = "kl_peer_k3_gen_max"
KL_PEER_K3_THETA_MEAN = "kl_peer_k3_theta_mean"
KL_PEER_K3_THETA_P50 = "kl_peer_k3_theta_p50"
KL_PEER_K3_THETA_P90 = "kl_peer_k3_theta_p90"
KL_PEER_K3_THETA_P99 = "kl_peer_k3_theta_p99"
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
OPTIMIZER_STEPS = "optimizer_steps"
SKIPPED = "skipped"
SKIPPED_SAMPLES = "skipped_samples"
TOKENS_PER_S = "tokens_per_s"
GEN_SECONDS = "gen_seconds"
TRAIN_SECONDS = "train_seconds"
STEP_SECONDS = "step_seconds"
BYTES_PER_TOKEN = "bytes_per_token"
TEXT_GROUPS = "text_groups"
TEXT_WITHHELD = "text_withheld"
OWN_GROUPS_PUBLISHED = "own_groups_published"
OWN_GROUPS_UNPUBLISHED_STALE = "own_groups_unpublished_stale"
BYTES_SENT = "bytes_sent"
BYTES_RECEIVED = "bytes_received"
EVAL_ACCURACY = "eval_accuracy"
EVAL_STEP = "eval_step"
EVAL_LO = "eval_lo"
EVAL_HI = "eval_hi"
EVAL_N = "eval_n"
EVAL_SECONDS = "eval_seconds"
LIVE_PEERS = "live_peers"
ROUTING_TABLE_SIZE = "routing_table_size"
ALONE_STEPS = "alone_steps"
PUBLISH_SECONDS = "publish_seconds"
GATHER_SECONDS = "gather_seconds"
INDEX_READ_FAILURES = "index_read_failures"
STORE_FAILURES = "store_failures"
STORED_KEYS = "stored_keys"
DHT_CALLS_COLLECTED = "dht_calls_collected"
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
PROMPT_SET_SWITCHES = "prompt_set_switches"
GIVEN_RECEIVERS = "given_receivers"
GIVEN_TAKERS = "given_takers"
GIVEN_GROUPS_TAKEN = "given_groups_taken"
GIVEN_SAMPLES = "given_samples"
GIVEN_SAMPLES_GRADIENT = "given_samples_gradient"
GIVEN_SAMPLES_FILTERED = "given_samples_filtered"
GIVEN_FILTERED_ADVANTAGE = "given_filtered_advantage"
GIVEN_FILTERED_KL = "given_filtered_kl"
GIVEN_GROUPS_DROPPED = "given_groups_dropped"
GIVEN_TOP_SHARE = "given_top_share"
GIVEN_SPAN_S = "given_span_s"
GIVEN_AGE_S = "given_age_s"
GIVEN_DROPPED_PREFIX = "given_dropped_"

# A per-sample distribution over the batch (method/stats.py): mean, quantiles 0.5, 0.9, 0.99, max.
KL_DISTRIBUTION = (KL_MEAN, KL_P50, KL_P90, KL_P99, KL_MAX)
KL_PEER_DISTRIBUTION = (KL_PEER_MEAN, KL_PEER_P50, KL_PEER_P90, KL_PEER_P99, KL_PEER_MAX)
KL_PEER_K3_GEN_DISTRIBUTION = (KL_PEER_K3_GEN_MEAN, KL_PEER_K3_GEN_P50, KL_PEER_K3_GEN_P90, KL_PEER_K3_GEN_P99,
                               KL_PEER_K3_GEN_MAX)
KL_PEER_K3_THETA_DISTRIBUTION = (KL_PEER_K3_THETA_MEAN, KL_PEER_K3_THETA_P50, KL_PEER_K3_THETA_P90,
                                 KL_PEER_K3_THETA_P99, KL_PEER_K3_THETA_MAX)

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
    PEER_SAMPLES: "Peer completions in the step's batch (filtered ones included; 0 when a non-finite step dropped them).",
    PEER_SAMPLES_USED: "Peer completions in the batch that were not filtered.",
    PEER_SAMPLES_GRADIENT: "Peer completions that carried gradient (not filtered, nonzero advantage).",
    MIXED_GROUPS: "Fraction of own groups whose rewards are not all equal.",
    PEER_GROUPS: "Peer groups taken into the step's batch.",
    SAMPLES: "Samples in the step's batch the objective counted: own_samples + peer_samples.",
    REWARD_MEAN_ALL: "Mean reward over every sample handed to the trainer, peers' included.",
    COMPLETION_TOKENS: "Completion tokens of every sample handed to the trainer.",
    LONGEST_PROMPT: "Tokens of the longest prompt among the samples scored with gradient (the memory plan's "
                    "prompt length; doctor reads it).",
    LONGEST_COMPLETION: "Tokens of the longest completion among the samples scored with gradient (the memory "
                        "plan's completion length).",
    TOKENS: "Valid completion tokens of the scored samples.",
    ACTIVE_TOKENS: "Scored tokens that can carry gradient (valid, of a sample the filter kept).",
    PEER_TOKENS: "Valid completion tokens of peers' scored samples.",
    FILTERED: "Samples the filter rule dropped (objective.filter_rule over the filter conditions).",
    FILTERED_NONPOSITIVE_ADVANTAGE: "Samples in the filter scope with a non-positive advantage (the advantage condition).",
    FILTERED_KL: "Samples in the filter scope whose per-sample KL exceeded g (the KL condition).",
    FILTERED_FRACTION: "Samples the filter rule dropped / samples in the batch.",
    FILTERED_NONPOSITIVE_ADVANTAGE_FRACTION: "filtered_nonpositive_advantage / samples in the batch.",
    FILTERED_KL_FRACTION: "filtered_kl / samples in the batch.",
    KL_MEAN: "Mean per-sample KL over the batch (objective.kl_estimator, unit: objective.kl_reduction).",
    KL_P50: "Median per-sample KL.",
    KL_P90: "90th percentile of per-sample KL.",
    KL_P99: "99th percentile of per-sample KL.",
    KL_MAX: "Largest per-sample KL.",
    KL_PEER_MEAN: "Mean per-sample KL (objective.kl_estimator) over peers' samples.",
    KL_PEER_P50: "Median per-sample KL over peers' samples.",
    KL_PEER_P90: "90th percentile of per-sample KL over peers' samples.",
    KL_PEER_P99: "99th percentile of per-sample KL over peers' samples.",
    KL_PEER_MAX: "Largest per-sample KL over peers' samples.",
    KL_PEER_K3_GEN_MEAN: "Mean per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_GEN_P50: "Median per-sample k3_gen KL (of KL(pi_gen || pi_theta)) over peers' samples.",
    KL_PEER_K3_GEN_P90: "90th percentile of the per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_GEN_P99: "99th percentile of the per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_GEN_MAX: "Largest per-sample k3_gen KL over peers' samples.",
    KL_PEER_K3_THETA_MEAN: "Mean per-sample k3_theta KL over peers' samples.",
    KL_PEER_K3_THETA_P50: "Median per-sample k3_theta KL (the authors' code's form) over peers' samples.",
    KL_PEER_K3_THETA_P90: "90th percentile of the per-sample k3_theta KL over peers' samples.",
    KL_PEER_K3_THETA_P99: "99th percentile of the per-sample k3_theta KL over peers' samples.",
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
    OPTIMIZER_STEPS: "Optimizer updates made in the step (one per epoch over the batch that carried gradient).",
    SKIPPED: "1 when the step made no optimizer update (no token carried gradient), else 0.",
    SKIPPED_SAMPLES: "Samples given no gradient pass: they carry no gradient (equal rewards, filtered).",
    TOKENS_PER_S: "Generated tokens per second of generation time.",
    GEN_SECONDS: "Seconds spent generating in the step.",
    TRAIN_SECONDS: "Seconds spent in the optimizer step (forward, backward, update).",
    STEP_SECONDS: "Wall-clock seconds of the whole step.",
    BYTES_PER_TOKEN: "Published bytes per completion token (after compression).",
    TEXT_GROUPS: "Own groups published with completion text for peers of other tokenizers (swarm.send_text).",
    TEXT_WITHHELD: "Own groups published without text although text was due: a completion had no faithful text.",
    OWN_GROUPS_PUBLISHED: "Own groups published in the step (a slow node's as each sub-batch is complete).",
    OWN_GROUPS_UNPUBLISHED_STALE: "Own groups trained on but not published: complete only after peers stop reading "
                                  "them (swarm.staleness_steps x swarm.window_seconds after the step began).",
    BYTES_SENT: "Bytes published to the swarm in the step.",
    BYTES_RECEIVED: "Bytes fetched from the swarm in the step.",
    # the node's latest held-out evaluation (evaluation/heldout.py), repeated in every step after it
    EVAL_ACCURACY: "Held-out accuracy (greedy pass@1) of the node's latest evaluation (eval.every_steps).",
    EVAL_STEP: "The step after which the latest held-out evaluation ran (0: before training).",
    EVAL_LO: "Lower end of the latest held-out accuracy's 95% Wilson interval.",
    EVAL_HI: "Upper end of the latest held-out accuracy's 95% Wilson interval.",
    EVAL_N: "Problems in the latest held-out evaluation.",
    EVAL_SECONDS: "Seconds the latest held-out evaluation took (not counted in step_seconds).",
    LIVE_PEERS: "Peers with a live connection to this node's DHT at the end of the step.",
    ROUTING_TABLE_SIZE: "Peers in this node's DHT routing table at the end of the step.",
    ALONE_STEPS: "Consecutive steps ending without a live peer (0 when connected).",
    PUBLISH_SECONDS: "Seconds spent publishing own groups (chunks and index) in the step.",
    GATHER_SECONDS: "Seconds the step waited for peers' groups after generation.",
    INDEX_READ_FAILURES: "DHT reads (index keys, status) that timed out in the step.",
    STORE_FAILURES: "Records or chunks no peer accepted in time in the step.",
    # `swarm-node bootstrap` (no steps): its DHT's state every few seconds
    STORED_KEYS: "DHT keys this peer holds for the swarm.",
    DHT_CALLS_COLLECTED: "DHT calls whose task the DHT process lost while it waited for an answer that could not come (since start).",
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
    PROMPT_SET_SWITCHES: "1 at the step after which this node switched to the successor of its ended prompt "
                         "set (swarm.prompt_set_owner's tombstone; prompt_keeper.py), else 0.",
    PEER_NEWEST_AGE_S: "Seconds from the creation of the newest peer group taken to the end of the step (absent without one).",
    # the receipts naming this node in peers' status records (given.py), as of its latest read
    GIVEN_RECEIVERS: "Peers whose status record holds a receipt for this node's groups.",
    GIVEN_TAKERS: "Peers whose receipt says they took at least one of this node's groups.",
    GIVEN_GROUPS_TAKEN: "Groups of this node that peers' receipts say became training samples.",
    GIVEN_SAMPLES: "Samples of this node's groups that peers' receipts say they trained on.",
    GIVEN_SAMPLES_GRADIENT: "Samples of this node's groups that carried gradient at peers (their receipts).",
    GIVEN_SAMPLES_FILTERED: "Samples of this node's groups that peers' filters dropped (their receipts).",
    GIVEN_FILTERED_ADVANTAGE: "Of those, samples with a non-positive advantage at the receiver.",
    GIVEN_FILTERED_KL: "Of those, samples whose KL exceeded the receiver's g.",
    GIVEN_GROUPS_DROPPED: "Groups (and index records) of this node that peers' receipts say they dropped.",
    GIVEN_TOP_SHARE: "Share of given_samples_gradient stated by the one receiver stating the most.",
    GIVEN_SPAN_S: "Shortest span (seconds) the receipts naming this node cover.",
    GIVEN_AGE_S: "Seconds since this node last read the receipts naming it.",
}

NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def merge(*writers: Mapping[str, float]) -> dict[str, float]:
    """A step's metrics from its writers' parts (as floats). Each name has one writer: a name two
    writers give is a bug (one would silently replace the other), so it raises ValueError."""
    out: dict[str, float] = {}
    for part in writers:
        for name, value in part.items():
            if name in out:
                raise ValueError(f"metric {name!r} is written by two writers in one step")
            out[name] = float(value)
    return out


def dropped_name(reason: str) -> str:
    """The metric name counting peer data dropped for `reason` (a short identifier)."""
    if not NAME_RE.match(reason):
        raise ValueError(f"drop reason {reason!r} is not a short identifier")
    return DROPPED_PREFIX + reason


def given_dropped_name(reason: str) -> str:
    """The metric name of this node's groups that peers' receipts say they dropped for `reason`."""
    if not NAME_RE.match(GIVEN_DROPPED_PREFIX + reason):
        raise ValueError(f"drop reason {reason!r} is not a short identifier")
    return GIVEN_DROPPED_PREFIX + reason


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
