"""Greedy pass@1 evaluation of a model on a prompt set, through the node's generator.

Prompts are rendered with the task's `render_prompt`, ordered by length (so a batch pads to little
more than its own prompts), decoded greedily by the generator (`Generator.greedy`: the hf backend's
batched loop in `swarm_node.policy.greedy`, or vLLM at temperature 0) until a stop token
(`Policy.stop_token_ids`, the stop rule of sampling too) or `max_new_tokens`, and scored with the
task's reward function. A problem counts as correct when the reward function says the answer is
right (`score().correct` when it has one, else reward >= 1), so a format bonus never turns a wrong
answer into a correct one.
"""

from __future__ import annotations

import time
from typing import Any

from swarm_node.policy.greedy import ROUND_BATCHES
from swarm_node.policy.types import Generator
from swarm_node.tasks.base import Problem, PromptSet, RewardFn
from swarm_node.tasks.prompts import render_prompt

COMPLETION_CHARS = 500  # completion text kept per record


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
    generator: Generator,
    tokenizer: Any,
    prompt_set: PromptSet,
    reward_fn: RewardFn,
    *,
    limit: int | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    system_prompt: str | None = None,
    worked_example: bool = False,
    progress: bool = True,
    by_length: bool = True,
) -> dict[str, Any]:
    """Greedy pass@1 of `generator`'s current weights on the first `limit` problems (all when None).

    `batch_size`: prompts the hf backend decodes together (vLLM batches on its own); the generator
    gets ROUND_BATCHES batches per call. `by_length`: prompts go to the generator sorted by length
    (stably), so a batch pads to little more than its own prompts; the records keep the problems'
    order. The completions are those of batches in the set's order up to floating-point summation
    order (benchmarks/eval_batches.py compares both).

    Returns accuracy, n, correct, seconds, generated_tokens, tokens_per_s, truncated (hit
    max_new_tokens) and `records`: per problem, in the set's order, {index, correct, reward, tokens,
    stopped, completion (first COMPLETION_CHARS characters)}."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    problems = prompt_set.problems[: limit if limit is not None else len(prompt_set)]
    slots: list[dict[str, Any] | None] = [None] * len(problems)
    tokens = correct = done = 0
    bar = _progress(progress, len(problems))
    start = time.perf_counter()
    try:
        prompts = [render_prompt(tokenizer, p.question, system_prompt, worked_example) for p in problems]
        order = sorted(range(len(problems)), key=lambda i: len(prompts[i])) if by_length else list(range(len(problems)))
        step = batch_size * ROUND_BATCHES
        for b in range(0, len(order), step):
            chunk = order[b: b + step]
            completions = generator.greedy([prompts[i] for i in chunk], max_new_tokens, batch_size)
            for i, completion in zip(chunk, completions, strict=True):
                text = tokenizer.decode(completion.token_ids.tolist(), skip_special_tokens=True)
                ok, reward = _is_correct(reward_fn, text, problems[i])
                tokens += len(completion.token_ids)
                correct += int(ok)
                slots[i] = {"index": problems[i].index, "correct": ok, "reward": reward,
                            "tokens": len(completion.token_ids), "stopped": completion.finish_reason == "stop",
                            "completion": text[:COMPLETION_CHARS]}
            done += len(chunk)
            if bar is not None:
                bar.update(bar.task_ids[0], advance=len(chunk), acc=correct / done)
    finally:
        if bar is not None:
            bar.stop()
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
