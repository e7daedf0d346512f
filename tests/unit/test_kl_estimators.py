"""The per-sample KL estimators (swarm_node.method.kl) against exact KLs of small categorical distributions.

Tokens are sampled from pi_gen, as a peer's are. k3_gen's mean matches KL(pi_gen || pi_theta); k3_theta's
mean on the same samples matches neither KL but its own expectation E_gen[pi_gen/pi_theta] - 1 -
KL(pi_gen || pi_theta): the bias docs/method.md describes. On pi_theta's own samples k3_theta is
unbiased for KL(pi_theta || pi_gen), the use it was made for.
"""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.method.kl import per_sample_kl, token_kl

P_GEN = [0.55, 0.30, 0.10, 0.05]  # a confident peer
P_THETA = [0.15, 0.25, 0.35, 0.25]  # a node that disagrees with it
N = 200_000


def kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def sampled_token_logprobs(sample_from: list[float], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi_theta, log pi_gen) of N tokens drawn from `sample_from`, as [N, 1] float64."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(torch.tensor(sample_from, dtype=torch.float64), N, replacement=True, generator=g)
    theta = torch.tensor(P_THETA, dtype=torch.float64).log()[tokens]
    gen = torch.tensor(P_GEN, dtype=torch.float64).log()[tokens]
    return theta[:, None], gen[:, None]


def mean_and_se(values: torch.Tensor) -> tuple[float, float]:
    return float(values.mean()), float(values.std() / math.sqrt(values.numel()))


def test_k3_gen_is_unbiased_for_kl_gen_theta_on_generator_samples():
    theta, gen = sampled_token_logprobs(P_GEN)
    values = per_sample_kl(theta, gen, torch.ones_like(theta, dtype=torch.bool), "sum", "k3_gen")  # [N]
    mean, se = mean_and_se(values)
    exact = kl(P_GEN, P_THETA)
    assert exact == pytest.approx(0.5636, abs=1e-4)
    assert abs(mean - exact) < 4 * se and abs(mean - exact) < 0.01 * exact
    assert (values >= 0).all()


def test_k3_theta_is_biased_on_generator_samples_and_unbiased_on_its_own():
    theta, gen = sampled_token_logprobs(P_GEN)
    mask = torch.ones_like(theta, dtype=torch.bool)
    mean, se = mean_and_se(per_sample_kl(theta, gen, mask, "sum", "k3_theta"))
    kl_theta_gen, kl_gen_theta = kl(P_THETA, P_GEN), kl(P_GEN, P_THETA)
    # What it does estimate on pi_gen's samples: E_gen[pi_gen/pi_theta] - 1 - KL(pi_gen || pi_theta).
    expected = sum(p * p / q for p, q in zip(P_GEN, P_THETA, strict=True)) - 1 - kl_gen_theta
    assert abs(mean - expected) < 4 * se
    assert expected == pytest.approx(0.8517, abs=1e-4) and kl_theta_gen == pytest.approx(0.6004, abs=1e-4)
    assert abs(mean - kl_theta_gen) > 10 * se  # not the KL it is named after, nor the other one
    assert abs(mean - kl_gen_theta) > 10 * se
    # On samples from pi_theta (own, on-policy samples) it is unbiased for KL(pi_theta || pi_gen).
    theta, gen = sampled_token_logprobs(P_THETA, seed=1)
    mean, se = mean_and_se(per_sample_kl(theta, gen, mask, "sum", "k3_theta"))
    assert abs(mean - kl_theta_gen) < 4 * se


def test_k3_theta_tail_is_heavier_where_the_peer_is_confident():
    """A token the peer gives 0.9 and the node 1e-4: k3_theta ~ pi_gen/pi_theta, k3_gen ~ |log r|."""
    theta = torch.tensor([[math.log(1e-4)]], dtype=torch.float64)
    gen = torch.tensor([[math.log(0.9)]], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    log_r = math.log(1e-4 / 0.9)
    assert float(token_kl(theta, gen, mask, "k3_gen")) == pytest.approx(math.exp(log_r) - 1 - log_r)  # ~8.1
    assert float(token_kl(theta, gen, mask, "k3_theta")) == pytest.approx(0.9 / 1e-4 + log_r - 1)  # ~8990


def test_summed_k3_gen_is_unbiased_for_the_sequence_kl():
    """Two-token sequences from a Markov chain: the sum over a completion's tokens estimates the KL of
    the whole completion (`kl_reduction = "sum"`); `mean` is that divided by the length."""
    first_gen, first_theta = [0.7, 0.2, 0.1], [0.3, 0.4, 0.3]
    next_gen = [[0.8, 0.1, 0.1], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]]  # p(x2 | x1)
    next_theta = [[0.4, 0.3, 0.3], [0.3, 0.4, 0.3], [0.5, 0.25, 0.25]]
    exact = sum(first_gen[a] * next_gen[a][b] * math.log(first_gen[a] * next_gen[a][b]
                                                          / (first_theta[a] * next_theta[a][b]))
                for a in range(3) for b in range(3))
    g = torch.Generator().manual_seed(2)
    x1 = torch.multinomial(torch.tensor(first_gen, dtype=torch.float64), N, replacement=True, generator=g)
    x2 = torch.multinomial(torch.tensor(next_gen, dtype=torch.float64)[x1], 1, generator=g)[:, 0]

    def logprobs(first, nxt):
        return torch.stack([torch.tensor(first, dtype=torch.float64).log()[x1],
                            torch.tensor(nxt, dtype=torch.float64).log()[x1, x2]], dim=1)  # [N, 2]

    theta, gen = logprobs(first_theta, next_theta), logprobs(first_gen, next_gen)
    mask = torch.ones(N, 2, dtype=torch.bool)
    mean, se = mean_and_se(per_sample_kl(theta, gen, mask, "sum", "k3_gen"))
    assert abs(mean - exact) < 4 * se and exact == pytest.approx(0.6630, abs=1e-4)
    per_token = per_sample_kl(theta, gen, mask, "mean", "k3_gen")
    assert float(per_token.mean()) == pytest.approx(mean / 2, rel=1e-12)
