"""The few statistics every layer reports, with one rule each: nearest-rank percentiles, the
summary of a sample (count, median, 90th percentile, max), and Jain's fairness index."""
from __future__ import annotations

import math
from typing import Iterable


def percentile(xs: Iterable[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``xs``: a value of the sample, never an
    interpolation between two; NaN for an empty sample."""
    s = sorted(xs)
    if not s:
        return math.nan
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def summary(xs: Iterable[float]) -> dict | None:
    """count, p50, p90 and max of a sample (None when it is empty)."""
    s = sorted(xs)
    if not s:
        return None
    return {"count": len(s), "p50": percentile(s, 50), "p90": percentile(s, 90), "max": s[-1]}


def jain(xs: Iterable[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has all.
    All zero counts as equal (1): no one got more than another. NaN for no values at all."""
    xs = list(xs)
    if not xs:
        return math.nan
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0
