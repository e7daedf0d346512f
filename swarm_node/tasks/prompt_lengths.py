"""The prompt-length cap (`generation.max_prompt_tokens`) checked once, before a node generates.

The cap sizes the vLLM engine (`max_model_len`, `swarm_node.policy.vllm_engine`) and the memory
plan, so a longer prompt must never reach them: a node checks every prompt of its own prompt set,
rendered with its own template, at start and refuses to run, with one line naming the longest
prompt and the value to set, when one does not fit. Peers' groups are about prompts of the same
set, rendered with this node's template for training (`rollouts`), so the one check covers them
too. The generators refuse a longer prompt as a bug (`policy.types.check_prompts`).

Rendering every prompt costs seconds for large sets (10,000 arithmetic problems: 7-8 s on a
loaded 2-core machine), so a prompt is rendered only when a bound says it might not fit: a token
covers at least one byte of text, so a prompt takes at most the tokens of the template around an
empty question plus the question's UTF-8 bytes (BOUND_SLACK more for tokenizers whose merges cross
the question's edges). On GSM8K and MATH-500 questions with SmolLM2's tokenizer and the byte-level
tiny tokenizers the exact length was never above the template's plus the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swarm_node.tasks.base import Problem
from swarm_node.tasks.prompts import render_prompt

BOUND_SLACK = 8


def longest_prompt(tokenizer: Any, problems: Sequence[Problem], system_prompt: str | None = None,
                   worked_example: bool = False) -> tuple[int, Problem | None]:
    """(tokens, problem) of the longest rendered prompt, every prompt rendered; (0, None) for none."""
    best, which = 0, None
    for p in problems:
        n = len(render_prompt(tokenizer, p.question, system_prompt, worked_example))
        if n > best:
            best, which = n, p
    return best, which


def check_prompt_lengths(tokenizer: Any, problems: Sequence[Problem], set_id: str, max_prompt_tokens: int,
                         system_prompt: str | None = None, worked_example: bool = False) -> int:
    """At most how many tokens a prompt of `problems` takes (exact for the prompts rendered, the
    bound for the others); an InputError naming the longest when one exceeds `max_prompt_tokens`."""
    base = len(render_prompt(tokenizer, "", system_prompt, worked_example)) + BOUND_SLACK
    bounds = [base + len(p.question.strip().encode("utf-8")) for p in problems]
    unsure = [p for p, bound in zip(problems, bounds, strict=True) if bound > max_prompt_tokens]
    longest, problem = longest_prompt(tokenizer, unsure, system_prompt, worked_example)
    if longest > max_prompt_tokens:
        from swarm_node.util.errors import InputError

        assert problem is not None
        raise InputError(
            f"prompt set {set_id!r}: problem {problem.index} renders to {longest} prompt tokens, more than "
            f"generation.max_prompt_tokens={max_prompt_tokens}",
            f"set generation.max_prompt_tokens to at least {longest} (it sizes the vLLM engine and the memory "
            "plan), or use a prompt set of shorter questions")
    return max([longest, *(b for b in bounds if b <= max_prompt_tokens)], default=0)
