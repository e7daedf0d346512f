"""Behaviour the method promises (docs/method.md), each checked on concrete values."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveInputs, ObjectiveStats, group_advantages, objective_loss, sample_weights
from tests.unit.naive_objective import random_batch

VARIANTS = ["grpo", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis"]


def make_inputs(t: dict, *, trainer=None, step_start=None, generator=None, is_peer=None, advantages=None,
                normalization="sequence") -> ObjectiveInputs:
    trainer = (t["trainer"] if trainer is None else trainer).clone().requires_grad_(True)
    return ObjectiveInputs(
        trainer_logprobs=trainer,
        step_start_logprobs=t["step_start"] if step_start is None else step_start,
        generator_logprobs=t["generator"] if generator is None else generator,
        mask=t["mask"],
        advantages=group_advantages(t["rewards"], t["group_ids"]) if advantages is None else advantages,
        is_peer=t["is_peer"] if is_peer is None else is_peer,
        sample_weights=sample_weights(t["group_ids"], t["mask"].sum(1), normalization),
    )


def loss_and_grad(inputs: ObjectiveInputs, cfg: ObjectiveConfig):
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    return loss.detach(), inputs.trainer_logprobs.grad, stats


@pytest.mark.parametrize("variant", VARIANTS)
def test_on_policy_every_variant_equals_grpo(variant):
    """pi_theta == pi_gen == pi_theta_old: weights are 1, nothing clips, KL is 0."""
    t = random_batch(1)["tensors"]
    on_policy = t["trainer"]
    own = torch.zeros_like(t["is_peer"])
    ref = loss_and_grad(make_inputs(t, step_start=on_policy, generator=on_policy, is_peer=own),
                        ObjectiveConfig(variant="grpo"))
    got = loss_and_grad(make_inputs(t, step_start=on_policy, generator=on_policy, is_peer=own),
                        ObjectiveConfig(variant=variant))
    torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-12, atol=1e-15)
    assert float(ref[0]) != 0.0
    # Peers' samples, on-policy: the only difference the filters make is dropping A <= 0.
    peers = torch.ones_like(own)
    got = loss_and_grad(make_inputs(t, step_start=on_policy, generator=on_policy, is_peer=peers),
                        ObjectiveConfig(variant=variant))
    adv = group_advantages(t["rewards"], t["group_ids"])
    expected_adv = adv.clamp(min=0) if ObjectiveConfig(variant=variant).filter == "on" else adv
    exp = loss_and_grad(make_inputs(t, step_start=on_policy, generator=on_policy, is_peer=own,
                                    advantages=expected_adv), ObjectiveConfig(variant="grpo"))
    torch.testing.assert_close(got[1], exp[1], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_tis_token_gradient_is_minus_advantage_times_truncated_weight(normalization):
    t = random_batch(2)["tensors"]
    inputs = make_inputs(t, step_start=t["trainer"], normalization=normalization)
    _, grad, _ = loss_and_grad(inputs, ObjectiveConfig(variant="tis"))
    rho = torch.exp(t["trainer"] - t["generator"])
    expected = -inputs.advantages[:, None] * rho.clamp(max=2.0) * inputs.sample_weights[:, None]
    expected = torch.where(t["mask"], expected, 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert (rho[t["mask"]] > 2).any() and (rho[t["mask"]] < 2).any()


def test_lowering_pi_gen_never_pushes_the_weight_above_c():
    """One peer token; as log pi_gen falls (pi_gen -> 0, rho -> inf) the weight rises to C, never past."""
    c = 2.0
    weights = []
    for gen_logprob in [-0.1, -0.5, -1.0, -1.6, -2.0, -5.0, -50.0, -1e4]:
        trainer = torch.tensor([[-1.0]], dtype=torch.float64)
        inputs = ObjectiveInputs(
            trainer_logprobs=trainer.clone().requires_grad_(True), step_start_logprobs=trainer,
            generator_logprobs=torch.tensor([[gen_logprob]], dtype=torch.float64),
            mask=torch.ones(1, 1, dtype=torch.bool), advantages=torch.tensor([1.5], dtype=torch.float64),
            is_peer=torch.ones(1, dtype=torch.bool), sample_weights=torch.ones(1, dtype=torch.float64),
        )
        _, grad, _ = loss_and_grad(inputs, ObjectiveConfig(variant="tis", truncation_c=c))
        weights.append(float(-grad[0, 0]) / 1.5)
    assert all(math.isfinite(w) and w <= c for w in weights)
    assert weights == sorted(weights)
    assert weights[-1] == c and weights[0] == pytest.approx(math.exp(-0.9))


@pytest.mark.parametrize("reason", ["advantage", "kl"])
def test_filtered_sample_shapes_advantages_but_has_zero_gradient(reason):
    # One group of four peer samples; sample 0 gets filtered.
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64) if reason == "advantage" else \
        torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    group_ids = torch.zeros(4, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    trainer = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    generator = trainer + 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    if reason == "kl":
        trainer[0] -= 10.0  # pi_gen far above pi_theta: k3_gen per token ~ 9, so 6 tokens sum above g = 50
    t = {"trainer": trainer, "step_start": trainer, "generator": generator,
         "mask": torch.ones(4, 6, dtype=torch.bool), "rewards": rewards, "group_ids": group_ids,
         "is_peer": torch.ones(4, dtype=torch.bool)}
    adv = group_advantages(rewards, group_ids)
    # Sample 0 still counts: the others' advantages are those of the full group, not of the rest.
    rest = group_advantages(rewards[1:], group_ids[1:])
    assert not torch.allclose(adv[1:], rest)
    _, grad_f, stats = loss_and_grad(make_inputs(t), ObjectiveConfig(variant="f-tis"))
    _, grad_u, _ = loss_and_grad(make_inputs(t), ObjectiveConfig(variant="tis"))
    assert torch.equal(grad_f[0], torch.zeros(6, dtype=torch.float64))
    assert grad_u[0].abs().sum() > 0
    keep = [1, 3] if reason == "advantage" else [1]  # f-tis also drops the A <= 0 samples
    torch.testing.assert_close(grad_f[keep], grad_u[keep], rtol=0, atol=0)
    d = stats.to_dict()
    assert d["filtered_kl" if reason == "kl" else "filtered_nonpositive_advantage"] >= 1


@pytest.mark.parametrize("variant", ["f-nois", "f-vis", "f-tis"])
def test_all_filtered_gives_zero_loss_and_zero_gradient(variant):
    t = random_batch(3)["tensors"]
    peers = torch.ones_like(t["is_peer"])
    inputs = make_inputs(t, is_peer=peers, advantages=-torch.rand(len(peers), dtype=torch.float64))
    loss, grad, stats = loss_and_grad(inputs, ObjectiveConfig(variant=variant))
    assert float(loss) == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))
    d = stats.to_dict()
    assert d["filtered_fraction"] == 1.0 and d["active_tokens"] == 0.0
    assert all(math.isfinite(v) for v in d.values())


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_never_changes_the_loss(variant):
    t = random_batch(4, pad_extra=0)["tensors"]
    cfg = ObjectiveConfig(variant=variant, kl_threshold=1.5)
    base = loss_and_grad(make_inputs(t), cfg)
    for fill in (float("nan"), float("inf"), -1e30, 3.0):
        wide = dict(t)
        for k in ("trainer", "step_start", "generator"):
            wide[k] = torch.cat([t[k], torch.full((t[k].shape[0], 5), fill, dtype=torch.float64)], dim=1)
        wide["mask"] = torch.cat([t["mask"], torch.zeros(t["mask"].shape[0], 5, dtype=torch.bool)], dim=1)
        loss, grad, stats = loss_and_grad(make_inputs(wide), cfg)
        torch.testing.assert_close(loss, base[0], rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(grad[:, :-5], base[1], rtol=1e-13, atol=1e-15)
        assert torch.equal(grad[:, -5:], torch.zeros_like(grad[:, -5:]))
        assert stats.to_dict() == pytest.approx(base[2].to_dict(), rel=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_micro_batch_losses_and_stats_add_up_to_the_full_batch(variant, normalization):
    t = random_batch(5, n_groups=6)["tensors"]
    cfg = ObjectiveConfig(variant=variant, kl_threshold=1.5)
    full = make_inputs(t, normalization=normalization)
    loss_full, grad_full, stats_full = loss_and_grad(full, cfg)
    total, merged, grads = 0.0, ObjectiveStats.empty(), []
    b = full.trainer_logprobs.shape[0]
    for lo in range(0, b, 3):
        sl = slice(lo, lo + 3)
        part = ObjectiveInputs(
            trainer_logprobs=full.trainer_logprobs.detach()[sl].clone().requires_grad_(True),
            step_start_logprobs=full.step_start_logprobs[sl], generator_logprobs=full.generator_logprobs[sl],
            mask=full.mask[sl], advantages=full.advantages[sl], is_peer=full.is_peer[sl],
            sample_weights=full.sample_weights[sl])
        loss, grad, stats = loss_and_grad(part, cfg)
        total += float(loss)
        merged.merge(stats)
        grads.append(grad)
    assert total == pytest.approx(float(loss_full), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(torch.cat(grads), grad_full, rtol=1e-12, atol=1e-15)
    assert merged.to_dict() == pytest.approx(stats_full.to_dict(), rel=1e-12, abs=1e-15)


def test_filter_scope_all_also_filters_own_samples():
    t = random_batch(6)["tensors"]
    own = torch.zeros_like(t["is_peer"])
    adv = group_advantages(t["rewards"], t["group_ids"])
    _, g_peers, s_peers = loss_and_grad(make_inputs(t, is_peer=own), ObjectiveConfig(variant="f-tis"))
    _, g_all, s_all = loss_and_grad(make_inputs(t, is_peer=own), ObjectiveConfig(variant="f-tis", filter_scope="all"))
    assert s_peers.to_dict()["filtered"] == 0
    assert s_all.to_dict()["filtered_nonpositive_advantage"] == float((adv <= 0).sum()) > 0
    assert torch.equal(g_all[adv <= 0], torch.zeros_like(g_all[adv <= 0]))
    assert g_peers[adv < 0].abs().sum() > 0


def test_later_epoch_clips_ratio_to_old_policy():
    """R beyond 1+eps with A > 0 gets no gradient (PPO clip), whatever the importance weight."""
    trainer = torch.tensor([[-0.5, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-0.5 - 0.5, -0.5 - 0.1]], dtype=torch.float64)  # R = e^0.5 (clipped), e^0.1
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer.clone().requires_grad_(True), step_start_logprobs=old, generator_logprobs=trainer,
        mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.tensor([1.0], dtype=torch.float64),
        is_peer=torch.tensor([True]), sample_weights=torch.tensor([0.5], dtype=torch.float64))
    loss, grad, stats = loss_and_grad(inputs, ObjectiveConfig(variant="f-tis"))
    assert grad[0, 0] == 0.0
    # Decoupled weight min(pi_old/pi_gen, C) = e^-0.1 times the slope of R = e^0.1: exactly 1.
    assert float(grad[0, 1]) == pytest.approx(-0.5)
    assert float(loss) == pytest.approx(-0.5 * (1.2 * math.exp(-0.5) + 1.0))
    assert stats.to_dict()["clipped_fraction"] == 0.5
