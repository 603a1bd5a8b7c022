"""Paired, interleaved wall-clock comparisons (pure logic, standard library only).

On a shared machine one round of a setting varies by +-20 %, so separate runs of two settings
contradict each other.  What is stable: run every setting in every round (engines alive
together, order rotated per round), divide per round, and report the median of those paired
ratios with its interquartile range.

``rotation(names, r)`` is the order of round ``r``; ``paired_ratio(a, b)`` summarises
``a[r] / b[r]`` over the rounds both have.  Used by ``dspark-dynamic-bench --policies`` and by the
laboratory's benchmarks (``dspark_lab.paired`` re-exports this module).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    median: float
    q1: float
    q3: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "n": self.n}

    def __str__(self) -> str:
        return f"{self.median:.3f} (IQR {self.q1:.3f}-{self.q3:.3f}, n={self.n})"


def summarize(values: Sequence[float]) -> Summary:
    """Median and quartiles (inclusive method; one value gives a zero-width range)."""
    vals = sorted(values)
    if not vals:
        raise ValueError("no values to summarise")
    if len(vals) == 1:
        return Summary(vals[0], vals[0], vals[0], 1)
    q1, med, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    return Summary(med, q1, q3, len(vals))


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Summary:
    """Summary of per-round ratios ``a[r] / b[r]``."""
    if len(a) != len(b):
        raise ValueError(f"paired series differ in length: {len(a)} vs {len(b)}")
    return summarize([x / y for x, y in zip(a, b, strict=True) if y > 0])


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """Round ``r`` runs the settings starting at ``r mod len``, so each holds each slot equally."""
    if not names:
        return []
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])
