"""Load: mixed text and image requests at concurrency 64 against the real engine. Nothing fails,
every cache lookup is accounted for, nothing is left in flight, and memory holds still once warm.

    warm-up (the same mix, not measured) ─▶ RSS, counters ─▶ the load ─▶ RSS, counters again
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import psutil

from services.cli.bench.load import Limits, run
from services.cli.bench.workload import Mix, Workload
from tests.services.prom import scrape
from tests.support import RunningServer, engine_core

from .conftest import record, scaled

CONCURRENCY = 64
# RSS after the load over RSS before it, once warm: the allowed growth
RSS_GROWTH = 0.10
MIX = Mix(
    max_tokens=8,
    image_ratio=0.3,
    image_repeat=0.7,
    working_set=16,
    burst_every=50,
    burst_size=8,
    seed=1,
)


def rss(server: RunningServer) -> dict[str, int]:
    core = engine_core(server)
    assert core is not None
    return {
        "server": psutil.Process(server.process.pid).memory_info().rss,
        "engine_core": core.memory_info().rss,
    }


async def test_mixed_load_leaves_nothing_behind(llava_server: RunningServer) -> None:
    server = llava_server
    async with server.client(timeout=120.0) as client:
        warm = await run(client, Workload(MIX), Limits(requests=scaled(200, 2000), concurrency=64))
        assert Counter(o.code for o in warm[0]) == {"OK": len(warm[0])}
        rss_before = rss(server)
        stats_before = (await client.stats()).actor
        metrics_before = await scrape(server.metrics_url)

        requests = scaled(1000, 30000)
        mix = dataclasses.replace(MIX, seed=2)
        outcomes, _, wall = await run(
            client, Workload(mix), Limits(requests=requests, concurrency=CONCURRENCY)
        )
        stats = await client.stats()
        metrics_after = await scrape(server.metrics_url)
        rss_after = rss(server)

    codes = Counter(o.code for o in outcomes)
    kinds = Counter(o.kind for o in outcomes)
    reported = Counter(lookup for o in outcomes for lookup in o.lookups)
    actor = stats.actor
    moved = {
        name: getattr(actor, name) - getattr(stats_before, name)
        for name in ("hits", "misses", "coalesced", "load_successes", "load_failures",
                     "overloaded", "recursion_rejections", "compute_timeouts")
    }  # fmt: skip
    lookups_moved = metrics_after.total("mmgate_actor_lookups_total") - metrics_before.total(
        "mmgate_actor_lookups_total"
    )
    growth = {part: rss_after[part] / rss_before[part] - 1 for part in rss_before}
    record(
        "load",
        {
            "requests": len(outcomes),
            "concurrency": CONCURRENCY,
            "kinds": dict(kinds),
            "codes": dict(codes),
            "wall_seconds": round(wall, 2),
            "requests_per_second": round(len(outcomes) / wall, 1),
            "lookups_reported": sum(reported.values()),
            "lookups_counted": lookups_moved,
            "actor": moved,
            "rss_before_mib": {k: round(v / 2**20) for k, v in rss_before.items()},
            "rss_after_mib": {k: round(v / 2**20) for k, v in rss_after.items()},
            "rss_growth": {k: round(v, 4) for k, v in growth.items()},
            "cache_mib": {
                "before": round(stats_before.bytes / 2**20, 1),
                "after": round(actor.bytes / 2**20, 1),
                "budget": 32,
            },
            "left": {
                "flights": actor.flights,
                "waiters": actor.waiters,
                "engine_in_flight": stats.engine_health.in_flight,
                "active_requests": metrics_after.value("mmgate_inference_active_requests"),
            },
        },
    )
    assert codes == {"OK": requests}, codes
    assert kinds["image"] > 0
    assert kinds["burst"] > 0
    # every lookup a request reported is one the actor counted, and each ended one way
    assert lookups_moved == sum(reported.values())
    assert moved["hits"] + moved["misses"] + moved["coalesced"] == lookups_moved
    assert moved["misses"] == moved["load_successes"] + moved["load_failures"]
    assert moved["load_failures"] == moved["overloaded"] == moved["compute_timeouts"] == 0
    # nothing left in flight
    assert (actor.flights, actor.waiters, stats.engine_health.in_flight) == (0, 0, 0)
    assert metrics_after.value("mmgate_inference_active_requests") == 0
    assert stats.engine.running + stats.engine.waiting == 0
    # memory holds still once warm
    assert all(g < RSS_GROWTH for g in growth.values()), growth
