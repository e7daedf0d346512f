"""The uncertainty of a held-out accuracy and whether a change between two evaluations is outside the
noise. Pure Python, no I/O: every place that prints or plots a held-out accuracy (the `local`
summary, `report`, `status`, the dashboard) takes its numbers from here.

*Interval.* A held-out accuracy is `correct` successes out of `n` problems; its 95% interval is
Wilson's score interval (`wilson`): unlike the normal approximation p +- 1.96 sqrt(p(1-p)/n) it
stays inside [0, 1] and keeps close to its nominal coverage at small n and near 0 or 1. At n = 64
and p = 0.23 it is [0.15, 0.35]: a 64-problem difference of 0.1 is within the noise.

*Verdict.* Two evaluations of one node on the same held-out set are paired: the same problems, so
what matters is the problems that changed. When both rows carry their per-problem outcomes
(`evals.jsonl`'s `outcomes`), the rule is McNemar's exact test: of the d problems answered right
in exactly one of the two evaluations, `gained` went wrong -> right and `lost` right -> wrong;
under "no change" gained ~ Binomial(d, 1/2), and the two-sided p-value is
min(1, 2 P(X <= min(gained, lost))). p < ALPHA is "improved" (gained > lost) or "worse"; otherwise
"no measurable change". Without outcomes (rows written before they were logged, or of different
sets) the rule is Newcombe's hybrid score interval for the difference of two proportions (method
10 of Newcombe 1998, built from the two Wilson intervals): "improved" when it lies above 0, "worse"
below 0. It treats the two evaluations as independent; on the same problems their results are
positively correlated, which makes this interval wider than the paired test: it errs towards "no
measurable change".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal
ALPHA = 0.05  # the test's level: a verdict other than "no measurable change" is wrong 5% of the time at most
IMPROVED, NO_CHANGE, WORSE = "improved", "no measurable change", "worse"
PAIRED, UNPAIRED = "mcnemar_exact", "newcombe_interval"


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval (lo, hi) for `correct` successes in `n` trials (95% by default)."""
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n >= 1, got correct={correct}, n={n}")
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # clamp rounding only: at p = 0 the exact lower bound is 0, at p = 1 the upper bound is 1
    return max(0.0, centre - half) if correct else 0.0, min(1.0, centre + half) if correct < n else 1.0


@dataclass(frozen=True)
class Accuracy:
    """A held-out accuracy with its 95% Wilson interval."""

    correct: int
    n: int

    @property
    def value(self) -> float:
        return self.correct / self.n

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.correct, self.n)

    def text(self, digits: int = 3) -> str:
        """'0.234 [0.148, 0.350]': the accuracy and its 95% interval."""
        lo, hi = self.interval
        return f"{self.value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def mcnemar_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: the discordant problems split `gained` vs `lost` under
    Binomial(gained + lost, 1/2). 1.0 when no problem changed."""
    if gained < 0 or lost < 0:
        raise ValueError(f"counts must be >= 0, got {gained}, {lost}")
    d, k = gained + lost, min(gained, lost)
    if d == 0:
        return 1.0
    tail = sum(math.comb(d, i) for i in range(k + 1)) / 2.0**d
    return min(1.0, 2.0 * tail)


def newcombe_difference(before: Accuracy, after: Accuracy, z: float = Z95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (method 10) for after - before, as independent proportions."""
    l1, u1 = wilson(before.correct, before.n, z)
    l2, u2 = wilson(after.correct, after.n, z)
    p1, p2 = before.value, after.value
    d = p2 - p1
    return d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)


@dataclass(frozen=True)
class Change:
    """A before/after comparison: the verdict in words and the evidence behind it.

    `test`: PAIRED (gained, lost and p_value set) or UNPAIRED (diff_lo, diff_hi: the 95% interval of
    after - before)."""

    verdict: str
    test: str
    difference: float
    p_value: float | None = None
    gained: int | None = None
    lost: int | None = None
    diff_lo: float | None = None
    diff_hi: float | None = None

    def text(self) -> str:
        """'improved (+0.125; 11 problems gained, 3 lost, exact McNemar p=0.057)' and the like."""
        sign = f"{self.difference:+.3f}"
        if self.test == PAIRED:
            return (f"{self.verdict} ({sign}; {self.gained} problems gained, {self.lost} lost, "
                    f"exact McNemar p={self.p_value:.3g})")
        return f"{self.verdict} ({sign}, 95% interval [{self.diff_lo:+.3f}, {self.diff_hi:+.3f}])"


def paired_counts(before: str, after: str) -> tuple[int, int]:
    """(gained, lost) between two outcome strings ('1' right, '0' wrong, one character per problem)."""
    if len(before) != len(after):
        raise ValueError(f"outcomes of {len(before)} and {len(after)} problems are not paired")
    gained = sum(1 for a, b in zip(before, after, strict=True) if a == "0" and b == "1")
    lost = sum(1 for a, b in zip(before, after, strict=True) if a == "1" and b == "0")
    return gained, lost


def compare(before: Accuracy, after: Accuracy, outcomes: Sequence[str | None] = (None, None),
            alpha: float = ALPHA) -> Change:
    """The verdict on `after` vs `before` (see the module docstring): paired when both outcome
    strings are given (the same problems, in the same order), else by Newcombe's interval."""
    difference = after.value - before.value
    first, second = outcomes
    if first is not None and second is not None:
        gained, lost = paired_counts(first, second)
        p = mcnemar_p(gained, lost)
        verdict = NO_CHANGE if p >= alpha else (IMPROVED if gained > lost else WORSE)
        return Change(verdict, PAIRED, difference, p_value=p, gained=gained, lost=lost)
    z = _normal_quantile(1 - alpha / 2)
    lo, hi = newcombe_difference(before, after, z)
    verdict = IMPROVED if lo > 0 else WORSE if hi < 0 else NO_CHANGE
    return Change(verdict, UNPAIRED, difference, diff_lo=lo, diff_hi=hi)


def _normal_quantile(q: float) -> float:
    from statistics import NormalDist

    return Z95 if q == 1 - ALPHA / 2 else NormalDist().inv_cdf(q)
