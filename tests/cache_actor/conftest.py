"""Fixtures for the cache actor: actors that are closed after the test, and leak checks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cache_actor import CacheActor, CacheConfig, CacheStats

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


def assert_stats(cache: CacheActor[Any], **expected: Any) -> CacheStats:
    """Assert the named stats exactly and every counter not named to be zero (async-lru style)."""
    stats = cache.stats()
    actual = dataclasses.asdict(stats)
    wanted = {name: 0 for name in COUNTERS} | expected
    assert {name: actual[name] for name in wanted} == wanted
    return stats


MakeActor = Callable[..., CacheActor[Any]]


@pytest.fixture
async def make_actor() -> AsyncIterator[MakeActor]:
    """Start actors on demand; close them after the test and check nothing was left running."""
    actors: list[CacheActor[Any]] = []

    def make(config: CacheConfig | None = None, **kwargs: Any) -> CacheActor[Any]:
        actor: CacheActor[Any] = CacheActor(config, **kwargs)
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
async def cache(make_actor: MakeActor) -> CacheActor[Any]:
    return make_actor(CacheConfig())


def assert_no_leaked_tasks() -> None:
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert leaked == []


class Gate:
    """A computation that blocks until released and counts its calls (sequencing, not sleeps)."""

    def __init__(self, value: Any = b"value") -> None:
        self.value = value
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> Any:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return self.value


class Stuck:
    """A computation that never finishes by itself and records that it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"never"


async def until(predicate: Callable[[], bool], limit: int = 10_000) -> None:
    """Yield to the loop until ``predicate`` holds: waits on progress, not on time."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")
