import asyncio

import pytest

from cache_actor import CacheActor, CacheConfig, ComputeTimeout, Outcome
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, Stuck, until


async def test_caller_timeout_leaves_the_flight_running(cache: CacheActor) -> None:
    gate = Gate()
    patient = asyncio.ensure_future(cache.get("k", gate, timeout=30))
    await gate.started.wait()
    with pytest.raises(ComputeTimeout, match="caller"):
        await cache.get("k", gate, timeout=0.01)
    await until(lambda: cache.stats().waiters == 1)
    gate.release.set()
    assert (await patient).outcome is Outcome.MISS
    assert gate.calls == 1
    assert_stats(cache, misses=1, coalesced=1, caller_timeouts=1, load_successes=1, entries=1)


async def test_default_timeout_applies_when_none_is_given(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(default_timeout=0.01))
    gate = Gate()
    with pytest.raises(ComputeTimeout):
        await cache.get("k", gate)
    gate.release.set()
    await until(lambda: cache.stats().entries == 1)
    assert_stats(cache, misses=1, caller_timeouts=1, load_successes=1, entries=1)


async def test_compute_deadline_cancels_and_fails_every_waiter(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(compute_deadline=0.02))
    runaway = Stuck()

    lookups = [asyncio.ensure_future(cache.get("k", runaway, timeout=30)) for _ in range(3)]
    results = await asyncio.gather(*lookups, return_exceptions=True)
    assert all(isinstance(r, ComputeTimeout) and "deadline" in str(r) for r in results)
    await runaway.cancelled.wait()
    assert_stats(cache, misses=1, coalesced=2, compute_timeouts=1, load_failures=1, flights=0)

    gate = Gate()
    gate.release.set()
    assert (await cache.get("k", gate)).outcome is Outcome.MISS  # nothing was left behind
