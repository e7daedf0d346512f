"""The vLLM backend against the contract: shapes, finish reasons, logprobs equal to the trainer's
tempered scoring, and weight sync (full and LoRA) without an engine restart."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (scripts/setup_vllm_env.sh builds the environment)")

from swarm_node.policy.scoring import token_logprobs  # noqa: E402
from swarm_node.policy.types import GeneratedCompletion  # noqa: E402
from swarm_node.policy.vllm_engine import vllm_lora_rank  # noqa: E402
from swarm_node.policy.vllm_generator import request_seed  # noqa: E402

pytestmark = pytest.mark.vllm

TOL = 1e-3  # generator vs trainer logprobs, float32 on both sides


def prompts_of(policy, texts=("hello world", "12 + 30 =", "a")) -> list[list[int]]:
    return [policy.tokenizer.encode(t, add_special_tokens=False) for t in texts]


def max_logprob_gap(model, prompts, groups, temperature) -> float:
    """Largest |generator logprob - trainer logprob| over every sampled token."""
    flat_prompts = [p for p, group in zip(prompts, groups) for _ in group]
    flat = [c for group in groups for c in group]
    with torch.no_grad():
        trainer = token_logprobs(model, flat_prompts, [c.token_ids.tolist() for c in flat], temperature, 8)
    return max(float(np.abs(t.numpy() - c.logprobs).max()) for t, c in zip(trainer, flat))


def adam_step(model: torch.nn.Module, token_ids: list[int], lr: float = 1e-2) -> None:
    """One AdamW step on the language-modelling loss of `token_ids` (every trainable weight moves)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids = torch.tensor([token_ids])
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()


def test_helpers() -> None:
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError):
        vllm_lora_rank(513)
    seeds = {request_seed(s, c, p) for s in range(3) for c in range(3) for p in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 2**62 for s in seeds)
    assert request_seed(1, 2, 3) == request_seed(1, 2, 3)


def test_generate_shapes_finish_reasons_and_seeds(make_policy, make_generator) -> None:
    policy = make_policy()
    gen = make_generator(policy, temperature=0.8, max_new_tokens=8)
    stops = set(policy.stop_token_ids)
    prompts = prompts_of(policy)
    groups = gen.generate(prompts, n=8)
    assert [len(g) for g in groups] == [8, 8, 8]
    reasons = set()
    for group in groups:
        assert len({tuple(c.token_ids) for c in group}) > 1  # each child samples with its own seed
        for c in group:
            assert isinstance(c, GeneratedCompletion)
            assert c.token_ids.dtype == np.int64 and c.logprobs.dtype == np.float32
            assert c.token_ids.shape == c.logprobs.shape and 1 <= len(c.token_ids) <= 8
            assert np.all(np.isfinite(c.logprobs)) and np.all(c.logprobs <= 0)
            assert not stops & set(c.token_ids[:-1].tolist())  # nothing generated after a stop
            if c.finish_reason == "stop":
                assert int(c.token_ids[-1]) in stops
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == 8
                assert int(c.token_ids[-1]) not in stops
            reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}
    # Rewinding the call counter replays the same per-request seeds, hence the same samples.
    again = gen.generate(prompts, n=8)
    assert [c.token_ids.tolist() for c in again[0]] != [c.token_ids.tolist() for c in groups[0]]
    gen.load_state_dict({"calls": torch.tensor(0)})
    replay = gen.generate(prompts, n=8)
    for g1, g2 in zip(groups, replay):
        assert [c.token_ids.tolist() for c in g1] == [c.token_ids.tolist() for c in g2]
    with pytest.raises(ValueError):
        gen.generate([[]], n=2)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_logprobs_match_trainer_scoring(make_policy, make_generator, temperature: float) -> None:
    policy = make_policy()
    gen = make_generator(policy, temperature=temperature, max_new_tokens=32)
    prompts = prompts_of(policy)
    groups = gen.generate(prompts, n=4)
    gap = max_logprob_gap(policy.model, prompts, groups, temperature)
    print(f"vllm vs trainer max |logprob gap| at T={temperature}: {gap:.3e}")
    assert gap < TOL
    # The untempered distribution is measurably different, so the check above sees temperature.
    assert max_logprob_gap(policy.model, prompts, groups, 1.0) > 100 * TOL


def step_then_sync(policy, gen, lr: float, label: str) -> tuple[float, float]:
    """An AdamW step on the policy, then `gen.sync_weights`: before the sync the engine samples
    from the old weights; returns the gaps of fresh samples to the new and to the old weights."""
    prompts = prompts_of(policy)
    old_model = copy.deepcopy(policy.model)
    adam_step(policy.model, prompts[1] + prompts[0], lr=lr)
    stale = gen.generate(prompts, n=4)  # before the sync the engine still has the old weights
    assert max_logprob_gap(old_model, prompts, stale, 0.9) < TOL
    gen.sync_weights(policy.model)
    fresh = gen.generate(prompts, n=4)
    gap_new = max_logprob_gap(policy.model, prompts, fresh, 0.9)
    gap_old = max_logprob_gap(old_model, prompts, fresh, 0.9)
    print(f"after {label} sync: gap to new weights {gap_new:.3e}, to old weights {gap_old:.3e}")
    return gap_new, gap_old


@pytest.mark.parametrize("name", ["tiny-random:128x2", "tiny-random:128x2-tied"])  # tied: as SmolLM2
def test_full_weight_sync_after_optimizer_step(make_policy, make_generator, name: str) -> None:
    policy = make_policy(name=name)
    assert policy.model.config.tie_word_embeddings == name.endswith("-tied")
    gen = make_generator(policy, temperature=0.9, max_new_tokens=24)
    gap_new, gap_old = step_then_sync(policy, gen, 1e-2, "full")
    assert gap_new < TOL
    assert gap_old > 100 * TOL


def test_lora_adapter_sync(make_policy, make_generator) -> None:
    policy = make_policy(lora_rank=8)
    gen = make_generator(policy, temperature=0.9, max_new_tokens=24)
    assert gen.weight_version == 1  # the initial adapter is loaded at construction
    gap_new, gap_old = step_then_sync(policy, gen, 5e-2, "LoRA adapter")  # moves only adapter weights
    assert gen.weight_version == 2
    assert gap_new < TOL
    assert gap_old > 10 * TOL


def test_lora_merged_sync(make_policy, make_generator) -> None:
    """`vllm_lora_sync = "merged"`: the engine runs without LoRA kernels on base + adapter delta."""
    policy = make_policy(lora_rank=8)
    base_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    gen = make_generator(policy, temperature=0.9, max_new_tokens=24, vllm_lora_sync="merged")
    gap_new, gap_old = step_then_sync(policy, gen, 5e-2, "merged LoRA")
    assert gen.weight_version == 0  # no adapter versions in this mode
    assert gap_new < TOL
    assert gap_old > 10 * TOL
    # Merging happened in copies: the trainer's base weights are bit-identical.
    assert all(torch.equal(base_before[n], p) for n, p in policy.model.named_parameters() if "lora_" not in n)
