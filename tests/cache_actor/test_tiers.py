import asyncio
from typing import Any

from cache_actor import CacheConfig, InMemoryTier, Outcome, SecondTier, Stage, TierUse
from tests.cache_actor.stats_check import MakeActor, assert_stats
from tests.support import Gate, until


class BrokenTier:
    """Fails every call, as a Redis that is down does."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    async def get(self, tenant: str, key: str, *, stage: str, timeout: float) -> Any | None:
        self.calls += 1
        raise ConnectionError("connection refused")

    async def set(self, tenant: str, key: str, value: Any, *, stage: str, timeout: float) -> None:
        self.calls += 1
        raise ConnectionError("connection refused")

    async def delete(self, tenant: str, key: str, *, stage: str | None, timeout: float) -> None:
        raise ConnectionError("connection refused")


class ReadOnlyTier(BrokenTier):
    """Answers reads (with nothing) but fails writes."""

    name = "read-only"

    async def get(self, tenant: str, key: str, *, stage: str, timeout: float) -> Any | None:
        self.calls += 1
        return None


class HangingTier(BrokenTier):
    name = "hanging"

    async def get(self, tenant: str, key: str, *, stage: str, timeout: float) -> Any | None:
        self.calls += 1
        await asyncio.Event().wait()  # ignores its timeout: the actor enforces it
        return None


def test_implementations_satisfy_the_protocol() -> None:
    assert isinstance(InMemoryTier(), SecondTier)
    assert isinstance(BrokenTier(), SecondTier)


async def test_value_from_the_second_tier(make_actor: MakeActor) -> None:
    tier = InMemoryTier("redis")
    tier.values[("default", "k")] = b"shared"
    cache = make_actor(tier=tier)
    gate = Gate()
    lookup = await cache.get("k", gate)
    assert (lookup.value, lookup.outcome, lookup.tier) == (b"shared", Outcome.MISS, "redis")
    assert gate.calls == 0
    hit = await cache.get("k", gate)
    assert (hit.outcome, hit.tier) == (Outcome.HIT, "memory")
    assert (await cache.inspect("k")).tier == "redis"
    assert_stats(cache, misses=1, hits=1, tier_hits=1, load_successes=1, entries=1)


async def test_computed_value_is_written_back(make_actor: MakeActor) -> None:
    tier = InMemoryTier()
    cache = make_actor(tier=tier)
    gate = Gate(b"computed")
    gate.release.set()
    assert (await cache.get("k", gate, tenant="t")).tier is None
    await until(lambda: tier.sets == 1)
    assert tier.values == {("t", "k"): b"computed"}
    assert await cache.invalidate("k", tenant="t")
    assert tier.values == {}


async def test_broken_tier_is_a_miss_and_opens_the_breaker(make_actor: MakeActor) -> None:
    tier = BrokenTier()
    cache = make_actor(CacheConfig(tier_breaker_failures=3, tier_breaker_seconds=3600), tier=tier)
    for i in range(5):
        gate = Gate(b"computed")
        gate.release.set()
        assert (await cache.get(f"k{i}", gate)).value == b"computed"
        await cache.ping()  # let any write-back report
    stats = cache.stats()
    assert stats.tier_breaker_open
    # three failed reads (k0, k1, k2) open it; k3 and k4 do not ask
    assert (stats.tier_errors, stats.tier_write_errors) == (3, 0)
    calls = tier.calls
    gate = Gate()
    gate.release.set()
    await cache.get("k-after", gate)
    assert tier.calls == calls  # not asked while the breaker is open
    assert not await cache.invalidate("never-stored")  # delete errors are logged, not raised


async def test_hanging_tier_times_out_as_a_miss(make_actor: MakeActor) -> None:
    tier = HangingTier()
    cache = make_actor(CacheConfig(tier_timeout=0.01), tier=tier)
    gate = Gate(b"computed")
    gate.release.set()
    lookup = await cache.get("k", gate, timeout=10)
    assert (lookup.value, lookup.tier) == (b"computed", None)
    assert cache.stats().tier_errors == 1


async def test_failed_write_back_is_reported_not_raised(make_actor: MakeActor) -> None:
    cache = make_actor(tier=ReadOnlyTier())
    gate = Gate(b"computed")
    gate.release.set()
    assert (await cache.get("k", gate)).value == b"computed"
    await until(lambda: cache.stats().tier_write_errors == 1)
    assert_stats(cache, misses=1, load_successes=1, tier_write_errors=1, entries=1)


async def test_write_failures_are_counted_apart_and_leave_reads_alone(
    make_actor: MakeActor,
) -> None:
    # a Redis at maxmemory: it answers reads and refuses every write
    tier = ReadOnlyTier()
    cache = make_actor(CacheConfig(tier_breaker_failures=2), tier=tier)
    for i in range(6):
        gate = Gate(b"computed")
        gate.release.set()
        await cache.get(f"k{i}", gate)
    await until(lambda: cache.stats().tier_write_errors == 6)
    stats = cache.stats()
    assert not stats.tier_breaker_open  # reads still work: the breaker stays closed
    assert stats.tier_errors == 0
    reads = tier.calls
    gate = Gate()
    gate.release.set()
    await cache.get("k-next", gate)
    assert tier.calls > reads  # still asked


class StuckWrites(ReadOnlyTier):
    """Reads answer; writes never finish (a tier that has stopped responding to them)."""

    name = "stuck-writes"

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    async def set(self, tenant: str, key: str, value: Any, *, stage: str, timeout: float) -> None:
        self.sets += 1
        await asyncio.Event().wait()


async def test_write_backs_are_bounded_and_drops_counted(make_actor: MakeActor) -> None:
    tier = StuckWrites()
    config = CacheConfig(tier_write_queue=3, tier_writers=1, tier_timeout=30)
    cache = make_actor(config, tier=tier)
    for i in range(10):
        gate = Gate(b"v")
        gate.release.set()
        await cache.get(f"k{i}", gate)  # nobody waits for the writes
    await until(lambda: tier.sets == 1)  # the one writer is stuck on the first
    stats = cache.stats()
    assert (stats.tier_write_queue_depth, stats.tier_write_drops) == (3, 6)
    assert stats.tier == "stuck-writes"


async def test_each_lookup_says_how_it_uses_the_tier(make_actor: MakeActor) -> None:
    tier = InMemoryTier("redis")
    tier.values[("t", "held")] = b"from the tier"
    cache = make_actor(tier=tier)

    def computed(value: bytes) -> Gate:
        gate = Gate(value)
        gate.release.set()
        return gate

    # memory only: the tier is neither asked nor written
    lookup = await cache.get(
        "held", computed(b"mine"), tenant="t", tier=TierUse(read=False, write=False)
    )
    assert (lookup.value, lookup.tier) == (b"mine", None)
    assert tier.gets == 0
    # read only: asked, and a computed value is not written (its final form comes later)
    reading = Stage.RESPONSE.tier_use
    await cache.get("new", computed(b"live"), tenant="t", tier=reading)
    assert tier.gets == 1
    cache.put("new", b"final", tenant="t", stage=Stage.RESPONSE)
    await until(lambda: tier.sets == 1)
    assert tier.values[("t", "new")] == b"final"
    assert tier.stages[("t", "new")] == "response"
    # a stage's lookup writes under its stage
    await cache.get("enc", computed(b"tensor"), tenant="t", tier=Stage.EMBEDDING.tier_use)
    await until(lambda: tier.sets == 2)
    assert tier.stages[("t", "enc")] == "embedding"


async def test_a_local_invalidate_leaves_the_tier_alone(make_actor: MakeActor) -> None:
    tier = InMemoryTier()
    cache = make_actor(tier=tier)
    gate = Gate(b"v")
    gate.release.set()
    await cache.get("k", gate, tenant="t")
    await until(lambda: tier.sets == 1)
    # another replica removed it from the tier and said so: forget the memory copy only
    assert await cache.invalidate("k", tenant="t", local=True)
    assert tier.values == {("t", "k"): b"v"}
    assert await cache.invalidate("k", tenant="t") is False
    assert tier.values == {}
