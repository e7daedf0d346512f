"""Prompt sources (built-in arithmetic, GSM8K, MATH-500) and verifiable rewards.

The node uses three functions: `load_prompt_set`, `make_reward_fn` and `render_prompt` (see
docs/architecture.md; which prompts a step answers is a protocol rule, `protocol.binding`).
Exports resolve lazily, so importing one submodule (the reward worker process imports
`swarm_node.tasks.bounded`) does not pull in the config tree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AnswerKind": "base",
    "Problem": "base",
    "PromptSet": "base",
    "RewardFn": "base",
    "DEFAULT_INSTRUCTION": "prompts",
    "render_prompt": "prompts",
    "load_prompt_set": "registry",
    "make_reward_fn": "registry",
    "CorrectnessReward": "rewards",
    "Score": "rewards",
}

__all__ = [
    "DEFAULT_INSTRUCTION",
    "AnswerKind",
    "CorrectnessReward",
    "Problem",
    "PromptSet",
    "RewardFn",
    "Score",
    "load_prompt_set",
    "make_reward_fn",
    "render_prompt",
]

if TYPE_CHECKING:
    from swarm_node.tasks.base import AnswerKind, Problem, PromptSet, RewardFn
    from swarm_node.tasks.prompts import DEFAULT_INSTRUCTION, render_prompt
    from swarm_node.tasks.registry import load_prompt_set, make_reward_fn
    from swarm_node.tasks.rewards import CorrectnessReward, Score


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'swarm_node.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(f"swarm_node.tasks.{module}"), name)
