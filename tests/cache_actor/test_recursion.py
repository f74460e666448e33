"""The failure mmgate exists to prevent: a miss path that asks the cache for its own key."""

import asyncio

import pytest

from cache_actor import CacheActor, CacheRecursionError, Outcome
from tests.cache_actor.stats_check import assert_stats
from tests.support import Gate, until

# Recursion must be refused at once; this bounds "at once" far below every deadline in play.
FAST = 1.0


async def test_same_key_recursion_is_refused_at_once(cache: CacheActor) -> None:
    async def reenters() -> bytes:
        return (await cache.get("img", reenters, timeout=30)).value

    async with asyncio.timeout(FAST):
        with pytest.raises(CacheRecursionError) as caught:
            await cache.get("img", reenters, timeout=30)
    assert caught.value.cycle == ("img", "img")
    assert_stats(cache, misses=1, recursion_rejections=1, load_failures=1, flights=0)

    gate = Gate(b"ok")  # the key is not a ghost: the next lookup computes and stores it
    gate.release.set()
    assert (await cache.get("img", gate)).outcome is Outcome.MISS


async def test_recursion_through_a_child_task(cache: CacheActor) -> None:
    async def logs_stats_in_a_task() -> bytes:
        # e.g. a statistics hook that looks the image up again from a task it spawned
        child = asyncio.create_task(cache.get("img", logs_stats_in_a_task, timeout=30))
        return (await child).value

    async with asyncio.timeout(FAST):
        with pytest.raises(CacheRecursionError):
            await cache.get("img", logs_stats_in_a_task, timeout=30)
    assert cache.stats().recursion_rejections == 1


async def test_recursion_through_another_key(cache: CacheActor) -> None:
    async def compute_a() -> bytes:
        return (await cache.get("b", compute_b, timeout=30)).value

    async def compute_b() -> bytes:
        return (await cache.get("a", compute_a, timeout=30)).value

    async with asyncio.timeout(FAST):
        with pytest.raises(CacheRecursionError) as caught:
            await cache.get("a", compute_a, timeout=30)
    assert caught.value.cycle == ("a", "b", "a")


async def test_cross_key_cycle_between_two_requests(cache: CacheActor) -> None:
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def compute_a() -> bytes:
        a_started.set()
        await b_started.wait()
        return b"a+" + (await cache.get("b", compute_b, timeout=30)).value

    async def compute_b() -> bytes:
        b_started.set()
        await a_started.wait()
        await until(lambda: cache.stats().waiters == 3)  # a's computation now waits on b
        return b"b+" + (await cache.get("a", compute_a, timeout=30)).value

    async with asyncio.timeout(FAST):
        first = asyncio.ensure_future(cache.get("a", compute_a, timeout=30))
        second = asyncio.ensure_future(cache.get("b", compute_b, timeout=30))
        results = await asyncio.gather(first, second, return_exceptions=True)
    # the lookup that would close the cycle (b's computation asking for a) is refused; its
    # error fails b, and a, waiting on b, fails with the same error
    assert all(isinstance(r, CacheRecursionError) for r in results)
    assert {r.cycle for r in results if isinstance(r, CacheRecursionError)} == {("b", "a", "b")}
    assert_stats(cache, misses=2, coalesced=1, recursion_rejections=1, load_failures=2, flights=0)


async def test_nested_lookups_without_a_cycle_work(cache: CacheActor) -> None:
    async def leaf() -> bytes:
        return b"leaf"

    async def parent() -> bytes:
        return b"parent+" + (await cache.get("leaf", leaf)).value

    assert (await cache.get("parent", parent)).value == b"parent+leaf"
    # a second parent flight joins the stored leaf: no false positive from stale lineages
    await cache.invalidate("parent")
    assert (await cache.get("parent", parent)).value == b"parent+leaf"
    assert_stats(cache, misses=3, hits=1, load_successes=3, entries=2)
