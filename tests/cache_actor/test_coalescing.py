import asyncio

from cache_actor import CacheActor, Outcome
from tests.cache_actor.stats_check import assert_stats
from tests.support import Gate, until


async def test_thousand_identical_misses_compute_once(cache: CacheActor) -> None:
    gate = Gate(b"x" * 100)
    lookups = [asyncio.ensure_future(cache.get("img", gate)) for _ in range(1000)]
    await gate.started.wait()
    await until(lambda: cache.stats().waiters == 1000)
    gate.release.set()
    results = await asyncio.gather(*lookups)

    assert gate.calls == 1
    assert {r.value for r in results} == {b"x" * 100}
    outcomes = [r.outcome for r in results]
    assert outcomes.count(Outcome.MISS) == 1
    assert outcomes.count(Outcome.COALESCED) == 999
    assert len({r.flight_id for r in results}) == 1
    assert_stats(cache, misses=1, coalesced=999, load_successes=1, entries=1, bytes=100, flights=0)


async def test_later_lookup_is_a_memory_hit(cache: CacheActor) -> None:
    gate = Gate()
    gate.release.set()
    first = await cache.get("k", gate)
    second = await cache.get("k", gate)
    assert (first.outcome, first.tier) == (Outcome.MISS, None)
    assert (second.outcome, second.tier) == (Outcome.HIT, "memory")
    assert gate.calls == 1
    assert_stats(cache, misses=1, hits=1, load_successes=1, entries=1)


async def test_keys_are_separate_per_tenant(cache: CacheActor) -> None:
    gate = Gate()
    gate.release.set()
    a = await cache.get("k", gate, tenant="a")
    b = await cache.get("k", gate, tenant="b")
    assert (a.outcome, b.outcome) == (Outcome.MISS, Outcome.MISS)
    assert gate.calls == 2
    assert_stats(cache, misses=2, load_successes=2, entries=2)


async def test_different_keys_compute_concurrently(cache: CacheActor) -> None:
    gates = [Gate(str(i).encode()) for i in range(3)]
    lookups = [asyncio.ensure_future(cache.get(f"k{i}", g)) for i, g in enumerate(gates)]
    for gate in gates:  # all three run at once: none waits for another
        await gate.started.wait()
    assert cache.stats().flights == 3
    for gate in gates:
        gate.release.set()
    values = [r.value for r in await asyncio.gather(*lookups)]
    assert values == [b"0", b"1", b"2"]
