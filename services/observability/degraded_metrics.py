"""The cache front's figures: degraded mode (whether requests compute without the cache now,
and how often) and the watchers of what the cache holds (Cache.Watch: the journal's own counts,
``cache_actor.WatchStats``).

mmgate_cache_degraded                  1 while the cache actor cannot answer (dead, stalled)
mmgate_cache_actor_replacements_total  dead actors replaced by fresh, empty ones
mmgate_cache_bypassed_total            lookups computed without the cache, by stage, reason
mmgate_cache_watchers                  Cache.Watch streams open
mmgate_cache_watch_events_total        events handed to watchers
mmgate_cache_watch_gaps_total          watchers that fell behind (or were reset): one gap each
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cache_actor import WatchStats


@final
@dataclass(frozen=True, slots=True)
class DegradedStats:
    degraded: bool = False
    replacements: int = 0
    # (stage, reason: cache_dead | cache_stalled) -> lookups computed without the cache
    bypassed: Mapping[tuple[str, str], int] = field(default_factory=dict)


def degraded_families(stats: DegradedStats, watch: WatchStats) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_cache_degraded",
        "1 while the cache actor cannot answer (dead or stalled): requests compute without "
        "the cache (MMGATE_CACHE__ON_FAILURE=compute) or fail.",
        value=float(stats.degraded),
    )
    yield CounterMetricFamily(
        "mmgate_cache_actor_replacements_total",
        "Dead cache actors replaced by fresh, empty ones.",
        value=stats.replacements,
    )
    bypassed = CounterMetricFamily(
        "mmgate_cache_bypassed_total",
        "Lookups computed without the cache because the actor could not answer, by stage and "
        "reason (cache_dead, cache_stalled).",
        labels=["stage", "reason"],
    )
    for (stage, reason), count in sorted(stats.bypassed.items()):
        bypassed.add_metric([stage, reason], count)
    yield bypassed
    yield GaugeMetricFamily(
        "mmgate_cache_watchers", "Cache.Watch streams open.", value=watch.watchers
    )
    yield CounterMetricFamily(
        "mmgate_cache_watch_events_total",
        "Cache events handed to Cache.Watch streams.",
        value=watch.events,
    )
    yield CounterMetricFamily(
        "mmgate_cache_watch_gaps_total",
        "Watchers that fell behind their buffer, or whose cache was emptied (a replaced "
        "actor): each got one gap event and its stream ended.",
        value=watch.gaps,
    )


__all__ = ["DegradedStats", "degraded_families"]
