"""Fixtures for the cache actor: actors that are closed after the test, and exact stats.

Computations (Gate, Stuck) and sequencing helpers, shared with the service's tests, live in
tests/support.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cache_actor import CacheActor, CacheConfig
from tests.cache_actor.stats_check import MakeActor
from tests.support import assert_no_leaked_tasks


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
