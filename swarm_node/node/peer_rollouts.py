"""Peers' rollouts, between the wire and the trainer: peers' decoded groups are checked against this
node's own state (tokenizer, prompt set), re-scored locally and become training samples. Every
rejection is counted by reason. Own completions become samples and wire groups in
`own_rollouts.py`; what both sides use (`TOKENIZER_LOCK`, `decode`, `render_prompts`, `group_key`)
is here. Both see the node through `parts.NodeParts`.

A step's peer work (fetch, checks, reward verification within its time budget:
`swarm_node.tasks.verify`) runs off the step thread in `gather_peer_samples`, overlapped with
generation. A group refused for a reason that is its sender's fault and would recur (a logprob
mismatch, a verifier timeout, or blame for a non-finite step) is blamed in one place, `blame`: the
peer ledger, the sender's reputation share (admission) and the node's reject list, so it stays
refused across restarts.

The protocol layer has already checked structure and limits (`protocol.validate`, in the
exchange); what is checked here needs the node: the tokenizer fingerprint, the prompt reference
against the node's own copy of the prompt set, the sender's logprobs when this node holds the model
the group declares (`swarm_node.peers.spotcheck`: `logprob_mismatch`), and the reward, always recomputed.

A group from another tokenizer (its fingerprint differs) is taken when `swarm.cross_tokenizer` is on
(the default) and it carries every completion's text and piece byte lengths: where this node holds
the sender's tokenizer (a spot-check reference of that fingerprint) the texts must be what it makes
of the tokens (`text_token_mismatch`, blamed), then the group is converted to this node's tokens
(`swarm_node.peers.crosstok_receive`; a completion that does not round-trip drops the whole group,
counted by reason), its rewards are computed from the texts, and its samples carry chunk ids (F-TIS
per chunk of aligned text). Otherwise it is dropped (`tokenizer_mismatch`).

The exchange counted every group it returns as taken in the sender's reputation; one dropped here
before training is withdrawn and is a miss of its sender (`Admission.untake`: the slot it held
was used for nothing), unless the reason is this node's own budget.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import numpy as np

from protocol import keys
from protocol.messages import PromptRef, RolloutGroup
from swarm_node.peers.crosstok_receive import (
    DROP_TEXT_TOKEN_MISMATCH,
    ReceivedGroup,
    held_tokenizer,
    receive_group,
    texts_match_tokens,
    train_samples,
)
from swarm_node.node.parts import NodeParts, SpotSession
from swarm_node.policy.types import TrainSample
from swarm_node.peers.spotcheck import LOGPROB_MISMATCH
from swarm_node.swarm.admission import OVER_TOKEN_BUDGET
from swarm_node.tasks.base import Problem
from swarm_node.tasks.prompts import render_prompt
from swarm_node.tasks.verify import VERIFY_BUDGET, PeerVerifier

DROP_TOKENIZER = "tokenizer_mismatch"
# Another tokenizer's completion may be at most this many times this node's max_new_tokens in own
# tokens (a byte-level receiver of a BPE sender needs about 4x; more is a degenerate text).
CROSSTOK_MAX_TOKENS_FACTOR = 6
DROP_UNKNOWN_PROMPT = "unknown_prompt"
DROP_WRONG_SWARM = "wrong_swarm"
DROP_OVER_CAP = "over_peer_cap"
DROP_OWN_ECHO = "own_group"
DROP_REJECTED_BEFORE = "rejected_before"  # refused earlier for a reason that would recur (swarm_node.peers.rejects)
DROP_NONFINITE = "nonfinite_step"  # its samples made a training step non-finite
GATHER_ATTEMPTS = 8  # gathers of one step, at most (`gather_while_generating`)


def window_of(dht_time: float, window_seconds: float) -> int:
    return keys.window_of(dht_time, window_seconds)


@dataclass
class PeerBatch:
    samples: list[TrainSample] = field(default_factory=list)
    groups: int = 0
    verify_seconds: float = 0.0  # spent computing the peers' rewards
    newest_created_at: float | None = None  # DHT time the newest taken group was made
    crosstok_tokens: int = 0  # own tokens made from other tokenizers' texts (crosstok_receive), dropped included
    spot_metrics: dict[str, float] = field(default_factory=dict)  # spotcheck.SpotSession.metrics()


def group_key(parts: NodeParts, sender: str, policy_version: int, index: int) -> str:
    """The advantage group of a sample: one sender's completions of one prompt at one policy
    version, or, in horizontal collaboration, every generator's completions of the prompt."""
    if parts.config.swarm.collaboration == "horizontal":
        return f"h:{index}"  # the union of every generator's completions of this prompt
    return f"{sender}:{policy_version}:{index}"


# Fast tokenizers are not safe to call from two threads at once (a Rust "Already borrowed" error),
# and the gather thread decodes and renders while the step thread does: every use goes through here.
TOKENIZER_LOCK = threading.Lock()


def decode(parts: NodeParts, token_ids: np.ndarray) -> str:
    """A completion's text under this node's tokenizer, special tokens left out (thread-safe)."""
    with TOKENIZER_LOCK:
        return cast(str, parts.policy.tokenizer.decode(token_ids.tolist(), skip_special_tokens=True))


def render_prompts(parts: NodeParts, problems: Sequence[Problem]) -> list[list[int]]:
    """Prompt token ids of `problems` with this node's template (thread-safe)."""
    with TOKENIZER_LOCK:
        task = parts.config.task
        return [render_prompt(parts.policy.tokenizer, p.question, task.system_prompt, task.worked_example)
                for p in problems]


def peer_group_cap(own_groups: int, max_peer_fraction: float, max_peer_groups: int) -> int:
    """How many peer groups may join `own_groups` so that peers are at most `max_peer_fraction` of groups."""
    if max_peer_fraction >= 1.0:
        return max_peer_groups
    by_share = int(np.floor(own_groups * max_peer_fraction / (1.0 - max_peer_fraction) + 1e-9))
    return min(max_peer_groups, by_share)


def group_record_id(group: RolloutGroup) -> str:
    """A content id of a peer's group: sender, prompt, policy version and every completion's tokens
    and logprobs, and its text and pieces when sent (so a re-encoding of the same data has the same
    id, and any change a new one; a group without text keeps the id it had before text existed)."""
    h = hashlib.sha256()
    p = group.prompt
    for part in (group.sender, p.prompt_set_id, str(p.index), p.sha256, str(group.policy_version)):
        data = part.encode()
        h.update(len(data).to_bytes(4, "little") + data)
    for c in group.completions:
        tokens = np.asarray(c.token_ids, dtype="<u4").tobytes()
        logprobs = np.asarray(c.logprobs, dtype="<f4").tobytes()
        h.update(len(tokens).to_bytes(8, "little") + tokens + logprobs)
        if c.has_text:
            text = c.text.encode("utf-8", "surrogatepass")
            pieces = np.asarray(c.piece_bytes, dtype="<u2").tobytes()
            h.update(b"text" + len(text).to_bytes(8, "little") + text + len(pieces).to_bytes(8, "little") + pieces)
    return h.hexdigest()


def remember_poisoned(parts: NodeParts, samples: Iterable[TrainSample]) -> Counter[str]:
    """Blame the groups of peer samples blamed for a non-finite step (`Trainer.poisoned`): they were
    taken, so the ledger counts them as dropped late; returns the drops to count."""
    ids = {s.record_id: s.source for s in samples if s.is_peer and s.record_id}
    for record_id, sender in ids.items():
        blame(parts, sender, record_id, DROP_NONFINITE, late=True)
    return Counter({DROP_NONFINITE: len(ids)}) if ids else Counter()


def blame(parts: NodeParts, sender: str, record_id: str, reason: str, *, tokenizer: str = "",
          late: bool = False) -> None:
    """A group dropped for a reason that is its sender's fault and would recur: recorded in the peer
    ledger (`late`: a group counted as taken earlier, e.g. whose samples made a step non-finite), a
    fault of the sender in the admission (it lowers the sender's share; enough exclude it), and its
    record on the reject list, so it stays refused (also after a restart). The caller counts the drop."""
    if parts.ledger is not None:
        if late:
            parts.ledger.record_late_drop(sender, reason)
        else:
            parts.ledger.record_group(sender, reason, tokenizer)
    if parts.admission is not None:
        parts.admission.record(sender, reason)
        if not late:  # taken by the exchange in this gather: the take is withdrawn
            parts.admission.untake(sender, reason)
    if parts.rejects is not None and record_id:
        parts.rejects.add(record_id, reason)


def _record(parts: NodeParts, group: RolloutGroup, reason: str | None) -> None:
    """A group's fate in the peer ledger: taken (None) or dropped for a reason that is no fault (the
    exchange's take of it withdrawn: `Admission.untake`)."""
    if parts.ledger is not None:
        parts.ledger.record_group(group.sender, reason, group.tokenizer_fingerprint)
    if reason is not None and parts.admission is not None:
        parts.admission.untake(group.sender, reason)


def _known_problem(parts: NodeParts, ref: PromptRef) -> Problem | None:
    """The problem `ref` names in this node's prompt set or, during the handover after a switch, in the
    set it left (`NodeParts.ended_prompt_set`)."""
    ps, ended = parts.prompt_set, parts.ended_prompt_set
    if ref.prompt_set_id != ps.id and ended is not None and ref.prompt_set_id == ended[0].id \
            and parts.dht_time() < ended[1]:
        ps = ended[0]
    if ref.prompt_set_id != ps.id or not 0 <= ref.index < len(ps):
        return None
    problem = ps.problems[ref.index]
    return problem if problem.sha256 == ref.sha256 else None


@runtime_checkable
class PeerWorkerReward(Protocol):
    """A reward function with a separate worker for peers' answers (`tasks.rewards.CorrectnessReward`)."""

    def start_peer_worker(self) -> None: ...


def peer_verifier(parts: NodeParts) -> PeerVerifier:
    """A fresh verification budget for one gather (`task.peer_reward_budget_s`, `..._per_peer_s`)."""
    task = parts.config.task
    if isinstance(parts.reward_fn, PeerWorkerReward):
        parts.reward_fn.start_peer_worker()  # a no-op once running; else its startup overlaps the fetch
    return PeerVerifier(parts.reward_fn, task.peer_reward_budget_s, task.peer_reward_budget_per_peer_s)


def gather_peer_samples(parts: NodeParts, window: int, own_groups: int, seed: int, step: int
                        ) -> tuple[PeerBatch, Counter[str]]:
    """Fetch peers' groups and turn them into samples, rewards included: the whole of a step's
    peer work, run off the step thread (the node submits it at the start of the step, so it
    overlaps generation). `own_groups` sets the peer cap (`peer_group_cap`)."""
    sw, exchange = parts.config.swarm, parts.exchange
    if exchange is None:  # training alone: no peers to gather from
        return PeerBatch(), Counter()
    verifier = peer_verifier(parts)
    # Fetch no more than the step can use: groups over the peer cap would be fetched for nothing.
    max_groups = peer_group_cap(own_groups, sw.max_peer_fraction, sw.max_peer_groups_per_step)
    groups, fetch_drops = exchange.fetch_groups(
        current_window=window, staleness_windows=sw.staleness_steps, max_groups=max_groups,
        max_per_peer=sw.max_groups_per_peer, timeout=sw.fetch_timeout_s, rng=random.Random(seed))
    drops: Counter[str] = Counter(fetch_drops)
    if exchange.tokenizers.statuses_due(parts.dht_time()):  # every swarm.record_ttl_s / 3
        # notes the swarm's tokenizers and the receipts naming this node; bad records: dropped_status_<reason>
        exchange.read_statuses(timeout=sw.fetch_timeout_s / 4, drops=drops)
    return peer_samples(parts, groups, max_groups, drops, step, verifier, spot_session(parts, seed)), drops


def gather_while_generating(parts: NodeParts, window: int, own_groups: int, seed: int, step: int,
                            generated: threading.Event) -> tuple[PeerBatch, Counter[str]]:
    """`gather_peer_samples`, and while the step still generates (`generated` not set), again
    every half window in the window of that moment when a gather took no group, at most
    GATHER_ATTEMPTS times. Found by the soak: on a loaded 48-peer swarm every index read of a
    gather timed out now and then; a node stepping every few seconds just took peers' groups at
    its next step, but the slow and SmolLM2 nodes, one gather per 3-6 minute step, took none in
    most of their steps."""
    drops: Counter[str] = Counter()
    half_window = parts.config.swarm.window_seconds / 2
    for attempt in range(GATHER_ATTEMPTS):
        batch, more = gather_peer_samples(parts, window, own_groups, seed + attempt, step)
        drops.update(more)
        if batch.groups or attempt + 1 == GATHER_ATTEMPTS or generated.wait(half_window):
            break
        window = window_of(parts.dht_time(), parts.config.swarm.window_seconds)
    return batch, drops


def spot_session(parts: NodeParts, seed: int) -> SpotSession | None:
    """A step's logprob spot-checks (`swarm.spot_check`), None when the node has no checker."""
    return parts.spot_checker.session(seed) if parts.spot_checker is not None else None


def peer_samples(parts: NodeParts, groups: Sequence[RolloutGroup], max_groups: int, drops: Counter[str],
                 step: int, verifier: PeerVerifier | None = None, spot: SpotSession | None = None) -> PeerBatch:
    """Check peers' groups against this node's state, spot-check their logprobs when this node holds
    the declared model (`spot`, a fresh session of the node's checker by default), recompute rewards
    (within `verifier`'s time budget, a fresh one by default), keep at most `max_groups`."""
    verifier = verifier or peer_verifier(parts)
    spot = spot or spot_session(parts, step)
    batch = PeerBatch()
    for group in groups:
        admitted = _admit(parts, group, batch.groups, max_groups)
        if isinstance(admitted, str):
            drops[admitted] += 1
            if admitted != DROP_OWN_ECHO:  # this node is no peer of its own
                _record(parts, group, admitted)
            continue
        problem, record_id = admitted
        if spot is not None and spot.check(group, problem) == LOGPROB_MISMATCH:
            drops[LOGPROB_MISMATCH] += 1
            blame(parts, group.sender, record_id, LOGPROB_MISMATCH, tokenizer=group.tokenizer_fingerprint)
            continue
        received = None
        if group.tokenizer_fingerprint != parts.policy.fingerprint:  # accepted by _group_reason: convert it
            if not _text_bound(parts, group, verifier):
                drops[DROP_TEXT_TOKEN_MISMATCH] += 1
                blame(parts, group.sender, record_id, DROP_TEXT_TOKEN_MISMATCH, tokenizer=group.tokenizer_fingerprint)
                continue
            received, reason = _receive_foreign(parts, group, verifier)
            batch.crosstok_tokens += received.own_tokens if received is not None else 0
            if reason is not None:
                drops[reason] += 1
                _record(parts, group, reason)
                continue
            texts = [c.text for c in group.completions]
        else:
            token_ids = [np.array(c.token_ids, dtype=np.int64) for c in group.completions]
            texts = [decode(parts, ids) for ids in token_ids]
        verdict = verifier.group_rewards(texts, problem, group.sender)
        batch.verify_seconds += verdict.seconds
        if verdict.rewards is None:
            reason = verdict.reason or VERIFY_BUDGET
            drops[reason] += 1
            if verdict.blamed:  # a verifier timeout on every completion: it would time out again
                blame(parts, group.sender, record_id, reason, tokenizer=group.tokenizer_fingerprint)
            else:
                _record(parts, group, reason)
            continue
        # The prompt is rendered with this node's own template: the node trains its own policy.
        prompt = np.asarray(render_prompts(parts, [problem])[0], dtype=np.int64)
        key = group_key(parts, group.sender, group.policy_version, problem.index)
        if received is not None:
            batch.samples += train_samples(received.views, verdict.rewards, prompt_ids=prompt, group_key=key,
                                           source=group.sender, record_id=record_id)
        else:
            for c, ids, reward in zip(group.completions, token_ids, verdict.rewards, strict=True):
                batch.samples.append(TrainSample(
                    group_key=key, prompt_ids=prompt, completion_ids=ids,
                    generator_logprobs=np.array(c.logprobs, dtype=np.float32),  # a writable copy
                    reward=reward, is_peer=True, source=group.sender, record_id=record_id))
        batch.groups += 1
        _record(parts, group, None)
        if batch.newest_created_at is None or group.created_at > batch.newest_created_at:
            batch.newest_created_at = group.created_at
    if spot is not None:
        batch.spot_metrics = spot.metrics()
    return batch


def _admit(parts: NodeParts, group: RolloutGroup, taken: int, max_groups: int) -> tuple[Problem, str] | str:
    """(the group's problem, its record id), or the reason it is dropped before any work on it."""
    reason = _group_reason(parts, group)
    if reason is not None:
        return reason
    problem = _known_problem(parts, group.prompt)
    if problem is None:
        return DROP_UNKNOWN_PROMPT
    if taken >= max_groups:
        return DROP_OVER_CAP
    record_id = group_record_id(group)
    if parts.rejects is not None and record_id in parts.rejects:
        return DROP_REJECTED_BEFORE
    return problem, record_id


def _group_reason(parts: NodeParts, group: RolloutGroup) -> str | None:
    """Checks that need this node's identity, swarm and tokenizer (the exchange checked the rest)."""
    if group.sender == parts.peer_id:
        return DROP_OWN_ECHO
    if group.swarm_id != parts.config.swarm.swarm_id:
        return DROP_WRONG_SWARM
    if group.tokenizer_fingerprint != parts.policy.fingerprint and not _cross_tokenizer(parts, group):
        return DROP_TOKENIZER  # per-token weights would compare different token streams
    return None


def _receive_foreign(parts: NodeParts, group: RolloutGroup, verifier: PeerVerifier
                     ) -> tuple[ReceivedGroup | None, str | None]:
    """Another tokenizer's group in this node's tokens, within the step's peer budgets: its
    conversion time counts in the verification budget (`verifier`), its own tokens beyond the
    sender's (a finer tokenizer) in the admission's token budget, and no completion may exceed
    `CROSSTOK_MAX_TOKENS_FACTOR` x this node's `generation.max_new_tokens` own tokens."""
    if verifier.left(group.sender) <= 0:
        return None, VERIFY_BUDGET
    cap = CROSSTOK_MAX_TOKENS_FACTOR * parts.config.generation.max_new_tokens
    start = time.monotonic()
    with TOKENIZER_LOCK:
        received = receive_group(parts.policy.tokenizer, parts.policy.stop_token_ids[0], group.completions,
                                 max_own_tokens=cap)
    verifier.charge(group.sender, time.monotonic() - start)
    if received.reason is not None:
        return received, received.reason
    extra = received.own_tokens - group.num_tokens
    if extra > 0 and parts.admission is not None and not parts.admission.charge_tokens(extra):
        return received, OVER_TOKEN_BUDGET
    return received, None


def _text_bound(parts: NodeParts, group: RolloutGroup, verifier: PeerVerifier) -> bool:
    """False when this node holds the sender's tokenizer (a spot-check reference of the group's
    fingerprint) and some completion's text is not what it makes of the tokens; True otherwise
    (checked and bound, or not checkable). The time counts in the verification budget."""
    references = getattr(parts.spot_checker, "references", ())  # spotcheck.SpotChecker's references
    tokenizer = held_tokenizer(references, group.tokenizer_fingerprint)
    if tokenizer is None:
        return True
    start = time.monotonic()
    bound = texts_match_tokens(tokenizer, group.completions)
    verifier.charge(group.sender, time.monotonic() - start)
    return bound


def _cross_tokenizer(parts: NodeParts, group: RolloutGroup) -> bool:
    """Whether a group from another tokenizer can be taken: `swarm.cross_tokenizer` is on and every
    completion carries its text's piece byte lengths, one per token (a sender that does not send
    its texts sends none)."""
    return parts.config.swarm.cross_tokenizer and all(c.has_text for c in group.completions)
