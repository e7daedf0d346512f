"""The F-TIS loss family (docs/method.md): group advantages, sample filters, the per-token loss.

Pure functions over tensors: no I/O, no model, no networking. The objective maximised is

    J = sum_i w_i sum_t  iw_i,t * min(R_i,t * A'_i, clip(R_i,t, 1-eps, 1+eps) * A'_i)

and the loss returned is -J, where
    w_i     sample weight from `sample_weights` (1/(n_groups * G * |a_i|) for the paper's
            per-sequence-then-per-group normalisation, or 1/(valid tokens of the step batch));
    A'_i    the sample's advantage, or 0 when the filter drops it (`objective.filter = "on"`, samples in
            `filter_scope`): for A_i <= 0 or KL_i > g (`filter_rule = "or"`, the paper's text), or
            only for both (`"and"`, the authors' code); KL_i from `swarm_node.method.kl` (`kl_estimator`);
    iw, R   depend on the importance correction (`objective.correction`):
              none (grpo, nois, f-nois)  iw = 1,                    R = pi_theta / pi_theta_old
              vis  (vis, f-vis)          iw = 1,                    R = pi_theta / pi_gen   (PPO clip on it)
              tis  (tis, f-tis)          iw = min(rho, C) detached, R = pi_theta / pi_theta_old
            with rho = pi_theta_old / pi_gen, pi_theta_old the policy at the start of the step's
            optimisation (`step_start_logprobs`).
So the gradient of an unfiltered token in the first epoch (R = 1) is -w_i A_i min(rho, C) grad log pi.

The multi-epoch weight (train.epochs_per_batch > 1) is the decoupled form min(pi_old/pi_gen, C) * R:
the importance weight corrects for who generated the sample (pi_gen) relative to the policy the
batch started from (pi_old), and stays fixed across epochs; the PPO ratio R = pi_theta/pi_old,
clipped, carries the change made by earlier epochs. Own on-policy samples (pi_gen = pi_old) get
weight 1 in every epoch, so every correction and filter equals GRPO on on-policy data; reading the weight from
the current policy instead would give them R (docs/method.md with one update per batch is the
special case R = 1, where both forms agree).

Samples generated with another tokenizer (`swarm_node.method.crosstok`) carry `chunk_ids`: every ratio
against pi_gen (rho, the VIS ratio, the KL's) is then taken per chunk, the product of the chunk's
own token probabilities over the generator's chunk probability, and broadcast to the chunk's own
tokens (`swarm_node.method.chunks`); the VIS surrogate counts once per chunk (spread evenly
over its tokens); the PPO ratio pi_theta/pi_theta_old stays per token (both are this node's).
The per-sample KL is the same estimator over the sample's chunks (`mean`: per chunk). With one
token per chunk this is exactly the per-token objective (equal loss and gradients).

Numerics that peers cannot poison: every log-ratio (pi_theta/pi_gen, pi_theta/pi_old,
pi_old/pi_gen, and the KL's, `swarm_node.method.kl`) is clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before it is
exponentiated, so any finite (or floored, `protocol.validate`) generator logprob gives finite
ratios, losses, gradients and statistics. Beyond the bound a token's ratio is constant, so it
carries no gradient through the ratio; within it nothing changes.

Every computation that may see padding first replaces padded values by 0 (`torch.where`), so
garbage (NaN, inf) in padded positions never reaches the loss or the gradient. `objective_loss`
does not synchronise with the device: its statistics stay tensors until `ObjectiveStats.to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from swarm_node.config import ObjectiveConfig
from swarm_node.method.kl import (  # re-exported: the KL estimators and the log-ratio clamp live in kl.py
    KL_ESTIMATORS,
    LOG_RATIO_BOUND,
    KLEstimator,
    KLReduction,
    clamped_log_ratio,
    per_sample_kl,
    token_kl,
)
from swarm_node.method.chunks import broadcast, check_chunk_ids, chunk_mask, chunk_sum, tokens_per_chunk
from swarm_node.method.stats import QUANTILES, ObjectiveStats  # re-exported

__all__ = [
    "KL_ESTIMATORS", "LOG_RATIO_BOUND", "QUANTILES", "KLEstimator", "KLReduction", "Normalization",
    "ObjectiveInputs", "ObjectiveStats", "advantage_filter", "carries_gradient", "clamped_log_ratio",
    "group_advantages", "objective_loss", "per_sample_kl", "sample_weights", "token_kl", "unscored_stats",
]

Normalization = Literal["sequence", "token"]


def group_advantages(
    rewards: Tensor, group_ids: Tensor, *, scale_by_std: bool = True, eps: float = 1e-4
) -> Tensor:
    """Group-relative advantages A_i = (r_i - mean_g(r)) / (std_g(r) + eps), or r_i - mean_g(r).

    rewards: [N] float; group_ids: [N] integer (any values; samples sharing an id form one group,
    so a horizontal group is simply one id shared by several generators). std is the sample
    standard deviation (ddof=1, like torch.std). Groups of size 1 and groups whose rewards are
    all equal get exactly 0 (never NaN). Returns [N] in the rewards' float dtype (float32 for
    integer rewards); computed in float64.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = rewards.to(torch.float64)  # [N]
    if r.numel() == 0:
        return r.to(out_dtype)
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv: [N] in 0..n_groups-1
    n_groups = int(inv.max()) + 1
    zeros = r.new_zeros(n_groups)
    count = zeros.index_add(0, inv, torch.ones_like(r))  # [n_groups]
    mean = zeros.index_add(0, inv, r) / count
    centered = r - mean[inv]  # [N]
    if scale_by_std:
        var = zeros.index_add(0, inv, centered * centered) / (count - 1).clamp(min=1)
        adv = centered / (var.sqrt()[inv] + eps)
    else:
        adv = centered
    rmax = zeros.scatter_reduce(0, inv, r, reduce="amax", include_self=False)
    rmin = zeros.scatter_reduce(0, inv, r, reduce="amin", include_self=False)
    degenerate = (count < 2) | (rmax == rmin)  # [n_groups]
    return torch.where(degenerate[inv], torch.zeros_like(adv), adv).to(out_dtype)


def sample_weights(group_ids: Tensor, lengths: Tensor, normalization: Normalization = "sequence") -> Tensor:
    """Per-sample loss weights over the *whole* step batch, so micro-batch losses add up.

    `sequence` (the paper): w_i = 1 / (n_groups * G_g(i) * |a_i|), i.e. 1/G sum_i 1/|a_i| sum_t per
    group, then the mean over groups. `token`: w_i = 1 / (valid tokens in the batch), the token
    mean. group_ids [B] integer, lengths [B] valid-token counts; returns [B] float64. Samples of
    length 0 get weight 0 (they have no tokens) but still count in their group's size G.
    Filtered samples keep their weight: the objective zeroes their advantage instead.
    """
    if group_ids.shape != lengths.shape or group_ids.dim() != 1:
        raise ValueError(f"group_ids {tuple(group_ids.shape)} and lengths {tuple(lengths.shape)} must be equal 1-D")
    lens = lengths.to(torch.float64)  # [B]
    has_tokens = lens > 0
    if normalization == "token":
        total = lens.sum().clamp(min=1)
        return torch.where(has_tokens, 1.0 / total, 0.0)
    if normalization != "sequence":
        raise ValueError(f"unknown normalization {normalization!r}")
    if lens.numel() == 0:
        return lens
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    group_size = lens.new_zeros(n_groups).index_add(0, inv, torch.ones_like(lens))[inv]  # [B]
    return torch.where(has_tokens, 1.0 / (n_groups * group_size * lens.clamp(min=1)), 0.0)


@dataclass
class ObjectiveInputs:
    """One (micro-)batch for `objective_loss`. B samples, T padded positions.

    trainer_logprobs:    [B,T] log pi_theta(a_t | ...), tempered, requires grad
    step_start_logprobs: [B,T] log pi_theta at the start of this step's optimisation (detached):
                         the PPO denominator pi_theta_old, and what the KL filter reads
    generator_logprobs:  [B,T] log pi_gen(a_t | ...) reported by the generator
    mask:                [B,T] bool, valid completion tokens (never padding)
    advantages:          [B]   from group_advantages over the full groups (before filtering)
    is_peer:             [B]   bool, generated by another node
    sample_weights:      [B]   from sample_weights over the whole step batch
    chunk_ids:           [B,T] int64 or None: the chunk of each token for samples generated with
                         another tokenizer (`swarm_node.method.crosstok`), whose `generator_logprobs` are
                         then per-token shares summing to log pi_gen(chunk) over each chunk; rows of
                         same-tokenizer samples hold their positions 0..T-1. None: every token is
                         its own chunk (the same result as positions, computed per token).
    """

    trainer_logprobs: Tensor
    step_start_logprobs: Tensor
    generator_logprobs: Tensor
    mask: Tensor
    advantages: Tensor
    is_peer: Tensor
    sample_weights: Tensor
    chunk_ids: Tensor | None = None

    def __post_init__(self) -> None:
        bt = tuple(self.trainer_logprobs.shape)
        if len(bt) != 2:
            raise ValueError(f"trainer_logprobs must be [B,T], got {bt}")
        for name in ("step_start_logprobs", "generator_logprobs", "mask"):
            if tuple(getattr(self, name).shape) != bt:
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {bt}")
        for name in ("advantages", "is_peer", "sample_weights"):
            if tuple(getattr(self, name).shape) != bt[:1]:
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {bt[:1]}")
        if self.mask.dtype != torch.bool or self.is_peer.dtype != torch.bool:
            raise ValueError("mask and is_peer must be bool tensors")
        if self.chunk_ids is not None:
            check_chunk_ids(self.chunk_ids, self.mask)


def _ppo_surrogate(log_ratio: Tensor, adv: Tensor, eps: float) -> Tensor:
    """min(ratio * A, clip(ratio, 1-eps, 1+eps) * A) elementwise. log_ratio [B,T], adv [B,1]."""
    ratio = torch.exp(log_ratio)
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - eps, 1.0 + eps) * adv)


def _filter_scope(is_peer: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """[B] bool: samples the filters apply to (none with `objective.filter = "off"`)."""
    if cfg.filter == "off":
        return torch.zeros_like(is_peer)
    return is_peer if cfg.filter_scope == "peers" else torch.ones_like(is_peer)


def advantage_filter(advantages: Tensor, is_peer: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """[B] bool: samples in the filter scope whose advantage is <= 0 (the advantage condition)."""
    return _filter_scope(is_peer, cfg) & (advantages <= 0)


def drop(bad_adv: Tensor, bad_kl: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """[B] bool: samples the filter rule drops, from its two conditions (each already in scope):
    `or` (the paper's text) drops either, `and` (the authors' code) only both."""
    return bad_adv | bad_kl if cfg.filter_rule == "or" else bad_adv & bad_kl


def _dropped_without_kl(bad_adv: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """[B] bool: what the rule drops when no KL is known (taken as not above g)."""
    return drop(bad_adv, torch.zeros_like(bad_adv), cfg)


def carries_gradient(advantages: Tensor, is_peer: Tensor, cfg: ObjectiveConfig) -> Tensor:
    """[B] bool: samples whose objective term can have a nonzero gradient.

    Every correction's per-token term is a multiple of the (possibly filtered) advantage A', so a
    sample with A' = 0 (advantage exactly 0, or dropped by the advantage condition alone, which the
    `or` rule does) contributes exactly nothing, whatever its logprobs; the KL condition needs
    logprobs and is not decided here (under `and` a sample with A < 0 is kept unless its KL > g).
    """
    return (advantages != 0) & ~_dropped_without_kl(advantage_filter(advantages, is_peer, cfg), cfg)


def unscored_stats(advantages: Tensor, is_peer: Tensor, cfg: ObjectiveConfig) -> ObjectiveStats:
    """Stats for samples left unscored because they carry no gradient (see `carries_gradient`).

    They count as samples and under the advantage condition when they meet it; as filtered when
    that alone drops them (`or`: their KL is unknown, so under `and` they are not counted as
    filtered). Token, weight and KL statistics cover scored samples only (these have no logprobs).
    """
    f64 = torch.float64
    bad_adv = advantage_filter(advantages, is_peer, cfg)
    dropped = _dropped_without_kl(bad_adv, cfg)
    stats = ObjectiveStats.empty()
    stats.n_samples = torch.tensor(float(advantages.shape[0]), dtype=f64)
    stats.n_peer_samples = is_peer.sum().to(f64).cpu()
    stats.n_filtered_nonpositive_advantage = bad_adv.sum().to(f64).cpu()
    stats.n_filtered = dropped.sum().to(f64).cpu()
    stats.n_peer_filtered = (dropped & is_peer).sum().to(f64).cpu()
    return stats


def objective_loss(inputs: ObjectiveInputs, cfg: ObjectiveConfig) -> tuple[Tensor, ObjectiveStats]:
    """The loss (-J, a scalar connected to `trainer_logprobs`) and its statistics for one batch.

    Losses of micro-batches sum to the loss of their union when `sample_weights` were computed
    over the union. A batch whose samples are all filtered gives a loss of exactly 0 whose
    gradient is 0 (not NaN).
    """
    mask = inputs.mask  # [B,T]
    dtype = torch.promote_types(inputs.trainer_logprobs.dtype, torch.float32)
    theta = inputs.trainer_logprobs.to(dtype)  # [B,T], carries the gradient
    old = inputs.step_start_logprobs.detach().to(dtype)
    gen = inputs.generator_logprobs.detach().to(dtype)
    chunks = inputs.chunk_ids
    if chunks is None:  # every token its own chunk
        old_c, gen_c, mask_c = old, gen, mask  # [B,T]
    else:  # [B,C] chunk log-probabilities (C = T; chunks past a row's last are empty)
        old_c, gen_c, mask_c = chunk_sum(old, chunks, mask), chunk_sum(gen, chunks, mask), chunk_mask(chunks, mask)

    # [B] per estimator, from step start: fixed across epochs; the filter reads the configured one
    kls = {e: per_sample_kl(old_c, gen_c, mask_c, cfg.kl_reduction, e) for e in KL_ESTIMATORS}
    scope = _filter_scope(inputs.is_peer, cfg)
    bad_adv = advantage_filter(inputs.advantages, inputs.is_peer, cfg)  # [B] the advantage condition
    bad_kl = scope & (kls[cfg.kl_estimator] > cfg.kl_threshold)  # [B] the KL condition
    filtered = drop(bad_adv, bad_kl, cfg)  # [B]
    adv = torch.where(filtered, 0.0, inputs.advantages.detach().to(dtype))  # A'  [B]
    active = mask & ~filtered[:, None]  # [B,T] tokens that can carry gradient

    # Clamped log-ratios, 0 at inactive positions *before* exp, so padding garbage never leaks.
    rho = torch.exp(clamped_log_ratio(old_c, gen_c, mask_c))  # pi_old/pi_gen, detached, 1 on padding
    if chunks is not None:
        rho = torch.where(mask, broadcast(rho, chunks, mask), 1.0)  # [B,C] -> each own token [B,T]
    truncated_rho = rho.clamp(max=cfg.truncation_c)  # min(rho, C)
    if cfg.correction == "vis" and chunks is not None:  # the chunk's surrogate, spread over its tokens
        active_c = chunk_mask(chunks, active)  # [B,C]
        clip_c = clamped_log_ratio(chunk_sum(theta, chunks, mask), gen_c, active_c)  # log pi_theta/pi_gen [B,C]
        clip_log_ratio = torch.where(active, broadcast(clip_c, chunks, mask), 0.0)  # [B,T]
        term = (broadcast(_ppo_surrogate(clip_c, adv[:, None], cfg.clip_eps), chunks, mask)
                / tokens_per_chunk(chunks, mask, dtype))  # [B,T]
    else:
        if cfg.correction == "vis":
            clip_log_ratio = clamped_log_ratio(theta, gen, active)  # log pi_theta/pi_gen [B,T]
        else:
            clip_log_ratio = clamped_log_ratio(theta, old, active)  # log pi_theta/pi_theta_old [B,T]
        term = _ppo_surrogate(clip_log_ratio, adv[:, None], cfg.clip_eps)  # [B,T]
    if cfg.correction == "tis":
        term = term * truncated_rho
    weights = inputs.sample_weights.detach().to(dtype)  # [B]
    objective = (term * active.to(dtype) * weights[:, None]).sum()
    stats = _stats(inputs, cfg, rho, truncated_rho, clip_log_ratio.detach(), adv, kls,
                   (bad_adv, bad_kl, filtered), active)
    return -objective, stats


@torch.no_grad()
def _stats(
    inputs: ObjectiveInputs, cfg: ObjectiveConfig, rho: Tensor, truncated_rho: Tensor, clip_log_ratio: Tensor,
    adv: Tensor, kls: dict[str, Tensor], conditions: tuple[Tensor, Tensor, Tensor], active: Tensor,
) -> ObjectiveStats:
    """Diagnostics of one call, as device tensors (no host synchronisation); sums in float64.

    rho, truncated_rho [B,T] (1 on padding); clip_log_ratio [B,T] (0 where inactive); adv [B] = A';
    kls: estimator -> [B]; conditions: [B] bool (advantage condition, KL condition, dropped).
    """
    f64 = torch.float64
    mask = inputs.mask
    peer_mask = mask & inputs.is_peer[:, None]  # [B,T] valid tokens of peers' samples
    maskf, peerf = mask.to(rho.dtype), peer_mask.to(rho.dtype)
    bad_adv, bad_kl, filtered = conditions
    eps = cfg.clip_eps
    a = adv[:, None]
    clipped = active & (((clip_log_ratio > _log1p(eps)) & (a > 0)) | ((clip_log_ratio < _log1p(-eps)) & (a < 0)))
    w = truncated_rho * maskf  # [B,T], 0 on padding
    neg_inf = torch.tensor(float("-inf"), dtype=f64, device=rho.device)
    return ObjectiveStats(
        n_samples=torch.tensor(float(mask.shape[0]), dtype=f64, device=mask.device),
        n_peer_samples=inputs.is_peer.sum().to(f64),
        n_filtered=filtered.sum().to(f64),
        n_filtered_nonpositive_advantage=bad_adv.sum().to(f64),
        n_filtered_kl=bad_kl.sum().to(f64),
        n_peer_filtered=(filtered & inputs.is_peer).sum().to(f64),
        n_peer_gradient=((adv != 0) & inputs.is_peer).sum().to(f64),
        n_tokens=mask.sum().to(f64),
        n_active_tokens=active.sum().to(f64),
        rho_sum=(rho * maskf).sum(dtype=f64),
        rho_max=(rho * maskf).amax().to(f64) if mask.numel() else neg_inf,  # padding gives 0 <= rho
        n_truncated=((rho > cfg.truncation_c) & mask).sum().to(f64),
        n_peer_tokens=peer_mask.sum().to(f64),
        rho_peer_sum=(rho * peerf).sum(dtype=f64),
        rho_peer_max=(rho * peerf).amax().to(f64) if mask.numel() else neg_inf,  # 0 without peer tokens
        n_peer_truncated=((rho > cfg.truncation_c) & peer_mask).sum().to(f64),
        n_clipped=clipped.sum().to(f64),
        w_sum=w.sum(dtype=f64),
        w_sq_sum=(w * w).sum(dtype=f64),
        kl_values=kls[cfg.kl_estimator].to(f64),
        kl_k3_gen_values=kls["k3_gen"].to(f64),
        kl_k3_theta_values=kls["k3_theta"].to(f64),
        rho_values=((rho * maskf).sum(dim=1, dtype=f64) / mask.sum(dim=1).clamp(min=1)).to(f64),
        kl_is_peer=inputs.is_peer.clone(),
        filtered_flags=filtered.clone(),
        gradient_flags=adv != 0,
        advantage_flags=bad_adv.clone(),
        kl_flags=bad_kl.clone(),
    )


def _log1p(x: float) -> float:
    """log(1 + x) as a python float (the clip bounds in log space)."""
    return float(torch.log1p(torch.tensor(x, dtype=torch.float64)))
