"""This node's own rollouts, between generation, the wire and the trainer: own completions are
scored and become training samples (`own_samples`) and the wire groups peers fetch
(`to_wire_groups`), with every completion's text and piece bytes when the swarm needs them
(`sends_text`: `swarm.send_text`).

Peers' groups go the other way in `peer_rollouts.py`, which also holds what both sides use
(`TOKENIZER_LOCK`, `decode`, `group_key`). Both see the node through `parts.NodeParts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast
import numpy as np

from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
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
