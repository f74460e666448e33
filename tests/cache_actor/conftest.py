"""Fixtures for the cache actor: actors that are closed after the test, and exact stats.

Computations (Gate, Stuck) and sequencing helpers, shared with the service's tests, live in
tests/support.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cache_actor import CacheActor, CacheConfig, CacheStats
from tests.support import assert_no_leaked_tasks

COUNTERS = (
    "hits",
    "tier_hits",
    "misses",
    "coalesced",
    "load_successes",
    "load_failures",
    "evictions",
    "evicted_bytes",
    "expirations",
    "oversize_rejections",
    "recursion_rejections",
    "compute_timeouts",
    "caller_timeouts",
    "cancelled_waiters",
    "overloaded",
    "tier_errors",
    "tier_write_errors",
    "stalled_flights",
)


def assert_stats(cache: CacheActor, **expected: Any) -> CacheStats:
    """Assert the named stats exactly and every counter not named to be zero (async-lru style)."""
    stats = cache.stats()
    actual = dataclasses.asdict(stats)
    wanted = {name: 0 for name in COUNTERS} | expected
    assert {name: actual[name] for name in wanted} == wanted
    return stats


MakeActor = Callable[..., CacheActor]


@pytest.fixture
async def make_actor() -> AsyncIterator[MakeActor]:
    """Start actors on demand; close them after the test and check nothing was left running."""
    actors: list[CacheActor] = []

    def make(config: CacheConfig | None = None, **kwargs: Any) -> CacheActor:
        actor = CacheActor(config, **kwargs)
        actor.start()
        actors.append(actor)
        return actor

    yield make
    for actor in actors:
        await actor.aclose()
        stats = actor.stats()
        assert (stats.flights, stats.waiters, stats.alive) == (0, 0, False)
    assert_no_leaked_tasks()


@pytest.fixture
async def cache(make_actor: MakeActor) -> CacheActor:
    return make_actor(CacheConfig())
