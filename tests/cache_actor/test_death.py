import asyncio

import pytest

from cache_actor import CacheActor, CacheActorDead
from tests.cache_actor.stats_check import MakeActor
from tests.support import Gate, until


async def test_crashed_actor_fails_every_waiter(
    make_actor: MakeActor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cache = make_actor()
    crashing, waiting = Gate(), Gate()
    doomed = [asyncio.ensure_future(cache.get("crash", crashing)) for _ in range(3)]
    bystanders = [asyncio.ensure_future(cache.get("other", waiting)) for _ in range(3)]
    await until(lambda: cache.stats().waiters == 6)

    def broken_admit(*args: object) -> bool:
        raise RuntimeError("bug in a handler")

    monkeypatch.setattr(cache._core.store, "admit", broken_admit)
    crashing.release.set()  # its completion reaches the broken handler: the actor dies

    results = await asyncio.gather(*doomed, *bystanders, return_exceptions=True)
    assert all(isinstance(r, CacheActorDead) and "crashed" in str(r) for r in results)
    assert "cache actor crashed" in caplog.text
    assert not cache.alive
    assert not cache.stats().alive
    with pytest.raises(CacheActorDead):
        await cache.get("later", Gate())
    with pytest.raises(CacheActorDead):
        await cache.ping()


async def test_cancelled_actor_task_fails_every_waiter(make_actor: MakeActor) -> None:
    cache = make_actor()
    gate = Gate()
    lookup = asyncio.ensure_future(cache.get("k", gate))
    await gate.started.wait()
    assert cache._core.task is not None
    cache._core.task.cancel()  # e.g. a loop shutting down underneath the service
    with pytest.raises(CacheActorDead):
        await lookup
    assert not cache.alive


async def test_closed_actor_fails_pending_and_later_callers() -> None:
    cache = CacheActor()
    cache.start()
    gate = Gate()
    pending = [asyncio.ensure_future(cache.get("k", gate)) for _ in range(3)]
    queued_behind_close = None
    await until(lambda: cache.stats().waiters == 3)
    closing = asyncio.ensure_future(cache.aclose())
    queued_behind_close = asyncio.ensure_future(cache.get("late", gate))
    await closing
    results = await asyncio.gather(*pending, queued_behind_close, return_exceptions=True)
    assert all(isinstance(r, CacheActorDead) and "closed" in str(r) for r in results)
    with pytest.raises(CacheActorDead):
        await cache.get("k", gate)
    await cache.aclose()  # idempotent


async def test_unstarted_actor_refuses() -> None:
    cache = CacheActor()
    with pytest.raises(CacheActorDead, match="not started"):
        await cache.get("k", Gate())


async def test_an_injected_crash_takes_the_crash_path(
    make_actor: MakeActor, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection: the loop dies as after a bug, failing the lookups that wait."""
    cache = make_actor()
    waiting = Gate()
    pending = asyncio.ensure_future(cache.get("k", waiting))
    await waiting.started.wait()
    cache.inject_fault("crash")
    with pytest.raises(CacheActorDead, match="crashed"):
        await pending
    assert "cache actor crashed" in caplog.text
    assert not cache.alive
    cache.inject_fault("crash")  # a dead actor ignores it
    with pytest.raises(CacheActorDead):
        await cache.get("later", Gate())


async def test_an_injected_stall_holds_every_lookup_until_it_ends(make_actor: MakeActor) -> None:
    """Fault injection: the loop takes no message for a while (pings time out, lookups are
    not taken from the mailbox), then serves as before."""
    cache = make_actor()
    cache.inject_fault("stall", seconds=0.5)
    with pytest.raises(TimeoutError):
        await cache.ping(timeout=0.05)
    lookup = asyncio.ensure_future(cache.get("k", Gate()))
    await asyncio.sleep(0)
    assert cache.stats().waiters == 0  # still in the mailbox
    assert not lookup.done()
    assert cache.alive
    await cache.ping(timeout=5.0)  # answered once the stall is over
    assert cache.stats().waiters == 1  # and the lookup was taken
    lookup.cancel()
