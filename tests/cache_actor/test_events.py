"""The store's events for watchers: admits, evictions and invalidations, numbered, per tenant;
resuming from a sequence number; a snapshot when the history no longer reaches back; a watcher
that does not read costs a bounded buffer and ends with one gap."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from cache_actor import CacheActor, CacheConfig, CacheEvent, CacheOverloaded, Journal, TierUse

pytestmark = pytest.mark.asyncio

IMAGE = TierUse("image", read=False, write=False)


def value_of(size: int) -> Callable[[], Awaitable[bytes]]:
    async def compute() -> bytes:
        return b"x" * size

    return compute


def actor(journal: Journal, max_bytes: int = 10_000) -> CacheActor:
    config = CacheConfig(max_bytes=max_bytes, max_entry_fraction=0.6)
    cache = CacheActor(config, journal=journal)
    cache.start()
    return cache


def kinds(events: list[CacheEvent]) -> list[tuple[str, str, str]]:
    return [(e.kind, e.tenant, e.key) for e in events]


async def test_admits_evictions_and_invalidations_reach_a_tenants_watcher() -> None:
    journal = Journal()
    cache = actor(journal)
    mine, _ = await cache.watch(frozenset({"a"}), 0, capacity=100)
    theirs, _ = await cache.watch(frozenset({"b"}), 0, capacity=100)
    await cache.get("k1", value_of(3000), tenant="a", tier=IMAGE, label="sha256:one")
    await cache.get("k2", value_of(3000), tenant="a")
    await cache.get("k3", value_of(4500), tenant="a")  # over 10,000 bytes: k1 goes
    assert await cache.invalidate("k2", tenant="a")
    events = await mine.next()
    assert kinds(events) == [
        ("admit", "a", "k1"),
        ("admit", "a", "k2"),
        ("evict", "a", "k1"),
        ("admit", "a", "k3"),
        ("invalidate", "a", "k2"),
    ]
    first = events[0]
    assert (first.stage, first.label, first.tier) == ("image", "sha256:one", None)
    assert first.nbytes >= 3000
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5]
    await cache.get("other", value_of(10), tenant="b")
    assert kinds(await theirs.next()) == [("admit", "b", "other")]  # a's events: none
    await cache.aclose()


async def test_a_new_watcher_starts_with_what_is_held() -> None:
    journal = Journal()
    cache = actor(journal)
    await cache.get("k1", value_of(10), tenant="a")
    await cache.get("k2", value_of(10), tenant="b")
    _, first = await cache.watch(frozenset({"a"}), 0, capacity=10)
    assert kinds(first) == [("held", "a", "k1")]
    assert first[0].sequence == journal.sequence == 2
    _, everyone = await cache.watch(None, 0, capacity=10)
    assert {e.key for e in everyone} == {"k1", "k2"}
    await cache.aclose()


async def test_a_watcher_resuming_gets_exactly_the_events_it_missed() -> None:
    journal = Journal(history=8)
    cache = actor(journal)
    watcher, _ = await cache.watch(frozenset({"a"}), 0, capacity=10)
    await cache.get("k1", value_of(10), tenant="a")
    (seen,) = await watcher.next()
    watcher.close()  # the caller goes away; three more events meanwhile
    for key in ("k2", "k3"):
        await cache.get(key, value_of(10), tenant="a")
    await cache.get("elsewhere", value_of(10), tenant="b")
    assert await cache.invalidate("k1", tenant="a")
    _, missed = await cache.watch(frozenset({"a"}), seen.sequence, capacity=10)
    assert kinds(missed) == [("admit", "a", "k2"), ("admit", "a", "k3"), ("invalidate", "a", "k1")]
    # further back than the history holds: a snapshot instead
    for n in range(10):
        await cache.get(f"more{n}", value_of(10), tenant="b")
    _, snapshot = await cache.watch(frozenset({"a"}), seen.sequence, capacity=10)
    assert kinds(snapshot) == [("held", "a", "k2"), ("held", "a", "k3")]
    await cache.aclose()


async def test_a_watcher_that_does_not_read_ends_with_one_gap() -> None:
    journal = Journal()
    cache = actor(journal, max_bytes=1_000_000)
    watcher, _ = await cache.watch(None, 0, capacity=50)
    for n in range(1000):
        await cache.get(f"k{n}", value_of(10))
    events = await watcher.next()
    assert len(events) == 51
    assert [e.kind for e in events[-2:]] == ["admit", "gap"]
    assert events[-1].sequence == events[-2].sequence  # resume after the last one it has
    assert journal.gaps == 1
    assert len(journal.history) <= 4096  # and the history is bounded too
    await cache.aclose()


async def test_watchers_are_bounded() -> None:
    cache = actor(Journal(max_watchers=2))
    for _ in range(2):
        await cache.watch(None, 0, capacity=10)
    with pytest.raises(CacheOverloaded, match="2 cache watchers"):
        await cache.watch(None, 0, capacity=10)
    assert cache.alive  # a refused watch is the caller's error, not the actor's
    await cache.aclose()


async def test_a_reset_gaps_every_watcher_and_its_history_is_not_replayed() -> None:
    journal = Journal()
    cache = actor(journal)
    watcher, _ = await cache.watch(None, 0, capacity=10)
    await cache.get("k1", value_of(10))
    (seen,) = await watcher.next()
    journal.reset()  # the actor these events told of is gone
    (gap,) = await watcher.next()
    assert (gap.kind, gap.sequence) == ("gap", seen.sequence)
    fresh = actor(journal)  # its replacement, empty
    _, first = await fresh.watch(None, gap.sequence, capacity=10)
    assert first == []  # a snapshot of nothing, not a replay of k1's admit
    assert journal.sequence > gap.sequence
    await asyncio.gather(cache.aclose(), fresh.aclose())


async def test_a_sequence_number_from_another_life_gets_a_snapshot() -> None:
    """A number this journal never gave (another replica's, or from before a restart)."""
    journal = Journal()
    cache = actor(journal)
    await cache.get("k1", value_of(10), tenant="a")
    watcher, first = await cache.watch(frozenset({"a"}), journal.sequence + 100, capacity=10)
    assert kinds(first) == [("held", "a", "k1")]
    assert not watcher.resumed
    await cache.aclose()
