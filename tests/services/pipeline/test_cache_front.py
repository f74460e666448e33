"""Degraded mode on a real cache actor: a lookup the actor cannot answer is computed by the
caller (compute) or fails (fail); a dead actor is replaced, three times in ten minutes at most.

The real server's degraded mode, under load with fault injection, is tested in
tests/reliability/test_degraded.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from cache_actor import (
    CacheActor,
    CacheActorDead,
    CacheConfig,
    CacheOverloaded,
    ComputeTimeout,
    Journal,
    Outcome,
    WatchFilter,
)
from services.pipeline.cache_front import (
    MAX_REPLACEMENTS,
    REPLACEMENT_WINDOW,
    Bypassed,
    CacheFront,
    outcome_of,
)
from tests.support import Clock, Gate

pytestmark = pytest.mark.asyncio

EVERY = WatchFilter(tenants=None)  # a watcher of every tenant's events


def front(on_failure: str = "compute", clock: Clock | None = None) -> CacheFront:
    made = CacheFront(CacheActor, on_failure, clock or Clock())  # type: ignore[arg-type]
    made.start()
    return made


async def value(result: int = 7) -> int:
    return result


async def test_a_live_actor_answers_as_ever() -> None:
    cache = front()
    first = await cache.get("k", value)
    second = await cache.get("k", value)
    assert (first.outcome, second.outcome) == (Outcome.MISS, Outcome.HIT)
    assert outcome_of(second) == ("hit", "")
    assert cache.degraded is None
    await cache.aclose()


async def test_a_dead_actor_is_replaced_and_the_lookup_computed_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = front()
    await cache.get("k", value)
    waiting = Gate()
    pending = asyncio.ensure_future(cache.get("slow", waiting))
    await waiting.started.wait()
    dead = cache.actor
    dead.inject_fault("crash")
    caplog.set_level(logging.ERROR, "mmgate.cache")
    waiting.release.set()
    lookup = await pending  # the actor died under it: computed here instead
    assert waiting.calls == 2  # the flight's computation went with the actor
    assert isinstance(lookup, Bypassed)
    assert outcome_of(lookup) == ("bypass", "cache_dead")
    assert cache.actor is not dead
    assert cache.actor.alive
    assert cache.replacements == 1
    assert "replaced by an empty one" in caplog.text
    assert "lost 1 entries" in caplog.text
    # the fresh actor is empty, then caches again
    assert (await cache.get("k", value)).outcome is Outcome.MISS
    assert (await cache.get("k", value)).outcome is Outcome.HIT
    assert cache.bypassed == {("other", "cache_dead"): 1}
    await cache.aclose()


async def test_a_fourth_death_in_ten_minutes_is_not_survived() -> None:
    clock = Clock()
    cache = front(clock=clock)
    for death in range(MAX_REPLACEMENTS):
        cache.actor.inject_fault("crash")
        await asyncio.sleep(0)  # the loop takes the fault
        assert not cache.actor.alive
        lookup = await cache.get("k", value)  # a fresh actor took its place first
        assert lookup.outcome is Outcome.MISS
        assert cache.replacements == death + 1
        clock.now += 60
    cache.actor.inject_fault("crash")
    await asyncio.sleep(0)
    lookup = await cache.get("k", value)
    assert outcome_of(lookup) == ("bypass", "cache_dead")  # still served
    assert cache.exhausted
    assert cache.degraded == "cache_dead"
    assert cache.replacements == MAX_REPLACEMENTS


async def test_deaths_further_apart_than_the_window_are_each_survived() -> None:
    clock = Clock()
    cache = front(clock=clock)
    for _ in range(MAX_REPLACEMENTS + 2):
        cache.actor.inject_fault("crash")
        await asyncio.sleep(0)
        cache.found_dead()
        clock.now += REPLACEMENT_WINDOW / 2
    assert not cache.exhausted
    assert cache.actor.alive
    await cache.aclose()


async def test_lookups_waiting_on_a_stalled_actor_compute_for_themselves() -> None:
    cache = front()
    cache.inject_fault("stall", 3600)
    pending = asyncio.ensure_future(cache.get("k", value))
    await asyncio.sleep(0)
    assert not pending.done()  # waits on the actor, until the health monitor finds it stalled
    cache.found_stalled()
    lookup = await pending
    assert outcome_of(lookup) == ("bypass", "cache_stalled")
    assert outcome_of(await cache.get("k", value)) == ("bypass", "cache_stalled")
    assert cache.degraded == "cache_stalled"
    cache.found_answering()
    assert cache.degraded is None
    cache.actor._core.task.cancel()  # end the stall: no hour-long close
    await asyncio.sleep(0)


async def test_fail_is_the_behaviour_before_degraded_mode() -> None:
    cache = front("fail")
    cache.actor.inject_fault("crash")
    await asyncio.sleep(0)
    with pytest.raises(CacheActorDead):
        await cache.get("k", value)
    with pytest.raises(CacheActorDead):
        await cache.invalidate("k")
    cache.found_dead()
    assert cache.exhausted  # liveness fails: no replacement
    assert cache.replacements == 0
    assert not cache.actor.alive


async def test_nothing_is_stored_for_a_bypassed_lookup() -> None:
    cache = front()
    cache.found_stalled()
    calls: list[int] = []

    async def counted() -> int:
        calls.append(1)
        return 1

    await asyncio.gather(*(cache.get("k", counted) for _ in range(3)))
    assert len(calls) == 3  # no coalescing either
    cache.found_answering()
    assert (await cache.get("k", counted)).outcome is Outcome.MISS
    await cache.aclose()


async def test_a_full_mailbox_is_overload_not_a_fault() -> None:
    """RESOURCE_EXHAUSTED as before: computing without coalescing would add to the overload."""
    cache = CacheFront(lambda: CacheActor(CacheConfig(mailbox_size=1)))
    cache.start()
    cache.inject_fault("stall", 0.2)  # nothing is taken from the mailbox meanwhile
    first = asyncio.ensure_future(cache.get("a", value))
    await asyncio.sleep(0)
    with pytest.raises(CacheOverloaded):
        await cache.get("b", value)
    assert cache.bypassed == {}
    assert (await first).outcome is Outcome.MISS
    await cache.aclose()


async def test_a_bypassed_computation_is_bounded_by_the_callers_wait() -> None:
    """Computed in the caller's task, it ends with the caller's wait, as a lookup would."""
    cache = front()
    cache.found_stalled()
    never = Gate()
    with pytest.raises(ComputeTimeout, match=r"within the caller's 0\.01 s"):
        await cache.get("k", never, timeout=0.01)
    assert never.calls == 1
    await cache.aclose()


async def test_an_invalidation_reaching_a_dead_actor_goes_to_its_replacement() -> None:
    cache = front()
    await cache.get("k", value)
    dead = cache.actor
    dead.inject_fault("crash")
    await asyncio.sleep(0)
    assert await cache.invalidate("k") is False  # the entry died with the actor
    assert cache.actor is not dead
    assert cache.replacements == 1
    await cache.aclose()


async def test_a_failure_its_caller_left_before_reading_is_not_reported_as_lost() -> None:
    """A caller cancelled just as its lookup failed: asyncio must not log the lookup's error
    as never retrieved (a chaos run's log filled with them)."""
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    cache = front()

    async def leave_as_it_fails() -> None:
        gate = Gate()
        caller = asyncio.ensure_future(cache.get("k", gate))
        await gate.started.wait()
        (lookup,) = [t for t in asyncio.all_tasks() if "CacheActor.get" in repr(t.get_coro())]
        # the lookup fails with CacheActorDead, and its caller leaves before reading it
        lookup.add_done_callback(lambda _: caller.cancel())
        cache.actor.inject_fault("crash")
        await asyncio.wait([caller])
        assert caller.cancelled()
        assert gate.calls == 1  # it did not get as far as computing for itself

    await leave_as_it_fails()
    gc.collect()  # the lookup task is gone: asyncio reports a failure nobody read here
    assert reported == []
    await cache.aclose()


async def test_a_replaced_actor_gaps_every_watcher() -> None:
    """What a watcher was told of died with the actor: it starts over, from a snapshot."""
    journal = Journal()
    cache = CacheFront(lambda: CacheActor(journal=journal), journal=journal)
    cache.start()
    await cache.get("k", value)
    watcher, first = await cache.watch(EVERY, 0, capacity=10)
    assert [e.kind for e in first] == ["held"]
    cache.actor.inject_fault("crash")
    await asyncio.sleep(0)
    _, fresh = await cache.watch(EVERY, first[0].sequence, capacity=10)  # replaced on the way
    assert cache.replacements == 1
    (gap,) = await watcher.next()
    assert gap.kind == "gap"
    assert fresh == []  # a snapshot of the empty replacement, not a replay of the old history
    await cache.aclose()


async def test_a_stalled_actor_is_not_watched() -> None:
    journal = Journal()
    cache = CacheFront(lambda: CacheActor(journal=journal), journal=journal)
    cache.start()
    cache.found_stalled()
    with pytest.raises(CacheActorDead, match="not answering"):
        await cache.watch(EVERY, 0, capacity=10)
    cache.found_answering()
    watcher, _ = await cache.watch(EVERY, 0, capacity=10)
    watcher.close()
    await cache.aclose()
