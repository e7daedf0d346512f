"""The red-team suite's measurements (tests/integration/redteam_measure.py) on hand-made batches:
the influence read from the objective's gradient shows the TIS truncation, and would show a weight
beyond C where there is none (VIS on a negative advantage)."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.config import ObjectiveConfig
from swarm_node.method.objective import ObjectiveInputs
from tests.integration import redteam_measure as measure


def _influence(variant: str, peer_gen: float, advantage: float) -> tuple[float, float]:
    """(own sample's influence, peer sample's) for one own on-policy row and one peer row whose
    every token claims `peer_gen`; both rows have the same tokens, weight and advantage."""
    theta = torch.full((2, 3), -2.0, requires_grad=True)
    gen = torch.tensor([[-2.0] * 3, [peer_gen] * 3])
    inputs = ObjectiveInputs(trainer_logprobs=theta * 1.0, step_start_logprobs=theta.detach().clone(),
                             generator_logprobs=gen, mask=torch.ones(2, 3, dtype=torch.bool),
                             advantages=torch.tensor([advantage, advantage]), is_peer=torch.tensor([False, True]),
                             sample_weights=torch.full((2,), 1 / 6))
    measure._SINK = []
    try:
        measure._recording_loss(inputs, ObjectiveConfig(variant=variant))
        (mass, active), = measure._SINK
    finally:
        measure._SINK = None
    assert active.tolist() == [3, 3 if mass[1] > 0 else 0]
    return float(mass[0]), float(mass[1])


def test_floor_logprobs_get_at_most_c_times_an_honest_samples_influence_under_tis() -> None:
    own, peer = _influence("tis", -49.9, 1.0)
    c = ObjectiveConfig(variant="tis").truncation_c
    assert own > 0 and peer == pytest.approx(c * own)


def test_a_weight_beyond_c_shows_where_nothing_truncates_it() -> None:
    # VIS on a negative advantage: the ratio pi_theta / pi_gen (e^5 here) multiplies the gradient.
    own, peer = _influence("vis", -7.0, -1.0)
    assert peer == pytest.approx(math.exp(5.0) * own, rel=1e-4)
    # At the floor the log-ratio clamp leaves no gradient through the ratio at all.
    own, peer = _influence("vis", -49.9, -1.0)
    assert own > 0 and peer == 0.0


def test_reward_noise_is_taken_over_groups() -> None:
    base, under = [0.0, 0.25, 0.5, 0.25], [0.0, 0.0, 0.25, 0.25]
    pooled = base + under
    mean = sum(pooled) / 8
    s2 = sum((x - mean) ** 2 for x in pooled) / 7
    assert measure.difference_noise(base, under) == pytest.approx(math.sqrt(s2 / 2))
    assert measure.difference_noise([0.5], []) == math.inf
