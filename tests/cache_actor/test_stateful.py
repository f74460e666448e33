"""The actor against a plain reference model: an LRU dict with byte budgets, run sequentially."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cache_actor import CacheActor, CacheConfig, Lookup, Outcome

SIZES = {f"k{i}": size for i, size in enumerate([50, 100, 150, 200, 250, 300, 400, 450])}
MAX_BYTES, TENANT_BUDGET = 600, 400
TENANTS = ("a", "b")

keys = st.sampled_from(sorted(SIZES))
tenants = st.sampled_from(TENANTS)


def value_of(key: str) -> bytes:
    return key.encode().ljust(SIZES[key], b".")


class ComputeFailed(Exception):
    pass


def served(results: list[Lookup[bytes] | BaseException]) -> list[Lookup[bytes]]:
    assert all(isinstance(r, Lookup) for r in results), results
    return [r for r in results if isinstance(r, Lookup)]


class ReferenceCache:
    """What the actor must do, written as plainly as possible."""

    def __init__(self) -> None:
        self.lru: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.hits = self.misses = self.coalesced = self.evictions = self.oversize = 0

    def bytes(self, tenant: str | None = None) -> int:
        return sum(n for (t, _), n in self.lru.items() if tenant in (None, t))

    def lookup(self, tenant: str, key: str, count: int, fails: bool) -> bool:
        """Return True when the value was stored before (a hit)."""
        full_key = (tenant, key)
        if full_key in self.lru:
            self.lru.move_to_end(full_key)
            self.hits += count
            return True
        self.misses += 1
        self.coalesced += count - 1
        if not fails:
            self.admit(full_key, SIZES[key])
        return False

    def admit(self, full_key: tuple[str, str], size: int) -> None:
        if size > TENANT_BUDGET:
            self.oversize += 1
            return
        tenant = full_key[0]
        while self.bytes(tenant) + size > TENANT_BUDGET:
            self.evict(next(k for k in self.lru if k[0] == tenant))
        while self.bytes() + size > MAX_BYTES:
            self.evict(next(iter(self.lru)))
        self.lru[full_key] = size

    def evict(self, full_key: tuple[str, str]) -> None:
        del self.lru[full_key]
        self.evictions += 1


class ActorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.model = ReferenceCache()
        config = CacheConfig(
            max_bytes=MAX_BYTES, max_bytes_per_tenant=TENANT_BUDGET, max_entry_fraction=1.0
        )
        self.cache = CacheActor(config)
        self.runner.run(self._start())
        self.computations = 0

    async def _start(self) -> None:
        self.cache.start()

    def _compute_for(self, key: str, fails: bool) -> Callable[[], Awaitable[bytes]]:
        async def compute() -> bytes:
            self.computations += 1
            if fails:
                raise ComputeFailed(key)
            return value_of(key)

        return compute

    @rule(tenant=tenants, key=keys, count=st.integers(1, 5), fails=st.booleans())
    def lookup(self, tenant: str, key: str, count: int, fails: bool) -> None:
        compute = self._compute_for(key, fails)

        async def burst() -> list[Lookup[bytes] | BaseException]:
            lookups = (self.cache.get(key, compute, tenant=tenant) for _ in range(count))
            return await asyncio.gather(*lookups, return_exceptions=True)

        computations = self.computations
        results = self.runner.run(burst())
        was_stored = self.model.lookup(tenant, key, count, fails)
        if was_stored:
            assert [r.outcome for r in served(results)] == [Outcome.HIT] * count
            assert self.computations == computations
            return
        assert self.computations == computations + 1
        if fails:
            assert all(isinstance(r, ComputeFailed) for r in results)
            return
        outcomes = [r.outcome for r in served(results)]
        assert outcomes == [Outcome.MISS] + [Outcome.COALESCED] * (count - 1)
        assert all(r.value == value_of(key) for r in served(results))

    @rule(tenant=tenants, key=keys)
    def invalidate(self, tenant: str, key: str) -> None:
        removed = self.runner.run(self.cache.invalidate(key, tenant=tenant))
        assert removed == ((tenant, key) in self.model.lru)
        self.model.lru.pop((tenant, key), None)

    @precondition(lambda self: bool(self.model.lru))
    @rule(data=st.data())
    def inspect(self, data: st.DataObject) -> None:
        tenant, key = data.draw(st.sampled_from(sorted(self.model.lru)))
        info = self.runner.run(self.cache.inspect(key, tenant=tenant))
        assert (info.state, info.nbytes) == ("stored", SIZES[key])

    @invariant()
    def matches_the_model(self) -> None:
        stats = self.cache.stats()
        model = self.model
        assert stats.entries == len(model.lru)
        assert stats.bytes == model.bytes() <= MAX_BYTES
        assert dict(stats.bytes_by_tenant) == {t: model.bytes(t) for t in TENANTS if model.bytes(t)}
        assert (stats.hits, stats.misses, stats.coalesced) == (
            model.hits,
            model.misses,
            model.coalesced,
        )
        assert (stats.evictions, stats.oversize_rejections) == (model.evictions, model.oversize)
        assert (stats.flights, stats.waiters) == (0, 0)

    def teardown(self) -> None:
        self.runner.run(self.cache.aclose())
        self.runner.close()


ActorMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestActorAgainstModel = ActorMachine.TestCase
