"""Logprob spot-checks (swarm_node/peers/spotcheck.py) and the declared model (Policy.declared_revision,
adapter_digest): the math, the budget, the declared temperature, forged groups dropped as
logprob_mismatch and blamed, honest ones taken, groups of models this node does not hold unchecked."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from protocol.messages import Completion, PromptRef, RolloutGroup, SamplingParams
from swarm_node.node import peer_rollouts
from swarm_node.config.spotcheck import SpotCheckConfig
from swarm_node.policy.models import TRAINED_SUFFIX
from swarm_node.policy.scoring import token_logprobs
from swarm_node.peers.spotcheck import (
    CHECKED,
    LOGPROB_MISMATCH,
    UNCHECKED,
    Reference,
    SpotChecker,
    check_cost,
    mismatch,
    sample_positions,
)
from swarm_node.swarm.memory import MemorySwarm
from tests.unit.test_node_loop import make_node


def test_mismatch_is_the_median_of_exp_abs_delta_minus_one() -> None:
    assert mismatch([-1.0, -2.0, -3.0], [-1.0, -2.5, -1.0]) == pytest.approx(math.expm1(0.5))
    assert mismatch([-1.0, -2.0], [-1.0, -4.0]) == pytest.approx((0.0 + math.expm1(2.0)) / 2)  # even: mean of two
    assert mismatch([], []) == 0.0
    assert mismatch([-50.0] * 3, [-0.5] * 3) == pytest.approx(math.expm1(49.5))
    assert mismatch([float("nan")], [-1.0]) == math.inf
    assert mismatch([-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]) == 0.0  # one forged position of three: the median passes


def test_positions_are_spread_within_lengths_and_the_token_budget() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(0, 40) for _ in range(rng.randint(1, 6))]
        prompt_len, budget = rng.randint(1, 30), rng.randint(0, 200)
        picked = sample_positions(lengths, prompt_len, 8, 2, budget, rng)
        assert len(picked) <= 2 and check_cost(picked, prompt_len) <= budget
        for i, pos in picked.items():
            assert pos == sorted(set(pos)) and 0 <= pos[0] and pos[-1] < lengths[i]
    assert sample_positions([10, 10], 5, 8, 2, 0, rng) == {}
    both = sample_positions([10, 10], 5, 8, 2, 10_000, random.Random(1))
    assert sorted(len(p) for p in both.values()) == [4, 4]
    short = sample_positions([2, 30], 5, 8, 2, 10_000, random.Random(1))
    assert {len(p) for p in short.values()} == {2, 6}  # the short completion gives what it has


class SharpLM(torch.nn.Module):
    """A fake causal LM: the next token's logits depend on the current token only, and are sharp."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(vocab, vocab)
        with torch.no_grad():
            self.table.weight.mul_(4.0)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, use_cache=False, **_: Any):
        logits = self.table(input_ids)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits, past_key_values=None)


def sharp_group(temperature: float, declared_temperature: float, *, revision: str = "r") -> tuple[RolloutGroup, list]:
    model, prompt = SharpLM(), [1, 2, 3]
    rng = np.random.default_rng(0)
    comps = []
    for _ in range(3):
        ids = rng.integers(0, 16, size=12).tolist()
        with torch.no_grad():
            lp = token_logprobs(model, [prompt], [ids], temperature, 1)[0].numpy()
        comps.append(Completion(token_ids=ids, logprobs=lp, finish_reason="length", claimed_reward=0.0))
    group = RolloutGroup(swarm_id="s", sender="peer", model_id="m", model_revision=revision, tokenizer_fingerprint="fp",
                         policy_version=0, created_at=0.0, prompt=PromptRef(prompt_set_id="p", index=0, sha256="0" * 64),
                         sampling=SamplingParams(temperature=declared_temperature, top_p=1.0, max_new_tokens=12),
                         completions=tuple(comps))
    return group, prompt


def sharp_session(prompt: list[int], **cfg: Any):
    ref = Reference(model=SharpLM(), tokenizer=None, model_id="m", revision="r", adapter_digest="", fingerprint="fp")
    return SpotChecker([ref], lambda _tok, _problem: prompt, SpotCheckConfig(**cfg)).session(0)


def test_the_declared_temperature_is_the_one_recomputed() -> None:
    for t in (0.5, 1.0, 1.7):
        group, prompt = sharp_group(t, t)
        session = sharp_session(prompt)
        assert session.check(group, None) is None and session.mismatches[0] < 1e-5
        other, _ = sharp_group(t, 1.0 if t != 1.0 else 0.5)  # logprobs of T declared as another temperature
        session = sharp_session(prompt)
        assert session.check(other, None) == LOGPROB_MISMATCH and session.mismatches[0] > 0.25


def test_a_check_scores_in_its_references_compute_dtype(monkeypatch) -> None:
    from swarm_node.policy import scoring

    seen = []
    real = scoring.token_logprobs

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("compute_dtype", torch.float32))
        return real(*args, **kw)

    monkeypatch.setattr(scoring, "token_logprobs", spy)
    group, prompt = sharp_group(1.0, 1.0)
    for dtype in (torch.bfloat16, torch.float32):
        ref = Reference(model=SharpLM(), tokenizer=None, model_id="m", revision="r", adapter_digest="", fingerprint="fp",
                        compute_dtype=dtype)
        session = SpotChecker([ref], lambda _tok, _problem: prompt, SpotCheckConfig()).session(0)
        assert session.check(group, None) is None
    assert seen == [torch.bfloat16, torch.float32]


def test_references_take_the_nodes_compute_dtype_and_reference_dtype(tmp_path) -> None:
    """The own model checks in the node's compute dtype; a listed reference is stored and computes in
    swarm.spot_check.reference_dtype (a validated ModelConfig: the setting is not dropped)."""
    from swarm_node.config import NodeConfig
    from swarm_node.peers.spotcheck import build_spot_checker
    from swarm_node.policy.models import load_policy

    cfg = NodeConfig.load(None, ['model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp_path}"', 'model.device="cpu"',
                                 'model.compute_dtype="bfloat16"', 'swarm.spot_check.reference_models=["tiny-random:64x1:b"]',
                                 'swarm.spot_check.reference_dtype="bfloat16"'])
    policy = load_policy(cfg.model)
    own, listed = build_spot_checker(cfg, policy, lambda _tok, _problem: [1, 2]).references
    assert own.model is policy.model and own.compute_dtype == torch.bfloat16
    assert listed.compute_dtype == torch.bfloat16 and {p.dtype for p in listed.model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in listed.model.parameters())
    fp32 = NodeConfig.load(None, ['model.name="tiny-random:64x1:a"', f'model.cache_dir="{tmp_path}"', 'model.device="cpu"',
                                  'swarm.spot_check.reference_models=["tiny-random:64x1:b"]'])
    listed = build_spot_checker(fp32, policy, lambda _tok, _problem: [1, 2]).references[1]
    assert listed.compute_dtype == torch.float32 and {p.dtype for p in listed.model.parameters()} == {torch.float32}


def test_unheld_models_are_unchecked_and_the_budget_bounds_the_work() -> None:
    group, prompt = sharp_group(1.0, 1.0)
    session = sharp_session(prompt)
    for g in (dataclasses.replace(group, model_revision="r" + TRAINED_SUFFIX),
              dataclasses.replace(group, adapter_digest="ab" * 32), dataclasses.replace(group, model_id="other"),
              dataclasses.replace(group, tokenizer_fingerprint="fp2")):
        assert session.check(g, None) is None
    assert session.counts == Counter({UNCHECKED: 4})
    tight = sharp_session(prompt, max_tokens_per_step=len(prompt) + 12)  # room for one completion's prefix
    assert tight.check(group, None) is None and tight.check(group, None) is None
    assert tight.counts[CHECKED] == 1 and tight.counts["over_budget"] == 1 and tight.tokens <= len(prompt) + 12
    none = sharp_session(prompt, budget_s=0.0)
    assert none.check(group, None) is None and none.counts == Counter({"over_budget": 1})


# ---- in a node: own model as the reference while untrained -----------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_node(tmp_path_factory.mktemp("spot"), MemorySwarm(), "R")


def honest_group(node: Any, sender: str = "peer-x", index: int = 3) -> RolloutGroup:
    parts = node.parts
    policy, problem = parts.policy, parts.prompt_set.problems[index]
    prompt = peer_rollouts.render_prompts(parts, [problem])[0]
    comps = parts.generator.generate([prompt], 4)[0]
    return RolloutGroup(
        swarm_id=parts.config.swarm.swarm_id, sender=sender, model_id=policy.model_id,
        model_revision=policy.declared_revision, adapter_digest=policy.adapter_digest,
        tokenizer_fingerprint=policy.fingerprint, policy_version=0, created_at=0.0,
        prompt=PromptRef(prompt_set_id=parts.prompt_set.id, index=problem.index, sha256=problem.sha256),
        sampling=SamplingParams(temperature=parts.config.generation.temperature, top_p=1.0,
                                max_new_tokens=parts.config.generation.max_new_tokens),
        completions=tuple(Completion(token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                                     claimed_reward=0.0) for c in comps))


def forged(group: RolloutGroup, value: float) -> RolloutGroup:
    return dataclasses.replace(group, completions=tuple(
        dataclasses.replace(c, logprobs=np.full(c.logprobs.shape, value, np.float32)) for c in group.completions))


def test_forged_logprobs_are_dropped_and_blamed_honest_groups_taken(node: Any) -> None:
    parts = node.parts
    assert not parts.policy.trained and parts.spot_checker is not None
    honest = honest_group(node, "peer-honest")
    floor, certain = forged(honest_group(node, "peer-floor", 4), -50.0), forged(honest_group(node, "peer-zero", 5), 0.0)
    drops: Counter[str] = Counter()
    batch = peer_rollouts.peer_samples(parts, [honest, floor, certain], 8, drops, step=0)
    assert batch.groups == 1 and {s.source for s in batch.samples} == {"peer-honest"}
    assert drops == Counter({LOGPROB_MISMATCH: 2})
    assert batch.spot_metrics["spot_checked"] == 3 and batch.spot_metrics["spot_mismatch"] == 2
    admission = parts.exchange.admission
    assert admission.reputation.faults["peer-floor"] >= 1 and admission.reputation.faults["peer-zero"] >= 1
    assert admission.reputation.faults.get("peer-honest", 0.0) == 0.0
    assert peer_rollouts.group_record_id(floor) in parts.rejects
    peers = {p["peer_id"]: p for p in parts.ledger.to_json()["peers"]}
    assert LOGPROB_MISMATCH in str(peers["peer-floor"]) and LOGPROB_MISMATCH not in str(peers["peer-honest"])


def test_a_trained_node_declares_no_base_revision_and_stops_checking_with_its_own_model(node: Any) -> None:
    parts = node.parts
    group = honest_group(node, "peer-late", 6)
    assert parts.policy.declared_revision == (parts.policy.revision or "")
    published: list[RolloutGroup] = []
    publish = parts.exchange.publish_groups
    parts.exchange.publish_groups = lambda groups, window: published.extend(groups) or publish(groups, window)
    try:
        node.run_step()  # step 0: groups of the untrained model, then an optimizer step
        node.run_step()
    finally:
        parts.exchange.publish_groups = publish
    assert parts.policy.trained
    assert published[0].model_revision == "" and published[-1].model_revision == TRAINED_SUFFIX
    assert parts.policy.declared_revision.endswith(TRAINED_SUFFIX)
    drops: Counter[str] = Counter()
    batch = peer_rollouts.peer_samples(parts, [forged(group, -50.0)], 8, drops, step=9)  # no reference any more
    assert LOGPROB_MISMATCH not in drops and batch.spot_metrics["spot_unchecked"] == 1


def test_a_lora_node_declares_its_current_adapter(tmp_path) -> None:
    node = make_node(tmp_path, MemorySwarm(), "L", extra=[
        "model.lora.enabled=true", "model.lora.rank=2", 'model.lora.target_modules=["q_proj","v_proj"]'])
    policy = node.parts.policy
    before = policy.adapter_digest
    assert len(before) == 64 and policy.declared_revision == "" and policy.adapter_digest == before
    node.run_step()
    assert policy.trained and policy.declared_revision == ""  # the base did not move; the adapter did
    assert policy.adapter_digest != before and len(policy.adapter_digest) == 64


def _gradient_weight(theta: torch.Tensor, gen: torch.Tensor, cfg: Any) -> float:
    from swarm_node.method.objective import ObjectiveInputs, objective_loss

    t = theta.clone()[None].requires_grad_(True)
    n = theta.shape[0]
    inputs = ObjectiveInputs(trainer_logprobs=t, step_start_logprobs=theta[None].clone(), generator_logprobs=gen[None],
                             mask=torch.ones(1, n, dtype=torch.bool), advantages=torch.tensor([1.0], dtype=torch.float64),
                             is_peer=torch.tensor([True]), sample_weights=torch.tensor([1.0], dtype=torch.float64))
    loss, _ = objective_loss(inputs, cfg)
    loss.backward()
    return float(t.grad.abs().sum())


def test_an_unchecked_forger_weighs_at_most_c_times_an_honest_sample() -> None:
    """Without a reference, forged logprobs are bounded by the F-TIS cap C and the KL filter only."""
    from swarm_node.config import ObjectiveConfig

    cfg = ObjectiveConfig()
    torch.manual_seed(0)
    theta = -torch.rand(24, dtype=torch.float64) * 3.0 - 0.05
    honest = _gradient_weight(theta, theta.clone(), cfg)
    assert honest > 0
    ratios = {v: _gradient_weight(theta, torch.full_like(theta, v), cfg) / honest for v in (-50.0, -20.0, -5.0, -1.0, 0.0)}
    ratios["just_at_c"] = _gradient_weight(theta, theta - math.log(cfg.truncation_c), cfg) / honest
    assert all(r <= cfg.truncation_c + 1e-9 for r in ratios.values())
    assert ratios["just_at_c"] == pytest.approx(cfg.truncation_c)  # the most a forger gets: every weight at C
    assert ratios[-50.0] == 0.0  # the floor forgery's KL is far over g: filtered


def test_a_listed_reference_checks_after_training_and_a_node_step_counts_the_drop(tmp_path) -> None:
    """End to end: a forger publishing the declared base model's groups with logprobs at the floor,
    and a receiver whose own model is already trained but who lists the base as a reference."""
    from tests.unit.test_poison_numerics import _tamper_logprobs

    swarm = MemorySwarm()
    evil = make_node(tmp_path, swarm, "evil")
    _tamper_logprobs(evil, -50.0)
    honest = make_node(tmp_path, swarm, "honest", extra=['swarm.spot_check.reference_models=["tiny-random:64x1:a"]'])
    honest.parts.policy.weights_changed()  # as after a step: its own model is no reference any more
    refs = honest.parts.spot_checker.references
    assert len(refs) == 2 and not refs[0].active() and refs[1].model is not honest.parts.policy.model
    assert not any(p.requires_grad for p in refs[1].model.parameters())
    evil.run_step()
    m = honest.run_step()
    assert m["dropped_logprob_mismatch"] >= 1 and m["spot_mismatch"] == m["dropped_logprob_mismatch"]
    assert m["peer_groups"] == 0 and m["spot_unchecked"] == 0
    assert honest.parts.exchange.admission.reputation.faults["evil"] >= 1


def test_honest_nodes_on_one_model_pass_each_others_checks(tmp_path) -> None:
    swarm = MemorySwarm()
    a, b = make_node(tmp_path, swarm, "A"), make_node(tmp_path, swarm, "B")
    a.run_step()  # A's step-0 groups declare the untrained base; B is untrained when it gathers them
    m = b.run_step()
    assert m["spot_checked"] >= 1 and m["peer_groups"] == m["spot_checked"]
    assert m.get("dropped_logprob_mismatch", 0.0) == 0.0 and m["spot_mismatch"] == 0.0
