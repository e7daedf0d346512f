"""Greedy decoding with a Hugging Face causal LM, in batches: the `hf` backend's `greedy`
(`HFGenerator.greedy`), which held-out evaluation calls (`swarm_node.evaluation.evaluate`).

A batch is left-padded; prompts of one task share a long prefix (chat template, instruction, worked
example), and with `share_prefix` its keys and values are computed once and repeated over the
batch, which removes most of the prefill (the dominant cost of short greedy answers on a CPU). The
completions are those of the plain left-padded batch up to floating-point summation order. A
completion ends at the first stop token (kept, finish 'stop') or after `max_new_tokens` tokens
(finish 'length'); the stop set is the caller's (`Policy.stop_token_ids`, the one rule of
sampling, evaluation and scoring).

One greedy on every backend: transformers fills each generation setting a call leaves unset (None)
from the model's own `generation_config.json` (a repetition penalty, `no_repeat_ngram_size`, suppressed
tokens, stop strings: Qwen2.5 Instruct models ship a repetition penalty above 1), so `generate` here
runs with a fresh `GenerationConfig` in the model's place (`fresh_generation_config`) and the node's
own settings (`pinned_config`): every logits processor off, the greedy completion is plain argmax
decoding, as vLLM's greedy with explicit `SamplingParams` on an engine that ignores the model's
generation config (`vllm_engine.engine_kwargs`). The sampling generator (`generation.HFGenerator`)
runs under the same rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig as HFGenerationConfig

from swarm_node.policy.types import GreedyCompletion

ROUND_BATCHES = 8  # batches per greedy generator call in evaluation: the progress bar's unit (vLLM schedules a call's prompts together)
MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a second forward pass


# Every generation setting that turns on a logits processor or a stopping rule, at the value that turns
# it off (transformers 5.19's `_get_logits_processor` and stopping criteria): what the node does not choose.
NEUTRAL_SETTINGS: dict[str, Any] = {
    "num_beams": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None, "bad_words_ids": None,
    "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "exponential_decay_length_penalty": None, "renormalize_logits": False,
    "remove_invalid_values": False, "guidance_scale": None, "watermarking_config": None, "stop_strings": None,
    "max_time": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None,
    "bos_token_id": None, "use_cache": True,
}


def pinned_config(**chosen: Any) -> HFGenerationConfig:
    """A fresh GenerationConfig: the node's `chosen` settings, every other one at NEUTRAL_SETTINGS."""
    return HFGenerationConfig(**{**NEUTRAL_SETTINGS, **chosen})


@contextlib.contextmanager
def fresh_generation_config(model: Any) -> Iterator[None]:
    """While the block runs, the model's `generation_config` (from its generation_config.json) is a
    fresh one, so transformers fills unset settings from its global defaults, never from the model's
    file (`GenerationMixin._prepare_generation_config`). A peft model generates through its base."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = target.generation_config
    target.generation_config = HFGenerationConfig()
    try:
        yield
    finally:
        target.generation_config = saved


def trim_completion(tokens: Sequence[int], stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first stop token, and whether one was found."""
    stops = set(stop_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return list(tokens[: i + 1]), True
    return list(tokens), False


def shared_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix every prompt starts with, leaving each prompt at least one token of
    its own (the first generated token is predicted from the prompt's last position)."""
    if not prompts:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def prefix_then_pad(prompts: Sequence[Sequence[int]], prefix_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids [B, P + W] and attention mask (1 on real tokens): the shared prefix (P tokens), then
    padding, then each prompt's own suffix, so every suffix ends at the last column and the prefix
    sits at the same positions in every row (its keys and values can be computed once). With
    `prefix_len` 0 this is plain left padding (`left_pad`)."""
    suffixes = [list(p[prefix_len:]) for p in prompts]
    width = max(len(s) for s in suffixes)
    prefix = list(prompts[0][:prefix_len])
    ids = torch.full((len(prompts), prefix_len + width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(suffixes):
        ids[row, :prefix_len] = torch.tensor(prefix, dtype=torch.long)
        mask[row, :prefix_len] = 1
        if s:
            ids[row, prefix_len + width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[row, prefix_len + width - len(s):] = 1
    return ids, mask


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded input ids [B, L] and attention mask [B, L] (1 on real tokens)."""
    return prefix_then_pad(prompts, 0, pad_id)


@torch.no_grad()
def greedy_batch(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, stop_ids: Sequence[int],
                 pad_id: int, device: str | torch.device, share_prefix: bool = True) -> list[GreedyCompletion]:
    """Greedy completions of one batch of prompts (the model in eval mode), in the prompts' order."""
    stops = [int(s) for s in stop_ids]
    shared = shared_prefix_len(prompts) if share_prefix and len(prompts) > 1 else 0
    shared = shared if shared >= MIN_SHARED_PREFIX else 0
    ids, mask = prefix_then_pad(prompts, shared, pad_id)  # [B, P + W]; P = 0: plain left padding
    kwargs: dict[str, Any] = {}
    if shared:
        cache = model(input_ids=ids[:1, :shared].to(device), use_cache=True).past_key_values  # [1, P] keys/values
        cache.batch_repeat_interleave(len(prompts))
        kwargs["past_key_values"] = cache
    config = pinned_config(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=pad_id)
    with fresh_generation_config(model):
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                             **kwargs)  # [B, L + T']
    completions = []
    for row in out[:, ids.shape[1]:].tolist():
        tokens, stopped = trim_completion(row, stops)
        completions.append(GreedyCompletion(token_ids=np.asarray(tokens, dtype=np.int64),
                                            finish_reason="stop" if stopped else "length"))
    return completions


def greedy(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, batch_size: int,
           stop_ids: Sequence[int], pad_id: int, device: str | torch.device,
           share_prefix: bool = True) -> list[GreedyCompletion]:
    """Greedy completions of every prompt, `batch_size` consecutive prompts per batch, in the
    prompts' order; the model runs in eval mode and gets its training flag back."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    prompts = [[int(t) for t in p] for p in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: a completion needs at least one prompt token")
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        out: list[GreedyCompletion] = []
        for start in range(0, len(prompts), batch_size):
            out += greedy_batch(model, prompts[start: start + batch_size], max_new_tokens, stop_ids=stop_ids,
                                pad_id=pad_id, device=device, share_prefix=share_prefix)
        return out
    finally:
        model.train(was_training)
