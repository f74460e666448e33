import asyncio

import pytest

from cache_actor import CacheActor, CacheConfig, ComputeTimeout, Outcome, waiting_to_start
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, Stuck, until


async def test_leader_cancellation_leaves_followers_served(cache: CacheActor) -> None:
    gate = Gate()
    leader = asyncio.ensure_future(cache.get("k", gate))
    await gate.started.wait()
    followers = [asyncio.ensure_future(cache.get("k", gate)) for _ in range(5)]
    await until(lambda: cache.stats().waiters == 6)

    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    await until(lambda: cache.stats().waiters == 5)
    gate.release.set()

    results = await asyncio.gather(*followers)
    assert [r.outcome for r in results] == [Outcome.COALESCED] * 5
    assert gate.calls == 1
    assert_stats(cache, misses=1, coalesced=5, cancelled_waiters=1, load_successes=1, entries=1)


async def test_follower_cancellation_removes_only_itself(cache: CacheActor) -> None:
    gate = Gate()
    leader = asyncio.ensure_future(cache.get("k", gate))
    follower = asyncio.ensure_future(cache.get("k", gate))
    await until(lambda: cache.stats().waiters == 2)
    follower.cancel()
    await until(lambda: cache.stats().waiters == 1)
    gate.release.set()
    assert (await leader).outcome is Outcome.MISS
    assert follower.cancelled()
    assert_stats(cache, misses=1, coalesced=1, cancelled_waiters=1, load_successes=1, entries=1)


async def test_flight_outlives_its_last_waiter_by_default(cache: CacheActor) -> None:
    gate = Gate()
    only = asyncio.ensure_future(cache.get("k", gate))
    await gate.started.wait()
    only.cancel()
    await until(lambda: cache.stats().waiters == 0)
    assert cache.stats().flights == 1  # the image will likely be asked for again
    gate.release.set()
    await until(lambda: cache.stats().entries == 1)
    assert (await cache.get("k", gate)).outcome is Outcome.HIT
    assert gate.calls == 1


async def test_orphaned_flight_can_be_cancelled(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(finish_orphaned_flights=False))
    compute = Stuck()

    only = asyncio.ensure_future(cache.get("k", compute))
    await until(lambda: cache.stats().flights == 1)
    only.cancel()
    await compute.cancelled.wait()
    await until(lambda: cache.stats().flights == 0)
    assert_stats(cache, misses=1, cancelled_waiters=1, entries=0)


async def test_cancel_before_the_actor_reads_the_request(cache: CacheActor) -> None:
    gate = Gate()
    lookup = asyncio.ensure_future(cache.get("k", gate))
    await until(lambda: cache.stats().mailbox_depth == 1)  # queued, not yet read
    lookup.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lookup
    await cache.ping()
    assert gate.calls == 0
    assert_stats(cache, cancelled_waiters=1, flights=0)


async def test_a_queued_orphan_is_cancelled_before_it_starts(cache: CacheActor) -> None:
    capacity = asyncio.Semaphore(0)  # no capacity: the computation stays queued
    entered = asyncio.Event()
    started = []

    async def compute() -> bytes:
        with waiting_to_start():
            entered.set()
            await capacity.acquire()
        started.append(True)
        return b"value"

    only = asyncio.ensure_future(cache.get("k", compute))
    await entered.wait()
    only.cancel()
    await until(lambda: cache.stats().flights == 0)  # default config: orphans finish, but not this
    capacity.release()
    assert started == []
    assert_stats(cache, misses=1, cancelled_waiters=1, entries=0)


async def test_an_orphan_that_has_started_finishes(cache: CacheActor) -> None:
    capacity = asyncio.Semaphore(0)
    gate = Gate()

    async def compute() -> bytes:
        with waiting_to_start():
            await capacity.acquire()
        value: bytes = await gate()  # started: out of the queue
        return value

    only = asyncio.ensure_future(cache.get("k", compute))
    await until(lambda: cache.stats().flights == 1)
    capacity.release()
    await gate.started.wait()
    only.cancel()
    await until(lambda: cache.stats().waiters == 0)
    gate.release.set()
    await until(lambda: cache.stats().entries == 1)
    assert (await cache.get("k", compute)).outcome is Outcome.HIT


async def test_a_flight_asked_to_stop_when_orphaned_is_cancelled_with_its_last_waiter(
    cache: CacheActor,
) -> None:
    compute = Stuck()
    first = asyncio.ensure_future(cache.get("k", compute, cancel_when_orphaned=True))
    second = asyncio.ensure_future(cache.get("k", compute, cancel_when_orphaned=True))
    await until(lambda: cache.stats().waiters == 2)
    first.cancel()
    await until(lambda: cache.stats().waiters == 1)
    assert not compute.cancelled.is_set()  # somebody still waits: it goes on
    second.cancel()
    await compute.cancelled.wait()  # default config (orphans finish), but not this one
    await until(lambda: cache.stats().flights == 0)
    assert_stats(cache, misses=1, coalesced=1, cancelled_waiters=2, entries=0)


async def test_it_runs_to_the_latest_deadline_of_those_still_waiting(cache: CacheActor) -> None:
    gate = Gate()
    leader = asyncio.ensure_future(cache.get("k", gate, timeout=0.01, cancel_when_orphaned=True))
    await gate.started.wait()
    patient = asyncio.ensure_future(cache.get("k", gate, timeout=30, cancel_when_orphaned=True))
    with pytest.raises(ComputeTimeout, match="caller"):
        await leader  # the leader's deadline passes: the follower keeps the flight alive
    await until(lambda: cache.stats().waiters == 1)
    gate.release.set()
    assert (await patient).outcome is Outcome.COALESCED
    assert gate.calls == 1
    assert_stats(cache, misses=1, coalesced=1, caller_timeouts=1, load_successes=1, entries=1)


async def test_a_last_waiter_past_its_deadline_ends_the_flight(cache: CacheActor) -> None:
    compute = Stuck()
    with pytest.raises(ComputeTimeout):
        await cache.get("k", compute, timeout=0.01, cancel_when_orphaned=True)
    await compute.cancelled.wait()
    await until(lambda: cache.stats().flights == 0)
    assert_stats(cache, misses=1, caller_timeouts=1, entries=0)


async def test_the_lookup_that_starts_the_flight_decides(cache: CacheActor) -> None:
    gate = Gate()
    leader = asyncio.ensure_future(cache.get("k", gate))
    await gate.started.wait()
    follower = asyncio.ensure_future(cache.get("k", gate, cancel_when_orphaned=True))
    await until(lambda: cache.stats().waiters == 2)
    leader.cancel()
    follower.cancel()
    await until(lambda: cache.stats().waiters == 0)
    assert cache.stats().flights == 1  # started by a lookup that lets orphans finish
    gate.release.set()
    await until(lambda: cache.stats().entries == 1)
    assert_stats(cache, misses=1, coalesced=1, cancelled_waiters=2, load_successes=1, entries=1)
