"""The vLLM engine as the node builds it: limits from the node's caps, its own dtype (weight syncs
cast to it), the node's GPU, sleep mode where it exists, and greedy evaluation through it equal to
the hf backend's."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (scripts/setup_vllm_env.sh builds the environment)")

from swarm_node.config import GenerationConfig  # noqa: E402
from swarm_node.evaluation.evaluate import evaluate  # noqa: E402
from swarm_node.policy.generation import HFGenerator  # noqa: E402
from swarm_node.policy.vllm_engine import BATCHED_TOKENS, EngineDemand  # noqa: E402
from swarm_node.tasks import Problem, PromptSet, render_prompt  # noqa: E402
from swarm_node.tasks.rewards import CorrectnessReward  # noqa: E402
from tests.unit.test_policy_generation import SHIPPED, argmax_decode, with_generation_config  # noqa: E402
from tests.vllm.test_vllm_generator import adam_step, max_logprob_gap, prompts_of  # noqa: E402

pytestmark = pytest.mark.vllm


def engine_config(gen):
    return gen.llm.llm_engine.vllm_config


def test_engine_is_sized_from_the_nodes_caps(make_policy, make_generator) -> None:
    policy = make_policy()
    gen = make_generator(policy, demand=EngineDemand(sequences=12, max_new_tokens=40), max_prompt_tokens=100,
                         max_new_tokens=24)
    vc = engine_config(gen)
    assert vc.model_config.max_model_len == 140  # 100 prompt tokens + the evaluation's 40
    assert (vc.scheduler_config.max_num_seqs, vc.scheduler_config.max_num_batched_tokens) == (12, BATCHED_TOKENS)
    assert vc.model_config.dtype == torch.float32 and vc.model_config.enforce_eager  # CPU: float32, eager
    assert not vc.model_config.enable_sleep_mode
    long_prompt = [[7] * 100]
    assert len(gen.generate(long_prompt, n=2)[0]) == 2
    with pytest.raises(ValueError, match="exceeds generation.max_prompt_tokens=100"):
        gen.generate([[7] * 101], n=1)
    assert len(gen.greedy(long_prompt, 40, batch_size=1)) == 1
    with pytest.raises(ValueError, match="max_model_len=140"):
        gen.greedy(long_prompt, 41, batch_size=1)


def test_device_ids_put_the_engine_on_the_nodes_gpu(monkeypatch) -> None:
    """`device_ids=[N]`, as engine_kwargs passes it for cuda:N, resolves to visible device N: the
    arithmetic of vLLM's CUDA platform (EngineArgs._resolve_device_ids, then the worker's
    logical_device_id_to_visible_device_id for its local rank 0), without a GPU."""
    import vllm.engine.arg_utils as arg_utils
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import interface

    class Cuda(interface.Platform):
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

    monkeypatch.setattr(arg_utils, "current_platform", Cuda)
    for visible, node_index, physical in ((None, 1, 1), ("4,5,6", 1, 5), ("3", 0, 3)):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assigned = EngineArgs(model="unused", device_ids=[node_index])._resolve_device_ids()
        assert assigned == [physical]
        monkeypatch.setattr(interface, "_assigned_physical_gpu_ids", assigned)
        assert Cuda.logical_device_id_to_visible_device_id(0) == node_index  # torch's cuda:<node_index>


def test_sleep_on_cpu_is_logged_and_the_engine_stays_awake(make_policy, make_generator, caplog) -> None:
    policy = make_policy()
    with caplog.at_level(logging.WARNING, logger="swarm_node.policy.vllm_generator"):
        gen = make_generator(policy, vllm_sleep=True, max_new_tokens=8)
    assert not gen.sleeps and not engine_config(gen).model_config.enable_sleep_mode
    assert "vLLM's sleep mode needs a CUDA device" in caplog.text
    assert len(gen.generate(prompts_of(policy), n=2)) == 3


def same_greedy(policy, vllm_gen, prompts, max_new: int = 16) -> tuple[int, int]:
    """(prompts whose greedy completion and finish reason match the hf backend's, prompts)."""
    hf = HFGenerator(policy, GenerationConfig()).greedy(prompts, max_new, batch_size=2)
    vl = vllm_gen.greedy(prompts, max_new, batch_size=2)
    return sum(a.token_ids.tolist() == b.token_ids.tolist() and a.finish_reason == b.finish_reason
               for a, b in zip(hf, vl, strict=True)), len(prompts)


def chat_prompts(policy) -> list[list[int]]:
    questions = ["What is 2 plus 3?", "What is 40 minus 12?", "Tom has 5 apples and eats 2. How many are left?",
                 "7 * 8 = ?", "hello", "A longer question about 17 apples and 4 baskets: how many in each basket?"]
    return [render_prompt(policy.tokenizer, q) for q in questions]


@pytest.mark.parametrize("lora", [None, "adapter", "merged"])
def test_greedy_equals_the_hf_backends_before_and_after_a_sync(make_policy, make_generator, lora) -> None:
    policy = make_policy(lora_rank=8 if lora else None)
    gen = make_generator(policy, **({"vllm_lora_sync": lora} if lora else {}))
    prompts = chat_prompts(policy)
    before = same_greedy(policy, gen, prompts)
    first = [c.token_ids.tolist() for c in gen.greedy(prompts, 16, batch_size=2)]
    adam_step(policy.model, prompts[0] + prompts[1], lr=5e-2)
    gen.sync_weights(policy.model)
    after = same_greedy(policy, gen, prompts)
    moved = sum(c.token_ids.tolist() != f for c, f in zip(gen.greedy(prompts, 16, batch_size=2), first))
    print(f"greedy vLLM == hf ({lora or 'full'}): {before[0]}/{before[1]} before, {after[0]}/{after[1]} after a "
          f"sync; {moved} completions changed by the step")
    assert before == (len(prompts), len(prompts)) and after == (len(prompts), len(prompts))
    assert moved >= 1  # the engine decodes with the new weights


def test_greedy_ignores_the_models_generation_config_on_both_backends(make_policy, make_generator, tmp_path) -> None:
    """A model saved with a generation_config.json that sets a repetition penalty, top-k and a
    temperature (and a no-repeat n-gram rule): vLLM's greedy, the hf backend's greedy and plain argmax
    decoding give the same completions."""
    from swarm_node.config import ModelConfig
    from swarm_node.policy.models import load_policy

    where = with_generation_config(make_policy().local_path, tmp_path / "shipped", SHIPPED)
    policy = load_policy(ModelConfig(name=str(where), device="cpu", compute_dtype="float32"))
    assert policy.model.generation_config.repetition_penalty == SHIPPED["repetition_penalty"]
    prompts = chat_prompts(policy)
    stops = set(policy.stop_token_ids)
    expected = [argmax_decode(policy.model, p, 16, stops) for p in prompts]
    hf = [c.token_ids.tolist() for c in HFGenerator(policy, GenerationConfig()).greedy(prompts, 16, batch_size=2)]
    vl = [c.token_ids.tolist() for c in make_generator(policy).greedy(prompts, 16, batch_size=2)]
    assert hf == expected and vl == expected


def test_evaluation_through_vllm_equals_evaluation_through_hf(make_policy, make_generator) -> None:
    policy = make_policy()
    gen = make_generator(policy)
    ps = PromptSet(id="t", answer_kind="number",
                   problems=tuple(Problem(i, f"What is {i} plus {3 * i}?", str(4 * i)) for i in range(10)))
    reward = CorrectnessReward("number")
    kw = dict(batch_size=4, max_new_tokens=12, progress=False, worked_example=True)
    through_vllm = evaluate(gen, policy.tokenizer, ps, reward, **kw)
    through_hf = evaluate(HFGenerator(policy, GenerationConfig()), policy.tokenizer, ps, reward, **kw)
    same = sum(a == b for a, b in zip(through_vllm["records"], through_hf["records"], strict=True))
    print(f"evaluation records identical (vLLM vs hf): {same}/{len(ps)}")
    assert through_vllm["records"] == through_hf["records"]
    assert through_vllm["generated_tokens"] == through_hf["generated_tokens"] > 0


@pytest.mark.parametrize("name", ["tiny-random:128x2", "tiny-random:128x2-tied"])
def test_bfloat16_engine_syncs_cast_weights(make_policy, make_generator, name: str) -> None:
    """A float32 trainer and a bf16 engine (generation.dtype): the sync casts every tensor, and the
    engine samples from the new weights (gap to them far below the gap to the old)."""
    policy = make_policy(name=name)
    gen = make_generator(policy, dtype="bfloat16", temperature=0.9, max_new_tokens=24)
    assert engine_config(gen).model_config.dtype == torch.bfloat16 and gen.dtype == torch.bfloat16
    prompts = prompts_of(policy)
    old = copy.deepcopy(policy.model)
    adam_step(policy.model, prompts[1] + prompts[0], lr=1e-2)
    gen.sync_weights(policy.model)
    fresh = gen.generate(prompts, n=4)
    gap_new = max_logprob_gap(policy.model, prompts, fresh, 0.9)
    gap_old = max_logprob_gap(old, prompts, fresh, 0.9)
    print(f"bf16 engine ({name}) after a full sync: gap to new weights {gap_new:.3e}, to old weights {gap_old:.3e}")
    assert gap_new < gap_old / 10
