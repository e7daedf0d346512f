"""Statistics of the objective (`objective_loss` returns them): sums and counts that merge exactly
across micro-batches, and their flat metrics (`swarm_node.metrics` names them)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class ObjectiveStats:
    """Sums and counts of one or more objective calls; `merge` makes micro-batches add up exactly.

    All fields are float64 tensors on the batch's device (0-d, except the per-sample KL values
    kept whole so that quantiles of merged stats are exact). Token statistics are over valid tokens
    of scored samples (the trainer scores peers' samples without gradient in a no-grad pass, so
    these cover every peer sample; only own samples without gradient stay unscored: `unscored_stats`);
    the importance weight is rho = pi_theta_old / pi_gen whatever the variant (a diagnostic of how
    off-policy the batch is; finite, since its log is clamped); `ess` is over min(rho, C).
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
    n_clipped: Tensor
    w_sum: Tensor
    w_sq_sum: Tensor
    kl_values: Tensor  # [n_samples] float64
    kl_is_peer: Tensor  # [n_samples] bool

    @classmethod
    def empty(cls) -> ObjectiveStats:
        """The neutral element of `merge`."""
        z = torch.zeros((), dtype=torch.float64)
        return cls(**{f.name: z for f in fields(cls) if f.name not in ("kl_values", "kl_is_peer", "rho_max")},
                   rho_max=torch.tensor(float("-inf"), dtype=torch.float64),
                   kl_values=torch.zeros(0, dtype=torch.float64), kl_is_peer=torch.zeros(0, dtype=torch.bool))

    def merge(self, other: ObjectiveStats) -> ObjectiveStats:
        """Add `other` into this object (in place) and return it, so both `a.merge(b)` and
        `a = a.merge(b)` work."""
        dev = other.n_samples.device  # follow the newest batch: an empty() on the CPU moves once
        for f in fields(self):
            mine, theirs = getattr(self, f.name).to(dev), getattr(other, f.name)
            if f.name == "rho_max":
                merged = torch.maximum(mine, theirs)
            elif f.name in ("kl_values", "kl_is_peer"):
                merged = torch.cat([mine, theirs])
            else:
                merged = mine + theirs
            setattr(self, f.name, merged)
        return self

    def to_dict(self) -> dict[str, float]:
        """Flat metrics (host floats). Fractions are of samples or of valid tokens; empty -> 0."""
        def frac(num: Tensor, den: Tensor) -> float:
            return float(num / den) if float(den) > 0 else 0.0

        n, tok = self.n_samples, self.n_tokens
        out = {
            "samples": float(n),
            "peer_samples": float(self.n_peer_samples),
            "peer_samples_used": float(self.n_peer_samples - self.n_peer_filtered),
            "peer_samples_gradient": float(self.n_peer_gradient),
            "filtered": float(self.n_filtered),
            "filtered_fraction": frac(self.n_filtered, n),
            "filtered_nonpositive_advantage": float(self.n_filtered_nonpositive_advantage),
            "filtered_nonpositive_advantage_fraction": frac(self.n_filtered_nonpositive_advantage, n),
            "filtered_kl": float(self.n_filtered_kl),
            "filtered_kl_fraction": frac(self.n_filtered_kl, n),
            "tokens": float(tok),
            "active_tokens": float(self.n_active_tokens),
            "is_weight_mean": frac(self.rho_sum, tok),
            "is_weight_max": float(self.rho_max) if float(tok) > 0 else 0.0,
            "truncated_fraction": frac(self.n_truncated, tok),
            "clipped_fraction": frac(self.n_clipped, tok),
            "ess": frac(self.w_sum * self.w_sum, self.w_sq_sum * tok),
        }
        values = self.kl_values.detach().cpu()
        peer = self.kl_is_peer.cpu()
        out.update(_distribution("kl", values))
        out.update(_distribution("kl_peer", values[peer]))
        return out


def _distribution(prefix: str, values: Tensor) -> dict[str, float]:
    """Mean, quantiles (linear interpolation) and max of a 1-D float64 tensor; zeros when empty."""
    names = [f"{prefix}_mean"] + [f"{prefix}_p{round(q * 100)}" for q in QUANTILES] + [f"{prefix}_max"]
    if values.numel() == 0:
        return dict.fromkeys(names, 0.0)
    qs = torch.quantile(values, torch.tensor(QUANTILES, dtype=values.dtype)).tolist()
    return dict(zip(names, [float(values.mean()), *qs, float(values.max())], strict=True))
