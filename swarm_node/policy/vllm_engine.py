"""The arguments a node's vLLM engine is built with (pure: vLLM itself is not imported here).

Sizing (`engine_limits`), from the node's own caps instead of the model's context (a Qwen model's
32k context would otherwise size the engine):

  - `max_model_len` = generation.max_prompt_tokens + the longest completion the node asks for
    (generation.max_new_tokens, or eval.max_new_tokens when the node evaluates and that is longer);
    the node refuses a prompt set with a longer prompt at start (`tasks.prompt_lengths`);
  - `max_num_seqs` = the sequences one call decodes together: train.prompts_per_step x
    generation.group_size, or the prompts of one evaluation call when more (`evaluate` sends
    eval.batch_size x ROUND_BATCHES at a time), at most MAX_NUM_SEQS (vLLM's own default on most
    GPUs); more requests queue in vLLM's scheduler, so this caps concurrency, not a call;
  - `max_num_batched_tokens` = max(BATCHED_TOKENS, max_model_len, max_num_seqs): a whole prompt
    always fits one scheduler step (no engine needs chunked prefill to hold it) and vLLM's rule
    `max_num_batched_tokens >= max_num_seqs` holds.

Device (`engine_device_ids`): vLLM (0.32) places an in-process engine on logical device 0 unless
`device_ids` names physical GPUs (`EngineArgs.device_ids`, read as indices into
CUDA_VISIBLE_DEVICES when that is set: the same ordinals torch uses), so a node on `cuda:N` passes
`device_ids=[N]`. A vLLM without `device_ids` can only take the default device: a node on another
GPU is refused with a line saying what to do. vLLM records the GPUs of the first in-process engine
for the whole process (`set_assigned_physical_gpu_ids` refuses another value), so two nodes in one
process (an experiment's lockstep mode) share a GPU or run as separate processes (`check_gpu_map`).

Precision: the engine's dtype is `generation.dtype` (`auto`: bfloat16 on CUDA, float32 on CPU;
`precision.resolve_dtype`), not the trainer's; weight syncs cast to it. CUDA graphs are on by
default on GPUs (`generation.vllm_enforce_eager`; eager on CPU).

LoRA's merged sync needs a float32 engine (`lora_sync_problem`). The engine would hold
round_d(W + s B A) for a frozen base W: in bfloat16 each merged weight keeps 8 significant bits, so a
delta below half an ulp (2^-9 of the weight's magnitude; float16: 2^-12) rounds away. An adapter's
delta after one Adam step at lr eta is about eta x scaling x sum|A|: about 6e-7 at lr 5e-6 and rank 16,
against half an ulp of about 6e-5 for a weight of 0.015, so a bf16 engine would sample from the base
for on the order of a hundred steps while the trainer scores with the adapter (the rounding the config
refuses for full fine-tuning in bf16). `adapter` sync (vLLM computes x A B beside the base) keeps
the delta, so it is the only LoRA mode on 16-bit engines; the merge itself is done in float32
(`vllm_generator.merged_named_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from swarm_node.config import GenerationConfig
from swarm_node.policy.precision import dtype_name, resolve_dtype

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig
    from swarm_node.policy.models import Policy

MAX_NUM_SEQS = 256
BATCHED_TOKENS = 8192
# vLLM accepts only these values for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class EngineDemand:
    """The most one call asks of the engine: sequences decoded together and the longest completion."""

    sequences: int
    max_new_tokens: int


@dataclass(frozen=True)
class EngineLimits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


def node_demand(cfg: NodeConfig) -> EngineDemand:
    """A node's demand: one step's own groups (prompts_per_step x G; a horizontal arm's config already
    holds its shares), and its held-out evaluation's calls and completion cap when it evaluates."""
    from swarm_node.policy.greedy import ROUND_BATCHES

    sequences = cfg.train.prompts_per_step * cfg.generation.group_size
    new_tokens = cfg.generation.max_new_tokens
    if cfg.eval.problems:
        sequences = max(sequences, min(cfg.eval.problems, cfg.eval.batch_size * ROUND_BATCHES))
        new_tokens = max(new_tokens, cfg.eval.max_new_tokens or new_tokens)
    return EngineDemand(sequences=sequences, max_new_tokens=new_tokens)


def engine_limits(cfg: GenerationConfig, demand: EngineDemand | None = None) -> EngineLimits:
    """The engine's length and batch limits (module docstring); without a demand (benchmarks, tests):
    up to MAX_NUM_SEQS sequences, completions of generation.max_new_tokens."""
    demand = demand or EngineDemand(sequences=MAX_NUM_SEQS, max_new_tokens=cfg.max_new_tokens)
    max_model_len = cfg.max_prompt_tokens + max(demand.max_new_tokens, cfg.max_new_tokens)
    max_num_seqs = max(1, min(MAX_NUM_SEQS, demand.sequences))
    return EngineLimits(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max(BATCHED_TOKENS, max_model_len, max_num_seqs))


def engine_dtype(cfg: GenerationConfig, device: torch.device) -> torch.dtype:
    """The engine's weights and compute dtype (`generation.dtype`)."""
    return resolve_dtype(cfg.dtype, device)


def lora_sync_problem(cfg: GenerationConfig, device: torch.device, is_lora: bool) -> str | None:
    """Why this LoRA sync cannot keep the adapter (one sentence with the fix), or None (module docstring)."""
    if not is_lora or cfg.vllm_lora_sync != "merged":
        return None
    dtype = engine_dtype(cfg, device)
    if dtype == torch.float32:
        return None
    return (f"generation.vllm_lora_sync='merged' on a {dtype_name(dtype)} vLLM engine rounds each merged weight to "
            f"{'8' if dtype == torch.bfloat16 else '11'} significant bits, which erases a LoRA adapter's small "
            "updates (one step at lr 5e-6 changes a weight by ~6e-7, half an ulp is ~6e-5): set "
            "generation.vllm_lora_sync='adapter' (or generation.dtype='float32' to keep merged syncs)")


def enforce_eager(cfg: GenerationConfig, device: torch.device) -> bool:
    """`generation.vllm_enforce_eager`, or (None) eager on CPU, CUDA graphs on GPUs."""
    return cfg.vllm_enforce_eager if cfg.vllm_enforce_eager is not None else device.type != "cuda"


def engine_device_ids(device: torch.device, current_index: int = 0, *, supports_device_ids: bool = True) -> list[int] | None:
    """vLLM's `device_ids` for an engine on the node's device: [N] for `cuda:N` (plain `cuda`: torch's
    current device, `current_index`); None on CPU. A vLLM without `device_ids` runs on device 0 only:
    another index is a ValueError saying what to do."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else current_index
    if supports_device_ids:
        return [index]
    if index != 0:
        raise ValueError(f"the installed vLLM cannot place its engine on cuda:{index} (it has no device_ids "
                         f"argument): install vllm==0.32.0, or run the node with CUDA_VISIBLE_DEVICES={index} "
                         "and model.device='cuda'")
    return None


def check_gpu_map(assigned: list[int] | None, physical: int, index: int) -> None:
    """vLLM keeps one GPU map per process (`assigned`: the physical GPUs the first in-process engine
    was given); an engine for another GPU cannot start beside it: a ValueError saying what to do."""
    if assigned is not None and list(assigned) != [physical]:
        raise ValueError(f"a vLLM engine on physical GPU {list(assigned)} already runs in this process and vLLM keeps "
                         f"one GPU map per process, so an engine for cuda:{index} cannot start beside it: run nodes on "
                         "different GPUs as separate processes (one `swarm-node join` per GPU, or `swarm-node "
                         "experiment --mode swarm`)")


def sleep_support(device: torch.device, llm_cls: Any, platform_available: bool) -> str | None:
    """Why sleep mode cannot be used (a sentence), or None when it can: it needs a CUDA device, an
    `LLM` with sleep/wake_up and a platform vLLM reports sleep-capable."""
    if device.type != "cuda":
        return f"vLLM's sleep mode needs a CUDA device (the node generates on {device})"
    if not (hasattr(llm_cls, "sleep") and hasattr(llm_cls, "wake_up")):
        return "the installed vLLM has no LLM.sleep/wake_up"
    if not platform_available:
        return "the installed vLLM reports no sleep mode on this platform"
    return None


def vllm_lora_rank(rank: int) -> int:
    """Smallest rank vLLM accepts as `max_lora_rank` that holds an adapter of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's maximum {VLLM_LORA_RANKS[-1]}")


def adapter_rank(model: Any) -> int:
    """Largest LoRA rank in a peft model (its active adapter's r and any per-module overrides)."""
    config = model.peft_config[model.active_adapter]
    return max([int(config.r), *(int(r) for r in (config.rank_pattern or {}).values())])


def engine_kwargs(policy: Policy, cfg: GenerationConfig, seed: int, demand: EngineDemand | None = None, *,
                  current_index: int = 0, supports_device_ids: bool = True, sleep: bool = False) -> dict[str, Any]:
    """Arguments for `vllm.LLM`: the policy's local weights on the node's device, the engine's own
    dtype, limits from the node's caps, memory from the config, sleep mode when `sleep`."""
    device = torch.device(policy.device)
    limits = engine_limits(cfg, demand)
    kwargs: dict[str, Any] = {
        "model": str(policy.local_path),
        "dtype": dtype_name(engine_dtype(cfg, device)),
        "seed": seed,
        "enforce_eager": enforce_eager(cfg, device),
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # the model's generation_config.json sets no default of any request
        "max_model_len": limits.max_model_len,
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
    }
    device_ids = engine_device_ids(device, current_index, supports_device_ids=supports_device_ids)
    if device_ids is not None:
        kwargs["device_ids"] = device_ids
    if device.type == "cuda":
        kwargs["gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_bytes"] = cfg.vllm_kv_cache_gib * 2**30
    if sleep:
        kwargs["enable_sleep_mode"] = True
    if policy.is_lora and cfg.vllm_lora_sync == "adapter":
        kwargs["enable_lora"] = True
        kwargs["max_loras"] = 1
        kwargs["max_lora_rank"] = vllm_lora_rank(adapter_rank(policy.model))
    return kwargs
