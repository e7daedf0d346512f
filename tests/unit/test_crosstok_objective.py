"""F-TIS over chunks (ObjectiveInputs.chunk_ids): one token per chunk is exactly today's per-token
objective; weights, KL and gradients on known chunk probabilities."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveInputs, group_advantages, objective_loss, sample_weights
from tests.unit.naive_objective import random_batch
from tests.unit.test_objective_reference import KL_THRESHOLD, VARIANT_FILTERS


def run(t: dict, cfg: ObjectiveConfig, step_start: torch.Tensor, chunk_ids: torch.Tensor | None):
    trainer = t["trainer"].clone().requires_grad_(True)
    adv = group_advantages(t["rewards"], t["group_ids"], scale_by_std=cfg.scale_by_std, eps=cfg.advantage_eps)
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer, step_start_logprobs=step_start, generator_logprobs=t["generator"],
        mask=t["mask"], advantages=adv, is_peer=t["is_peer"],
        sample_weights=sample_weights(t["group_ids"], t["mask"].sum(1), cfg.normalization), chunk_ids=chunk_ids)
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    return loss.detach(), trainer.grad, stats.to_dict()


@pytest.mark.parametrize(("variant", "estimator", "rule"), VARIANT_FILTERS)
@pytest.mark.parametrize("kl_reduction", ["sum", "mean"])
@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_one_token_per_chunk_is_exactly_the_per_token_objective(variant, estimator, rule, kl_reduction,
                                                                normalization) -> None:
    cfg = ObjectiveConfig(variant=variant, kl_reduction=kl_reduction, kl_threshold=KL_THRESHOLD[kl_reduction],
                          kl_estimator=estimator, filter_rule=rule, normalization=normalization)
    for seed, epoch in itertools.product(range(4), ("first", "later")):
        t = random_batch(seed)["tensors"]
        step_start = t["trainer"].clone() if epoch == "first" else t["step_start"]
        b, width = t["mask"].shape
        positions = torch.arange(width).expand(b, width).clone()
        positions[~t["mask"]] = 5  # any value on padding
        loss, grad, stats = run(t, cfg, step_start, None)
        loss_c, grad_c, stats_c = run(t, cfg, step_start, positions)
        assert torch.equal(loss, loss_c), (float(loss), float(loss_c))
        assert torch.equal(grad, grad_c)
        assert stats == stats_c


def known_batch(variant: str, reduction: str = "sum", advantage: float = 1.0):
    """One peer sample of 4 own tokens in 3 chunks [t0 t1 | t2 | t3] plus an own partner.

    Own probabilities 0.5, 0.4 | 0.3 | 0.9 -> chunks 0.2, 0.3, 0.9; generator chunks 0.05, 0.6, 0.9:
    rho = 4 (truncated at C = 2), 0.5, 1."""
    own = torch.tensor([[0.5, 0.4, 0.3, 0.9]], dtype=torch.float64).log()
    gen_chunks = torch.tensor([0.05, 0.6, 0.9], dtype=torch.float64).log()
    gen = torch.tensor([[0.0, gen_chunks[0], gen_chunks[1], gen_chunks[2]]], dtype=torch.float64)
    trainer = own.clone().requires_grad_(True)
    cfg = ObjectiveConfig(variant=variant, kl_reduction=reduction, kl_threshold=1e9)
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer, step_start_logprobs=own.clone(), generator_logprobs=gen,
        mask=torch.ones(1, 4, dtype=torch.bool), advantages=torch.tensor([advantage], dtype=torch.float64),
        is_peer=torch.tensor([True]), sample_weights=torch.tensor([0.25], dtype=torch.float64),
        chunk_ids=torch.tensor([[0, 0, 1, 2]]))
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    return loss.detach(), trainer.grad[0], stats.to_dict()


def test_truncated_chunk_weight_applies_to_each_own_token() -> None:
    _, grad, stats = known_batch("tis")
    # first epoch (R = 1): d(-J)/d log pi(t) = -w A min(rho_chunk, C)
    assert torch.allclose(grad, torch.tensor([-0.25 * 2, -0.25 * 2, -0.25 * 0.5, -0.25 * 1.0], dtype=torch.float64))
    assert stats["is_weight_peer_mean"] == pytest.approx((4 + 4 + 0.5 + 1) / 4)
    assert stats["is_weight_peer_max"] == pytest.approx(4.0)
    assert stats["truncated_peer_fraction"] == pytest.approx(0.5)  # both tokens of the first chunk


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_kl_is_the_same_estimator_over_chunks(reduction: str) -> None:
    _, _, stats = known_batch("f-tis", reduction)
    ratios = [0.2 / 0.05, 0.3 / 0.6, 0.9 / 0.9]  # r = pi_theta / pi_gen per chunk
    k3_gen = sum(r - 1 - math.log(r) for r in ratios)
    k3_theta = sum(1 / r - 1 + math.log(r) for r in ratios)  # e^d - d - 1, d = -log r
    n = 1 if reduction == "sum" else 3  # mean over the 3 chunks, not the 4 tokens
    assert stats["kl_peer_k3_gen_max"] == pytest.approx(k3_gen / n)
    assert stats["kl_peer_k3_theta_max"] == pytest.approx(k3_theta / n)


def test_vis_ratio_and_clip_are_per_chunk() -> None:
    loss, grad, _ = known_batch("vis")
    # chunk 0: r = 4 > 1 + eps with A > 0: clipped, no gradient; chunk 1: r = 0.5 (unclipped for A > 0):
    # gradient -w A r on its token; chunk 2: r = 1 on its token. Each chunk's term counts once.
    assert torch.allclose(grad, torch.tensor([0.0, 0.0, -0.25 * 0.5, -0.25 * 1.0], dtype=torch.float64))
    assert float(loss) == pytest.approx(-0.25 * (1.2 + 0.5 + 1.0))


def test_kl_filter_reads_chunk_kl() -> None:
    """g between the per-chunk and a per-token reading of the same sample: the filter drops it."""
    own = torch.tensor([[0.5, 0.4, 0.3, 0.9]], dtype=torch.float64).log()
    gen = torch.tensor([[0.0, math.log(0.05), math.log(0.6), math.log(0.9)]], dtype=torch.float64)
    k3 = sum(r - 1 - math.log(r) for r in (4.0, 0.5, 1.0))
    base = dict(trainer_logprobs=own.clone().requires_grad_(True), step_start_logprobs=own, generator_logprobs=gen,
                mask=torch.ones(1, 4, dtype=torch.bool), advantages=torch.tensor([1.0], dtype=torch.float64),
                is_peer=torch.tensor([True]), sample_weights=torch.tensor([0.25], dtype=torch.float64))
    for g, dropped in ((k3 - 1e-6, 1.0), (k3 + 1e-6, 0.0)):
        cfg = ObjectiveConfig(variant="f-tis", kl_threshold=g)
        stats = objective_loss(ObjectiveInputs(**base, chunk_ids=torch.tensor([[0, 0, 1, 2]])), cfg)[1].to_dict()
        assert stats["filtered_kl"] == dropped


def test_chunk_ids_must_match_the_mask() -> None:
    with pytest.raises(ValueError, match="chunk_ids"):
        ObjectiveInputs(trainer_logprobs=torch.zeros(1, 3), step_start_logprobs=torch.zeros(1, 3),
                        generator_logprobs=torch.zeros(1, 3), mask=torch.ones(1, 3, dtype=torch.bool),
                        advantages=torch.zeros(1), is_peer=torch.tensor([True]), sample_weights=torch.zeros(1),
                        chunk_ids=torch.zeros(1, 2, dtype=torch.long))
