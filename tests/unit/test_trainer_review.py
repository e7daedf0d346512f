"""Review items of the trainer: one logprob definition (top_p < 1 refused), scoring in eval mode,
KL/weight statistics over every peer sample, and the decoupled multi-epoch weight (every variant
equals GRPO on on-policy data, over several epochs)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from swarm_node.config import GenerationConfig, LoraConfig, ModelConfig, NodeConfig, ObjectiveConfig, TrainConfig
from swarm_node.policy.models import load_policy
from swarm_node.policy.scoring import token_logprobs
from swarm_node.policy.trainer import Trainer
from tests.unit.test_policy_trainer import cache, make_policy, make_samples, params  # noqa: F401  (fixture)

VARIANTS = ("grpo", "nois", "vis", "tis", "f-nois", "f-vis", "f-tis")


def test_top_p_below_one_is_refused_with_one_line() -> None:
    with pytest.raises(ValidationError, match=r"generation.top_p=0.9 is not supported: set generation.top_p=1"):
        GenerationConfig(top_p=0.9)
    with pytest.raises(ValueError, match="top_p"):
        NodeConfig.load(None, ["generation.top_p=0.5"])
    assert GenerationConfig(top_p=1.0).top_p == 1.0


def test_on_policy_weights_are_exactly_one_with_lora_dropout(cache: Path) -> None:  # noqa: F811
    """Dropout is off while weights and KL are read: own on-policy samples get weight 1, KL 0."""
    cfg = ModelConfig(name="tiny-random:64x2", cache_dir=cache, device="cpu",
                      lora=LoraConfig(enabled=True, rank=4, alpha=8.0, dropout=0.5))
    policy = load_policy(cfg, seed=0)
    trainer = Trainer(policy, TrainConfig(learning_rate=1e-3), ObjectiveConfig(variant="f-tis", filter_scope="all"), 1.0)
    assert trainer.dropout
    samples = make_samples(policy, [[1.0, 0.0, 1.0, 0.0]], seed=4)
    m = trainer.step(samples)
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-4) and m["is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert m["kl_max"] < 1e-6 and m["filtered_kl"] == 0
    assert policy.model.training is False  # the caller's mode is restored (load_policy returns eval mode)


def test_kl_statistics_cover_peer_samples_without_gradient(cache: Path) -> None:  # noqa: F811
    policy = make_policy(cache)
    own = make_samples(policy, [[1.0, 0.0]], seed=1)
    # A peer group whose rewards are all equal (advantage 0: no gradient) and whose generator
    # assigned each token 0.5 nats less than this policy does: KL > 0 that only a no-grad pass sees.
    peers = [dataclasses.replace(s, generator_logprobs=(s.generator_logprobs - 0.5).astype(np.float32))
             for s in make_samples(policy, [[1.0, 1.0, 1.0]], peer=True, seed=2)]
    with torch.no_grad():
        theta = token_logprobs(policy.model, [s.prompt_ids for s in peers], [s.completion_ids for s in peers], 1.0, 4)
    # k3_gen (the default): r - 1 - log r with log r = log pi_theta - log pi_gen, summed over tokens
    expected = [float(sum(math.expm1(float(t) - float(g)) - (float(t) - float(g))
                          for g, t in zip(s.generator_logprobs, lp, strict=True))) for s, lp in zip(peers, theta)]
    m = Trainer(policy, TrainConfig(learning_rate=1e-3), ObjectiveConfig(variant="f-tis"), 1.0).step(own + peers)
    assert m["peer_samples"] == 3 and m["skipped_samples"] == 3  # no gradient ...
    assert m["kl_peer_mean"] == pytest.approx(np.mean(expected), rel=1e-3)  # ... but in the statistics
    assert m["kl_peer_max"] == pytest.approx(max(expected), rel=1e-3)
    assert m["is_weight_max"] == pytest.approx(math.exp(0.5), rel=1e-3)


@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_every_variant_equals_grpo_on_on_policy_data_over_epochs(cache: Path, variant: str) -> None:  # noqa: F811
    """With epochs_per_batch=3 the decoupled weight min(pi_old/pi_gen, C) is 1 for on-policy data in
    every epoch, so every variant takes GRPO's three updates; peers' samples too where no filter
    applies (an f-* variant drops a peer's non-positive advantages by design)."""
    policy = make_policy(cache)
    start = params(policy)
    as_peer = ObjectiveConfig(variant=variant).filter == "off"
    own = make_samples(policy, [[1.0, 0.0, 0.0]], seed=5)
    peer = make_samples(policy, [[0.0, 1.0, 1.0]], peer=as_peer, seed=6)
    lr = 1e-3
    results = {}
    for name in ("grpo", variant):
        for k, p in policy.model.named_parameters():
            p.data.copy_(start[k])
        trainer = Trainer(policy, TrainConfig(learning_rate=lr, epochs_per_batch=3), ObjectiveConfig(variant=name), 1.0)
        m = trainer.step(own + peer)
        assert m["optimizer_steps"] == 3
        results[name] = params(policy)
    moved = sum(float((results["grpo"][k] - start[k]).abs().max()) for k in start)
    assert moved > 2 * lr  # three real updates happened
    worst = max(float((results[variant][k] - results["grpo"][k]).abs().max()) for k in start)
    # Generator and trainer logprobs agree to ~1e-6, so the weights are 1 to ~1e-6; three Adam steps
    # of size ~lr then agree far below lr (a weight read from the current policy would give R^2).
    assert worst < 0.05 * lr, f"{variant} differs from grpo by {worst}"


@pytest.mark.parametrize(("rule", "gradient", "dropped"), [("or", 2, 2), ("and", 4, 0)])
def test_filter_rule_and_lets_close_peers_negative_samples_teach(cache: Path, rule: str, gradient: int,  # noqa: F811
                                                                  dropped: int) -> None:
    """A peer group from this very policy (KL ~ 0), rewards [1, 0, 1, 0]: the text's rule (`or`) drops
    the two negative samples unscored; the authors' (`and`) keeps all four, since none exceeds g."""
    policy = make_policy(cache)
    peers = make_samples(policy, [[1.0, 0.0, 1.0, 0.0]], peer=True, seed=3)
    cfg = ObjectiveConfig(variant="f-tis", filter_rule=rule)
    m = Trainer(policy, TrainConfig(learning_rate=1e-3), cfg, 1.0).step(peers)
    assert m["peer_samples"] == 4 and m["peer_samples_gradient"] == gradient
    assert m["skipped_samples"] == dropped  # no gradient pass (a no-grad one, for the statistics)
    assert m["filtered"] == dropped and m["filtered_nonpositive_advantage"] == 2 and m["filtered_kl"] == 0
    assert m["kl_peer_k3_gen_max"] < 1e-4 and m["kl_peer_k3_theta_max"] < 1e-4
