"""What every proof of the device check builds: the shapes and precision policies, configs, a trainer
and a generator for a tiny model, fixed prompts and own samples, and device housekeeping."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

# name -> tiny spec: hidden x layers, vocabulary padded to a real model's order of size
SHAPES = {
    "10m": "tiny-random:384x4-v8192",
    "30m": "tiny-random:512x6-v16000",
    "100m": "tiny-random:768x12-v32000",
    "500m": "tiny-random:1536x20-v32000",
}
PRECISIONS = {  # policy -> (compute dtype, parameter dtype)
    "float32": ("float32", "float32"),
    "bf16_compute": ("bfloat16", "auto"),
    "bf16_inplace": ("bfloat16", "bfloat16"),
}
ENV_AT_START = dict(os.environ)  # for the memory children (benchmarks.memory_plan.run_child): an in-process vLLM engine edits the environment


def model_cfg(args: argparse.Namespace, spec: str, cache: Path, **kw: Any) -> Any:
    from swarm_node.config import ModelConfig

    return ModelConfig(name=spec, device=args.device, cache_dir=cache, **kw)


def train_cfg(args: argparse.Namespace, lr: float, **kw: Any) -> Any:
    from swarm_node.config import TrainConfig

    return TrainConfig(learning_rate=lr, micro_batch_size=args.micro_batch, **kw)


def make_trainer(policy: Any, train_cfg: Any) -> Any:
    from swarm_node.config import ObjectiveConfig
    from swarm_node.policy.trainer import Trainer

    return Trainer(policy, train_cfg, ObjectiveConfig(), temperature=1.0)


def make_generator_for(args: argparse.Namespace, policy: Any, lora_sync: str = "adapter", dtype: str = "auto") -> Any:
    from swarm_node.config import GenerationConfig
    from swarm_node.policy.generation import make_generator

    cfg = GenerationConfig(backend=args.backend, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                           vllm_lora_sync=lora_sync, dtype=dtype)
    return make_generator(policy, cfg, seed=0)


def fixed_prompts(policy: Any, n: int) -> list[list[int]]:
    """Fixed prompts of the built-in arithmetic task, rendered with the policy's chat template."""
    from swarm_node.tasks import render_prompt
    from swarm_node.tasks.arithmetic import arithmetic_prompt_set

    return [render_prompt(policy.tokenizer, p.question) for p in arithmetic_prompt_set([1], n, 0).problems]


def own_samples(prompts: list[list[int]], groups: list[list[Any]], seed: int) -> list[Any]:
    """Own samples with alternating rewards, so every group has a non-zero advantage spread."""
    from swarm_node.policy.types import TrainSample

    rng = np.random.default_rng(seed)
    out = []
    for i, (p, group) in enumerate(zip(prompts, groups, strict=True)):
        rewards = rng.permutation([float(k % 2) for k in range(len(group))])
        for c, r in zip(group, rewards, strict=True):
            out.append(TrainSample(group_key=str(i), prompt_ids=np.asarray(p, dtype=np.int64),
                                   completion_ids=np.asarray(c.token_ids, dtype=np.int64),
                                   generator_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                                   reward=float(r), is_peer=False))
    return out


def sync_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
