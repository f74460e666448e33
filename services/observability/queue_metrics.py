"""The figures of mmgate's queue in front of the engine (pipeline/queue.py), and their metric
families, by tenant.

The ``tenant`` label holds at most ``MMGATE_TENANTS__MAX_LABELS`` tenants, the rest counted as
"other" (pipeline/queue.py): a bounded set, whatever callers send in mode none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .histograms import cumulative_buckets

# Upper bounds of the queue-wait buckets, in seconds (the histogram's `le`).
QUEUE_WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0
)  # fmt: skip


@final
@dataclass(slots=True)
class TenantQueueStats:
    """One tenant in mmgate's queue for the engine: now, and counted since start."""

    waiting: int = 0  # requests waiting for a slot now
    slots: int = 0  # engine slots its runs hold now
    granted: int = 0
    left: int = 0  # requests whose caller left, or whose deadline passed, while waiting
    # waits by bucket (QUEUE_WAIT_BUCKETS, then one beyond the last), not cumulative
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(QUEUE_WAIT_BUCKETS) + 1))
    wait_seconds: float = 0.0


@final
@dataclass(frozen=True, slots=True)
class QueueStats:
    """mmgate's queue for the engine: its slots, those taken, each tenant's figures."""

    slots: int = 0  # what the engine is handed at most (0: no queue)
    in_use: int = 0
    tenants: Mapping[str, TenantQueueStats] = field(default_factory=dict)


def queue_families(stats: QueueStats) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_queue_engine_slots",
        "Sequences mmgate hands the engine at most (max_num_seqs + queue_lead; 0: no queue).",
        value=stats.slots,
    )
    yield GaugeMetricFamily(
        "mmgate_queue_engine_slots_in_use",
        "Sequences of runs in the engine now, as mmgate's queue counts them.",
        value=stats.in_use,
    )
    tenants = sorted(stats.tenants.items())
    depth = GaugeMetricFamily(
        "mmgate_queue_depth",
        "Requests waiting in mmgate's queue for an engine slot, by tenant.",
        labels=["tenant"],
    )
    held = GaugeMetricFamily(
        "mmgate_queue_slots_held",
        "Engine slots held by a tenant's runs now (a run of n samples holds n).",
        labels=["tenant"],
    )
    left = CounterMetricFamily(
        "mmgate_queue_left_total",
        "Requests that left mmgate's queue before a slot (caller gone or deadline), by tenant.",
        labels=["tenant"],
    )
    wait = HistogramMetricFamily(
        "mmgate_queue_wait_seconds",
        "Time a run waited in mmgate's queue for engine slots, by tenant.",
        labels=["tenant"],
    )
    for tenant, figures in tenants:
        depth.add_metric([tenant], figures.waiting)
        held.add_metric([tenant], figures.slots)
        left.add_metric([tenant], figures.left)
        buckets = cumulative_buckets(QUEUE_WAIT_BUCKETS, figures.wait_counts)
        wait.add_metric([tenant], buckets, sum_value=figures.wait_seconds)
    yield from (depth, held, left, wait)


__all__ = ["QUEUE_WAIT_BUCKETS", "QueueStats", "TenantQueueStats", "queue_families"]
