"""A lookup names its stage once, in the ``TierUse`` it passes (``Stage.X.tier_use``): that one
argument is what the metrics hook counts it under, what the span says, what the second tier reads
and writes it under, what watchers are told of its entry, and what a bypass is counted under."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cache_actor import CacheActor, CacheConfig, InMemoryTier, Journal, Stage, WatchFilter
from services.config import Settings
from services.observability import spans
from services.observability.lookups import Observers
from services.observability.metrics import LookupMetrics, Metrics
from services.observability.tracing import LookupSpans
from services.pipeline.cache_front import CacheFront
from tests.support import until

SETTINGS = Settings(metrics={"port": 0})


def counts(metrics: Metrics) -> dict[tuple[str, str, str], int]:
    hook = metrics.lookup_hook
    assert isinstance(hook, LookupMetrics)
    return hook.counts


async def value() -> bytes:
    return b"tensor"


async def test_the_stage_named_once_reaches_metrics_spans_the_tier_and_watchers() -> None:
    metrics = Metrics(SETTINGS)
    assert metrics.lookup_hook is not None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks = Observers([metrics.lookup_hook, LookupSpans(provider.get_tracer("test"))])
    tier = InMemoryTier()
    async with CacheActor(CacheConfig(), tier=tier, hook=hooks, journal=Journal()) as cache:
        watcher, _ = await cache.watch(WatchFilter(tenants=None), 0, 16)
        await cache.get("enc", value, tenant="t", tier=Stage.EMBEDDING.tier_use)
        await until(lambda: tier.sets == 1)
        [admitted] = await asyncio.wait_for(watcher.next(), 5)

    assert counts(metrics) == {("embedding", "miss", "none"): 1}
    spans.flush_pending()
    [lookup] = [s for s in exporter.get_finished_spans() if s.name == "cache.lookup"]
    assert dict(lookup.attributes or {})["mmgate.cache.stage"] == "embedding"
    # the embedding stage reads the tier first and writes what it computed, under its stage
    assert tier.gets == 1
    assert tier.stages[("t", "enc")] is Stage.EMBEDDING
    assert (admitted.kind, admitted.stage) == ("admit", Stage.EMBEDDING)


async def test_a_memory_stage_is_counted_under_its_name_and_never_touches_the_tier() -> None:
    metrics = Metrics(SETTINGS)
    tier = InMemoryTier()
    async with CacheActor(CacheConfig(), tier=tier, hook=metrics.lookup_hook) as cache:
        await cache.get("p", value, tenant="t", tier=Stage.PROMPT.tier_use)
        await cache.get("p", value, tenant="t", tier=Stage.PROMPT.tier_use)
    assert counts(metrics) == {("prompt", "miss", "none"): 1, ("prompt", "hit", "memory"): 1}
    assert (tier.gets, tier.sets) == (0, 0)


async def test_a_lookup_that_names_no_stage_is_other_in_metrics_and_any_in_the_tier() -> None:
    metrics = Metrics(SETTINGS)
    tier = InMemoryTier()
    async with CacheActor(CacheConfig(), tier=tier, hook=metrics.lookup_hook) as cache:
        await cache.get("k", value, tenant="t")
        await until(lambda: tier.sets == 1)
    assert counts(metrics) == {("other", "miss", "none"): 1}
    assert tier.stages[("t", "k")] == ""  # as Redis and watchers had it
    assert tier.stages[("t", "k")] is Stage.ANY


async def test_a_bypassed_lookup_is_counted_under_the_stage_it_named() -> None:
    async with CacheActor() as actor:
        front = CacheFront(lambda: actor)
        front.found_stalled()  # lookups compute for themselves: degraded mode
        lookup = await front.get("k", value, tier=Stage.RESPONSE.tier_use)
        assert lookup.value == b"tensor"
        await front.get("k", value)
    assert front.bypassed == {("response", "cache_stalled"): 1, ("other", "cache_stalled"): 1}
