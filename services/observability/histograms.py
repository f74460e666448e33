"""Histograms kept as counts by bucket (the stats snapshots) and exposed as Prometheus wants
them: cumulative, each under its upper bound, the last "+Inf"."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """``counts[i]``: observations in bucket i (the first bound they fit under; the last count:
    beyond every bound) -> (le, observations at or under it), for HistogramMetricFamily."""
    labels = (*(str(bound) for bound in bounds), "+Inf")
    running = itertools.accumulate(counts)
    return [(le, float(count)) for le, count in zip(labels, running, strict=True)]


__all__ = ["cumulative_buckets"]
