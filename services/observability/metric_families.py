"""The service's Prometheus families, each built from the figures of the part that owns them.

Every part (the cache front, the engine, the health monitor, the thread pools, admission, the
chaos injector, the auth gate, the pipeline) has a ``collect()`` that reads its own figures and
yields its families through one of these functions; the server adds the part to ``Metrics`` where
it builds it (metrics.py runs every ``collect()`` on the event loop at each scrape).

Names follow docs/observability.md, which lists every series: the prefix ``mmgate_``, base units,
``_total`` on counters only; the exception, ``vllm_cache_hit_rate``, is the page level's ratio."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from typing import get_args

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from cache_actor import CacheStats, Outcome, Stage

from ..types import (
    TIME_TO_FIRST_TOKEN_BUCKETS,
    EngineHealth,
    EngineState,
    EngineStats,
    EngineTokenStats,
    ThreadPoolStats,
)
from .histograms import cumulative_buckets

# the cache stages that hold images: the media level
MEDIA_STAGES = frozenset(stage for stage in Stage if stage.is_media)

LookupKey = tuple[str, str, str]  # stage, outcome, tier


def media_outcome(outcome: str, tier: str) -> str:
    """A media-level outcome: a value found in any tier of mmgate's cache is a hit there."""
    if outcome == Outcome.MISS.value and tier != "none":
        return Outcome.HIT.value
    return outcome


def media_lookups(lookups: Mapping[LookupKey, int]) -> dict[tuple[str, str], int]:
    """Lookups of the media stages by (tier, media outcome)."""
    media: dict[tuple[str, str], int] = {}
    for (stage, outcome, tier), count in lookups.items():
        if stage in MEDIA_STAGES:
            key = (tier, media_outcome(outcome, tier))
            media[key] = media.get(key, 0) + count
    return media


def ratio(hits: float, total: float) -> float:
    return hits / total if total else 0.0


# (name, CacheStats field, help): one unlabelled series each
_ACTOR_GAUGES = (
    ("mmgate_actor_entries", "entries", "Entries held in memory."),
    ("mmgate_actor_bytes", "bytes", "Bytes held in memory."),
    ("mmgate_actor_flights", "flights", "Computations (or tier reads) in progress."),
    ("mmgate_actor_waiters", "waiters", "Lookups waiting on a flight."),
    ("mmgate_actor_mailbox_depth", "mailbox_depth", "Requests queued in the actor's mailbox."),
    ("mmgate_actor_loop_lag_seconds", "loop_lag_seconds", "How late the actor's last tick ran."),
    (
        "mmgate_actor_oldest_flight_seconds",
        "oldest_flight_seconds",
        "Age of the oldest flight in progress (0: none).",
    ),
    ("mmgate_actor_alive", "alive", "1 while the actor answers its mailbox."),
    (
        "mmgate_actor_tier_write_queue_depth",
        "tier_write_queue_depth",
        "Second-tier writes waiting for a writer.",
    ),
)
_ACTOR_COUNTERS = (
    ("mmgate_actor_evictions_total", "evictions", "Entries evicted to fit the byte budget."),
    ("mmgate_actor_evicted_bytes_total", "evicted_bytes", "Bytes evicted."),
    ("mmgate_actor_expirations_total", "expirations", "Entries dropped past their TTL."),
    (
        "mmgate_actor_oversize_rejections_total",
        "oversize_rejections",
        "Values not stored: larger than the budget.",
    ),
    (
        "mmgate_actor_recursion_rejections_total",
        "recursion_rejections",
        "Lookups refused at once: they would have waited on their own computation.",
    ),
    (
        "mmgate_actor_compute_timeouts_total",
        "compute_timeouts",
        "Computations cancelled at the compute deadline.",
    ),
    (
        "mmgate_actor_caller_timeouts_total",
        "caller_timeouts",
        "Lookups whose caller stopped waiting at its deadline.",
    ),
    (
        "mmgate_actor_cancelled_waiters_total",
        "cancelled_waiters",
        "Lookups cancelled by their caller while waiting.",
    ),
    (
        "mmgate_actor_overloaded_total",
        "overloaded",
        "Lookups refused: the mailbox or the flight table was full.",
    ),
    (
        "mmgate_actor_stalled_flights_total",
        "stalled_flights",
        "Computations that ran past the stall threshold (logged with their stack).",
    ),
    (
        "mmgate_actor_tier_hits_total",
        "tier_hits",
        "Flights served by the second tier instead of a computation.",
    ),
    (
        "mmgate_actor_load_seconds_total",
        "load_seconds",
        "Time spent loading values (computations and tier reads).",
    ),
)


def cache_level_families(e: EngineStats, counts: Mapping[LookupKey, int]) -> Iterator[Metric]:
    """The three cache levels: the engine's pages and prefixes, mmgate's media lookups."""
    for name, value, documentation in (
        (
            "mmgate_cache_page_queried_tokens_total",
            e.prefix_cache_queries,
            "page level: prompt tokens looked up in the engine's KV cache (vLLM prefix cache).",
        ),
        (
            "mmgate_cache_page_hit_tokens_total",
            e.prefix_cache_hits,
            "page level: prompt tokens found resident in the engine's KV cache.",
        ),
        (
            "mmgate_cache_prefix_requests_total",
            e.requests,
            "prefix level: requests the engine finished.",
        ),
        (
            "mmgate_cache_prefix_hit_requests_total",
            e.requests_with_cached_prefix,
            "prefix level: finished requests that reused a cached prefix (num_cached_tokens > 0).",
        ),
    ):
        yield CounterMetricFamily(name, documentation, value=value)
    # the plain hit and miss series exist from the start, so rate() over them has no gap
    media = {("memory", "hit"): 0, ("none", "miss"): 0, **media_lookups(counts)}
    lookups = CounterMetricFamily(
        "mmgate_cache_media_lookups_total",
        "media level: image and encoder-output lookups in mmgate's cache, by tier (none: "
        "computed) and outcome (a value found in any tier is a hit).",
        labels=["tier", "outcome"],
    )
    for (tier, outcome), count in sorted(media.items()):
        lookups.add_metric([tier, outcome], count)
    yield lookups
    served = sum(n for (_, outcome), n in media.items() if outcome in ("hit", "coalesced"))
    page = ratio(e.prefix_cache_hits, e.prefix_cache_queries)
    ratios = GaugeMetricFamily(
        "mmgate_cache_hit_ratio",
        "Hit ratio per cache level since start: page = hit / queried tokens, prefix = hit / "
        "finished requests, media = (hits + coalesced) / media lookups.",
        labels=["level"],
    )
    ratios.add_metric(["page"], page)
    ratios.add_metric(["prefix"], ratio(e.requests_with_cached_prefix, e.requests))
    ratios.add_metric(["media"], ratio(served, sum(media.values())))
    yield ratios
    yield GaugeMetricFamily(
        "vllm_cache_hit_rate",
        "The engine's KV-cache hit ratio since start: tokens found resident / tokens queried "
        '(the same as mmgate_cache_hit_ratio{level="page"}).',
        value=page,
    )


def _by_label(name: str, documentation: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family


def lookup_families(counts: Mapping[LookupKey, int]) -> Iterator[Metric]:
    lookups = CounterMetricFamily(
        "mmgate_actor_lookups_total",
        "Cache actor lookups by stage, outcome (hit, miss, coalesced, rejected, timeout, "
        "cancelled, error) and tier (memory, a second tier's name, none: computed or failed).",
        labels=["stage", "outcome", "tier"],
    )
    for (stage, outcome, tier), count in sorted(counts.items()):
        lookups.add_metric([stage, outcome, tier], count)
    yield lookups


def actor_families(c: CacheStats, mailbox_capacity: int) -> Iterator[Metric]:
    for name, field, documentation in _ACTOR_GAUGES:
        yield GaugeMetricFamily(name, documentation, value=float(getattr(c, field)))
    yield GaugeMetricFamily(
        "mmgate_actor_mailbox_capacity",
        "Requests the mailbox holds before lookups are refused.",
        value=mailbox_capacity,
    )
    for name, field, documentation in _ACTOR_COUNTERS:
        yield CounterMetricFamily(name, documentation, value=getattr(c, field))
    yield _by_label(
        "mmgate_actor_loads_total",
        "Flights finished, by result (success or failure).",
        "result",
        {"success": c.load_successes, "failure": c.load_failures},
    )
    yield _by_label(
        "mmgate_actor_tier_errors_total",
        "Second-tier (Redis) errors by operation; the lookup went on without the tier.",
        "op",
        {"read": c.tier_errors, "write": c.tier_write_errors},
    )
    yield CounterMetricFamily(
        "mmgate_actor_tier_write_drops_total",
        "Second-tier writes dropped: the write queue was full.",
        value=c.tier_write_drops,
    )
    breaker = GaugeMetricFamily(
        "mmgate_actor_tier_breaker_open",
        "1 while the second tier is skipped after repeated read errors, by tier.",
        labels=["tier"],
    )
    if c.tier is not None:
        breaker.add_metric([c.tier], float(c.tier_breaker_open))
    yield breaker


def tier_families(refused_values: int) -> Iterator[Metric]:
    refused = CounterMetricFamily(
        "mmgate_tier_refused_values_total",
        "Values read from the second tier that failed a check (format, length, digest): misses.",
    )
    refused.add_metric([], refused_values)
    yield refused


def engine_families(ready: bool, e: EngineStats, t: EngineTokenStats) -> Iterator[Metric]:
    for name, value, documentation in (
        ("mmgate_engine_ready", float(ready), "1 while the engine serves requests."),
        ("mmgate_engine_running_requests", e.running, "Requests the engine is running."),
        ("mmgate_engine_waiting_requests", e.waiting, "Requests queued in the engine."),
        (
            "mmgate_engine_kv_cache_usage_ratio",
            e.kv_cache_usage,
            "Share of the KV cache in use (0 to 1).",
        ),
        (
            "mmgate_engine_generation_tokens_per_second",
            t.generation_tokens_per_second,
            "Tokens generated per second over the last few seconds.",
        ),
    ):
        yield GaugeMetricFamily(name, documentation, value=value)
    for name, value, documentation in (
        (
            "mmgate_engine_prompt_tokens_total",
            t.prompt_tokens,
            "Prompt tokens the engine took in (cached ones included).",
        ),
        ("mmgate_engine_generation_tokens_total", t.generation_tokens, "Tokens generated."),
        (
            "mmgate_engine_aborted_requests_total",
            e.aborted,
            "Engine requests ended early: cancelled, deadline passed, or shut down.",
        ),
    ):
        yield CounterMetricFamily(name, documentation, value=value)
    ttft = HistogramMetricFamily(
        "mmgate_engine_time_to_first_token_seconds",
        "From a request's arrival in the engine to its first generated token.",
    )
    buckets = cumulative_buckets(TIME_TO_FIRST_TOKEN_BUCKETS, t.time_to_first_token_counts)
    ttft.add_metric([], buckets, sum_value=t.time_to_first_token_sum)
    yield ttft


def engine_health_families(h: EngineHealth) -> Iterator[Metric]:
    """The engine as the watchdog sees it (services/api/health.py)."""
    yield GaugeMetricFamily(
        "mmgate_engine_in_flight_requests",
        "Engine requests mmgate has open (its own count: true when the engine is silent).",
        value=h.in_flight,
    )
    yield GaugeMetricFamily(
        "mmgate_engine_seconds_since_step",
        "Seconds without an engine step while requests are in flight (0 when idle).",
        value=h.seconds_since_step,
    )
    yield CounterMetricFamily(
        "mmgate_engine_stalls_total",
        "Times requests were in flight and the engine did not step for engine_stall_seconds.",
        value=h.stalls,
    )
    state = GaugeMetricFamily(
        "mmgate_engine_state",
        "1 for the engine's state as the watchdog sees it (serving, stalled, hung, failed...).",
        labels=["state"],
    )
    for name in get_args(EngineState):
        state.add_metric([name], float(name == h.state))
    yield state


def thread_families(pools: Iterable[ThreadPoolStats]) -> Iterator[Metric]:
    pools = tuple(pools)
    for name, documentation, value in (
        ("mmgate_stage_threads", "Threads of each pool of CPU-bound work.", "threads"),
        ("mmgate_stage_threads_busy", "Computations running in a pool's threads.", "busy"),
        (
            "mmgate_stage_threads_waiting",
            "Computations queued for a pool's threads.",
            "waiting",
        ),
    ):
        # published names: the label `stage` holds the pool (docs/architecture.md, "Words")
        family = GaugeMetricFamily(name, documentation, labels=["stage"])
        for stats in pools:
            family.add_metric([stats.pool], getattr(stats, value))
        yield family


def admission_families(active: int, max_concurrent: int) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_inference_active_requests",
        "Inference requests in progress (cache stages and engine).",
        value=active,
    )
    yield GaugeMetricFamily(
        "mmgate_inference_max_concurrent_requests",
        "Requests in progress beyond which new ones get RESOURCE_EXHAUSTED.",
        value=max_concurrent,
    )


def loop_task_families(tasks: int) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_event_loop_tasks",
        "asyncio tasks alive on the service's event loop (one that only grows is a leak).",
        value=tasks,
    )


def chaos_families(enabled: bool, injected: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "mmgate_chaos_enabled",
        "1 while fault injection is on (MMGATE_CHAOS__ENABLED): failures are on purpose.",
        value=float(enabled),
    )
    faults = CounterMetricFamily(
        "mmgate_chaos_faults_total",
        "Faults injected on purpose, by point (decode, encode, engine, loop_block) and fault.",
        labels=["point", "fault"],
    )
    for (point, fault), count in sorted(injected.items()):
        faults.add_metric([point, fault], count)
    yield faults


def auth_families(refused_by_reason: Mapping[str, int]) -> Iterator[Metric]:
    refused = CounterMetricFamily(
        "mmgate_auth_refused_total",
        "Calls refused by authentication, by reason (UNTRUSTED_PEER: mesh mode, a connection "
        "that is not the sidecar's).",
        labels=["reason"],
    )
    for reason, count in sorted(refused_by_reason.items()):
        refused.add_metric([reason], count)
    yield refused


def info_families(model: str, media_mode: str) -> Iterator[Metric]:
    info = InfoMetricFamily("mmgate", "The model served, the media mode and mmgate's version.")
    info.add_metric([], {"model": model, "media_mode": media_mode, "version": VERSION})
    yield info


def _version() -> str:
    try:
        return metadata.version("mmgate")
    except metadata.PackageNotFoundError:
        return "unknown"


# mmgate's own version: the info metric's and Inference.GetServerInfo's
VERSION = _version()
