"""This node's own rollouts, between generation, the wire and the trainer: own completions are
scored and become training samples (`own_samples`) and the wire groups peers fetch
(`to_wire_groups`), with every completion's text and piece bytes when the swarm needs them
(`sends_text`: `swarm.send_text`). A slow node's pacing (docs/architecture.md, "Slow nodes"): how
many prompts one generate call takes so that groups are published while peers read them
(`Pacing`), their concatenation (`concat`), and what to say when some were not (`stale_advice`).

Peers' groups go the other way in `peer_rollouts.py`, which also holds what both sides use
(`TOKENIZER_LOCK`, `decode`, `group_key`). Both see the node through `parts.NodeParts`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast
import numpy as np

from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.config.swarm import SwarmConfig
from swarm_node.policy.pieces import faithful_prefix
from swarm_node.policy.types import GeneratedCompletion, TrainSample
from swarm_node.node.parts import NodeParts
from swarm_node.node.peer_rollouts import TOKENIZER_LOCK, decode, group_key
from swarm_node.tasks.base import Problem


@dataclass
class OwnBatch:
    samples: list[TrainSample] = field(default_factory=list)
    rewards: list[list[float]] = field(default_factory=list)  # [prompt][completion]
    text_groups: int = 0  # wire groups sent with completion text (swarm.send_text)
    text_withheld: int = 0  # groups sent without text: some completion had no faithful prefix (policy/pieces.py)
    text_trimmed: int = 0  # completions sent as their longest prefix with faithful text (cut mid-character)

    @property
    def reward_mean(self) -> float:
        flat = [r for group in self.rewards for r in group]
        return float(np.mean(flat)) if flat else 0.0

    @property
    def accuracy(self) -> float:
        """Fraction of completions with full correctness credit (reward >= 1)."""
        flat = [r for group in self.rewards for r in group]
        return float(np.mean([r >= 1.0 for r in flat])) if flat else 0.0

    @property
    def mixed_fraction(self) -> float:
        """Fraction of groups whose rewards are not all equal: the groups GRPO learns from."""
        return float(np.mean([len(set(g)) > 1 for g in self.rewards])) if self.rewards else 0.0


def concat(batches: Sequence[OwnBatch]) -> OwnBatch:
    """A step's own batch from those of its sub-batches (a slow node's, `loop.Node.generate_step`), in
    their order: its accuracy, reward_mean and mixed_fraction are over all the step's groups."""
    if len(batches) == 1:
        return batches[0]
    return OwnBatch(samples=[s for b in batches for s in b.samples], rewards=[r for b in batches for r in b.rewards],
                    text_groups=sum(b.text_groups for b in batches),
                    text_withheld=sum(b.text_withheld for b in batches),
                    text_trimmed=sum(b.text_trimmed for b in batches))


def own_samples(parts: NodeParts, problems: Sequence[Problem], prompt_ids: Sequence[Sequence[int]],
                completions: Sequence[Sequence[GeneratedCompletion]], step: int, window: int) -> OwnBatch:
    """Score own completions and turn them into samples (generator logprobs come from the sampler)."""
    batch = OwnBatch()
    for problem, prompt, group in zip(problems, prompt_ids, completions, strict=True):
        key = group_key(parts, "self", step, problem.index)
        rewards = []
        for c in group:
            reward = float(parts.reward_fn(decode(parts, c.token_ids), problem))
            rewards.append(reward)
            batch.samples.append(TrainSample(
                group_key=key, prompt_ids=np.asarray(prompt, dtype=np.int64),
                completion_ids=np.asarray(c.token_ids, dtype=np.int64),
                generator_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                reward=reward, is_peer=False, source="self"))
        batch.rewards.append(rewards)
    return batch


def to_wire_groups(parts: NodeParts, problems: Sequence[Problem], completions: Sequence[Sequence[GeneratedCompletion]],
                   own: OwnBatch, step: int, created_at: float) -> list[RolloutGroup]:
    """The wire form of this step's own groups (claimed rewards are informational for peers).
    `created_at`: the DHT time the step started, whose window binds its prompts (swarm/binding.py).
    With text (`sends_text`), every completion carries its text and piece bytes, or none does."""
    cfg, policy = parts.config, parts.policy
    sampling = SamplingParams(temperature=cfg.generation.temperature, top_p=cfg.generation.top_p,
                              max_new_tokens=cfg.generation.max_new_tokens)
    with_text = sends_text(parts)
    groups = []
    for problem, group, rewards in zip(problems, completions, own.rewards, strict=True):
        comps = [Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                            claimed_reward=r) for c, r in zip(group, rewards, strict=True)]
        if with_text:
            comps = _with_text(parts, comps, own)
        groups.append(RolloutGroup(
            swarm_id=cfg.swarm.swarm_id, sender=parts.peer_id, model_id=policy.model_id,
            model_revision=policy.declared_revision, adapter_digest=policy.adapter_digest,
            tokenizer_fingerprint=policy.fingerprint,
            policy_version=step, created_at=created_at,
            prompt=PromptRef(prompt_set_id=parts.prompt_set.id, index=problem.index, sha256=problem.sha256),
            sampling=sampling, completions=tuple(comps),
        ))
    return groups


def sends_text(parts: NodeParts) -> bool:
    """`swarm.send_text`: always, never, or (auto) while another tokenizer is seen in the swarm or
    no peer's tokenizer is known yet (`swarm.tokenizers.TokenizerCensus.wants_text`)."""
    mode = parts.config.swarm.send_text
    if mode != "auto":
        return mode == "always"
    return parts.exchange is not None and parts.exchange.tokenizers.wants_text(parts.dht_time())


def _with_text(parts: NodeParts, comps: list[Completion], own: OwnBatch) -> list[Completion]:
    """`comps` with text and piece bytes; a completion without faithful text as a whole (cut
    mid-character by the token cap, a stray byte) is sent as its longest prefix that has one
    (`policy.pieces.faithful_prefix`, finish_reason "length"); `comps` unchanged when some
    completion has no faithful prefix at all."""
    with TOKENIZER_LOCK:
        found = [faithful_prefix(parts.policy.tokenizer, c.token_ids) for c in comps]
    if any(f is None for f in found):
        own.text_withheld += 1
        return comps
    own.text_groups += 1
    out = []
    for c, (k, text, pieces) in zip(comps, cast(list[tuple[int, str, np.ndarray]], found), strict=True):
        if k < len(c.token_ids):
            own.text_trimmed += 1
            c = dataclasses.replace(c, token_ids=c.token_ids[:k], logprobs=c.logprobs[:k], finish_reason="length")
        out.append(dataclasses.replace(c, text=text, piece_bytes=pieces))
    return out


# ---- a slow node's pacing (docs/architecture.md, "Slow nodes") ----------------------------------

GEN_TIME_EMA_WEIGHT = 0.5  # the weight of a step's measured generation time per group in its average


def sub_batch_size(n: int, seconds_per_group: float | None, fresh_s: float) -> int:
    """How many of a step's `n` prompts one generate call takes: all of them while they fit the
    freshness bound `fresh_s` at `seconds_per_group` (or nothing was measured yet), else as many as
    take at most half of it, at least 1."""
    if seconds_per_group is None or n * seconds_per_group <= fresh_s:
        return n
    return max(1, min(n, math.floor(fresh_s / 2 / seconds_per_group)))


@dataclass
class Pacing:
    """A node's generation time per group (DHT time, scoring and publishing included), a moving
    average over past steps, and the sub-batches it implies. Groups of window w are read by peers
    until window w + staleness_steps + 1 begins: about `fresh_s` after their step's start."""

    staleness_steps: int
    window_seconds: float
    seconds_per_group: float | None = None  # none before the first step

    @property
    def fresh_s(self) -> float:
        return self.staleness_steps * self.window_seconds

    def remember(self, seconds_per_group: float) -> None:
        previous = self.seconds_per_group
        self.seconds_per_group = seconds_per_group if previous is None else (
            GEN_TIME_EMA_WEIGHT * seconds_per_group + (1 - GEN_TIME_EMA_WEIGHT) * previous)

    def sub_batch_end(self, start: int, n: int, window: int, now: float) -> int:
        """The end of the sub-batch of a step's prompts (of window `window`) from `start` at DHT time
        `now`: all n while they fit; else `sub_batch_size` of them, fewer when fewer can still be
        complete before the step's groups go stale, and all the rest once no further group can
        (then they are generated for training only)."""
        per_group = self.seconds_per_group
        size = sub_batch_size(n, per_group, self.fresh_s)
        if per_group is None or size >= n:
            return n  # the whole step fits (or nothing was measured yet): one call
        fresh_until = (window + self.staleness_steps + 1) * self.window_seconds
        in_time = math.floor((fresh_until - now) / per_group)
        return n if in_time < 1 else min(n, start + min(size, in_time))


@dataclass
class Published:
    """A step's publishing of its own groups so far (`loop.Node.generate_step`)."""

    groups: int = 0
    stale: int = 0  # complete only after peers stop reading them: not published
    bytes: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else 0.0


def stale_advice(sw: SwarmConfig, stale: int, n: int, elapsed: float) -> str:
    """The warning for `stale` of a step's `n` own groups complete too late to publish, the step's
    generation having taken `elapsed` seconds: what this node, or the swarm, should change."""
    bound, per_group = sw.staleness_steps * sw.window_seconds, elapsed / n
    reads = (f"peers read a group for at most {bound:.0f} s after its step began (swarm.staleness_steps="
             f"{sw.staleness_steps} x swarm.window_seconds={sw.window_seconds:g} s)")
    swarm_wide = "or raise swarm.window_seconds or swarm.staleness_steps on every node of the swarm"
    if per_group > bound:
        return (f"{stale} own groups not published: one group takes about {per_group:.0f} s to generate here, but "
                f"{reads}, so this node gives the swarm nothing (it still trains on its own groups). Lower "
                f"generation.max_new_tokens or generation.group_size on this node (or run it with more threads "
                f"or a smaller model), {swarm_wide}.")
    fits = max(1, math.floor(bound / per_group)) if per_group > 0 else n
    return (f"{stale} of this step's {n} own groups not published: its {n} prompts took {elapsed:.0f} s (about "
            f"{per_group:.0f} s a group), but {reads}; it still trains on them, and publishes the groups it "
            f"completes in time in sub-batches. To publish every group, set train.prompts_per_step={fits} on this "
            f"node (with swarm.peer_prompts_per_step set to the swarm's n), or lower generation.max_new_tokens "
            f"or generation.group_size, {swarm_wide}.")
