"""Prometheus metrics: mmgate's own series on their own HTTP port, at /metrics.

    gRPC call ──▶ the API's MetricsInterceptor ─▶ grpc requests, durations, in flight ─┐
    cache.get ──▶ LookupMetrics (a LookupHook) ──▶ lookups by stage, outcome, tier ─┤ event loop
    vLLM step ──▶ EngineWorker's stat logger ──▶ EngineStats, EngineTokenStats      │
    actor, queue, media, admission... ──▶ each part's own collect()                 │
                                                                                    ▼
    scrape (http.py's own thread and loop) ── every part's collect(), on the event loop ──▶ text

What the actor, the engine and the media stage count already is read from them at scrape time
(no second bookkeeping): each part has a ``collect()`` that yields its own families
(metric_families.py), and the server adds the part here where it builds it (``Metrics.add``;
this module reaches into nothing). Parts are collected on the event loop, the only thread that
touches their state; a loop too busy to answer within ``SNAPSHOT_TIMEOUT_SECONDS`` gets a
scrape without those series, counted in ``mmgate_metrics_stale_scrapes_total``, as does one the
loop heartbeat (heartbeat.py) knows is blocked, at once; ``mmgate_event_loop_blocked`` comes from
that thread, so a scrape says so while the loop is stuck.

The three cache levels, as operators read them (docs/observability.md): ``page`` (KV-cache tokens
found resident in the engine), ``prefix`` (requests that reused a cached prefix), ``media`` (images
served by mmgate's cache), each with counters and a ratio in ``mmgate_cache_hit_ratio{level}``.
``vllm_cache_hit_rate``, which existing dashboards scrape, is the page level's ratio.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from cache_actor import LookupEvent, LookupHook, Stage

from ..config import Settings
from ..types import EngineStats
from .heartbeat import LAG_BUCKETS, LoopHeartbeat
from .histograms import cumulative_buckets
from .http import MetricsHTTPServer
from .lookups import OTHER_STAGE, lookup_outcome, stage_label
from .metric_families import (
    LookupKey,
    cache_level_families,
    lookup_families,
    loop_task_families,
)

log = logging.getLogger("mmgate.metrics")

SNAPSHOT_TIMEOUT_SECONDS = 5.0
SNAPSHOT_SLICE_SECONDS = 0.1
# a cache lookup takes microseconds when it hits, up to seconds when it computes
LOOKUP_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# a gRPC call: a cache or health answer in a millisecond, a generation in seconds to minutes
GRPC_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip


class Part(Protocol):
    """What a part of the service gives metrics: its own families, read on the event loop."""

    def collect(self) -> Iterable[Metric]: ...


@final
class LookupMetrics:
    """The LookupHook behind ``mmgate_actor_lookups_total`` and the lookup duration histogram.

    Both methods run in the caller's task on the event loop: the counts are plain ints, read by
    the scrape on the same loop.
    """

    __slots__ = ("_durations", "counts", "duration")

    def __init__(self, duration: Histogram) -> None:
        self.counts: dict[LookupKey, int] = {}
        self.duration = duration
        self._durations: dict[str, Any] = {}  # a histogram child per stage, found once

    def lookup_started(self, tenant: str, key: str, stage: Stage) -> object:
        return stage_label(stage)  # the token: the label lookup_finished counts under

    def lookup_finished(self, token: object, event: LookupEvent) -> None:
        stage = token if isinstance(token, str) else OTHER_STAGE
        key = (stage, lookup_outcome(event), event.tier or "none")
        self.counts[key] = self.counts.get(key, 0) + 1
        child = self._durations.get(stage)
        if child is None:
            child = self._durations[stage] = self.duration.labels(stage)
        child.observe(event.wait_seconds)


@final
class Metrics:
    """mmgate's metrics registry, its gRPC interceptor, its lookup hook and its HTTP server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.enabled = settings.metrics.enabled
        self.port = 0
        # one registry per server: several run in one test process
        self.registry = CollectorRegistry()
        # the gRPC calls' families, counted by the API's interceptor
        self.grpc_requests = Counter(
            "mmgate_grpc_requests_total",
            "gRPC calls finished, by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.grpc_duration = Histogram(
            "mmgate_grpc_request_duration_seconds",
            "Duration of gRPC calls (a stream: until its last message), by method.",
            ["method"],
            buckets=GRPC_BUCKETS,
            registry=self.registry,
        )
        self.grpc_in_flight = Gauge(
            "mmgate_grpc_streams_in_flight",
            "gRPC calls in progress, by method.",
            ["method"],
            registry=self.registry,
        )
        self._lookups = LookupMetrics(
            Histogram(
                "mmgate_actor_lookup_duration_seconds",
                "Cache lookups from call to answer, by stage.",
                ["stage"],
                buckets=LOOKUP_BUCKETS,
                registry=self.registry,
            )
        )
        self.lookup_hook: LookupHook | None = self._lookups if self.enabled else None
        self.registry.register(_ServiceCollector(self))
        # the parts whose figures a scrape reads, on the event loop: lookups first
        self._parts: list[Part] = [self]
        self.heartbeat: LoopHeartbeat | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._http: MetricsHTTPServer | None = None
        # counted by the scraping threads (several scrapes may run at once)
        self.stale_scrapes = 0
        self._stale_lock = threading.Lock()

    def add(self, *parts: Part) -> None:
        """Export each part's families from now on (its ``collect()``, on the event loop)."""
        self._parts.extend(parts)

    def collect(self) -> Iterator[Metric]:
        """Metrics' own loop-side families: lookups by stage, asyncio tasks."""
        yield from lookup_families(self._lookups.counts)
        yield from loop_task_families(len(asyncio.all_tasks()))

    def start(self, heartbeat: LoopHeartbeat) -> None:
        """Serve /metrics on settings.metrics.host:port (sets self.port); on the event loop.

        ``heartbeat`` says, from its own thread, whether this loop is blocked.
        """
        if self._http is not None:
            return
        self.heartbeat = heartbeat
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        settings = self.settings.metrics
        http = MetricsHTTPServer(
            self.registry,
            read_timeout=settings.read_timeout_seconds,
            max_connections=settings.max_connections,
        )
        http.start(settings.host, settings.port)
        self._http = http
        self.port = http.port
        log.info("metrics on http://%s:%d/metrics", settings.host, self.port)

    def stop(self) -> None:
        if self._http is None:
            return
        http, self._http = self._http, None
        http.stop()

    # ── scrapes ─────────────────────────────────────────────────────────────────────────────

    def _take(self) -> list[Metric]:
        return [family for part in self._parts for family in part.collect()]

    def part_families(self) -> list[Metric] | None:
        """Every part's families now, read on the event loop; None when they could not be."""
        take, loop = self._take, self._loop
        if self.heartbeat is None:  # not started
            return None
        if loop is None or threading.get_ident() == self._loop_thread:
            return take()
        if self.heartbeat is not None and self.heartbeat.blocked:
            # the loop is known to be stuck: answer now with what the threads know
            with self._stale_lock:
                self.stale_scrapes += 1
            return None
        answer: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def run() -> None:
            if answer.set_running_or_notify_cancel():
                try:
                    answer.set_result(take())
                except Exception as exc:  # noqa: BLE001 - handed to the scraping thread
                    answer.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the server has stopped
            return None
        try:
            return self._wait(answer)
        except concurrent.futures.TimeoutError:
            answer.cancel()
            with self._stale_lock:
                self.stale_scrapes += 1
            log.warning("metrics scrape: the event loop did not answer")
            return None

    def _wait(self, answer: concurrent.futures.Future[list[Metric]]) -> list[Metric]:
        """The loop's answer, in slices: a block the heartbeat sees meanwhile ends the wait."""
        waited = 0.0
        while True:
            try:
                return answer.result(timeout=SNAPSHOT_SLICE_SECONDS)
            except concurrent.futures.TimeoutError:
                waited += SNAPSHOT_SLICE_SECONDS
                blocked = self.heartbeat is not None and self.heartbeat.blocked
                if blocked or waited >= SNAPSHOT_TIMEOUT_SECONDS:
                    raise

    def cache_levels(self, engine_stats: Callable[[], EngineStats]) -> Part:
        """The three cache levels: the engine's pages and prefixes beside the media lookups."""
        return _CacheLevels(engine_stats, self._lookups)


@final
class _CacheLevels:
    def __init__(self, engine_stats: Callable[[], EngineStats], lookups: LookupMetrics) -> None:
        self.engine_stats = engine_stats
        self.lookups = lookups

    def collect(self) -> Iterator[Metric]:
        return cache_level_families(self.engine_stats(), self.lookups.counts)


@final
class _ServiceCollector:
    """The scrape's own families, and every part's, read on the event loop."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        stale = CounterMetricFamily(
            "mmgate_metrics_stale_scrapes_total",
            "Scrapes without the service's series: the event loop did not answer in time.",
        )
        families = self.metrics.part_families()
        stale.add_metric([], self.metrics.stale_scrapes)
        yield stale
        heartbeat = self.metrics.heartbeat
        # read from the heartbeat's thread: true while the loop itself cannot answer (0 before
        # the server has started watching)
        yield GaugeMetricFamily(
            "mmgate_event_loop_blocked",
            "1 while the event loop has not answered the heartbeat for loop_block_seconds.",
            value=float(heartbeat is not None and heartbeat.blocked),
        )
        yield CounterMetricFamily(
            "mmgate_event_loop_blocks_total",
            "Times the event loop was blocked for loop_block_seconds or longer.",
            value=heartbeat.blocks if heartbeat is not None else 0,
        )
        lag = HistogramMetricFamily(
            "mmgate_event_loop_lag_seconds",
            "How long each heartbeat (every loop_block_seconds / 4) waited for the event loop.",
        )
        if heartbeat is not None:
            counts = list(heartbeat.lag_counts)
            lag.add_metric([], cumulative_buckets(LAG_BUCKETS, counts), heartbeat.lag_sum)
        yield lag
        if families is not None:
            yield from families
