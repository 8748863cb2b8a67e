"""The one rule for each statistic the project reports."""
from __future__ import annotations

import math

import pytest

from emulator.stats import jain, percentile, summary


def test_jain_index():
    assert jain([5, 5, 5, 5]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)  # one flow has it all: 1/n
    assert jain([1, 3]) == pytest.approx(16 / 20)
    assert jain([0, 0, 0]) == 1.0  # no one got more than another
    assert math.isnan(jain([]))


def test_nearest_rank_percentile():
    xs = list(range(1, 101))
    assert percentile(xs, 50) == 50 and percentile(xs, 99) == 99 and percentile(xs, 100) == 100
    assert percentile(reversed(xs), 0) == 1  # any order; the lowest rank is the minimum
    assert percentile([1, 2, 3, 4], 50) == 2  # a value of the sample, not 2.5
    assert math.isnan(percentile([], 50))


def test_summary_uses_the_same_percentiles():
    xs = [0.4, 0.1, 0.3, 0.2, 1.0]
    assert summary(xs) == {"count": 5, "p50": 0.3, "p90": 1.0, "max": 1.0}
    assert summary([]) is None
