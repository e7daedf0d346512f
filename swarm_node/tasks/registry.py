"""Build a task from its config: the prompt set and the reward function."""

from __future__ import annotations

from swarm_node.config import TaskConfig
from swarm_node.tasks.arithmetic import FINAL_ANSWER_MARKERS, arithmetic_prompt_set
from swarm_node.tasks.base import AnswerKind, PromptSet
from swarm_node.tasks.datasets import (
    GSM8K_HUB_ID,
    GSM8K_MARKERS,
    MATH500_HUB_ID,
    MATH500_MARKERS,
    load_gsm8k,
    load_math500,
)
from swarm_node.tasks.rewards import CorrectnessReward


def load_prompt_set(cfg: TaskConfig) -> PromptSet:
    """The prompt set `cfg` names. `source` defaults to the hub id for gsm8k/math500 (MATH-500 has a
    single split, `test`, so `split` applies to GSM8K only)."""
    if cfg.name == "arithmetic":
        return arithmetic_prompt_set(cfg.levels, cfg.size, cfg.seed, cfg.wording)
    if cfg.name == "gsm8k":
        return load_gsm8k(cfg.source or GSM8K_HUB_ID, split=cfg.split, limit=cfg.limit)
    if cfg.name == "math500":
        return load_math500(cfg.source or MATH500_HUB_ID, split="test", limit=cfg.limit)
    raise ValueError(f"unknown task {cfg.name!r}")


def make_reward_fn(
    cfg: TaskConfig, answer_kind: AnswerKind, *, format_reward: float | None = None
) -> CorrectnessReward:
    """The reward for a prompt set of `answer_kind`, bounded by `cfg.reward_timeout_s` per call.

    `format_reward` overrides `cfg.format_reward` (evaluation passes 0 to score correctness only);
    the task's final-answer markers come from its module (GSM8K: `####`)."""
    bonus = cfg.format_reward if format_reward is None else format_reward
    markers = {"arithmetic": FINAL_ANSWER_MARKERS, "gsm8k": GSM8K_MARKERS, "math500": MATH500_MARKERS}[cfg.name]
    return CorrectnessReward(answer_kind, format_reward=bonus, timeout_s=cfg.reward_timeout_s, markers=markers)
