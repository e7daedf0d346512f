"""The production objective agrees with the naive float64 reference for every variant and switch."""

from __future__ import annotations

import itertools

import pytest
import torch

from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveInputs, group_advantages, objective_loss, per_sample_kl, sample_weights
from tests.unit.naive_objective import naive_advantages, naive_kl, naive_loss_and_grad, random_batch

VARIANTS = ["grpo", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis"]
SEEDS = range(4)
# The KL estimator and the filter rule only matter where a filter reads them.
VARIANT_FILTERS = [(v, "k3_gen", "or") for v in VARIANTS] + [
    (v, e, r) for v in VARIANTS if v.startswith("f-")
    for e, r in itertools.product(("k3_gen", "k3_theta"), ("or", "and")) if (e, r) != ("k3_gen", "or")]
# g in each reduction's unit, chosen so that the KL filter drops some peers' samples but not all.
KL_THRESHOLD = {"sum": 1.5, "mean": 0.3}


def run_production(t: dict, cfg: ObjectiveConfig, step_start: torch.Tensor):
    trainer = t["trainer"].clone().requires_grad_(True)
    adv = group_advantages(t["rewards"], t["group_ids"], scale_by_std=cfg.scale_by_std, eps=cfg.advantage_eps)
    inputs = ObjectiveInputs(
        trainer_logprobs=trainer, step_start_logprobs=step_start, generator_logprobs=t["generator"],
        mask=t["mask"], advantages=adv, is_peer=t["is_peer"],
        sample_weights=sample_weights(t["group_ids"], t["mask"].sum(1), cfg.normalization),
    )
    loss, stats = objective_loss(inputs, cfg)
    loss.backward()
    return loss, trainer.grad, stats


def assert_rel(a: float, b: float, rtol: float = 1e-6, atol: float = 1e-12) -> None:
    assert abs(a - b) <= rtol * abs(b) + atol, (a, b)


@pytest.mark.parametrize(("variant", "estimator", "rule"), VARIANT_FILTERS)
@pytest.mark.parametrize("normalization", ["sequence", "token"])
@pytest.mark.parametrize("kl_reduction", ["sum", "mean"])
@pytest.mark.parametrize("scope", ["peers", "all"])
def test_loss_and_gradient_match_naive_reference(variant, estimator, rule, normalization, kl_reduction, scope):
    cfg = ObjectiveConfig(variant=variant, normalization=normalization, kl_reduction=kl_reduction,
                          filter_scope=scope, kl_threshold=KL_THRESHOLD[kl_reduction], kl_estimator=estimator,
                          filter_rule=rule)
    for seed, epoch in itertools.product(SEEDS, ("first", "later")):
        batch = random_batch(seed)
        t, naive = batch["tensors"], batch["naive"]
        if epoch == "first":  # step start == trainer: R = 1
            step_start = t["trainer"].clone()
            naive.step_start = naive.trainer
        else:
            step_start = t["step_start"]
        loss, grad, _ = run_production(t, cfg, step_start)
        ref_loss, ref_grad = naive_loss_and_grad(
            naive, variant, c=cfg.truncation_c, eps=cfg.clip_eps, g=cfg.kl_threshold,
            kl_reduction=kl_reduction, kl_estimator=estimator, filter_rule=rule, scope=scope,
            normalization=normalization,
        )
        assert torch.isfinite(grad).all()
        assert_rel(float(loss.detach()), ref_loss)
        torch.testing.assert_close(grad, torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-6, atol=1e-12)


def test_reference_batches_exercise_every_branch():
    """The random batches above really filter, truncate and clip (so the comparison is not vacuous)."""
    totals = {"filtered_nonpositive_advantage": 0, "filtered_kl": 0, "truncated_fraction": 0, "clipped_fraction": 0}
    kl_filtered = {"k3_gen": 0, "k3_theta": 0}
    zero_adv = nonzero_adv = 0
    for seed, estimator in itertools.product(SEEDS, kl_filtered):
        t = random_batch(seed)["tensors"]
        cfg = ObjectiveConfig(variant="f-tis", kl_threshold=1.5, kl_estimator=estimator)
        d = run_production(t, cfg, t["step_start"])[2].to_dict()
        for k in totals:
            totals[k] += d[k]
        kl_filtered[estimator] += d["filtered_kl"]
        if estimator == "k3_theta":
            continue
        adv = group_advantages(t["rewards"], t["group_ids"])
        zero_adv += int((adv == 0).sum())
        nonzero_adv += int((adv != 0).sum())
    assert all(v > 0 for v in totals.values()), totals
    assert all(0 < v < sum(len(random_batch(s)["naive"].rewards) for s in SEEDS) for v in kl_filtered.values())
    assert zero_adv > 0 and nonzero_adv > 0


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_advantages_and_kl_match_naive(scale_by_std):
    for seed in SEEDS:
        batch = random_batch(seed)
        t, naive = batch["tensors"], batch["naive"]
        adv = group_advantages(t["rewards"], t["group_ids"], scale_by_std=scale_by_std, eps=1e-4)
        ref = naive_advantages(naive.rewards, naive.group_ids, scale_by_std, 1e-4)
        torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        for reduction, estimator in itertools.product(("sum", "mean"), ("k3_gen", "k3_theta")):
            kl = per_sample_kl(t["step_start"], t["generator"], t["mask"], reduction, estimator)
            ref_kl = [naive_kl(naive.step_start[i], naive.generator[i], naive.mask[i], reduction, estimator)
                      for i in range(len(naive.rewards))]
            torch.testing.assert_close(kl, torch.tensor(ref_kl, dtype=torch.float64), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", ["grpo", "vis", "f-tis"])
def test_float32_inputs_agree_with_reference_to_float32_precision(variant):
    cfg = ObjectiveConfig(variant=variant, kl_threshold=1.5)
    batch = random_batch(7)
    t, naive = batch["tensors"], batch["naive"]
    t32 = {k: (v.float() if v.is_floating_point() else v) for k, v in t.items()}
    naive.trainer, naive.step_start, naive.generator = (
        t32["trainer"].double().tolist(), t32["step_start"].double().tolist(), t32["generator"].double().tolist())
    loss, grad, _ = run_production(t32, cfg, t32["step_start"])
    ref_loss, ref_grad = naive_loss_and_grad(naive, variant, g=1.5)
    assert loss.dtype == torch.float32
    assert_rel(float(loss.detach()), ref_loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad.double(), torch.tensor(ref_grad, dtype=torch.float64), rtol=1e-4, atol=1e-7)
