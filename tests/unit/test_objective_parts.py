"""group_advantages, per_sample_kl, sample_weights, ObjectiveStats and the config defaults."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.config import NodeConfig, ObjectiveConfig
from swarm_node.method.objective import (
    ObjectiveInputs, ObjectiveStats, group_advantages, objective_loss, per_sample_kl, sample_weights,
)


def test_advantages_known_values():
    adv = group_advantages(torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0, 7, 7]))
    std = math.sqrt(1 / 3)  # sample std of [0, 1, 1, 0]
    expected = [-0.5 / (std + 1e-4), 0.5 / (std + 1e-4)] * 2 + [-0.5 / (math.sqrt(0.5) + 1e-4), 0.5 / (math.sqrt(0.5) + 1e-4)]
    expected = [expected[0], expected[1], expected[1], expected[0], expected[4], expected[5]]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    assert adv.dtype == torch.float32


def test_advantages_mean_only():
    adv = group_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64), torch.zeros(4, dtype=torch.long),
                           scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([-0.75, 0.25, 0.25, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_size_one_and_zero_variance_groups_give_exact_zero(scale_by_std):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 3.0, 0.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([5, 5, 5, 9, 2, 4, 4])  # zero-variance (0.1 x3), size 1, size 1, normal
    adv = group_advantages(rewards, groups, scale_by_std=scale_by_std)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:5], torch.zeros(5, dtype=torch.float64))
    assert adv[5] < 0 < adv[6]


def test_horizontal_union_group_is_a_shared_id_across_generators():
    # Two generators answer the same prompt. Vertical: each its own group. Horizontal: one id.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0])  # generator A: first three, B: last three
    vertical = group_advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1]))
    horizontal = group_advantages(rewards, torch.tensor([3, 3, 3, 3, 3, 3]))
    # Horizontal: relative to the swarm's mean 0.5 -> every correct answer gets the same advantage.
    assert torch.allclose(horizontal[rewards == 1], horizontal[0].expand(3))
    assert horizontal[0] > 0 > horizontal[2]
    assert not torch.allclose(vertical, horizontal)
    # Order does not matter: a permutation permutes the advantages.
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    torch.testing.assert_close(group_advantages(rewards[perm], torch.zeros(6, dtype=torch.long)), horizontal[perm])


def test_per_sample_kl_k3_sum_and_mean_ignore_padding():
    theta = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("inf"), 5.0]], dtype=torch.float64)
    gen = torch.tensor([[-1.5, -1.0, 4.0], [-0.5, -3.0, float("-inf")]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # k3_theta: d = gen - theta = -0.5, 1.0 -> e^d - d - 1
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    kl = per_sample_kl(theta, gen, mask, "sum", "k3_theta")
    torch.testing.assert_close(kl, torch.tensor([sum(k3), 0.0], dtype=torch.float64))
    kl = per_sample_kl(theta, gen, mask, "mean", "k3_theta")
    torch.testing.assert_close(kl, torch.tensor([sum(k3) / 2, 0.0], dtype=torch.float64))
    # k3_gen (the default): log r = theta - gen = 0.5, -1.0 -> r - 1 - log r
    k3g = [math.exp(0.5) - 1 - 0.5, math.exp(-1.0) - 1 + 1.0]
    torch.testing.assert_close(per_sample_kl(theta, gen, mask, "sum"), torch.tensor([sum(k3g), 0.0], dtype=torch.float64))
    kl = per_sample_kl(theta, gen, mask, "mean", "k3_gen")
    torch.testing.assert_close(kl, torch.tensor([sum(k3g) / 2, 0.0], dtype=torch.float64))
    empty = torch.zeros(1, 3, dtype=torch.bool)
    assert float(per_sample_kl(theta[:1], gen[:1], empty, "mean")[0]) == 0.0
    with pytest.raises(ValueError, match="unknown KL estimator"):
        per_sample_kl(theta, gen, mask, "sum", "k1")


def test_sample_weights_sequence_and_token():
    groups = torch.tensor([1, 1, 1, 8, 8])
    lengths = torch.tensor([2, 4, 0, 5, 1])
    w = sample_weights(groups, lengths, "sequence")
    expected = [1 / (2 * 3 * 2), 1 / (2 * 3 * 4), 0.0, 1 / (2 * 2 * 5), 1 / (2 * 2 * 1)]
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64))
    # Per group, sum_i w_i |a_i| = (samples with tokens / G) / n_groups: the empty sample counts in G.
    assert float((w * lengths).sum()) == pytest.approx(1.0 * (3 - 1) / 3 / 2 + 0.5)
    wt = sample_weights(groups, lengths, "token")
    torch.testing.assert_close(wt, torch.tensor([1 / 12, 1 / 12, 0.0, 1 / 12, 1 / 12], dtype=torch.float64))


def test_stats_values_on_a_handmade_batch():
    # Sample 0: own, 2 tokens; sample 1: peer with A <= 0 (filtered), 1 token + padding.
    trainer = torch.tensor([[-1.0, -1.0], [-2.0, float("nan")]], dtype=torch.float64)
    gen = torch.tensor([[-1.0, -3.0], [-1.0, 0.0]], dtype=torch.float64)  # rho = 1, e^2 (> C), e^-1
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer.clone().requires_grad_(True), step_start_logprobs=trainer, generator_logprobs=gen,
        mask=torch.tensor([[True, True], [True, False]]), advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
        is_peer=torch.tensor([False, True]), sample_weights=torch.tensor([0.25, 0.5], dtype=torch.float64))
    loss, stats = objective_loss(inputs, ObjectiveConfig(variant="f-tis"))
    assert float(loss.detach()) == pytest.approx(-0.25 * (1.0 + 2.0))
    d = stats.to_dict()
    rho = [1.0, math.exp(2.0), math.exp(-1.0)]
    w = [1.0, 2.0, math.exp(-1.0)]
    kl1 = math.exp(-1.0) - 1.0 + 1.0  # k3_gen: log r = theta - gen = -1
    assert d["samples"] == 2 and d["peer_samples"] == 1 and d["tokens"] == 3 and d["active_tokens"] == 2
    assert d["filtered"] == 1 and d["filtered_fraction"] == 0.5 and d["peer_samples_used"] == 0
    assert d["peer_samples_gradient"] == 0
    assert d["filtered_nonpositive_advantage"] == 1 and d["filtered_kl"] == 0
    assert d["is_weight_mean"] == pytest.approx(sum(rho) / 3)
    assert d["is_weight_max"] == pytest.approx(math.exp(2.0))
    assert d["truncated_fraction"] == pytest.approx(1 / 3)
    assert d["clipped_fraction"] == 0.0
    assert d["ess"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w) / 3)
    kl0 = math.exp(2.0) - 1.0 - 2.0  # log r = 0, 2
    assert d["kl_mean"] == pytest.approx((kl0 + kl1) / 2)
    assert d["kl_max"] == pytest.approx(kl0)
    assert d["kl_p50"] == pytest.approx((kl0 + kl1) / 2)
    assert d["kl_peer_mean"] == pytest.approx(kl1) and d["kl_peer_p99"] == pytest.approx(kl1)


def test_empty_stats_and_merge_are_neutral():
    e = ObjectiveStats.empty().to_dict()
    assert all(v == 0.0 for v in e.values())
    trainer = torch.tensor([[-1.0]], dtype=torch.float64)
    inputs = ObjectiveInputs(trainer, trainer, trainer - 1, torch.ones(1, 1, dtype=torch.bool),
                             torch.tensor([1.0], dtype=torch.float64), torch.tensor([True]),
                             torch.tensor([1.0], dtype=torch.float64))
    _, stats = objective_loss(inputs, ObjectiveConfig())
    alone = stats.to_dict()
    assert ObjectiveStats.empty().merge(stats).to_dict() == alone
    assert alone["is_weight_max"] == pytest.approx(math.e)


def test_inputs_reject_mismatched_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="generator_logprobs"):
        ObjectiveInputs(x, x, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2),
                        torch.zeros(2, dtype=torch.bool), torch.zeros(2))
    with pytest.raises(ValueError, match="bool"):
        ObjectiveInputs(x, x, x, torch.ones(2, 3), torch.zeros(2), torch.zeros(2, dtype=torch.bool), torch.zeros(2))


def test_config_defaults_are_the_papers():
    cfg = ObjectiveConfig()
    assert (cfg.correction, cfg.filter, cfg.variant_name) == ("tis", "on", "f-tis")
    assert (cfg.truncation_c, cfg.clip_eps, cfg.kl_threshold) == (2.0, 0.2, 50.0)
    assert (cfg.filter_scope, cfg.normalization, cfg.kl_reduction) == ("peers", "sequence", "sum")
    assert cfg.kl_estimator == "k3_gen"  # unbiased for KL(pi_gen || pi_theta) on the peers' samples
    with pytest.raises(ValueError):
        ObjectiveConfig(truncation_c=0)
    with pytest.raises(ValueError):
        ObjectiveConfig(variant="ppo")
    with pytest.raises(ValueError):
        ObjectiveConfig(correction="is")
    with pytest.raises(ValueError):
        ObjectiveConfig(filter=True)
    assert NodeConfig.load(overrides=["objective.correction='vis'"]).objective.variant_name == "f-vis"


def test_peer_samples_gradient_counts_nonzero_advantage_only():
    """Unfiltered variants use every peer sample, but one with A = 0 teaches nothing."""
    lp = torch.full((3, 2), -1.0, dtype=torch.float64)
    inputs = ObjectiveInputs(
        trainer_logprobs=lp.clone().requires_grad_(True), step_start_logprobs=lp, generator_logprobs=lp,
        mask=torch.ones((3, 2), dtype=torch.bool), advantages=torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64),
        is_peer=torch.tensor([True, True, True]), sample_weights=torch.full((3,), 1 / 3, dtype=torch.float64))
    tis = objective_loss(inputs, ObjectiveConfig(variant="tis"))[1].to_dict()
    assert tis["peer_samples_used"] == 3 and tis["peer_samples_gradient"] == 2
    ftis = objective_loss(inputs, ObjectiveConfig(variant="f-tis"))[1].to_dict()
    assert ftis["peer_samples_used"] == 1 and ftis["peer_samples_gradient"] == 1
