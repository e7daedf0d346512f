"""The statistics over seeds that the grid's summary, plots and comparisons share: the mean with its
95% Student t interval (`mean_ci`) and the area under an accuracy curve (`curve_auc`). Pure Python."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Student t quantile t_{0.975, df} for df = 1..30 (beyond: the normal 1.96 is within 2%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half width of the 95% t interval); the half width is nan for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def curve_auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under (steps, values) divided by the step span (= mean value over the run)."""
    if len(steps) != len(values) or not steps:
        raise ValueError("steps and values must be non-empty and of equal length")
    if len(steps) == 1:
        return float(values[0])
    area = sum((steps[i + 1] - steps[i]) * (values[i + 1] + values[i]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])
