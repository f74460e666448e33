from cache_actor import CacheActor, CacheConfig, TenantStats
from tests.cache_actor.stats_check import MakeActor


async def put(cache: CacheActor, key: str, tenant: str, nbytes: int = 100) -> None:
    async def compute() -> bytes:
        return b"v" * nbytes

    await cache.get(key, compute, tenant=tenant)


async def test_each_tenant_sees_its_own_counts_and_holdings(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_bytes=10_000, max_bytes_per_tenant=5000))
    await put(cache, "k", "a")
    await put(cache, "k", "a")  # a hit, for a only
    await put(cache, "k", "b")  # the same key: b's own miss
    a, b = cache.tenant_stats("a")[0], cache.tenant_stats("b")[0]
    assert (a.hits, a.misses, a.entries, a.bytes) == (1, 1, 1, 100)
    assert (b.hits, b.misses, b.entries, b.bytes) == (0, 1, 1, 100)
    assert a.budget_bytes == 5000
    assert a.hit_ratio == 0.5
    assert {s.tenant for s in cache.tenant_stats()} == {"a", "b"}
    # a tenant never seen: zeros, and asking does not make it one
    nobody = cache.tenant_stats("nobody")[0]
    assert nobody == TenantStats("nobody", 0, 0, 0, 0, 0, 0, 0, 5000)
    assert "nobody" not in {s.tenant for s in cache.tenant_stats()}


async def test_counts_are_kept_for_a_bounded_number_of_tenants(make_actor: MakeActor) -> None:
    cache = make_actor(CacheConfig(max_tenants=3))
    for i in range(10):
        await put(cache, "k", f"label-{i}")
    await put(cache, "k", "label-7")  # used again: not among the longest idle
    await put(cache, "k", "label-10")
    kept = [s.tenant for s in cache.tenant_stats()]
    assert kept == ["label-9", "label-7", "label-10"]
    # entries stay, bounded by bytes as always; only the forgotten tenants' counts start again
    assert (await cache.inspect("k", tenant="label-0")).state == "stored"
    assert cache.tenant_stats("label-0")[0].misses == 0
