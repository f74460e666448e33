import asyncio

import pytest

from cache_actor import CacheActor, CacheConfig, CacheError, ComputeTimeout, Outcome
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, until


class ImageCorrupt(ValueError):
    pass


async def test_error_reaches_every_waiter_with_its_type(cache: CacheActor) -> None:
    release = asyncio.Event()
    calls = 0

    async def broken() -> bytes:
        nonlocal calls
        calls += 1
        await release.wait()
        raise ImageCorrupt("bad header")

    lookups = [asyncio.ensure_future(cache.get("k", broken)) for _ in range(10)]
    await until(lambda: cache.stats().waiters == 10)
    release.set()
    results = await asyncio.gather(*lookups, return_exceptions=True)
    assert all(isinstance(r, ImageCorrupt) for r in results)
    assert calls == 1
    assert_stats(cache, misses=1, coalesced=9, load_failures=1, entries=0)


async def test_failure_is_not_stored(cache: CacheActor) -> None:
    async def broken() -> bytes:
        raise ImageCorrupt("bad header")

    with pytest.raises(ImageCorrupt):
        await cache.get("k", broken)
    gate = Gate(b"fixed")
    gate.release.set()
    lookup = await cache.get("k", gate)  # computes afresh: no poisoned key
    assert (lookup.value, lookup.outcome) == (b"fixed", Outcome.MISS)
    assert_stats(cache, misses=2, load_failures=1, load_successes=1, entries=1)


async def test_stale_failure_never_removes_a_newer_flight(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(compute_deadline=0.05))
    fail_now = asyncio.Event()
    failing = asyncio.Event()

    async def stubborn() -> bytes:
        # ignores its cancellation at the deadline, then fails late
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await fail_now.wait()
        failing.set()  # the wrapper posts the completion in this same step
        raise ImageCorrupt("late failure of the first flight")

    with pytest.raises(ComputeTimeout):
        await cache.get("k", stubborn)
    second = Gate(b"second")
    newer = asyncio.ensure_future(cache.get("k", second, timeout=10))
    await second.started.wait()

    fail_now.set()  # the first flight's completion now reaches the actor
    await failing.wait()
    info = await cache.inspect("k")  # queued behind the stale completion
    assert info.state == "in_flight"
    assert info.waiters == 1

    second.release.set()
    assert (await newer).value == b"second"
    assert_stats(cache, misses=2, compute_timeouts=1, load_failures=1, load_successes=1, entries=1)


async def test_compute_raising_cancelled_error_is_not_passed_on(
    cache: CacheActor,
) -> None:
    async def cancelled_inside() -> bytes:
        raise asyncio.CancelledError  # e.g. a dependency it awaited was cancelled

    with pytest.raises(CacheError, match="cancelled") as caught:
        await cache.get("k", cancelled_inside)
    assert not isinstance(caught.value, asyncio.CancelledError)
    assert_stats(cache, misses=1, load_failures=1)


async def test_weigher_error_fails_the_flight_not_the_actor(make_actor: MakeActor) -> None:
    def weigher(value: object) -> int:
        raise TypeError("cannot weigh")

    cache = make_actor(CacheConfig(weigher=weigher))
    gate = Gate()
    gate.release.set()
    with pytest.raises(TypeError):
        await cache.get("k", gate)
    assert cache.alive
    assert_stats(cache, misses=1, load_failures=1)
