"""Statistics of the objective (`objective_loss` returns them): sums and counts that merge exactly
across micro-batches, and their flat metrics (names: `swarm_node.metric_names`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from swarm_node import metric_names as m

QUANTILES = (0.5, 0.9, 0.99)
_PER_SAMPLE = ("kl_values", "kl_k3_gen_values", "kl_k3_theta_values", "rho_values", "kl_is_peer",
               "filtered_flags", "gradient_flags", "advantage_flags", "kl_flags")  # concatenated by merge
_FLAGS = ("kl_is_peer", "filtered_flags", "gradient_flags", "advantage_flags", "kl_flags")  # the bool ones
_MAXIMA = ("rho_max", "rho_peer_max")  # merged by max


@dataclass
class ObjectiveStats:
    """Sums and counts of one or more objective calls; `merge` makes micro-batches add up exactly.

    All fields are float64 tensors on the batch's device (0-d, except the per-sample KL values
    kept whole so that quantiles of merged stats are exact). Token statistics are over valid tokens
    of scored samples (the trainer scores peers' samples without gradient in a no-grad pass, so
    these cover every peer sample; only own samples without gradient stay unscored: `unscored_stats`);
    the importance weight is rho = pi_theta_old / pi_gen whatever the correction (a diagnostic of how
    off-policy the batch is; finite, since its log is clamped); `ess` is over min(rho, C). `is_weight_*`
    averages every scored token (own ones weigh 1 in the first epoch), `is_weight_peer_*` peers' only.

    Filter counts: `filtered_nonpositive_advantage` and `filtered_kl` count the samples of the filter
    scope that meet each condition (A <= 0; KL > g), a sample may meet both; `filtered` counts the
    samples the rule drops (`objective.filter_rule`: either condition under `or`, both under `and`).
    The per-sample KL is kept for the configured estimator (`kl_*`, `kl_peer_*`) and for both
    estimators on peers' samples (`kl_peer_k3_gen_*`, `kl_peer_k3_theta_*`), so a run shows both.

    Cross-tokenizer samples (`swarm_node.method.crosstok`) are scored per chunk: their token statistics
    count this node's tokens, each carrying its chunk's weight (rho of the chunk); their KL values
    are over chunks (`mean`: per chunk).
    Per scored sample, in the order of the calls merged, are also kept its mean rho, whether the
    rule dropped it, whether it can carry gradient and which filter conditions it met: the trainer
    attributes them to the sample's sender (`Trainer.peer_sample_stats`, the peer ledger, receipts).
    """

    n_samples: Tensor
    n_peer_samples: Tensor
    n_filtered: Tensor
    n_filtered_nonpositive_advantage: Tensor
    n_filtered_kl: Tensor
    n_peer_filtered: Tensor
    n_peer_gradient: Tensor  # peer samples with A' != 0: not filtered and a nonzero advantage
    n_tokens: Tensor
    n_active_tokens: Tensor
    rho_sum: Tensor
    rho_max: Tensor
    n_truncated: Tensor
    n_peer_tokens: Tensor
    rho_peer_sum: Tensor
    rho_peer_max: Tensor
    n_peer_truncated: Tensor
    n_clipped: Tensor
    w_sum: Tensor
    w_sq_sum: Tensor
    kl_values: Tensor  # [n_samples] float64, the configured estimator
    kl_k3_gen_values: Tensor  # [n_samples] float64
    kl_k3_theta_values: Tensor  # [n_samples] float64
    rho_values: Tensor  # [n_samples] float64, mean rho over each sample's valid tokens
    kl_is_peer: Tensor  # [n_samples] bool
    filtered_flags: Tensor  # [n_samples] bool, dropped by the filter rule
    gradient_flags: Tensor  # [n_samples] bool, A' != 0 (can carry gradient)
    advantage_flags: Tensor  # [n_samples] bool, in the filter scope with A <= 0 (the advantage condition)
    kl_flags: Tensor  # [n_samples] bool, in the filter scope with KL > g (the KL condition)

    @classmethod
    def empty(cls) -> ObjectiveStats:
        """The neutral element of `merge`."""
        z = torch.zeros((), dtype=torch.float64)
        neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
        values = {name: torch.zeros(0, dtype=torch.bool if name in _FLAGS else torch.float64) for name in _PER_SAMPLE}
        return cls(**{f.name: z for f in fields(cls) if f.name not in (*_PER_SAMPLE, *_MAXIMA)},
                   **dict.fromkeys(_MAXIMA, neg_inf), **values)

    def merge(self, other: ObjectiveStats) -> ObjectiveStats:
        """Add `other` into this object (in place) and return it, so both `a.merge(b)` and
        `a = a.merge(b)` work."""
        dev = other.n_samples.device  # follow the newest batch: an empty() on the CPU moves once
        for f in fields(self):
            mine, theirs = getattr(self, f.name).to(dev), getattr(other, f.name)
            if f.name in _MAXIMA:
                merged = torch.maximum(mine, theirs)
            elif f.name in _PER_SAMPLE:
                merged = torch.cat([mine, theirs])
            else:
                merged = mine + theirs
            setattr(self, f.name, merged)
        return self

    def per_sample(self) -> list[tuple[float, float, bool, bool, bool, bool]]:
        """(KL, mean rho, filtered, can carry gradient, advantage condition, KL condition) of every
        scored sample, in merge order."""
        return list(zip(self.kl_values.detach().cpu().tolist(), self.rho_values.detach().cpu().tolist(),
                        self.filtered_flags.cpu().tolist(), self.gradient_flags.cpu().tolist(),
                        self.advantage_flags.cpu().tolist(), self.kl_flags.cpu().tolist(), strict=True))

    def to_dict(self) -> dict[str, float]:
        """Flat metrics (host floats). Fractions are of samples or of valid tokens; empty -> 0."""
        def frac(num: Tensor, den: Tensor) -> float:
            return float(num / den) if float(den) > 0 else 0.0

        n, tok, peer_tok = self.n_samples, self.n_tokens, self.n_peer_tokens
        out = {
            m.SAMPLES: float(n),
            m.PEER_SAMPLES: float(self.n_peer_samples),
            m.PEER_SAMPLES_USED: float(self.n_peer_samples - self.n_peer_filtered),
            m.PEER_SAMPLES_GRADIENT: float(self.n_peer_gradient),
            m.FILTERED: float(self.n_filtered),
            m.FILTERED_FRACTION: frac(self.n_filtered, n),
            m.FILTERED_NONPOSITIVE_ADVANTAGE: float(self.n_filtered_nonpositive_advantage),
            m.FILTERED_NONPOSITIVE_ADVANTAGE_FRACTION: frac(self.n_filtered_nonpositive_advantage, n),
            m.FILTERED_KL: float(self.n_filtered_kl),
            m.FILTERED_KL_FRACTION: frac(self.n_filtered_kl, n),
            m.TOKENS: float(tok),
            m.ACTIVE_TOKENS: float(self.n_active_tokens),
            m.IS_WEIGHT_MEAN: frac(self.rho_sum, tok),
            m.IS_WEIGHT_MAX: float(self.rho_max) if float(tok) > 0 else 0.0,
            m.TRUNCATED_FRACTION: frac(self.n_truncated, tok),
            m.PEER_TOKENS: float(peer_tok),
            m.IS_WEIGHT_PEER_MEAN: frac(self.rho_peer_sum, peer_tok),
            m.IS_WEIGHT_PEER_MAX: float(self.rho_peer_max) if float(peer_tok) > 0 else 0.0,
            m.TRUNCATED_PEER_FRACTION: frac(self.n_peer_truncated, peer_tok),
            m.CLIPPED_FRACTION: frac(self.n_clipped, tok),
            m.ESS: frac(self.w_sum * self.w_sum, self.w_sq_sum * tok),
        }
        values = self.kl_values.detach().cpu()
        peer = self.kl_is_peer.cpu()
        out.update(_distribution(m.KL_DISTRIBUTION, values))
        out.update(_distribution(m.KL_PEER_DISTRIBUTION, values[peer]))
        out.update(_distribution(m.KL_PEER_K3_GEN_DISTRIBUTION, self.kl_k3_gen_values.detach().cpu()[peer]))
        out.update(_distribution(m.KL_PEER_K3_THETA_DISTRIBUTION, self.kl_k3_theta_values.detach().cpu()[peer]))
        return out


def _distribution(names: tuple[str, ...], values: Tensor) -> dict[str, float]:
    """Mean, quantiles (linear interpolation) and max of a 1-D float64 tensor under `names`; zeros when empty."""
    if len(names) != len(QUANTILES) + 2:
        raise ValueError(f"a distribution has {len(QUANTILES) + 2} names (mean, quantiles, max), got {names}")
    if values.numel() == 0:
        return dict.fromkeys(names, 0.0)
    qs = torch.quantile(values, torch.tensor(QUANTILES, dtype=values.dtype)).tolist()
    return dict(zip(names, [float(values.mean()), *qs, float(values.max())], strict=True))
