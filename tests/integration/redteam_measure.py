"""What the red-team suite measures of honest nodes that learn: their reward before and under an
attack (with its sampling noise) and the share of a step's update an attacker's samples get.

Reward noise. With `task.format_reward = 0` a completion's reward is 0 or 1. The G completions of
one group answer the same problem, which the model tends to get all right or all wrong, so they
are not independent draws: the noise is taken over groups (cluster-robust), the standard error of
the difference of the two means being sqrt(s2 (1/g_base + 1/g_attack)) with s2 the pooled sample
variance of the groups' mean rewards and g the groups on each side (the binomial
sqrt(p (1 - p) (1/n_base + 1/n_attack)) over completions, which under-states it, is reported too).
The reward under attack may not be lower than the baseline's by more than REWARD_NOISE_SE such
errors.

Update share. In a step's first epoch the gradient of the loss is sum_i,t c_i,t grad log pi(token
t of sample i), and the coefficient c_i,t = d loss / d log pi_i,t is -w_i A'_i x (importance weight)
(TIS: min(rho_t, C); VIS: the PPO-clipped ratio pi_theta/pi_gen). `InfluenceProbe` reads these
coefficients from the node's own objective during its real step (autograd of each micro-batch's
loss with respect to its trainer logprobs, which touches no parameter gradient), so a broken
truncation or filter shows in them. A sample's influence is sum_t |c_i,t|; `share` is the
attacker's share of the step's influence, `active_share` its share of the tokens with c != 0, and
`weight_gain` its influence over the influence its kept samples would have at weight 1 (as with
honest on-policy logprobs: sum w_i |A_i| |a_i|): what its forged logprobs bought. For TIS it is at
most C whatever the logprobs claim; VIS has no such bound (its clip bounds only the positive side).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

import swarm_node.policy.trainer as trainer_module

REWARD_NOISE_SE = 3.0  # a drop of more than this many standard errors fails (about 0.1% by chance)


def own_group_means(rows: Sequence[dict]) -> list[float]:
    """The mean reward of each own group trained on in the step rows (`Honest.step`)."""
    out = []
    for r in rows:
        groups: dict[str, list[float]] = {}
        for x in r["samples"]:
            if not x.is_peer:
                groups.setdefault(x.group_key, []).append(float(x.reward))
        out += [sum(v) / len(v) for v in groups.values()]
    return out


def difference_noise(base: Sequence[float], under: Sequence[float]) -> float:
    """The cluster-robust standard error of mean(under) - mean(base), both lists of group means."""
    if len(base) + len(under) < 3 or not base or not under:
        return float("inf")
    pooled = [*base, *under]
    mean = sum(pooled) / len(pooled)
    s2 = sum((x - mean) ** 2 for x in pooled) / (len(pooled) - 1)
    return math.sqrt(s2 * (1 / len(base) + 1 / len(under)))


def reward_check(before: Sequence[dict], during: Sequence[dict]) -> dict:
    """The honest nodes' mean own reward before and under attack (groups of G completions each),
    the noise of their difference, and whether the drop stays within REWARD_NOISE_SE of it."""
    gb, ga = own_group_means(before), own_group_means(during)
    base, under = sum(gb) / max(len(gb), 1), sum(ga) / max(len(ga), 1)
    se = difference_noise(gb, ga)
    p = (sum(gb) + sum(ga)) / max(len(gb) + len(ga), 1)
    n = [sum(not x.is_peer for r in rows for x in r["samples"]) for rows in (before, during)]
    binomial = math.sqrt(p * (1 - p) * (1 / max(n[0], 1) + 1 / max(n[1], 1)))
    return {"baseline": round(base, 4), "attack": round(under, 4), "groups": [len(gb), len(ga)],
            "se": round(se, 4), "se_binomial": round(binomial, 4),
            "within_noise": under >= base - REWARD_NOISE_SE * se - 1e-9,
            "group_means": [[round(x, 3) for x in gb], [round(x, 3) for x in ga]]}


_SINK: list | None = None  # while a probed first epoch runs: each micro-batch's [b] influence
_real_loss = trainer_module.objective_loss


def _recording_loss(inputs, cfg):
    loss, stats = _real_loss(inputs, cfg)
    if _SINK is not None:
        lp = inputs.trainer_logprobs
        grad = torch.autograd.grad(loss, lp, retain_graph=True)[0] if loss.requires_grad else torch.zeros_like(lp)
        _SINK.append(((grad.detach().abs() * inputs.mask).sum(dim=1), ((grad != 0) & inputs.mask).sum(dim=1)))
    return loss, stats


class InfluenceProbe:
    """Wraps one trainer: after each step, `last` holds per sample (influence, tokens with gradient,
    influence at weight 1) of its first epoch, in the order of the step's samples; None when the
    step trained nothing (see the module docstring)."""

    def __init__(self, trainer) -> None:
        self.last: list[tuple[float, int, float]] | None = None
        original = trainer._accumulate
        trainer_module.objective_loss = _recording_loss  # records only inside a probed first epoch

        def accumulate(batch, step_start, first_epoch):
            global _SINK
            if not first_epoch:
                return original(batch, step_start, first_epoch)
            _SINK, calls = [], []
            try:
                out = original(batch, step_start, first_epoch)
                calls = _SINK
            finally:
                _SINK = None
            n = len(batch.prompts)
            infl, toks = [0.0] * n, [0] * n
            for idx, (mass, active) in zip(batch.micro_batches, calls, strict=True):
                for i, m, a in zip(idx, mass.tolist(), active.tolist(), strict=True):
                    infl[i], toks[i] = m, int(a)
            unit = (batch.weights.abs() * batch.advantages.abs()).tolist()
            self.last = [(infl[i], toks[i], unit[i] * len(batch.completions[i]) if toks[i] else 0.0) for i in range(n)]
            return out
        trainer._accumulate = accumulate


def restore() -> None:
    """Undo the probes' hook on the trainer module (the suite's teardown)."""
    trainer_module.objective_loss = _real_loss


def update_shares(samples: Sequence, influence: Sequence | None, attackers: set[str]) -> dict | None:
    """The attacker's share of one step's update (see the module docstring), or None when the step
    trained on none of its samples."""
    if not samples or influence is None or not any(s.is_peer and s.source in attackers for s in samples):
        return None
    tot = {"att": 0.0, "all": 0.0, "att_tok": 0, "all_tok": 0, "att_unit": 0.0}
    kept = n_att = 0
    for s, (infl, toks, unit) in zip(samples, influence, strict=True):
        mine = s.is_peer and s.source in attackers
        tot["all"] += infl
        tot["all_tok"] += toks
        if mine:
            n_att += 1
            kept += toks > 0
            tot["att"] += infl
            tot["att_tok"] += toks
            tot["att_unit"] += unit

    def share(num: float, den: float) -> float:
        return num / den if den > 0 else 0.0

    return {"attacker_samples": n_att, "attacker_kept": kept, "share": share(tot["att"], tot["all"]),
            "active_share": share(tot["att_tok"], tot["all_tok"]), "weight_gain": share(tot["att"], tot["att_unit"])}


def worst_shares(rows: Sequence[dict], attackers: set[str]) -> dict:
    """Per node: the attacker's largest share of a step over the steps of `rows` (each quantity its
    own maximum), and the steps that trained on its samples."""
    out: dict[str, dict] = {}
    for r in rows:
        got = update_shares(r["samples"], r["influence"], attackers)
        if got is None:
            continue
        prev = out.setdefault(r["node"], {"steps": 0})
        prev["steps"] += 1
        for k, v in got.items():
            prev[k] = max(prev.get(k, v), round(v, 4) if isinstance(v, float) else v)
    return out
