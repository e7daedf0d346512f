"""`swarm-node eval`: greedy pass@1 of a model or a checkpoint on a prompt set, through the generator
the node would use (`swarm_node.evaluation.evaluate`), with an engine sized for this evaluation."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from swarm_node.config import NodeConfig

log = logging.getLogger(__name__)


def run_eval(cfg: NodeConfig, *, checkpoint: Path | None, limit: int, batch_size: int,
             max_new_tokens: int, progress: bool) -> dict[str, Any]:
    from swarm_node.evaluation.evaluate import evaluate
    from swarm_node.node import preflight
    from swarm_node.policy.checkpoint import checkpoint_model_config, load_weights
    from swarm_node.policy.generation import make_generator
    from swarm_node.policy.greedy import ROUND_BATCHES
    from swarm_node.policy.models import load_policy
    from swarm_node.policy.vllm_engine import EngineDemand
    from swarm_node.tasks import make_reward_fn
    from swarm_node.tasks.prompt_lengths import longest_prompt

    model_cfg = cfg.model
    if checkpoint is not None:
        model_cfg = checkpoint_model_config(checkpoint, cfg.model)  # the model the checkpoint records
        log.info("evaluating checkpoint %s of %s%s", checkpoint, model_cfg.name, " (LoRA)" if model_cfg.lora.enabled else "")
    preflight.check_model_name(model_cfg.name)
    prompt_set = preflight.check_task_data(cfg)  # before the model: a bad data file costs nothing
    policy = load_policy(model_cfg, seed=cfg.train.seed)
    if checkpoint is not None:
        load_weights(checkpoint, policy)
    # The engine is sized for this evaluation: its longest prompt, its completion cap, its calls.
    longest, _ = longest_prompt(policy.tokenizer, prompt_set.problems[:limit])
    gen_cfg = cfg.generation.model_copy(update={"max_prompt_tokens": max(cfg.generation.max_prompt_tokens, longest)})
    demand = EngineDemand(sequences=batch_size * ROUND_BATCHES, max_new_tokens=max_new_tokens)
    generator = make_generator(policy, gen_cfg, seed=cfg.train.seed, demand=demand)
    reward_fn = make_reward_fn(cfg.task, prompt_set.answer_kind, format_reward=0.0)
    try:
        return evaluate(generator, policy.tokenizer, prompt_set, reward_fn, limit=limit, batch_size=batch_size,
                        max_new_tokens=max_new_tokens, progress=progress)
    finally:
        reward_fn.close()
        generator.close()
