"""Realistic synthetic rollout groups for transport tests and benchmarks (no model needed).

Token ids follow a Zipf law over the vocabulary (as text does) and logprobs look like a language
model's sampled-token logprobs: most tokens near 0, a heavy tail of unlikely ones. Sizes and
compressibility therefore match real groups closely enough to measure the wire and the DHT.
"""

from __future__ import annotations

import hashlib

import numpy as np

from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams


def synthetic_group(
    rng: np.random.Generator,
    *,
    swarm_id: str,
    sender: str,
    created_at: float,
    prompt_index: int = 0,
    policy_version: int = 0,
    group_size: int = 8,
    tokens: int = 256,
    vocab_size: int = 49_152,
    prompt_set_id: str = "synthetic-0",
    tokenizer_fingerprint: str = "synthetic-tokenizer",
) -> RolloutGroup:
    """One group of `group_size` completions of `tokens` tokens each."""
    completions = []
    for _ in range(group_size):
        ids = (rng.zipf(1.2, size=tokens) - 1) % vocab_size  # [T] Zipf-distributed token ids
        # [T] sampled-token logprobs: ~70% confident tokens, the rest from a long tail
        confident = rng.random(tokens) < 0.7
        logprobs = np.where(confident, -rng.exponential(0.05, tokens), -rng.exponential(2.5, tokens))
        completions.append(Completion(
            token_ids=ids.astype(np.uint32), logprobs=logprobs.astype(np.float32),
            finish_reason="length", claimed_reward=float(rng.random() < 0.5),
        ))
    question = f"synthetic problem {prompt_index}"
    return RolloutGroup(
        swarm_id=swarm_id, sender=sender, model_id="synthetic/model", model_revision="0",
        tokenizer_fingerprint=tokenizer_fingerprint, policy_version=policy_version, created_at=created_at,
        prompt=PromptRef(prompt_set_id=prompt_set_id, index=prompt_index,
                         sha256=hashlib.sha256(question.encode()).hexdigest()),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=tokens),
        completions=tuple(completions),
    )
