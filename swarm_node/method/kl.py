"""Per-sample KL estimates for the F-TIS filter (docs/method.md, "KL estimators"), on the sampled tokens.

The tokens of a sample come from its generator pi_gen (a peer's model, or this node's own sampler),
so an estimator is unbiased only for the KL whose expectation is over pi_gen. With the per-token
log-ratio log r_t = log pi_theta(a_t) - log pi_gen(a_t):

    k3_gen    r - 1 - log r       E_{a ~ pi_gen}[.] = KL(pi_gen || pi_theta)          (unbiased here)
    k3_theta  e^d - d - 1,        d = log pi_gen - log pi_theta = -log r: unbiased for
                                  KL(pi_theta || pi_gen) only on samples from pi_theta; on pi_gen's
                                  samples E[.] = E_gen[pi_gen/pi_theta] - 1 - KL(pi_gen || pi_theta), not a
                                  KL, and e^d makes the tail heavy where the peer is confident and
                                  this node is not (the authors' published code uses this form).

Both are >= 0 per token. Summed over a sample's tokens, k3_gen is an unbiased estimate of the
sequence-level KL(pi_gen || pi_theta) (chain rule: each token's term is unbiased for the KL of the
next-token distributions given the prefix); `mean` divides by the valid tokens (nats per token).

Every log-ratio is clamped to +-LOG_RATIO_BOUND before it is exponentiated, so any finite (or
floored) logprob gives a finite estimate: a huge but finite KL, certainly above any sensible g.
Padding never leaks: masked positions are replaced by 0 before any arithmetic.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

KLEstimator = Literal["k3_gen", "k3_theta"]
KLReduction = Literal["sum", "mean"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
LOG_RATIO_BOUND = 20.0  # |log ratio| cap: e^20 ~ 4.9e8, so ratio * advantage * weight stays finite in float32


def clamped_log_ratio(numerator: Tensor, denominator: Tensor, mask: Tensor) -> Tensor:
    """log(numerator/denominator) of two logprob tensors [B,T], clamped to +-LOG_RATIO_BOUND, 0 where
    `mask` is false (padding garbage, NaN included, never leaks: `torch.where` picks the 0)."""
    diff = (numerator - denominator).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.where(mask, diff, 0.0)


def token_kl(trainer_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor,
             estimator: KLEstimator = "k3_gen") -> Tensor:
    """Per-token KL estimates [B,T] (exactly 0 on padding) by `estimator` (module doc).

    Inputs [B,T] logprobs of the sampled tokens under pi_theta and pi_gen, mask [B,T] bool; computed
    in the inputs' dtype (at least float32), detached.
    """
    dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
    log_r = clamped_log_ratio(trainer_logprobs.detach().to(dtype), generator_logprobs.detach().to(dtype), mask)
    if estimator == "k3_gen":
        return torch.expm1(log_r) - log_r  # r - 1 - log r
    if estimator == "k3_theta":
        delta = -log_r  # log pi_gen - log pi_theta (the clamp is symmetric, so this is exact)
        return torch.expm1(delta) - delta
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def per_sample_kl(trainer_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor,
                  reduction: KLReduction = "sum", estimator: KLEstimator = "k3_gen") -> Tensor:
    """Per-sample KL estimate [B]: `token_kl` reduced over the valid tokens only.

    `sum`, or `mean` with 0 for a sample without valid tokens. Inputs [B,T], mask [B,T] bool; returns
    [B] in the inputs' dtype (at least float32). No gradient flows (inputs are detached).
    """
    per_token = token_kl(trainer_logprobs, generator_logprobs, mask, estimator)  # [B,T]
    total = per_token.sum(dim=1)  # [B]
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / mask.sum(dim=1).clamp(min=1).to(total.dtype)
    raise ValueError(f"unknown KL reduction {reduction!r}")
