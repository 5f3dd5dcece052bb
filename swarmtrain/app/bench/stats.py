"""Means and 95 % intervals over seeds, and goals judged by the whole interval (pure, no torch).

A point of ``swarmtrain bench strategies`` trained with K seeds has K final losses; its figure is
their mean with the half-width of the 95 % Student-t interval (``t_{0.975, K-1} * s / sqrt(K)``).
Gaps are paired: seed s of a point against seed s of its reference (same data order), so the
shared part of the seed's luck cancels. With one seed there is no interval: ``None`` (``null`` in
JSON), and a goal is then judged on the single value and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["T975", "t975", "mean_ci95", "paired_gaps", "goal_verdict"]

#: t_{0.975, df} for df = 1..30 (two-sided 95 %); beyond 30 the normal 1.96 is within 2 %
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T975[df - 1] if df <= len(T975) else 1.96


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """``(mean, half-width of the 95 % t-interval)``; the half-width is ``None`` for one value.

    Non-finite values make both non-finite (a diverged seed is not averaged away).
    """
    if not values:
        raise ValueError("mean_ci95 of no values")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)


def paired_gaps(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per seed, ``value / reference - 1`` (the relative gap of each seed to the same seed's reference)."""
    if len(values) != len(reference):
        raise ValueError(f"{len(values)} values against {len(reference)} reference values")
    return [v / r - 1 for v, r in zip(values, reference, strict=True)]


def goal_verdict(mean: float, ci95: float | None, limit: float, *, at_most: bool = True) -> str:
    """``"met"`` only when the whole interval lies inside the goal (``<= limit``, or ``>= limit``
    with ``at_most=False``); ``"not met"`` when the whole interval lies outside; ``"unclear"`` when
    the interval straddles the limit; ``"met (1 seed)"``/``"not met (1 seed)"`` without an interval."""
    if not math.isfinite(mean):
        return "not met"
    if ci95 is None:
        inside = mean <= limit if at_most else mean >= limit
        return ("met" if inside else "not met") + " (1 seed)"
    lo, hi = mean - ci95, mean + ci95
    if (hi <= limit) if at_most else (lo >= limit):
        return "met"
    if (lo > limit) if at_most else (hi < limit):
        return "not met"
    return "unclear"
