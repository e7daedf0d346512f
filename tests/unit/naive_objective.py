"""A deliberately naive reference for the F-TIS loss family, written from docs/method.md.

Python loops over samples and tokens, python floats (float64), the gradient derived by hand from
the equation. It shares nothing with swarm_node/method/objective.py, so agreement between the two is
evidence that both implement the equation:

    J = 1/G sum_i 1/|a_i| sum_t  iw_i,t * min(R_i,t * A'_i, clip(R_i,t, 1-eps, 1+eps) * A'_i)

averaged over groups ("sequence"), or the plain mean over all valid tokens ("token"); loss = -J.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class NaiveBatch:
    """Plain python lists. Padded positions (mask False) may hold anything, even NaN."""

    trainer: list[list[float]]
    step_start: list[list[float]]
    generator: list[list[float]]
    mask: list[list[bool]]
    rewards: list[float]
    group_ids: list[int]
    is_peer: list[bool]


def naive_advantages(rewards: list[float], group_ids: list[int], scale_by_std: bool, eps: float) -> list[float]:
    """(r - mean) / (sample std + eps) within each group; 0 for size-1 or all-equal groups."""
    out = []
    for i, r in enumerate(rewards):
        group = [rewards[j] for j in range(len(rewards)) if group_ids[j] == group_ids[i]]
        if len(group) < 2 or max(group) == min(group):
            out.append(0.0)
            continue
        mean = sum(group) / len(group)
        if not scale_by_std:
            out.append(r - mean)
            continue
        var = sum((x - mean) ** 2 for x in group) / (len(group) - 1)
        out.append((r - mean) / (math.sqrt(var) + eps))
    return out


def naive_kl(theta: list[float], gen: list[float], mask: list[bool], reduction: str, estimator: str = "k3_gen") -> float:
    """k3 estimate over the valid tokens of one sample: `k3_gen` r - 1 - log r with r = pi_theta/pi_gen
    (KL(pi_gen || pi_theta) on pi_gen's samples), `k3_theta` e^d - d - 1 with d = log pi_gen - log pi_theta."""
    total, n = 0.0, 0
    for t in range(len(mask)):
        if mask[t]:
            if estimator == "k3_gen":
                log_r = theta[t] - gen[t]
                total += math.exp(log_r) - 1.0 - log_r
            elif estimator == "k3_theta":
                delta = gen[t] - theta[t]
                total += math.exp(delta) - delta - 1.0
            else:
                raise ValueError(estimator)
            n += 1
    if reduction == "mean":
        return total / n if n else 0.0
    return total


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def _surrogate_and_slope(ratio: float, adv: float, eps: float) -> tuple[float, float]:
    """min(ratio*A, clip(ratio)*A) and its derivative with respect to log(ratio).

    The unclipped branch has derivative A*ratio; the clipped one is constant outside the range.
    """
    unclipped = ratio * adv
    clipped = _clip(ratio, 1.0 - eps, 1.0 + eps) * adv
    if unclipped <= clipped:
        return unclipped, adv * ratio
    return clipped, 0.0


def naive_loss_and_grad(
    batch: NaiveBatch,
    variant: str,
    *,
    c: float = 2.0,
    eps: float = 0.2,
    g: float = 50.0,
    kl_reduction: str = "sum",
    kl_estimator: str = "k3_gen",
    filter_rule: str = "or",
    scope: str = "peers",
    normalization: str = "sequence",
    scale_by_std: bool = True,
    adv_eps: float = 1e-4,
) -> tuple[float, list[list[float]]]:
    """Loss (-J) and d loss / d trainer logprob for every position (0 on padding)."""
    n = len(batch.rewards)
    adv = naive_advantages(batch.rewards, batch.group_ids, scale_by_std, adv_eps)
    base = variant[2:] if variant.startswith("f-") else variant
    groups = sorted(set(batch.group_ids))
    total_tokens = sum(sum(1 for m in row if m) for row in batch.mask)

    loss = 0.0
    grad = [[0.0] * len(row) for row in batch.mask]
    for i in range(n):
        length = sum(1 for m in batch.mask[i] if m)
        if length == 0:
            continue
        a = adv[i]
        if variant.startswith("f-") and (batch.is_peer[i] or scope == "all"):
            kl = naive_kl(batch.step_start[i], batch.generator[i], batch.mask[i], kl_reduction, kl_estimator)
            drop = (a <= 0 or kl > g) if filter_rule == "or" else (a <= 0 and kl > g)
            if drop:
                a = 0.0
        if normalization == "sequence":
            group_size = sum(1 for j in range(n) if batch.group_ids[j] == batch.group_ids[i])
            weight = 1.0 / (len(groups) * group_size * length)
        else:
            weight = 1.0 / total_tokens
        for t in range(len(batch.mask[i])):
            if not batch.mask[i][t]:
                continue
            theta = batch.trainer[i][t]
            rho = math.exp(theta - batch.generator[i][t])
            weight_rho = math.exp(batch.step_start[i][t] - batch.generator[i][t])  # decoupled: pi_old/pi_gen
            r_old = math.exp(theta - batch.step_start[i][t])
            if base in ("grpo", "nois"):
                term, slope = _surrogate_and_slope(r_old, a, eps)
            elif base == "vis":
                term, slope = _surrogate_and_slope(rho, a, eps)
            elif base == "tis":
                ppo, ppo_slope = _surrogate_and_slope(r_old, a, eps)
                term, slope = min(weight_rho, c) * ppo, min(weight_rho, c) * ppo_slope
            else:
                raise ValueError(variant)
            loss -= weight * term
            grad[i][t] = -weight * slope
    return loss, grad


# --- random batches shared by the objective tests -------------------------------------------------

GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 7.0)


def random_batch(seed: int, *, n_groups: int = 4, max_group: int = 4, max_len: int = 9, epoch_drift: float = 0.15,
                 peer_shift: float = 0.8, pad_extra: int = 2) -> dict:
    """A random mixed own/peer batch as torch tensors (float64) plus its NaiveBatch twin.

    Mixed lengths (some 0), garbage in every padded position, rewards in {0, 0.5, 1} (so some
    groups have zero variance), step-start logprobs drifted from the trainer's (a later epoch),
    peers' generator logprobs far from the trainer's (some tokens truncate at C, some KL large).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    group_ids, is_peer = [], []
    for g in range(n_groups):
        size = int(torch.randint(1, max_group + 1, (1,), generator=gen))
        peer = bool(torch.rand((), generator=gen) < 0.6)
        group_ids += [10 * g + 3] * size  # arbitrary, non-contiguous ids
        is_peer += [peer] * size
    b, t = len(group_ids), max_len + pad_extra
    lengths = torch.randint(0, max_len + 1, (b,), generator=gen)
    lengths[0] = max(int(lengths[0]), 1)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    trainer = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    step_start = trainer + epoch_drift * torch.randn(b, t, generator=gen, dtype=torch.float64)
    shift = torch.tensor([peer_shift if p else 0.02 for p in is_peer], dtype=torch.float64)[:, None]
    generator = trainer + shift * torch.randn(b, t, generator=gen, dtype=torch.float64)
    rewards = torch.randint(0, 3, (b,), generator=gen).to(torch.float64) / 2
    for x in (trainer, step_start, generator):
        pads = (~mask).nonzero().tolist()
        for k, (i, j) in enumerate(pads):
            x[i, j] = GARBAGE[(k + seed) % len(GARBAGE)]
    tensors = {
        "trainer": trainer, "step_start": step_start, "generator": generator, "mask": mask,
        "rewards": rewards, "group_ids": torch.tensor(group_ids), "is_peer": torch.tensor(is_peer),
        "lengths": lengths,
    }
    naive = NaiveBatch(trainer.tolist(), step_start.tolist(), generator.tolist(), mask.tolist(),
                       rewards.tolist(), group_ids, is_peer)
    return {"tensors": tensors, "naive": naive}
