"""Types shared by generation, training and the node loop (not wire types: see protocol/)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import numpy as np

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GeneratedCompletion:
    """One sampled completion.

    token_ids: int64 [T], the sampled tokens (stop token included when finish_reason == "stop").
    logprobs:  float32 [T], log pi_gen(token_t | prompt, tokens_<t) under the sampling
               distribution actually used (temperature applied; top_p < 1 is refused).
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: FinishReason


@dataclass(frozen=True)
class TrainSample:
    """One completion ready for the objective. Samples sharing `group_key` form one advantage group.

    prompt_ids:         int64 [P]
    completion_ids:     int64 [T]
    generator_logprobs: float32 [T], sampled-token logprobs under the generating policy pi_gen; for a
                        sample generated with another tokenizer, per-token shares of the chunks'
                        logprobs: log pi_gen(chunk) on the chunk's last token, 0 on its others
    reward:             recomputed locally, never a peer's claim
    is_peer:            True when another node generated it (filters apply by scope)
    source:             "self" or the generating peer's id
    record_id:          peer samples: the id of the wire group they came from (rollouts.group_record_id)
    chunk_ids:          int64 [T] or None: for a sample generated with another tokenizer, the chunk
                        of aligned text each own token belongs to (nondecreasing from 0,
                        `swarm_node.method.crosstok`); None when the generator's tokens are these tokens
    """

    group_key: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    generator_logprobs: np.ndarray
    reward: float
    is_peer: bool
    source: str = "self"
    record_id: str = ""
    chunk_ids: np.ndarray | None = None


class SampleStat(NamedTuple):
    """What the trainer measured of one peer sample (`Trainer.peer_sample_stats`; the node's peer
    ledger attributes them per sender).

    kl and is_weight are None for a sample that was not scored (no tokens); crosstok: the sample
    came from another tokenizer (re-tokenized, trained per chunk); filtered_advantage / filtered_kl:
    the filter dropped it and it met the advantage condition (A <= 0) / the KL condition (KL > g),
    possibly both (what a receipt tells its sender, `swarm_node.peers.receipts`)."""

    peer: str
    reward: float
    kl: float | None
    is_weight: float | None
    filtered: bool
    gradient: bool
    crosstok: bool = False
    filtered_advantage: bool = False
    filtered_kl: bool = False


@dataclass(frozen=True)
class GreedyCompletion:
    """One greedy (argmax) completion, as held-out evaluation decodes it.

    token_ids: int64 [T], stop token included when finish_reason == "stop" (`Policy.stop_token_ids`,
               the same stop set as sampling).
    """

    token_ids: np.ndarray
    finish_reason: FinishReason


def check_prompts(prompt_ids: Sequence[Sequence[int]], max_prompt_tokens: int) -> list[list[int]]:
    """The prompt rule of every `Generator.generate`: the prompts as int lists; an empty prompt, or
    one longer than `generation.max_prompt_tokens` (the node checks its prompt set against it at
    start: `tasks.prompt_lengths`), is a ValueError."""
    prompts = [[int(t) for t in p] for p in prompt_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: a completion needs at least one prompt token")
    longest = max((len(p) for p in prompts), default=0)
    if longest > max_prompt_tokens:
        raise ValueError(f"a prompt of {longest} tokens exceeds generation.max_prompt_tokens={max_prompt_tokens}")
    return prompts


class Generator(Protocol):
    """A generation backend. Sampling settings are fixed at construction (GenerationConfig)."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int) -> list[list[GeneratedCompletion]]:
        """Sample `n` completions for each prompt; returns one list of n completions per prompt."""
        ...

    def greedy(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
               batch_size: int) -> list[GreedyCompletion]:
        """Greedy completions of at most `max_new_tokens` tokens, one per prompt, in the prompts'
        order, with the current weights (held-out evaluation). `batch_size`: prompts decoded together
        where the backend batches itself (hf: consecutive prompts, so a caller that sorts them by
        length pads little); vLLM's scheduler batches on its own and ignores it."""
        ...

    def sync_weights(self, model: object) -> None:
        """Make subsequent generations use the trainer's current weights."""
        ...

    def close(self) -> None: ...
