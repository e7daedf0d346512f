"""The vLLM engine's arguments, built without vLLM: dtype, CUDA graphs, limits from the node's caps,
the node's GPU, sleep-mode support, and the prompt-length cap checked before generation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarm_node.config import GenerationConfig, NodeConfig
from swarm_node.util.errors import InputError
from swarm_node.policy.greedy import ROUND_BATCHES
from swarm_node.policy.types import check_prompts
from swarm_node.policy.vllm_engine import (
    BATCHED_TOKENS,
    MAX_NUM_SEQS,
    EngineDemand,
    check_gpu_map,
    engine_device_ids,
    engine_kwargs,
    engine_limits,
    node_demand,
    sleep_support,
    vllm_lora_rank,
)
from swarm_node.tasks import Problem, render_prompt
from swarm_node.tasks.prompt_lengths import check_prompt_lengths, longest_prompt


def fake_policy(device: str, lora_rank: int | None = None) -> SimpleNamespace:
    """What engine_kwargs reads of a Policy (a peft config when LoRA is on)."""
    model = None
    if lora_rank is not None:
        peft = SimpleNamespace(r=lora_rank, rank_pattern={"q_proj": lora_rank * 2})
        model = SimpleNamespace(peft_config={"default": peft}, active_adapter="default")
    return SimpleNamespace(device=torch.device(device), local_path=Path("/models/m"), is_lora=lora_rank is not None,
                           model=model)


def test_dtype_and_cuda_graphs_follow_the_device_unless_set() -> None:
    cpu = engine_kwargs(fake_policy("cpu"), GenerationConfig(), seed=3)
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["seed"]) == ("float32", True, 3)
    assert cpu["kv_cache_memory_bytes"] == 2**30 and "gpu_memory_utilization" not in cpu and "device_ids" not in cpu
    gpu = engine_kwargs(fake_policy("cuda:0"), GenerationConfig(vllm_gpu_memory_utilization=0.4), seed=0)
    # auto: bf16 where the GPU has it, else fp16 (this machine has no GPU to ask: either is right)
    assert gpu["dtype"] in ("bfloat16", "float16") and gpu["enforce_eager"] is False
    assert gpu["gpu_memory_utilization"] == 0.4 and "kv_cache_memory_bytes" not in gpu
    set_cpu = engine_kwargs(fake_policy("cpu"), GenerationConfig(dtype="bfloat16", vllm_enforce_eager=False), seed=0)
    assert (set_cpu["dtype"], set_cpu["enforce_eager"]) == ("bfloat16", False)
    set_gpu = engine_kwargs(fake_policy("cuda"), GenerationConfig(dtype="float32", vllm_enforce_eager=True), seed=0)
    assert (set_gpu["dtype"], set_gpu["enforce_eager"]) == ("float32", True)
    assert cpu["logprobs_mode"] == "processed_logprobs" and cpu["model"] == "/models/m"


def test_limits_come_from_the_nodes_caps() -> None:
    gen = GenerationConfig(max_prompt_tokens=600, max_new_tokens=200)
    limits = engine_limits(gen, EngineDemand(sequences=48, max_new_tokens=200))
    assert (limits.max_model_len, limits.max_num_seqs, limits.max_num_batched_tokens) == (800, 48, BATCHED_TOKENS)
    longer = engine_limits(gen, EngineDemand(sequences=10_000, max_new_tokens=300))  # an evaluation's longer cap
    assert (longer.max_model_len, longer.max_num_seqs) == (900, MAX_NUM_SEQS)
    long_prompts = engine_limits(GenerationConfig(max_prompt_tokens=30_000, max_new_tokens=2048))
    assert long_prompts.max_model_len == 32_048 and long_prompts.max_num_batched_tokens == 32_048  # a prompt fits a step
    assert engine_limits(gen).max_num_seqs == MAX_NUM_SEQS  # no demand: vLLM's usual cap
    kwargs = engine_kwargs(fake_policy("cpu"), gen, 0, EngineDemand(sequences=12, max_new_tokens=200))
    assert (kwargs["max_model_len"], kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (800, 12, BATCHED_TOKENS)


def test_node_demand_counts_a_steps_groups_and_the_evaluation() -> None:
    cfg = NodeConfig.load(None, ["train.prompts_per_step=3", "generation.group_size=12", "generation.max_new_tokens=64",
                                 "eval.problems=0"])
    assert node_demand(cfg) == EngineDemand(sequences=36, max_new_tokens=64)
    on = NodeConfig.load(None, ["train.prompts_per_step=3", "generation.group_size=12", "generation.max_new_tokens=64"])
    assert node_demand(on).sequences == max(36, min(on.eval.problems, on.eval.batch_size * ROUND_BATCHES))  # by default
    cfg = NodeConfig.load(None, ["train.prompts_per_step=1", "generation.group_size=4", "generation.max_new_tokens=32",
                                 "eval.problems=64", "eval.batch_size=4", "eval.max_new_tokens=96"])
    assert node_demand(cfg) == EngineDemand(sequences=min(64, 4 * ROUND_BATCHES), max_new_tokens=96)
    cfg = NodeConfig.load(None, ["train.prompts_per_step=1", "generation.group_size=4", "eval.problems=3",
                                 "eval.batch_size=16"])
    assert node_demand(cfg).sequences == 4  # three evaluation prompts never need more than a step's four


def test_the_engine_runs_on_the_nodes_gpu() -> None:
    assert engine_device_ids(torch.device("cpu")) is None
    assert engine_device_ids(torch.device("cuda:1")) == [1]
    assert engine_device_ids(torch.device("cuda"), current_index=2) == [2]  # plain cuda: torch's current device
    assert engine_kwargs(fake_policy("cuda:3"), GenerationConfig(), 0)["device_ids"] == [3]
    assert engine_kwargs(fake_policy("cuda"), GenerationConfig(), 0, current_index=1)["device_ids"] == [1]
    # a vLLM without device_ids: device 0 is its default; another GPU is refused with what to do
    assert engine_device_ids(torch.device("cuda:0"), supports_device_ids=False) is None
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1"):
        engine_device_ids(torch.device("cuda:1"), supports_device_ids=False)
    # vLLM keeps one GPU map per process: a second engine on another GPU is refused, on the same one not
    check_gpu_map(None, 5, 1)
    check_gpu_map([5], 5, 1)
    with pytest.raises(ValueError, match="separate processes"):
        check_gpu_map([0], 1, 1)


def test_sleep_mode_needs_cuda_and_a_vllm_that_has_it() -> None:
    class WithSleep:
        def sleep(self) -> None: ...

        def wake_up(self) -> None: ...

    assert sleep_support(torch.device("cuda:0"), WithSleep, True) is None
    assert "CUDA" in sleep_support(torch.device("cpu"), WithSleep, True)
    assert "no LLM.sleep" in sleep_support(torch.device("cuda:0"), object, True)
    assert "platform" in sleep_support(torch.device("cuda:0"), WithSleep, False)
    kwargs = engine_kwargs(fake_policy("cuda:0"), GenerationConfig(vllm_sleep=True), 0, sleep=True)
    assert kwargs["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in engine_kwargs(fake_policy("cuda:0"), GenerationConfig(vllm_sleep=True), 0)


def test_lora_adapters_get_lora_kernels_merged_ones_do_not() -> None:
    adapter = engine_kwargs(fake_policy("cpu", lora_rank=8), GenerationConfig(), 0)
    assert (adapter["enable_lora"], adapter["max_loras"], adapter["max_lora_rank"]) == (True, 1, 16)  # rank_pattern 16
    assert "enable_lora" not in engine_kwargs(fake_policy("cpu", lora_rank=8), GenerationConfig(vllm_lora_sync="merged"), 0)
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]


def test_prompts_longer_than_the_cap_are_refused() -> None:
    assert check_prompts([[1, 2], (3,)], 2) == [[1, 2], [3]]
    with pytest.raises(ValueError, match="3 tokens exceeds generation.max_prompt_tokens=2"):
        check_prompts([[1, 2, 3]], 2)
    with pytest.raises(ValueError, match="empty prompt"):
        check_prompts([[]], 2)


def test_a_prompt_set_is_checked_against_the_cap_with_its_longest_prompt_named(monkeypatch) -> None:
    import swarm_node.tasks.prompt_lengths as lengths
    from tests.unit.test_evaluate import char_tokenizer

    tok = char_tokenizer()  # one token a character: a prompt is the template's tokens plus the question's
    problems = [Problem(0, "What is 1 plus 1?", "2"), Problem(7, "What is 1000 plus 1000?", "2000")]
    longest, which = longest_prompt(tok, problems)
    short = longest_prompt(tok, problems[:1])[0]
    assert which is problems[1] and longest == short + 6
    assert check_prompt_lengths(tok, problems, "s", longest) == longest  # rendered: the bound did not fit
    with pytest.raises(InputError, match=f"problem 7 renders to {longest} prompt tokens") as e:
        check_prompt_lengths(tok, problems, "s", longest - 1)
    assert f"generation.max_prompt_tokens to at least {longest}" in e.value.line()
    assert longest_prompt(tok, []) == (0, None)
    # Far under the cap, the byte bound settles it: only the empty template is rendered.
    rendered = []
    monkeypatch.setattr(lengths, "render_prompt", lambda t, q, *a: rendered.append(q) or render_prompt(t, q, *a))
    assert check_prompt_lengths(tok, problems, "s", 4096) == longest + lengths.BOUND_SLACK
    assert rendered == [""]
