"""The filter rule (`objective.filter_rule`: the paper's text `or`, the authors' code `and`) and the
peer statistics the filters report, each on inputs whose answer is known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveInputs, carries_gradient, objective_loss, unscored_stats

# Five samples of two tokens: four peers covering (A > 0 | A < 0) x (KL low | KL high), and one own
# sample with A < 0 and a high KL, outside the default filter scope (peers).
ADV = [1.0, 1.0, -1.0, -1.0, -1.0]
HIGH_KL = [False, True, False, True, True]
IS_PEER = [True, True, True, True, False]


def known_inputs() -> ObjectiveInputs:
    gen = torch.full((5, 2), -1.0, dtype=torch.float64)
    # pi_theta = e^-10 pi_gen on both tokens of a high-KL sample: k3_gen = e^-10 - 1 + 10 ~ 9 per token
    trainer = gen - torch.tensor([10.0 if h else 0.0 for h in HIGH_KL], dtype=torch.float64)[:, None]
    return ObjectiveInputs(
        trainer_logprobs=trainer.clone().requires_grad_(True), step_start_logprobs=trainer, generator_logprobs=gen,
        mask=torch.ones(5, 2, dtype=torch.bool), advantages=torch.tensor(ADV, dtype=torch.float64),
        is_peer=torch.tensor(IS_PEER), sample_weights=torch.full((5,), 0.1, dtype=torch.float64))


@pytest.mark.parametrize(("rule", "dropped"), [
    ("or", [False, True, True, True, False]),  # the paper's text: A <= 0 or KL > g
    ("and", [False, False, False, True, False]),  # the authors' code: A <= 0 and KL > g
])
def test_filter_rule_drops_exactly_the_known_samples(rule, dropped):
    inputs = known_inputs()
    cfg = ObjectiveConfig(variant="f-nois", filter_rule=rule, kl_threshold=5.0)
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    grad = inputs.trainer_logprobs.grad
    # f-nois, first epoch: d loss / d logprob = -w * A' per valid token
    expected = torch.tensor([[0.0 if d else -0.1 * a] * 2 for a, d in zip(ADV, dropped, strict=True)],
                            dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    d = stats.to_dict()
    n_dropped = sum(dropped)
    assert d["filtered"] == n_dropped and d["filtered_fraction"] == n_dropped / 5
    # the two conditions are counted the same under both rules (peers meeting each)
    assert d["filtered_nonpositive_advantage"] == 2 and d["filtered_kl"] == 2
    assert d["peer_samples"] == 4 and d["peer_samples_used"] == 4 - n_dropped
    assert d["peer_samples_gradient"] == 4 - n_dropped  # every kept peer sample has A != 0 here
    # the KL condition reads the configured estimator; both estimators' peer distributions are reported
    high = 2 * (math.exp(-10.0) - 1 + 10.0)
    assert d["kl_peer_max"] == pytest.approx(high) and d["kl_peer_k3_gen_max"] == pytest.approx(high)
    assert d["kl_peer_k3_theta_max"] == pytest.approx(2 * (math.exp(10.0) - 10.0 - 1))
    assert d["kl_peer_k3_gen_p50"] == pytest.approx(high / 2)  # two of four peers at 0, two at `high`


def test_filter_rule_and_with_k3_theta_mean_is_the_authors_setting():
    """The authors' code: token-mean k3_theta > 5 and A <= 0. Sample 3 (A < 0, mean k3_theta ~ e^10) only."""
    inputs = known_inputs()
    cfg = ObjectiveConfig(variant="f-tis", filter_rule="and", kl_estimator="k3_theta", kl_reduction="mean",
                          kl_threshold=5.0)
    d = objective_loss(inputs, cfg)[1].to_dict()
    assert d["filtered"] == 1 and d["filtered_kl"] == 2
    assert d["kl_peer_max"] == pytest.approx(math.exp(10.0) - 11.0)  # per token: the mean unit


@pytest.mark.parametrize(("rule", "expected"), [("or", [False, False, True]), ("and", [False, True, True])])
def test_carries_gradient_and_unscored_counts_follow_the_rule(rule, expected):
    adv = torch.tensor([0.0, -1.0, 1.0], dtype=torch.float64)
    peer = torch.ones(3, dtype=torch.bool)
    cfg = ObjectiveConfig(variant="f-tis", filter_rule=rule)
    # under `and` a negative-advantage peer sample still needs its KL: it is scored
    assert carries_gradient(adv, peer, cfg).tolist() == expected
    left_out = ~carries_gradient(adv, peer, cfg)
    d = unscored_stats(adv[left_out], peer[left_out], cfg).to_dict()
    assert d["filtered_nonpositive_advantage"] == int(left_out.sum())
    assert d["filtered"] == (int(left_out.sum()) if rule == "or" else 0)  # `and`: KL unknown, not dropped
    assert d["peer_samples_gradient"] == 0
    assert not carries_gradient(adv, peer, ObjectiveConfig(variant="tis", filter_rule=rule))[0]  # A = 0: never


def test_peer_importance_weights_leave_own_tokens_out():
    """is_weight_mean averages every scored token; is_weight_peer_mean peers' tokens only."""
    theta = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    gen = torch.tensor([[-1.0, -1.0], [-3.0, -1.0], [-0.5, float("nan")]], dtype=torch.float64)
    inputs = ObjectiveInputs(
        trainer_logprobs=theta.clone().requires_grad_(True), step_start_logprobs=theta, generator_logprobs=gen,
        mask=torch.tensor([[True, True], [True, True], [True, False]]),
        advantages=torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64), is_peer=torch.tensor([False, True, True]),
        sample_weights=torch.full((3,), 0.2, dtype=torch.float64))
    d = objective_loss(inputs, ObjectiveConfig(variant="tis"))[1].to_dict()
    peer_rho = [math.exp(2.0), 1.0, math.exp(-0.5)]
    assert d["peer_tokens"] == 3 and d["tokens"] == 5
    assert d["is_weight_peer_mean"] == pytest.approx(sum(peer_rho) / 3)
    assert d["is_weight_mean"] == pytest.approx((sum(peer_rho) + 2.0) / 5)
    assert d["is_weight_peer_max"] == pytest.approx(math.exp(2.0))
    assert d["truncated_peer_fraction"] == pytest.approx(1 / 3) and d["truncated_fraction"] == pytest.approx(1 / 5)
    own_only = ObjectiveInputs(inputs.trainer_logprobs.detach()[:1], theta[:1], gen[:1], inputs.mask[:1],
                               inputs.advantages[:1], inputs.is_peer[:1], inputs.sample_weights[:1])
    d = objective_loss(own_only, ObjectiveConfig(variant="tis"))[1].to_dict()
    assert d["peer_tokens"] == 0 and d["is_weight_peer_mean"] == 0.0 and d["is_weight_peer_max"] == 0.0
