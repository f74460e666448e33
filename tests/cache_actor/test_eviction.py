import asyncio

from cache_actor import CacheActor, CacheConfig, Outcome
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, until


def value_of(nbytes: int) -> bytes:
    return b"v" * nbytes


async def put(cache: CacheActor, key: str, nbytes: int, tenant: str = "default") -> None:
    async def compute() -> bytes:
        return value_of(nbytes)

    await cache.get(key, compute, tenant=tenant)


async def test_total_budget_holds_with_lru_order(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_bytes=1000, max_entry_fraction=1.0))
    for i in range(4):
        await put(cache, f"k{i}", 200)  # 800 bytes
    await put(cache, "k0", 200)  # a hit: k0 is now the most recently used
    await put(cache, "k4", 400)  # needs 200 more bytes: k1 goes, not k0
    assert (await cache.inspect("k0")).state == "stored"
    assert (await cache.inspect("k1")).state == "absent"
    assert_stats(
        cache,
        misses=5,
        hits=1,
        load_successes=5,
        evictions=1,
        evicted_bytes=200,
        entries=4,
        bytes=1000,
    )


async def test_budget_holds_under_many_inserts(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_bytes=10_000))
    for i in range(300):
        await put(cache, f"k{i}", 100 + (i * 37) % 900)
        assert cache.stats().bytes <= 10_000


async def test_tenant_budget_evicts_only_that_tenant(make_actor: MakeActor) -> None:
    cache = make_actor(
        CacheConfig(max_bytes=10_000, max_bytes_per_tenant=1000, max_entry_fraction=1.0)
    )
    await put(cache, "quiet", 500, tenant="b")
    for i in range(10):
        await put(cache, f"noisy{i}", 400, tenant="a")
    stats = cache.stats()
    assert dict(stats.bytes_by_tenant) == {"a": 800, "b": 500}
    assert (await cache.inspect("quiet", tenant="b")).state == "stored"
    assert stats.evictions == 8


async def test_oversized_value_is_served_but_not_stored(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_bytes=1000, max_entry_fraction=0.5))
    gate = Gate(value_of(600))
    gate.release.set()
    first = await cache.get("big", gate)
    second = await cache.get("big", gate)
    assert (first.value, second.outcome) == (value_of(600), Outcome.MISS)
    assert_stats(cache, misses=2, load_successes=2, oversize_rejections=2, entries=0, bytes=0)


async def test_eviction_under_load_never_drops_a_flight(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_bytes=2_000))
    gates = {f"flight{i}": Gate(value_of(100)) for i in range(20)}
    pending = {
        key: [asyncio.ensure_future(cache.get(key, gate)) for _ in range(3)]
        for key, gate in gates.items()
    }
    await until(lambda: cache.stats().flights == 20)
    for i in range(200):  # churn: ten times the budget passes through the store
        await put(cache, f"churn{i}", 100)
    assert cache.stats().flights == 20
    assert cache.stats().waiters == 60
    for gate in gates.values():
        gate.release.set()
    for key, lookups in pending.items():
        results = await asyncio.gather(*lookups)
        assert [r.value for r in results] == [value_of(100)] * 3, key
    assert cache.stats().bytes <= 2_000


async def test_numpy_like_values_weigh_their_nbytes(cache: CacheActor) -> None:
    class Tensor:
        nbytes = 4096

    async def compute() -> object:
        return Tensor()

    assert (await cache.get("t", compute)).nbytes == 4096
    assert cache.stats().bytes == 4096
