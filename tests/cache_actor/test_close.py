import asyncio

from cache_actor import CacheActor, CacheActorDead, CacheConfig, InMemoryTier
from tests.support import Gate, Stuck, assert_no_leaked_tasks, until


async def test_no_task_left_after_close() -> None:
    stuck = Stuck()

    tier = InMemoryTier()
    async with CacheActor(CacheConfig(), tier=tier) as cache:
        gate = Gate()
        gate.release.set()
        await cache.get("written-back", gate)  # leaves a write-back task behind, briefly
        waiters = [asyncio.ensure_future(cache.get(f"stuck{i}", stuck)) for i in range(5)]
        await until(lambda: cache.stats().flights == 5)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, CacheActorDead) for r in results)
    assert stuck.cancelled.is_set()
    assert_no_leaked_tasks()
