"""What every proof of the device check builds: the shapes and precision policies, configs, a trainer
and a generator for a tiny model, fixed prompts and own samples, and device housekeeping.

`Build` names the node's own functions each proof builds its pieces with (policy, trainer, generator,
resume). The check always runs the defaults; the unit tests pass broken ones (weights that do not
move, a sync that does not reach the generator, a resume that loses the optimizer state, a generator
reporting untempered logprobs) and see each proof fail."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
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
    # Qwen2.5's attention grouping (7 query heads share each key/value head, as in Qwen2.5-7B; the
    # 1.5B shares 6) and vocabulary (151,936 rows), at small width: SDPA expands the keys and values
    # to every query head when a mask is passed, and the logits are [rows, T, 152k]
    "gqa7-152k": "tiny-random:224x2-g7-v151936",
}
PRECISIONS = {  # policy -> (compute dtype, parameter dtype)
    "float32": ("float32", "float32"),
    "bf16_compute": ("bfloat16", "auto"),
    "bf16_inplace": ("bfloat16", "bfloat16"),
}
ENV_AT_START = dict(os.environ)  # for the memory children (benchmarks.memory_plan.run_child): an in-process vLLM engine edits the environment


@dataclass(frozen=True)
class GenSettings:
    """What a proof asks of the generator it builds."""

    lora_sync: str = "adapter"  # generation.vllm_lora_sync
    dtype: str = "auto"  # generation.dtype (vLLM's engine; hf generates in the trainer's compute dtype)
    temperature: float = 1.0


def model_cfg(args: argparse.Namespace, spec: str, cache: Path, **kw: Any) -> Any:
    from swarm_node.config import ModelConfig

    return ModelConfig(name=spec, device=args.device, cache_dir=cache, **kw)


def train_cfg(args: argparse.Namespace, lr: float, **kw: Any) -> Any:
    from swarm_node.config import TrainConfig

    return TrainConfig(learning_rate=lr, micro_batch_size=args.micro_batch, **kw)


def load_policy(model: Any, seed: int = 0) -> Any:
    from swarm_node.policy.models import load_policy as load

    return load(model, seed=seed)


def make_trainer(policy: Any, train_cfg: Any, temperature: float = 1.0) -> Any:
    from swarm_node.config import ObjectiveConfig
    from swarm_node.policy.trainer import Trainer

    return Trainer(policy, train_cfg, ObjectiveConfig(), temperature=temperature)


def make_generator_for(args: argparse.Namespace, policy: Any, settings: GenSettings = GenSettings()) -> Any:
    from swarm_node.config import GenerationConfig
    from swarm_node.policy.generation import make_generator

    cfg = GenerationConfig(backend=args.backend, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                           vllm_lora_sync=settings.lora_sync, dtype=settings.dtype, temperature=settings.temperature)
    return make_generator(policy, cfg, seed=0)


def resume(node_dir: Path, trainer: Any) -> tuple[int, dict[str, Any]] | None:
    from swarm_node.policy.checkpoint import load_latest_checkpoint

    return load_latest_checkpoint(node_dir, trainer)


@dataclass(frozen=True)
class Build:
    """The functions a proof builds a node's pieces with (the node's own, unless a test says otherwise)."""

    policy: Callable[..., Any] = load_policy  # (ModelConfig, seed) -> Policy
    trainer: Callable[..., Any] = make_trainer  # (Policy, TrainConfig, temperature) -> Trainer
    generator: Callable[..., Any] = make_generator_for  # (args, Policy, GenSettings) -> Generator
    resume: Callable[[Path, Any], Any] = resume  # (node_dir, Trainer) -> (step, extra) | None


NODE = Build()


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


def generates_with(generator: Any, policy: Any) -> bool:
    """Whether `generator` samples with the trained module itself (the hf backend): then no weights
    are copied anywhere, and a sync proof has nothing to prove."""
    return getattr(generator, "model", None) is policy.model


def sync_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
