"""Greedy pass@1 evaluation of a causal LM on a prompt set.

Works with any Hugging Face causal LM and tokenizer: prompts are rendered with the task's
`render_prompt`, grouped by length into left-padded batches, decoded greedily (`do_sample=False`)
until an end-of-sequence token or `max_new_tokens`, and scored with the task's reward function. A
problem counts as correct when the reward function says the answer is right (`score().correct` when it has one,
else reward >= 1), so a format bonus never turns a wrong answer into a correct one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from swarm_node.tasks.base import Problem, PromptSet, RewardFn
from swarm_node.tasks.prompts import render_prompt

COMPLETION_CHARS = 500  # completion text kept per record


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the model's generation config (chat models often list several) plus the tokenizer's."""
    ids: list[int] = []
    gen_cfg = getattr(model, "generation_config", None)
    for value in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("neither the model nor the tokenizer defines an end-of-sequence token")
    return ids


def trim_completion(tokens: Sequence[int], stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first stop token, and whether one was found."""
    stops = set(stop_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return list(tokens[: i + 1]), True
    return list(tokens), False


MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a second forward pass


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
def generate_greedy(
    model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, device: str | torch.device,
    share_prefix: bool = True,
) -> list[tuple[list[int], bool]]:
    """Greedy completions for one batch: per prompt, (completion tokens incl. the stop token, stopped).

    Prompts of one task share a long prefix (chat template, instruction, worked example): with
    `share_prefix` its keys and values are computed once and repeated over the batch, which removes
    most of the prefill (the dominant cost of short greedy answers on a CPU). The completions are
    those of the plain left-padded batch up to floating-point summation order."""
    stops = stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    shared = shared_prefix_len(prompts) if share_prefix and len(prompts) > 1 else 0
    shared = shared if shared >= MIN_SHARED_PREFIX else 0
    ids, mask = prefix_then_pad(prompts, shared, pad_id)  # [B, P + W]; P = 0: plain left padding
    kwargs: dict[str, Any] = {}
    if shared:
        cache = model(input_ids=ids[:1, :shared].to(device), use_cache=True).past_key_values  # [1, P] keys/values
        cache.batch_repeat_interleave(len(prompts))
        kwargs["past_key_values"] = cache
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops,
        pad_token_id=pad_id,
        temperature=None,
        top_p=None,
        top_k=None,
        **kwargs,
    )  # [B, L + T']
    new = out[:, ids.shape[1]:].tolist()
    return [trim_completion(row, stops) for row in new]


def _is_correct(reward_fn: RewardFn, text: str, problem: Problem) -> tuple[bool, float]:
    score = getattr(reward_fn, "score", None)
    if callable(score):
        s = score(text, problem)
        return bool(s.correct), float(s.reward)
    reward = float(reward_fn(text, problem))
    return reward >= 1.0, reward


def _progress(progress: bool, total: int) -> Any:
    if not progress:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415

    bar = Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TextColumn("acc {task.fields[acc]:.3f}"),
                   TimeRemainingColumn())
    bar.start()
    bar.add_task("eval", total=total, acc=0.0)
    return bar


def evaluate(
    model: Any,
    tokenizer: Any,
    prompt_set: PromptSet,
    reward_fn: RewardFn,
    *,
    limit: int | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    device: str | torch.device = "cpu",
    system_prompt: str | None = None,
    worked_example: bool = False,
    progress: bool = True,
    by_length: bool = True,
) -> dict[str, Any]:
    """Greedy pass@1 on the first `limit` problems (all when None).

    `by_length`: batches are made of prompts of similar length (the problems sorted by prompt length,
    stably), so a batch pads to little more than its own prompts; the records keep the problems'
    order. The completions are those of batches in the set's order up to floating-point summation
    order (benchmarks/eval_batches.py compares both).

    Returns accuracy, n, correct, seconds, generated_tokens, tokens_per_s, truncated (hit
    max_new_tokens) and `records`: per problem, in the set's order, {index, correct, reward, tokens,
    stopped, completion (first COMPLETION_CHARS characters)}."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    problems = prompt_set.problems[: limit if limit is not None else len(prompt_set)]
    was_training = bool(getattr(model, "training", False))
    model.eval()
    slots: list[dict[str, Any] | None] = [None] * len(problems)
    tokens = correct = done = 0
    bar = _progress(progress, len(problems))
    start = time.perf_counter()
    try:
        prompts = [render_prompt(tokenizer, p.question, system_prompt, worked_example) for p in problems]
        order = sorted(range(len(problems)), key=lambda i: len(prompts[i])) if by_length else list(range(len(problems)))
        for b in range(0, len(order), batch_size):
            batch = order[b: b + batch_size]
            completions = generate_greedy(model, tokenizer, [prompts[i] for i in batch], max_new_tokens, device)
            for i, (completion, stopped) in zip(batch, completions, strict=True):
                text = tokenizer.decode(completion, skip_special_tokens=True)
                ok, reward = _is_correct(reward_fn, text, problems[i])
                tokens += len(completion)
                correct += int(ok)
                slots[i] = {"index": problems[i].index, "correct": ok, "reward": reward, "tokens": len(completion),
                            "stopped": stopped, "completion": text[:COMPLETION_CHARS]}
            done += len(batch)
            if bar is not None:
                bar.update(bar.task_ids[0], advance=len(batch), acc=correct / done)
    finally:
        if bar is not None:
            bar.stop()
        if was_training:
            model.train()
    seconds = time.perf_counter() - start
    records = [r for r in slots if r is not None]
    n = len(records)
    return {
        "task": prompt_set.id,
        "accuracy": correct / n if n else 0.0,
        "n": n,
        "correct": correct,
        "seconds": seconds,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "truncated": sum(1 for r in records if not r["stopped"]),
        "records": records,
    }
