import asyncio

import pytest

from cache_actor import CacheConfig, CacheOverloaded
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, until


async def test_full_mailbox_refuses_at_once(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(mailbox_size=4))
    gate = Gate()
    # ten lookups queue before the actor runs once: four fit, six are refused without waiting
    results = asyncio.gather(*(cache.get(f"k{i}", gate) for i in range(10)), return_exceptions=True)
    await until(lambda: cache.stats().flights == 4)
    gate.release.set()
    outcomes = await results
    refused = [r for r in outcomes if isinstance(r, CacheOverloaded)]
    assert len(refused) == 6
    assert "mailbox is full" in str(refused[0])
    assert_stats(cache, misses=4, load_successes=4, overloaded=6, entries=4)
    assert (await cache.get("k9", gate)).value == b"value"  # serving again once drained


async def test_flight_table_is_bounded(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_flights=2))
    gates = [Gate() for _ in range(3)]
    first = [asyncio.ensure_future(cache.get(f"k{i}", gates[i])) for i in range(2)]
    await until(lambda: cache.stats().flights == 2)
    with pytest.raises(CacheOverloaded, match="flights"):
        await cache.get("k2", gates[2])
    for gate in gates:
        gate.release.set()
    await asyncio.gather(*first)
    assert_stats(cache, misses=2, load_successes=2, overloaded=1, entries=2)
